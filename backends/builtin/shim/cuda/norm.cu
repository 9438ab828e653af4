// Normalizations: layer_norm, rms_norm, batch_norm (inference); softmax: softmax.cu.
//
// Statistics run in the dtype's compute type (float for float32 and the 16-bit floats,
// double for float64) with the reference's formulas (byoc/ops/normalization.py): a
// two-pass mean / centered variance for layer_norm (no E[x^2] - E[x]^2 cancellation), and
// each result rounded once. layer_norm and rms_norm are row kernels (rows.cuh).
#include "rows.cuh"

using namespace byoc_shim_cuda;

namespace {

// ---------------------------------------------------------------- layer_norm, rms_norm

// centered: layer_norm ((x - mean) / sqrt(var + eps) * gamma + beta, beta may be NULL);
// otherwise rms_norm (x / sqrt(mean(x^2) + eps) * gamma).
template <class Storage, bool kWarpPerRow, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads)
    norm_rows_kernel(const Storage* __restrict__ in, const Storage* __restrict__ gamma,
                     const Storage* __restrict__ beta, Storage* __restrict__ out, int64_t rows,
                     int64_t n, float epsilon, bool centered, bool use_cache) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  __shared__ Compute scratch[32];
  const RowGroup group = row_group<kWarpPerRow>();
  Compute* cache = row_cache<kWarpPerRow, Compute>(n, use_cache);
  auto sum_op = [](Compute a, Compute b) { return a + b; };
  const Compute count = static_cast<Compute>(n);
  for (int64_t row = group.first_row; row < row_loop_end<kWarpPerRow>(group, rows); row += group.row_step) {
    const bool valid = row < rows;
    const Storage* row_in = in + (valid ? row : 0) * n;
    Compute mean = Compute(0);
    bool cached = false;
    if (centered) {
      Compute sum = Compute(0);
      if (valid) visit_row<Storage, kVec>(row_in, n, group, cache, false, [&](int64_t, Compute x) { sum += x; });
      mean = group_all_reduce<kWarpPerRow>(sum, sum_op, scratch) / count;
      cached = cache != nullptr;
    }
    // Population variance of the centered values; for rms_norm the mean of squares.
    Compute squares = Compute(0);
    if (valid) visit_row<Storage, kVec>(row_in, n, group, cache, cached, [&](int64_t, Compute x) {
      const Compute centered_value = x - mean;
      squares += centered_value * centered_value;
    });
    const Compute variance = group_all_reduce<kWarpPerRow>(squares, sum_op, scratch) / count;
    if (!valid) continue;
    const Compute deviation = sqrt(variance + static_cast<Compute>(epsilon));
    // gamma and beta: one vector load per pack, like the row.
    const Pack<Storage, kVec>* gamma_packs = reinterpret_cast<const Pack<Storage, kVec>*>(gamma);
    const Pack<Storage, kVec>* beta_packs = reinterpret_cast<const Pack<Storage, kVec>*>(beta);
    Pack<Storage, kVec> gamma_pack, beta_pack;
    int64_t loaded_pack = -1;
    write_row<Storage, kVec>(row_in, out + row * n, n, group, cache, [&](int64_t i, Compute x) {
      const int64_t pack = i / kVec;
      if (pack != loaded_pack) {
        gamma_pack = gamma_packs[pack];
        if (beta != nullptr) beta_pack = beta_packs[pack];
        loaded_pack = pack;
      }
      Compute value = (x - mean) / deviation * T::load(gamma_pack.values[i % kVec]);
      if (beta != nullptr) value += T::load(beta_pack.values[i % kVec]);
      return value;
    });
  }
}

