// Depthwise convolutions (one input and one output channel per group) in NHWC with 16-bit
// floats and channels a multiple of 8 (MobileNet's, EfficientNet's, ConvNeXt's), with the
// store left to an epilogue: the shim's conv2d stores sum + bias (conv.cu), and a generated
// builtin function stores whatever elementwise chain reads the conv (bias, activation,
// residual: templates/builtin/conv2d_epilogue.j2) without writing the conv's output first.
//
// Two kernels, chosen by the output's size (launch_nhwc). In both a thread computes 8
// neighbouring channels of one output pixel or of a row of two or four, with 16-byte reads
// of 8 channels and sums in float, and filters sit in shared memory tap-major ([kh][kw]
// [channel]; OHWI is [channel][kh][kw]), so that a thread's 8 filters of one tap are one
// 16-byte read too.
// - nhwc_kernel (large outputs; any window, stride and dilation; unaligned input): a grid of
//   a few blocks per SM, each copying all filters once and then looping over the output,
//   reading the input from global memory (L1 serves the repeats).
// - tiled_kernel (small outputs of the common windows): a block per output tile, which first
//   copies the tile's input window into shared memory.
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
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class Storage>
using Pair = std::conditional_t<std::is_same_v<Storage, __half>, __half2, __nv_bfloat162>;

// The 8 16-bit floats of one 16-byte word as floats.
template <class Storage>
__device__ __forceinline__ void unpack(const uint4& words, float (&x)[kVector]) {
  const Pair<Storage>* pairs = reinterpret_cast<const Pair<Storage>*>(&words);
#pragma unroll
  for (int j = 0; j < kVector / 2; ++j) {
    const float2 f = to_float2(pairs[j]);
    x[2 * j] = f.x;
    x[2 * j + 1] = f.y;
  }
}

// One window row of kPixels horizontally neighbouring output pixels: input columns c <
// (kPixels - 1) * kStride + kKernel (load_column(c, x)) serve every pixel, pixel p reading
// column c with filter column c - p * kStride; each column is loaded and converted once.
template <int kKernel, int kStride, int kPixels, class LoadColumn>
__device__ __forceinline__ void accumulate_row(const float (&w)[kKernel][kVector], LoadColumn load_column,
                                               float (&sum)[kPixels][kVector]) {
  constexpr int kColumns = (kPixels - 1) * kStride + kKernel;
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    float x[kVector];
    load_column(c, x);
#pragma unroll
    for (int p = 0; p < kPixels; ++p) {
      const int kw = c - p * kStride;
      if (kw >= 0 && kw < kKernel) {
#pragma unroll
        for (int j = 0; j < kVector; ++j) sum[p][j] = fmaf(x[j], w[kw][j], sum[p][j]);
      }
    }
  }
}

// Stores the sums of kPixels output pixels from vector `first` on (one pixel's channel
// vectors apart), those past the row's end left out.
template <int kPixels, class Index, class Epilogue>
__device__ __forceinline__ void store_pixels(const Epilogue& epilogue, Index first, Index vectors, Index ow0,
                                             Index out_w, const float (&sum)[kPixels][kVector]) {
#pragma unroll
  for (int p = 0; p < kPixels; ++p) {
    if (p == 0 || ow0 + p < out_w) epilogue(first + p * vectors, sum[p]);
  }
}

// Whether the kernel takes a conv of these channels and window (16-bit storage assumed).
inline bool takes(int64_t channels, int64_t kernel_h, int64_t kernel_w) {
  return channels > 0 && channels % kVector == 0 &&
         static_cast<size_t>(channels * kernel_h * kernel_w) * 2 <= kMaxSharedBytes;
}

// `epilogue(vector, sums)` stores output elements vector * 8 .. vector * 8 + 7 (NHWC
// linear indices: the channels of one pixel) from their float sums.
//
// kKernelH, kKernelW and kStride are the window and stride of the common convs (3x3 and 5x5,
// stride 1 or 2; 7x7 stride 1; no dilation), else 0 (all of them from `s`). For the common
// ones a thread computes pixels_per_thread horizontally neighbouring output pixels: each
// input column of a window row is loaded and converted once for all of them, each filter
// once per row, and the unrolled taps' loads are all issued before the first is used
// (branch-free: outside the image a tap reads zeros). An item is one channel vector of one
// pixel (generic) or of a row of pixels.
//
// Four pixels for 7-wide windows: a window row then loads 10 input columns for 28 taps
// (7 per tap with one pixel), which is what kept ConvNeXt's 7x7 convs at 2.6x cuDNN's time
// (H200, b32); two for the narrower ones, whose filters and sums fit registers either way.
__host__ __device__ constexpr int pixels_per_thread(int kernel_w) { return kernel_w >= 7 ? 4 : kernel_w > 0 ? 2 : 1; }

