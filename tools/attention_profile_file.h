// SPDX-License-Identifier: Apache-2.0
// tools/attention_profile_file.h: a trained network's KV and queries, read from a profile file,
// for the selectors' benchmark (bench/reprefill, --attention-profile trained-tiny) in place of the
// synthetic generator (tools/synthetic_attention.h).
//
// The file is safetensors (tools/safetensors.h), written by python/ckv_ref/export_profile.py:
//   k        F16 [conversations, layers, total_tokens, kv_heads, head_dim]: post-RoPE keys of
//            every token, as a serving system caches them
//   v        F16, the same shape
//   q        F32 [conversations, turns, layers, window, q_heads, head_dim]: post-RoPE queries of
//            the last `window` tokens of each turn's suffix
//   tokens   I32 [conversations, total_tokens], every id >= 0
//   __metadata__ (strings): model_id, layers, q_heads, kv_heads, head_dim, chunk_tokens,
//            prefix_tokens, suffix_tokens, turns, window, rope_theta; optionally hidden and
//            intermediate (the network's sizes, for the modelled compute)
// with total_tokens = prefix_tokens + turns * suffix_tokens. Turn t (0-based) of conversation c
// reuses tokens [0, prefix_tokens + t * suffix_tokens) as its stored prefix and brings the
// suffix [prefix_tokens + t * suffix_tokens, prefix_tokens + (t + 1) * suffix_tokens), whose last
// `window` tokens' queries are q[c, t]. The K/V of token i depend only on tokens <= i, so one
// conversation's K/V serve all its turns.
//
// Open checks the whole header, and fails with InvalidArgument naming the file and what is wrong
// (a missing or extra tensor, a wrong dtype or shape, metadata missing, unparsable or disagreeing
// with the shapes, window > suffix_tokens, a model spec that does not validate, a negative token
// id); a missing file is the open error (NotFound) naming the path. It reads the tokens and the
// queries into memory (at most kMaxQueryBytes of queries); K/V are read on demand, a
// (conversation, layer) slab at a time.
//
// Thread-safety: immutable after Open; const methods may be called from several threads.
#ifndef CKV_TOOLS_ATTENTION_PROFILE_FILE_H_
#define CKV_TOOLS_ATTENTION_PROFILE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "tools/safetensors.h"

namespace ckv::synth {

// Most bytes of queries Open holds in memory (the q tensor).
inline constexpr uint64_t kMaxProfileQueryBytes = uint64_t{1} << 30;

// Every layer's K and V of a conversation's first tokens, in fp16, owning their memory. Moves keep
// tensors() valid (the per-layer buffers do not move).
struct ProfileKv {
  std::vector<std::vector<std::byte>> k, v;
  KvTensors tensors;
};

class AttentionProfileFile {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionProfileFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // model_id, layers, q_heads, kv_heads, head_dim, chunk_tokens from the file; fp16.
  const ModelSpec& spec() const { return spec_; }
  uint32_t conversations() const { return conversations_; }
  uint32_t prefix_tokens() const { return prefix_tokens_; }
  uint32_t suffix_tokens() const { return suffix_tokens_; }
  uint32_t turns() const { return turns_; }
  uint32_t window() const { return window_; }
  double rope_theta() const { return rope_theta_; }
  // The network's hidden and MLP sizes (metadata "hidden", "intermediate"); 0 when absent.
  uint32_t hidden() const { return hidden_; }
  uint32_t intermediate() const { return intermediate_; }
  size_t total_tokens() const { return size_t{prefix_tokens_} + size_t{turns_} * suffix_tokens_; }

  // Conversation c's total_tokens() token ids. REQUIRES: c < conversations().
  std::span<const int32_t> Tokens(uint32_t c) const;
  // The queries of turn t of conversation c: [layers][window * q_heads * head_dim].
  // REQUIRES: c < conversations(), t < turns().
  std::vector<std::vector<float>> Queries(uint32_t c, uint32_t t) const;
  // K and V of conversation c's first `tokens` tokens, every layer. Errors: InvalidArgument for c
  // or tokens out of range; the file's read errors.
  absl::StatusOr<ProfileKv> ReadKv(uint32_t c, size_t tokens) const;
  // The whole chunks of conversation c's first `tokens` tokens at `layer`, as ckv stores them
  // (per chunk, K [chunk_tokens, kv_heads, head_dim] then V). Errors: as ReadKv.
  absl::StatusOr<std::vector<std::byte>> Records(uint32_t c, uint32_t layer, size_t tokens) const;

 private:
  AttentionProfileFile() = default;
  absl::Status Init();
  absl::Status ReadSlab(const safetensors::TensorInfo& t, uint32_t c, uint32_t layer, size_t tokens,
                        std::vector<std::byte>* out) const;

  std::string path_;
  std::unique_ptr<safetensors::Reader> reader_;
  const safetensors::TensorInfo* k_ = nullptr;
  const safetensors::TensorInfo* v_ = nullptr;
  ModelSpec spec_;
  uint32_t conversations_ = 0, prefix_tokens_ = 0, suffix_tokens_ = 0, turns_ = 0, window_ = 0;
  double rope_theta_ = 0;
  uint32_t hidden_ = 0, intermediate_ = 0;
  std::vector<int32_t> tokens_;  // [conversations, total_tokens]
  std::vector<float> q_;         // [conversations, turns, layers, window, q_heads, head_dim]
};

}  // namespace ckv::synth

#endif  // CKV_TOOLS_ATTENTION_PROFILE_FILE_H_
