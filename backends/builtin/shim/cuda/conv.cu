// conv2d, in NCHW or NHWC (the windowed pools: pool.cu).
//
// conv2d, float dtypes with one group: a 1x1 convolution that keeps the spatial size
// (stride 1, no padding) is one cuBLASLt GEMM; any other is im2col into the caller's
// workspace, a chunk at a time, then cuBLASLt (tensor cores, float32 accumulation).
// byoc_shim_conv2d_workspace reports the chunk plus 4 MiB of cuBLASLt scratch (see
// plan_conv_workspace for the exact formula).
// Grouped convs in NHWC with 16-bit floats and groups of whole 8-channel vectors run on
// grouped_conv.cuh's kernel, depthwise ones on depthwise.cuh's, dense ones of 4 input
// channels (a stem) on its few-channel kernel.
// Everything else (integers, groups > 1, no or too little workspace, or no cuBLASLt
// algorithm) is an implicit GEMM: the tiled GEMM of tiled_gemm.cuh with operand loaders
// that compute im2col addresses on the fly (zero outside the image), one GEMM per group
// with the batch folded into the GEMM's rows (NHWC) or columns (NCHW).
//
// Index math in the loaders is 32-bit whenever the tensors allow (the common case): they
// divide per element, and 64-bit division is an emulated sequence.
#include "conv.cuh"
#include "depthwise.cuh"
#include "grouped_conv.cuh"
#include "tiled_gemm.cuh"

using namespace byoc_shim_cuda;

namespace {

// ---------------------------------------------------------------- NCHW loaders
// Per group g: C (O/g x batch*OH*OW) = W (O/g x C/g*KH*KW) * columns (C/g*KH*KW x batch*OH*OW).

template <class Storage, class Acc, class Index>
struct NchwWeight {  // A(o, p): weight row o of group g, contiguous in p = (c, kh, kw)
  const Storage* weight;
  Index depth;
  Index group_out;
  __device__ Acc operator()(int64_t g, int64_t o, int64_t p) const {
    return load_as<Acc>(weight[(static_cast<Index>(g) * group_out + static_cast<Index>(o)) * depth +
                               static_cast<Index>(p)]);
  }
};

template <class Storage, class Acc, class Index>
struct NchwColumns {  // B(p, j): p = (c, kh, kw), j = (image, oh, ow)
  const Storage* in;
  ConvGeometry<Index> s;
  __device__ Acc operator()(int64_t g, int64_t p64, int64_t j64) const {
    const Index p = static_cast<Index>(p64), j = static_cast<Index>(j64);
    const Index kernel_area = s.kernel_h * s.kernel_w;
    const Index c = p / kernel_area, cell = p % kernel_area;
    const Index kh = cell / s.kernel_w, kw = cell % s.kernel_w;
    const Index out_area = s.out_h * s.out_w;
    const Index image = j / out_area, pixel = j % out_area;
    const Index ih = (pixel / s.out_w) * s.stride_h - s.pad_top + kh * s.dilation_h;
    const Index iw = (pixel % s.out_w) * s.stride_w - s.pad_left + kw * s.dilation_w;
    if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) return Acc(0);
    const Index channel = static_cast<Index>(g) * s.group_in + c;
    return load_as<Acc>(in[((image * s.in_channels + channel) * s.in_h + ih) * s.in_w + iw]);
  }
};

template <class Storage, class Acc, class Index>
struct NchwOutput {
  Storage* out;
  const Storage* bias;  // may be NULL
  ConvGeometry<Index> s;
  __device__ void operator()(int64_t g, int64_t o64, int64_t j64, Acc value) const {
    const Index out_area = s.out_h * s.out_w;
    const Index channel = static_cast<Index>(g) * s.group_out + static_cast<Index>(o64);
    const Index j = static_cast<Index>(j64);
    if (bias != nullptr) value += load_as<Acc>(bias[channel]);
    out[((j / out_area) * s.out_channels + channel) * out_area + j % out_area] = store_from<Storage>(value);
  }
};

// ---------------------------------------------------------------- NHWC loaders
// Per group g: C (batch*OH*OW x O/g) = columns (batch*OH*OW x KH*KW*C/g) * W^T (KH*KW*C/g x O/g).

