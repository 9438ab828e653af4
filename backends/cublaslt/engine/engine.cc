// The JSON runtime engine: strict JSON parser, graph validation, planning (fusion of
// matmul epilogues, storage of intermediates), the CPU executor, and the C API.
// The CUDA executor lives in engine_cuda.cu; build both with -DBYOC_JSON_ENGINE_WITH_CUDA.
//
// Everything that can fail at create() throws EngineError; the C functions at the end
// turn it into a return code and a thread-local message. Nothing here trusts the JSON:
// sizes are checked before they are used, arithmetic on them cannot overflow.
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

// ================================================================== limits
// Generous for real subgraphs (BERT-large's largest is a few hundred nodes), small
// enough that a hostile document cannot exhaust memory or the stack.
constexpr size_t kMaxJsonBytes = size_t(16) << 20;
constexpr int kMaxJsonDepth = 32;
constexpr size_t kMaxJsonValues = size_t(1) << 20;
constexpr size_t kMaxStringBytes = 1024;
constexpr size_t kMaxNumberChars = 64;
constexpr size_t kMaxInputs = 1024;
constexpr size_t kMaxOutputs = 1024;
constexpr size_t kMaxConstants = 1 << 16;
constexpr size_t kMaxNodes = 1 << 16;
constexpr int64_t kMaxTensorBytes = int64_t(1) << 36;  // 64 GiB: more than any GPU holds
constexpr int64_t kMaxTotalBytes = int64_t(1) << 38;   // all node results together

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

struct KindInfo {
  const char* name;
  NodeKind kind;
  int num_inputs;
};
constexpr KindInfo kKinds[] = {
    {"matmul", NodeKind::kMatmul, 2},   {"add", NodeKind::kAdd, 2},
    {"bias_add", NodeKind::kBiasAdd, 2}, {"gelu", NodeKind::kGelu, 1},
    {"gelu_tanh", NodeKind::kGeluTanh, 1}, {"relu", NodeKind::kRelu, 1},
    {"reshape", NodeKind::kReshape, 1}, {"transpose", NodeKind::kTranspose, 1},
};

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

static std::string shape_text(const std::vector<int64_t>& shape) {
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

static size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// ================================================================== JSON

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  size_t offset = 0;  // where the value starts, for messages
  bool boolean = false;
  bool is_integer = false;  // a number written without fraction or exponent
  int64_t integer = 0;
  double number = 0;
  std::string text;
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;  // in document order
};

static const char* json_type_name(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "a boolean";
    case JsonValue::Type::kNumber: return "a number";
    case JsonValue::Type::kString: return "a string";
    case JsonValue::Type::kArray: return "an array";
    case JsonValue::Type::kObject: return "an object";
  }
  return "?";
}

// RFC 8259 JSON, strictly: no comments, no trailing commas, no NaN/Infinity, no leading
// zeros, no control characters in strings, valid UTF-8 only (no overlong forms, no
// surrogates), escaped surrogates only in pairs, no duplicate keys, nothing after the
// document but whitespace. Recursion is bounded by kMaxJsonDepth.
class JsonParser {
 public:
  JsonParser(const char* text, size_t length) : text_(text), length_(length) {}

  JsonValue parse_document() {
    if (length_ > kMaxJsonBytes)
      throw EngineError(BYOC_JSON_ERROR_PARSE, "JSON graph is " + std::to_string(length_) +
                                                   " bytes; the limit is " + std::to_string(kMaxJsonBytes));
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (position_ != length_) fail("unexpected text after the JSON document");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw EngineError(BYOC_JSON_ERROR_PARSE, "JSON parse error at byte " + std::to_string(position_) + ": " + what);
  }

