// Data movement: copy_strided, tile, trilu, cumsum (gather and gather_elements:
// gather.cu; pad: pad.cu).
//
// copy_strided, tile and trilu only move bytes, so they work on elements as opaque
// unsigned integers of the element's width; where the layout allows, several elements
// move as one wider word (up to 16 bytes, a vector access). cumsum needs the dtype.
//
// Index math is 32-bit whenever every element and offset of the call fits (the common
// case): 64-bit division on the GPU is an emulated sequence several times slower.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

// ================================================================= strided copy

// tile doubles the dims (repeat, size); the odd-element-size fallback adds one.
constexpr int kMaxCopyDims = 2 * BYOC_SHIM_MAX_DIMS + 1;

struct CopyProblem {
  int ndim = 0;
  int64_t shape[kMaxCopyDims] = {};
  int64_t in_strides[kMaxCopyDims] = {};
  int64_t out_strides[kMaxCopyDims] = {};
  int64_t in_offset = 0;

  int64_t count() const {
    int64_t total = 1;
    for (int d = 0; d < ndim; ++d) total *= shape[d];
    return total;
  }

  // Drops size-1 dims and merges neighbours that are contiguous with each other in both
  // in and out (a transpose keeps its permuted dims; a dense copy becomes one dim).
  void simplify() {
    int kept = 0;
    for (int d = 0; d < ndim; ++d) {
      if (shape[d] == 1) continue;
      if (kept > 0 && in_strides[kept - 1] == in_strides[d] * shape[d] &&
          out_strides[kept - 1] == out_strides[d] * shape[d]) {
        shape[kept - 1] *= shape[d];
        in_strides[kept - 1] = in_strides[d];
        out_strides[kept - 1] = out_strides[d];
        continue;
      }
      shape[kept] = shape[d];
      in_strides[kept] = in_strides[d];
      out_strides[kept] = out_strides[d];
      ++kept;
    }
    ndim = kept;
  }

  // The lowest and highest in (or out) element offsets the copy touches.
  void range(bool of_in, int64_t* low, int64_t* high) const {
    *low = *high = of_in ? in_offset : 0;
    for (int d = 0; d < ndim; ++d) {
      const int64_t reach = (shape[d] - 1) * (of_in ? in_strides[d] : out_strides[d]);
      (reach < 0 ? *low : *high) += reach;
    }
  }
};

// Kernel parameters (by value: one constant-bank read per use, no device allocation).
template <class Index>
struct CopyParams {
  Index shape[kMaxCopyDims];
  Index in_strides[kMaxCopyDims];
  Index out_strides[kMaxCopyDims];
  Index in_offset;
  int ndim;
};

template <class Element, class Index>
__global__ void strided_copy_kernel(const Element* __restrict__ in, Element* __restrict__ out, CopyParams<Index> p,
                                    Index total) {
  byoc_pdl::begin_after_previous();
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear, source = p.in_offset, destination = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const Index coordinate = rest % p.shape[d];
      rest /= p.shape[d];
      source += coordinate * p.in_strides[d];
      destination += coordinate * p.out_strides[d];
    }
    out[destination] = in[source];
  }
}

template <class Element, class Index>
int launch_strided_copy(const char* function, const void* in, void* out, const CopyProblem& problem,
                        cudaStream_t stream) {
  CopyParams<Index> params{};
  params.ndim = problem.ndim;
  params.in_offset = static_cast<Index>(problem.in_offset);
  for (int d = 0; d < problem.ndim; ++d) {
    params.shape[d] = static_cast<Index>(problem.shape[d]);
    params.in_strides[d] = static_cast<Index>(problem.in_strides[d]);
    params.out_strides[d] = static_cast<Index>(problem.out_strides[d]);
  }
  const int64_t total = problem.count();
  byoc_pdl::launch_after_previous(strided_copy_kernel<Element, Index>, blocks_for(total), kThreads, 0, stream,
      static_cast<const Element*>(in), static_cast<Element*>(out), params, static_cast<Index>(total));
  return check_launch(function);
}

