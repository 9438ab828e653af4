// IEEE binary16 and bfloat16 <-> float on the host, by bit manipulation (no compiler
// support for _Float16 needed): the one copy that the built-in CPU shim, the generated
// CPU code (templates/builtin/prelude.j2) and the JSON engine's CPU executor share, so
// that every CPU path rounds alike, and as NumPy and ml_dtypes do:
//   to 16 bits: round to nearest even; overflow (>= 65520 for binary16) becomes inf;
//               NaN stays a quiet NaN keeping its payload's top bits, inf stays inf;
//   to float:   exact (subnormal halves included).
#ifndef BYOC_FLOAT16_H_
#define BYOC_FLOAT16_H_

#include <cstdint>
#include <cstring>

namespace byoc_float16 {

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
  return sign ? -magnitude : magnitude;
}

inline uint16_t float_to_half(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf stays inf; NaN stays a (quiet) NaN
    return magnitude == 0x7f800000u ? (sign | 0x7c00u)
                                    : static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to 65520 or more: inf
  if (magnitude >= 0x38800000u) {  // a normal half (>= 2^-14)
    // Round to nearest even on the 13 dropped mantissa bits, then rebias 127 -> 15.
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // A half subnormal (or zero): round(magnitude * 2^24) to nearest even.
  const int exponent = static_cast<int>(magnitude >> 23);
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const int shift = 126 - exponent;  // >= 14 here
  if (shift > 24) return sign;
  uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (quotient & 1u))) ++quotient;
  return static_cast<uint16_t>(sign | quotient);  // 0x400 (smallest normal) is a valid carry
}

inline float bfloat16_to_float(uint16_t bfloat) { return float_from_bits(static_cast<uint32_t>(bfloat) << 16); }

inline uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace byoc_float16

#endif  // BYOC_FLOAT16_H_
