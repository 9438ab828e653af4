// Shared by the model runtime's translation units (model_runtime.cc, and for cuda models
// model_runtime_cuda.cc): the model instance and the helpers both use. Not an interface
// of the generated code (that is model_runtime.h).
#ifndef BYOC_MODEL_RUNTIME_INTERNAL_H_
#define BYOC_MODEL_RUNTIME_INTERNAL_H_

#include <string>

#include "byoc_model.h"
#include "model_runtime.h"

#if BYOC_RUNTIME_CUDA
#include <cuda_runtime.h>
#endif

// What a model instance keeps per variant (byoc_runtime::VariantSpec).
struct byoc_variant_instance {
  void** states = nullptr;  // per-instance state of the variant's stateful functions
#if BYOC_RUNTIME_CUDA
  // One executable graph per region of the variant's program (null: not captured yet, or a
  // region that runs directly).
  cudaGraphExec_t* graph_execs = nullptr;
  // The first run is not captured: library handles, kernel modules and plans that set
  // themselves up on first use do so outside the capture. The second run captures.
  bool warmed_up = false;
  bool capture_failed = false;  // then every run of the variant executes the calls directly
  // ("update") the caller's pointers the graph was captured with: other pointers
  // re-capture it and update the executable graph in place (cudaGraphExecUpdate).
  void** graph_in = nullptr;
  void** graph_out = nullptr;
#endif
};

// The memories are shared by the variants (one runs at a time), each as large as the
// largest variant needs.
struct byoc_model {
  unsigned char* weights = nullptr;  // device copy (cuda) or host copy (sidecar)
  bool owns_weights = false;
  unsigned char* arena = nullptr;
  unsigned char* workspace = nullptr;
  uint64_t workspace_bytes = 0;
  byoc_variant_instance* variants = nullptr;  // spec.num_variants of them
  int32_t arch = 0;  // cuda: the arch of the variants this instance runs (0: every variant)
  // Padded dims (model_padding.cc): per caller tensor (inputs, then outputs) that a variant
  // pads, a buffer as large as its largest variant's (else null), in staging_memory (the
  // device's; the cpu target's host memory) or, for a tensor in host memory, in
  // host_staging_memory. A padded run reads and writes these in place of the caller's.
  unsigned char** staging = nullptr;
  unsigned char* staging_memory = nullptr;
  unsigned char* host_staging_memory = nullptr;
#if BYOC_RUNTIME_CUDA
  int device = 0;  // the CUDA device the model's memory, streams and runs are on
  unsigned int* status_word = nullptr;  // mapped host memory; see byoc_current_run_status
  // The stream the calls are captured on: the model's own and non-blocking, so that work
  // other threads put on the legacy default stream meanwhile neither joins the capture nor
  // breaks it (a capturing blocking stream would be made to wait on the legacy stream).
  // Capturing executes nothing: the graph is launched on the caller's stream, in its order.
  cudaStream_t capture_stream = nullptr;
  const unsigned char* host_weights = nullptr;  // the weights in host memory, for cpu functions
  unsigned char* owned_host_weights = nullptr;  // the sidecar's bytes, kept for them
  unsigned char* host_arena = nullptr;
  unsigned char* pinned_arena = nullptr;
  unsigned char* host_workspace = nullptr;
  uint64_t host_workspace_bytes = 0;
#endif
};

