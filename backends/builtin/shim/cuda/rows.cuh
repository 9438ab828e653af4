// Row machinery of the CUDA shim's row kernels (softmax.cu: softmax with inner == 1;
// norm.cu: layer_norm, rms_norm): how a row is spread over a warp or a block, read with
// vector loads, cached, reduced, and how such kernels are planned and launched.
//
// Rows up to kWarpRowLimit elements get one warp each (eight rows per 256-thread block, the
// row held in registers: see "short rows in registers"), longer rows one block each. Rows
// are read with vector loads (16 bytes) when the row length and every pointer allow, and
// read from global memory once: the register kernels keep the row in registers; the
// shared-memory kernels (rows too long for registers) keep the values (in the compute
// type) in shared memory for the later passes when they fit in the default 48 KiB, and
// otherwise read the row again (then mostly from L2). Each thread revisits only the
// elements it cached itself, so the passes need no barrier beyond the reductions'.
#ifndef BYOC_SHIM_CUDA_ROWS_CUH_
#define BYOC_SHIM_CUDA_ROWS_CUH_

#include <type_traits>

#include "shim_cuda.cuh"

namespace byoc_shim_cuda {

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

// The register kernels' group for short rows: kLanes neighbouring lanes of a warp (a power
// of two, 32 at most) per row, blockDim.x / kLanes rows a block.
template <int kLanes>
__device__ __forceinline__ RowGroup lanes_row_group() {
  RowGroup group;
  const int64_t rows_per_block = blockDim.x / kLanes;
  group.member = static_cast<int>(threadIdx.x % kLanes);
  group.size = kLanes;
  group.first_row = blockIdx.x * rows_per_block + threadIdx.x / kLanes;
  group.row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  return group;
}

template <bool kWarpPerRow, class T, class Combine>
__device__ __forceinline__ T group_all_reduce(T value, Combine combine, T* scratch) {
  return kWarpPerRow ? warp_all_reduce(value, combine) : block_all_reduce(value, combine, scratch);
}

// The shared-memory cache of this thread's group's row (n values each), or NULL.
template <bool kWarpPerRow, class Compute>
__device__ __forceinline__ Compute* row_cache(int64_t n, bool use_cache) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  return use_cache ? reinterpret_cast<Compute*>(shared_bytes) + (kWarpPerRow ? threadIdx.x / 32 : 0) * n : nullptr;
}

