// Data movement: copy_strided, tile, gather, gather_elements, pad, trilu, cumsum.
//
// Most of these only move bytes, so they work on elements as opaque unsigned integers of
// the element's width; where the layout allows, several elements move as one wider word
// (up to 16 bytes, a vector access). pad and cumsum need the dtype.
//
// Index math is 32-bit whenever every element and offset of the call fits (the common
// case): 64-bit division on the GPU is an emulated sequence several times slower.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

// 32-bit indexing needs every index below this bound (with room for the grid-stride
// loop's last step, which may pass the end by a whole grid before it stops).
constexpr int64_t kIndex32Limit = int64_t{1} << 30;

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

void dense_strides(const int64_t* shape, int ndim, int64_t* strides) {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
}

int64_t product(const int64_t* values, int count) {
  int64_t result = 1;
  for (int i = 0; i < count; ++i) result *= values[i];
  return result;
}

// Element type and count of "units" per element for kernels that take any elem_size:
// the widest power-of-two word that divides the element and keeps both pointers aligned.
template <class Visit>
int visit_units(int elem_size, const void* a, const void* b, Visit&& visit) {
  const int width = common_alignment(static_cast<size_t>(elem_size), a, b);
  const int units = elem_size / width;
  return visit_blob(width, [&](auto blob) { return visit(blob, units); });
}

// ================================================================= gather

template <class Element, class Index, class IndexValue>
__global__ void gather_kernel(const Element* __restrict__ data, const IndexValue* __restrict__ indices,
                              Element* __restrict__ out, Index axis_len, Index inner, Index num_indices,
                              Index total, RunStatus status) {
  byoc_pdl::begin_after_previous();
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index column = linear % inner;
    const Index slice = linear / inner;
    const Index position = slice % num_indices;
    const Index o = slice / num_indices;
    int64_t index = static_cast<int64_t>(indices[position]);
    if (index < 0) index += axis_len;
    if (index < 0 || index >= axis_len) {  // clamped, never read outside data; reported
      report_to(status);
      index = index < 0 ? 0 : axis_len - 1;
    }
    out[linear] = data[(o * axis_len + static_cast<Index>(index)) * inner + column];
  }
}

int check_index_dtype(const char* function, byoc_dtype index_dtype) {
  if (index_dtype != BYOC_INT64 && index_dtype != BYOC_INT32) {
    return fail(kUnsupportedDtype, function, "index_dtype is %s; expected int64 or int32", dtype_name(index_dtype));
  }
  return 0;
}

// ================================================================= gather_elements

template <class Index>
struct GatherElementsParams {
  Index shape[BYOC_SHIM_MAX_DIMS];        // of out and indices
  Index data_strides[BYOC_SHIM_MAX_DIMS];  // dense strides of data
  Index axis_len;
  int ndim, axis, units;  // units: words per element
};

template <class Element, class Index, class IndexValue>
__global__ void gather_elements_kernel(const Element* __restrict__ data, const IndexValue* __restrict__ indices,
                                       Element* __restrict__ out, GatherElementsParams<Index> p, Index total,
                                       RunStatus status) {
  byoc_pdl::begin_after_previous();
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index element = p.units == 1 ? linear : linear / p.units;
    const Index part = p.units == 1 ? 0 : linear % p.units;
    int64_t index = static_cast<int64_t>(indices[element]);
    if (index < 0) index += p.axis_len;
    if (index < 0 || index >= p.axis_len) {  // clamped, never read outside data; reported
      report_to(status);
      index = index < 0 ? 0 : p.axis_len - 1;
    }
    Index rest = element, source = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const Index coordinate = rest % p.shape[d];
      rest /= p.shape[d];
      source += (d == p.axis ? static_cast<Index>(index) : coordinate) * p.data_strides[d];
    }
    out[linear] = data[source * p.units + part];
  }
}

// ================================================================= pad

constexpr int kPadConstant = 0;
constexpr int kPadReflect = 1;
constexpr int kPadEdge = 2;

template <class Index>
struct PadParams {
  Index out_shape[BYOC_SHIM_MAX_DIMS];
  Index in_strides[BYOC_SHIM_MAX_DIMS];
  Index pad_begin[BYOC_SHIM_MAX_DIMS];
  Index low[BYOC_SHIM_MAX_DIMS];  // kept (uncropped) input range [low, high) per dim
  Index high[BYOC_SHIM_MAX_DIMS];
  int ndim, mode;
};

