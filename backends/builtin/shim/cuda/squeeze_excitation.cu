// Squeeze-and-excitation: the gate of an SE block (byoc_shim.h documents it) as one kernel,
// where the unfused block is three (a global average pool and two tiny GEMMs of M = batch,
// each latency-bound: EfficientNet-B0 runs 16 such blocks, MobileNetV3 8).
//
// A cluster of kCluster blocks per sample (sm_90's thread block clusters; one block where
// the device has none): each block sums its share of the sample's pixels, 8 channels a
// thread with 16-byte reads; the blocks then read each other's sums through distributed
// shared memory, so every block holds the channel means. Each block computes every
// kCluster-th squeeze output (a warp per output, reading w1's rows in 16-byte vectors),
// the blocks exchange those the same way, and each block computes its share of the
// channels' gates (a few threads per channel). Sums in float; the intermediates never
// leave shared memory. With `scale` the blocks exchange the gates once more and each
// multiplies its share of the pixels by them: the block's output, in the same kernel.
#include <cooperative_groups.h>

#include "shim_cuda.cuh"

namespace byoc_shim_cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kSeThreads = 256;
constexpr int kSeCluster = 8;  // the portable cluster size: 8 blocks share a sample
constexpr int kVector = 8;     // channels a thread reads at once (16 bytes of 16-bit floats)

struct Activation {
  int kind;
  float alpha, beta;  // hard_sigmoid's
};

struct SqueezeExcitation {
  int64_t pixels;
  int channels, squeeze;
  Activation activation, gate;
  int lanes;         // threads per channel of the excitation
  bool vector_rows;  // w2's rows read in 16-byte vectors (squeeze a multiple of 8, w2 aligned)
  bool scale;        // out: the input times the gates, not the gates
};

__device__ __forceinline__ float squeeze_activate(const Activation& a, float x) {
  switch (a.kind) {
    case BYOC_ACTIVATION_RELU: return x < 0.0f ? 0.0f : x;  // NaN stays NaN
    case BYOC_ACTIVATION_SILU: return x / (1.0f + expf(-x));
    case BYOC_ACTIVATION_HARD_SWISH: return x * fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f);
    case BYOC_ACTIVATION_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case BYOC_ACTIVATION_HARD_SIGMOID: return fminf(fmaxf(a.alpha * x + a.beta, 0.0f), 1.0f);
    default: return x;
  }
}

// Eight consecutive elements as floats: one 16-byte read of 16-bit floats, two of float.
template <class Storage>
__device__ __forceinline__ void load_eight(const Storage* p, float (&x)[kVector]) {
  if constexpr (sizeof(Storage) == 2) {
    const uint4 words = *reinterpret_cast<const uint4*>(p);
    const Storage* values = reinterpret_cast<const Storage*>(&words);
#pragma unroll
    for (int j = 0; j < kVector; ++j) x[j] = Traits<Storage>::load(values[j]);
  } else {
    const float4 low = reinterpret_cast<const float4*>(p)[0], high = reinterpret_cast<const float4*>(p)[1];
    x[0] = low.x, x[1] = low.y, x[2] = low.z, x[3] = low.w;
    x[4] = high.x, x[5] = high.y, x[6] = high.z, x[7] = high.w;
  }
}

// Eight floats into eight consecutive elements: one 16-byte write of 16-bit floats, two of float.
template <class Storage>
__device__ __forceinline__ void store_eight(Storage* p, const float (&x)[kVector]) {
  if constexpr (sizeof(Storage) == 2) {
    alignas(16) Storage values[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) values[j] = Traits<Storage>::store(x[j]);
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(values);
  } else {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
}

template <int kCluster>
__device__ __forceinline__ void sync_cluster() {
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#else
    __trap();  // never launched: the host launches clusters only on sm_90 and later
#endif
  }
}

// `local` (a shared-memory address of this block) in block `rank` of the cluster.
template <int kCluster>
__device__ __forceinline__ const float* cluster_shared(float* local, int rank) {
  if constexpr (kCluster == 1) {
    return local;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(local, rank);
#else
    return local;
#endif
  }
}

