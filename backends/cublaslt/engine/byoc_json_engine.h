/* The JSON runtime engine: runs a subgraph that the build step serialized as JSON
 * (backends/cublaslt/SCHEMA.md, "byoc-json-graph" version 1).
 *
 * Life cycle:
 *   create()   parses the JSON strictly, validates the graph (kinds, dtypes, every
 *              shape), checks the constants against the weights blob, then plans once:
 *              fusion of matmul epilogues, cuBLASLt descriptors and algorithm choice
 *              (CUDA), storage of the intermediates, workspace size.
 *   run()      only executes: no parsing, no allocation, no host synchronization.
 *   destroy()  frees what create() allocated.
 *
 * Two implementations share this header:
 *   engine.cc alone                        -> CPU only (device_kind 2 is refused)
 *   engine.cc + engine_cuda.cu, both built with -DBYOC_JSON_ENGINE_WITH_CUDA
 *                                          -> CPU and CUDA (links cudart and cublasLt)
 *
 * Pointers: for device_kind 1 (CPU) host pointers; for device_kind 2 (CUDA) device
 * pointers, weights included (weights_base must stay valid until destroy()), and
 * `stream` is a cudaStream_t (NULL = the default stream). Tensors are dense row-major.
 * For CUDA, inputs, outputs, weights_base and workspace must be 16-byte aligned.
 *
 * Every function returning int returns BYOC_JSON_OK (0) or one of the codes below;
 * byoc_json_engine_last_error() then names what was wrong (thread-local; valid until the
 * next failing call on the same thread).
 */
#ifndef BYOC_JSON_ENGINE_H_
#define BYOC_JSON_ENGINE_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  BYOC_JSON_OK = 0,
  BYOC_JSON_ERROR_ARGUMENT = 1,    /* a NULL pointer, bad device_kind, bad options */
  BYOC_JSON_ERROR_PARSE = 2,       /* the text is not valid JSON within the limits */
  BYOC_JSON_ERROR_SCHEMA = 3,      /* valid JSON, but not a valid version-1 graph */
  BYOC_JSON_ERROR_UNSUPPORTED = 4, /* a valid graph the engine cannot run (on this device) */
  BYOC_JSON_ERROR_DEVICE = 5,      /* CUDA or cuBLASLt reported an error */
  BYOC_JSON_ERROR_INTERNAL = 6     /* out of host memory, or a bug */
};

enum { BYOC_JSON_DEVICE_CPU = 1, BYOC_JSON_DEVICE_CUDA = 2 };

/* options: NULL, "" or "key=value;key=value" with keys
 *   workspace_limit=BYTES   cuBLASLt workspace per matmul (default 33554432)
 *   timed_selection=0|1     1: time the top `candidates` algorithms at create (default 0)
 *   candidates=N            1..64 (default 8)
 *   fuse_erf_gelu=0|1       1: fuse exact (erf) gelu into cuBLASLt's GELU epilogue, which
 *                           computes the tanh approximation (default 0: exact, unfused)
 *   tf32=0|1                1: float32 matmuls on TF32 tensor cores, as torch's
 *                           allow_tf32 and TensorRT's default (default 0: exact float32)
 * Unknown keys and malformed values are errors. */
int byoc_json_engine_create(const char* json, size_t json_len, const void* weights_base,
                            size_t weights_bytes, int device_kind, const char* options,
                            void** engine);

/* inputs/outputs in the order of the graph's "inputs" and "outputs";
 * workspace_bytes must be at least byoc_json_engine_workspace(engine). */
int byoc_json_engine_run(void* engine, void* const* inputs, void* const* outputs,
                         void* workspace, size_t workspace_bytes, void* stream);

/* Whether the graph's interface is the one the caller passes: num_inputs inputs of
 * input_bytes[i] bytes each and num_outputs outputs of output_bytes[i] (the sizes the
 * caller's buffers have, which the engine cannot see). A graph that differs (a library
 * edited after its build, its checksum forged too) is a BYOC_JSON_ERROR_SCHEMA naming the
 * tensor, before any run reads or writes past a buffer. */
int byoc_json_engine_check_interface(void* engine, size_t num_inputs, const size_t* input_bytes,
                                     size_t num_outputs, const size_t* output_bytes);
/* Workspace bytes run() needs: intermediates + cuBLASLt workspace. */
size_t byoc_json_engine_workspace(void* engine);

/* A human-readable description of the plan create() made (steps, fused epilogues,
 * chosen algorithms, workspace, create time). Owned by the engine. */
const char* byoc_json_engine_describe(void* engine);

void byoc_json_engine_destroy(void* engine);

const char* byoc_json_engine_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* BYOC_JSON_ENGINE_H_ */
