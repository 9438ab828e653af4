/* The C ABI of a library built by byoc (model.so).
 *
 *   byoc_model* model = NULL;
 *   if (byoc_model_create(&model, NULL) != 0) puts(byoc_last_error());
 *   byoc_model_run(model, inputs, num_inputs, outputs, num_outputs, stream);
 *   byoc_model_destroy(model);
 *
 * Tensors cross the boundary as DLPack DLTensors (the struct below has DLPack's layout,
 * so a DLManagedTensor's dl_tensor can be passed as it is). Inputs and outputs are given
 * in the order of the metadata JSON ("inputs", "outputs"); each must have exactly the
 * declared shape (a library of shape buckets: one bucket's, its "variants" in the metadata;
 * along the axes of a padded dim, any size up to a bucket's, and the outputs then have the
 * sizes the inputs imply) and dtype, live on the model's device and be compact row-major
 * (strides NULL or the compact ones). run() checks all of this, never allocates, and
 * enqueues all work on `stream` (a cudaStream_t; NULL = the legacy default stream; ignored
 * on the cpu target). Every function returns 0 on success; otherwise byoc_last_error()
 * (thread-local) says what went wrong, and the model stays usable. Outputs must not
 * overlap inputs or each other (refused). Model instances are independent: each owns its
 * memory, engines and graphs.
 */
#ifndef BYOC_MODEL_H_
#define BYOC_MODEL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { int32_t device_type; int32_t device_id; } byoc_dl_device;   /* DLDevice */
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } byoc_dl_dtype; /* DLDataType */
typedef struct {                                                              /* DLTensor */
  void* data;
  byoc_dl_device device;
  int32_t ndim;
  byoc_dl_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} byoc_dl_tensor;

enum { BYOC_DL_CPU = 1, BYOC_DL_CUDA = 2, BYOC_DL_CUDA_HOST = 3 };
enum { BYOC_DL_INT = 0, BYOC_DL_UINT = 1, BYOC_DL_FLOAT = 2, BYOC_DL_BFLOAT = 4, BYOC_DL_BOOL = 6 };

typedef struct byoc_model byoc_model;

/* Loads weights (from inside the library, or, when the model was built with params:
 * sidecar, from `weights_path`, its .safetensors sidecar: required then, since the runtime
 * does not know where its library lies; Python's byoc.load finds the sidecar beside the
 * library) and allocates all memory the model will ever use. A `weights_path` given to a
 * library that embeds its weights replaces them: any weights file of the library's program
 * (`byoc refit` writes one from new weights) is taken, one of another program or whose bytes
 * do not match its checksum is refused. */
int byoc_model_create(byoc_model** model, const char* weights_path);
/* The same on CUDA device `device` (-1: the calling thread's current device, as
 * byoc_model_create): the model's memory, streams and engines live there, and each run
 * launches there whatever device the calling thread has current; inputs and outputs
 * (DLTensor device_id) and the stream must be that device's. A cpu model takes -1 or 0. */
int byoc_model_create_on_device(byoc_model** model, const char* weights_path, int32_t device);
int byoc_model_run(byoc_model* model, const byoc_dl_tensor* inputs, int32_t num_inputs,
                   const byoc_dl_tensor* outputs, int32_t num_outputs, void* stream);
void byoc_model_destroy(byoc_model* model);
/* 0 when every finished run went well; else 1, and byoc_last_error() names the call whose
 * kernel found an error it could only see on the device (cuda: an out-of-range Gather
 * index, clamped so that nothing outside the table is read). Such an error is reported
 * once, by this or by the next byoc_model_run; call it after synchronizing the stream to
 * know about the runs before. Does not wait for queued work. */
int byoc_model_status(byoc_model* model);
/* The sm (90 for sm_90) whose kernels this instance runs: a library built for several archs
 * (config `arch`) holds each one's, and create takes the highest whose machine code the
 * device runs, else the highest whose PTX it compiles; $BYOC_ARCH=sm_NN asks for one. 0 on
 * the cpu. */
int byoc_model_arch(const byoc_model* model);
/* JSON: format, version, build_id, target, arch, inputs, outputs, backends, functions, weights. */
const char* byoc_model_metadata(void);
const char* byoc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* BYOC_MODEL_H_ */
