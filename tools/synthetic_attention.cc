// SPDX-License-Identifier: Apache-2.0
// The planted-attention generator (see tools/synthetic_attention.h and docs/generator.md).
//
// Randomness is counter-based, as in synthetic_kv.cc: every value is Mix64 (the splitmix64
// finaliser) of a key built from (seed, what it is, layer, head, index), so any layer or head
// is produced without producing what precedes it, and nothing depends on call order.
//
// Gaussian noise is the Irwin-Hall sum of the four 16-bit lanes of one hash, rescaled to unit
// variance: one hash and no libm call per value (Box-Muller would add a log and a sincos per two
// values, and libm's results may differ between C libraries). Its tails stop at 3.46 sigma, which
// does not matter here: what attention sees is a key's dot product with a query, a sum over
// head_dim channels, which is Gaussian again.
#include "tools/synthetic_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/assert.h"
#include "kernels/half.h"
#include "tools/synthetic_kv.h"

namespace ckv::synth {
namespace {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

// Domain tags: what a hash is for, so that equal indices of different things never share one.
enum Tag : uint64_t {
  kSharedCoin = 1,  // does a chunk's layer-wide draw change at a period head?
  kSharedDraw,
  kKvPick,  // does a kv head follow its own draw for a chunk?
  kKvCoin,
  kKvDraw,
  kQPick,  // does a q head follow its own draw for a chunk?
  kQCoin,
  kQDraw,
  kDriftCoin,  // does a chunk's draw change at a layer inside a period?
  kDriftDraw,
  kDirections,
  kKeys,
  kValues,
  kQueries,
  // kCalibrated's own tags, appended so that kPlantedChunks' hashes are unchanged.
  kCalDirections,
  kCalKeys,
  kCalValues,
  kCalQueries,
  kSlotCoin,  // does a hitter slot keep its hitter at a layer?
  kSlotDraw,  // a slot's hitter: position, length, strength, topic
  kTopicStart,
  kTopicStep,
  kJitter,
  kLocalHead,
  // Values with structure, key outliers, per-token queries and group agreement.
  kValueDirections,
  kValueSmooth,
  kValueCoefficients,
  kKeyOutliers,
  kTokenWeight,
  kGroupJitter,
  kGroupLocal,
  kLocalFollows,
  kGroupQueries,
  kGroupTokenWeight,
};

// A hash of a tuple of words (order matters).
template <typename... W>
uint64_t Hash(uint64_t seed, W... words) {
  uint64_t h = Mix64(seed + kGamma);
  ((h = Mix64((h ^ static_cast<uint64_t>(words)) + kGamma)), ...);
  return h;
}

// Uniform in [0, 1) from the high 53 bits.
inline double Uniform(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }

// A unit normal (approximately: Irwin-Hall of 4 uniform 16-bit lanes, exact mean 0 and variance
// 1) from 64 random bits. Integer arithmetic up to the one exact int-to-float conversion.
inline float Normal(uint64_t r) {
  const int32_t sum =
      static_cast<int32_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
  // 1 / sqrt(4 * (65536^2 - 1) / 12): the standard deviation of the sum of 4 lanes.
  constexpr float kScale = 2.6428998e-05f;
  return static_cast<float>(sum - 131070) * kScale;
}

// Values [first, first + count) of the normal stream `s` (value j is Normal of the j-th
// splitmix64 output seeded with s), times `scale`.
void FillNormals(uint64_t s, uint64_t first, float scale, float* out, size_t count) {
  uint64_t ctr = s + first * kGamma;
  for (size_t i = 0; i < count; ++i) {
    ctr += kGamma;
    out[i] = scale * Normal(Mix64(ctr));
  }
}

// A broken precondition of the generator's caller: stops the process as CKV_CHECK does.
[[noreturn]] void Fail(const char* what) { ::ckv::internal::CheckFailed(__FILE__, __LINE__, what); }

bool IsProbability(double p) { return p >= 0 && p <= 1; }
bool IsSpread(double s) { return std::isfinite(s) && s >= 0; }

void ValidateCalibrated(const ModelSpec& spec, const AttentionParams& p) {
  const CalibratedShape& c = p.calibrated;
  if (spec.q_heads / spec.kv_heads + 3 > spec.head_dim) {
    Fail("head_dim too small for the calibrated profile's directions");
  }
  if (!IsProbability(c.always_on_share) || !IsProbability(c.kv_head_own_share) ||
      !IsProbability(c.layer_persistence) || !IsProbability(c.local_head_fraction) ||
      !IsProbability(p.request_shift)) {
    Fail("a calibrated share, persistence or request_shift outside [0, 1]");
  }
  if (p.request_shift > 1 - c.always_on_share + 1e-12) {
    Fail("request_shift > 1 - always_on_share: always-on hitters cannot change");
  }
  if (!std::isfinite(c.sink_strength) || !std::isfinite(c.recent_strength) ||
      !std::isfinite(c.hitter_strength) || !std::isfinite(c.local_sink_strength) ||
      !std::isfinite(c.local_strength) || !std::isfinite(c.diffuse_scale) ||
      !IsSpread(c.hitter_tail) || !IsSpread(c.q_head_jitter) || !IsSpread(c.hitter_density) ||
      !(c.recent_tokens > 0) || !(c.local_tokens > 0) || !(c.hitter_mean_tokens >= 1) ||
      !std::isfinite(c.recent_tokens) || !std::isfinite(c.local_tokens) ||
      !std::isfinite(c.hitter_mean_tokens)) {
    Fail("a calibrated strength, length or density is not finite or out of range");
  }
  if (c.value_rank == 0 || !IsProbability(c.value_low_rank_share) ||
      !IsProbability(c.value_smooth_share) ||
      c.value_low_rank_share + c.value_smooth_share > 1 + 1e-12 ||
      !(c.value_smooth_corr >= 0 && c.value_smooth_corr < 1)) {
    Fail(
        "calibrated values: value_rank 0, a share outside [0, 1] or summing above 1, or "
        "value_smooth_corr outside [0, 1)");
  }
  if (!std::isfinite(c.key_outlier_offset) || !IsSpread(c.key_outlier_scale) ||
      !IsSpread(c.query_token_spread) || !IsProbability(c.head_agreement)) {
    Fail("calibrated key outliers, query_token_spread or head_agreement out of range");
  }
}

void Validate(const ModelSpec& spec, size_t tokens, const AttentionParams& p) {
  if (!spec.Validate().ok()) Fail("invalid ModelSpec");
  if (tokens == 0) Fail("tokens == 0");
  if (p.profile == AttentionProfile::kCalibrated) ValidateCalibrated(spec, p);
  if (spec.q_heads / spec.kv_heads + 1 > spec.head_dim) {
    Fail("head_dim too small for a direction per q head of a group plus a shared one");
  }
  if (p.window == 0 || p.period_layers == 0) Fail("window and period_layers must be >= 1");
  if (!IsProbability(p.heavy_fraction) || !IsProbability(p.hot_token_fraction) ||
      !IsProbability(p.period_overlap) || !IsProbability(p.layer_drift) ||
      !IsProbability(p.kv_head_disagreement) || !IsProbability(p.q_head_disagreement) ||
      !IsProbability(p.recent_decay)) {
    Fail("a probability (fraction, overlap, drift, disagreement, decay) outside [0, 1]");
  }
  if (!std::isfinite(p.sink_strength) || !std::isfinite(p.recent_strength) ||
      !std::isfinite(p.heavy_strength) || !IsSpread(p.heavy_tail) ||
      !IsSpread(p.background_spread) || !IsSpread(p.token_noise) || !IsSpread(p.query_noise)) {
    Fail("a strength, spread or noise is not finite, or a spread is negative");
  }
}

// The boost of each token of a chunk (out.size() tokens) under importance draw `id`.
void DrawBoosts(uint64_t id, const AttentionParams& p, std::span<float> out) {
  const float level = static_cast<float>(p.background_spread) * Normal(Mix64(id ^ 1));
  std::fill(out.begin(), out.end(), level);
  if (Uniform(Mix64(id ^ 2)) >= p.heavy_fraction) return;
  const double exp1 = -std::log1p(-Uniform(Mix64(id ^ 3)));  // Exp(1)
  const auto strength = static_cast<float>(p.heavy_strength + p.heavy_tail * exp1);
  const size_t always_hot = Mix64(id ^ 4) % out.size();
  for (size_t t = 0; t < out.size(); ++t) {
    if (t == always_hot || Uniform(Hash(id, 5, t)) < p.hot_token_fraction) out[t] += strength;
  }
}

// Which draw a chunk follows in period `period`, on a chain that starts with a draw at period 0
// and changes at each later period head with probability 1 - overlap: the last period at which
// it changed names the draw. `who` tells the chains apart (the layer's, a kv head's, a q head's).
uint64_t ChainDraw(const AttentionParams& p, Tag coin, Tag draw, uint64_t who, uint32_t period,
                   uint64_t chunk) {
  uint32_t since = 0;
  for (uint32_t q = 1; q <= period; ++q) {
    if (Uniform(Hash(p.seed, coin, who, q, chunk)) >= p.period_overlap) since = q;
  }
  return Hash(p.seed, draw, who, since, chunk);
}

// Orthonormal directions u_0..u_m (m = q heads per kv head) of (layer, kv head), row after row.
std::vector<float> Directions(const ModelSpec& spec, uint64_t seed, uint32_t layer,
                              uint32_t kv_head) {
  const uint32_t d_n = spec.head_dim, m = spec.q_heads / spec.kv_heads;
  const uint64_t s = Hash(seed, kDirections, layer, kv_head);
  std::vector<float> draws(size_t{m + 1} * d_n);
  FillNormals(s, 0, 1.0f, draws.data(), draws.size());
  std::vector<double> u(draws.begin(), draws.end());
  // Gram-Schmidt. Random Gaussian vectors with m + 1 <= D are independent with probability 1;
  // the norm check only guards against a freak draw.
  for (uint32_t a = 0; a <= m; ++a) {
    double* ua = u.data() + size_t{a} * d_n;
    for (uint32_t b = 0; b < a; ++b) {
      const double* ub = u.data() + size_t{b} * d_n;
      double dot = 0;
      for (uint32_t d = 0; d < d_n; ++d) dot += ua[d] * ub[d];
      for (uint32_t d = 0; d < d_n; ++d) ua[d] -= dot * ub[d];
    }
    double norm = 0;
    for (uint32_t d = 0; d < d_n; ++d) norm += ua[d] * ua[d];
    if (norm < 1e-12) Fail("degenerate random directions");
    for (uint32_t d = 0; d < d_n; ++d) ua[d] /= std::sqrt(norm);
  }
  return std::vector<float>(u.begin(), u.end());
}

// Per-channel noise scales from the logit noise: with q = sqrt(D)(u_0 + u_i) + eps (eps ~
// N(0, sq^2) per channel) and key noise z ~ N(0, sk^2) per channel, the logit's noise is
// (u_0 + u_i) . z ~ N(0, 2 sk^2), the same for every query, plus eps . z / sqrt(D) ~
// N(0, sq^2 sk^2), per (query, token).
struct NoiseScales {
  float key, query;
};
NoiseScales Scales(const AttentionParams& p) {
  const double key = p.token_noise / std::sqrt(2.0);
  return {static_cast<float>(key), key > 0 ? static_cast<float>(p.query_noise / key) : 0.0f};
}

void WriteQueries(const ModelSpec& spec, const AttentionParams& p, uint32_t layer, uint32_t h,
                  std::span<const float> dirs, std::vector<float>& q) {
  const uint32_t d_n = spec.head_dim, m = spec.q_heads / spec.kv_heads;
  const float sqrt_d = std::sqrt(static_cast<float>(d_n));
  const float sq = Scales(p).query;
  const float* u0 = dirs.data();
  for (uint32_t i = 0; i < m; ++i) {
    const uint32_t g = h * m + i;
    const float* ui = dirs.data() + size_t{i + 1} * d_n;
    const uint64_t s = Hash(p.query_seed != 0 ? p.query_seed : p.seed, kQueries, layer, g);
    for (uint32_t w = 0; w < p.window; ++w) {
      float* out = q.data() + (size_t{w} * spec.q_heads + g) * d_n;
      FillNormals(s, size_t{w} * d_n, sq, out, d_n);
      for (uint32_t d = 0; d < d_n; ++d) out[d] += sqrt_d * (u0[d] + ui[d]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The calibrated profile. Per (layer, kv head) the directions are, row after row: u_0 (what every
// normal q head of the group reads: sink, recency, always-on hitters), u_1..u_m (one per q head:
// only its own key noise), u_loc (what local-only heads read: their sink and recency) and
// w_0..w_{T-1} (one per topic: that topic's hitters). A normal q head's query is
// sqrt(D) (c_0 u_0 + u_i + sum over active topics a of c_a w_a), a local-only head's
// sqrt(D) u_loc, so a hitter counts only while its topic is active.

struct CalShape {
  uint32_t m;       // q heads per kv head
  uint32_t topics;  // T, after clamping to the directions left over
  uint32_t active;  // A, after clamping to T / 2
  uint32_t rows() const { return m + 3 + topics; }
  uint32_t loc_row() const { return m + 1; }
  uint32_t group_row() const { return m + 2; }
  uint32_t topic_row(uint32_t a) const { return m + 3 + a; }
};

CalShape CalShapeOf(const ModelSpec& spec, const CalibratedShape& c) {
  CalShape s;
  s.m = spec.q_heads / spec.kv_heads;
  s.topics = std::min<uint32_t>(c.topics, spec.head_dim - s.m - 3);
  s.active = std::min<uint32_t>(c.active_topics, s.topics / 2);
  return s;
}

// `rows` orthonormal random directions of dimension d_n (rows <= d_n), from stream `s`.
std::vector<float> Orthonormal(uint64_t s, uint32_t rows, uint32_t d_n) {
  std::vector<float> draws(size_t{rows} * d_n);
  FillNormals(s, 0, 1.0f, draws.data(), draws.size());
  std::vector<double> u(draws.begin(), draws.end());
  for (uint32_t a = 0; a < rows; ++a) {
    double* ua = u.data() + size_t{a} * d_n;
    for (uint32_t b = 0; b < a; ++b) {
      const double* ub = u.data() + size_t{b} * d_n;
      double dot = 0;
      for (uint32_t d = 0; d < d_n; ++d) dot += ua[d] * ub[d];
      for (uint32_t d = 0; d < d_n; ++d) ua[d] -= dot * ub[d];
    }
    double norm = 0;
    for (uint32_t d = 0; d < d_n; ++d) norm += ua[d] * ua[d];
    if (norm < 1e-12) Fail("degenerate random directions");
    for (uint32_t d = 0; d < d_n; ++d) ua[d] /= std::sqrt(norm);
  }
  return std::vector<float>(u.begin(), u.end());
}

// The active topics of request `request`: A topics drawn from the seed for request 0, then at
// each later request a share x of them (floor(x A), plus one more with probability the
// fraction) swapped for inactive ones. Iterating from request 0 keeps consecutive requests
// related (a topic stays active for a few requests) while each step changes the expected share.
std::vector<uint32_t> ActiveTopicSet(const AttentionParams& p, const CalShape& s) {
  const uint32_t t_n = s.topics, a_n = s.active;
  if (a_n == 0) return {};
  // A seeded permutation's first A entries: partial Fisher-Yates.
  std::vector<uint32_t> order(t_n);
  for (uint32_t i = 0; i < t_n; ++i) order[i] = i;
  for (uint32_t i = 0; i < a_n; ++i) {
    const uint32_t j = i + static_cast<uint32_t>(Hash(p.seed, kTopicStart, i) % (t_n - i));
    std::swap(order[i], order[j]);
  }
  // order[0, A) are active, order[A, T) inactive.
  const double x = p.calibrated.always_on_share < 1
                       ? std::min(1.0, p.request_shift / (1 - p.calibrated.always_on_share))
                       : 0.0;
  for (uint32_t r = 1; r <= p.request; ++r) {
    const double want = x * a_n;
    uint32_t k = static_cast<uint32_t>(std::floor(want));
    if (Uniform(Hash(p.seed, kTopicStep, r, 0)) < want - k) ++k;
    k = std::min(k, std::min(a_n, t_n - a_n));
    for (uint32_t i = 0; i < k; ++i) {
      // Move a random still-unswapped active topic to slot i, a random inactive one to A + i,
      // then swap them: the swapped-out topic cannot come back within this step.
      const uint32_t ja = i + static_cast<uint32_t>(Hash(p.seed, kTopicStep, r, 1, i) % (a_n - i));
      const uint32_t ji =
          a_n + i + static_cast<uint32_t>(Hash(p.seed, kTopicStep, r, 2, i) % (t_n - a_n - i));
      std::swap(order[i], order[ja]);
      std::swap(order[a_n + i], order[ji]);
      std::swap(order[i], order[a_n + i]);
    }
  }
  std::vector<uint32_t> active(order.begin(), order.begin() + a_n);
  std::sort(active.begin(), active.end());
  return active;
}

// Group agreement. A draw of q head g is sqrt(a) x (its group's draw) + sqrt(1 - a) x (its own),
// which keeps the draw's distribution and correlates the q heads of a group with coefficient a.
// head_agreement is the in-group top-5% Jaccard that a should produce: the own weight
// sqrt(1 - a) that gives each Jaccard below was measured with attention_stats on qwen2.5-7b,
// 8192 tokens, the other defaults (docs/generator.md); in between it is interpolated linearly.
// Jaccards below the first point give independent draws.
double OwnWeight(double head_agreement) {
  struct Point {
    double jaccard, own;
  };
  static constexpr Point kMeasured[] = {
      {0.432, 1.0},   {0.470, 0.894},  {0.546, 0.707}, {0.699, 0.447},
      {0.789, 0.316}, {0.852, 0.224},  {0.889, 0.173}, {0.911, 0.141},
      {0.936, 0.100}, {0.953, 0.0707}, {1.0, 0.0},
  };
  if (head_agreement <= kMeasured[0].jaccard) return 1.0;
  for (size_t i = 1; i < std::size(kMeasured); ++i) {
    const Point& a = kMeasured[i - 1];
    const Point& b = kMeasured[i];
    if (head_agreement <= b.jaccard) {
      return a.own + (b.own - a.own) * (head_agreement - a.jaccard) / (b.jaccard - a.jaccard);
    }
  }
  return 0.0;
}

struct Mix {
  float group, own;  // sqrt(a), sqrt(1 - a)
};
Mix MixOf(const AttentionParams& p) {
  const double own = OwnWeight(p.calibrated.head_agreement);
  return {static_cast<float>(std::sqrt(1 - own * own)), static_cast<float>(own)};
}

// a: the correlation the mixing gives.
double GroupShare(const AttentionParams& p) {
  const double own = OwnWeight(p.calibrated.head_agreement);
  return 1 - own * own;
}

// Whether q head g (of kv head g / m) is local-only: with probability GroupShare it takes
// its group's coin, otherwise its own; either way local with probability local_head_fraction.
bool IsLocalHead(const AttentionParams& p, uint32_t m, uint32_t layer, uint32_t g) {
  const double a = GroupShare(p);
  const bool follows = a > 0 && Uniform(Hash(p.seed, kLocalFollows, layer, g)) < a;
  const uint64_t coin =
      follows ? Hash(p.seed, kGroupLocal, layer, g / m) : Hash(p.seed, kLocalHead, layer, g);
  return Uniform(coin) < p.calibrated.local_head_fraction;
}

// A q head's weight on the always-on hitters (a = T) or on topic a.
float Jitter(const AttentionParams& p, const Mix& mix, uint32_t m, uint32_t layer, uint32_t g,
             uint32_t a) {
  const float z = mix.own * Normal(Hash(p.seed, kJitter, layer, g, a)) +
                  mix.group * Normal(Hash(p.seed, kGroupJitter, layer, g / m, a));
  return static_cast<float>(std::max(0.0, 1 + p.calibrated.q_head_jitter * z));
}

// Key noise per channel: the logit noise of a normal head is token_noise. Its query direction
// has squared norm about 1 + (1 + A)(1 + query_token_spread^2) (the head jitter aside), and the
// outlier channels' noise is scaled up, which adds their share of the query's direction times
// (scale^2 - 1).
NoiseScales CalScales(const ModelSpec& spec, const AttentionParams& p, const CalShape& s) {
  const CalibratedShape& c = p.calibrated;
  const double spread = c.query_token_spread;
  const double dir = 1 + (1.0 + s.active) * (1 + spread * spread);
  const double outliers = std::min<uint32_t>(c.key_outlier_channels, spec.head_dim);
  const double channels =
      1 + outliers * (c.key_outlier_scale * c.key_outlier_scale - 1) / spec.head_dim;
  const double key = p.token_noise / std::sqrt(dir * std::max(channels, 1e-9));
  return {static_cast<float>(key), key > 0 ? static_cast<float>(p.query_noise / key) : 0.0f};
}

// The window's queries of kv head h's q heads. A normal q head i's query w is
//   sqrt(D) (c_T e_T(w) u_0 + n_i + sum_{a active} c_a e_a(w) w_a) + noise,
// c the head's weights (Jitter), e its query token's own (max(0, 1 + spread N(0, 1))), and
// n_i = sqrt(a) u_grp + sqrt(1 - a) u_i the direction of its own key noise (a = GroupShare);
// the draws behind c, e and the noise mix the group's and the head's own (MixOf).
void WriteCalQueries(const ModelSpec& spec, const AttentionParams& p, const CalShape& s,
                     const std::vector<uint32_t>& active, uint32_t layer, uint32_t h,
                     std::span<const float> dirs, std::vector<float>& q) {
  const uint32_t d_n = spec.head_dim;
  const float sqrt_d = std::sqrt(static_cast<float>(d_n));
  const float sq = CalScales(spec, p, s).query;
  const Mix mix = MixOf(p);
  const auto spread = static_cast<float>(p.calibrated.query_token_spread);
  const uint64_t query_seed = p.query_seed != 0 ? p.query_seed : p.seed;
  auto row = [&](uint32_t r) { return dirs.data() + size_t{r} * d_n; };
  // Components a query weighs: the always-on direction (index T) and the active topics.
  std::vector<uint32_t> parts(active.begin(), active.end());
  parts.push_back(s.topics);
  std::vector<float> base(d_n), shared(d_n), head_w(parts.size());
  const uint64_t group_stream = Hash(query_seed, kGroupQueries, layer, h);
  for (uint32_t i = 0; i < s.m; ++i) {
    const uint32_t g = h * s.m + i;
    const bool local = IsLocalHead(p, s.m, layer, g);
    // The part every query of the head shares: u_loc, or the own noise direction.
    for (uint32_t d = 0; d < d_n; ++d) {
      base[d] =
          local ? row(s.loc_row())[d] : mix.group * row(s.group_row())[d] + mix.own * row(i + 1)[d];
    }
    for (size_t j = 0; j < parts.size(); ++j) head_w[j] = Jitter(p, mix, s.m, layer, g, parts[j]);
    const uint64_t stream = Hash(query_seed, kCalQueries, layer, g);
    for (uint32_t w = 0; w < p.window; ++w) {
      float* out = q.data() + (size_t{w} * spec.q_heads + g) * d_n;
      FillNormals(stream, size_t{w} * d_n, sq * mix.own, out, d_n);
      if (mix.group > 0) {
        FillNormals(group_stream, size_t{w} * d_n, sq * mix.group, shared.data(), d_n);
        for (uint32_t d = 0; d < d_n; ++d) out[d] += shared[d];
      }
      for (uint32_t d = 0; d < d_n; ++d) out[d] += sqrt_d * base[d];
      if (local) continue;
      for (size_t j = 0; j < parts.size(); ++j) {
        const uint32_t a = parts[j];
        const float z = mix.own * Normal(Hash(query_seed, kTokenWeight, layer, g, w, a)) +
                        mix.group * Normal(Hash(query_seed, kGroupTokenWeight, layer, h, w, a));
        const float weight = sqrt_d * head_w[j] * std::max(0.0f, 1 + spread * z);
        const float* u = row(a == s.topics ? 0 : s.topic_row(a));
        for (uint32_t d = 0; d < d_n; ++d) out[d] += weight * u[d];
      }
    }
  }
}

// The outlier channels of (layer, kv head h): which, their offsets (in key units) and the
// scale of their noise.
struct KeyOutliers {
  std::vector<uint32_t> channel;
  std::vector<float> offset;
  float scale;
};
KeyOutliers KeyOutliersOf(const ModelSpec& spec, const AttentionParams& p, uint32_t layer,
                          uint32_t h, float key_noise) {
  const CalibratedShape& c = p.calibrated;
  const uint32_t d_n = spec.head_dim, count = std::min(c.key_outlier_channels, d_n);
  KeyOutliers o;
  o.scale = static_cast<float>(c.key_outlier_scale);
  // The first `count` entries of a seeded permutation of the channels (partial Fisher-Yates).
  std::vector<uint32_t> order(d_n);
  for (uint32_t d = 0; d < d_n; ++d) order[d] = d;
  for (uint32_t j = 0; j < count; ++j) {
    const uint64_t r = Hash(p.seed, kKeyOutliers, layer, h, j);
    std::swap(order[j], order[j + static_cast<uint32_t>(r % (d_n - j))]);
    o.channel.push_back(order[j]);
    const float sign = (Mix64(r) & 1) ? 1.0f : -1.0f;
    o.offset.push_back(sign * static_cast<float>(c.key_outlier_offset) * key_noise);
  }
  return o;
}

// The values of kv head h at `layer` into v [n, kv_heads, head_dim] (CalibratedShape's value
// model): a low-rank part, an AR(1) part along the tokens (one sequential pass) and noise. Two
// hashes per value and value_rank per token.
void WriteCalValues(const ModelSpec& spec, const AttentionParams& p, size_t n, uint32_t layer,
                    uint32_t h, std::vector<float>& v) {
  const CalibratedShape& c = p.calibrated;
  const uint32_t d_n = spec.head_dim, h_n = spec.kv_heads;
  const uint32_t rank = std::min(c.value_rank, d_n);
  const double rest = std::max(0.0, 1 - c.value_low_rank_share - c.value_smooth_share);
  const auto low_rank =
      static_cast<float>(std::sqrt(c.value_low_rank_share * static_cast<double>(d_n) / rank));
  const auto smooth = static_cast<float>(std::sqrt(c.value_smooth_share));
  const auto noise = static_cast<float>(std::sqrt(rest));
  const auto rho = static_cast<float>(c.value_smooth_corr);
  const auto innovation =
      static_cast<float>(std::sqrt(1 - c.value_smooth_corr * c.value_smooth_corr));
  const std::vector<float> basis = Orthonormal(Hash(p.seed, kValueDirections, layer, h), rank, d_n);
  const uint64_t noise_stream = Hash(p.seed, kCalValues, layer, h);
  const uint64_t smooth_stream = Hash(p.seed, kValueSmooth, layer, h);
  const uint64_t coef_stream = Hash(p.seed, kValueCoefficients, layer, h);
  std::vector<float> state(d_n), step(d_n), coef(rank);
  for (size_t t = 0; t < n; ++t) {
    float* out = v.data() + (t * h_n + h) * d_n;
    FillNormals(noise_stream, t * d_n, noise, out, d_n);
    FillNormals(smooth_stream, t * d_n, 1.0f, step.data(), d_n);
    // S_0 is drawn from the stationary distribution (unit variance), later S_t from S_{t-1}.
    const float keep = t == 0 ? 0.0f : rho, fresh = t == 0 ? 1.0f : innovation;
    for (uint32_t d = 0; d < d_n; ++d) {
      state[d] = keep * state[d] + fresh * step[d];
      out[d] += smooth * state[d];
    }
    FillNormals(coef_stream, t * rank, low_rank, coef.data(), rank);
    for (uint32_t r = 0; r < rank; ++r) {
      const float* b = basis.data() + size_t{r} * d_n;
      for (uint32_t d = 0; d < d_n; ++d) out[d] += coef[r] * b[d];
    }
  }
}

// One heavy-hitter span.
struct Span {
  size_t first, len;
  float strength;
  int32_t topic;  // -1: always on
};

// The hitters of `slots` slots of scope `who` (0: the layer's, 1 + h: kv head h's own) at
// `layer`: each slot holds a hitter born at the last layer <= `layer` whose coin said "replace"
// (or at layer 0), drawn from (slot, birth layer).
void SlotSpans(const AttentionParams& p, const CalShape& s, size_t n, uint32_t layer, uint64_t who,
               size_t slots, float scale, std::vector<Span>& out) {
  const CalibratedShape& c = p.calibrated;
  // log(1 - 1/mean): Geometric lengths by inversion.
  const double log_stay = c.hitter_mean_tokens > 1 ? std::log1p(-1 / c.hitter_mean_tokens) : 0;
  for (size_t slot = 0; slot < slots; ++slot) {
    uint32_t birth = 0;
    for (uint32_t l = layer; l >= 1; --l) {
      if (Uniform(Hash(p.seed, kSlotCoin, who, slot, l)) >= c.layer_persistence) {
        birth = l;
        break;
      }
    }
    const uint64_t id = Hash(p.seed, kSlotDraw, who, slot, birth);
    Span sp;
    sp.first = Mix64(id ^ 1) % n;
    size_t len = 1;
    if (log_stay < 0) {
      const double u = 1 - Uniform(Mix64(id ^ 2));  // in (0, 1]
      len += static_cast<size_t>(std::min(64.0, std::floor(std::log(u) / log_stay)));
    }
    sp.len = std::min(len, n - sp.first);
    const double exp1 = -std::log1p(-Uniform(Mix64(id ^ 3)));
    sp.strength = scale * static_cast<float>(c.hitter_strength + c.hitter_tail * exp1);
    sp.topic = (s.topics == 0 || Uniform(Mix64(id ^ 4)) < c.always_on_share)
                   ? -1
                   : static_cast<int32_t>(Mix64(id ^ 5) % s.topics);
    out.push_back(sp);
  }
}

void GenerateCalibrated(const ModelSpec& spec, size_t n, const AttentionParams& p, uint32_t layer,
                        SyntheticAttention::Layer& out) {
  const CalibratedShape& c = p.calibrated;
  const CalShape s = CalShapeOf(spec, c);
  const uint32_t h_n = spec.kv_heads, d_n = spec.head_dim;
  const NoiseScales scale = CalScales(spec, p, s);
  const float diffuse = layer < c.diffuse_layers ? static_cast<float>(c.diffuse_scale) : 1.0f;

  // Position effects along u_0 (normal heads) and u_loc (local-only heads), in tokens.
  std::vector<float> position(n), local(n);
  for (size_t t = 0; t < n; ++t) {
    const double back = static_cast<double>(n - 1 - t);
    position[t] =
        diffuse * static_cast<float>(c.recent_strength * std::exp(-back / c.recent_tokens));
    local[t] = static_cast<float>(c.local_strength * std::exp(-back / c.local_tokens));
  }
  if (layer > 0) {
    for (size_t t = 0; t < std::min<size_t>(p.sink_tokens, n); ++t) {
      position[t] += diffuse * static_cast<float>(c.sink_strength);
      local[t] += static_cast<float>(c.local_sink_strength);
    }
  }

  const double spans_per_head = c.hitter_density * static_cast<double>(n);
  const auto own_slots = static_cast<size_t>(std::lround(spans_per_head * c.kv_head_own_share));
  const auto layer_slots = static_cast<size_t>(std::lround(spans_per_head)) -
                           std::min(own_slots, static_cast<size_t>(std::lround(spans_per_head)));
  std::vector<Span> layer_spans, spans;
  SlotSpans(p, s, n, layer, 0, layer_slots, diffuse, layer_spans);

  out.k.resize(n * h_n * d_n);
  out.v.resize(n * h_n * d_n);
  out.q.resize(size_t{p.window} * spec.q_heads * d_n);
  const std::vector<uint32_t> active = ActiveTopicSet(p, s);
  std::vector<float> u0_boost(n);
  for (uint32_t h = 0; h < h_n; ++h) {
    const std::vector<float> dirs =
        Orthonormal(Hash(p.seed, kCalDirections, layer, h), s.rows(), d_n);
    const float* u0 = dirs.data();
    const float* uloc = dirs.data() + size_t{s.loc_row()} * d_n;
    spans = layer_spans;
    SlotSpans(p, s, n, layer, 1 + h, own_slots, diffuse, spans);
    std::copy(position.begin(), position.end(), u0_boost.begin());
    for (const Span& sp : spans) {
      if (sp.topic >= 0) continue;
      for (size_t t = sp.first; t < sp.first + sp.len; ++t) u0_boost[t] += sp.strength;
    }
    const KeyOutliers outliers = KeyOutliersOf(spec, p, layer, h, scale.key);
    const uint64_t key_stream = Hash(p.seed, kCalKeys, layer, h);
    for (size_t t = 0; t < n; ++t) {
      float* k = out.k.data() + (t * h_n + h) * d_n;
      FillNormals(key_stream, t * d_n, scale.key, k, d_n);
      for (size_t j = 0; j < outliers.channel.size(); ++j) {
        float& x = k[outliers.channel[j]];
        x = outliers.scale * x + outliers.offset[j];
      }
      const float b0 = u0_boost[t], bl = local[t];
      for (uint32_t d = 0; d < d_n; ++d) k[d] += b0 * u0[d] + bl * uloc[d];
    }
    WriteCalValues(spec, p, n, layer, h, out.v);
    // Topic hitters along their topic's direction (few tokens: a pass over the spans).
    for (const Span& sp : spans) {
      if (sp.topic < 0) continue;
      const float* w = dirs.data() + size_t{s.topic_row(static_cast<uint32_t>(sp.topic))} * d_n;
      for (size_t t = sp.first; t < sp.first + sp.len; ++t) {
        float* k = out.k.data() + (t * h_n + h) * d_n;
        for (uint32_t d = 0; d < d_n; ++d) k[d] += sp.strength * w[d];
      }
    }
    WriteCalQueries(spec, p, s, active, layer, h, dirs, out.q);
  }
}
}  // namespace

std::string_view AttentionProfileName(AttentionProfile profile) {
  switch (profile) {
    case AttentionProfile::kCalibrated:
      return "calibrated";
    case AttentionProfile::kPlantedChunks:
      return "planted-chunks";
  }
  return "unknown";
}

absl::StatusOr<AttentionProfile> ParseAttentionProfile(std::string_view name) {
  for (AttentionProfile p : {AttentionProfile::kCalibrated, AttentionProfile::kPlantedChunks}) {
    if (name == AttentionProfileName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown attention profile '", std::string(name),
                                                 "': valid are calibrated, planted-chunks"));
}

SyntheticAttention::SyntheticAttention(const ModelSpec& spec, size_t tokens,
                                       const AttentionParams& params)
    : spec_(spec), tokens_(tokens), params_(params) {
  Validate(spec_, tokens_, params_);
}

SyntheticAttention::Layer SyntheticAttention::Generate(uint32_t layer) const {
  Layer out;
  Generate(layer, out);
  return out;
}

std::vector<uint32_t> SyntheticAttention::ActiveTopics() const {
  if (params_.profile != AttentionProfile::kCalibrated) return {};
  return ActiveTopicSet(params_, CalShapeOf(spec_, params_.calibrated));
}

void SyntheticAttention::Generate(uint32_t layer, Layer& out) const {
  if (layer >= spec_.layers) Fail("Generate: layer out of range");
  if (params_.profile == AttentionProfile::kCalibrated) {
    GenerateCalibrated(spec_, tokens_, params_, layer, out);
    return;
  }
  const AttentionParams& p = params_;
  const uint32_t c = spec_.chunk_tokens, h_n = spec_.kv_heads, d_n = spec_.head_dim;
  const uint32_t m = spec_.q_heads / h_n;
  const size_t n = tokens_, n_chunks = (n + c - 1) / c;  // the tail is a short chunk
  const uint32_t period = layer / p.period_layers;
  const uint32_t head_layer = period * p.period_layers;
  const NoiseScales scale = Scales(p);

  // The draw each chunk follows at this layer, before the heads' own: the layer-wide chain,
  // unless a layer of this period since its head redrew it (the latest such layer's draw).
  std::vector<uint64_t> shared(n_chunks);
  std::vector<bool> drifted(n_chunks, false);
  for (uint64_t j = 0; j < n_chunks; ++j) {
    shared[j] = ChainDraw(p, kSharedCoin, kSharedDraw, 0, period, j);
    for (uint32_t l = head_layer + 1; l <= layer; ++l) {
      if (Uniform(Hash(p.seed, kDriftCoin, l, j)) < p.layer_drift) {
        shared[j] = Hash(p.seed, kDriftDraw, l, j);
        drifted[j] = true;
      }
    }
  }
  // Position effects, the same for every head.
  std::vector<float> position(n, 0.0f);
  for (size_t t = 0; t < std::min<size_t>(p.sink_tokens, n); ++t) {
    position[t] += static_cast<float>(p.sink_strength);
  }
  for (size_t t = 0; t < n; ++t) {
    const double chunks_back = static_cast<double>(n - 1 - t) / c;
    position[t] += static_cast<float>(p.recent_strength * std::pow(p.recent_decay, chunks_back));
  }

  out.k.resize(n * h_n * d_n);  // every element is written below
  out.v.resize(n * h_n * d_n);
  out.q.resize(size_t{p.window} * spec_.q_heads * d_n);
  std::vector<float> shared_boost(n), own(c);
  std::vector<float> extra(size_t{m} * n);  // q head i's boost minus the kv head's
  for (uint32_t h = 0; h < h_n; ++h) {
    const std::vector<float> dirs = Directions(spec_, p.seed, layer, h);
    // Content boosts: the kv head's draw along u_0; where q head i follows a different draw, the
    // difference along u_i, which only q head i's query reads.
    std::fill(extra.begin(), extra.end(), 0.0f);
    for (uint64_t j = 0; j < n_chunks; ++j) {
      const size_t first = j * c, len = std::min<size_t>(c, n - first);
      const std::span<float> kv_boost(shared_boost.data() + first, len);
      // A drift redraws the chunk for every head alike.
      uint64_t kv_draw = shared[j];
      if (!drifted[j] && Uniform(Hash(p.seed, kKvPick, h, j)) < p.kv_head_disagreement) {
        kv_draw = ChainDraw(p, kKvCoin, kKvDraw, h, period, j);
      }
      DrawBoosts(kv_draw, p, kv_boost);
      if (drifted[j]) continue;
      for (uint32_t i = 0; i < m; ++i) {
        const uint64_t g = uint64_t{h} * m + i;
        if (Uniform(Hash(p.seed, kQPick, g, j)) >= p.q_head_disagreement) continue;
        DrawBoosts(ChainDraw(p, kQCoin, kQDraw, g, period, j), p, std::span(own).first(len));
        for (size_t t = 0; t < len; ++t) extra[i * n + first + t] = own[t] - kv_boost[t];
      }
    }
    const uint64_t key_stream = Hash(p.seed, kKeys, layer, h);
    const uint64_t value_stream = Hash(p.seed, kValues, layer, h);
    for (size_t t = 0; t < n; ++t) {
      float* k = out.k.data() + (t * h_n + h) * d_n;
      float* v = out.v.data() + (t * h_n + h) * d_n;
      const float b = shared_boost[t] + position[t];
      FillNormals(key_stream, t * d_n, scale.key, k, d_n);
      for (uint32_t d = 0; d < d_n; ++d) k[d] += b * dirs[d];
      FillNormals(value_stream, t * d_n, 1.0f, v, d_n);
      for (uint32_t i = 0; i < m; ++i) {
        const float e = extra[i * n + t];
        if (e == 0.0f) continue;
        const float* ui = dirs.data() + size_t{i + 1} * d_n;
        for (uint32_t d = 0; d < d_n; ++d) k[d] += e * ui[d];
      }
    }
    WriteQueries(spec_, p, layer, h, dirs, out.q);
  }
}

std::vector<float> SyntheticAttention::Queries(uint32_t layer) const {
  if (layer >= spec_.layers) Fail("Queries: layer out of range");
  std::vector<float> q(size_t{params_.window} * spec_.q_heads * spec_.head_dim);
  if (params_.profile == AttentionProfile::kCalibrated) {
    const CalShape s = CalShapeOf(spec_, params_.calibrated);
    const std::vector<uint32_t> active = ActiveTopicSet(params_, s);
    for (uint32_t h = 0; h < spec_.kv_heads; ++h) {
      const std::vector<float> dirs =
          Orthonormal(Hash(params_.seed, kCalDirections, layer, h), s.rows(), spec_.head_dim);
      WriteCalQueries(spec_, params_, s, active, layer, h, dirs, q);
    }
    return q;
  }
  for (uint32_t h = 0; h < spec_.kv_heads; ++h) {
    WriteQueries(spec_, params_, layer, h, Directions(spec_, params_.seed, layer, h), q);
  }
  return q;
}

std::vector<std::byte> SyntheticAttention::ToDType(std::span<const float> values) const {
  std::vector<std::byte> out(values.size() * kernels::ElementBytes(spec_.dtype));
  kernels::FromFloat(spec_.dtype, values.data(), values.size(), out.data());
  return out;
}

std::vector<std::byte> SyntheticAttention::Records(const Layer& layer) const {
  const size_t c = spec_.chunk_tokens;
  const size_t row = size_t{spec_.kv_heads} * spec_.head_dim;  // elements per token
  const size_t half = c * row * kernels::ElementBytes(spec_.dtype);
  if (layer.k.size() != tokens_ * row || layer.v.size() != tokens_ * row) {
    Fail("Records: a layer of another shape");
  }
  std::vector<std::byte> out(chunks() * 2 * half);
  for (size_t j = 0; j < chunks(); ++j) {
    std::byte* record = out.data() + j * 2 * half;
    kernels::FromFloat(spec_.dtype, layer.k.data() + j * c * row, c * row, record);
    kernels::FromFloat(spec_.dtype, layer.v.data() + j * c * row, c * row, record + half);
  }
  return out;
}

PlantedKv::PlantedKv(const SyntheticAttention& gen) {
  const uint32_t layers = gen.spec().layers;
  k_.reserve(layers);
  v_.reserve(layers);
  tensors_.tokens = gen.tokens();
  for (uint32_t l = 0; l < layers; ++l) {
    const SyntheticAttention::Layer layer = gen.Generate(l);
    k_.push_back(gen.ToDType(layer.k));
    v_.push_back(gen.ToDType(layer.v));
    tensors_.k.emplace_back(k_.back());
    tensors_.v.emplace_back(v_.back());
  }
}

size_t PlantedKv::bytes() const {
  size_t total = 0;
  for (const auto& k : k_) total += k.size();
  for (const auto& v : v_) total += v.size();
  return total;
}

}  // namespace ckv::synth
