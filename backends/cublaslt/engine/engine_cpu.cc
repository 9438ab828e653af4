// The JSON runtime engine's CPU executor: the plan's steps in float, 16-bit floats rounded
// as the reference interpreter rounds them.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <utility>

#include "byoc_float16.h"  // byoc/runtime: the 16-bit float conversions of every CPU path
#include "engine_internal.h"

namespace byoc_json {

// ================================================================== CPU execution

// 16-bit floats as their bits; the conversions are byoc/runtime/byoc_float16.h's (round to
// nearest even, as NumPy and ml_dtypes do, and as every other CPU path), so the CPU path
// rounds exactly like the reference interpreter.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

static inline float to_float(float value) { return value; }

static inline float to_float(Half value) { return byoc_float16::half_to_float(value.bits); }

static inline float to_float(BFloat16 value) { return byoc_float16::bfloat16_to_float(value.bits); }

template <typename T>
static inline T from_float(float value);

template <>
inline float from_float<float>(float value) { return value; }

template <>
inline Half from_float<Half>(float value) { return Half{byoc_float16::float_to_half(value)}; }

template <>
inline BFloat16 from_float<BFloat16>(float value) { return BFloat16{byoc_float16::float_to_bfloat16(value)}; }

static inline float activate(Activation activation, float value) {
  switch (activation) {
    case Activation::kNone: return value;
    case Activation::kRelu: return value < 0.0f ? 0.0f : value;  // keeps NaN, like numpy.maximum
    case Activation::kGelu: {
      double x = value;
      return float(0.5 * x * std::erfc(-x / std::sqrt(2.0)));
    }
    case Activation::kGeluTanh: {
      // 0.5 x (1 + tanh(u)) == x * sigmoid(2u), without cancellation for x << 0
      double x = value, u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      double e = std::exp(-std::fabs(2 * u));
      double sigmoid = u >= 0 ? 1 / (1 + e) : e / (1 + e);
      return float(x * sigmoid);
    }
  }
  return value;
}

// What a CPU step needs beyond the Step itself, computed once at create().
struct CpuStepPlan {
  MatmulGeometry geometry;
  std::vector<int64_t> shape;                    // output shape (add, transpose)
  std::vector<int64_t> strides_a, strides_b;     // input element strides over `shape`
};

// Walks the elements of `shape` in row-major order with each input's offset.
template <typename Visit>
static void for_each_element(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides_a,
                             const std::vector<int64_t>* strides_b, Visit visit) {
  const size_t rank = shape.size();
  int64_t index[kMaxRank] = {0};
  int64_t offset_a = 0, offset_b = 0, total = 1;
  for (int64_t dim : shape) total *= dim;
  for (int64_t linear = 0; linear < total; ++linear) {
    visit(linear, offset_a, offset_b);
    for (size_t axis = rank; axis-- > 0;) {  // odometer step
      ++index[axis];
      offset_a += strides_a[axis];
      if (strides_b) offset_b += (*strides_b)[axis];
      if (index[axis] < shape[axis]) break;
      offset_a -= strides_a[axis] * shape[axis];
      if (strides_b) offset_b -= (*strides_b)[axis] * shape[axis];
      index[axis] = 0;
    }
  }
}

template <typename T>
static void cpu_matmul(const Step& step, const MatmulGeometry& g, const T* a, const T* b, const T* bias,
                       const T* residual, T* out, float* accumulator) {
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    const T* a_batch = a + batch * g.a_batch_stride;
    const T* b_batch = b + batch * g.b_batch_stride;
    T* out_batch = out + batch * g.m * g.n;
    const T* residual_batch = residual ? residual + batch * g.m * g.n : nullptr;
    for (int64_t row = 0; row < g.m; ++row) {
      std::fill(accumulator, accumulator + g.n, 0.0f);
      for (int64_t inner = 0; inner < g.k; ++inner) {
        float a_value = to_float(a_batch[row * g.k + inner]);
        const T* b_row = b_batch + inner * g.n;
        for (int64_t column = 0; column < g.n; ++column) accumulator[column] += a_value * to_float(b_row[column]);
      }
      for (int64_t column = 0; column < g.n; ++column) {
        float value = accumulator[column];
        if (bias) value += to_float(bias[column]);
        value = activate(step.activation, value);
        if (residual_batch) value += to_float(residual_batch[row * g.n + column]);
        out_batch[row * g.n + column] = from_float<T>(value);
      }
    }
  }
}

