// byoc's flash attention kernel for sm_80 and later: one pass over the keys with an online
// softmax (FlashAttention-2's schedule), written for the short sequences of encoder models
// (BERT's 128 tokens, ViT's 197 patches), where CUTLASS's example 41 kernel spends most of
// its time setting up. Built from CUTLASS's PTX wrappers (cute::SM80_16x8x16 MMA, ldmatrix
// and cp.async atoms); the generated unit (templates/cutlass/flash_attention.cu.j2) fills in
// the Params and instantiates FlashAttention for its problem.
//
//   O[b, q, h, :] = softmax(scale * Q[b, q, h, :] . K[b, :, h, :] + mask[b, h, q, :]) V[b, :, h, :]
//
// A thread block takes kWarps * 16 queries of one (batch, head); each warp owns 16 of them
// and keeps their scores, softmax state and output rows in registers. Keys and values pass
// through shared memory kBlockN rows at a time, double-buffered with cp.async: the next
// block loads while this one computes, and V's load overlaps the scores. Shared memory rows
// are 16-byte chunks XOR-swizzled by row, so ldmatrix's eight rows hit eight bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <cutlass/arch/grid_dependency_control.h>
#include <cutlass/numeric_types.h>

#include <cmath>
#include <cstdint>

namespace byoc_flash {

// Element offsets; queries, keys and output rows are [.., S, H, D] with the given strides.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;  // additive, [B, H, Sq, Sk] through (possibly zero) strides; or null
  void* o;
  int64_t q_batch_stride, q_row_stride;
  int64_t k_batch_stride, k_row_stride;
  int64_t v_batch_stride, v_row_stride;
  int64_t o_batch_stride, o_row_stride;
  int64_t mask_batch_stride, mask_head_stride, mask_query_stride;
  int head_stride_q, head_stride_k, head_stride_v, head_stride_o;
  int seq_q, seq_k;
  // query heads per key/value head (grouped-query attention: head h reads K and V of head
  // h / kv_group, in place, not repeated); 1 for multi-head attention
  int kv_group;
  float scale_log2;  // the scores' scale times log2(e): the softmax runs in base 2
};

template <class Element>
struct ElementTraits;

template <>
struct ElementTraits<cutlass::half_t> {
  using Mma = cute::SM80_16x8x16_F32F16F16F32_TN;
  static __device__ __forceinline__ uint32_t pack(float low, float high) {
    __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<uint32_t*>(&pair);
  }
};

template <>
struct ElementTraits<cutlass::bfloat16_t> {
  using Mma = cute::SM80_16x8x16_F32BF16BF16F32_TN;
  static __device__ __forceinline__ uint32_t pack(float low, float high) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t*>(&pair);
  }
};

