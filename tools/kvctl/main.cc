// SPDX-License-Identifier: Apache-2.0
// kvctl: create, populate and inspect ckv stores from the command line.
//
//   kvctl init STORE [--max-disk-bytes N] [--layout layer-major|period-major]
//   kvctl put STORE --model PRESET --tokens N --seed S [--shared-tokens K --shared-seed S2]
//                   [--dtype fp16|bf16|fp32] [--model-id ID] [--chunk-tokens C] [--json [PATH]]
//   kvctl ls STORE [--json [PATH]]
//   kvctl lookup STORE (--model PRESET | --spec FILE) --tokens-file F [--model-id ID]
//                [--json [PATH]]
//   kvctl show STORE PREFIX [--json [PATH]]
//   kvctl stats STORE [--gpu-tier-bytes B] [--cpu-tier-bytes B] [--json [PATH]]
//   kvctl verify STORE [--synthetic | --repair] [--json [PATH]]
//   kvctl rm STORE PREFIX [--json [PATH]]
//   kvctl gc STORE [--json [PATH]]
//   kvctl import STORE FILE (--model PRESET | --spec FILE) [--model-id ID] [--tokens-file F]
//                [--json [PATH]]
//   kvctl export STORE PREFIX OUT.safetensors [--json [PATH]]
//   kvctl replay STORE TRACE --model PRESET [--selector S] [--budget F] [--gpu-tier-bytes B]
//                [--cpu-tier-bytes B] [--no-put] [--speed X] [--json [PATH]]
// put, import and replay take --max-request-kv-bytes B: the most KV one request holds in memory.
//   kvctl remote-stats --remote HOST:PORT[,...] [--json [PATH]]
// put, lookup, replay and verify take --remote HOST:PORT[,...] too (docs/remote.md).
//
// Exit codes: 0 ok, 1 problems found (verify), 2 usage error, 3 I/O or store error (out of
// memory included: a request over --max-request-kv-bytes, or a failed allocation).
// Results go to stdout (a table, or one JSON object with --json; --json PATH writes the JSON to
// PATH instead, see tools/cli.h); errors and progress go to stderr: a bar on a terminal, plain
// lines otherwise (KVCTL_PROGRESS=bar|lines|off chooses).
//
// One file per command or family of commands (tools/kvctl/command.h); this one holds the
// command table and the parse.

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "tools/cli.h"
#include "tools/kvctl/command.h"

namespace ckv::kvctl {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"kvctl: create, populate and inspect ckv stores.", "kvctl"};
  cli::Configure(app,
                 "Run 'kvctl COMMAND --help' for a command's options.\n"
                 "Exit codes: 0 ok, 1 problems found, 2 usage error, 3 I/O or store error.");
  const std::vector<Command> commands = {
      AddInit(app),   AddPut(app),    AddLs(app),          AddShow(app),   AddStats(app),
      AddVerify(app), AddRm(app),     AddGc(app),          AddImport(app), AddExport(app),
      AddReplay(app), AddLookup(app), AddRemoteStats(app),
  };
  app.add_subcommand("help", "show this help, or 'kvctl help COMMAND' for one command");
  app.require_subcommand(1);
  const auto find = [&](std::string_view name) -> const Command* {
    for (const Command& c : commands) {
      if (c.app->get_name() == name) return &c;
    }
    return nullptr;
  };

  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "help") {
    if (argc < 3) {
      std::fputs(app.help().c_str(), stdout);
      return kExitOk;
    }
    const Command* c = find(argv[2]);
    if (c == nullptr) return UsageError("", "unknown command '" + std::string(argv[2]) + "'");
    std::fputs(c->app->help("kvctl").c_str(), stdout);
    return kExitOk;
  }
  if (!name.starts_with("-") && find(name) == nullptr) {
    return UsageError("", "unknown command '" + std::string(name) + "'");
  }
  if (const std::optional<int> exit = cli::Parse(app, argc, argv)) return *exit;
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    // The big buffers (a request's KV) turn a failed allocation into ResourceExhausted where they
    // are made; anything else that runs out of memory ends here, as exit 3 rather than abort.
    try {
      return c.run();
    } catch (const std::bad_alloc&) {
      return StoreError(c.app->get_name(),
                        absl::ResourceExhaustedError("out of memory (a memory limit such as "
                                                     "ulimit -v, or too little memory)"));
    }
  }
  return UsageError("", "no command given");
}

}  // namespace
}  // namespace ckv::kvctl

int main(int argc, char** argv) {
  // kvctl writes nothing outside the store and the paths it is given. The CUDA driver keeps a JIT
  // cache in $HOME/.nv/ComputeCache once the GPU tier touches a device; a user who names a cache
  // (CUDA_CACHE_PATH) or turns it on or off (CUDA_CACHE_DISABLE) keeps that choice.
  if (std::getenv("CUDA_CACHE_PATH") == nullptr) setenv("CUDA_CACHE_DISABLE", "1", 0);
  return ckv::kvctl::Main(argc, argv);
}
