// SPDX-License-Identifier: Apache-2.0
// Every remote entry point against a cluster node that lies (tests/remote/hostile_node.h): huge
// counts and lengths, replies dripped a byte at a time, endless streams, wrong types, MOVED and ASK
// loops, an invalid slot map, replies out of order. Each call must end within its stated
// deadline, as a miss or a clear error, never a crash, with no allocation sized by what the
// node announced, and never serve bytes other than the ones stored.
//   - the cluster client: RefreshSlotMap, MultiGet, MultiSet, MultiExists, Execute (GETRANGE)
//     and ExecuteOn, within call_timeout + connect_timeout (remote/cluster_client.h);
//   - the engine: Put and its publishing, Lookup (a fill), Probe, a selecting and a reading
//     Re-Prefill session, and closing the engine (docs/remote.md states each one's deadline);
//   - kvctl put and lookup with --remote, the reproduction of the 13-byte reply included.
// The Python entry point has its own test (tests/python/test_hostile_node.py).
#include "tests/remote/hostile_node.h"

#include <sys/resource.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ckv/engine.h"
#include "ckv/log.h"
#include "engine/internal.h"
#include "gtest/gtest.h"
#include "remote/cluster_client.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using ckv::testing::HostileNode;
using ckv::testing::TempDir;
using Behavior = HostileNode::Behavior;

// Long enough under a sanitizer for an honest call (the out-of-order node must first take the
// Put's values) to finish: TSan makes encoding and sending several times slower.
constexpr absl::Duration kCallTimeout =
    ckv::testing::kSanitizerBuild ? absl::Milliseconds(1000) : absl::Milliseconds(300);
constexpr absl::Duration kConnectTimeout = absl::Milliseconds(200);
// What a loaded machine may add to a stated deadline (ctest runs two tests at once), and a
// sanitizer more: the engine's own work (RocksDB, the Put) is 5-15 times slower under TSan.
constexpr absl::Duration kSlack =
    ckv::testing::kSanitizerBuild ? absl::Milliseconds(2500) : absl::Milliseconds(700);

// The largest RSS the process has had, in bytes.
uint64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

std::unique_ptr<HostileNode> StartNode(Behavior behavior, bool honest_slot_map) {
  HostileNode::Options o;
  o.behavior = behavior;
  o.honest_slot_map = honest_slot_map;
  o.serve_limit = absl::Seconds(20);
  auto node = std::make_unique<HostileNode>(o);
  if (!node->Start()) return nullptr;
  return node;
}

struct Case {
  Behavior behavior;
  bool honest_slot_map;  // the lie meets the data commands, not CLUSTER SLOTS
};

std::string HostileCaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = HostileNode::Name(info.param.behavior);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return absl::StrCat(name, info.param.honest_slot_map ? "_after_slot_map" : "");
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (Behavior b : HostileNode::kAllBehaviors) {
    cases.push_back({b, false});
    if (b == Behavior::kHugeArray || b == Behavior::kHugeBulk || b == Behavior::kDrip ||
        b == Behavior::kEndless) {
      cases.push_back({b, true});
    }
  }
  return cases;
}

// Times `fn` and checks it ended within `limit`.
template <typename Fn>
auto Timed(const char* what, absl::Duration limit, Fn fn) {
  const absl::Time start = absl::Now();
  auto result = fn();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LE(took, limit) << what << " took " << took;
  return result;
}

class HostileClientTest : public ::testing::TestWithParam<Case> {};

