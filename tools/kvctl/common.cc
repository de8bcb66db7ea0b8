// SPDX-License-Identifier: Apache-2.0
// What kvctl's commands share (command.h).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ckv/codec.h"
#include "ckv/log.h"
#include "ckv/options.h"
#include "engine/internal.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/store_stats_json.h"

namespace ckv::kvctl {

int UsageError(const std::string& command, const std::string& message) {
  return cli::UsageError("kvctl", message, command.empty() ? "kvctl" : "kvctl " + command);
}

int StoreError(const std::string& what, const absl::Status& status) {
  // Both may quote a file, a store or a server (a model id, a trace's label, a node's reply).
  std::fprintf(stderr, "kvctl: %s: %s\n", Printable(what).c_str(),
               Printable(status.ToString()).c_str());
  return kExitStoreError;
}

int EmitJson(const cli::JsonOutput& json, const tools::JsonWriter& w) {
  if (absl::Status s = json.Write(w.str()); !s.ok()) return StoreError("--json", s);
  return kExitOk;
}

CLI::Option* AddStoreArg(CLI::App& app, std::string* store) {
  return app.add_option("STORE", *store, "the store's directory")->required()->type_name("");
}

CLI::Option* AddPrefixArg(CLI::App& app, std::string* prefix) {
  return app
      .add_option("PREFIX", *prefix,
                  "a stored prefix's id as 'kvctl ls' prints it, or any leading part of it")
      ->required()
      ->type_name("");
}

absl::StatusOr<std::unique_ptr<Engine>> OpenExisting(const std::string& path,
                                                     const std::string& remote) {
  EngineOptions options;
  options.create_if_missing = false;
  ApplyRemote(remote, &options);
  return Engine::Open(options, path);
}

CLI::Option* AddRemoteOption(CLI::App& app, std::string* remote) {
  return app
      .add_option("--remote", *remote,
                  "the remote tier: any nodes of a Redis Cluster, HOST:PORT[,HOST:PORT...] "
                  "(docs/remote.md)")
      ->type_name("HOST:PORT");
}

void ApplyRemote(const std::string& remote, EngineOptions* options) {
  if (remote.empty()) return;
  size_t start = 0;
  while (start <= remote.size()) {
    size_t end = remote.find(',', start);
    if (end == std::string::npos) end = remote.size();
    options->remote.seeds.push_back(remote.substr(start, end - start));
    start = end + 1;
  }
}

bool AwaitRemotePublished(Engine& engine) {
  return engine::WaitUntilRemotePublished(engine, absl::Seconds(60));
}

namespace {

// Field `name` of EngineStats under its name without "remote_", when it has that prefix.
template <typename T>
void RemoteField(tools::JsonWriter& w, std::string_view name, T value) {
  constexpr std::string_view kPrefix = "remote_";
  if (!name.starts_with(kPrefix)) return;
  w.Key(name.substr(kPrefix.size()));
  if constexpr (std::is_same_v<T, bool>) {
    w.Bool(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    w.Double(value);
  } else {
    w.Uint(value);
  }
}

}  // namespace

void WriteSpecJson(tools::JsonWriter& w, const ModelSpec& spec, std::string_view codec_key) {
  w.Key("model_id")
      .String(spec.model_id)
      .Key("dtype")
      .String(DTypeName(spec.dtype))
      .Key(codec_key)
      .String(KvCodecName(spec.codec))
      .Key("chunk_tokens")
      .Uint(spec.chunk_tokens);
}

void WriteRemoteJson(tools::JsonWriter& w, const EngineStats& s) {
  // Every remote_* figure of CKV_ENGINE_STATS_FIELDS (include/ckv/stats.h), in its order.
  w.Key("remote").BeginObject();
#define CKV_REMOTE_FIELD_(type, name, kind, scope, metric, help) RemoteField(w, #name, s.name);
  CKV_ENGINE_STATS_FIELDS(CKV_REMOTE_FIELD_)
#undef CKV_REMOTE_FIELD_
  w.EndObject();
}

void PrintRemoteLine(const EngineStats& s) {
  std::printf(
      "  remote               published %llu chunks (%s), %llu failed, %llu dropped; "
      "fetched %llu chunks (%s), %llu corrupt; %llu errors (%llu timeouts)\n",
      static_cast<unsigned long long>(s.remote_published_chunks),
      FormatBytes(s.remote_published_bytes).c_str(),
      static_cast<unsigned long long>(s.remote_publish_failures),
      static_cast<unsigned long long>(s.remote_publish_dropped),
      static_cast<unsigned long long>(s.remote_fetched_chunks),
      FormatBytes(s.remote_fetched_bytes).c_str(),
      static_cast<unsigned long long>(s.remote_corrupt_chunks),
      static_cast<unsigned long long>(s.remote_errors),
      static_cast<unsigned long long>(s.remote_timeouts));
}

absl::StatusOr<std::unique_ptr<Engine>> OpenToRead(const std::string& path) {
  return Engine::OpenReadOnly(EngineOptions{}, path);
}

void WritePutResultJson(tools::JsonWriter& w, const PutResult& result, uint64_t kv_bytes) {
  w.Key("kv_bytes")
      .Uint(kv_bytes)
      .Key("chunks")
      .Uint(result.chunks)
      .Key("chunks_written")
      .Uint(result.chunks_written)
      .Key("chunks_deduplicated")
      .Uint(result.chunks_existing)
      .Key("tail_tokens")
      .Uint(result.tail_tokens)
      .Key("bytes_written")
      .Uint(result.bytes_written)
      .Key("chunks_evicted")
      .Uint(result.chunks_evicted);
}

void PrintPutResultLines(const PutResult& result, bool with_tail) {
  std::printf("  chunks written       %llu (%s)\n",
              static_cast<unsigned long long>(result.chunks_written),
              FormatBytes(result.bytes_written).c_str());
  std::printf("  chunks deduplicated  %llu (already stored)\n",
              static_cast<unsigned long long>(result.chunks_existing));
  if (with_tail) {
    std::printf("  tail tokens          %llu (not stored: less than a chunk)\n",
                static_cast<unsigned long long>(result.tail_tokens));
  }
  std::printf("  chunks evicted       %llu\n",
              static_cast<unsigned long long>(result.chunks_evicted));
}

void WriteStatsJson(tools::JsonWriter& w, const EngineStats& s) {
  w.BeginObject();
  tools::WriteStoreStatsMembers(w, s);
  w.EndObject();
}

uint64_t DefaultMaxRequestKvBytes() {
  constexpr uint64_t kDefault = uint64_t{8} << 30;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return kDefault;
  const uint64_t half = static_cast<uint64_t>(pages) / 2 * static_cast<uint64_t>(page_bytes);
  return std::min(kDefault, half);
}

CLI::Option* AddMaxRequestKvBytes(CLI::App& app, uint64_t* limit) {
  *limit = DefaultMaxRequestKvBytes();
  return cli::AddParsed(
      app, "--max-request-kv-bytes",
      "most KV one request may hold in memory, refused before it is allocated (default: 8 GiB "
      "or half the physical memory, whichever is less; here " +
          FormatBytes(*limit) + ")",
      "BYTES", "a byte count up to 1T (an integer, optionally with a K/M/G/T suffix)",
      [limit](const std::string& text) {
        uint64_t v = 0;
        if (!cli::ParseBytes(text, &v) || v > kMaxRequestKvBytesCeiling) return false;
        *limit = v;
        return true;
      });
}

absl::Status CheckRequestKvBytes(std::string_view what, uint64_t tokens, const ModelSpec& spec,
                                 uint64_t limit) {
  uint64_t kv_bytes = 0;
  const bool overflow = __builtin_mul_overflow(tokens, spec.KvBytesPerToken(), &kv_bytes);
  if (!overflow && kv_bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      std::string(what), ": ", tokens, " tokens, ",
      overflow ? std::string("more than 2^64 bytes") : FormatBytes(kv_bytes), " of KV (",
      FormatBytes(spec.KvBytesPerToken()), " per token of ", spec.model_id, "), over the limit of ",
      FormatBytes(limit),
      " per request (--max-request-kv-bytes): a request's KV is held in memory whole"));
}

absl::Status OutOfMemory(std::string_view what, uint64_t bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "out of memory allocating ", FormatBytes(bytes), " for ", std::string(what),
      " (a memory limit such as ulimit -v, or too little memory: lower --max-request-kv-bytes)"));
}

