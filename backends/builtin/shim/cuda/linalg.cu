// Batched matmul: cuBLASLt for the float dtypes, the tiled CUDA-core GEMM for integers.
//
// cuBLASLt is column-major; a row-major C = A * B is the column-major C^T = B^T * A^T,
// and a row-major matrix read column-major is its transpose. So cuBLASLt's "A" is our B
// and its "B" is our A, with no copies: our trans flags become its op flags.
//
// Precision: float16 / bfloat16 / float32 compute in float32 (CUBLAS_COMPUTE_32F: no
// TF32, so float32 results match the reference to float32 rounding), float64 in
// float64. `algo` indexes cuBLASLt's heuristic list for the problem (at most
// kMaxHeuristics entries, requested with the caller's workspace size and the operands'
// actual alignments); -1 takes the first. With algo == -1 and no cuBLASLt algorithm at
// all, the tiled kernel computes the product instead (float32 accumulation).
//
// Plan cache: building descriptors and asking for heuristics costs tens of
// microseconds, so each (device, dtype, shapes, strides, trans flags, alignments,
// workspace limit, algo) gets a plan once, kept for the life of the process in a small
// cache (kPlanCacheCapacity entries, oldest evicted first). Thread safety: the cache and
// the per-device cuBLASLt handles are guarded by one mutex, taken only to look up or
// insert; plans are immutable once built and shared through shared_ptr, so an evicted
// plan stays alive until the threads using it finish. cuBLASLt handles may be used from
// several threads at once (the stream is a per-call argument). Handles are never
// destroyed: at process exit the CUDA context may already be gone.
#include <cublasLt.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "tiled_gemm.cuh"

using namespace byoc_shim_cuda;

namespace {

constexpr int kMaxHeuristics = 32;
constexpr size_t kPlanCacheCapacity = 256;

int check_cublas(const char* function, const char* what, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return 0;
  return fail(kCublasError, function, "%s failed: %s (%s)", what, cublasLtGetStatusName(status),
              cublasLtGetStatusString(status));
}

// The largest power of two (<= 256) dividing a pointer and, for a batch, its batch
// stride in bytes: the alignment every matrix of the operand has.
uint32_t operand_alignment(const void* pointer, int64_t batch, int64_t stride_bytes) {
  uint32_t alignment = 256;
  while (alignment > 1 && (reinterpret_cast<uintptr_t>(pointer) % alignment != 0 ||
                           (batch > 1 && stride_bytes % static_cast<int64_t>(alignment) != 0)))
    alignment /= 2;
  return alignment;
}

struct PlanKey {
  int device;
  int dtype;
  int64_t batch, m, n, k;
  int trans_a, trans_b;
  int64_t stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  size_t workspace_limit;
  int algo;

  auto tie() const {
    return std::tie(device, dtype, batch, m, n, k, trans_a, trans_b, stride_a, stride_b, stride_c, align_a, align_b,
                    align_c, workspace_limit, algo);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

// Descriptors and the chosen algorithm of one problem; immutable once built.
struct Plan {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;  // cuBLASLt's A, B, C
  cublasLtMatmulAlgo_t algo{};
  int heuristic_count = 0;  // 0: cuBLASLt has no algorithm for this problem
  bool double_scale = false;  // alpha/beta are double (float64) rather than float

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }
};

std::mutex cache_mutex;
std::map<int, cublasLtHandle_t> handles;  // per device
std::map<PlanKey, std::shared_ptr<const Plan>> plans;
std::deque<PlanKey> plan_order;  // insertion order, for eviction

int get_handle(const char* function, int device, cublasLtHandle_t* handle) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto found = handles.find(device);
  if (found != handles.end()) {
    *handle = found->second;
    return 0;
  }
  BYOC_CHECK(check_cublas(function, "cublasLtCreate", cublasLtCreate(handle)));
  handles[device] = *handle;
  return 0;
}

bool lt_types(byoc_dtype dtype, cudaDataType_t* data, cublasComputeType_t* compute, cudaDataType_t* scale) {
  switch (dtype) {
    case BYOC_FLOAT32: *data = CUDA_R_32F; break;
    case BYOC_FLOAT16: *data = CUDA_R_16F; break;
    case BYOC_BFLOAT16: *data = CUDA_R_16BF; break;
    case BYOC_FLOAT64:
      *data = CUDA_R_64F;
      *compute = CUBLAS_COMPUTE_64F;
      *scale = CUDA_R_64F;
      return true;
    default: return false;
  }
  *compute = CUBLAS_COMPUTE_32F;  // float32 accumulation, no TF32
  *scale = CUDA_R_32F;
  return true;
}

int make_layout(const char* function, cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows,
                int64_t columns, int64_t batch, int64_t batch_stride) {
  BYOC_CHECK(check_cublas(function, "cublasLtMatrixLayoutCreate",
                          cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows),
                                                     static_cast<uint64_t>(columns), rows)));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    BYOC_CHECK(check_cublas(function, "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)",
                            cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                             sizeof count)));
    BYOC_CHECK(check_cublas(function, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)",
                            cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                             &batch_stride, sizeof batch_stride)));
  }
  return 0;
}

