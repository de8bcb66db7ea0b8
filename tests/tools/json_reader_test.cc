// SPDX-License-Identifier: Apache-2.0
// tools/json_reader: what it accepts, and the specific error for what it rejects.
#include "tools/json_reader.h"

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckv::tools {
namespace {

using ::testing::HasSubstr;

// The message of parsing `text`, which must fail with InvalidArgument.
std::string ParseError(const std::string& text, const JsonLimits& limits = {}) {
  absl::StatusOr<JsonValue> v = ParseJson(text, limits);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(v.status().message());
}

TEST(JsonReaderTest, ReadsEveryKindOfValue) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"( {"a": [1, -2, 1.5, 1e3, 9223372036854775807, 9223372036854775808], "b": true,
           "c": false, "d": null, "e": "x\"\\\/\b\f\n\r\tA\u00e9\ud83d\ude00", "f": {}, "g": []} )");
  ASSERT_TRUE(v.ok()) << v.status();
  const JsonValue::Array& a = *v->Find("a")->AsArray();
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(*a[0].AsInt(), 1);
  EXPECT_EQ(*a[1].AsInt(), -2);
  EXPECT_EQ(*a[2].AsDouble(), 1.5);
  EXPECT_EQ(*a[3].AsDouble(), 1000.0);  // an exponent makes a double
  EXPECT_EQ(*a[4].AsInt(), INT64_MAX);
  EXPECT_EQ(*a[5].AsDouble(), 9223372036854775808.0);  // past int64
  EXPECT_TRUE(*v->Find("b")->AsBool());
  EXPECT_FALSE(*v->Find("c")->AsBool());
  EXPECT_TRUE(v->Find("d")->IsNull());
  EXPECT_EQ(*v->Find("e")->AsString(), "x\"\\/\b\f\n\r\tA\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v->Find("f")->AsObject()->empty());
  EXPECT_TRUE(v->Find("g")->AsArray()->empty());
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(a[0].AsString(), nullptr);
  EXPECT_EQ(a[0].TypeName(), "an integer");
  // Scalars at the top level, and raw UTF-8 in strings.
  EXPECT_EQ(*ParseJson("-0")->AsInt(), 0);
  EXPECT_EQ(*ParseJson("\"\xe6\x97\xa5\"")->AsString(), "\xe6\x97\xa5");
}

TEST(JsonReaderTest, RejectsMalformedTextNamingTheByte) {
  EXPECT_THAT(ParseError(""), HasSubstr("JSON at byte 0: expected a value, found end of text"));
  EXPECT_THAT(ParseError("{\"a\" 1}"),
              HasSubstr("byte 5: expected ':' after an object key, found '1'"));
  EXPECT_THAT(ParseError("[1,]"), HasSubstr("byte 3: expected a value"));
  EXPECT_THAT(ParseError("[1 2]"), HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(ParseError("{\"a\":1,}"), HasSubstr("expected a string key"));
  EXPECT_THAT(ParseError("{1:2}"), HasSubstr("expected a string key"));
  EXPECT_THAT(ParseError("01"), HasSubstr("leading zero"));
  EXPECT_THAT(ParseError("1."), HasSubstr("expected a digit after '.'"));
  EXPECT_THAT(ParseError("1e"), HasSubstr("expected a digit in the exponent"));
  EXPECT_THAT(ParseError("-"), HasSubstr("expected a value"));
  EXPECT_THAT(ParseError("NaN"), HasSubstr("expected a value"));
  EXPECT_THAT(ParseError("1e999"), HasSubstr("number 1e999 is out of double's range"));
  EXPECT_THAT(ParseError("tru"), HasSubstr("expected a value"));
  EXPECT_THAT(ParseError("1 2"), HasSubstr("byte 2: unexpected text after the value"));
  EXPECT_THAT(ParseError("\"abc"), HasSubstr("unterminated string"));
  EXPECT_THAT(ParseError("\"a\nb\""), HasSubstr("raw control character"));
  EXPECT_THAT(ParseError("\"\\x\""), HasSubstr("byte 2: unknown escape, found 'x'"));
  EXPECT_THAT(ParseError("\"\\u12\""), HasSubstr("expected 4 hex digits"));
  EXPECT_THAT(ParseError("\"\\udc00\""), HasSubstr("lone low surrogate"));
  EXPECT_THAT(ParseError("\"\\ud800x\""), HasSubstr("high surrogate not followed"));
  EXPECT_THAT(ParseError("\"\\ud800\\u0041\""), HasSubstr("high surrogate not followed"));
  EXPECT_THAT(ParseError("\"\xff\""),
              HasSubstr("byte 1: invalid UTF-8 in a string, found byte 0xff"));
  EXPECT_THAT(ParseError("\"\xc0\xaf\""), HasSubstr("invalid UTF-8"));      // overlong
  EXPECT_THAT(ParseError("\"\xed\xa0\x80\""), HasSubstr("invalid UTF-8"));  // surrogate
  EXPECT_THAT(ParseError("\"\xe6\x97\""), HasSubstr("invalid UTF-8"));      // cut short
  EXPECT_THAT(ParseError("{\"a\":1,\"b\":2,\"a\":3}"),
              HasSubstr("byte 0: duplicate key \"a\" in an object"));
}

TEST(JsonReaderTest, EnforcesItsLimits) {
  JsonLimits limits;
  limits.max_depth = 3;
  EXPECT_TRUE(ParseJson("[[[1]]]", limits).ok());
  EXPECT_THAT(ParseError("[[[[1]]]]", limits), HasSubstr("byte 3: nesting deeper than 3"));
  // A deeply nested text fails cleanly at the default limit instead of exhausting the stack.
  EXPECT_THAT(ParseError(std::string(100000, '[')), HasSubstr("nesting deeper than 64"));

  limits = {};
  limits.max_values = 4;
  EXPECT_TRUE(ParseJson("[1,2,3]", limits).ok());
  EXPECT_THAT(ParseError("[1,2,3,4]", limits), HasSubstr("more than 4 values"));

  limits = {};
  limits.max_bytes = 4;
  EXPECT_THAT(ParseError("[1,2]", limits), HasSubstr("5 bytes: over the limit of 4"));
}

TEST(JsonReaderTest, ReadsAFileAndNamesItInErrors) {
  ckv::testing::TempDir dir;
  const std::string path = dir.Sub("x.json");
  std::ofstream(path) << "{\"a\": [1, 2]}\n";
  absl::StatusOr<JsonValue> v = ReadJsonFile(path);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Find("a")->AsArray()->size(), 2u);

  std::ofstream(path) << "{\"a\": }";
  v = ReadJsonFile(path);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr(path + ": JSON at byte 6"));

  JsonLimits limits;
  limits.max_bytes = 3;
  v = ReadJsonFile(path, limits);
  EXPECT_THAT(v.status().message(), HasSubstr("over the JSON size limit of 3 bytes"));

  EXPECT_EQ(ReadJsonFile(dir.Sub("missing.json")).status().code(), absl::StatusCode::kNotFound);
}

TEST(JsonReaderTest, ValidatesUtf8) {
  EXPECT_TRUE(IsValidUtf8("plain \xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("\xf5\x80\x80\x80"));  // past U+10FFFF
}

}  // namespace
}  // namespace ckv::tools
