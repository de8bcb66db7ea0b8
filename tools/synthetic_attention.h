// SPDX-License-Identifier: Apache-2.0
// tools/synthetic_attention.h: synthetic K, V and suffix queries with planted attention
// structure, for the selectors' tests and the fidelity benchmark. docs/generator.md ("Planted
// attention" and "The calibrated profile") describes the models, their parameters and what they
// leave out.
//
// Two profiles (AttentionParams::profile):
//   - kCalibrated (the default): heavy hitters are short token spans at random offsets (nothing
//     knows about ckv's chunks), which of them matter depends on the request (topics that the
//     request's queries point at, shifting from request to request), layers 0-1 attend
//     diffusely, some heads are local-only, and hitters drift per layer. Values have structure
//     (a low-rank part shared along the sequence, correlation between neighbouring tokens,
//     noise), keys carry fixed outlier channels (values do not), each query of the window weighs
//     the head's directions its own way, and the q heads of a GQA group agree as much as
//     CalibratedShape::head_agreement says. Its defaults are calibrated against published
//     measurements of real models where we found them (docs/generator.md).
//   - kPlantedChunks: the original model, described below; it is shaped like ckv's own design
//     (importance drawn per 16-token chunk, request-independent, periods of 8 layers) and is kept
//     bit for bit so that earlier results can be reproduced.
//
// kPlantedChunks in short: per (layer, kv head) there are orthonormal directions u_0 (shared by the
// kv head's group of q heads) and u_1..u_m (one per q head of the group). A key is Gaussian noise
// plus a logit boost along u_0 (what all q heads of the group see) and corrections along u_i (what
// only q head i sees); a query of q head i is sqrt(D) * (u_0 + u_i) plus noise. So the attention
// logit q . k / sqrt(D) of a token is its planted boost for that q head plus noise, and the boosts
// decide where attention goes:
//   - a sink: the first tokens of the prefix;
//   - recency: the last chunks, decaying with distance;
//   - content: every chunk has an importance draw: a few percent are heavy hitters (heavy-tailed
//     strength, carried by only some of the chunk's tokens), the rest a mild chunk-level
//     background level. Draws persist across the layers of a period, carry over to the next
//     period with probability `period_overlap`, drift a little per layer, and differ on a
//     fraction of the chunks per kv head and per q head.
//
// Everything is a pure function of (spec, tokens, params, layer): layers are generated one at a
// time, on demand (a 7b-shaped 32K-token prefix is 134 MB of float K and V per layer, 3.8 GB over
// all layers). Generating a layer costs one 64-bit hash per generated key or query value and
// two per value of V in kCalibrated (one in kPlantedChunks), plus a few per token.
//
// Thread-safety: a SyntheticAttention is immutable after construction; its const methods may be
// called from several threads at once. PlantedKv is immutable once built.
#ifndef CKV_TOOLS_SYNTHETIC_ATTENTION_H_
#define CKV_TOOLS_SYNTHETIC_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"

namespace ckv::synth {

// Which model of attention the generator plants (see the file comment).
enum class AttentionProfile {
  kCalibrated,
  kPlantedChunks,
};
// "calibrated" or "planted-chunks".
std::string_view AttentionProfileName(AttentionProfile profile);
// The inverse of AttentionProfileName. InvalidArgument naming the value and the valid names
// otherwise.
absl::StatusOr<AttentionProfile> ParseAttentionProfile(std::string_view name);

// The knobs of the calibrated profile (AttentionParams::calibrated; kPlantedChunks ignores them).
// Strengths are in logit units, lengths in tokens. docs/generator.md gives the reason for each
// default and what they produce on qwen2.5-7b at 8K tokens.
struct CalibratedShape {
  // Attention sink on the first AttentionParams::sink_tokens tokens, every layer but layer 0.
  // Default: 7.0.
  double sink_strength = 7.0;
  // Recency: a token d tokens before the end of the prefix gets
  // recent_strength * exp(-d / recent_tokens). Default: 4.0, 24 tokens.
  double recent_strength = 4.0;
  double recent_tokens = 24.0;

