// softmax / log_softmax over the middle axis of (outer, n, inner).
//
// Statistics run in the dtype's compute type (float for float32 and the 16-bit floats,
// double for float64) with the reference's formulas (byoc/ops/normalization.py): the
// maximum-shifted exponentials, each result rounded once. inner == 1: the row kernels
// of rows.cuh (a warp or a block per row, the row in registers or shared memory);
// inner > 1: a thread per column.
#include "rows.cuh"

using namespace byoc_shim_cuda;

namespace {

template <class Compute>
__device__ __forceinline__ Compute exp_of(Compute x) {
  return exp(x);  // expf for float (accurate, not __expf: results are compared to NumPy)
}
template <class Compute>
__device__ __forceinline__ Compute log_of(Compute x) {
  return log(x);
}

// ---------------------------------------------------------------- softmax

template <class Storage, bool kWarpPerRow, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_rows_kernel(const Storage* __restrict__ in, Storage* __restrict__ out, int64_t rows,
                        int64_t n, bool log, bool use_cache) {
  byoc_pdl::begin_after_previous();
  using Compute = typename Traits<Storage>::Compute;
  __shared__ Compute scratch[32];
  const RowGroup group = row_group<kWarpPerRow>();
  Compute* cache = row_cache<kWarpPerRow, Compute>(n, use_cache);
  auto max_op = [](Compute a, Compute b) { return nan_max(a, b); };
  auto sum_op = [](Compute a, Compute b) { return a + b; };
  for (int64_t row = group.first_row; row < row_loop_end<kWarpPerRow>(group, rows); row += group.row_step) {
    const bool valid = row < rows;
    const Storage* row_in = in + (valid ? row : 0) * n;
    // Subtract the maximum so exp never overflows; a NaN maximum (or an all -inf row)
    // gives NaN, as in NumPy and onnxruntime.
    Compute maximum = Traits<Storage>::lowest();
    if (valid) visit_row<Storage, kVec>(row_in, n, group, cache, false, [&](int64_t, Compute x) {
      maximum = nan_max(maximum, x);
    });
    maximum = group_all_reduce<kWarpPerRow>(maximum, max_op, scratch);
    Compute sum = Compute(0);
    if (valid) visit_row<Storage, kVec>(row_in, n, group, cache, cache != nullptr, [&](int64_t, Compute x) {
      sum += exp_of(x - maximum);
    });
    sum = group_all_reduce<kWarpPerRow>(sum, sum_op, scratch);
    if (!valid) continue;
    Storage* row_out = out + row * n;
    if (log) {
      const Compute log_sum = log_of(sum);
      write_row<Storage, kVec>(row_in, row_out, n, group, cache,
                               [&](int64_t, Compute x) { return x - maximum - log_sum; });
    } else {
      write_row<Storage, kVec>(row_in, row_out, n, group, cache,
                               [&](int64_t, Compute x) { return exp_of(x - maximum) / sum; });
    }
  }
}

// inner > 1: one thread per (outer, inner) column, three passes down n; neighbouring
// threads read neighbouring columns, so every access is a coalesced row.
template <class Storage>
__global__ void softmax_columns_kernel(const Storage* __restrict__ in, Storage* __restrict__ out, int64_t outer,
                                       int64_t n, int64_t inner, bool log) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  const int64_t columns = outer * inner;
  for (int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; column < columns;
       column += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (column / inner) * n * inner + column % inner;
    Compute maximum = T::lowest();
    for (int64_t p = 0; p < n; ++p) maximum = nan_max(maximum, T::load(in[base + p * inner]));
    Compute sum = Compute(0);
    for (int64_t p = 0; p < n; ++p) sum += exp_of(T::load(in[base + p * inner]) - maximum);
    const Compute log_sum = log_of(sum);
    for (int64_t p = 0; p < n; ++p) {
      const Compute x = T::load(in[base + p * inner]);
      out[base + p * inner] = T::store(log ? x - maximum - log_sum : exp_of(x - maximum) / sum);
    }
  }
}

