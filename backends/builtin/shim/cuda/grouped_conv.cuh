// Grouped convolutions whose groups are whole 8-channel vectors (RegNet's and ResNeXt's
// 3x3 convs: 8 to 64 channels a group) in NHWC with 16-bit floats, with the store left to
// an epilogue as in depthwise.cuh, whose namespace, vectors and epilogue interface these
// share: the shim's conv2d stores sum + bias (conv.cu), a generated conv2d_epilogue
// function stores its elementwise chain (templates/builtin/conv2d_epilogue.j2).
//
// As a GEMM per group such a conv has as many columns as the group has output channels (8
// for RegNetY-400MF: one eighth of a 64-wide tile), and conv.cu's per-output direct kernel
// read every input element 2 bytes at a time, once per output channel: RegNetY-400MF's 16
// grouped convs took 3.6 ms of its 4.3 ms a run at batch 32 on an H200.
//
// Here a thread computes 8 neighbouring output channels (one 16-byte vector; a group's
// outputs are whole vectors, so they share the group's input channels) of kGroupedPixels
// neighbouring output pixels of a row. Per tap and 8 input channels of the group: one
// 16-byte read of each pixel's input and eight 16-byte shared-memory reads of filters (8
// output channels of one input channel each) that serve every pixel, then 64 multiply-adds
// a pixel, in float. A block holds the filters of a slice of output vectors in shared
// memory ([tap][input channel of the group][vector of the slice], gathered once from OHWI);
// blockIdx.y is the slice, and the block's threads stride over the output's pixels.
#ifndef BYOC_SHIM_CUDA_GROUPED_CONV_CUH_
#define BYOC_SHIM_CUDA_GROUPED_CONV_CUH_

#include "depthwise.cuh"