  // Heavy hitters: spans of Geometric(1 / hitter_mean_tokens) tokens (>= 1, mean
  // hitter_mean_tokens) starting at uniformly random tokens, `hitter_density` spans per token of
  // the prefix (as seen by one kv head), each of strength hitter_strength + hitter_tail * Exp(1)
  // on all its tokens (its weight is Pareto-distributed with tail index 1 / hitter_tail).
  // Defaults: 0.05 spans per token, 2 tokens, 2.3, 0.8.
  double hitter_density = 0.05;
  double hitter_mean_tokens = 2.0;
  double hitter_strength = 2.3;
  double hitter_tail = 0.8;

  // Request dependence. A hitter is "always on" (the document's generally important tokens)
  // with probability `always_on_share`; otherwise it belongs to one of `topics` topics, and the
  // request's queries point at `active_topics` of them (see AttentionParams::request_shift).
  // Topics are clamped to head_dim - (q_heads / kv_heads) - 2 (the directions left over), and
  // active topics to half the topics. Defaults: 0.1, 32, 8.
  double always_on_share = 0.1;
  uint32_t topics = 32;
  uint32_t active_topics = 8;

  // GQA: a share `kv_head_own_share` of a kv head's hitters are its own (other kv heads of the
  // layer do not see them); the rest are the layer's, seen by every kv head. The q heads of a
  // group see the same hitters, each weighing the always-on ones and each topic by its own
  // factor max(0, 1 + q_head_jitter * N(0, 1)). Defaults: 0.3, 0.15.
  double kv_head_own_share = 0.3;
  double q_head_jitter = 0.15;

  // Drift across layers: each hitter persists from one layer to the next with probability
  // `layer_persistence`; otherwise it is replaced by a fresh one elsewhere. Default: 0.965 (puts
  // the overlap of adjacent period heads, 8 layers apart, in ContiguousKV's 52-64%).
  double layer_persistence = 0.965;

  // Layers [0, diffuse_layers) attend diffusely: their hitter, recency and sink strengths are
  // scaled by `diffuse_scale` (layer 0 has no sink). Defaults: 2, 0.35.
  uint32_t diffuse_layers = 2;
  double diffuse_scale = 0.35;

  // Local-only heads: each q head of each layer is local-only with probability
  // `local_head_fraction`: it sees only a sink of `local_sink_strength` (layers >= 1) and
  // recency local_strength * exp(-d / local_tokens), no hitters. Defaults: 0.15, 10.0, 9.0, 64.
  double local_head_fraction = 0.15;
  double local_sink_strength = 10.0;
  double local_strength = 9.0;
  double local_tokens = 64.0;

  // Values. Per (layer, kv head), token t's value is
  //   sqrt(value_low_rank_share) L_t + sqrt(value_smooth_share) S_t + sqrt(rest) N_t,
  // rest = 1 - value_low_rank_share - value_smooth_share, where
  //   L_t = sqrt(head_dim / value_rank) sum_r a_r(t) b_r: `value_rank` fixed orthonormal
  //         directions b_r shared along the sequence, coefficients a_r(t) ~ N(0, 1) per token;
  //   S_t: per channel an AR(1) process along the tokens, lag-1 correlation value_smooth_corr;
  //   N_t: independent noise.
  // Each part has unit variance per channel (on average over channels), so V does too; the
  // lag-1 correlation of neighbouring tokens' values is value_smooth_share * value_smooth_corr.
  // REQUIRES: 1 <= value_rank (clamped to head_dim); shares >= 0 and summing to <= 1;
  // value_smooth_corr in [0, 1). Defaults: 8, 0.5, 0.3, 0.8.
  uint32_t value_rank = 8;
  double value_low_rank_share = 0.5;
  double value_smooth_share = 0.3;
  double value_smooth_corr = 0.8;

  // Keys: `key_outlier_channels` channels per (layer, kv head), fixed for every token, carry a
  // constant offset of +-key_outlier_offset key-noise standard deviations and noise scaled by
  // key_outlier_scale (KIVI's outlier channels; values have none). The offset adds the same logit
  // to every token of a query, so it moves no attention; the scale is compensated in the key
  // noise, so the logit noise stays token_noise. Clamped to head_dim. Defaults: 4, 8.0, 3.0.
  uint32_t key_outlier_channels = 4;
  double key_outlier_offset = 8.0;
  double key_outlier_scale = 3.0;

  // Queries of the window differ per token: query w of a normal q head weighs the always-on
  // direction and each active topic by its head's factor times its own
  // max(0, 1 + query_token_spread * N(0, 1)), so the window's mean query is not any of them.
  // Default: 0.3.
  double query_token_spread = 0.3;

