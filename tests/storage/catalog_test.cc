// SPDX-License-Identifier: Apache-2.0
// Tests for storage/catalog.h: the chunk scan opening a store runs on (Catalog::ScanChunks), whose
// decoding runs on a thread of its own, batches ahead of the caller.
#include "storage/catalog.h"

#include <memory>
#include <string>
#include <vector>

#include "rocksdb/db.h"
#include "tests/test_util.h"

namespace ckv::storage {
namespace {

using ::ckv::testing::TempDir;

ChunkKey KeyOf(uint64_t i) { return ChunkKey{i * 0x9e3779b97f4a7c15ull + 1, i}; }

// A catalog of `n` chunks (several scan batches), written through Catalog::Batch and closed.
void WriteChunks(const std::string& dir, uint64_t n) {
  Catalog::Contents contents;
  auto catalog = Catalog::Open(dir, /*create_if_missing=*/true, false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  for (uint64_t first = 0; first < n; first += 1000) {
    Catalog::Batch batch = (*catalog)->NewBatch();
    for (uint64_t i = first; i < std::min(n, first + 1000); ++i) {
      ChunkRecord r;
      r.slot = static_cast<uint32_t>(i);
      r.put_seq = i;
      r.tokens = {static_cast<int32_t>(i)};
      r.checksums = {i, i + 1};
      batch.PutChunk(KeyOf(i), r);
    }
    CKV_ASSERT_OK((*catalog)->Commit(batch));
  }
}

TEST(CatalogScanTest, EveryChunkComesOnceInKeyOrderWithItsFields) {
  TempDir dir;
  constexpr uint64_t kChunks = 20'000;  // about five batches of the scan
  WriteChunks(dir.path() + "/catalog", kChunks);
  Catalog::Contents contents;
  auto catalog = Catalog::Open(dir.path() + "/catalog", false, false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::vector<bool> seen(kChunks);
  std::string last;
  uint64_t count = 0;
  CKV_ASSERT_OK((*catalog)->ScanChunks([&](const ChunkKey& key, const ChunkRecord& r) {
    ++count;
    const std::string encoded = EncodeChunkKey(key);
    EXPECT_LT(last, encoded) << "key order";
    last = encoded;
    EXPECT_LT(r.put_seq, kChunks);
    if (r.put_seq >= kChunks) return absl::OkStatus();
    EXPECT_FALSE(seen[r.put_seq]) << r.put_seq;
    seen[r.put_seq] = true;
    EXPECT_EQ(key, KeyOf(r.put_seq));
    EXPECT_EQ(r.slot, r.put_seq);
    EXPECT_EQ(r.checksums, (std::vector<uint64_t>{r.put_seq, r.put_seq + 1}));
    EXPECT_TRUE(r.tokens.empty());
    return absl::OkStatus();
  }));
  EXPECT_EQ(count, kChunks);
  // What opening a store sizes its table by: the estimate, and the catalog's bytes that bound it
  // (each chunk's record holds at least two 16-byte keys).
  EXPECT_GE((*catalog)->EstimateChunks(), kChunks / 2);
  EXPECT_LE((*catalog)->EstimateChunks(), kChunks * 2);
  EXPECT_GE((*catalog)->ApproximateBytes(), kChunks * 16);
}

TEST(CatalogScanTest, TheCallersErrorStopsTheScanAndIsReturned) {
  TempDir dir;
  WriteChunks(dir.path() + "/catalog", 20'000);
  Catalog::Contents contents;
  auto catalog = Catalog::Open(dir.path() + "/catalog", false, false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  uint64_t calls = 0;
  const absl::Status s = (*catalog)->ScanChunks([&](const ChunkKey&, const ChunkRecord&) {
    return ++calls == 5000 ? absl::ResourceExhaustedError("caller stops at 5000")
                           : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(calls, 5000u) << "no chunk is handed over after the error";
  // The catalog is still usable: a second scan sees everything.
  calls = 0;
  CKV_ASSERT_OK((*catalog)->ScanChunks([&](const ChunkKey&, const ChunkRecord&) {
    ++calls;
    return absl::OkStatus();
  }));
  EXPECT_EQ(calls, 20'000u);
}

TEST(CatalogScanTest, ARecordThatDoesNotDecodeIsDataLossNamingItsChunk) {
  TempDir dir;
  const std::string path = dir.path() + "/catalog";
  WriteChunks(path, 10'000);
  // Damage one value with RocksDB itself, below ckv's encoders.
  const ChunkKey bad = KeyOf(7'777);
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    for (const char* name :
         {"default", kCfChunks, kCfPrefixes, kCfSegments, kCfStatistics, kCfMeta}) {
      cfs.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), path, cfs, &handles, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(
        db->Put(rocksdb::WriteOptions(), handles[1], EncodeChunkKey(bad), "\x01short").ok());
    for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  }
  Catalog::Contents contents;
  auto catalog = Catalog::Open(path, false, false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  const absl::Status s =
      (*catalog)->ScanChunks([](const ChunkKey&, const ChunkRecord&) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(bad.ToHex()), std::string::npos) << s;
}

}  // namespace
}  // namespace ckv::storage
