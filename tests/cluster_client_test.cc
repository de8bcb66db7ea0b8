// SPDX-License-Identifier: Apache-2.0
// remote/cluster_client.h against a real Redis Cluster on loopback (tests/redis_cluster.h):
// routing by slot, pipelined reads and writes across masters, MOVED and ASK while a slot
// migrates, a stopped master (a timeout, not a hang), a killed master (the replica takes over
// and the client follows), and eviction under maxmemory (a miss, not an error). Skipped, saying
// why, where redis-server or redis-cli is absent.
#include "remote/cluster_client.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "remote/key_slot.h"
#include "tests/redis_cluster.h"

namespace ckv::remote {
namespace {

using ckv::testing::RedisCluster;
using ckv::testing::WaitUntil;

// One cluster of three masters with one replica each, for the whole suite. Tests that change
// the cluster put it back as they found it (or run last in their own cluster).
class ClusterClientTest : public ckv::testing::SuiteClusterTest {
 protected:
  static void SetUpTestSuite() {
    RedisCluster::Options o;
    o.masters = 3;
    o.replicas_per_master = 1;
    // Long enough that the SIGSTOP test does not cause a failover.
    o.node_timeout_ms = 5000;
    StartSuiteCluster(o);
  }
  std::unique_ptr<ClusterClient> NewClient(absl::Duration call_timeout = absl::Seconds(2)) {
    ClusterOptions o;
    o.seeds = {cluster_->endpoint(0)};  // one seed: the rest is learnt from the slot map
    o.call_timeout = call_timeout;
    auto client = ClusterClient::Create(o);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }
};

TEST(ParseEndpointsTest, ListsAndErrors) {
  auto e = ParseEndpoints("127.0.0.1:7000,redis-a:7001");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].host, "127.0.0.1");
  EXPECT_EQ((*e)[0].port, 7000);
  EXPECT_EQ((*e)[1].ToString(), "redis-a:7001");
  EXPECT_EQ(ParseEndpoints("host").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoints("host:0").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoints("host:70000").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoints("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterClientCreateTest, RejectsBadOptions) {
  ClusterOptions o;
  EXPECT_EQ(ClusterClient::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.seeds = {{"127.0.0.1", 1}};
  o.call_timeout = absl::ZeroDuration();
  EXPECT_EQ(ClusterClient::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterClientCreateTest, NoClusterIsUnavailableWithinTheDeadline) {
  // A port nothing listens on (bound and released by the fixture's helper would be racy; port
  // 1 on loopback is refused without root services).
  ClusterOptions o;
  o.seeds = {{"127.0.0.1", 1}};
  o.call_timeout = absl::Milliseconds(300);
  auto client = ClusterClient::Create(o);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  auto got = (*client)->MultiGet({"a", "b"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].status().code(), absl::StatusCode::kUnavailable) << got[0].status();
}

TEST_F(ClusterClientTest, KeySlotAgreesWithTheServer) {
  for (const std::string key : {"foo", "bar", "{user1000}.following", "ckv:abc:0123", "a{}b",
                                "x{y}z{w}"}) {
    const std::string answer = cluster_->Cli(0, absl::StrCat("CLUSTER KEYSLOT '", key, "'"));
    EXPECT_EQ(std::stoul(answer), KeySlot(key)) << key;
  }
}

TEST_F(ClusterClientTest, SetThenGetAcrossAllMasters) {
  auto client = NewClient();
  std::vector<std::pair<std::string, std::string>> items;
  for (int i = 0; i < 300; ++i) {
    items.emplace_back(absl::StrCat("t1:key:", i),
                       std::string(100 + i, static_cast<char>('a' + i % 26)));
  }
  for (const absl::Status& s : client->MultiSet(items)) ASSERT_TRUE(s.ok()) << s;
  std::vector<std::string> keys;
  for (const auto& [k, v] : items) keys.push_back(k);
  keys.push_back("t1:missing");
  auto got = client->MultiGet(keys);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    ASSERT_TRUE(got[i]->has_value()) << keys[i];
    EXPECT_EQ(**got[i], items[i].second);
  }
  ASSERT_TRUE(got.back().ok());
  EXPECT_FALSE(got.back()->has_value());
  // Three masters served the keys: the map routed them, no redirection was needed.
  const ClusterClientStats st = client->stats();
  EXPECT_EQ(st.moved_redirects, 0u);
  EXPECT_EQ(st.ask_redirects, 0u);
  EXPECT_GE(st.connections_opened, 3u);
  auto exists = client->MultiExists({"t1:key:0", "t1:missing"});
  ASSERT_TRUE(exists[0].ok() && exists[1].ok());
  EXPECT_TRUE(*exists[0]);
  EXPECT_FALSE(*exists[1]);
}

TEST_F(ClusterClientTest, MultiGetIntoReusesTheCallersStrings) {
  auto client = NewClient();
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) {
    keys.push_back(absl::StrCat("into:", i));
    // Small values and values past the reader's direct threshold, each its own bytes.
    items.emplace_back(keys.back(), std::string(i % 2 == 0 ? 100 + i : (64 << 10) + i,
                                                static_cast<char>('a' + i)));
  }
  for (const absl::Status& s : client->MultiSet(items)) ASSERT_TRUE(s.ok()) << s;
  keys.push_back("into:missing");
  std::vector<std::string> values;
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    std::vector<const char*> memory;
    for (const std::string& v : values) memory.push_back(v.data());
    auto got = client->MultiGetInto(keys, &values);
    ASSERT_EQ(got.size(), keys.size());
    ASSERT_EQ(values.size(), keys.size());
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_TRUE(*got[i]) << keys[i];
      EXPECT_TRUE(values[i] == items[i].second) << keys[i];
      // The second pass reads each value into the memory the first left.
      if (pass == 1) {
        EXPECT_EQ(values[i].data(), memory[i]) << keys[i];
      }
    }
    ASSERT_TRUE(got.back().ok()) << got.back().status();
    EXPECT_FALSE(*got.back());
    EXPECT_TRUE(values.back().empty());
  }
}

