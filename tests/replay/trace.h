// SPDX-License-Identifier: Apache-2.0
// tests/replay/trace.h: multi-turn conversation traces for the replay tests.
//
// A trace is a list of turns in the order a serving fleet would see them (conversations
// interleaved round-robin). Every turn's prompt extends the previous turn's prompt of the same
// conversation by new tokens (the model's answer and the user's next message), and the first turn
// of a conversation starts from a shared beginning where the shape has one (a system prompt, a
// RAG document). So a Re-Prefill of turn t can reuse what turn t-1 stored, and conversations that
// share a beginning share its whole chunks.
//
// Shapes (docs/reliability.md, "Replay tests"):
//   kSharedSystemPrompt  one long system prompt, many conversations of short user turns;
//   kSharedDocuments     a few long RAG documents, each reused by several users;
//   kDeepConversations   a few conversations of 20+ turns each, growing to ~2K tokens.
//
// Deterministic: a pure function of (shape, seed, scale). Token ids come from synth::Tokens with
// seeds derived from the trace seed, so two traces with the same arguments are identical.
//
// Thread-safety: pure functions; a Trace is a plain value.
#ifndef CKV_TESTS_REPLAY_TRACE_H_
#define CKV_TESTS_REPLAY_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ckv::replay {

enum class TraceShape : uint8_t { kSharedSystemPrompt, kSharedDocuments, kDeepConversations };

std::string_view TraceShapeName(TraceShape shape);

struct Turn {
  uint32_t conversation = 0;    // index of the conversation in the trace
  uint32_t turn = 0;            // 0 = the conversation's first turn
  uint32_t shared_source = 0;   // which system prompt / document it starts from (0 when none)
  size_t shared_tokens = 0;     // leading tokens that come from that shared source
  std::vector<int32_t> prompt;  // the whole prompt: the previous turn's prompt + new tokens
};

struct Trace {
  TraceShape shape = TraceShape::kSharedSystemPrompt;
  uint32_t conversations = 0;
  std::vector<Turn> turns;  // in replay order
  size_t max_prompt_tokens() const;
};

// Generates a trace. `scale` >= 1 multiplies the number of conversations (and, for
// kDeepConversations, the depth); 1 is the size the CI tests run.
Trace GenerateTrace(TraceShape shape, uint64_t seed, uint32_t scale = 1);

}  // namespace ckv::replay

#endif  // CKV_TESTS_REPLAY_TRACE_H_
