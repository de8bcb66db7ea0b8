// SPDX-License-Identifier: Apache-2.0
// kvctl lookup: how many leading chunks of a token sequence a store holds, and where the chain
// breaks. Opens the store read-only, so it answers while a serving process holds the store.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ckv/log.h"
#include "tools/kvctl/command.h"
#include "tools/safetensors.h"

namespace ckv::kvctl {
namespace {

struct LookupOptions {
  std::string store;
  PresetOptions preset;
  std::string tokens_file;
  std::string remote;  // --remote: fill a local miss from this cluster
  cli::JsonOutput json;
};

int RunLookup(const LookupOptions& o) {
  ModelSpec spec;
  if (std::string error; !PresetSpec(o.preset, &spec, &error)) return UsageError("lookup", error);
  auto tokens = safetensors::ReadTokenIdsFile(o.tokens_file);
  if (!tokens.ok()) return StoreError("lookup --tokens-file", tokens.status());
  // With --remote, the store is opened for writing: what the cluster holds past the local
  // chunks is fetched into it.
  auto engine = o.remote.empty() ? OpenToRead(o.store) : OpenExisting(o.store, o.remote);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());
  auto stored = (*engine)->Lookup(spec, *tokens);
  if (!stored.ok()) return StoreError("lookup in " + o.store, stored.status());
  const uint64_t c = spec.chunk_tokens;
  const uint64_t chunks = tokens->size() / c;
  const bool whole = *stored == chunks;
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(o.store)
        .Key("model_id")
        .String(spec.model_id)
        .Key("tokens")
        .Uint(tokens->size())
        .Key("chunks")
        .Uint(chunks)
        .Key("stored_chunks")
        .Uint(*stored)
        .Key("stored_tokens")
        .Uint(*stored * c)
        .Key("breaks_at_chunk");
    if (whole) {
      w.Null();
    } else {
      w.Uint(*stored);
    }
    if (!o.remote.empty()) WriteRemoteJson(w, (*engine)->Stats());
    w.EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf("%llu of %llu chunks stored (%llu of %zu tokens) under %s\n",
              static_cast<unsigned long long>(*stored), static_cast<unsigned long long>(chunks),
              static_cast<unsigned long long>(*stored * c), tokens->size(),
              Printable(spec.model_id).c_str());
  if (!whole) {
    std::printf("  the chain breaks at chunk %llu (tokens %llu..%llu): not stored\n",
                static_cast<unsigned long long>(*stored),
                static_cast<unsigned long long>(*stored * c),
                static_cast<unsigned long long>((*stored + 1) * c - 1));
  }
  if (!o.remote.empty()) PrintRemoteLine((*engine)->Stats());
  if (tokens->size() % c != 0) {
    std::printf("  the last %llu tokens are not a whole chunk and are never stored\n",
                static_cast<unsigned long long>(tokens->size() % c));
  }
  return kExitOk;
}

}  // namespace

Command AddLookup(CLI::App& kvctl) {
  auto o = std::make_shared<LookupOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "lookup",
      "How many leading chunks of a token sequence the store holds, and where the chain "
      "breaks.");
  cmd->footer(
      "The tokens come from F, a JSON array of integers (as 'kvctl import --tokens-file'); the\n"
      "model options name the spec the chunks were stored under (as 'kvctl put': the model id\n"
      "is part of every chunk key). Opens the store read-only: it works while a serving process\n"
      "holds the store, and sees what was committed when it opened. With --remote, it opens the\n"
      "store for writing and fills a local miss from that Redis Cluster: the chunks that continue\n"
      "the chain there are fetched, verified and stored (docs/remote.md).\n"
      "Example: kvctl lookup ./store --model qwen2.5-7b --tokens-file prompt.json");
  AddStoreArg(*cmd, &o->store);
  AddPresetOptions(*cmd, &o->preset);
  cmd->add_option("--tokens-file", o->tokens_file, "token ids from F, a JSON array of integers")
      ->required()
      ->type_name("F");
  AddRemoteOption(*cmd, &o->remote);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunLookup(*o); }};
}

}  // namespace ckv::kvctl