class CpuExecutor : public Executor {
 public:
  CpuExecutor(const Graph& graph, const void* weights)
      : graph_(graph), weights_(static_cast<const char*>(weights)) {
    steps_ = plan_steps(graph, FusionRules{true, true});  // the CPU computes gelu exactly either way
    plan_ = plan_storage(graph, steps_);
    size_t widest_row = 0;
    for (const Step& step : steps_) {
      CpuStepPlan step_plan;
      const Node& node = graph.nodes[step.node];
      if (step.kind == StepKind::kMatmul) {
        step_plan.geometry = matmul_geometry(graph, graph.nodes[step.fused_nodes[0]]);
        widest_row = std::max(widest_row, size_t(step_plan.geometry.n));
      } else if (step.kind == StepKind::kAdd) {
        step_plan.shape = node.tensor.shape;
        step_plan.strides_a = broadcast_strides(graph.tensor(step.reads[0]).shape, node.tensor.shape);
        step_plan.strides_b = broadcast_strides(graph.tensor(step.reads[1]).shape, node.tensor.shape);
      } else if (step.kind == StepKind::kTranspose) {
        const std::vector<int64_t>& in_shape = graph.tensor(step.reads[0]).shape;
        std::vector<int64_t> in_strides = broadcast_strides(in_shape, in_shape);
        step_plan.shape = node.tensor.shape;
        for (int axis : node.perm) step_plan.strides_a.push_back(in_shape[axis] == 1 ? 0 : in_strides[axis]);
      }
      step_plans_.push_back(std::move(step_plan));
    }
    // The matmul accumulator row lives in the workspace, after the intermediates, so
    // that run() allocates nothing and two runs with two workspaces can overlap.
    accumulator_offset_ = align_up(plan_.arena_bytes, kStorageAlignment);
    workspace_bytes_ = accumulator_offset_ + widest_row * sizeof(float);
  }

  size_t workspace_bytes() const override { return workspace_bytes_; }

  std::string describe() const override {
    return "device=cpu\n" + describe_steps(graph_, steps_, plan_) + "workspace_bytes=" +
           std::to_string(workspace_bytes_) + "\n";
  }

  void run(void* const* inputs, void* const* outputs, void* workspace, size_t workspace_bytes, void*) override {
    RunBuffers buffers{inputs, outputs, weights_, static_cast<char*>(workspace)};
    for (size_t i = 0; i < steps_.size(); ++i) {
      switch (graph_.nodes[steps_[i].node].tensor.dtype) {
        case DType::kFloat32: run_step<float>(steps_[i], step_plans_[i], buffers); break;
        case DType::kFloat16: run_step<Half>(steps_[i], step_plans_[i], buffers); break;
        case DType::kBFloat16: run_step<BFloat16>(steps_[i], step_plans_[i], buffers); break;
      }
    }
    for (const auto& copy : plan_.output_copies) {
      const void* source = value_address(graph_, plan_, buffers, ValueRef{RefKind::kNode, copy.second});
      std::memcpy(outputs[copy.first], source, graph_.nodes[copy.second].tensor.bytes);
    }
    (void)workspace_bytes;
  }

 private:
  template <typename T>
  void run_step(const Step& step, const CpuStepPlan& step_plan, const RunBuffers& buffers) {
    auto address = [&](ValueRef ref) { return static_cast<T*>(value_address(graph_, plan_, buffers, ref)); };
    T* out = address(ValueRef{RefKind::kNode, step.node});
    const Node& node = graph_.nodes[step.node];
    switch (step.kind) {
      case StepKind::kMatmul: {
        size_t next = 2;
        const T* bias = step.has_bias ? address(step.reads[next++]) : nullptr;
        const T* residual = step.has_residual ? address(step.reads[next++]) : nullptr;
        float* accumulator = reinterpret_cast<float*>(buffers.workspace + accumulator_offset_);
        cpu_matmul<T>(step, step_plan.geometry, address(step.reads[0]), address(step.reads[1]), bias, residual, out,
                      accumulator);
        break;
      }
      case StepKind::kAdd: {
        const T* a = address(step.reads[0]);
        const T* b = address(step.reads[1]);
        for_each_element(step_plan.shape, step_plan.strides_a, &step_plan.strides_b,
                         [&](int64_t i, int64_t ia, int64_t ib) { out[i] = from_float<T>(to_float(a[ia]) + to_float(b[ib])); });
        break;
      }
      case StepKind::kBiasAdd: {
        const T* x = address(step.reads[0]);
        const T* bias = address(step.reads[1]);
        const int64_t width = node.tensor.shape.back();
        for (int64_t i = 0; i < node.tensor.elements; ++i) out[i] = from_float<T>(to_float(x[i]) + to_float(bias[i % width]));
        break;
      }
      case StepKind::kActivation: {
        const T* x = address(step.reads[0]);
        for (int64_t i = 0; i < node.tensor.elements; ++i) out[i] = from_float<T>(activate(step.activation, to_float(x[i])));
        break;
      }
      case StepKind::kTranspose: {
        const T* x = address(step.reads[0]);
        for_each_element(step_plan.shape, step_plan.strides_a, nullptr,
                         [&](int64_t i, int64_t ix, int64_t) { out[i] = x[ix]; });
        break;
      }
      case StepKind::kReshape:
        break;  // an alias: the plan gave it its input's bytes
    }
  }

  const Graph& graph_;
  const char* weights_;
  std::vector<Step> steps_;
  std::vector<CpuStepPlan> step_plans_;
  StoragePlan plan_;
  size_t accumulator_offset_ = 0;
  size_t workspace_bytes_ = 0;
};

std::unique_ptr<Executor> make_cpu_executor(const Graph& graph, const void* weights, const Options&) {
  return std::unique_ptr<Executor>(new CpuExecutor(graph, weights));
}

}  // namespace byoc_json
