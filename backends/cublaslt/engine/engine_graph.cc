// The JSON runtime engine's graph reader: the document's schema (SCHEMA.md), checked
// value by value, every shape inferred and compared with the declared one; and the
// options string. Nothing here trusts the JSON: sizes are checked before they are used,
// arithmetic on them cannot overflow.
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
#include "engine_json.h"

namespace byoc_json {

// Generous for real subgraphs (BERT-large's largest is a few hundred nodes), small
// enough that a hostile document cannot exhaust memory.
constexpr size_t kMaxInputs = 1024;
constexpr size_t kMaxOutputs = 1024;
constexpr size_t kMaxConstants = 1 << 16;
constexpr size_t kMaxNodes = 1 << 16;
constexpr int64_t kMaxTensorBytes = int64_t(1) << 36;  // 64 GiB: more than any GPU holds
constexpr int64_t kMaxTotalBytes = int64_t(1) << 38;   // all node results together

// ================================================================== schema

[[noreturn]] static void schema_error(const std::string& path, const std::string& what) {
  throw EngineError(BYOC_JSON_ERROR_SCHEMA, "graph schema error at " + path + ": " + what);
}

static void expect_type(const JsonValue& value, JsonValue::Type type, const std::string& path) {
  if (value.type != type)
    schema_error(path, std::string("expected ") + json_type_name(type) + ", got " + json_type_name(value.type));
}

// `object` must hold exactly the keys in `keys` (the schema has no optional keys, so an
// unknown key is a typo or a newer version, never something to skip).
static void expect_keys(const JsonValue& object, std::initializer_list<const char*> keys, const std::string& path) {
  expect_type(object, JsonValue::Type::kObject, path);
  for (const auto& member : object.members) {
    bool known = false;
    for (const char* key : keys) known = known || member.first == key;
    if (!known) schema_error(path, "unknown key \"" + member.first + "\"");
  }
  for (const char* key : keys) {
    bool present = false;
    for (const auto& member : object.members) present = present || member.first == key;
    if (!present) schema_error(path, std::string("missing key \"") + key + "\"");
  }
}

static const JsonValue& member(const JsonValue& object, const char* key) {
  for (const auto& entry : object.members)
    if (entry.first == key) return entry.second;
  throw EngineError(BYOC_JSON_ERROR_INTERNAL, std::string("member ") + key + " looked up before expect_keys");
}

static int64_t read_integer(const JsonValue& value, const std::string& path, int64_t min, int64_t max) {
  if (value.type != JsonValue::Type::kNumber || !value.is_integer)
    schema_error(path, std::string("expected an integer, got ") +
                           (value.type == JsonValue::Type::kNumber ? "a non-integer number" : json_type_name(value.type)));
  if (value.integer < min || value.integer > max)
    schema_error(path, "integer " + std::to_string(value.integer) + " is outside " + std::to_string(min) + ".." +
                           std::to_string(max));
  return value.integer;
}

static const std::string& read_name(const JsonValue& value, const std::string& path) {
  expect_type(value, JsonValue::Type::kString, path);
  if (value.text.empty()) schema_error(path, "expected a non-empty name");
  return value.text;
}

static const std::vector<JsonValue>& read_array(const JsonValue& value, const std::string& path, size_t min_items,
                                                size_t max_items) {
  expect_type(value, JsonValue::Type::kArray, path);
  if (value.items.size() < min_items || value.items.size() > max_items)
    schema_error(path, "expected " + std::to_string(min_items) + ".." + std::to_string(max_items) + " items, got " +
                           std::to_string(value.items.size()));
  return value.items;
}

static DType read_dtype(const JsonValue& value, const std::string& path) {
  expect_type(value, JsonValue::Type::kString, path);
  if (value.text == "float32") return DType::kFloat32;
  if (value.text == "float16") return DType::kFloat16;
  if (value.text == "bfloat16") return DType::kBFloat16;
  schema_error(path, "unknown dtype \"" + value.text + "\"; expected float32, float16 or bfloat16");
}

static TensorInfo make_tensor(DType dtype, const std::vector<int64_t>& shape, const std::string& path) {
  TensorInfo tensor;
  tensor.dtype = dtype;
  tensor.shape = shape;
  const int64_t max_elements = kMaxTensorBytes / int64_t(dtype_size(dtype));
  for (int64_t dim : shape) {
    // dim >= 1 and elements <= max_elements, so this test cannot overflow.
    if (dim > max_elements / tensor.elements)
      schema_error(path, "shape " + shape_text(shape) + " is larger than the limit of " +
                             std::to_string(kMaxTensorBytes) + " bytes per tensor");
    tensor.elements *= dim;
  }
  tensor.bytes = size_t(tensor.elements) * dtype_size(dtype);
  return tensor;
}

static TensorInfo read_tensor(const JsonValue& object, const std::string& path) {
  DType dtype = read_dtype(member(object, "dtype"), path + ".dtype");
  const auto& dims = read_array(member(object, "shape"), path + ".shape", 0, kMaxRank);
  std::vector<int64_t> shape;
  for (size_t i = 0; i < dims.size(); ++i)
    shape.push_back(read_integer(dims[i], path + ".shape[" + std::to_string(i) + "]", 1,
                                 std::numeric_limits<int64_t>::max()));
  return make_tensor(dtype, shape, path + ".shape");
}

// "input:N", "const:N" or "node:N" with N a decimal index without leading zeros.
static ValueRef read_ref(const JsonValue& value, const std::string& path, const Graph& graph, int current_node) {
  expect_type(value, JsonValue::Type::kString, path);
  const std::string& text = value.text;
  size_t colon = text.find(':');
  if (colon == std::string::npos) schema_error(path, "reference \"" + text + "\" is not input:N, const:N or node:N");
  std::string prefix = text.substr(0, colon), digits = text.substr(colon + 1);
  ValueRef ref;
  size_t count;
  if (prefix == "input") {
    ref.kind = RefKind::kInput;
    count = graph.inputs.size();
  } else if (prefix == "const") {
    ref.kind = RefKind::kConstant;
    count = graph.constants.size();
  } else if (prefix == "node") {
    ref.kind = RefKind::kNode;
    count = size_t(current_node);  // only earlier nodes: the graph is acyclic by construction
  } else {
    schema_error(path, "reference \"" + text + "\" is not input:N, const:N or node:N");
  }
  bool digits_ok = !digits.empty() && digits.size() <= 9 && (digits == "0" || digits[0] != '0') &&
                   std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_ok) schema_error(path, "reference \"" + text + "\" has no valid index");
  long index = std::stol(digits);
  if (size_t(index) >= count) {
    if (ref.kind == RefKind::kNode)
      schema_error(path, "reference \"" + text + "\" is not an earlier node (node ids must be in order, no cycles)");
    schema_error(path, "reference \"" + text + "\" is out of range (" + std::to_string(count) + " defined)");
  }
  ref.index = int(index);
  return ref;
}

