// SPDX-License-Identifier: Apache-2.0
// kernels/attention.cc: exact attention, gather and reference attention (see attention.h).
#include "kernels/attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/matmul.h"
#include "kernels/simd.h"

namespace ckv::kernels {
namespace {

absl::Status CheckQueries(const KvShape& s, std::span<const float> queries, uint32_t window) {
  const size_t want = size_t{window} * s.q_heads * s.head_dim;
  if (window == 0 || queries.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("queries of ", queries.size(), " floats; ",
                                                   window, " x ", s.q_heads, " heads x ",
                                                   s.head_dim, " need ", want));
  }
  return absl::OkStatus();
}

// The keys of kv head `h` of every chunk in `records`, as float [tokens, D]: converted once per
// kv head, then read by each of its q heads.
void HeadKeys(const KvShape& s, ChunkRecords records, uint32_t h, std::vector<float>& out) {
  const uint32_t c = s.chunk_tokens, d_n = s.head_dim;
  const size_t elem = ElementBytes(s.dtype);
  out.resize(records.size() * c * d_n);
  for (size_t j = 0; j < records.size(); ++j) {
    for (uint32_t t = 0; t < c; ++t) {
      const std::byte* row = records[j] + (size_t{t} * s.kv_heads + h) * d_n * elem;
      ToFloat(s.dtype, row, d_n, out.data() + (j * c + t) * d_n);
    }
  }
}

}  // namespace

absl::Status KvShape::Validate() const {
  if (q_heads == 0 || kv_heads == 0 || head_dim == 0 || chunk_tokens == 0 ||
      q_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv shape: ", q_heads, " q heads, ", kv_heads,
                                                   " kv heads, head dim ", head_dim, ", ",
                                                   chunk_tokens, " tokens per chunk"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> TokenAttention(const KvShape& s, std::span<const float> queries,
                                                  uint32_t window, ChunkRecords records,
                                                  std::span<const uint32_t> heads) {
  if (auto st = s.Validate(); !st.ok()) return st;
  if (auto st = CheckQueries(s, queries, window); !st.ok()) return st;
  std::vector<uint32_t> all;
  if (heads.empty()) {
    for (uint32_t g = 0; g < s.q_heads; ++g) all.push_back(g);
    heads = all;
  }
  for (uint32_t g : heads) {
    if (g >= s.q_heads) {
      return absl::InvalidArgumentError(absl::StrCat("q head ", g, " of ", s.q_heads));
    }
  }
  const size_t tokens = records.size() * s.chunk_tokens;
  std::vector<float> mass(tokens, 0.0f);
  if (tokens == 0) return mass;
  const uint32_t d_n = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  const float norm = 1.0f / (static_cast<float>(window) * heads.size());
  std::vector<float> k, p(size_t{window} * tokens);
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    bool loaded = false;
    for (uint32_t g : heads) {
      if (g / s.group() != h) continue;
      if (!loaded) {
        HeadKeys(s, records, h, k);
        loaded = true;
      }
      ScoresQK(queries.data() + size_t{g} * d_n, size_t{s.q_heads} * d_n, window, k.data(), d_n,
               tokens, d_n, scale, p.data(), tokens);
      for (uint32_t i = 0; i < window; ++i) {
        float* row = p.data() + size_t{i} * tokens;
        simd::Axpy(norm / simd::SoftmaxNumerators(row, tokens), row, mass.data(), tokens);
      }
    }
  }
  return mass;
}

std::vector<float> PerChunk(std::span<const float> per_token, uint32_t chunk_tokens) {
  std::vector<float> out(per_token.size() / chunk_tokens, 0.0f);
  for (size_t j = 0; j < out.size(); ++j) {
    for (uint32_t t = 0; t < chunk_tokens; ++t) out[j] += per_token[j * chunk_tokens + t];
  }
  return out;
}

absl::StatusOr<GatheredKv> Gather(const KvShape& s, ChunkRecords records,
                                  std::span<const uint32_t> chunks) {
  if (auto st = s.Validate(); !st.ok()) return st;
  const uint32_t c = s.chunk_tokens;
  const size_t row = size_t{s.kv_heads} * s.head_dim;  // elements per token
  const size_t elem = ElementBytes(s.dtype);
  GatheredKv out;
  out.tokens = static_cast<uint32_t>(chunks.size() * c);
  out.k.resize(out.tokens * row);
  out.v.resize(out.tokens * row);
  out.positions.resize(out.tokens);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint32_t j = chunks[i];
    if (j >= records.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather of chunk ", j, " of a prefix of ", records.size()));
    }
    ToFloat(s.dtype, records[j], c * row, out.k.data() + i * c * row);
    ToFloat(s.dtype, records[j] + c * row * elem, c * row, out.v.data() + i * c * row);
    for (uint32_t t = 0; t < c; ++t) out.positions[i * c + t] = j * c + t;
  }
  return out;
}

absl::StatusOr<std::vector<float>> ReferenceAttention(const KvShape& s,
                                                      std::span<const float> queries,
                                                      uint32_t window, const GatheredKv& kv) {
  if (auto st = s.Validate(); !st.ok()) return st;
  if (auto st = CheckQueries(s, queries, window); !st.ok()) return st;
  const uint32_t d_n = s.head_dim;
  const size_t tokens = kv.tokens;
  const size_t want = tokens * s.kv_heads * d_n;
  if (kv.k.size() != want || kv.v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("gathered kv of ", kv.k.size(), " + ",
                                                   kv.v.size(), " floats; ", tokens, " tokens x ",
                                                   s.kv_heads, " x ", d_n, " need ", want));
  }
  // Queries, keys, values and outputs are read in place, with the strides of their layouts.
  const size_t ldq = size_t{s.q_heads} * d_n, ldkv = size_t{s.kv_heads} * d_n;
  std::vector<float> out(size_t{window} * ldq, 0.0f);
  if (tokens == 0) return out;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  std::vector<float> p(size_t{window} * tokens), inv(window);
  for (uint32_t g = 0; g < s.q_heads; ++g) {
    const size_t h = g / s.group();
    ScoresQK(queries.data() + size_t{g} * d_n, ldq, window, kv.k.data() + h * d_n, ldkv, tokens,
             d_n, scale, p.data(), tokens);
    for (uint32_t i = 0; i < window; ++i) {
      inv[i] = 1.0f / simd::SoftmaxNumerators(p.data() + size_t{i} * tokens, tokens);
    }
    // The unnormalised weights times V, then each output row divided by its denominator.
    float* o = out.data() + size_t{g} * d_n;
    AccumulatePV(p.data(), tokens, window, kv.v.data() + h * d_n, ldkv, tokens, d_n, o, ldq);
    for (uint32_t i = 0; i < window; ++i) {
      for (uint32_t d = 0; d < d_n; ++d) o[i * ldq + d] *= inv[i];
    }
  }
  return out;
}

}  // namespace ckv::kernels