namespace byoc_runtime {
namespace internal {

extern const ModelSpec& spec;  // the model's tables (byoc_model_spec)

// One variant of the model as a run sees it: its tables, its decoded program and the
// instance's state for it.
struct Variant {
  int32_t number;
  const VariantSpec& spec;
  const Program& program;
  byoc_variant_instance& instance;
};
Variant variant_of(byoc_model* model, int32_t number);

// Decodes and checks every variant's program table, once per process: 0, or 1 with the
// error set.
int load_programs();
// The decoded program of variant `number` (after load_programs).
const Program& program_of(int32_t number);
// The largest of `field` over the variants (the shared memories' sizes).
uint64_t largest(uint64_t VariantSpec::*field);
// The number the status word holds for call `index` of variant `number` (1-based, unique
// over the variants), and back.
unsigned int call_number(int32_t number, int32_t index);
const char* call_label(unsigned int call);

// Sets byoc_last_error() (thread-local) and returns 1.
int fail(const std::string& message);
// The address a Ref names in this run.
void* resolve(const byoc_model* model, const Ref& ref, void* const* in, void* const* out);
// Copies `bytes` in stream order (cuda) or at once (cpu); a failure names `what` and,
// unless negative, `number`.
int copy_bytes(void* destination, const void* source, uint64_t bytes, void* stream, const char* what,
               int32_t number);
// The variant's calls [first, end) in order, on `stream`.
int run_calls(byoc_model* model, const Variant& variant, void* const* in, void* const* out, void* stream,
              int32_t first, int32_t end);
// The activation arena, the workspace: device memory on cuda, 256-byte aligned host memory on the cpu.
int device_alloc(unsigned char** out, uint64_t bytes, const char* what);
void device_free(unsigned char* p);

// Padded dims (model_padding.cc). The staging buffers (at create), and their release.
int allocate_staging(byoc_model* model);
void free_staging(byoc_model* model);
// The smallest variant the caller's inputs fit with padding, its padded dims' sizes in
// `sizes` (spec.num_padded_dims of them); -1 when none.
int32_t padded_variant(const byoc_model* model, const byoc_dl_tensor* inputs, int32_t num_inputs, int64_t* sizes);

// Which of a library's archs (`archs[i]`, with PTX where `ptx[i]`) a device of arch
// `device_arch` runs: the highest whose machine code it runs (its major version, a minor
// not above its own: the driver runs sm_80 code on an sm_86), else the highest whose PTX
// it compiles (not above its arch); only `wanted` where that is not 0 ($BYOC_ARCH). 0:
// none runs. (A kernel built for a larger GPU's shared memory fails at its launch.)
inline int32_t choose_arch(const int32_t* archs, const bool* ptx, int32_t count, int32_t device_arch,
                           int32_t wanted) {
  int32_t native = 0, compiled = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (wanted != 0 && archs[i] != wanted) continue;
    if (archs[i] / 10 == device_arch / 10 && archs[i] % 10 <= device_arch % 10 && archs[i] > native) {
      native = archs[i];
    }
    if (ptx[i] && archs[i] <= device_arch && archs[i] > compiled) compiled = archs[i];
  }
  return native != 0 ? native : compiled;
}

// Whether `model` runs variant `v`: a variant of another arch than the instance's is left
// alone (its kernels may not run on this device; its states are never made).
inline bool runs_variant(const byoc_model* model, int32_t v) {
  const int32_t arch = byoc_model_spec.variants[v].arch_number;
  return model->arch == 0 || arch == 0 || arch == model->arch;
}
// "batch from 1 to 32, ...": the sizes run() takes by padding, for messages.
std::string padded_dims_text();
// `tensor` as the caller gives it in a run with padded dims of `sizes` (`values`: the
// variant's sizes of them).
void caller_view(const TensorSpec& tensor, const int64_t* values, const int64_t* sizes, TensorSpec* view);
// Before a padded run: each padded input copied into its staging buffer, zeros after it
// (in[] then points there), and out[] pointed at the staging buffers of the padded
// outputs (caller_out[] keeps the caller's). `caller` has the caller's tensors. With CUDA
// graphs in "copy" mode the buffers are the planned storage the graphs read and write.
int stage_inputs(byoc_model* model, const Variant& run, const VariantSpec& caller, void** in, void** out,
                 void** caller_out, void* stream);
// After it: each padded output's valid box copied into the caller's tensor.
int unstage_outputs(const VariantSpec& variant, const VariantSpec& caller, void* const* out,
                    void* const* caller_out, void* stream);

#if BYOC_RUNTIME_CUDA
// The number of the call being launched, for the kernels' status word (byoc_current_run_status).
extern thread_local unsigned int* current_status_word;
extern thread_local unsigned int current_call;

int cuda_failed(cudaError_t status, const char* what);
// The device this process runs on must be the arch the kernels were compiled for.
// The device a model is created on: `requested` (-1: the calling thread's current one),
// which must exist and be of the arch the kernels were compiled for.
int check_device(int32_t requested, int* device, int32_t* arch);

// While alive, the calling thread's current CUDA device is `device`; the one before is
// restored after (create, run and destroy work on the model's device, whatever the
// caller's thread had current).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      changed_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};
// Device memory, the status word, the capture stream and the host-side buffers.
int allocate_cuda(byoc_model* model, const unsigned char* host_weights, unsigned char** sidecar);
// An error a kernel of an earlier run reported into the status word: once, then cleared.
int take_reported_error(byoc_model* model);
// run() with CUDA graphs: direct, then each region captured, then replayed.
int run_graph(byoc_model* model, const Variant& variant, void* const* in, void* const* out, cudaStream_t run_stream);
#endif

}  // namespace internal
}  // namespace byoc_runtime

// A C ABI entry point the library exports (the version script keeps only byoc_model_* and
// byoc_last_error), defined by model_runtime.cc and model_run.cc.
#define BYOC_EXPORT extern "C" __attribute__((visibility("default")))

#endif  // BYOC_MODEL_RUNTIME_INTERNAL_H_