// ------------------------------------------------------------------ shape inference

static std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                            const std::string& path) {
  size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      schema_error(path, "shapes " + shape_text(a) + " and " + shape_text(b) + " do not broadcast");
    out[i] = std::max(da, db);
  }
  return out;
}

// The result shape of node `node` from its inputs, following the byoc op semantics.
static std::vector<int64_t> infer_shape(const Graph& graph, const Node& node, const std::string& path) {
  const TensorInfo& x = graph.tensor(node.inputs[0]);
  switch (node.kind) {
    case NodeKind::kMatmul: {
      const TensorInfo& w = graph.tensor(node.inputs[1]);
      if (x.shape.empty() || w.shape.empty()) schema_error(path, "matmul inputs must have rank >= 1");
      std::vector<int64_t> a = x.shape, b = w.shape;
      if (a.size() == 1) a.insert(a.begin(), 1);
      if (b.size() == 1) b.push_back(1);
      if (a.back() != b[b.size() - 2])
        schema_error(path, "matmul inner dimensions differ: " + shape_text(x.shape) + " @ " + shape_text(w.shape));
      std::vector<int64_t> batch = broadcast_shape(std::vector<int64_t>(a.begin(), a.end() - 2),
                                                   std::vector<int64_t>(b.begin(), b.end() - 2), path);
      if (x.shape.size() > 1) batch.push_back(a[a.size() - 2]);
      if (w.shape.size() > 1) batch.push_back(b.back());
      return batch;
    }
    case NodeKind::kAdd:
      return broadcast_shape(x.shape, graph.tensor(node.inputs[1]).shape, path);
    case NodeKind::kBiasAdd: {
      const TensorInfo& bias = graph.tensor(node.inputs[1]);
      bool vector_like = !bias.shape.empty() && !x.shape.empty() && bias.shape.size() <= x.shape.size() &&
                         bias.shape.back() == x.shape.back() && bias.elements == bias.shape.back();
      if (!vector_like)
        schema_error(path, "bias_add needs a bias of shape [N] or [1,...,1,N] with N the last dim of x; got x " +
                               shape_text(x.shape) + ", bias " + shape_text(bias.shape));
      return x.shape;
    }
    case NodeKind::kGelu:
    case NodeKind::kGeluTanh:
    case NodeKind::kRelu:
      return x.shape;
    case NodeKind::kReshape:
      if (node.tensor.elements != x.elements)
        schema_error(path, "reshape from " + shape_text(x.shape) + " (" + std::to_string(x.elements) +
                               " elements) to " + shape_text(node.tensor.shape) + " (" +
                               std::to_string(node.tensor.elements) + " elements)");
      return node.tensor.shape;
    case NodeKind::kTranspose: {
      if (node.perm.size() != x.shape.size())
        schema_error(path, "transpose perm has " + std::to_string(node.perm.size()) + " entries for an input of rank " +
                               std::to_string(x.shape.size()));
      std::vector<int64_t> out;
      for (int axis : node.perm) out.push_back(x.shape[axis]);
      return out;
    }
  }
  schema_error(path, "unknown node kind");
}

