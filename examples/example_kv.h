// SPDX-License-Identifier: Apache-2.0
// examples/example_kv.h: a stand-in for what a serving system hands ckv, so that the examples
// run without a model: token ids, and fp16 K/V and queries with deterministic values.
#ifndef CKV_EXAMPLES_EXAMPLE_KV_H_
#define CKV_EXAMPLES_EXAMPLE_KV_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckv/kv.h"
#include "ckv/model_spec.h"

namespace example {

inline uint64_t Next(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// `n` token ids drawn from a 150,000-token vocabulary.
inline std::vector<int32_t> Tokens(uint64_t seed, size_t n) {
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(Next(seed) % 150000);
  return tokens;
}

// A prefix's K and V, as a model would produce them for `tokens` tokens: one fp16 tensor
// [tokens, kv_heads, head_dim] per layer for K and one for V, values of magnitude 0.25 to 1.
class Kv {
 public:
  Kv(const ckv::ModelSpec& spec, size_t tokens, uint64_t seed) {
    const size_t elements = tokens * spec.kv_heads * spec.head_dim;
    storage_.resize(2 * spec.layers, std::vector<std::byte>(elements * 2));
    tensors_.tokens = tokens;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<std::byte>& t = storage_[2 * l + kv];
        for (size_t i = 0; i < elements; ++i) {
          const uint64_t r = Next(seed);
          // sign, an exponent of 13 or 14 (0.25 to 1), ten random mantissa bits
          const uint16_t half = static_cast<uint16_t>(
              (r & 0x8000) | ((13 + ((r >> 16) & 1)) << 10) | ((r >> 20) & 0x3ff));
          t[2 * i] = static_cast<std::byte>(half & 0xff);
          t[2 * i + 1] = static_cast<std::byte>(half >> 8);
        }
        (kv == 0 ? tensors_.k : tensors_.v).emplace_back(t.data(), t.size());
      }
    }
  }
  const ckv::KvTensors& tensors() const { return tensors_; }

 private:
  std::vector<std::vector<std::byte>> storage_;
  ckv::KvTensors tensors_;
};

// `n` query values in [-1, 1).
inline std::vector<float> Queries(uint64_t seed, size_t n) {
  std::vector<float> q(n);
  for (float& x : q) x = static_cast<float>(Next(seed) >> 40) / static_cast<float>(1 << 23) - 1.0f;
  return q;
}

}  // namespace example

#endif  // CKV_EXAMPLES_EXAMPLE_KV_H_