// Builds the plan of `key` (descriptors, heuristics, the algorithm at key.algo).
int build_plan(const char* function, const PlanKey& key, cublasLtHandle_t handle, std::shared_ptr<Plan>* result) {
  auto plan = std::make_shared<Plan>();
  plan->handle = handle;
  cudaDataType_t data_type = CUDA_R_32F, scale_type = CUDA_R_32F;
  cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;
  lt_types(static_cast<byoc_dtype>(key.dtype), &data_type, &compute_type, &scale_type);
  plan->double_scale = scale_type == CUDA_R_64F;
  BYOC_CHECK(check_cublas(function, "cublasLtMatmulDescCreate",
                          cublasLtMatmulDescCreate(&plan->operation, compute_type, scale_type)));
  // cuBLASLt's A is our B (op = trans_b), its B is our A (op = trans_a).
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  BYOC_CHECK(check_cublas(function, "cublasLtMatmulDescSetAttribute(TRANSA)",
                          cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                         sizeof op_a)));
  BYOC_CHECK(check_cublas(function, "cublasLtMatmulDescSetAttribute(TRANSB)",
                          cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                         sizeof op_b)));
  // Stored shapes, column-major: our B is (k x n) row-major = (n x k) column-major, or
  // (n x k) row-major = (k x n) column-major when trans_b; likewise for A.
  BYOC_CHECK(make_layout(function, &plan->layout_a, data_type, key.trans_b ? key.k : key.n,
                         key.trans_b ? key.n : key.k, key.batch, key.stride_b));
  BYOC_CHECK(make_layout(function, &plan->layout_b, data_type, key.trans_a ? key.m : key.k,
                         key.trans_a ? key.k : key.m, key.batch, key.stride_a));
  BYOC_CHECK(make_layout(function, &plan->layout_c, data_type, key.n, key.m, key.batch, key.stride_c));

  cublasLtMatmulPreference_t preference = nullptr;
  BYOC_CHECK(check_cublas(function, "cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&preference)));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> preference_owner(
      preference, cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace_limit = key.workspace_limit;
  BYOC_CHECK(check_cublas(function, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
                          cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_limit, sizeof workspace_limit)));
  // Alignments: cuBLASLt's A is our B, its B our A; C and D are both our C.
  const cublasLtMatmulPreferenceAttributes_t alignment_keys[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t alignments[4] = {key.align_b, key.align_a, key.align_c, key.align_c};
  for (int i = 0; i < 4; ++i) {
    BYOC_CHECK(check_cublas(function, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)",
                            cublasLtMatmulPreferenceSetAttribute(preference, alignment_keys[i], &alignments[i],
                                                                 sizeof alignments[i])));
  }
  cublasLtMatmulHeuristicResult_t heuristics[kMaxHeuristics];
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan->operation, plan->layout_a, plan->layout_b, plan->layout_c,
                                     plan->layout_c, preference, kMaxHeuristics, heuristics, &returned);
  // NOT_SUPPORTED means no algorithm for this problem: an empty list, not an error.
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
    BYOC_CHECK(check_cublas(function, "cublasLtMatmulAlgoGetHeuristic", status));
  } else {
    returned = 0;
  }
  // Only the usable entries count (and keep their order), so that an index means the
  // same algorithm here and in byoc_shim_matmul_heuristic_count.
  int usable = 0;
  for (int i = 0; i < returned; ++i) {
    if (heuristics[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (usable == (key.algo < 0 ? 0 : key.algo)) plan->algo = heuristics[i].algo;
    ++usable;
  }
  plan->heuristic_count = usable;
  if (key.algo >= 0 && key.algo >= usable && usable > 0) {
    return fail(kInvalidArgument, function, "algo %d is out of range: cuBLASLt offers %d algorithms for this problem",
                key.algo, usable);
  }
  *result = std::move(plan);
  return 0;
}

int get_plan(const char* function, const PlanKey& key, std::shared_ptr<const Plan>* result) {
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto found = plans.find(key);
    if (found != plans.end()) {
      *result = found->second;
      return 0;
    }
  }
  cublasLtHandle_t handle = nullptr;
  BYOC_CHECK(get_handle(function, key.device, &handle));
  std::shared_ptr<Plan> built;
  BYOC_CHECK(build_plan(function, key, handle, &built));  // outside the lock: it may take a while
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto inserted = plans.emplace(key, std::move(built));
  if (inserted.second) {  // (another thread may have built the same plan meanwhile)
    plan_order.push_back(key);
    if (plan_order.size() > kPlanCacheCapacity) {
      plans.erase(plan_order.front());
      plan_order.pop_front();
    }
  }
  *result = inserted.first->second;
  return 0;
}

