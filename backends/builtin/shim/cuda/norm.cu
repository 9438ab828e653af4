// Normalizations: softmax / log_softmax, layer_norm, rms_norm, batch_norm (inference).
//
// Statistics run in the dtype's compute type (float for float32 and the 16-bit floats,
// double for float64) with the reference's formulas (byoc/ops/normalization.py): the
// maximum-shifted exponentials for softmax, a two-pass mean / centered variance for
// layer_norm (no E[x^2] - E[x]^2 cancellation), and each result rounded once.
//
// Row kernels (softmax with inner == 1, layer_norm, rms_norm): one warp per row for
// rows up to kWarpRowLimit elements (eight rows per 256-thread block, the row held in
// registers: see "short rows in registers"), one block per row beyond. Rows are read with vector loads (16 bytes) when the row length and every
// pointer allow, and read from global memory once: the first pass keeps the values (in
// the compute type) in shared memory for the later passes, when they fit in the default
// 48 KiB; otherwise the later passes read the row again (then mostly from L2). Each
// thread revisits only the elements it cached itself, so the passes need no barrier
// beyond the reductions'.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

constexpr int64_t kWarpRowLimit = 1024;
// Threads of a block-per-row launch, at most; the row kernels are compiled for it
// (__launch_bounds__), so that a float64 instantiation never asks for more registers
// than a full block can have.
constexpr int kMaxRowThreads = 512;
constexpr size_t kCacheBytesLimit = 48 * 1024;  // dynamic shared memory without opting in

template <class Storage, int kVec>
struct alignas(sizeof(Storage) * kVec) Pack {
  Storage values[kVec];
};

// The widest vector (in elements, 16 bytes at most) that divides the row length and keeps
// every given pointer aligned; 1 when none does.
template <class Storage>
int vector_width(int64_t n, const void* a, const void* b, const void* c = nullptr, const void* d = nullptr) {
  const int width = static_cast<int>(16 / sizeof(Storage));
  const size_t bytes = sizeof(Storage) * width;
  const bool fits = n % width == 0 && aligned_to(a, bytes) && aligned_to(b, bytes) &&
                    (c == nullptr || aligned_to(c, bytes)) && (d == nullptr || aligned_to(d, bytes));
  return fits ? width : 1;
}

// Where a row kernel's thread sits: its group (a warp or the block), its place in the
// group, and the shared-memory cache of its group's row.
struct RowGroup {
  int member, size;
  int64_t first_row, row_step;
};

template <bool kWarpPerRow>
__device__ __forceinline__ RowGroup row_group() {
  RowGroup group;
  const int64_t groups_per_block = kWarpPerRow ? blockDim.x / 32 : 1;
  group.member = kWarpPerRow ? (threadIdx.x & 31) : threadIdx.x;
  group.size = kWarpPerRow ? 32 : blockDim.x;
  group.first_row = blockIdx.x * groups_per_block + (kWarpPerRow ? threadIdx.x / 32 : 0);
  group.row_step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  return group;
}

template <bool kWarpPerRow, class T, class Combine>
__device__ __forceinline__ T group_all_reduce(T value, Combine combine, T* scratch) {
  return kWarpPerRow ? warp_all_reduce(value, combine) : block_all_reduce(value, combine, scratch);
}

// Visits the elements of one row that this thread owns, as (index, value) in the compute
// type: from global memory (filling `cache` when given) or, when `from_cache`, from the
// cache this thread filled before.
template <class Storage, int kVec, class Visit>
__device__ __forceinline__ void visit_row(const Storage* row, int64_t n, const RowGroup& group,
                                          typename Traits<Storage>::Compute* cache, bool from_cache, Visit visit) {
  const int64_t packs = n / kVec;
  for (int64_t pack = group.member; pack < packs; pack += group.size) {
    const int64_t base = pack * kVec;
    if (from_cache) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) visit(base + v, cache[base + v]);
    } else {
      const Pack<Storage, kVec> loaded = reinterpret_cast<const Pack<Storage, kVec>*>(row)[pack];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const auto value = Traits<Storage>::load(loaded.values[v]);
        if (cache != nullptr) cache[base + v] = value;
        visit(base + v, value);
      }
    }
  }
}

