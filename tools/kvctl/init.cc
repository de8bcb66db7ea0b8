// SPDX-License-Identifier: Apache-2.0
// kvctl init: create an empty store.
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "ckv/options.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {
namespace {

struct InitOptions {
  std::string store;
  uint64_t max_disk_bytes = 0;
  bool cap_given = false;  // --max-disk-bytes was given (0 = unlimited)
  std::string layout = "layer-major";
};

// The share of the free space a store's cap takes when init is not given one: the store is a
// cache, and a full file system would fail every Put with ENOSPC instead of evicting.
constexpr double kDefaultCapShareOfFree = 0.9;

// Bytes free to an unprivileged writer on the file system that will hold `store` (its nearest
// existing directory).
absl::StatusOr<uint64_t> FreeBytesFor(const std::string& store) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(store, ec);
  if (ec) return absl::InternalError("resolve " + store + ": " + ec.message());
  while (!std::filesystem::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path()) {
    dir = dir.parent_path();
  }
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) {
    return absl::InternalError("statvfs " + dir.string() + ": " + std::strerror(errno));
  }
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

int RunInit(const InitOptions& o) {
  EngineOptions options;
  options.create_if_missing = true;
  options.error_if_exists = true;
  uint64_t cap = o.max_disk_bytes;
  std::string cap_note;
  if (!o.cap_given) {
    auto free_bytes = FreeBytesFor(o.store);
    if (!free_bytes.ok()) return StoreError("init " + o.store, free_bytes.status());
    cap = static_cast<uint64_t>(static_cast<double>(*free_bytes) * kDefaultCapShareOfFree);
    if (cap == 0) {
      std::fprintf(stderr, "kvctl: init %s: no free space on its file system\n", o.store.c_str());
      return kExitStoreError;
    }
    cap_note = " (90% of the " + FormatBytes(*free_bytes) +
               " free on its file system; --max-disk-bytes sets another)";
  }
  options.max_disk_bytes = cap;
  options.layout =
      o.layout == "period-major" ? RecordLayout::kPeriodMajor : RecordLayout::kLayerMajor;

  auto engine = Engine::Open(options, o.store);
  if (absl::IsAlreadyExists(engine.status())) {
    std::fprintf(stderr, "kvctl: init %s: store already exists\n", o.store.c_str());
    return kExitStoreError;
  }
  if (!engine.ok()) return StoreError("init " + o.store, engine.status());
  std::printf("initialized store %s (layout %s, cap %s%s)\n", o.store.c_str(), o.layout.c_str(),
              cap == 0 ? "unlimited" : FormatBytes(cap).c_str(), cap_note.c_str());
  return kExitOk;
}

}  // namespace

Command AddInit(CLI::App& kvctl) {
  auto o = std::make_shared<InitOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "init", "Create an empty store in directory STORE (the directory is created if missing).");
  cmd->footer(
      "Fails (exit 3) when STORE already holds a store. The cap and the layout are persisted:\n"
      "later commands keep them. Without --max-disk-bytes the cap is 90% of the space free on\n"
      "STORE's file system now, so that the store evicts before the disk fills.");
  AddStoreArg(*cmd, &o->store);
  cli::AddBytes(*cmd, "--max-disk-bytes", &o->max_disk_bytes,
                "hard cap on segment bytes; K/M/G/T suffixes (powers of 1024); 0 = unlimited; "
                "default: 90% of the free space")
      ->each([o](const std::string&) { o->cap_given = true; });
  cli::AddChoice(*cmd, "--layout", &o->layout, {"layer-major", "period-major"},
                 "record layout of segments: layer-major (default) or period-major");
  return {cmd, [o] { return RunInit(*o); }};
}

}  // namespace ckv::kvctl