TEST_F(ClusterClientTest, SlotMigrationFollowsAskThenMoved) {
  auto client = NewClient();
  const std::string moved_key = "{mig}moved";
  const std::string staying_key = "{mig}staying";
  const uint32_t slot = KeySlot(moved_key);
  ASSERT_EQ(slot, KeySlot(staying_key));
  for (const absl::Status& s :
       client->MultiSet({{moved_key, "v-moved"}, {staying_key, "v-stay"}})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  auto source_ep = client->MasterOf(slot);
  ASSERT_TRUE(source_ep.ok()) << source_ep.status();
  const int source = cluster_->NodeOfPort(source_ep->port);
  ASSERT_GE(source, 0);
  int target = -1;
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i != source && cluster_->IsMaster(i)) {
      target = i;
      break;
    }
  }
  ASSERT_GE(target, 0);
  const std::string source_id = cluster_->NodeId(source);
  const std::string target_id = cluster_->NodeId(target);
  // Half-migrated: one key already on the target, the other still on the source.
  ASSERT_NE(cluster_->Cli(target, absl::StrCat("CLUSTER SETSLOT ", slot, " IMPORTING ", source_id))
                .find("OK"), std::string::npos);
  ASSERT_NE(cluster_->Cli(source, absl::StrCat("CLUSTER SETSLOT ", slot, " MIGRATING ", target_id))
                .find("OK"), std::string::npos);
  ASSERT_NE(cluster_->Cli(source, absl::StrCat("MIGRATE 127.0.0.1 ", cluster_->port(target),
                                               " '' 0 5000 KEYS '", moved_key, "'"))
                .find("OK"), std::string::npos);
  auto got = client->MultiGet({moved_key, staying_key});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[0]->value_or("<nil>"), "v-moved");
  EXPECT_EQ(got[1]->value_or("<nil>"), "v-stay");
  EXPECT_EQ(client->stats().ask_redirects, 1u);
  EXPECT_EQ(client->stats().moved_redirects, 0u);

  // The migration ends: the slot belongs to the target, everywhere.
  ASSERT_NE(cluster_->Cli(source, absl::StrCat("MIGRATE 127.0.0.1 ", cluster_->port(target),
                                               " '' 0 5000 KEYS '", staying_key, "'"))
                .find("OK"), std::string::npos);
  for (int i = 0; i < cluster_->size(); ++i) {
    if (!cluster_->IsMaster(i)) continue;
    cluster_->Cli(i, absl::StrCat("CLUSTER SETSLOT ", slot, " NODE ", target_id));
  }
  got = client->MultiGet({moved_key, staying_key});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[0]->value_or("<nil>"), "v-moved");
  EXPECT_EQ(got[1]->value_or("<nil>"), "v-stay");
  EXPECT_GE(client->stats().moved_redirects, 1u);
  // The map was fetched again: the next read goes straight to the target.
  const uint64_t moved_before = client->stats().moved_redirects;
  got = client->MultiGet({moved_key});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(client->stats().moved_redirects, moved_before);
  auto now_master = client->MasterOf(slot);
  ASSERT_TRUE(now_master.ok());
  EXPECT_EQ(now_master->port, cluster_->port(target));
}

