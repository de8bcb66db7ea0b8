// SPDX-License-Identifier: Apache-2.0
// ckv/kv.h: how a caller hands ckv the K and V of a prefix.
//
// Layout: for every layer l, one K tensor and one V tensor, each dense and row-major
// [tokens, kv_heads, head_dim] in the spec's dtype (the layout of vLLM's and SGLang's per-layer
// caches once gathered for one request). The spans are host memory; ckv only reads them during
// the call.
//
// Thread-safety: a plain struct; ckv never writes through it.
#ifndef CKV_KV_H_
#define CKV_KV_H_

#include <cstddef>
#include <span>
#include <vector>

namespace ckv {

struct KvTensors {
  // Tokens covered by every tensor.
  size_t tokens = 0;
  // k[l], v[l]: layer l's keys and values, tokens * kv_heads * head_dim elements each.
  std::vector<std::span<const std::byte>> k;
  std::vector<std::span<const std::byte>> v;
};

}  // namespace ckv

#endif  // CKV_KV_H_
