// SPDX-License-Identifier: Apache-2.0
// Tests of tools/synthetic_kv.h: the deterministic prefix and KV generator.
#include "tools/synthetic_kv.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"
#include "gtest/gtest.h"
#include "tests/shaped_spec.h"
#include "xxhash.h"

namespace ckv::synth {
namespace {

ModelSpec Preset(const char* name, DType dtype = DType::kFp16, uint32_t c = 16) {
  absl::StatusOr<ModelSpec> spec = ModelSpec::Preset(name, dtype, c);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

// Odd sizes everywhere, so K and V parts end in the middle of a 64-bit draw.
ModelSpec SmallSpec(DType dtype) {
  const ModelSpec spec = ::ckv::testing::ShapedSpec("test-small", 3, 6, 3, 5, 7, dtype);
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  return spec;
}

std::vector<std::byte> Record(const ModelSpec& spec, const ChunkKey& key, uint32_t layer) {
  std::vector<std::byte> out(spec.RecordBytes());
  FillRecord(spec, key, layer, out);
  return out;
}

uint64_t Hash(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

float HalfToFloat(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return (h & 0x8000) ? -v : v;
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Decodes little-endian elements of `dtype` (the generator's byte order) to floats.
std::vector<float> Decode(DType dtype, std::span<const std::byte> bytes) {
  std::vector<float> out;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size() / DTypeBytes(dtype);
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kFp32) {
      const uint32_t u = uint32_t{p[4 * i]} | uint32_t{p[4 * i + 1]} << 8 |
                         uint32_t{p[4 * i + 2]} << 16 | uint32_t{p[4 * i + 3]} << 24;
      out.push_back(std::bit_cast<float>(u));
    } else {
      const auto u = static_cast<uint16_t>(p[2 * i] | p[2 * i + 1] << 8);
      out.push_back(dtype == DType::kFp16 ? HalfToFloat(u) : Bf16ToFloat(u));
    }
  }
  return out;
}

// Every value is finite and in the documented range: |v| in [2^-6, 4).
void ExpectValuesInRange(DType dtype, std::span<const std::byte> bytes) {
  const std::vector<float> values = Decode(dtype, bytes);
  size_t bad = 0;
  for (float v : values) {
    if (!std::isfinite(v) || std::fabs(v) >= 4.0f || std::fabs(v) < 0x1p-6f) {
      if (++bad <= 5) ADD_FAILURE() << DTypeName(dtype) << " value " << v << " out of range";
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The contract of SyntheticKv: for every whole chunk i and layer l, the K rows of chunk i then
// its V rows are FillRecord(spec, key_i, l).
void ExpectTensorsMatchRecords(const ModelSpec& spec, std::span<const int32_t> tokens,
                               const SyntheticKv& kv) {
  const KvTensors& t = kv.tensors();
  ASSERT_EQ(t.tokens, tokens.size());
  ASSERT_EQ(t.k.size(), spec.layers);
  ASSERT_EQ(t.v.size(), spec.layers);
  const size_t row = spec.TokenBytesPerLayer();
  const size_t part = spec.chunk_tokens * row;
  const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  ASSERT_EQ(keys.size(), tokens.size() / spec.chunk_tokens);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    ASSERT_EQ(t.k[l].size(), tokens.size() * row);
    ASSERT_EQ(t.v[l].size(), tokens.size() * row);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::vector<std::byte> rec = Record(spec, keys[i], l);
      ASSERT_EQ(std::memcmp(t.k[l].data() + i * part, rec.data(), part), 0)
          << spec.DebugString() << " chunk " << i << " layer " << l << " K";
      ASSERT_EQ(std::memcmp(t.v[l].data() + i * part, rec.data() + part, part), 0)
          << spec.DebugString() << " chunk " << i << " layer " << l << " V";
    }
  }
  EXPECT_EQ(kv.bytes(), 2 * spec.layers * tokens.size() * row);
}

TEST(TokensTest, DeterministicPrefixStableAndInRange) {
  const std::vector<int32_t> a = Tokens(42, 5000);
  EXPECT_EQ(a, Tokens(42, 5000));
  // A pure function of (seed, position): a shorter request is a prefix of a longer one.
  const std::vector<int32_t> shorter = Tokens(42, 1234);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), a.begin()));
  EXPECT_NE(Tokens(43, 5000), a);
  int32_t lo = kVocabSize, hi = -1;
  for (int32_t t : a) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kVocabSize);
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  // Spread over the vocabulary, not bunched at one end.
  EXPECT_LT(lo, kVocabSize / 100);
  EXPECT_GT(hi, kVocabSize - kVocabSize / 100);
  EXPECT_TRUE(Tokens(1, 0).empty());
}

TEST(TokensTest, GoldenValues) {
  EXPECT_EQ(Tokens(42, 8),
            (std::vector<int32_t>{112670, 24296, 42329, 52294, 5778, 131915, 33183, 121644}));
}

TEST(TokensTest, SharedPrefix) {
  const std::vector<int32_t> t = TokensWithSharedPrefix(7, 40, 8, 100);
  ASSERT_EQ(t.size(), 100u);
  const std::vector<int32_t> shared = Tokens(7, 40);
  const std::vector<int32_t> rest = Tokens(8, 60);
  EXPECT_TRUE(std::equal(shared.begin(), shared.end(), t.begin()));
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), t.begin() + 40));
  EXPECT_EQ(TokensWithSharedPrefix(7, 0, 8, 10), Tokens(8, 10));
  EXPECT_EQ(TokensWithSharedPrefix(7, 10, 8, 10), Tokens(7, 10));
}