template <class Storage, class Index, bool kAlignedInput, int kKernelH, int kKernelW, int kStride, class Epilogue>
__global__ void __launch_bounds__(kThreads) nhwc_kernel(const Storage* __restrict__ in,
                                                        const Storage* __restrict__ weight, Geometry<Index> s,
                                                        Index total_items, Epilogue epilogue) {
  constexpr bool kFixed = kKernelH > 0;
  constexpr int kPixels = pixels_per_thread(kKernelW);
  extern __shared__ uint4 shared_words[];  // 16-byte aligned
  Storage* filters = reinterpret_cast<Storage*>(shared_words);
  byoc_pdl::begin_after_previous();
  const Index kernel_h = kFixed ? Index{kKernelH} : s.kernel_h;
  const Index kernel_w = kFixed ? Index{kKernelW} : s.kernel_w;
  const Index channels = s.channels, taps = kernel_h * kernel_w;
  for (Index i = threadIdx.x; i < channels * taps; i += blockDim.x) {  // coalesced reads of OHWI
    filters[(i % taps) * channels + i / taps] = weight[i];
  }
  __syncthreads();
  const Index vectors = channels / kVector;
  const Index groups_w = (s.out_w + kPixels - 1) / kPixels;
  for (Index item = blockIdx.x * blockDim.x + threadIdx.x; item < total_items;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = item;
    const Index vector_in_pixel = rest % vectors;
    const Index channel = vector_in_pixel * kVector;
    rest /= vectors;
    const Index ow0 = (rest % groups_w) * kPixels;
    rest /= groups_w;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    const Storage* image_in = in + image * s.in_h * s.in_w * channels + channel;
    float sum[kPixels][kVector] = {};
    // The 8 channels of input pixel (ih, iw) as floats; zeros outside the image.
    const auto load_pixel = [&](Index ih, Index iw, bool row_inside, float (&x)[kVector]) {
      uint4 words = make_uint4(0, 0, 0, 0);
      if (row_inside && iw >= 0 && iw < s.in_w) {
        const Storage* source = image_in + (ih * s.in_w + iw) * channels;
        if constexpr (kAlignedInput) {
          words = __ldg(reinterpret_cast<const uint4*>(source));
        } else {
          alignas(16) Storage lanes[kVector];
#pragma unroll
          for (int j = 0; j < kVector; ++j) lanes[j] = source[j];
          words = *reinterpret_cast<const uint4*>(lanes);
        }
      }
      unpack<Storage>(words, x);
    };
    const auto load_filter = [&](Index kh, Index kw, float (&w)[kVector]) {
      unpack<Storage>(*reinterpret_cast<const uint4*>(filters + (kh * kernel_w + kw) * channels + channel), w);
    };
#pragma unroll
    for (Index kh = 0; kh < kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      const bool row_inside = ih >= 0 && ih < s.in_h;
      if constexpr (kFixed) {
        float w[kKernelW][kVector];
#pragma unroll
        for (int kw = 0; kw < kKernelW; ++kw) load_filter(kh, kw, w[kw]);
        accumulate_row<kKernelW, kStride, kPixels>(
            w, [&](int c, float (&x)[kVector]) { load_pixel(ih, ow0 * kStride - s.pad_left + c, row_inside, x); },
            sum);
      } else {
        for (Index kw = 0; kw < kernel_w; ++kw) {
          float x[kVector], w[kVector];
          load_pixel(ih, ow0 * s.stride_w - s.pad_left + kw * s.dilation_w, row_inside, x);
          load_filter(kh, kw, w);
#pragma unroll
          for (int j = 0; j < kVector; ++j) sum[0][j] = fmaf(x[j], w[j], sum[0][j]);
        }
      }
    }
    store_pixels<kPixels>(epilogue, ((image * s.out_h + oh) * s.out_w + ow0) * vectors + vector_in_pixel, vectors,
                          ow0, s.out_w, sum);
  }
}

