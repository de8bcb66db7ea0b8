// SPDX-License-Identifier: Apache-2.0
// kernels/summary.cc: computing and decoding the quantised key summaries (see summary.h).
#include "kernels/summary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// round(x / scale) clamped to [-127, 127], for round = floor, ceil or nearbyint (to nearest even
// in the default rounding mode), without a libm call per element: x / scale is first bounded to
// [-128, 128], which clamps alike, and within it the rounding is exact (a float's integer part
// converts exactly; adding and removing 1.5 x 2^23 rounds as nearbyint does). x is never NaN
// here: the summaries are of clamped keys.
template <Rounding kRound>
void QuantiseAll(const float* x, uint32_t n, float scale, int8_t* out) {
  if (scale == 0) {
    std::memset(out, 0, n);
    return;
  }
  for (uint32_t i = 0; i < n; ++i) {
    const float v = std::min(std::max(x[i] / scale, -128.0f), 128.0f);
    float r;
    if constexpr (kRound == Rounding::kNearest) {
      r = (v + 0x1.8p23f) - 0x1.8p23f;
    } else {
      r = static_cast<float>(static_cast<int32_t>(v));  // toward zero
      if (kRound == Rounding::kDown && r > v) r -= 1.0f;
      if (kRound == Rounding::kUp && r < v) r += 1.0f;
    }
    out[i] = static_cast<int8_t>(std::min(std::max(r, -127.0f), 127.0f));
  }
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

namespace {

// Folds one token's keys of every kv head (`n` floats, head-major) into the running minimum,
// maximum and sum of each element: the same operations, in the same token order, as ExactSummary
// makes per head, so the results are bit-identical; contiguous, so the loop vectorises.
void AccumulateRow(const float* __restrict x, size_t n, float* __restrict mn, float* __restrict mx,
                   float* __restrict sum) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i] != x[i] ? 0.0f : std::min(std::max(x[i], -kHalfMax), kHalfMax);  // Clamp
    mn[i] = std::min(mn[i], v);
    mx[i] = std::max(mx[i], v);
    sum[i] += v;
  }
}

// The outlier entries of `layer` from a chunk's float keys `k` ([c, kv_heads, head_dim], not yet
// clamped) and their clamped mean: per kv head, the clamped key farthest (L2) from the mean, ties
// to the earlier token.
void WriteOutliers(const ModelSpec& spec, const SummaryFormat& f, uint32_t layer, const float* k,
                   const float* mean, std::span<std::byte> outlier_part) {
  const uint32_t d_n = spec.head_dim;
  const size_t row = size_t{spec.kv_heads} * d_n;
  thread_local std::vector<float> key;  // reused: a Put summarises every layer of every chunk
  key.resize(d_n);
  for (uint32_t h = 0; h < spec.kv_heads; ++h) {
    const float* h_mean = mean + size_t{h} * d_n;
    uint32_t far = 0;
    double far_d2 = -1;
    for (uint32_t t = 0; t < spec.chunk_tokens; ++t) {
      const float* x = k + t * row + size_t{h} * d_n;
      double d2 = 0;
      for (uint32_t d = 0; d < d_n; ++d) {
        const float e = Clamp(x[d]) - h_mean[d];
        d2 += double(e) * e;
      }
      if (d2 > far_d2) {
        far_d2 = d2;
        far = t;
      }
    }
    for (uint32_t d = 0; d < d_n; ++d) key[d] = Clamp(k[far * row + size_t{h} * d_n + d]);
    std::byte* e = outlier_part.data() + f.EntryIndex(layer, h) * f.OutlierEntryBytes();
    const auto [bits, scale] = ScaleFor(MaxAbs(key.data(), d_n));
    std::memcpy(e, &bits, 2);
    QuantiseAll<Rounding::kNearest>(key.data(), d_n, scale, reinterpret_cast<int8_t*>(e + 2));
  }
}

}  // namespace

