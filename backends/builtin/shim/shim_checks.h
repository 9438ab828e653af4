// Error reporting, argument checks and the dtype dispatch that the CPU shim (cpu/) and the
// CUDA shim (cuda/) share: host code only, one definition for both, so that both report
// the same message for the same bad call. Each shim brings these names into its
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
#include <type_traits>

#include "byoc_shim.h"

namespace byoc_shim_checks {

// The integer storage types the shims compute with: int64, int32, int16, int8, uint8 (bool
// moves only; other integers are no byoc dtype).
template <class T>
constexpr bool kIntegerStorage = std::is_same<T, int64_t>::value || std::is_same<T, int32_t>::value ||
                                 std::is_same<T, int16_t>::value || std::is_same<T, int8_t>::value ||
                                 std::is_same<T, uint8_t>::value;

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

// The dtypes this shim has kernels for, a bit per byoc_dtype value: a model build passes
// the ones its generated code names (-DBYOC_SHIM_DTYPES=..., backends/builtin), so that
// a float16 model does not compile every family's kernels for five other types; every
// dtype by default (the shim's own tests, a build that does not say).
#ifndef BYOC_SHIM_DTYPES
#define BYOC_SHIM_DTYPES 0xFFFFFFFFu  // every dtype, today's and any added later
#endif
constexpr bool compiled_in(byoc_dtype dtype) { return ((BYOC_SHIM_DTYPES) >> static_cast<int>(dtype)) & 1; }

// Calls visit(Storage{}) with the storage type of `dtype`, if the entry point accepts it:
// the floats always (Half and BFloat16 are the shim's types of the 16-bit floats), the
// integers with kIntegers, bool with kBool, and only dtypes compiled in (BYOC_SHIM_DTYPES).
// Otherwise records an error naming `function` and returns kUnsupportedDtype. `visit` is a
// generic lambda returning int; it is instantiated only for accepted types. Each shim
// wraps this as its dispatch<DtypeSet>.
template <class Half, class BFloat16, bool kIntegers, bool kBool, class Visit>
int dispatch_dtype(const char* function, byoc_dtype dtype, Visit&& visit) {
  bool accepted = true;
  switch (dtype) {
    case BYOC_FLOAT32: if constexpr (compiled_in(BYOC_FLOAT32)) return visit(float{}); break;
    case BYOC_FLOAT16: if constexpr (compiled_in(BYOC_FLOAT16)) return visit(Half{}); break;
    case BYOC_BFLOAT16: if constexpr (compiled_in(BYOC_BFLOAT16)) return visit(BFloat16{}); break;
    case BYOC_FLOAT64: if constexpr (compiled_in(BYOC_FLOAT64)) return visit(double{}); break;
    case BYOC_INT64: if constexpr (kIntegers && compiled_in(BYOC_INT64)) return visit(int64_t{}); accepted = kIntegers; break;
    case BYOC_INT32: if constexpr (kIntegers && compiled_in(BYOC_INT32)) return visit(int32_t{}); accepted = kIntegers; break;
    case BYOC_INT16: if constexpr (kIntegers && compiled_in(BYOC_INT16)) return visit(int16_t{}); accepted = kIntegers; break;
    case BYOC_INT8: if constexpr (kIntegers && compiled_in(BYOC_INT8)) return visit(int8_t{}); accepted = kIntegers; break;
    case BYOC_UINT8: if constexpr (kIntegers && compiled_in(BYOC_UINT8)) return visit(uint8_t{}); accepted = kIntegers; break;
    case BYOC_BOOL: if constexpr (kBool && compiled_in(BYOC_BOOL)) return visit(bool{}); accepted = kBool; break;
    default:
      return fail(kUnsupportedDtype, function, "dtype %d is not a byoc_dtype", static_cast<int>(dtype));
  }
  if (accepted) {
    return fail(kUnsupportedDtype, function, "dtype %s has no kernels in this library's shim (it was built "
                "for the dtypes its model's code names; BYOC_SHIM_DTYPES)", dtype_name(dtype));
  }
  return fail(kUnsupportedDtype, function, "dtype %s is not supported (expected %s)", dtype_name(dtype),
              kIntegers ? "a float or integer dtype" : "a float dtype");
}

// ---------------------------------------------------------------- shapes

// The product of `count` sizes (1 for none).
inline int64_t product(const int64_t* values, int count) {
  int64_t result = 1;
  for (int i = 0; i < count; ++i) result *= values[i];
  return result;
}

// Row-major dense element strides of `shape`.
inline void dense_strides(const int64_t* shape, int ndim, int64_t* strides) {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
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

// Every size and attribute of one conv2d call (names as in byoc_shim.h).
struct ConvShape {
  int64_t batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h, out_w;
  int64_t stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, groups;
  int64_t group_in_channels() const { return in_channels / groups; }
  int64_t group_out_channels() const { return out_channels / groups; }
  bool empty() const { return batch == 0 || out_channels == 0 || out_h == 0 || out_w == 0; }  // no output
};

// The geometry of byoc_shim_pool2d's arguments.
struct PoolShape {
  int64_t batch, channels, in_h, in_w, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w;
  int64_t pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w;
  bool empty() const { return batch == 0 || channels == 0 || out_h == 0 || out_w == 0; }  // no output
};

// byoc_shim_conv2d's arguments (every size, attribute and, unless the output is empty, pointer).
inline int check_conv2d(const char* function, const void* in, const void* weight, const void* out, int layout,
                        const ConvShape& s) {
  if (layout != kLayoutNCHW && layout != kLayoutNHWC) {
    return fail(kInvalidArgument, function, "layout is %d; expected 0 (NCHW) or 1 (NHWC)", layout);
  }
  BYOC_CHECK(check_size(function, "batch", s.batch));
  BYOC_CHECK(check_size(function, "in_channels", s.in_channels));
  BYOC_CHECK(check_size(function, "in_h", s.in_h));
  BYOC_CHECK(check_size(function, "in_w", s.in_w));
  BYOC_CHECK(check_size(function, "out_channels", s.out_channels));
  BYOC_CHECK(check_size(function, "out_h", s.out_h));
  BYOC_CHECK(check_size(function, "out_w", s.out_w));
  BYOC_CHECK(check_positive(function, "kernel_h", s.kernel_h));
  BYOC_CHECK(check_positive(function, "kernel_w", s.kernel_w));
  BYOC_CHECK(check_positive(function, "stride_h", s.stride_h));
  BYOC_CHECK(check_positive(function, "stride_w", s.stride_w));
  BYOC_CHECK(check_size(function, "pad_top", s.pad_top));
  BYOC_CHECK(check_size(function, "pad_left", s.pad_left));
  BYOC_CHECK(check_positive(function, "dilation_h", s.dilation_h));
  BYOC_CHECK(check_positive(function, "dilation_w", s.dilation_w));
  BYOC_CHECK(check_positive(function, "groups", s.groups));
  if (s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0) {
    return fail(kInvalidArgument, function, "groups %lld must divide in_channels %lld and out_channels %lld",
                static_cast<long long>(s.groups), static_cast<long long>(s.in_channels),
                static_cast<long long>(s.out_channels));
  }
  if (!s.empty()) {
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


// ---------------------------------------------------------------- linalg, reductions

// byoc_shim_matmul's sizes (byoc_shim_matmul_heuristic_count checks these alone).
inline int check_matmul_sizes(const char* function, int64_t batch, int64_t m, int64_t n, int64_t k) {
  BYOC_CHECK(check_size(function, "batch", batch));
  BYOC_CHECK(check_size(function, "m", m));
  BYOC_CHECK(check_size(function, "n", n));
  BYOC_CHECK(check_size(function, "k", k));
  return 0;
}

// byoc_shim_matmul's sizes and pointers: none when C is empty, and A and B only when the
// depth k is not 0 (C is then zeros).
inline int check_matmul(const char* function, const void* a, const void* b, const void* c, int64_t batch, int64_t m,
                        int64_t n, int64_t k) {
  BYOC_CHECK(check_matmul_sizes(function, batch, m, n, k));
  if (batch == 0 || m == 0 || n == 0) return 0;
  if (k > 0) {
    BYOC_CHECK(check_pointer(function, "a", a));
    BYOC_CHECK(check_pointer(function, "b", b));
  }
  return check_pointer(function, "c", c);
}

// The kinds of byoc_shim_reduce.
enum ReduceKind { kSum = 0, kMean = 1, kMax = 2, kMin = 3, kProd = 4 };

// byoc_shim_reduce's arguments. An empty output (outer or inner 0) needs no pointer; an
// empty axis (n == 0) needs no input: the output is the reduction's identity.
inline int check_reduce(const char* function, const void* in, const void* out, int kind, int64_t outer, int64_t n,
                        int64_t inner) {
  if (kind < kSum || kind > kProd) {
    return fail(kInvalidArgument, function, "kind is %d; expected 0 (sum), 1 (mean), 2 (max), 3 (min) or 4 (prod)",
                kind);
  }
  BYOC_CHECK(check_size(function, "outer", outer));
  BYOC_CHECK(check_size(function, "n", n));
  BYOC_CHECK(check_size(function, "inner", inner));
  if (outer == 0 || inner == 0) return 0;
  if (n > 0) BYOC_CHECK(check_pointer(function, "in", in));
  return check_pointer(function, "out", out);
}

// byoc_shim_arg_reduce's arguments: as byoc_shim_reduce's, but an empty axis has no index.
inline int check_arg_reduce(const char* function, const void* in, const void* out, int kind, int64_t outer,
                            int64_t n, int64_t inner) {
  if (kind != 0 && kind != 1) return fail(kInvalidArgument, function, "kind is %d; expected 0 (argmax) or 1 (argmin)", kind);
  BYOC_CHECK(check_size(function, "outer", outer));
  BYOC_CHECK(check_size(function, "n", n));
  BYOC_CHECK(check_size(function, "inner", inner));
  if (outer == 0 || inner == 0) return 0;
  if (n == 0) return fail(kInvalidArgument, function, "n is 0; an empty axis has no index to return");
  BYOC_CHECK(check_pointer(function, "in", in));
  return check_pointer(function, "out", out);
}

// ---------------------------------------------------------------- data movement

inline int check_index_dtype(const char* function, byoc_dtype index_dtype) {
  if (index_dtype != BYOC_INT64 && index_dtype != BYOC_INT32) {
    return fail(kUnsupportedDtype, function, "index_dtype is %s; expected int64 or int32", dtype_name(index_dtype));
  }
  return 0;
}

// byoc_shim_copy_strided's arguments (out_strides may be NULL: dense); the data pointers
// only when the copy is not empty (product(shape, ndim) != 0).
inline int check_copy_strided(const char* function, const void* in, const void* out, int elem_size, int ndim,
                              const int64_t* shape, const int64_t* in_strides) {
  BYOC_CHECK(check_ndim(function, ndim));
  BYOC_CHECK(check_positive(function, "elem_size", elem_size));
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(function, "shape", shape));
    BYOC_CHECK(check_pointer(function, "in_strides", in_strides));
  }
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) {
      return fail(kInvalidArgument, function, "shape[%d] is %lld; expected >= 0", d, static_cast<long long>(shape[d]));
    }
  }
  if (product(shape, ndim) == 0) return 0;
  BYOC_CHECK(check_pointer(function, "in", in));
  return check_pointer(function, "out", out);
}