std::string ModelHelp() {
  std::string list;
  for (const std::string& p : ModelSpec::PresetNames()) list += (list.empty() ? "" : ", ") + p;
  return "model shape: " + list;
}

void AddPresetOptions(CLI::App& app, PresetOptions* options) {
  app.add_option("--model", options->model, ModelHelp())->required()->type_name("PRESET");
  app.add_option("--dtype", options->dtype, "element type: fp16 (default), bf16, fp32")
      ->type_name("T");
  app.add_option("--model-id", options->model_id,
                 "model id bound into every chunk key (default: the preset name)")
      ->type_name("ID");
  cli::AddUint(app, "--chunk-tokens", &options->chunk_tokens, "tokens per chunk (default 16)", "C");
  app.add_option("--codec", options->codec,
                 "how records are stored: none (the dtype, default), fp8, int8, int4; another "
                 "codec is another spec")
      ->type_name("CODEC");
}

bool PresetSpec(const PresetOptions& options, ModelSpec* spec, std::string* error) {
  auto dtype = ParseDType(options.dtype);
  if (!dtype.ok()) {
    *error = "--dtype: '" + options.dtype + "' is not fp16, bf16 or fp32";
    return false;
  }
  const std::vector<std::string> presets = ModelSpec::PresetNames();
  if (std::find(presets.begin(), presets.end(), options.model) == presets.end()) {
    std::string list;
    for (const std::string& p : presets) list += (list.empty() ? "" : ", ") + p;
    *error = "--model: unknown preset '" + options.model + "' (known: " + list + ")";
    return false;
  }
  if (options.chunk_tokens == 0 || options.chunk_tokens > 4096) {
    *error = "--chunk-tokens: " + std::to_string(options.chunk_tokens) + " is out of range 1..4096";
    return false;
  }
  auto spec_or =
      ModelSpec::Preset(options.model, *dtype, static_cast<uint32_t>(options.chunk_tokens));
  if (!spec_or.ok()) {
    *error = std::string(spec_or.status().message());
    return false;
  }
  *spec = *std::move(spec_or);
  if (!options.model_id.empty()) spec->model_id = options.model_id;
  absl::StatusOr<KvCodec> codec = ParseKvCodec(options.codec);
  if (!codec.ok()) {
    *error = "--codec: " + std::string(codec.status().message());
    return false;
  }
  spec->codec = *codec;
  if (absl::Status valid = spec->Validate(); !valid.ok()) {
    *error = std::string(valid.message());
    return false;
  }
  return true;
}