namespace byoc_depthwise {

constexpr int kGroupedPixels = 2;
constexpr int64_t kGroupedMaxGroupIn = 64;  // wider groups: the tiled GEMM per group (not measured against it)
constexpr int64_t kGroupedMaxSliceVectors = 32;
constexpr size_t kGroupedMaxSharedBytes = size_t{48} << 10;  // the default: no opt-in

// Whether the grouped kernel takes a conv of these channels, groups and window (16-bit
// storage assumed): groups of whole 8-channel vectors in and out, one output vector's
// filters (window x group_in x 8 channels) within the shared memory of a block.
inline bool takes_grouped(int64_t in_channels, int64_t out_channels, int64_t groups, int64_t kernel_h,
                          int64_t kernel_w) {
  if (groups < 2 || in_channels % groups != 0 || out_channels % groups != 0) return false;
  const int64_t group_in = in_channels / groups, group_out = out_channels / groups;
  return group_in % kVector == 0 && group_out % kVector == 0 && group_in <= kGroupedMaxGroupIn &&
         kernel_h > 0 && kernel_w > 0 &&
         static_cast<size_t>(kernel_h * kernel_w * group_in) * kVector * 2 <= kGroupedMaxSharedBytes;
}

// How the output's vectors are cut into slices, one per blockIdx.y: as few slices as the
// shared memory allows (at most 32 vectors each), of equal size but for the last.
struct GroupedSlices {
  int vectors;    // output vectors of a slice
  int64_t count;  // slices
};

inline GroupedSlices grouped_slices(int64_t vectors, int64_t kernel_h, int64_t kernel_w, int64_t group_in) {
  const int64_t vector_bytes = kernel_h * kernel_w * group_in * kVector * 2;
  int64_t most = static_cast<int64_t>(kGroupedMaxSharedBytes) / vector_bytes;
  if (most > kGroupedMaxSliceVectors) most = kGroupedMaxSliceVectors;
  if (most < 1) most = 1;
  const int64_t count = (vectors + most - 1) / most;
  return {static_cast<int>((vectors + count - 1) / count), count};
}

template <class Storage, class Index, bool kAlignedInput, class Epilogue>
__global__ void __launch_bounds__(kThreads) grouped_kernel(const Storage* __restrict__ in,
                                                           const Storage* __restrict__ weight, Geometry<Index> s,
                                                           Index group_in, Index group_out, int slice_vectors,
                                                           Index total_items, Epilogue epilogue) {
  extern __shared__ uint4 shared_words[];  // [tap][input channel of the group][vector of the slice]
  byoc_pdl::begin_after_previous();
  const Index vectors = s.channels / kVector;
  const Index first_vector = static_cast<Index>(blockIdx.y) * slice_vectors;
  const Index slice = vectors - first_vector < slice_vectors ? vectors - first_vector : Index{slice_vectors};
  const Index depth = s.kernel_h * s.kernel_w * group_in;  // one output channel's filter: (kh, kw, c) in OHWI
  // Neighbouring threads read neighbouring elements of one filter row (coalesced); lane j
  // of a word is output channel j of the vector.
  for (Index i = threadIdx.x; i < depth * slice; i += blockDim.x) {
    const Index tap_channel = i % depth, v = i / depth;
    const Storage* filter = weight + (first_vector + v) * kVector * depth + tap_channel;
    alignas(16) Storage lanes[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) lanes[j] = filter[j * depth];
    shared_words[tap_channel * slice_vectors + v] = *reinterpret_cast<const uint4*>(lanes);
  }
  __syncthreads();
  const int pixels_per_pass = blockDim.x / slice_vectors;  // groups of kGroupedPixels
  const int v = threadIdx.x % slice_vectors;
  const int lane_group = threadIdx.x / slice_vectors;
  if (v >= slice || lane_group >= pixels_per_pass) return;  // the last slice's spare lanes
  const Index vector = first_vector + v;
  const Index in_channels = s.channels / group_out * group_in;
  const Index first_in = vector * kVector / group_out * group_in;  // the group's first input channel
  const Index in_vectors = group_in / kVector;
  const Index row_groups = (s.out_w + kGroupedPixels - 1) / kGroupedPixels;
  const uint4* filters = shared_words + v;
  for (Index item = static_cast<Index>(blockIdx.x) * pixels_per_pass + lane_group; item < total_items;
       item += static_cast<Index>(gridDim.x) * pixels_per_pass) {
    Index rest = item;
    const Index ow0 = rest % row_groups * kGroupedPixels;
    rest /= row_groups;
    const Index oh = rest % s.out_h;
    const Index image = rest / s.out_h;
    const Storage* image_in = in + image * s.in_h * s.in_w * in_channels + first_in;
    float sum[kGroupedPixels][kVector] = {};
    for (Index kh = 0; kh < s.kernel_h; ++kh) {
      const Index ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      if (ih < 0 || ih >= s.in_h) continue;
      for (Index kw = 0; kw < s.kernel_w; ++kw) {
        const Storage* pixel_in[kGroupedPixels];  // NULL outside the image: zeros
#pragma unroll
        for (int p = 0; p < kGroupedPixels; ++p) {
          const Index iw = (ow0 + p) * s.stride_w - s.pad_left + kw * s.dilation_w;
          pixel_in[p] = iw >= 0 && iw < s.in_w ? image_in + (ih * s.in_w + iw) * in_channels : nullptr;
        }
        const uint4* tap_filters = filters + (kh * s.kernel_w + kw) * group_in * slice_vectors;
        for (Index iv = 0; iv < in_vectors; ++iv) {
          float x[kGroupedPixels][kVector];
#pragma unroll
          for (int p = 0; p < kGroupedPixels; ++p) {
            uint4 words = make_uint4(0, 0, 0, 0);
            if (pixel_in[p] != nullptr) {
              const Storage* source = pixel_in[p] + iv * kVector;
              if constexpr (kAlignedInput) {
                words = __ldg(reinterpret_cast<const uint4*>(source));
              } else {  // a model input at an offset: 8 loads of 2 bytes
                alignas(16) Storage lanes[kVector];
#pragma unroll
                for (int j = 0; j < kVector; ++j) lanes[j] = source[j];
                words = *reinterpret_cast<const uint4*>(lanes);
              }
            }
            unpack<Storage>(words, x[p]);
          }
          const uint4* channel_filters = tap_filters + iv * kVector * slice_vectors;
#pragma unroll
          for (int c = 0; c < kVector; ++c) {
            float w[kVector];
            unpack<Storage>(channel_filters[c * slice_vectors], w);
#pragma unroll
            for (int p = 0; p < kGroupedPixels; ++p) {
#pragma unroll
              for (int j = 0; j < kVector; ++j) sum[p][j] = fmaf(x[p][c], w[j], sum[p][j]);
            }
          }
        }
      }
    }
    store_pixels<kGroupedPixels>(epilogue, ((image * s.out_h + oh) * s.out_w + ow0) * vectors + vector, vectors, ow0,
                                 s.out_w, sum);
  }
}

// Launches grouped_kernel for `batch` images (takes_grouped() must hold for the conv;
// `s.channels` is the output's channels); returns the launch's error. Blocks: as many as
// the GPU holds at once, spread over the slices. An input that is not 16-byte aligned (a
// model input at an offset) is read 2 bytes at a time.
template <class Storage, class Index, class Epilogue>
cudaError_t launch_grouped_runtime(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                                   int64_t group_in, int64_t group_out, Epilogue epilogue, cudaStream_t stream) {
  const GroupedSlices slices = grouped_slices(s.channels / kVector, s.kernel_h, s.kernel_w, group_in);
  if (slices.count > 65535) return cudaErrorInvalidConfiguration;
  const int threads = kThreads / slices.vectors * slices.vectors;
  const size_t shared_bytes = static_cast<size_t>(s.kernel_h) * s.kernel_w * group_in * slices.vectors * 16;
  const int64_t items =
      batch * static_cast<int64_t>(s.out_h) * ((static_cast<int64_t>(s.out_w) + kGroupedPixels - 1) / kGroupedPixels);
  auto kernel = reinterpret_cast<uintptr_t>(in) % 16 == 0 ? grouped_kernel<Storage, Index, true, Epilogue>
                                                           : grouped_kernel<Storage, Index, false, Epilogue>;
  int64_t resident = 0;  // blocks the GPU holds at once, shared by the slices
  const cudaError_t status = resident_blocks(kernel, threads, shared_bytes, &resident);
  if (status != cudaSuccess) return status;
  const int64_t pixels_per_pass = threads / slices.vectors;
  int64_t blocks = (items + pixels_per_pass - 1) / pixels_per_pass;
  if (blocks > resident / slices.count) blocks = resident / slices.count;
  if (blocks < 1) blocks = 1;
  byoc_pdl::launch_after_previous(kernel, dim3(static_cast<unsigned int>(blocks), static_cast<unsigned int>(slices.count)),
                                  threads, shared_bytes, stream, in, weight, s, static_cast<Index>(group_in),
                                  static_cast<Index>(group_out), slices.vectors, static_cast<Index>(items), epilogue);
  return cudaGetLastError();
}

// The launcher a generated conv2d_epilogue names, its group widths fixed by the model
// (conv_epilogue.py), with depthwise.cuh's launchers' arguments.
template <int kGroupIn, int kGroupOut, class Storage, class Index, class Epilogue>
cudaError_t launch_grouped(const Storage* in, const Storage* weight, int64_t batch, const Geometry<Index>& s,
                           Epilogue epilogue, cudaStream_t stream) {
  return launch_grouped_runtime(in, weight, batch, s, kGroupIn, kGroupOut, epilogue, stream);
}

}  // namespace byoc_depthwise

#endif  // BYOC_SHIM_CUDA_GROUPED_CONV_CUH_
