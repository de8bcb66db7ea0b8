// SPDX-License-Identifier: Apache-2.0
// Tests of the simulated prefix cache (tools/prefix_cache_sim.h).
#include "tools/prefix_cache_sim.h"

#include <vector>

#include "gtest/gtest.h"

namespace ckv::tools {
namespace {

using Chain = std::vector<uint32_t>;

TEST(PrefixLruSimTest, UnlimitedHitsEveryLeadingChunkSeenBefore) {
  PrefixLruSim sim(0);
  EXPECT_EQ(sim.Access(Chain{0, 1, 2}), 0u);
  EXPECT_EQ(sim.Access(Chain{0, 1, 3, 4}), 2u);
  EXPECT_EQ(sim.Access(Chain{0, 1, 3, 4}), 4u);
  EXPECT_EQ(sim.Access(Chain{5, 1}), 0u) << "a prefix hit starts at the first chunk";
  EXPECT_EQ(sim.chunks(), 7u);
  EXPECT_EQ(sim.evicted(), 0u);
}

TEST(PrefixLruSimTest, EvictsTheLeastRecentLeafAndThenItsParent) {
  PrefixLruSim sim(4);
  sim.Access(Chain{0, 1});                 // t1
  sim.Access(Chain{2, 3});                 // t2
  sim.Access(Chain{0, 1});                 // t3: 0 <- 1 is now the most recent
  EXPECT_EQ(sim.Access(Chain{4, 5}), 0u);  // room for 2: leaf 3 (t2), then its parent 2
  EXPECT_EQ(sim.evicted(), 2u);
  EXPECT_EQ(sim.Access(Chain{2}), 0u) << "2 was evicted";
  // 4 chunks held (0 1 4 5) before 2 came: the least recent leaf, 1 (t3), made room for it.
  EXPECT_EQ(sim.Access(Chain{0, 1}), 1u);
  EXPECT_EQ(sim.chunks(), 4u);
}

TEST(PrefixLruSimTest, NeverEvictsAnInnerChunkOrTheRequestsOwnMatch) {
  PrefixLruSim sim(3);
  sim.Access(Chain{0, 1});                    // t1
  EXPECT_EQ(sim.Access(Chain{0, 1, 2}), 2u);  // t2: full; the chain 0 <- 1 <- 2 held
  // Extending by 1 needs room, and the only chunks are the request's own match: refused.
  EXPECT_EQ(sim.Access(Chain{0, 1, 2, 3}), 3u);
  EXPECT_EQ(sim.refused(), 1u);
  EXPECT_EQ(sim.evicted(), 0u);
  // A sibling branch: room comes from the leaf 2 (not held), never from inner 0 or 1.
  EXPECT_EQ(sim.Access(Chain{0, 1, 4}), 2u);
  EXPECT_EQ(sim.evicted(), 1u);
  EXPECT_EQ(sim.Access(Chain{0, 1, 4}), 3u);
  EXPECT_EQ(sim.Access(Chain{6, 7, 8, 9}), 0u) << "longer than the cache";
  EXPECT_EQ(sim.refused(), 2u);
}

}  // namespace
}  // namespace ckv::tools
