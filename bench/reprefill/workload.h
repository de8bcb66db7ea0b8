// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/workload.h: the conversations and requests of the Re-Prefill benchmark.
//
// `conversations` conversations, each a prefix of `prefix-tokens` tokens (the first
// `system-prompt-share` of them common to all) followed by `turns` requests: request t reuses
// the prefix plus the t earlier suffixes (each turn's prefix is the previous one plus that turn)
// and brings a `suffix-tokens` suffix. The KV is the synthetic attention generator's
// (tools/synthetic_attention.h), distinct per conversation (its own seed); request t of a
// conversation is the generator's request t, whose queries move a share of the heavy hitters
// (request_shift) and carry their own noise (query_seed). Turns below `warmup-turns` warm the
// tiers and are not measured.
//
// With a profile file (--attention-profile trained-tiny, tools/attention_profile_file.h) the
// tokens, the KV and every request's queries are the file's instead: a trained network's
// attention. Its flags (prefix and suffix tokens, conversations, turns, window) are then the
// file's (ApplyProfileFile in main.cc sets them).
//
// Thread-safety: immutable after construction.
#ifndef CKV_BENCH_REPREFILL_WORKLOAD_H_
#define CKV_BENCH_REPREFILL_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/reprefill/flags.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "tools/attention_profile_file.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {

uint64_t Mix(uint64_t x);

struct Request {
  uint32_t conversation = 0;
  uint32_t turn = 0;
  bool warmup = false;
};

class Workload {
 public:
  // REQUIRES: f.attention_profile names a synthetic profile, or `file` is set (and outlives the
  // Workload) and f's shape flags are the file's.
  Workload(const Flags& f, ModelSpec spec, const synth::AttentionProfileFile* file = nullptr);

  const ModelSpec& spec() const { return spec_; }
  const Flags& flags() const { return f_; }
  size_t stored_tokens() const { return stored_tokens_; }
  uint64_t store_bytes() const;
  const std::vector<Request>& requests() const { return requests_; }
  std::span<const int32_t> StoredTokens(uint32_t c) const {
    return std::span(tokens_[c]).first(stored_tokens_);
  }
  // The prefix a request reuses.
  std::span<const int32_t> Prefix(const Request& r) const {
    return std::span(tokens_[r.conversation])
        .first(f_.prefix_tokens + size_t{r.turn} * f_.suffix_tokens);
  }
  // The generator's parameters of a conversation's KV and of one of its requests.
  synth::AttentionParams Params(uint32_t conversation) const;
  synth::AttentionParams Params(const Request& r) const;
  // A request's queries, every layer: [layers][window * q_heads * head_dim].
  std::vector<std::vector<float>> Queries(const Request& r) const;
  // Calls `fn` with the KV of conversation c's stored tokens, every layer in spec().dtype.
  // Errors: fn's; the profile file's read errors.
  absl::Status WithStoredKv(uint32_t c,
                            const std::function<absl::Status(const KvTensors&)>& fn) const;
  // The whole chunks of conversation c's stored tokens at `layer`, as ckv stores them (per
  // chunk, K then V). Errors: the profile file's read errors.
  absl::StatusOr<std::vector<std::byte>> Records(uint32_t c, uint32_t layer) const;
  // The profile file, or nullptr for the synthetic generator.
  const synth::AttentionProfileFile* file() const { return file_; }
  // What the store's contents depend on.
  std::string Manifest() const;

 private:
  const Flags& f_;
  ModelSpec spec_;
  size_t stored_tokens_ = 0;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<Request> requests_;
  synth::AttentionParams base_;
  const synth::AttentionProfileFile* file_ = nullptr;
};

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_WORKLOAD_H_
