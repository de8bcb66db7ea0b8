// SPDX-License-Identifier: Apache-2.0
// remote/slot_map.h: CLUSTER SLOTS replies and redirections as a hostile node would send them.
#include "remote/slot_map.h"

#include <string>

#include "gtest/gtest.h"

namespace ckv::remote {
namespace {

Reply Int(long long v) {
  Reply r;
  r.type = Reply::Type::kInteger;
  r.integer = v;
  return r;
}
Reply Str(std::string s) {
  Reply r;
  r.type = Reply::Type::kString;
  r.str = std::move(s);
  return r;
}
Reply Node(std::string host, long long port) {
  Reply r;
  r.type = Reply::Type::kArray;
  r.elements = {Str(std::move(host)), Int(port)};
  return r;
}
Reply Range(long long first, long long last, Reply master) {
  Reply r;
  r.type = Reply::Type::kArray;
  r.elements = {Int(first), Int(last), std::move(master)};
  return r;
}
Reply Map(std::vector<Reply> ranges) {
  Reply r;
  r.type = Reply::Type::kArray;
  r.elements = std::move(ranges);
  return r;
}

const Endpoint kNode{"127.0.0.1", 7000};

TEST(SlotMapTest, AWellFormedMapRoutesEverySlot) {
  auto map = ParseSlotMap(
      Map({Range(0, 8191, Node("10.0.0.1", 7000)), Range(8192, 16383, Node("", 7001))}), kNode);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->masters.size(), 2u);
  EXPECT_EQ(map->masters[map->slot_master[0]].ToString(), "10.0.0.1:7000");
  EXPECT_EQ(map->masters[map->slot_master[16383]].ToString(), "127.0.0.1:7001");  // "" = us
}

TEST(SlotMapTest, PortsHostsAndOverlapsFromTheWireAreChecked) {
  // Port 99999 was used as 34463.
  EXPECT_FALSE(ParseSlotMap(Map({Range(0, 16383, Node("10.0.0.1", 99999))}), kNode).ok());
  EXPECT_FALSE(ParseSlotMap(Map({Range(0, 16383, Node("10.0.0.1", 0))}), kNode).ok());
  // A host that would drive a terminal, or that Python could not decode.
  EXPECT_FALSE(ParseSlotMap(Map({Range(0, 16383, Node("\x1b]0;x\x07", 7000))}), kNode).ok());
  EXPECT_FALSE(ParseSlotMap(Map({Range(0, 16383, Node("h\xc3\xa9", 7000))}), kNode).ok());
  // A slot served twice: each overlapping range rewrote up to 16384 slots.
  auto overlap = ParseSlotMap(
      Map({Range(0, 16383, Node("10.0.0.1", 7000)), Range(5, 6, Node("10.0.0.2", 7000))}), kNode);
  EXPECT_TRUE(absl::IsUnavailable(overlap.status()));
  EXPECT_NE(std::string(overlap.status().message()).find("serves slot 5 a second time"),
            std::string::npos)
      << overlap.status();
  EXPECT_FALSE(RedirectTarget("MOVED 1 10.0.0.1:99999", kNode).has_value());
  EXPECT_FALSE(RedirectTarget("ASK 1 \x1b[2J:7000", kNode).has_value());
  ASSERT_TRUE(RedirectTarget("MOVED 1 :7002", kNode).has_value());
  EXPECT_EQ(RedirectTarget("MOVED 1 :7002", kNode)->ToString(), "127.0.0.1:7002");
}

TEST(SlotMapTest, ReplicasBeyondTheFirst1024AreNotKept) {
  // A range naming 100,000 distinct replicas (2 MB on the wire): kept by hash, the first 1024
  // only. A linear search per replica made this parse take seconds, and 800,000 minutes.
  Reply range = Range(0, 16383, Node("10.0.0.1", 7000));
  for (int i = 0; i < 100000; ++i) {
    range.elements.push_back(
        Node("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250), 1 + i % 60000));
  }
  auto map = ParseSlotMap(Map({std::move(range)}), kNode);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->replicas.size(), 1024u);
}

}  // namespace
}  // namespace ckv::remote
