// SPDX-License-Identifier: Apache-2.0
// ckv/virtual_tokens.h: the chunks a Re-Prefill view did not load, as tokens an attention kernel
// takes beside the loaded ones.
//
// A chunk that is not loaded still holds a share of every query's softmax. Dropping it loses that
// share and leans the output toward what was loaded; standing it in by one virtual token per kv
// head keeps most of it (RetroInfer, arXiv 2505.02922, does so per cluster of keys). Virtual
// token j, for chunk chunks[j], has per kv head h a key keys[j, h] (the mean of the chunk's keys)
// and a value values[j, h] (the mean of its values). Query head g, reading kv head h(g) = g /
// (q_heads / kv_heads), gives it the logit
//
//   q . keys[j, h(g)] / sqrt(head_dim) + bias[j, g]
//
// and it joins the softmax beside the loaded tokens' logits q . k / sqrt(head_dim). A session
// sets the bias to log(chunk_tokens): the virtual token weighs as the chunk's c tokens would if
// each had the mean key. The bias is per (token, q head) so that other estimates fit the same form
// (docs/estimate.md says which were measured, and why this one is served).
//
// Any attention kernel that takes an additive logit bias per key (a float mask, ALiBi-style)
// serves them unchanged: append the virtual keys and values to the loaded ones and the bias to
// the mask (0 for the loaded tokens). Causality: every virtual token is in the prefix, before
// every suffix query.
#ifndef CKV_VIRTUAL_TOKENS_H_
#define CKV_VIRTUAL_TOKENS_H_

#include <cstdint>
#include <vector>

namespace ckv {

struct VirtualTokens {
  uint32_t count = 0;
  std::vector<uint32_t> chunks;     // the prefix chunk each stands for, ascending
  std::vector<float> keys, values;  // float32 [count, kv_heads, head_dim]
  std::vector<float> bias;          // float32 [count, q_heads]
};

}  // namespace ckv

#endif  // CKV_VIRTUAL_TOKENS_H_
