// The cudnn engine's parts that its two sources share: the conv's graph, the engine
// configurations cuDNN's heuristics propose, execution plans and a model instance's conv
// (cudnn_conv.cc builds and runs them; cudnn_plan_timing.cc times a conv's plans at build
// time). Internal to the engine: byoc_cudnn.h is its interface.
#ifndef BYOC_CUDNN_CONV_INTERNAL_H_
#define BYOC_CUDNN_CONV_INTERNAL_H_

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "byoc_cudnn.h"

// hidden: the engine stays inside the library that links it (only byoc_cudnn.h's
// functions are its interface)
namespace __attribute__((visibility("hidden"))) byoc_cudnn_internal {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A cuDNN or CUDA status other than success, as a Failure naming `what`.
void check(cudnnStatus_t status, const char* what);
void check_cuda(cudaError_t status, const char* what);

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &handle_), "cudnnBackendCreateDescriptor");
  }
  ~Descriptor() {
    if (handle_ != nullptr) cudnnBackendDestroyDescriptor(handle_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return handle_; }

  template <typename T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const T* values, const char* what) {
    check(cudnnBackendSetAttribute(handle_, name, type, count, values), what);
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& other, const char* what) {
    cudnnBackendDescriptor_t value = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void finalize(const char* what) { check(cudnnBackendFinalize(handle_), what); }

 private:
  cudnnBackendDescriptor_t handle_ = nullptr;
};

using Owned = std::unique_ptr<Descriptor>;

// The conv's operation graph on `handle`: its tensors and ops stay alive with it.
struct Graph {
  std::vector<Owned> parts;
  Owned graph;
};

// One engine configuration the heuristics proposed, and its engine's global index.
struct Config {
  Owned config;
  int64_t engine = -1;
  bool tensor_core = false;  // cuDNN notes that the engine runs on tensor cores (TF32 for float32)
  bool down_converts = false;  // cuDNN notes that it converts its inputs to a narrower type
};

struct Plan {
  Owned plan;
  int64_t engine = -1;
  int64_t workspace = 0;
};

struct Conv {
  ByocCudnnConv shape{};
  cudnnHandle_t handle = nullptr;
  Graph graph;
  Plan plan;
  // A variant pack per set of pointers the conv ran on (data, weight, bias, residual,
  // output, workspace), kept: one symbol serves every call site of its conv shape in the
  // model (ResNet-50 calls some three to six times a run, each on other buffers), and each
  // site's pack is made once, not again at every call.
  std::vector<std::pair<std::array<void*, 6>, Owned>> packs;
  // Four bytes of device memory that fence() sets before every execution (see there).
  void* fence_word = nullptr;
  ~Conv() {
    if (fence_word != nullptr) cudaFree(fence_word);
    packs.clear();
    plan.plan.reset();
    graph.graph.reset();
    graph.parts.clear();
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

// A conv's graph and the plans its timing will try, built ahead of the timing
// (byoc_cudnn_conv_prepare_plans): building them is the slow part (cuDNN compiles its
// runtime-fusion kernels), and convs' plans build side by side in threads, each conv with
// its own handle, while their timing runs one conv at a time.
struct PreparedPlans {
  Conv conv;
  std::vector<Plan> plans;
};

size_t element_bytes(int32_t dtype);
// The conv's operation graph on `handle`.
Graph build_graph(const ByocCudnnConv& c, cudnnHandle_t handle);
// Every configuration the heuristics propose, mode A's first, then the fallback list's
// engines mode A did not name.
std::vector<Config> all_configs(const Graph& g);
// Whether the conv may run on `config`: for a float32 conv whose tf32 is off, not an engine
// on tensor cores nor one that narrows its inputs (torch's filter for exact float32).
bool allowed(const Config& config, const ByocCudnnConv& c);
// The plan of `config`, or no plan where it does not build or needs more workspace.
Plan make_plan(const Config& config, cudnnHandle_t handle, int64_t workspace_limit);
// The conv in words, for messages.
std::string describe(const ByocCudnnConv& c);
// A conv's handle and its fence word, made before its graph and plans.
void open_conv(Conv& conv);
// Orders the conv's next execution after all earlier work on `stream` has completed.
void fence(Conv& conv, cudaStream_t stream);
// One execution of the conv's plan on these pointers (data, weight, bias, residual, output,
// workspace), fenced; builds its variant pack when they changed.
void execute(Conv& conv, void* const pointers[6], void* workspace, cudaStream_t stream);
// Records `message` as this thread's last error; returns 1.
int fail(const std::string& message);

}  // namespace byoc_cudnn_internal

#endif  // BYOC_CUDNN_CONV_INTERNAL_H_
