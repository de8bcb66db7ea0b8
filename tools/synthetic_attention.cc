// tools/synthetic_attention.cc: see synthetic_attention.h.
#include "tools/synthetic_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/half.h"

namespace ckv::synth {
namespace {

// A small, fast, seedable generator (splitmix64 for seeding, xoshiro256** for draws) and
// Box-Muller normals: a layer of an 8K-token 7b prefix needs ~8M normals.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) s = SplitMix(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  float Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = std::max(Uniform(), 1e-300), u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2 * M_PI * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2 * M_PI * u2));
  }
  size_t Below(size_t n) { return static_cast<size_t>(Uniform() * static_cast<double>(n)); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
  float spare_ = 0;
  bool has_spare_ = false;
};

uint64_t Mix(uint64_t a, uint64_t b) { return a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull); }

// Replaces round(fraction * |set|) members of `set` with chunks outside it (never the sink chunk
// or the recent ones, which are planted separately), keeping it sorted.
void Swap(std::vector<uint32_t>& set, double fraction, size_t chunks, size_t first_recent,
          Rng& rng) {
  const auto swaps = static_cast<size_t>(std::lround(fraction * static_cast<double>(set.size())));
  std::vector<bool> in(chunks, false);
  for (uint32_t j : set) in[j] = true;
  const size_t candidates = first_recent > 1 ? first_recent - 1 : 0;  // chunks 1..first_recent-1
  // Distinct members go out: the first `swaps` positions of a random permutation.
  std::vector<size_t> order(set.size());
  std::iota(order.begin(), order.end(), size_t{0});
  for (size_t i = 0; i < std::min(swaps, order.size()); ++i) {
    std::swap(order[i], order[i + rng.Below(order.size() - i)]);
  }
  for (size_t s = 0; s < swaps && s < set.size() && set.size() < candidates; ++s) {
    const size_t out = order[s];
    uint32_t j;
    do {
      j = static_cast<uint32_t>(1 + rng.Below(candidates));
    } while (in[j]);
    in[set[out]] = false;
    in[j] = true;
    set[out] = j;
  }
  std::sort(set.begin(), set.end());
}