// Where output position `o` of dim `d` reads from, or -1 for the constant (as the CPU
// shim's PadDim::source; NumPy's "reflect" mirrors without repeating the edge).
template <class Index>
__device__ __forceinline__ Index pad_source(const PadParams<Index>& p, int d, Index o) {
  const Index s = o - p.pad_begin[d];
  const Index low = p.low[d], high = p.high[d];
  if (s >= low && s < high) return s;
  if (p.mode == kPadConstant) return -1;
  if (p.mode == kPadEdge) return s < low ? low : high - 1;
  Index t = s - low;
  t = t < 0 ? -t : 2 * (high - low - 1) - t;
  return low + t;
}

template <class Element, class Index>
__global__ void pad_kernel(const Element* __restrict__ in, Element* __restrict__ out, PadParams<Index> p,
                           Element fill, Index total) {
  byoc_pdl::begin_after_previous();
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear, source = 0;
    bool inside = true;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const Index coordinate = rest % p.out_shape[d];
      rest /= p.out_shape[d];
      const Index s = pad_source(p, d, coordinate);
      if (s < 0) {
        inside = false;
        break;
      }
      source += s * p.in_strides[d];
    }
    out[linear] = inside ? in[source] : fill;
  }
}

// pad's constant in the dtype, converted as NumPy's astype would for in-range values:
// floats round to nearest, integers truncate toward zero and wrap; NaN becomes 0
// (integers) or true (bool). Returns the bytes in a 64-bit word (little-endian).
unsigned long long pad_fill_bits(byoc_dtype dtype, double value) {
  unsigned long long bits = 0;
  auto put = [&bits](const void* source, size_t size) { std::memcpy(&bits, source, size); };
  auto as_int64 = [](double v) -> int64_t {
    if (!(v == v)) return 0;
    if (v >= 9.2233720368547758e18) return 9223372036854775807ll;
    if (v <= -9.2233720368547758e18) return -9223372036854775807ll - 1;
    return static_cast<int64_t>(v);
  };
  switch (dtype) {
    case BYOC_FLOAT32: { const float f = static_cast<float>(value); put(&f, 4); break; }
    case BYOC_FLOAT64: put(&value, 8); break;
    case BYOC_FLOAT16: { const __half h = __double2half(value); put(&h, 2); break; }
    case BYOC_BFLOAT16: {
      // Through float: a double -> bfloat16 conversion on the host is not available in
      // every CUDA version; rounding twice differs only in the last bit of a tie.
      const __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(value));
      put(&b, 2);
      break;
    }
    case BYOC_INT64: { const int64_t i = as_int64(value); put(&i, 8); break; }
    case BYOC_INT32: { const int32_t i = static_cast<int32_t>(static_cast<uint32_t>(as_int64(value))); put(&i, 4); break; }
    case BYOC_INT16: { const int16_t i = static_cast<int16_t>(static_cast<uint16_t>(as_int64(value))); put(&i, 2); break; }
    case BYOC_INT8: { const int8_t i = static_cast<int8_t>(static_cast<uint8_t>(as_int64(value))); put(&i, 1); break; }
    case BYOC_UINT8: { const uint8_t i = static_cast<uint8_t>(as_int64(value)); put(&i, 1); break; }
    case BYOC_BOOL: { const uint8_t b = value != 0.0 ? 1 : 0; put(&b, 1); break; }  // NaN is true, as in NumPy
  }
  return bits;
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
  BYOC_CHECK(check_ndim(kFunction, ndim));
  BYOC_CHECK(check_positive(kFunction, "elem_size", elem_size));
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(kFunction, "shape", shape));
    BYOC_CHECK(check_pointer(kFunction, "in_strides", in_strides));
  }
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) {
      return fail(kInvalidArgument, kFunction, "shape[%d] is %lld; expected >= 0", d, static_cast<long long>(shape[d]));
    }
  }
  if (product(shape, ndim) == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "in", in));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
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

