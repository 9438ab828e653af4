// Internal header of the CPU shim (backends/builtin/shim/cpu/*.cpp): error reporting,
// the storage types of 16-bit floats, per-dtype traits and the dtype dispatch that
// turns a runtime byoc_dtype into a template argument.
//
// Not part of the ABI: generated code only sees byoc_shim.h.
#ifndef BYOC_SHIM_CPU_H_
#define BYOC_SHIM_CPU_H_

#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../byoc_shim.h"
#include "../shim_checks.h"
#include "byoc_float16.h"

namespace byoc_shim_cpu {

// ---------------------------------------------------------------- errors

// Error reporting, return codes and argument checks: shared with the CUDA shim
// (../shim_checks.h, which also defines BYOC_CHECK).
using namespace byoc_shim_checks;  // fail, dtype_name/size, check_*, the k* codes

// ---------------------------------------------------------------- 16-bit floats

// IEEE binary16 and bfloat16 are stored as their bit patterns; arithmetic happens in
// float after converting (round to nearest even on the way back, as NumPy/ml_dtypes do).
struct float16_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

// The conversions (byoc/runtime/byoc_float16.h: shared with the generated CPU code and the
// JSON engine, so that every CPU path rounds alike).
using byoc_float16::bfloat16_to_float;
using byoc_float16::float_bits;
using byoc_float16::float_from_bits;
using byoc_float16::float_to_bfloat16;
using byoc_float16::float_to_half;
using byoc_float16::half_to_float;

// ---------------------------------------------------------------- dtype traits

// DtypeTraits<Storage>:
//   Compute      the type one value is worked on in (float for the 16-bit floats, int64_t
//                for every integer so comparisons and divisions are exact);
//   Accumulate   the type sums and products run in: float / double for floats, uint64_t
//                for integers (unsigned so that overflow wraps, as NumPy's int64 does,
//                instead of being undefined; the cast back to a narrower type wraps too);
//   load/store   conversions from storage to Compute and from Compute or Accumulate back.
template <class Storage, class = void>
struct DtypeTraits;

template <class Float>
struct FloatTraits {
  using Compute = Float;
  using Accumulate = Float;
  static constexpr bool is_float = true;
  static Compute load(Float value) { return value; }
  static Float store(Compute value) { return value; }
  static Compute lowest() { return -std::numeric_limits<Float>::infinity(); }
  static Compute highest() { return std::numeric_limits<Float>::infinity(); }
};

template <>
struct DtypeTraits<float> : FloatTraits<float> {};
template <>
struct DtypeTraits<double> : FloatTraits<double> {};

template <>
struct DtypeTraits<float16_t> {
  using Compute = float;
  using Accumulate = float;
  static constexpr bool is_float = true;
  static float load(float16_t value) { return half_to_float(value.bits); }
  static float16_t store(float value) { return float16_t{float_to_half(value)}; }
  static float lowest() { return -std::numeric_limits<float>::infinity(); }
  static float highest() { return std::numeric_limits<float>::infinity(); }
};

template <>
struct DtypeTraits<bfloat16_t> {
  using Compute = float;
  using Accumulate = float;
  static constexpr bool is_float = true;
  static float load(bfloat16_t value) { return bfloat16_to_float(value.bits); }
  static bfloat16_t store(float value) { return bfloat16_t{float_to_bfloat16(value)}; }
  static float lowest() { return -std::numeric_limits<float>::infinity(); }
  static float highest() { return std::numeric_limits<float>::infinity(); }
};

template <class Int>
struct IntTraits {
  using Compute = int64_t;
  using Accumulate = uint64_t;
  static constexpr bool is_float = false;
  static int64_t load(Int value) { return static_cast<int64_t>(value); }
  // Keeps the low bits (two's complement wrap-around, like NumPy's astype).
  static Int store(int64_t value) { return static_cast<Int>(static_cast<uint64_t>(value)); }
  static Int store(uint64_t value) { return static_cast<Int>(value); }
  static int64_t lowest() { return std::numeric_limits<Int>::lowest(); }
  static int64_t highest() { return std::numeric_limits<Int>::max(); }
};

// int64, int32, int16, int8 and uint8 (bool is not a number here: below)
template <class Int>
struct DtypeTraits<Int, std::enable_if_t<byoc_shim_checks::kIntegerStorage<Int>>> : IntTraits<Int> {};

// bool (one byte, 0 or 1) only moves and pads; a value is true when nonzero.
template <>
struct DtypeTraits<bool> {
  using Compute = int64_t;
  using Accumulate = uint64_t;
  static constexpr bool is_float = false;
  static int64_t load(bool value) { return value ? 1 : 0; }
  static bool store(int64_t value) { return value != 0; }
  static bool store(uint64_t value) { return value != 0; }
  static int64_t lowest() { return 0; }
  static int64_t highest() { return 1; }
};

// Loads a value of any dtype straight into an accumulator type (integers sign-extend
// to 64 bits before becoming unsigned, so the wrap-around arithmetic stays exact).
template <class Accumulate, class Storage>
inline Accumulate load_as(Storage value) {
  if constexpr (std::is_same_v<Accumulate, uint64_t>) {
    return static_cast<uint64_t>(DtypeTraits<Storage>::load(value));
  } else {
    return static_cast<Accumulate>(DtypeTraits<Storage>::load(value));
  }
}

// Stores an accumulator back into a storage type.
template <class Storage, class Accumulate>
inline Storage store_from(Accumulate value) {
  using Traits = DtypeTraits<Storage>;
  if constexpr (Traits::is_float) {
    return Traits::store(static_cast<typename Traits::Compute>(value));
  } else {
    return Traits::store(static_cast<uint64_t>(value));
  }
}

// Converts a double (pad's constant) to a dtype as NumPy's astype would for in-range
// values: floats round, integers truncate toward zero and wrap; NaN becomes 0.
template <class Storage>
inline Storage from_double(double value) {
  using Traits = DtypeTraits<Storage>;
  if constexpr (Traits::is_float) {
    return Traits::store(static_cast<typename Traits::Compute>(value));
  } else {
    if constexpr (std::is_same_v<Storage, bool>) return value != 0.0;  // NaN is true, as in NumPy
    if (!(value == value)) return Traits::store(int64_t{0});
    if (value >= 9.2233720368547758e18) return Traits::store(std::numeric_limits<int64_t>::max());
    if (value <= -9.2233720368547758e18) return Traits::store(std::numeric_limits<int64_t>::min());
    return Traits::store(static_cast<int64_t>(value));
  }
}

// The identity of a running sum: -0.0 for floats (so that a sum of -0.0 stays -0.0,
// as NumPy's, which starts from the first element), 0 for integers.
template <class Accumulate>
inline Accumulate sum_identity() {
  if constexpr (std::is_floating_point_v<Accumulate>) return -Accumulate(0);
  return Accumulate(0);
}

inline bool is_nan(float value) { return value != value; }
inline bool is_nan(double value) { return value != value; }
inline bool is_nan(int64_t) { return false; }

// ---------------------------------------------------------------- dispatch

// Which dtypes an entry point accepts.
enum class DtypeSet { kFloats, kNumbers, kAll };

// Calls visit(Storage{}) with the storage type of `dtype`, if `dtype` is in `kAllowed`;
// otherwise records an error naming `function` and returns kUnsupportedDtype (see
// dispatch_dtype in ../shim_checks.h, shared with the CUDA shim).
template <DtypeSet kAllowed, class Visit>
int dispatch(const char* function, byoc_dtype dtype, Visit&& visit) {
  return dispatch_dtype<float16_t, bfloat16_t, kAllowed != DtypeSet::kFloats, kAllowed == DtypeSet::kAll>(
      function, dtype, visit);
}

// ---------------------------------------------------------------- GEMM core

// C (m x n) = A (m x k) * B (k x n), blocked and packed (the BLIS scheme: packed panels
// of A and B, a small register-tile micro-kernel, accumulation in `Accumulate`). The
// operands are read and the result written through callbacks, so one core serves
// matmul (strided, transposed operands of any dtype) and conv2d (an implicit im2col:
// the packing reads the input image directly, so conv2d needs no workspace):
//   read_a(i, p0, count, Accumulate* dst): dst[t] = A(i, p0 + t) for t < count
//   read_b(p, j0, count, Accumulate* dst): dst[t] = B(p, j0 + t)
//   write_c(i, j0, count, const Accumulate* values): C(i, j0 + t) = values[t]
// The packed blocks live on the stack (about 80 KiB; no heap allocation).
namespace gemm {

constexpr int kRowsPerTile = 4;     // MR: rows of the register tile
constexpr int kColumnsPerTile = 8;  // NR: columns of the register tile
constexpr int64_t kBlockRows = 64;  // MC: rows of A packed at a time
constexpr int64_t kBlockColumns = 64;  // NC: columns of B packed at a time
// KC: depth packed at a time, so that a packed block stays 32 KiB whatever the type.
template <class Accumulate>
constexpr int64_t block_depth() { return 128 * 4 / static_cast<int64_t>(sizeof(Accumulate)); }

// tile[r][c] += sum_p a_panel[p][r] * b_panel[p][c] over `depth`, the register tile
// written into `accumulator` (row stride `accumulator_stride`). Constant trip counts
// let the compiler keep the tile in vector registers.
template <class Accumulate>
inline void micro_kernel(int64_t depth, const Accumulate* a_panel, const Accumulate* b_panel,
                         Accumulate* accumulator, int64_t accumulator_stride) {
  Accumulate tile[kRowsPerTile][kColumnsPerTile] = {};
  for (int64_t p = 0; p < depth; ++p) {
    const Accumulate* a = a_panel + p * kRowsPerTile;
    const Accumulate* b = b_panel + p * kColumnsPerTile;
    for (int r = 0; r < kRowsPerTile; ++r) {
      const Accumulate a_value = a[r];
      for (int c = 0; c < kColumnsPerTile; ++c) tile[r][c] += a_value * b[c];
    }
  }
  for (int r = 0; r < kRowsPerTile; ++r)
    for (int c = 0; c < kColumnsPerTile; ++c) accumulator[r * accumulator_stride + c] += tile[r][c];
}

// float32, the common case: the same kernel written with GCC/Clang vector extensions, so
// the tile lives in vector registers at -O2 too (plain loops vectorize only at -O3).
typedef float FloatRow __attribute__((vector_size(kColumnsPerTile * sizeof(float))));

template <>
inline void micro_kernel<float>(int64_t depth, const float* a_panel, const float* b_panel, float* accumulator,
                                int64_t accumulator_stride) {
  static_assert(kRowsPerTile == 4, "the float kernel spells out its four rows");
  // One named variable per row: -O2 does not unroll a loop over the rows, and an array
  // of vectors would live on the stack.
  FloatRow row0 = {}, row1 = {}, row2 = {}, row3 = {};
  for (int64_t p = 0; p < depth; ++p) {
    FloatRow b;
    std::memcpy(&b, b_panel + p * kColumnsPerTile, sizeof b);
    const float* a = a_panel + p * kRowsPerTile;
    row0 += a[0] * b;
    row1 += a[1] * b;
    row2 += a[2] * b;
    row3 += a[3] * b;
  }
  const FloatRow* rows[kRowsPerTile] = {&row0, &row1, &row2, &row3};
  for (int r = 0; r < kRowsPerTile; ++r) {
    FloatRow sum;
    std::memcpy(&sum, accumulator + r * accumulator_stride, sizeof sum);
    sum += *rows[r];
    std::memcpy(accumulator + r * accumulator_stride, &sum, sizeof sum);
  }
}

template <class Accumulate, class ReadA, class ReadB, class WriteC>
void multiply(int64_t m, int64_t n, int64_t k, ReadA&& read_a, ReadB&& read_b, WriteC&& write_c) {
  constexpr int64_t kDepth = block_depth<Accumulate>();
  alignas(64) Accumulate packed_a[kBlockRows * kDepth];     // MR-row panels, depth-major
  alignas(64) Accumulate packed_b[kDepth * kBlockColumns];  // NR-column panels, depth-major
  alignas(64) Accumulate accumulator[kBlockRows * kBlockColumns];
  alignas(64) Accumulate row[kDepth > kBlockColumns ? kDepth : kBlockColumns];

  for (int64_t row_start = 0; row_start < m; row_start += kBlockRows) {
    const int64_t rows = m - row_start < kBlockRows ? m - row_start : kBlockRows;
    const int64_t padded_rows = (rows + kRowsPerTile - 1) / kRowsPerTile * kRowsPerTile;
    for (int64_t column_start = 0; column_start < n; column_start += kBlockColumns) {
      const int64_t columns = n - column_start < kBlockColumns ? n - column_start : kBlockColumns;
      const int64_t padded_columns = (columns + kColumnsPerTile - 1) / kColumnsPerTile * kColumnsPerTile;
      for (int64_t i = 0; i < padded_rows * kBlockColumns; ++i) accumulator[i] = Accumulate(0);

      for (int64_t depth_start = 0; depth_start < k; depth_start += kDepth) {
        const int64_t depth = k - depth_start < kDepth ? k - depth_start : kDepth;
        // Pack A: row i of the block goes to panel i / MR, lane i % MR; rows past the
        // end of A are zero so the micro-kernel never needs an edge case.
        for (int64_t i = 0; i < padded_rows; ++i) {
          Accumulate* panel = packed_a + (i / kRowsPerTile) * depth * kRowsPerTile + i % kRowsPerTile;
          if (i < rows) {
            read_a(row_start + i, depth_start, depth, row);
            for (int64_t p = 0; p < depth; ++p) panel[p * kRowsPerTile] = row[p];
          } else {
            for (int64_t p = 0; p < depth; ++p) panel[p * kRowsPerTile] = Accumulate(0);
          }
        }
        // Pack B the same way by NR-column panels, zero columns past the end.
        for (int64_t p = 0; p < depth; ++p) {
          read_b(depth_start + p, column_start, columns, row);
          for (int64_t j = columns; j < padded_columns; ++j) row[j] = Accumulate(0);
          for (int64_t j = 0; j < padded_columns; ++j)
            packed_b[(j / kColumnsPerTile) * depth * kColumnsPerTile + p * kColumnsPerTile + j % kColumnsPerTile] =
                row[j];
        }
        for (int64_t i = 0; i < padded_rows; i += kRowsPerTile)
          for (int64_t j = 0; j < padded_columns; j += kColumnsPerTile)
            micro_kernel(depth, packed_a + i * depth, packed_b + j * depth, accumulator + i * kBlockColumns + j,
                         kBlockColumns);
      }
      for (int64_t i = 0; i < rows; ++i) write_c(row_start + i, column_start, columns, accumulator + i * kBlockColumns);
    }
  }
}

}  // namespace gemm

}  // namespace byoc_shim_cpu

#endif  // BYOC_SHIM_CPU_H_
