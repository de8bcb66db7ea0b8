// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/fidelity.h: the attention over what a system attended to against the attention
// over the full KV, computed on the CPU from the generator (whose records are the stored bytes).
//
// Recall is the share of the exact attention mass (averaged over queries and q heads) on the
// tokens the system attends to: every token of its loaded chunks for a chunk-level system, only
// its selected tokens for a token-level one (the rest of the blocks it had to read are not
// attended, as in the originals). The output error is the relative L2 error of the attention
// output over those tokens (and over the virtual tokens of a system that estimates the chunks it
// did not load). Both are averaged over the layers.
//
// Thread-safety: none (one caller).
#ifndef CKV_BENCH_REPREFILL_FIDELITY_H_
#define CKV_BENCH_REPREFILL_FIDELITY_H_

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/reprefill/report.h"
#include "bench/reprefill/systems.h"
#include "bench/reprefill/workload.h"
#include "kernels/attention.h"

namespace ckv::bench {

class Fidelity {
 public:
  explicit Fidelity(const Workload& w) : w_(w) {}

  // What one request's attention over a system's KV gives, against the attention over all of it.
  struct Quality {
    double recall = 0;                // mean over layers
    double recall_loaded = 0;         // mean over layers
    double error = 0;                 // output relative L2 error, mean over layers
    std::vector<double> layer_error;  // per layer
  };

  // `loaded[l]`: chunks loaded at layer l; `attended[l]`: the tokens attended to, sorted, or
  // empty for every token of loaded[l]. recall counts the attended tokens, recall_loaded every
  // token of the loaded chunks (what a token-level system would get if it used all it read).
  // `estimated[l]` (empty, or one per layer): the chunks not loaded that the system's attention
  // also took as virtual tokens (ckv/virtual_tokens.h), rebuilt here from the records as a
  // session makes them (kernels::VirtualTokensOf's mean form over 8-bit statistics); recall
  // does not count them. `served[l]` (empty, or one per layer): the virtual tokens the session
  // served, which must match the rebuild (Internal otherwise). `codec`: how the system's store
  // holds the records (ckv/codec.h); the loaded chunks are served through it, the truth never.
  absl::StatusOr<Quality> Measure(KvCodec codec, const Request& r,
                                  const std::vector<std::vector<float>>& queries,
                                  const std::vector<std::vector<uint32_t>>& loaded,
                                  const std::vector<std::vector<uint32_t>>& attended,
                                  const std::vector<std::vector<uint32_t>>& estimated = {},
                                  const std::vector<VirtualTokens>& served = {});

  // Recall and output error of `measured` (whose results `results` holds, in the same order;
  // every one, or the first `limit` when it is not 0) into `row`: the means over requests, the
  // error's p95 over them, and the layer whose mean error over them is the worst.
  absl::Status MeasureRow(KvCodec codec, const std::vector<Request>& measured,
                          const std::vector<RequestResult>& results, uint32_t limit, Row* row);

 private:
  struct Truth {
    std::vector<float> token_mass;  // per token of the request's prefix (whole chunks)
    std::vector<float> output;      // attention output over every chunk
  };
  // The stored records of a conversation's layer (the workload's), cached.
  absl::StatusOr<const std::vector<std::byte>*> Records(uint32_t conversation, uint32_t layer);
  // The records as a session serves them once decoded: Records() through `codec`
  // (ckv/codec.h) and back, so the output error counts what the codec lost; Records() itself
  // without a codec. The truth is always computed from Records().
  absl::StatusOr<const std::vector<std::byte>*> Served(KvCodec codec, uint32_t conversation,
                                                       uint32_t layer);

  const Workload& w_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> records_;
  std::map<std::tuple<KvCodec, uint32_t, uint32_t>, std::vector<std::byte>> served_;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, Truth> truth_;
};

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_FIDELITY_H_