// Writes this thread's elements of an output row: value(index, x) for each element x.
template <class Storage, int kVec, class Value>
__device__ __forceinline__ void write_row(const Storage* row, Storage* out_row, int64_t n, const RowGroup& group,
                                          const typename Traits<Storage>::Compute* cache, Value value) {
  const int64_t packs = n / kVec;
  for (int64_t pack = group.member; pack < packs; pack += group.size) {
    const int64_t base = pack * kVec;
    Pack<Storage, kVec> result;
    if (cache != nullptr) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) result.values[v] = Traits<Storage>::store(value(base + v, cache[base + v]));
    } else {
      const Pack<Storage, kVec> loaded = reinterpret_cast<const Pack<Storage, kVec>*>(row)[pack];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        result.values[v] = Traits<Storage>::store(value(base + v, Traits<Storage>::load(loaded.values[v])));
      }
    }
    reinterpret_cast<Pack<Storage, kVec>*>(out_row)[pack] = result;
  }
}

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
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ Compute scratch[32];
  const RowGroup group = row_group<kWarpPerRow>();
  Compute* cache = use_cache ? reinterpret_cast<Compute*>(shared_bytes) + (kWarpPerRow ? threadIdx.x / 32 : 0) * n
                             : nullptr;
  auto max_op = [](Compute a, Compute b) { return nan_max(a, b); };
  auto sum_op = [](Compute a, Compute b) { return a + b; };
  const int64_t row_limit = kWarpPerRow ? rows : ((rows + group.row_step - 1) / group.row_step) * group.row_step;
  for (int64_t row = group.first_row; row < row_limit; row += group.row_step) {
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
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ Compute scratch[32];
  const RowGroup group = row_group<kWarpPerRow>();
  Compute* cache = use_cache ? reinterpret_cast<Compute*>(shared_bytes) + (kWarpPerRow ? threadIdx.x / 32 : 0) * n
                             : nullptr;
  auto sum_op = [](Compute a, Compute b) { return a + b; };
  const Compute count = static_cast<Compute>(n);
  const int64_t row_limit = kWarpPerRow ? rows : ((rows + group.row_step - 1) / group.row_step) * group.row_step;
  for (int64_t row = group.first_row; row < row_limit; row += group.row_step) {
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

// Launches a row kernel: a warp per row (8 rows a block) or a block per row, the shared
// cache when it fits, vector width kVec or 1.
struct RowLaunch {
  bool warp_per_row;
  unsigned int blocks, threads;
  size_t shared_bytes;  // 0: no cache
};

template <class Compute>
RowLaunch plan_rows(int64_t rows, int64_t n) {
  RowLaunch plan;
  plan.warp_per_row = n <= kWarpRowLimit;
  const int64_t rows_per_block = plan.warp_per_row ? kThreads / 32 : 1;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  plan.blocks = static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  plan.threads = plan.warp_per_row ? kThreads : (n <= 4096 ? 256 : kMaxRowThreads);
  const size_t bytes = static_cast<size_t>(rows_per_block) * static_cast<size_t>(n) * sizeof(Compute);
  plan.shared_bytes = bytes <= kCacheBytesLimit ? bytes : 0;
  return plan;
}

// ---------------------------------------------------------------- short rows in registers

// Rows of at most kWarpRowLimit elements: one warp per row (eight rows per 256-thread
// block) holding its row in registers: lane l owns packs l, l + 32, ... (kPacks of them,
// kVec elements each, one vector load per pack), so the row is read from global memory
// once and every pass after the first works on registers (softmax computes each exp
// once). No block-level barrier: warps run their rows independently.
template <class Storage, int kVec, int kPacks>
__device__ __forceinline__ void load_row(const Storage* row, int packs, int lane, int group,
                                         typename Traits<Storage>::Compute (&values)[kPacks][kVec],
                                         typename Traits<Storage>::Compute fill) {
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int pack = lane + group * j;
    if (pack < packs) {
      const Pack<Storage, kVec> loaded = reinterpret_cast<const Pack<Storage, kVec>*>(row)[pack];
#pragma unroll
      for (int v = 0; v < kVec; ++v) values[j][v] = Traits<Storage>::load(loaded.values[v]);
    } else {
#pragma unroll
      for (int v = 0; v < kVec; ++v) values[j][v] = fill;
    }
  }
}

// kBlock: the same with one block per row (mid-size rows; rows are block-uniform, so the
// block-wide reductions' barriers are reached by every thread).
template <bool kBlock, class T, class Combine>
__device__ __forceinline__ T register_row_reduce(T value, Combine combine, T* scratch) {
  if constexpr (kBlock) {
    return block_all_reduce(value, combine, scratch);
  } else {
    return warp_all_reduce(value, combine);
  }
}

template <class Storage, int kVec, int kPacks, bool kBlock>
__global__ void __launch_bounds__(kBlock ? kMaxRowThreads : kThreads)
    softmax_register_kernel(const Storage* __restrict__ in, Storage* __restrict__ out, int64_t rows, int n,
                            bool log) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  __shared__ Compute scratch[kBlock ? 32 : 1];
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int group = kBlock ? blockDim.x : 32;
  const int packs = n / kVec;
  const int64_t groups_per_block = kBlock ? 1 : blockDim.x / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  for (int64_t row = blockIdx.x * groups_per_block + (kBlock ? 0 : threadIdx.x / 32); row < rows; row += step) {
    Compute values[kPacks][kVec];
    load_row<Storage, kVec, kPacks>(in + row * n, packs, lane, group, values, T::lowest());
    // Subtract the maximum so exp never overflows; a NaN maximum (or an all -inf row)
    // gives NaN, as in NumPy and onnxruntime. Padding lanes hold -inf: no effect.
    Compute maximum = T::lowest();
#pragma unroll
    for (int j = 0; j < kPacks; ++j)
#pragma unroll
      for (int v = 0; v < kVec; ++v) maximum = nan_max(maximum, values[j][v]);
    maximum = register_row_reduce<kBlock>(maximum, [](Compute a, Compute b) { return nan_max(a, b); }, scratch);
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
    sum = register_row_reduce<kBlock>(sum, [](Compute a, Compute b) { return a + b; }, scratch);
    const Compute log_sum = log ? log_of(sum) : Compute(0);
    Storage* row_out = out + row * n;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int pack = lane + group * j;
      if (pack >= packs) continue;
      Pack<Storage, kVec> result;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        result.values[v] = T::store(log ? values[j][v] - maximum - log_sum : values[j][v] / sum);
      }
      reinterpret_cast<Pack<Storage, kVec>*>(row_out)[pack] = result;
    }
  }
}

