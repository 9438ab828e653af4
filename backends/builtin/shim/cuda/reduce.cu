// Reductions over the middle axis of (outer, n, inner): reduce (sum, mean, max, min, prod)
// and arg_reduce (argmax, argmin).
//
// Two kernel shapes, both reducing in parallel within a block:
//   inner == 1  the reduced elements of a row are contiguous: a warp per row (short rows,
//               eight rows per block) or a whole block per row (long rows), each thread
//               striding over the row, then a shuffle (and shared-memory) reduction;
//   inner > 1   a block covers up to 32 neighbouring inner columns of one outer index
//               (coalesced rows) with up to 1024 threads splitting n, then combines the
//               partial results in a shared-memory tree.
// Each reduction is an "Op": its Value, identity, how one element enters, the combine
// (associative and commutative, so the parallel order gives the serial result up to
// float rounding) and the final store.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

// ---------------------------------------------------------------- ops
// (ReduceKind, kSum .. kProd: ../shim_checks.h, shared with the CPU shim)

template <class Storage, int kKind>
struct ReduceOp {
  using In = Storage;
  using T = Traits<Storage>;
  using Out = Storage;
  static constexpr bool kExtreme = kKind == kMax || kKind == kMin;
  // Sums and products run in the accumulate type; max/min compare in the compute type.
  using Value = typename std::conditional<kExtreme, typename T::Compute, typename T::Accumulate>::type;

  __device__ static Value identity(int64_t n) {
    if (kKind == kMax) return T::lowest();  // -inf, or the dtype's minimum
    if (kKind == kMin) return T::highest();
    if (kKind == kProd) return Value(1);
    // A sum over nothing is +0; otherwise start from -0.0 so that a sum of -0.0 stays
    // -0.0 (NumPy's starts from the first element).
    if constexpr (T::is_float) return n == 0 ? Value(0) : -Value(0);
    return Value(0);
  }
  __device__ static Value make(Storage x, int64_t) {
    if constexpr (kExtreme) {
      return T::load(x);
    } else {
      return load_as<Value>(x);
    }
  }
  __device__ static Value combine(Value a, Value b) {
    if constexpr (kKind == kMax) return nan_max(a, b);
    if constexpr (kKind == kMin) return nan_min(a, b);
    if constexpr (kKind == kProd) return a * b;
    return a + b;
  }
  __device__ static Out finish(Value v, int64_t n) {
    if constexpr (kExtreme) {
      return T::store(v);
    } else if constexpr (kKind == kMean) {
      if constexpr (T::is_float) {
        return store_from<Storage>(v / static_cast<Value>(n));  // NaN when n == 0
      } else {
        // The int64 total divided with truncation toward zero (ONNX ReduceMean); 0 over nothing.
        const int64_t total = static_cast<int64_t>(v);
        return T::store(n == 0 ? int64_t{0} : total / n);
      }
    } else {
      return store_from<Storage>(v);
    }
  }
};

// argmax/argmin carry (value, index); index -1 marks "no element yet".
template <class Compute>
struct ArgValue {
  Compute value;
  int64_t index;
};

template <class Compute>
__device__ __forceinline__ ArgValue<Compute> shuffle_xor(ArgValue<Compute> v, int offset) {
  return {__shfl_xor_sync(0xffffffffu, v.value, offset), __shfl_xor_sync(0xffffffffu, v.index, offset)};
}

template <class Storage, bool kArgmax, bool kSelectLast>
struct ArgOp {
  using In = Storage;
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  using Value = ArgValue<Compute>;
  using Out = int64_t;

  __device__ static Value identity(int64_t) { return {Compute(0), -1}; }
  __device__ static Value make(Storage x, int64_t p) { return {T::load(x), p}; }
  // A total order on (is NaN, value, index): NaN is the extreme (as NumPy); among equal
  // values (or among NaNs) the first index wins, or the last with select_last_index.
  __device__ static Value combine(Value a, Value b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    const bool a_earlier = kSelectLast ? a.index > b.index : a.index < b.index;
    bool a_wins;
    if (a_nan || b_nan) {
      a_wins = a_nan && (!b_nan || a_earlier);
    } else if (a.value == b.value) {
      a_wins = a_earlier;
    } else {
      a_wins = kArgmax ? a.value > b.value : a.value < b.value;
    }
    return a_wins ? a : b;
  }
  __device__ static Out finish(Value v, int64_t) { return v.index; }
};

