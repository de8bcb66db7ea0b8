// SPDX-License-Identifier: Apache-2.0
// remote/cluster_client.h against a real Redis Cluster on loopback (tests/remote/redis_cluster.h):
// routing by slot, pipelined reads and writes across masters, MOVED and ASK while a slot
// migrates, a stopped master (a timeout, not a hang), a killed master (the replica takes over
// and the client follows), and eviction under maxmemory (a miss, not an error). Skipped, saying
// why, where redis-server or redis-cli is absent.
#include "remote/cluster_client.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "remote/key_slot.h"
#include "tests/remote/redis_cluster.h"

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
  for (const std::string key :
       {"foo", "bar", "{user1000}.following", "ckv:abc:0123", "a{}b", "x{y}z{w}"}) {
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
                .find("OK"),
            std::string::npos);
  ASSERT_NE(cluster_->Cli(source, absl::StrCat("CLUSTER SETSLOT ", slot, " MIGRATING ", target_id))
                .find("OK"),
            std::string::npos);
  ASSERT_NE(cluster_
                ->Cli(source, absl::StrCat("MIGRATE 127.0.0.1 ", cluster_->port(target),
                                           " '' 0 5000 KEYS '", moved_key, "'"))
                .find("OK"),
            std::string::npos);
  auto got = client->MultiGet({moved_key, staying_key});
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[0]->value_or("<nil>"), "v-moved");
  EXPECT_EQ(got[1]->value_or("<nil>"), "v-stay");
  EXPECT_EQ(client->stats().ask_redirects, 1u);
  EXPECT_EQ(client->stats().moved_redirects, 0u);

  // The migration ends: the slot belongs to the target, everywhere.
  ASSERT_NE(cluster_
                ->Cli(source, absl::StrCat("MIGRATE 127.0.0.1 ", cluster_->port(target),
                                           " '' 0 5000 KEYS '", staying_key, "'"))
                .find("OK"),
            std::string::npos);
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
  // Each key its own bytes (its name, then a filler of its own), so a hit proves it is that
  // key's value, not any value of the right size.
  auto value_of = [](const std::string& key) {
    std::string v = key;
    v.resize(64 << 10, static_cast<char>('a' + key.size() % 7 + key.back() % 13));
    return v;
  };
  std::vector<std::string> keys;
  for (int batch = 0; batch < 8; ++batch) {
    std::vector<std::pair<std::string, std::string>> items;
    for (int i = 0; i < 32; ++i) {
      keys.push_back(absl::StrCat("evict:", batch, ":", i));
      items.emplace_back(keys.back(), value_of(keys.back()));
    }
    for (const absl::Status& s : client->MultiSet(items)) EXPECT_TRUE(s.ok()) << s;
  }
  auto got = client->MultiGet(keys);
  // The suite's cluster back as it was, before any assertion can end the test.
  for (int m : masters) {
    cluster_->Cli(m, "CONFIG SET maxmemory 0");
    cluster_->Cli(m, "CONFIG SET maxmemory-policy noeviction");
  }
  ASSERT_EQ(got.size(), keys.size());
  size_t misses = 0, hits = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status();
    if (got[i]->has_value()) {
      EXPECT_TRUE(**got[i] == value_of(keys[i])) << keys[i] << ": served another value";
      ++hits;
    } else {
      ++misses;
    }
  }
  // 16 MiB of values into 3 x 4 MiB: some were evicted (misses), some kept, none an error.
  EXPECT_GT(misses, 0u);
  EXPECT_GT(hits, 0u);
}