// Pixels are summed by `lanes` threads per channel vector; their partial sums take
// lanes * channels floats (at most kSeThreads * kVector, or channels when a thread has
// several vectors).
__host__ __device__ inline int squeeze_pool_lanes(int channels) {
  const int vectors = channels / kVector;
  return vectors >= kSeThreads ? 1 : kSeThreads / vectors;
}

__host__ __device__ inline size_t squeeze_shared_floats(int channels, int squeeze) {
  return static_cast<size_t>(squeeze_pool_lanes(channels)) * channels + channels + 2 * static_cast<size_t>(squeeze);
}

template <class Storage, int kCluster>
__global__ void __launch_bounds__(kSeThreads)
    squeeze_excitation_kernel(const Storage* __restrict__ in, const Storage* __restrict__ w1,
                              const Storage* __restrict__ b1, const Storage* __restrict__ w2,
                              const Storage* __restrict__ b2, Storage* __restrict__ out, SqueezeExcitation se) {
  extern __shared__ float shared[];
  const int channels = se.channels, squeeze = se.squeeze, vectors = channels / kVector;
  const int lanes = squeeze_pool_lanes(channels);
  float* partial = shared;                      // [lanes][channels]; then the channel means
  float* block_sums = partial + lanes * channels;  // [channels]: this block's pixel sums
  float* own_hidden = block_sums + channels;    // [squeeze]: the outputs this block computes
  float* hidden = own_hidden + squeeze;         // [squeeze]: all of them
  byoc_pdl::begin_after_previous();

  const int rank = static_cast<int>(blockIdx.x % kCluster);
  const int64_t sample = blockIdx.x / kCluster;
  const int64_t share = (se.pixels + kCluster - 1) / kCluster;
  const int64_t first = rank * share, end = first + share < se.pixels ? first + share : se.pixels;
  const Storage* pixels = in + sample * se.pixels * channels;
  for (int slot = threadIdx.x; slot < lanes * vectors; slot += kSeThreads) {
    const int vector = slot % vectors, lane = slot / vectors;
    float sum[kVector] = {};
#pragma unroll 4
    for (int64_t p = first + lane; p < end; p += lanes) {
      float x[kVector];
      load_eight(pixels + p * channels + vector * kVector, x);
#pragma unroll
      for (int j = 0; j < kVector; ++j) sum[j] += x[j];
    }
#pragma unroll
    for (int j = 0; j < kVector; ++j) partial[lane * channels + vector * kVector + j] = sum[j];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < channels; c += kSeThreads) {
    float sum = 0.0f;
    for (int lane = 0; lane < lanes; ++lane) sum += partial[lane * channels + c];
    block_sums[c] = sum;
  }
  sync_cluster<kCluster>();  // every block's sums are complete

  float* means = partial;
  const float inverse = 1.0f / static_cast<float>(se.pixels);
  for (int c = threadIdx.x; c < channels; c += kSeThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int other = 0; other < kCluster; ++other) sum += cluster_shared<kCluster>(block_sums, other)[c];
    means[c] = sum * inverse;
  }
  __syncthreads();

  // Squeeze: this block's outputs (every kCluster-th), a warp each.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int s = rank + warp * kCluster; s < squeeze; s += kCluster * (kSeThreads / 32)) {
    const Storage* row = w1 + static_cast<int64_t>(s) * channels;
    float dot = 0.0f;