// byoc_shim_concat's arguments; the data pointers only where a part (or the output) is
// not empty.
inline int check_concat(const char* function, const void* const* ins, int parts, const int64_t* row_bytes,
                        int64_t rows, const void* out) {
  if (parts < 0 || rows < 0) {
    return fail(kInvalidArgument, function, "parts = %d and rows = %lld; expected both >= 0", parts,
                static_cast<long long>(rows));
  }
  if (parts == 0) return 0;
  BYOC_CHECK(check_pointer(function, "row_bytes", row_bytes));  // read even when rows is 0
  if (rows == 0) {
    for (int i = 0; i < parts; ++i) {
      if (row_bytes[i] < 0) {
        return fail(kInvalidArgument, function, "row_bytes[%d] is %lld; expected >= 0", i,
                    static_cast<long long>(row_bytes[i]));
      }
    }
    return 0;
  }
  BYOC_CHECK(check_pointer(function, "ins", ins));
  int64_t total = 0;
  for (int i = 0; i < parts; ++i) {
    if (row_bytes[i] < 0) {
      return fail(kInvalidArgument, function, "row_bytes[%d] is %lld; expected >= 0", i,
                  static_cast<long long>(row_bytes[i]));
    }
    if (row_bytes[i] > 0) BYOC_CHECK(check_pointer(function, "ins[i]", ins[i]));
    total += row_bytes[i];
  }
  return total == 0 ? 0 : check_pointer(function, "out", out);
}

