// The JSON runtime engine's plan: matmul epilogues fused into their matmuls (steps), and
// the storage of intermediates and outputs in one workspace (a first-fit range allocator
// over the steps' lifetimes).
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

#include "engine_internal.h"

namespace byoc_json {

// ================================================================== planning

MatmulGeometry matmul_geometry(const Graph& graph, const Node& matmul) {
  std::vector<int64_t> a = graph.tensor(matmul.inputs[0]).shape, b = graph.tensor(matmul.inputs[1]).shape;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  MatmulGeometry geometry;
  geometry.m = a[a.size() - 2];
  geometry.k = a.back();
  geometry.n = b.back();
  int64_t a_batches = 1, b_batches = 1;
  for (size_t i = 0; i + 2 < a.size(); ++i) a_batches *= a[i];
  for (size_t i = 0; i + 2 < b.size(); ++i) b_batches *= b[i];
  geometry.batch = std::max(a_batches, b_batches);
  // numpy broadcasting guarantees: an operand with as many batches as the result has
  // exactly the result's batch dims; one with a single batch is broadcast to all.
  int64_t out_batches = graph.nodes[matmul.id].tensor.elements / (geometry.m * geometry.n);
  for (int64_t count : {a_batches, b_batches})
    if (count != 1 && count != out_batches)
      throw EngineError(BYOC_JSON_ERROR_UNSUPPORTED,
                        "node:" + std::to_string(matmul.id) + " (matmul): partial broadcast of batch dims " +
                            shape_text(a) + " @ " + shape_text(b) + " is not supported");
  geometry.batch = out_batches;
  geometry.a_batch_stride = a_batches == 1 ? 0 : geometry.m * geometry.k;
  geometry.b_batch_stride = b_batches == 1 ? 0 : geometry.k * geometry.n;
  if (geometry.b_batch_stride == 0 && geometry.a_batch_stride != 0) {
    // a's batches are consecutive rows of one (batch*M x K) matrix: one larger product.
    geometry.m *= geometry.batch;
    geometry.batch = 1;
    geometry.a_batch_stride = 0;
  }
  return geometry;
}

std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& input_shape,
                                       const std::vector<int64_t>& output_shape) {
  std::vector<int64_t> strides(output_shape.size(), 0);
  size_t offset = output_shape.size() - input_shape.size();
  int64_t stride = 1;
  for (size_t i = input_shape.size(); i-- > 0;) {
    strides[offset + i] = input_shape[i] == 1 ? 0 : stride;
    stride *= input_shape[i];
  }
  return strides;
}

static Activation activation_of(NodeKind kind) {
  switch (kind) {
    case NodeKind::kRelu: return Activation::kRelu;
    case NodeKind::kGelu: return Activation::kGelu;
    case NodeKind::kGeluTanh: return Activation::kGeluTanh;
    default: return Activation::kNone;
  }
}

// The step of a node that no matmul chain absorbed: it runs alone.
static Step single_node_step(const Node& node) {
  Step step;
  step.node = node.id;
  step.fused_nodes = {node.id};
  step.reads = node.inputs;
  switch (node.kind) {
    case NodeKind::kAdd: step.kind = StepKind::kAdd; break;
    case NodeKind::kBiasAdd: step.kind = StepKind::kBiasAdd; break;
    case NodeKind::kReshape: step.kind = StepKind::kReshape; break;
    case NodeKind::kTranspose: step.kind = StepKind::kTranspose; break;
    case NodeKind::kGelu:
    case NodeKind::kGeluTanh:
    case NodeKind::kRelu:
      step.kind = StepKind::kActivation;
      step.activation = activation_of(node.kind);
      break;
    case NodeKind::kMatmul:
      break;  // unreachable: every matmul heads a chain
  }
  return step;
}

