// SPDX-License-Identifier: Apache-2.0
// tests/prefetch/prefetch_planner_test.cc: prefetch::PlanAfterSelection, the cross-layer prefetch
// plan.
#include "prefetch/planner.h"

#include <vector>

#include "gtest/gtest.h"

namespace ckv::prefetch {
namespace {

std::vector<uint32_t> Layers(const std::vector<PlannedRead>& plan, Priority priority,
                             bool keys_only = false) {
  std::vector<uint32_t> out;
  for (const PlannedRead& r : plan) {
    if (r.priority == priority && r.keys_only == keys_only) out.push_back(r.layer);
  }
  return out;
}

TEST(PrefetchPlannerTest, PerLayerScoringPrefetchesTheNextLayerOnly) {
  const PlanOptions o{.layers = 28, .period_layers = 8, .per_layer = true};
  const auto plan = PlanAfterSelection(5, o);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].layer, 6u);
  EXPECT_EQ(plan[0].priority, Priority::kSpeculative);
  EXPECT_FALSE(plan[0].keys_only);
  EXPECT_TRUE(PlanAfterSelection(27, o).empty()) << "the last layer has no next";
}

TEST(PrefetchPlannerTest, PeriodHeadRequestsItsPeriodThenTheNextPeriodAfterItsHead) {
  const PlanOptions o{.layers = 28, .period_layers = 8, .per_layer = false};
  const auto plan = PlanAfterSelection(8, o);
  EXPECT_EQ(Layers(plan, Priority::kIntraPeriod),
            (std::vector<uint32_t>{9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Layers(plan, Priority::kSpeculative),
            (std::vector<uint32_t>{17, 18, 19, 20, 21, 22, 23}));
  EXPECT_TRUE(Layers(plan, Priority::kSpeculative, /*keys_only=*/true).empty());
  EXPECT_TRUE(Layers(plan, Priority::kDemand).empty()) << "the head's own read is the caller's";
  // Intra-period reads come first: they are needed sooner.
  EXPECT_EQ(plan.front().priority, Priority::kIntraPeriod);
}

TEST(PrefetchPlannerTest, ExactScoringReadsTheNextHeadsKeysAhead) {
  const PlanOptions o{
      .layers = 28, .period_layers = 8, .per_layer = false, .read_keys_ahead = true};
  EXPECT_EQ(Layers(PlanAfterSelection(16, o), Priority::kSpeculative, true),
            (std::vector<uint32_t>{24}));
  EXPECT_TRUE(Layers(PlanAfterSelection(24, o), Priority::kSpeculative, true).empty())
      << "no head after the last period";
}

TEST(PrefetchPlannerTest, TheLastPeriodIsCutAtTheModelsLayers) {
  const PlanOptions o{.layers = 28, .period_layers = 8, .per_layer = false};
  const auto plan = PlanAfterSelection(24, o);
  EXPECT_EQ(Layers(plan, Priority::kIntraPeriod), (std::vector<uint32_t>{25, 26, 27}));
  EXPECT_TRUE(Layers(plan, Priority::kSpeculative).empty());
}

TEST(PrefetchPlannerTest, PeriodOfOneLayerPrefetchesNothingWithinIt) {
  const PlanOptions o{.layers = 4, .period_layers = 0, .per_layer = false};  // 0 counts as 1
  const auto plan = PlanAfterSelection(1, o);
  EXPECT_TRUE(Layers(plan, Priority::kIntraPeriod).empty());
  EXPECT_TRUE(Layers(plan, Priority::kSpeculative).empty())
      << "layer + p + 1 .. layer + 2p is empty";
}

}  // namespace
}  // namespace ckv::prefetch
