// Normalizations: softmax / log_softmax, layer_norm, rms_norm, batch_norm (inference).
//
// Statistics are computed in the dtype's compute type (float for float32 and the 16-bit
// floats, double for float64), with the same operation order as the NumPy references
// (byoc/ops/normalization.py), and each result is rounded once.
#include <cmath>

#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

constexpr int64_t kChunk = 256;  // inner columns normalized together (state on the stack)

template <class Storage>
void softmax_typed(const Storage* in, Storage* out, int64_t outer, int64_t n, int64_t inner, bool log) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  Compute maxima[kChunk], sums[kChunk];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t chunk_start = 0; chunk_start < inner; chunk_start += kChunk) {
      const int64_t chunk = inner - chunk_start < kChunk ? inner - chunk_start : kChunk;
      const Storage* column = in + o * n * inner + chunk_start;
      Storage* result = out + o * n * inner + chunk_start;
      // Subtract the maximum so exp never overflows; a NaN maximum (or all -inf)
      // gives NaN, as in NumPy and onnxruntime.
      for (int64_t c = 0; c < chunk; ++c) maxima[c] = -std::numeric_limits<Compute>::infinity();
      for (int64_t p = 0; p < n; ++p)
        for (int64_t c = 0; c < chunk; ++c) {
          const Compute value = Traits::load(column[p * inner + c]);
          if (value > maxima[c] || is_nan(value)) {
            if (!is_nan(maxima[c])) maxima[c] = value;
          }
        }
      for (int64_t c = 0; c < chunk; ++c) sums[c] = Compute(0);
      for (int64_t p = 0; p < n; ++p)
        for (int64_t c = 0; c < chunk; ++c) sums[c] += std::exp(Traits::load(column[p * inner + c]) - maxima[c]);
      if (log) {
        for (int64_t c = 0; c < chunk; ++c) sums[c] = std::log(sums[c]);
        for (int64_t p = 0; p < n; ++p)
          for (int64_t c = 0; c < chunk; ++c) {
            const int64_t at = p * inner + c;
            result[at] = Traits::store(Traits::load(column[at]) - maxima[c] - sums[c]);
          }
      } else {
        for (int64_t p = 0; p < n; ++p)
          for (int64_t c = 0; c < chunk; ++c) {
            const int64_t at = p * inner + c;
            result[at] = Traits::store(std::exp(Traits::load(column[at]) - maxima[c]) / sums[c]);
          }
      }
    }
  }
}

// layer_norm (centered, with beta) and rms_norm (not centered, no beta) share the loop.
template <class Storage>
void normalize_rows(const Storage* in, const Storage* gamma, const Storage* beta, Storage* out, int64_t rows,
                    int64_t n, float epsilon, bool centered) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  const Compute count = static_cast<Compute>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const Storage* x = in + r * n;
    Storage* y = out + r * n;
    Compute mean = Compute(0);
    if (centered) {
      for (int64_t i = 0; i < n; ++i) mean += Traits::load(x[i]);
      mean /= count;
    }
    // Population variance of the centered values (two passes, no cancellation); for
    // rms_norm the mean of squares.
    Compute variance = Compute(0);
    for (int64_t i = 0; i < n; ++i) {
      const Compute centered_value = Traits::load(x[i]) - mean;
      variance += centered_value * centered_value;
    }
    variance /= count;
    const Compute deviation = std::sqrt(variance + static_cast<Compute>(epsilon));
    for (int64_t i = 0; i < n; ++i) {
      Compute value = (Traits::load(x[i]) - mean) / deviation * Traits::load(gamma[i]);
      if (beta != nullptr) value += Traits::load(beta[i]);
      y[i] = Traits::store(value);
    }
  }
}

template <class Storage>
void batch_norm_typed(const Storage* in, const Storage* scale, const Storage* bias, const Storage* mean,
                      const Storage* var, Storage* out, int64_t outer, int64_t channels, int64_t inner,
                      float epsilon) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const Compute channel_mean = Traits::load(mean[c]);
      const Compute deviation = std::sqrt(Traits::load(var[c]) + static_cast<Compute>(epsilon));
      const Compute channel_scale = Traits::load(scale[c]);
      const Compute channel_bias = Traits::load(bias[c]);
      const int64_t base = (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        out[base + i] = Traits::store((Traits::load(in[base + i]) - channel_mean) / deviation * channel_scale +
                                      channel_bias);
      }
    }
  }
}

// byoc_shim_layer_norm (centered, with beta) and byoc_shim_rms_norm (beta NULL), checked
// and dispatched.
int normalize(const char* function, const void* in, const void* gamma, const void* beta, void* out,
              byoc_dtype dtype, int64_t rows, int64_t n, float epsilon, bool centered) {
  BYOC_CHECK(check_sizes_then_pointers(function, {{"rows", rows}, {"n", n}},
                                       {{"in", in}, {"gamma", gamma}, {"out", out}}));
  const bool empty = rows == 0 || n == 0;
  return dispatch<DtypeSet::kFloats>(function, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) {
      normalize_rows(static_cast<const Storage*>(in), static_cast<const Storage*>(gamma),
                     static_cast<const Storage*>(beta), static_cast<Storage*>(out), rows, n, epsilon, centered);
    }
    return 0;
  });
}

}  // namespace

extern "C" int byoc_shim_softmax(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n, int64_t inner,
                                 int log, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_softmax";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"n", n}, {"inner", inner}},
                                       {{"in", in}, {"out", out}}));
  const bool empty = outer == 0 || n == 0 || inner == 0;
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) softmax_typed(static_cast<const Storage*>(in), static_cast<Storage*>(out), outer, n, inner, log != 0);
    return 0;
  });
}

extern "C" int byoc_shim_layer_norm(const void* in, const void* gamma, const void* beta, void* out, byoc_dtype dtype,
                                    int64_t rows, int64_t n, float epsilon, void* stream) {
  (void)stream;
  return normalize("byoc_shim_layer_norm", in, gamma, beta, out, dtype, rows, n, epsilon, true);
}

extern "C" int byoc_shim_rms_norm(const void* in, const void* gamma, void* out, byoc_dtype dtype, int64_t rows,
                                  int64_t n, float epsilon, void* stream) {
  (void)stream;
  return normalize("byoc_shim_rms_norm", in, gamma, nullptr, out, dtype, rows, n, epsilon, false);
}

extern "C" int byoc_shim_batch_norm(const void* in, const void* scale, const void* bias, const void* mean,
                                    const void* var, void* out, byoc_dtype dtype, int64_t outer, int64_t channels,
                                    int64_t inner, float epsilon, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_batch_norm";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"channels", channels}, {"inner", inner}},
                                       {{"in", in}, {"scale", scale}, {"bias", bias}, {"mean", mean}, {"var", var},
                                        {"out", out}}));
  const bool empty = outer == 0 || channels == 0 || inner == 0;
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) {
      batch_norm_typed(static_cast<const Storage*>(in), static_cast<const Storage*>(scale),
                       static_cast<const Storage*>(bias), static_cast<const Storage*>(mean),
                       static_cast<const Storage*>(var), static_cast<Storage*>(out), outer, channels, inner, epsilon);
    }
    return 0;
  });
}
