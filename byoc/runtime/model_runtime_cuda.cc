// The model runtime's CUDA part (cuda models only): the device check, device memory and
// streams, the kernels' status word, and running the calls as a CUDA graph.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "model_runtime_internal.h"

#define BYOC_EXPORT extern "C" __attribute__((visibility("default")))

// Errors kernels find while they run (an out-of-range Gather index, clamped): the shim asks
// for the running model's status word (mapped host memory) and the number of the call being
// launched, and its kernels write that number there. A later byoc_model_run or
// byoc_model_status reports it, once the run has finished.
namespace byoc_runtime {
namespace internal {
thread_local unsigned int* current_status_word = nullptr;
thread_local unsigned int current_call = 0;
}  // namespace internal
}  // namespace byoc_runtime

extern "C" __attribute__((visibility("hidden"))) void byoc_current_run_status(unsigned int** word,
                                                                               unsigned int* call) {
  *word = byoc_runtime::internal::current_status_word;
  *call = byoc_runtime::internal::current_call;
}

namespace byoc_runtime {
namespace internal {

namespace {

// byoc_model_create's device queries: where there is no GPU or no driver, say so in those
// words (the CUDA runtime's own message for a machine without a driver is "CUDA driver
// version is insufficient for CUDA runtime version").
int device_unavailable(cudaError_t status, const char* what) {
  const std::string arch = "sm_" + std::to_string(spec.arch_number);
  if (status == cudaErrorInsufficientDriver) {
    return fail("this model runs on an NVIDIA GPU (built for " + arch + "), but this machine has no NVIDIA "
                "driver, or one older than its CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
                std::to_string(CUDART_VERSION % 1000 / 10) + " runtime needs (libcuda.so.1); install or update the "
                "NVIDIA driver, or build the model for the cpu target");
  }
  if (status == cudaErrorNoDevice) {
    return fail("this model runs on an NVIDIA GPU (built for " + arch + "), but no CUDA device is visible "
                "(is CUDA_VISIBLE_DEVICES empty?); run it on a machine with one, or build the model for the cpu target");
  }
  return cuda_failed(status, what);
}

}  // namespace

int cuda_failed(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return 0;
  return fail(std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

int device_alloc(unsigned char** out, uint64_t bytes, const char* what) {
  *out = nullptr;
  if (bytes == 0) return 0;
  return cuda_failed(cudaMalloc(reinterpret_cast<void**>(out), bytes), what);
}

void device_free(unsigned char* p) {
  if (p) cudaFree(p);
}

// The variants' archs as "sm_80 (and PTX), sm_90", for messages.
std::string built_archs() {
  std::string text;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const int32_t arch = spec.variants[v].arch_number ? spec.variants[v].arch_number : spec.arch_number;
    const std::string entry = "sm_" + std::to_string(arch) + (spec.variants[v].arch_ptx ? " (and PTX)" : "");
    if (text.find(entry) == std::string::npos) text += (text.empty() ? "" : ", ") + entry;
  }
  return text;
}

// The arch of the variants a model created on a device of arch `device_arch` runs
// (choose_arch), or the one $BYOC_ARCH names ("sm_80"), which a test sets to run an older
// arch's kernels (their PTX) on a newer GPU. 0 with the error set where none can run.
int32_t chosen_arch(int device_arch, int device, const char* device_name) {
  const char* forced = std::getenv("BYOC_ARCH");
  int32_t wanted = 0;
  if (forced != nullptr && *forced != '\0') {
    const char* digits = std::strncmp(forced, "sm_", 3) == 0 ? forced + 3 : forced;
    char* end = nullptr;
    const long number = std::strtol(digits, &end, 10);
    // sm_80, sm_90a or 80: two or three digits, an "a" at most after them
    const bool whole = end != digits && (*end == '\0' || (end[0] == 'a' && end[1] == '\0'));
    wanted = whole && number >= 10 && number <= 999 ? static_cast<int32_t>(number) : 0;
    if (wanted <= 0) {
      fail(std::string("BYOC_ARCH is '") + forced + "'; expected an arch like sm_80 (this model has " +
           built_archs() + ")");
      return 0;
    }
  }
  int32_t archs[32], count = 0;  // the distinct (arch, PTX) pairs of the variants
  bool ptx[32];
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const int32_t arch = spec.variants[v].arch_number ? spec.variants[v].arch_number : spec.arch_number;
    bool seen = false;
    for (int32_t i = 0; i < count && !seen; ++i) seen = archs[i] == arch && ptx[i] == spec.variants[v].arch_ptx;
    if (seen || count == 32) continue;
    archs[count] = arch;
    ptx[count++] = spec.variants[v].arch_ptx;
  }
  const int32_t chosen = choose_arch(archs, ptx, count, device_arch, wanted);
  if (chosen != 0) return chosen;
  const std::string device_text = "CUDA device " + std::to_string(device) + " (" + device_name + ") is sm_" +
                                  std::to_string(device_arch);
  if (wanted != 0) {
    fail("BYOC_ARCH asks for sm_" + std::to_string(wanted) + ", but this model has " + built_archs() + " and " +
         device_text + ": none of that arch runs there");
  } else {
    fail("this model was built for " + built_archs() + ", but " + device_text + "; rebuild it with target 'cuda "
         "-arch=sm_" + std::to_string(device_arch) + "' (or list sm_" + std::to_string(device_arch) +
         " in the config's arch)");
  }
  return 0;
}

// The device a model is created on must exist and run the kernels of one of the archs the
// model was compiled for (`*arch`: which).
int check_device(int32_t requested, int* device, int32_t* arch) {
  int count = 0;
  cudaError_t queried = cudaGetDeviceCount(&count);
  if (queried != cudaSuccess) return device_unavailable(queried, "cudaGetDeviceCount");
  if (requested < -1 || requested >= count) {
    return fail("device " + std::to_string(requested) + ": expected a CUDA device from 0 to " +
                std::to_string(count - 1) + " (this process sees " + std::to_string(count) + "; CUDA_VISIBLE_DEVICES " +
                "chooses which), or -1 for the calling thread's current device");
  }
  *device = requested;
  if (requested == -1) {
    queried = cudaGetDevice(device);
    if (queried != cudaSuccess) return device_unavailable(queried, "cudaGetDevice");
  }
  cudaDeviceProp props;
  queried = cudaGetDeviceProperties(&props, *device);
  if (queried != cudaSuccess) return device_unavailable(queried, "cudaGetDeviceProperties");
  *arch = chosen_arch(props.major * 10 + props.minor, *device, props.name);
  return *arch == 0 ? 1 : 0;
}

// Device memory, the status word, the capture stream and the host-side buffers.
int allocate_cuda(byoc_model* model, const unsigned char* host_weights, unsigned char** sidecar) {
  if (device_alloc(&model->weights, spec.weights_bytes, "allocating the weights") ||
      (spec.weights_bytes && cuda_failed(cudaMemcpy(model->weights, host_weights, spec.weights_bytes,
                                                    cudaMemcpyHostToDevice), "copying the weights to the device"))) {
    return 1;
  }
  model->owns_weights = true;
  bool devices = false, cuda_graph = false;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    devices = devices || spec.variants[v].devices;
    cuda_graph = cuda_graph || spec.variants[v].cuda_graph;
  }
  if (devices) {
    model->host_weights = host_weights;
    model->owned_host_weights = *sidecar;  // cpu functions read the weights from it
    *sidecar = nullptr;
  }
  model->workspace_bytes = largest(&VariantSpec::workspace_bytes);
  if (device_alloc(&model->arena, largest(&VariantSpec::arena_bytes), "allocating the activation arena") ||
      device_alloc(&model->workspace, model->workspace_bytes, "allocating the workspace")) {
    return 1;
  }
  // Mapped (and, with unified addressing, the same pointer on the device): kernels write it
  // and the host reads it without a copy or a synchronization.
  if (cuda_failed(cudaHostAlloc(reinterpret_cast<void**>(&model->status_word), sizeof(unsigned int),
                                cudaHostAllocMapped), "allocating the status word")) {
    return 1;
  }
  *model->status_word = 0;
  if (cuda_graph && cuda_failed(cudaStreamCreateWithFlags(&model->capture_stream, cudaStreamNonBlocking),
                                 "creating the capture stream")) {
    return 1;
  }
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    if (!variant.cuda_graph) continue;
    byoc_variant_instance& instance = model->variants[v];
    instance.graph_in = new (std::nothrow) void*[variant.num_inputs + 1]();
    instance.graph_out = new (std::nothrow) void*[variant.num_outputs + 1]();
    instance.graph_execs = new (std::nothrow) cudaGraphExec_t[program_of(v).num_regions + 1]();
    if (instance.graph_in == nullptr || instance.graph_out == nullptr || instance.graph_execs == nullptr) {
      return fail("out of host memory");
    }
  }
  if (!devices) return 0;
  const uint64_t host_arena_bytes = largest(&VariantSpec::host_arena_bytes);
  const uint64_t pinned_arena_bytes = largest(&VariantSpec::pinned_arena_bytes);
  model->host_workspace_bytes = largest(&VariantSpec::host_workspace_bytes);
  // Host-side buffers: 256-byte aligned like the planned offsets; the staging arena is
  // page-locked so that copies to and from the GPU run asynchronously on the stream.
  if (host_arena_bytes) {
    model->host_arena = static_cast<unsigned char*>(std::aligned_alloc(256, (host_arena_bytes + 255) / 256 * 256));
  }
  if (model->host_workspace_bytes) {
    model->host_workspace =
        static_cast<unsigned char*>(std::aligned_alloc(256, (model->host_workspace_bytes + 255) / 256 * 256));
  }
  if ((host_arena_bytes && model->host_arena == nullptr) ||
      (model->host_workspace_bytes && model->host_workspace == nullptr)) {
    return fail("out of host memory allocating the host arena");
  }
  if (pinned_arena_bytes &&
      cuda_failed(cudaMallocHost(reinterpret_cast<void**>(&model->pinned_arena), pinned_arena_bytes),
                  "allocating the pinned host arena")) {
    return 1;
  }
  return 0;
}

