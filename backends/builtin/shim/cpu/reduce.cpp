// Reductions over the middle axis of (outer, n, inner): reduce (sum, mean, max, min,
// prod) and arg_reduce (argmax, argmin).
//
// Both walk the input in its memory order: for each outer index, a chunk of inner
// columns is reduced together, one contiguous row of the chunk per step of n.
#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

// (ReduceKind, kSum .. kProd: ../shim_checks.h, shared with the CUDA shim)
constexpr int64_t kChunk = 256;  // inner columns reduced together (their state is on the stack)

template <class Storage>
void reduce_typed(const Storage* in, Storage* out, int kind, int64_t outer, int64_t n, int64_t inner) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  using Accumulate = typename Traits::Accumulate;
  const bool extreme = kind == kMax || kind == kMin;

  Accumulate totals[kChunk];  // sum, mean, prod
  Compute extremes[kChunk];   // max, min
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t chunk_start = 0; chunk_start < inner; chunk_start += kChunk) {
      const int64_t chunk = inner - chunk_start < kChunk ? inner - chunk_start : kChunk;
      const Storage* column = in + o * n * inner + chunk_start;
      Storage* result = out + o * inner + chunk_start;
      if (extreme) {
        // Over nothing: -inf / +inf for floats, the dtype's limits for integers.
        const Compute identity = kind == kMax ? Traits::lowest() : Traits::highest();
        for (int64_t c = 0; c < chunk; ++c) extremes[c] = identity;
        for (int64_t p = 0; p < n; ++p) {
          const Storage* row = column + p * inner;
          for (int64_t c = 0; c < chunk; ++c) {
            const Compute value = Traits::load(row[c]);
            // A NaN wins and stays (as NumPy's max/min): comparisons with it are false.
            const bool better = kind == kMax ? value > extremes[c] : value < extremes[c];
            if (better || is_nan(value)) {
              if (!is_nan(extremes[c])) extremes[c] = value;
            }
          }
        }
        for (int64_t c = 0; c < chunk; ++c) result[c] = Traits::store(extremes[c]);
        continue;
      }
      // A sum over nothing is +0; otherwise start from -0.0 (see sum_identity).
      const Accumulate identity =
          kind == kProd ? Accumulate(1) : (n == 0 ? Accumulate(0) : sum_identity<Accumulate>());
      for (int64_t c = 0; c < chunk; ++c) totals[c] = identity;
      for (int64_t p = 0; p < n; ++p) {
        const Storage* row = column + p * inner;
        if (kind == kProd) {
          for (int64_t c = 0; c < chunk; ++c) totals[c] *= load_as<Accumulate>(row[c]);
        } else {
          for (int64_t c = 0; c < chunk; ++c) totals[c] += load_as<Accumulate>(row[c]);
        }
      }
      if (kind == kMean) {
        for (int64_t c = 0; c < chunk; ++c) {
          if constexpr (Traits::is_float) {
            result[c] = store_from<Storage>(totals[c] / static_cast<Accumulate>(n));  // NaN when n == 0
          } else {
            // Integer mean: the int64 total divided with truncation toward zero (C++ /),
            // as ONNX ReduceMean; 0 over nothing.
            const int64_t total = static_cast<int64_t>(totals[c]);
            result[c] = Traits::store(n == 0 ? int64_t{0} : total / n);
          }
        }
      } else {
        for (int64_t c = 0; c < chunk; ++c) result[c] = store_from<Storage>(totals[c]);
      }
    }
  }
}

template <class Storage>
void arg_reduce_typed(const Storage* in, int64_t* out, bool is_argmax, int64_t outer, int64_t n, int64_t inner,
                      bool select_last_index) {
  using Traits = DtypeTraits<Storage>;
  using Compute = typename Traits::Compute;
  Compute best[kChunk];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t chunk_start = 0; chunk_start < inner; chunk_start += kChunk) {
      const int64_t chunk = inner - chunk_start < kChunk ? inner - chunk_start : kChunk;
      const Storage* column = in + o * n * inner + chunk_start;
      int64_t* result = out + o * inner + chunk_start;
      for (int64_t c = 0; c < chunk; ++c) {
        best[c] = Traits::load(column[c]);
        result[c] = 0;
      }
      for (int64_t p = 1; p < n; ++p) {
        const Storage* row = column + p * inner;
        for (int64_t c = 0; c < chunk; ++c) {
          const Compute value = Traits::load(row[c]);
          // NaN is the extreme, as in NumPy: the first NaN (the last one when
          // select_last_index) wins over every number.
          bool take;
          if (is_nan(best[c])) {
            take = select_last_index && is_nan(value);
          } else if (is_nan(value)) {
            take = true;
          } else {
            take = is_argmax ? value > best[c] : value < best[c];
            take = take || (select_last_index && value == best[c]);
          }
          if (take) {
            best[c] = value;
            result[c] = p;
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" int byoc_shim_reduce(const void* in, void* out, byoc_dtype dtype, int kind, int64_t outer, int64_t n,
                                int64_t inner, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_reduce";
  BYOC_CHECK(check_reduce(kFunction, in, out, kind, outer, n, inner));
  const bool empty = outer == 0 || inner == 0;
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) reduce_typed(static_cast<const Storage*>(in), static_cast<Storage*>(out), kind, outer, n, inner);
    return 0;
  });
}

extern "C" int byoc_shim_arg_reduce(const void* in, int64_t* out, byoc_dtype dtype, int kind, int64_t outer,
                                    int64_t n, int64_t inner, int select_last_index, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_arg_reduce";
  BYOC_CHECK(check_arg_reduce(kFunction, in, out, kind, outer, n, inner));
  const bool empty = outer == 0 || inner == 0;
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) {
      arg_reduce_typed(static_cast<const Storage*>(in), out, kind == 0, outer, n, inner, select_last_index != 0);
    }
    return 0;
  });
}
