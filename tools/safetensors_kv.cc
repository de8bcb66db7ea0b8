// SPDX-License-Identifier: Apache-2.0
// KV files in safetensors (tools/safetensors.h): a prefix's token ids and per-layer K and V,
// imported (ImportKv, ReadTokenIdsFile) and exported (ExportKv). The file format itself, the
// Reader and WriteFile, is in safetensors.cc.
#include <charconv>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_reader.h"
#include "tools/safetensors.h"
#include "tools/safetensors_internal.h"

namespace ckv::safetensors {

using internal::Quoted;
using internal::ShapeString;
using internal::Sv;
using internal::TensorError;

namespace {

// The ckv dtype of a K/V tensor's dtype; nullopt for the integer dtypes.
std::optional<DType> KvDtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF16:
      return DType::kFp16;
    case Dtype::kBF16:
      return DType::kBf16;
    case Dtype::kF32:
      return DType::kFp32;
    default:
      return std::nullopt;
  }
}

Dtype FileDtype(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return Dtype::kF16;
    case DType::kBf16:
      return Dtype::kBF16;
    case DType::kFp32:
      break;
  }
  return Dtype::kF32;
}

std::string_view LayoutName(KvLayout layout) {
  return layout == KvLayout::kTokensFirst ? "[tokens, kv_heads, head_dim]"
                                          : "[kv_heads, tokens, head_dim]";
}

// "layers.{l}.key" / "layers.{l}.value" with l in canonical decimal (no sign, no leading zero).
bool ParseKvName(std::string_view name, uint32_t* layer, bool* is_key) {
  constexpr std::string_view kPrefix = "layers.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  name.remove_prefix(kPrefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return false;
  const std::string_view number = name.substr(0, dot);
  const std::string_view part = name.substr(dot + 1);
  if (part != "key" && part != "value") return false;
  if (number.empty() || (number.size() > 1 && number[0] == '0')) return false;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), *layer);
  if (ec != std::errc() || end != number.data() + number.size()) return false;
  *is_key = part == "key";
  return true;
}

}  // namespace

std::string KeyTensorName(uint32_t layer) { return absl::StrCat("layers.", layer, ".key"); }
std::string ValueTensorName(uint32_t layer) { return absl::StrCat("layers.", layer, ".value"); }

namespace {

absl::StatusOr<std::vector<int32_t>> ReadTokenIdsTensor(const Reader& file, const TensorInfo& t) {
  if (t.dtype != Dtype::kI32 && t.dtype != Dtype::kI64) {
    return TensorError(t.name, absl::StrCat("dtype ", Sv(DtypeName(t.dtype)), ", not I32 or I64"));
  }
  if (t.shape.size() != 1) {
    return TensorError(t.name,
                       absl::StrCat("shape ", ShapeString(t.shape), " is not [tokens] (rank 1)"));
  }
  // The file's size bounds the tensor, but a sparse file's size costs nothing: bound it too.
  if (t.shape[0] > kMaxImportTokens) {
    return TensorError(t.name, absl::StrCat("shape ", ShapeString(t.shape), ": ", t.shape[0],
                                            " token ids, over the limit of ", kMaxImportTokens));
  }
  std::vector<std::byte> raw(t.bytes());
  CKV_RETURN_IF_ERROR(file.Read(t, raw));
  std::vector<int32_t> ids(t.shape[0]);
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t id;
    if (t.dtype == Dtype::kI32) {
      int32_t v;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      id = v;
    } else {
      std::memcpy(&id, raw.data() + 8 * i, 8);
    }
    if (id < 0 || id > INT32_MAX) {
      return TensorError(
          t.name, absl::StrCat("token_ids[", i, "] = ", id, " is not a token id in [0, 2^31)"));
    }
    ids[i] = static_cast<int32_t>(id);
  }
  return ids;
}

// Applies the file's __metadata__ model id and chunk size to `spec`, where `options` asks.
absl::Status ApplyMetadata(const Reader& file, const ImportOptions& options, ModelSpec* spec) {
  const auto& metadata = file.metadata();
  if (const auto it = metadata.find(std::string(kMetaModelId));
      options.model_id_from_file && it != metadata.end()) {
    spec->model_id = it->second;
  }
  if (const auto it = metadata.find(std::string(kMetaChunkTokens));
      options.chunk_tokens_from_file && it != metadata.end()) {
    const std::string& text = it->second;
    uint32_t c = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), c);
    if (ec != std::errc() || end != text.data() + text.size() || c < 1 || c > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("__metadata__ chunk_tokens ", Quoted(text),
                                                     " is not an integer in 1..4096"));
    }
    spec->chunk_tokens = c;
  }
  return absl::OkStatus();
}

