// SPDX-License-Identifier: Apache-2.0
// Tests of ChunkStore::Pin (what Re-Prefill sessions read through), AddUsage (I and F) and
// DescribePrefix (where a prefix's chunks are, with their I and F).
#include <cstring>
#include <string>

#include "io/mem_file_system.h"
#include "storage/chunk_store.h"
#include "storage/record_checksum.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;

class PinTest : public ::testing::Test {
 protected:
  // Pins, usage and descriptions are the store's logic, not the disk's: the segments live in
  // memory (the catalog in dir_).
  void SetUp() override {
    CKV_ASSERT_OK(fs_.CreateDirs(dir_.path()));
    Open();
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    tokens_ = synth::Tokens(3, 6 * spec_.chunk_tokens);
    keys_ = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens_);
    synth::SyntheticKv kv(spec_, tokens_);
    ASSERT_TRUE(store_->Put(spec_, tokens_, kv.tensors()).ok());
  }
  void Open() {
    store_.reset();
    storage::StoreOptions options;
    options.file_system = &fs_;
    auto store = storage::ChunkStore::Open(options, dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  // Reads the record at `where` and checks it against the generator.
  void ExpectRecord(const storage::PinnedChunks::Location& where, size_t chunk, uint32_t layer) {
    io::AlignedBuffer buf((where.length + 4095) / 4096 * 4096, where.file->alignment());
    ASSERT_TRUE(where.file->ReadAt(where.offset, std::span(buf.data(), buf.size())).ok());
    EXPECT_EQ(storage::RecordChecksum(buf.data(), where.length), where.checksum);
    std::vector<std::byte> want(spec_.RecordBytes());
    synth::FillRecord(spec_, keys_[chunk], layer, want);
    EXPECT_EQ(0, std::memcmp(buf.data(), want.data(), want.size())) << chunk << "/L" << layer;
  }

  TempDir dir_;
  io::MemFileSystem fs_;
  std::unique_ptr<storage::ChunkStore> store_;
  ModelSpec spec_;
  std::vector<int32_t> tokens_;
  std::vector<ChunkKey> keys_;
};

TEST_F(PinTest, PinnedLocationsStayReadableAfterTheirPrefixIsDeleted) {
  auto pinned = store_->Pin(spec_, keys_);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_EQ((*pinned)->chunks().size(), keys_.size());
  ASSERT_TRUE(store_->DeletePrefix(keys_.back()).ok());
  // A new Put would reuse freed slots: the pinned ones must not be among them.
  const auto other = synth::Tokens(4, 6 * spec_.chunk_tokens);
  synth::SyntheticKv kv(spec_, other);
  ASSERT_TRUE(store_->Put(spec_, other, kv.tensors()).ok());
  for (size_t i = 0; i < keys_.size(); ++i) {
    for (uint32_t l : {0u, spec_.layers - 1}) ExpectRecord((*pinned)->RecordAt(i, l), i, l);
  }
  // The deleted chunks' slots still count against the cap while pinned, and are freed on unpin.
  const uint64_t chunk_bytes = uint64_t{spec_.layers} * spec_.RecordBytes();  // no summaries
  EXPECT_EQ(store_->Stats().disk_bytes_used, 12 * chunk_bytes);
  pinned->reset();
  EXPECT_EQ(store_->Stats().disk_bytes_used, 6 * chunk_bytes);
}

// A pinned record hands out its ready read: aligned offset, the record's whole padded slot (so
// that reads of adjacent slots coalesce), the checksum over the record's bytes; a part of it,
// the aligned blocks around it.
TEST_F(PinTest, PinnedRecordsHandOutReadyReads) {
  auto pinned = store_->Pin(spec_, keys_);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  const uint32_t layer = spec_.layers - 1;
  const storage::PinnedChunks::Location where = (*pinned)->RecordAt(1, layer);
  const io::FileRead read = (*pinned)->ReadOf(1, layer);
  const size_t align = where.file->alignment();
  EXPECT_EQ(read.file, where.file);
  EXPECT_EQ(read.offset, where.offset);
  EXPECT_EQ(read.length % align, 0u);
  EXPECT_GE(read.length, where.length);
  EXPECT_EQ(read.length, (where.length + 4095) / 4096 * 4096);
  EXPECT_EQ(read.skip, 0u);
  EXPECT_EQ(read.checksum, where.checksum);
  EXPECT_EQ(read.checksum_bytes, where.length);
  io::AlignedBuffer buf(read.length, align);
  CKV_ASSERT_OK(read.file->ReadAt(read.offset, buf.span()));
  CKV_EXPECT_OK(storage::VerifyRecordChecksum(buf.data(), read.checksum_bytes, read.checksum,
                                              [] { return std::string("record"); }));
  // The second half (V), as the H2O baseline reads it.
  const uint32_t half = where.length / 2;
  const io::FileRead part = (*pinned)->PartOf(1, layer, half, half);
  EXPECT_EQ(part.offset % align, 0u);
  EXPECT_EQ(part.length % align, 0u);
  EXPECT_EQ(part.offset + part.skip, where.offset + half);
  EXPECT_GE(part.offset + part.length, where.offset + where.length);
  EXPECT_EQ(part.checksum_bytes, 0u);
  io::AlignedBuffer pbuf(part.length, align);
  CKV_ASSERT_OK(part.file->ReadAt(part.offset, pbuf.span()));
  EXPECT_EQ(0, std::memcmp(pbuf.data() + part.skip, buf.data() + half, half));
  // A corrupt byte fails the one verification with DataLoss naming the record.
  buf.data()[7] ^= std::byte{1};
  const absl::Status bad = storage::VerifyRecordChecksum(
      buf.data(), read.checksum_bytes, read.checksum, [] { return std::string("record x/L1"); });
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find("record x/L1: checksum 0x"), absl::string_view::npos) << bad;
}

