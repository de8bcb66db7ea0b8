// SPDX-License-Identifier: Apache-2.0
// kvctl import and export: a prefix's token ids and KV from and to a safetensors file.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "ckv/codec.h"
#include "ckv/log.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "storage/catalog.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/kvctl/progress.h"
#include "tools/model_spec_json.h"
#include "tools/safetensors.h"

namespace ckv::kvctl {
namespace {

// ---------------------------------------------------------------------------------------------
// kvctl import

struct ImportOptions {
  std::string store;
  std::string file;
  std::string model;                  // --model PRESET, or
  std::string spec_file;              // --spec SPEC.json
  std::string model_id;               // --model-id; empty: see the footer
  std::string tokens_file;            // --tokens-file
  std::string codec = "none";         // --codec: how the store keeps the records (ckv/codec.h)
  uint64_t max_request_kv_bytes = 0;  // --max-request-kv-bytes
  cli::JsonOutput json;
};

int PrintImport(const ImportOptions& o, const safetensors::ImportedKv& imported,
                const PutResult& result, double read_seconds, double put_seconds) {
  const ModelSpec& spec = imported.spec;
  const uint64_t tokens = imported.token_ids.size();
  const uint64_t kv_bytes = tokens * spec.KvBytesPerToken();
  const bool heads_first = imported.file_layout == safetensors::KvLayout::kHeadsFirst;
  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(o.store)
        .Key("file")
        .String(o.file)
        .Key("prefix_id")
        .String(result.prefix_id.ToHex());
    WriteSpecJson(w, spec);
    w.Key("tokens")
        .Uint(tokens)
        .Key("layout")
        .String(heads_first ? "heads-first" : "tokens-first")
        .Key("layout_ambiguous")
        .Bool(imported.layout_ambiguous);
    WritePutResultJson(w, result, kv_bytes);
    w.Key("read_seconds").Double(read_seconds).Key("put_seconds").Double(put_seconds).EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  // The model id may come from FILE's metadata: shown, not obeyed.
  std::printf("imported %s from %s: %s, %llu tokens (%llu chunks)\n",
              result.prefix_id.ToHex().c_str(), Printable(o.file).c_str(),
              Printable(spec.DebugString()).c_str(), static_cast<unsigned long long>(tokens),
              static_cast<unsigned long long>(result.chunks));
  PrintPutResultLines(result, /*with_tail=*/true);
  std::printf(
      "  layout               %s%s\n",
      heads_first ? "[kv_heads, tokens, head_dim], transposed" : "[tokens, kv_heads, head_dim]",
      imported.layout_ambiguous ? " (tokens == kv_heads: both layouts fit; read as tokens-first)"
                                : "");
  std::printf(
      "  time                 read %.2fs, put %.2fs (%s)\n", read_seconds, put_seconds,
      FormatRate(put_seconds > 0 ? static_cast<double>(result.bytes_written) / put_seconds : 0)
          .c_str());
  return kExitOk;
}

int RunImport(const ImportOptions& o) {
  // The spec, and which of its fields the file may fill in (see the footer).
  tools::ModelSpecJson given;
  if (!o.model.empty()) {
    auto spec = ModelSpec::Preset(o.model);
    if (!spec.ok()) return UsageError("import", "--model: " + std::string(spec.status().message()));
    given.spec = *std::move(spec);
  } else {
    auto spec = tools::ReadModelSpecFile(o.spec_file);
    if (!spec.ok()) return StoreError("import --spec", spec.status());
    given = *std::move(spec);
  }
  absl::StatusOr<KvCodec> codec = ParseKvCodec(o.codec);
  if (!codec.ok()) return UsageError("import", "--codec: " + std::string(codec.status().message()));
  given.spec.codec = *codec;
  safetensors::ImportOptions options;
  options.max_kv_bytes = o.max_request_kv_bytes;
  options.max_kv_bytes_name = "--max-request-kv-bytes: the file's KV is held in memory whole";
  options.dtype_from_file = !given.has_dtype;
  options.chunk_tokens_from_file = !given.has_chunk_tokens;
  options.model_id_from_file = !o.model.empty();
  if (!o.model_id.empty()) {
    given.spec.model_id = o.model_id;
    options.model_id_from_file = false;
    if (absl::Status valid = given.spec.Validate(); !valid.ok()) {
      return UsageError("import", "--model-id: " + std::string(valid.message()));
    }
  }

  auto engine = OpenExisting(o.store);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());
  if (!o.tokens_file.empty()) {
    auto ids = safetensors::ReadTokenIdsFile(o.tokens_file);
    if (!ids.ok()) return StoreError("import --tokens-file", ids.status());
    options.token_ids = *std::move(ids);
  }

