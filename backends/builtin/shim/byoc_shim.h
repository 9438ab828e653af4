/* The built-in backend's shim library: the kernels that the runtime library already
 * contains. Generated partition code calls these with configuration arguments fixed at
 * build time (shapes are static, so every size below is a compile-time constant at the
 * call site).
 *
 * One header, two implementations with identical symbols:
 *   cpu/       (C++17, g++)           -> libbyoc_shim_cpu.a      `stream` is ignored
 *   shim_cuda/ (CUDA, nvcc, per arch)  -> libbyoc_shim_cuda_smXX.a `stream` is a cudaStream_t
 * Pointers are device pointers for CUDA and host pointers for CPU. All tensors are dense,
 * row-major (C-contiguous). No function allocates memory except through the caller-given
 * workspace, and none synchronizes the stream.
 *
 * Every function returns 0 on success and a nonzero code on failure; then
 * byoc_shim_last_error() returns a message naming the function and what was wrong
 * (thread-local; valid until the next failing call on the same thread).
 * A pointer may be NULL only when the call touches no element through it.
 */
#ifndef BYOC_SHIM_H_
#define BYOC_SHIM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Numbering is part of the ABI (generated code passes these numbers). */
typedef enum {
  BYOC_FLOAT32 = 0,
  BYOC_FLOAT16 = 1,
  BYOC_BFLOAT16 = 2,
  BYOC_FLOAT64 = 3,
  BYOC_INT64 = 4,
  BYOC_INT32 = 5,
  BYOC_INT16 = 6,
  BYOC_INT8 = 7,
  BYOC_UINT8 = 8,
  BYOC_BOOL = 9 /* one byte, 0 or 1 */
} byoc_dtype;

#define BYOC_SHIM_MAX_DIMS 8

const char* byoc_shim_last_error(void);

/* ---- data movement --------------------------------------------------------------
 * out[i0..i{ndim-1}] = in[in_offset + sum_k i_k * in_strides[k]]   (strides in ELEMENTS,
 * may be 0 for broadcast or negative for reversed slices). Covers transpose, broadcast_to,
 * strided_slice, split (one call per output) and concat (one call per input, with
 * out_strides placing it inside the larger output).
 * out_strides gives the element strides of `out` for the same index (row-major dense when
 * NULL). shape/in_strides/out_strides have `ndim` entries, ndim <= BYOC_SHIM_MAX_DIMS. */
int byoc_shim_copy_strided(const void* in, void* out, int elem_size, int ndim,
                           const int64_t* shape, int64_t in_offset, const int64_t* in_strides,
                           const int64_t* out_strides, void* stream);

/* concat of `parts` dense inputs along one axis, in bytes: input i is `rows` rows of
 * row_bytes[i] bytes (its extent along the axis times every dim after it, times the element
 * size), the output `rows` rows of sum(row_bytes) bytes, input i at byte column
 * sum(row_bytes[:i]) of each. On the GPU one launch copies up to 64 parts (a DenseNet layer
 * concatenates up to 32 feature maps; a strided copy each was a launch each). */
int byoc_shim_concat(const void* const* ins, int parts, const int64_t* row_bytes, int64_t rows, void* out,
                     void* stream);

/* Onnx Tile: out shape = in_shape[k] * repeats[k]; out[i] = in[i_k % in_shape[k]]. */
int byoc_shim_tile(const void* in, void* out, int elem_size, int ndim, const int64_t* in_shape,
                   const int64_t* repeats, void* stream);

/* gather(data, indices, axis): data viewed as (outer, axis_len, inner); indices has
 * num_indices entries (int64 or int32 per index_dtype), negative indices wrap; an index
 * outside [-axis_len, axis_len) is an error (CPU) or clamps to the nearest slice and is
 * reported through the running model's status word (CUDA: the indices are on the device;
 * byoc_model_run or byoc_model_status says so once the run has finished).
 * out is (outer, num_indices, inner). */
int byoc_shim_gather(const void* data, const void* indices, void* out, int elem_size,
                     byoc_dtype index_dtype, int64_t outer, int64_t axis_len, int64_t inner,
                     int64_t num_indices, void* stream);

/* gather_elements: out and indices share `shape`; data has `data_shape`; along `axis`
 * out[i] = data[i with i_axis replaced by indices[i]]. shape[d] <= data_shape[d] off `axis`;
 * indices wrap and are range-checked as in gather. */
int byoc_shim_gather_elements(const void* data, const void* indices, void* out, int elem_size,
                              byoc_dtype index_dtype, int ndim, const int64_t* data_shape,
                              const int64_t* shape, int axis, void* stream);

/* pad: pads_begin/pads_end per dim (may be negative = crop). mode 0 constant (value given
 * as double, converted to dtype), 1 reflect (NumPy "reflect": one mirror image, so each
 * positive pad must be < the kept size of its dim), 2 edge (needs a kept size >= 1). */
