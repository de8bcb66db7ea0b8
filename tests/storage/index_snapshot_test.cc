// SPDX-License-Identifier: Apache-2.0
// Tests of the index snapshot (storage/chunk_store_snapshot.cc): a clean close leaves the index
// for the next open, which loads it instead of scanning the catalog only while the catalog is the
// one it was written against, and never trusts a damaged one.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"
#include "xxhash.h"

namespace ckv {
namespace {

using ::ckv::testing::CountBadRecords;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void WriteAll(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
template <typename T>
T At(const std::vector<char>& b, size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof v);
  return v;
}
template <typename T>
void SetAt(std::vector<char>& b, size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof v);
}

class IndexSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three prefixes sharing a first chunk, one of them used (I and F) after its Put.
    auto engine = Open();
    ASSERT_NE(engine, nullptr);
    for (int i = 0; i < 3; ++i) {
      prompts_.push_back(synth::TokensWithSharedPrefix(7, spec_.chunk_tokens, 100 + i,
                                                       (3 + i) * spec_.chunk_tokens));
      ASSERT_TRUE(PutSynthetic(*engine, spec_, prompts_.back()).ok());
    }
    const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, prompts_[1]);
    const storage::ChunkStore::Usage usage[] = {{keys[2], 0.75, 3}};
    CKV_ASSERT_OK(engine::HostOf(*engine).store().AddUsage(usage));
    before_ = Describe(*engine);
  }

  std::unique_ptr<Engine> Open() {
    auto engine = Engine::Open(EngineOptions{}, store_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  std::string SnapshotPath() const { return store_ + "/index.snapshot"; }

  // What the index says of every prefix: its chunks, where they are, their I and F.
  std::string Describe(Engine& engine) {
    std::string out;
    for (const PrefixInfo& p : engine.ListPrefixes()) {
      auto d = engine::HostOf(engine).store().DescribePrefix(p.id);
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) continue;
      absl::StrAppend(&out, p.id.ToHex(), ":");
      for (const auto& c : d->chunks) {
        absl::StrAppend(&out, " ", c.key.ToHex(), "@", c.segment, "/", c.slot, "/", c.importance,
                        "/", c.loads);
      }
      absl::StrAppend(&out, "\n");
    }
    return out;
  }

  // Opens the store, expects the index from the snapshot or not, and checks it whole.
  void ExpectWholeStore(bool from_snapshot) {
    auto engine = Open();
    ASSERT_NE(engine, nullptr);
    const EngineStats stats = engine->Stats();
    EXPECT_EQ(stats.index_from_snapshot, from_snapshot);
    EXPECT_FALSE(std::filesystem::exists(SnapshotPath())) << "open leaves no snapshot behind";
    EXPECT_EQ(stats.chunks, 1u + 2 + 3 + 4);
    EXPECT_EQ(Describe(*engine), before_);
    for (size_t i = 0; i < prompts_.size(); ++i) {
      EXPECT_EQ(*engine->Lookup(spec_, prompts_[i]), 3 + i);
      EXPECT_EQ(CountBadRecords(*engine, spec_, prompts_[i], 3 + i), 0);
    }
    auto report = engine->Verify();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }

  TempDir dir_;
  const std::string store_ = dir_.path() + "/store";
  const ModelSpec spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
  std::vector<std::vector<int32_t>> prompts_;
  std::string before_;
};

TEST_F(IndexSnapshotTest, ACleanCloseLeavesTheIndexAndTheNextOpenLoadsIt) {
  ASSERT_TRUE(std::filesystem::exists(SnapshotPath()));
  ExpectWholeStore(/*from_snapshot=*/true);
  // That open deleted it and closed cleanly again: a new one, loaded again.
  ExpectWholeStore(/*from_snapshot=*/true);
}

TEST_F(IndexSnapshotTest, ASnapshotOfAnEarlierCatalogIsNotUsed) {
  // A crash after a later open wrote leaves the catalog past the snapshot: here, an older snapshot
  // put back after a Put.
  const std::vector<char> old = ReadAll(SnapshotPath());
  {
    auto engine = Open();
    ASSERT_NE(engine, nullptr);
    prompts_.push_back(synth::Tokens(900, 4 * spec_.chunk_tokens));
    ASSERT_TRUE(PutSynthetic(*engine, spec_, prompts_.back()).ok());
  }
  WriteAll(SnapshotPath(), old);
  auto engine = Open();
  ASSERT_NE(engine, nullptr);
  EXPECT_FALSE(engine->Stats().index_from_snapshot);
  EXPECT_EQ(engine->Stats().chunks, 1u + 2 + 3 + 4 + 4);
  EXPECT_EQ(*engine->Lookup(spec_, prompts_.back()), 4u);
  EXPECT_EQ(CountBadRecords(*engine, spec_, prompts_.back(), 4), 0);
}

TEST_F(IndexSnapshotTest, ADamagedSnapshotIsNotTrusted) {
  const std::vector<char> good = ReadAll(SnapshotPath());
  const uint64_t header_bytes = At<uint64_t>(good, 56);
  // A flipped bit in the header, in a record, and a cut file: each is read past, never served.
  for (const size_t offset : {size_t{20}, size_t(header_bytes + 50)}) {
    std::vector<char> bad = good;
    bad[offset] ^= 0x10;
    WriteAll(SnapshotPath(), bad);
    SCOPED_TRACE(offset);
    ExpectWholeStore(/*from_snapshot=*/false);
  }
  WriteAll(SnapshotPath(), std::vector<char>(good.begin(), good.begin() + header_bytes));
  ExpectWholeStore(/*from_snapshot=*/false);
}

TEST_F(IndexSnapshotTest, ASnapshotWhoseChecksumsHoldButWhoseRecordsDoNotFitIsReadPast) {
  // A record naming a segment the catalog does not hold, with both checksums made to match: the
  // open that applied part of it starts again from the catalog.
  std::vector<char> bad = ReadAll(SnapshotPath());
  const uint64_t header_bytes = At<uint64_t>(bad, 56);
  const uint64_t n = At<uint64_t>(bad, 16);
  SetAt<uint32_t>(bad, header_bytes + 5 * 48 + 20, 999999);
  SetAt<uint64_t>(bad, 64, XXH3_64bits(bad.data() + header_bytes, n * 48));
  const size_t checked = 208 + 16 * At<uint32_t>(bad, 76);
  SetAt<uint64_t>(bad, checked, XXH3_64bits(bad.data(), checked));
  WriteAll(SnapshotPath(), bad);
  ExpectWholeStore(/*from_snapshot=*/false);
}

}  // namespace
}  // namespace ckv
