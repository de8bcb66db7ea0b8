// SPDX-License-Identifier: Apache-2.0
// tools/kvctl/command.h: what kvctl's commands share: the command table's entry, exit codes and
// error output, opening a store, the model options of put and replay, naming a stored prefix,
// and the --json output.
//
// Each command lives in its own file (or one file per family: inspect.cc holds ls, show and
// stats) and registers itself with an Add* function below, which declares its arguments on a
// CLI11 subcommand (tools/cli.h) and returns how to run it.
//
// kvctl uses the public API (include/ckv/) and tools/ (the synthetic generator, safetensors),
// with these exceptions: export reads a prefix's token ids from the catalog, which the Engine API
// does not expose (import_export.cc, ReadPrefixTokens); stats takes the CPU tier's summary share
// from engine/tier_cache.h, and writes --format prom with engine/metrics.h (StoreMetrics), so
// that its names are Engine::Metrics()'s.
#ifndef CKV_TOOLS_KVCTL_COMMAND_H_
#define CKV_TOOLS_KVCTL_COMMAND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/engine.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "ckv/stats.h"
#include "tools/cli.h"
#include "tools/json_writer.h"

namespace ckv::kvctl {

// Exit codes: 0 ok, 1 problems found (verify), 2 usage error, 3 I/O or store error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitProblems = 1;
inline constexpr int kExitUsage = cli::kExitUsage;
inline constexpr int kExitStoreError = cli::kExitError;

// One command: its CLI11 subcommand, and how to run it once the subcommand has been parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command AddInit(CLI::App& kvctl);         // init.cc
Command AddPut(CLI::App& kvctl);          // put.cc
Command AddLs(CLI::App& kvctl);           // inspect.cc
Command AddShow(CLI::App& kvctl);         // inspect.cc
Command AddStats(CLI::App& kvctl);        // stats.cc
Command AddVerify(CLI::App& kvctl);       // verify.cc
Command AddRm(CLI::App& kvctl);           // remove.cc
Command AddGc(CLI::App& kvctl);           // remove.cc
Command AddImport(CLI::App& kvctl);       // import_export.cc
Command AddExport(CLI::App& kvctl);       // import_export.cc
Command AddReplay(CLI::App& kvctl);       // replay.cc
Command AddLookup(CLI::App& kvctl);       // lookup.cc
Command AddRemoteStats(CLI::App& kvctl);  // remote_stats.cc

// "kvctl: MESSAGE" and "Run 'kvctl COMMAND --help' for usage." on stderr; returns kExitUsage.
int UsageError(const std::string& command, const std::string& message);
// "kvctl: WHAT: STATUS" on stderr; returns kExitStoreError.
int StoreError(const std::string& what, const absl::Status& status);
// Writes `w`'s JSON where `json` says (tools/cli.h). Returns kExitOk, else prints the error and
// returns kExitStoreError.
int EmitJson(const cli::JsonOutput& json, const tools::JsonWriter& w);

// The required positional STORE: a store's directory.
CLI::Option* AddStoreArg(CLI::App& app, std::string* store);
// The required positional PREFIX (show, rm, export).
CLI::Option* AddPrefixArg(CLI::App& app, std::string* prefix);

// Opens the store at `path`, which must exist; with `remote` (a --remote value), with the remote
// tier on that cluster (EngineOptions::remote, docs/remote.md).
absl::StatusOr<std::unique_ptr<Engine>> OpenExisting(const std::string& path,
                                                     const std::string& remote = "");
// Opens it read-only (Engine::OpenReadOnly): for the commands that only read (ls, show, stats,
// verify, lookup), which thus work while a serving process holds the store, and change nothing.
absl::StatusOr<std::unique_ptr<Engine>> OpenToRead(const std::string& path);
void WriteStatsJson(tools::JsonWriter& w, const EngineStats& s);
// A spec's model_id, dtype, codec (under `codec_key`) and chunk_tokens, as JSON keys.
void WriteSpecJson(tools::JsonWriter& w, const ModelSpec& spec,
                   std::string_view codec_key = "codec");

// --remote HOST:PORT[,HOST:PORT...] (put, lookup, replay, verify, remote-stats): any nodes of a
// Redis Cluster, the remote tier's seeds.
CLI::Option* AddRemoteOption(CLI::App& app, std::string* remote);
// Sets options->remote.seeds from a --remote value (nothing when it is empty).
void ApplyRemote(const std::string& remote, EngineOptions* options);
// After a command's Puts with --remote: waits (up to 60 s) until the remote tier has published
// what they queued. False on timeout.
bool AwaitRemotePublished(Engine& engine);
// The remote tier's figures: as a "remote" JSON object, and as one text line
// ("  remote               published 12 chunks (2.3 MiB), fetched 0, ...").
void WriteRemoteJson(tools::JsonWriter& w, const EngineStats& s);
void PrintRemoteLine(const EngineStats& s);
// The fields of a Put's result that put and import both report: as JSON keys (kv_bytes, chunks,
// chunks_written, ...), and as the lines of the table under the command's first line.
void WritePutResultJson(tools::JsonWriter& w, const PutResult& result, uint64_t kv_bytes);
void PrintPutResultLines(const PutResult& result, bool with_tail);

// --max-request-kv-bytes BYTES (put, import, replay): the most KV one request may hold in memory
// (tokens x the model's K+V bytes per token, all layers), checked before it is allocated. Put
// generates a prefix's KV whole, import reads a file's whole, replay generates each request's
// whole; each refuses a request over the limit with ResourceExhausted (exit 3) naming both.
// Default: 8 GiB, or half the machine's physical memory where that is less. At most 1 TiB.
inline constexpr uint64_t kMaxRequestKvBytesCeiling = uint64_t{1} << 40;
uint64_t DefaultMaxRequestKvBytes();
CLI::Option* AddMaxRequestKvBytes(CLI::App& app, uint64_t* limit);
// OK when `tokens` of `spec` are at most `limit` bytes of KV; else ResourceExhausted
// "WHAT: N tokens, X of KV (B per token of MODEL), over the limit of Y per request
// (--max-request-kv-bytes): ...".
absl::Status CheckRequestKvBytes(std::string_view what, uint64_t tokens, const ModelSpec& spec,
                                 uint64_t limit);
// ResourceExhausted for a std::bad_alloc caught while allocating `bytes` for `what`.
absl::Status OutOfMemory(std::string_view what, uint64_t bytes);

// --model PRESET (required), --dtype, --model-id, --chunk-tokens and --codec, as put and replay
// take them.
struct PresetOptions {
  std::string model;
  std::string dtype = "fp16";
  std::string model_id;  // empty: the preset's name
  uint64_t chunk_tokens = 16;
  std::string codec = "none";  // ckv/codec.h
};
void AddPresetOptions(CLI::App& app, PresetOptions* options);
// The spec the options name. Returns false with `*error` set on a usage error.
bool PresetSpec(const PresetOptions& options, ModelSpec* spec, std::string* error);
// The --model option's help: the preset names.
std::string ModelHelp();

// Checks and lower-cases a PREFIX argument: 1 to 32 hex digits, the id 'kvctl ls' prints (its
// first 16 digits) or any leading part of the full id. Returns false with `*error` set.
bool NormalizePrefixArg(std::string* wanted, std::string* error);
// The one stored prefix whose id starts with `wanted` (normalized). Returns kExitOk with `*id`
// set, else prints the error and returns its exit code: 3 when none matches (the store does not
// hold it), 2 when several do (the argument is too short).
int FindPrefix(Engine& engine, const std::string& command, const std::string& store,
               const std::string& wanted, ChunkKey* id);

// The KV of `tokens` (whole chunks only) laid out as ckv/kv.h says, generated record by record
// with synth::FillRecord so that generation can show progress. For whole chunks this is exactly
// what synth::SyntheticKv generates: a record is a pure function of (chunk key, layer, spec).
// put.cc.
class GeneratedKv {
 public:
  // Allocates every tensor first, then generates: a failed allocation is ResourceExhausted
  // (OutOfMemory), before any time is spent generating. `progress`: show the generation's
  // progress (see ProgressBar).
  static absl::StatusOr<std::unique_ptr<GeneratedKv>> Generate(const ModelSpec& spec,
                                                               std::span<const int32_t> tokens,
                                                               bool progress = true);

  const KvTensors& tensors() const { return tensors_; }
  uint64_t bytes() const { return total_bytes_; }

 private:
  GeneratedKv() = default;

  std::vector<std::unique_ptr<std::byte[]>> k_, v_;
  KvTensors tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace ckv::kvctl

#endif  // CKV_TOOLS_KVCTL_COMMAND_H_
