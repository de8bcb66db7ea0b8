// SPDX-License-Identifier: Apache-2.0
// The record codecs (ckv/codec.h), and a store of a spec with one: round trips within the
// stated bounds, the layout the header documents, fingerprints, the catalog's spec encoding, the
// remote value's codec byte, and sessions that serve the stored bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ckv/codec.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "kernels/attention.h"
#include "kernels/half.h"
#include "kernels/selector.h"
#include "remote/chunk_value.h"
#include "storage/catalog_format.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"
#include "tools/synthetic_attention.h"
#include "tools/synthetic_kv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckv {
namespace {

using ::ckv::testing::ServedEquals;
using ::ckv::testing::TempDir;

ModelSpec SpecWith(KvCodec codec, DType dtype = DType::kFp16, const char* preset = "qwen2.5-0.5b") {
  ModelSpec s = *ModelSpec::Preset(preset, dtype);
  s.codec = codec;
  return s;
}

// One record's K and V as floats: channels whose scales span 1e-3..1e2, a zero channel, a zero
// token, and an outlier channel near fp16's limit, as real keys have.
std::vector<float> RecordValues(const ModelSpec& spec, uint64_t seed) {
  const size_t hd = size_t{spec.kv_heads} * spec.head_dim;
  const size_t n = size_t{spec.chunk_tokens} * hd;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> channel_scale(hd);
  for (size_t j = 0; j < hd; ++j) {
    channel_scale[j] = std::pow(10.0f, -3.0f + 5.0f * static_cast<float>(j) / hd);
  }
  std::vector<float> x(2 * n);
  for (size_t i = 0; i < 2 * n; ++i) x[i] = normal(rng) * channel_scale[i % hd];
  for (size_t t = 0; t < spec.chunk_tokens; ++t) x[t * hd + 3] = 0;  // a zero key channel
  std::fill(x.begin() + n + hd, x.begin() + n + 2 * hd, 0.0f);       // a zero value token
  x[5] = 60000.0f;                                                   // an outlier key
  x[n + 7] = -60000.0f;                                              // an outlier value
  return x;
}

float HalfAt(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// The decoded element's error against the bound the header states, from the record's own
// scale entries, plus the rounding to the dtype.
void ExpectWithinBound(const ModelSpec& spec, const std::vector<float>& want,
                       const std::vector<float>& got, const std::vector<std::byte>& record) {
  const size_t hd = size_t{spec.kv_heads} * spec.head_dim;
  const size_t n = size_t{spec.chunk_tokens} * hd;
  const float dtype_eps = spec.dtype == DType::kBf16 ? 1.0f / 256 : 1.0f / 2048;
  const size_t entry = CodecScaleBytes(spec.codec);
  for (size_t i = 0; i < 2 * n; ++i) {
    const bool value = i >= n;
    const size_t e = value ? i - n : i;
    const size_t group = value ? e / spec.head_dim : e % hd;  // (t, h) or (h, d)
    const std::byte* part = record.data() + (value ? spec.RecordKeyBytes() : 0);
    const float s = HalfAt(part + CodecPayloadBytes(spec.codec, n) + group * entry);
    float bound = 0;
    switch (spec.codec) {
      case KvCodec::kInt8:
      case KvCodec::kInt4:
        bound = s / 2;
        break;
      case KvCodec::kFp8E4M3:
        bound = std::fabs(want[i]) / 16 + s / 1024;
        break;
      case KvCodec::kNone:
        break;
    }
    bound = bound * 1.0001f + std::fabs(got[i]) * dtype_eps;
    ASSERT_LE(std::fabs(got[i] - want[i]), bound)
        << KvCodecName(spec.codec) << " " << DTypeName(spec.dtype) << (value ? " V" : " K")
        << " element " << e << ": " << want[i] << " decoded as " << got[i] << " (scale " << s
        << ")";
  }
}

TEST(CodecTest, EachCodecRoundTripsWithinItsStatedBoundAndDecodesToTheSameBitsEveryTime) {
  for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4}) {
    for (DType dtype : {DType::kFp16, DType::kBf16}) {
      const ModelSpec spec = SpecWith(codec, dtype);
      const size_t n = spec.DecodedRecordBytes() / 2 / DTypeBytes(dtype);
      const std::vector<float> x = RecordValues(spec, 11 + static_cast<int>(codec));
      std::vector<std::byte> input(spec.DecodedRecordBytes());
      kernels::FromFloat(dtype, x.data(), 2 * n, input.data());
      std::vector<float> as_given(2 * n);  // the values as the dtype holds them
      kernels::ToFloat(dtype, input.data(), 2 * n, as_given.data());
      const std::span<const std::byte> in(input);
      std::vector<std::byte> record(spec.RecordBytes());
      ASSERT_TRUE(
          EncodeRecord(spec, in.first(input.size() / 2), in.subspan(input.size() / 2), record)
              .ok());
      std::vector<std::byte> decoded(spec.DecodedRecordBytes()), again(decoded.size());
      ASSERT_TRUE(DecodeRecord(spec, record, decoded).ok());
      ASSERT_TRUE(DecodeRecord(spec, record, again).ok());
      EXPECT_EQ(decoded, again);
      std::vector<std::byte> keys(decoded.size() / 2);
      ASSERT_TRUE(
          DecodeRecordKeys(spec, std::span(record).first(spec.RecordKeyBytes()), keys).ok());
      EXPECT_TRUE(std::equal(keys.begin(), keys.end(), decoded.begin()));
      std::vector<float> got(2 * n);
      kernels::ToFloat(dtype, decoded.data(), 2 * n, got.data());
      ExpectWithinBound(spec, as_given, got, record);
      EXPECT_EQ(got[3], 0.0f) << "a zero channel decodes to zeros";
      // The error is small against the data, not only against its bound.
      double err = 0, norm = 0;
      for (size_t i = 0; i < 2 * n; ++i) {
        err += (got[i] - as_given[i]) * double(got[i] - as_given[i]);
        norm += as_given[i] * double(as_given[i]);
      }
      EXPECT_LT(std::sqrt(err / norm), codec == KvCodec::kInt4 ? 0.1 : 0.03)
          << KvCodecName(codec) << " " << DTypeName(dtype);
    }
  }
}

