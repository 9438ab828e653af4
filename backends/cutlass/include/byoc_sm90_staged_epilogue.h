// byoc's epilogue for CUTLASS 3.x sm90 warp-specialized GEMMs: D = act(alpha * acc + bias + C).
//
// Why byoc has its own: CUTLASS's TMA epilogue (the epilogue visitor tree, staged through
// shared memory and stored by TMA, with a producer warp loading C) is about 40% of what nvcc
// spends on a kernel's device half (bench/results/nvcc_phases.md), and its direct epilogue
// (DefaultEpilogue: each thread stores its own accumulators, two bytes at a time) compiles in
// half the time but runs 23-65% slower. This one is as cheap to compile as the direct one and
// stores as the TMA one does, in 16-byte vectors along D's contiguous dimension:
//
//   1. Each MMA thread computes alpha * acc + bias for its accumulators in float (and the
//      activation, when there is no C to add first), rounds once to the element type and
//      writes it to a shared-memory tile of the CTA's output tile.
//   2. A barrier over the MMA threads.
//   3. The same threads sweep the tile in 16-byte vectors: read one from shared memory, add
//      the same vector of C (16-byte load) and apply the activation in float, store 16 bytes
//      of D. Rows or columns past the problem's end are skipped whole vector by whole vector:
//      D's contiguous extent is a multiple of the vector (TMA's 16-byte stride rule, which
//      the mainloop already imposes; can_implement checks it).
//
// With C the value is rounded twice (alpha * acc + bias to the element type in step 1, the
// sum with C in step 3): within an ulp of the element type of CUTLASS's single rounding.
//
// It is a collective like CUTLASS's DefaultEpilogue (operator() per output tile), wrapped in
// Sm90TmaWarpSpecializedAdapter for the kernels' TMA epilogue interface. A pingpong kernel's
// two consumer warp groups run their epilogues one after the other (its math order barrier),
// so one tile of shared memory serves both.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>

namespace byoc_cutlass {

enum class BiasAlong { kNone, kColumns, kRows };  // a bias of N (per column) or of M (per row)

// ElementC: the element type of C (D's), or void where there is no C.
template <class Element_, class ElementC_, class StrideD_, template <class> class Activation, BiasAlong kBias,
          class TileShapeMNK>
class Sm90StagedEpilogue {
 public:
  using ElementD = Element_;
  using ElementC = ElementC_;
  static constexpr bool kHasSource = !cute::is_void_v<ElementC>;
  using StrideC = StrideD_;
  using StrideD = StrideD_;
  using ElementAccumulator = float;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  static constexpr int kTileM = cute::size<0>(TileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(TileShapeMNK{});
  static constexpr int kVector = 16 / int(sizeof(ElementD));  // elements in 16 bytes
  // D is stored along its stride-1 mode: N for row-major D, M for column-major (swapped) D
  static constexpr bool kAlongM = cute::is_constant<1, decltype(cute::get<0>(StrideD{}))>::value;
  static constexpr int kRows = kAlongM ? kTileN : kTileM;  // the shared tile, rows by contiguous columns
  static constexpr int kColumns = kAlongM ? kTileM : kTileN;
  // a vector of padding per row: the MMA layout's writes of eight rows at once fall in
  // different banks
  static constexpr int kPitch = kColumns + kVector;

  struct SharedStorage {
    alignas(128) ElementD tile[kRows * kPitch];
  };
  using TensorStorage = SharedStorage;

  struct Arguments {
    float alpha = 1.0f;
    ElementD const* ptr_C = nullptr;  // laid out as D (dD)
    ElementD* ptr_D = nullptr;
    StrideD dD{};
    ElementD const* ptr_bias = nullptr;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto shape = cute::append<4>(problem_shape, 1);
    int64_t contiguous = kAlongM ? int64_t(cute::get<0>(shape)) : int64_t(cute::get<1>(shape));
    auto aligned = [](void const* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; };
    return contiguous % kVector == 0 && aligned(args.ptr_D) && (!kHasSource || aligned(args.ptr_C));
  }

  CUTLASS_HOST_DEVICE Sm90StagedEpilogue(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() const { return kHasSource; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    constexpr int kThreads = int(size(TiledMma{}));
    auto synchronize = [] {
      cutlass::arch::NamedBarrier::sync(kThreads, int(cutlass::arch::ReservedNamedBarriers::EpilogueBarrier));
    };
    int const M = int(get<0>(problem_shape_mnkl));
    int const N = int(get<1>(problem_shape_mnkl));
    int const tile_m = int(get<0>(blk_coord_mnkl)) * kTileM;
    int const tile_n = int(get<1>(blk_coord_mnkl)) * kTileN;
    int64_t const batch_offset = int64_t(get<3>(blk_coord_mnkl)) * int64_t(get<2>(params_.dD));
    ElementD* tile = reinterpret_cast<SharedStorage*>(smem_buf)->tile;
    Activation<float> activation;

    // 1. accumulators -> alpha * acc + bias (activation too without C) -> the shared tile.
    // The tile's (row, column) of each accumulator: the MMA's partition of the identity.
    Tensor coordinates = tiled_mma.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    synchronize();  // the previous tile's step 3 has read the shared tile
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); ++i) {
      int const m = get<0>(coordinates(i)), n = get<1>(coordinates(i));
      float value = params_.alpha * float(accumulators(i));
      if constexpr (kBias == BiasAlong::kColumns) {
        if (tile_n + n < N) value += float(params_.ptr_bias[tile_n + n]);
      } else if constexpr (kBias == BiasAlong::kRows) {
        if (tile_m + m < M) value += float(params_.ptr_bias[tile_m + m]);
      }
      if constexpr (!kHasSource) value = activation(value);
      tile[kAlongM ? n * kPitch + m : m * kPitch + n] = ElementD(value);
    }
    synchronize();

    // 3. 16-byte vectors of the shared tile (+ C, activation) -> D
    constexpr int kVectorsPerRow = kColumns / kVector;
    constexpr int kVectorsPerTile = kRows * kVectorsPerRow;
    int const row_limit = kAlongM ? N - tile_n : M - tile_m;
    int const column_limit = kAlongM ? M - tile_m : N - tile_n;
    CUTLASS_PRAGMA_UNROLL
    for (int base = 0; base < kVectorsPerTile; base += kThreads) {
      int const vector = base + thread_idx;
      if (kVectorsPerTile % kThreads != 0 && vector >= kVectorsPerTile) break;
      int const row = vector / kVectorsPerRow, column = (vector % kVectorsPerRow) * kVector;
      if (row >= row_limit || column >= column_limit) continue;
      int const m = tile_m + (kAlongM ? column : row), n = tile_n + (kAlongM ? row : column);
      int64_t const offset = batch_offset + int64_t(m) * int64_t(get<0>(params_.dD)) +
                             int64_t(n) * int64_t(get<1>(params_.dD));
      cutlass::Array<ElementD, kVector> staged = *reinterpret_cast<cutlass::Array<ElementD, kVector> const*>(
          tile + row * kPitch + column);
      if constexpr (kHasSource) {
        cutlass::Array<ElementD, kVector> source =
            *reinterpret_cast<cutlass::Array<ElementD, kVector> const*>(params_.ptr_C + offset);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kVector; ++j) staged[j] = ElementD(activation(float(staged[j]) + float(source[j])));
      }
      *reinterpret_cast<cutlass::Array<ElementD, kVector>*>(params_.ptr_D + offset) = staged;
    }
  }

 private:
  Params params_;
};

}  // namespace byoc_cutlass
