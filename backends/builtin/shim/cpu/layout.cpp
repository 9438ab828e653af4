// Data movement: copy_strided, tile, gather, gather_elements, pad, trilu, cumsum.
//
// Most of these only move bytes, so they work on elements as opaque blobs of
// `elem_size` bytes; pad and cumsum need the dtype (pad's constant, cumsum's sums).
#include <cstring>

#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

// An element moved as an opaque value of N bytes (copies compile to plain loads/stores).
template <size_t N>
struct Blob {
  unsigned char bytes[N];
};

// Calls visit(Blob<elem_size>{}) for the common element sizes; returns false for others.
template <class Visit>
bool visit_blob(int elem_size, Visit&& visit) {
  switch (elem_size) {
    case 1: visit(Blob<1>{}); return true;
    case 2: visit(Blob<2>{}); return true;
    case 4: visit(Blob<4>{}); return true;
    case 8: visit(Blob<8>{}); return true;
    case 16: visit(Blob<16>{}); return true;
    default: return false;
  }
}

// Visits every index of `shape` but its last dim (odometer order), calling
// row(index) once per row; `index` holds ndim-1 entries. Nothing when a dim is 0.
template <class Row>
void for_each_row(const int64_t* shape, int ndim, Row&& row) {
  int64_t index[BYOC_SHIM_MAX_DIMS + 1] = {};
  for (int d = 0; d < ndim; ++d)
    if (shape[d] == 0) return;
  for (;;) {
    row(static_cast<const int64_t*>(index));
    int d = ndim - 2;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// out[i] = in[in_offset + sum_k i_k in_strides[k]] at out[sum_k i_k out_strides[k]].
template <class Element>
void copy_strided_elements(const Element* in, Element* out, int ndim, const int64_t* shape, int64_t in_offset,
                           const int64_t* in_strides, const int64_t* out_strides) {
  if (ndim == 0) {
    out[0] = in[in_offset];
    return;
  }
  const int last = ndim - 1;
  const int64_t length = shape[last];
  const int64_t in_step = in_strides[last];
  const int64_t out_step = out_strides[last];
  for_each_row(shape, ndim, [&](const int64_t* index) {
    int64_t in_position = in_offset;
    int64_t out_position = 0;
    for (int d = 0; d < last; ++d) {
      in_position += index[d] * in_strides[d];
      out_position += index[d] * out_strides[d];
    }
    const Element* source = in + in_position;
    Element* destination = out + out_position;
    if (in_step == 1 && out_step == 1) {
      std::memmove(destination, source, static_cast<size_t>(length) * sizeof(Element));
    } else {
      for (int64_t t = 0; t < length; ++t) destination[t * out_step] = source[t * in_step];
    }
  });
}

}  // namespace

extern "C" int byoc_shim_copy_strided(const void* in, void* out, int elem_size, int ndim, const int64_t* shape,
                                      int64_t in_offset, const int64_t* in_strides, const int64_t* out_strides,
                                      void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_copy_strided";
  BYOC_CHECK(check_copy_strided(kFunction, in, out, elem_size, ndim, shape, in_strides));
  if (product(shape, ndim) == 0) return 0;

  int64_t dense[BYOC_SHIM_MAX_DIMS];
  if (out_strides == nullptr) {
    dense_strides(shape, ndim, dense);
    out_strides = dense;
  }
  bool copied = visit_blob(elem_size, [&](auto blob) {
    using Element = decltype(blob);
    copy_strided_elements(static_cast<const Element*>(in), static_cast<Element*>(out), ndim, shape, in_offset,
                          in_strides, out_strides);
  });
  if (!copied) {
    // An unusual element size: copy bytes, with the element's bytes as one more dim.
    int64_t byte_shape[BYOC_SHIM_MAX_DIMS + 1], byte_in[BYOC_SHIM_MAX_DIMS + 1], byte_out[BYOC_SHIM_MAX_DIMS + 1];
    for (int d = 0; d < ndim; ++d) {
      byte_shape[d] = shape[d];
      byte_in[d] = in_strides[d] * elem_size;
      byte_out[d] = out_strides[d] * elem_size;
    }
    byte_shape[ndim] = elem_size;
    byte_in[ndim] = byte_out[ndim] = 1;
    copy_strided_elements(static_cast<const Blob<1>*>(in), static_cast<Blob<1>*>(out), ndim + 1, byte_shape,
                          in_offset * elem_size, byte_in, byte_out);
  }
  return 0;
}

extern "C" int byoc_shim_concat(const void* const* ins, int parts, const int64_t* row_bytes, int64_t rows,
                                void* out, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_concat";
  BYOC_CHECK(check_concat(kFunction, ins, parts, row_bytes, rows, out));
  int64_t out_row = 0;
  for (int i = 0; i < parts; ++i) out_row += row_bytes[i];
  if (rows == 0 || out_row == 0) return 0;
  unsigned char* destination = static_cast<unsigned char*>(out);
  for (int64_t row = 0; row < rows; ++row) {
    for (int i = 0; i < parts; ++i) {
      if (row_bytes[i] == 0) continue;
      std::memcpy(destination, static_cast<const unsigned char*>(ins[i]) + row * row_bytes[i],
                  static_cast<size_t>(row_bytes[i]));
      destination += row_bytes[i];
    }
  }
  return 0;
}

extern "C" int byoc_shim_tile(const void* in, void* out, int elem_size, int ndim, const int64_t* in_shape,
                              const int64_t* repeats, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_tile";
  int64_t out_shape[BYOC_SHIM_MAX_DIMS];
  BYOC_CHECK(check_tile(kFunction, in, out, elem_size, ndim, in_shape, repeats, out_shape));
  if (product(out_shape, ndim) == 0) return 0;
  const char* source = static_cast<const char*>(in);
  char* destination = static_cast<char*>(out);
  if (ndim == 0) {
    std::memcpy(destination, source, static_cast<size_t>(elem_size));
    return 0;
  }

  int64_t in_strides[BYOC_SHIM_MAX_DIMS];
  dense_strides(in_shape, ndim, in_strides);
  const int last = ndim - 1;
  const size_t in_row_bytes = static_cast<size_t>(in_shape[last]) * elem_size;
  const size_t out_row_bytes = in_row_bytes * static_cast<size_t>(repeats[last]);
  int64_t out_row = 0;
  // Each output row is the matching input row (index modulo the input's dims) repeated.
  for_each_row(out_shape, ndim, [&](const int64_t* index) {
    int64_t in_position = 0;
    for (int d = 0; d < last; ++d) in_position += (index[d] % in_shape[d]) * in_strides[d];
    const char* in_row = source + in_position * elem_size;
    char* row = destination + out_row * out_row_bytes;
    for (int64_t r = 0; r < repeats[last]; ++r) std::memcpy(row + r * in_row_bytes, in_row, in_row_bytes);
    ++out_row;
  });
  return 0;
}

namespace {

// Reads index `position` of an int64 or int32 index array.
inline int64_t read_index(const void* indices, bool is_int64, int64_t position) {
  return is_int64 ? static_cast<const int64_t*>(indices)[position]
                  : static_cast<const int32_t*>(indices)[position];
}

// Checks that every index is in [-axis_len, axis_len) before anything is written.
int check_indices(const char* function, const void* indices, bool is_int64, int64_t count, int64_t axis_len) {
  for (int64_t position = 0; position < count; ++position) {
    const int64_t index = read_index(indices, is_int64, position);
    if (index < -axis_len || index >= axis_len) {
      return fail(kIndexOutOfRange, function, "index %lld (at position %lld) is out of range for an axis of size %lld",
                  static_cast<long long>(index), static_cast<long long>(position), static_cast<long long>(axis_len));
    }
  }
  return 0;
}

}  // namespace

extern "C" int byoc_shim_gather(const void* data, const void* indices, void* out, int elem_size,
                                byoc_dtype index_dtype, int64_t outer, int64_t axis_len, int64_t inner,
                                int64_t num_indices, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_gather";
  BYOC_CHECK(check_gather_sizes(kFunction, elem_size, index_dtype, outer, axis_len, inner, num_indices));
  if (num_indices == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "indices", indices));
  const bool is_int64 = index_dtype == BYOC_INT64;
  BYOC_CHECK(check_indices(kFunction, indices, is_int64, num_indices, axis_len));
  if (outer == 0 || inner == 0) return 0;
  BYOC_CHECK(check_pointer(kFunction, "data", data));
  BYOC_CHECK(check_pointer(kFunction, "out", out));

  const size_t slice_bytes = static_cast<size_t>(inner) * elem_size;
  const char* source = static_cast<const char*>(data);
  char* destination = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t q = 0; q < num_indices; ++q) {
      int64_t index = read_index(indices, is_int64, q);
      if (index < 0) index += axis_len;
      std::memcpy(destination + (o * num_indices + q) * slice_bytes, source + (o * axis_len + index) * slice_bytes,
                  slice_bytes);
    }
  }
  return 0;
}

