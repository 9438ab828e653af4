// conv2d and the windowed pools, in NCHW or NHWC.
//
// conv2d, float dtypes with one group: a 1x1 convolution that keeps the spatial size
// (stride 1, no padding) is one cuBLASLt GEMM; any other is im2col into the caller's
// workspace, a chunk at a time, then cuBLASLt (tensor cores, float32 accumulation).
// byoc_shim_conv2d_workspace reports the chunk plus 4 MiB of cuBLASLt scratch (see
// plan_conv_workspace for the exact formula).
// Everything else (integers, groups > 1, no or too little workspace, or no cuBLASLt
// algorithm) is an implicit GEMM: the tiled GEMM of tiled_gemm.cuh with operand loaders
// that compute im2col addresses on the fly (zero outside the image), one GEMM per group
// with the batch folded into the GEMM's rows (NHWC) or columns (NCHW).
//
// Index math in the loaders is 32-bit whenever the tensors allow (the common case): they
// divide per element, and 64-bit division is an emulated sequence.
#include "tiled_gemm.cuh"

using namespace byoc_shim_cuda;

namespace {

constexpr int64_t kIndex32Limit = int64_t{1} << 30;

// Every size and attribute of one conv2d call (names as in byoc_shim.h), in Index.
template <class Index>
struct ConvGeometry {
  Index in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h, out_w;
  Index stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  Index group_in, group_out;  // channels per group
};

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
struct NhwcWeight {  // B(p, j) = W[j][p]: weight (O x KH*KW*C/g), row j of group g
  const Storage* weight;
  Index depth;
  Index group_out;
  __device__ Acc operator()(int64_t g, int64_t p, int64_t j) const {
    return load_as<Acc>(weight[(static_cast<Index>(g) * group_out + static_cast<Index>(j)) * depth +
                               static_cast<Index>(p)]);
  }
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

// Depthwise convs (one input and one output channel per group) in NHWC with 16-bit floats
// and channels a multiple of 8 (MobileNet's, EfficientNet's, ConvNeXt's): a thread computes
// 8 neighbouring channels of one output pixel, reading them with one 16-byte load per tap.
// Each block first copies the filters into shared memory tap-major ([kh][kw][channel]; OHWI
// is [channel][kh][kw]), so that a thread's 8 filters of one tap are one 16-byte read too,
// and then loops over the output: a grid of a few blocks per SM copies them few times.
// (The direct kernel above read 2 bytes per load and filters strided by the window: MobileNetV3's
// depthwise convs took 82 us each at batch 32 on an H100.)
constexpr int kDepthwiseVector = 8;
constexpr size_t kDepthwiseMaxSharedBytes = size_t{96} << 10;

template <class Storage, class Index>
__global__ void depthwise_nhwc_kernel(const Storage* __restrict__ in, const Storage* __restrict__ weight,
                                      const Storage* __restrict__ bias, Storage* __restrict__ out,
                                      ConvGeometry<Index> s, Index total_vectors) {
  extern __shared__ uint4 shared_words[];  // 16-byte aligned
  Storage* filters = reinterpret_cast<Storage*>(shared_words);
  byoc_pdl::begin_after_previous();
  const Index channels = s.out_channels, taps = s.kernel_h * s.kernel_w;
  for (Index i = threadIdx.x; i < channels * taps; i += blockDim.x) {  // coalesced reads of OHWI
    filters[(i % taps) * channels + i / taps] = weight[i];
  }
  __syncthreads();
  const Index vectors = channels / kDepthwiseVector;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total_vectors;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear;
    const Index channel = (rest % vectors) * kDepthwiseVector;
    rest /= vectors;
    const Index ow = rest % s.out_w;
    rest /= s.out_w;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    float sum[kDepthwiseVector] = {};
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      if (ih < 0 || ih >= s.in_h) continue;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Index iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
        if (iw < 0 || iw >= s.in_w) continue;
        alignas(16) Storage x[kDepthwiseVector], w[kDepthwiseVector];
        *reinterpret_cast<uint4*>(x) =
            __ldg(reinterpret_cast<const uint4*>(in + ((image * s.in_h + ih) * s.in_w + iw) * channels + channel));
        *reinterpret_cast<uint4*>(w) =
            *reinterpret_cast<const uint4*>(filters + (kh * s.kernel_w + kw) * channels + channel);
#pragma unroll
        for (int j = 0; j < kDepthwiseVector; ++j) sum[j] += load_as<float>(x[j]) * load_as<float>(w[j]);
      }
    }
    alignas(16) Storage y[kDepthwiseVector];
#pragma unroll
    for (int j = 0; j < kDepthwiseVector; ++j) {
      y[j] = store_from<Storage>(bias != nullptr ? sum[j] + load_as<float>(bias[channel + j]) : sum[j]);
    }
    *reinterpret_cast<uint4*>(out + linear * kDepthwiseVector) = *reinterpret_cast<const uint4*>(y);
  }
}