// Copies `problem` (offsets and strides in elements of `elem_size` bytes).
int run_copy(const char* function, const void* in, void* out, int elem_size, CopyProblem problem,
             cudaStream_t stream) {
  problem.simplify();
  const char* source = static_cast<const char*>(in);
  if (problem.ndim == 0) {  // one element
    return check_cuda(function, "cudaMemcpyAsync",
                      cudaMemcpyAsync(out, source + problem.in_offset * elem_size, static_cast<size_t>(elem_size),
                                      cudaMemcpyDeviceToDevice, stream));
  }
  if (problem.ndim == 1 && problem.in_strides[0] == 1 && problem.out_strides[0] == 1) {  // one dense run
    return check_cuda(function, "cudaMemcpyAsync",
                      cudaMemcpyAsync(out, source + problem.in_offset * elem_size,
                                      static_cast<size_t>(problem.shape[0]) * elem_size, cudaMemcpyDeviceToDevice,
                                      stream));
  }
  const int last = problem.ndim - 1;
  if (!(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8 || elem_size == 16)) {
    // An unusual element size: move bytes, with the element's bytes as one more dim.
    for (int d = 0; d < problem.ndim; ++d) {
      problem.in_strides[d] *= elem_size;
      problem.out_strides[d] *= elem_size;
    }
    problem.shape[problem.ndim] = elem_size;
    problem.in_strides[problem.ndim] = problem.out_strides[problem.ndim] = 1;
    problem.in_offset *= elem_size;
    ++problem.ndim;
    return run_copy(function, in, out, 1, problem, stream);
  }
  // Widen: when the innermost dim is contiguous on both sides, move `factor` elements as
  // one word of up to 16 bytes, if every other stride, the offset and both pointers keep
  // that word aligned.
  if (problem.in_strides[last] == 1 && problem.out_strides[last] == 1) {
    int factor = 16 / elem_size;
    for (; factor > 1; factor /= 2) {
      const int width = factor * elem_size;
      bool fits = problem.shape[last] % factor == 0 && problem.in_offset % factor == 0 && aligned_to(in, width) &&
                  aligned_to(out, width);
      for (int d = 0; fits && d < last; ++d)
        fits = problem.in_strides[d] % factor == 0 && problem.out_strides[d] % factor == 0;
      if (fits) break;
    }
    if (factor > 1) {
      problem.shape[last] /= factor;
      for (int d = 0; d < last; ++d) {
        problem.in_strides[d] /= factor;
        problem.out_strides[d] /= factor;
      }
      problem.in_offset /= factor;
      elem_size *= factor;
    }
  }
  int64_t in_low, in_high, out_low, out_high;
  problem.range(true, &in_low, &in_high);
  problem.range(false, &out_low, &out_high);
  const bool small = problem.count() < kIndex32Limit && in_low > -kIndex32Limit && in_high < kIndex32Limit &&
                     out_low > -kIndex32Limit && out_high < kIndex32Limit;
  return visit_blob(elem_size, [&](auto blob) {
    using Element = decltype(blob);
    return small ? launch_strided_copy<Element, int32_t>(function, in, out, problem, stream)
                 : launch_strided_copy<Element, int64_t>(function, in, out, problem, stream);
  });
}

// ================================================================= concat

// Parts one launch concatenates (more are launched in groups of this many): by value, the
// kernel's parameters stay well inside the 4 KB they may take.
constexpr int kMaxConcatParts = 64;

template <class Index>
struct ConcatParams {
  const void* in[kMaxConcatParts];
  Index width[kMaxConcatParts];   // a part's row, in words
  Index column[kMaxConcatParts];  // where it starts in an output row, in words
  Index out_width;                // an output row, in words
  Index rows;
};

// blockIdx.y picks the part (uniform in the block: its parameters are one constant-bank
// read each); the blocks of x stride over that part's rows x width words.
template <class Word, class Index>
__global__ void concat_kernel(Word* __restrict__ out, ConcatParams<Index> p) {
  byoc_pdl::begin_after_previous();
  const int part = blockIdx.y;
  const Word* __restrict__ in = static_cast<const Word*>(p.in[part]);
  const Index width = p.width[part];
  const Index total = width * p.rows;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index row = linear / width;
    out[row * p.out_width + p.column[part] + (linear - row * width)] = in[linear];
  }
}

