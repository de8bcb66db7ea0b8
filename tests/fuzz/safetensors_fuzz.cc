// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the JSON reader, the safetensors reader and ImportKv over untrusted bytes.
// Built and run by tests/fuzz/run_fuzz.sh (clang, -fsanitize=fuzzer,address,undefined). Any crash,
// sanitizer report, leak or broken invariant (__builtin_trap below) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ckv/model_spec.h"
#include "tools/json_reader.h"
#include "tools/model_spec_json.h"
#include "tools/safetensors.h"

namespace {

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// A KV import must come back with every tensor the size the spec says.
void Import(const ckv::safetensors::Reader& reader, const ckv::ModelSpec& spec) {
  ckv::safetensors::ImportOptions options;
  options.dtype_from_file = options.model_id_from_file = options.chunk_tokens_from_file = true;
  auto imported = ckv::safetensors::ImportKv(reader, spec, options);
  if (!imported.ok()) return;
  const size_t tensor_bytes = imported->token_ids.size() * imported->spec.TokenBytesPerLayer();
  Check(imported->kv.tokens == imported->token_ids.size() && !imported->token_ids.empty());
  Check(imported->kv.k.size() == spec.layers && imported->kv.v.size() == spec.layers);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    Check(imported->kv.k[l].size() == tensor_bytes && imported->kv.v[l].size() == tensor_bytes);
  }
  for (int32_t id : imported->token_ids) Check(id >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto json = ckv::tools::ParseJson(text); json.ok()) {
    (void)ckv::tools::ModelSpecFromJson(*json);  // errors are fine; crashes are not
  }

  const auto bytes = std::as_bytes(std::span(data, size));
  auto reader = ckv::safetensors::Reader::FromBuffer(bytes);
  if (!reader.ok()) return 0;
  // Every tensor the reader accepted lies inside the input and reads back.
  uint64_t total = 0;
  for (const ckv::safetensors::TensorInfo& t : (*reader)->tensors()) {
    Check(t.data_begin <= t.data_end && t.data_end <= size);
    total += t.bytes();
    std::vector<std::byte> out(t.bytes());
    Check((*reader)->Read(t, out).ok());
  }
  Check(total <= size);

  static const ckv::ModelSpec kPreset = *ckv::ModelSpec::Preset("qwen2.5-0.5b");
  // A one-layer spec too, so that small inputs reach the whole import path.
  static const ckv::ModelSpec kTiny = [] {
    ckv::ModelSpec spec;
    spec.model_id = "tiny";
    spec.layers = 1;
    spec.q_heads = 2;
    spec.kv_heads = 2;
    spec.head_dim = 2;
    return spec;
  }();
  Import(**reader, kPreset);
  Import(**reader, kTiny);
  return 0;
}
