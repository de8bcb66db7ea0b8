// SPDX-License-Identifier: Apache-2.0
// kvctl put: store a synthetic prefix and its KV; GeneratedKv, the KV that put and replay store.
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>

#include "absl/strings/str_cat.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/kvctl/progress.h"
#include "tools/synthetic_kv.h"

namespace ckv::kvctl {

absl::StatusOr<std::unique_ptr<GeneratedKv>> GeneratedKv::Generate(const ModelSpec& spec,
                                                                   std::span<const int32_t> tokens,
                                                                   bool progress) {
  const size_t c = spec.chunk_tokens;
  const size_t chunks = tokens.size() / c;
  const size_t token_bytes = spec.TokenBytesPerLayer();
  const size_t half = c * token_bytes;  // bytes of K (or V) of one chunk at one layer
  const size_t tensor_bytes = tokens.size() * token_bytes;
  std::unique_ptr<GeneratedKv> kv(new GeneratedKv());
  kv->total_bytes_ = 2 * tensor_bytes * spec.layers;
  std::vector<std::byte> record;
  std::vector<ChunkKey> keys;
  // Every buffer first: a request too large for this process's memory (ulimit -v, a small
  // machine) fails here, at once, rather than after generating most of it.
  try {
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      kv->k_.push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
      kv->v_.push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
    }
    record.resize(spec.DecodedRecordBytes());
    keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(absl::StrCat("the KV of ", tokens.size(), " tokens"), kv->total_bytes_);
  }

  std::optional<ProgressBar> bar;
  if (progress) bar.emplace("generate", kv->total_bytes_);
  kv->tensors_.tokens = tokens.size();
  uint64_t done = 0;
  for (uint32_t layer = 0; layer < spec.layers; ++layer) {
    std::byte* k = kv->k_[layer].get();
    std::byte* v = kv->v_[layer].get();
    for (size_t i = 0; i < chunks; ++i) {
      synth::FillRecord(spec, keys[i], layer, record);
      std::memcpy(k + i * half, record.data(), half);
      std::memcpy(v + i * half, record.data() + half, half);
      done += record.size();
      if (bar) bar->Update(done);
    }
    kv->tensors_.k.emplace_back(k, tensor_bytes);
    kv->tensors_.v.emplace_back(v, tensor_bytes);
  }
  if (bar) bar->Finish();
  return kv;
}

namespace {

struct PutOptions {
  std::string store;
  PresetOptions preset;
  uint64_t tokens = 0;
  uint64_t seed = 0;
  uint64_t shared_tokens = 0;
  uint64_t shared_seed = 0;
  bool shared = false;                // --shared-tokens and --shared-seed given
  std::string remote;                 // --remote: publish to this cluster too
  uint64_t max_request_kv_bytes = 0;  // --max-request-kv-bytes
  cli::JsonOutput json;
};

// Put's result: JSON (see tools/cli.h), then the text unless the JSON took its place.
int PrintPut(const PutOptions& o, const ModelSpec& spec, const PutResult& result, uint64_t kv_bytes,
             double gen_seconds, double put_seconds, const EngineStats& stats) {
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(o.store)
        .Key("prefix_id")
        .String(result.prefix_id.ToHex())
        .Key("model")
        .String(o.preset.model);
    WriteSpecJson(w, spec);
    w.Key("tokens").Uint(o.tokens).Key("seed").Uint(o.seed);
    if (o.shared) {
      w.Key("shared_tokens").Uint(o.shared_tokens).Key("shared_seed").Uint(o.shared_seed);
    }
    WritePutResultJson(w, result, kv_bytes);
    w.Key("generate_seconds").Double(gen_seconds).Key("put_seconds").Double(put_seconds);
    if (!o.remote.empty()) WriteRemoteJson(w, stats);
    w.EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf("put %s: %s, %llu tokens (%llu chunks)\n", result.prefix_id.ToHex().c_str(),
              spec.DebugString().c_str(), static_cast<unsigned long long>(o.tokens),
              static_cast<unsigned long long>(result.chunks));
  PrintPutResultLines(result, /*with_tail=*/false);
  std::printf(
      "  time                 generate %.2fs, put %.2fs (%s)\n", gen_seconds, put_seconds,
      FormatRate(put_seconds > 0 ? static_cast<double>(result.bytes_written) / put_seconds : 0)
          .c_str());
  if (!o.remote.empty()) PrintRemoteLine(stats);
  return kExitOk;
}

int RunPut(const PutOptions& o) {
  std::string error;
  ModelSpec spec;
  if (!PresetSpec(o.preset, &spec, &error)) return UsageError("put", error);
  if (o.tokens == 0 || o.tokens % spec.chunk_tokens != 0) {
    return UsageError("put", "--tokens: " + std::to_string(o.tokens) +
                                 " is not a positive multiple of the chunk size " +
                                 std::to_string(spec.chunk_tokens));
  }
  if (o.shared_tokens > o.tokens) {
    return UsageError("put", "--shared-tokens " + std::to_string(o.shared_tokens) +
                                 " is more than --tokens " + std::to_string(o.tokens));
  }
  // The prefix's KV is generated whole: refused here, before anything is allocated, when it is
  // over the limit (at most 1 TiB, which also keeps its size addressable on any host).
  if (absl::Status fits = CheckRequestKvBytes("the prefix", o.tokens, spec, o.max_request_kv_bytes);
      !fits.ok()) {
    return StoreError("put " + o.store, fits);
  }

  // Open first: a missing store is reported before generating gigabytes.
  auto engine = OpenExisting(o.store, o.remote);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());