extern "C" int byoc_shim_gather_elements(const void* data, const void* indices, void* out, int elem_size,
                                         byoc_dtype index_dtype, int ndim, const int64_t* data_shape,
                                         const int64_t* shape, int axis, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_gather_elements";
  BYOC_CHECK(check_gather_elements(kFunction, data, indices, out, elem_size, index_dtype, ndim, data_shape, shape,
                                   axis));
  const int64_t count = product(shape, ndim);
  if (count == 0) return 0;
  const bool is_int64 = index_dtype == BYOC_INT64;
  const int64_t axis_len = data_shape[axis];
  BYOC_CHECK(check_indices(kFunction, indices, is_int64, count, axis_len));

  int64_t data_strides[BYOC_SHIM_MAX_DIMS];
  dense_strides(data_shape, ndim, data_strides);
  const char* source = static_cast<const char*>(data);
  char* destination = static_cast<char*>(out);
  const int last = ndim - 1;
  int64_t position = 0;  // flat position in out and indices (both dense with `shape`)
  for_each_row(shape, ndim, [&](const int64_t* index) {
    int64_t row_base = 0;  // data offset of this row, the gathered axis left out
    for (int d = 0; d < last; ++d)
      if (d != axis) row_base += index[d] * data_strides[d];
    for (int64_t t = 0; t < shape[last]; ++t, ++position) {
      int64_t gathered = read_index(indices, is_int64, position);
      if (gathered < 0) gathered += axis_len;
      const int64_t offset = row_base + gathered * data_strides[axis] + (last == axis ? 0 : t * data_strides[last]);
      std::memcpy(destination + position * elem_size, source + offset * elem_size, static_cast<size_t>(elem_size));
    }
  });
  return 0;
}