extern "C" int byoc_shim_tile(const void* in, void* out, int elem_size, int ndim, const int64_t* in_shape,
                              const int64_t* repeats, void* stream) {
  static const char kFunction[] = "byoc_shim_tile";
  BYOC_CHECK(check_ndim(kFunction, ndim));
  BYOC_CHECK(check_positive(kFunction, "elem_size", elem_size));
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(kFunction, "in_shape", in_shape));
    BYOC_CHECK(check_pointer(kFunction, "repeats", repeats));
  }
  int64_t out_count = 1;
  for (int d = 0; d < ndim; ++d) {
    if (in_shape[d] < 0 || repeats[d] < 0) {
      return fail(kInvalidArgument, kFunction, "in_shape[%d] = %lld and repeats[%d] = %lld; expected both >= 0", d,
                  static_cast<long long>(in_shape[d]), d, static_cast<long long>(repeats[d]));
    }
    out_count *= in_shape[d] * repeats[d];
  }
  if (out_count == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "in", in));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
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

extern "C" int byoc_shim_gather(const void* data, const void* indices, void* out, int elem_size,
                                byoc_dtype index_dtype, int64_t outer, int64_t axis_len, int64_t inner,
                                int64_t num_indices, void* stream) {
  static const char kFunction[] = "byoc_shim_gather";
  BYOC_CHECK(check_positive(kFunction, "elem_size", elem_size));
  BYOC_CHECK(check_index_dtype(kFunction, index_dtype));
  BYOC_CHECK(check_size(kFunction, "outer", outer));
  BYOC_CHECK(check_size(kFunction, "axis_len", axis_len));
  BYOC_CHECK(check_size(kFunction, "inner", inner));
  BYOC_CHECK(check_size(kFunction, "num_indices", num_indices));
  if (num_indices == 0 || outer == 0 || inner == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "indices", indices));
  BYOC_CHECK(check_pointer(kFunction, "data", data));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
  if (axis_len == 0) {
    // Indices live on the device and are not checked, but no index fits an empty axis.
    return fail(kIndexOutOfRange, kFunction, "axis_len is 0: every one of the %lld indices is out of range",
                static_cast<long long>(num_indices));
  }
  // Each index moves one contiguous slice of inner * elem_size bytes: move it in the
  // widest words that divide it and keep both pointers aligned.
  const size_t slice_bytes = static_cast<size_t>(inner) * elem_size;
  const int width = common_alignment(slice_bytes, data, out);
  const int64_t words = static_cast<int64_t>(slice_bytes / width);
  const int64_t total = outer * num_indices * words;
  const bool small = total < kIndex32Limit && outer * axis_len * words < kIndex32Limit;
  cudaStream_t cuda_stream = as_stream(stream);
  return visit_blob(width, [&](auto blob) {
    using Element = decltype(blob);
    auto launch = [&](auto index_tag, auto value_tag) {
      using Index = decltype(index_tag);
      using IndexValue = decltype(value_tag);
      byoc_pdl::launch_after_previous(gather_kernel<Element, Index, IndexValue>,
          blocks_for(total), kThreads, 0, cuda_stream, static_cast<const Element*>(data),
          static_cast<const IndexValue*>(indices), static_cast<Element*>(out), static_cast<Index>(axis_len),
          static_cast<Index>(words), static_cast<Index>(num_indices), static_cast<Index>(total), current_run_status());
      return check_launch(kFunction);
    };
    if (index_dtype == BYOC_INT64) return small ? launch(int32_t{}, int64_t{}) : launch(int64_t{}, int64_t{});
    return small ? launch(int32_t{}, int32_t{}) : launch(int64_t{}, int32_t{});
  });
}

