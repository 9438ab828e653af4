// The engine's JSON reader (engine_json.cc): a document as a tree of values, for the
// schema checks of engine_graph.cc. Not part of the C API.
#ifndef BYOC_JSON_ENGINE_JSON_H_
#define BYOC_JSON_ENGINE_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace byoc_json {

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

// "a number", "an object", ...: what a schema message says was found.
const char* json_type_name(JsonValue::Type type);

// The document `text` (RFC 8259, strictly; bounded size, depth and value count). Throws
// EngineError(BYOC_JSON_ERROR_PARSE) naming the byte where it stops.
JsonValue parse_json(const char* text, size_t length);

}  // namespace byoc_json

#endif  // BYOC_JSON_ENGINE_JSON_H_
