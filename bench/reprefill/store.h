// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/store.h: the benchmark's store: one ckv store per record layout that the
// systems use, plus the key files of the token-level baselines and of the engine's exact
// scoring, and impress's block file. DIR/manifest.json names the
// workload; a store whose manifest matches and which holds every prefix is reused.
//
// keys.bin holds every conversation's keys head-major, as IMPRESS and AttentionStore+H2O keep
// keys apart from values: for conversation c, layer l, kv head h, the keys of all stored tokens,
// [tokens, head_dim], back to back. One kv head's keys of a run of tokens is one read.
//
// Every system verifies what it reads (DESIGN decision 4), the baselines' own files included:
// keys.sum holds the XXH3-64 (storage::RecordChecksum) of each chunk's keys in keys.bin, one per
// (conversation, layer, kv head, chunk), and impress.sum that of each impress.bin block in token
// order, one per (conversation, layer, block); both little-endian uint64, in index order.
#ifndef CKV_BENCH_REPREFILL_STORE_H_
#define CKV_BENCH_REPREFILL_STORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/reprefill/workload.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "engine/internal.h"  // the read engine and the file system

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
  // Checksums: one per chunk of chunk_tokens tokens (the last one of a run may be shorter).
  size_t chunk_key_bytes() const { return chunk_tokens_ * key_bytes_; }
  size_t sums() const { return size_t{conversations_} * layers_ * kv_heads_ * chunks_; }
  size_t SumIndex(uint32_t c, uint32_t layer, uint32_t head, size_t chunk) const {
    return ((size_t{c} * layers_ + layer) * kv_heads_ + head) * chunks_ + chunk;
  }

 private:
  uint32_t layers_, kv_heads_, conversations_, chunk_tokens_;
  size_t chunks_;  // per run: ceil(tokens / chunk_tokens)
  size_t key_bytes_;
  uint64_t run_bytes_ = 0;
  uint64_t bytes_ = 0;
};

// A file of record halves, one per chunk: for conversation c, layer l, each whole chunk's K
// half or V half ([chunk_tokens, kv_heads, head_dim], as a record holds it) page-rounded, back
// to back in chunk order, so that one layer's halves of consecutive chunks are adjacent and the
// read engine merges their reads into large ones. Its .sum file holds the XXH3-64 of each half,
// one per (conversation, layer, chunk). Two are written:
//   scoring_keys.bin  K halves: the keys the engine's exact scoring (`ckv-paper`, and any ckv
//                     variant that scores exactly) reads through engine::ScoringKeys, as the
//                     token-level baselines read keys.bin;
//   values.bin        V halves: the values `h2o` reads for the chunks it selects, kept apart
//                     from its keys as AttentionStore+H2O would keep them.
class HalfFile {
 public:
  HalfFile(const ModelSpec& spec, size_t tokens, uint32_t conversations);
  uint32_t chunks() const { return chunks_; }          // per (conversation, layer): whole chunks
  size_t half_bytes() const { return half_bytes_; }    // a record's K (or V) half
  uint64_t slot_bytes() const { return slot_bytes_; }  // the same, page-rounded
  uint64_t bytes() const { return slot_bytes_ * sums(); }
  size_t sums() const { return size_t{conversations_} * layers_ * chunks_; }
  size_t SumIndex(uint32_t c, uint32_t layer, uint32_t chunk) const {
    return (size_t{c} * layers_ + layer) * chunks_ + chunk;
  }
  uint64_t Offset(uint32_t c, uint32_t layer, uint32_t chunk) const {
    return SumIndex(c, layer, chunk) * slot_bytes_;
  }
  // The read of (c, layer, chunk)'s half from `file` (the file `name` names, registered with the
  // read engine; `sums` its checksums) into `dest`, one slot, verified as it lands.
  prefetch::ReadRequest Read(prefetch::FileId file, const std::vector<uint64_t>& sums,
                             const char* name, uint32_t c, uint32_t layer, uint32_t chunk,
                             prefetch::Priority priority, std::span<std::byte> dest) const;

 private:
  uint32_t layers_, conversations_, chunks_;
  size_t half_bytes_;
  uint64_t slot_bytes_;
};