// Whether depthwise_nhwc_kernel takes this conv; it is then launched (check_launch sees
// how that went).
template <class Storage, class Index>
bool launch_depthwise_nhwc(const Storage* x, const Storage* w, const Storage* b, Storage* y, int64_t batch,
                           const ConvGeometry<Index>& s, cudaStream_t stream) {
  if constexpr (sizeof(Storage) != 2 || !Traits<Storage>::is_float) {
    return false;
  } else {
    const size_t shared_bytes = static_cast<size_t>(s.out_channels) * s.kernel_h * s.kernel_w * sizeof(Storage);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (s.group_in != 1 || s.group_out != 1 || s.out_channels % kDepthwiseVector != 0 ||
        shared_bytes > kDepthwiseMaxSharedBytes || !aligned(x) || !aligned(y)) {
      return false;
    }
    auto kernel = depthwise_nhwc_kernel<Storage, Index>;
    int device = 0, sm_count = 0;
    // Over the default 48 KB of shared memory the kernel opts in, always to the one largest
    // size it takes: threads launching convs of other sizes then set the same value.
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        (shared_bytes > (size_t{48} << 10) &&
         cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(kDepthwiseMaxSharedBytes)) != cudaSuccess)) {
      cudaGetLastError();  // not this conv's error: the generic kernel runs, needing none of this
      return false;
    }
    const int64_t vectors = batch * static_cast<int64_t>(s.out_h) * s.out_w * (s.out_channels / kDepthwiseVector);
    unsigned int blocks = blocks_for(vectors);
    if (blocks > static_cast<unsigned int>(sm_count) * 4) blocks = static_cast<unsigned int>(sm_count) * 4;
    byoc_pdl::launch_after_previous(kernel, blocks, kThreads, shared_bytes, stream, x, w, b, y, s,
                                    static_cast<Index>(vectors));
    return true;
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
                                  NhwcWeight<Storage, Acc, Index>{w, depth, s.group_out},
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

// ---------------------------------------------------------------- im2col + cuBLASLt

// Float convolutions with one group (and not a plain 1x1 GEMM) materialize the im2col
// matrix in the caller's workspace, a chunk at a time, and multiply it on the tensor
// cores with cuBLASLt:
//   NHWC  out rows [r0, r0 + rows) of (batch*OH*OW x O) = columns (rows x KH*KW*C)
//         * W^T (W is O x KH*KW*C, OHWI); a chunk is any range of output pixels.
//   NCHW  out[image] (O x OH*OW) = W (O x C*KH*KW, OIHW) * columns[image] (C*KH*KW x
//         OH*OW), strided-batched over the chunk's images (W broadcast: stride 0).
// A chunk's columns stay under kConvColumnsLimitBytes (NCHW: at least one whole image,
// whatever its size). The workspace is the columns (rounded up to 256 bytes) followed by
// kConvGemmWorkspaceBytes for cuBLASLt; conv2d falls back to the implicit GEMM when the
// caller gives less than the columns need.
constexpr size_t kConvColumnsLimitBytes = size_t{64} << 20;
constexpr size_t kConvGemmWorkspaceBytes = size_t{4} << 20;
constexpr size_t kWorkspaceAlignment = 256;

