// The JSON runtime engine: the small helpers every part shares, and the C API. The parts:
// engine_json.cc (the JSON reader), engine_graph.cc (schema, shapes, options),
// engine_plan.cc (fusion and storage), engine_cpu.cc (the CPU executor) and
// engine_cuda.cu (the CUDA executor; build everything with -DBYOC_JSON_ENGINE_WITH_CUDA
// for it). Everything that can fail at create() throws EngineError; the C functions at
// the end turn it into a return code and a thread-local message.
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

// ================================================================== small helpers

size_t dtype_size(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 2;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

constexpr KindInfo kKinds[] = {
    {"matmul", NodeKind::kMatmul, 2},   {"add", NodeKind::kAdd, 2},
    {"bias_add", NodeKind::kBiasAdd, 2}, {"gelu", NodeKind::kGelu, 1},
    {"gelu_tanh", NodeKind::kGeluTanh, 1}, {"relu", NodeKind::kRelu, 1},
    {"reshape", NodeKind::kReshape, 1}, {"transpose", NodeKind::kTranspose, 1},
};

const KindInfo* find_node_kind(const std::string& name) {
  for (const KindInfo& info : kKinds)
    if (name == info.name) return &info;
  return nullptr;
}

const char* node_kind_name(NodeKind kind) {
  for (const KindInfo& info : kKinds)
    if (info.kind == kind) return info.name;
  return "?";
}

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::kNone: return "none";
    case Activation::kRelu: return "relu";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
  }
  return "?";
}

std::string ref_text(ValueRef ref) {
  const char* prefix = ref.kind == RefKind::kInput ? "input:" : ref.kind == RefKind::kConstant ? "const:" : "node:";
  return prefix + std::to_string(ref.index);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

const TensorInfo& Graph::tensor(ValueRef ref) const {
  switch (ref.kind) {
    case RefKind::kInput: return inputs[ref.index].tensor;
    case RefKind::kConstant: return constants[ref.index].tensor;
    case RefKind::kNode: break;
  }
  return nodes[ref.index].tensor;
}

size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace byoc_json

// ================================================================== C API

namespace {

// A fixed buffer: a thread_local with a destructor would keep the model library loaded
// until the thread exits (glibc), so closed models would stay mapped.
thread_local char last_error[2048] = "";

struct Engine {
  byoc_json::Graph graph;
  std::unique_ptr<byoc_json::Executor> executor;  // declared after graph: destroyed first
  std::string description;
};

int fail(int code, const std::string& message) {
  std::snprintf(last_error, sizeof(last_error), "%s", message.empty() ? "unknown error" : message.c_str());
  return code;
}

// Runs `body`, turning whatever it throws into a return code and last_error.
template <typename Body>
int guarded(const char* function, Body body) {
  try {
    body();
    return BYOC_JSON_OK;
  } catch (const byoc_json::EngineError& error) {
    return fail(error.code(), std::string(function) + ": " + error.what());
  } catch (const std::bad_alloc&) {
    return fail(BYOC_JSON_ERROR_INTERNAL, std::string(function) + ": out of host memory");
  } catch (const std::exception& error) {
    return fail(BYOC_JSON_ERROR_INTERNAL, std::string(function) + ": " + error.what());
  } catch (...) {
    return fail(BYOC_JSON_ERROR_INTERNAL, std::string(function) + ": unknown exception");
  }
}

}  // namespace

extern "C" {

int byoc_json_engine_create(const char* json, size_t json_len, const void* weights_base, size_t weights_bytes,
                            int device_kind, const char* options, void** engine) {
  using byoc_json::EngineError;
  if (engine) *engine = nullptr;
  return guarded("byoc_json_engine_create", [&] {
    auto started = std::chrono::steady_clock::now();
    if (!engine) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "engine (the result pointer) is NULL");
    if (!json) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "json is NULL");
    if (!weights_base && weights_bytes != 0)
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "weights_base is NULL but weights_bytes is not 0");
    if (device_kind != BYOC_JSON_DEVICE_CPU && device_kind != BYOC_JSON_DEVICE_CUDA)
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT,
                        "device_kind " + std::to_string(device_kind) + " is not 1 (cpu) or 2 (cuda)");
    byoc_json::Options parsed_options = byoc_json::parse_options(options);
    std::unique_ptr<Engine> created(new Engine);
    created->graph = byoc_json::parse_graph(json, json_len, weights_bytes);
    if (device_kind == BYOC_JSON_DEVICE_CPU) {
      created->executor = byoc_json::make_cpu_executor(created->graph, weights_base, parsed_options);
    } else {
#ifdef BYOC_JSON_ENGINE_WITH_CUDA
      created->executor = byoc_json::make_cuda_executor(created->graph, weights_base, parsed_options);
#else
      throw EngineError(BYOC_JSON_ERROR_UNSUPPORTED, "this engine was built without CUDA (device_kind 2)");
#endif
    }
    double milliseconds =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    created->description = created->executor->describe() + "create_ms=" + std::to_string(milliseconds) + "\n";
    *engine = created.release();
  });
}

