// SPDX-License-Identifier: Apache-2.0
// tests/reliability/crash_spec.h: the model and prefixes that the crash child writes and the crash
// test checks.
#ifndef CKV_TESTS_CRASH_SPEC_H_
#define CKV_TESTS_CRASH_SPEC_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ckv/model_spec.h"
#include "ckv/session.h"
#include "tests/shaped_spec.h"
#include "tools/synthetic_kv.h"

namespace ckv::crash {

// A small model (8 layers, 2 KV heads of 64, fp16: 8 KiB records, 64 KiB chunks), so that a
// crash run does many Puts in little time.
inline ModelSpec Spec() { return ::ckv::testing::ShapedSpec("crash-test-model", 8, 4, 2, 64); }

struct Prefix {
  uint64_t seed = 0;
  uint64_t chunks = 0;
  uint64_t shared_chunks = 0;  // leading chunks from a system prompt shared by all prefixes
};

inline constexpr uint64_t kSharedSeed = 4242;

inline std::vector<int32_t> TokensOf(const ModelSpec& spec, const Prefix& p) {
  return synth::TokensWithSharedPrefix(kSharedSeed, p.shared_chunks * spec.chunk_tokens, p.seed,
                                       p.chunks * spec.chunk_tokens);
}

// "<verb> <seed> <chunks> <shared_chunks> <value>": value is what the verb reports about the
// prefix (0 when it reports nothing).
inline std::string Format(const char* verb, const Prefix& p, uint64_t value = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %llu %llu %llu %llu", verb,
                static_cast<unsigned long long>(p.seed), static_cast<unsigned long long>(p.chunks),
                static_cast<unsigned long long>(p.shared_chunks),
                static_cast<unsigned long long>(value));
  return buf;
}

// Parses a line Format wrote; false for anything else (a line cut short by the kill).
inline bool Parse(const std::string& line, std::string* verb, Prefix* p,
                  uint64_t* value = nullptr) {
  char v[16];
  unsigned long long seed, chunks, shared, val;
  if (std::sscanf(line.c_str(), "%15s %llu %llu %llu %llu", v, &seed, &chunks, &shared, &val) !=
      5) {
    return false;
  }
  *verb = v;
  *p = Prefix{seed, chunks, shared};
  if (value != nullptr) *value = val;
  return true;
}

// What a crash child runs (its MODE argument).
//   puts:  Puts, and a Delete of one of its own Puts one time in five.
//   mixed: a seeded mix of Puts, Deletes, Re-Prefill sessions (Begin, every layer's queries
//          and view, Finish, which persists I and F) and Gc, over the prefixes it Put and those
//          the parent lists in its KNOWN file. With a cap, its Puts evict.
enum class Mode { kPuts, kMixed };

// The Re-Prefill options of the mixed mode's sessions: a small window, so queries are cheap.
inline ReprefillOptions SessionOptions() {
  ReprefillOptions o;
  o.budget_fraction = 0.5;
  o.window = 4;
  o.period_layers = 4;
  return o;
}

// Queries of layer `layer` of a session: float32 [window, q_heads, head_dim], uniform in [-2, 2),
// a pure function of (seed, layer).
inline std::vector<float> Queries(const ModelSpec& spec, const ReprefillOptions& o, uint64_t seed,
                                  uint32_t layer) {
  std::vector<float> q(size_t{o.window} * spec.q_heads * spec.head_dim);
  uint64_t x = (seed * 0x9e3779b97f4a7c15ull) ^ (uint64_t{layer} + 1) * 0xbf58476d1ce4e5b9ull;
  for (float& f : q) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 4.0 - 2.0);
  }
  return q;
}

}  // namespace ckv::crash

#endif  // CKV_TESTS_CRASH_SPEC_H_
