// Error reporting and argument checks that the CPU shim (cpu/) and the CUDA shim (cuda/)
// share: host code only, one definition for both. Each shim brings these names into its
// own namespace (shim_cpu.h, shim_cuda.cuh) and exports the message through
// byoc_shim_last_error() (its common.cpp / common.cu).
//
// Not part of the ABI: generated code only sees byoc_shim.h.
#ifndef BYOC_SHIM_CHECKS_H_
#define BYOC_SHIM_CHECKS_H_

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "byoc_shim.h"

namespace byoc_shim_checks {

// Return codes (the ABI only promises "nonzero"; distinct codes help when debugging).
constexpr int kInvalidArgument = 1;
constexpr int kIndexOutOfRange = 2;
constexpr int kUnsupportedDtype = 3;
constexpr int kCudaError = 4;
constexpr int kCublasError = 5;

// One message per thread, in static storage: reporting an error allocates nothing.
inline thread_local char last_error_message[512] = "";

// Records "<function>: <printf-formatted message>" as this thread's last error and
// returns `code`, so that a check reads `return fail(code, kFunction, "...", ...)`.
inline int fail(int code, const char* function, const char* format, ...) __attribute__((format(printf, 3, 4)));
inline int fail(int code, const char* function, const char* format, ...) {
  int written = std::snprintf(last_error_message, sizeof last_error_message, "%s: ", function);
  if (written < 0 || written >= static_cast<int>(sizeof last_error_message)) written = 0;
  va_list arguments;
  va_start(arguments, format);
  std::vsnprintf(last_error_message + written, sizeof last_error_message - written, format, arguments);
  va_end(arguments);
  return code;
}

inline const char* dtype_name(byoc_dtype dtype) {
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

// Bytes per element; 0 for an unknown dtype.
inline size_t dtype_size(byoc_dtype dtype) {
  switch (dtype) {
    case BYOC_FLOAT64: case BYOC_INT64: return 8;
    case BYOC_FLOAT32: case BYOC_INT32: return 4;
    case BYOC_FLOAT16: case BYOC_BFLOAT16: case BYOC_INT16: return 2;
    case BYOC_INT8: case BYOC_UINT8: case BYOC_BOOL: return 1;
  }
  return 0;
}

// Argument checks shared by every entry point. Each returns 0 or the error code after
// recording a message that names `function` and the argument.
inline int check_pointer(const char* function, const char* name, const void* pointer) {
  if (pointer == nullptr) return fail(kInvalidArgument, function, "%s is NULL", name);
  return 0;
}

inline int check_size(const char* function, const char* name, int64_t value) {  // value >= 0
  if (value < 0) {
    return fail(kInvalidArgument, function, "%s is %lld; expected a non-negative size", name,
                static_cast<long long>(value));
  }
  return 0;
}

inline int check_positive(const char* function, const char* name, int64_t value) {  // value >= 1
  if (value < 1) {
    return fail(kInvalidArgument, function, "%s is %lld; expected a positive value", name,
                static_cast<long long>(value));
  }
  return 0;
}

inline int check_ndim(const char* function, int ndim) {  // 0 <= ndim <= BYOC_SHIM_MAX_DIMS
  if (ndim < 0 || ndim > BYOC_SHIM_MAX_DIMS) {
    return fail(kInvalidArgument, function, "ndim is %d; expected 0..%d", ndim, BYOC_SHIM_MAX_DIMS);
  }
  return 0;
}

}  // namespace byoc_shim_checks

// Evaluates a check and returns its error code from the calling function on failure.
#define BYOC_CHECK(expression)                          \
  do {                                                  \
    int byoc_check_code = (expression);                 \
    if (byoc_check_code != 0) return byoc_check_code;   \
  } while (0)

namespace byoc_shim_checks {

struct NamedSize {
  const char* name;
  int64_t value;
};
struct NamedPointer {
  const char* name;
  const void* pointer;
};

// Every size >= 0, then, unless one of them is 0 (the entry point reads and writes
// nothing), every pointer non-NULL; each in the order given, the first failure reported.
inline int check_sizes_then_pointers(const char* function, std::initializer_list<NamedSize> sizes,
                                     std::initializer_list<NamedPointer> pointers) {
  bool empty = false;
  for (const NamedSize& size : sizes) {
    BYOC_CHECK(check_size(function, size.name, size.value));
    empty = empty || size.value == 0;
  }
  if (empty) return 0;
  for (const NamedPointer& named : pointers) BYOC_CHECK(check_pointer(function, named.name, named.pointer));
  return 0;
}

// The layouts of byoc_shim_conv2d and byoc_shim_pool2d.
constexpr int kLayoutNCHW = 0;
constexpr int kLayoutNHWC = 1;

// byoc_shim_conv2d's arguments (every size, attribute and, unless the output is empty, pointer).
inline int check_conv2d(const char* function, const void* in, const void* weight, const void* out, int layout,
                        int64_t batch, int64_t in_channels, int64_t in_h, int64_t in_w, int64_t out_channels,
                        int64_t kernel_h, int64_t kernel_w, int64_t out_h, int64_t out_w, int64_t stride_h,
                        int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t dilation_h, int64_t dilation_w,
                        int64_t groups) {
  if (layout != kLayoutNCHW && layout != kLayoutNHWC) {
    return fail(kInvalidArgument, function, "layout is %d; expected 0 (NCHW) or 1 (NHWC)", layout);
  }
  BYOC_CHECK(check_size(function, "batch", batch));
  BYOC_CHECK(check_size(function, "in_channels", in_channels));
  BYOC_CHECK(check_size(function, "in_h", in_h));
  BYOC_CHECK(check_size(function, "in_w", in_w));
  BYOC_CHECK(check_size(function, "out_channels", out_channels));
  BYOC_CHECK(check_size(function, "out_h", out_h));
  BYOC_CHECK(check_size(function, "out_w", out_w));
  BYOC_CHECK(check_positive(function, "kernel_h", kernel_h));
  BYOC_CHECK(check_positive(function, "kernel_w", kernel_w));
  BYOC_CHECK(check_positive(function, "stride_h", stride_h));
  BYOC_CHECK(check_positive(function, "stride_w", stride_w));
  BYOC_CHECK(check_size(function, "pad_top", pad_top));
  BYOC_CHECK(check_size(function, "pad_left", pad_left));
  BYOC_CHECK(check_positive(function, "dilation_h", dilation_h));
  BYOC_CHECK(check_positive(function, "dilation_w", dilation_w));
  BYOC_CHECK(check_positive(function, "groups", groups));
  if (in_channels % groups != 0 || out_channels % groups != 0) {
    return fail(kInvalidArgument, function, "groups %lld must divide in_channels %lld and out_channels %lld",
                static_cast<long long>(groups), static_cast<long long>(in_channels),
                static_cast<long long>(out_channels));
  }
  if (batch != 0 && out_channels != 0 && out_h != 0 && out_w != 0) {
    BYOC_CHECK(check_pointer(function, "in", in));
    BYOC_CHECK(check_pointer(function, "weight", weight));
    BYOC_CHECK(check_pointer(function, "out", out));
  }
  return 0;
}

// byoc_shim_pool2d's arguments.
inline int check_pool2d(const char* function, const void* in, const void* out, int kind, int layout, int64_t batch,
                        int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, int64_t kernel_h,
                        int64_t kernel_w, int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                        int64_t pad_bottom, int64_t pad_right, int64_t dilation_h, int64_t dilation_w) {
  if (kind != 0 && kind != 1) return fail(kInvalidArgument, function, "kind is %d; expected 0 (max) or 1 (average)", kind);
  if (layout != kLayoutNCHW && layout != kLayoutNHWC) {
    return fail(kInvalidArgument, function, "layout is %d; expected 0 (NCHW) or 1 (NHWC)", layout);
  }
  BYOC_CHECK(check_size(function, "batch", batch));
  BYOC_CHECK(check_size(function, "channels", channels));
  BYOC_CHECK(check_size(function, "in_h", in_h));
  BYOC_CHECK(check_size(function, "in_w", in_w));
  BYOC_CHECK(check_size(function, "out_h", out_h));
  BYOC_CHECK(check_size(function, "out_w", out_w));
  BYOC_CHECK(check_positive(function, "kernel_h", kernel_h));
  BYOC_CHECK(check_positive(function, "kernel_w", kernel_w));
  BYOC_CHECK(check_positive(function, "stride_h", stride_h));
  BYOC_CHECK(check_positive(function, "stride_w", stride_w));
  BYOC_CHECK(check_size(function, "pad_top", pad_top));
  BYOC_CHECK(check_size(function, "pad_left", pad_left));
  BYOC_CHECK(check_size(function, "pad_bottom", pad_bottom));
  BYOC_CHECK(check_size(function, "pad_right", pad_right));
  BYOC_CHECK(check_positive(function, "dilation_h", dilation_h));
  BYOC_CHECK(check_positive(function, "dilation_w", dilation_w));
  if (batch != 0 && channels != 0 && out_h != 0 && out_w != 0) {
    BYOC_CHECK(check_pointer(function, "in", in));
    BYOC_CHECK(check_pointer(function, "out", out));
  }
  return 0;
}

}  // namespace byoc_shim_checks

#endif  // BYOC_SHIM_CHECKS_H_
