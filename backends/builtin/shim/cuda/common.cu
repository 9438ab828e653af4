// The CUDA shim's error message, exported through the ABI, and its CUDA-specific checks.
// Reporting and the argument checks are shared with the CPU shim: ../shim_checks.h.
#include "shim_cuda.cuh"

namespace byoc_shim_cuda {

int check_cuda(const char* function, const char* what, cudaError_t status) {
  if (status == cudaSuccess) return 0;
  return fail(kCudaError, function, "%s failed: %s (%s)", what, cudaGetErrorName(status),
              cudaGetErrorString(status));
}

int check_launch(const char* function) { return check_cuda(function, "kernel launch", cudaGetLastError()); }

}  // namespace byoc_shim_cuda

// Defined by a model's host code (templates/host/model.cc.j2); weak, so that the shim also
// links alone.
extern "C" __attribute__((weak)) void byoc_current_run_status(unsigned int** word, unsigned int* call);

namespace byoc_shim_cuda {

RunStatus current_run_status() {
  RunStatus status{nullptr, 0};
  if (byoc_current_run_status != nullptr) byoc_current_run_status(&status.word, &status.call);
  return status;
}

}  // namespace byoc_shim_cuda

extern "C" const char* byoc_shim_last_error(void) { return byoc_shim_checks::last_error_message; }
