// SPDX-License-Identifier: Apache-2.0
#include "tests/replay/trace.h"

#include <algorithm>

#include "tools/synthetic_kv.h"

namespace ckv::replay {
namespace {

using synth::Mix64;

uint64_t Derive(uint64_t seed, uint64_t purpose, uint64_t a, uint64_t b = 0) {
  return Mix64(Mix64(Mix64(seed ^ (purpose * 0x9e3779b97f4a7c15ull)) ^ a) ^ (b + 1));
}

// A length in [lo, hi], from (seed, purpose, a, b).
size_t Length(uint64_t seed, uint64_t purpose, uint64_t a, uint64_t b, size_t lo, size_t hi) {
  return lo + Derive(seed, purpose, a, b) % (hi - lo + 1);
}

enum Purpose : uint64_t {
  kSharedTokens = 1,
  kSharedLength = 2,
  kTurnTokens = 3,
  kTurnLength = 4,
  kSourcePick = 5,
};

void Append(std::vector<int32_t>& to, uint64_t stream_seed, size_t count) {
  const std::vector<int32_t> more = synth::Tokens(stream_seed, count);
  to.insert(to.end(), more.begin(), more.end());
}

struct ShapeParams {
  uint32_t sources = 0;                 // shared system prompts / documents (0: none)
  size_t shared_lo = 0, shared_hi = 0;  // tokens of each shared source
  uint32_t conversations = 0;
  uint32_t turns = 0;                 // per conversation
  size_t first_lo = 0, first_hi = 0;  // tokens the first turn adds after the shared source
  size_t next_lo = 0, next_hi = 0;    // tokens each later turn adds
};

ShapeParams ParamsOf(TraceShape shape, uint32_t scale) {
  ShapeParams p;
  switch (shape) {
    case TraceShape::kSharedSystemPrompt:
      // ~700-token system prompt (43-47 whole chunks, shared by every conversation), then short
      // user turns: a conversation ends around 1.1K tokens.
      p = {1, 700, 760, 6 * scale, 6, 20, 60, 30, 90};
      break;
    case TraceShape::kSharedDocuments:
      // Three documents of 0.9-1.4K tokens; each user picks one and asks a few questions.
      p = {3, 900, 1400, 8 * scale, 3, 20, 60, 30, 80};
      break;
    case TraceShape::kDeepConversations:
      // No shared beginning; 22+ turns growing to ~1.5-2K tokens.
      p = {0, 0, 0, 2 * scale, 22 * scale, 60, 120, 40, 80};
      break;
  }
  return p;
}

}  // namespace

std::string_view TraceShapeName(TraceShape shape) {
  switch (shape) {
    case TraceShape::kSharedSystemPrompt:
      return "shared-system-prompt";
    case TraceShape::kSharedDocuments:
      return "shared-documents";
    case TraceShape::kDeepConversations:
      return "deep-conversations";
  }
  return "?";
}

size_t Trace::max_prompt_tokens() const {
  size_t m = 0;
  for (const Turn& t : turns) m = std::max(m, t.prompt.size());
  return m;
}

Trace GenerateTrace(TraceShape shape, uint64_t seed, uint32_t scale) {
  scale = std::max<uint32_t>(scale, 1);
  const ShapeParams p = ParamsOf(shape, scale);
  Trace trace;
  trace.shape = shape;
  trace.conversations = p.conversations;

  std::vector<std::vector<int32_t>> sources(p.sources);
  for (uint32_t s = 0; s < p.sources; ++s) {
    Append(sources[s], Derive(seed, kSharedTokens, s),
           Length(seed, kSharedLength, s, 0, p.shared_lo, p.shared_hi));
  }
  // Round-robin over the conversations, turn by turn: turn t of every conversation comes
  // before turn t + 1 of any, so conversations compete for the tiers and the store.
  std::vector<Turn> last(p.conversations);
  for (uint32_t t = 0; t < p.turns; ++t) {
    for (uint32_t c = 0; c < p.conversations; ++c) {
      Turn turn;
      turn.conversation = c;
      turn.turn = t;
      if (t == 0) {
        if (p.sources > 0) {
          turn.shared_source = static_cast<uint32_t>(Derive(seed, kSourcePick, c) % p.sources);
          turn.prompt = sources[turn.shared_source];
          turn.shared_tokens = turn.prompt.size();
        }
        Append(turn.prompt, Derive(seed, kTurnTokens, c, t),
               Length(seed, kTurnLength, c, t, p.first_lo, p.first_hi));
      } else {
        turn.shared_source = last[c].shared_source;
        turn.shared_tokens = last[c].shared_tokens;
        turn.prompt = last[c].prompt;
        Append(turn.prompt, Derive(seed, kTurnTokens, c, t),
               Length(seed, kTurnLength, c, t, p.next_lo, p.next_hi));
      }
      last[c] = turn;
      trace.turns.push_back(std::move(turn));
    }
  }
  return trace;
}

}  // namespace ckv::replay
