// SPDX-License-Identifier: Apache-2.0
// ModelSpec from JSON (see tools/model_spec_json.h).
#include "tools/model_spec_json.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckv/status.h"
#include "common/status_macros.h"

namespace ckv::tools {
namespace {

// The installed Abseil has its own absl::string_view, which std::string_view does not convert to.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status FieldError(std::string_view field, const JsonValue& value, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("spec field ", Sv(field), " is ", Sv(value.TypeName()), ", not ", Sv(want)));
}

// A uint32 field; Validate() checks its range afterwards.
absl::Status ReadUint32(std::string_view field, const JsonValue& value, uint32_t* out) {
  const int64_t* i = value.AsInt();
  if (i == nullptr) return FieldError(field, value, "an integer");
  if (*i < 0 || *i > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec field ", Sv(field), " = ", *i, ": out of range"));
  }
  *out = static_cast<uint32_t>(*i);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpecJson> ModelSpecFromJson(const JsonValue& json) {
  const JsonValue::Object* fields = json.AsObject();
  if (fields == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec is ", Sv(json.TypeName()), ", not a JSON object"));
  }
  ModelSpecJson out;
  ModelSpec& spec = out.spec;
  bool has_model_id = false, has_layers = false, has_q_heads = false, has_kv_heads = false,
       has_head_dim = false;
  for (const auto& [name, value] : *fields) {
    if (name == "model_id") {
      if (value.AsString() == nullptr) return FieldError(name, value, "a string");
      spec.model_id = *value.AsString();
      has_model_id = true;
    } else if (name == "layers") {
      CKV_RETURN_IF_ERROR(ReadUint32(name, value, &spec.layers));
      has_layers = true;
    } else if (name == "q_heads") {
      CKV_RETURN_IF_ERROR(ReadUint32(name, value, &spec.q_heads));
      has_q_heads = true;
    } else if (name == "kv_heads") {
      CKV_RETURN_IF_ERROR(ReadUint32(name, value, &spec.kv_heads));
      has_kv_heads = true;
    } else if (name == "head_dim") {
      CKV_RETURN_IF_ERROR(ReadUint32(name, value, &spec.head_dim));
      has_head_dim = true;
    } else if (name == "dtype") {
      if (value.AsString() == nullptr) return FieldError(name, value, "a string");
      CKV_ASSIGN_OR_RETURN(spec.dtype, ParseDType(*value.AsString()));
      out.has_dtype = true;
    } else if (name == "chunk_tokens") {
      CKV_RETURN_IF_ERROR(ReadUint32(name, value, &spec.chunk_tokens));
      out.has_chunk_tokens = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("spec field \"", absl::CHexEscape(Sv(name)),
                       "\" is unknown (known: model_id, layers, q_heads, kv_heads, head_dim, "
                       "dtype, chunk_tokens)"));
    }
  }
  const std::pair<bool, const char*> required[] = {
      {has_model_id, "model_id"}, {has_layers, "layers"},     {has_q_heads, "q_heads"},
      {has_kv_heads, "kv_heads"}, {has_head_dim, "head_dim"},
  };
  for (const auto& [given, name] : required) {
    if (!given) return absl::InvalidArgumentError(absl::StrCat("spec field ", name, " is missing"));
  }
  CKV_RETURN_IF_ERROR(spec.Validate());
  return out;
}

absl::StatusOr<ModelSpecJson> ReadModelSpecFile(const std::string& path) {
  CKV_ASSIGN_OR_RETURN(const JsonValue json, ReadJsonFile(path));
  absl::StatusOr<ModelSpecJson> spec = ModelSpecFromJson(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace ckv::tools