void SummarizeChunkLayer(const ModelSpec& spec, uint32_t layer, std::span<const std::byte> keys,
                         std::span<std::byte> minmax_part, std::span<std::byte> mean_part,
                         std::span<std::byte> outlier_part) {
  const SummaryFormat f = SummaryFormat::For(spec);
  const uint32_t d_n = spec.head_dim;
  const size_t row = size_t{spec.kv_heads} * d_n;  // one token's keys, every kv head
  const size_t elements = size_t{spec.chunk_tokens} * row;
  // One chunk's keys of one layer in, one entry per kv head of that layer out, inside the parts.
  CKV_DCHECK(layer < spec.layers &&
             keys.size() == size_t{spec.chunk_tokens} * spec.TokenBytesPerLayer());
  CKV_DCHECK(minmax_part.size() == f.MinMaxBytes() && mean_part.size() == f.MeanBytes());
  CKV_DCHECK(outlier_part.empty() || outlier_part.size() == f.OutlierBytes());
  // Reused per thread: a Put summarises every layer of every chunk it writes.
  thread_local std::vector<float> k, mn, mx, mean;
  k.resize(elements);
  mn.assign(row, kHalfMax);
  mx.assign(row, -kHalfMax);
  mean.assign(row, 0.0f);
  ToFloat(spec.dtype, keys.data(), elements, k.data());
  for (uint32_t t = 0; t < spec.chunk_tokens; ++t) {
    AccumulateRow(k.data() + t * row, row, mn.data(), mx.data(), mean.data());
  }
  for (float& m : mean) m /= static_cast<float>(spec.chunk_tokens);
  if (!outlier_part.empty()) WriteOutliers(spec, f, layer, k.data(), mean.data(), outlier_part);

  for (uint32_t h = 0; h < spec.kv_heads; ++h) {
    const float* h_mn = mn.data() + size_t{h} * d_n;
    const float* h_mx = mx.data() + size_t{h} * d_n;
    const float* h_mean = mean.data() + size_t{h} * d_n;
    std::byte* e = minmax_part.data() + f.EntryIndex(layer, h) * f.MinMaxEntryBytes();
    const auto [min_bits, min_scale] = ScaleFor(MaxAbs(h_mn, d_n));
    const auto [max_bits, max_scale] = ScaleFor(MaxAbs(h_mx, d_n));
    const uint16_t scales[2] = {min_bits, max_bits};
    std::memcpy(e, scales, 4);
    auto* q_min = reinterpret_cast<int8_t*>(e + 4);
    auto* q_max = q_min + d_n;
    QuantiseAll<Rounding::kDown>(h_mn, d_n, min_scale, q_min);
    QuantiseAll<Rounding::kUp>(h_mx, d_n, max_scale, q_max);

    std::byte* m = mean_part.data() + f.EntryIndex(layer, h) * f.MeanEntryBytes();
    const auto [mean_bits, mean_scale] = ScaleFor(MaxAbs(h_mean, d_n));
    std::memcpy(m, &mean_bits, 2);
    auto* q_mean = reinterpret_cast<int8_t*>(m + 2);
    QuantiseAll<Rounding::kNearest>(h_mean, d_n, mean_scale, q_mean);
  }
}

void EstimateChunkLayer(const ModelSpec& spec, uint32_t layer, std::span<const std::byte> values,
                        std::span<std::byte> estimate_part) {
  const SummaryFormat f = SummaryFormat::For(spec);
  const uint32_t d_n = spec.head_dim;
  const size_t row = size_t{spec.kv_heads} * d_n;
  const size_t elements = size_t{spec.chunk_tokens} * row;
  CKV_DCHECK(layer < spec.layers &&
             values.size() == size_t{spec.chunk_tokens} * spec.TokenBytesPerLayer());
  CKV_DCHECK(estimate_part.size() == f.EstimateBytes());
  thread_local std::vector<float> v, value_mean;
  v.resize(elements);
  value_mean.assign(row, 0.0f);
  ToFloat(spec.dtype, values.data(), elements, v.data());
  for (uint32_t t = 0; t < spec.chunk_tokens; ++t) {
    for (size_t i = 0; i < row; ++i) value_mean[i] += Clamp(v[t * row + i]);
  }
  for (float& m : value_mean) m /= static_cast<float>(spec.chunk_tokens);
  for (uint32_t h = 0; h < spec.kv_heads; ++h) {
    const float* h_v = value_mean.data() + size_t{h} * d_n;
    std::byte* e = estimate_part.data() + f.EntryIndex(layer, h) * f.EstimateEntryBytes();
    const auto [bits, scale] = ScaleFor(MaxAbs(h_v, d_n));
    std::memcpy(e, &bits, 2);
    QuantiseAll<Rounding::kNearest>(h_v, d_n, scale, reinterpret_cast<int8_t*>(e + 2));
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

void DecodeEstimate(const EstimateEntry& e, uint32_t head_dim, float* value_mean) {
  for (uint32_t d = 0; d < head_dim; ++d) value_mean[d] = e.value_mean[d] * e.scale;
}

void DecodeOutlier(const OutlierEntry& e, uint32_t head_dim, float* key) {
  for (uint32_t d = 0; d < head_dim; ++d) key[d] = e.key[d] * e.scale;
}

void RoundTripInt8(float* x, uint32_t n, Rounding r) {
  const float scale = ScaleFor(MaxAbs(x, n)).second;
  std::vector<int8_t> q(n);
  switch (r) {
    case Rounding::kDown:
      QuantiseAll<Rounding::kDown>(x, n, scale, q.data());
      break;
    case Rounding::kUp:
      QuantiseAll<Rounding::kUp>(x, n, scale, q.data());
      break;
    case Rounding::kNearest:
      QuantiseAll<Rounding::kNearest>(x, n, scale, q.data());
      break;
  }
  for (uint32_t i = 0; i < n; ++i) x[i] = q[i] * scale;
}

}  // namespace ckv::kernels
