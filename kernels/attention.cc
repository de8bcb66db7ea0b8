// kernels/attention.cc: exact attention, gather and reference attention (see attention.h).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_path.h"
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

// Kv head `h` of K (or V, with `v` set) of every chunk in `records`, as float [tokens, D].
void HeadRows(const KvShape& s, ChunkRecords records, uint32_t h, bool v, std::vector<float>& out) {
  const uint32_t c = s.chunk_tokens, d_n = s.head_dim;
  const size_t elem = ElementBytes(s.dtype);
  out.resize(records.size() * c * d_n);
  for (size_t j = 0; j < records.size(); ++j) {
    const std::byte* base = records[j] + (v ? s.half_record_bytes() : 0);
    for (uint32_t t = 0; t < c; ++t) {
      const std::byte* row = base + (size_t{t} * s.kv_heads + h) * d_n * elem;
      ToFloat(s.dtype, row, d_n, out.data() + (j * c + t) * d_n);
    }
  }
}

// scores[r][t] = q_r . k_t * scale for `rows` queries (stride D) against `tokens` keys.
void Scores(const float* q, uint32_t rows, const float* k, size_t tokens, uint32_t d_n,
            float scale, float* scores) {
  const bool avx2 = UseAvx2();
  uint32_t r = 0;
  if (avx2) {
    float out[4];
    for (; r + 4 <= rows; r += 4) {
      for (size_t t = 0; t < tokens; ++t) {
        simd::Dot4Avx2(q + size_t{r} * d_n, d_n, k + t * d_n, out);
        for (int i = 0; i < 4; ++i) scores[(r + i) * tokens + t] = out[i] * scale;
      }
    }
  }
  for (; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t) {
      const float dot = avx2 ? simd::DotAvx2(q + size_t{r} * d_n, k + t * d_n, d_n)
                             : simd::DotScalar(q + size_t{r} * d_n, k + t * d_n, d_n);
      scores[r * tokens + t] = dot * scale;
    }
  }
}

// In place: each row of `rows` x `n` becomes its softmax.
void SoftmaxRows(float* scores, uint32_t rows, size_t n) {
  const bool avx2 = UseAvx2();
  for (uint32_t r = 0; r < rows; ++r) {
    float* row = scores + r * n;
    const float max = *std::max_element(row, row + n);
    const float sum = avx2 ? simd::ExpSubAvx2(row, n, max) : simd::ExpSubScalar(row, n, max);
    const float inv = 1.0f / sum;
    for (size_t t = 0; t < n; ++t) row[t] *= inv;
  }
}

// The queries of q head g, [w, D], copied out of [w, q_heads, D].
void HeadQueries(const KvShape& s, std::span<const float> queries, uint32_t window, uint32_t g,
                 float* out) {
  for (uint32_t i = 0; i < window; ++i) {
    std::copy_n(queries.data() + (size_t{i} * s.q_heads + g) * s.head_dim, s.head_dim,
                out + size_t{i} * s.head_dim);
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
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const float norm = 1.0f / (static_cast<float>(window) * heads.size());
  std::vector<float> k, q(size_t{window} * s.head_dim), p(size_t{window} * tokens);
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    bool loaded = false;
    for (uint32_t g : heads) {
      if (g / s.group() != h) continue;
      if (!loaded) {
        HeadRows(s, records, h, /*v=*/false, k);
        loaded = true;
      }
      HeadQueries(s, queries, window, g, q.data());
      Scores(q.data(), window, k.data(), tokens, s.head_dim, scale, p.data());
      SoftmaxRows(p.data(), window, tokens);
      for (uint32_t i = 0; i < window; ++i) {
        const float* row = p.data() + size_t{i} * tokens;
        if (UseAvx2()) {
          simd::AxpyAvx2(norm, row, mass.data(), tokens);
        } else {
          simd::AxpyScalar(norm, row, mass.data(), tokens);
        }
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
  std::vector<float> out(size_t{window} * s.q_heads * d_n, 0.0f);
  if (tokens == 0) return out;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_n));
  const bool avx2 = UseAvx2();
  std::vector<float> k(tokens * d_n), v(tokens * d_n), q(size_t{window} * d_n),
      p(size_t{window} * tokens);
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    for (size_t t = 0; t < tokens; ++t) {
      std::copy_n(kv.k.data() + (t * s.kv_heads + h) * d_n, d_n, k.data() + t * d_n);
      std::copy_n(kv.v.data() + (t * s.kv_heads + h) * d_n, d_n, v.data() + t * d_n);
    }
    for (uint32_t g = h * s.group(); g < (h + 1) * s.group(); ++g) {
      HeadQueries(s, queries, window, g, q.data());
      Scores(q.data(), window, k.data(), tokens, d_n, scale, p.data());
      SoftmaxRows(p.data(), window, tokens);
      for (uint32_t i = 0; i < window; ++i) {
        float* o = out.data() + (size_t{i} * s.q_heads + g) * d_n;
        const float* row = p.data() + size_t{i} * tokens;
        for (size_t t = 0; t < tokens; ++t) {
          if (avx2) {
            simd::AxpyAvx2(row[t], v.data() + t * d_n, o, d_n);
          } else {
            simd::AxpyScalar(row[t], v.data() + t * d_n, o, d_n);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace ckv::kernels