int byoc_shim_pad(const void* in, void* out, byoc_dtype dtype, int ndim, const int64_t* in_shape,
                  const int64_t* pads_begin, const int64_t* pads_end, int mode, double value,
                  void* stream);

/* trilu on the last two dims (batch, rows, cols): keep j - i >= k (upper) or j - i <= k (lower). */
int byoc_shim_trilu(const void* in, void* out, int elem_size, int64_t batch, int64_t rows,
                    int64_t cols, int upper, int64_t k, void* stream);

/* cumsum along the middle axis of (outer, n, inner). Sums run in float32 for 16-bit floats
 * (rounded once per output), integers in int64 wrapped to the dtype. */
int byoc_shim_cumsum(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n,
                     int64_t inner, int exclusive, int reverse, void* stream);

/* ---- reductions -----------------------------------------------------------------
 * in viewed as (outer, n, inner), reduced over n -> out (outer, inner). Multi-axis
 * reductions are emitted as consecutive calls or over merged contiguous axes.
 * kind: 0 sum, 1 mean, 2 max, 3 min, 4 prod. Floating inputs accumulate in float32
 * (float64 in float64), integers in int64 (wrapping); an integer mean truncates toward 0.
 * n == 0 gives the identity: sum 0, prod 1, max -inf / dtype min, min +inf / dtype max,
 * mean NaN (floats) or 0 (integers). max/min propagate NaN. */
int byoc_shim_reduce(const void* in, void* out, byoc_dtype dtype, int kind, int64_t outer,
                     int64_t n, int64_t inner, void* stream);

/* argmax (kind 0) / argmin (kind 1) over n of (outer, n, inner) -> int64 out (outer, inner);
 * ties pick the first index, or the last when select_last_index. n must be >= 1.
 * NaN counts as the extreme (as NumPy): the first NaN, or the last with select_last_index. */
int byoc_shim_arg_reduce(const void* in, int64_t* out, byoc_dtype dtype, int kind, int64_t outer,
                         int64_t n, int64_t inner, int select_last_index, void* stream);

/* softmax over n of (outer, n, inner); log_softmax when `log`. Statistics in float32
 * (float64 for float64, here and in the norms below). */
int byoc_shim_softmax(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n,
                      int64_t inner, int log, void* stream);

/* layer_norm over the last n elements of each of `rows` rows: (x - mean) / sqrt(var + eps)
 * * gamma + beta; gamma/beta have n elements (beta may be NULL). rms_norm: x / sqrt(mean(x^2)
 * + eps) * gamma (beta ignored). Statistics in float32. */
int byoc_shim_layer_norm(const void* in, const void* gamma, const void* beta, void* out,
                         byoc_dtype dtype, int64_t rows, int64_t n, float epsilon, void* stream);
int byoc_shim_rms_norm(const void* in, const void* gamma, void* out, byoc_dtype dtype,
                       int64_t rows, int64_t n, float epsilon, void* stream);

/* ---- squeeze-and-excitation ------------------------------------------------------
 * The gate of a squeeze-and-excitation block (SENet; MobileNetV3's and EfficientNet's), for
 * each sample n of `in` (batch, pixels, channels), channels innermost (NHWC):
 *   pooled[k] = mean over the pixels of in[n, :, k]
 *   hidden[s] = activation(b1[s] + sum_k w1[s, k] * pooled[k])     w1: (squeeze, channels)
 *   out[n, c] = gate(b2[c] + sum_s w2[c, s] * hidden[s])           w2: (channels, squeeze)
 * out is (batch, channels); with `scale`, out is (batch, pixels, channels) instead: `in` with
 * every pixel's channels multiplied by their gate (the block's output). b1 and b2 may be NULL
 * (no bias). `activation` and `gate` are
 * byoc_activation numbers; alpha and beta are BYOC_ACTIVATION_HARD_SIGMOID's (max(0,
 * min(1, alpha * x + beta))), ignored by the others. float32, float16 and bfloat16, sums in
 * float32. channels must be a multiple of 8, at most BYOC_SE_MAX_CHANNELS, squeeze at most
 * BYOC_SE_MAX_SQUEEZE; CUDA: in, w1 and (with `scale`) out 16-byte aligned. */
typedef enum {
  BYOC_ACTIVATION_IDENTITY = 0,
  BYOC_ACTIVATION_RELU = 1,
  BYOC_ACTIVATION_SILU = 2,       /* x * sigmoid(x) */
  BYOC_ACTIVATION_HARD_SWISH = 3, /* x * max(0, min(1, x / 6 + 0.5)) */
  BYOC_ACTIVATION_SIGMOID = 4,
  BYOC_ACTIVATION_HARD_SIGMOID = 5
} byoc_activation;
#define BYOC_SE_MAX_CHANNELS 4096
#define BYOC_SE_MAX_SQUEEZE 1024
int byoc_shim_squeeze_excitation(const void* in, const void* w1, const void* b1, const void* w2, const void* b2,
                                 void* out, byoc_dtype dtype, int64_t batch, int64_t pixels, int64_t channels,
                                 int64_t squeeze, int activation, float activation_alpha, float activation_beta,
                                 int gate, float gate_alpha, float gate_beta, int scale, void* stream);