namespace {

// Where output position `o` of one dim reads from in the input, or -1 for the constant.
// The kept (uncropped) input range is [low, high); positions outside it are padding.
struct PadDim {
  int64_t pad_begin, low, high;
  int mode;
  int64_t source(int64_t o) const {
    const int64_t s = o - pad_begin;
    if (s >= low && s < high) return s;
    if (mode == kPadConstant) return -1;
    if (mode == kPadEdge) return s < low ? low : high - 1;
    // Reflect about the first/last kept element without repeating it (NumPy's
    // "reflect"); the checks guarantee one reflection is enough.
    const int64_t kept = high - low;
    int64_t t = s - low;
    t = t < 0 ? -t : 2 * (kept - 1) - t;
    return low + t;
  }
};

}  // namespace

extern "C" int byoc_shim_pad(const void* in, void* out, byoc_dtype dtype, int ndim, const int64_t* in_shape,
                             const int64_t* pads_begin, const int64_t* pads_end, int mode, double value,
                             void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_pad";
  BYOC_CHECK(check_pad_mode(kFunction, ndim, mode));
  PadExtents extents;
  BYOC_CHECK(check_pad(kFunction, in, out, ndim, in_shape, pads_begin, pads_end, mode, &extents));
  const int64_t* out_shape = extents.out_shape;
  if (product(out_shape, ndim) == 0) return 0;
  PadDim dims[BYOC_SHIM_MAX_DIMS];
  for (int d = 0; d < ndim; ++d) dims[d] = PadDim{pads_begin[d], extents.low[d], extents.high[d], mode};

  return dispatch<DtypeSet::kAll>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    const Storage* source = static_cast<const Storage*>(in);
    Storage* destination = static_cast<Storage*>(out);
    const Storage fill = from_double<Storage>(value);
    if (ndim == 0) {
      destination[0] = source[0];
      return 0;
    }
    int64_t in_strides[BYOC_SHIM_MAX_DIMS];
    dense_strides(in_shape, ndim, in_strides);
    const int last = ndim - 1;
    const PadDim& row_dim = dims[last];
    const int64_t row_length = out_shape[last];
    int64_t out_position = 0;
    for_each_row(out_shape, ndim, [&](const int64_t* index) {
      Storage* row = destination + out_position;
      out_position += row_length;
      int64_t in_row = 0;
      for (int d = 0; d < last; ++d) {
        const int64_t s = dims[d].source(index[d]);
        if (s < 0) {  // this whole row lies in constant padding
          for (int64_t t = 0; t < row_length; ++t) row[t] = fill;
          return;
        }
        in_row += s * in_strides[d];
      }
      for (int64_t t = 0; t < row_length; ++t) {
        const int64_t s = row_dim.source(t);
        row[t] = s < 0 ? fill : source[in_row + s];
      }
    });
    return 0;
  });
}