template <class Storage, class Acc, class Index>
struct NhwcColumns {  // A(i, p): i = (image, oh, ow), p = (kh, kw, c): channels contiguous
  const Storage* in;
  ConvGeometry<Index> s;
  __device__ Acc operator()(int64_t g, int64_t i64, int64_t p64) const {
    const Index i = static_cast<Index>(i64), p = static_cast<Index>(p64);
    const Index cell = p / s.group_in, c = p % s.group_in;
    const Index kh = cell / s.kernel_w, kw = cell % s.kernel_w;
    const Index out_area = s.out_h * s.out_w;
    const Index image = i / out_area, pixel = i % out_area;
    const Index ih = (pixel / s.out_w) * s.stride_h - s.pad_top + kh * s.dilation_h;
    const Index iw = (pixel % s.out_w) * s.stride_w - s.pad_left + kw * s.dilation_w;
    if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) return Acc(0);
    return load_as<Acc>(
        in[((image * s.in_h + ih) * s.in_w + iw) * s.in_channels + static_cast<Index>(g) * s.group_in + c]);
  }
};

template <class Storage, class Acc, class Index>
struct NhwcWeight {  // B(p, j) = W[j][p]: the same filter rows as NchwWeight (OHWI here), transposed
  NchwWeight<Storage, Acc, Index> rows;
  __device__ Acc operator()(int64_t g, int64_t p, int64_t j) const { return rows(g, j, p); }
};

template <class Storage, class Acc, class Index>
struct NhwcOutput {
  Storage* out;
  const Storage* bias;
  ConvGeometry<Index> s;
  __device__ void operator()(int64_t g, int64_t i, int64_t j, Acc value) const {
    const Index channel = static_cast<Index>(g) * s.group_out + static_cast<Index>(j);
    if (bias != nullptr) value += load_as<Acc>(bias[channel]);
    out[static_cast<Index>(i) * s.out_channels + channel] = store_from<Storage>(value);
  }
};

// Grouped convs with few output channels per group (depthwise: one): one thread per output
// element sums its group's input channels over the window. As a GEMM per group their N
// would be one column of a 64-wide tile (MobileNetV3's depthwise convs took 0.8 ms each
// at batch 32 that way). NHWC walks channels fastest, so a warp reads neighbouring
// channels of one pixel. Weights are OHWI (NHWC) or OIHW (NCHW), as the GEMM loaders read them.
constexpr int64_t kDirectConvMaxGroupOut = 16;

template <class Storage, class Index, bool kNhwc>
__global__ void direct_conv_kernel(const Storage* __restrict__ in, const Storage* __restrict__ weight,
                                   const Storage* __restrict__ bias, Storage* __restrict__ out, ConvGeometry<Index> s,
                                   Index total) {
  byoc_pdl::begin_after_previous();
  using Acc = typename Traits<Storage>::Accumulate;
  const Index depth = s.group_in * s.kernel_h * s.kernel_w;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear, channel, ow, oh;
    if (kNhwc) {
      channel = rest % s.out_channels;
      rest /= s.out_channels;
      ow = rest % s.out_w;
      rest /= s.out_w;
      oh = rest % s.out_h;
    } else {
      ow = rest % s.out_w;
      rest /= s.out_w;
      oh = rest % s.out_h;
      rest /= s.out_h;
      channel = rest % s.out_channels;
    }
    const Index image = rest / (kNhwc ? s.out_h : s.out_channels);
    const Index first_in = (channel / s.group_out) * s.group_in;
    const Storage* filter = weight + channel * depth;
    Acc sum = Acc(0);
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      if (ih < 0 || ih >= s.in_h) continue;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Index iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
        if (iw < 0 || iw >= s.in_w) continue;
        for (Index c = 0; c < s.group_in; ++c) {
          const Index source = kNhwc ? ((image * s.in_h + ih) * s.in_w + iw) * s.in_channels + first_in + c
                                     : ((image * s.in_channels + first_in + c) * s.in_h + ih) * s.in_w + iw;
          const Index tap = kNhwc ? (kh * s.kernel_w + kw) * s.group_in + c : (c * s.kernel_h + kh) * s.kernel_w + kw;
          sum += load_as<Acc>(in[source]) * load_as<Acc>(filter[tap]);
        }
      }
    }
    if (bias != nullptr) sum += load_as<Acc>(bias[channel]);
    out[linear] = store_from<Storage>(sum);
  }
}