template <class Word, class Index>
int launch_concat(const char* function, const void* const* ins, int parts, const int64_t* row_bytes, int64_t rows,
                  int64_t out_row_bytes, void* out, cudaStream_t stream) {
  const int64_t word = sizeof(Word);
  int64_t column = 0;
  for (int first = 0; first < parts; first += kMaxConcatParts) {
    const int count = parts - first < kMaxConcatParts ? parts - first : kMaxConcatParts;
    ConcatParams<Index> params{};
    params.out_width = static_cast<Index>(out_row_bytes / word);
    params.rows = static_cast<Index>(rows);
    int64_t widest = 0;
    for (int i = 0; i < count; ++i) {
      params.in[i] = ins[first + i];
      params.width[i] = static_cast<Index>(row_bytes[first + i] / word);
      params.column[i] = static_cast<Index>(column / word);
      column += row_bytes[first + i];
      if (row_bytes[first + i] > widest) widest = row_bytes[first + i];
    }
    if (widest == 0) continue;
    const dim3 grid(blocks_for(widest / word * rows), static_cast<unsigned int>(count));
    byoc_pdl::launch_after_previous(concat_kernel<Word, Index>, grid, dim3(kThreads), 0, stream,
                                    static_cast<Word*>(out), params);
    BYOC_CHECK(check_launch(function));
  }
  return 0;
}

// ================================================================= trilu

template <class Element, class Index>
__global__ void trilu_kernel(const Element* __restrict__ in, Element* __restrict__ out, Index rows, Index cols,
                             int units, bool upper, int64_t k, Index total) {
  byoc_pdl::begin_after_previous();
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index element = units == 1 ? linear : linear / units;
    const int64_t j = element % cols;
    const int64_t i = (element / cols) % rows;
    const bool keep = upper ? j - i >= k : j - i <= k;
    out[linear] = keep ? in[linear] : Element{};
  }
}

// ================================================================= cumsum

template <class Accumulate>
__device__ __forceinline__ Accumulate sum_identity() {
  // -0.0 for floats, so that a sum of -0.0 stays -0.0 (NumPy starts from the first element).
  if constexpr (std::is_floating_point<Accumulate>::value) return -Accumulate(0);
  return Accumulate(0);
}

// One thread per (outer, inner) column, walking n: neighbouring threads read neighbouring
// inner columns, so every step is a coalesced row. In place (in == out) is fine.
template <class Storage, class Index>
__global__ void cumsum_columns_kernel(const Storage* in, Storage* out, Index n, Index inner, bool exclusive,
                                      bool reverse, Index columns) {
  byoc_pdl::begin_after_previous();
  using Accumulate = typename Traits<Storage>::Accumulate;
  for (Index column = blockIdx.x * blockDim.x + threadIdx.x; column < columns;
       column += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index base = (column / inner) * n * inner + column % inner;
    Accumulate sum = sum_identity<Accumulate>();
    for (Index step = 0; step < n; ++step) {
      const Index at = base + (reverse ? n - 1 - step : step) * inner;
      const Accumulate value = load_as<Accumulate>(in[at]);
      if (exclusive) {
        out[at] = store_from<Storage>(step == 0 ? Accumulate(0) : sum);  // a plain 0 first
        sum += value;
      } else {
        sum += value;
        out[at] = store_from<Storage>(sum);
      }
    }
  }
}

// Long rows with inner == 1: one block per row scans tiles of kScanThreads * kScanItems
// elements. Each thread scans kScanItems consecutive elements serially, the block scans
// the per-thread totals (warp shuffles, then the warp totals), and a running carry joins
// the tiles.
constexpr int kScanThreads = 256;
constexpr int kScanItems = 8;