// How many blocks of `threads` threads and `shared_bytes` of dynamic shared memory the
// current GPU holds at once for `kernel` (at least one an SM).
template <class Kernel>
cudaError_t resident_blocks(Kernel kernel, int threads, size_t shared_bytes, int64_t* resident) {
  int device = 0, sm_count = 0, blocks_per_sm = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, shared_bytes);
  }
  *resident = int64_t{sm_count} * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  return status;
}

// Launches a grid-stride kernel over `items` with as many blocks of kThreads as the GPU
// holds at once (each copies its filters to shared memory once, then loops), at most one
// per kThreads items.
template <class Kernel, class... Args>
cudaError_t launch_resident(Kernel kernel, int64_t items, size_t shared_bytes, cudaStream_t stream, Args... args) {
  int64_t resident = 0;
  const cudaError_t status = resident_blocks(kernel, kThreads, shared_bytes, &resident);
  if (status != cudaSuccess) return status;
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > resident) blocks = resident;
  if (blocks < 1) blocks = 1;
  byoc_pdl::launch_after_previous(kernel, static_cast<unsigned int>(blocks), kThreads, shared_bytes, stream, args...);
  return cudaGetLastError();
}

template <class Storage, class Index, int kKernelH, int kKernelW, int kStride, class Epilogue>
cudaError_t launch_window(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                          Epilogue epilogue, cudaStream_t stream) {
  constexpr int kPixels = pixels_per_thread(kKernelW);
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  auto kernel = aligned ? nhwc_kernel<Storage, Index, true, kKernelH, kKernelW, kStride, Epilogue>
                        : nhwc_kernel<Storage, Index, false, kKernelH, kKernelW, kStride, Epilogue>;
  const size_t shared_bytes = static_cast<size_t>(s.channels) * s.kernel_h * s.kernel_w * sizeof(Storage);
  // Over the default 48 KB of shared memory the kernel opts in, always to the one largest
  // size it takes: threads launching convs of other sizes then set the same value.
  if (shared_bytes > (size_t{48} << 10)) {
    const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(kMaxSharedBytes));
    if (status != cudaSuccess) return status;
  }
  const int64_t items = batch * static_cast<int64_t>(s.out_h) * ((s.out_w + kPixels - 1) / kPixels) *
                        (s.channels / kVector);
  return launch_resident(kernel, items, shared_bytes, stream, in, weight, s, static_cast<Index>(items), epilogue);
}

// ---------------------------------------------------------------- tiled in shared memory
//
// The kernel above reads every input vector from global memory once per output pixel
// group and window row that uses it (6 to 15 times for 3x3 and 5x5 windows) and counts on
// L1 to serve the repeats; at the sizes of MobileNet's and EfficientNet's convs that left it
// several times slower than the input's bandwidth allows. tiled_kernel gives a block one
// tile of output (tile_h rows x tile_w columns x some channel vectors): the block copies the
// tile's input window, halo included, and its filters into shared memory with coalesced
// 16-byte loads, all in flight at once, and each thread then computes kPixels neighbouring
// output pixels of one channel vector from shared memory. A block computes one tile: the
// host picks the tile's shape for the conv (choose_tile) so that small outputs (7x7 late in
// a network) do not leave most of a block idle.
struct Tile {
  int rows;           // output rows of a tile
  int groups;         // groups of kPixels output columns of a tile (tile width groups * kPixels)
  int vectors;        // channel vectors (8 channels each) of a tile
  int64_t tiles_h, tiles_w, tiles_c;
  __host__ __device__ int threads() const { return rows * groups * vectors; }
};

template <int kKernel, int kStride, int kPixels>
struct TiledWindow {
  static constexpr int kColumns = (kPixels - 1) * kStride + kKernel;  // input columns of one thread's pixels
  __host__ __device__ static int input_rows(const Tile& t) { return (t.rows - 1) * kStride + kKernel; }
  __host__ __device__ static int input_columns(const Tile& t) { return (t.groups * kPixels - 1) * kStride + kKernel; }
  static size_t shared_bytes(const Tile& t) {
    return static_cast<size_t>(input_rows(t)) * input_columns(t) * t.vectors * 16 +
           static_cast<size_t>(kKernel) * kKernel * t.vectors * 16;
  }
};