struct ConvWorkspacePlan {
  bool pointwise = false;  // 1x1 with unchanged spatial size: the direct cuBLASLt GEMM
  bool im2col = false;
  int64_t chunk = 0;  // NHWC: output pixels (rows) per chunk; NCHW: images per chunk
  size_t columns_bytes = 0;  // one chunk's im2col matrix
  size_t total_bytes = 0;    // what byoc_shim_conv2d_workspace reports
};

ConvWorkspacePlan plan_conv_workspace(byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels, int64_t in_h,
                                      int64_t in_w, int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                                      int64_t out_h, int64_t out_w, int64_t groups) {
  ConvWorkspacePlan plan;
  const bool is_float =
      dtype == BYOC_FLOAT32 || dtype == BYOC_FLOAT16 || dtype == BYOC_BFLOAT16 || dtype == BYOC_FLOAT64;
  if (!is_float || groups != 1 || (layout != kLayoutNCHW && layout != kLayoutNHWC)) return plan;
  if (batch <= 0 || in_channels <= 0 || out_channels <= 0 || out_h <= 0 || out_w <= 0 || kernel_h <= 0 ||
      kernel_w <= 0)
    return plan;
  if (kernel_h == 1 && kernel_w == 1 && out_h == in_h && out_w == in_w) {
    plan.pointwise = true;
    plan.total_bytes = kConvGemmWorkspaceBytes;
    return plan;
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const int64_t depth = in_channels * kernel_h * kernel_w;
  const int64_t pixels = out_h * out_w;
  const int64_t limit = static_cast<int64_t>(kConvColumnsLimitBytes);
  if (layout == kLayoutNHWC) {
    const int64_t rows = batch * pixels;
    int64_t chunk = limit / (depth * elem);
    if (chunk < 1) chunk = 1;
    if (chunk > rows) chunk = rows;
    plan.chunk = chunk;
    plan.columns_bytes = static_cast<size_t>(chunk * depth * elem);
  } else {
    const int64_t per_image = depth * pixels * elem;
    int64_t chunk = limit / per_image;
    if (chunk < 1) chunk = 1;
    if (chunk > batch) chunk = batch;
    plan.chunk = chunk;
    plan.columns_bytes = static_cast<size_t>(chunk * per_image);
  }
  plan.im2col = true;
  plan.total_bytes = (plan.columns_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment +
                     kConvGemmWorkspaceBytes;
  return plan;
}

// NHWC im2col of output pixels [row0, row0 + rows): columns[r][(kh*KW + kw)*C + c], moved
// as Vector words of `lanes` channels (a warp writes one contiguous stretch of a row and
// reads neighbouring channels of one input cell).
template <class Vector, class Index>
__global__ void im2col_nhwc_kernel(const Vector* __restrict__ in, Vector* __restrict__ columns,
                                   ConvGeometry<Index> s, Index channel_words, Index row0, Index total) {
  byoc_pdl::begin_after_previous();
  const Index depth_words = s.kernel_h * s.kernel_w * channel_words;
  const Index pixels = s.out_h * s.out_w;
  for (Index linear = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index word = linear % depth_words, row = row0 + linear / depth_words;
    const Index c = word % channel_words, cell = word / channel_words;
    const Index kh = cell / s.kernel_w, kw = cell % s.kernel_w;
    const Index image = row / pixels, pixel = row % pixels;
    const Index ih = (pixel / s.out_w) * s.stride_h - s.pad_top + kh * s.dilation_h;
    const Index iw = (pixel % s.out_w) * s.stride_w - s.pad_left + kw * s.dilation_w;
    Vector value{};
    if (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) value = in[((image * s.in_h + ih) * s.in_w + iw) * channel_words + c];
    columns[linear] = value;
  }
}

// NCHW im2col of images [image0, image0 + count): columns[image][(c*KH + kh)*KW + kw][pixel]
// (consecutive threads walk output pixels, so reads follow an input row).
template <class Element, class Index>
__global__ void im2col_nchw_kernel(const Element* __restrict__ in, Element* __restrict__ columns,
                                   ConvGeometry<Index> s, Index image0, Index total) {
  byoc_pdl::begin_after_previous();
  const Index pixels = s.out_h * s.out_w;
  const Index kernel_area = s.kernel_h * s.kernel_w;
  const Index depth = s.in_channels * kernel_area;
  for (Index linear = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; linear < total;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index pixel = linear % pixels, rest = linear / pixels;
    const Index p = rest % depth, image = image0 + rest / depth;
    const Index c = p / kernel_area, cell = p % kernel_area;
    const Index kh = cell / s.kernel_w, kw = cell % s.kernel_w;
    const Index ih = (pixel / s.out_w) * s.stride_h - s.pad_top + kh * s.dilation_h;
    const Index iw = (pixel % s.out_w) * s.stride_w - s.pad_left + kw * s.dilation_w;
    Element value{};
    if (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) value = in[((image * s.in_channels + c) * s.in_h + ih) * s.in_w + iw];
    columns[linear] = value;
  }
}

// Runs the im2col + cuBLASLt convolution (groups == 1, float dtypes). Sets *unsupported
// (recording nothing) when cuBLASLt has no algorithm for a chunk, so that the caller
// computes the whole output with the implicit GEMM instead.
template <class Index>
int im2col_conv(const char* function, const void* in, const void* weight, void* out, byoc_dtype dtype, bool nhwc,
                int64_t batch, const ConvGeometry<Index>& s, const ConvWorkspacePlan& plan, void* workspace,
                size_t workspace_bytes, cudaStream_t stream, bool* unsupported) {
  *unsupported = false;
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const int64_t depth = static_cast<int64_t>(s.in_channels) * s.kernel_h * s.kernel_w;
  const int64_t pixels = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t out_channels = s.out_channels;
  const size_t columns_space =
      (plan.columns_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  char* gemm_workspace = workspace_bytes > columns_space ? static_cast<char*>(workspace) + columns_space : nullptr;
  const size_t gemm_workspace_bytes = gemm_workspace ? workspace_bytes - columns_space : 0;
  char* output = static_cast<char*>(out);
  if (nhwc) {
    const int64_t rows_total = batch * pixels;
    // The widest word (<= 16 bytes) that divides a cell's channels and aligns both buffers.
    const int width = common_alignment(static_cast<size_t>(s.in_channels) * elem, in, workspace);
    const int lanes = width / static_cast<int>(elem) > 0 ? width / static_cast<int>(elem) : 1;
    const int word_bytes = width >= elem ? width : static_cast<int>(elem);
    const Index channel_words = static_cast<Index>(s.in_channels / lanes);
    for (int64_t row0 = 0; row0 < rows_total; row0 += plan.chunk) {
      const int64_t rows = rows_total - row0 < plan.chunk ? rows_total - row0 : plan.chunk;
      const int64_t words = rows * depth / lanes;
      const int code = visit_blob(word_bytes, [&](auto blob) {
        using Vector = decltype(blob);
        byoc_pdl::launch_after_previous(im2col_nhwc_kernel<Vector, Index>, blocks_for(words), kThreads, 0, stream,
            static_cast<const Vector*>(in), static_cast<Vector*>(workspace), s, channel_words, static_cast<Index>(row0),
            static_cast<Index>(words));
        return check_launch(function);
      });
      BYOC_CHECK(code);
      BYOC_CHECK(lt_matmul(function, workspace, weight, output + row0 * out_channels * elem, dtype, 1, rows,
                           out_channels, depth, false, true, 0, 0, 0, -1, gemm_workspace, gemm_workspace_bytes,
                           stream, unsupported));
      if (*unsupported) return 0;
    }
    return 0;
  }
  for (int64_t image0 = 0; image0 < batch; image0 += plan.chunk) {
    const int64_t images = batch - image0 < plan.chunk ? batch - image0 : plan.chunk;
    const int64_t total = images * depth * pixels;
    const int code = visit_blob(static_cast<int>(elem), [&](auto blob) {
      using Element = decltype(blob);
      byoc_pdl::launch_after_previous(im2col_nchw_kernel<Element, Index>, blocks_for(total), kThreads, 0, stream,
          static_cast<const Element*>(in), static_cast<Element*>(workspace), s, static_cast<Index>(image0),
          static_cast<Index>(total));
      return check_launch(function);
    });
    BYOC_CHECK(code);
    BYOC_CHECK(lt_matmul(function, weight, workspace, output + image0 * out_channels * pixels * elem, dtype, images,
                         out_channels, pixels, depth, false, false, 0, depth * pixels, out_channels * pixels, -1,
                         gemm_workspace, gemm_workspace_bytes, stream, unsupported));
    if (*unsupported) return 0;
  }
  return 0;
}

// ---------------------------------------------------------------- pooling

template <class Index>
struct PoolGeometry {
  Index channels, in_h, in_w, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w;
  Index pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w;
};

// One thread per output element (channels fastest in NHWC, so a warp reads neighbouring
// channels of a cell; columns fastest in NCHW). Padding never wins a max (-inf, or the
// integer minimum) and adds 0 to a sum. The average's divisor counts the window's cells
// in the image, or with count_include_pad those inside the explicitly padded image (a
// ceil_mode window's overhang never counts); at least 1.
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
    Index rows_inside = 0, rows_padded = 0, columns_inside = 0, columns_padded = 0;
    for (Index kw = 0; kw < s.kernel_w; ++kw) {
      const Index iw = column_start + kw * s.dilation_w;
      columns_inside += (iw >= 0 && iw < s.in_w);
      columns_padded += (iw >= -s.pad_left && iw < s.in_w + s.pad_right);
    }
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = row_start + kh * s.dilation_h;
      rows_padded += (ih >= -s.pad_top && ih < s.in_h + s.pad_bottom);
      if (ih < 0 || ih >= s.in_h) continue;
      ++rows_inside;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Index iw = column_start + kw * s.dilation_w;
        if (iw < 0 || iw >= s.in_w) continue;
        const Compute x = T::load(base[(ih * s.in_w + iw) * cell_stride]);
        value = kAverage ? value + x : nan_max(value, x);
      }
    }
    if (kAverage) {
      Index count = count_include_pad ? rows_padded * columns_padded : rows_inside * columns_inside;
      if (count < 1) count = 1;  // a window wholly in the padding averages to 0
      value = value / static_cast<Compute>(count);
    }
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
    Index rows_inside = 0, rows_padded = 0, columns_inside = 0, columns_padded = 0;
    for (Index kw = 0; kw < s.kernel_w; ++kw) {
      const Index iw = column_start + kw * s.dilation_w;
      columns_inside += (iw >= 0 && iw < s.in_w);
      columns_padded += (iw >= -s.pad_left && iw < s.in_w + s.pad_right);
    }
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = row_start + kh * s.dilation_h;
      rows_padded += (ih >= -s.pad_top && ih < s.in_h + s.pad_bottom);
      if (ih < 0 || ih >= s.in_h) continue;
      ++rows_inside;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Index iw = column_start + kw * s.dilation_w;
        if (iw < 0 || iw >= s.in_w) continue;
        const uint4 packed = base[(ih * s.in_w + iw) * vectors];
        const Storage* lanes = reinterpret_cast<const Storage*>(&packed);
        for (int lane = 0; lane < kLanes; ++lane) {
          const Compute x = T::load(lanes[lane]);
          value[lane] = kAverage ? value[lane] + x : nan_max(value[lane], x);
        }
      }
    }
    uint4 packed;
    Storage* lanes = reinterpret_cast<Storage*>(&packed);
    Index count = 1;
    if (kAverage) {
      count = count_include_pad ? rows_padded * columns_padded : rows_inside * columns_inside;
      if (count < 1) count = 1;
    }
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