extern "C" int byoc_shim_gather_elements(const void* data, const void* indices, void* out, int elem_size,
                                         byoc_dtype index_dtype, int ndim, const int64_t* data_shape,
                                         const int64_t* shape, int axis, void* stream) {
  static const char kFunction[] = "byoc_shim_gather_elements";
  BYOC_CHECK(check_positive(kFunction, "elem_size", elem_size));
  BYOC_CHECK(check_index_dtype(kFunction, index_dtype));
  BYOC_CHECK(check_ndim(kFunction, ndim));
  if (ndim == 0) return fail(kInvalidArgument, kFunction, "ndim is 0; expected a rank of at least 1");
  BYOC_CHECK(check_pointer(kFunction, "data_shape", data_shape));
  BYOC_CHECK(check_pointer(kFunction, "shape", shape));
  if (axis < 0 || axis >= ndim) return fail(kInvalidArgument, kFunction, "axis is %d; expected 0..%d", axis, ndim - 1);
  for (int d = 0; d < ndim; ++d) {
    if (data_shape[d] < 0 || shape[d] < 0) {
      return fail(kInvalidArgument, kFunction, "data_shape[%d] = %lld, shape[%d] = %lld; expected sizes >= 0", d,
                  static_cast<long long>(data_shape[d]), d, static_cast<long long>(shape[d]));
    }
    if (d != axis && shape[d] > data_shape[d]) {
      return fail(kInvalidArgument, kFunction, "shape[%d] = %lld exceeds data_shape[%d] = %lld off the gathered axis",
                  d, static_cast<long long>(shape[d]), d, static_cast<long long>(data_shape[d]));
    }
  }
  const int64_t count = product(shape, ndim);
  if (count == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "data", data));
  BYOC_CHECK(check_pointer(kFunction, "indices", indices));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
  if (data_shape[axis] == 0) {
    return fail(kIndexOutOfRange, kFunction, "data_shape[%d] is 0: every index is out of range", axis);
  }
  int64_t data_strides[BYOC_SHIM_MAX_DIMS];
  dense_strides(data_shape, ndim, data_strides);
  const int64_t data_count = product(data_shape, ndim);
  cudaStream_t cuda_stream = as_stream(stream);
  return visit_units(elem_size, data, out, [&](auto blob, int units) {
    using Element = decltype(blob);
    const int64_t total = count * units;
    auto launch = [&](auto index_tag, auto value_tag) {
      using Index = decltype(index_tag);
      using IndexValue = decltype(value_tag);
      GatherElementsParams<Index> params{};
      for (int d = 0; d < ndim; ++d) {
        params.shape[d] = static_cast<Index>(shape[d]);
        params.data_strides[d] = static_cast<Index>(data_strides[d]);
      }
      params.axis_len = static_cast<Index>(data_shape[axis]);
      params.ndim = ndim;
      params.axis = axis;
      params.units = units;
      byoc_pdl::launch_after_previous(gather_elements_kernel<Element, Index, IndexValue>,
          blocks_for(total), kThreads, 0, cuda_stream, static_cast<const Element*>(data),
          static_cast<const IndexValue*>(indices), static_cast<Element*>(out), params, static_cast<Index>(total),
          current_run_status());
      return check_launch(kFunction);
    };
    const bool small = total < kIndex32Limit && data_count * units < kIndex32Limit;
    if (index_dtype == BYOC_INT64) return small ? launch(int32_t{}, int64_t{}) : launch(int64_t{}, int64_t{});
    return small ? launch(int32_t{}, int32_t{}) : launch(int64_t{}, int32_t{});
  });
}