/* batch_norm inference on (outer, channels, inner):
 * (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]; params share dtype with x. */
int byoc_shim_batch_norm(const void* in, const void* scale, const void* bias, const void* mean,
                         const void* var, void* out, byoc_dtype dtype, int64_t outer,
                         int64_t channels, int64_t inner, float epsilon, void* stream);

/* ---- linear algebra -------------------------------------------------------------
 * C[b] = A[b] (m x k) * B[b] (k x n), row-major, for b in [0, batch). The batch offset of
 * each operand is b_index * batch_stride (elements; 0 broadcasts one matrix to all).
 * trans_a/trans_b: A is stored (k x m) / B is stored (n x k). Float types accumulate in
 * float32 (float64 in float64), integers in int64.
 * algo: the GEMM configuration chosen at build time (CUDA: an index into the cuBLASLt
 * heuristic list for this problem, -1 = first heuristic; CPU: ignored).
 * workspace/workspace_bytes: scratch the caller owns (may be NULL/0; CPU: ignored). */
int byoc_shim_matmul(const void* a, const void* b, void* c, byoc_dtype dtype, int64_t batch,
                     int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                     int64_t batch_stride_a, int64_t batch_stride_b, int64_t batch_stride_c,
                     int algo, void* workspace, size_t workspace_bytes, void* stream);

/* conv2d. layout 0 = NCHW input/output with OIHW weights, 1 = NHWC with OHWI weights.
 * weight has out_channels x (in_channels/groups) x kh x kw (in its layout). Only the top and
 * left pads are passed: out_h/out_w fix how far windows reach past the bottom/right edge
 * (cells outside the image are 0). Float types accumulate in float32 (float64 in float64),
 * integers in int64 (wrapping). bias (out_channels elements) may be NULL. */
int byoc_shim_conv2d(const void* in, const void* weight, const void* bias, void* out,
                     byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels,
                     int64_t in_h, int64_t in_w, int64_t out_channels, int64_t kernel_h,
                     int64_t kernel_w, int64_t out_h, int64_t out_w, int64_t stride_h,
                     int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t dilation_h,
                     int64_t dilation_w, int64_t groups, void* workspace, size_t workspace_bytes,
                     void* stream);

/* Workspace (bytes) byoc_shim_conv2d needs for these arguments (0 if none).
 * CPU: always 0 (an implicit GEMM: im2col blocks are packed on the stack). */
size_t byoc_shim_conv2d_workspace(byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels,
                                  int64_t in_h, int64_t in_w, int64_t out_channels, int64_t kernel_h,
                                  int64_t kernel_w, int64_t out_h, int64_t out_w, int64_t groups);

/* pool2d: kind 0 max (float or integer dtypes), 1 average (float dtypes). layout as conv2d
 * (no weights). out sizes are given (ceil_mode already applied). Padded cells are ignored by
 * max (a window with no input cell gives -inf / the dtype's minimum) and counted by average
 * only when count_include_pad: then the divisor counts the window's cells inside
 * [-pad_top, in_h + pad_bottom) x [-pad_left, in_w + pad_right), so the part of a ceil_mode
 * window past the explicit padding never counts (ONNX, PyTorch); otherwise it counts the
 * cells inside the image. A divisor of 0 counts as 1. */
int byoc_shim_pool2d(const void* in, void* out, byoc_dtype dtype, int kind, int layout,
                     int64_t batch, int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h,
                     int64_t out_w, int64_t kernel_h, int64_t kernel_w, int64_t stride_h,
                     int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                     int64_t pad_right, int64_t dilation_h, int64_t dilation_w,
                     int count_include_pad, void* stream);

/* ---- build-time tuning (CUDA only) ---------------------------------------------
 * Added with the CUDA implementation; generated run-time code never calls these, so a
 * CPU library may leave them out (or return 1).
 *
 * How many `algo` values byoc_shim_matmul accepts for these arguments on the current
 * device: the usable entries of cuBLASLt's heuristic list (at most 32), asked with this
 * workspace size and 256-byte aligned operands (as the runtime places them). Tuning tries
 * algo = 0 .. count-1 (-1 is the same as 0). 0 means cuBLASLt has no algorithm and only
 * algo = -1 runs (on a fallback kernel); integer dtypes (no cuBLASLt) and empty problems
 * give 1. Returns -1 on error (byoc_shim_last_error says why). Thread-safe; the result is
 * cached with the plan byoc_shim_matmul then reuses. */
int byoc_shim_matmul_heuristic_count(byoc_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                                     int trans_a, int trans_b, int64_t batch_stride_a,
                                     int64_t batch_stride_b, int64_t batch_stride_c,
                                     size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif  /* BYOC_SHIM_H_ */
