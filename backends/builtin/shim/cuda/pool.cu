// The windowed pools (max, average), in NCHW or NHWC.
//
// One thread per output element, or in NHWC with channels a multiple of a 16-byte vector,
// per output cell and vector of channels. Index math is 32-bit whenever the tensors allow
// (the common case): the kernels divide per element, and 64-bit division is an emulated
// sequence.
#include "shim_cuda.cuh"

using namespace byoc_shim_cuda;

namespace {


template <class Index>
struct PoolGeometry {
  Index channels, in_h, in_w, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w;
  Index pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w;
};

// Calls visit(ih, iw) for each cell of the window starting at (row_start, column_start)
// that lies in the image: padding never wins a max (-inf, or the integer minimum) and
// adds 0 to a sum, so it is skipped.
template <class Index, class Visit>
__device__ __forceinline__ void for_each_window_cell(const PoolGeometry<Index>& s, Index row_start, Index column_start,
                                                     Visit visit) {
  for (Index kh = 0; kh < s.kernel_h; ++kh) {
    const Index ih = row_start + kh * s.dilation_h;
    if (ih < 0 || ih >= s.in_h) continue;
    for (Index kw = 0; kw < s.kernel_w; ++kw) {
      const Index iw = column_start + kw * s.dilation_w;
      if (iw < 0 || iw >= s.in_w) continue;
      visit(ih, iw);
    }
  }
}

// The average's divisor for the window starting at (row_start, column_start): its cells in
// the image, or with count_include_pad those inside the explicitly padded image (a
// ceil_mode window's overhang never counts); at least 1.
template <class Index>
__device__ __forceinline__ Index pool_divisor(const PoolGeometry<Index>& s, Index row_start, Index column_start,
                                              bool count_include_pad) {
  Index rows_inside = 0, rows_padded = 0, columns_inside = 0, columns_padded = 0;
  for (Index kh = 0; kh < s.kernel_h; ++kh) {
    const Index ih = row_start + kh * s.dilation_h;
    rows_inside += (ih >= 0 && ih < s.in_h);
    rows_padded += (ih >= -s.pad_top && ih < s.in_h + s.pad_bottom);
  }
  for (Index kw = 0; kw < s.kernel_w; ++kw) {
    const Index iw = column_start + kw * s.dilation_w;
    columns_inside += (iw >= 0 && iw < s.in_w);
    columns_padded += (iw >= -s.pad_left && iw < s.in_w + s.pad_right);
  }
  const Index count = count_include_pad ? rows_padded * columns_padded : rows_inside * columns_inside;
  return count < 1 ? Index(1) : count;  // a window wholly in the padding averages to 0
}

// One thread per output element (channels fastest in NHWC, so a warp reads neighbouring
// channels of a cell; columns fastest in NCHW).
template <class Storage, class Index, bool kAverage, bool kNhwc>
__global__ void pool2d_kernel(const Storage* __restrict__ in, Storage* __restrict__ out, PoolGeometry<Index> s,
                              bool count_include_pad, Index total) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index channel, ow, oh, image, rest = linear;
    if (kNhwc) {
      channel = rest % s.channels;
      rest /= s.channels;
      ow = rest % s.out_w;
      rest /= s.out_w;
      oh = rest % s.out_h;
      image = rest / s.out_h;
    } else {
      ow = rest % s.out_w;
      rest /= s.out_w;
      oh = rest % s.out_h;
      rest /= s.out_h;
      channel = rest % s.channels;
      image = rest / s.channels;
    }
    const Storage* base = kNhwc ? in + image * s.in_h * s.in_w * s.channels + channel
                                : in + (image * s.channels + channel) * s.in_h * s.in_w;
    const Index cell_stride = kNhwc ? s.channels : 1;
    const Index row_start = oh * s.stride_h - s.pad_top;
    const Index column_start = ow * s.stride_w - s.pad_left;
    Compute value = kAverage ? Compute(0) : T::lowest();
    for_each_window_cell(s, row_start, column_start, [&](Index ih, Index iw) {
      const Compute x = T::load(base[(ih * s.in_w + iw) * cell_stride]);
      value = kAverage ? value + x : nan_max(value, x);
    });
    if (kAverage) value = value / static_cast<Compute>(pool_divisor(s, row_start, column_start, count_include_pad));
    out[linear] = T::store(value);
  }
}