extern "C" int byoc_shim_pad(const void* in, void* out, byoc_dtype dtype, int ndim, const int64_t* in_shape,
                             const int64_t* pads_begin, const int64_t* pads_end, int mode, double value,
                             void* stream) {
  static const char kFunction[] = "byoc_shim_pad";
  BYOC_CHECK(check_ndim(kFunction, ndim));
  if (mode != kPadConstant && mode != kPadReflect && mode != kPadEdge) {
    return fail(kInvalidArgument, kFunction, "mode is %d; expected 0 (constant), 1 (reflect) or 2 (edge)", mode);
  }
  const size_t elem_size = dtype_size(dtype);
  if (elem_size == 0) return fail(kUnsupportedDtype, kFunction, "dtype %d is not a byoc_dtype", static_cast<int>(dtype));
  if (ndim > 0) {
    BYOC_CHECK(check_pointer(kFunction, "in_shape", in_shape));
    BYOC_CHECK(check_pointer(kFunction, "pads_begin", pads_begin));
    BYOC_CHECK(check_pointer(kFunction, "pads_end", pads_end));
  }
  int64_t out_shape[BYOC_SHIM_MAX_DIMS], low[BYOC_SHIM_MAX_DIMS], high[BYOC_SHIM_MAX_DIMS];
  for (int d = 0; d < ndim; ++d) {
    const int64_t size = in_shape[d], before = pads_begin[d], after = pads_end[d];
    if (size < 0) {
      return fail(kInvalidArgument, kFunction, "in_shape[%d] is %lld; expected >= 0", d, static_cast<long long>(size));
    }
    low[d] = before < 0 ? -before : 0;
    high[d] = size + (after < 0 ? after : 0);
    const int64_t kept = high[d] - low[d];
    if (kept < 0) {
      return fail(kInvalidArgument, kFunction, "pads %lld/%lld crop more than the %lld elements of dim %d",
                  static_cast<long long>(before), static_cast<long long>(after), static_cast<long long>(size), d);
    }
    const int64_t largest = before > after ? (before > 0 ? before : 0) : (after > 0 ? after : 0);
    if (mode == kPadReflect && largest > 0 && largest >= kept) {
      return fail(kInvalidArgument, kFunction, "reflect padding of %lld on dim %d needs more than %lld elements there",
                  static_cast<long long>(largest), d, static_cast<long long>(kept));
    }
    if (mode == kPadEdge && largest > 0 && kept == 0) {
      return fail(kInvalidArgument, kFunction, "edge padding of dim %d needs at least one element there", d);
    }
    out_shape[d] = kept + (before > 0 ? before : 0) + (after > 0 ? after : 0);
  }
  const int64_t total = product(out_shape, ndim);
  if (total == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "in", in));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
  cudaStream_t cuda_stream = as_stream(stream);
  if (ndim == 0) {
    return check_cuda(kFunction, "cudaMemcpyAsync",
                      cudaMemcpyAsync(out, in, elem_size, cudaMemcpyDeviceToDevice, cuda_stream));
  }
  int64_t in_strides[BYOC_SHIM_MAX_DIMS];
  dense_strides(in_shape, ndim, in_strides);
  const unsigned long long fill_bits = pad_fill_bits(dtype, value);
  const bool small = total < kIndex32Limit && product(in_shape, ndim) < kIndex32Limit;
  return visit_blob(static_cast<int>(elem_size), [&](auto blob) {
    using Element = decltype(blob);
    Element fill{};  // (pad's dtypes are at most 8 bytes; the 16-byte case is never taken)
    std::memcpy(&fill, &fill_bits, sizeof fill < sizeof fill_bits ? sizeof fill : sizeof fill_bits);
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      PadParams<Index> params{};
      // Neighbouring dims that no pad touches merge into one (the input is dense), so that
      // an NHWC image padded along its channels indexes as [N*H*W, C]: fewer divisions per
      // element for the same result.
      int dims = 0;
      for (int d = 0; d < ndim; ++d) {
        const bool untouched = pads_begin[d] == 0 && pads_end[d] == 0;
        const bool previous_untouched = dims > 0 && params.pad_begin[dims - 1] == 0 &&
                                        params.low[dims - 1] == 0 && params.high[dims - 1] == params.out_shape[dims - 1];
        if (untouched && previous_untouched) {
          params.out_shape[dims - 1] *= static_cast<Index>(out_shape[d]);
          params.high[dims - 1] = params.out_shape[dims - 1];
          params.in_strides[dims - 1] = static_cast<Index>(in_strides[d]);
          continue;
        }
        params.out_shape[dims] = static_cast<Index>(out_shape[d]);
        params.in_strides[dims] = static_cast<Index>(in_strides[d]);
        params.pad_begin[dims] = static_cast<Index>(pads_begin[d]);
        params.low[dims] = static_cast<Index>(low[d]);
        params.high[dims] = static_cast<Index>(high[d]);
        ++dims;
      }
      params.ndim = dims;
      params.mode = mode;
      byoc_pdl::launch_after_previous(pad_kernel<Element, Index>, blocks_for(total), kThreads, 0, cuda_stream,
          static_cast<const Element*>(in), static_cast<Element*>(out), params, fill, static_cast<Index>(total));
      return check_launch(kFunction);
    };
    return small ? launch(int32_t{}) : launch(int64_t{});
  });
}

extern "C" int byoc_shim_trilu(const void* in, void* out, int elem_size, int64_t batch, int64_t rows, int64_t cols,
                               int upper, int64_t k, void* stream) {
  static const char kFunction[] = "byoc_shim_trilu";
  BYOC_CHECK(check_positive(kFunction, "elem_size", elem_size));
  BYOC_CHECK(check_size(kFunction, "batch", batch));
  BYOC_CHECK(check_size(kFunction, "rows", rows));
  BYOC_CHECK(check_size(kFunction, "cols", cols));
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "in", in));
  BYOC_CHECK(check_pointer(kFunction, "out", out));
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