static Node read_node(const JsonValue& object, const std::string& path, const Graph& graph, int id) {
  expect_keys(object, {"id", "kind", "inputs", "attrs", "dtype", "shape"}, path);
  Node node;
  node.id = int(read_integer(member(object, "id"), path + ".id", id, id));  // ids are positions
  const JsonValue& kind = member(object, "kind");
  expect_type(kind, JsonValue::Type::kString, path + ".kind");
  const KindInfo* info = find_node_kind(kind.text);
  if (!info)
    schema_error(path + ".kind", "unknown node kind \"" + kind.text +
                                     "\"; expected matmul, add, bias_add, gelu, gelu_tanh, relu, reshape or transpose");
  node.kind = info->kind;
  const std::string kind_path = path + " (" + info->name + ")";

  const auto& inputs = read_array(member(object, "inputs"), path + ".inputs", info->num_inputs, info->num_inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    node.inputs.push_back(read_ref(inputs[i], path + ".inputs[" + std::to_string(i) + "]", graph, id));

  const JsonValue& attrs = member(object, "attrs");
  if (node.kind == NodeKind::kTranspose) {
    expect_keys(attrs, {"perm"}, path + ".attrs");
    const auto& perm = read_array(member(attrs, "perm"), path + ".attrs.perm", 0, kMaxRank);
    std::vector<bool> seen(perm.size(), false);
    for (size_t i = 0; i < perm.size(); ++i) {
      std::string entry_path = path + ".attrs.perm[" + std::to_string(i) + "]";
      int axis = int(read_integer(perm[i], entry_path, 0, int64_t(perm.size()) - 1));
      if (seen[axis]) schema_error(entry_path, "axis " + std::to_string(axis) + " appears twice; perm must be a permutation");
      seen[axis] = true;
      node.perm.push_back(axis);
    }
  } else {
    expect_keys(attrs, {}, path + ".attrs");
  }

  node.tensor = read_tensor(object, path);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    DType input_dtype = graph.tensor(node.inputs[i]).dtype;
    if (input_dtype != node.tensor.dtype)
      schema_error(kind_path, "input " + std::to_string(i) + " (" + ref_text(node.inputs[i]) + ") has dtype " +
                                  dtype_name(input_dtype) + ", the node has " + dtype_name(node.tensor.dtype));
  }
  std::vector<int64_t> inferred = infer_shape(graph, node, kind_path);
  if (inferred != node.tensor.shape)
    schema_error(kind_path, "declared shape " + shape_text(node.tensor.shape) + " but the inputs give " +
                                shape_text(inferred));
  return node;
}