// Where a group's row loop ends: past `rows` for a block per row, rounded up to the whole
// grid's step, so that every thread of the block reaches the reductions' barriers (rows
// past the end take part in the reductions and write nothing).
template <bool kWarpPerRow>
__device__ __forceinline__ int64_t row_loop_end(const RowGroup& group, int64_t rows) {
  return kWarpPerRow ? rows : ((rows + group.row_step - 1) / group.row_step) * group.row_step;
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

// Calls f(std::integral_constant<int, kVec>) with the vector width of a shared-memory row
// kernel: 16 bytes of elements when `wide` (vector_width allows it), else 1.
template <class Storage, class F>
int with_row_vector(bool wide, F&& f) {
  constexpr int kWide = static_cast<int>(16 / sizeof(Storage));
  return wide ? f(std::integral_constant<int, kWide>{}) : f(std::integral_constant<int, 1>{});
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

// Stores this thread's packs of an output row, the value of element v of pack j being
// value(j, v) in the compute type (the counterpart of load_row).
template <class Storage, int kVec, int kPacks, class Value>
__device__ __forceinline__ void store_row(Storage* row, int packs, int lane, int group, Value value) {
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int pack = lane + group * j;
    if (pack >= packs) continue;
    Pack<Storage, kVec> result;
#pragma unroll
    for (int v = 0; v < kVec; ++v) result.values[v] = Traits<Storage>::store(value(j, v));
    reinterpret_cast<Pack<Storage, kVec>*>(row)[pack] = result;
  }
}

// kBlock: the same with one block per row (mid-size rows; rows are block-uniform, so the
// block-wide reductions' barriers are reached by every thread). Otherwise kLanes lanes
// reduce their row: the whole warp, or (short rows) an aligned group of kLanes lanes whose
// shuffles name only themselves, so that groups whose rows end early need not take part.
template <bool kBlock, int kLanes = 32, class T, class Combine>
__device__ __forceinline__ T register_row_reduce(T value, Combine combine, T* scratch) {
  if constexpr (kBlock) {
    return block_all_reduce(value, combine, scratch);
  } else if constexpr (kLanes == 32) {
    return warp_all_reduce(value, combine);
  } else {
    static_assert(kLanes > 0 && kLanes < 32 && (kLanes & (kLanes - 1)) == 0, "lanes: a power of two");
    const unsigned first_lane = (threadIdx.x & 31u) & ~static_cast<unsigned>(kLanes - 1);
    const unsigned mask = ((1u << kLanes) - 1u) << first_lane;
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
      value = combine(value, __shfl_xor_sync(mask, value, offset, kLanes));
    }
    return value;
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
// and a lane's share fits in registers), `lanes` lanes of a warp (short rows), or a block
// of `threads` (<= kMaxRowThreads, a multiple of 32) with `packs` packs of `vec` elements
// per thread. ok == false: too long for registers (the shared-memory kernels take it).
struct RegisterRowPlan {
  bool ok = false, block = false;
  int vec = 1, threads = 32;
  int lanes = 32;     // lanes a row (warp per row or fewer); 32 with a block per row
  int64_t packs = 1;  // per thread
};

// Short rows: fewer than 32 packs of 16 bytes (ConvNeXt's LayerNorm over 96 channels, a
// 7x7 window's softmax). A warp per row then left lanes idle or read 2 or 4 bytes a load
// (96 float16 channels: 2-byte pairs, 65 us for 32x56x56 rows on an H200, a quarter of the
// bandwidth), and each warp's short life was mostly latency. Instead the row's 16-byte
// packs are spread over the fewest lanes (4 or 8) that hold at most kShortRowPacks packs
// each: 8 or 4 rows a warp.
constexpr int kShortRowPacks = 4;
constexpr int kShortRowMinLanes = 4;

template <class Storage>
RegisterRowPlan plan_register_row(int64_t n, int vec, int wide_vec = 1) {
  using Compute = typename Traits<Storage>::Compute;
  RegisterRowPlan plan;
  constexpr int kWide = static_cast<int>(16 / sizeof(Storage));
  if (wide_vec == kWide && n / kWide < 32 && n > 0) {  // a short row of whole 16-byte packs
    const int64_t row_packs = n / kWide;
    int lanes = kShortRowMinLanes;
    while (lanes < 32 && lanes * kShortRowPacks < row_packs) lanes *= 2;
    plan.ok = true;
    plan.vec = kWide;
    plan.lanes = lanes;
    plan.packs = (row_packs + lanes - 1) / lanes;
    return plan;
  }
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
// BERT at batch 1 has 128), so that they spread over more SMs' load units. Short rows
// (fewer lanes a row) take full blocks.
inline unsigned int warp_row_threads(int64_t rows, int lanes = 32) {
  return lanes == 32 && rows <= 1024 ? 64 : kThreads;
}

inline unsigned int warp_row_blocks(int64_t rows, int lanes = 32) {
  const int64_t rows_per_block = warp_row_threads(rows, lanes) / lanes;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Launches a register-row kernel as `plan` says, through launch(vec_tag, packs_tag,
// block_tag, lanes_tag, blocks, threads): the vector width, the packs per thread, whether a
// block (std::true_type) or lanes of a warp (std::false_type) take a row, and how many
// lanes, as compile-time constants.
template <class Storage, class Launch>
void launch_register_rows(const RegisterRowPlan& plan, int64_t rows, Launch&& launch) {
  using Compute = typename Traits<Storage>::Compute;
  constexpr int kWide = static_cast<int>(16 / sizeof(Storage));
  if (plan.lanes < 32) {  // short rows: whole 16-byte packs, at most kShortRowPacks a lane
    const auto short_rows = [&](auto lanes_tag) {
      return with_packs<kWide, kWide * kShortRowPacks>(plan.packs, [&](auto packs_tag) {
        constexpr int kLanes = decltype(lanes_tag)::value;
        launch(std::integral_constant<int, kWide>{}, packs_tag, std::false_type{}, lanes_tag,
               warp_row_blocks(rows, kLanes), warp_row_threads(rows, kLanes));
        return 0;
      });
    };
    if (plan.lanes <= 4) {
      short_rows(std::integral_constant<int, 4>{});
    } else {
      short_rows(std::integral_constant<int, 8>{});  // plan_register_row: 8 at most
    }
    return;
  }
  with_vector<kWide>(plan.vec, [&](auto vec_tag) {
    return with_packs<decltype(vec_tag)::value, register_values<Compute>()>(plan.packs, [&](auto packs_tag) {
      if (plan.block) {
        const unsigned blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
        launch(vec_tag, packs_tag, std::true_type{}, std::integral_constant<int, 32>{}, blocks,
               static_cast<unsigned>(plan.threads));
      } else {
        launch(vec_tag, packs_tag, std::false_type{}, std::integral_constant<int, 32>{}, warp_row_blocks(rows),
               warp_row_threads(rows));
      }
      return 0;
    });
  });
}

}  // namespace byoc_shim_cuda

#endif  // BYOC_SHIM_CUDA_ROWS_CUH_
