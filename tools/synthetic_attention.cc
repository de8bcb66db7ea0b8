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
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
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
  const int32_t sum = static_cast<int32_t>((r & 0xffff) + ((r >> 16) & 0xffff) +
                                           ((r >> 32) & 0xffff) + (r >> 48));
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

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "ckv synthetic_attention: precondition failed: %s\n", what);
  std::abort();
}

bool IsProbability(double p) { return p >= 0 && p <= 1; }
bool IsSpread(double s) { return std::isfinite(s) && s >= 0; }

void Validate(const ModelSpec& spec, size_t tokens, const AttentionParams& p) {
  if (!spec.Validate().ok()) Fail("invalid ModelSpec");
  if (tokens == 0) Fail("tokens == 0");
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

}  // namespace

std::string_view AttentionProfileName(AttentionProfile profile) {
  return profile == AttentionProfile::kCalibrated ? "calibrated" : "planted-chunks";
}

absl::StatusOr<AttentionProfile> ParseAttentionProfile(std::string_view name) {
  if (name == "calibrated") return AttentionProfile::kCalibrated;
  if (name == "planted-chunks") return AttentionProfile::kPlantedChunks;
  return absl::InvalidArgumentError(absl::StrCat("unknown attention profile '", std::string(name),
                                                 "' (calibrated, planted-chunks)"));
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

void SyntheticAttention::Generate(uint32_t layer, Layer& out) const {
  if (layer >= spec_.layers) Fail("Generate: layer out of range");
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