Graph parse_graph(const char* text, size_t length, size_t weights_bytes) {
  JsonValue document = parse_json(text, length);
  expect_type(document, JsonValue::Type::kObject, "the document");
  // format and version first: a newer version may have other keys, and the message
  // should say "version", not "unknown key".
  for (const char* key : {"format", "version"}) {
    bool present = false;
    for (const auto& entry : document.members) present = present || entry.first == key;
    if (!present) schema_error("the document", std::string("missing key \"") + key + "\"");
  }
  const JsonValue& format = member(document, "format");
  if (format.type != JsonValue::Type::kString || format.text != "byoc-json-graph")
    schema_error("format", "expected \"byoc-json-graph\"");
  const JsonValue& version = member(document, "version");
  if (version.type != JsonValue::Type::kNumber || !version.is_integer || version.integer != 1)
    schema_error("version", "unsupported version; this engine reads version 1");
  expect_keys(document, {"format", "version", "inputs", "constants", "nodes", "outputs"}, "the document");

  Graph graph;
  const auto& inputs = read_array(member(document, "inputs"), "inputs", 0, kMaxInputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string path = "inputs[" + std::to_string(i) + "]";
    expect_keys(inputs[i], {"name", "dtype", "shape"}, path);
    GraphInput input{read_name(member(inputs[i], "name"), path + ".name"), read_tensor(inputs[i], path)};
    for (const GraphInput& other : graph.inputs)
      if (other.name == input.name) schema_error(path + ".name", "duplicate input name \"" + input.name + "\"");
    graph.inputs.push_back(std::move(input));
  }

  const auto& constants = read_array(member(document, "constants"), "constants", 0, kMaxConstants);
  for (size_t i = 0; i < constants.size(); ++i) {
    std::string path = "constants[" + std::to_string(i) + "]";
    expect_keys(constants[i], {"name", "dtype", "shape", "offset"}, path);
    GraphConstant constant;
    constant.name = read_name(member(constants[i], "name"), path + ".name");
    constant.tensor = read_tensor(constants[i], path);
    constant.offset = size_t(read_integer(member(constants[i], "offset"), path + ".offset", 0,
                                          std::numeric_limits<int64_t>::max()));
    if (constant.offset % dtype_size(constant.tensor.dtype) != 0)
      schema_error(path + ".offset", "offset " + std::to_string(constant.offset) + " is not a multiple of the element size");
    if (constant.offset > weights_bytes || constant.tensor.bytes > weights_bytes - constant.offset)
      schema_error(path, "bytes " + std::to_string(constant.offset) + ".." + std::to_string(constant.offset) + "+" +
                             std::to_string(constant.tensor.bytes) + " lie outside the weights blob of " +
                             std::to_string(weights_bytes) + " bytes");
    for (const GraphConstant& other : graph.constants)
      if (other.name == constant.name) schema_error(path + ".name", "duplicate constant name \"" + constant.name + "\"");
    graph.constants.push_back(std::move(constant));
  }

  const auto& nodes = read_array(member(document, "nodes"), "nodes", 1, kMaxNodes);
  int64_t total_bytes = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::string path = "nodes[" + std::to_string(i) + "]";
    graph.nodes.push_back(read_node(nodes[i], path, graph, int(i)));
    total_bytes += int64_t(graph.nodes.back().tensor.bytes);  // each <= 2^36, at most 2^16 of them
    if (total_bytes > kMaxTotalBytes)
      schema_error(path, "the node results together exceed the limit of " + std::to_string(kMaxTotalBytes) + " bytes");
  }

  const auto& outputs = read_array(member(document, "outputs"), "outputs", 1, kMaxOutputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string path = "outputs[" + std::to_string(i) + "]";
    ValueRef ref = read_ref(outputs[i], path, graph, int(graph.nodes.size()));
    if (ref.kind != RefKind::kNode) schema_error(path, "an output must be a node:N reference");
    graph.outputs.push_back(ref);
  }
  return graph;
}

// ================================================================== options

Options parse_options(const char* text) {
  Options options;
  if (!text) return options;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    size_t equals = item.find('=');
    if (equals == std::string::npos)
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "option \"" + item + "\" is not key=value");
    std::string key = item.substr(0, equals), value = item.substr(equals + 1);
    uint64_t number = 0;
    auto result = std::from_chars(value.data(), value.data() + value.size(), number);
    bool numeric = !value.empty() && result.ec == std::errc() && result.ptr == value.data() + value.size();
    auto require = [&](bool ok, const char* expected) {
      if (!numeric || !ok)
        throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "option " + key + "=" + value + ": expected " + expected);
    };
    if (key == "workspace_limit") {
      require(number <= (uint64_t(1) << 36), "a byte count up to 2^36");
      options.workspace_limit = size_t(number);
    } else if (key == "timed_selection") {
      require(number <= 1, "0 or 1");
      options.timed_selection = number == 1;
    } else if (key == "candidates") {
      require(number >= 1 && number <= 64, "1..64");
      options.candidates = int(number);
    } else if (key == "fuse_erf_gelu") {
      require(number <= 1, "0 or 1");
      options.fuse_erf_gelu = number == 1;
    } else if (key == "tf32") {
      require(number <= 1, "0 or 1");
      options.tf32 = number == 1;
    } else {
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "unknown option \"" + key +
                                                      "\"; expected workspace_limit, timed_selection, candidates, "
                                                      "fuse_erf_gelu or tf32");
    }
  }
  return options;
}

}  // namespace byoc_json