// A KV file's tensors: its token ids (or none) and every layer's K and V.
struct KvTensorSet {
  const TensorInfo* token_ids = nullptr;
  std::vector<const TensorInfo*> k, v;  // by layer
};

// Sorts the tensors into token ids and per-layer K and V; anything else does not belong, and
// every layer of the spec must have both.
absl::StatusOr<KvTensorSet> SortTensors(const Reader& file, uint32_t layers) {
  KvTensorSet set;
  set.k.assign(layers, nullptr);
  set.v.assign(layers, nullptr);
  std::vector<const TensorInfo*>& k = set.k;
  std::vector<const TensorInfo*>& v = set.v;
  for (const TensorInfo& t : file.tensors()) {
    if (t.name == kTokenIdsTensor) {
      set.token_ids = &t;
      continue;
    }
    uint32_t layer;
    bool is_key;
    if (!ParseKvName(t.name, &layer, &is_key)) {
      return TensorError(t.name,
                         "unexpected (a KV file holds token_ids, layers.{l}.key and "
                         "layers.{l}.value)");
    }
    if (layer >= layers) {
      return TensorError(t.name,
                         absl::StrCat("layer ", layer, " is past the spec's ", layers, " layers"));
    }
    (is_key ? k : v)[layer] = &t;
  }
  size_t missing = 0;
  std::string first_missing;
  for (uint32_t l = 0; l < layers; ++l) {
    for (const bool is_key : {true, false}) {
      if ((is_key ? k : v)[l] != nullptr) continue;
      if (missing++ == 0) first_missing = is_key ? KeyTensorName(l) : ValueTensorName(l);
    }
  }
  if (missing > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing ", missing, " K/V tensor", missing == 1 ? "" : "s", ", the first ",
                     Quoted(first_missing), " (the spec has ", layers, " layers)"));
  }
  return set;
}

// The one dtype of all K and V; it sets the spec's when options.dtype_from_file.
absl::StatusOr<DType> KvFileDtype(const KvTensorSet& set, const ImportOptions& options,
                                  ModelSpec* spec) {
  const std::vector<const TensorInfo*>& k = set.k;
  const std::vector<const TensorInfo*>& v = set.v;
  const uint32_t layers = static_cast<uint32_t>(k.size());
  const Dtype file_dtype = k[0]->dtype;
  for (uint32_t l = 0; l < layers; ++l) {
    for (const TensorInfo* t : {k[l], v[l]}) {
      if (!KvDtype(t->dtype).has_value()) {
        return TensorError(t->name, absl::StrCat("dtype ", Sv(DtypeName(t->dtype)),
                                                 " is not a K/V dtype (F16, BF16 or F32)"));
      }
      if (t->dtype != file_dtype) {
        return TensorError(
            t->name,
            absl::StrCat("dtype ", Sv(DtypeName(t->dtype)), " differs from ", Quoted(k[0]->name),
                         "'s ", Sv(DtypeName(file_dtype)), " (K and V must share one dtype)"));
      }
    }
  }
  const DType dtype = *KvDtype(file_dtype);
  if (options.dtype_from_file) {
    spec->dtype = dtype;
  } else if (dtype != spec->dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the file's K/V dtype is ", Sv(DTypeName(dtype)), " (", Sv(DtypeName(file_dtype)),
        ") but the spec's is ", Sv(DTypeName(spec->dtype))));
  }

  return dtype;
}

// Token ids: from the file or from the caller, not both.
absl::StatusOr<std::vector<int32_t>> KvFileTokenIds(const Reader& file, const KvTensorSet& set,
                                                    const ImportOptions& options) {
  std::vector<int32_t> ids;
  if (options.token_ids.has_value()) {
    if (set.token_ids != nullptr) {
      return absl::InvalidArgumentError(
          "token ids were given apart from the file, which holds a token_ids tensor too: use one");
    }
    ids = *options.token_ids;
  } else {
    if (set.token_ids == nullptr) {
      return absl::InvalidArgumentError(
          "no token_ids tensor in the file and no token ids given apart from it");
    }
    CKV_ASSIGN_OR_RETURN(ids, ReadTokenIdsTensor(file, *set.token_ids));
  }
  if (ids.empty()) return absl::InvalidArgumentError("no tokens: token_ids is empty");
  return ids;
}