// impress.bin holds impress's own copy of every conversation's KV in IMPRESS's layout: for
// conversation c, layer l, each 64-token block in turn, the block's K (64 slots x kv_heads x
// head_dim) then its V, so one block of one layer is one read (qwen2.5-7b: 128 KiB). The slots
// start in token order; impress reorders them between turns (system_impress.cc), keeping the
// mapping in impress.map so that a later run can restore token order first.
class ImpressFile {
 public:
  static constexpr uint32_t kBlockTokens = 64;
  ImpressFile(const ModelSpec& spec, size_t tokens, uint32_t conversations);
  uint32_t blocks() const { return blocks_; }            // per (conversation, layer)
  uint64_t block_bytes() const { return block_bytes_; }  // K then V of one block, page-rounded
  uint64_t kv_bytes() const { return kv_bytes_; }        // of the K half (and of the V half)
  uint64_t bytes() const { return block_bytes_ * blocks_ * layers_ * conversations_; }
  uint64_t Offset(uint32_t c, uint32_t layer, uint32_t block) const {
    return ((uint64_t{c} * layers_ + layer) * blocks_ + block) * block_bytes_;
  }
  size_t sums() const { return size_t{conversations_} * layers_ * blocks_; }
  size_t SumIndex(uint32_t c, uint32_t layer, uint32_t block) const {
    return (size_t{c} * layers_ + layer) * blocks_ + block;
  }

 private:
  uint32_t layers_, conversations_, blocks_;
  uint64_t kv_bytes_, block_bytes_;
};

const char* LayoutName(RecordLayout l);

// One of the harness's stores: its records' layout and codec. Each is a store of its own under
// --store: layer-major, period-major, layer-major-int8, ...
struct StoreId {
  RecordLayout layout = RecordLayout::kLayerMajor;
  KvCodec codec = KvCodec::kNone;
  auto operator<=>(const StoreId&) const = default;
};
// layer-major, period-major-int8, ...: the store's folder under --store.
std::string StoreName(StoreId store);
std::string StorePath(const Flags& f, StoreId store);
// `spec` with `codec`: the workload's spec as a store of that codec holds it.
inline ModelSpec WithCodec(ModelSpec spec, KvCodec codec) {
  spec.codec = codec;
  return spec;
}
std::string KeyFilePath(const Flags& f);
std::string ImpressFilePath(const Flags& f);
std::string ImpressMapPath(const Flags& f);
std::string KeySumPath(const Flags& f);
std::string ImpressSumPath(const Flags& f);
std::string ScoringKeyPath(const Flags& f);
std::string ScoringKeySumPath(const Flags& f);
std::string ValueFilePath(const Flags& f);
std::string ValueSumPath(const Flags& f);

// A file of a system's own (keys.bin, impress.bin, ...), open and registered with a read
// engine, with its checksums. Unregistered by Close, or when it goes (on an error path).
struct OwnFile {
  prefetch::ReadEngine* reads = nullptr;  // set while registered
  std::unique_ptr<io::File> file;
  prefetch::FileId id = 0;
  std::vector<uint64_t> sums;

  // Opens `path`, registers it with `engine` and reads the `count` checksums of `sum_path`.
  absl::Status Open(prefetch::ReadEngine& engine, const std::string& path,
                    const std::string& sum_path, size_t count);
  // REQUIRES: none of its reads is outstanding.
  absl::Status Close();
  ~OwnFile() { Close().IgnoreError(); }
};

// The `count` checksums of a .sum file. DataLoss naming the file when it is missing or holds
// another number of them.
absl::StatusOr<std::vector<uint64_t>> ReadSums(const std::string& path, size_t count);

// What Populate makes beside the stores.
struct StoreFiles {
  bool keys = false;          // keys.bin (h2o, impress)
  bool impress = false;       // impress.bin (impress)
  bool scoring_keys = false;  // scoring_keys.bin (the engine's exact scoring)
  bool values = false;        // values.bin (h2o)
};

// Makes (or reuses) the stores `stores`, and the files `files` names.
absl::Status Populate(const Workload& w, const std::set<StoreId>& stores, const StoreFiles& files);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_STORE_H_
