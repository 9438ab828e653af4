// The byoc_shim_conv2d entry point (byoc_shim.h), written once for both shims: the one
// translation unit of each shim that runs convolutions (cpu/conv_pool.cpp, cuda/conv.cu)
// includes it once, after defining conv2d_checked (its shim's convolution on arguments
// check_conv2d has accepted).
#ifndef BYOC_SHIM_CONV2D_ENTRY_H_
#define BYOC_SHIM_CONV2D_ENTRY_H_

extern "C" int byoc_shim_conv2d(const void* in, const void* weight, const void* bias, void* out, byoc_dtype dtype,
                                int layout, int64_t batch, int64_t in_channels, int64_t in_h, int64_t in_w,
                                int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t out_h,
                                int64_t out_w, int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                                int64_t dilation_h, int64_t dilation_w, int64_t groups, void* workspace,
                                size_t workspace_bytes, void* stream) {
  static const char kFunction[] = "byoc_shim_conv2d";
  const ConvShape shape{batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h,
                        out_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, groups};
  BYOC_CHECK(check_conv2d(kFunction, in, weight, out, layout, shape));
  return conv2d_checked(kFunction, in, weight, bias, out, dtype, layout, shape, workspace, workspace_bytes, stream);
}

#endif  // BYOC_SHIM_CONV2D_ENTRY_H_