template <class Storage, int kVec, int kPacks, bool kBlock>
__global__ void __launch_bounds__(kBlock ? kMaxRowThreads : kThreads)
    norm_register_kernel(const Storage* __restrict__ in, const Storage* __restrict__ gamma,
                         const Storage* __restrict__ beta, Storage* __restrict__ out, int64_t rows, int n,
                         float epsilon, bool centered) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  __shared__ Compute scratch[kBlock ? 32 : 1];
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int group = kBlock ? blockDim.x : 32;
  const int packs = n / kVec;
  const int64_t groups_per_block = kBlock ? 1 : blockDim.x / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups_per_block;
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
  for (int64_t row = blockIdx.x * groups_per_block + (kBlock ? 0 : threadIdx.x / 32); row < rows; row += step) {
    Compute values[kPacks][kVec];
    load_row<Storage, kVec, kPacks>(in + row * n, packs, lane, group, values, Compute(0));
    Compute mean = Compute(0);
    if (centered) {
      Compute sum = Compute(0);
#pragma unroll
      for (int j = 0; j < kPacks; ++j)
#pragma unroll
        for (int v = 0; v < kVec; ++v) sum += values[j][v];  // padding holds 0
      mean = register_row_reduce<kBlock>(sum, sum_op, scratch) / count;
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
    const Compute variance = register_row_reduce<kBlock>(squares, sum_op, scratch) / count;
    const Compute deviation = sqrt(variance + static_cast<Compute>(epsilon));
    Storage* row_out = out + row * n;
    if constexpr (kBlock) load_affine();
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int pack = lane + group * j;
      if (pack >= packs) continue;
      Pack<Storage, kVec> result;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        Compute value = (values[j][v] - mean) / deviation * T::load(gamma_packs[j].values[v]);
        if (beta != nullptr) value += T::load(beta_packs[j].values[v]);
        result.values[v] = T::store(value);
      }
      reinterpret_cast<Pack<Storage, kVec>*>(row_out)[pack] = result;
    }
  }
}

// The vector width (elements) of a register row: the widest power of two (16 bytes at
// most) that divides n, aligns every given pointer and still gives each of the 32 lanes
// a pack (so short rows keep the whole warp busy).
template <class Storage>
int register_row_vector(int64_t n, const void* a, const void* b, const void* c = nullptr, const void* d = nullptr) {
  int vec = static_cast<int>(16 / sizeof(Storage));
  auto fits = [&](int width) {
    const size_t bytes = sizeof(Storage) * width;
    return n % width == 0 && n / width >= 32 && aligned_to(a, bytes) && aligned_to(b, bytes) &&
           (c == nullptr || aligned_to(c, bytes)) && (d == nullptr || aligned_to(d, bytes));
  };
  while (vec > 1 && !fits(vec)) vec /= 2;
  return vec;
}

