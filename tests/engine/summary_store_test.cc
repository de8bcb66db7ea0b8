// SPDX-License-Identifier: Apache-2.0
// Tests of the key summaries: computed at Put time (engine/summaries.h, kernels/summary.h),
// stored as auxiliary records (storage/segment.h) and read back with their checksums verified.
#include <fstream>

#include "engine/summaries.h"
#include "kernels/half.h"
#include "kernels/summary.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using engine::ChunkSummaries;
using engine::LoadSummaries;
using engine::SummaryPart;
using engine::SummaryRecords;

ModelSpec Spec(const char* preset, DType dtype = DType::kFp16) {
  auto spec = ModelSpec::Preset(preset, dtype);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::unique_ptr<storage::ChunkStore> OpenStore(const std::string& path,
                                               storage::StoreOptions options = {}) {
  auto store = storage::ChunkStore::Open(options, path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

absl::StatusOr<PutResult> PutWithSummaries(storage::ChunkStore& store, const ModelSpec& spec,
                                           const std::vector<int32_t>& tokens) {
  synth::SyntheticKv kv(spec, tokens);
  const storage::AuxRecords aux = SummaryRecords(spec, kv.tensors());
  return store.Put(spec, tokens, kv.tensors(), &aux);
}

// The summary parts of chunk `chunk` of `kv`, computed directly.
std::pair<std::vector<std::byte>, std::vector<std::byte>> Expected(const ModelSpec& spec,
                                                                   const KvTensors& kv,
                                                                   size_t chunk) {
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  std::vector<std::byte> minmax(f.MinMaxBytes()), mean(f.MeanBytes());
  const size_t bytes = size_t{spec.chunk_tokens} * spec.TokenBytesPerLayer();
  for (uint32_t l = 0; l < spec.layers; ++l) {
    kernels::SummarizeChunkLayer(spec, l, kv.k[l].subspan(chunk * bytes, bytes), minmax, mean);
  }
  return {minmax, mean};
}

class SummaryStoreTest : public ::testing::TestWithParam<RecordLayout> {};

TEST_P(SummaryStoreTest, EveryChunkGetsItsSummariesBitExactAcrossPutsAndReopen) {
  TempDir dir;
  storage::StoreOptions options;
  options.layout = GetParam();
  const ModelSpec spec = Spec("qwen2.5-0.5b");
  const uint32_t c = spec.chunk_tokens;
  // A second prefix shares the first 6 chunks: its summaries come from two Puts.
  const auto a = synth::Tokens(1, 10 * c);
  const auto b = synth::TokensWithSharedPrefix(1, 6 * c, 2, 13 * c);
  {
    auto store = OpenStore(dir.path(), options);
    ASSERT_TRUE(PutWithSummaries(*store, spec, a).ok());
    ASSERT_TRUE(PutWithSummaries(*store, spec, b).ok());
  }
  auto store = OpenStore(dir.path(), options);
  synth::SyntheticKv kv_b(spec, b);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), c, b);
  auto minmax = LoadSummaries(*store, spec, keys, SummaryPart::kMinMax);
  auto mean = LoadSummaries(*store, spec, keys, SummaryPart::kMean);
  ASSERT_TRUE(minmax.ok()) << minmax.status();
  ASSERT_TRUE(mean.ok()) << mean.status();
  ASSERT_EQ(minmax->chunks(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto [want_minmax, want_mean] = Expected(spec, kv_b.tensors(), i);
    EXPECT_EQ(0, std::memcmp(minmax->chunk(i), want_minmax.data(), want_minmax.size())) << i;
    EXPECT_EQ(0, std::memcmp(mean->chunk(i), want_mean.data(), want_mean.size())) << i;
  }
  auto report = store->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  // Keys listed out of order (and twice) come back in the order asked.
  std::vector<ChunkKey> shuffled = {keys[5], keys[0], keys[12], keys[5]};
  auto some = LoadSummaries(*store, spec, shuffled, SummaryPart::kMean);
  ASSERT_TRUE(some.ok()) << some.status();
  const size_t bytes = some->record_bytes;
  EXPECT_EQ(0, std::memcmp(some->chunk(0), mean->chunk(5), bytes));
  EXPECT_EQ(0, std::memcmp(some->chunk(1), mean->chunk(0), bytes));
  EXPECT_EQ(0, std::memcmp(some->chunk(2), mean->chunk(12), bytes));
  EXPECT_EQ(0, std::memcmp(some->chunk(3), mean->chunk(5), bytes));
}

// A session reads the summaries of the chunks it pinned. A Delete between the pin and the read
// must not fail the read (it did when the read looked the chunks up again), and the bytes must
// still be the chunks' own.
TEST_P(SummaryStoreTest, SummariesOfPinnedChunksReadAfterTheirPrefixIsDeleted) {
  TempDir dir;
  storage::StoreOptions options;
  options.layout = GetParam();
  const ModelSpec spec = Spec("qwen2.5-0.5b");
  const uint32_t c = spec.chunk_tokens;
  const auto tokens = synth::Tokens(3, 8 * c);
  auto store = OpenStore(dir.path(), options);
  ASSERT_TRUE(PutWithSummaries(*store, spec, tokens).ok());
  const auto keys = ChainChunkKeys(spec.Fingerprint(), c, tokens);
  auto pinned = store->PinLeading(spec, keys);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_EQ((*pinned)->chunks().size(), keys.size());
  ASSERT_TRUE(store->Delete(spec, tokens).ok());
  EXPECT_EQ(LoadSummaries(*store, spec, keys, SummaryPart::kMinMax).status().code(),
            absl::StatusCode::kNotFound);

  const std::vector<size_t> which = {6, 1, 2};
  auto minmax = LoadSummaries(*store, spec, **pinned, which, SummaryPart::kMinMax);
  ASSERT_TRUE(minmax.ok()) << minmax.status();
  ASSERT_EQ(minmax->chunks(), which.size());
  synth::SyntheticKv kv(spec, tokens);
  for (size_t i = 0; i < which.size(); ++i) {
    const auto want = Expected(spec, kv.tensors(), which[i]).first;
    EXPECT_EQ(0, std::memcmp(minmax->chunk(i), want.data(), want.size())) << which[i];
  }
  const std::vector<size_t> beyond = {8};
  EXPECT_EQ(LoadSummaries(*store, spec, **pinned, beyond, SummaryPart::kMean).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SummaryStoreTest,
                         ::testing::Values(RecordLayout::kLayerMajor, RecordLayout::kPeriodMajor),
                         [](const auto& info) {
                           return info.param == RecordLayout::kLayerMajor ? "layer" : "period";
                         });

TEST(SummaryFormatTest, BoxContainsEveryKeyAndMeanIsWithinHalfAStep) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const ModelSpec spec = Spec("qwen2.5-7b", dtype);
    const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
    const auto tokens = synth::Tokens(9, 3 * spec.chunk_tokens);
    synth::SyntheticKv kv(spec, tokens);
    const uint32_t c = spec.chunk_tokens, h_n = spec.kv_heads, d_n = spec.head_dim;
    std::vector<float> keys(size_t{c} * h_n * d_n), mn(d_n), mx(d_n), mean(d_n), exact_mean(d_n),
        unused(d_n);
    for (size_t chunk = 0; chunk < 3; ++chunk) {
      const auto [minmax_part, mean_part] = Expected(spec, kv.tensors(), chunk);
      for (uint32_t l : {0u, spec.layers - 1}) {
        const size_t bytes = size_t{c} * spec.TokenBytesPerLayer();
        kernels::ToFloat(dtype, kv.tensors().k[l].data() + chunk * bytes, keys.size(), keys.data());
        for (uint32_t h = 0; h < h_n; ++h) {
          const auto mm = kernels::MinMaxAt(f, minmax_part.data(), l, h);
          kernels::DecodeMinMax(mm, d_n, mn.data(), mx.data());
          const auto me = kernels::MeanAt(f, mean_part.data(), l, h);
          kernels::DecodeMean(me, d_n, mean.data());
          kernels::ExactSummary(keys.data(), c, h_n, d_n, h, unused.data(), unused.data(),
                                exact_mean.data());
          for (uint32_t t = 0; t < c; ++t) {
            for (uint32_t d = 0; d < d_n; ++d) {
              const float k = keys[(size_t{t} * h_n + h) * d_n + d];
              ASSERT_LE(mn[d], k) << "layer " << l << " head " << h << " channel " << d;
              ASSERT_GE(mx[d], k) << "layer " << l << " head " << h << " channel " << d;
            }
          }
          for (uint32_t d = 0; d < d_n; ++d) {
            ASSERT_NEAR(mean[d], exact_mean[d], me.scale / 2 * 1.0001f) << "channel " << d;
          }
          // The box is tight: the decoded bounds are within one step of the exact ones.
          for (uint32_t d = 0; d < d_n; ++d) {
            float lo = 1e30f, hi = -1e30f;
            for (uint32_t t = 0; t < c; ++t) {
              lo = std::min(lo, keys[(size_t{t} * h_n + h) * d_n + d]);
              hi = std::max(hi, keys[(size_t{t} * h_n + h) * d_n + d]);
            }
            ASSERT_LE(lo - mn[d], mm.scale_min * 1.0001f);
            ASSERT_LE(mx[d] - hi, mm.scale_max * 1.0001f);
          }
        }
      }
    }
  }
}

TEST(SummaryFormatTest, SizesAreTheDocumentedFractionOfTheKv) {
  const ModelSpec spec = Spec("qwen2.5-7b");
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  const size_t kv = size_t{spec.layers} * spec.RecordBytes();
  EXPECT_EQ(f.MinMaxBytes(), size_t{28} * 4 * (2 * 128 + 4));
  EXPECT_EQ(f.MeanBytes(), size_t{28} * 4 * (128 + 2));
  EXPECT_NEAR(double(kv) / f.MinMaxBytes(), 31.5, 0.1);
  EXPECT_NEAR(double(kv) / f.MeanBytes(), 63.0, 0.1);
}

TEST(SummaryStoreErrorsTest, ACorruptSummaryIsDataLossNamingItAndVerifyFindsIt) {
  TempDir dir;
  const ModelSpec spec = Spec("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(4, 8 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(PutWithSummaries(*store, spec, tokens).ok());
  auto where = store->LocateRecord(keys[3], spec.layers + 1);  // chunk 3's mean part
  ASSERT_TRUE(where.ok()) << where.status();
  {
    std::fstream f(where->segment_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(where->offset + 17));
    const char x = 0x5a;
    f.write(&x, 1);
  }
  auto mean = LoadSummaries(*store, spec, keys, SummaryPart::kMean);
  ASSERT_EQ(mean.status().code(), absl::StatusCode::kDataLoss) << mean.status();
  EXPECT_NE(mean.status().message().find("/aux1"), std::string::npos) << mean.status();
  // The other part of the same chunk is intact.
  EXPECT_TRUE(LoadSummaries(*store, spec, keys, SummaryPart::kMinMax).ok());
  auto report = store->Verify(nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->checksum_failures, 1u);
}

TEST(SummaryStoreErrorsTest, ChunksStoredWithoutSummariesSayNotFoundAndNewPutsGetThem) {
  TempDir dir;
  const ModelSpec spec = Spec("qwen2.5-0.5b");
  const uint32_t c = spec.chunk_tokens;
  const auto old_tokens = synth::Tokens(5, 4 * c);
  auto store = OpenStore(dir.path());
  {
    synth::SyntheticKv kv(spec, old_tokens);
    ASSERT_TRUE(store->Put(spec, old_tokens, kv.tensors()).ok());  // as a version 1 store did
  }
  const auto old_keys = ChainChunkKeys(spec.Fingerprint(), c, old_tokens);
  auto missing = LoadSummaries(*store, spec, old_keys, SummaryPart::kMinMax);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  const auto tokens = synth::Tokens(6, 4 * c);
  ASSERT_TRUE(PutWithSummaries(*store, spec, tokens).ok());
  auto loaded = LoadSummaries(*store, spec, ChainChunkKeys(spec.Fingerprint(), c, tokens),
                              SummaryPart::kMinMax);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(store->Stats().segments, 2u);  // summaries never go into a segment without them
}

TEST(SummaryStoreErrorsTest, BadRequestsAreClearErrors) {
  TempDir dir;
  const ModelSpec spec = Spec("qwen2.5-0.5b");
  const auto tokens = synth::Tokens(7, 2 * spec.chunk_tokens);
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(PutWithSummaries(*store, spec, tokens).ok());
  std::vector<std::byte> small(10);
  EXPECT_EQ(store->ReadAux(spec, keys, 0, small).code(), absl::StatusCode::kInvalidArgument);
  const ModelSpec other = Spec("qwen2.5-7b");
  auto foreign = LoadSummaries(*store, other, keys, SummaryPart::kMinMax);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition) << foreign.status();
  const ChunkKey absent = ChainChunkKey(ChunkKey{}, spec.Fingerprint(), synth::Tokens(99, 16));
  auto gone = LoadSummaries(*store, spec, std::vector<ChunkKey>{absent}, SummaryPart::kMean);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_EQ(store->ReadAux(spec, keys, 2, small).code(), absl::StatusCode::kInvalidArgument)
      << "the estimate part exists, and is larger than 10 bytes";
  EXPECT_EQ(store->ReadAux(spec, keys, 3, small).code(), absl::StatusCode::kInvalidArgument)
      << "the outlier part exists, and is larger than 10 bytes";
  EXPECT_EQ(store->ReadAux(spec, keys, 4, small).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckv
