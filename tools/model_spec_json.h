// SPDX-License-Identifier: Apache-2.0
// tools/model_spec_json.h: a ModelSpec from a JSON spec file (kvctl import --spec FILE).
//
// The fields are ModelSpec's (include/ckv/model_spec.h), by name:
//
//   {"model_id": "Qwen/Qwen2.5-7B-Instruct", "layers": 28, "q_heads": 28, "kv_heads": 4,
//    "head_dim": 128, "dtype": "bf16", "chunk_tokens": 16}
//
// model_id, layers, q_heads, kv_heads and head_dim are required. dtype ("fp16", "bf16", "fp32")
// and chunk_tokens may be left out; the result says whether they were given, so that a caller can
// take them from elsewhere (kvctl import takes them from the file it imports). Unknown fields,
// missing required ones, values of the wrong type and values out of ModelSpec's ranges are
// InvalidArgument naming the field and the value.
//
// Thread-safety: pure functions.
#ifndef CKV_TOOLS_MODEL_SPEC_JSON_H_
#define CKV_TOOLS_MODEL_SPEC_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "ckv/model_spec.h"
#include "tools/json_reader.h"

namespace ckv::tools {

struct ModelSpecJson {
  // Valid. dtype and chunk_tokens hold ModelSpec's defaults (fp16, 16) when not given.
  ModelSpec spec;
  bool has_dtype = false;
  bool has_chunk_tokens = false;
};

absl::StatusOr<ModelSpecJson> ModelSpecFromJson(const JsonValue& json);

// Reads the file at `path` and ModelSpecFromJson's it; errors name the path.
absl::StatusOr<ModelSpecJson> ReadModelSpecFile(const std::string& path);

}  // namespace ckv::tools

#endif  // CKV_TOOLS_MODEL_SPEC_JSON_H_
