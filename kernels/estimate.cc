// SPDX-License-Identifier: Apache-2.0
// kernels/estimate.cc: attention with the chunks not loaded estimated (see estimate.h).
#include "kernels/estimate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/simd.h"
#include "kernels/summary.h"

namespace ckv::kernels {

std::string_view EstimateKindName(EstimateKind k) {
  switch (k) {
    case EstimateKind::kNone:
      return "drop";
    case EstimateKind::kMean:
      return "mean";
    case EstimateKind::kGaussian:
      return "gauss";
    case EstimateKind::kGaussianWindow:
      return "gauss-window";
    case EstimateKind::kGaussianCapped:
      return "gauss-capped";
  }
  return "?";
}

absl::StatusOr<ChunkStats> ChunkStats::Of(const KvShape& s, ChunkRecords records,
                                          std::span<const uint32_t> which) {
  if (auto st = s.Validate(); !st.ok()) return st;
  const uint32_t c = s.chunk_tokens, d_n = s.head_dim;
  const size_t row = size_t{s.kv_heads} * d_n, per_chunk = row;
  ChunkStats out;
  out.chunks = static_cast<uint32_t>(which.size());
  for (auto* v : {&out.key_mean, &out.key_var, &out.key_min, &out.key_max, &out.value_mean}) {
    v->assign(which.size() * per_chunk, 0.0f);
  }
  std::vector<float> k(size_t{c} * row), v(size_t{c} * row);
  for (size_t n = 0; n < which.size(); ++n) {
    if (which[n] >= records.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk index ", which[n], " of ", records.size(), " chunks"));
    }
    ToFloat(s.dtype, records[which[n]], k.size(), k.data());
    ToFloat(s.dtype, records[which[n]] + s.half_record_bytes(), v.size(), v.data());
    float* mean = out.key_mean.data() + n * per_chunk;
    float* var = out.key_var.data() + n * per_chunk;
    float* mn = out.key_min.data() + n * per_chunk;
    float* mx = out.key_max.data() + n * per_chunk;
    float* vm = out.value_mean.data() + n * per_chunk;
    std::copy_n(k.data(), row, mn);
    std::copy_n(k.data(), row, mx);
    for (uint32_t t = 0; t < c; ++t) {
      for (size_t e = 0; e < row; ++e) {
        const float x = k[t * row + e];
        mean[e] += x;
        mn[e] = std::min(mn[e], x);
        mx[e] = std::max(mx[e], x);
        vm[e] += v[t * row + e];
      }
    }
    for (size_t e = 0; e < row; ++e) {
      mean[e] /= static_cast<float>(c);
      vm[e] /= static_cast<float>(c);
    }
    for (uint32_t t = 0; t < c; ++t) {
      for (size_t e = 0; e < row; ++e) {
        const float dx = k[t * row + e] - mean[e];
        var[e] += dx * dx;
      }
    }
    for (size_t e = 0; e < row; ++e) var[e] /= static_cast<float>(c);
  }
  return out;
}

void ChunkStats::RoundTripInt8(uint32_t kv_heads, uint32_t head_dim) {
  const size_t vectors = size_t{chunks} * kv_heads;
  for (size_t n = 0; n < vectors; ++n) {
    const size_t at = n * head_dim;
    kernels::RoundTripInt8(key_mean.data() + at, head_dim, Rounding::kNearest);
    kernels::RoundTripInt8(key_var.data() + at, head_dim, Rounding::kNearest);
    kernels::RoundTripInt8(key_min.data() + at, head_dim, Rounding::kDown);
    kernels::RoundTripInt8(key_max.data() + at, head_dim, Rounding::kUp);
    kernels::RoundTripInt8(value_mean.data() + at, head_dim, Rounding::kNearest);
  }
}

ChunkStats ChunkStats::Subset(std::span<const uint32_t> which, uint32_t kv_heads,
                              uint32_t head_dim) const {
  const size_t per_chunk = size_t{kv_heads} * head_dim;
  ChunkStats out;
  out.chunks = static_cast<uint32_t>(which.size());
  const std::vector<float>* from[] = {&key_mean, &key_var, &key_min, &key_max, &value_mean};
  std::vector<float>* to[] = {&out.key_mean, &out.key_var, &out.key_min, &out.key_max,
                              &out.value_mean};
  for (size_t a = 0; a < 5; ++a) {
    to[a]->resize(which.size() * per_chunk);
    for (size_t n = 0; n < which.size(); ++n) {
      std::copy_n(from[a]->data() + which[n] * per_chunk, per_chunk, to[a]->data() + n * per_chunk);
    }
  }
  return out;
}

namespace {

absl::Status CheckQueriesAndLoaded(const KvShape& s, std::span<const float> queries,
                                   uint32_t window, const GatheredKv& loaded) {
  if (auto st = s.Validate(); !st.ok()) return st;
  const size_t ldq = size_t{s.q_heads} * s.head_dim, ldkv = size_t{s.kv_heads} * s.head_dim;
  if (queries.size() != size_t{window} * ldq || window == 0) {
    return absl::InvalidArgumentError(absl::StrCat("queries of ", queries.size(), " floats; ",
                                                   window, " x ", ldq, " need ", window * ldq));
  }
  if (loaded.k.size() != loaded.tokens * ldkv || loaded.v.size() != loaded.tokens * ldkv) {
    return absl::InvalidArgumentError(absl::StrCat("gathered kv of ", loaded.k.size(), " + ",
                                                   loaded.v.size(), " floats; ", loaded.tokens,
                                                   " tokens need ", loaded.tokens * ldkv, " each"));
  }
  return absl::OkStatus();
}

// The statistics `kind` reads are each chunks x kv_heads x head_dim floats.
absl::Status CheckStats(const KvShape& s, const ChunkStats& rest, EstimateKind kind) {
  const size_t need = size_t{rest.chunks} * s.kv_heads * s.head_dim;
  std::vector<const std::vector<float>*> parts = {&rest.key_mean, &rest.value_mean};
  if (kind != EstimateKind::kMean) parts.push_back(&rest.key_var);
  if (kind == EstimateKind::kGaussianCapped)
    parts.insert(parts.end(), {&rest.key_min, &rest.key_max});
  for (const auto* v : parts) {
    if (v->size() != need) {
      return absl::InvalidArgumentError(absl::StrCat("chunk statistics of ", v->size(), " floats; ",
                                                     rest.chunks, " chunks need ", need));
    }
  }
  return absl::OkStatus();
}

// The mean over the window's w queries of q_d^2, per channel d, for the q head whose window
// starts at q (stride ldq): what kGaussianWindow's variance term reads.
void WindowMeanSquares(const float* q, size_t ldq, uint32_t window, uint32_t d_n, float* out) {
  std::fill_n(out, d_n, 0.0f);
  for (uint32_t i = 0; i < window; ++i) {
    for (uint32_t d = 0; d < d_n; ++d) {
      out[d] += q[i * ldq + d] * q[i * ldq + d] / static_cast<float>(window);
    }
  }
}

// softmax over [the loaded tokens' logits, m extra tokens' logits] applied to [their values, the
// extra values], the extra logits being q . extra_keys / sqrt(d) and then adjusted by
// adjust(g, h, q, logits): q is q head g's window of queries (stride q_heads * head_dim), logits
// [window, m] with stride `width` (the extra tokens' columns of each query's row).
template <typename Adjust>
std::vector<float> AttendWithExtra(const KvShape& s, std::span<const float> queries,
                                   uint32_t window, const GatheredKv& loaded,
                                   const float* extra_keys, const float* extra_values, size_t m,
                                   Adjust adjust) {
  const uint32_t d_n = s.head_dim;
  const size_t ldq = size_t{s.q_heads} * d_n, ldkv = size_t{s.kv_heads} * d_n;
  const size_t tokens = loaded.tokens, width = tokens + m;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  std::vector<float> out(size_t{window} * ldq, 0.0f), p(size_t{window} * width), inv(window);
  for (uint32_t g = 0; g < s.q_heads; ++g) {
    const size_t h = g / s.group();
    const float* q = queries.data() + size_t{g} * d_n;
    if (tokens > 0) {
      ScoresQK(q, ldq, window, loaded.k.data() + h * d_n, ldkv, tokens, d_n, scale, p.data(),
               width);
    }
    if (m > 0) {
      ScoresQK(q, ldq, window, extra_keys + h * d_n, ldkv, m, d_n, scale, p.data() + tokens, width);
      adjust(g, h, q, p.data() + tokens, width);
    }
    for (uint32_t i = 0; i < window; ++i) {
      inv[i] = 1.0f / simd::SoftmaxNumerators(p.data() + size_t{i} * width, width);
    }
    float* o = out.data() + size_t{g} * d_n;
    if (tokens > 0) {
      AccumulatePV(p.data(), width, window, loaded.v.data() + h * d_n, ldkv, tokens, d_n, o, ldq);
    }
    if (m > 0) {
      AccumulatePV(p.data() + tokens, width, window, extra_values + h * d_n, ldkv, m, d_n, o, ldq);
    }
    for (uint32_t i = 0; i < window; ++i) {
      for (uint32_t d = 0; d < d_n; ++d) o[i * ldq + d] *= inv[i];
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> EstimatedAttention(const KvShape& s,
                                                      std::span<const float> queries,
                                                      uint32_t window, const GatheredKv& loaded,
                                                      const ChunkStats& rest, EstimateKind kind) {
  if (kind == EstimateKind::kNone || rest.chunks == 0) {
    return ReferenceAttention(s, queries, window, loaded);
  }
  CKV_RETURN_IF_ERROR(CheckQueriesAndLoaded(s, queries, window, loaded));
  CKV_RETURN_IF_ERROR(CheckStats(s, rest, kind));
  const uint32_t d_n = s.head_dim;
  const size_t ldq = size_t{s.q_heads} * d_n, ldkv = size_t{s.kv_heads} * d_n;
  const size_t m = rest.chunks;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  const float log_c = std::log(static_cast<float>(s.chunk_tokens));
  // The variance term, per query (kGaussian, kGaussianCapped) or once from the window's mean q^2
  // (kGaussianWindow: row 0 of spread serves every query).
  const bool per_window = kind == EstimateKind::kGaussianWindow;
  std::vector<float> q2(size_t{window} * d_n), spread(size_t{window} * m);
  auto adjust = [&](uint32_t, size_t h, const float* q, float* logits, size_t width) {
    if (per_window) {
      WindowMeanSquares(q, ldq, window, d_n, q2.data());
    } else if (kind != EstimateKind::kMean) {
      for (uint32_t i = 0; i < window; ++i) {
        for (uint32_t d = 0; d < d_n; ++d) q2[i * d_n + d] = q[i * ldq + d] * q[i * ldq + d];
      }
    }
    if (kind != EstimateKind::kMean) {
      ScoresQK(q2.data(), d_n, per_window ? 1 : window, rest.key_var.data() + h * d_n, ldkv, m, d_n,
               0.5f * scale * scale, spread.data(), m);
    }
    for (uint32_t i = 0; i < window; ++i) {
      float* row = logits + size_t{i} * width;
      const float* sp = spread.data() + (per_window ? 0 : size_t{i} * m);
      for (size_t j = 0; j < m; ++j) {
        float x = row[j] + log_c;
        if (kind != EstimateKind::kMean) x += sp[j];
        if (kind == EstimateKind::kGaussianCapped) {
          const float* mn = rest.key_min.data() + j * ldkv + h * d_n;
          const float* mx = rest.key_max.data() + j * ldkv + h * d_n;
          const float* qi = q + i * ldq;
          float u = 0;
          for (uint32_t d = 0; d < d_n; ++d) u += std::max(qi[d] * mn[d], qi[d] * mx[d]);
          x = std::min(x, u * scale + log_c);
        }
        row[j] = x;
      }
    }
  };
  return AttendWithExtra(s, queries, window, loaded, rest.key_mean.data(), rest.value_mean.data(),
                         m, adjust);
}

absl::StatusOr<VirtualTokens> VirtualTokensOf(const KvShape& s, std::span<const float> queries,
                                              uint32_t window, const ChunkStats& rest,
                                              EstimateKind kind) {
  if (kind != EstimateKind::kMean && kind != EstimateKind::kGaussianWindow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "estimate ", std::string(EstimateKindName(kind)),
        " has no virtual-token form: it is mean or gauss-window (a bias per chunk and q head)"));
  }
  CKV_RETURN_IF_ERROR(CheckQueriesAndLoaded(s, queries, window, GatheredKv{}));
  CKV_RETURN_IF_ERROR(CheckStats(s, rest, kind));
  const uint32_t d_n = s.head_dim, m = rest.chunks;
  const size_t ldq = size_t{s.q_heads} * d_n, ldkv = size_t{s.kv_heads} * d_n;
  VirtualTokens vt;
  vt.count = m;
  vt.keys = rest.key_mean;
  vt.values = rest.value_mean;
  vt.bias.assign(size_t{m} * s.q_heads, std::log(static_cast<float>(s.chunk_tokens)));
  if (kind == EstimateKind::kGaussianWindow && m > 0) {
    const float half_inv_d = 0.5f / static_cast<float>(d_n);
    std::vector<float> q2(d_n), spread(m);
    for (uint32_t g = 0; g < s.q_heads; ++g) {
      const size_t h = g / s.group();
      WindowMeanSquares(queries.data() + size_t{g} * d_n, ldq, window, d_n, q2.data());
      ScoresQK(q2.data(), d_n, 1, rest.key_var.data() + h * d_n, ldkv, m, d_n, half_inv_d,
               spread.data(), m);
      for (uint32_t j = 0; j < m; ++j) vt.bias[size_t{j} * s.q_heads + g] += spread[j];
    }
  }
  return vt;
}

absl::Status CheckVirtualTokenInput(const KvShape& s, std::span<const float> queries,
                                    uint32_t window, const GatheredKv& loaded,
                                    const VirtualTokens& vt) {
  CKV_RETURN_IF_ERROR(CheckQueriesAndLoaded(s, queries, window, loaded));
  const size_t ldkv = size_t{s.kv_heads} * s.head_dim;
  if (vt.keys.size() != vt.count * ldkv || vt.values.size() != vt.count * ldkv ||
      vt.bias.size() != size_t{vt.count} * s.q_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual tokens of ", vt.keys.size(), " + ", vt.values.size(), " + ",
                     vt.bias.size(), " floats; ", vt.count, " tokens need ", vt.count * ldkv, " + ",
                     vt.count * ldkv, " + ", size_t{vt.count} * s.q_heads));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> AttentionWithVirtualTokens(const KvShape& s,
                                                              std::span<const float> queries,
                                                              uint32_t window,
                                                              const GatheredKv& loaded,
                                                              const VirtualTokens& vt) {
  CKV_RETURN_IF_ERROR(CheckVirtualTokenInput(s, queries, window, loaded, vt));
  auto adjust = [&](uint32_t g, size_t, const float*, float* logits, size_t width) {
    for (uint32_t i = 0; i < window; ++i) {
      for (uint32_t j = 0; j < vt.count; ++j) {
        logits[size_t{i} * width + j] += vt.bias[size_t{j} * s.q_heads + g];
      }
    }
  };
  return AttendWithExtra(s, queries, window, loaded, vt.keys.data(), vt.values.data(), vt.count,
                         adjust);
}

}  // namespace ckv::kernels