  // Agreement of the q heads of one GQA group: the mean top-5% Jaccard of the token sets of
  // two q heads of one group that it produces at the calibration shape (qwen2.5-7b, 8192
  // tokens, the other defaults; docs/generator.md has the measured mapping). Each q head's own
  // draws (its weights on the topics, its per-token weights, the direction of its own key noise,
  // its query noise, whether it is local-only) are mixed with its group's: at 1 every q head of
  // a group is its group's (Jaccard 1), at <= 0.43 they are independent (the Jaccard that
  // sharing the kv head's keys alone gives). Keys and values do not depend on it.
  // REQUIRES: in [0, 1]. Default: 0.7 (see docs/generator.md: IMPRESS measured > 0.95 on one
  // layer of an MHA model).
  double head_agreement = 0.7;
};

// The knobs of the planted structure. Unless said otherwise, a field is kPlantedChunks' alone;
// seed, window, sink_tokens, token_noise, query_noise and query_seed serve both. Strengths are in
// logit units (q . k / sqrt(D)): a token whose boost is larger by 1 gets e = 2.7x the attention
// weight. The defaults are calibrated on qwen2.5-7b with an 8K-token prefix (docs/generator.md
// lists what they produce there).
struct AttentionParams {
  // Which model (see the file comment). Default: kCalibrated.
  AttentionProfile profile = AttentionProfile::kCalibrated;
  // Seed of everything: the prefix's K and V (a benchmark gives each conversation its own).
  // Default: 1.
  uint64_t seed = 1;
  // Suffix queries per layer, w (the queries of the suffix's last w tokens). >= 1. Default: 32.
  uint32_t window = 32;

  // Attention sink: the first `sink_tokens` tokens of the prefix get `sink_strength`, in every
  // head and layer. Default: 4 tokens, 8.0.
  uint32_t sink_tokens = 4;
  double sink_strength = 8.0;
  // Recency: a token d tokens before the end of the prefix gets
  // recent_strength * recent_decay^(d / chunk_tokens): the last chunk gets the most and the
  // effect fades over a few chunks. Default: 5.0, 0.6 per chunk.
  double recent_strength = 5.0;
  double recent_decay = 0.6;

  // Content. Each chunk has an importance draw. With probability `heavy_fraction` it is a heavy
  // hitter of strength heavy_strength + heavy_tail * Exp(1) (so its attention weight is
  // Pareto-distributed with tail index 1 / heavy_tail), carried by each of its tokens with
  // probability `hot_token_fraction` (at least one): token-level and chunk-level importance
  // differ. Every chunk, heavy or not, also has a chunk-level background level
  // N(0, background_spread^2) on all of its tokens, which orders the chunks beyond the heavy
  // hitters (it is what a 25-50% budget picks from).
  // Defaults: 0.05, 3.3, 0.7, 0.5, 0.5.
  double heavy_fraction = 0.05;
  double heavy_strength = 3.3;
  double heavy_tail = 0.7;
  double hot_token_fraction = 0.5;
  double background_spread = 0.5;

  // Drift across layers. Layers [P * period_layers, (P + 1) * period_layers) form period P (the
  // ModelSpec has no period). Draws hold for a whole period; at each period head each chunk keeps
  // its draw with probability `period_overlap` and is redrawn otherwise, so the important chunks
  // of adjacent period heads overlap by about that fraction. Within a period, each layer redraws
  // each chunk with probability `layer_drift` (cumulatively, until the next period head).
  // Defaults: 8 layers, 0.6 (ContiguousKV measured 52-64% on real models), 0.02.
  uint32_t period_layers = 8;
  double period_overlap = 0.6;
  double layer_drift = 0.02;

  // GQA. A kv head follows its own draws (instead of the layer's) on a fraction
  // `kv_head_disagreement` of the chunks, and each q head its own (instead of its kv head's) on
  // a fraction `q_head_disagreement`; which chunks is fixed per head, and those draws carry over
  // between periods like the shared ones. So the q heads of a group share most of their heavy
  // hitters, and groups share most with each other. Defaults: 0.2, 0.1.
  double kv_head_disagreement = 0.2;
  double q_head_disagreement = 0.1;