// byoc_shim_tile's arguments; fills out_shape (ndim entries: in_shape times repeats). The
// data pointers only when the output is not empty.
inline int check_tile(const char* function, const void* in, const void* out, int elem_size, int ndim,
                      const int64_t* in_shape, const int64_t* repeats, int64_t* out_shape) {
  BYOC_CHECK(check_ndim(function, ndim));
  BYOC_CHECK(check_positive(function, "elem_size", elem_size));
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(function, "in_shape", in_shape));
    BYOC_CHECK(check_pointer(function, "repeats", repeats));
  }
  for (int d = 0; d < ndim; ++d) {
    if (in_shape[d] < 0 || repeats[d] < 0) {
      return fail(kInvalidArgument, function, "in_shape[%d] = %lld and repeats[%d] = %lld; expected both >= 0", d,
                  static_cast<long long>(in_shape[d]), d, static_cast<long long>(repeats[d]));
    }
    out_shape[d] = in_shape[d] * repeats[d];
  }
  if (product(out_shape, ndim) == 0) return 0;
  BYOC_CHECK(check_pointer(function, "in", in));
  return check_pointer(function, "out", out);
}

// byoc_shim_gather's element size, index dtype and sizes (the pointers and indices each
// shim checks where it can: the CPU reads every index first, the GPU clamps and reports).
inline int check_gather_sizes(const char* function, int elem_size, byoc_dtype index_dtype, int64_t outer,
                              int64_t axis_len, int64_t inner, int64_t num_indices) {
  BYOC_CHECK(check_positive(function, "elem_size", elem_size));
  BYOC_CHECK(check_index_dtype(function, index_dtype));
  BYOC_CHECK(check_size(function, "outer", outer));
  BYOC_CHECK(check_size(function, "axis_len", axis_len));
  BYOC_CHECK(check_size(function, "inner", inner));
  return check_size(function, "num_indices", num_indices);
}

