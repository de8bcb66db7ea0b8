// SPDX-License-Identifier: Apache-2.0
// kvctl init: create an empty store.
#include <cstdio>

#include "ckv/options.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {
namespace {

struct InitOptions {
  std::string store;
  uint64_t max_disk_bytes = 0;
  std::string layout = "layer-major";
};

int RunInit(const InitOptions& o) {
  EngineOptions options;
  options.create_if_missing = true;
  options.error_if_exists = true;
  options.max_disk_bytes = o.max_disk_bytes;
  options.layout =
      o.layout == "period-major" ? RecordLayout::kPeriodMajor : RecordLayout::kLayerMajor;

  auto engine = Engine::Open(options, o.store);
  if (absl::IsAlreadyExists(engine.status())) {
    std::fprintf(stderr, "kvctl: init %s: store already exists\n", o.store.c_str());
    return kExitStoreError;
  }
  if (!engine.ok()) return StoreError("init " + o.store, engine.status());
  std::printf("initialized store %s (layout %s, cap %s)\n", o.store.c_str(), o.layout.c_str(),
              o.max_disk_bytes == 0 ? "unlimited" : FormatBytes(o.max_disk_bytes).c_str());
  return kExitOk;
}

}  // namespace

Command AddInit(CLI::App& kvctl) {
  auto o = std::make_shared<InitOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "init", "Create an empty store in directory STORE (the directory is created if missing).");
  cmd->footer(
      "Fails (exit 3) when STORE already holds a store. The cap and the layout are persisted:\n"
      "later commands keep them.");
  AddStoreArg(*cmd, &o->store);
  cli::AddBytes(*cmd, "--max-disk-bytes", &o->max_disk_bytes,
                "hard cap on segment bytes; K/M/G/T suffixes (powers of 1024); 0 = unlimited "
                "(default)");
  cli::AddChoice(*cmd, "--layout", &o->layout, {"layer-major", "period-major"},
                 "record layout of segments: layer-major (default) or period-major");
  return {cmd, [o] { return RunInit(*o); }};
}

}  // namespace ckv::kvctl