TEST(CodecTest, NoCodecCopiesAndWrongSizesAreRefused) {
  const ModelSpec spec = SpecWith(KvCodec::kNone);
  std::vector<std::byte> in(spec.DecodedRecordBytes());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::byte>(i * 7);
  std::vector<std::byte> record(spec.RecordBytes()), out(spec.DecodedRecordBytes());
  const std::span<const std::byte> s(in);
  ASSERT_TRUE(EncodeRecord(spec, s.first(in.size() / 2), s.subspan(in.size() / 2), record).ok());
  EXPECT_EQ(record, in);
  ASSERT_TRUE(DecodeRecord(spec, record, out).ok());
  EXPECT_EQ(out, in);
  const ModelSpec int4 = SpecWith(KvCodec::kInt4);
  absl::Status wrong = DecodeRecord(int4, record, out);  // an fp16 record under int4
  EXPECT_TRUE(absl::IsInvalidArgument(wrong)) << wrong;
  EXPECT_THAT(std::string(wrong.message()),
              ::testing::HasSubstr(absl::StrCat(record.size(), " bytes")));
}

// fp16's largest values, infinities and NaN: every decoded element is finite, within fp16's range,
// a NaN stored as 0, the largest values kept large (a scale rounded up must not carry them to
// infinity).
TEST(CodecTest, ExtremesDecodeFiniteAndNaNAsZero) {
  for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4}) {
    const ModelSpec spec = SpecWith(codec);
    const size_t n = spec.DecodedRecordBytes() / 2 / 2;
    std::vector<float> x(2 * n, 1.0f);
    x[0] = 65504.0f;
    x[1] = -65504.0f;
    x[2] = std::numeric_limits<float>::infinity();
    x[3] = std::nanf("");
    x[n] = 65504.0f;  // a value token's first element
    x[n + 1] = -std::numeric_limits<float>::infinity();
    std::vector<std::byte> input(spec.DecodedRecordBytes());
    kernels::FromFloat(DType::kFp16, x.data(), 2 * n, input.data());
    const std::span<const std::byte> in(input);
    std::vector<std::byte> record(spec.RecordBytes()), decoded(spec.DecodedRecordBytes());
    ASSERT_TRUE(
        EncodeRecord(spec, in.first(input.size() / 2), in.subspan(input.size() / 2), record).ok());
    ASSERT_TRUE(DecodeRecord(spec, record, decoded).ok());
    std::vector<float> got(2 * n);
    kernels::ToFloat(DType::kFp16, decoded.data(), 2 * n, got.data());
    for (size_t i = 0; i < 2 * n; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << KvCodecName(codec) << " element " << i;
    }
    EXPECT_GT(got[0], 60000.0f) << KvCodecName(codec);
    EXPECT_LT(got[1], -60000.0f) << KvCodecName(codec);
    EXPECT_GT(got[2], 60000.0f) << KvCodecName(codec);                   // +inf, stored as 65504
    EXPECT_LT(std::fabs(got[3]), 65504.0f / 100) << KvCodecName(codec);  // NaN, stored as 0
    EXPECT_GT(got[n], 60000.0f) << KvCodecName(codec);
    EXPECT_LT(got[n + 1], -60000.0f) << KvCodecName(codec);
  }
}