template <class Storage, int kVec, int kPacks, bool kBlock, int kLanes>
__global__ void __launch_bounds__(kBlock ? kMaxRowThreads : kThreads)
    norm_register_kernel(const Storage* __restrict__ in, const Storage* __restrict__ gamma,
                         const Storage* __restrict__ beta, Storage* __restrict__ out, int64_t rows, int n,
                         float epsilon, bool centered) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  __shared__ Compute scratch[kBlock ? 32 : 1];
  const RowGroup rows_of_group = kBlock ? row_group<false>() : lanes_row_group<kLanes>();
  const int lane = rows_of_group.member, group = rows_of_group.size;
  const int packs = n / kVec;
  const Compute count = static_cast<Compute>(n);
  auto sum_op = [](Compute a, Compute b) { return a + b; };
  // gamma and beta are the same for every row. A warp per row loads them once, before the
  // first row's loads are waited on, so that their latency hides behind the row's and the
  // reductions' (a few-row layer norm, a transformer at batch 1, is that latency and little
  // else); a block per row (long rows, tighter register bounds) loads them after the
  // reductions, for each row.
  Pack<Storage, kVec> gamma_packs[kPacks], beta_packs[kPacks];
  auto load_affine = [&] {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int pack = lane + group * j;
      if (pack < packs) {
        gamma_packs[j] = reinterpret_cast<const Pack<Storage, kVec>*>(gamma)[pack];
        if (beta != nullptr) beta_packs[j] = reinterpret_cast<const Pack<Storage, kVec>*>(beta)[pack];
      }
    }
  };
  if constexpr (!kBlock) load_affine();
  for (int64_t row = rows_of_group.first_row; row < rows; row += rows_of_group.row_step) {
    Compute values[kPacks][kVec];
    load_row<Storage, kVec, kPacks>(in + row * n, packs, lane, group, values, Compute(0));
    Compute mean = Compute(0);
    if (centered) {
      Compute sum = Compute(0);
#pragma unroll
      for (int j = 0; j < kPacks; ++j)
#pragma unroll
        for (int v = 0; v < kVec; ++v) sum += values[j][v];  // padding holds 0
      mean = register_row_reduce<kBlock, kLanes>(sum, sum_op, scratch) / count;
    }
    // Population variance of the centered values; for rms_norm the mean of squares.
    Compute squares = Compute(0);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + group * j >= packs) continue;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const Compute centered_value = values[j][v] - mean;
        squares += centered_value * centered_value;
      }
    }
    const Compute variance = register_row_reduce<kBlock, kLanes>(squares, sum_op, scratch) / count;
    const Compute deviation = sqrt(variance + static_cast<Compute>(epsilon));
    if constexpr (kBlock) load_affine();
    store_row<Storage, kVec, kPacks>(out + row * n, packs, lane, group, [&](int j, int v) {
      Compute value = (values[j][v] - mean) / deviation * T::load(gamma_packs[j].values[v]);
      if (beta != nullptr) value += T::load(beta_packs[j].values[v]);
      return value;
    });
  }
}

// ---------------------------------------------------------------- batch_norm

template <class Storage, class Index>
__global__ void batch_norm_kernel(const Storage* __restrict__ in, const Storage* __restrict__ scale,
                                  const Storage* __restrict__ bias, const Storage* __restrict__ mean,
                                  const Storage* __restrict__ var, Storage* __restrict__ out, Index channels,
                                  Index inner, float epsilon, Index total) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index channel = (linear / inner) % channels;
    const Compute deviation = sqrt(T::load(var[channel]) + static_cast<Compute>(epsilon));
    out[linear] = T::store((T::load(in[linear]) - T::load(mean[channel])) / deviation * T::load(scale[channel]) +
                           T::load(bias[channel]));
  }
}

