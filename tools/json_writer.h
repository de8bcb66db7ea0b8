// SPDX-License-Identifier: Apache-2.0
// tools/json_writer.h: a tiny, correct JSON writer for the tools' --json output.
//
// Writes one JSON value into a string: objects, arrays, strings (escaped per RFC 8259: quote,
// backslash and control characters; invalid UTF-8 bytes become U+FFFD so the output is always
// valid UTF-8), integers, doubles (shortest round-trip form; NaN and infinities become null, which
// JSON has no spelling for), booleans and null. Commas and colons are placed by the writer.
//
// Header-only on purpose: kvctl and the benchmarks each link it without a library of its own.
//
//   JsonWriter w;
//   w.BeginObject().Key("ok").Bool(true).Key("problems").BeginArray().EndArray().EndObject();
//   std::puts(w.str().c_str());  // {"ok":true,"problems":[]}
//
// REQUIRES: calls form one well-nested value (a Key before every value inside an object, none
// inside an array). Misuse is a programming error, caught by assert in debug builds.
//
// Thread-safety: none; one writer per thread.
#ifndef CKV_TOOLS_JSON_WRITER_H_
#define CKV_TOOLS_JSON_WRITER_H_

#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace ckv::tools {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char b0 = byte(i);
  size_t len;
  uint32_t cp;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t j = 1; j < len; ++j) {
    if ((byte(i + j) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + j) & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return len;
}

class JsonWriter {
 public:
  JsonWriter& BeginObject() {
    BeforeValue();
    out_ += '{';
    stack_.push_back({/*is_object=*/true, /*empty=*/true, /*after_key=*/false});
    return *this;
  }
  JsonWriter& EndObject() {
    assert(!stack_.empty() && stack_.back().is_object && !stack_.back().after_key);
    stack_.pop_back();
    out_ += '}';
    return *this;
  }
  JsonWriter& BeginArray() {
    BeforeValue();
    out_ += '[';
    stack_.push_back({/*is_object=*/false, /*empty=*/true, /*after_key=*/false});
    return *this;
  }
  JsonWriter& EndArray() {
    assert(!stack_.empty() && !stack_.back().is_object);
    stack_.pop_back();
    out_ += ']';
    return *this;
  }

  // The name of the next member of the enclosing object.
  JsonWriter& Key(std::string_view key) {
    assert(!stack_.empty() && stack_.back().is_object && !stack_.back().after_key);
    Level& level = stack_.back();
    if (!level.empty) out_ += ',';
    level.empty = false;
    AppendQuoted(key);
    out_ += ':';
    level.after_key = true;
    return *this;
  }

  JsonWriter& String(std::string_view value) {
    BeforeValue();
    AppendQuoted(value);
    return *this;
  }
  JsonWriter& Uint(uint64_t value) {
    BeforeValue();
    AppendNumber(value);
    return *this;
  }
  JsonWriter& Int(int64_t value) {
    BeforeValue();
    AppendNumber(value);
    return *this;
  }
  JsonWriter& Double(double value) {
    BeforeValue();
    if (!std::isfinite(value)) {
      out_ += "null";
      return *this;
    }
    char buf[64];
    // Shortest representation that reads back as the same double.
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
    assert(ec == std::errc());
    out_.append(buf, end);
    return *this;
  }
  JsonWriter& Bool(bool value) {
    BeforeValue();
    out_ += value ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    BeforeValue();
    out_ += "null";
    return *this;
  }

  // The text written so far; one complete value once every Begin has its End.
  const std::string& str() const { return out_; }
  bool complete() const { return stack_.empty() && !out_.empty(); }

  // `s` as a JSON string literal, quotes included.
  static std::string Quote(std::string_view s) {
    JsonWriter w;
    w.AppendQuoted(s);
    return w.out_;
  }

 private:
  struct Level {
    bool is_object;
    bool empty;
    bool after_key;
  };

  void BeforeValue() {
    if (stack_.empty()) {
      assert(out_.empty() && "a JsonWriter holds one top-level value");
      return;
    }
    Level& level = stack_.back();
    if (level.is_object) {
      assert(level.after_key && "a value inside an object needs a Key first");
      level.after_key = false;
      return;
    }
    if (!level.empty) out_ += ',';
    level.empty = false;
  }

  template <typename T>
  void AppendNumber(T value) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
    assert(ec == std::errc());
    (void)ec;
    out_.append(buf, end);
  }

  void AppendQuoted(std::string_view s) {
    static constexpr char kHex[] = "0123456789abcdef";
    out_ += '"';
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      switch (c) {
        case '"':
          out_ += "\\\"";
          ++i;
          continue;
        case '\\':
          out_ += "\\\\";
          ++i;
          continue;
        case '\b':
          out_ += "\\b";
          ++i;
          continue;
        case '\f':
          out_ += "\\f";
          ++i;
          continue;
        case '\n':
          out_ += "\\n";
          ++i;
          continue;
        case '\r':
          out_ += "\\r";
          ++i;
          continue;
        case '\t':
          out_ += "\\t";
          ++i;
          continue;
        default:
          break;
      }
      if (c < 0x20 || c == 0x7F) {
        out_ += "\\u00";
        out_ += kHex[c >> 4];
        out_ += kHex[c & 0xF];
        ++i;
        continue;
      }
      const size_t len = Utf8SequenceLength(s, i);
      if (len == 0) {
        out_ += "\\ufffd";  // not UTF-8: replace the byte rather than emit invalid JSON
        ++i;
        continue;
      }
      out_.append(s.substr(i, len));
      i += len;
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<Level> stack_;
};

}  // namespace ckv::tools

#endif  // CKV_TOOLS_JSON_WRITER_H_
