// pad: constant, reflect or edge padding of any rank; negative pads crop.
//
// A thread per output element maps each coordinate back to the input (pad_source); dims
// that no pad touches are merged first, so that the common cases (an image padded along
// its spatial dims, or along its channels) divide once or twice per element.
//
// Index math is 32-bit whenever every element and offset of the call fits (the common
// case): 64-bit division on the GPU is an emulated sequence several times slower.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

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

// The kernel's view of a checked pad. Neighbouring dims that no pad touches merge into
// one (the input is dense), so that an NHWC image padded along its channels indexes as
// [N*H*W, C]: fewer divisions per element for the same result.
template <class Index>
PadParams<Index> pad_params(int ndim, const int64_t* in_shape, const int64_t* pads_begin, const int64_t* pads_end,
                            int mode, const PadExtents& extents) {
  int64_t in_strides[BYOC_SHIM_MAX_DIMS];
  dense_strides(in_shape, ndim, in_strides);
  PadParams<Index> params{};
  int dims = 0;
  for (int d = 0; d < ndim; ++d) {
    const bool untouched = pads_begin[d] == 0 && pads_end[d] == 0;
    const bool previous_untouched = dims > 0 && params.pad_begin[dims - 1] == 0 && params.low[dims - 1] == 0 &&
                                    params.high[dims - 1] == params.out_shape[dims - 1];
    if (untouched && previous_untouched) {
      params.out_shape[dims - 1] *= static_cast<Index>(extents.out_shape[d]);
      params.high[dims - 1] = params.out_shape[dims - 1];
      params.in_strides[dims - 1] = static_cast<Index>(in_strides[d]);
      continue;
    }
    params.out_shape[dims] = static_cast<Index>(extents.out_shape[d]);
    params.in_strides[dims] = static_cast<Index>(in_strides[d]);
    params.pad_begin[dims] = static_cast<Index>(pads_begin[d]);
    params.low[dims] = static_cast<Index>(extents.low[d]);
    params.high[dims] = static_cast<Index>(extents.high[d]);
    ++dims;
  }
  params.ndim = dims;
  params.mode = mode;
  return params;
}

}  // namespace

extern "C" int byoc_shim_pad(const void* in, void* out, byoc_dtype dtype, int ndim, const int64_t* in_shape,
                             const int64_t* pads_begin, const int64_t* pads_end, int mode, double value,
                             void* stream) {
  static const char kFunction[] = "byoc_shim_pad";
  BYOC_CHECK(check_pad_mode(kFunction, ndim, mode));
  const size_t elem_size = dtype_size(dtype);
  if (elem_size == 0) return fail(kUnsupportedDtype, kFunction, "dtype %d is not a byoc_dtype", static_cast<int>(dtype));
  PadExtents extents;
  BYOC_CHECK(check_pad(kFunction, in, out, ndim, in_shape, pads_begin, pads_end, mode, &extents));
  const int64_t total = product(extents.out_shape, ndim);
  if (total == 0) return 0;
  cudaStream_t cuda_stream = as_stream(stream);
  if (ndim == 0) {
    return check_cuda(kFunction, "cudaMemcpyAsync",
                      cudaMemcpyAsync(out, in, elem_size, cudaMemcpyDeviceToDevice, cuda_stream));
  }
  const unsigned long long fill_bits = pad_fill_bits(dtype, value);
  const bool small = total < kIndex32Limit && product(in_shape, ndim) < kIndex32Limit;
  return visit_blob(static_cast<int>(elem_size), [&](auto blob) {
    using Element = decltype(blob);
    Element fill{};  // (pad's dtypes are at most 8 bytes; the 16-byte case is never taken)
    std::memcpy(&fill, &fill_bits, sizeof fill < sizeof fill_bits ? sizeof fill : sizeof fill_bits);
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      byoc_pdl::launch_after_previous(pad_kernel<Element, Index>, blocks_for(total), kThreads, 0, cuda_stream,
          static_cast<const Element*>(in), static_cast<Element*>(out),
          pad_params<Index>(ndim, in_shape, pads_begin, pads_end, mode, extents), fill, static_cast<Index>(total));
      return check_launch(kFunction);
    };
    return small ? launch(int32_t{}) : launch(int64_t{});
  });
}
