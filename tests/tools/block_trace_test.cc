// SPDX-License-Identifier: Apache-2.0
// Tests of the public trace formats (tools/block_trace.h) and the synthetic Mooncake trace
// (tools/synthetic_trace.h). The traces are written here; no recorded data is used.
#include "tools/block_trace.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"
#include "gtest/gtest.h"
#include "tools/synthetic_trace.h"

namespace ckv::tools {
namespace {

TEST(BlockTraceTest, DetectsTheFormatFromTheFirstRequest) {
  EXPECT_EQ(*DetectTraceFormat("\n{\"conversation\": \"a\", \"turn\": 1, \"tokens\": [1]}", "t"),
            TraceFormat::kCkv);
  EXPECT_EQ(*DetectTraceFormat("{\"timestamp\": 0, \"hash_ids\": [1]}\nnot json", "t"),
            TraceFormat::kMooncake);
  EXPECT_EQ(*DetectTraceFormat("{\"chat_id\": 3, \"hash_ids\": [1]}", "t"), TraceFormat::kBailian);
  EXPECT_EQ(DetectTraceFormat(" \n\n", "t.jsonl").status().message(),
            "t.jsonl: the trace is empty");
  const auto unknown = DetectTraceFormat("\n{\"prompt\": \"hi\"}", "t.jsonl");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StartsWith(unknown.status().message(), "t.jsonl:2: cannot tell the trace format"))
      << unknown.status();
  EXPECT_EQ(*ParseTraceFormat("bailian"), TraceFormat::kBailian);
  EXPECT_EQ(ParseTraceFormat("sharegpt").status().message(),
            "trace format 'sharegpt' is not ckv, mooncake or bailian");
}

TEST(BlockTraceTest, ParsesMooncakeWithItsPartialLastBlock) {
  const std::string text =
      "{\"timestamp\": 1500, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [4, 9, "
      "2]}\n"
      "\n"
      "{\"timestamp\": 2000, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [4],"
      " \"extra\": true}\n";
  auto trace = ParseBlockTrace(text, "m.jsonl", TraceFormat::kMooncake);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->block_tokens, 512u);
  ASSERT_EQ(trace->requests.size(), 2u);
  const BlockRequest& r = trace->requests[0];
  EXPECT_EQ(r.label, "r0");
  EXPECT_DOUBLE_EQ(r.arrival_seconds, 1.5);
  EXPECT_EQ(r.tokens, 1030u);
  EXPECT_EQ(r.output_tokens, 7u);
  EXPECT_EQ(r.hash_ids, (std::vector<uint64_t>{4, 9, 2}));
  EXPECT_EQ(trace->requests[1].line, 3u);
  const std::vector<int32_t> tokens = RequestTokens(*trace, r);
  ASSERT_EQ(tokens.size(), 1030u);
  // Block 2 holds 6 tokens: the first 6 of block id 2's tokens.
  EXPECT_EQ(std::vector<int32_t>(tokens.begin() + 1024, tokens.end()), BlockTokens(2, 6));
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 512), BlockTokens(4, 512));
  EXPECT_NE(BlockTokens(4, 512), BlockTokens(9, 512));
}

TEST(BlockTraceTest, ParsesBailian) {
  const std::string text =
      "{\"chat_id\": 159, \"parent_chat_id\": -1, \"timestamp\": 61.25, \"input_length\": 40,"
      " \"output_length\": 132, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1089, 1090, 7]}\n"
      "{\"chat_id\": 160, \"parent_chat_id\": 159, \"timestamp\": 62, \"input_length\": 48,"
      " \"output_length\": 1, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [1089, 1090, 8]}\n";
  auto trace = ParseBlockTrace(text, "b.jsonl", TraceFormat::kBailian);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->block_tokens, 16u);
  ASSERT_EQ(trace->requests.size(), 2u);
  EXPECT_EQ(trace->requests[0].label, "159");
  EXPECT_DOUBLE_EQ(trace->requests[0].arrival_seconds, 61.25);
  EXPECT_EQ(trace->requests[0].tokens, 40u);
  EXPECT_EQ(trace->requests[1].turn, 2u);
  const std::vector<int32_t> a = RequestTokens(*trace, trace->requests[0]);
  const std::vector<int32_t> b = RequestTokens(*trace, trace->requests[1]);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 32, b.begin())) << "shared ids 1089, 1090";
  EXPECT_NE(a[32], b[32]);
}

