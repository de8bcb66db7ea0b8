// SPDX-License-Identifier: Apache-2.0
// The strict JSON reader (see tools/json_reader.h): recursive descent over a string_view, with
// the depth bounded before each descent and the value count bounded before each allocation.
#include "tools/json_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_writer.h"

namespace ckv::tools {
namespace {

// The installed Abseil has its own absl::string_view, which std::string_view does not convert to.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  Parser(std::string_view text, const JsonLimits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue value;
    CKV_RETURN_IF_ERROR(Value(/*depth=*/1, &value));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  absl::Status Error(std::string_view what) const {
    std::string found = "end of text";
    if (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      found = c >= 0x20 && c < 0x7F ? absl::StrCat("'", std::string(1, static_cast<char>(c)), "'")
                                    : absl::StrCat("byte 0x", absl::Hex(c, absl::kZeroPad2));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("JSON at byte ", pos_, ": ", Sv(what), ", found ", found));
  }
  static absl::Status ErrorAt(size_t pos, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("JSON at byte ", pos, ": ", Sv(what)));
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  absl::Status Value(uint32_t depth, JsonValue* out) {
    SkipWhitespace();
    if (++values_ > limits_.max_values) {
      return ErrorAt(pos_, absl::StrCat("more than ", limits_.max_values, " values"));
    }
    if (pos_ >= text_.size()) return Error("expected a value");
    switch (text_[pos_]) {
      case '{':
        return ObjectValue(depth, out);
      case '[':
        return ArrayValue(depth, out);
      case '"': {
        std::string s;
        CKV_RETURN_IF_ERROR(String(&s));
        *out = JsonValue(std::move(s));
        return absl::OkStatus();
      }
      case 't':
        if (!Consume("true")) return Error("expected a value");
        *out = JsonValue(true);
        return absl::OkStatus();
      case 'f':
        if (!Consume("false")) return Error("expected a value");
        *out = JsonValue(false);
        return absl::OkStatus();
      case 'n':
        if (!Consume("null")) return Error("expected a value");
        *out = JsonValue();
        return absl::OkStatus();
      default:
        return Number(out);
    }
  }

  absl::Status CheckDepth(uint32_t depth) const {
    if (depth > limits_.max_depth) {
      return ErrorAt(pos_, absl::StrCat("nesting deeper than ", limits_.max_depth));
    }
    return absl::OkStatus();
  }