template <class Storage>
__global__ void __launch_bounds__(kScanThreads)
    cumsum_rows_kernel(const Storage* in, Storage* out, int64_t rows, int64_t n, bool exclusive, bool reverse) {
  byoc_pdl::begin_after_previous();
  using Accumulate = typename Traits<Storage>::Accumulate;
  __shared__ Accumulate warp_totals[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kTile = kScanThreads * kScanItems;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const Storage* row_in = in + row * n;
    Storage* row_out = out + row * n;
    Accumulate carry = sum_identity<Accumulate>();
    for (int64_t tile_start = 0; tile_start < n; tile_start += kTile) {
      // Scan positions (reverse scans run from the end of the row).
      const int64_t first = tile_start + static_cast<int64_t>(threadIdx.x) * kScanItems;
      Accumulate values[kScanItems];
      Accumulate thread_total = sum_identity<Accumulate>();
#pragma unroll
      for (int t = 0; t < kScanItems; ++t) {
        const int64_t s = first + t;
        values[t] = s < n ? load_as<Accumulate>(row_in[reverse ? n - 1 - s : s]) : Accumulate(0);
        thread_total += values[t];
      }
      // Inclusive scan of the thread totals within the warp.
      Accumulate inclusive = thread_total;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const Accumulate other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      Accumulate exclusive_in_warp = __shfl_up_sync(0xffffffffu, inclusive, 1);
      if (lane == 0) exclusive_in_warp = sum_identity<Accumulate>();
      if (lane == 31) warp_totals[warp] = inclusive;
      __syncthreads();
      Accumulate before = carry;  // everything before this thread's first element
      for (int w = 0; w < warp; ++w) before += warp_totals[w];
      before += exclusive_in_warp;
      Accumulate tile_total = sum_identity<Accumulate>();
      for (int w = 0; w < kScanThreads / 32; ++w) tile_total += warp_totals[w];
      __syncthreads();  // warp_totals is rewritten by the next tile
      Accumulate running = before;
#pragma unroll
      for (int t = 0; t < kScanItems; ++t) {
        const int64_t s = first + t;
        if (s >= n) break;
        Storage* destination = row_out + (reverse ? n - 1 - s : s);
        if (exclusive) {
          *destination = store_from<Storage>(s == 0 ? Accumulate(0) : running);
          running += values[t];
        } else {
          running += values[t];
          *destination = store_from<Storage>(running);
        }
      }
      carry += tile_total;
    }
  }
}

}  // namespace

// ================================================================= entry points

extern "C" int byoc_shim_copy_strided(const void* in, void* out, int elem_size, int ndim, const int64_t* shape,
                                      int64_t in_offset, const int64_t* in_strides, const int64_t* out_strides,
                                      void* stream) {
  static const char kFunction[] = "byoc_shim_copy_strided";
  BYOC_CHECK(check_copy_strided(kFunction, in, out, elem_size, ndim, shape, in_strides));
  if (product(shape, ndim) == 0) return 0;
  CopyProblem problem;
  problem.ndim = ndim;
  problem.in_offset = in_offset;
  for (int d = 0; d < ndim; ++d) {
    problem.shape[d] = shape[d];
    problem.in_strides[d] = in_strides[d];
  }
  if (out_strides != nullptr) {
    for (int d = 0; d < ndim; ++d) problem.out_strides[d] = out_strides[d];
  } else {
    dense_strides(shape, ndim, problem.out_strides);
  }
  return run_copy(kFunction, in, out, elem_size, problem, as_stream(stream));
}

extern "C" int byoc_shim_concat(const void* const* ins, int parts, const int64_t* row_bytes, int64_t rows,
                                void* out, void* stream) {
  static const char kFunction[] = "byoc_shim_concat";
  BYOC_CHECK(check_concat(kFunction, ins, parts, row_bytes, rows, out));
  int64_t out_row_bytes = 0;
  for (int i = 0; i < parts; ++i) out_row_bytes += row_bytes[i];
  if (rows == 0 || out_row_bytes == 0) return 0;
  // The widest word (up to 16 bytes) that divides every row and keeps every pointer aligned.
  int word = common_alignment(static_cast<size_t>(out_row_bytes), out);
  for (int i = 0; i < parts; ++i) {
    if (row_bytes[i] == 0) continue;
    const int fits = common_alignment(static_cast<size_t>(row_bytes[i]), ins[i]);
    if (fits < word) word = fits;
  }
  const bool small = rows * (out_row_bytes / word) < kIndex32Limit;
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  return visit_blob(word, [&](auto blob) {
    using Word = decltype(blob);
    return small ? launch_concat<Word, int32_t>(kFunction, ins, parts, row_bytes, rows, out_row_bytes, out, cuda_stream)
                 : launch_concat<Word, int64_t>(kFunction, ins, parts, row_bytes, rows, out_row_bytes, out, cuda_stream);
  });
}