#pragma unroll 4
    for (int vector = lane; vector < vectors; vector += 32) {
      float w[kVector];
      load_eight(row + vector * kVector, w);
#pragma unroll
      for (int j = 0; j < kVector; ++j) dot = fmaf(w[j], means[vector * kVector + j], dot);
    }
    dot = warp_all_reduce(dot, [](float a, float b) { return a + b; });
    if (lane == 0) own_hidden[s] = squeeze_activate(se.activation, dot + (b1 != nullptr ? Traits<Storage>::load(b1[s]) : 0.0f));
  }
  sync_cluster<kCluster>();  // every squeeze output is computed
  for (int s = threadIdx.x; s < squeeze; s += kSeThreads) hidden[s] = cluster_shared<kCluster>(own_hidden, s % kCluster)[s];
  // No block may leave (taking its shared memory with it) while another still reads it.
  sync_cluster<kCluster>();

  // Excitation: this block's share of the channels, `se.lanes` threads each (a power of
  // two up to 32 sized so that each reads a few 16-byte vectors of the channel's row of
  // w2): the block's reads of its rows are coalesced and issued together. Every thread
  // runs every round (a group past the block's channels sums zeros) so that the
  // shuffles see whole warps.
  const int per_block = (channels + kCluster - 1) / kCluster;
  const int first_channel = rank * per_block;
  const int last = first_channel + per_block < channels ? first_channel + per_block : channels;
  const int group = threadIdx.x / se.lanes, member = threadIdx.x % se.lanes, groups = kSeThreads / se.lanes;
  for (int base = first_channel; base < last; base += groups) {
    const int c = base + group;
    float dot = 0.0f;
    if (c < last) {
      const Storage* row = w2 + static_cast<int64_t>(c) * squeeze;
      if (se.vector_rows) {
#pragma unroll 4
        for (int vector = member; vector < squeeze / kVector; vector += se.lanes) {
          float w[kVector];
          load_eight(row + vector * kVector, w);
#pragma unroll
          for (int j = 0; j < kVector; ++j) dot = fmaf(w[j], hidden[vector * kVector + j], dot);
        }
      } else {
        for (int s = member; s < squeeze; s += se.lanes) dot = fmaf(Traits<Storage>::load(row[s]), hidden[s], dot);
      }
    }
    for (int offset = se.lanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (c < last && member == 0) {
      const Storage gate =
          Traits<Storage>::store(squeeze_activate(se.gate, dot + (b2 != nullptr ? Traits<Storage>::load(b2[c]) : 0.0f)));
      if (se.scale) {
        partial[c] = Traits<Storage>::load(gate);  // rounded, as the unfused multiply reads it
      } else {
        out[sample * channels + c] = gate;
      }
    }
  }
  if (!se.scale) return;

  // Scale: every gate from the block that computed it, then this block's pixels times them.
  sync_cluster<kCluster>();
  float* gates = block_sums;
  for (int c = threadIdx.x; c < channels; c += kSeThreads) gates[c] = cluster_shared<kCluster>(partial, c / per_block)[c];
  sync_cluster<kCluster>();  // (no block leaves while another reads its gates)
  // As the pool walks them: a thread keeps one channel vector (its 8 gates in registers)
  // and strides over the block's pixels, so that no 64-bit division is left in the loop
  // and the loads of several pixels are in flight at once (the loop was the kernel's
  // slowest part: a division and a gate reload per 16 bytes).
  Storage* scaled = out + sample * se.pixels * channels;
  for (int slot = threadIdx.x; slot < lanes * vectors; slot += kSeThreads) {
    const int vector = slot % vectors;
    float gate[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) gate[j] = gates[vector * kVector + j];
#pragma unroll 4
    for (int64_t p = first + slot / vectors; p < end; p += lanes) {
      const int64_t offset = p * channels + vector * kVector;
      float x[kVector];
      load_eight(pixels + offset, x);
#pragma unroll
      for (int j = 0; j < kVector; ++j) x[j] *= gate[j];
      store_eight(scaled + offset, x);
    }
  }
}

// Threads per channel of the excitation: enough that each reads at most 4 vectors (or 16
// values where w2's rows are not vector-aligned) of the channel's row.
inline int excitation_lanes(int64_t squeeze, bool vector_rows) {
  const int64_t per_thread = vector_rows ? 4 * kVector : 16;
  int lanes = 1;
  while (lanes < 32 && lanes * per_thread < squeeze) lanes *= 2;
  return lanes;
}

// Thread block clusters need sm_90; the answer is asked once per device.
bool device_has_clusters() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static int major[64] = {};  // 0: not asked yet
  if (device < 0 || device >= 64) return false;
  if (major[device] == 0 && cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    major[device] = 0;
    return false;
  }
  return major[device] >= 9;
}