extern "C" int byoc_shim_conv2d(const void* in, const void* weight, const void* bias, void* out, byoc_dtype dtype,
                                int layout, int64_t batch, int64_t in_channels, int64_t in_h, int64_t in_w,
                                int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t out_h,
                                int64_t out_w, int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                                int64_t dilation_h, int64_t dilation_w, int64_t groups, void* workspace,
                                size_t workspace_bytes, void* stream) {
  static const char kFunction[] = "byoc_shim_conv2d";
  BYOC_CHECK(check_conv2d(kFunction, in, weight, out, layout, batch, in_channels, in_h, in_w, out_channels, kernel_h,
                          kernel_w, out_h, out_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w,
                          groups));
  const bool empty = batch == 0 || out_channels == 0 || out_h == 0 || out_w == 0;
  cudaStream_t cuda_stream = as_stream(stream);
  const bool nhwc = layout == kLayoutNHWC;
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    const int64_t out_count = batch * out_channels * out_h * out_w;
    // 1x1, stride 1, no padding, one group: out = in * W^T (NHWC) or out[b] = W * in[b]
    // (NCHW), a plain GEMM for cuBLASLt.
    if constexpr (Traits<Storage>::is_float) {
      const bool pointwise = kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_top == 0 &&
                             pad_left == 0 && out_h == in_h && out_w == in_w && groups == 1 && in_channels > 0;
      if (pointwise) {
        bool unsupported = false;
        const int64_t pixels = in_h * in_w;
        if (nhwc) {
          BYOC_CHECK(lt_matmul(kFunction, in, weight, out, dtype, 1, batch * pixels, out_channels, in_channels,
                               false, true, 0, 0, 0, -1, workspace, workspace_bytes, cuda_stream, &unsupported));
        } else {
          BYOC_CHECK(lt_matmul(kFunction, weight, in, out, dtype, batch, out_channels, pixels, in_channels, false,
                               false, 0, in_channels * pixels, out_channels * pixels, -1, workspace,
                               workspace_bytes, cuda_stream, &unsupported));
        }
        if (!unsupported) {
          if (bias == nullptr) return 0;
          byoc_pdl::launch_after_previous(add_bias_kernel<Storage>, blocks_for(out_count), kThreads, 0, cuda_stream,
              static_cast<Storage*>(out), static_cast<const Storage*>(bias), out_channels, nhwc ? int64_t{1} : pixels,
              out_count);
          return check_launch(kFunction);
        }
      }
    }
    auto geometry_of = [&](auto index_tag) {
      using Index = decltype(index_tag);
      return ConvGeometry<Index>{
          static_cast<Index>(in_channels),           static_cast<Index>(in_h),
          static_cast<Index>(in_w),                  static_cast<Index>(out_channels),
          static_cast<Index>(kernel_h),              static_cast<Index>(kernel_w),
          static_cast<Index>(out_h),                 static_cast<Index>(out_w),
          static_cast<Index>(stride_h),              static_cast<Index>(stride_w),
          static_cast<Index>(pad_top),               static_cast<Index>(pad_left),
          static_cast<Index>(dilation_h),            static_cast<Index>(dilation_w),
          static_cast<Index>(in_channels / groups),  static_cast<Index>(out_channels / groups)};
    };
    const bool spatial_small = (in_h + pad_top + (kernel_h - 1) * dilation_h + out_h * stride_h) < kIndex32Limit &&
                               (in_w + pad_left + (kernel_w - 1) * dilation_w + out_w * stride_w) < kIndex32Limit;
    // Float, one group, workspace for the im2col chunk: tensor cores through cuBLASLt.
    if constexpr (Traits<Storage>::is_float) {
      const ConvWorkspacePlan plan = plan_conv_workspace(dtype, layout, batch, in_channels, in_h, in_w, out_channels,
                                                         kernel_h, kernel_w, out_h, out_w, groups);
      const size_t columns_space =
          (plan.columns_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
      if (plan.im2col && workspace != nullptr && workspace_bytes >= columns_space) {
        const int64_t columns_elements = static_cast<int64_t>(plan.columns_bytes / dtype_size(dtype));
        const bool small32 = spatial_small && columns_elements < kIndex32Limit &&
                             batch * in_channels * in_h * in_w < kIndex32Limit &&
                             batch * out_h * out_w < kIndex32Limit;
        bool unsupported = false;
        const int code =
            small32 ? im2col_conv(kFunction, in, weight, out, dtype, nhwc, batch, geometry_of(int32_t{}), plan,
                                  workspace, workspace_bytes, cuda_stream, &unsupported)
                    : im2col_conv(kFunction, in, weight, out, dtype, nhwc, batch, geometry_of(int64_t{}), plan,
                                  workspace, workspace_bytes, cuda_stream, &unsupported);
        BYOC_CHECK(code);
        if (!unsupported) {
          if (bias == nullptr) return 0;
          byoc_pdl::launch_after_previous(add_bias_kernel<Storage>, blocks_for(out_count), kThreads, 0, cuda_stream,
              static_cast<Storage*>(out), static_cast<const Storage*>(bias), out_channels,
              nhwc ? int64_t{1} : out_h * out_w, out_count);
          return check_launch(kFunction);
        }
      }
    }
    const bool small = out_count < kIndex32Limit && batch * in_channels * in_h * in_w < kIndex32Limit &&
                       out_channels * (in_channels / groups) * kernel_h * kernel_w < kIndex32Limit && spatial_small;
    auto run = [&](auto index_tag) {
      using Index = decltype(index_tag);
      return implicit_gemm_conv<Storage, Index>(kFunction, in, weight, bias, out, nhwc, batch, geometry_of(index_tag),
                                                groups, cuda_stream);
    };
    return small ? run(int32_t{}) : run(int64_t{});
  });
}