  const auto read_start = Clock::now();
  auto reader = safetensors::Reader::OpenFile(o.file);
  if (!reader.ok()) return StoreError("import " + o.file, reader.status());
  ProgressFnBar bar("read");
  options.progress = bar.fn();
  auto imported = safetensors::ImportKv(**reader, given.spec, options);
  bar.Finish();
  if (!imported.ok()) return StoreError("import " + o.file, imported.status());
  const double read_seconds = SecondsSince(read_start);
  const uint64_t kv_bytes = imported->token_ids.size() * imported->spec.KvBytesPerToken();

  const auto put_start = Clock::now();
  absl::StatusOr<PutResult> result;
  {
    ElapsedTicker ticker("write " + FormatBytes(kv_bytes));
    result = (*engine)->Put(imported->spec, imported->token_ids, imported->kv);
  }
  const double put_seconds = SecondsSince(put_start);
  if (!result.ok()) return StoreError("import " + o.file, result.status());
  return PrintImport(o, *imported, *result, read_seconds, put_seconds);
}

// ---------------------------------------------------------------------------------------------
// kvctl export

struct ExportOptions {
  std::string store;
  std::string prefix;
  std::string out;
  cli::JsonOutput json;
};

// The token ids of the chunks `keys` of a prefix stored under `spec`, from the catalog of the
// store at `store`. The Engine API does not return token ids, so export reads them here, with
// the Engine closed (RocksDB admits one opener at a time). Chunk keys hash the tokens, so the
// ids are checked against the keys: they are the ones the records were stored under.
absl::StatusOr<std::vector<int32_t>> ReadPrefixTokens(const std::string& store,
                                                      const ModelSpec& spec,
                                                      const std::vector<ChunkKey>& keys) {
  storage::Catalog::Contents contents;
  // The catalog's directory in a store: docs/format.md.
  auto catalog = storage::Catalog::Open(store + "/catalog", /*create_if_missing=*/false,
                                        /*error_if_exists=*/false, &contents);
  if (!catalog.ok()) return catalog.status();
  std::vector<int32_t> tokens;
  tokens.reserve(keys.size() * spec.chunk_tokens);
  for (const ChunkKey& key : keys) {
    auto chunk = (*catalog)->GetChunk(key);
    if (!chunk.ok()) return chunk.status();
    tokens.insert(tokens.end(), chunk->tokens.begin(), chunk->tokens.end());
  }
  if (ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens) != keys) {
    return absl::DataLossError("the catalog's token ids of prefix " + keys.back().ToHex() +
                               " do not hash to its chunk keys");
  }
  return tokens;
}

// Fails before reading the whole prefix when OUT cannot be written where it is asked for.
absl::Status CheckOutPath(const std::string& out) {
  std::error_code ec;
  std::string dir = std::filesystem::path(out).parent_path().string();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError("directory " + dir + " does not exist");
  }
  if (std::filesystem::is_directory(out, ec)) {
    return absl::InvalidArgumentError(out + " is a directory, not a file name");
  }
  return absl::OkStatus();
}