// Whether the code the device loaded for `kernel` was compiled for sm_90 or later (PTX of
// an earlier arch, which a library for several archs may run on a newer GPU, has no
// cluster code: its sync_cluster traps). Asked once per device and kernel.
template <class Kernel>
bool has_cluster_code(Kernel kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  static int known[64] = {};  // 0: not asked yet, 1: yes, 2: no
  if (known[device] == 0) {
    cudaFuncAttributes attributes;
    known[device] = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90 ? 1 : 2;
  }
  return known[device] == 1;
}

template <class Storage, int kCluster>
int launch_squeeze_excitation(const char* function, const void* in, const void* w1, const void* b1, const void* w2, const void* b2,
           void* out, int64_t batch, const SqueezeExcitation& se, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(batch * kCluster));
  config.blockDim = dim3(kSeThreads);
  config.dynamicSmemBytes = squeeze_shared_floats(se.channels, se.squeeze) * sizeof(float);
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned int count = 0;
  if (kCluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = kCluster;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
#ifdef BYOC_PDL
  attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[count].val.programmaticStreamSerializationAllowed = 1;
  ++count;
#endif
  config.attrs = attributes;
  config.numAttrs = count;
  cudaLaunchKernelEx(&config, squeeze_excitation_kernel<Storage, kCluster>, static_cast<const Storage*>(in),
                     static_cast<const Storage*>(w1), static_cast<const Storage*>(b1),
                     static_cast<const Storage*>(w2), static_cast<const Storage*>(b2), static_cast<Storage*>(out), se);
  return check_launch(function);
}

}  // namespace
}  // namespace byoc_shim_cuda

using namespace byoc_shim_cuda;

extern "C" int byoc_shim_squeeze_excitation(const void* in, const void* w1, const void* b1, const void* w2,
                                            const void* b2, void* out, byoc_dtype dtype, int64_t batch,
                                            int64_t pixels, int64_t channels, int64_t squeeze, int activation,
                                            float activation_alpha, float activation_beta, int gate,
                                            float gate_alpha, float gate_beta, int scale, void* stream) {
  static const char kFunction[] = "byoc_shim_squeeze_excitation";
  BYOC_CHECK(check_squeeze_excitation(kFunction, in, w1, w2, out, batch, pixels, channels, squeeze, activation,
                                      gate));
  if (batch == 0) return 0;
  if (batch > (int64_t{1} << 27)) {
    return fail(kInvalidArgument, kFunction, "batch is %lld; expected at most %lld", static_cast<long long>(batch),
                static_cast<long long>(int64_t{1} << 27));
  }
  if (!aligned_to(in, 16) || !aligned_to(w1, 16) || (scale != 0 && !aligned_to(out, 16))) {
    return fail(kInvalidArgument, kFunction, "in, w1 and (with scale) out must be 16-byte aligned");
  }
  const bool vector_rows = squeeze % kVector == 0 && aligned_to(w2, 16);
  const SqueezeExcitation se{pixels, static_cast<int>(channels), static_cast<int>(squeeze),
                             {activation, activation_alpha, activation_beta}, {gate, gate_alpha, gate_beta},
                             excitation_lanes(squeeze, vector_rows), vector_rows, scale != 0};
  const bool device_clusters = device_has_clusters();
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if constexpr (std::is_same_v<Storage, double>) {
      return fail(kUnsupportedDtype, kFunction, "float64 is not supported (float32, float16, bfloat16 are)");
    } else {
      const bool clusters = device_clusters && has_cluster_code(squeeze_excitation_kernel<Storage, kSeCluster>);
      return clusters ? launch_squeeze_excitation<Storage, kSeCluster>(kFunction, in, w1, b1, w2, b2, out, batch, se, as_stream(stream))
                      : launch_squeeze_excitation<Storage, 1>(kFunction, in, w1, b1, w2, b2, out, batch, se, as_stream(stream));
    }
  });
}