// Every K/V tensor [tokens, kv_heads, head_dim], or every one [kv_heads, tokens, head_dim].
absl::StatusOr<KvLayout> KvFileLayout(const KvTensorSet& set, const ModelSpec& spec,
                                      uint64_t tokens) {
  const std::vector<const TensorInfo*>& k = set.k;
  const std::vector<const TensorInfo*>& v = set.v;
  const uint32_t layers = static_cast<uint32_t>(k.size());
  const uint64_t heads = spec.kv_heads;
  const uint64_t dim = spec.head_dim;
  const std::vector<uint64_t> tokens_first = {tokens, heads, dim};
  const std::vector<uint64_t> heads_first = {heads, tokens, dim};
  std::optional<KvLayout> layout;
  for (uint32_t l = 0; l < layers; ++l) {
    for (const TensorInfo* t : {k[l], v[l]}) {
      const bool fits_tokens_first = t->shape == tokens_first;
      if (!fits_tokens_first && t->shape != heads_first) {
        return TensorError(
            t->name,
            absl::StrCat("shape ", ShapeString(t->shape),
                         " fits neither [tokens, kv_heads, head_dim] = ", ShapeString(tokens_first),
                         " nor [kv_heads, tokens, head_dim] = ", ShapeString(heads_first), " (",
                         tokens, " token ids; kv_heads ", heads, " and head_dim ", dim,
                         " from the spec)"));
      }
      const KvLayout this_layout =
          fits_tokens_first ? KvLayout::kTokensFirst : KvLayout::kHeadsFirst;
      if (!layout) layout = this_layout;
      if (this_layout != *layout) {
        return TensorError(
            t->name, absl::StrCat("shape ", ShapeString(t->shape), " is ",
                                  Sv(LayoutName(this_layout)), " but ", Quoted(k[0]->name), " is ",
                                  Sv(LayoutName(*layout)), " (one layout for all K and V)"));
      }
    }
  }
  return *layout;
}