bool NormalizePrefixArg(std::string* wanted, std::string* error) {
  if (wanted->empty() || wanted->size() > 32 ||
      !std::all_of(wanted->begin(), wanted->end(),
                   [](unsigned char c) { return std::isxdigit(c) != 0; })) {
    *error = "PREFIX: '" + *wanted +
             "' is not a prefix id (1 to 32 hex digits, as 'kvctl ls' prints it)";
    return false;
  }
  std::transform(wanted->begin(), wanted->end(), wanted->begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return true;
}

int FindPrefix(Engine& engine, const std::string& command, const std::string& store,
               const std::string& wanted, ChunkKey* id) {
  std::vector<ChunkKey> matches;
  for (const PrefixInfo& p : engine.ListPrefixes()) {
    if (p.id.ToHex().rfind(wanted, 0) == 0) matches.push_back(p.id);
  }
  if (matches.empty()) {
    return StoreError(command + " " + store,
                      absl::NotFoundError("no stored prefix id starts with " + wanted));
  }
  if (matches.size() > 1) {
    return UsageError(command, "PREFIX " + wanted +
                                   " is ambiguous: " + std::to_string(matches.size()) +
                                   " stored prefix ids start with it; give more digits");
  }
  *id = matches[0];
  return kExitOk;
}

}  // namespace ckv::kvctl