// NHWC with channels a multiple of a 16-byte vector: one thread per output cell and
// vector of channels, so that every load and store is 16 bytes and the index arithmetic
// is shared by the vector's lanes (a ResNet-50 max-pool at batch 32 ran 102 us one
// element per thread). The same semantics as pool2d_kernel, lane by lane.
template <class Storage, class Index, bool kAverage>
__global__ void pool2d_nhwc_vector_kernel(const uint4* __restrict__ in, uint4* __restrict__ out,
                                          PoolGeometry<Index> s, bool count_include_pad, Index total) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  using Compute = typename T::Compute;
  constexpr int kLanes = sizeof(uint4) / sizeof(Storage);
  const Index vectors = s.channels / kLanes;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear;
    const Index vector = rest % vectors;
    rest /= vectors;
    const Index ow = rest % s.out_w;
    rest /= s.out_w;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    const uint4* base = in + image * s.in_h * s.in_w * vectors + vector;
    const Index row_start = oh * s.stride_h - s.pad_top;
    const Index column_start = ow * s.stride_w - s.pad_left;
    Compute value[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) value[lane] = kAverage ? Compute(0) : T::lowest();
    for_each_window_cell(s, row_start, column_start, [&](Index ih, Index iw) {
      const uint4 packed = base[(ih * s.in_w + iw) * vectors];
      const Storage* lanes = reinterpret_cast<const Storage*>(&packed);
      for (int lane = 0; lane < kLanes; ++lane) {
        const Compute x = T::load(lanes[lane]);
        value[lane] = kAverage ? value[lane] + x : nan_max(value[lane], x);
      }
    });
    uint4 packed;
    Storage* lanes = reinterpret_cast<Storage*>(&packed);
    const Index count = kAverage ? pool_divisor(s, row_start, column_start, count_include_pad) : Index(1);
    for (int lane = 0; lane < kLanes; ++lane) {
      lanes[lane] = T::store(kAverage ? value[lane] / static_cast<Compute>(count) : value[lane]);
    }
    out[linear] = packed;
  }
}

template <class Storage, class Index, bool kAverage>
int launch_pool(const char* function, const void* in, void* out, bool nhwc, const PoolGeometry<Index>& s,
                bool count_include_pad, int64_t total, cudaStream_t stream) {
  const auto* x = static_cast<const Storage*>(in);
  auto* y = static_cast<Storage*>(out);
  constexpr int64_t kLanes = sizeof(uint4) / sizeof(Storage);
  const bool vectorised = nhwc && s.channels % kLanes == 0 && reinterpret_cast<uintptr_t>(in) % sizeof(uint4) == 0 &&
                          reinterpret_cast<uintptr_t>(out) % sizeof(uint4) == 0;
  if (vectorised) {
    const int64_t vectors = total / kLanes;
    byoc_pdl::launch_after_previous(pool2d_nhwc_vector_kernel<Storage, Index, kAverage>,
        blocks_for(vectors), kThreads, 0, stream, static_cast<const uint4*>(in), static_cast<uint4*>(out), s,
        count_include_pad, static_cast<Index>(vectors));
  } else if (nhwc) {
    byoc_pdl::launch_after_previous(pool2d_kernel<Storage, Index, kAverage, true>,
        blocks_for(total), kThreads, 0, stream, x, y, s, count_include_pad, static_cast<Index>(total));
  } else {
    byoc_pdl::launch_after_previous(pool2d_kernel<Storage, Index, kAverage, false>,
        blocks_for(total), kThreads, 0, stream, x, y, s, count_include_pad, static_cast<Index>(total));
  }
  return check_launch(function);
}

}  // namespace

namespace {

// byoc_shim_pool2d (pool2d_entry.h) on checked arguments, for the dtypes of `kDtypes`: one
// thread per output, with 32-bit indexing where every index fits.
template <DtypeSet kDtypes>
int pool2d_checked(const char* function, const void* in, void* out, byoc_dtype dtype, bool average, bool nhwc,
                   const PoolShape& s, bool count_include_pad, void* stream) {
  const int64_t total = s.batch * s.channels * s.out_h * s.out_w;
  const bool small = total < kIndex32Limit && s.batch * s.channels * s.in_h * s.in_w < kIndex32Limit &&
                     s.out_h * s.stride_h + s.kernel_h * s.dilation_h + s.in_h + s.pad_bottom < kIndex32Limit &&
                     s.out_w * s.stride_w + s.kernel_w * s.dilation_w + s.in_w + s.pad_right < kIndex32Limit;
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<kDtypes>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (s.empty()) return 0;
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      const PoolGeometry<Index> geometry{
          static_cast<Index>(s.channels),   static_cast<Index>(s.in_h),       static_cast<Index>(s.in_w),
          static_cast<Index>(s.out_h),      static_cast<Index>(s.out_w),      static_cast<Index>(s.kernel_h),
          static_cast<Index>(s.kernel_w),   static_cast<Index>(s.stride_h),   static_cast<Index>(s.stride_w),
          static_cast<Index>(s.pad_top),    static_cast<Index>(s.pad_left),   static_cast<Index>(s.pad_bottom),
          static_cast<Index>(s.pad_right),  static_cast<Index>(s.dilation_h), static_cast<Index>(s.dilation_w)};
      return average ? launch_pool<Storage, Index, true>(function, in, out, nhwc, geometry, count_include_pad, total,
                                                         cuda_stream)
                     : launch_pool<Storage, Index, false>(function, in, out, nhwc, geometry, count_include_pad, total,
                                                          cuda_stream);
    };
    return small ? launch(int32_t{}) : launch(int64_t{});
  });
}

}  // namespace

#include "../pool2d_entry.h"
