// SPDX-License-Identifier: Apache-2.0
// tools/json_reader.h: a small, strict JSON reader for input that may be hostile.
//
// Reads one RFC 8259 JSON text into a JsonValue tree: objects, arrays, strings (all escapes,
// \uXXXX with surrogate pairs), numbers, true, false and null. Strict: no comments, no trailing
// commas, no leading zeros, no NaN or Infinity, no raw control characters or invalid UTF-8 in
// strings, no lone surrogates, no duplicate keys in an object, nothing but whitespace after the
// value. Numbers written without a fraction or exponent that fit in int64 are integers; every
// other number (1.5, 1e3, 2^63) is a double, and one out of double's range is an error.
//
// It is meant for input that may be hostile (file headers, fuzzed bytes): size, nesting depth and
// the number of values are bounded by JsonLimits, so neither the stack nor memory grows past what
// the limits allow, and every error is an InvalidArgument naming the byte offset and what was
// wrong: "JSON at byte 17: expected ':' after an object key, found '}'".
//
//   absl::StatusOr<JsonValue> v = ParseJson(R"({"shape": [16, 4, 64]})");
//   const JsonValue::Array* shape = v->Find("shape")->AsArray();
//
// Thread-safety: pure functions; a JsonValue is a value type (const access from any thread).
#ifndef CKV_TOOLS_JSON_READER_H_
#define CKV_TOOLS_JSON_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"

namespace ckv::tools {

class JsonValue {
 public:
  using Array = std::vector<JsonValue>;
  // Members in document order; keys are unique.
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  JsonValue() = default;  // null
  explicit JsonValue(bool b) : value_(b) {}
  explicit JsonValue(int64_t i) : value_(i) {}
  explicit JsonValue(double d) : value_(d) {}
  explicit JsonValue(std::string s) : value_(std::move(s)) {}
  explicit JsonValue(Array a) : value_(std::move(a)) {}
  explicit JsonValue(Object o) : value_(std::move(o)) {}

  bool IsNull() const { return std::holds_alternative<std::monostate>(value_); }
  // The value when it has that type, else nullptr.
  const bool* AsBool() const { return std::get_if<bool>(&value_); }
  const int64_t* AsInt() const { return std::get_if<int64_t>(&value_); }
  const double* AsDouble() const { return std::get_if<double>(&value_); }
  const std::string* AsString() const { return std::get_if<std::string>(&value_); }
  const Array* AsArray() const { return std::get_if<Array>(&value_); }
  const Object* AsObject() const { return std::get_if<Object>(&value_); }

  // Member `key` of an object; nullptr when absent or when this is not an object.
  const JsonValue* Find(std::string_view key) const;

  // "null", "a boolean", "an integer", "a number", "a string", "an array" or "an object", for
  // messages such as "shape is a string, not an array".
  std::string_view TypeName() const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> value_;
};

struct JsonLimits {
  // Longest text accepted, bytes. Default: 16 MiB.
  size_t max_bytes = size_t{16} << 20;
  // Deepest nesting of arrays and objects (the top-level value is depth 1). Default: 64.
  uint32_t max_depth = 64;
  // Most values (scalars, arrays and objects, each member value counted) in one text. Bounds the
  // memory of the tree to about 64 bytes a value plus the string bytes, whatever the text: a
  // 16 MiB text of "[0,0,0,..." would otherwise make 8 million values. Default: 1 << 20.
  size_t max_values = size_t{1} << 20;
};

// Parses `text` as one JSON value. InvalidArgument on malformed text or an exceeded limit.
absl::StatusOr<JsonValue> ParseJson(std::string_view text, const JsonLimits& limits = {});

// Reads the file at `path` (at most limits.max_bytes bytes) and parses it. Errors name the path:
// the open or read error mapped by ErrnoToStatus, or InvalidArgument "<path>: JSON at byte ...".
absl::StatusOr<JsonValue> ReadJsonFile(const std::string& path, const JsonLimits& limits = {});

// The bytes of the file at `path`, read to its end, or InvalidArgument "<path>: over the <what>
// size limit of N bytes" once past `max_bytes` (the file's size is not trusted). Open and read
// errors as ErrnoToStatus, naming the path.
absl::StatusOr<std::string> ReadFileUpTo(const std::string& path, size_t max_bytes,
                                         std::string_view what);

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF): the check ParseJson applies to the bytes of strings.
bool IsValidUtf8(std::string_view s);

}  // namespace ckv::tools

#endif  // CKV_TOOLS_JSON_READER_H_
