// bench/reprefill/store.h: the benchmark's store: one ckv store per record layout that the
// systems use, plus the key file of the token-level baselines. DIR/manifest.json names the
// workload; a store whose manifest matches and which holds every prefix is reused.
//
// keys.bin holds every conversation's keys head-major, as IMPRESS and AttentionStore+H2O keep
// keys apart from values: for conversation c, layer l, kv head h, the keys of all stored tokens,
// [tokens, head_dim], back to back. One kv head's keys of a run of tokens is one read.
#ifndef CKV_BENCH_REPREFILL_STORE_H_
#define CKV_BENCH_REPREFILL_STORE_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "bench/reprefill/workload.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"

namespace ckv::bench {

class KeyFile {
 public:
  KeyFile(const ModelSpec& spec, size_t tokens, uint32_t conversations);
  static uint64_t RoundUp(uint64_t b) { return (b + 4095) / 4096 * 4096; }
  uint64_t bytes() const { return bytes_; }
  size_t key_bytes() const { return key_bytes_; }
  // Offset of token `token`'s key of (conversation, layer, head).
  uint64_t Offset(uint32_t c, uint32_t layer, uint32_t head, size_t token) const {
    return ((uint64_t{c} * layers_ + layer) * kv_heads_ + head) * run_bytes_ + token * key_bytes_;
  }

 private:
  uint32_t layers_, kv_heads_;
  size_t key_bytes_;
  uint64_t run_bytes_ = 0;
  uint64_t bytes_ = 0;
};

const char* LayoutName(RecordLayout l);
std::string StorePath(const Flags& f, RecordLayout layout);
std::string KeyFilePath(const Flags& f);

// Makes (or reuses) the stores for `layouts` and, with `need_keys`, the key file.
absl::Status Populate(const Workload& w, const std::set<RecordLayout>& layouts, bool need_keys);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_STORE_H_