std::vector<float> UnitVector(uint32_t n, Rng& rng) {
  std::vector<float> v(n);
  double norm = 0;
  for (float& x : v) {
    x = rng.Normal();
    norm += double{x} * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

}  // namespace

SyntheticAttention::SyntheticAttention(const ModelSpec& spec, size_t tokens,
                                       const AttentionParams& params)
    : spec_(spec), tokens_(tokens), params_(params) {
  const size_t n = chunks();
  const size_t first_recent = n - std::min<size_t>(params_.recent_chunks, n);
  Rng rng(Mix(params_.seed, 0x5eed));
  strength_.resize(n);
  for (float& s : strength_) {
    s = static_cast<float>(params_.heavy_strength -
                           std::log(std::max(rng.Uniform(), 1e-12)) * params_.heavy_tail);
  }
  const size_t heavy = std::min<size_t>(
      first_recent > 1 ? first_recent - 1 : 0,
      static_cast<size_t>(std::lround(params_.heavy_fraction * static_cast<double>(n))));
  const uint32_t periods = (spec_.layers + params_.period_layers - 1) / params_.period_layers;
  std::vector<uint32_t> set;
  // The first period's set: `heavy` distinct chunks; later ones keep period_overlap of it.
  std::vector<uint32_t> pool(first_recent > 1 ? first_recent - 1 : 0);
  std::iota(pool.begin(), pool.end(), 1u);
  for (size_t i = 0; i < heavy; ++i) std::swap(pool[i], pool[i + rng.Below(pool.size() - i)]);
  set.assign(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(heavy));
  std::sort(set.begin(), set.end());
  for (uint32_t p = 0; p < periods; ++p) {
    if (p > 0) Swap(set, 1.0 - params_.period_overlap, n, first_recent, rng);
    period_sets_.push_back(set);
  }
}

std::vector<uint32_t> SyntheticAttention::HeavyHitters(uint32_t layer, uint32_t kv_head) const {
  const size_t n = chunks();
  const size_t first_recent = n - std::min<size_t>(params_.recent_chunks, n);
  std::vector<uint32_t> set = period_sets_[layer / params_.period_layers];
  Rng layer_rng(Mix(params_.seed, 0x1a7e0000ull + layer));
  const uint32_t steps = layer % params_.period_layers;
  for (uint32_t s = 0; s < steps; ++s) Swap(set, params_.layer_drift, n, first_recent, layer_rng);
  // A kv head's disagreement with the others holds for the whole period (heads specialise).
  Rng head_rng(Mix(Mix(params_.seed, 0x4ead0000ull + layer / params_.period_layers), kv_head));
  Swap(set, params_.head_disagreement, n, first_recent, head_rng);
  return set;
}

SyntheticAttention::Layer SyntheticAttention::Generate(uint32_t layer) const {
  const uint32_t c = spec_.chunk_tokens, h_n = spec_.kv_heads, d_n = spec_.head_dim;
  const uint32_t group = spec_.q_heads / h_n;
  const size_t n = chunks();
  const size_t first_recent = n - std::min<size_t>(params_.recent_chunks, n);
  Layer out;
  out.k.resize(tokens_ * h_n * d_n);
  out.v.resize(tokens_ * h_n * d_n);
  out.q.resize(size_t{params_.window} * spec_.q_heads * d_n);
  const float sqrt_d = std::sqrt(static_cast<float>(d_n));
  for (uint32_t h = 0; h < h_n; ++h) {
    Rng rng(Mix(Mix(params_.seed, 0xda7a0000ull + layer), h));
    const std::vector<float> u = UnitVector(d_n, rng);
    // Boost of every token along u.
    std::vector<float> boost(tokens_, 0.0f);
    for (uint32_t t = 0; t < std::min<size_t>(params_.sink_tokens, tokens_); ++t) {
      boost[t] = static_cast<float>(params_.sink_strength);
    }
    for (size_t j = first_recent; j < n; ++j) {
      const double b = params_.recent_strength * std::pow(params_.recent_decay, double(n - 1 - j));
      for (uint32_t t = 0; t < c; ++t) boost[j * c + t] = std::max(boost[j * c + t], float(b));
    }
    const auto hot = static_cast<uint32_t>(
        std::clamp<long>(std::lround(params_.hot_token_fraction * c), 1, c));
    for (uint32_t j : HeavyHitters(layer, h)) {
      std::vector<uint32_t> order(c);
      std::iota(order.begin(), order.end(), 0u);
      for (uint32_t i = 0; i < hot; ++i) std::swap(order[i], order[i + rng.Below(c - i)]);
      for (uint32_t i = 0; i < hot; ++i) boost[j * c + order[i]] = strength_[j];
    }
    // Keys: noise, plus the boost along u scaled so that a query of norm sqrt(D) along u turns
    // it into a logit of about `boost` (scores are divided by sqrt(D)).
    for (size_t t = 0; t < tokens_; ++t) {
      float* k = out.k.data() + (t * h_n + h) * d_n;
      float* v = out.v.data() + (t * h_n + h) * d_n;
      for (uint32_t d = 0; d < d_n; ++d) {
        k[d] = static_cast<float>(params_.key_noise) * rng.Normal() + boost[t] * u[d];
        v[d] = rng.Normal();
      }
    }
    // Queries of the group's q heads: along u tilted per head, plus noise; norm about sqrt(D)
    // along the direction so that logits are about the boost.
    for (uint32_t g = h * group; g < (h + 1) * group; ++g) {
      std::vector<float> dir = UnitVector(d_n, rng);
      double norm = 0;
      for (uint32_t d = 0; d < d_n; ++d) {
        dir[d] = u[d] + static_cast<float>(params_.query_head_spread) * dir[d];
        norm += double{dir[d]} * dir[d];
      }
      for (float& x : dir) x = static_cast<float>(x / std::sqrt(norm));
      for (uint32_t i = 0; i < params_.window; ++i) {
        float* q = out.q.data() + (size_t{i} * spec_.q_heads + g) * d_n;
        for (uint32_t d = 0; d < d_n; ++d) {
          q[d] = sqrt_d * dir[d] + static_cast<float>(params_.query_noise) * rng.Normal();
        }
      }
    }
  }
  return out;
}

std::vector<std::byte> SyntheticAttention::Records(const Layer& layer) const {
  const size_t c = spec_.chunk_tokens;
  const size_t row = size_t{spec_.kv_heads} * spec_.head_dim;  // elements per token
  const size_t elem = kernels::ElementBytes(spec_.dtype);
  const size_t half = c * row * elem;
  std::vector<std::byte> out(chunks() * 2 * half);
  for (size_t j = 0; j < chunks(); ++j) {
    kernels::FromFloat(spec_.dtype, layer.k.data() + j * c * row, c * row, out.data() + j * 2 * half);
    kernels::FromFloat(spec_.dtype, layer.v.data() + j * c * row, c * row,
                       out.data() + j * 2 * half + half);
  }
  return out;
}

}  // namespace ckv::synth