  absl::Status ArrayValue(uint32_t depth, JsonValue* out) {
    CKV_RETURN_IF_ERROR(CheckDepth(depth));
    ++pos_;  // '['
    JsonValue::Array items;
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      *out = JsonValue(std::move(items));
      return absl::OkStatus();
    }
    while (true) {
      items.emplace_back();
      CKV_RETURN_IF_ERROR(Value(depth + 1, &items.back()));
      SkipWhitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        break;
      }
      return Error("expected ',' or ']' in an array");
    }
    *out = JsonValue(std::move(items));
    return absl::OkStatus();
  }

  absl::Status ObjectValue(uint32_t depth, JsonValue* out) {
    CKV_RETURN_IF_ERROR(CheckDepth(depth));
    const size_t start = pos_;
    ++pos_;  // '{'
    JsonValue::Object members;
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      *out = JsonValue(std::move(members));
      return absl::OkStatus();
    }
    while (true) {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a string key");
      std::string key;
      CKV_RETURN_IF_ERROR(String(&key));
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        return Error("expected ':' after an object key");
      }
      ++pos_;
      members.emplace_back(std::move(key), JsonValue());
      CKV_RETURN_IF_ERROR(Value(depth + 1, &members.back().second));
      SkipWhitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        break;
      }
      return Error("expected ',' or '}' in an object");
    }
    // Duplicate keys make "which one counts" ambiguous between readers: reject them. Sorting
    // views keeps this O(n log n) for objects with many members.
    if (members.size() > 1) {
      std::vector<std::string_view> keys;
      keys.reserve(members.size());
      for (const auto& [key, value] : members) keys.push_back(key);
      std::sort(keys.begin(), keys.end());
      const auto dup = std::adjacent_find(keys.begin(), keys.end());
      if (dup != keys.end()) {
        return ErrorAt(
            start, absl::StrCat("duplicate key \"", absl::CHexEscape(Sv(*dup)), "\" in an object"));
      }
    }
    *out = JsonValue(std::move(members));
    return absl::OkStatus();
  }

  absl::Status Hex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return Error("expected 4 hex digits after \\u");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("expected 4 hex digits after \\u");
      }
      v = (v << 4) | d;
      ++pos_;
    }
    *out = v;
    return absl::OkStatus();
  }

  // At '"'; leaves pos_ past the closing quote.
  absl::Status String(std::string* out) {
    ++pos_;
    while (true) {
      // Copy the run of plain bytes up to the next quote, backslash or control character.
      const size_t run_start = pos_;
      while (pos_ < text_.size()) {
        const unsigned char c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20) break;
        if (c < 0x80) {
          ++pos_;
          continue;
        }
        const size_t len = Utf8SequenceLength(text_, pos_);
        if (len == 0) {
          out->append(text_.substr(run_start, pos_ - run_start));
          return Error("invalid UTF-8 in a string");
        }
        pos_ += len;
      }
      out->append(text_.substr(run_start, pos_ - run_start));
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c != '\\') return Error("raw control character in a string (escape it)");
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated string");
      switch (text_[pos_++]) {
        case '"':
          *out += '"';
          break;
        case '\\':
          *out += '\\';
          break;
        case '/':
          *out += '/';
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'n':
          *out += '\n';
          break;
        case 'r':
          *out += '\r';
          break;
        case 't':
          *out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          CKV_RETURN_IF_ERROR(Hex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) return Error("high surrogate not followed by a \\u low surrogate");
            uint32_t low = 0;
            CKV_RETURN_IF_ERROR(Hex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error("high surrogate not followed by a \\u low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, *out);
          break;
        }
        default:
          --pos_;
          return Error("unknown escape");
      }
    }
  }

  absl::Status Number(JsonValue* out) {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        return Error("leading zero in a number");
      }
    } else if (digits() == 0) {
      pos_ = start;
      return Error("expected a value");
    }
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) return Error("expected a digit after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Error("expected a digit in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t i;
      const auto [end, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && end == last) {
        *out = JsonValue(i);
        return absl::OkStatus();
      }
      // Past int64: read it as a double, as the header documents.
    }
    double d;
    const auto [end, ec] = std::from_chars(first, last, d);
    if (ec != std::errc() || end != last) {
      const std::string_view literal = text_.substr(start, std::min<size_t>(pos_ - start, 40));
      return ErrorAt(start, absl::StrCat("number ", Sv(literal), " is out of double's range"));
    }
    *out = JsonValue(d);
    return absl::OkStatus();
  }

  std::string_view text_;
  const JsonLimits& limits_;
  size_t pos_ = 0;
  size_t values_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(std::string_view key) const {
  const Object* object = AsObject();
  if (object == nullptr) return nullptr;
  for (const auto& [k, v] : *object) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string_view JsonValue::TypeName() const {
  static constexpr std::string_view kNames[] = {"null",     "a boolean", "an integer", "a number",
                                                "a string", "an array",  "an object"};
  return kNames[value_.index()];
}

absl::StatusOr<JsonValue> ParseJson(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON text of ", text.size(), " bytes: over the limit of ", limits.max_bytes));
  }
  return Parser(text, limits).Document();
}

absl::StatusOr<std::string> ReadFileUpTo(const std::string& path, size_t max_bytes,
                                         std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  // Read to the end rather than trusting the file's size, and stop once past the limit.
  std::string text;
  absl::Status status;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoToStatus(errno, absl::StrCat("read ", path));
      break;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(path, ": over the ", Sv(what), " size limit of ", max_bytes, " bytes"));
      break;
    }
  }
  ::close(fd);
  CKV_RETURN_IF_ERROR(status);
  return text;
}

absl::StatusOr<JsonValue> ReadJsonFile(const std::string& path, const JsonLimits& limits) {
  CKV_ASSIGN_OR_RETURN(const std::string text, ReadFileUpTo(path, limits.max_bytes, "JSON"));
  absl::StatusOr<JsonValue> value = ParseJson(text, limits);
  if (!value.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", value.status().message()));
  }
  return value;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace ckv::tools