TEST(CodecTest, E4M3CodesRoundTripAndSaturate) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(E4M3ToFloat(static_cast<uint8_t>(code))));
      continue;
    }
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x08), 1.0f / 64);   // the smallest normal
  EXPECT_EQ(E4M3ToFloat(0x01), 1.0f / 512);  // the smallest subnormal
  EXPECT_EQ(FloatToE4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToE4M3(-1e6f), 0xfe);
  EXPECT_EQ(FloatToE4M3(1.0f + 1.0f / 16), 0x38);  // a tie rounds to the even mantissa (1.0)
  EXPECT_EQ(FloatToE4M3(1.0f + 3.0f / 16), 0x3a);  // and up to 1.25 from the odd one
}

TEST(CodecTest, RecordSizesFollowTheDocumentedLayout) {
  // qwen2.5-7b: c = 16, 4 kv heads, head dim 128: N = 8192 elements per part, 512 key channels,
  // 64 value (token, head) groups.
  const ModelSpec none = SpecWith(KvCodec::kNone, DType::kFp16, "qwen2.5-7b");
  EXPECT_EQ(none.RecordBytes(), 32768u);
  EXPECT_EQ(none.RecordKeyBytes(), 16384u);
  for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8}) {
    const ModelSpec s = SpecWith(codec, DType::kFp16, "qwen2.5-7b");
    EXPECT_EQ(s.RecordKeyBytes(), 8192u + 512 * 2);
    EXPECT_EQ(s.RecordBytes(), 8192u + 512 * 2 + 8192 + 64 * 2);
    EXPECT_EQ(s.DecodedRecordBytes(), 32768u);
  }
  const ModelSpec int4 = SpecWith(KvCodec::kInt4, DType::kFp16, "qwen2.5-7b");
  EXPECT_EQ(int4.RecordKeyBytes(), 4096u + 512 * 4);
  EXPECT_EQ(int4.RecordBytes(), 4096u + 512 * 4 + 4096 + 64 * 4);
}

