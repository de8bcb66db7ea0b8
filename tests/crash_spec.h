// tests/crash_spec.h: the model and prefixes that the crash child writes and the crash test checks.
#ifndef CKV_TESTS_CRASH_SPEC_H_
#define CKV_TESTS_CRASH_SPEC_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ckv/model_spec.h"
#include "tools/synthetic_kv.h"

namespace ckv::crash {

// A small model (8 layers, 2 KV heads of 64, fp16: 8 KiB records, 64 KiB chunks), so that a
// crash run does many Puts in little time.
inline ModelSpec Spec() {
  ModelSpec spec;
  spec.model_id = "crash-test-model";
  spec.layers = 8;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;
}

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

inline std::string Format(const char* verb, const Prefix& p) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s %llu %llu %llu", verb,
                static_cast<unsigned long long>(p.seed), static_cast<unsigned long long>(p.chunks),
                static_cast<unsigned long long>(p.shared_chunks));
  return buf;
}

// Parses a line Format wrote; false for anything else (a line cut short by the kill).
inline bool Parse(const std::string& line, std::string* verb, Prefix* p) {
  char v[16];
  unsigned long long seed, chunks, shared;
  if (std::sscanf(line.c_str(), "%15s %llu %llu %llu", v, &seed, &chunks, &shared) != 4) {
    return false;
  }
  *verb = v;
  *p = Prefix{seed, chunks, shared};
  return true;
}

}  // namespace ckv::crash

#endif  // CKV_TESTS_CRASH_SPEC_H_