int make_key(const char* function, byoc_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a,
             bool trans_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, const void* a, const void* b,
             const void* c, int algo, size_t workspace_bytes, PlanKey* key) {
  int device = 0;
  BYOC_CHECK(check_cuda(function, "cudaGetDevice", cudaGetDevice(&device)));
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  *key = PlanKey{device, static_cast<int>(dtype), batch, m, n, k, trans_a ? 1 : 0, trans_b ? 1 : 0,
                 batch > 1 ? stride_a : 0, batch > 1 ? stride_b : 0, batch > 1 ? stride_c : 0,
                 operand_alignment(a, batch, stride_a * elem), operand_alignment(b, batch, stride_b * elem),
                 operand_alignment(c, batch, stride_c * elem), workspace_bytes, algo < 0 ? -1 : algo};
  return 0;
}

// ---------------------------------------------------------------- tiled GEMM operands

template <class Storage, class Acc>
struct MatrixA {  // A(i, p), stored (m x k), or (k x m) when transposed
  const Storage* data;
  int64_t batch_stride, m, k;
  bool transposed;
  __device__ Acc operator()(int64_t b, int64_t i, int64_t p) const {
    return load_as<Acc>(data[b * batch_stride + (transposed ? p * m + i : i * k + p)]);
  }
};

template <class Storage, class Acc>
struct MatrixB {  // B(p, j), stored (k x n), or (n x k) when transposed
  const Storage* data;
  int64_t batch_stride, k, n;
  bool transposed;
  __device__ Acc operator()(int64_t b, int64_t p, int64_t j) const {
    return load_as<Acc>(data[b * batch_stride + (transposed ? j * k + p : p * n + j)]);
  }
};

template <class Storage, class Acc>
struct MatrixC {
  Storage* data;
  int64_t batch_stride, n;
  __device__ void operator()(int64_t b, int64_t i, int64_t j, Acc value) const {
    data[b * batch_stride + i * n + j] = store_from<Storage>(value);
  }
};

template <class Storage>
int tiled_matmul(const char* function, const void* a, const void* b, void* c, int64_t batch, int64_t m, int64_t n,
                 int64_t k, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b, int64_t stride_c,
                 cudaStream_t stream) {
  using Acc = typename Traits<Storage>::Accumulate;
  return launch_tiled_gemm<Acc>(function, batch, m, n, k,
                                MatrixA<Storage, Acc>{static_cast<const Storage*>(a), stride_a, m, k, trans_a},
                                MatrixB<Storage, Acc>{static_cast<const Storage*>(b), stride_b, k, n, trans_b},
                                MatrixC<Storage, Acc>{static_cast<Storage*>(c), stride_c, n}, stream);
}

// C = 0 for k == 0 (an empty sum); the batch's matrices may sit apart (batch_stride_c).
template <class Storage>
__global__ void zero_matrices_kernel(Storage* c, int64_t batch, int64_t size, int64_t batch_stride) {
  byoc_pdl::begin_after_previous();
  const int64_t total = batch * size;
  for (int64_t linear = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; linear < total;
       linear += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    c[(linear / size) * batch_stride + linear % size] = Storage{};
  }
}

}  // namespace

