// How a partition calls the CUTLASS kernel that serves it.
//
// A CUTLASS kernel's compile unit depends on the kernel's types only (tile, schedule,
// epilogue, element, layouts, flags), never on a problem's sizes: it exports one function,
// byoc_cutlass_<kernel name>_<hash>(const ByocCutlassCall*), that takes the sizes and the
// operands at run time. So one object serves every problem, partition and model that uses
// that kernel, and tuning compiles exactly the objects a build links (the object cache
// hands them over). Each partition's own entry point (cutlass_entries.cc, generated from
// templates/cutlass/entries.cc.j2) fills a ByocCutlassCall and calls the kernel's function.
#ifndef BYOC_CUTLASS_CALL_H_
#define BYOC_CUTLASS_CALL_H_

#include <stddef.h>
#include <stdint.h>

// sizes[] of a GEMM: m, n, k, batch
enum { kByocGemmSizes = 4 };
// sizes[] of a 2-D convolution (NHWC): n, h, w, c, k, r, s, p, q, stride_h, stride_w,
// pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w
enum { kByocConv2dSizes = 17 };

typedef struct ByocCutlassCall {
  const char* symbol;         // the partition (error messages name it)
  void* const* args;          // the partition's parameters, in its order
  void* const* results;       // its one result
  int a, b, bias, residual;   // where each operand is in args; -1: the problem has none
  const int64_t* sizes;       // the problem's extents (above)
  float alpha;                // scale of the accumulator
  void* workspace;
  size_t workspace_bytes;
  void* stream;               // a cudaStream_t
  int activation;             // a runtime-epilogue kernel's activation (byoc_runtime_activation.h); others
                              // have theirs compiled in and ignore it
} ByocCutlassCall;

#endif  // BYOC_CUTLASS_CALL_H_