// Its own cluster, as a failover changes which nodes are masters. A reader thread keeps calling
// while the main thread kills a master under it: until the replica is promoted, the victim's keys
// fail within the call's deadline (Unavailable or DeadlineExceeded, never a hang, a miss or
// another key's bytes) while the other masters' keys are still served; after it, every key is
// served with its own bytes again.
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
    items.emplace_back(keys.back(), absl::StrCat("value-", i, "-", std::string(i, 'v')));
  }
  for (const absl::Status& s : (*client)->MultiSet(items)) ASSERT_TRUE(s.ok()) << s;
  // Let the replicas catch up before the kill, or a promoted replica may lack the last writes
  // (replication is asynchronous), which would read as misses. WAIT from redis-cli cannot tell:
  // it waits only for the writes of its own connection, which made none. So every replica's
  // replication offset is compared with its master's.
  auto offset_in = [](const std::string& info, const std::string& field) -> long long {
    const size_t at = info.find(field + ":");
    return at == std::string::npos ? -1 : std::atoll(info.c_str() + at + field.size() + 1);
  };
  std::string lagging;
  const bool caught_up = WaitUntil(
      [&] {
        for (int i = 0; i < cluster.size(); ++i) {
          const std::string info = cluster.Cli(i, "INFO replication");
          if (info.find("role:slave") == std::string::npos) continue;
          const int master = cluster.NodeOfPort(static_cast<int>(offset_in(info, "master_port")));
          if (master < 0) return false;
          const long long mine = offset_in(info, "slave_repl_offset");
          const long long theirs =
              offset_in(cluster.Cli(master, "INFO replication"), "master_repl_offset");
          if (mine < theirs || theirs <= 0) {
            lagging = absl::StrCat("replica ", cluster.port(i), " at ", mine, " of ", theirs);
            return false;
          }
        }
        return true;
      },
      absl::Seconds(10));
  ASSERT_TRUE(caught_up) << lagging;
  auto victim_ep = (*client)->MasterOf(KeySlot(keys[0]));
  ASSERT_TRUE(victim_ep.ok());
  const int victim = cluster.NodeOfPort(victim_ep->port);

  // What the reader saw, call by call.
  struct Seen {
    int calls = 0;
    int failed_calls = 0;          // calls with at least one failed key
    int served_while_failing = 0;  // keys served by calls that also had failures
    int ok_after_failure = 0;      // calls that served every key after one that failed
    absl::Duration longest_call;
    std::vector<std::string> problems;  // a hang, a miss, wrong bytes, an unexpected status
  };
  absl::Mutex mu;
  Seen seen;
  std::atomic<bool> stop{false};
  // A call may take the deadline plus one connect timeout (cluster_client.h); more is a hang.
  // Generous for a loaded machine or a sanitizer build, far below what a hang would show.
  const absl::Duration bound = co.call_timeout + co.connect_timeout + absl::Milliseconds(800);
  std::thread reader([&] {
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      auto got = (*client)->MultiGet(keys);
      const absl::Duration took = absl::Now() - start;
      int failed = 0, served = 0;
      std::vector<std::string> problems;
      if (took > bound) {
        problems.push_back(absl::StrCat("a call took ", absl::FormatDuration(took)));
      }
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!got[i].ok()) {
          ++failed;
          const absl::StatusCode code = got[i].status().code();
          if (code != absl::StatusCode::kUnavailable &&
              code != absl::StatusCode::kDeadlineExceeded) {
            problems.push_back(absl::StrCat(keys[i], ": ", got[i].status().ToString()));
          }
        } else if (!got[i]->has_value()) {
          problems.push_back(absl::StrCat(keys[i], ": a miss (the replica had it: WAIT)"));
        } else if (**got[i] != items[i].second) {
          problems.push_back(absl::StrCat(keys[i], ": wrong bytes \"", **got[i], "\""));
        } else {
          ++served;
        }
      }
      absl::MutexLock lock(&mu);
      ++seen.calls;
      seen.longest_call = std::max(seen.longest_call, took);
      if (failed > 0) {
        ++seen.failed_calls;
        seen.served_while_failing += served;
      } else if (seen.failed_calls > 0) {
        ++seen.ok_after_failure;
      }
      for (std::string& p : problems) {
        if (seen.problems.size() < 20) seen.problems.push_back(std::move(p));
      }
    }
  });
  // Kill the victim while the reader is in full flow, then wait until it has been served
  // everything, several times over, after the failover.
  const bool flowing = WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return seen.calls >= 5;
      },
      absl::Seconds(10));
  cluster.Kill(victim);
  const bool recovered = WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return seen.ok_after_failure >= 3;
      },
      absl::Seconds(20));
  stop.store(true);
  reader.join();

  absl::MutexLock lock(&mu);
  EXPECT_TRUE(flowing) << seen.calls << " calls before the kill";
  EXPECT_TRUE(recovered) << seen.failed_calls << " failed calls, " << seen.ok_after_failure
                         << " whole calls after them\n"
                         << cluster.Cli(victim == 0 ? 1 : 0, "CLUSTER NODES");
  // The kill was seen mid-run: calls failed (the victim's keys), and within their deadline;
  // the other masters' keys were served all along.
  EXPECT_GT(seen.failed_calls, 0);
  EXPECT_GT(seen.served_while_failing, 0);
  EXPECT_LE(seen.longest_call, bound);
  EXPECT_TRUE(seen.problems.empty()) << absl::StrJoin(seen.problems, "\n");
  auto now_master = (*client)->MasterOf(KeySlot(keys[0]));
  ASSERT_TRUE(now_master.ok());
  EXPECT_NE(now_master->port, victim_ep->port);
  EXPECT_GE((*client)->stats().slot_map_refreshes, 2u);
}

}  // namespace
}  // namespace ckv::remote
