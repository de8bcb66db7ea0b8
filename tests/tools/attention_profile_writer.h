// SPDX-License-Identifier: Apache-2.0
// tests/tools/attention_profile_writer.h: writes attention profile files
// (tools/attention_profile_file.h) of seeded random data for tests, with knobs to make them wrong
// in one way at a time.
#ifndef CKV_TESTS_ATTENTION_PROFILE_WRITER_H_
#define CKV_TESTS_ATTENTION_PROFILE_WRITER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/half.h"
#include "tools/safetensors.h"

namespace ckv::testing {

struct TestProfile {
  uint32_t conversations = 2, layers = 2, q_heads = 4, kv_heads = 2, head_dim = 8;
  uint32_t chunk_tokens = 16, prefix_tokens = 32, suffix_tokens = 16, turns = 2, window = 4;
  std::string model_id = "test/tiny";
  uint64_t seed = 1;
  uint32_t total_tokens() const { return prefix_tokens + turns * suffix_tokens; }

  // Filled by Write: the data written, row-major as in the file.
  std::vector<uint16_t> k, v;  // fp16 bits
  std::vector<float> q;
  std::vector<int32_t> tokens;

  // Ways to make the file wrong: metadata to set ("" removes the key), tensors to leave out,
  // dtypes to write k and q as, and an extra dimension on k.
  std::map<std::string, std::string> metadata_overrides;
  std::vector<std::string> omit;
  safetensors::Dtype k_dtype = safetensors::Dtype::kF16;
  safetensors::Dtype q_dtype = safetensors::Dtype::kF32;
  bool k_extra_token = false;

  absl::Status Write(const std::string& path) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const uint64_t c = conversations, t = total_tokens();
    const uint64_t kv_n = c * layers * t * kv_heads * head_dim;
    k.resize(kv_n);
    v.resize(kv_n);
    for (auto& x : k) x = kernels::FloatToHalf(normal(rng));
    for (auto& x : v) x = kernels::FloatToHalf(normal(rng));
    q.resize(c * turns * layers * window * q_heads * head_dim);
    for (auto& x : q) x = normal(rng);
    tokens.resize(c * t);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(rng() % 151643);

    std::vector<uint64_t> k_shape = {c, layers, t, kv_heads, head_dim};
    std::vector<uint16_t> k_written = k;
    if (k_extra_token) {
      k_shape[2] += 1;
      k_written.resize(c * layers * (t + 1) * kv_heads * head_dim);
    }
    std::vector<float> k_f32;
    std::span<const std::byte> k_bytes = std::as_bytes(std::span(k_written));
    if (k_dtype == safetensors::Dtype::kF32) {
      for (uint16_t h : k_written) k_f32.push_back(kernels::HalfToFloat(h));
      k_bytes = std::as_bytes(std::span(k_f32));
    }
    std::vector<uint16_t> q_f16;
    std::span<const std::byte> q_bytes = std::as_bytes(std::span(q));
    if (q_dtype == safetensors::Dtype::kF16) {
      for (float x : q) q_f16.push_back(kernels::FloatToHalf(x));
      q_bytes = std::as_bytes(std::span(q_f16));
    }
    std::vector<safetensors::TensorData> all = {
        {"k", k_dtype, k_shape, k_bytes},
        {"v",
         safetensors::Dtype::kF16,
         {c, layers, t, kv_heads, head_dim},
         std::as_bytes(std::span(v))},
        {"q", q_dtype, {c, turns, layers, window, q_heads, head_dim}, q_bytes},
        {"tokens", safetensors::Dtype::kI32, {c, t}, std::as_bytes(std::span(tokens))},
    };
    std::vector<safetensors::TensorData> written;
    for (auto& x : all) {
      if (std::find(omit.begin(), omit.end(), x.name) == omit.end()) written.push_back(x);
    }
    std::map<std::string, std::string> meta = {
        {"model_id", model_id},
        {"layers", std::to_string(layers)},
        {"q_heads", std::to_string(q_heads)},
        {"kv_heads", std::to_string(kv_heads)},
        {"head_dim", std::to_string(head_dim)},
        {"chunk_tokens", std::to_string(chunk_tokens)},
        {"prefix_tokens", std::to_string(prefix_tokens)},
        {"suffix_tokens", std::to_string(suffix_tokens)},
        {"turns", std::to_string(turns)},
        {"window", std::to_string(window)},
        {"rope_theta", "10000.0"},
    };
    for (const auto& [key, value] : metadata_overrides) {
      if (value.empty())
        meta.erase(key);
      else
        meta[key] = value;
    }
    return safetensors::WriteFile(path, std::move(written), meta);
  }
};

}  // namespace ckv::testing

#endif  // CKV_TESTS_ATTENTION_PROFILE_WRITER_H_
