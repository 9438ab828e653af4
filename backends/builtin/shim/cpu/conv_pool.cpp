// conv2d (implicit GEMM) and the windowed pools, in NCHW or NHWC.
//
// conv2d runs one GEMM per (image, group) on the blocked core of shim_cpu.h. The
// im2col matrix is never materialized: the core packs small blocks of its operands
// anyway, and here the packing callback reads those blocks straight from the image
// (zero outside it). So conv2d needs no workspace and byoc_shim_conv2d_workspace is 0.
#include <cmath>

#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

// (ConvShape, every size and attribute of a conv2d call: ../shim_checks.h)

template <class Storage>
void conv2d_nchw(const Storage* in, const Storage* weight, const Storage* bias, Storage* out, const ConvShape& s) {
  using Accumulate = typename DtypeTraits<Storage>::Accumulate;
  // Per (image, group): C (O/g x OH*OW) = W (O/g x C/g*KH*KW) * columns (C/g*KH*KW x OH*OW).
  const int64_t group_in = s.group_in_channels(), group_out = s.group_out_channels();
  const int64_t kernel_area = s.kernel_h * s.kernel_w;
  const int64_t depth = group_in * kernel_area;
  const int64_t out_area = s.out_h * s.out_w;
  for (int64_t image = 0; image < s.batch; ++image) {
    for (int64_t group = 0; group < s.groups; ++group) {
      const Storage* group_weight = weight + group * group_out * depth;
      const Storage* group_in_planes = in + (image * s.in_channels + group * group_in) * s.in_h * s.in_w;
      Storage* group_out_planes = out + (image * s.out_channels + group * group_out) * out_area;

      auto read_a = [&](int64_t i, int64_t p_start, int64_t count, Accumulate* destination) {
        const Storage* row = group_weight + i * depth + p_start;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(row[t]);
      };
      // Row p = (channel, kh, kw) of the im2col matrix, columns j = (oh, ow).
      auto read_b = [&](int64_t p, int64_t j_start, int64_t count, Accumulate* destination) {
        const int64_t channel = p / kernel_area;
        const int64_t kh = (p % kernel_area) / s.kernel_w, kw = p % s.kernel_w;
        const Storage* plane = group_in_planes + channel * s.in_h * s.in_w;
        const int64_t row_offset = kh * s.dilation_h - s.pad_top;
        const int64_t column_offset = kw * s.dilation_w - s.pad_left;
        int64_t oh = j_start / s.out_w, ow = j_start % s.out_w;
        for (int64_t t = 0; t < count; ++t) {
          const int64_t ih = oh * s.stride_h + row_offset, iw = ow * s.stride_w + column_offset;
          destination[t] = (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w)
                               ? load_as<Accumulate>(plane[ih * s.in_w + iw])
                               : Accumulate(0);
          if (++ow == s.out_w) {
            ow = 0;
            ++oh;
          }
        }
      };
      auto write_c = [&](int64_t i, int64_t j_start, int64_t count, const Accumulate* values) {
        const Accumulate bias_value = bias ? load_as<Accumulate>(bias[group * group_out + i]) : Accumulate(0);
        Storage* row = group_out_planes + i * out_area + j_start;
        for (int64_t t = 0; t < count; ++t) row[t] = store_from<Storage>(values[t] + bias_value);
      };
      gemm::multiply<Accumulate>(group_out, out_area, depth, read_a, read_b, write_c);
    }
  }
}

