// SPDX-License-Identifier: Apache-2.0
// kvctl rm and gc: remove a stored prefix, and give back the space nothing uses.
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <utility>

#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/kvctl/open_to_free.h"
#include "tools/kvctl/progress.h"

namespace ckv::kvctl {
namespace {

// Free bytes below which rm and gc give back blocks before they open the store at all: RocksDB's
// open may flush its WAL to a table (up to the catalog's 8 MiB write buffer), and its failure
// paths on a full disk are not all clean (an assertion of librocksdb's fired in one here).
constexpr uint64_t kNearlyFullBytes = 16ull << 20;

bool NearlyFull(const std::string& store) {
  struct statvfs fs {};
  if (::statvfs(store.c_str(), &fs) != 0) return false;  // the open says what is wrong
  return uint64_t{fs.f_bavail} * fs.f_frsize < kNearlyFullBytes;
}

// Opens `store` after `opened` found its file system full: gives back blocks without writing,
// the prefix's chunks (rm) only when free slots and the snapshot are not enough (open_to_free.h).
absl::StatusOr<std::unique_ptr<Engine>> OpenFreeingSpace(
    const std::string& command, const std::string& store, std::span<const ChunkKey> delete_prefixes,
    absl::StatusOr<std::unique_ptr<Engine>> opened) {
  const std::string why = opened.ok() ? std::string() : std::string(opened.status().message());
  int opens = 0;
  auto open = [&]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    // RocksDB opening on a file system with almost nothing free can abort the process (an
    // assertion of the installed librocksdb: "sync_without_flush_called_"). While a later step
    // may still give back more (rm's chunks), an open is not tried on a nearly full file system.
    if (opens++ == 0 && !delete_prefixes.empty() && NearlyFull(store)) {
      return NoSpaceError("fewer than 16 MiB free on the file system of " + store +
                          " after giving back free slots");
    }
    return OpenExisting(store);
  };
  return kvctl::OpenToFree(
      std::move(opened), delete_prefixes, open,
      [&](std::span<const ChunkKey> prefixes) {
        return engine::FreeSpaceToOpen(EngineOptions{}, store, prefixes);
      },
      [&](uint64_t freed, bool prefixes) {
        std::fprintf(stderr,
                     "kvctl %s: the file system of %s is full (%s); gave back %s without writing "
                     "(%s), opening it again\n",
                     command.c_str(), store.c_str(), why.c_str(), FormatBytes(freed).c_str(),
                     prefixes ? "the chunks being removed" : "free slots and the index snapshot");
      });
}

struct RmOptions {
  std::string store;
  std::string prefix;
  cli::JsonOutput json;
};

int RunRm(const RmOptions& o) {
  const std::string& store = o.store;
  std::string wanted = o.prefix;
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("rm", error);
  const bool nearly_full = NearlyFull(store);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      nearly_full ? absl::StatusOr<std::unique_ptr<Engine>>(
                        NoSpaceError("fewer than 16 MiB free on the file system of " + store))
                  : OpenExisting(store);
  ChunkKey prefix_id;
  if (!engine.ok() && IsNoSpace(engine.status())) {
    // Which prefix, from a read-only view (it writes nothing), before giving back its blocks.
    auto view = OpenToRead(store);
    if (!view.ok()) return StoreError("open " + store, view.status());
    if (const int code = FindPrefix(**view, "rm", store, wanted, &prefix_id); code != kExitOk) {
      return code;
    }
    view->reset();
    engine =
        OpenFreeingSpace("rm", store, std::span<const ChunkKey>(&prefix_id, 1), std::move(engine));
  }
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  if (const int code = FindPrefix(**engine, "rm", store, wanted, &prefix_id); code != kExitOk) {
    return code;
  }
  const EngineStats before = (*engine)->Stats();
  uint64_t chunks = 0;
  for (const PrefixInfo& p : (*engine)->ListPrefixes()) {
    if (p.id == prefix_id) chunks = p.chunks;
  }
  if (absl::Status s = (*engine)->DeletePrefix(prefix_id); !s.ok()) {
    return StoreError("rm " + prefix_id.ToHex(), s);
  }
  const EngineStats after = (*engine)->Stats();
  // Nothing else writes a store at rest; the guards keep a concurrent writer from wrapping them.
  const uint64_t freed = before.chunks > after.chunks ? before.chunks - after.chunks : 0;
  const uint64_t freed_bytes = before.disk_bytes_used > after.disk_bytes_used
                                   ? before.disk_bytes_used - after.disk_bytes_used
                                   : 0;
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(store)
        .Key("prefix_id")
        .String(prefix_id.ToHex())
        .Key("chunks")
        .Uint(chunks)
        .Key("chunks_freed")
        .Uint(freed)
        .Key("bytes_freed")
        .Uint(freed_bytes)
        .EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf(
      "removed prefix %s (%llu chunks): %llu chunks freed (%s), %llu shared with other "
      "prefixes kept\n",
      prefix_id.ToHex().c_str(), static_cast<unsigned long long>(chunks),
      static_cast<unsigned long long>(freed), FormatBytes(freed_bytes).c_str(),
      static_cast<unsigned long long>(chunks - std::min(chunks, freed)));
  return kExitOk;
}

struct GcOptions {
  std::string store;
  cli::JsonOutput json;
};

int RunGc(const GcOptions& o) {
  const std::string& store = o.store;
  auto engine = OpenFreeingSpace(
      "gc", store, {},
      NearlyFull(store) ? absl::StatusOr<std::unique_ptr<Engine>>(
                              NoSpaceError("fewer than 16 MiB free on the file system of " + store))
                        : OpenExisting(store));
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  const EngineStats before = (*engine)->Stats();
  const auto start = Clock::now();
  absl::StatusOr<GcReport> report;
  {
    ElapsedTicker ticker("gc");  // Engine::Gc reports no progress
    report = (*engine)->Gc();
  }
  if (!report.ok()) return StoreError("gc " + store, report.status());
  const double seconds = SecondsSince(start);
  const EngineStats after = (*engine)->Stats();
  const uint64_t total = before.orphan_bytes_reclaimed + report->bytes_reclaimed;
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(store)
        .Key("bytes_reclaimed")
        .Uint(total)
        .Key("open_bytes_reclaimed")
        .Uint(before.orphan_bytes_reclaimed)
        .Key("gc_bytes_reclaimed")
        .Uint(report->bytes_reclaimed)
        .Key("segments_removed")
        .Uint(report->segments_removed)
        .Key("segments")
        .Uint(after.segments)
        .Key("disk_bytes_used")
        .Uint(after.disk_bytes_used)
        .Key("seconds")
        .Double(seconds)
        .EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf(
      "gc %s: reclaimed %s (%s orphaned on open, %s of free slots and empty segments); "
      "%llu segment file%s removed, %llu left; disk used %s\n",
      store.c_str(), FormatBytes(total).c_str(), FormatBytes(before.orphan_bytes_reclaimed).c_str(),
      FormatBytes(report->bytes_reclaimed).c_str(),
      static_cast<unsigned long long>(report->segments_removed),
      report->segments_removed == 1 ? "" : "s", static_cast<unsigned long long>(after.segments),
      FormatBytes(after.disk_bytes_used).c_str());
  return kExitOk;
}

}  // namespace