// Calls f(std::integral_constant<int, kVec>) for the runtime width `vec` (a power of two <= kMaxVec).
template <int kMaxVec, int kVec = 1, class F>
int with_vector(int vec, F&& f) {
  if constexpr (kVec >= kMaxVec) {
    return f(std::integral_constant<int, kVec>{});
  } else {
    if (vec <= kVec) return f(std::integral_constant<int, kVec>{});
    return with_vector<kMaxVec, kVec * 2>(vec, f);
  }
}

// Calls f(std::integral_constant<int, kPacks>) with the smallest power of two >= packs,
// kVec * kPacks at most kMaxValues (the values a thread keeps in registers).
template <int kVec, int kMaxValues, int kPacks = 1, class F>
int with_packs(int64_t packs, F&& f) {
  if constexpr (kVec * kPacks >= kMaxValues) {
    return f(std::integral_constant<int, kPacks>{});
  } else {
    if (packs <= kPacks) return f(std::integral_constant<int, kPacks>{});
    return with_packs<kVec, kMaxValues, kPacks * 2>(packs, f);
  }
}

// Values a thread of a register-row kernel keeps: 32 floats (a warp covers kWarpRowLimit)
// or 8 doubles (no spills at 512 threads a block).
template <class Compute>
constexpr int register_values() { return sizeof(Compute) > 4 ? 8 : 32; }

// How a row of n elements is spread for the register kernels: a warp (n <= kWarpRowLimit
// and a lane's share fits in registers) or a block of `threads` (<= kMaxRowThreads, a multiple of 32) with `packs` packs of
// `vec` elements per thread. ok == false: too long for registers (the shared-memory
// kernels take it).
struct RegisterRowPlan {
  bool ok = false, block = false;
  int vec = 1, threads = 32;
  int64_t packs = 1;  // per thread
};

template <class Storage>
RegisterRowPlan plan_register_row(int64_t n, int vec) {
  using Compute = typename Traits<Storage>::Compute;
  RegisterRowPlan plan;
  plan.vec = vec;
  const int64_t row_packs = n / vec;
  const int64_t max_packs = register_values<Compute>() / vec;
  if (n <= kWarpRowLimit && (row_packs + 31) / 32 <= max_packs) {
    plan.ok = true;
    plan.packs = (row_packs + 31) / 32;
    return plan;
  }
  for (int64_t packs = 1; packs <= max_packs; packs *= 2) {
    const int64_t threads = (row_packs + packs - 1) / packs;
    if (threads <= kMaxRowThreads) {
      plan.ok = plan.block = true;
      plan.packs = packs;
      plan.threads = static_cast<int>((threads + 31) / 32 * 32);
      return plan;
    }
  }
  return plan;
}

// Threads of a warp-per-row block: 8 rows a block, or 2 when the rows are few (up to 1024:
// BERT at batch 1 has 128), so that they spread over more SMs' load units.
inline unsigned int warp_row_threads(int64_t rows) { return rows <= 1024 ? 64 : kThreads; }