// ---------------------------------------------------------------- kernels

constexpr int kRowBlockThreads = 1024;  // a block per long row (at most)
constexpr int64_t kWarpRowLimit = 4096;  // rows up to this length get a warp each

// inner == 1. kWarpPerRow: each warp of a 256-thread block reduces its own row;
// otherwise the whole block reduces one row. Threads stride over the row (coalesced).
template <class Op, bool kWarpPerRow>
__global__ void __launch_bounds__(kRowBlockThreads)
    reduce_rows_kernel(const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                       int64_t rows, int64_t n) {
  byoc_pdl::begin_after_previous();
  using Value = typename Op::Value;
  __shared__ Value scratch[32];
  const int group_size = kWarpPerRow ? 32 : blockDim.x;
  const int member = kWarpPerRow ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t groups_per_block = kWarpPerRow ? blockDim.x / 32 : 1;
  const int64_t first_row = blockIdx.x * groups_per_block + (kWarpPerRow ? threadIdx.x / 32 : 0);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  // Every thread of a block runs the same number of iterations (block_all_reduce
  // synchronizes): rows past the end reduce nothing and store nothing.
  const int64_t row_limit = kWarpPerRow ? rows : ((rows + row_step - 1) / row_step) * row_step;
  for (int64_t row = first_row; row < row_limit; row += row_step) {
    const bool valid = row < rows;
    Value value = Op::identity(n);
    if (valid) {
      const typename Op::In* row_in = in + row * n;
      for (int64_t p = member; p < n; p += group_size) value = Op::combine(value, Op::make(row_in[p], p));
    }
    auto combine = [](Value a, Value b) { return Op::combine(a, b); };
    value = kWarpPerRow ? warp_all_reduce(value, combine) : block_all_reduce(value, combine, scratch);
    if (valid && member == 0) out[row] = Op::finish(value, n);
  }
}

// inner > 1: a block of (width, split) threads owns `width` neighbouring inner columns of
// one outer index (consecutive threadIdx.x read consecutive addresses); threadIdx.y splits
// n, and the split partial results meet in a shared-memory tree. The shape adapts
// (launch_reduction): 32 columns wide normally, narrower when there are too few columns
// to fill the GPU, and up to 1024 threads so that a handful of blocks still keep many
// loads in flight (there is no workspace for a cross-block second pass).
constexpr int kColumnBlockThreads = 1024;
constexpr int64_t kColumnBlocksWanted = 132;  // one block per SM of an H100
constexpr int64_t kResidentThreads = 132 * 2048;  // threads an H100 keeps resident

template <class Op>
__global__ void __launch_bounds__(kColumnBlockThreads)
    reduce_columns_kernel(const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out, int64_t outer,
                          int64_t n, int64_t inner, int64_t column_blocks) {
  byoc_pdl::begin_after_previous();
  using Value = typename Op::Value;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Value* partial = reinterpret_cast<Value*>(shared_bytes);  // [split][width]
  const int width = blockDim.x, split = blockDim.y;
  const int slot = threadIdx.y * width + threadIdx.x;
  const int64_t blocks = outer * column_blocks;
  for (int64_t block = blockIdx.x; block < blocks; block += gridDim.x) {
    const int64_t o = block / column_blocks;
    const int64_t column = (block % column_blocks) * width + threadIdx.x;
    Value value = Op::identity(n);
    if (column < inner) {
      const typename Op::In* base = in + o * n * inner + column;
#pragma unroll 4
      for (int64_t p = threadIdx.y; p < n; p += split) value = Op::combine(value, Op::make(base[p * inner], p));
    }
    partial[slot] = value;
    __syncthreads();
    for (int half = split / 2; half > 0; half /= 2) {  // split is a power of two
      if (static_cast<int>(threadIdx.y) < half) partial[slot] = Op::combine(partial[slot], partial[slot + half * width]);
      __syncthreads();
    }
    if (threadIdx.y == 0 && column < inner) out[o * inner + column] = Op::finish(partial[threadIdx.x], n);
    __syncthreads();  // partial is rewritten by the next block-iteration
  }
}

