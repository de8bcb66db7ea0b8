// SPDX-License-Identifier: Apache-2.0
// The checked-in format fixture: tests/data/format_v2/ is a small store written by the ckv of
// catalog format version 2 (two prefixes sharing two chunks, 7 chunks with their key summaries,
// one layer-major segment, the RocksDB catalog). Every later ckv must open it and serve every
// record bit-exact, with the checksums stored then matching the checksum computed now, and the
// catalog's records must decode and re-encode to the same bytes.
//
// A format change must bump kCatalogFormatVersion, add a fixture tests/data/format_vN written by
// the new code (FormatFixtureWriter.DISABLED_WriteTheFixture), and keep this test reading
// format_v2: that is the migration test. See docs/format.md.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckv/engine.h"
#include "ckv/log.h"
#include "engine/internal.h"
#include "kernels/summary.h"
#include "rocksdb/db.h"
#include "storage/catalog.h"
#include "storage/catalog_format.h"
#include "storage/chunk_store.h"
#include "storage/record_checksum.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

#ifndef CKV_TEST_DATA_DIR
#error "CKV_TEST_DATA_DIR must name tests/data"
#endif

namespace ckv {
namespace {

using ::ckv::testing::TempDir;

// What the fixture holds. Changing any of this needs a new fixture.
ModelSpec FixtureSpec() {
  ModelSpec spec;
  spec.model_id = "format-fixture";
  spec.layers = 2;
  spec.q_heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 64;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;  // 4 KiB records
}
std::vector<int32_t> PrefixA() { return synth::TokensWithSharedPrefix(11, 32, 21, 64); }
std::vector<int32_t> PrefixB() { return synth::TokensWithSharedPrefix(11, 32, 22, 80 + 5); }
constexpr uint64_t kFixtureChunks = 7;  // 4 of A, 3 more of B (5, the first 2 shared)

const std::string& FixtureDir() {
  static const std::string dir = std::string(CKV_TEST_DATA_DIR) + "/format_v2";
  return dir;
}

// Writes the fixture where CKV_FORMAT_FIXTURE_OUT says (run by hand, never in CI):
//   CKV_FORMAT_FIXTURE_OUT=tests/data/format_v2 build/tests/ckv_tests
//     --gtest_also_run_disabled_tests --gtest_filter='FormatFixtureWriter.DISABLED_WriteTheFixture'
TEST(FormatFixtureWriter, DISABLED_WriteTheFixture) {
  const char* out = std::getenv("CKV_FORMAT_FIXTURE_OUT");
  if (out == nullptr) GTEST_SKIP() << "set CKV_FORMAT_FIXTURE_OUT";
  ASSERT_FALSE(std::filesystem::exists(out)) << out << " exists";
  const ModelSpec spec = FixtureSpec();
  {
    EngineOptions options;
    options.segment_bytes = 8 * ::ckv::testing::ChunkDiskBytes(spec);  // a small sparse file
    options.error_if_exists = true;
    auto engine = Engine::Open(options, out);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(::ckv::testing::PutSynthetic(**engine, spec, PrefixA()).ok());
    ASSERT_TRUE(::ckv::testing::PutSynthetic(**engine, spec, PrefixB()).ok());
  }
  // The info log is not part of the format.
  for (const auto& e : std::filesystem::directory_iterator(std::string(out) + "/catalog")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("LOG", 0) == 0 || name == "LOCK") std::filesystem::remove(e.path());
  }
}

class FormatFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(FixtureDir() + "/catalog/CURRENT")) << FixtureDir();
    // Opening writes (a new WAL, MANIFEST, OPTIONS): work on a copy.
    std::filesystem::copy(FixtureDir(), store_, std::filesystem::copy_options::recursive);
  }
  // The copy, opened as it is (never created).
  absl::StatusOr<std::unique_ptr<Engine>> OpenFixture() {
    EngineOptions options;
    options.create_if_missing = false;
    options.logger = NullLogger();
    return Engine::Open(options, store_);
  }
  TempDir dir_;
  const std::string store_ = dir_.Sub("store");
};

TEST_F(FormatFixtureTest, TheCatalogFormatVersionIsPinned) {
  // A change here means a format change: add tests/data/format_v3 and keep reading format_v2.
  EXPECT_EQ(storage::kCatalogFormatVersion, 2u);
}