extern "C" int byoc_shim_tile(const void* in, void* out, int elem_size, int ndim, const int64_t* in_shape,
                              const int64_t* repeats, void* stream) {
  static const char kFunction[] = "byoc_shim_tile";
  int64_t out_shape[BYOC_SHIM_MAX_DIMS];
  BYOC_CHECK(check_tile(kFunction, in, out, elem_size, ndim, in_shape, repeats, out_shape));
  if (product(out_shape, ndim) == 0) return 0;
  // Tile is a broadcast copy: out viewed as (r0, s0, r1, s1, ...) in row-major order reads
  // in with stride 0 along every repeat dim and in's own strides along the size dims.
  CopyProblem problem;
  problem.ndim = 2 * ndim;
  int64_t in_dense[BYOC_SHIM_MAX_DIMS];
  dense_strides(in_shape, ndim, in_dense);
  for (int d = 0; d < ndim; ++d) {
    problem.shape[2 * d] = repeats[d];
    problem.in_strides[2 * d] = 0;
    problem.shape[2 * d + 1] = in_shape[d];
    problem.in_strides[2 * d + 1] = in_dense[d];
  }
  dense_strides(problem.shape, problem.ndim, problem.out_strides);
  return run_copy(kFunction, in, out, elem_size, problem, as_stream(stream));
}

extern "C" int byoc_shim_trilu(const void* in, void* out, int elem_size, int64_t batch, int64_t rows, int64_t cols,
                               int upper, int64_t k, void* stream) {
  static const char kFunction[] = "byoc_shim_trilu";
  BYOC_CHECK(check_trilu(kFunction, in, out, elem_size, batch, rows, cols));
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return visit_units(elem_size, in, out, [&](auto blob, int units) {
    using Element = decltype(blob);
    const int64_t total = batch * rows * cols * units;
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      byoc_pdl::launch_after_previous(trilu_kernel<Element, Index>, blocks_for(total), kThreads, 0, cuda_stream,
          static_cast<const Element*>(in), static_cast<Element*>(out), static_cast<Index>(rows),
          static_cast<Index>(cols), units, upper != 0, k, static_cast<Index>(total));
      return check_launch(kFunction);
    };
    return total < kIndex32Limit ? launch(int32_t{}) : launch(int64_t{});
  });
}

extern "C" int byoc_shim_cumsum(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n,
                                int64_t inner, int exclusive, int reverse, void* stream) {
  static const char kFunction[] = "byoc_shim_cumsum";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"n", n}, {"inner", inner}},
                                       {{"in", in}, {"out", out}}));
  const bool empty = outer == 0 || n == 0 || inner == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    const Storage* source = static_cast<const Storage*>(in);
    Storage* destination = static_cast<Storage*>(out);
    // Long contiguous rows get a block each; otherwise a thread per column is both
    // coalesced (inner > 1) and has enough columns to fill the GPU.
    if (inner == 1 && n >= 256) {
      const unsigned int blocks = static_cast<unsigned int>(outer < kMaxBlocks ? outer : kMaxBlocks);
      byoc_pdl::launch_after_previous(cumsum_rows_kernel<Storage>, blocks, kScanThreads, 0, cuda_stream,
          source, destination, outer, n, exclusive != 0, reverse != 0);
      return check_launch(kFunction);
    }
    const int64_t columns = outer * inner;
    if (outer * n * inner < kIndex32Limit) {
      byoc_pdl::launch_after_previous(cumsum_columns_kernel<Storage, int32_t>,
          blocks_for(columns), kThreads, 0, cuda_stream, source, destination, static_cast<int32_t>(n),
          static_cast<int32_t>(inner), exclusive != 0, reverse != 0, static_cast<int32_t>(columns));
    } else {
      byoc_pdl::launch_after_previous(cumsum_columns_kernel<Storage, int64_t>,
          blocks_for(columns), kThreads, 0, cuda_stream, source, destination, n, inner, exclusive != 0, reverse != 0,
          columns);
    }
    return check_launch(kFunction);
  });
}