std::vector<Step> plan_steps(const Graph& graph, const FusionRules& rules) {
  const int count = int(graph.nodes.size());
  std::vector<int> uses(count, 0), last_consumer(count, -1);
  std::vector<bool> is_output(count, false), absorbed(count, false);
  for (const Node& node : graph.nodes)
    for (ValueRef ref : node.inputs)
      if (ref.kind == RefKind::kNode) {
        ++uses[ref.index];
        last_consumer[ref.index] = node.id;
      }
  for (ValueRef ref : graph.outputs) is_output[ref.index] = true;
  // The one node reading `node`'s value, when the value is needed nowhere else.
  auto sole_consumer = [&](int node) {
    return (uses[node] == 1 && !is_output[node] && !absorbed[last_consumer[node]]) ? last_consumer[node] : -1;
  };
  auto node_ref = [](int index) { return ValueRef{RefKind::kNode, index}; };

  // Matmul chains: matmul [-> bias_add] [-> activation | -> residual add]. Each chain
  // becomes one step, placed at its last node so that every value it reads exists.
  std::vector<int> chain_at_tail(count, -1);
  std::vector<Step> chains;
  for (const Node& node : graph.nodes) {
    if (node.kind != NodeKind::kMatmul || absorbed[node.id]) continue;
    Step step;
    step.kind = StepKind::kMatmul;
    step.reads = node.inputs;
    step.fused_nodes = {node.id};
    int tail = node.id;
    if (rules.fuse_epilogues) {
      int next = sole_consumer(tail);
      if (next >= 0 && graph.nodes[next].kind == NodeKind::kBiasAdd && graph.nodes[next].inputs[0] == node_ref(tail)) {
        step.has_bias = true;
        step.reads.push_back(graph.nodes[next].inputs[1]);
        step.fused_nodes.push_back(next);
        tail = next;
        next = sole_consumer(tail);
      }
      Activation activation = next >= 0 ? activation_of(graph.nodes[next].kind) : Activation::kNone;
      if (activation == Activation::kGelu && !rules.fuse_erf_gelu) activation = Activation::kNone;
      if (activation != Activation::kNone) {
        step.activation = activation;
        step.fused_nodes.push_back(next);
        tail = next;
      } else if (next >= 0 && graph.nodes[next].kind == NodeKind::kAdd) {
        // A residual add: D = A @ B (+ bias) + R, with R exactly D's shape (no broadcast).
        const Node& add = graph.nodes[next];
        ValueRef other = add.inputs[0] == node_ref(tail) ? add.inputs[1] : add.inputs[0];
        if (other != node_ref(tail) && graph.tensor(other).shape == add.tensor.shape &&
            graph.nodes[tail].tensor.shape == add.tensor.shape) {
          step.has_residual = true;
          step.reads.push_back(other);
          step.fused_nodes.push_back(next);
          tail = next;
        }
      }
    }
    for (size_t i = 1; i < step.fused_nodes.size(); ++i) absorbed[step.fused_nodes[i]] = true;
    step.node = tail;
    chain_at_tail[tail] = int(chains.size());
    chains.push_back(std::move(step));
  }

  std::vector<Step> steps;
  for (const Node& node : graph.nodes) {
    if (chain_at_tail[node.id] >= 0) {
      steps.push_back(std::move(chains[chain_at_tail[node.id]]));
      continue;
    }
    if (absorbed[node.id] || node.kind == NodeKind::kMatmul) continue;  // inside a chain, emitted at its tail
    steps.push_back(single_node_step(node));
  }
  return steps;
}

// First-fit allocation of workspace ranges, in kStorageAlignment units.
class RangeAllocator {
 public:
  size_t allocate(size_t bytes) {
    bytes = std::max(align_up(bytes, kStorageAlignment), kStorageAlignment);
    size_t offset = 0;
    auto position = live_.begin();
    for (; position != live_.end(); ++position) {
      if (position->first >= offset + bytes) break;  // the gap before this range fits
      offset = std::max(offset, position->first + position->second);
    }
    live_.insert(position, {offset, bytes});
    peak_ = std::max(peak_, offset + bytes);
    return offset;
  }
  void release(size_t offset) {
    for (auto it = live_.begin(); it != live_.end(); ++it)
      if (it->first == offset) {
        live_.erase(it);
        return;
      }
  }
  size_t peak() const { return peak_; }

 private:
  std::vector<std::pair<size_t, size_t>> live_;  // (offset, bytes), sorted by offset
  size_t peak_ = 0;
};