TEST_F(FormatFixtureTest, EveryRecordIsServedBitExactAndItsStoredChecksumIsTodays) {
  const ModelSpec spec = FixtureSpec();
  auto engine = OpenFixture();
  ASSERT_TRUE(engine.ok()) << engine.status();
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.chunks, kFixtureChunks);
  EXPECT_EQ(stats.prefixes, 2u);
  EXPECT_EQ(stats.segments, 1u);
  // (git and the copy above write the segment's holes as zeros, so Open punches the free slots
  // again: orphan_bytes_reclaimed is not 0 here, and says nothing about the format.)

  storage::ChunkStore& store = engine::HostOf(**engine).store();
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes()), raw(spec.RecordBytes());
  uint64_t records = 0;
  for (const auto& tokens : {PrefixA(), PrefixB()}) {
    const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    EXPECT_EQ(*(*engine)->Lookup(spec, tokens), keys.size());
    auto described = (*engine)->DescribePrefix(keys.back());
    ASSERT_TRUE(described.ok()) << described.status();
    ASSERT_EQ(described->chunks.size(), keys.size());
    for (const ChunkKey& key : keys) {
      for (uint32_t l = 0; l < spec.layers; ++l) {
        synth::FillRecord(spec, key, l, want);
        ASSERT_TRUE((*engine)->ReadRecord(spec, key, l, got).ok()) << key.ToHex() << "/L" << l;
        EXPECT_EQ(got, want) << key.ToHex() << "/L" << l;
        // The segment layout: the record lies where the store says, unpadded, bit-exact.
        auto where = store.LocateRecord(key, l);
        ASSERT_TRUE(where.ok()) << where.status();
        EXPECT_EQ(where->length, spec.RecordBytes());
        const int fd = ::open(where->segment_path.c_str(), O_RDONLY | O_CLOEXEC);
        ASSERT_GE(fd, 0) << where->segment_path;
        const ssize_t n = ::pread(fd, raw.data(), raw.size(), static_cast<off_t>(where->offset));
        ::close(fd);
        ASSERT_EQ(n, static_cast<ssize_t>(raw.size()));
        EXPECT_EQ(raw, want) << "segment bytes of " << key.ToHex() << "/L" << l;
        ++records;
      }
    }
  }
  EXPECT_EQ(records, (4 + 5) * spec.layers);
  // Verify reads every record, summaries included, against its stored checksum.
  auto report = (*engine)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
  EXPECT_EQ(report->checksum_failures, 0u);
  engine->reset();

  // The checksums written then are today's checksum of the same bytes.
  storage::Catalog::Contents contents;
  auto catalog = storage::Catalog::Open(store_ + "/catalog", false, false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(contents.format_version, 2u);
  size_t chunks = 0;
  CKV_ASSERT_OK((*catalog)->ScanChunks([&](const ChunkKey& key, const storage::ChunkRecord& rec) {
    ++chunks;
    EXPECT_TRUE(rec.tokens.empty()) << "the scan skips token ids";
    EXPECT_GE(rec.checksums.size(), spec.layers);
    for (uint32_t l = 0; l < spec.layers && l < rec.checksums.size(); ++l) {
      synth::FillRecord(spec, key, l, want);
      EXPECT_EQ(rec.checksums[l], storage::RecordChecksum(want.data(), want.size()))
          << key.ToHex() << "/L" << l;
    }
    return absl::OkStatus();
  }));
  EXPECT_EQ(chunks, kFixtureChunks);
}

TEST_F(FormatFixtureTest, EveryCatalogRecordDecodesAndReencodesToTheSameBytes) {
  // Read the catalog's raw bytes with RocksDB itself, below ckv's decoders.
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  for (const char* name : {"default", storage::kCfChunks, storage::kCfPrefixes,
                           storage::kCfSegments, storage::kCfStatistics, storage::kCfMeta}) {
    cfs.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw_db = nullptr;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), store_ + "/catalog", cfs, &handles,
                                           &raw_db)
                  .ok());
  std::unique_ptr<rocksdb::DB> db(raw_db);
  size_t values = 0;
  auto scan = [&](size_t cf, auto check) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[cf]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      check(absl::string_view(it->key().data(), it->key().size()),
            absl::string_view(it->value().data(), it->value().size()));
      ++values;
    }
    ASSERT_TRUE(it->status().ok());
  };
  scan(1, [](absl::string_view k, absl::string_view v) {
    auto key = storage::DecodeChunkKey(k);
    ASSERT_TRUE(key.ok());
    EXPECT_EQ(storage::EncodeChunkKey(*key), k);
    auto rec = storage::DecodeChunkRecord(v, "chunk");
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(storage::EncodeChunkRecord(*rec), v) << "chunk record of " << key->ToHex();
  });
  scan(2, [](absl::string_view, absl::string_view v) {
    auto rec = storage::DecodePrefixRecord(v, "prefix");
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(storage::EncodePrefixRecord(*rec), v);
  });
  scan(3, [](absl::string_view k, absl::string_view v) {
    auto id = storage::DecodeSegmentKey(k);
    ASSERT_TRUE(id.ok());
    EXPECT_EQ(storage::EncodeSegmentKey(*id), k);
    auto rec = storage::DecodeSegmentRecord(v, "segment");
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(storage::EncodeSegmentRecord(*rec), v);
  });
  scan(4, [](absl::string_view, absl::string_view v) {
    auto rec = storage::DecodeCounters(v, "counters");
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(storage::EncodeCounters(*rec), v);
  });
  scan(5, [](absl::string_view k, absl::string_view v) {
    if (k.rfind("spec/", 0) != 0) return;
    auto spec = storage::DecodeModelSpec(v, k);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(storage::EncodeModelSpec(*spec), v);
    EXPECT_EQ(spec->Fingerprint(), FixtureSpec().Fingerprint());
  });
  EXPECT_EQ(values, kFixtureChunks + 2 + 1 + 1 + 5);  // chunks, prefixes, segment, counters, meta
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
}