// The tile shape for an output of out_h x out_w pixels and `vectors` channel vectors: of
// the shapes of at most kThreads threads whose every extent is a power of two, the one with
// the least estimated work, counting each launched thread's shared-memory reads (idle
// threads of partial tiles included) and each block's global reads of its input window
// (the halo is read by two tiles). At least 4 vectors (64-byte runs of a pixel's
// channels) where the conv has them, so that the global reads coalesce.
template <int kKernel, int kStride, int kPixels>
Tile choose_tile(int64_t batch, int64_t out_h, int64_t out_w, int64_t vectors) {
  using W = TiledWindow<kKernel, kStride, kPixels>;
  const int64_t groups_total = (out_w + kPixels - 1) / kPixels;
  const int64_t min_vectors = vectors < 4 ? vectors : 4;
  Tile best{1, 1, 1, 0, 0, 0};
  double best_cost = -1;
  for (int v = 1; v <= 64; v *= 2) {
    if (v < min_vectors || (v > 1 && v / 2 >= vectors)) continue;
    for (int g = 1; g <= 64; g *= 2) {
      if (g > 1 && g / 2 >= groups_total) continue;
      for (int r = 1; r * g * v <= kThreads; r *= 2) {
        if (r > 1 && r / 2 >= out_h) continue;
        Tile t{r, g, v, (out_h + r - 1) / r, (groups_total + g - 1) / g, (vectors + v - 1) / v};
        const double tiles = static_cast<double>(batch) * t.tiles_h * t.tiles_w * t.tiles_c;
        const double shared_reads = tiles * t.threads() * (kKernel * W::kColumns + kKernel * kKernel);
        const double global_reads = tiles * W::input_rows(t) * W::input_columns(t) * t.vectors;
        // a block also costs its launch and its one __syncthreads (about one window's reads)
        const double cost = shared_reads / 4 + global_reads * 2 + tiles * 256;
        if (W::shared_bytes(t) > (size_t{48} << 10)) continue;
        if (best_cost < 0 || cost < best_cost) best_cost = cost, best = t;
      }
    }
  }
  return best;
}