TEST_F(PinTest, PinRefusesMissingAndForeignChunks) {
  const ChunkKey absent = ChainChunkKey(ChunkKey{}, spec_.Fingerprint(), synth::Tokens(9, 16));
  std::vector<ChunkKey> keys = {keys_[0], absent};
  EXPECT_EQ(store_->Pin(spec_, keys).status().code(), absl::StatusCode::kNotFound);
  const ModelSpec other = *ModelSpec::Preset("qwen2.5-7b");
  EXPECT_EQ(store_->Pin(other, keys_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PinTest, UsageAddsUpAndSurvivesAReopen) {
  std::vector<storage::ChunkStore::Usage> usage = {{keys_[0], 0.5, 1}, {keys_[2], 0.25, 2}};
  ASSERT_TRUE(store_->AddUsage(usage).ok());
  ASSERT_TRUE(store_->AddUsage(usage).ok());
  Open();
  auto pinned = store_->Pin(spec_, keys_);
  ASSERT_TRUE(pinned.ok());
  EXPECT_DOUBLE_EQ((*pinned)->chunks()[0].importance, 1.0);
  EXPECT_EQ((*pinned)->chunks()[0].loads, 2u);
  EXPECT_DOUBLE_EQ((*pinned)->chunks()[2].importance, 0.5);
  EXPECT_EQ((*pinned)->chunks()[2].loads, 4u);
  EXPECT_EQ((*pinned)->chunks()[1].loads, 0u);
}

TEST_F(PinTest, DescribePrefixGivesEachChunksPlaceAndScore) {
  std::vector<storage::ChunkStore::Usage> usage = {{keys_[1], 0.5, 3}};
  ASSERT_TRUE(store_->AddUsage(usage).ok());
  auto d = store_->DescribePrefix(keys_.back());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->spec.Fingerprint(), spec_.Fingerprint());
  ASSERT_EQ(d->chunks.size(), keys_.size());
  for (size_t i = 0; i < keys_.size(); ++i) {
    const ChunkPlacement& c = d->chunks[i];
    EXPECT_EQ(c.key, keys_[i]);
    auto where = store_->LocateRecord(keys_[i], 0);
    ASSERT_TRUE(where.ok());
    EXPECT_EQ(c.offset, where->offset);
    EXPECT_EQ(where->segment_path, dir_.Sub("segments/" + storage::Segment::FileName(c.segment)));
    EXPECT_EQ(c.bytes, uint64_t{spec_.layers} * spec_.RecordBytes());  // no summaries
  }
  EXPECT_DOUBLE_EQ(d->chunks[1].score(), 1.5);
  EXPECT_EQ(d->chunks[0].score(), 0);
  EXPECT_EQ(store_->DescribePrefix(keys_[2]).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PinTest, UsageOfADeletedChunkDoesNotBringItBack) {
  ASSERT_TRUE(store_->DeletePrefix(keys_.back()).ok());
  std::vector<storage::ChunkStore::Usage> usage = {{keys_[0], 1.0, 1}};
  ASSERT_TRUE(store_->AddUsage(usage).ok());
  Open();
  EXPECT_EQ(store_->Stats().chunks, 0u);
  EXPECT_EQ(store_->Pin(spec_, keys_).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckv
