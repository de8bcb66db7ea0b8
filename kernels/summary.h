// SPDX-License-Identifier: Apache-2.0
// kernels/summary.h: the quantised key summaries that let a selector score chunks without
// reading their KV.
//
// For every (chunk, layer, kv head) ckv keeps the channel-wise minimum and maximum of the chunk's
// c keys (Quest's page summary) and their mean (a ShadowKV-style landmark). They are computed at
// Put time and stored per chunk as parts, each its own record on disk (docs/format.md), so a
// selector reads only the part it uses:
//
//   min/max part: layers * kv_heads entries, entry (l, h) at index l * kv_heads + h, each
//       fp16 scale_min | fp16 scale_max | int8 min[head_dim] | int8 max[head_dim]
//   mean part:    layers * kv_heads entries, each
//       fp16 scale | int8 mean[head_dim]
//   estimate part (the third, absent from chunks written before it): layers * kv_heads entries,
//       fp16 scale | int8 value_mean[head_dim]
//     the tokens' mean value, which with the mean part's key mean lets a session stand in for a
//     chunk it did not load (kernels/estimate.h, docs/estimate.md).
//   outlier part (the fourth, absent from chunks written before it): layers * kv_heads entries,
//       fp16 scale | int8 key[head_dim]
//     the key of the chunk's token farthest (L2) from the chunk's mean key, ties to the earlier
//     token: with the mean part, what `outlier-key` scores (kernels/selector.h).
//
// A value is its int8 times its scale. Scales are per vector (max |x| / 127, rounded up to an fp16
// so that every quantised value fits in [-127, 127]). Minima are rounded down and maxima up, so the
// decoded box still contains every key and Quest's bound stays an upper bound. Means round to
// nearest. Keys that are not finite are clamped to +-65504 first.
//
// Size: at c = 16 and 16-bit KV the min/max part is (2 * head_dim + 4) / (64 * head_dim) of the
// chunk's KV bytes (1/31.5 at head_dim 128), and the mean and estimate parts half of that each.
// This layout is format version 1 of the summary records: do not change it without bumping
// docs/format.md.
//
// Thread-safety: pure functions.
#ifndef CKV_KERNELS_SUMMARY_H_
#define CKV_KERNELS_SUMMARY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "ckv/model_spec.h"
#include "kernels/half.h"

namespace ckv::kernels {

// Sizes of one chunk's summary parts under a spec.
struct SummaryFormat {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;