StoragePlan plan_storage(const Graph& graph, const std::vector<Step>& steps) {
  const int count = int(graph.nodes.size());
  StoragePlan plan;
  plan.node_storage.assign(count, Storage{});

  // A reshape is its input's bytes: follow reshape chains to the value that owns them.
  std::vector<ValueRef> owner(count);
  for (const Node& node : graph.nodes) {
    ValueRef source = node.inputs.empty() ? ValueRef{} : node.inputs[0];
    owner[node.id] = node.kind != NodeKind::kReshape ? ValueRef{RefKind::kNode, node.id}
                     : source.kind == RefKind::kNode ? owner[source.index]
                                                     : source;
  }

  // An output's owner writes straight into the caller's buffer, unless another output
  // claimed that owner first or the owner is an input or constant: then it is copied.
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    ValueRef value_owner = owner[graph.outputs[i].index];
    if (value_owner.kind == RefKind::kNode && plan.node_storage[value_owner.index].kind == StorageKind::kNone)
      plan.node_storage[value_owner.index] = Storage{StorageKind::kOutput, int(i), 0};
    else
      plan.output_copies.emplace_back(int(i), graph.outputs[i].index);
  }

  const int never = -1, forever = int(steps.size());
  std::vector<int> last_use(count, never);
  for (int t = 0; t < int(steps.size()); ++t)
    for (ValueRef ref : steps[t].reads)
      if (ref.kind == RefKind::kNode && owner[ref.index].kind == RefKind::kNode)
        last_use[owner[ref.index].index] = t;
  for (const auto& copy : plan.output_copies) {
    ValueRef value_owner = owner[copy.second];
    if (value_owner.kind == RefKind::kNode) last_use[value_owner.index] = forever;
  }

  RangeAllocator allocator;
  std::vector<std::vector<int>> release_after(steps.size());
  for (int t = 0; t < int(steps.size()); ++t) {
    const Step& step = steps[t];
    Storage& storage = plan.node_storage[step.node];
    // Reshapes own no bytes; a value bound to an output buffer needs no workspace.
    if (step.kind != StepKind::kReshape && storage.kind == StorageKind::kNone) {
      storage = Storage{StorageKind::kWorkspace, 0, allocator.allocate(graph.nodes[step.node].tensor.bytes)};
      // A value nobody reads is released right after the step that writes it.
      int release = std::max(last_use[step.node], t);
      if (release < forever) release_after[release].push_back(step.node);
    }
    // Release after allocating: a step never writes over a value it reads.
    for (int node : release_after[t]) allocator.release(plan.node_storage[node].offset);
  }
  plan.arena_bytes = allocator.peak();

  for (const Node& node : graph.nodes) {
    if (node.kind != NodeKind::kReshape) continue;
    ValueRef value_owner = owner[node.id];
    if (value_owner.kind == RefKind::kNode)
      plan.node_storage[node.id] = plan.node_storage[value_owner.index];
    else
      plan.node_storage[node.id] =
          Storage{value_owner.kind == RefKind::kInput ? StorageKind::kInput : StorageKind::kConstant, value_owner.index, 0};
  }
  return plan;
}

void* value_address(const Graph& graph, const StoragePlan& plan, const RunBuffers& buffers, ValueRef ref) {
  Storage storage;
  if (ref.kind == RefKind::kInput) storage = Storage{StorageKind::kInput, ref.index, 0};
  else if (ref.kind == RefKind::kConstant) storage = Storage{StorageKind::kConstant, ref.index, 0};
  else storage = plan.node_storage[ref.index];
  switch (storage.kind) {
    case StorageKind::kInput: return buffers.inputs[storage.index];
    case StorageKind::kConstant: return const_cast<char*>(buffers.weights) + graph.constants[storage.index].offset;
    case StorageKind::kWorkspace: return buffers.workspace + storage.offset;
    case StorageKind::kOutput: return buffers.outputs[storage.index];
    case StorageKind::kNone: break;
  }
  return nullptr;
}

std::string describe_steps(const Graph& graph, const std::vector<Step>& steps, const StoragePlan& plan) {
  std::ostringstream out;
  for (const Step& step : steps) {
    out << "step node:" << step.node << " ";
    if (step.kind == StepKind::kMatmul) {
      out << "matmul";
      if (step.has_bias) out << "+bias";
      if (step.activation != Activation::kNone) out << "+" << activation_name(step.activation);
      if (step.has_residual) out << "+residual";
    } else {
      out << node_kind_name(graph.nodes[step.node].kind);
    }
    out << " fused=[";
    for (size_t i = 0; i < step.fused_nodes.size(); ++i) out << (i ? "," : "") << step.fused_nodes[i];
    out << "] reads=[";
    for (size_t i = 0; i < step.reads.size(); ++i) out << (i ? "," : "") << ref_text(step.reads[i]);
    const Storage& storage = plan.node_storage[step.node];
    out << "] -> ";
    switch (storage.kind) {
      case StorageKind::kWorkspace: out << "workspace+" << storage.offset; break;
      case StorageKind::kOutput: out << "output:" << storage.index; break;
      case StorageKind::kInput: out << "input:" << storage.index; break;
      case StorageKind::kConstant: out << "const:" << storage.index; break;
      case StorageKind::kNone: out << "none"; break;
    }
    out << "\n";
  }
  for (const auto& copy : plan.output_copies) out << "copy node:" << copy.second << " -> output:" << copy.first << "\n";
  out << "arena_bytes=" << plan.arena_bytes << "\n";
  return out.str();
}

}  // namespace byoc_json