template <class Storage, class Index, int kKernel, int kStride, int kPixels, class Epilogue>
__global__ void __launch_bounds__(kThreads) tiled_kernel(const Storage* __restrict__ in,
                                                         const Storage* __restrict__ weight, Geometry<Index> s,
                                                         Tile t, Epilogue epilogue) {
  using W = TiledWindow<kKernel, kStride, kPixels>;
  extern __shared__ uint4 shared_words[];
  const int in_rows = W::input_rows(t), in_cols = W::input_columns(t);
  uint4* window = shared_words;                                  // [in_rows][in_cols][t.vectors]
  uint4* filters = shared_words + in_rows * in_cols * t.vectors;  // [kKernel * kKernel][t.vectors]
  int64_t block = blockIdx.x;
  const Index tile_c = static_cast<Index>(block % t.tiles_c);
  block /= t.tiles_c;
  const Index tile_w = static_cast<Index>(block % t.tiles_w);
  block /= t.tiles_w;
  const Index tile_h = static_cast<Index>(block % t.tiles_h);
  const Index image = static_cast<Index>(block / t.tiles_h);
  const Index vectors = s.channels / kVector;
  const Index first_vector = tile_c * t.vectors;
  const Index first_row = tile_h * t.rows * kStride - s.pad_top;
  const Index first_col = tile_w * t.groups * kPixels * kStride - s.pad_left;
  byoc_pdl::begin_after_previous();
  // Filters tap-major: 8 channels of one tap are one 16-byte shared read. OHWI weight is
  // [channel][tap]; a thread gathers one channel vector of one tap.
  constexpr int kTaps = kKernel * kKernel;
  for (int i = threadIdx.x; i < kTaps * t.vectors; i += blockDim.x) {
    const int v = i % t.vectors, tap = i / t.vectors;
    alignas(16) Storage lanes[kVector];
    const Index vector = first_vector + v;
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      lanes[j] = vector < vectors ? weight[(vector * kVector + j) * kTaps + tap] : Storage(0.0f);
    }
    filters[i] = *reinterpret_cast<const uint4*>(lanes);
  }
  // The window: every 16-byte copy of a thread in flight at once (cp.async from sm_80 on:
  // a plain load followed by its store to shared memory would wait out each load in turn).
  // Outside the image or the channels the copy reads nothing and fills zeros.
  const Storage* image_in = in + static_cast<int64_t>(image) * s.in_h * s.in_w * s.channels;
  for (int i = threadIdx.x; i < in_rows * in_cols * t.vectors; i += blockDim.x) {
    const int v = i % t.vectors, pixel = i / t.vectors;
    const Index ih = first_row + pixel / in_cols, iw = first_col + pixel % in_cols;
    const Index vector = first_vector + v;
    const bool inside = ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w && vector < vectors;
    const Storage* source = inside ? image_in + (ih * s.in_w + iw) * s.channels + vector * kVector : in;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned destination = static_cast<unsigned>(__cvta_generic_to_shared(window + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
                 "r"(inside ? 16 : 0));
#else
    window[i] = inside ? __ldg(reinterpret_cast<const uint4*>(source)) : make_uint4(0, 0, 0, 0);
#endif
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
  __syncthreads();
  const int v = threadIdx.x % t.vectors;
  const int group = threadIdx.x / t.vectors % t.groups;
  const int row = threadIdx.x / (t.vectors * t.groups);
  const Index oh = tile_h * t.rows + row;
  const Index ow0 = (tile_w * t.groups + group) * kPixels;
  if (row >= t.rows || oh >= s.out_h || ow0 >= s.out_w || first_vector + v >= vectors) return;
  float sum[kPixels][kVector] = {};
#pragma unroll
  for (int kh = 0; kh < kKernel; ++kh) {
    float w[kKernel][kVector];
#pragma unroll
    for (int kw = 0; kw < kKernel; ++kw) unpack<Storage>(filters[(kh * kKernel + kw) * t.vectors + v], w[kw]);
    const uint4* source = window + ((row * kStride + kh) * in_cols + group * kPixels * kStride) * t.vectors + v;
    accumulate_row<kKernel, kStride, kPixels>(
        w, [&](int c, float (&x)[kVector]) { unpack<Storage>(source[c * t.vectors], x); }, sum);
  }
  store_pixels<kPixels>(epilogue, ((image * s.out_h + oh) * s.out_w + ow0) * vectors + first_vector + v, vectors,
                        ow0, s.out_w, sum);
}

template <class Storage, class Index, int kKernel, int kStride, int kPixels, class Epilogue>
cudaError_t launch_tiled(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                         Epilogue epilogue, cudaStream_t stream) {
  const Tile t = choose_tile<kKernel, kStride, kPixels>(batch, s.out_h, s.out_w, s.channels / kVector);
  const int64_t blocks = batch * t.tiles_h * t.tiles_w * t.tiles_c;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const size_t shared_bytes = TiledWindow<kKernel, kStride, kPixels>::shared_bytes(t);
  byoc_pdl::launch_after_previous(tiled_kernel<Storage, Index, kKernel, kStride, kPixels, Epilogue>,
                                  static_cast<unsigned int>(blocks), static_cast<unsigned int>(t.threads()),
                                  shared_bytes, stream, in, weight, s, t, epilogue);
  return cudaGetLastError();
}

// ---------------------------------------------------------------- few input channels
//
// A dense conv (groups 1) of 1 to 4 input channels (an RGB image, or one padded to 4 by
// PadConvChannels) into `s.channels` output channels (a multiple of 8): the stem of
// MobileNet and EfficientNet. An implicit GEMM of such a conv has a reduction of R*S*4 (36
// for a 3x3 window) and an 8-byte pixel per tap; CUTLASS's fixed-channel conv spent 75-130
// us on these stems at batch 32 on an H200 where the arithmetic (R*S*C*K multiply-adds a
// pixel) takes a few microseconds on the CUDA cores. Here a thread computes 8 output
// channels of kFewPixels neighbouring output pixels of a row: per tap one read of each
// pixel's channels (8 bytes for 4 channels) and, per input channel, two 16-byte reads of
// filters from shared memory (held in float, [tap][in channel][out channel]) that serve
// every pixel, so that the filter reads, not the multiply-adds, are what it saves on.
constexpr int kFewChannels = 4;  // at most
constexpr int kFewPixels = 2;
constexpr size_t kFewChannelsMaxSharedBytes = size_t{48} << 10;

inline bool takes_few_channels(int64_t in_channels, int64_t out_channels, int64_t kernel_h, int64_t kernel_w) {
  return in_channels >= 1 && in_channels <= kFewChannels && out_channels > 0 && out_channels % kVector == 0 &&
         static_cast<size_t>(kernel_h * kernel_w * in_channels * out_channels) * sizeof(float) <=
             kFewChannelsMaxSharedBytes;
}

// The kChannels values of one input pixel as floats (one 8-byte read for 4 channels).
template <int kChannels, class Storage>
__device__ __forceinline__ void load_pixel(const Storage* pixel, float (&x)[kChannels]) {
  if constexpr (kChannels == 4) {
    const uint2 words = __ldg(reinterpret_cast<const uint2*>(pixel));
    const Pair<Storage>* pairs = reinterpret_cast<const Pair<Storage>*>(&words);
    const float2 low = to_float2(pairs[0]), high = to_float2(pairs[1]);
    x[0] = low.x, x[1] = low.y, x[2] = high.x, x[3] = high.y;
  } else {
#pragma unroll
    for (int c = 0; c < kChannels; ++c) x[c] = to_float(pixel[c]);
  }
}

template <int kChannels, class Storage, class Index, class Epilogue>
__global__ void __launch_bounds__(kThreads) few_channels_kernel(const Storage* __restrict__ in,
                                                                const Storage* __restrict__ weight,
                                                                Geometry<Index> s, Index total_items,
                                                                Epilogue epilogue) {
  extern __shared__ float4 shared_filters[];
  float* filters = reinterpret_cast<float*>(shared_filters);  // [tap][in channel][out channel]
  byoc_pdl::begin_after_previous();
  const Index out_channels = s.channels, taps = s.kernel_h * s.kernel_w;
  const Index filter_count = out_channels * taps * kChannels;
  for (Index i = threadIdx.x; i < filter_count; i += blockDim.x) {  // coalesced reads of OHWI
    const Index k = i / (taps * kChannels), tap_channel = i % (taps * kChannels);
    filters[tap_channel * out_channels + k] = to_float(weight[i]);
  }
  __syncthreads();
  const Index vectors = out_channels / kVector;
  const Index row_groups = (s.out_w + kFewPixels - 1) / kFewPixels;
  for (Index item = blockIdx.x * blockDim.x + threadIdx.x; item < total_items;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index vector = item % vectors;
    Index rest = item / vectors;
    const Index ow0 = rest % row_groups * kFewPixels;
    rest /= row_groups;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    const Storage* image_in = in + image * s.in_h * s.in_w * kChannels;
    float sum[kFewPixels][kVector] = {};
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      if (ih < 0 || ih >= s.in_h) continue;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        float x[kFewPixels][kChannels];
#pragma unroll
        for (int p = 0; p < kFewPixels; ++p) {  // outside the image (or past the row's end): zeros
          const Index iw = (ow0 + p) * s.stride_w - s.pad_left + kw * s.dilation_w;
          if (iw >= 0 && iw < s.in_w && ow0 + p < s.out_w) {
            load_pixel<kChannels>(image_in + (ih * s.in_w + iw) * kChannels, x[p]);
          } else {
#pragma unroll
            for (int c = 0; c < kChannels; ++c) x[p][c] = 0.0f;
          }
        }
        const float* tap_filters = filters + (kh * s.kernel_w + kw) * kChannels * out_channels + vector * kVector;
#pragma unroll
        for (int c = 0; c < kChannels; ++c) {
          const float4 w0 = *reinterpret_cast<const float4*>(tap_filters + c * out_channels);
          const float4 w1 = *reinterpret_cast<const float4*>(tap_filters + c * out_channels + 4);
          const float w[kVector] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
          for (int p = 0; p < kFewPixels; ++p) {
#pragma unroll
            for (int j = 0; j < kVector; ++j) sum[p][j] = fmaf(x[p][c], w[j], sum[p][j]);
          }
        }
      }
    }
    const Index first = ((image * s.out_h + oh) * s.out_w + ow0) * vectors + vector;
    store_pixels<kFewPixels>(epilogue, first, vectors, ow0, s.out_w, sum);
  }
}

