// SPDX-License-Identifier: Apache-2.0
// The clock seam (common/clock.h): FakeClock moves only when told, and what the store dates by
// it (the catalog's creation time, each prefix's) reads the clock it is given, not the wall.
#include "common/clock.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "storage/catalog.h"
#include "storage/chunk_store.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::FakeClock;

TEST(ClockTest, FakeClockMovesOnlyWhenAdvancedOrSleptOn) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.MonotonicNanos(), 0);
  clock.SleepFor(absl::Seconds(2));  // returns at once, two seconds later
  clock.Advance(absl::Milliseconds(5));
  clock.Advance(-absl::Seconds(10));  // time never goes back
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000) + absl::Milliseconds(2005));
  EXPECT_EQ(clock.MonotonicNanos(), 2'005'000'000);
}

TEST(ClockTest, RealClockMoves) {
  Clock* clock = RealClock();
  const int64_t before = clock->MonotonicNanos();
  clock->SleepFor(absl::Milliseconds(1));
  EXPECT_GE(clock->MonotonicNanos() - before, 1'000'000);
  EXPECT_LT(absl::AbsDuration(clock->Now() - absl::Now()), absl::Minutes(1));
}

TEST(ClockTest, CatalogIsDatedByItsClock) {
  ::ckv::testing::TempDir dir;
  FakeClock clock(absl::FromUnixMillis(1'234'567'890'123));
  storage::Catalog::Contents contents;
  auto catalog = storage::Catalog::Open(dir.Sub("catalog"), /*create_if_missing=*/true,
                                        /*error_if_exists=*/true, &contents, nullptr, &clock);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_TRUE(contents.created);
  EXPECT_EQ(contents.created_unix_ms, 1'234'567'890'123);
}

// A store opened with a FakeClock dates its catalog and each prefix by that clock: the prefix
// put after the clock is advanced is dated that much later, and nothing reads the wall.
TEST(ClockTest, StoreDatesItsCatalogAndPrefixesByItsClock) {
  ::ckv::testing::TempDir dir;
  const int64_t start_ms = 1'600'000'000'456;
  FakeClock clock(absl::FromUnixMillis(start_ms));
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::vector<int32_t> first = synth::Tokens(11, 2 * spec.chunk_tokens);
  const std::vector<int32_t> second = synth::Tokens(12, 2 * spec.chunk_tokens);
  ChunkKey first_id, second_id;
  {
    storage::StoreOptions options;
    options.clock = &clock;
    auto store = storage::ChunkStore::Open(options, dir.Sub("store"));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->clock(), &clock);
    synth::SyntheticKv kv1(spec, first);
    auto put1 = (*store)->Put(spec, first, kv1.tensors());
    ASSERT_TRUE(put1.ok()) << put1.status();
    first_id = put1->prefix_id;
    clock.Advance(absl::Seconds(90));
    synth::SyntheticKv kv2(spec, second);
    auto put2 = (*store)->Put(spec, second, kv2.tensors());
    ASSERT_TRUE(put2.ok()) << put2.status();
    second_id = put2->prefix_id;
    std::map<ChunkKey, int64_t> created;
    for (const PrefixInfo& p : (*store)->ListPrefixes()) created[p.id] = p.created_unix_ms;
    ASSERT_EQ(created.size(), 2u);
    EXPECT_EQ(created[first_id], start_ms);
    EXPECT_EQ(created[second_id], start_ms + 90'000);
  }
  // Reopened on the real clock: the recorded dates are the fake clock's, not the wall's.
  auto store = storage::ChunkStore::Open(storage::StoreOptions{}, dir.Sub("store"));
  ASSERT_TRUE(store.ok()) << store.status();
  for (const PrefixInfo& p : (*store)->ListPrefixes()) {
    EXPECT_EQ(p.created_unix_ms, p.id == first_id ? start_ms : start_ms + 90'000);
  }
  store->reset();
  storage::Catalog::Contents contents;
  auto catalog = storage::Catalog::Open(dir.Sub("store") + "/catalog", /*create_if_missing=*/false,
                                        /*error_if_exists=*/false, &contents);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(contents.created_unix_ms, start_ms);
}

}  // namespace
}  // namespace ckv