// Depthwise convs in NHWC with 16-bit floats and channels a multiple of 8: depthwise.cuh's
// kernel, storing sum + bias. (The direct kernel above read 2 bytes per load and filters
// strided by the window: MobileNetV3's depthwise convs took 82 us each at batch 32 on an H100.)
template <class Storage, class Index>
struct DepthwiseBiasStore {
  Storage* out;
  const Storage* bias;  // may be NULL
  Index vectors_per_pixel;
  __device__ void operator()(Index vector, const float (&sum)[byoc_depthwise::kVector]) const {
    constexpr int kVector = byoc_depthwise::kVector;
    const Index channel = (vector % vectors_per_pixel) * kVector;
    alignas(16) Storage y[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      y[j] = store_from<Storage>(bias != nullptr ? sum[j] + load_as<float>(bias[channel + j]) : sum[j]);
    }
    *reinterpret_cast<uint4*>(out + vector * kVector) = *reinterpret_cast<const uint4*>(y);
  }
};

// Launches one of depthwise.cuh's NHWC kernels (`launch`: launch_nhwc or
// launch_few_channels) storing sum + bias; false where the launch failed (not this conv's
// error: the caller's fallback runs, needing none of this).
template <class Storage, class Index, class Launch>
bool launch_with_bias_store(const Storage* x, const Storage* w, const Storage* b, Storage* y, int64_t batch,
                            const ConvGeometry<Index>& s, cudaStream_t stream, Launch launch) {
  const byoc_depthwise::Geometry<Index> geometry{s.in_h, s.in_w, s.out_channels, s.kernel_h, s.kernel_w,
                                                 s.out_h, s.out_w, s.stride_h, s.stride_w, s.pad_top,
                                                 s.pad_left, s.dilation_h, s.dilation_w};
  const DepthwiseBiasStore<Storage, Index> store{y, b, static_cast<Index>(s.out_channels / byoc_depthwise::kVector)};
  if (launch(x, w, batch, geometry, store, stream) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

// Whether the depthwise kernel takes this conv; it is then launched (check_launch sees
// how that went).
template <class Storage, class Index>
bool launch_depthwise_nhwc(const Storage* x, const Storage* w, const Storage* b, Storage* y, int64_t batch,
                           const ConvGeometry<Index>& s, cudaStream_t stream) {
  if constexpr (sizeof(Storage) != 2 || !Traits<Storage>::is_float) {
    return false;
  } else {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (s.group_in != 1 || s.group_out != 1 || !byoc_depthwise::takes(s.out_channels, s.kernel_h, s.kernel_w) ||
        !aligned(x) || !aligned(y)) {
      return false;
    }
    return launch_with_bias_store(x, w, b, y, batch, s, stream,
                                  [](auto... args) { return byoc_depthwise::launch_nhwc(args...); });
  }
}

// Dense NHWC convs of 4 input channels in 16-bit floats (an image's stem after
// PadConvChannels): depthwise.cuh's few_channels_kernel, storing sum + bias.
template <class Storage, class Index>
bool launch_few_channels_nhwc(const Storage* x, const Storage* w, const Storage* b, Storage* y, int64_t batch,
                              const ConvGeometry<Index>& s, cudaStream_t stream) {
  if constexpr (sizeof(Storage) != 2 || !Traits<Storage>::is_float) {
    return false;
  } else {
    if (s.group_in != s.in_channels || s.in_channels != byoc_depthwise::kFewChannels ||  // the kernel below: 4
        !byoc_depthwise::takes_few_channels(s.in_channels, s.out_channels, s.kernel_h, s.kernel_w) ||
        reinterpret_cast<uintptr_t>(x) % 8 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0) {
      return false;
    }
    return launch_with_bias_store(x, w, b, y, batch, s, stream, [](auto... args) {
      return byoc_depthwise::launch_few_channels<byoc_depthwise::kFewChannels>(args...);
    });
  }
}

// Whether grouped_conv.cuh's kernel takes this conv (16-bit floats in NHWC, groups of whole
// 8-channel vectors); it is then launched (check_launch sees how that went).
template <class Storage, class Index>
bool launch_grouped_nhwc(const Storage* x, const Storage* w, const Storage* b, Storage* y, int64_t batch,
                         const ConvGeometry<Index>& s, cudaStream_t stream) {
  if constexpr (sizeof(Storage) != 2 || !Traits<Storage>::is_float) {
    return false;
  } else {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (s.group_in == 0 || s.group_out == 0 || s.in_channels / s.group_in < 2 ||
        !byoc_depthwise::takes_grouped(s.in_channels, s.out_channels, s.in_channels / s.group_in, s.kernel_h,
                                       s.kernel_w) ||
        !aligned(x) || !aligned(y)) {
      return false;
    }
    const int64_t group_in = s.group_in, group_out = s.group_out;
    return launch_with_bias_store(x, w, b, y, batch, s, stream,
                                  [group_in, group_out](auto in, auto weight, int64_t images, const auto& geometry,
                                                        auto store, cudaStream_t launch_stream) {
                                    return byoc_depthwise::launch_grouped_runtime(in, weight, images, geometry,
                                                                                  group_in, group_out, store,
                                                                                  launch_stream);
                                  });
  }
}

template <class Storage, class Index>
int implicit_gemm_conv(const char* function, const void* in, const void* weight, const void* bias, void* out,
                       bool nhwc, int64_t batch, const ConvGeometry<Index>& s, int64_t groups, cudaStream_t stream) {
  using Acc = typename Traits<Storage>::Accumulate;
  const auto* x = static_cast<const Storage*>(in);
  const auto* w = static_cast<const Storage*>(weight);
  const auto* b = static_cast<const Storage*>(bias);
  auto* y = static_cast<Storage*>(out);
  const Index depth = s.group_in * s.kernel_h * s.kernel_w;
  const int64_t pixels = batch * static_cast<int64_t>(s.out_h) * s.out_w;
  if (nhwc && groups > 1 && launch_grouped_nhwc(x, w, b, y, batch, s, stream)) {
    return check_launch(function);
  }
  if (groups > 1 && s.group_out < kDirectConvMaxGroupOut) {
    const int64_t total = pixels * s.out_channels;
    if (nhwc && launch_depthwise_nhwc(x, w, b, y, batch, s, stream)) {
      return check_launch(function);
    }
    if (nhwc) {
      byoc_pdl::launch_after_previous(direct_conv_kernel<Storage, Index, true>, blocks_for(total), kThreads, 0, stream,
          x, w, b, y, s, static_cast<Index>(total));
    } else {
      byoc_pdl::launch_after_previous(direct_conv_kernel<Storage, Index, false>, blocks_for(total), kThreads, 0, stream,
          x, w, b, y, s, static_cast<Index>(total));
    }
    return check_launch(function);
  }
  if (nhwc) {
    return launch_tiled_gemm<Acc>(function, groups, pixels, s.group_out, depth,
                                  NhwcColumns<Storage, Acc, Index>{x, s},
                                  NhwcWeight<Storage, Acc, Index>{{w, depth, s.group_out}},
                                  NhwcOutput<Storage, Acc, Index>{y, b, s}, stream);
  }
  return launch_tiled_gemm<Acc>(function, groups, s.group_out, pixels, depth,
                                NchwWeight<Storage, Acc, Index>{w, depth, s.group_out},
                                NchwColumns<Storage, Acc, Index>{x, s}, NchwOutput<Storage, Acc, Index>{y, b, s},
                                stream);
}

// out[..., channel, ...] += bias[channel] after the cuBLASLt 1x1 path.
template <class Storage>
__global__ void add_bias_kernel(Storage* out, const Storage* bias, int64_t channels, int64_t inner, int64_t total) {
  byoc_pdl::begin_after_previous();
  using T = Traits<Storage>;
  for (int64_t linear = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; linear < total;
       linear += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t channel = (linear / inner) % channels;
    out[linear] = T::store(T::load(out[linear]) + T::load(bias[channel]));
  }
}

// out[..., channel, ...] += bias[channel] after a cuBLASLt path (nothing when bias is
// NULL); `inner` is the run of elements per channel (1 in NHWC).
template <class Storage>
int add_bias(const char* function, void* out, const void* bias, int64_t channels, int64_t inner, int64_t total,
             cudaStream_t stream) {
  if (bias == nullptr) return 0;
  byoc_pdl::launch_after_previous(add_bias_kernel<Storage>, blocks_for(total), kThreads, 0, stream,
      static_cast<Storage*>(out), static_cast<const Storage*>(bias), channels, inner, total);
  return check_launch(function);
}

template <class Index>
ConvGeometry<Index> conv_geometry(const ConvShape& s) {
  return ConvGeometry<Index>{
      static_cast<Index>(s.in_channels),           static_cast<Index>(s.in_h),
      static_cast<Index>(s.in_w),                  static_cast<Index>(s.out_channels),
      static_cast<Index>(s.kernel_h),              static_cast<Index>(s.kernel_w),
      static_cast<Index>(s.out_h),                 static_cast<Index>(s.out_w),
      static_cast<Index>(s.stride_h),              static_cast<Index>(s.stride_w),
      static_cast<Index>(s.pad_top),               static_cast<Index>(s.pad_left),
      static_cast<Index>(s.dilation_h),            static_cast<Index>(s.dilation_w),
      static_cast<Index>(s.group_in_channels()),   static_cast<Index>(s.group_out_channels())};
}

// Whether every input row and column a window reaches, padding and stride included, has a
// 32-bit index.
inline bool spatial_fits_index32(const ConvShape& s) {
  return (s.in_h + s.pad_top + (s.kernel_h - 1) * s.dilation_h + s.out_h * s.stride_h) < kIndex32Limit &&
         (s.in_w + s.pad_left + (s.kernel_w - 1) * s.dilation_w + s.out_w * s.stride_w) < kIndex32Limit;
}

// 1x1, stride 1, no padding, one group: out = in * W^T (NHWC) or out[b] = W * in[b]
// (NCHW), a plain GEMM for cuBLASLt. Sets *ran when it computed the output.
template <class Storage>
int pointwise_conv(const char* function, const void* in, const void* weight, const void* bias, void* out,
                   byoc_dtype dtype, bool nhwc, const ConvShape& s, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, bool* ran) {
  const bool pointwise = s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 &&
                         s.pad_top == 0 && s.pad_left == 0 && s.out_h == s.in_h && s.out_w == s.in_w &&
                         s.groups == 1 && s.in_channels > 0;
  if (!pointwise) return 0;
  bool unsupported = false;
  const int64_t pixels = s.in_h * s.in_w;
  if (nhwc) {
    BYOC_CHECK(lt_matmul(function, in, weight, out, dtype, 1, s.batch * pixels, s.out_channels, s.in_channels, false,
                         true, 0, 0, 0, -1, workspace, workspace_bytes, stream, &unsupported));
  } else {
    BYOC_CHECK(lt_matmul(function, weight, in, out, dtype, s.batch, s.out_channels, pixels, s.in_channels, false,
                         false, 0, s.in_channels * pixels, s.out_channels * pixels, -1, workspace, workspace_bytes,
                         stream, &unsupported));
  }
  if (unsupported) return 0;
  *ran = true;
  return add_bias<Storage>(function, out, bias, s.out_channels, nhwc ? int64_t{1} : pixels,
                           s.batch * s.out_channels * pixels, stream);
}

// Float, one group, workspace for the im2col chunk: tensor cores through cuBLASLt (conv.cuh).
// Sets *ran when it computed the output.
template <class Storage>
int workspace_im2col_conv(const char* function, const void* in, const void* weight, const void* bias, void* out,
                          byoc_dtype dtype, int layout, const ConvShape& s, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream, bool* ran) {
  const ConvWorkspacePlan plan = plan_conv_workspace(dtype, layout, s.batch, s.in_channels, s.in_h, s.in_w,
                                                     s.out_channels, s.kernel_h, s.kernel_w, s.out_h, s.out_w, s.groups);
  const size_t columns_space = (plan.columns_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  if (!plan.im2col || workspace == nullptr || workspace_bytes < columns_space) return 0;
  const bool nhwc = layout == kLayoutNHWC;
  const int64_t columns_elements = static_cast<int64_t>(plan.columns_bytes / dtype_size(dtype));
  const bool small32 = spatial_fits_index32(s) && columns_elements < kIndex32Limit &&
                       s.batch * s.in_channels * s.in_h * s.in_w < kIndex32Limit &&
                       s.batch * s.out_h * s.out_w < kIndex32Limit;
  bool unsupported = false;
  BYOC_CHECK(small32 ? im2col_conv(function, in, weight, out, dtype, nhwc, s.batch, conv_geometry<int32_t>(s), plan,
                                   workspace, workspace_bytes, stream, &unsupported)
                     : im2col_conv(function, in, weight, out, dtype, nhwc, s.batch, conv_geometry<int64_t>(s), plan,
                                   workspace, workspace_bytes, stream, &unsupported));
  if (unsupported) return 0;
  *ran = true;
  return add_bias<Storage>(function, out, bias, s.out_channels, nhwc ? int64_t{1} : s.out_h * s.out_w,
                           s.batch * s.out_channels * s.out_h * s.out_w, stream);
}

}  // namespace

extern "C" size_t byoc_shim_conv2d_workspace(byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels,
                                             int64_t in_h, int64_t in_w, int64_t out_channels, int64_t kernel_h,
                                             int64_t kernel_w, int64_t out_h, int64_t out_w, int64_t groups) {
  // Float dtypes, one group: a 1x1 convolution that keeps the spatial size is one GEMM
  // (4 MiB of cuBLASLt workspace); any other takes the im2col chunk (rounded up to 256
  // bytes) plus those 4 MiB. Everything else (integers, groups > 1, empty) needs none.
  return plan_conv_workspace(dtype, layout, batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h,
                             out_w, groups)
      .total_bytes;
}

namespace {

// byoc_shim_conv2d (conv2d_entry.h) on checked arguments: a pointwise conv or im2col as a
// cuBLASLt GEMM where one fits, else the implicit GEMM on the CUDA cores.
int conv2d_checked(const char* function, const void* in, const void* weight, const void* bias, void* out,
                   byoc_dtype dtype, int layout, const ConvShape& shape, void* workspace, size_t workspace_bytes,
                   void* stream) {
  const int64_t batch = shape.batch, in_channels = shape.in_channels, in_h = shape.in_h, in_w = shape.in_w;
  const int64_t out_channels = shape.out_channels, kernel_h = shape.kernel_h, kernel_w = shape.kernel_w;
  const int64_t out_h = shape.out_h, out_w = shape.out_w, groups = shape.groups;
  cudaStream_t cuda_stream = as_stream(stream);
  const bool nhwc = layout == kLayoutNHWC;
  return dispatch<DtypeSet::kNumbers>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (shape.empty()) return 0;
    // Four input channels (an image's stem): the direct kernel, before any GEMM.
    if (nhwc && groups == 1 && in_channels == byoc_depthwise::kFewChannels &&
        batch * out_channels * out_h * out_w < kIndex32Limit && batch * in_channels * in_h * in_w < kIndex32Limit &&
        spatial_fits_index32(shape) &&
        launch_few_channels_nhwc(static_cast<const Storage*>(in), static_cast<const Storage*>(weight),
                                 static_cast<const Storage*>(bias), static_cast<Storage*>(out), batch,
                                 conv_geometry<int32_t>(shape), cuda_stream)) {
      return check_launch(function);
    }
    if constexpr (Traits<Storage>::is_float) {
      bool ran = false;
      BYOC_CHECK(pointwise_conv<Storage>(function, in, weight, bias, out, dtype, nhwc, shape, workspace,
                                         workspace_bytes, cuda_stream, &ran));
      if (ran) return 0;
      BYOC_CHECK(workspace_im2col_conv<Storage>(function, in, weight, bias, out, dtype, layout, shape, workspace,
                                                workspace_bytes, cuda_stream, &ran));
      if (ran) return 0;
    }
    // Everything else, or no cuBLASLt algorithm: the implicit GEMM on the CUDA cores.
    const bool small = batch * out_channels * out_h * out_w < kIndex32Limit &&
                       batch * in_channels * in_h * in_w < kIndex32Limit &&
                       out_channels * (in_channels / groups) * kernel_h * kernel_w < kIndex32Limit &&
                       spatial_fits_index32(shape);
    return small ? implicit_gemm_conv<Storage, int32_t>(function, in, weight, bias, out, nhwc, batch,
                                                        conv_geometry<int32_t>(shape), groups, cuda_stream)
                 : implicit_gemm_conv<Storage, int64_t>(function, in, weight, bias, out, nhwc, batch,
                                                        conv_geometry<int64_t>(shape), groups, cuda_stream);
  });
}

}  // namespace

#include "../conv2d_entry.h"
