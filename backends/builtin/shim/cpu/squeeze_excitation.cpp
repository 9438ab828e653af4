// Squeeze-and-excitation: the gate of an SE block (byoc_shim.h documents it), computed as
// written: the mean of each channel over the pixels, the squeeze product with its
// activation, the excitation product with its gate, every sum in float; and with `scale`
// the input multiplied by it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

float squeeze_activate(int kind, float x, float alpha, float beta) {
  switch (kind) {
    case BYOC_ACTIVATION_RELU: return x < 0.0f ? 0.0f : x;  // NaN stays NaN
    case BYOC_ACTIVATION_SILU: return x / (1.0f + std::exp(-x));
    case BYOC_ACTIVATION_HARD_SWISH: return x * std::fmin(std::fmax(x / 6.0f + 0.5f, 0.0f), 1.0f);
    case BYOC_ACTIVATION_SIGMOID: return 1.0f / (1.0f + std::exp(-x));
    case BYOC_ACTIVATION_HARD_SIGMOID: return std::fmin(std::fmax(alpha * x + beta, 0.0f), 1.0f);
    default: return x;
  }
}

template <class Storage>
void squeeze_excitation_typed(const Storage* in, const Storage* w1, const Storage* b1, const Storage* w2,
                              const Storage* b2, Storage* out, int64_t batch, int64_t pixels, int64_t channels,
                              int64_t squeeze, int activation, float activation_alpha, float activation_beta,
                              int gate, float gate_alpha, float gate_beta, bool scale) {
  using Traits = DtypeTraits<Storage>;
  std::vector<float> pooled(static_cast<size_t>(channels)), hidden(static_cast<size_t>(squeeze));
  std::vector<float> gates(static_cast<size_t>(channels));
  for (int64_t n = 0; n < batch; ++n) {
    const Storage* sample = in + n * pixels * channels;
    std::fill(pooled.begin(), pooled.end(), 0.0f);
    for (int64_t p = 0; p < pixels; ++p)
      for (int64_t k = 0; k < channels; ++k) pooled[k] += static_cast<float>(Traits::load(sample[p * channels + k]));
    for (float& value : pooled) value /= static_cast<float>(pixels);
    for (int64_t s = 0; s < squeeze; ++s) {
      float sum = b1 != nullptr ? static_cast<float>(Traits::load(b1[s])) : 0.0f;
      for (int64_t k = 0; k < channels; ++k) sum += static_cast<float>(Traits::load(w1[s * channels + k])) * pooled[k];
      hidden[s] = squeeze_activate(activation, sum, activation_alpha, activation_beta);
    }
    for (int64_t c = 0; c < channels; ++c) {
      float sum = b2 != nullptr ? static_cast<float>(Traits::load(b2[c])) : 0.0f;
      for (int64_t s = 0; s < squeeze; ++s) sum += static_cast<float>(Traits::load(w2[c * squeeze + s])) * hidden[s];
      gates[c] = squeeze_activate(gate, sum, gate_alpha, gate_beta);
      if (!scale) out[n * channels + c] = Traits::store(gates[c]);
    }
    if (scale) {  // the gate rounded to the storage type, as the unfused multiply reads it
      Storage* scaled = out + n * pixels * channels;
      for (int64_t p = 0; p < pixels; ++p)
        for (int64_t k = 0; k < channels; ++k) {
          const float rounded = static_cast<float>(Traits::load(Traits::store(gates[k])));
          scaled[p * channels + k] = Traits::store(static_cast<float>(Traits::load(sample[p * channels + k])) * rounded);
        }
    }
  }
}

}  // namespace

extern "C" int byoc_shim_squeeze_excitation(const void* in, const void* w1, const void* b1, const void* w2,
                                            const void* b2, void* out, byoc_dtype dtype, int64_t batch,
                                            int64_t pixels, int64_t channels, int64_t squeeze, int activation,
                                            float activation_alpha, float activation_beta, int gate,
                                            float gate_alpha, float gate_beta, int scale, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_squeeze_excitation";
  BYOC_CHECK(check_squeeze_excitation(kFunction, in, w1, w2, out, batch, pixels, channels, squeeze, activation,
                                      gate));
  return dispatch<DtypeSet::kFloats>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if constexpr (std::is_same_v<Storage, double>) {
      return fail(kUnsupportedDtype, kFunction, "float64 is not supported (float32, float16, bfloat16 are)");
    } else {
      squeeze_excitation_typed(static_cast<const Storage*>(in), static_cast<const Storage*>(w1),
                               static_cast<const Storage*>(b1), static_cast<const Storage*>(w2),
                               static_cast<const Storage*>(b2), static_cast<Storage*>(out), batch, pixels, channels,
                               squeeze, activation, activation_alpha, activation_beta, gate, gate_alpha, gate_beta,
                               scale != 0);
      return 0;
    }
  });
}
