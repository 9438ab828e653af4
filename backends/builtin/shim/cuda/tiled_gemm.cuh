// A register-tiled GEMM on the CUDA cores, for what cuBLASLt does not do: integer
// matmul (int64 wrap-around accumulation), implicit-GEMM conv2d (the operand loaders
// compute im2col addresses on the fly, so no workspace), and the float fallback when
// cuBLASLt offers no algorithm.
//
// C[b] (m x n) = A[b] (m x k) * B[b] (k x n), where the operands are reached through
// functors (plain structs, not lambdas: extended lambdas need an nvcc flag):
//   Acc  load_a(int64_t b, int64_t i, int64_t p) const   A(i, p) of batch b, in Acc
//   Acc  load_b(int64_t b, int64_t p, int64_t j) const   B(p, j)
//   void store_c(int64_t b, int64_t i, int64_t j, Acc value) const
// Loaders are called only inside the matrices. A block computes a 64 x 64 tile of C with
// 256 threads (4 x 4 results each, strided by 16 so that the stores of a warp are
// contiguous), walking k in steps of 16 through shared memory.
#ifndef BYOC_SHIM_CUDA_TILED_GEMM_CUH_
#define BYOC_SHIM_CUDA_TILED_GEMM_CUH_

#include "shim_cuda.cuh"

namespace byoc_shim_cuda {

constexpr int kGemmTileM = 64;
constexpr int kGemmTileN = 64;
constexpr int kGemmTileK = 16;
constexpr int kGemmThreads = 256;  // 16 x 16
constexpr int64_t kGemmMaxBatchPerLaunch = 65535;  // gridDim.z limit

template <class Acc, class LoadA, class LoadB, class StoreC>
__global__ void __launch_bounds__(kGemmThreads)
    tiled_gemm_kernel(int64_t m, int64_t n, int64_t k, int64_t batch_offset, LoadA load_a, LoadB load_b,
                      StoreC store_c) {
  byoc_pdl::begin_after_previous();
  // +1 column: the A tile is written depth-fastest, which would otherwise put 16 threads
  // of a warp on one shared-memory bank.
  __shared__ Acc a_tile[kGemmTileK][kGemmTileM + 1];
  __shared__ Acc b_tile[kGemmTileK][kGemmTileN];
  const int thread = threadIdx.x;
  const int tx = thread % 16, ty = thread / 16;
  const int64_t batch = batch_offset + blockIdx.z;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGemmTileM;
  const int64_t column0 = static_cast<int64_t>(blockIdx.y) * kGemmTileN;

  Acc acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = Acc(0);

  for (int64_t depth0 = 0; depth0 < k; depth0 += kGemmTileK) {
    // A tile: 64 x 16, four elements per thread; consecutive threads walk the depth
    // (contiguous in a row-major A).
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = thread + q * kGemmThreads;
      const int i = e / kGemmTileK, p = e % kGemmTileK;
      const int64_t row = row0 + i, depth = depth0 + p;
      a_tile[p][i] = (row < m && depth < k) ? load_a(batch, row, depth) : Acc(0);
    }
    // B tile: 16 x 64; consecutive threads walk the columns (contiguous in a row-major B).
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = thread + q * kGemmThreads;
      const int p = e / kGemmTileN, j = e % kGemmTileN;
      const int64_t depth = depth0 + p, column = column0 + j;
      b_tile[p][j] = (depth < k && column < n) ? load_b(batch, depth, column) : Acc(0);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kGemmTileK; ++p) {
      Acc a[4], b[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = a_tile[p][ty + 16 * r];
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = b_tile[p][tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] += a[r] * b[c];
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t row = row0 + ty + 16 * r;
    if (row >= m) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t column = column0 + tx + 16 * c;
      if (column < n) store_c(batch, row, column, acc[r][c]);
    }
  }
}

// Launches the tiled GEMM over `batch` problems (in chunks of the grid's z limit).
template <class Acc, class LoadA, class LoadB, class StoreC>
int launch_tiled_gemm(const char* function, int64_t batch, int64_t m, int64_t n, int64_t k, const LoadA& load_a,
                      const LoadB& load_b, const StoreC& store_c, cudaStream_t stream) {
  const int64_t row_tiles = (m + kGemmTileM - 1) / kGemmTileM;
  const int64_t column_tiles = (n + kGemmTileN - 1) / kGemmTileN;
  if (row_tiles >= (int64_t{1} << 31) || column_tiles > 65535) {
    return fail(kInvalidArgument, function, "GEMM of %lld x %lld is too large for the tiled kernel's grid",
                static_cast<long long>(m), static_cast<long long>(n));
  }
  for (int64_t first = 0; first < batch; first += kGemmMaxBatchPerLaunch) {
    const int64_t count = batch - first < kGemmMaxBatchPerLaunch ? batch - first : kGemmMaxBatchPerLaunch;
    const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(column_tiles),
                    static_cast<unsigned>(count));
    byoc_pdl::launch_after_previous(tiled_gemm_kernel<Acc, LoadA, LoadB, StoreC>, grid, kGemmThreads, 0, stream,
        m, n, k, first, load_a, load_b, store_c);
    BYOC_CHECK(check_launch(function));
  }
  return 0;
}

}  // namespace byoc_shim_cuda

#endif  // BYOC_SHIM_CUDA_TILED_GEMM_CUH_
