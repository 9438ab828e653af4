// The JSON runtime engine's JSON reader: strict RFC 8259, bounded so that a hostile
// document cannot exhaust memory or the stack.
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
// enough that a hostile document cannot exhaust memory or the stack.
constexpr size_t kMaxJsonBytes = size_t(16) << 20;
constexpr int kMaxJsonDepth = 32;
constexpr size_t kMaxJsonValues = size_t(1) << 20;
constexpr size_t kMaxStringBytes = 1024;
constexpr size_t kMaxNumberChars = 64;

const char* json_type_name(JsonValue::Type type) {
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


namespace {

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

}  // namespace

JsonValue parse_json(const char* text, size_t length) {
  return JsonParser(text, length).parse_document();
}

}  // namespace byoc_json
