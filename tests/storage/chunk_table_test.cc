// SPDX-License-Identifier: Apache-2.0
// Tests for storage/chunk_table.h against a reference map.
#include "storage/chunk_table.h"

#include <map>
#include <random>
#include <utility>

#include "gtest/gtest.h"

namespace ckv::storage {
namespace {

struct Value {
  uint64_t n = 0;
  std::vector<int> heap;  // erased values must release what they hold
};

TEST(ChunkTableTest, AgreesWithAMapThroughInsertsErasesAndReuseAcrossBlocks) {
  ChunkTable<Value> table;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> want;
  std::mt19937_64 rng(3);
  const uint64_t keys = ChunkTable<Value>::kBlock + ChunkTable<Value>::kBlock / 2;
  auto key_of = [](uint64_t i) { return ChunkKey{i * 0x9e3779b97f4a7c15ull, i}; };
  for (uint64_t i = 0; i < keys; ++i) {
    ASSERT_TRUE(table.emplace(key_of(i), Value{i, {1, 2}}));
    want[{key_of(i).hi, key_of(i).lo}] = i;
  }
  EXPECT_FALSE(table.emplace(key_of(5), Value{99, {}})) << "a present key is not replaced";
  EXPECT_EQ(table.at(key_of(5)).n, 5u);
  // Erase a random half, then insert new keys, which reuse the erased ids.
  for (uint64_t i = 0; i < keys; ++i) {
    if (rng() % 2 == 0) continue;
    ASSERT_EQ(table.erase(key_of(i)), 1u);
    want.erase({key_of(i).hi, key_of(i).lo});
  }
  EXPECT_EQ(table.erase(key_of(keys + 7)), 0u);
  for (uint64_t i = keys; i < keys + 1000; ++i) {
    ASSERT_TRUE(table.emplace(key_of(i), Value{i, {}}));
    want[{key_of(i).hi, key_of(i).lo}] = i;
  }
  ASSERT_EQ(table.size(), want.size());
  // Iteration visits every live key once, with its value; find and contains agree.
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> seen;
  for (const auto& [key, value] : table) {
    EXPECT_TRUE(seen.emplace(std::make_pair(key.hi, key.lo), value.n).second);
  }
  EXPECT_EQ(seen, want);
  for (uint64_t i = 0; i < keys + 1000; ++i) {
    const bool present = want.contains({key_of(i).hi, key_of(i).lo});
    EXPECT_EQ(table.contains(key_of(i)), present) << i;
    auto it = table.find(key_of(i));
    ASSERT_EQ(it != table.end(), present) << i;
    if (present) {
      EXPECT_EQ(it->second.n, i);
      EXPECT_EQ(it->first, key_of(i));
    }
  }
  // Erasing through an iterator, and a value changed through a reference, stick.
  table.erase(table.find(key_of(keys)));
  EXPECT_FALSE(table.contains(key_of(keys)));
  table[key_of(keys + 1)].n = 12345;
  EXPECT_EQ(table.find(key_of(keys + 1))->second.n, 12345u);
}

TEST(ChunkTableTest, AnEmptyTableIteratesNothing) {
  ChunkTable<Value> table;
  EXPECT_TRUE(table.begin() == table.end());
  ASSERT_TRUE(table.emplace(ChunkKey{1, 1}, Value{}));
  ASSERT_EQ(table.erase(ChunkKey{1, 1}), 1u);
  EXPECT_TRUE(table.begin() == table.end());
  EXPECT_TRUE(table.empty());
}

}  // namespace
}  // namespace ckv::storage