TEST(CodecTest, TheCodecIsInTheFingerprintExceptNone) {
  const ModelSpec none = SpecWith(KvCodec::kNone, DType::kFp16, "qwen2.5-7b");
  // The golden value of ModelSpecTest: a spec without a codec keeps its keys.
  EXPECT_EQ(none.Fingerprint().ToHex(), "ca530f437de0d38f792edea6d47d0f3d");
  std::vector<ChunkKey> fps = {none.Fingerprint()};
  for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4}) {
    const ModelSpec s = SpecWith(codec, DType::kFp16, "qwen2.5-7b");
    for (const ChunkKey& other : fps) EXPECT_NE(s.Fingerprint(), other) << KvCodecName(codec);
    fps.push_back(s.Fingerprint());
    EXPECT_THAT(s.DebugString(),
                ::testing::HasSubstr(absl::StrCat("codec ", std::string(KvCodecName(codec)))));
    EXPECT_EQ(*ParseKvCodec(KvCodecName(codec)), codec);
  }
  EXPECT_EQ(*ParseKvCodec("fp8-e4m3"), KvCodec::kFp8E4M3);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseKvCodec("int3").status()));
  ModelSpec unknown = none;
  unknown.codec = static_cast<KvCodec>(9);
  absl::Status s = unknown.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("codec = 9"));
}

TEST(CodecTest, TheCatalogKeepsTheCodecAndRefusesOneItDoesNotKnow) {
  const ModelSpec none = SpecWith(KvCodec::kNone);
  const std::string v1 = storage::EncodeModelSpec(none);
  EXPECT_EQ(v1[0], 1) << "a spec without a codec is encoded as before codecs";
  for (KvCodec codec : {KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4}) {
    const ModelSpec spec = SpecWith(codec);
    const std::string enc = storage::EncodeModelSpec(spec);
    EXPECT_EQ(enc[0], 2);
    EXPECT_EQ(enc.size(), v1.size() + 1);
    auto back = storage::DecodeModelSpec(enc, "spec");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, spec);
  }
  std::string future = storage::EncodeModelSpec(SpecWith(KvCodec::kInt4));
  future.back() = 9;
  absl::Status s = storage::DecodeModelSpec(future, "spec/x").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("codec 9"));
}

TEST(CodecTest, ARemoteValueCarriesItsCodec) {
  const ModelSpec spec = SpecWith(KvCodec::kInt8);
  const ChunkKey key{1, 2};
  std::vector<std::vector<std::byte>> records(spec.layers,
                                              std::vector<std::byte>(spec.RecordBytes()));
  std::vector<std::span<const std::byte>> views(records.begin(), records.end());
  const remote::ChunkValueLayout layout = remote::LayoutOfChunkValue(spec);
  std::vector<std::byte> minmax(layout.minmax_bytes), mean(layout.mean_bytes);
  std::string value = remote::EncodeChunkValue(spec, key, views, minmax, mean);
  EXPECT_EQ(static_cast<uint8_t>(value[7]), static_cast<uint8_t>(KvCodec::kInt8));
  ASSERT_TRUE(remote::DecodeChunkValue(spec, key, value).ok());
  // The same value under a spec of another codec (its fingerprint aside) is refused by its byte.
  ModelSpec int4 = spec;
  int4.codec = KvCodec::kInt4;
  absl::Status s = remote::DecodeChunkValue(int4, key, value).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("codec 2 != 3"));
}