TEST_P(HostileClientTest, EveryCallEndsWithinItsDeadlineAsAnErrorOrAMiss) {
  const Case c = GetParam();
  auto node = StartNode(c.behavior, c.honest_slot_map);
  ASSERT_NE(node, nullptr);
  remote::ClusterOptions o;
  o.seeds = {remote::Endpoint{"127.0.0.1", node->port()}};
  o.call_timeout = kCallTimeout;
  o.connect_timeout = kConnectTimeout;
  o.max_redirects = 5;
  auto client = remote::ClusterClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Duration limit = kCallTimeout + kConnectTimeout + kSlack;
  const uint64_t rss_before = PeakRssBytes();

  const absl::Status refresh =
      Timed("RefreshSlotMap", limit, [&] { return (*client)->RefreshSlotMap(); });
  const auto set = Timed("MultiSet", limit, [&] {
    return (*client)->MultiSet({{"a", "1"}, {"b", "22"}, {"c", "333"}});
  });
  const auto get = Timed("MultiGet", limit, [&] {
    return (*client)->MultiGet({"a", "b", "c"}, /*max_value_bytes=*/64);
  });
  const auto exists = Timed("MultiExists", limit, [&] {
    return (*client)->MultiExists({"a", "b", "missing"});
  });
  const auto range = Timed("Execute GETRANGE", limit, [&] {
    remote::Request r;
    r.argv = {"GETRANGE", "c", "0", "1"};
    r.max_reply_bytes = 2;
    return (*client)->Execute({r});
  });
  const auto dbsize = Timed("ExecuteOn DBSIZE", limit,
                            [&] { return (*client)->ExecuteOn(o.seeds[0], {"DBSIZE"}); });

  // Nothing sized by what the node announced (a 2 GiB array, a 512 MiB string): the peak RSS
  // grew by far less than either. (Under ASan the shadow of a touched 512 MiB would show too.)
  EXPECT_LT(PeakRssBytes() - rss_before, uint64_t{64} << 20);

  // What each behaviour must give, beyond ending in time.
  auto all_fail_with = [&](absl::StatusCode code, const std::string& text) {
    for (const auto& s : get) {
      EXPECT_EQ(s.status().code(), code) << s.status();
      EXPECT_NE(std::string(s.status().message()).find(text), std::string::npos) << s.status();
    }
  };
  switch (c.behavior) {
    case Behavior::kHugeArray:
      if (!c.honest_slot_map) {
        EXPECT_NE(refresh.message().find("array of 2147483647 elements announced"),
                  std::string::npos)
            << refresh;
      } else {
        ASSERT_TRUE(refresh.ok()) << refresh;
        all_fail_with(absl::StatusCode::kInternal, "array of 2147483647 elements announced");
      }
      break;
    case Behavior::kHugeBulk:
      if (!c.honest_slot_map) {
        EXPECT_NE(refresh.message().find("bulk string of 524288000 bytes announced"),
                  std::string::npos)
            << refresh;
      } else {
        all_fail_with(absl::StatusCode::kInternal, "bulk string of 524288000 bytes announced");
      }
      break;
    case Behavior::kDrip:
      if (!c.honest_slot_map) {
        EXPECT_TRUE(absl::IsDeadlineExceeded(refresh)) << refresh;
      } else {
        all_fail_with(absl::StatusCode::kDeadlineExceeded, "deadline");
      }
      break;
    case Behavior::kEndless:
      if (!c.honest_slot_map) {
        EXPECT_FALSE(refresh.ok());
      } else {
        // The status line passes the GET's 64 bytes long before the deadline.
        all_fail_with(absl::StatusCode::kInternal, "reply still incomplete");
      }
      break;
    case Behavior::kWrongTypes:
      ASSERT_TRUE(refresh.ok()) << refresh;
      // A SET, GET or GETRANGE takes no array: refused at its header.
      for (const auto& s : set) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
        EXPECT_NE(s.message().find("answered a request that takes none"), std::string::npos) << s;
      }
      all_fail_with(absl::StatusCode::kInternal, "answered a request that takes none");
      for (const auto& s : exists) {
        EXPECT_EQ(s.status().code(), absl::StatusCode::kInternal) << s.status();
      }
      break;
    case Behavior::kMovedLoop:
    case Behavior::kAskLoop:
      ASSERT_TRUE(refresh.ok()) << refresh;
      all_fail_with(absl::StatusCode::kUnavailable, "too many redirections");
      for (const auto& s : set) EXPECT_TRUE(absl::IsUnavailable(s)) << s;
      break;
    case Behavior::kMovedToName:
      // Not resolved (a blocking getaddrinfo no deadline bounds): Unavailable, at once.
      ASSERT_TRUE(refresh.ok()) << refresh;
      all_fail_with(absl::StatusCode::kUnavailable, "only seeds are resolved");
      break;
    case Behavior::kBadSlotMap:
      // Port 99999 is not read as 34463, and the escape sequence never reaches a message raw.
      EXPECT_TRUE(absl::IsUnavailable(refresh)) << refresh;
      EXPECT_NE(refresh.message().find("range 0: its master is not a valid node"),
                std::string::npos)
          << refresh;
      for (const auto& s : get) {
        EXPECT_FALSE(s.ok());
        EXPECT_EQ(s.status().message().find('\x1b'), std::string::npos) << s.status();
      }
      break;
    case Behavior::kOutOfOrder: {
      // The client cannot know (RESP has no request ids): it hands back what came. The tier
      // above it verifies every value against its key (EngineEntryPoints below).
      ASSERT_TRUE(refresh.ok()) << refresh;
      for (const auto& s : set) EXPECT_TRUE(s.ok()) << s;
      ASSERT_EQ(get.size(), 3u);
      ASSERT_TRUE(get[0].ok() && get[0]->has_value()) << get[0].status();
      EXPECT_EQ(**get[0], "333");  // c's value, answered first
      break;
    }
    case Behavior::kHonest:
      break;
  }
  // ExecuteOn and Execute end in time whatever they got; a lying node never gives DBSIZE's
  // integer where the reply lies.
  (void)range;
  if (c.behavior == Behavior::kWrongTypes) {
    ASSERT_TRUE(dbsize.ok()) << dbsize.status();
    EXPECT_NE(dbsize->type, remote::Reply::Type::kInteger);
    for (const auto& s : exists) {
      EXPECT_NE(std::string(s.status().message()).find("answered a bulk string, not an integer"),
                std::string::npos)
          << s.status();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Behaviors, HostileClientTest, ::testing::ValuesIn(AllCases()),
                         HostileCaseName);

class HostileEngineTest : public ::testing::TestWithParam<Case> {
 protected:
  EngineOptions Options(const HostileNode& node) const {
    EngineOptions eo;
    eo.remote.seeds = {node.address()};
    eo.remote.call_timeout_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(kCallTimeout));
    eo.remote.connect_timeout_ms =
        static_cast<uint32_t>(absl::ToInt64Milliseconds(kConnectTimeout));
    eo.logger = NullLogger();
    return eo;
  }
};

