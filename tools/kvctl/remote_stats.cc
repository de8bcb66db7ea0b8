// SPDX-License-Identifier: Apache-2.0
// kvctl remote-stats: the Redis Cluster of the remote tier, master by master: slots, keys,
// memory, the eviction policy and what it evicted, hits and misses (docs/remote.md).
#include <cstdio>
#include <memory>
#include <string>

#include "engine/internal.h"
#include "ckv/log.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {
namespace {

struct RemoteStatsOptions {
  std::string remote;
  cli::JsonOutput json;
};

int RunRemoteStats(const RemoteStatsOptions& o) {
  EngineOptions options;
  ApplyRemote(o.remote, &options);
  auto nodes = engine::DescribeCluster(options.remote);
  if (!nodes.ok()) {
    if (absl::IsInvalidArgument(nodes.status())) {
      return UsageError("remote-stats", "--remote: " + std::string(nodes.status().message()));
    }
    return StoreError("remote-stats " + o.remote, nodes.status());
  }
  uint64_t keys = 0, used = 0, evicted = 0;
  for (const engine::RemoteNodeReport& n : *nodes) {
    keys += n.keys;
    used += n.used_memory_bytes;
    evicted += n.evicted_keys;
  }
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject().Key("remote").String(o.remote).Key("masters").BeginArray();
    for (const engine::RemoteNodeReport& n : *nodes) {
      w.BeginObject()
          .Key("endpoint")
          .String(n.endpoint)
          .Key("slots")
          .Uint(n.slots)
          .Key("keys")
          .Uint(n.keys)
          .Key("used_memory_bytes")
          .Uint(n.used_memory_bytes)
          .Key("maxmemory_bytes")
          .Uint(n.maxmemory_bytes)
          .Key("maxmemory_policy")
          .String(n.maxmemory_policy)
          .Key("evicted_keys")
          .Uint(n.evicted_keys)
          .Key("keyspace_hits")
          .Uint(n.keyspace_hits)
          .Key("keyspace_misses")
          .Uint(n.keyspace_misses)
          .Key("error")
          .String(n.error)
          .EndObject();
    }
    w.EndArray()
        .Key("keys")
        .Uint(keys)
        .Key("used_memory_bytes")
        .Uint(used)
        .Key("evicted_keys")
        .Uint(evicted)
        .EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf("cluster %s: %zu masters, %llu keys, %s used, %llu evicted\n", o.remote.c_str(),
              nodes->size(), static_cast<unsigned long long>(keys), FormatBytes(used).c_str(),
              static_cast<unsigned long long>(evicted));
  std::printf("  %-22s %6s %10s %12s %12s %-16s %10s %10s %10s\n", "master", "slots", "keys",
              "used", "maxmemory", "policy", "evicted", "hits", "misses");
  for (const engine::RemoteNodeReport& n : *nodes) {
    if (!n.error.empty()) {
      // What a node sent (its address, its error text): shown, not obeyed.
      std::printf("  %-22s %6u  error: %s\n", Printable(n.endpoint).c_str(), n.slots,
                  Printable(n.error).c_str());
      continue;
    }
    std::printf(
        "  %-22s %6u %10llu %12s %12s %-16s %10llu %10llu %10llu\n", Printable(n.endpoint).c_str(),
        n.slots, static_cast<unsigned long long>(n.keys), FormatBytes(n.used_memory_bytes).c_str(),
        n.maxmemory_bytes == 0 ? "none" : FormatBytes(n.maxmemory_bytes).c_str(),
        Printable(n.maxmemory_policy).c_str(), static_cast<unsigned long long>(n.evicted_keys),
        static_cast<unsigned long long>(n.keyspace_hits),
        static_cast<unsigned long long>(n.keyspace_misses));
  }
  return kExitOk;
}

}  // namespace

Command AddRemoteStats(CLI::App& kvctl) {
  auto o = std::make_shared<RemoteStatsOptions>();
  CLI::App* cmd = kvctl.add_subcommand("remote-stats",
                                       "The Redis Cluster of the remote tier, master by master.");
  cmd->footer(
      "Asks any node named by --remote for the slot map, then each master for DBSIZE and INFO:\n"
      "slots, keys, memory used and its cap, the eviction policy, keys evicted, keyspace hits and\n"
      "misses. A serving process reports its own remote figures in Engine::Metrics()\n"
      "(ckv_remote_*, docs/metrics.md).\n"
      "Example: kvctl remote-stats --remote 10.0.0.5:7000");
  AddRemoteOption(*cmd, &o->remote)->required();
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunRemoteStats(*o); }};
}

}  // namespace ckv::kvctl
