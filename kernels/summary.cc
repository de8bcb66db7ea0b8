// kernels/summary.cc: computing and decoding the quantised key summaries (see summary.h).
#include "kernels/summary.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/assert.h"

namespace ckv::kernels {
namespace {

constexpr float kHalfMax = 65504.0f;

// The smallest fp16 scale s with max_abs / s <= 127, as (fp16 bits, float value).
std::pair<uint16_t, float> ScaleFor(float max_abs) {
  if (max_abs == 0) return {0, 0.0f};
  const float want = max_abs / 127.0f;
  uint16_t bits = FloatToHalf(want);
  if (HalfToFloat(bits) < want) ++bits;  // positive halves are ordered like their bits
  if (bits == 0) bits = 1;               // smallest subnormal: the values are ~1e-8
  return {bits, HalfToFloat(bits)};
}

int8_t Quantise(float x, float scale, float (*round)(float)) {
  if (scale == 0) return 0;
  return static_cast<int8_t>(std::clamp(round(x / scale), -127.0f, 127.0f));
}

float Clamp(float x) {
  if (std::isnan(x)) return 0.0f;
  return std::clamp(x, -kHalfMax, kHalfMax);
}

float MaxAbs(const float* v, uint32_t n) {
  float m = 0;
  for (uint32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

}  // namespace

void ExactSummary(const float* keys, uint32_t tokens, uint32_t kv_heads, uint32_t head_dim,
                  uint32_t head, float* min, float* max, float* mean) {
  for (uint32_t d = 0; d < head_dim; ++d) {
    min[d] = kHalfMax;
    max[d] = -kHalfMax;
    mean[d] = 0;
  }
  for (uint32_t t = 0; t < tokens; ++t) {
    const float* k = keys + (size_t{t} * kv_heads + head) * head_dim;
    for (uint32_t d = 0; d < head_dim; ++d) {
      const float x = Clamp(k[d]);
      min[d] = std::min(min[d], x);
      max[d] = std::max(max[d], x);
      mean[d] += x;
    }
  }
  for (uint32_t d = 0; d < head_dim; ++d) mean[d] /= static_cast<float>(tokens);
}

void SummarizeChunkLayer(const ModelSpec& spec, uint32_t layer, std::span<const std::byte> keys,
                         std::span<std::byte> minmax_part, std::span<std::byte> mean_part) {
  const SummaryFormat f = SummaryFormat::For(spec);
  const uint32_t d_n = spec.head_dim;
  const size_t elements = size_t{spec.chunk_tokens} * spec.kv_heads * d_n;
  // One chunk's keys of one layer in, one entry per kv head of that layer out, inside the parts.
  CKV_DCHECK(layer < spec.layers && keys.size() == size_t{spec.chunk_tokens} *
                                                       spec.TokenBytesPerLayer());
  CKV_DCHECK(minmax_part.size() == f.MinMaxBytes() && mean_part.size() == f.MeanBytes());
  std::vector<float> k(elements), mn(d_n), mx(d_n), mean(d_n);
  ToFloat(spec.dtype, keys.data(), elements, k.data());
  for (uint32_t h = 0; h < spec.kv_heads; ++h) {
    ExactSummary(k.data(), spec.chunk_tokens, spec.kv_heads, d_n, h, mn.data(), mx.data(),
                 mean.data());

    std::byte* e = minmax_part.data() + f.EntryIndex(layer, h) * f.MinMaxEntryBytes();
    const auto [min_bits, min_scale] = ScaleFor(MaxAbs(mn.data(), d_n));
    const auto [max_bits, max_scale] = ScaleFor(MaxAbs(mx.data(), d_n));
    const uint16_t scales[2] = {min_bits, max_bits};
    std::memcpy(e, scales, 4);
    auto* q_min = reinterpret_cast<int8_t*>(e + 4);
    auto* q_max = q_min + d_n;
    for (uint32_t d = 0; d < d_n; ++d) {
      q_min[d] = Quantise(mn[d], min_scale, std::floor);
      q_max[d] = Quantise(mx[d], max_scale, std::ceil);
    }

    std::byte* m = mean_part.data() + f.EntryIndex(layer, h) * f.MeanEntryBytes();
    const auto [mean_bits, mean_scale] = ScaleFor(MaxAbs(mean.data(), d_n));
    std::memcpy(m, &mean_bits, 2);
    auto* q_mean = reinterpret_cast<int8_t*>(m + 2);
    for (uint32_t d = 0; d < d_n; ++d) q_mean[d] = Quantise(mean[d], mean_scale, std::nearbyint);
  }
}

void DecodeMinMax(const MinMaxEntry& e, uint32_t head_dim, float* min, float* max) {
  for (uint32_t d = 0; d < head_dim; ++d) {
    min[d] = e.min[d] * e.scale_min;
    max[d] = e.max[d] * e.scale_max;
  }
}

void DecodeMean(const MeanEntry& e, uint32_t head_dim, float* mean) {
  for (uint32_t d = 0; d < head_dim; ++d) mean[d] = e.mean[d] * e.scale;
}

}  // namespace ckv::kernels