extern "C" int byoc_shim_trilu(const void* in, void* out, int elem_size, int64_t batch, int64_t rows, int64_t cols,
                               int upper, int64_t k, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_trilu";
  BYOC_CHECK(check_trilu(kFunction, in, out, elem_size, batch, rows, cols));
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  const char* source = static_cast<const char*>(in);
  char* destination = static_cast<char*>(out);
  const size_t element = static_cast<size_t>(elem_size);
  for (int64_t row = 0; row < batch * rows; ++row) {
    const int64_t i = row % rows;
    // Kept columns: [i + k, cols) for upper, [0, i + k] for lower, clamped to the row.
    int64_t keep_begin = upper ? i + k : 0;
    int64_t keep_end = upper ? cols : i + k + 1;
    keep_begin = keep_begin < 0 ? 0 : (keep_begin > cols ? cols : keep_begin);
    keep_end = keep_end < keep_begin ? keep_begin : (keep_end > cols ? cols : keep_end);
    const char* in_row = source + row * cols * element;
    char* out_row = destination + row * cols * element;
    std::memset(out_row, 0, static_cast<size_t>(keep_begin) * element);
    std::memmove(out_row + keep_begin * element, in_row + keep_begin * element,
                 static_cast<size_t>(keep_end - keep_begin) * element);
    std::memset(out_row + keep_end * element, 0, static_cast<size_t>(cols - keep_end) * element);
  }
  return 0;
}

extern "C" int byoc_shim_cumsum(const void* in, void* out, byoc_dtype dtype, int64_t outer, int64_t n,
                                int64_t inner, int exclusive, int reverse, void* stream) {
  (void)stream;
  static const char kFunction[] = "byoc_shim_cumsum";
  BYOC_CHECK(check_sizes_then_pointers(kFunction, {{"outer", outer}, {"n", n}, {"inner", inner}},
                                       {{"in", in}, {"out", out}}));
  const bool empty = outer == 0 || n == 0 || inner == 0;
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    using Accumulate = typename DtypeTraits<Storage>::Accumulate;
    const Storage* source = static_cast<const Storage*>(in);
    Storage* destination = static_cast<Storage*>(out);
    // Running sums of a chunk of inner columns at a time, kept in the accumulate type
    // (16-bit floats must not round after every step). In place (in == out) is fine:
    // each element is read before it is written.
    constexpr int64_t kChunk = 256;
    Accumulate sums[kChunk];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t chunk_start = 0; chunk_start < inner; chunk_start += kChunk) {
        const int64_t chunk = inner - chunk_start < kChunk ? inner - chunk_start : kChunk;
        for (int64_t c = 0; c < chunk; ++c) sums[c] = sum_identity<Accumulate>();
        for (int64_t step = 0; step < n; ++step) {
          const int64_t p = reverse ? n - 1 - step : step;
          const int64_t base = (o * n + p) * inner + chunk_start;
          for (int64_t c = 0; c < chunk; ++c) {
            const Accumulate value = load_as<Accumulate>(source[base + c]);
            if (exclusive) {
              // The first exclusive sum is a plain 0 (not the -0.0 identity).
              destination[base + c] = store_from<Storage>(step == 0 ? Accumulate(0) : sums[c]);
              sums[c] += value;
            } else {
              sums[c] += value;
              destination[base + c] = store_from<Storage>(sums[c]);
            }
          }
        }
      }
    }
    return 0;
  });
}