// Reads every tensor straight into its buffer; heads-first ones through one scratch tensor.
absl::Status ReadKvTensors(const Reader& file, const KvTensorSet& set, DType dtype,
                           const ImportOptions& options, ImportedKv* out) {
  const std::vector<const TensorInfo*>& k = set.k;
  const std::vector<const TensorInfo*>& v = set.v;
  const uint32_t layers = static_cast<uint32_t>(k.size());
  const uint64_t tokens = out->token_ids.size();
  const uint64_t heads = out->spec.kv_heads;
  const uint64_t dim = out->spec.head_dim;
  const size_t tensor_bytes = tokens * out->spec.TokenBytesPerLayer();
  if (uint64_t{2} * layers * tensor_bytes > options.max_kv_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("K and V of ", tokens, " tokens x ", layers, " layers are ",
                     uint64_t{2} * layers * tensor_bytes, " bytes, over the import limit of ",
                     options.max_kv_bytes, " bytes (", options.max_kv_bytes_name, ")"));
  }
  const size_t row_bytes = dim * DTypeBytes(dtype);
  const uint64_t total = uint64_t{2} * layers * tensor_bytes;
  // Every buffer before any read: a file too large for this process's memory (ulimit -v, a
  // small machine) fails at once, not after reading most of it.
  std::unique_ptr<std::byte[]> scratch;
  try {
    if (out->file_layout == KvLayout::kHeadsFirst) {
      scratch = std::make_unique_for_overwrite<std::byte[]>(tensor_bytes);
    }
    out->buffers.reserve(out->buffers.size() + 2 * size_t{layers});
    for (uint32_t i = 0; i < 2 * layers; ++i) {
      out->buffers.push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
    }
  } catch (const std::bad_alloc&) {
    out->buffers.clear();
    return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating K and V of ", tokens,
                                                     " tokens x ", layers, " layers (", total,
                                                     " bytes)"));
  }
  uint64_t done = 0;
  size_t next_buffer = out->buffers.size() - 2 * size_t{layers};
  out->kv.tokens = tokens;
  for (uint32_t l = 0; l < layers; ++l) {
    for (const TensorInfo* t : {k[l], v[l]}) {
      std::byte* buffer = out->buffers[next_buffer++].get();
      if (out->file_layout == KvLayout::kTokensFirst) {
        CKV_RETURN_IF_ERROR(file.Read(*t, std::span(buffer, tensor_bytes)));
      } else {
        CKV_RETURN_IF_ERROR(file.Read(*t, std::span(scratch.get(), tensor_bytes)));
        for (uint64_t h = 0; h < heads; ++h) {
          for (uint64_t i = 0; i < tokens; ++i) {
            std::memcpy(buffer + (i * heads + h) * row_bytes,
                        scratch.get() + (h * tokens + i) * row_bytes, row_bytes);
          }
        }
      }
      (t == k[l] ? out->kv.k : out->kv.v).emplace_back(buffer, tensor_bytes);
      done += tensor_bytes;
      if (options.progress) options.progress(done, total);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImportedKv> ImportKv(const Reader& file, const ModelSpec& spec,
                                    const ImportOptions& options) {
  ImportedKv out;
  out.spec = spec;
  CKV_RETURN_IF_ERROR(ApplyMetadata(file, options, &out.spec));
  // Validate the shape fields now: the checks below divide the file by them.
  CKV_RETURN_IF_ERROR(out.spec.Validate());
  CKV_ASSIGN_OR_RETURN(const KvTensorSet set, SortTensors(file, out.spec.layers));
  CKV_ASSIGN_OR_RETURN(const DType dtype, KvFileDtype(set, options, &out.spec));
  CKV_ASSIGN_OR_RETURN(out.token_ids, KvFileTokenIds(file, set, options));
  CKV_ASSIGN_OR_RETURN(out.file_layout, KvFileLayout(set, out.spec, out.token_ids.size()));
  out.layout_ambiguous = out.token_ids.size() == out.spec.kv_heads;
  CKV_RETURN_IF_ERROR(ReadKvTensors(file, set, dtype, options, &out));
  return out;
}

absl::Status ExportKv(const std::string& path, const ModelSpec& spec,
                      std::span<const int32_t> token_ids, const KvTensors& kv,
                      const ProgressFn& progress) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  if (token_ids.size() != kv.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(token_ids.size(), " token ids for KV of ", kv.tokens, " tokens"));
  }
  if (kv.k.size() != spec.layers || kv.v.size() != spec.layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV of ", kv.k.size(), " K and ", kv.v.size(),
                                                   " V tensors for a spec of ", spec.layers,
                                                   " layers"));
  }
  const std::vector<uint64_t> shape = {kv.tokens, spec.kv_heads, spec.head_dim};
  const Dtype dtype = FileDtype(spec.dtype);
  std::vector<TensorData> tensors;
  tensors.push_back(
      {std::string(kTokenIdsTensor), Dtype::kI32, {token_ids.size()}, std::as_bytes(token_ids)});
  for (uint32_t l = 0; l < spec.layers; ++l) {
    tensors.push_back({KeyTensorName(l), dtype, shape, kv.k[l]});
    tensors.push_back({ValueTensorName(l), dtype, shape, kv.v[l]});
  }
  const std::map<std::string, std::string> metadata = {
      {std::string(kMetaModelId), spec.model_id},
      {std::string(kMetaDtype), std::string(DTypeName(spec.dtype))},
      {std::string(kMetaChunkTokens), absl::StrCat(spec.chunk_tokens)},
  };
  return WriteFile(path, std::move(tensors), metadata, progress);
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIdsFile(const std::string& path) {
  constexpr size_t kMaxTokens = size_t{1} << 24;
  tools::JsonLimits limits;
  limits.max_bytes = size_t{256} << 20;  // 2^24 ids of up to 10 digits, with separators
  limits.max_depth = 1;
  limits.max_values = kMaxTokens + 1;  // the array itself counts
  CKV_ASSIGN_OR_RETURN(const tools::JsonValue json, tools::ReadJsonFile(path, limits));
  const tools::JsonValue::Array* array = json.AsArray();
  if (array == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", Sv(json.TypeName()), ", not a JSON array of token ids"));
  }
  std::vector<int32_t> ids;
  ids.reserve(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const int64_t* id = (*array)[i].AsInt();
    if (id == nullptr || *id < 0 || *id > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": entry ", i,
                                                     " is not a token id (an integer in "
                                                     "[0, 2^31))"));
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

}  // namespace ckv::safetensors
