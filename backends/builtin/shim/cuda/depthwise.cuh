// Depthwise convolutions (one input and one output channel per group) in NHWC with 16-bit
// floats and channels a multiple of 8 (MobileNet's, EfficientNet's, ConvNeXt's), with the
// store left to an epilogue: the shim's conv2d stores sum + bias (conv.cu), and a generated
// builtin function stores whatever elementwise chain reads the conv (bias, activation,
// residual: templates/builtin/conv2d_epilogue.j2) without writing the conv's output first.
//
// A thread computes 8 neighbouring channels of one output pixel, reading them with one
// 16-byte load per tap (per-element loads where the input is not 16-byte aligned). Each
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

__device__ __forceinline__ float to_float(__half value) { return __half2float(value); }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

// Whether the kernel takes a conv of these channels and window (16-bit storage assumed).
inline bool takes(int64_t channels, int64_t kernel_h, int64_t kernel_w) {
  return channels > 0 && channels % kVector == 0 &&
         static_cast<size_t>(channels * kernel_h * kernel_w) * 2 <= kMaxSharedBytes;
}

// `epilogue(vector, sums)` stores output elements vector * 8 .. vector * 8 + 7 (NHWC
// linear indices: the channels of one pixel) from their float sums.
template <class Storage, class Index, bool kAlignedInput, class Epilogue>
__global__ void __launch_bounds__(kThreads) nhwc_kernel(const Storage* __restrict__ in,
                                                        const Storage* __restrict__ weight, Geometry<Index> s,
                                                        Index total_vectors, Epilogue epilogue) {
  extern __shared__ uint4 shared_words[];  // 16-byte aligned
  Storage* filters = reinterpret_cast<Storage*>(shared_words);
  byoc_pdl::begin_after_previous();
  const Index channels = s.channels, taps = s.kernel_h * s.kernel_w;
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
    float sum[kVector] = {};
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      if (ih < 0 || ih >= s.in_h) continue;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Index iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
        if (iw < 0 || iw >= s.in_w) continue;
        alignas(16) Storage x[kVector], w[kVector];
        const Storage* source = in + ((image * s.in_h + ih) * s.in_w + iw) * channels + channel;
        if constexpr (kAlignedInput) {
          *reinterpret_cast<uint4*>(x) = __ldg(reinterpret_cast<const uint4*>(source));
        } else {
#pragma unroll
          for (int j = 0; j < kVector; ++j) x[j] = source[j];
        }
        *reinterpret_cast<uint4*>(w) = *reinterpret_cast<const uint4*>(filters + (kh * s.kernel_w + kw) * channels + channel);
#pragma unroll
        for (int j = 0; j < kVector; ++j) sum[j] += to_float(x[j]) * to_float(w[j]);
      }
    }
    epilogue(linear, sum);
  }
}

// Launches the kernel for `batch` images (takes() must hold); returns the launch's error.
template <class Storage, class Index, class Epilogue>
cudaError_t launch_nhwc(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                        Epilogue epilogue, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  auto kernel = aligned ? nhwc_kernel<Storage, Index, true, Epilogue> : nhwc_kernel<Storage, Index, false, Epilogue>;
  const size_t shared_bytes = static_cast<size_t>(s.channels) * s.kernel_h * s.kernel_w * sizeof(Storage);
  int device = 0, sm_count = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  // Over the default 48 KB of shared memory the kernel opts in, always to the one largest
  // size it takes: threads launching convs of other sizes then set the same value.
  if (status == cudaSuccess && shared_bytes > (size_t{48} << 10)) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMaxSharedBytes));
  }
  if (status != cudaSuccess) return status;
  const int64_t vectors = batch * static_cast<int64_t>(s.out_h) * s.out_w * (s.channels / kVector);
  int64_t blocks = (vectors + kThreads - 1) / kThreads;
  if (blocks > int64_t{sm_count} * 4) blocks = int64_t{sm_count} * 4;
  if (blocks < 1) blocks = 1;
  byoc_pdl::launch_after_previous(kernel, static_cast<unsigned int>(blocks), kThreads, shared_bytes, stream, in,
                                  weight, s, static_cast<Index>(vectors), epilogue);
  return cudaGetLastError();
}

}  // namespace byoc_depthwise

#endif  // BYOC_SHIM_CUDA_DEPTHWISE_CUH_