template <class Storage>
void conv2d_nhwc(const Storage* in, const Storage* weight, const Storage* bias, Storage* out, const ConvShape& s) {
  using Accumulate = typename DtypeTraits<Storage>::Accumulate;
  // Per (image, group): C (OH*OW x O/g) = columns (OH*OW x KH*KW*C/g) * W^T (KH*KW*C/g x O/g).
  const int64_t group_in = s.group_in_channels(), group_out = s.group_out_channels();
  const int64_t depth = s.kernel_h * s.kernel_w * group_in;
  const int64_t out_area = s.out_h * s.out_w;
  for (int64_t image = 0; image < s.batch; ++image) {
    const Storage* image_in = in + image * s.in_h * s.in_w * s.in_channels;
    Storage* image_out = out + image * out_area * s.out_channels;
    for (int64_t group = 0; group < s.groups; ++group) {
      const Storage* group_weight = weight + group * group_out * depth;
      // Row i = (oh, ow) of the im2col matrix, columns p = (kh, kw, channel).
      auto read_a = [&](int64_t i, int64_t p_start, int64_t count, Accumulate* destination) {
        const int64_t oh = i / s.out_w, ow = i % s.out_w;
        int64_t channel = p_start % group_in, cell = p_start / group_in;
        int64_t t = 0;
        while (t < count) {
          const int64_t kh = cell / s.kernel_w, kw = cell % s.kernel_w;
          const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
          const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
          const int64_t run = group_in - channel < count - t ? group_in - channel : count - t;
          if (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) {
            const Storage* pixel = image_in + (ih * s.in_w + iw) * s.in_channels + group * group_in + channel;
            for (int64_t r = 0; r < run; ++r) destination[t + r] = load_as<Accumulate>(pixel[r]);
          } else {
            for (int64_t r = 0; r < run; ++r) destination[t + r] = Accumulate(0);
          }
          t += run;
          channel = 0;
          ++cell;
        }
      };
      auto read_b = [&](int64_t p, int64_t j_start, int64_t count, Accumulate* destination) {
        const Storage* column = group_weight + j_start * depth + p;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(column[t * depth]);
      };
      auto write_c = [&](int64_t i, int64_t j_start, int64_t count, const Accumulate* values) {
        Storage* row = image_out + i * s.out_channels + group * group_out + j_start;
        const Storage* row_bias = bias ? bias + group * group_out + j_start : nullptr;
        for (int64_t t = 0; t < count; ++t) {
          const Accumulate bias_value = row_bias ? load_as<Accumulate>(row_bias[t]) : Accumulate(0);
          row[t] = store_from<Storage>(values[t] + bias_value);
        }
      };
      gemm::multiply<Accumulate>(out_area, group_out, depth, read_a, read_b, write_c);
    }
  }
}

// Pooling windows: which kernel rows (or columns) of the window starting at `start`
// fall inside the image, and how many fall inside the image extended by the explicit
// padding (count_include_pad's divisor never counts a ceil_mode window's overhang).
struct WindowSpan {
  int64_t first, last;  // kernel indices [first, last) inside the image
  int64_t padded_count;  // kernel indices inside [-pad_begin, size + pad_end)
};

inline WindowSpan window_span(int64_t start, int64_t kernel, int64_t dilation, int64_t size, int64_t pad_begin,
                              int64_t pad_end) {
  WindowSpan span{kernel, 0, 0};
  for (int64_t q = 0; q < kernel; ++q) {
    const int64_t position = start + q * dilation;
    if (position >= 0 && position < size) {
      if (span.first == kernel) span.first = q;
      span.last = q + 1;
    }
    if (position >= -pad_begin && position < size + pad_end) ++span.padded_count;
  }
  if (span.first == kernel) span.first = span.last = 0;
  return span;
}

