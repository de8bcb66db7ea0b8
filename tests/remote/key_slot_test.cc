// SPDX-License-Identifier: Apache-2.0
// remote/key_slot.h: CRC16/XMODEM and the Redis Cluster key-to-slot rule with hash tags.
#include "remote/key_slot.h"

#include <gtest/gtest.h>

namespace ckv::remote {
namespace {

TEST(Crc16Test, CheckValueOfTheSpec) {
  // The Redis Cluster specification's check value for its CRC16 (XMODEM).
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
}

TEST(Crc16Test, EmptyAndSingleBytes) {
  EXPECT_EQ(Crc16(""), 0x0000);
  EXPECT_EQ(Crc16("A"), 0x58E5);  // CRC16/XMODEM of "A"
  EXPECT_EQ(Crc16(std::string_view("\0", 1)), 0x0000);
}

TEST(KeySlotTest, KnownKeys) {
  // As CLUSTER KEYSLOT answers (Redis 7.0).
  EXPECT_EQ(KeySlot("foo"), 12182u);
  EXPECT_EQ(KeySlot("bar"), 5061u);
  EXPECT_EQ(KeySlot("hello"), 866u);
  EXPECT_EQ(KeySlot("123456789"), 0x31C3u % 16384);
}

TEST(KeySlotTest, HashTagIsHashedAlone) {
  EXPECT_EQ(HashTagOf("{user1000}.following"), "user1000");
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  // Only the first '{' and the first '}' after it count.
  EXPECT_EQ(HashTagOf("foo{bar}{zap}"), "bar");
  EXPECT_EQ(HashTagOf("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(HashTagOf("foo{bar}{zap}"), "bar");
}

TEST(KeySlotTest, EmptyOrUnclosedTagHashesTheWholeKey) {
  EXPECT_EQ(HashTagOf("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(HashTagOf("foo{bar"), "foo{bar");
  EXPECT_EQ(HashTagOf("}foo{"), "}foo{");
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") % 16384);
}

TEST(KeySlotTest, SlotsAreInRange) {
  for (int i = 0; i < 10000; ++i) {
    EXPECT_LT(KeySlot("ckv:key:" + std::to_string(i)), kClusterSlots);
  }
}

}  // namespace
}  // namespace ckv::remote