// Launches few_channels_kernel for `batch` images of kChannels channels
// (takes_few_channels() must hold; `s.channels` is the output's channels); for 4 channels
// the input must be 8-byte aligned.
template <int kChannels, class Storage, class Index, class Epilogue>
cudaError_t launch_few_channels(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                                Epilogue epilogue, cudaStream_t stream) {
  static_assert(kChannels >= 1 && kChannels <= kFewChannels, "1 to 4 input channels");
  if (kChannels == 4 && reinterpret_cast<uintptr_t>(in) % 8 != 0) return cudaErrorMisalignedAddress;
  auto kernel = few_channels_kernel<kChannels, Storage, Index, Epilogue>;
  const size_t shared_bytes =
      static_cast<size_t>(s.kernel_h) * s.kernel_w * kChannels * s.channels * sizeof(float);
  const int64_t row_groups = (static_cast<int64_t>(s.out_w) + kFewPixels - 1) / kFewPixels;
  const int64_t items = batch * static_cast<int64_t>(s.out_h) * row_groups * (s.channels / kVector);
  return launch_resident(kernel, items, shared_bytes, stream, in, weight, s, static_cast<Index>(items), epilogue);
}

// Whether a conv's window is one the kernels unroll: 3x3 and 5x5 at stride 1 or 2, 7x7 at
// stride 1, no dilation (conv_epilogue.py's common_window says the same at build time).
template <class Index>
bool common_window(const Geometry<Index>& s) {
  return s.dilation_h == 1 && s.dilation_w == 1 && s.stride_h == s.stride_w && (s.stride_w == 1 || s.stride_w == 2) &&
         s.kernel_h == s.kernel_w && (s.kernel_w == 3 || s.kernel_w == 5 || (s.kernel_w == 7 && s.stride_w == 1));
}