  const auto gen_start = Clock::now();
  const std::vector<int32_t> tokens =
      o.shared ? synth::TokensWithSharedPrefix(o.shared_seed, o.shared_tokens, o.seed, o.tokens)
               : synth::Tokens(o.seed, o.tokens);
  auto generated = GeneratedKv::Generate(spec, tokens);
  if (!generated.ok()) return StoreError("put " + o.store, generated.status());
  const GeneratedKv& kv = **generated;
  const double gen_seconds = SecondsSince(gen_start);

  const auto put_start = Clock::now();
  absl::StatusOr<PutResult> result;
  {
    ElapsedTicker ticker("write " + FormatBytes(kv.bytes()));
    result = (*engine)->Put(spec, tokens, kv.tensors());
  }
  const double put_seconds = SecondsSince(put_start);
  if (!result.ok()) return StoreError("put " + o.store, result.status());
  // The Put is durable here; its chunks go to the cluster in the background: wait for them
  // before the process exits.
  if (!o.remote.empty() && !AwaitRemotePublished(**engine)) {
    std::fprintf(stderr, "kvctl: put: the remote tier had not published every chunk in 60 s\n");
  }
  return PrintPut(o, spec, *result, kv.bytes(), gen_seconds, put_seconds, (*engine)->Stats());
}

}  // namespace

Command AddPut(CLI::App& kvctl) {
  auto o = std::make_shared<PutOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "put", "Store a synthetic prefix of N tokens and its KV (see docs/generator.md).");
  cmd->footer(
      "Tokens come from --seed; with --shared-tokens K and --shared-seed S2 the first K tokens "
      "come\n"
      "from S2 instead, so prefixes that use the same S2 share their first K tokens, and the "
      "whole\n"
      "chunks among them are stored once (deduplicated). N must be a multiple of the chunk size.\n"
      "With --remote, the chunks are also published to that Redis Cluster (docs/remote.md); put\n"
      "waits for them before it exits (at most 60 s) and reports how many were published. A\n"
      "cluster that fails a whole call has the chunks queued behind it dropped, so a down or\n"
      "hostile cluster holds put for about one call timeout (500 ms), not one per batch.\n"
      "The prefix's KV is generated in memory whole: a prefix of more than\n"
      "--max-request-kv-bytes of KV is refused (exit 3) before anything is allocated.\n"
      "Example: kvctl put ./store --model qwen2.5-7b --tokens 4096 --seed 1");
  AddStoreArg(*cmd, &o->store);
  AddPresetOptions(*cmd, &o->preset);
  cli::AddUint(*cmd, "--tokens", &o->tokens,
               "prefix length in tokens; a multiple of the chunk size")
      ->required();
  cli::AddUint(*cmd, "--seed", &o->seed, "seed of the tokens", "S")->required();
  CLI::Option* shared_tokens =
      cli::AddUint(*cmd, "--shared-tokens", &o->shared_tokens,
                   "the first K tokens come from --shared-seed (K <= N)", "K");
  CLI::Option* shared_seed = cli::AddUint(*cmd, "--shared-seed", &o->shared_seed,
                                          "seed of the shared first K tokens", "S2");
  shared_tokens->needs(shared_seed);
  shared_seed->needs(shared_tokens);
  AddRemoteOption(*cmd, &o->remote);
  AddMaxRequestKvBytes(*cmd, &o->max_request_kv_bytes);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o, shared_tokens] {
            o->shared = shared_tokens->count() > 0;
            return RunPut(*o);
          }};
}

}  // namespace ckv::kvctl