// The fixture's chunks predate the estimate part (their segment has two auxiliary records): a
// session that asks for estimates serves them as before, dropping what it does not load and
// counting them; chunks stored now, in a new segment with the part, are estimated beside them.
TEST_F(FormatFixtureTest, ChunksStoredBeforeTheEstimatePartAreDroppedAndNewOnesEstimated) {
  const ModelSpec spec = FixtureSpec();
  auto engine = OpenFixture();
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Five chunks: the two A and B share (stored then), three stored now.
  const std::vector<int32_t> c = synth::TokensWithSharedPrefix(11, 32, 23, 80);
  auto put = ::ckv::testing::PutSynthetic(**engine, spec, c);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ((*engine)->Stats().segments, 2u) << "the new chunks need a segment with the part";
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.budget_fraction = 0.2;  // the sink and the recent chunk: 0 and 4
  o.window = 2;
  o.estimate_rest = true;
  const std::vector<float> queries(size_t{o.window} * spec.q_heads * spec.head_dim, 0.5f);
  for (const auto& [prompt, want_virtual, want_unestimated] :
       {std::tuple{c, std::vector<uint32_t>{2, 3}, 2u},
        std::tuple{PrefixA(), std::vector<uint32_t>{}, 4u}}) {
    auto session = (*engine)->BeginReprefill(spec, prompt, o);
    ASSERT_TRUE(session.ok()) << session.status();
    for (uint32_t l = 0; l < spec.layers; ++l) {
      ASSERT_TRUE((*session)->SubmitQueries(l, queries).ok());
      auto view = (*session)->AwaitLayer(l);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->records().size(), 2u);
      EXPECT_EQ(view->virtual_tokens().chunks, want_virtual) << "layer " << l;
      EXPECT_EQ(view->virtual_tokens().count, want_virtual.size());
    }
    auto stats = (*session)->Finish();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->unestimated_chunks, want_unestimated);
  }
}

// The fixture's chunks predate the outlier part: `outlier-key` scores them by their mean, as
// `mean-key` does (the same selections, the same bytes read), and reads the outlier parts of the
// chunks stored since, which have one.
TEST_F(FormatFixtureTest, ChunksStoredBeforeTheOutlierPartAreScoredByTheirMean) {
  const ModelSpec spec = FixtureSpec();
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  auto engine = OpenFixture();
  ASSERT_TRUE(engine.ok()) << engine.status();
  ReprefillOptions o;
  o.budget_fraction = 0.6;
  o.window = 2;
  std::vector<float> queries(size_t{o.window} * spec.q_heads * spec.head_dim);
  for (size_t i = 0; i < queries.size(); ++i) queries[i] = float(i % 7) - 3.0f;
  // Per layer, the chunks served, and the summary bytes read.
  auto run = [&](Selector selector, const std::vector<int32_t>& prompt) {
    o.selector = selector;
    std::vector<std::vector<uint32_t>> served;
    auto session = (*engine)->BeginReprefill(spec, prompt, o);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return std::pair{served, uint64_t{0}};
    for (uint32_t l = 0; l < spec.layers; ++l) {
      EXPECT_TRUE((*session)->SubmitQueries(l, queries).ok());
      auto view = (*session)->AwaitLayer(l);
      EXPECT_TRUE(view.ok()) << view.status();
      served.emplace_back();
      if (view.ok()) {
        for (const auto& r : view->records()) served.back().push_back(r.chunk);
      }
    }
    auto stats = (*session)->Finish();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return std::pair{served, stats.ok() ? stats->summary_bytes_read : 0};
  };
  const auto [outlier, outlier_bytes] = run(Selector::kOutlierKey, PrefixB());
  const auto [mean, mean_bytes] = run(Selector::kMeanKey, PrefixB());
  EXPECT_EQ(outlier, mean);
  EXPECT_EQ(outlier_bytes, 5 * f.MeanBytes()) << "no outlier part to read";
  EXPECT_EQ(mean_bytes, outlier_bytes);
  // Chunks stored now have the part: their outlier parts are read beside the old chunks' means.
  const std::vector<int32_t> c = synth::TokensWithSharedPrefix(11, 32, 23, 80);
  ASSERT_TRUE(::ckv::testing::PutSynthetic(**engine, spec, c).ok());
  const auto [mixed, mixed_bytes] = run(Selector::kOutlierKey, c);
  EXPECT_EQ(mixed.size(), spec.layers);
  EXPECT_EQ(mixed_bytes, 5 * f.MeanBytes() + 3 * f.OutlierBytes())
      << "every chunk's mean part, and the 3 new chunks' outlier parts";
}

}  // namespace
}  // namespace ckv
