// What the engine's parts (engine.cc, engine_json.cc, engine_graph.cc, engine_plan.cc,
// engine_cpu.cc, engine_cuda.cu) share: the validated graph, the plan of steps and storage, and the
// executor interface. Not part of the C API; plain C++17 so nvcc and g++ both read it.
#ifndef BYOC_JSON_ENGINE_INTERNAL_H_
#define BYOC_JSON_ENGINE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "byoc_json_engine.h"

namespace byoc_json {

constexpr int kMaxRank = 8;
// Intermediates and outputs start at multiples of this in the workspace (cuBLASLt and
// vectorized kernels want 16; 256 keeps every tensor on its own cache lines).
constexpr size_t kStorageAlignment = 256;

// Thrown inside the engine, turned into a return code and last_error at the C boundary.
class EngineError : public std::exception {
 public:
  EngineError(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int code_;
  std::string message_;
};

// ------------------------------------------------------------------ the graph

enum class DType { kFloat32, kFloat16, kBFloat16 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

enum class NodeKind { kMatmul, kAdd, kBiasAdd, kGelu, kGeluTanh, kRelu, kReshape, kTranspose };
const char* node_kind_name(NodeKind kind);
struct KindInfo {
  const char* name;  // as the JSON writes it
  NodeKind kind;
  int num_inputs;
};
const KindInfo* find_node_kind(const std::string& name);  // nullptr for an unknown name

std::string shape_text(const std::vector<int64_t>& shape);  // "[2,3]"
size_t align_up(size_t value, size_t alignment);

struct TensorInfo {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t elements = 1;
  size_t bytes = 0;
};

enum class RefKind { kInput, kConstant, kNode };
struct ValueRef {
  RefKind kind = RefKind::kNode;
  int index = 0;
  bool operator==(const ValueRef& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const ValueRef& other) const { return !(*this == other); }
};
std::string ref_text(ValueRef ref);  // "input:0", "const:2", "node:7"

struct GraphInput {
  std::string name;
  TensorInfo tensor;
};

struct GraphConstant {
  std::string name;
  TensorInfo tensor;
  size_t offset = 0;  // into the weights blob
};

struct Node {
  int id = 0;
  NodeKind kind = NodeKind::kRelu;
  std::vector<ValueRef> inputs;
  std::vector<int> perm;  // transpose only
  TensorInfo tensor;
};

struct Graph {
  std::vector<GraphInput> inputs;
  std::vector<GraphConstant> constants;
  std::vector<Node> nodes;
  std::vector<ValueRef> outputs;  // all RefKind::kNode

  const TensorInfo& tensor(ValueRef ref) const;
};

// Parses and validates; throws EngineError (PARSE or SCHEMA) naming the place at fault.
Graph parse_graph(const char* text, size_t length, size_t weights_bytes);

struct Options {
  size_t workspace_limit = size_t(32) << 20;
  bool timed_selection = false;
  int candidates = 8;
  bool fuse_erf_gelu = false;
  bool tf32 = false;  // float32 matmuls on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
};
Options parse_options(const char* text);

// ------------------------------------------------------------------ the plan

enum class Activation { kNone, kRelu, kGelu, kGeluTanh };
const char* activation_name(Activation activation);

// numpy.matmul over dense row-major operands, as `batch` products of (M x K) @ (K x N).
// A batch stride of 0 means the operand is broadcast to every batch. When b is shared
// by all batches and a is not, the batches are folded into M (one larger product).
struct MatmulGeometry {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // in elements
};
// Throws EngineError(UNSUPPORTED) for batch broadcasts that are not all-or-nothing.
MatmulGeometry matmul_geometry(const Graph& graph, const Node& matmul);

// Element strides of `input` over the dims of `output_shape` (numpy broadcast: 0 where
// the input has size 1 or lacks the dim).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& input_shape,
                                       const std::vector<int64_t>& output_shape);

enum class StepKind { kMatmul, kAdd, kBiasAdd, kActivation, kReshape, kTranspose };

// One unit of execution. A matmul step may carry a fused epilogue:
//   D = activation(A @ B + bias) + residual     (residual only without activation)
// which cuBLASLt runs as one call: bias/activation by the epilogue, residual as C, beta=1.
struct Step {
  StepKind kind = StepKind::kMatmul;
  int node = 0;                     // the node whose value the step produces
  std::vector<int> fused_nodes;     // every node the step computes, in order
  std::vector<ValueRef> reads;      // matmul: a, b, [bias], [residual]; else the node inputs
  bool has_bias = false;
  bool has_residual = false;
  Activation activation = Activation::kNone;  // also the function of a kActivation step
};

struct FusionRules {
  bool fuse_epilogues = true;
  bool fuse_erf_gelu = true;  // false where the fused gelu would be the tanh approximation
};
std::vector<Step> plan_steps(const Graph& graph, const FusionRules& rules);

enum class StorageKind { kNone, kInput, kConstant, kWorkspace, kOutput };
struct Storage {
  StorageKind kind = StorageKind::kNone;
  int index = 0;      // input, constant or output index
  size_t offset = 0;  // workspace offset
};

struct StoragePlan {
  std::vector<Storage> node_storage;  // per node; kNone for nodes fused away
  std::vector<std::pair<int, int>> output_copies;  // (output index, node) copied at the end
  size_t arena_bytes = 0;
};
// Where every computed value lives: the caller's output buffer when the value (or a
// reshape of it) is an output, else a workspace range reused once its last reader ran.
// Reshapes alias their input.
StoragePlan plan_storage(const Graph& graph, const std::vector<Step>& steps);

// Resolves a value to its address for one run().
struct RunBuffers {
  void* const* inputs;
  void* const* outputs;
  const char* weights;
  char* workspace;
};
void* value_address(const Graph& graph, const StoragePlan& plan, const RunBuffers& buffers,
                    ValueRef ref);

std::string describe_steps(const Graph& graph, const std::vector<Step>& steps,
                           const StoragePlan& plan);

// ------------------------------------------------------------------ executors

class Executor {
 public:
  virtual ~Executor() = default;
  virtual size_t workspace_bytes() const = 0;
  virtual void run(void* const* inputs, void* const* outputs, void* workspace,
                   size_t workspace_bytes, void* stream) = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<Executor> make_cpu_executor(const Graph& graph, const void* weights,
                                            const Options& options);
#ifdef BYOC_JSON_ENGINE_WITH_CUDA
std::unique_ptr<Executor> make_cuda_executor(const Graph& graph, const void* weights,
                                             const Options& options);
#endif

}  // namespace byoc_json

#endif  // BYOC_JSON_ENGINE_INTERNAL_H_