// A conv of a common window known at compile time (common_window must hold for kKernel
// and kStride): the tiled kernel for small outputs, the per-pixel-group one for large.
// Small outputs take the tiled kernel, measured over the depthwise convs of MobileNetV3,
// EfficientNet-B0 and ConvNeXt-T at batch 32 on an H200 (bench/bench_depthwise.py,
// bench/results/depthwise_h200.md): tiled was faster on every stride-1 output of 28x28
// pixels or fewer (3.4x on 7x7 outputs of 5x5 windows) and every stride-2 output under
// 14x14, the other kernel on larger ones (1.1-1.5x on 56x56). A generated epilogue calls
// this with its conv's window, instantiating three kernels where launch_nhwc's dispatch
// instantiates seventeen (EfficientNet-B0's builtin.cu took 112 s to compile that way).
template <class Storage, class Index, int kKernel, int kStride, class Epilogue>
cudaError_t launch_common_window(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                                 Epilogue epilogue, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int64_t out_pixels = static_cast<int64_t>(s.out_h) * s.out_w;
  const bool small = kStride == 1 ? out_pixels <= 28 * 28 : out_pixels < 14 * 14;
  if (aligned && small && batch * out_pixels * (s.channels / kVector) < 0x7fffffff) {  // blocks fit a grid
    return launch_tiled<Storage, Index, kKernel, kStride, kStride == 1 ? 4 : 2>(in, weight, batch, s, epilogue, stream);
  }
  return launch_window<Storage, Index, kKernel, kKernel, kStride>(in, weight, batch, s, epilogue, stream);
}

// Launches the kernel for `batch` images (takes() must hold); returns the launch's error.
template <class Storage, class Index, class Epilogue>
cudaError_t launch_nhwc(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                        Epilogue epilogue, cudaStream_t stream) {
  if (common_window(s)) {
    if (s.kernel_w == 3 && s.stride_w == 1) return launch_common_window<Storage, Index, 3, 1>(in, weight, batch, s, epilogue, stream);
    if (s.kernel_w == 3) return launch_common_window<Storage, Index, 3, 2>(in, weight, batch, s, epilogue, stream);
    if (s.kernel_w == 7) return launch_common_window<Storage, Index, 7, 1>(in, weight, batch, s, epilogue, stream);
    if (s.stride_w == 1) return launch_common_window<Storage, Index, 5, 1>(in, weight, batch, s, epilogue, stream);
    return launch_common_window<Storage, Index, 5, 2>(in, weight, batch, s, epilogue, stream);
  }
  return launch_window<Storage, Index, 0, 0, 0>(in, weight, batch, s, epilogue, stream);
}

}  // namespace byoc_depthwise

#endif  // BYOC_SHIM_CUDA_DEPTHWISE_CUH_
