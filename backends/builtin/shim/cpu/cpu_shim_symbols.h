// Renames the CPU shim's C symbols (and the generated code's helper namespace) so that a
// cuda build can link the CPU shim beside the CUDA shim, whose symbols are the same: the
// builtin backend compiles the CPU shim and the functions pinned to the cpu with
// `-include cpu_shim_symbols.h` in a cuda build (not in a cpu build, which has one shim).
// Every function of byoc_shim.h must be listed (tests/test_plan_devices.py checks).
#ifndef BYOC_CPU_SHIM_SYMBOLS_H_
#define BYOC_CPU_SHIM_SYMBOLS_H_

#define byoc_shim_arg_reduce byoc_cpu_shim_arg_reduce
#define byoc_shim_batch_norm byoc_cpu_shim_batch_norm
#define byoc_shim_conv2d byoc_cpu_shim_conv2d
#define byoc_shim_conv2d_workspace byoc_cpu_shim_conv2d_workspace
#define byoc_shim_copy_strided byoc_cpu_shim_copy_strided
#define byoc_shim_concat byoc_cpu_shim_concat
#define byoc_shim_cumsum byoc_cpu_shim_cumsum
#define byoc_shim_gather byoc_cpu_shim_gather
#define byoc_shim_gather_elements byoc_cpu_shim_gather_elements
#define byoc_shim_last_error byoc_cpu_shim_last_error
#define byoc_shim_layer_norm byoc_cpu_shim_layer_norm
#define byoc_shim_matmul byoc_cpu_shim_matmul
#define byoc_shim_matmul_heuristic_count byoc_cpu_shim_matmul_heuristic_count
#define byoc_shim_pad byoc_cpu_shim_pad
#define byoc_shim_pool2d byoc_cpu_shim_pool2d
#define byoc_shim_reduce byoc_cpu_shim_reduce
#define byoc_shim_rms_norm byoc_cpu_shim_rms_norm
#define byoc_shim_softmax byoc_cpu_shim_softmax
#define byoc_shim_squeeze_excitation byoc_cpu_shim_squeeze_excitation
#define byoc_shim_tile byoc_cpu_shim_tile
#define byoc_shim_trilu byoc_cpu_shim_trilu

// Inline helpers of generated builtin sources: the cpu and cuda versions differ.
#define byoc_builtin byoc_builtin_cpu

#endif  // BYOC_CPU_SHIM_SYMBOLS_H_