  bool at_end() const { return position_ >= length_; }
  unsigned char peek() const { return static_cast<unsigned char>(text_[position_]); }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++position_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxJsonDepth) fail("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (++value_count_ > kMaxJsonValues) fail("more than " + std::to_string(kMaxJsonValues) + " values");
    if (at_end()) fail("unexpected end of input, expected a value");
    JsonValue value;
    value.offset = position_;
    unsigned char c = peek();
    if (c == '{') {
      parse_object(value, depth);
    } else if (c == '[') {
      parse_array(value, depth);
    } else if (c == '"') {
      value.type = JsonValue::Type::kString;
      value.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      parse_number(value);
    } else if (c == 't') {
      expect_word("true");
      value.type = JsonValue::Type::kBool;
      value.boolean = true;
    } else if (c == 'f') {
      expect_word("false");
      value.type = JsonValue::Type::kBool;
    } else if (c == 'n') {
      expect_word("null");
    } else {
      fail(std::string("unexpected character ") + describe_byte(c) + ", expected a value");
    }
    return value;
  }

  static std::string describe_byte(unsigned char c) {
    if (c >= 0x20 && c < 0x7f) return std::string("'") + char(c) + "'";
    char buffer[8];
    std::snprintf(buffer, sizeof buffer, "0x%02x", c);
    return buffer;
  }

  void expect_word(const char* word) {
    size_t length = std::strlen(word);
    if (length_ - position_ < length || std::memcmp(text_ + position_, word, length) != 0)
      fail(std::string("invalid literal, expected ") + word);
    position_ += length;
  }

  void parse_object(JsonValue& value, int depth) {
    value.type = JsonValue::Type::kObject;
    ++position_;  // '{'
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      if (at_end() || peek() != '"') fail("expected a string key in an object");
      size_t key_offset = position_;
      std::string key = parse_string();
      for (const auto& member : value.members)
        if (member.first == key) {
          position_ = key_offset;
          fail("duplicate key \"" + key + "\"");
        }
      skip_whitespace();
      if (at_end() || peek() != ':') fail("expected ':' after an object key");
      ++position_;
      skip_whitespace();
      JsonValue member = parse_value(depth + 1);
      value.members.emplace_back(std::move(key), std::move(member));
      skip_whitespace();
      if (at_end()) fail("unexpected end of input in an object");
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() == '}') {
        ++position_;
        return;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  void parse_array(JsonValue& value, int depth) {
    value.type = JsonValue::Type::kArray;
    ++position_;  // '['
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      value.items.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (at_end()) fail("unexpected end of input in an array");
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() == ']') {
        ++position_;
        return;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  unsigned parse_hex4() {
    if (length_ - position_ < 4) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      unsigned char c = peek();
      unsigned digit;
      if (c >= '0' && c <= '9') digit = c - '0';
      else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
      else fail("invalid hex digit in a \\u escape");
      code = code * 16 + digit;
      ++position_;
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += char(code);
    } else if (code < 0x800) {
      out += char(0xC0 | (code >> 6));
      out += char(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += char(0xE0 | (code >> 12));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    } else {
      out += char(0xF0 | (code >> 18));
      out += char(0x80 | ((code >> 12) & 0x3F));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    }
  }

  // Consumes one UTF-8 encoded character starting at a byte >= 0x80 (Unicode table 3-7).
  void copy_utf8_sequence(std::string& out) {
    unsigned char lead = peek();
    int continuation;
    unsigned char low = 0x80, high = 0xBF;  // range of the first continuation byte
    if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuation = 2;
      if (lead == 0xE0) low = 0xA0;        // no overlong forms
      if (lead == 0xED) high = 0x9F;       // no UTF-16 surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuation = 3;
      if (lead == 0xF0) low = 0x90;        // no overlong forms
      if (lead == 0xF4) high = 0x8F;       // nothing above U+10FFFF
    } else {
      fail("invalid UTF-8 lead byte " + describe_byte(lead) + " in a string");
    }
    if (length_ - position_ <= size_t(continuation)) fail("truncated UTF-8 sequence in a string");
    for (int i = 1; i <= continuation; ++i) {
      unsigned char c = static_cast<unsigned char>(text_[position_ + i]);
      unsigned char min = i == 1 ? low : 0x80, max = i == 1 ? high : 0xBF;
      if (c < min || c > max) fail("invalid UTF-8 continuation byte " + describe_byte(c) + " in a string");
    }
    out.append(text_ + position_, continuation + 1);
    position_ += continuation + 1;
  }

  std::string parse_string() {
    ++position_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      if (out.size() > kMaxStringBytes) fail("string longer than " + std::to_string(kMaxStringBytes) + " bytes");
      unsigned char c = peek();
      if (c == '"') {
        ++position_;
        return out;
      }
      if (c < 0x20) fail("control character " + describe_byte(c) + " in a string (escape it)");
      if (c >= 0x80) {
        copy_utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out += char(c);
        ++position_;
        continue;
      }
      ++position_;
      if (at_end()) fail("unterminated escape in a string");
      char escape = char(peek());
      ++position_;
      switch (escape) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = parse_hex4();
          if (code >= 0xDC00 && code <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (length_ - position_ < 2 || text_[position_] != '\\' || text_[position_ + 1] != 'u')
              fail("high surrogate not followed by a low surrogate escape");
            position_ += 2;
            unsigned low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          if (code == 0) fail("NUL character (\\u0000) in a string");
          append_utf8(out, code);
          break;
        }
        default:
          --position_;
          fail(std::string("invalid escape \\") + describe_byte(static_cast<unsigned char>(escape)));
      }
    }
  }

  void parse_number(JsonValue& value) {
    value.type = JsonValue::Type::kNumber;
    size_t start = position_;
    auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
    if (peek() == '-') ++position_;
    if (!digit()) fail("expected a digit in a number");
    if (peek() == '0') {
      ++position_;
      if (digit()) fail("leading zeros are not allowed in a number");
    } else {
      while (digit()) ++position_;
    }
    bool integral = true;
    if (!at_end() && peek() == '.') {
      integral = false;
      ++position_;
      if (!digit()) fail("expected a digit after '.' in a number");
      while (digit()) ++position_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++position_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++position_;
      if (!digit()) fail("expected a digit in the exponent of a number");
      while (digit()) ++position_;
    }
    size_t length = position_ - start;
    if (length > kMaxNumberChars) {
      position_ = start;
      fail("number longer than " + std::to_string(kMaxNumberChars) + " characters");
    }
    const char* first = text_ + start;
    const char* last = text_ + position_;
    if (integral) {
      int64_t integer = 0;
      auto result = std::from_chars(first, last, integer);
      if (result.ec != std::errc() || result.ptr != last) {
        position_ = start;
        fail("integer " + std::string(first, last) + " is outside the 64-bit range");
      }
      value.is_integer = true;
      value.integer = integer;
      value.number = double(integer);
    } else {
      double number = 0;
      auto result = std::from_chars(first, last, number);
      if (result.ec != std::errc() || result.ptr != last || !std::isfinite(number)) {
        position_ = start;
        fail("number " + std::string(first, last) + " is out of range");
      }
      value.number = number;
    }
  }

  const char* text_;
  size_t length_;
  size_t position_ = 0;
  size_t value_count_ = 0;
};

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
  const KindInfo* info = nullptr;
  for (const KindInfo& candidate : kKinds)
    if (kind.text == candidate.name) info = &candidate;
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
  JsonValue document = JsonParser(text, length).parse_document();
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
    } else {
      throw EngineError(BYOC_JSON_ERROR_ARGUMENT, "unknown option \"" + key +
                                                      "\"; expected workspace_limit, timed_selection, candidates or fuse_erf_gelu");
    }
  }
  return options;
}

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
    steps.push_back(std::move(step));
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
