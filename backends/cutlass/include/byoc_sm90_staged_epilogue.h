// byoc's epilogue for CUTLASS 3.x sm90 warp-specialized GEMMs: D = act(alpha * acc + bias + C).
//
// Why byoc has its own: CUTLASS's TMA epilogue (the epilogue visitor tree, staged through
// shared memory and stored by TMA, with a producer warp loading C) is about half of what nvcc
// spends on a kernel's device half (bench/results/nvcc_phases.md), and its direct epilogue
// (DefaultEpilogue: each thread stores its own accumulators, two bytes at a time) compiles in
// half the time but runs 23-65% slower. This one compiles as fast as the direct one and
// stores as the TMA one does, in 16-byte vectors along D's contiguous dimension, a chunk of
// at most 64 contiguous columns of the CTA's tile at a time:
//
//   1. Each MMA thread loads the C and bias values of the vectors it will store (step 3), so
//      their latency passes while it stages the chunk.
//   2. It writes alpha * acc of its accumulators in the chunk to a float tile in shared
//      memory (pairs of columns as 8-byte stores: the padded pitch puts a half-warp's pairs in
//      32 different banks). A barrier over the MMA threads.
//   3. The same threads read the chunk back in vectors along the contiguous dimension, add
//      bias and C, apply the activation, all in float, round once to the element type (as
//      CUTLASS's epilogue does) and store 16 bytes of D. A barrier, then the next chunk.
//
// Rows or columns past the problem's end are skipped vector by vector: D's contiguous
// extent is a multiple of the vector (TMA's 16-byte stride rule, which the mainloop already
// imposes; can_implement checks it).
//
// It is a collective like CUTLASS's DefaultEpilogue (operator() per output tile), wrapped in
// Sm90TmaWarpSpecializedAdapter for the kernels' TMA epilogue interface. A pingpong kernel's
// two consumer warp groups run their epilogues one after the other (its math order barrier),
// so one chunk of shared memory serves both.
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
  static constexpr int kRows = kAlongM ? kTileN : kTileM;  // the tile as rows of contiguous columns
  static constexpr int kColumns = kAlongM ? kTileM : kTileN;
  static constexpr int kChunk = kColumns < 64 ? kColumns : 64;  // contiguous columns staged at a time
  static_assert(kVector == 8, "16-bit elements");
  static_assert(kColumns % kChunk == 0 && kChunk % kVector == 0, "tile not a multiple of the chunk");
  static constexpr int kPitch = kChunk + 8;  // floats; see step 2
  static constexpr bool kBiasAlongColumns = kBias == (kAlongM ? BiasAlong::kRows : BiasAlong::kColumns);

  struct SharedStorage {
    alignas(128) float chunk[kRows * kPitch];
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
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK, BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    using Vector = cutlass::Array<ElementD, kVector>;
    constexpr int kThreads = int(size(TiledMma{}));
    constexpr int kVectorsPerRow = kChunk / kVector;
    constexpr int kVectorsPerChunk = kRows * kVectorsPerRow;
    constexpr int kVectorsPerThread = (kVectorsPerChunk + kThreads - 1) / kThreads;
    auto synchronize = [] {
      cutlass::arch::NamedBarrier::sync(kThreads, int(cutlass::arch::ReservedNamedBarriers::EpilogueBarrier));
    };
    int const tile_m = int(get<0>(blk_coord_mnkl)) * kTileM;
    int const tile_n = int(get<1>(blk_coord_mnkl)) * kTileN;
    // the tile's origin and extent as rows of contiguous columns
    int const row_origin = kAlongM ? tile_n : tile_m, column_origin = kAlongM ? tile_m : tile_n;
    int const row_limit = (kAlongM ? int(get<1>(problem_shape_mnkl)) : int(get<0>(problem_shape_mnkl))) - row_origin;
    int const column_limit =
        (kAlongM ? int(get<0>(problem_shape_mnkl)) : int(get<1>(problem_shape_mnkl))) - column_origin;
    int64_t const row_stride = kAlongM ? int64_t(get<1>(params_.dD)) : int64_t(get<0>(params_.dD));
    ElementD* const d = params_.ptr_D + int64_t(get<3>(blk_coord_mnkl)) * int64_t(get<2>(params_.dD)) +
                        int64_t(row_origin) * row_stride + column_origin;
    ElementD const* const c = kHasSource ? params_.ptr_C + (d - params_.ptr_D) : nullptr;
    ElementD const* const bias = params_.ptr_bias + (kBiasAlongColumns ? column_origin : row_origin);
    float* const staged = reinterpret_cast<SharedStorage*>(smem_buf)->chunk;
    Activation<float> activation;
    // the tile's (row, contiguous column) of each accumulator: the MMA's partition of the identity
    Tensor coordinates = tiled_mma.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    auto row_of = [&](int i) { return kAlongM ? int(get<1>(coordinates(i))) : int(get<0>(coordinates(i))); };
    auto column_of = [&](int i) { return kAlongM ? int(get<0>(coordinates(i))) : int(get<1>(coordinates(i))); };

    CUTLASS_PRAGMA_UNROLL
    for (int chunk = 0; chunk < kColumns / kChunk; ++chunk) {
      // 1. C and bias of this thread's vectors of the chunk
      Vector sources[kVectorsPerThread];
      float row_bias[kVectorsPerThread];
      Vector column_bias[kVectorsPerThread];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kVectorsPerThread; ++k) {
        int const vector = k * kThreads + thread_idx;
        int const row = vector / kVectorsPerRow, column = chunk * kChunk + (vector % kVectorsPerRow) * kVector;
        bool const inside = vector < kVectorsPerChunk && row < row_limit && column < column_limit;
        if constexpr (kHasSource) {
          if (inside) sources[k] = *reinterpret_cast<Vector const*>(c + int64_t(row) * row_stride + column);
        }
        if constexpr (kBias != BiasAlong::kNone) {
          if (inside) {
            if constexpr (kBiasAlongColumns) {
              CUTLASS_PRAGMA_UNROLL
              for (int j = 0; j < kVector; ++j) column_bias[k][j] = bias[column + j];
            } else {
              row_bias[k] = float(bias[row]);
            }
          }
        }
      }
      // 2. alpha * acc of the chunk's accumulators -> shared memory
      if (chunk > 0) synchronize();  // the previous chunk's step 3 has read it
      // An even accumulator and the next one in the next column (the MMA layout's pairs;
      // constants once unrolled) go as one 8-byte store where the address allows.
      auto staged_at = [&](int i) { return staged + row_of(i) * kPitch + column_of(i) - chunk * kChunk; };
      auto stored_as_pair = [&](int i) {
        return i % 2 == 0 && i + 1 < int(size(accumulators)) && row_of(i + 1) == row_of(i) &&
               column_of(i + 1) == column_of(i) + 1 && reinterpret_cast<uintptr_t>(staged_at(i)) % 8 == 0;
      };
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accumulators); ++i) {
        int const column = column_of(i) - chunk * kChunk;
        if (column < 0 || column >= kChunk || (i % 2 == 1 && stored_as_pair(i - 1))) continue;
        if (stored_as_pair(i)) {
          *reinterpret_cast<float2*>(staged_at(i)) =
              make_float2(params_.alpha * float(accumulators(i)), params_.alpha * float(accumulators(i + 1)));
        } else {
          *staged_at(i) = params_.alpha * float(accumulators(i));
        }
      }
      synchronize();
      // 3. vectors of the chunk + bias + C, activation -> D
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kVectorsPerThread; ++k) {
        int const vector = k * kThreads + thread_idx;
        int const row = vector / kVectorsPerRow, in_chunk = (vector % kVectorsPerRow) * kVector;
        int const column = chunk * kChunk + in_chunk;
        if (vector >= kVectorsPerChunk || row >= row_limit || column >= column_limit) continue;
        float4 const low = *reinterpret_cast<float4 const*>(staged + row * kPitch + in_chunk);
        float4 const high = *reinterpret_cast<float4 const*>(staged + row * kPitch + in_chunk + 4);
        float values[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
        Vector out;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kVector; ++j) {
          float value = values[j];
          if constexpr (kBias != BiasAlong::kNone) value += kBiasAlongColumns ? float(column_bias[k][j]) : row_bias[k];
          if constexpr (kHasSource) value += float(sources[k][j]);
          out[j] = ElementD(activation(value));
        }
        *reinterpret_cast<Vector*>(d + int64_t(row) * row_stride + column) = out;
      }
    }
  }

 private:
  Params params_;
};

}  // namespace byoc_cutlass
