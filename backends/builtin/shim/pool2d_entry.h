// The byoc_shim_pool2d entry point (byoc_shim.h), written once for both shims: the one
// translation unit of each shim that runs pooling (cpu/conv_pool.cpp, cuda/pool.cu)
// includes it once, after defining pool2d_checked (its shim's pooling on arguments
// check_pool2d has accepted).
#ifndef BYOC_SHIM_POOL2D_ENTRY_H_
#define BYOC_SHIM_POOL2D_ENTRY_H_

extern "C" int byoc_shim_pool2d(const void* in, void* out, byoc_dtype dtype, int kind, int layout, int64_t batch,
                                int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
                                int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                                int64_t pad_top, int64_t pad_left, int64_t pad_bottom, int64_t pad_right,
                                int64_t dilation_h, int64_t dilation_w, int count_include_pad, void* stream) {
  static const char kFunction[] = "byoc_shim_pool2d";
  BYOC_CHECK(check_pool2d(kFunction, in, out, kind, layout, batch, channels, in_h, in_w, out_h, out_w, kernel_h,
                          kernel_w, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h,
                          dilation_w));
  const PoolShape shape{batch,    channels, in_h,    in_w,       out_h,     out_w,      kernel_h,   kernel_w,
                        stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w};
  // An integer average would need a rounding rule: only floats average.
  return kind == 1 ? pool2d_checked<DtypeSet::kFloats>(kFunction, in, out, dtype, true, layout == kLayoutNHWC, shape,
                                                       count_include_pad != 0, stream)
                   : pool2d_checked<DtypeSet::kNumbers>(kFunction, in, out, dtype, false, layout == kLayoutNHWC,
                                                        shape, count_include_pad != 0, stream);
}

#endif  // BYOC_SHIM_POOL2D_ENTRY_H_