  static SummaryFormat For(const ModelSpec& spec) {
    return SummaryFormat{spec.layers, spec.kv_heads, spec.head_dim};
  }
  size_t MinMaxEntryBytes() const { return 4 + 2 * size_t{head_dim}; }
  size_t MeanEntryBytes() const { return 2 + size_t{head_dim}; }
  size_t EstimateEntryBytes() const { return 2 + size_t{head_dim}; }
  size_t OutlierEntryBytes() const { return 2 + size_t{head_dim}; }
  size_t MinMaxBytes() const { return Entries() * MinMaxEntryBytes(); }
  size_t MeanBytes() const { return Entries() * MeanEntryBytes(); }
  size_t EstimateBytes() const { return Entries() * EstimateEntryBytes(); }
  size_t OutlierBytes() const { return Entries() * OutlierEntryBytes(); }
  size_t Entries() const { return size_t{layers} * kv_heads; }
  size_t EntryIndex(uint32_t layer, uint32_t head) const { return size_t{layer} * kv_heads + head; }
};

// One (layer, kv head) entry of a min/max part, viewed in place.
struct MinMaxEntry {
  float scale_min = 0;
  float scale_max = 0;
  const int8_t* min = nullptr;  // head_dim values
  const int8_t* max = nullptr;  // head_dim values
};

// One (layer, kv head) entry of a mean part, viewed in place.
struct MeanEntry {
  float scale = 0;
  const int8_t* mean = nullptr;  // head_dim values
};

inline MinMaxEntry MinMaxAt(const SummaryFormat& f, const std::byte* minmax_part, uint32_t layer,
                            uint32_t head) {
  const std::byte* p = minmax_part + f.EntryIndex(layer, head) * f.MinMaxEntryBytes();
  uint16_t s[2];
  std::memcpy(s, p, 4);
  const auto* q = reinterpret_cast<const int8_t*>(p + 4);
  return MinMaxEntry{HalfToFloat(s[0]), HalfToFloat(s[1]), q, q + f.head_dim};
}

inline MeanEntry MeanAt(const SummaryFormat& f, const std::byte* mean_part, uint32_t layer,
                        uint32_t head) {
  const std::byte* p = mean_part + f.EntryIndex(layer, head) * f.MeanEntryBytes();
  uint16_t s;
  std::memcpy(&s, p, 2);
  return MeanEntry{HalfToFloat(s), reinterpret_cast<const int8_t*>(p + 2)};
}

// One (layer, kv head) entry of an estimate part, viewed in place: what kernels/estimate.h needs
// beside the mean part's key mean to stand in for the chunk when it is not loaded.
struct EstimateEntry {
  float scale = 0;
  const int8_t* value_mean = nullptr;  // head_dim values: the tokens' mean value
};

inline EstimateEntry EstimateAt(const SummaryFormat& f, const std::byte* estimate_part,
                                uint32_t layer, uint32_t head) {
  const std::byte* p = estimate_part + f.EntryIndex(layer, head) * f.EstimateEntryBytes();
  uint16_t s;
  std::memcpy(&s, p, 2);
  return EstimateEntry{HalfToFloat(s), reinterpret_cast<const int8_t*>(p + 2)};
}

// One (layer, kv head) entry of an outlier part, viewed in place.
struct OutlierEntry {
  float scale = 0;
  const int8_t* key = nullptr;  // head_dim values: the key farthest from the chunk's mean
};

inline OutlierEntry OutlierAt(const SummaryFormat& f, const std::byte* outlier_part, uint32_t layer,
                              uint32_t head) {
  const std::byte* p = outlier_part + f.EntryIndex(layer, head) * f.OutlierEntryBytes();
  uint16_t s;
  std::memcpy(&s, p, 2);
  return OutlierEntry{HalfToFloat(s), reinterpret_cast<const int8_t*>(p + 2)};
}

// Writes the entries of `layer` (all kv heads) of one chunk's two summary parts from the chunk's
// keys at that layer: chunk_tokens * kv_heads * head_dim elements of spec.dtype, [c, kv_heads,
// head_dim] as in ckv/kv.h. REQUIRES: keys.size() == c * kv_heads * head_dim * element bytes,
// minmax_part.size() == MinMaxBytes(), mean_part.size() == MeanBytes().
// With a non-empty `outlier_part` (OutlierBytes()), also its entries of `layer`, from the same
// float keys and mean: per kv head, the key of the token farthest from the tokens' mean (keys
// clamped as for the summaries), int8 times an fp16 scale, to nearest.
void SummarizeChunkLayer(const ModelSpec& spec, uint32_t layer, std::span<const std::byte> keys,
                         std::span<std::byte> minmax_part, std::span<std::byte> mean_part,
                         std::span<std::byte> outlier_part = {});

// Writes the entries of `layer` (all kv heads) of one chunk's estimate part from the chunk's
// values at that layer (as `keys` above): per entry, the value mean, int8 times an fp16 scale, to
// nearest (values clamped as keys are for the summaries). REQUIRES: values.size() == c *
// kv_heads * head_dim * element bytes, estimate_part.size() == EstimateBytes().
void EstimateChunkLayer(const ModelSpec& spec, uint32_t layer, std::span<const std::byte> values,
                        std::span<std::byte> estimate_part);

// Unquantised summaries of one (chunk, layer, kv head) from float keys [tokens, kv_heads,
// head_dim]: the reference the quantised ones are measured against. Writes head_dim floats to
// each of min, max, mean.
void ExactSummary(const float* keys, uint32_t tokens, uint32_t kv_heads, uint32_t head_dim,
                  uint32_t head, float* min, float* max, float* mean);

// Decodes an entry into head_dim floats each.
void DecodeMinMax(const MinMaxEntry& e, uint32_t head_dim, float* min, float* max);
void DecodeMean(const MeanEntry& e, uint32_t head_dim, float* mean);
void DecodeEstimate(const EstimateEntry& e, uint32_t head_dim, float* value_mean);
void DecodeOutlier(const OutlierEntry& e, uint32_t head_dim, float* key);

// How a vector rounds into the 8-bit form: minima down (the box never shrinks), maxima up, the
// rest to nearest.
enum class Rounding { kDown, kUp, kNearest };

// Replaces x[0, n) by its 8-bit form decoded: int8 times the fp16 scale SummarizeChunkLayer
// gives a vector of that max |x|. For measuring what a stored statistic would give.
void RoundTripInt8(float* x, uint32_t n, Rounding r);

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_SUMMARY_H_