// Put, its publishing, Lookup (which fills), Probe, a selecting and a reading session, and
// the engine's close. A fill is stated to delay its caller by at most about two call deadlines
// (docs/remote.md); publishing holds a closing engine for at most one call.
TEST_P(HostileEngineTest, EntryPointsEndInTimeAndServeOnlyStoredBytes) {
  const Case c = GetParam();
  auto node = StartNode(c.behavior, c.honest_slot_map);
  ASSERT_NE(node, nullptr);
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const absl::Duration one_call = kCallTimeout + kConnectTimeout + kSlack;
  const absl::Duration fill = 2 * (kCallTimeout + kConnectTimeout) + kSlack;
  TempDir dir;
  const std::vector<int32_t> tokens = synth::Tokens(11, 8 * spec.chunk_tokens);
  uint64_t published = 0;

  {
    // A: puts and publishes; closing waits for at most the call in flight.
    auto a = Engine::Open(Options(*node), dir.Sub("a"));
    ASSERT_TRUE(a.ok()) << a.status();
    auto put = ckv::testing::PutSynthetic(**a, spec, tokens);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_TRUE(Timed("publishing", 2 * one_call,
                      [&] { return engine::WaitUntilRemotePublished(**a, absl::Seconds(10)); }));
    published = (*a)->Stats().remote_published_chunks;
    Timed("closing the publisher", one_call, [&] {
      a->reset();
      return 0;
    });
  }

  // B: an empty store that asks the node.
  auto b = Engine::Open(Options(*node), dir.Sub("b"));
  ASSERT_TRUE(b.ok()) << b.status();
  const auto probe = Timed("Probe", one_call, [&] { return (*b)->Probe(spec, tokens); });
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->local_chunks, 0u);

  ReprefillOptions selecting;
  selecting.selector = Selector::kQuest;
  selecting.budget_fraction = 0.5;
  auto session = Timed("a selecting session", fill,
                       [&] { return (*b)->BeginReprefill(spec, tokens, selecting); });
  if (session.ok()) {
    std::vector<float> queries(size_t{selecting.window} * spec.q_heads * spec.head_dim, 0.25f);
    const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    std::vector<std::byte> want(spec.RecordBytes());
    for (uint32_t l = 0; l < spec.layers; ++l) {
      if (!(*session)->SubmitQueries(l, queries).ok()) break;
      auto view = Timed("AwaitLayer", one_call, [&] { return (*session)->AwaitLayer(l); });
      if (!view.ok()) break;  // a clear error for that layer, never wrong bytes
      for (const auto& r : view->records()) {
        synth::FillRecord(spec, keys[r.chunk], l, want);
        ASSERT_TRUE(ckv::testing::ServedEquals(r, want.data(), want.size()))
            << "layer " << l << " chunk " << r.chunk;
      }
    }
    (*session)->Finish().IgnoreError();  // a failed layer fails Finish too: not the question
    session->reset();
  }

  const auto found = Timed("Lookup (a fill)", fill, [&] { return (*b)->Lookup(spec, tokens); });
  ASSERT_TRUE(found.ok()) << found.status();
  // Whatever B holds now, it holds the bytes A stored: out-of-order values are refused.
  EXPECT_EQ(ckv::testing::CountBadRecords(**b, spec, tokens, *found), 0);
  const EngineStats st = (*b)->Stats();
  switch (c.behavior) {
    case Behavior::kOutOfOrder:
      // The first value that came back belongs to the last chunk: refused, the chain ends.
      ASSERT_EQ(published, tokens.size() / spec.chunk_tokens) << "the node took every value";
      EXPECT_GT(st.remote_corrupt_chunks, 0u);
      EXPECT_LT(*found, tokens.size() / spec.chunk_tokens);
      break;
    default:
      EXPECT_EQ(*found, 0u);
      break;
  }
  Timed("closing", one_call, [&] {
    b->reset();
    return 0;
  });
}

