// Programmatic dependent launch (PDL) for the built-in CUDA kernels: the shim's and the
// generated elementwise kernels (templates/builtin/elementwise.j2).
//
// Launched with launch_after_previous(), a kernel's CTAs may be scheduled while the previous
// kernel in the stream (or CUDA graph) is still draining, so its launch and prologue overlap
// that kernel's tail. In exchange every such kernel must start with begin_after_previous():
// griddepcontrol.wait blocks until the previous grid has completed and its writes are
// visible, before the kernel touches global memory. It waits in every CTA, unconditionally,
// before any early return, so a kernel never completes before the one it follows has (the
// kernel after it relies on that: it waits only for its own predecessor).
//
// The launch attribute is set only where the device code waits: with BYOC_PDL (the cuda
// target's `pdl`, sm_90 and later), whose objects are compiled for that arch alone.
// Kernels compiled for an earlier arch, or launched without the attribute, wait for
// nothing (griddepcontrol.wait then returns at once).
#ifndef BYOC_SHIM_CUDA_PDL_CUH_
#define BYOC_SHIM_CUDA_PDL_CUH_

#include <cuda_runtime.h>

namespace byoc_pdl {

__device__ __forceinline__ void begin_after_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // Let the next kernel be scheduled as soon as every CTA of this one has started: it
  // waits for this grid to finish anyway, and CTAs started early only take free slots.
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with the PDL attribute where
// BYOC_PDL is on. Returns the launch's status (cudaGetLastError() sees it too).
template <typename... Params, typename... Args>
cudaError_t launch_after_previous(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                  cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
#ifdef BYOC_PDL
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
#endif
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace byoc_pdl

#endif  // BYOC_SHIM_CUDA_PDL_CUH_
