// How the host half of a CUTLASS kernel unit runs the kernel its device half compiled.
//
// An sm90 kernel unit is two compile units that nvcc compiles side by side: the device half
// (the kernel alone, `nvcc -cubin`: no host pass) and the host half (the kernel's types, its
// Arguments -> Params, no kernel instantiated). Each is about half of what one unit of
// both took, so the longest compile of a build is about half as long. The device half's
// cubin is embedded in the library (byoc/toolchain/embed_cubin.S); the host half loads it
// the first time it runs (byoc never captures a model's first run into a CUDA graph) and
// launches its one kernel, an extern "C" __global__ taking the Params, with the attributes
// CUTLASS's own launcher would give it (cluster shape, programmatic dependent launch).
// The Params are laid out alike on both sides: the same types, from the same headers,
// through one nvcc.
#ifndef BYOC_CUTLASS_LAUNCH_H_
#define BYOC_CUTLASS_LAUNCH_H_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdio.h>

#include <atomic>
#include <mutex>

extern "C" int byoc_report_error(const char* symbol, const char* message);

// One embedded cubin, loaded into the process the first time its kernel runs (a CUDA
// library is not bound to a context: it serves every device) and unloaded when the model
// library is. A load that fails (no such GPU, out of memory) is not remembered: the next
// call tries again.
class ByocEmbeddedKernel {
 public:
  ByocEmbeddedKernel(const void* cubin, const char* kernel_name) : cubin_(cubin), kernel_name_(kernel_name) {}
  ~ByocEmbeddedKernel() {
    // At process exit the CUDA runtime may be gone already: its answer is of no use then.
    if (library_ != nullptr) cudaLibraryUnload(library_);
  }
  ByocEmbeddedKernel(const ByocEmbeddedKernel&) = delete;
  ByocEmbeddedKernel& operator=(const ByocEmbeddedKernel&) = delete;

  // Launches the kernel with its one parameter at `params`; 0, or byoc_report_error's answer
  // naming `symbol` (the partition), `what` (the kernel) and CUDA's reason.
  int launch(const char* symbol, const char* what, dim3 grid, dim3 block, dim3 cluster, int shared_bytes,
             bool with_pdl, cudaStream_t stream, void* params) const {
    cudaKernel_t kernel = nullptr;
    const cudaError_t loaded = load(&kernel);
    if (loaded != cudaSuccess) return fail(symbol, what, "cannot be loaded", loaded);
    // Above 48 KiB of dynamic shared memory a kernel must opt in (per device: set it each
    // time, as CUTLASS's adapter does, so a second device is covered too).
    if (shared_bytes >= (48 << 10)) {
      const cudaError_t set = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
      if (set != cudaSuccess) return fail(symbol, what, "cannot have its shared memory", set);
    }
    cudaLaunchAttribute attributes[2];
    unsigned count = 0;
    const unsigned cluster_size = cluster.x * cluster.y * cluster.z;
    if (cluster_size > 8) {  // beyond the portable cluster size a kernel must opt in
      const cudaError_t set = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                                   cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (set != cudaSuccess) return fail(symbol, what, "cannot have its cluster shape", set);
    }
    if (cluster_size > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count].val.clusterDim.x = cluster.x;
      attributes[count].val.clusterDim.y = cluster.y;
      attributes[count].val.clusterDim.z = cluster.z;
      ++count;
    }
    if (with_pdl) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count].val.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
    config.stream = stream;
    config.attrs = attributes;
    config.numAttrs = count;
    void* arguments[] = {params};
    const cudaError_t launched = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), arguments);
    return launched == cudaSuccess ? 0 : fail(symbol, what, "failed to launch", launched);
  }

 private:
  static int fail(const char* symbol, const char* what, const char* doing, cudaError_t error) {
    cudaGetLastError();  // a launch's error is not sticky: clear it, as CUTLASS's launcher does
    char message[512];
    snprintf(message, sizeof message, "%s %s: %s", what, doing, cudaGetErrorString(error));
    return byoc_report_error(symbol, message);
  }

  // The kernel, loaded by the first call that gets here (later calls read it without the lock).
  cudaError_t load(cudaKernel_t* kernel) const {
    *kernel = kernel_.load(std::memory_order_acquire);
    if (*kernel != nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    *kernel = kernel_.load(std::memory_order_relaxed);
    if (*kernel != nullptr) return cudaSuccess;
    cudaLibrary_t library = nullptr;
    cudaError_t error = cudaLibraryLoadData(&library, cubin_, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (error == cudaSuccess) error = cudaLibraryGetKernel(kernel, library, kernel_name_);
    if (error != cudaSuccess) {
      if (library != nullptr) cudaLibraryUnload(library);
      *kernel = nullptr;
      return error;
    }
    library_ = library;
    kernel_.store(*kernel, std::memory_order_release);
    return cudaSuccess;
  }

  const void* cubin_;
  const char* kernel_name_;
  mutable std::mutex mutex_;
  mutable cudaLibrary_t library_ = nullptr;
  mutable std::atomic<cudaKernel_t> kernel_{nullptr};
};

// What the host half of every kernel unit does once it has the kernel's Arguments: the
// checks CUTLASS's device adapter makes (can_implement, the workspace), Arguments -> Params,
// and the launch of the device half's kernel. `Kernel`: a CUTLASS 3.x kernel type
// (GemmUniversal, ConvUniversal); `what`: its name for messages; `symbol` (the partition),
// `workspace`, `workspace_bytes` and `stream` come from the ByocCutlassCall. 0, or
// byoc_report_error's answer.
template <class Kernel>
int byoc_run_cutlass_kernel(const char* symbol, const char* what, typename Kernel::Arguments const& arguments,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            const ByocEmbeddedKernel& kernel, dim3 cluster, bool with_pdl) {
  char message[512];
  if (!Kernel::can_implement(arguments)) {
    snprintf(message, sizeof message, "CUTLASS cannot run %s on these operands (alignment?)", what);
    return byoc_report_error(symbol, message);
  }
  if (Kernel::get_workspace_size(arguments) > workspace_bytes) {
    snprintf(message, sizeof message, "workspace too small for %s", what);
    return byoc_report_error(symbol, message);
  }
  if (Kernel::initialize_workspace(arguments, workspace, stream) != cutlass::Status::kSuccess) {
    snprintf(message, sizeof message, "%s cannot set up its workspace", what);
    return byoc_report_error(symbol, message);
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(arguments, workspace);
  return kernel.launch(symbol, what, Kernel::get_grid_shape(params), Kernel::get_block_shape(), cluster,
                       Kernel::SharedStorageSize, with_pdl, stream, &params);
}

#endif  // BYOC_CUTLASS_LAUNCH_H_
