// conv2d's geometry (conv.cu) and its im2col + cuBLASLt path, for float convolutions with
// one group.
#ifndef BYOC_SHIM_CUDA_CONV_CUH_
#define BYOC_SHIM_CUDA_CONV_CUH_

#include "shim_cuda.cuh"

namespace byoc_shim_cuda {

// Every size and attribute of one conv2d call (names as in byoc_shim.h), in Index.
template <class Index>
struct ConvGeometry {
  Index in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h, out_w;
  Index stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  Index group_in, group_out;  // channels per group
};

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

inline ConvWorkspacePlan plan_conv_workspace(byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels, int64_t in_h,
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


}  // namespace byoc_shim_cuda

#endif  // BYOC_SHIM_CUDA_CONV_CUH_
