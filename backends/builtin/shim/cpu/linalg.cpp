// Batched matrix multiplication on the blocked GEMM core of shim_cpu.h.
#include "shim_cpu.h"

using namespace byoc_shim_cpu;

namespace {

template <class Storage>
void matmul_typed(const Storage* a, const Storage* b, Storage* c, int64_t batch, int64_t m, int64_t n, int64_t k,
                  bool trans_a, bool trans_b, int64_t batch_stride_a, int64_t batch_stride_b,
                  int64_t batch_stride_c) {
  using Accumulate = typename DtypeTraits<Storage>::Accumulate;
  for (int64_t index = 0; index < batch; ++index) {
    const Storage* a_matrix = a + index * batch_stride_a;
    const Storage* b_matrix = b + index * batch_stride_b;
    Storage* c_matrix = c + index * batch_stride_c;
    // A(i, p) is a[i * k + p], or a[p * m + i] when A is stored transposed (k x m).
    auto read_a = [&](int64_t i, int64_t p_start, int64_t count, Accumulate* destination) {
      if (!trans_a) {
        const Storage* row = a_matrix + i * k + p_start;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(row[t]);
      } else {
        const Storage* column = a_matrix + p_start * m + i;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(column[t * m]);
      }
    };
    // B(p, j) is b[p * n + j], or b[j * k + p] when B is stored transposed (n x k).
    auto read_b = [&](int64_t p, int64_t j_start, int64_t count, Accumulate* destination) {
      if (!trans_b) {
        const Storage* row = b_matrix + p * n + j_start;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(row[t]);
      } else {
        const Storage* column = b_matrix + j_start * k + p;
        for (int64_t t = 0; t < count; ++t) destination[t] = load_as<Accumulate>(column[t * k]);
      }
    };
    auto write_c = [&](int64_t i, int64_t j_start, int64_t count, const Accumulate* values) {
      Storage* row = c_matrix + i * n + j_start;
      for (int64_t t = 0; t < count; ++t) row[t] = store_from<Storage>(values[t]);
    };
    gemm::multiply<Accumulate>(m, n, k, read_a, read_b, write_c);
  }
}

}  // namespace

extern "C" int byoc_shim_matmul(const void* a, const void* b, void* c, byoc_dtype dtype, int64_t batch, int64_t m,
                                int64_t n, int64_t k, int trans_a, int trans_b, int64_t batch_stride_a,
                                int64_t batch_stride_b, int64_t batch_stride_c, int algo, void* workspace,
                                size_t workspace_bytes, void* stream) {
  // algo, workspace and stream mean something only to the CUDA implementation.
  (void)algo;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  static const char kFunction[] = "byoc_shim_matmul";
  BYOC_CHECK(check_matmul(kFunction, a, b, c, batch, m, n, k));
  const bool empty = batch == 0 || m == 0 || n == 0;
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (!empty) {
      matmul_typed(static_cast<const Storage*>(a), static_cast<const Storage*>(b), static_cast<Storage*>(c), batch, m,
                   n, k, trans_a != 0, trans_b != 0, batch_stride_a, batch_stride_b, batch_stride_c);
    }
    return 0;
  });
}
