// SPDX-License-Identifier: Apache-2.0
// tools/block_trace.h: the public KV-cache traces of production studies, for `kvctl replay` and
// bench/replay_bench. Both are JSON Lines, one request per line, in arrival order:
//
//   Mooncake (FAST'25), 512-token blocks, timestamp in milliseconds:
//     {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}
//   Alibaba Qwen-Bailian (ATC'25), 16-token blocks, timestamp in seconds:
//     {"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521,
//      "output_length": 132, "type": "text", "turn": 1, "hash_ids": [1089, 1090, 1091]}
//
// A request's prompt is its blocks, in order: hash id i stands for the i-th block of the prompt
// (it hashes the block and every token before it), so equal ids mean an equal prefix block.
// The tokens of a block are a pure function of its id (BlockTokens), so equal ids give equal
// tokens, equal chunk keys and dedup hits in the store. The last block may be partial:
// input_length = (n - 1) * native + r with n = hash_ids count and 1 <= r <= native (native = the
// format's block: 512 or 16 tokens); any other input_length is an error.
//
// Scaling (--block-tokens B): every block becomes B tokens, the partial last one ceil(r * B /
// native), so a trace of long prompts fits a small machine while keeping its sharing structure.
// A block of fewer tokens is a prefix of the same id's whole block.
//
// Members other than those named above are ignored (the formats may grow). The input may be
// hostile: file, line, request and total tokens are bounded by TraceLimits (a request keeps 8
// bytes per hash id, and every id is at least one token), and errors are
// InvalidArgument naming file:line and the value: "t.jsonl:3: \"input_length\" 9000 does not fit
// 2 blocks of 512 tokens (513..1024)".
//
// Thread-safety: pure functions.
#ifndef CKV_TOOLS_BLOCK_TRACE_H_
#define CKV_TOOLS_BLOCK_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/replay_trace.h"

namespace ckv::tools {

enum class TraceFormat { kCkv, kMooncake, kBailian };

// "ckv", "mooncake", "bailian".
std::string_view TraceFormatName(TraceFormat format);
// The inverse of TraceFormatName; InvalidArgument naming `name` otherwise.
absl::StatusOr<TraceFormat> ParseTraceFormat(std::string_view name);
// Tokens per hash id in the format's own trace: 512 (Mooncake), 16 (Bailian); 0 for kCkv.
uint32_t NativeBlockTokens(TraceFormat format);

// The format of JSON Lines `text`, told from the members of its first non-blank line:
// "conversation" -> ckv; "hash_ids" and "chat_id" -> bailian; "hash_ids" -> mooncake.
// Errors name `name`:line: an empty trace, a line that is not a JSON object, or one that has none
// of those members.
absl::StatusOr<TraceFormat> DetectTraceFormat(std::string_view text, std::string_view name,
                                              const TraceLimits& limits = {});

struct BlockTraceOptions {
  // Tokens per hash id in the replay, 1..65536; 0 = the format's own block. Default: 0.
  uint32_t block_tokens = 0;
  // Most requests read; the rest of the file is not parsed. 0 = all. Default: 0.
  uint64_t max_requests = 0;
};

struct BlockRequest {
  std::string label;           // Bailian: chat_id; Mooncake: "r" and the request's index
  uint64_t turn = 1;           // Bailian: turn; Mooncake: 1
  double arrival_seconds = 0;  // the trace's timestamp, in seconds
  uint64_t tokens = 0;         // prompt tokens after scaling
  uint64_t output_tokens = 0;  // as the trace says (not scaled; not replayed)
  std::vector<uint64_t> hash_ids;
  size_t line = 0;  // 1-based line of the trace it came from
};

struct BlockTrace {
  TraceFormat format = TraceFormat::kMooncake;
  uint32_t block_tokens = 0;  // tokens per hash id in the replay
  std::vector<BlockRequest> requests;
};

// Parses `text` as `format` (kMooncake or kBailian). limits.max_context_tokens bounds one
// request's (scaled) tokens and limits.max_total_tokens all requests' together.
absl::StatusOr<BlockTrace> ParseBlockTrace(std::string_view text, std::string_view name,
                                           TraceFormat format,
                                           const BlockTraceOptions& options = {},
                                           const TraceLimits& limits = {});

// The first `count` tokens of hash block `hash_id`: a pure function of (hash_id, position).
std::vector<int32_t> BlockTokens(uint64_t hash_id, size_t count);

// The prompt of `request` in `trace`: its blocks' tokens, the last one cut to fit.
std::vector<int32_t> RequestTokens(const BlockTrace& trace, const BlockRequest& request);

}  // namespace ckv::tools

#endif  // CKV_TOOLS_BLOCK_TRACE_H_