template <class Storage>
int launch_norm(const char* function, const void* in, const void* gamma, const void* beta, void* out, int64_t rows,
                int64_t n, float epsilon, bool centered, cudaStream_t stream) {
  using Compute = typename Traits<Storage>::Compute;
  const auto* x = static_cast<const Storage*>(in);
  const auto* g = static_cast<const Storage*>(gamma);
  const auto* b = static_cast<const Storage*>(beta);
  auto* y = static_cast<Storage*>(out);
  const RegisterRowPlan registers = plan_register_row<Storage>(
      n, register_row_vector<Storage>(n, in, out, gamma, beta), vector_width<Storage>(n, in, out, gamma, beta));
  if (registers.ok) {
    launch_register_rows<Storage>(registers, rows, [&](auto vec, auto packs, auto block, auto lanes, unsigned blocks,
                                                       unsigned threads) {
      byoc_pdl::launch_after_previous(
          norm_register_kernel<Storage, decltype(vec)::value, decltype(packs)::value, decltype(block)::value,
                               decltype(lanes)::value>,
          blocks, threads, 0, stream, x, g, b, y, rows, static_cast<int>(n), epsilon, centered);
    });
    return check_launch(function);
  }
  const RowLaunch plan = plan_rows<Compute>(rows, n);
  const bool wide = vector_width<Storage>(n, in, out, gamma, beta) > 1;
  return with_row_vector<Storage>(wide, [&](auto vec) {
    byoc_pdl::launch_after_previous(norm_rows_kernel<Storage, false, decltype(vec)::value>, plan.blocks,
        plan.threads, plan.shared_bytes, stream, x, g, b, y, rows, n, epsilon, centered, plan.shared_bytes > 0);
    return check_launch(function);
  });
}

// byoc_shim_layer_norm (centered, with beta) and byoc_shim_rms_norm (beta NULL), checked
// and dispatched.
int normalize(const char* function, const void* in, const void* gamma, const void* beta, void* out,
              byoc_dtype dtype, int64_t rows, int64_t n, float epsilon, bool centered, cudaStream_t stream) {
  BYOC_CHECK(check_sizes_then_pointers(function, {{"rows", rows}, {"n", n}},
                                       {{"in", in}, {"gamma", gamma}, {"out", out}}));
  const bool empty = rows == 0 || n == 0;
  return dispatch<DtypeSet::kFloats>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    return launch_norm<Storage>(function, in, gamma, beta, out, rows, n, epsilon, centered, stream);
  });
}

}  // namespace

extern "C" int byoc_shim_layer_norm(const void* in, const void* gamma, const void* beta, void* out, byoc_dtype dtype,
                                    int64_t rows, int64_t n, float epsilon, void* stream) {
  return normalize("byoc_shim_layer_norm", in, gamma, beta, out, dtype, rows, n, epsilon, true, as_stream(stream));
}

extern "C" int byoc_shim_rms_norm(const void* in, const void* gamma, void* out, byoc_dtype dtype, int64_t rows,
                                  int64_t n, float epsilon, void* stream) {
  return normalize("byoc_shim_rms_norm", in, gamma, nullptr, out, dtype, rows, n, epsilon, false, as_stream(stream));
}

extern "C" int byoc_shim_batch_norm(const void* in, const void* scale, const void* bias, const void* mean,
                                    const void* var, void* out, byoc_dtype dtype, int64_t outer, int64_t channels,
                                    int64_t inner, float epsilon, void* stream) {
  static const char kFunction[] = "byoc_shim_batch_norm";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"channels", channels}, {"inner", inner}},
                                       {{"in", in}, {"scale", scale}, {"bias", bias}, {"mean", mean}, {"var", var},
                                        {"out", out}}));
  const bool empty = outer == 0 || channels == 0 || inner == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    const int64_t total = outer * channels * inner;
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      byoc_pdl::launch_after_previous(batch_norm_kernel<Storage, Index>, blocks_for(total), kThreads, 0, cuda_stream,
          static_cast<const Storage*>(in), static_cast<const Storage*>(scale), static_cast<const Storage*>(bias),
          static_cast<const Storage*>(mean), static_cast<const Storage*>(var), static_cast<Storage*>(out),
          static_cast<Index>(channels), static_cast<Index>(inner), epsilon, static_cast<Index>(total));
      return check_launch(kFunction);
    };
    return total < kIndex32Limit ? launch(int32_t{}) : launch(int64_t{});
  });
}