TEST(FillRecordTest, DeterministicAndKeyed) {
  const ModelSpec spec = Preset("qwen2.5-0.5b");
  const ChunkKey key{0x1234, 0x5678};
  const std::vector<std::byte> r = Record(spec, key, 3);
  EXPECT_EQ(r, Record(spec, key, 3));
  EXPECT_NE(r, Record(spec, key, 4));
  EXPECT_NE(r, Record(spec, ChunkKey{0x1234, 0x5679}, 3));
  EXPECT_NE(r, Record(spec, ChunkKey{0x1235, 0x5678}, 3));
  EXPECT_NE(r, Record(spec, ChunkKey{0x5678, 0x1234}, 3));
  // K and V halves are different streams.
  const size_t half = r.size() / 2;
  EXPECT_NE(std::memcmp(r.data(), r.data() + half, half), 0);
  // The zero key is an ordinary key.
  EXPECT_NE(Record(spec, ChunkKey{}, 0), Record(spec, ChunkKey{}, 1));
}

// A record is a pure function of (key, layer, spec shape and dtype): pinning it catches any change
// to the generator that would make stores written by an older kvctl fail verification.
TEST(FillRecordTest, GoldenValues) {
  const ChunkKey key{1, 2};
  const std::vector<std::byte> bf16 = Record(Preset("qwen2.5-0.5b", DType::kBf16), key, 3);
  const std::vector<std::byte> fp32 = Record(Preset("qwen2.5-0.5b", DType::kFp32), key, 3);
  EXPECT_EQ(Hash(Record(Preset("qwen2.5-0.5b"), key, 3)), 0x81fa3b48b6503401ULL);
  EXPECT_EQ(Hash(bf16), 0xdf81ddcad5c9db07ULL);
  EXPECT_EQ(Hash(fp32), 0x7a9c74ab8712bb79ULL);
  // The first values, decoded, so a failure shows what changed.
  const std::vector<std::byte> fp16 = Record(Preset("qwen2.5-0.5b"), key, 3);
  EXPECT_EQ(Decode(DType::kFp16, std::span(fp16).first(16)),
            (std::vector<float>{-0.077880859375f, -3.61328125f, 3.0703125f, -0.04229736328125f,
                                -0.10015869140625f, 0.28662109375f, 0.9169921875f,
                                -0.0240631103515625f}));
}