extern "C" int byoc_shim_pool2d(const void* in, void* out, byoc_dtype dtype, int kind, int layout, int64_t batch,
                                int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
                                int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                                int64_t pad_top, int64_t pad_left, int64_t pad_bottom, int64_t pad_right,
                                int64_t dilation_h, int64_t dilation_w, int count_include_pad, void* stream) {
  static const char kFunction[] = "byoc_shim_pool2d";
  BYOC_CHECK(check_pool2d(kFunction, in, out, kind, layout, batch, channels, in_h, in_w, out_h, out_w, kernel_h,
                          kernel_w, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h,
                          dilation_w));
  const bool empty = batch == 0 || channels == 0 || out_h == 0 || out_w == 0;
  const int64_t total = batch * channels * out_h * out_w;
  const bool small = total < kIndex32Limit && batch * channels * in_h * in_w < kIndex32Limit &&
                     out_h * stride_h + kernel_h * dilation_h + in_h + pad_bottom < kIndex32Limit &&
                     out_w * stride_w + kernel_w * dilation_w + in_w + pad_right < kIndex32Limit;
  cudaStream_t cuda_stream = as_stream(stream);
  auto run = [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    auto launch = [&](auto index_tag) {
      using Index = decltype(index_tag);
      const PoolGeometry<Index> geometry{
          static_cast<Index>(channels),   static_cast<Index>(in_h),       static_cast<Index>(in_w),
          static_cast<Index>(out_h),      static_cast<Index>(out_w),      static_cast<Index>(kernel_h),
          static_cast<Index>(kernel_w),   static_cast<Index>(stride_h),   static_cast<Index>(stride_w),
          static_cast<Index>(pad_top),    static_cast<Index>(pad_left),   static_cast<Index>(pad_bottom),
          static_cast<Index>(pad_right),  static_cast<Index>(dilation_h), static_cast<Index>(dilation_w)};
      const bool nhwc = layout == kLayoutNHWC;
      return kind == 1 ? launch_pool<Storage, Index, true>(kFunction, in, out, nhwc, geometry,
                                                           count_include_pad != 0, total, cuda_stream)
                       : launch_pool<Storage, Index, false>(kFunction, in, out, nhwc, geometry,
                                                            count_include_pad != 0, total, cuda_stream);
    };
    return small ? launch(int32_t{}) : launch(int64_t{});
  };
  // An integer average would need a rounding rule: only floats average.
  return kind == 1 ? dispatch<DtypeSet::kFloats>(kFunction, dtype, run)
                   : dispatch<DtypeSet::kNumbers>(kFunction, dtype, run);
}