// K and V of every layer, [tokens, kv_heads, head_dim], from the records (K then V of one chunk
// at one layer), into `buffers`. Layer by layer: a layer's records of consecutive chunks are
// adjacent in layer-major segments. On an error, `*failed_record` names the record ("record
// 3/L0").
absl::StatusOr<KvTensors> ReadPrefixKv(Engine& engine, const ModelSpec& spec,
                                       const std::vector<ChunkKey>& keys,
                                       std::vector<std::unique_ptr<std::byte[]>>* buffers,
                                       std::string* failed_record) {
  const size_t tokens = keys.size() * spec.chunk_tokens;
  const size_t half = spec.DecodedRecordBytes() / 2;
  const size_t tensor_bytes = tokens * spec.TokenBytesPerLayer();
  KvTensors kv;
  kv.tokens = tokens;
  std::vector<std::byte> record, decoded;  // decoded: a codec's record in the dtype
  // Every buffer before any read: a prefix too large for this process's memory fails at once.
  try {
    record.resize(spec.RecordBytes());
    decoded.resize(spec.DecodedRecordBytes());
    for (uint32_t i = 0; i < 2 * spec.layers; ++i) {
      buffers->push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
    }
  } catch (const std::bad_alloc&) {
    buffers->clear();
    return OutOfMemory("the prefix's KV", uint64_t{2} * spec.layers * tensor_bytes);
  }
  ProgressBar bar("read", uint64_t{spec.layers} * keys.size() * record.size());
  uint64_t done = 0;
  for (uint32_t layer = 0; layer < spec.layers; ++layer) {
    std::byte* k = (*buffers)[2 * layer].get();
    std::byte* v = (*buffers)[2 * layer + 1].get();
    for (size_t i = 0; i < keys.size(); ++i) {
      const absl::Status read = engine.ReadRecord(spec, keys[i], layer, record);
      if (!read.ok()) {
        *failed_record = "record " + std::to_string(i) + "/L" + std::to_string(layer);
        return read;
      }
      // Exported in the dtype whatever the codec: a file any reader takes.
      CKV_RETURN_IF_ERROR(DecodeRecord(spec, record, decoded));
      std::memcpy(k + i * half, decoded.data(), half);
      std::memcpy(v + i * half, decoded.data() + half, half);
      done += record.size();
      bar.Update(done);
    }
    kv.k.emplace_back(k, tensor_bytes);
    kv.v.emplace_back(v, tensor_bytes);
  }
  return kv;
}

int RunExport(const ExportOptions& o) {
  std::string wanted = o.prefix;
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("export", error);
  if (absl::Status s = CheckOutPath(o.out); !s.ok()) return StoreError("export " + o.out, s);

  auto engine = OpenToRead(o.store);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());
  ChunkKey prefix_id;
  if (const int code = FindPrefix(**engine, "export", o.store, wanted, &prefix_id);
      code != kExitOk) {
    return code;
  }
  ModelSpec spec;
  auto keys = (*engine)->PrefixChunks(prefix_id, &spec);
  if (!keys.ok()) return StoreError("export " + prefix_id.ToHex(), keys.status());

  const auto read_start = Clock::now();
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  std::string failed_record;
  auto kv = ReadPrefixKv(**engine, spec, *keys, &buffers, &failed_record);
  if (!kv.ok())
    return StoreError("export " + prefix_id.ToHex() + ": " + failed_record, kv.status());
  engine->reset();  // ReadPrefixTokens opens the catalog
  auto token_ids = ReadPrefixTokens(o.store, spec, *keys);
  if (!token_ids.ok()) return StoreError("export " + prefix_id.ToHex(), token_ids.status());
  const double read_seconds = SecondsSince(read_start);

  const auto write_start = Clock::now();
  ProgressFnBar bar("write");
  const absl::Status written = safetensors::ExportKv(o.out, spec, *token_ids, *kv, bar.fn());
  bar.Finish();
  if (!written.ok()) return StoreError("export " + o.out, written);
  const double write_seconds = SecondsSince(write_start);
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(o.out, ec);
  const size_t tokens = kv->tokens;
  const uint64_t kv_bytes = 2 * uint64_t{spec.layers} * tokens * spec.TokenBytesPerLayer();

  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store")
        .String(o.store)
        .Key("prefix_id")
        .String(prefix_id.ToHex())
        .Key("file")
        .String(o.out);
    WriteSpecJson(w, spec, "stored_codec");
    w.Key("tokens")
        .Uint(tokens)
        .Key("chunks")
        .Uint(keys->size())
        .Key("kv_bytes")
        .Uint(kv_bytes)
        .Key("file_bytes")
        .Uint(file_bytes)
        .Key("read_seconds")
        .Double(read_seconds)
        .Key("write_seconds")
        .Double(write_seconds)
        .EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf("exported %s to %s: %s, %zu tokens (%zu chunks), %s\n", prefix_id.ToHex().c_str(),
              Printable(o.out).c_str(), Printable(spec.DebugString()).c_str(), tokens, keys->size(),
              FormatBytes(file_bytes).c_str());
  std::printf("  time                 read %.2fs, write %.2fs\n", read_seconds, write_seconds);
  return kExitOk;
}

}  // namespace