Command AddRm(CLI::App& kvctl) {
  auto o = std::make_shared<RmOptions>();
  CLI::App* cmd = kvctl.add_subcommand("rm", "Remove a stored prefix (Engine::DeletePrefix).");
  cmd->footer(
      "PREFIX as for 'kvctl export'. The prefix's chunks that no other stored prefix uses are\n"
      "freed at once (their blocks are given back to the file system); shared ones stay. On a\n"
      "file system too full for the store to open, rm first gives back the blocks of those\n"
      "chunks (and of free slots) without writing, then opens the store and removes them.\n"
      "Example: kvctl rm ./store 9f3c0a17b2d4e6f8");
  AddStoreArg(*cmd, &o->store);
  AddPrefixArg(*cmd, &o->prefix);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunRm(*o); }};
}

Command AddGc(CLI::App& kvctl) {
  auto o = std::make_shared<GcOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "gc", "Give back segment space no chunk uses, and delete segment files that hold no chunk.");
  cmd->footer(
      "Removing a chunk normally frees its blocks at once; what is left for gc is the space a\n"
      "crash or a failed hole punch left behind. Opening the store reclaims the space of slots no\n"
      "committed chunk names (orphaned space); Engine::Gc then gives back the blocks of free\n"
      "slots still allocated and deletes the segment files that hold no chunk. gc reports both;\n"
      "bytes_reclaimed is their sum. It does not move chunks: a segment with one live chunk keeps\n"
      "its file. On a file system too full for the store to open, gc first gives back the blocks\n"
      "of free slots and the index snapshot without writing, then opens it.\n"
      "Example: kvctl gc ./store");
  AddStoreArg(*cmd, &o->store);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunGc(*o); }};
}

}  // namespace ckv::kvctl