TEST(FillRecordTest, ValuesFiniteAndInRange) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const ModelSpec spec = Preset("qwen2.5-7b", dtype);
    std::vector<float> all;
    for (uint64_t k = 0; k < 8; ++k) {
      const std::vector<std::byte> r = Record(spec, ChunkKey{k, ~k}, static_cast<uint32_t>(k));
      ExpectValuesInRange(dtype, r);
      const std::vector<float> v = Decode(dtype, r);
      all.insert(all.end(), v.begin(), v.end());
    }
    // Roughly symmetric, and every one of the 8 binades [2^-6, 2^-5) .. [2, 4) is used.
    size_t negative = 0;
    int binade_counts[8] = {};
    for (float v : all) {
      negative += v < 0;
      const int e = std::ilogb(v);  // -6..1
      ASSERT_GE(e, -6);
      ASSERT_LE(e, 1);
      ++binade_counts[e + 6];
    }
    const double frac_negative = static_cast<double>(negative) / all.size();
    EXPECT_NEAR(frac_negative, 0.5, 0.01);
    for (int b = 0; b < 8; ++b) {
      EXPECT_NEAR(static_cast<double>(binade_counts[b]) / all.size(), 1.0 / 8, 0.01) << b;
    }
  }
}

TEST(SyntheticKvTest, MatchesFillRecordForPresetDtypes) {
  const std::vector<int32_t> tokens = Tokens(5, 16 * 6 + 5);  // six chunks and a tail
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const ModelSpec spec = Preset("qwen2.5-0.5b", dtype);
    SCOPED_TRACE(spec.DebugString());
    const SyntheticKv kv(spec, tokens);
    ExpectTensorsMatchRecords(spec, tokens, kv);
    for (uint32_t l = 0; l < spec.layers; ++l) {
      ExpectValuesInRange(dtype, kv.tensors().k[l]);
      ExpectValuesInRange(dtype, kv.tensors().v[l]);
    }
  }
}

TEST(SyntheticKvTest, MatchesFillRecordForSmallOddSpec) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const ModelSpec spec = SmallSpec(dtype);
    SCOPED_TRACE(spec.DebugString());
    for (size_t n : {0, 3, 7, 7 * 4, 7 * 4 + 6}) {
      SCOPED_TRACE(n);
      const std::vector<int32_t> tokens = Tokens(11, n);
      const SyntheticKv kv(spec, tokens);
      ExpectTensorsMatchRecords(spec, tokens, kv);
      for (uint32_t l = 0; l < spec.layers; ++l) {
        ExpectValuesInRange(dtype, kv.tensors().k[l]);
        ExpectValuesInRange(dtype, kv.tensors().v[l]);
      }
    }
  }
}

TEST(SyntheticKvTest, Deterministic) {
  const ModelSpec spec = SmallSpec(DType::kBf16);
  const std::vector<int32_t> tokens = Tokens(3, 7 * 3 + 4);
  const SyntheticKv a(spec, tokens);
  const SyntheticKv b(spec, tokens);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    EXPECT_TRUE(std::ranges::equal(a.tensors().k[l], b.tensors().k[l])) << l;
    EXPECT_TRUE(std::ranges::equal(a.tensors().v[l], b.tensors().v[l])) << l;
  }
}