template <class Op>
int launch_reduction(const char* function, const void* in, void* out, int64_t outer, int64_t n, int64_t inner,
                     cudaStream_t stream) {
  const auto* source = static_cast<const typename Op::In*>(in);
  auto* destination = static_cast<typename Op::Out*>(out);
  if (inner == 1) {
    if (n <= kWarpRowLimit) {
      const int64_t rows_per_block = kThreads / 32;
      const int64_t blocks = (outer + rows_per_block - 1) / rows_per_block;
      byoc_pdl::launch_after_previous(reduce_rows_kernel<Op, true>,
          static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0, stream, source, destination,
          outer, n);
    } else {
      // Few rows: bigger blocks keep more loads in flight per row.
      const int threads = outer < kColumnBlocksWanted * 2 ? kRowBlockThreads : kRowBlockThreads / 2;
      byoc_pdl::launch_after_previous(reduce_rows_kernel<Op, false>,
          static_cast<unsigned>(outer < kMaxBlocks ? outer : kMaxBlocks), threads, 0, stream, source, destination,
          outer, n);
    }
  } else {
    // Narrower tiles (down to 4 columns) when 32-wide ones would leave SMs idle, and no
    // wider than the columns there are; then as many splits of n as fit in 1024 threads.
    int width = 32;
    while (width > 1 && width / 2 >= inner) width /= 2;
    while (width > 4 && outer * ((inner + width - 1) / width) < kColumnBlocksWanted) width /= 2;
    const int64_t column_blocks = (inner + width - 1) / width;
    const int64_t blocks = outer * column_blocks;
    // Enough threads in all to fill the GPU (at least 8 splits, for loads in flight).
    int64_t split_limit = kResidentThreads / (blocks * width);
    if (split_limit < 8) split_limit = 8;
    int split = 1;
    while (split * 2 * width <= kColumnBlockThreads && split * 2 <= n && split * 2 <= split_limit) split *= 2;
    const size_t shared = static_cast<size_t>(width) * split * sizeof(typename Op::Value);
    byoc_pdl::launch_after_previous(reduce_columns_kernel<Op>,
        static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), dim3(width, split), shared, stream, source,
        destination, outer, n, inner, column_blocks);
  }
  return check_launch(function);
}

}  // namespace

extern "C" int byoc_shim_reduce(const void* in, void* out, byoc_dtype dtype, int kind, int64_t outer, int64_t n,
                                int64_t inner, void* stream) {
  static const char kFunction[] = "byoc_shim_reduce";
  BYOC_CHECK(check_reduce(kFunction, in, out, kind, outer, n, inner));
  const bool empty = outer == 0 || inner == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    switch (kind) {
      case kSum: return launch_reduction<ReduceOp<Storage, kSum>>(kFunction, in, out, outer, n, inner, cuda_stream);
      case kMean: return launch_reduction<ReduceOp<Storage, kMean>>(kFunction, in, out, outer, n, inner, cuda_stream);
      case kMax: return launch_reduction<ReduceOp<Storage, kMax>>(kFunction, in, out, outer, n, inner, cuda_stream);
      case kMin: return launch_reduction<ReduceOp<Storage, kMin>>(kFunction, in, out, outer, n, inner, cuda_stream);
      default: return launch_reduction<ReduceOp<Storage, kProd>>(kFunction, in, out, outer, n, inner, cuda_stream);
    }
  });
}

extern "C" int byoc_shim_arg_reduce(const void* in, int64_t* out, byoc_dtype dtype, int kind, int64_t outer,
                                    int64_t n, int64_t inner, int select_last_index, void* stream) {
  static const char kFunction[] = "byoc_shim_arg_reduce";
  BYOC_CHECK(check_arg_reduce(kFunction, in, out, kind, outer, n, inner));
  const bool empty = outer == 0 || inner == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    const bool last = select_last_index != 0;
    if (kind == 0) {
      return last ? launch_reduction<ArgOp<Storage, true, true>>(kFunction, in, out, outer, n, inner, cuda_stream)
                  : launch_reduction<ArgOp<Storage, true, false>>(kFunction, in, out, outer, n, inner, cuda_stream);
    }
    return last ? launch_reduction<ArgOp<Storage, false, true>>(kFunction, in, out, outer, n, inner, cuda_stream)
                : launch_reduction<ArgOp<Storage, false, false>>(kFunction, in, out, outer, n, inner, cuda_stream);
  });
}
