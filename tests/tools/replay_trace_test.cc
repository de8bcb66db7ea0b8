// SPDX-License-Identifier: Apache-2.0
// Tests of the replay trace reader (tools/replay_trace.h).
#include "tools/replay_trace.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

namespace ckv::tools {
namespace {

TEST(ReplayTraceTest, TurnsAppendListedOrGeneratedTokensPerConversation) {
  const std::string text =
      "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 7, \"tokens\": 40}}\n"
      "\n"
      "{\"conversation\": \"b\", \"turn\": 1, \"generate\": {\"tokens\": 40, \"seed\": 7}}\r\n"
      "{\"conversation\": \"a\", \"turn\": 2, \"tokens\": [0, 5, 2147483647]}\n"
      "{\"conversation\": \"a\", \"turn\": 3, \"tokens\": []}";
  auto turns = ParseTrace(text, "t.jsonl");
  ASSERT_TRUE(turns.ok()) << turns.status();
  ASSERT_EQ(turns->size(), 4u);
  EXPECT_EQ((*turns)[0].conversation, "a");
  EXPECT_EQ((*turns)[0].turn, 1u);
  EXPECT_EQ((*turns)[0].line, 1u);
  EXPECT_EQ((*turns)[0].tokens, synth::Tokens(7, 40));
  EXPECT_EQ((*turns)[1].conversation, "b");
  EXPECT_EQ((*turns)[1].line, 3u);
  EXPECT_EQ((*turns)[1].tokens, (*turns)[0].tokens) << "same seed, same system prompt";
  EXPECT_EQ((*turns)[2].turn, 2u);
  EXPECT_EQ((*turns)[2].tokens, (std::vector<int32_t>{0, 5, 2147483647}));
  EXPECT_TRUE((*turns)[3].tokens.empty());
}

TEST(ReplayTraceTest, BadLinesNameTheFileTheLineAndWhatIsWrong) {
  const std::string ok = "{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [1]}\n";
  const std::pair<std::string, std::string> cases[] = {
      {"[1, 2]", "t.jsonl:2: a turn is a JSON object, not an array"},
      {"{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [1]}",
       "t.jsonl:2: turn 1 of conversation \"a\" follows turn 1 (turns are 1, 2, 3, ...)"},
      {"{\"conversation\": \"b\", \"turn\": 2, \"tokens\": [1]}",
       "t.jsonl:2: turn 2 of conversation \"b\" follows turn 0 (turns are 1, 2, 3, ...)"},
      {"{\"conversation\": \"\", \"turn\": 1, \"tokens\": [1]}",
       "t.jsonl:2: \"conversation\" must be a non-empty string"},
      {"{\"conversation\": \"b\", \"turn\": 0, \"tokens\": [1]}",
       "t.jsonl:2: \"turn\" must be an integer >= 1"},
      {"{\"conversation\": \"b\", \"turn\": 1}",
       "t.jsonl:2: a turn has either \"tokens\" or \"generate\", not both or neither"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"tokens\": [1, -1]}",
       "t.jsonl:2: token 1 is not an integer in [0, 2147483647]"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"tokens\": [2147483648]}",
       "t.jsonl:2: token 0 is not an integer in [0, 2147483647]"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"tokens\": \"1 2\"}",
       "t.jsonl:2: \"tokens\" is a string, not an array of token ids"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"generate\": {\"seed\": 1}}",
       "t.jsonl:2: \"generate\" must be {\"seed\": S, \"tokens\": N} with integers S >= 0 and "
       "N >= 0"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"tokens\": [1], \"role\": \"user\"}",
       "t.jsonl:2: unknown member \"role\" (known: conversation, turn, tokens, generate)"},
      {"{\"conversation\": \"b\", \"turn\": 1, \"tokens\": [1],}", "t.jsonl:2: JSON at byte"},
  };
  for (const auto& [line, want] : cases) {
    auto turns = ParseTrace(ok + line + "\n", "t.jsonl");
    ASSERT_FALSE(turns.ok()) << line;
    EXPECT_EQ(turns.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(std::string(turns.status().message()).substr(0, want.size()), want) << line;
  }
}

TEST(ReplayTraceTest, LimitsBoundContextsTheWholeTraceAndLines) {
  TraceLimits limits;
  limits.max_context_tokens = 100;
  limits.max_total_tokens = 150;
  limits.max_line_bytes = 200;
  const std::string two_turns =
      "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 60}}\n"
      "{\"conversation\": \"a\", \"turn\": 2, \"generate\": {\"seed\": 2, \"tokens\": 41}}\n";
  auto context = ParseTrace(two_turns, "t", limits);
  EXPECT_EQ(context.status().message(),
            "t:2: conversation \"a\" would reach 101 tokens at turn 2; the limit is 100");
  const std::string total =
      "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 100}}\n"
      "{\"conversation\": \"b\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": 51}}\n";
  EXPECT_EQ(ParseTrace(total, "t", limits).status().message(),
            "t:2: the trace reaches 151 tokens; the limit is 150");
  const std::string huge = "{\"conversation\": \"" + std::string(300, 'x') + "\"}";
  EXPECT_EQ(ParseTrace(huge, "t", limits).status().message(),
            "t:1: line of 320 bytes; the limit is 200");
  // A generated turn is bounded before anything is generated.
  const std::string absurd =
      "{\"conversation\": \"a\", \"turn\": 1, \"generate\": {\"seed\": 1, \"tokens\": "
      "9000000000000000000}}";
  EXPECT_FALSE(ParseTrace(absurd, "t").ok());
}

TEST(ReplayTraceTest, FilesAreReadUpToTheirLimit) {
  ::ckv::testing::TempDir dir;
  const std::string path = dir.path() + "/trace.jsonl";
  std::ofstream(path) << "{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [3, 4]}\n";
  auto turns = ReadTraceFile(path);
  ASSERT_TRUE(turns.ok()) << turns.status();
  EXPECT_EQ((*turns)[0].tokens, (std::vector<int32_t>{3, 4}));
  TraceLimits small;
  small.max_file_bytes = 10;
  EXPECT_EQ(ReadTraceFile(path, small).status().message(),
            path + ": over the trace size limit of 10 bytes");
  EXPECT_EQ(ReadTraceFile(dir.path() + "/missing.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

// Regression: /dev/zero as a trace was read up to the 256 MiB file limit before
// it was refused; ReadTraceText refuses a non-trace in the read that shows it is one.
TEST(ReplayTraceTest, ReadTraceTextRefusesWhatIsNoTraceAsItReadsIt) {
  ::ckv::testing::TempDir dir;
  TraceLimits limits;
  limits.max_line_bytes = 64;
  const auto read = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return ReadTraceText(path, limits);
  };
  const std::string line = "{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [3]}\n";
  auto text = read("ok.jsonl", "\n  " + line + "\r\n\t" + line);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "\n  " + line + "\r\n\t" + line);
  EXPECT_EQ(read("nul.jsonl", line + std::string("{\0", 2)).status().message(),
            dir.path() +
                "/nul.jsonl:2: a NUL byte at byte 49 of the file: binary data, not a "
                "JSON Lines trace");
  EXPECT_EQ(read("text.jsonl", line + "  # \x1b[2J\n").status().message(),
            dir.path() +
                "/text.jsonl:2: the line starts with '#', not '{': every line of a "
                "trace is a JSON object");
  EXPECT_EQ(read("esc.jsonl", "\x1b[2J").status().message(),
            dir.path() +
                "/esc.jsonl:1: the line starts with '\\x1b', not '{': every line of a "
                "trace is a JSON object");
  EXPECT_EQ(read("long.jsonl", line + "{" + std::string(100, ' ') + "}\n").status().message(),
            dir.path() + "/long.jsonl:2: line of more than 64 bytes; the limit is 64");
  // /dev/zero: refused in its first read, whatever the file limit.
  limits.max_file_bytes = size_t{1} << 40;
  const auto zero = ReadTraceText("/dev/zero", limits);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.status().message(),
            "/dev/zero:1: a NUL byte at byte 0 of the file: binary data, not a JSON Lines trace");
}

}  // namespace
}  // namespace ckv::tools