TEST(SyntheticKvTest, SharedPrefixChunksHaveIdenticalRecords) {
  const ModelSpec spec = Preset("qwen2.5-0.5b");
  const size_t c = spec.chunk_tokens;
  // Share 2.5 chunks: chunks 0 and 1 are shared, chunk 2 diverges halfway.
  const std::vector<int32_t> a = TokensWithSharedPrefix(1, c * 5 / 2, 2, c * 4);
  const std::vector<int32_t> b = TokensWithSharedPrefix(1, c * 5 / 2, 3, c * 4 + 3);
  const SyntheticKv ka(spec, a);
  const SyntheticKv kb(spec, b);
  const size_t part = c * spec.TokenBytesPerLayer();
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const auto& ta = ka.tensors();
    const auto& tb = kb.tensors();
    EXPECT_EQ(std::memcmp(ta.k[l].data(), tb.k[l].data(), 2 * part), 0) << l;
    EXPECT_EQ(std::memcmp(ta.v[l].data(), tb.v[l].data(), 2 * part), 0) << l;
    for (size_t i = 2; i < 4; ++i) {
      EXPECT_NE(std::memcmp(ta.k[l].data() + i * part, tb.k[l].data() + i * part, part), 0);
      EXPECT_NE(std::memcmp(ta.v[l].data() + i * part, tb.v[l].data() + i * part, part), 0);
    }
  }
}

// Tail rows are a function of (last whole chunk key, position, token id, layer): changing one tail
// token changes its own rows only; changing an earlier chunk changes every tail row.
TEST(SyntheticKvTest, TailRule) {
  const ModelSpec spec = SmallSpec(DType::kFp16);
  const size_t c = spec.chunk_tokens;
  const size_t row = spec.TokenBytesPerLayer();
  std::vector<int32_t> tokens = Tokens(9, 2 * c + 4);
  const SyntheticKv base(spec, tokens);

  std::vector<int32_t> tail_changed = tokens;
  tail_changed[2 * c + 1] += 1;
  const SyntheticKv kt(spec, tail_changed);
  std::vector<int32_t> chunk_changed = tokens;
  chunk_changed[3] += 1;
  const SyntheticKv kc(spec, chunk_changed);

  auto row_equal = [&](const SyntheticKv& x, const SyntheticKv& y, uint32_t l, size_t p) {
    const size_t at = p * row;
    const KvTensors& a = x.tensors();
    const KvTensors& b = y.tensors();
    return std::memcmp(a.k[l].data() + at, b.k[l].data() + at, row) == 0 &&
           std::memcmp(a.v[l].data() + at, b.v[l].data() + at, row) == 0;
  };
  for (uint32_t l = 0; l < spec.layers; ++l) {
    for (size_t p = 0; p < tokens.size(); ++p) {
      EXPECT_EQ(row_equal(base, kt, l, p), p != 2 * c + 1) << "layer " << l << " pos " << p;
      EXPECT_EQ(row_equal(base, kc, l, p), false) << "layer " << l << " pos " << p;
    }
  }
  // Tail rows differ between positions, layers and K/V even for equal token ids.
  const std::vector<int32_t> same(c - 1, 77);
  const SyntheticKv ks(spec, same);  // no whole chunk: the tail hangs off the zero key
  const auto& t = ks.tensors();
  EXPECT_NE(std::memcmp(t.k[0].data(), t.k[0].data() + row, row), 0);  // position
  EXPECT_NE(std::memcmp(t.k[0].data(), t.k[1].data(), row), 0);        // layer
  EXPECT_NE(std::memcmp(t.k[0].data(), t.v[0].data(), row), 0);        // K vs V
}

TEST(SyntheticKvTest, MoveKeepsViewsValid) {
  static_assert(!std::is_copy_constructible_v<SyntheticKv>);
  static_assert(std::is_nothrow_move_constructible_v<SyntheticKv>);
  const ModelSpec spec = SmallSpec(DType::kFp32);
  const std::vector<int32_t> tokens = Tokens(1, 20);
  SyntheticKv a(spec, tokens);
  const std::byte* k0 = a.tensors().k[0].data();
  const size_t bytes = a.bytes();
  SyntheticKv b(std::move(a));
  EXPECT_EQ(b.tensors().k[0].data(), k0);
  EXPECT_EQ(b.bytes(), bytes);
  ExpectTensorsMatchRecords(spec, tokens, b);
}

}  // namespace
}  // namespace ckv::synth