INSTANTIATE_TEST_SUITE_P(Behaviors, HostileEngineTest, ::testing::ValuesIn(AllCases()),
                         HostileCaseName);

#ifdef CKV_KVCTL_PATH
int64_t IntAt(const tools::JsonValue& v, std::string_view object, std::string_view key) {
  const tools::JsonValue* o = object.empty() ? &v : v.Find(object);
  if (o == nullptr) return -1;
  const tools::JsonValue* x = o->Find(key);
  return x != nullptr && x->AsInt() != nullptr ? *x->AsInt() : -1;
}

// The reproduction of the report: a node that answers CLUSTER SLOTS with 13 bytes killed kvctl
// put with SIGABRT. Now put commits locally, says the chunks were not published, and exits 0
// within its stated bound (the local Put, then one call); lookup is a miss. The drip, which
// held put's shutdown for over 100 s, is bounded the same way.
TEST(HostileKvctlTest, PutAndLookupEndInTimeAgainstAHostileNode) {
  for (const Case c : {Case{Behavior::kHugeArray, false}, Case{Behavior::kDrip, false},
                       Case{Behavior::kHugeBulk, true}, Case{Behavior::kEndless, true}}) {
    SCOPED_TRACE(HostileNode::Name(c.behavior));
    auto node = StartNode(c.behavior, c.honest_slot_map);
    ASSERT_NE(node, nullptr);
    TempDir dir;
    const std::string store = dir.Sub("s");
    const std::string kvctl = absl::StrCat("KVCTL_PROGRESS=off ", CKV_KVCTL_PATH);
    ASSERT_EQ(ckv::testing::RunProgram(kvctl, "init " + store + " --max-disk-bytes 64M").exit_code,
              0);
    const std::string remote = absl::StrCat(" --remote ", node->address());
    // The local Put and RocksDB take most of it, far more under a sanitizer; the node adds at
    // most one call.
    const absl::Duration process_bound =
        ckv::testing::kSanitizerBuild ? absl::Seconds(20) : absl::Seconds(5);
    const auto put = Timed("kvctl put", process_bound, [&] {
      return ckv::testing::RunProgram(
          kvctl, "put " + store + " --model qwen2.5-0.5b --tokens 64 --seed 1 --json" + remote,
          /*merge_stderr=*/false);
    });
    EXPECT_EQ(put.exit_code, 0) << put.output;  // -1 is a signal: the abort of the report
    auto put_json = tools::ParseJson(put.output);
    ASSERT_TRUE(put_json.ok()) << put.output;
    EXPECT_EQ(IntAt(*put_json, "remote", "published_chunks"), 0) << put.output;
    // A longer prompt than was put: the local chain ends at chunk 4, the node is asked for more.
    const std::vector<int32_t> tokens = synth::Tokens(1, 128);
    const std::string tokens_file = dir.Sub("tokens.json");
    std::ofstream(tokens_file) << "[" << absl::StrJoin(tokens, ",") << "]";
    const auto lookup = Timed("kvctl lookup", process_bound, [&] {
      return ckv::testing::RunProgram(
          kvctl,
          "lookup " + store + " --model qwen2.5-0.5b --json --tokens-file " + tokens_file + remote,
          /*merge_stderr=*/false);
    });
    EXPECT_EQ(lookup.exit_code, 0) << lookup.output;
    auto lookup_json = tools::ParseJson(lookup.output);
    ASSERT_TRUE(lookup_json.ok()) << lookup.output;
    EXPECT_EQ(IntAt(*lookup_json, "", "stored_chunks"), 4) << lookup.output;
  }
}
#endif

}  // namespace
}  // namespace ckv