inline unsigned int warp_row_blocks(int64_t rows) {
  const int64_t rows_per_block = warp_row_threads(rows) / 32;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
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

int check_row_arguments(const char* function, int64_t rows, int64_t n, const void* in, const void* gamma,
                        const void* out, bool* empty) {
  BYOC_CHECK(check_size(function, "rows", rows));
  BYOC_CHECK(check_size(function, "n", n));
  *empty = rows == 0 || n == 0;
  if (!*empty) {
    BYOC_CHECK(check_pointer(function, "in", in));
    BYOC_CHECK(check_pointer(function, "gamma", gamma));
    BYOC_CHECK(check_pointer(function, "out", out));
  }
  return 0;
}

template <class Storage>
int launch_norm(const char* function, const void* in, const void* gamma, const void* beta, void* out, int64_t rows,
                int64_t n, float epsilon, bool centered, cudaStream_t stream) {
  using Compute = typename Traits<Storage>::Compute;
  const RowLaunch plan = plan_rows<Compute>(rows, n);
  const int width = vector_width<Storage>(n, in, out, gamma, beta);
  const auto* x = static_cast<const Storage*>(in);
  const auto* g = static_cast<const Storage*>(gamma);
  const auto* b = static_cast<const Storage*>(beta);
  auto* y = static_cast<Storage*>(out);
  const bool cache = plan.shared_bytes > 0;
  constexpr int kWide = static_cast<int>(16 / sizeof(Storage));
  const RegisterRowPlan registers = plan_register_row<Storage>(n, register_row_vector<Storage>(n, in, out, gamma, beta));
  if (registers.ok) {
    constexpr int kValues = register_values<Compute>();
    return with_vector<kWide>(registers.vec, [&](auto vec_tag) {
      constexpr int kVec = decltype(vec_tag)::value;
      return with_packs<kVec, kValues>(registers.packs, [&](auto packs_tag) {
        constexpr int kPacks = decltype(packs_tag)::value;
        if (registers.block) {
          const unsigned blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
          byoc_pdl::launch_after_previous(norm_register_kernel<Storage, kVec, kPacks, true>,
              blocks, registers.threads, 0, stream, x, g, b, y, rows, static_cast<int>(n), epsilon, centered);
        } else {
          byoc_pdl::launch_after_previous(norm_register_kernel<Storage, kVec, kPacks, false>,
              warp_row_blocks(rows), warp_row_threads(rows), 0, stream, x, g, b, y, rows, static_cast<int>(n), epsilon,
              centered);
        }
        return check_launch(function);
      });
    });
  } else {
    if (width > 1) {
      byoc_pdl::launch_after_previous(norm_rows_kernel<Storage, false, kWide>,
          plan.blocks, plan.threads, plan.shared_bytes, stream, x, g, b, y, rows, n, epsilon, centered, cache);
    } else {
      byoc_pdl::launch_after_previous(norm_rows_kernel<Storage, false, 1>,
          plan.blocks, plan.threads, plan.shared_bytes, stream, x, g, b, y, rows, n, epsilon, centered, cache);
    }
  }
  return check_launch(function);
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
    const RowLaunch plan = plan_rows<Compute>(outer, n);
    const bool wide = vector_width<Storage>(n, in, out) > 1;
    const bool cache = plan.shared_bytes > 0;
    constexpr int kWide = static_cast<int>(16 / sizeof(Storage));
    const RegisterRowPlan registers = plan_register_row<Storage>(n, register_row_vector<Storage>(n, in, out));
    if (registers.ok) {
      constexpr int kValues = register_values<Compute>();
      return with_vector<kWide>(registers.vec, [&](auto vec_tag) {
        constexpr int kVec = decltype(vec_tag)::value;
        return with_packs<kVec, kValues>(registers.packs, [&](auto packs_tag) {
          constexpr int kPacks = decltype(packs_tag)::value;
          if (registers.block) {
            const unsigned blocks = static_cast<unsigned>(outer < kMaxBlocks ? outer : kMaxBlocks);
            byoc_pdl::launch_after_previous(softmax_register_kernel<Storage, kVec, kPacks, true>,
                blocks, registers.threads, 0, cuda_stream, x, y, outer, static_cast<int>(n), log != 0);
          } else {
            byoc_pdl::launch_after_previous(softmax_register_kernel<Storage, kVec, kPacks, false>,
                warp_row_blocks(outer), warp_row_threads(outer), 0, cuda_stream, x, y, outer, static_cast<int>(n),
                log != 0);
          }
          return check_launch(kFunction);
        });
      });
    } else {
      if (wide) {
        byoc_pdl::launch_after_previous(softmax_rows_kernel<Storage, false, kWide>,
            plan.blocks, plan.threads, plan.shared_bytes, cuda_stream, x, y, outer, n, log != 0, cache);
      } else {
        byoc_pdl::launch_after_previous(softmax_rows_kernel<Storage, false, 1>,
            plan.blocks, plan.threads, plan.shared_bytes, cuda_stream, x, y, outer, n, log != 0, cache);
      }
    }
    return check_launch(kFunction);
  });
}

extern "C" int byoc_shim_layer_norm(const void* in, const void* gamma, const void* beta, void* out, byoc_dtype dtype,
                                    int64_t rows, int64_t n, float epsilon, void* stream) {
  static const char kFunction[] = "byoc_shim_layer_norm";
  bool empty = false;
  BYOC_CHECK(check_row_arguments(kFunction, rows, n, in, gamma, out, &empty));
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    return launch_norm<Storage>(kFunction, in, gamma, beta, out, rows, n, epsilon, true, as_stream(stream));
  });
}

extern "C" int byoc_shim_rms_norm(const void* in, const void* gamma, void* out, byoc_dtype dtype, int64_t rows,
                                  int64_t n, float epsilon, void* stream) {
  static const char kFunction[] = "byoc_shim_rms_norm";
  bool empty = false;
  BYOC_CHECK(check_row_arguments(kFunction, rows, n, in, gamma, out, &empty));
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    return launch_norm<Storage>(kFunction, in, gamma, nullptr, out, rows, n, epsilon, false, as_stream(stream));
  });
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
    return total < (int64_t{1} << 30) ? launch(int32_t{}) : launch(int64_t{});
  });
}