namespace byoc_shim_cuda {

int lt_matmul(const char* function, const void* a, const void* b, void* c, byoc_dtype dtype, int64_t batch,
              int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t batch_stride_a,
              int64_t batch_stride_b, int64_t batch_stride_c, int algo, void* workspace, size_t workspace_bytes,
              cudaStream_t stream, bool* unsupported) {
  *unsupported = false;
  cudaDataType_t data_type, scale_type;
  cublasComputeType_t compute_type;
  if (!lt_types(dtype, &data_type, &compute_type, &scale_type) || batch > 2147483647) {
    *unsupported = true;
    return 0;
  }
  PlanKey key;
  BYOC_CHECK(make_key(function, dtype, batch, m, n, k, trans_a, trans_b, batch_stride_a, batch_stride_b,
                      batch_stride_c, a, b, c, algo, workspace == nullptr ? 0 : workspace_bytes, &key));
  std::shared_ptr<const Plan> plan;
  BYOC_CHECK(get_plan(function, key, &plan));
  if (plan->heuristic_count == 0) {
    *unsupported = true;
    return 0;
  }
  const float alpha_float = 1.0f, beta_float = 0.0f;
  const double alpha_double = 1.0, beta_double = 0.0;
  const void* alpha = plan->double_scale ? static_cast<const void*>(&alpha_double) : &alpha_float;
  const void* beta = plan->double_scale ? static_cast<const void*>(&beta_double) : &beta_float;
  // cuBLASLt's A is our B and its B our A (see the top of this file); beta = 0, C = D.
  return check_cublas(function, "cublasLtMatmul",
                      cublasLtMatmul(plan->handle, plan->operation, alpha, b, plan->layout_a, a, plan->layout_b, beta,
                                     c, plan->layout_c, c, plan->layout_c, &plan->algo,
                                     workspace == nullptr ? nullptr : workspace,
                                     workspace == nullptr ? 0 : workspace_bytes, stream));
}

}  // namespace byoc_shim_cuda

extern "C" int byoc_shim_matmul(const void* a, const void* b, void* c, byoc_dtype dtype, int64_t batch, int64_t m,
                                int64_t n, int64_t k, int trans_a, int trans_b, int64_t batch_stride_a,
                                int64_t batch_stride_b, int64_t batch_stride_c, int algo, void* workspace,
                                size_t workspace_bytes, void* stream) {
  static const char kFunction[] = "byoc_shim_matmul";
  BYOC_CHECK(check_matmul(kFunction, a, b, c, batch, m, n, k));
  const bool empty = batch == 0 || m == 0 || n == 0;
  if (algo < -1) return fail(kInvalidArgument, kFunction, "algo is %d; expected -1 or a heuristic index", algo);
  cudaStream_t cuda_stream = as_stream(stream);
  return dispatch<DtypeSet::kNumbers>(kFunction, dtype, [&](auto tag) {
    using Storage = decltype(tag);
    if (empty) return 0;
    if (k == 0) {
      byoc_pdl::launch_after_previous(zero_matrices_kernel<Storage>,
          blocks_for(batch * m * n), kThreads, 0, cuda_stream, static_cast<Storage*>(c), batch, m * n, batch_stride_c);
      return check_launch(kFunction);
    }
    if constexpr (Traits<Storage>::is_float) {
      bool unsupported = false;
      BYOC_CHECK(lt_matmul(kFunction, a, b, c, dtype, batch, m, n, k, trans_a != 0, trans_b != 0, batch_stride_a,
                           batch_stride_b, batch_stride_c, algo, workspace, workspace_bytes, cuda_stream,
                           &unsupported));
      if (!unsupported) return 0;
      if (algo >= 0) {
        return fail(kInvalidArgument, kFunction, "algo %d is out of range: cuBLASLt offers no algorithm here", algo);
      }
      // No cuBLASLt algorithm (unusual sizes or alignments): the CUDA-core kernel.
    }
    return tiled_matmul<Storage>(kFunction, a, b, c, batch, m, n, k, trans_a != 0, trans_b != 0, batch_stride_a,
                                 batch_stride_b, batch_stride_c, cuda_stream);
  });
}

extern "C" int byoc_shim_matmul_heuristic_count(byoc_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                                                int trans_a, int trans_b, int64_t batch_stride_a,
                                                int64_t batch_stride_b, int64_t batch_stride_c,
                                                size_t workspace_bytes) {
  static const char kFunction[] = "byoc_shim_matmul_heuristic_count";
  if (check_matmul_sizes(kFunction, batch, m, n, k) != 0) return -1;
  cudaDataType_t data_type, scale_type;
  cublasComputeType_t compute_type;
  if (dtype_size(dtype) == 0 || dtype == BYOC_BOOL) {
    fail(kUnsupportedDtype, kFunction, "dtype %s is not supported (expected a float or integer dtype)",
         dtype_name(dtype));
    return -1;
  }
  // Integers (the tiled kernel) and empty problems have one way to run.
  if (!lt_types(dtype, &data_type, &compute_type, &scale_type) || batch == 0 || m == 0 || n == 0 || k == 0) return 1;
  // Operands as the runtime places them: 256-byte aligned buffers.
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  PlanKey key;
  if (make_key(kFunction, dtype, batch, m, n, k, trans_a != 0, trans_b != 0, batch_stride_a, batch_stride_b,
               batch_stride_c, aligned, aligned, aligned, -1, workspace_bytes, &key) != 0)
    return -1;
  std::shared_ptr<const Plan> plan;
  if (get_plan(kFunction, key, &plan) != 0) return -1;
  return plan->heuristic_count;
}