Command AddImport(CLI::App& kvctl) {
  auto o = std::make_shared<ImportOptions>();
  CLI::App* cmd =
      kvctl.add_subcommand("import", "Store the KV of a prefix read from a safetensors file.");
  cmd->footer(
      "FILE holds token_ids (I32 or I64, [tokens]) and, for every layer l of the model,\n"
      "layers.{l}.key and layers.{l}.value, each [tokens, kv_heads, head_dim] or each\n"
      "[kv_heads, tokens, head_dim] (detected from the shapes; tokens-first when tokens ==\n"
      "kv_heads), all F16, all BF16 or all F32. The whole chunks are stored (those stored already\n"
      "are not written again); a tail shorter than a chunk is not.\n"
      "What the options leave open comes from FILE: the dtype from its tensors, the model id and\n"
      "the chunk size from its __metadata__ (as 'kvctl export' writes them), else the preset's\n"
      "name and 16. A --spec file is a JSON object of ModelSpec's fields: model_id, layers,\n"
      "q_heads, kv_heads, head_dim (required), dtype and chunk_tokens (optional; a dtype given\n"
      "must be FILE's). With --tokens-file the token ids come from F, a JSON array of integers,\n"
      "and FILE must hold no token_ids. A malformed FILE, spec or token file exits 3 with the\n"
      "store unchanged. The prefix's whole KV is held in memory while it is stored (about\n"
      "FILE's size; the store takes a prefix in one Put): a FILE of more than\n"
      "--max-request-kv-bytes of KV is refused (exit 3) before its KV is read.\n"
      "Example: kvctl import ./store prefix.safetensors --model qwen2.5-7b");
  AddStoreArg(*cmd, &o->store);
  cmd->add_option("FILE", o->file, "the safetensors file")->required()->type_name("");
  CLI::Option* model = cmd->add_option("--model", o->model, ModelHelp())->type_name("PRESET");
  CLI::Option* spec = cmd->add_option("--spec", o->spec_file,
                                      "model shape from a JSON spec file instead of a preset")
                          ->type_name("SPEC.json");
  cmd->add_option("--model-id", o->model_id,
                  "model id bound into every chunk key (default: see below)")
      ->type_name("ID");
  cmd->add_option("--tokens-file", o->tokens_file, "token ids from F, a JSON array of integers")
      ->type_name("F");
  cmd->add_option("--codec", o->codec,
                  "store the records encoded: none (FILE's dtype, default), fp8, int8, int4 "
                  "(another codec is another spec)")
      ->type_name("CODEC");
  AddMaxRequestKvBytes(*cmd, &o->max_request_kv_bytes);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o, model, spec] {
            if ((model->count() > 0) == (spec->count() > 0)) {
              return UsageError("import", "import needs one of --model and --spec");
            }
            return RunImport(*o);
          }};
}

Command AddExport(CLI::App& kvctl) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "export", "Write a stored prefix's token ids and KV to a safetensors file.");
  cmd->footer(
      "PREFIX is a prefix id as 'kvctl ls' prints it (its first 16 hex digits), or any leading\n"
      "part of the full id ('kvctl ls --json' prints it whole) that names one stored prefix.\n"
      "Every record is read with its checksum verified. OUT holds token_ids (I32 [tokens]) and,\n"
      "for every layer l, layers.{l}.key and layers.{l}.value ([tokens, kv_heads, head_dim] in\n"
      "the store's dtype), with the model id, dtype and chunk size in its __metadata__: 'kvctl\n"
      "import' stores it back as the same chunks. OUT is written under a unique temporary name\n"
      "beside it (never through a link planted there), mode 0600, synced, and renamed.\n"
      "The prefix's whole KV is held in memory while OUT is written (about OUT's size).\n"
      "Example: kvctl export ./store 9f3c0a17b2d4e6f8 prefix.safetensors");
  AddStoreArg(*cmd, &o->store);
  AddPrefixArg(*cmd, &o->prefix);
  cmd->add_option("OUT", o->out, "the safetensors file to write (OUT.safetensors)")
      ->required()
      ->type_name("");
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunExport(*o); }};
}

}  // namespace ckv::kvctl