// byoc_shim_gather_elements's arguments but the index values; the data pointers only when
// the output is not empty (product(shape, ndim) != 0).
inline int check_gather_elements(const char* function, const void* data, const void* indices, const void* out,
                                 int elem_size, byoc_dtype index_dtype, int ndim, const int64_t* data_shape,
                                 const int64_t* shape, int axis) {
  BYOC_CHECK(check_positive(function, "elem_size", elem_size));
  BYOC_CHECK(check_index_dtype(function, index_dtype));
  BYOC_CHECK(check_ndim(function, ndim));
  if (ndim == 0) return fail(kInvalidArgument, function, "ndim is 0; expected a rank of at least 1");
  BYOC_CHECK(check_pointer(function, "data_shape", data_shape));
  BYOC_CHECK(check_pointer(function, "shape", shape));
  if (axis < 0 || axis >= ndim) return fail(kInvalidArgument, function, "axis is %d; expected 0..%d", axis, ndim - 1);
  for (int d = 0; d < ndim; ++d) {
    if (data_shape[d] < 0 || shape[d] < 0) {
      return fail(kInvalidArgument, function, "data_shape[%d] = %lld, shape[%d] = %lld; expected sizes >= 0", d,
                  static_cast<long long>(data_shape[d]), d, static_cast<long long>(shape[d]));
    }
    if (d != axis && shape[d] > data_shape[d]) {
      return fail(kInvalidArgument, function, "shape[%d] = %lld exceeds data_shape[%d] = %lld off the gathered axis",
                  d, static_cast<long long>(shape[d]), d, static_cast<long long>(data_shape[d]));
    }
  }
  if (product(shape, ndim) == 0) return 0;
  BYOC_CHECK(check_pointer(function, "data", data));
  BYOC_CHECK(check_pointer(function, "indices", indices));
  return check_pointer(function, "out", out);
}

// The modes of byoc_shim_pad.
constexpr int kPadConstant = 0;
constexpr int kPadReflect = 1;
constexpr int kPadEdge = 2;

// byoc_shim_pad's rank and mode (checked before its dtype on the GPU, which needs the
// element size early).
inline int check_pad_mode(const char* function, int ndim, int mode) {
  BYOC_CHECK(check_ndim(function, ndim));
  if (mode != kPadConstant && mode != kPadReflect && mode != kPadEdge) {
    return fail(kInvalidArgument, function, "mode is %d; expected 0 (constant), 1 (reflect) or 2 (edge)", mode);
  }
  return 0;
}

// Per dim of a pad: the kept (uncropped) input range [low, high) and the output size.
struct PadExtents {
  int64_t low[BYOC_SHIM_MAX_DIMS];
  int64_t high[BYOC_SHIM_MAX_DIMS];
  int64_t out_shape[BYOC_SHIM_MAX_DIMS];
};

