// The CUDA shim's error reporting and the argument checks every entry point shares.
#include <cstdio>

#include "shim_cuda.cuh"

namespace byoc_shim_cuda {

namespace {
// One message per thread, in static storage: reporting an error allocates nothing.
thread_local char last_error_message[512] = "";
}  // namespace

int fail(int code, const char* function, const char* format, ...) {
  int written = std::snprintf(last_error_message, sizeof last_error_message, "%s: ", function);
  if (written < 0 || written >= static_cast<int>(sizeof last_error_message)) written = 0;
  va_list arguments;
  va_start(arguments, format);
  std::vsnprintf(last_error_message + written, sizeof last_error_message - written, format, arguments);
  va_end(arguments);
  return code;
}

const char* dtype_name(byoc_dtype dtype) {
  switch (dtype) {
    case BYOC_FLOAT32: return "float32";
    case BYOC_FLOAT16: return "float16";
    case BYOC_BFLOAT16: return "bfloat16";
    case BYOC_FLOAT64: return "float64";
    case BYOC_INT64: return "int64";
    case BYOC_INT32: return "int32";
    case BYOC_INT16: return "int16";
    case BYOC_INT8: return "int8";
    case BYOC_UINT8: return "uint8";
    case BYOC_BOOL: return "bool";
  }
  return "unknown";
}

size_t dtype_size(byoc_dtype dtype) {
  switch (dtype) {
    case BYOC_FLOAT64: case BYOC_INT64: return 8;
    case BYOC_FLOAT32: case BYOC_INT32: return 4;
    case BYOC_FLOAT16: case BYOC_BFLOAT16: case BYOC_INT16: return 2;
    case BYOC_INT8: case BYOC_UINT8: case BYOC_BOOL: return 1;
  }
  return 0;
}

int check_pointer(const char* function, const char* name, const void* pointer) {
  if (pointer == nullptr) return fail(kInvalidArgument, function, "%s is NULL", name);
  return 0;
}

int check_size(const char* function, const char* name, int64_t value) {
  if (value < 0) {
    return fail(kInvalidArgument, function, "%s is %lld; expected a non-negative size", name,
                static_cast<long long>(value));
  }
  return 0;
}

int check_positive(const char* function, const char* name, int64_t value) {
  if (value < 1) {
    return fail(kInvalidArgument, function, "%s is %lld; expected a positive value", name,
                static_cast<long long>(value));
  }
  return 0;
}

int check_ndim(const char* function, int ndim) {
  if (ndim < 0 || ndim > BYOC_SHIM_MAX_DIMS) {
    return fail(kInvalidArgument, function, "ndim is %d; expected 0..%d", ndim, BYOC_SHIM_MAX_DIMS);
  }
  return 0;
}

int check_cuda(const char* function, const char* what, cudaError_t status) {
  if (status == cudaSuccess) return 0;
  return fail(kCudaError, function, "%s failed: %s (%s)", what, cudaGetErrorName(status),
              cudaGetErrorString(status));
}

int check_launch(const char* function) { return check_cuda(function, "kernel launch", cudaGetLastError()); }

}  // namespace byoc_shim_cuda

extern "C" const char* byoc_shim_last_error(void) { return byoc_shim_cuda::last_error_message; }
