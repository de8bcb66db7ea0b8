// SPDX-License-Identifier: Apache-2.0
// Tests for storage/segment.h: the slot allocator, loaded in bulk as opening a store does.
#include "storage/segment.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "io/mem_file_system.h"

namespace ckv::storage {
namespace {

Segment MakeSegment(io::MemFileSystem& fs, uint32_t capacity) {
  SegmentRecord g;
  g.layers = 1;
  g.band_layers = 1;
  g.record_bytes = 4096;
  g.record_slot_bytes = 4096;
  g.capacity_slots = capacity;
  auto file = fs.Open("/seg", io::FileSystem::OpenMode::kCreateReadWrite);
  EXPECT_TRUE(file.ok()) << file.status();
  return Segment(1, g, *std::move(file));
}

// The free runs of `used` (sorted), the slow and obvious way.
std::vector<std::pair<uint32_t, uint32_t>> ExpectedRuns(const std::vector<bool>& used) {
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  for (uint32_t s = 0; s < used.size(); ++s) {
    if (used[s]) continue;
    if (!runs.empty() && runs.back().first + runs.back().second == s) {
      ++runs.back().second;
    } else {
      runs.emplace_back(s, 1);
    }
  }
  return runs;
}

std::vector<std::pair<uint32_t, uint32_t>> Runs(const Segment& seg) {
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  for (const SlotRun& r : seg.FreeRuns()) runs.emplace_back(r.start, r.count);
  return runs;
}

TEST(SegmentLoadTest, SlotsMarkedInAnyOrderGiveTheExactFreeRuns) {
  // Capacities around word edges, densities from empty to full, slots marked in random order
  // (catalog order is key-hash order).
  std::mt19937 rng(7);
  for (uint32_t capacity : {1u, 63u, 64u, 65u, 200u, 1000u}) {
    for (double density : {0.0, 0.1, 0.5, 0.97, 1.0}) {
      io::MemFileSystem fs;
      Segment seg = MakeSegment(fs, capacity);
      std::vector<bool> used(capacity);
      std::vector<uint32_t> order;
      std::bernoulli_distribution pick(density);
      for (uint32_t s = 0; s < capacity; ++s) {
        used[s] = pick(rng);
        if (used[s]) order.push_back(s);
      }
      std::shuffle(order.begin(), order.end(), rng);
      seg.BeginLoad();
      for (uint32_t s : order) ASSERT_TRUE(seg.MarkUsed(s)) << s;
      seg.EndLoad();
      EXPECT_EQ(Runs(seg), ExpectedRuns(used)) << capacity << " slots at " << density;
      EXPECT_EQ(seg.used_slots(), order.size());
      // The allocator works on what the load built: the free slots are exactly those.
      const uint32_t free = seg.free_slots();
      uint32_t taken = 0;
      for (SlotRun r = seg.Allocate(capacity); r.count > 0; r = seg.Allocate(capacity)) {
        for (uint32_t s = r.start; s < r.start + r.count; ++s) EXPECT_FALSE(used[s]) << s;
        taken += r.count;
      }
      EXPECT_EQ(taken, free);
      EXPECT_EQ(seg.free_slots(), 0u);
    }
  }
}

TEST(SegmentLoadTest, ASegmentTooLargeForABitmapSplitsItsRunsInstead) {
  // A geometry over kMaxLoadBitmapSlots (up to 2^30 slots, tiny chunks in huge segments) is
  // loaded without a bitmap of its size, with the same result.
  io::MemFileSystem fs;
  const uint32_t capacity = Segment::kMaxLoadBitmapSlots + 100;
  Segment seg = MakeSegment(fs, capacity);
  seg.BeginLoad();
  for (uint32_t s : {capacity - 1, 5u, 6u, 0u, capacity - 50}) ASSERT_TRUE(seg.MarkUsed(s)) << s;
  EXPECT_FALSE(seg.MarkUsed(6));
  seg.EndLoad();
  EXPECT_EQ(seg.used_slots(), 5u);
  EXPECT_EQ(Runs(seg), (std::vector<std::pair<uint32_t, uint32_t>>{
                           {1, 4}, {7, capacity - 57}, {capacity - 49, 48}}));
}

TEST(SegmentLoadTest, ASegmentWithNoChunkIsWhollyFree) {
  io::MemFileSystem fs;
  Segment seg = MakeSegment(fs, 1000);
  seg.BeginLoad();
  seg.EndLoad();
  EXPECT_EQ(Runs(seg), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 1000}}));
}

TEST(SegmentLoadTest, ASlotMarkedTwiceIsRefusedTheSecondTime) {
  io::MemFileSystem fs;
  Segment seg = MakeSegment(fs, 100);
  seg.BeginLoad();
  EXPECT_TRUE(seg.MarkUsed(70));
  EXPECT_FALSE(seg.MarkUsed(70));
  EXPECT_TRUE(seg.MarkUsed(3));
  seg.EndLoad();
  EXPECT_EQ(seg.used_slots(), 2u);
  EXPECT_EQ(Runs(seg), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 3}, {4, 66}, {71, 29}}));
}

}  // namespace
}  // namespace ckv::storage