  // Noise, as standard deviations of the logit. `token_noise`: per token and q head, the same
  // for every query (from the key's noise along the query's direction); `query_noise`: per
  // (query, token) pair. Both spread attention over the whole prefix, so that it is not
  // trivially concentrated. Defaults: 1.0, 0.5.
  double token_noise = 1.0;
  double query_noise = 0.5;
  // Seed of the queries' noise alone, 0 = `seed`: requests that reuse one prefix with different
  // suffixes (the benchmark's turns) see the same planted structure through different queries.
  uint64_t query_seed = 0;

  // kCalibrated only. The request's index in its conversation (e.g. its turn), and the share of
  // the heavy-hitter mass that changes from request r - 1 to request r: the active topics of
  // request 0 are drawn from `seed`, and each later request replaces a share
  // request_shift / (1 - always_on_share) of them (deterministic from seed and r), so that
  // consecutive requests share about 1 - request_shift of their heavy hitters.
  // REQUIRES: request_shift in [0, 1 - calibrated.always_on_share]. Defaults: 0, 0.5.
  uint32_t request = 0;
  double request_shift = 0.5;
  // kCalibrated only: the shape of the model.
  CalibratedShape calibrated;
};

class SyntheticAttention {
 public:
  // A prefix of `tokens` tokens (a tail past the last whole chunk is generated like any other
  // token; it is not part of Records()).
  // REQUIRES (aborts otherwise): spec.Validate().ok(); tokens >= 1;
  // spec.q_heads / spec.kv_heads + 1 <= spec.head_dim (+ 3 for kCalibrated: room for the
  // orthogonal directions);
  // params.window >= 1, params.period_layers >= 1, probabilities in [0, 1], strengths, spreads
  // and noise finite and (where a standard deviation) >= 0.
  SyntheticAttention(const ModelSpec& spec, size_t tokens, const AttentionParams& params);

  // The topics the queries of request params().request point at, sorted (kCalibrated; empty
  // for kPlantedChunks): a pure function of (seed, request).
  std::vector<uint32_t> ActiveTopics() const;

  // One layer in float32.
  struct Layer {
    std::vector<float> k;  // [tokens, kv_heads, head_dim]
    std::vector<float> v;  // [tokens, kv_heads, head_dim], unit variance per channel
    std::vector<float> q;  // [window, q_heads, head_dim], the suffix queries
  };
  // REQUIRES: layer < spec().layers.
  Layer Generate(uint32_t layer) const;
  // The same into `out`, reusing its buffers: a caller that walks the layers saves the page
  // faults of fresh tensors, about half the cost of a layer.
  void Generate(uint32_t layer, Layer& out) const;
  // Generate(layer).q alone, without generating the keys and values (cheap).
  std::vector<float> Queries(uint32_t layer) const;

  // `values` converted to spec().dtype, round to nearest even (fp16, bf16; fp32 is a copy).
  std::vector<std::byte> ToDType(std::span<const float> values) const;
  // The whole chunks of a generated layer as ckv stores them: per chunk, K [c, kv_heads,
  // head_dim] then V, in spec().dtype; chunks() * spec().DecodedRecordBytes() bytes (a spec
  // with a codec stores them encoded: ckv/codec.h).
  std::vector<std::byte> Records(const Layer& layer) const;

  const ModelSpec& spec() const { return spec_; }
  size_t tokens() const { return tokens_; }
  // Whole chunks of the prefix.
  size_t chunks() const { return tokens_ / spec_.chunk_tokens; }
  const AttentionParams& params() const { return params_; }

 private:
  ModelSpec spec_;
  size_t tokens_;
  AttentionParams params_;
};

// Every layer's K and V in the spec's dtype, as ckv::KvTensors for Engine::Put, owning their
// memory: for prefixes small enough to hold (2 * layers * tokens * TokenBytesPerLayer() bytes).
// Move-only, as SyntheticKv: tensors() views this object's buffers.
class PlantedKv {
 public:
  explicit PlantedKv(const SyntheticAttention& gen);
  PlantedKv(const PlantedKv&) = delete;
  PlantedKv& operator=(const PlantedKv&) = delete;
  PlantedKv(PlantedKv&&) = default;
  PlantedKv& operator=(PlantedKv&&) = default;

  const KvTensors& tensors() const { return tensors_; }
  size_t bytes() const;

 private:
  std::vector<std::vector<std::byte>> k_, v_;
  KvTensors tensors_;
};

}  // namespace ckv::synth

#endif  // CKV_TOOLS_SYNTHETIC_ATTENTION_H_
