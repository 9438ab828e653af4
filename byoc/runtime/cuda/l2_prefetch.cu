// Prefetching a range of device memory into L2 (the host code's weight prefetches; see
// byoc/codegen/l2_prefetch.py). Static: compiled once per arch into the object cache and
// linked into every cuda model that prefetches.
#include <cuda_runtime.h>

namespace {

// Bytes one thread asks for: on sm_90 one bulk prefetch instruction, before that one
// prefetch instruction per 128-byte line. A CTA lasts until its prefetches have landed and
// one SM moves a few hundred GB/s, so the range is spread over many small CTAs (one CTA
// of 128 threads x 64 KiB took 15 us for 4.5 MiB on an H100).
constexpr unsigned int kChunkBytes = 4u << 10;
constexpr unsigned int kThreads = 32;

__global__ void __launch_bounds__(kThreads) prefetch_l2_kernel(const char* data, unsigned long long bytes) {
  const unsigned long long start = (static_cast<unsigned long long>(blockIdx.x) * kThreads + threadIdx.x) * kChunkBytes;
  if (start >= bytes) return;
  const unsigned long long left = bytes - start;
  const unsigned int size = static_cast<unsigned int>(left < kChunkBytes ? left : kChunkBytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // size and address are multiples of 16 (the host asks for whole 16-byte blocks of
  // 256-byte aligned weights)
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(data + start), "r"(size) : "memory");
#else
  for (unsigned int offset = 0; offset < size; offset += 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(data + start + offset));
  }
#endif
}

}  // namespace

// A hint: the data is read by a later kernel, which is right whether or not it arrived.
// Returns the launch's status. `bytes` a multiple of 16, `data` 16-byte aligned.
extern "C" cudaError_t byoc_runtime_prefetch_l2(const void* data, unsigned long long bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const unsigned long long per_block = static_cast<unsigned long long>(kThreads) * kChunkBytes;
  const unsigned int blocks = static_cast<unsigned int>((bytes + per_block - 1) / per_block);
  prefetch_l2_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const char*>(data), bytes);
  return cudaGetLastError();
}
