// Internal header of the CUDA shim (backends/builtin/shim/cuda/*.cu): error reporting,
// argument checks, per-dtype traits (host and device), the dtype dispatch that turns a
// runtime byoc_dtype into a template argument, launch helpers and warp/block reductions.
//
// Not part of the ABI: generated code only sees byoc_shim.h. Semantics follow the CPU
// shim (../cpu/) and the NumPy references in byoc/ops/*.py.
#ifndef BYOC_SHIM_CUDA_CUH_
#define BYOC_SHIM_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../byoc_shim.h"
#include "../shim_checks.h"
#include "pdl.cuh"

namespace byoc_shim_cuda {

// ---------------------------------------------------------------- errors

// Error reporting, return codes and argument checks: shared with the CPU shim
// (../shim_checks.h, which also defines BYOC_CHECK).
using namespace byoc_shim_checks;  // fail, dtype_name/size, check_*, the k* codes

// After a kernel launch: reports a launch error (bad configuration, no device, a sticky
// error from earlier work) without synchronizing the stream.
int check_launch(const char* function);
// Reports a failed CUDA runtime call (`what` names it).
int check_cuda(const char* function, const char* what, cudaError_t status);

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Errors that only a kernel can see (an out-of-range index read from device memory): the
// kernel clamps and writes the number of the model's call that launched it into the
// running model's status word (mapped host memory), which the model reports at its next
// run (byoc_model_run) or status check (byoc_model_status). Outside a model (the shim's
// own tests) word is NULL and nothing is reported.
struct RunStatus {
  unsigned int* word;
  unsigned int call;
};
RunStatus current_run_status();

__device__ inline void report_to(const RunStatus& status) {
  if (status.word != nullptr) *reinterpret_cast<volatile unsigned int*>(status.word) = status.call;
}

// ---------------------------------------------------------------- launch helpers

constexpr int kThreads = 256;  // threads per block of the elementwise-style kernels
// Grid-stride loops cover any size; more blocks than this only add scheduling overhead.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

inline unsigned int blocks_for(int64_t work_items, int threads_per_block = kThreads) {
  int64_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned int>(blocks);
}

// Whether every index below `count` fits in a signed 32-bit integer (32-bit index math
// is markedly cheaper on the GPU: divisions and multiplies are half the instructions).
inline bool fits_int32(int64_t count) { return count >= 0 && count < (int64_t{1} << 31); }

// Kernels that pick 32-bit indexing by their own bounds need every index below this one
// (with room for a grid-stride loop's last step, which may pass the end by a whole grid
// before it stops).
constexpr int64_t kIndex32Limit = int64_t{1} << 30;

inline bool aligned_to(const void* pointer, size_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// ---------------------------------------------------------------- dtype traits (device)

// Traits<Storage>:
//   Compute     the type one value is worked on in (float for the 16-bit floats and
//               float32, double for float64, int64_t for every integer);
//   Accumulate  the type sums and products run in: float / double for floats, unsigned
//               long long for integers (unsigned so overflow wraps as NumPy's int64 does;
//               the cast back to a narrower type wraps too);
//   load/store  conversions between storage and Compute (stores round to nearest even).
template <class Storage, class = void>
struct Traits;

template <>
struct Traits<float> {
  using Compute = float;
  using Accumulate = float;
  static constexpr bool is_float = true;
  __host__ __device__ static float load(float value) { return value; }
  __host__ __device__ static float store(float value) { return value; }
  __device__ static float lowest() { return -__int_as_float(0x7f800000); }
  __device__ static float highest() { return __int_as_float(0x7f800000); }
};

template <>
struct Traits<double> {
  using Compute = double;
  using Accumulate = double;
  static constexpr bool is_float = true;
  __host__ __device__ static double load(double value) { return value; }
  __host__ __device__ static double store(double value) { return value; }
  __device__ static double lowest() { return -__longlong_as_double(0x7ff0000000000000ll); }
  __device__ static double highest() { return __longlong_as_double(0x7ff0000000000000ll); }
};

template <>
struct Traits<__half> {
  using Compute = float;
  using Accumulate = float;
  static constexpr bool is_float = true;
  __device__ static float load(__half value) { return __half2float(value); }
  __device__ static __half store(float value) { return __float2half_rn(value); }
  __device__ static float lowest() { return -__int_as_float(0x7f800000); }
  __device__ static float highest() { return __int_as_float(0x7f800000); }
};

template <>
struct Traits<__nv_bfloat16> {
  using Compute = float;
  using Accumulate = float;
  static constexpr bool is_float = true;
  __device__ static float load(__nv_bfloat16 value) { return __bfloat162float(value); }
  __device__ static __nv_bfloat16 store(float value) { return __float2bfloat16_rn(value); }
  __device__ static float lowest() { return -__int_as_float(0x7f800000); }
  __device__ static float highest() { return __int_as_float(0x7f800000); }
};

// The range of each integer type, spelled out: std::numeric_limits is host-only without
// --expt-relaxed-constexpr, and the shim must build with the plain flags.
template <class Int>
struct IntRange;
template <>
struct IntRange<int64_t> {
  static constexpr int64_t low = -9223372036854775807ll - 1, high = 9223372036854775807ll;
};
template <>
struct IntRange<int32_t> {
  static constexpr int64_t low = -2147483648ll, high = 2147483647ll;
};
template <>
struct IntRange<int16_t> {
  static constexpr int64_t low = -32768, high = 32767;
};
template <>
struct IntRange<int8_t> {
  static constexpr int64_t low = -128, high = 127;
};
template <>
struct IntRange<uint8_t> {
  static constexpr int64_t low = 0, high = 255;
};

template <class Int>
struct IntTraits {
  using Compute = int64_t;
  using Accumulate = unsigned long long;
  static constexpr bool is_float = false;
  __host__ __device__ static int64_t load(Int value) { return static_cast<int64_t>(value); }
  // Keeps the low bits (two's complement wrap-around, like NumPy's astype).
  __host__ __device__ static Int store(int64_t value) {
    return static_cast<Int>(static_cast<unsigned long long>(value));
  }
  __device__ static int64_t lowest() { return IntRange<Int>::low; }
  __device__ static int64_t highest() { return IntRange<Int>::high; }
};
// int64, int32, int16, int8 and uint8 (the IntRange types; bool is not a number here: below)
template <class Int>
struct Traits<Int, std::enable_if_t<byoc_shim_checks::kIntegerStorage<Int>>> : IntTraits<Int> {};

// A storage value straight into an accumulator (integers sign-extend to 64 bits before
// becoming unsigned, so the wrap-around arithmetic stays exact).
template <class Accumulate, class Storage>
__device__ __forceinline__ Accumulate load_as(Storage value) {
  return static_cast<Accumulate>(Traits<Storage>::load(value));
}

// An accumulator back into storage (floats round once; integers keep the low bits).
template <class Storage, class Accumulate>
__device__ __forceinline__ Storage store_from(Accumulate value) {
  using T = Traits<Storage>;
  if constexpr (T::is_float) {
    return T::store(static_cast<typename T::Compute>(value));
  } else {
    return T::store(static_cast<int64_t>(value));
  }
}

__device__ __forceinline__ bool is_nan(float value) { return value != value; }
__device__ __forceinline__ bool is_nan(double value) { return value != value; }
__device__ __forceinline__ bool is_nan(int64_t) { return false; }
__device__ __forceinline__ bool is_nan(unsigned long long) { return false; }

// max/min that propagate NaN (as NumPy's max/min; fmaxf would drop it).
template <class T>
__device__ __forceinline__ T nan_max(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return a > b ? a : b;
}
template <class T>
__device__ __forceinline__ T nan_min(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return a < b ? a : b;
}

// ---------------------------------------------------------------- dispatch

enum class DtypeSet { kFloats, kNumbers };

// Calls visit(Storage{}) with the storage type of `dtype` if `dtype` is in `kAllowed`;
// otherwise records an error naming `function` and returns kUnsupportedDtype (see
// dispatch_dtype in ../shim_checks.h, shared with the CPU shim). bool moves only
// (copy_strided, pad, ... take an element size), so no dispatch accepts it.
template <DtypeSet kAllowed, class Visit>
int dispatch(const char* function, byoc_dtype dtype, Visit&& visit) {
  return dispatch_dtype<__half, __nv_bfloat16, kAllowed == DtypeSet::kNumbers, false>(function, dtype, visit);
}

// ---------------------------------------------------------------- opaque elements

// Elements that only move are copied as unsigned integers of their width (one load and
// one store each; 16 bytes is a uint4 vector access).
template <int kBytes>
struct BlobType;
template <>
struct BlobType<1> { using type = uint8_t; };
template <>
struct BlobType<2> { using type = uint16_t; };
template <>
struct BlobType<4> { using type = uint32_t; };
template <>
struct BlobType<8> { using type = unsigned long long; };
template <>
struct BlobType<16> { using type = uint4; };

// Calls visit(Blob{}) for the element sizes 1, 2, 4, 8, 16; returns -1 for others.
template <class Visit>
int visit_blob(int elem_size, Visit&& visit) {
  switch (elem_size) {
    case 1: return visit(BlobType<1>::type{});
    case 2: return visit(BlobType<2>::type{});
    case 4: return visit(BlobType<4>::type{});
    case 8: return visit(BlobType<8>::type{});
    case 16: return visit(BlobType<16>::type{});
    default: return -1;
  }
}

// The widest power of two <= 16 that divides `bytes` and every pointer given.
inline int common_alignment(size_t bytes, const void* a, const void* b = nullptr) {
  int width = 16;
  while (width > 1 && (bytes % width != 0 || !aligned_to(a, width) || (b != nullptr && !aligned_to(b, width))))
    width /= 2;
  return width;
}

// Element type and count of "units" per element for kernels that take any elem_size:
// visit(Blob{}, units) with the widest power-of-two word that divides the element and
// keeps both pointers aligned.
template <class Visit>
int visit_units(int elem_size, const void* a, const void* b, Visit&& visit) {
  const int width = common_alignment(static_cast<size_t>(elem_size), a, b);
  const int units = elem_size / width;
  return visit_blob(width, [&](auto blob) { return visit(blob, units); });
}

// ---------------------------------------------------------------- reductions in a group

// A lane's value from the lane `offset` away (xor); overloaded (found by argument-dependent
// lookup) for the structs that reductions carry, such as argmax's (value, index).
template <class T>
__device__ __forceinline__ T shuffle_xor(T value, int offset) {
  return __shfl_xor_sync(0xffffffffu, value, offset);
}

// Butterfly reduction over the 32 lanes of a warp; every lane gets the result.
template <class T, class Combine>
__device__ __forceinline__ T warp_all_reduce(T value, Combine combine) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = combine(value, shuffle_xor(value, offset));
  return value;
}

// Reduction over a whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds 32 values; the block synchronizes twice.
template <class T, class Combine>
__device__ __forceinline__ T block_all_reduce(T value, Combine combine, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  value = warp_all_reduce(value, combine);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  T result = scratch[0];
  for (int w = 1; w < warps; ++w) result = combine(result, scratch[w]);
  return result;
}

// ---------------------------------------------------------------- shared with conv2d

// cuBLASLt GEMM of row-major operands (linalg.cu), for the float dtypes: C[b] = A[b] *
// B[b] as byoc_shim_matmul documents. Used by conv2d's 1x1 fast path. Returns 0, or a
// code after recording an error that names `function`; sets *unsupported (and records
// nothing) when cuBLASLt offers no algorithm, so that the caller can fall back.
int lt_matmul(const char* function, const void* a, const void* b, void* c, byoc_dtype dtype, int64_t batch,
              int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t batch_stride_a,
              int64_t batch_stride_b, int64_t batch_stride_c, int algo, void* workspace, size_t workspace_bytes,
              cudaStream_t stream, bool* unsupported);

}  // namespace byoc_shim_cuda

#endif  // BYOC_SHIM_CUDA_CUH_
