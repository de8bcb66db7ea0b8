// tools/synthetic_attention.h: synthetic K, V and suffix queries with planted attention
// structure, for the selectors' tests and the fidelity benchmark. docs/generator.md describes the
// model of the data and its parameters.
//
// Per (layer, kv head) there is a unit "topic" direction u. Keys are noise plus a boost b_t along
// u; queries point along u (per q head, u tilted by a small head-specific direction). A token's
// attention logit is therefore about b_t plus unit-variance noise, so the planted boosts decide
// where attention goes:
//   - sink: the first `sink_tokens` tokens of chunk 0 get `sink_strength`;
//   - recency: every token of the last `recent_chunks` chunks gets recent_strength * decay^d
//     (d = distance from the end, in chunks);
//   - heavy hitters: `heavy_fraction` of the chunks, each with a strength drawn from
//     heavy_strength + Exp(1) * heavy_tail; only `hot_token_fraction` of a heavy chunk's tokens
//     (chosen per chunk) carry it. The set drifts: each period of `period_layers` layers keeps
//     `period_overlap` of the previous period's set; each layer of a period swaps
//     `layer_drift` of the period's set; each kv head swaps `head_disagreement` of the layer's
//     (the same swaps for every layer of a period).
// Values are unit Gaussian noise.
//
// Everything is a pure function of (spec, tokens, params, layer): layers are generated one at a
// time, on demand.
//
// Thread-safety: a SyntheticAttention is immutable after construction; Generate may be called
// from several threads at once.
#ifndef CKV_TOOLS_SYNTHETIC_ATTENTION_H_
#define CKV_TOOLS_SYNTHETIC_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckv/model_spec.h"

namespace ckv::synth {

struct AttentionParams {
  uint64_t seed = 1;
  uint32_t window = 32;           // suffix queries per layer
  uint32_t period_layers = 8;
  double heavy_fraction = 0.05;   // of the chunks
  double heavy_strength = 3.0;    // logit boost of a heavy hitter's hot tokens (minimum)
  double heavy_tail = 1.5;        // scale of the exponential tail added to it
  double hot_token_fraction = 0.5;
  double period_overlap = 0.6;    // heavy hitters kept from one period to the next
  double layer_drift = 0.05;      // swapped per layer within a period
  double head_disagreement = 0.2; // swapped per kv head (the same for a whole period)
  uint32_t sink_tokens = 4;
  double sink_strength = 8.0;
  uint32_t recent_chunks = 4;
  double recent_strength = 3.5;
  double recent_decay = 0.7;
  double query_head_spread = 0.3; // tilt of each q head's direction away from its group's u
  double query_noise = 1.0;       // std of the query noise, in units of the logit
  double key_noise = 1.0;         // std of each key channel's noise
};

class SyntheticAttention {
 public:
  // REQUIRES: spec valid, tokens a positive multiple of spec.chunk_tokens.
  SyntheticAttention(const ModelSpec& spec, size_t tokens, const AttentionParams& params);

  struct Layer {
    std::vector<float> k;  // [tokens, kv_heads, head_dim]
    std::vector<float> v;  // [tokens, kv_heads, head_dim]
    std::vector<float> q;  // [window, q_heads, head_dim]
  };
  Layer Generate(uint32_t layer) const;

  // The planted heavy-hitter chunks of (layer, kv head), sorted.
  std::vector<uint32_t> HeavyHitters(uint32_t layer, uint32_t kv_head) const;

  // The records of a generated layer as ckv stores them: per chunk K [c, kv_heads, head_dim]
  // then V, in spec.dtype, chunk after chunk (chunks * RecordBytes() bytes).
  std::vector<std::byte> Records(const Layer& layer) const;

  const ModelSpec& spec() const { return spec_; }
  size_t tokens() const { return tokens_; }
  size_t chunks() const { return tokens_ / spec_.chunk_tokens; }
  const AttentionParams& params() const { return params_; }

 private:
  ModelSpec spec_;
  size_t tokens_;
  AttentionParams params_;
  std::vector<std::vector<uint32_t>> period_sets_;  // heavy hitters of each period
  std::vector<float> strength_;                     // per chunk, used when it is a heavy hitter
};

}  // namespace ckv::synth

#endif  // CKV_TOOLS_SYNTHETIC_ATTENTION_H_