int byoc_json_engine_run(void* engine, void* const* inputs, void* const* outputs, void* workspace,
                         size_t workspace_bytes, void* stream) {
  using byoc_json::EngineError;
  return guarded("byoc_json_engine_run", [&] {
    if (!engine) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "engine is NULL");
    Engine* self = static_cast<Engine*>(engine);
    const size_t needed = self->executor->workspace_bytes();
    if (workspace_bytes < needed || (needed > 0 && !workspace))
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "workspace of " + std::to_string(workspace_bytes) +
                                                      " bytes given, " + std::to_string(needed) + " needed");
    if ((!inputs && !self->graph.inputs.empty()) || !outputs)
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "inputs or outputs is NULL");
    for (size_t i = 0; i < self->graph.inputs.size(); ++i)
      if (!inputs[i]) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "input " + std::to_string(i) + " is NULL");
    for (size_t i = 0; i < self->graph.outputs.size(); ++i)
      if (!outputs[i]) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "output " + std::to_string(i) + " is NULL");
    self->executor->run(inputs, outputs, workspace, workspace_bytes, stream);
  });
}

int byoc_json_engine_check_interface(void* engine, size_t num_inputs, const size_t* input_bytes,
                                     size_t num_outputs, const size_t* output_bytes) {
  using byoc_json::EngineError;
  return guarded("byoc_json_engine_check_interface", [&] {
    if (!engine) throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "engine is NULL");
    if ((num_inputs && !input_bytes) || (num_outputs && !output_bytes))
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "input_bytes or output_bytes is NULL");
    const byoc_json::Graph& graph = static_cast<Engine*>(engine)->graph;
    if (graph.inputs.size() != num_inputs || graph.outputs.size() != num_outputs)
      throw EngineError(BYOC_JSON_ERROR_SCHEMA,
                        "the graph has " + std::to_string(graph.inputs.size()) + " inputs and " +
                            std::to_string(graph.outputs.size()) + " outputs; the caller passes " +
                            std::to_string(num_inputs) + " and " + std::to_string(num_outputs));
    for (size_t i = 0; i < num_inputs; ++i)
      if (graph.inputs[i].tensor.bytes != input_bytes[i])
        throw EngineError(BYOC_JSON_ERROR_SCHEMA, "the graph's input " + std::to_string(i) + " ('" +
                                                      graph.inputs[i].name + "') is " +
                                                      std::to_string(graph.inputs[i].tensor.bytes) +
                                                      " bytes; the caller passes " + std::to_string(input_bytes[i]));
    for (size_t i = 0; i < num_outputs; ++i)
      if (graph.tensor(graph.outputs[i]).bytes != output_bytes[i])
        throw EngineError(BYOC_JSON_ERROR_SCHEMA, "the graph's output " + std::to_string(i) + " is " +
                                                      std::to_string(graph.tensor(graph.outputs[i]).bytes) +
                                                      " bytes; the caller passes " + std::to_string(output_bytes[i]));
  });
}

size_t byoc_json_engine_workspace(void* engine) {
  return engine ? static_cast<Engine*>(engine)->executor->workspace_bytes() : 0;
}

const char* byoc_json_engine_describe(void* engine) {
  return engine ? static_cast<Engine*>(engine)->description.c_str() : "";
}

void byoc_json_engine_destroy(void* engine) {
  delete static_cast<Engine*>(engine);
}

const char* byoc_json_engine_last_error(void) {
  return last_error;
}

}  // extern "C"
