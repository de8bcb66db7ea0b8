// SPDX-License-Identifier: Apache-2.0
// Tests of the disk eviction order (storage/eviction_policy.h).
#include "storage/eviction_policy.h"

#include "gtest/gtest.h"

namespace ckv::storage {
namespace {

ChunkKey Key(uint64_t lo) { return ChunkKey{0, lo}; }

// Regression: ranked by score first, a chunk a Put just wrote (S = 0) was evicted
// before a chunk a session loaded long ago, and score eviction lost to LRU on traces.
TEST(EvictionPolicyTest, AnOldHighScoreLeafGoesBeforeARecentUnscoredOne) {
  const EvictionCandidate old_popular{EvictionPolicy::Score(3.0, 40), 5, Key(1)};
  const EvictionCandidate fresh{EvictionPolicy::Score(0, 0), 9, Key(2)};
  EXPECT_TRUE(EvictionPolicy::EvictBefore(old_popular, fresh));
  EXPECT_FALSE(EvictionPolicy::EvictBefore(fresh, old_popular));
}

TEST(EvictionPolicyTest, ScoreThenKeyBreakTiesOfRecency) {
  const EvictionCandidate low{EvictionPolicy::Score(1.0, 1), 7, Key(9)};
  const EvictionCandidate high{EvictionPolicy::Score(1.0, 2), 7, Key(1)};
  EXPECT_TRUE(EvictionPolicy::EvictBefore(low, high));
  EXPECT_FALSE(EvictionPolicy::EvictBefore(high, low));
  const EvictionCandidate same{EvictionPolicy::Score(1.0, 1), 7, Key(3)};
  EXPECT_TRUE(EvictionPolicy::EvictBefore(same, low));
  EXPECT_FALSE(EvictionPolicy::EvictBefore(low, low));
}

}  // namespace
}  // namespace ckv::storage