TEST_F(ClusterClientTest, StoppedMasterIsATimeoutNotAHang) {
  auto client = NewClient(absl::Milliseconds(300));
  const std::string key = "stop:key";
  ASSERT_TRUE(client->MultiSet({{key, "v"}})[0].ok());
  auto master = client->MasterOf(KeySlot(key));
  ASSERT_TRUE(master.ok());
  const int node = cluster_->NodeOfPort(master->port);
  // A key on another master, which must still be served in the same call.
  std::string other_key;
  for (int i = 0; other_key.empty(); ++i) {
    std::string k = absl::StrCat("stop:other:", i);
    auto m = client->MasterOf(KeySlot(k));
    if (m.ok() && m->port != master->port) other_key = k;
  }
  ASSERT_TRUE(client->MultiSet({{other_key, "w"}})[0].ok());
  cluster_->Signal(node, SIGSTOP);
  const absl::Time start = absl::Now();
  auto got = client->MultiGet({key, other_key});
  const absl::Duration took = absl::Now() - start;
  cluster_->Signal(node, SIGCONT);
  EXPECT_EQ(got[0].status().code(), absl::StatusCode::kDeadlineExceeded) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[1]->value_or("<nil>"), "w");
  EXPECT_LT(took, absl::Milliseconds(800));
  EXPECT_GE(client->stats().timeouts, 1u);
  // Once the node runs again, the client serves from it again.
  got = client->MultiGet({key});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[0]->value_or("<nil>"), "v");
}

TEST_F(ClusterClientTest, EvictionUnderMaxmemoryLooksLikeAMiss) {
  auto client = NewClient();
  std::vector<int> masters;
  for (int i = 0; i < cluster_->size(); ++i) {
    if (cluster_->IsMaster(i)) masters.push_back(i);
  }
  for (int m : masters) {
    cluster_->Cli(m, "CONFIG SET maxmemory-policy allkeys-lru");
    cluster_->Cli(m, "CONFIG SET maxmemory 4mb");
  }
  const std::string value(64 << 10, 'e');
  std::vector<std::string> keys;
  for (int batch = 0; batch < 8; ++batch) {
    std::vector<std::pair<std::string, std::string>> items;
    for (int i = 0; i < 32; ++i) {
      keys.push_back(absl::StrCat("evict:", batch, ":", i));
      items.emplace_back(keys.back(), value);
    }
    for (const absl::Status& s : client->MultiSet(items)) EXPECT_TRUE(s.ok()) << s;
  }
  auto got = client->MultiGet(keys);
  size_t misses = 0, hits = 0;
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    if (g->has_value()) {
      EXPECT_EQ(**g, value);
      ++hits;
    } else {
      ++misses;
    }
  }
  for (int m : masters) {
    cluster_->Cli(m, "CONFIG SET maxmemory 0");
    cluster_->Cli(m, "CONFIG SET maxmemory-policy noeviction");
  }
  // 16 MiB of values into 3 x 4 MiB: some were evicted (misses), some kept, none an error.
  EXPECT_GT(misses, 0u);
  EXPECT_GT(hits, 0u);
}

// Its own cluster, as a failover changes which nodes are masters.
TEST(ClusterClientFailoverTest, KilledMasterReplicaTakesOver) {
  RedisCluster::Options o;
  o.masters = 3;
  o.replicas_per_master = 1;
  o.node_timeout_ms = 1000;
  auto started = RedisCluster::Start(o);
  CKV_SKIP_OR_FAIL_WITHOUT_CLUSTER(started.status());
  RedisCluster& cluster = **started;
  ClusterOptions co;
  co.seeds = cluster.endpoints();
  co.call_timeout = absl::Milliseconds(500);
  auto client = ClusterClient::Create(co);
  ASSERT_TRUE(client.ok());
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) {
    keys.push_back(absl::StrCat("fo:", i));
    items.emplace_back(keys.back(), absl::StrCat("value-", i));
  }
  for (const absl::Status& s : (*client)->MultiSet(items)) ASSERT_TRUE(s.ok()) << s;
  // Let the replicas catch up: WAIT on every master until its one replica acknowledged.
  for (int i = 0; i < cluster.size(); ++i) {
    if (cluster.IsMaster(i)) {
      ASSERT_EQ(cluster.Cli(i, "WAIT 1 5000"), "1\n") << "node " << i;
    }
  }
  auto victim_ep = (*client)->MasterOf(KeySlot(keys[0]));
  ASSERT_TRUE(victim_ep.ok());
  const int victim = cluster.NodeOfPort(victim_ep->port);
  cluster.Kill(victim);
  // Until the failover, reads of the victim's keys fail (within the call's deadline); after
  // it, the client finds the promoted replica through a fresh slot map, and every key is there.
  std::string last_problem;
  bool recovered = WaitUntil(
      [&] {
        auto got = (*client)->MultiGet(keys);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!got[i].ok()) {
            last_problem = got[i].status().ToString();
            return false;
          }
          if (!got[i]->has_value() || **got[i] != items[i].second) {
            last_problem = keys[i] + ": missing or wrong after the failover";
            return false;
          }
        }
        return true;
      },
      absl::Seconds(20));
  EXPECT_TRUE(recovered) << last_problem << "\n"
                         << cluster.Cli(victim == 0 ? 1 : 0, "CLUSTER NODES");
  auto now_master = (*client)->MasterOf(KeySlot(keys[0]));
  ASSERT_TRUE(now_master.ok());
  EXPECT_NE(now_master->port, victim_ep->port);
  EXPECT_GE((*client)->stats().slot_map_refreshes, 2u);
}

}  // namespace
}  // namespace ckv::remote