// A store of an int8 spec: Put encodes, reads serve the stored bytes across a reopen, a chunk
// asked for under another codec is refused, Verify checks the stored bytes.
TEST(CodecStoreTest, PutEncodesAndEveryReadServesTheStoredBytes) {
  const ModelSpec spec = SpecWith(KvCodec::kInt8);
  const std::vector<int32_t> tokens = synth::Tokens(3, 8 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  TempDir dir;
  {
    auto engine = Engine::Open({}, dir.path());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(testing::PutSynthetic(**engine, spec, tokens).ok());
    EXPECT_EQ(testing::CountBadRecords(**engine, spec, tokens, keys.size()), 0);
    // The same chunk under another codec: another spec.
    const ModelSpec int4 = SpecWith(KvCodec::kInt4);
    std::vector<std::byte> out(int4.RecordBytes());
    absl::Status other = (*engine)->ReadRecord(int4, keys[0], 0, out);
    EXPECT_FALSE(other.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(other) || absl::IsNotFound(other)) << other;
    EXPECT_EQ(*(*engine)->Lookup(int4, tokens), 0u);
  }
  auto engine = Engine::Open({}, dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(*(*engine)->Lookup(spec, tokens), keys.size());
  EXPECT_EQ(testing::CountBadRecords(**engine, spec, tokens, keys.size()), 0);
  auto report = (*engine)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty()) << report->problems.front();
}

// Sessions over an int4 store: exact scoring (period-exact) decodes the keys it scores, and
// every view serves the stored (encoded) bytes, which decode to what EncodeRecord made of the
// records Put was given.
TEST(CodecStoreTest, ASessionScoresDecodedKeysAndServesTheStoredRecords) {
  const ModelSpec spec = SpecWith(KvCodec::kInt4);
  const size_t n_tokens = 1024;  // 64 chunks
  const std::vector<int32_t> tokens = synth::Tokens(5, n_tokens);
  synth::AttentionParams p;
  p.seed = 5;
  const synth::SyntheticAttention gen(spec, n_tokens, p);
  std::vector<synth::SyntheticAttention::Layer> layers;
  std::vector<std::vector<std::byte>> stored(spec.layers), decoded(spec.layers);
  std::vector<std::vector<std::byte>> k(spec.layers), v(spec.layers);
  KvTensors kv;
  kv.tokens = n_tokens;
  const size_t chunks = n_tokens / spec.chunk_tokens;
  const size_t elems = n_tokens * spec.kv_heads * spec.head_dim;
  const size_t half = spec.DecodedRecordBytes() / 2;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    layers.push_back(gen.Generate(l));
    k[l].resize(elems * 2);
    v[l].resize(elems * 2);
    kernels::FromFloat(spec.dtype, layers[l].k.data(), elems, k[l].data());
    kernels::FromFloat(spec.dtype, layers[l].v.data(), elems, v[l].data());
    kv.k.emplace_back(k[l]);
    kv.v.emplace_back(v[l]);
    stored[l].resize(chunks * spec.RecordBytes());
    decoded[l].resize(chunks * spec.DecodedRecordBytes());
    for (size_t j = 0; j < chunks; ++j) {
      std::span<std::byte> rec(stored[l].data() + j * spec.RecordBytes(), spec.RecordBytes());
      ASSERT_TRUE(EncodeRecord(spec, std::span(k[l]).subspan(j * half, half),
                               std::span(v[l]).subspan(j * half, half), rec)
                      .ok());
      ASSERT_TRUE(DecodeRecord(spec, rec,
                               {decoded[l].data() + j * spec.DecodedRecordBytes(),
                                spec.DecodedRecordBytes()})
                      .ok());
    }
  }
  TempDir dir;
  auto engine = Engine::Open({}, dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Put(spec, tokens, kv).ok());
  ReprefillOptions o;
  o.selector = Selector::kPeriodExact;
  o.budget_fraction = 0.25;
  auto session = (*engine)->BeginReprefill(spec, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<uint32_t> expected;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, layers[l].q).ok());
    if (l % o.period_layers == 0) {
      // What period-exact picks from the keys the store holds, decoded.
      std::vector<const std::byte*> recs(chunks);
      for (size_t j = 0; j < chunks; ++j) {
        recs[j] = decoded[l].data() + j * spec.DecodedRecordBytes();
      }
      kernels::SelectorInput in;
      in.shape = kernels::KvShape::Of(spec);
      in.layers = spec.layers;
      in.layer = l;
      in.queries = layers[l].q;
      in.window = o.window;
      in.chunks = chunks;
      in.records = recs;
      kernels::SelectOptions so;
      so.budget_fraction = o.budget_fraction;
      expected = kernels::Select(kernels::SelectorKind::kPeriodExact, in, so)->chunks;
    }
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(view->records().size(), expected.size()) << "layer " << l;
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& r = view->records()[i];
      ASSERT_EQ(r.chunk, expected[i]) << "layer " << l;
      ASSERT_TRUE(
          ServedEquals(r, stored[l].data() + r.chunk * spec.RecordBytes(), spec.RecordBytes()))
          << "layer " << l << " chunk " << r.chunk;
    }
  }
  auto stats = (*session)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes_needed, stats->records_served * spec.RecordBytes());
}

}  // namespace
}  // namespace ckv
