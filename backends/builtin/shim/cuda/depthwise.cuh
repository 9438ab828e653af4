// Depthwise convolutions (one input and one output channel per group) in NHWC with 16-bit
// floats and channels a multiple of 8 (MobileNet's, EfficientNet's, ConvNeXt's), with the
// store left to an epilogue: the shim's conv2d stores sum + bias (conv.cu), and a generated
// builtin function stores whatever elementwise chain reads the conv (bias, activation,
// residual: templates/builtin/conv2d_epilogue.j2) without writing the conv's output first.
//
// A thread computes 8 neighbouring channels of one output pixel, reading them with one
// 16-byte load per tap (per-element loads where the input is not 16-byte aligned) and
// accumulating in float. Each
// block first copies the filters into shared memory tap-major ([kh][kw][channel]; OHWI is
// [channel][kh][kw]), so that a thread's 8 filters of one tap are one 16-byte read too, and
// then loops over the output: a grid of a few blocks per SM copies them few times.
#ifndef BYOC_SHIM_CUDA_DEPTHWISE_CUH_
#define BYOC_SHIM_CUDA_DEPTHWISE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "pdl.cuh"

namespace byoc_depthwise {

constexpr int kVector = 8;    // channels per thread: one 16-byte vector of 16-bit floats
constexpr int kThreads = 256;
constexpr size_t kMaxSharedBytes = size_t{96} << 10;  // the filters, all taps of all channels

template <class Index>
struct Geometry {
  Index in_h, in_w, channels, kernel_h, kernel_w, out_h, out_w;
  Index stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
};

__device__ __forceinline__ float2 to_float2(__half2 pair) { return __half22float2(pair); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 pair) { return __bfloat1622float2(pair); }
template <class Storage>
using Pair = std::conditional_t<std::is_same_v<Storage, __half>, __half2, __nv_bfloat162>;

// Whether the kernel takes a conv of these channels and window (16-bit storage assumed).
inline bool takes(int64_t channels, int64_t kernel_h, int64_t kernel_w) {
  return channels > 0 && channels % kVector == 0 &&
         static_cast<size_t>(channels * kernel_h * kernel_w) * 2 <= kMaxSharedBytes;
}

// `epilogue(vector, sums)` stores output elements vector * 8 .. vector * 8 + 7 (NHWC
// linear indices: the channels of one pixel) from their float sums. kKernelH and kKernelW
// are the window when it is one of the common ones (3x3, 5x5: the tap loops unroll and
// every tap's load is issued before the first is used), else 0 (the window from `s`).
template <class Storage, class Index, bool kAlignedInput, int kKernelH, int kKernelW, class Epilogue>
__global__ void __launch_bounds__(kThreads) nhwc_kernel(const Storage* __restrict__ in,
                                                        const Storage* __restrict__ weight, Geometry<Index> s,
                                                        Index total_vectors, Epilogue epilogue) {
  extern __shared__ uint4 shared_words[];  // 16-byte aligned
  Storage* filters = reinterpret_cast<Storage*>(shared_words);
  byoc_pdl::begin_after_previous();
  const Index kernel_h = kKernelH > 0 ? Index{kKernelH} : s.kernel_h;
  const Index kernel_w = kKernelW > 0 ? Index{kKernelW} : s.kernel_w;
  const Index channels = s.channels, taps = kernel_h * kernel_w;
  for (Index i = threadIdx.x; i < channels * taps; i += blockDim.x) {  // coalesced reads of OHWI
    filters[(i % taps) * channels + i / taps] = weight[i];
  }
  __syncthreads();
  const Index vectors = channels / kVector;
  for (Index linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total_vectors;
       linear += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = linear;
    const Index channel = (rest % vectors) * kVector;
    rest /= vectors;
    const Index ow = rest % s.out_w;
    rest /= s.out_w;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    const Storage* image_in = in + image * s.in_h * s.in_w * channels + channel;
    float sum[kVector] = {};
#pragma unroll
    for (Index kh = 0; kh < kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      const bool row_inside = ih >= 0 && ih < s.in_h;
#pragma unroll
      for (Index kw = 0; kw < kernel_w; ++kw) {
        const Index iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
        // Outside the image the tap reads zeros: a select, not a branch, so that the
        // unrolled taps' loads can all be in flight at once.
        uint4 x_words = make_uint4(0, 0, 0, 0);
        if (row_inside && iw >= 0 && iw < s.in_w) {
          const Storage* source = image_in + (ih * s.in_w + iw) * channels;
          if constexpr (kAlignedInput) {
            x_words = __ldg(reinterpret_cast<const uint4*>(source));
          } else {
            alignas(16) Storage x[kVector];
#pragma unroll
            for (int j = 0; j < kVector; ++j) x[j] = source[j];
            x_words = *reinterpret_cast<const uint4*>(x);
          }
        }
        const uint4 w_words = *reinterpret_cast<const uint4*>(filters + (kh * kernel_w + kw) * channels + channel);
        const Pair<Storage>* x = reinterpret_cast<const Pair<Storage>*>(&x_words);
        const Pair<Storage>* w = reinterpret_cast<const Pair<Storage>*>(&w_words);
#pragma unroll
        for (int j = 0; j < kVector / 2; ++j) {
          const float2 xf = to_float2(x[j]), wf = to_float2(w[j]);
          sum[2 * j] = fmaf(xf.x, wf.x, sum[2 * j]);
          sum[2 * j + 1] = fmaf(xf.y, wf.y, sum[2 * j + 1]);
        }
      }
    }
    epilogue(linear, sum);
  }
}

template <class Storage, class Index, int kKernelH, int kKernelW, class Epilogue>
cudaError_t launch_window(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                          Epilogue epilogue, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  auto kernel = aligned ? nhwc_kernel<Storage, Index, true, kKernelH, kKernelW, Epilogue>
                        : nhwc_kernel<Storage, Index, false, kKernelH, kKernelW, Epilogue>;
  const size_t shared_bytes = static_cast<size_t>(s.channels) * s.kernel_h * s.kernel_w * sizeof(Storage);
  int device = 0, sm_count = 0, blocks_per_sm = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  // Over the default 48 KB of shared memory the kernel opts in, always to the one largest
  // size it takes: threads launching convs of other sizes then set the same value.
  if (status == cudaSuccess && shared_bytes > (size_t{48} << 10)) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMaxSharedBytes));
  }
  // As many blocks as fit on the GPU at once (each copies the filters once, then loops).
  if (status == cudaSuccess) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, shared_bytes);
  }
  if (status != cudaSuccess) return status;
  const int64_t vectors = batch * static_cast<int64_t>(s.out_h) * s.out_w * (s.channels / kVector);
  int64_t blocks = (vectors + kThreads - 1) / kThreads;
  const int64_t resident = int64_t{sm_count} * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  if (blocks > resident) blocks = resident;
  if (blocks < 1) blocks = 1;
  byoc_pdl::launch_after_previous(kernel, static_cast<unsigned int>(blocks), kThreads, shared_bytes, stream, in,
                                  weight, s, static_cast<Index>(vectors), epilogue);
  return cudaGetLastError();
}

// Launches the kernel for `batch` images (takes() must hold); returns the launch's error.
template <class Storage, class Index, class Epilogue>
cudaError_t launch_nhwc(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                        Epilogue epilogue, cudaStream_t stream) {
  if (s.kernel_h == 3 && s.kernel_w == 3) return launch_window<Storage, Index, 3, 3>(in, weight, batch, s, epilogue, stream);
  if (s.kernel_h == 5 && s.kernel_w == 5) return launch_window<Storage, Index, 5, 5>(in, weight, batch, s, epilogue, stream);
  return launch_window<Storage, Index, 0, 0>(in, weight, batch, s, epilogue, stream);
}

}  // namespace byoc_depthwise

#endif  // BYOC_SHIM_CUDA_DEPTHWISE_CUH_