TEST(BlockTraceTest, BlockTokensScaleEveryBlockAndThePartialLastOneRoundsUp) {
  const std::string text =
      "{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n"
      "{\"timestamp\": 1, \"input_length\": 1536, \"output_length\": 1, \"hash_ids\": [1, 2, 5]}\n"
      "{\"timestamp\": 2, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [6]}\n";
  BlockTraceOptions options;
  options.block_tokens = 32;
  auto trace = ParseBlockTrace(text, "m.jsonl", TraceFormat::kMooncake, options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->block_tokens, 32u);
  EXPECT_EQ(trace->requests[0].tokens, 65u);  // 2 * 32 + ceil(1 * 32 / 512)
  EXPECT_EQ(trace->requests[1].tokens, 96u);  // a whole last block
  EXPECT_EQ(trace->requests[2].tokens, 7u);   // ceil(100 * 32 / 512)
  options.max_requests = 2;
  trace = ParseBlockTrace(text + "not json\n", "m.jsonl", TraceFormat::kMooncake, options);
  ASSERT_TRUE(trace.ok()) << "lines past --max-requests are not read: " << trace.status();
  EXPECT_EQ(trace->requests.size(), 2u);
}

TEST(BlockTraceTest, EqualHashIdsGiveEqualChunkKeys) {
  const std::string text =
      "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n"
      "{\"timestamp\": 1, \"input_length\": 1400, \"output_length\": 1, \"hash_ids\": [1, 2, 4]}\n"
      "{\"timestamp\": 2, \"input_length\": 1400, \"output_length\": 1, \"hash_ids\": [2, 1, 4]}\n";
  BlockTraceOptions options;
  options.block_tokens = 64;
  auto trace = ParseBlockTrace(text, "m.jsonl", TraceFormat::kMooncake, options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  auto keys = [&](size_t i) {
    return ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens,
                          RequestTokens(*trace, trace->requests[i]));
  };
  const std::vector<ChunkKey> a = keys(0), b = keys(1), c = keys(2);
  ASSERT_EQ(a.size(), 11u);  // (64 + 64 + ceil(476 * 64 / 512) = 60) / 16, whole chunks
  ASSERT_EQ(b.size(), 10u);  // (128 + 47) / 16
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 8, b.begin())) << "blocks 1, 2: 8 chunks";
  EXPECT_NE(a[8], b[8]);
  EXPECT_NE(a[0], c[0]) << "the same ids in another order are another prefix";
}

