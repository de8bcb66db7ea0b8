// The clock seam (storage/clock.h): FakeClock moves only when told, and what the store dates by
// it (the catalog's creation time) reads the clock it is given, not the wall.
#include "storage/clock.h"

#include "gtest/gtest.h"
#include "storage/catalog.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::storage::FakeClock;

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
  storage::Clock* clock = storage::RealClock();
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

}  // namespace
}  // namespace ckv