// kZeroEmptyRows: a row none of whose keys has a finite score (every one masked with
// -inf) gives zeros, as where(isnan(softmax(s)), 0, softmax(s)) does; else 0/0 = NaN, as
// softmax itself does.
template <class Element_, int kHeadDim_, int kWarps_, int kBlockN_, bool kHasMask_, bool kZeroEmptyRows_ = false>
struct FlashAttention {
  using Element = Element_;
  using Traits = ElementTraits<Element>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kHasMask = kHasMask_;
  static constexpr bool kZeroEmptyRows = kZeroEmptyRows_;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
  static constexpr int kKeySteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kScoreTiles = kBlockN / 8;  // n-tiles of the scores
  static constexpr int kOutputTiles = kHeadDim / 8;  // n-tiles of the output
  static constexpr int kStage = kBlockN * kChunks;  // 16-byte chunks of one stage of K or V
  // Q, then two stages of K and of V
  static constexpr int kSharedBytes = (kBlockM + 4 * kBlockN) * kHeadDim * int(sizeof(Element));
  static_assert(sizeof(Element) == 2, "16-bit elements");
  // The swizzle XORs a row's chunk index with bits of the row, so that the 8 rows one
  // ldmatrix reads sit in 8 different 16-byte bank groups: rows of eight chunks or more
  // (head dims 64 and 128) with the row's low three bits; rows of four chunks (head dim 32:
  // two rows a 128-byte line) with bits 1 and 2, the line's two rows told apart by their
  // halves.
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128, "head dim 32, 64 or 128");
  static_assert(kBlockN % 16 == 0, "keys a block: a multiple of 16");

  static __device__ __forceinline__ int chunk_at(int row, int chunk) {
    if constexpr (kChunks >= 8) {
      return row * kChunks + (chunk ^ (row & 7));
    } else {
      return row * kChunks + (chunk ^ ((row >> 1) & 3));
    }
  }

  // rows [0, rows) of a tile from global memory (row stride in elements) into swizzled
  // shared memory; rows from `valid` on are zero-filled (no global read).
  template <int kRows>
  static __device__ __forceinline__ void load_tile(uint4* tile, const Element* source, int64_t row_stride,
                                                   int valid) {
    for (int index = threadIdx.x; index < kRows * kChunks; index += kThreads) {
      const int row = index / kChunks, chunk = index % kChunks;
      const bool inside = row < valid;
      const uint4* from = reinterpret_cast<const uint4*>(source + (inside ? row : 0) * row_stride) + chunk;
      cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint4>::copy(*from, tile[chunk_at(row, chunk)], inside);
    }
  }

  // left += A B[0..1], right += A B[2..3]: two 16x8x16 MMAs that share the A fragment
  // (ldmatrix.x4 loads the B fragments of two adjacent n-tiles at once)
  static __device__ __forceinline__ void mma_pair(const uint32_t (&a)[4], const uint32_t (&b)[4], float (&left)[4],
                                                  float (&right)[4]) {
    Traits::Mma::fma(left[0], left[1], left[2], left[3], a[0], a[1], a[2], a[3], b[0], b[1], left[0], left[1], left[2],
                     left[3]);
    Traits::Mma::fma(right[0], right[1], right[2], right[3], a[0], a[1], a[2], a[3], b[2], b[3], right[0], right[1],
                     right[2], right[3]);
  }

  static __device__ __forceinline__ float mask_at(const Element* row, int key, int seq_k) {
    return key < seq_k ? float(row[key]) : 0.0f;
  }

  static __device__ void run(const Params& p) {
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    // Q's rows, then K's two stages, then V's (stage s of K at shared_k + s * kStage)
    uint4* shared_q = reinterpret_cast<uint4*>(shared_bytes);
    uint4* shared_k = shared_q + kBlockM * kChunks;
    uint4* shared_v = shared_k + 2 * kStage;

    const int query_block = blockIdx.x * kBlockM, head = blockIdx.y, batch = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Element* q = static_cast<const Element*>(p.q) + batch * p.q_batch_stride + query_block * p.q_row_stride +
                       head * p.head_stride_q;
    const int kv_head = head / p.kv_group;
    const Element* k = static_cast<const Element*>(p.k) + batch * p.k_batch_stride + kv_head * p.head_stride_k;
    const Element* v = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + kv_head * p.head_stride_v;
    const int key_blocks = (p.seq_k + kBlockN - 1) / kBlockN;

    // Launched with programmatic dependent launch, the block starts while the previous
    // kernel drains: nothing touches global memory before its writes are visible.
    cutlass::arch::wait_on_dependent_grids();
    cutlass::arch::launch_dependent_grids();

    load_tile<kBlockM>(shared_q, q, p.q_row_stride, p.seq_q - query_block);
    load_tile<kBlockN>(shared_k, k, p.k_row_stride, p.seq_k);
    cute::cp_async_fence();
    load_tile<kBlockN>(shared_v, v, p.v_row_stride, p.seq_k);
    cute::cp_async_fence();

    // This thread's rows of the warp's 16: `lane / 4` and `lane / 4 + 8`; its score and
    // output columns: 2 * (lane % 4) and the next, in every 8-wide n-tile.
    const int row_in_warp = lane / 4, column = 2 * (lane % 4);
    const Element* mask_rows[2] = {nullptr, nullptr};
    if constexpr (kHasMask) {
      for (int half = 0; half < 2; ++half) {
        const int query = query_block + warp * 16 + row_in_warp + 8 * half;
        // rows past the queries read row 0's mask: their results are never stored
        mask_rows[half] = static_cast<const Element*>(p.mask) + batch * p.mask_batch_stride +
                          head * p.mask_head_stride + (query < p.seq_q ? query : 0) * p.mask_query_stride;
      }
    }

    uint32_t q_fragments[kKeySteps][4];
    float output[kOutputTiles][4];
    float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f};
    for (int tile = 0; tile < kOutputTiles; ++tile) {
      for (int i = 0; i < 4; ++i) output[tile][i] = 0.0f;
    }

    for (int block = 0; block < key_blocks; ++block) {
      const int stage = (block & 1) * kStage, key_base = block * kBlockN;
      cute::cp_async_wait<1>();  // Q and this block's K (V may still be in flight)
      __syncthreads();
      if (block == 0) {
        for (int step = 0; step < kKeySteps; ++step) {
          const int row = warp * 16 + lane % 16, chunk = 2 * step + lane / 16;
          cute::SM75_U32x4_LDSM_N::copy(reinterpret_cast<const cute::uint128_t&>(shared_q[chunk_at(row, chunk)]),
                                         q_fragments[step][0], q_fragments[step][1], q_fragments[step][2],
                                         q_fragments[step][3]);
        }
      }

      // scores = Q K^T for this block's keys
      float scores[kScoreTiles][4];
      for (int tile = 0; tile < kScoreTiles; ++tile) {
        for (int i = 0; i < 4; ++i) scores[tile][i] = 0.0f;
      }
      for (int step = 0; step < kKeySteps; ++step) {
        for (int pair = 0; pair < kScoreTiles / 2; ++pair) {
          const int key = pair * 16 + lane % 8 + (lane / 16) * 8, chunk = 2 * step + (lane / 8) % 2;
          uint32_t b[4];
          cute::SM75_U32x4_LDSM_N::copy(
              reinterpret_cast<const cute::uint128_t&>(shared_k[stage + chunk_at(key, chunk)]), b[0], b[1], b[2], b[3]);
          mma_pair(q_fragments[step], b, scores[2 * pair], scores[2 * pair + 1]);
        }
      }

      // scale, mask, and the online softmax of this thread's two rows (a row's four
      // threads are one quad: lanes 4r..4r+3)
      for (int half = 0; half < 2; ++half) {
        float block_max = -INFINITY;
        for (int tile = 0; tile < kScoreTiles; ++tile) {
          for (int i = 0; i < 2; ++i) {
            const int key = key_base + tile * 8 + column + i;
            float x = scores[tile][2 * half + i] * p.scale_log2;
            if constexpr (kHasMask) {
              x += mask_at(mask_rows[half], key, p.seq_k) * 1.4426950408889634f;
            }
            x = key < p.seq_k ? x : -INFINITY;
            scores[tile][2 * half + i] = x;
            block_max = fmaxf(block_max, x);
          }
        }
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 1));
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 2));
        const float new_max = fmaxf(running_max[half], block_max);
        // a row whose scores are all -inf so far subtracts 0 (not -inf - -inf = NaN)
        const float subtract = new_max == -INFINITY ? 0.0f : new_max;
        const float rescale = exp2f(running_max[half] - subtract);
        running_max[half] = new_max;
        float block_sum = 0.0f;
        for (int tile = 0; tile < kScoreTiles; ++tile) {
          for (int i = 0; i < 2; ++i) {
            const float probability = exp2f(scores[tile][2 * half + i] - subtract);
            scores[tile][2 * half + i] = probability;
            block_sum += probability;
          }
        }
        running_sum[half] = running_sum[half] * rescale + block_sum;
        for (int tile = 0; tile < kOutputTiles; ++tile) {
          output[tile][2 * half] *= rescale;
          output[tile][2 * half + 1] *= rescale;
        }
      }

      cute::cp_async_wait<0>();  // this block's V
      __syncthreads();  // ... in every thread's view; and every warp is past the previous block
      if (block + 1 < key_blocks) {
        const int next = key_base + kBlockN;
        load_tile<kBlockN>(shared_k + (kStage - stage), k + next * p.k_row_stride, p.k_row_stride, p.seq_k - next);
        cute::cp_async_fence();
        load_tile<kBlockN>(shared_v + (kStage - stage), v + next * p.v_row_stride, p.v_row_stride, p.seq_k - next);
        cute::cp_async_fence();
      }

      // output += P V: the probabilities' accumulator layout is the A operand's
      for (int step = 0; step < kBlockN / 16; ++step) {
        const float* low = scores[2 * step];
        const float* high = scores[2 * step + 1];
        const uint32_t a[4] = {Traits::pack(low[0], low[1]), Traits::pack(low[2], low[3]),
                               Traits::pack(high[0], high[1]), Traits::pack(high[2], high[3])};
        for (int pair = 0; pair < kOutputTiles / 2; ++pair) {
          const int key = step * 16 + lane % 8 + ((lane / 8) % 2) * 8, chunk = 2 * pair + lane / 16;
          uint32_t b[4];
          cute::SM75_U16x8_LDSM_T::copy(
              reinterpret_cast<const cute::uint128_t&>(shared_v[stage + chunk_at(key, chunk)]), b[0], b[1], b[2], b[3]);
          mma_pair(a, b, output[2 * pair], output[2 * pair + 1]);
        }
      }
    }

    // normalise, stage the warp's 16 rows in its own rows of Q's shared memory (read into
    // registers before the first block), and store them as 16-byte rows
    for (int half = 0; half < 2; ++half) {
      float sum = running_sum[half];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      // an empty row's sum is 0 and its outputs 0 (every probability exp2(-inf) = 0)
      const float inverse = kZeroEmptyRows && sum == 0.0f ? 0.0f : 1.0f / sum;
      const int row = warp * 16 + row_in_warp + 8 * half;
      for (int tile = 0; tile < kOutputTiles; ++tile) {
        uint32_t* staged = reinterpret_cast<uint32_t*>(&shared_q[chunk_at(row, tile)]) + column / 2;
        *staged = Traits::pack(output[tile][2 * half] * inverse, output[tile][2 * half + 1] * inverse);
      }
    }
    __syncwarp();
    Element* o = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head * p.head_stride_o;
    for (int index = lane; index < 16 * kChunks; index += 32) {
      const int row = warp * 16 + index / kChunks, chunk = index % kChunks;
      const int query = query_block + row;
      if (query < p.seq_q) {
        reinterpret_cast<uint4*>(o + query * p.o_row_stride)[chunk] = shared_q[chunk_at(row, chunk)];
      }
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads) flash_attention_kernel(Params p) {
  Kernel::run(p);
}

}  // namespace byoc_flash