// An error a kernel of an earlier run wrote into the status word (see
// byoc_current_run_status): reported once, then cleared.
int take_reported_error(byoc_model* model) {
  volatile unsigned int* word = model->status_word;
  const unsigned int call = *word;
  if (call == 0) return 0;
  *word = 0;
  const char* label = call_label(call);
  return fail(std::string("an earlier run of this model read indices out of range in call ") + label +
              " (clamped to the nearest valid index, so its outputs are wrong); expected every index in "
              "[-size, size) of its axis");
}

// Captures region `r`'s calls into graph_execs[r]: a new executable graph, or ("update":
// the same calls, other pointers) the old one updated in place, which is cheaper where the
// update is allowed. 0: captured; 1: an error (byoc_last_error says it); 2: the calls
// cannot be captured (a backend that synchronizes or allocates at run time).
int capture_region(byoc_model* model, const Variant& variant, int32_t r, void* const* in, void* const* out) {
  const byoc_runtime::Region& region = variant.program.regions[r];
  // Thread-local mode: only this thread's unsafe calls (an allocation, a synchronization)
  // end the capture; other threads' calls do not.
  if (cuda_failed(cudaStreamBeginCapture(model->capture_stream, cudaStreamCaptureModeThreadLocal),
                  "starting CUDA graph capture")) {
    return 1;
  }
  const int status = run_calls(model, variant, in, out, model->capture_stream, static_cast<int32_t>(region.first_call),
                               static_cast<int32_t>(region.first_call + region.num_calls));
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(model->capture_stream, &graph);
  cudaError_t made = cudaErrorUnknown;
  const bool captured = status == 0 && ended == cudaSuccess && graph != nullptr;
  cudaGraphExec_t& exec = variant.instance.graph_execs[r];
  if (captured && exec != nullptr) {
    cudaGraphExecUpdateResultInfo update_info;
    made = cudaGraphExecUpdate(exec, graph, &update_info);
    if (made != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  }
  if (captured && exec == nullptr) {
    cudaGraphExec_t instantiated = nullptr;
    made = cudaGraphInstantiate(&instantiated, graph, 0);
    if (made == cudaSuccess) exec = instantiated;
  }
  if (graph) cudaGraphDestroy(graph);
  if (made == cudaSuccess) return 0;
  cudaGetLastError();
  std::fprintf(stderr, "byoc: CUDA graph capture failed (%s); the model runs without graphs\n",
               status != 0 ? byoc_last_error() : cudaGetErrorString(ended != cudaSuccess ? ended : made));
  return 2;
}

// CUDA graphs: the first run executes the calls directly; the second captures each
// capturing region of program.regions into its own graph, later runs replay them, and the
// calls between regions (a cpu function, a copy between memories) always run directly on
// the caller's stream, in order with the graphs. "copy": the calls always see the same
// (planned) pointers, the caller's tensors are copied in before and out after. "update":
// the graphs read and write the caller's tensors; other pointers re-capture them and
// update the executable graphs in place.
int run_graph(byoc_model* model, const Variant& variant, void* const* in, void* const* out, cudaStream_t run_stream) {
  const Program& program = variant.program;
  const VariantSpec& v = variant.spec;
  byoc_variant_instance& instance = variant.instance;
  bool same_pointers = true;
  if (v.graph_io_update) {
    for (int32_t i = 0; same_pointers && i < v.num_inputs; ++i) same_pointers = instance.graph_in[i] == in[i];
    for (int32_t i = 0; same_pointers && i < v.num_outputs; ++i) same_pointers = instance.graph_out[i] == out[i];
  }
  for (int32_t i = 0; i < program.num_input_copies; ++i) {
    const byoc_runtime::Copy& copy = program.input_copies[i];
    void* destination = resolve(model, copy.ref, in, out);
    if (destination == in[copy.tensor]) continue;  // a padded input, put there already (model_padding.cc)
    if (copy_bytes(destination, in[copy.tensor], copy.bytes, run_stream, "copying input",
                   copy.tensor)) {
      return 1;
    }
  }
  if (!instance.warmed_up || instance.capture_failed) {
    if (run_calls(model, variant, in, out, run_stream, 0, program.num_calls) != 0) return 1;
    instance.warmed_up = true;
    return 0;
  }
  for (int32_t r = 0; r < program.num_regions; ++r) {
    const byoc_runtime::Region& region = program.regions[r];
    if (region.capture && !instance.capture_failed && (instance.graph_execs[r] == nullptr || !same_pointers)) {
      const int captured = capture_region(model, variant, r, in, out);
      if (captured == 1) return 1;
      if (captured == 2) {
        // run directly from now on, this region included: no graph is replayed again
        for (int32_t other = 0; other < program.num_regions; ++other) {
          if (instance.graph_execs[other]) cudaGraphExecDestroy(instance.graph_execs[other]);
          instance.graph_execs[other] = nullptr;
        }
        instance.capture_failed = true;
      }
    }
    if (!region.capture || instance.capture_failed) {
      if (run_calls(model, variant, in, out, run_stream, static_cast<int32_t>(region.first_call),
                    static_cast<int32_t>(region.first_call + region.num_calls)) != 0) {
        return 1;
      }
    } else if (cuda_failed(cudaGraphLaunch(instance.graph_execs[r], run_stream), "launching a CUDA graph")) {
      return 1;
    }
  }
  if (v.graph_io_update && !instance.capture_failed) {
    for (int32_t i = 0; i < v.num_inputs; ++i) instance.graph_in[i] = in[i];
    for (int32_t i = 0; i < v.num_outputs; ++i) instance.graph_out[i] = out[i];
  }
  return 0;
}

}  // namespace internal
}  // namespace byoc_runtime

using byoc_runtime::internal::fail;
using byoc_runtime::internal::take_reported_error;

// 0 when every finished run of the model went well; else 1 and byoc_last_error() names the
// call whose kernel found an error (reported once). Does not wait for queued work.
BYOC_EXPORT int byoc_model_status(byoc_model* model) {
  if (model == nullptr) return fail("byoc_model_status: the model is NULL");
  return take_reported_error(model);
}
