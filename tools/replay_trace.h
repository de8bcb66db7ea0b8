// SPDX-License-Identifier: Apache-2.0
// tools/replay_trace.h: multi-turn traces for `kvctl replay`, read from JSON Lines.
//
// One line per turn, in the order the turns arrive:
//
//   {"conversation": "c1", "turn": 1, "generate": {"seed": 7, "tokens": 1024}}
//   {"conversation": "c1", "turn": 2, "tokens": [151644, 8948, 198]}
//
// A turn's tokens are appended to its conversation's context, and the request of the turn is the
// whole context so far: turn 2 of c1 above is a prompt of 1027 tokens whose first 1024 are turn
// 1's. "tokens" lists token ids (0 <= id < 2^31); "generate" asks the synthetic generator for
// `tokens` ids from `seed` (synth::Tokens), so conversations whose first turn generates from the
// same seed share a system prompt. Blank lines are skipped. Turns of a conversation must be
// numbered 1, 2, 3, ... in the order they appear; conversations may interleave.
//
// The input may be hostile: the file, a line and the tokens of a turn and of a whole context are
// bounded (TraceLimits), and every error is an InvalidArgument naming the file and line:
// "trace.jsonl:3: turn 3 of conversation \"c1\" follows turn 1".
//
// Thread-safety: pure functions.
#ifndef CKV_TOOLS_REPLAY_TRACE_H_
#define CKV_TOOLS_REPLAY_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckv::tools {

struct TraceTurn {
  std::string conversation;
  uint64_t turn = 0;            // 1, 2, ... within its conversation
  std::vector<int32_t> tokens;  // appended to the conversation's context
  size_t line = 0;              // 1-based line of the trace it came from
};

struct TraceLimits {
  // Largest trace file, bytes. Default: 256 MiB.
  size_t max_file_bytes = size_t{256} << 20;
  // Longest line, bytes. Default: 16 MiB.
  size_t max_line_bytes = size_t{16} << 20;
  // Most tokens one conversation's context may reach (generated or listed). Default: 1 << 20.
  size_t max_context_tokens = size_t{1} << 20;
  // Most tokens in the whole trace. Default: 1 << 26.
  size_t max_total_tokens = size_t{1} << 26;
};

// Calls `fn(line_number, content)` for each line of JSON Lines `text` that is not blank (lines
// numbered from 1; a trailing CR dropped; lines of spaces and tabs skipped), in order, until `fn`
// returns false or an error, which it returns. The trace readers share it.
absl::Status ForEachLine(
    std::string_view text,
    const std::function<absl::StatusOr<bool>(size_t line, std::string_view content)>& fn);

// Parses the JSON Lines `text`; `name` (a path, say) prefixes error messages.
absl::StatusOr<std::vector<TraceTurn>> ParseTrace(std::string_view text, std::string_view name,
                                                  const TraceLimits& limits = {});

// The text of the trace file at `path` (any of the JSON Lines trace formats), checked as it is
// read so that a file that is no trace is refused early, not after limits.max_file_bytes:
// a NUL byte (binary data, /dev/zero) is refused in the read that brings it, and so is a line
// whose first character other than space or tab is not '{' (every line of a trace is a JSON
// object); a line is refused once it grows past limits.max_line_bytes, the file once it grows
// past limits.max_file_bytes. So at most max_line_bytes plus one read (64 KiB) is held before a
// refusal. Errors: the mapped open/read error; InvalidArgument naming the path (and line).
absl::StatusOr<std::string> ReadTraceText(const std::string& path, const TraceLimits& limits = {});

// Reads the file at `path` (ReadTraceText) and parses it. Errors name the path.
absl::StatusOr<std::vector<TraceTurn>> ReadTraceFile(const std::string& path,
                                                     const TraceLimits& limits = {});

}  // namespace ckv::tools

#endif  // CKV_TOOLS_REPLAY_TRACE_H_
