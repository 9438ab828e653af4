// Indexed reads: gather (whole slices of an axis, picked by an index array) and
// gather_elements (one element per index, along an axis).
//
// Elements only move, so they are opaque unsigned integers of the element's width, or of
// a wider word where the layout allows. The indices live on the device and are not read
// on the host: a kernel clamps an out-of-range index (never reading outside data) and
// reports it through the model's run status (RunStatus in shim_cuda.cuh).
//
// Index math is 32-bit whenever every element and offset of the call fits (the common
// case): 64-bit division on the GPU is an emulated sequence several times slower.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {

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

}  // namespace

extern "C" int byoc_shim_gather(const void* data, const void* indices, void* out, int elem_size,
                                byoc_dtype index_dtype, int64_t outer, int64_t axis_len, int64_t inner,
                                int64_t num_indices, void* stream) {
  static const char kFunction[] = "byoc_shim_gather";
  BYOC_CHECK(check_gather_sizes(kFunction, elem_size, index_dtype, outer, axis_len, inner, num_indices));
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
  BYOC_CHECK(check_gather_elements(kFunction, data, indices, out, elem_size, index_dtype, ndim, data_shape, shape,
                                   axis));
  const int64_t count = product(shape, ndim);
  if (count == 0) return 0;
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