// byoc_shim_pad's shapes and pads (negative pads crop), after check_pad_mode; fills
// `extents`. The data pointers only when the output is not empty.
inline int check_pad(const char* function, const void* in, const void* out, int ndim, const int64_t* in_shape,
                     const int64_t* pads_begin, const int64_t* pads_end, int mode, PadExtents* extents) {
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(function, "in_shape", in_shape));
    BYOC_CHECK(check_pointer(function, "pads_begin", pads_begin));
    BYOC_CHECK(check_pointer(function, "pads_end", pads_end));
  }
  for (int d = 0; d < ndim; ++d) {
    const int64_t size = in_shape[d], before = pads_begin[d], after = pads_end[d];
    if (size < 0) {
      return fail(kInvalidArgument, function, "in_shape[%d] is %lld; expected >= 0", d, static_cast<long long>(size));
    }
    const int64_t low = before < 0 ? -before : 0;
    const int64_t high = size + (after < 0 ? after : 0);
    const int64_t kept = high - low;
    if (kept < 0) {
      return fail(kInvalidArgument, function, "pads %lld/%lld crop more than the %lld elements of dim %d",
                  static_cast<long long>(before), static_cast<long long>(after), static_cast<long long>(size), d);
    }
    // Reflection mirrors without repeating the edge element, so it needs more elements
    // than the widest pad; a single reflection is then always enough.
    const int64_t largest = before > after ? (before > 0 ? before : 0) : (after > 0 ? after : 0);
    if (mode == kPadReflect && largest > 0 && largest >= kept) {
      return fail(kInvalidArgument, function, "reflect padding of %lld on dim %d needs more than %lld elements there",
                  static_cast<long long>(largest), d, static_cast<long long>(kept));
    }
    if (mode == kPadEdge && largest > 0 && kept == 0) {
      return fail(kInvalidArgument, function, "edge padding of dim %d needs at least one element there", d);
    }
    extents->low[d] = low;
    extents->high[d] = high;
    extents->out_shape[d] = kept + (before > 0 ? before : 0) + (after > 0 ? after : 0);
  }
  if (product(extents->out_shape, ndim) == 0) return 0;
  BYOC_CHECK(check_pointer(function, "in", in));
  return check_pointer(function, "out", out);
}

// byoc_shim_trilu's arguments; the data pointers only when the output is not empty.
inline int check_trilu(const char* function, const void* in, const void* out, int elem_size, int64_t batch,
                       int64_t rows, int64_t cols) {
  BYOC_CHECK(check_positive(function, "elem_size", elem_size));
  return check_sizes_then_pointers(function, {{"batch", batch}, {"rows", rows}, {"cols", cols}},
                                   {{"in", in}, {"out", out}});
}

// byoc_shim_squeeze_excitation's arguments (the CUDA shim checks alignment besides); the
// data pointers only when the output is not empty (the biases may be NULL).
inline int check_squeeze_excitation(const char* function, const void* in, const void* w1, const void* w2,
                                    const void* out, int64_t batch, int64_t pixels, int64_t channels,
                                    int64_t squeeze, int activation, int gate) {
  for (const int kind : {activation, gate}) {
    if (kind < BYOC_ACTIVATION_IDENTITY || kind > BYOC_ACTIVATION_HARD_SIGMOID) {
      return fail(kInvalidArgument, function, "activation %d is not a byoc_activation (0..%d)", kind,
                  static_cast<int>(BYOC_ACTIVATION_HARD_SIGMOID));
    }
  }
  BYOC_CHECK(check_positive(function, "pixels", pixels));
  BYOC_CHECK(check_positive(function, "channels", channels));
  BYOC_CHECK(check_positive(function, "squeeze", squeeze));
  if (channels % 8 != 0 || channels > BYOC_SE_MAX_CHANNELS) {
    return fail(kInvalidArgument, function, "channels is %lld; expected a multiple of 8 up to %d",
                static_cast<long long>(channels), BYOC_SE_MAX_CHANNELS);
  }
  if (squeeze > BYOC_SE_MAX_SQUEEZE) {
    return fail(kInvalidArgument, function, "squeeze is %lld; expected at most %d", static_cast<long long>(squeeze),
                BYOC_SE_MAX_SQUEEZE);
  }
  return check_sizes_then_pointers(function, {{"batch", batch}},
                                   {{"in", in}, {"w1", w1}, {"w2", w2}, {"out", out}});
}

}  // namespace byoc_shim_checks

#endif  // BYOC_SHIM_CHECKS_H_
