// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/workload.h"

#include <cmath>

#include "tools/json_writer.h"

namespace ckv::bench {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Workload::Workload(const Flags& f, ModelSpec spec) : f_(f), spec_(std::move(spec)) {
  stored_tokens_ = f.prefix_tokens + size_t{f.turns - 1} * f.suffix_tokens;
  const size_t shared = static_cast<size_t>(std::llround(f.system_prompt_share * f.prefix_tokens));
  tokens_.resize(f.conversations);
  for (uint32_t c = 0; c < f.conversations; ++c) {
    auto& t = tokens_[c];
    t.resize(stored_tokens_ + f.suffix_tokens);
    for (size_t i = 0; i < t.size(); ++i) {
      const uint64_t h = i < shared ? Mix(f.seed * 1000003 + i) : Mix(Mix(f.seed + 7919 * (c + 1)) + i);
      t[i] = static_cast<int32_t>(h % 151643);  // qwen2.5's vocabulary
    }
  }
  base_.seed = f.seed;
  base_.window = f.window;
  base_.profile = *synth::ParseAttentionProfile(f.attention_profile);
  if (f.request_shift >= 0) base_.request_shift = f.request_shift;
  for (uint32_t turn = 0; turn < f.turns; ++turn) {
    for (uint32_t c = 0; c < f.conversations; ++c) {
      requests_.push_back({c, turn, turn < f.warmup_turns});
    }
  }
}

uint64_t Workload::store_bytes() const {
  return uint64_t(stored_tokens_ / spec_.chunk_tokens) * spec_.RecordBytes() * spec_.layers *
         f_.conversations;
}

synth::AttentionParams Workload::Params(uint32_t conversation) const {
  synth::AttentionParams p = base_;
  // Distinct KV per conversation. The planted-chunks profile keeps its one shared KV, as the
  // stores measured before the calibrated profile had it.
  if (p.profile != synth::AttentionProfile::kPlantedChunks) {
    p.seed = Mix(f_.seed * 7717 + conversation + 1);
  }
  return p;
}

synth::AttentionParams Workload::Params(const Request& r) const {
  synth::AttentionParams p = Params(r.conversation);
  p.request = r.turn;
  p.query_seed = Mix(f_.seed * 31 + r.conversation * 1009 + r.turn + 1);
  return p;
}

std::vector<std::vector<float>> Workload::Queries(const Request& r) const {
  synth::SyntheticAttention gen(spec_, stored_tokens_, Params(r));
  std::vector<std::vector<float>> q(spec_.layers);
  for (uint32_t l = 0; l < spec_.layers; ++l) q[l] = gen.Queries(l);
  return q;
}

std::string Workload::Manifest() const {
  tools::JsonWriter w;
  w.BeginObject().Key("model").String(f_.model).Key("prefix_tokens").Uint(f_.prefix_tokens);
  w.Key("suffix_tokens").Uint(f_.suffix_tokens).Key("conversations").Uint(f_.conversations);
  w.Key("turns").Uint(f_.turns).Key("system_prompt_share").Double(f_.system_prompt_share);
  w.Key("seed").Uint(f_.seed).Key("window").Uint(f_.window).Key("generator").Uint(2);
  // The KV depends on the profile, not on the requests' shift (queries are not stored).
  w.Key("attention_profile").String(f_.attention_profile);
  w.EndObject();
  return w.str();
}

}  // namespace ckv::bench