template <class Storage, int kVec, int kPacks, bool kBlock, int kLanes>
__global__ void __launch_bounds__(kBlock ? kMaxRowThreads : kThreads)
    softmax_register_kernel(const Storage* __restrict__ in, Storage* __restrict__ out, int64_t rows, int n,
                            bool log) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  __shared__ Compute scratch[kBlock ? 32 : 1];
  const RowGroup rows_of_group = kBlock ? row_group<false>() : lanes_row_group<kLanes>();
  const int lane = rows_of_group.member, group = rows_of_group.size;
  const int packs = n / kVec;
  for (int64_t row = rows_of_group.first_row; row < rows; row += rows_of_group.row_step) {
    Compute values[kPacks][kVec];
    load_row<Storage, kVec, kPacks>(in + row * n, packs, lane, group, values, T::lowest());
    // Subtract the maximum so exp never overflows; a NaN maximum (or an all -inf row)
    // gives NaN, as in NumPy and onnxruntime. Padding lanes hold -inf: no effect.
    Compute maximum = T::lowest();
#pragma unroll
    for (int j = 0; j < kPacks; ++j)
#pragma unroll
      for (int v = 0; v < kVec; ++v) maximum = nan_max(maximum, values[j][v]);
    maximum = register_row_reduce<kBlock, kLanes>(maximum, [](Compute a, Compute b) { return nan_max(a, b); }, scratch);
    Compute sum = Compute(0);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + group * j >= packs) continue;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const Compute e = exp_of(values[j][v] - maximum);
        sum += e;
        if (!log) values[j][v] = e;
      }
    }
    sum = register_row_reduce<kBlock, kLanes>(sum, [](Compute a, Compute b) { return a + b; }, scratch);
    const Compute log_sum = log ? log_of(sum) : Compute(0);
    store_row<Storage, kVec, kPacks>(out + row * n, packs, lane, group, [&](int j, int v) {
      return log ? values[j][v] - maximum - log_sum : values[j][v] / sum;
    });
  }
}

}  // namespace

extern "C" int byoc_shim_softmax(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n, int64_t inner,
                                 int log, void* stream) {
  static const char kFunction[] = "byoc_shim_softmax";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"n", n}, {"inner", inner}},
                                       {{"in", in}, {"out", out}}));
  const bool empty = outer == 0 || n == 0 || inner == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    using Compute = typename Traits<Storage>::Compute;
    if (empty) return 0;
    const auto* x = static_cast<const Storage*>(in);
    auto* y = static_cast<Storage*>(out);
    if (inner > 1) {
      byoc_pdl::launch_after_previous(softmax_columns_kernel<Storage>,
          blocks_for(outer * inner), kThreads, 0, cuda_stream, x, y, outer, n, inner, log != 0);
      return check_launch(kFunction);
    }
    const RegisterRowPlan registers = plan_register_row<Storage>(n, register_row_vector<Storage>(n, in, out),
                                                                 vector_width<Storage>(n, in, out));
    if (registers.ok) {
      launch_register_rows<Storage>(registers, outer, [&](auto vec, auto packs, auto block, auto lanes,
                                                          unsigned blocks, unsigned threads) {
        byoc_pdl::launch_after_previous(
            softmax_register_kernel<Storage, decltype(vec)::value, decltype(packs)::value, decltype(block)::value,
                                    decltype(lanes)::value>,
            blocks, threads, 0, cuda_stream, x, y, outer, static_cast<int>(n), log != 0);
      });
      return check_launch(kFunction);
    }
    const RowLaunch plan = plan_rows<Compute>(outer, n);
    const bool wide = vector_width<Storage>(n, in, out) > 1;
    return with_row_vector<Storage>(wide, [&](auto vec) {
      byoc_pdl::launch_after_previous(softmax_rows_kernel<Storage, false, decltype(vec)::value>, plan.blocks,
          plan.threads, plan.shared_bytes, cuda_stream, x, y, outer, n, log != 0, plan.shared_bytes > 0);
      return check_launch(kFunction);
    });
  });
}