template <class Storage>
void pool2d_typed(const Storage* in, Storage* out, bool average, bool nhwc, const PoolShape& s,
                  bool count_include_pad) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  // Channels are contiguous in NHWC and a whole plane apart in NCHW.
  const int64_t channel_stride = nhwc ? 1 : s.in_h * s.in_w;
  const int64_t pixel_stride = nhwc ? s.channels : 1;
  const int64_t out_channel_stride = nhwc ? 1 : s.out_h * s.out_w;
  const int64_t out_pixel_stride = nhwc ? s.channels : 1;
  constexpr int64_t kChunk = 64;  // channels pooled together (NHWC reads them contiguously)
  const int64_t chunk_size = nhwc ? kChunk : 1;
  Compute values[kChunk];

  for (int64_t image = 0; image < s.batch; ++image) {
    const Storage* image_in = in + image * s.channels * s.in_h * s.in_w;
    Storage* image_out = out + image * s.channels * s.out_h * s.out_w;
    for (int64_t channel_start = 0; channel_start < s.channels; channel_start += chunk_size) {
      const int64_t chunk = s.channels - channel_start < chunk_size ? s.channels - channel_start : chunk_size;
      for (int64_t oh = 0; oh < s.out_h; ++oh) {
        const int64_t row_start = oh * s.stride_h - s.pad_top;
        const WindowSpan rows = window_span(row_start, s.kernel_h, s.dilation_h, s.in_h, s.pad_top, s.pad_bottom);
        for (int64_t ow = 0; ow < s.out_w; ++ow) {
          const int64_t column_start = ow * s.stride_w - s.pad_left;
          const WindowSpan columns =
              window_span(column_start, s.kernel_w, s.dilation_w, s.in_w, s.pad_left, s.pad_right);
          // Padding never wins a max (-inf, or the integer minimum) and adds 0 to a sum.
          const Compute identity = average ? Compute(0) : Traits::lowest();
          for (int64_t c = 0; c < chunk; ++c) values[c] = identity;
          for (int64_t kh = rows.first; kh < rows.last; ++kh) {
            const int64_t ih = row_start + kh * s.dilation_h;
            if (ih < 0 || ih >= s.in_h) continue;  // a dilated window can skip past the image
            for (int64_t kw = columns.first; kw < columns.last; ++kw) {
              const int64_t iw = column_start + kw * s.dilation_w;
              if (iw < 0 || iw >= s.in_w) continue;
              const Storage* cell = image_in + (ih * s.in_w + iw) * pixel_stride + channel_start * channel_stride;
              for (int64_t c = 0; c < chunk; ++c) {
                const Compute value = Traits::load(cell[c * channel_stride]);
                if (average) {
                  values[c] += value;
                } else if (value > values[c] || is_nan(value)) {
                  if (!is_nan(values[c])) values[c] = value;  // NaN propagates, as NumPy's max
                }
              }
            }
          }
          Storage* result = image_out + (oh * s.out_w + ow) * out_pixel_stride + channel_start * out_channel_stride;
          if (average) {
            int64_t inside = 0;  // cells inside the image (dilation may skip some of [first, last))
            for (int64_t kh = rows.first; kh < rows.last; ++kh) {
              const int64_t ih = row_start + kh * s.dilation_h;
              if (ih >= 0 && ih < s.in_h) ++inside;
            }
            int64_t inside_columns = 0;
            for (int64_t kw = columns.first; kw < columns.last; ++kw) {
              const int64_t iw = column_start + kw * s.dilation_w;
              if (iw >= 0 && iw < s.in_w) ++inside_columns;
            }
            inside *= inside_columns;
            int64_t count = count_include_pad ? rows.padded_count * columns.padded_count : inside;
            if (count < 1) count = 1;  // a window wholly in the padding averages to 0
            for (int64_t c = 0; c < chunk; ++c)
              result[c * out_channel_stride] = Traits::store(values[c] / static_cast<Compute>(count));
          } else {
            for (int64_t c = 0; c < chunk; ++c) result[c * out_channel_stride] = Traits::store(values[c]);
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" size_t byoc_shim_conv2d_workspace(byoc_dtype dtype, int layout, int64_t batch, int64_t in_channels,
                                             int64_t in_h, int64_t in_w, int64_t out_channels, int64_t kernel_h,
                                             int64_t kernel_w, int64_t out_h, int64_t out_w, int64_t groups) {
  // The implicit GEMM packs its blocks on the stack: no workspace, whatever the shape.
  (void)dtype, (void)layout, (void)batch, (void)in_channels, (void)in_h, (void)in_w, (void)out_channels;
  (void)kernel_h, (void)kernel_w, (void)out_h, (void)out_w, (void)groups;
  return 0;
}

namespace {

// byoc_shim_conv2d (conv2d_entry.h) on checked arguments: a direct loop nest per layout.
int conv2d_checked(const char* function, const void* in, const void* weight, const void* bias, void* out,
                   byoc_dtype dtype, int layout, const ConvShape& shape, void* workspace, size_t workspace_bytes,
                   void* stream) {
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return dispatch<DtypeSet::kNumbers>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (shape.empty()) return 0;
    const Storage* typed_in = static_cast<const Storage*>(in);
    const Storage* typed_weight = static_cast<const Storage*>(weight);
    const Storage* typed_bias = static_cast<const Storage*>(bias);
    Storage* typed_out = static_cast<Storage*>(out);
    if (layout == kLayoutNCHW) {
      conv2d_nchw(typed_in, typed_weight, typed_bias, typed_out, shape);
    } else {
      conv2d_nhwc(typed_in, typed_weight, typed_bias, typed_out, shape);
    }
    return 0;
  });
}

}  // namespace

#include "../conv2d_entry.h"

namespace {

// byoc_shim_pool2d (pool2d_entry.h) on checked arguments, for the dtypes of `kDtypes`.
template <DtypeSet kDtypes>
int pool2d_checked(const char* function, const void* in, void* out, byoc_dtype dtype, bool average, bool nhwc,
                   const PoolShape& shape, bool count_include_pad, void* stream) {
  (void)stream;
  return dispatch<kDtypes>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!shape.empty()) {
      pool2d_typed(static_cast<const Storage*>(in), static_cast<Storage*>(out), average, nhwc, shape,
                   count_include_pad);
    }
    return 0;
  });
}

}  // namespace

#include "../pool2d_entry.h"