TEST(BlockTraceTest, BadRequestsNameTheFileTheLineAndTheValue) {
  const std::string ok =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n";
  const std::pair<std::string, std::string> cases[] = {
      {"[1]", "m.jsonl:2: a request is a JSON object, not an array"},
      {"{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
       "m.jsonl:2: \"timestamp\" missing is not a number >= 0 (milliseconds)"},
      {"{\"timestamp\": -3, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
       "m.jsonl:2: \"timestamp\" -3 is not a number >= 0 (milliseconds)"},
      {"{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": [1]}",
       "m.jsonl:2: \"input_length\" 0 is not an integer >= 1"},
      {"{\"timestamp\": 1, \"input_length\": \"9\", \"output_length\": 1, \"hash_ids\": [1]}",
       "m.jsonl:2: \"input_length\" \"9\" is not an integer >= 1"},
      {"{\"timestamp\": 1, \"input_length\": 9000, \"output_length\": 1, \"hash_ids\": [1, 2]}",
       "m.jsonl:2: \"input_length\" 9000 does not fit 2 blocks of 512 tokens (513..1024)"},
      {"{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": []}",
       "m.jsonl:2: \"hash_ids\" is empty; a request has at least one block"},
      {"{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": 4}",
       "m.jsonl:2: \"hash_ids\" is 4, not an array of block ids"},
      {"{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, -2]}",
       "m.jsonl:2: hash id 1 is -2, not an integer >= 0"},
      {"{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [[1]]}",
       "m.jsonl:2: hash id 0 is an array, not an integer >= 0"},
  };
  for (const auto& [line, message] : cases) {
    auto trace = ParseBlockTrace(ok + line + "\n", "m.jsonl", TraceFormat::kMooncake);
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(trace.status().message(), message) << line;
  }
  auto bailian = ParseBlockTrace(
      "{\"chat_id\": -4, \"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, "
      "\"hash_ids\": [1]}",
      "b.jsonl", TraceFormat::kBailian);
  EXPECT_EQ(bailian.status().message(),
            "b.jsonl:1: \"chat_id\" -4 is not an integer >= 0 or a short string");
  bailian = ParseBlockTrace(
      "{\"chat_id\": 4, \"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, "
      "\"turn\": \"two\", \"hash_ids\": [1]}",
      "b.jsonl", TraceFormat::kBailian);
  EXPECT_EQ(bailian.status().message(), "b.jsonl:1: \"turn\" \"two\" is not an integer >= 0");
}

TEST(BlockTraceTest, LimitsBoundLinesRequestsAndTheWholeTrace) {
  const std::string line =
      "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";
  TraceLimits limits;
  limits.max_line_bytes = 40;
  EXPECT_EQ(ParseBlockTrace(line, "m", TraceFormat::kMooncake, {}, limits).status().message(),
            "m:1: line of 78 bytes; the limit is 40");
  limits = {};
  limits.max_context_tokens = 1000;
  EXPECT_EQ(ParseBlockTrace(line, "m", TraceFormat::kMooncake, {}, limits).status().message(),
            "m:1: the request has 1024 tokens at 512 per block; the limit is 1000");
  BlockTraceOptions small;
  small.block_tokens = 16;  // 32 tokens: within the limit once scaled
  EXPECT_TRUE(ParseBlockTrace(line, "m", TraceFormat::kMooncake, small, limits).ok());
  limits = {};
  limits.max_total_tokens = 2047;
  EXPECT_EQ(
      ParseBlockTrace(line + line, "m", TraceFormat::kMooncake, {}, limits).status().message(),
      "m:2: the trace reaches 2048 tokens at 512 per block; the limit is 2047");
  small.block_tokens = 65537;
  EXPECT_EQ(ParseBlockTrace(line, "m", TraceFormat::kMooncake, small).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticTraceTest, IsAMooncakeTraceWithSharedAndExtendedPrefixes) {
  SyntheticTraceOptions o;
  o.requests = 300;
  o.prefix_blocks_min = 2;
  o.prefix_blocks_max = 3;
  const std::string text = SyntheticMooncakeTrace(o);
  EXPECT_EQ(text, SyntheticMooncakeTrace(o)) << "deterministic";
  ASSERT_EQ(*DetectTraceFormat(text, "s"), TraceFormat::kMooncake);
  auto trace = ParseBlockTrace(text, "s", TraceFormat::kMooncake);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 300u);
  // Ids are position-chained, so a request's leading run of ids seen before is the prefix it
  // shares with earlier requests: a shared prefix alone gives at most 3 blocks; more is a later
  // turn extending an earlier prompt.
  absl::flat_hash_set<uint64_t> seen;
  uint64_t shared = 0, extended = 0;
  double last = 0;
  for (const BlockRequest& r : trace->requests) {
    EXPECT_GE(r.arrival_seconds, last);
    last = r.arrival_seconds;
    size_t run = 0;
    while (run < r.hash_ids.size() && seen.contains(r.hash_ids[run])) ++run;
    shared += run > 0;
    extended += run > 3;
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  EXPECT_GT(shared, 200u);
  EXPECT_LT(shared, 300u);
  EXPECT_GT(extended, 50u);
  EXPECT_LT(extended, 250u);
}

}  // namespace
}  // namespace ckv::tools
