// SPDX-License-Identifier: Apache-2.0
// ckv/reports.h: what the store's operations return: Put's result, the stored prefixes and their
// chunks, and the reports of Verify, Repair and Gc (see ckv/engine.h).
//
// Thread-safety: plain structs, returned by value.
#ifndef CKV_REPORTS_H_
#define CKV_REPORTS_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"

namespace ckv {

// One problem Verify found.
struct VerifyProblem {
  enum class Kind : uint8_t {
    kChecksum,      // a record's bytes do not match its checksum (counted in checksum_failures)
    kUnreadable,    // a record or catalog entry could not be read (an I/O error; it may pass)
    kDamaged,       // a chunk's catalog entry is unusable: it names no valid slot or spec, its key
                    // is not the hash of its parent and tokens, its parent is not stored, or its
                    // parent links loop (such a chunk is not served)
    kInconsistent,  // derived state disagrees with what it derives from: child counts, the set
                    // of leaves, a prefix's length, a record's depth, an unknown model spec
  };
  // `layer` when the problem is not one layer's record: the chunk's, or a summary record's.
  static constexpr uint32_t kNoLayer = UINT32_MAX;

  Kind kind = Kind::kInconsistent;
  ChunkKey chunk;             // the chunk (or prefix) it concerns; zero when it is no one chunk's
  uint32_t layer = kNoLayer;  // the record's layer, for kChecksum and kUnreadable
  std::string message;        // one line naming the record or entry and the values that disagree
};

// "checksum", "unreadable", "damaged", "inconsistent".
inline const char* VerifyProblemKindName(VerifyProblem::Kind kind) {
  switch (kind) {
    case VerifyProblem::Kind::kChecksum:
      return "checksum";
    case VerifyProblem::Kind::kUnreadable:
      return "unreadable";
    case VerifyProblem::Kind::kDamaged:
      return "damaged";
    case VerifyProblem::Kind::kInconsistent:
      return "inconsistent";
  }
  return "?";
}

// The problem's message.
inline std::ostream& operator<<(std::ostream& os, const VerifyProblem& p) {
  return os << p.message;
}

// What Verify found.
struct VerifyReport {
  uint64_t chunks_checked = 0;
  uint64_t records_checked = 0;
  uint64_t bytes_checked = 0;
  uint64_t checksum_failures = 0;
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

// What Repair did.
struct RepairReport {
  // Chunks removed from the store: those that failed a check (a record's checksum, the key's
  // hash, a missing parent, a catalog entry Open could not load) and every chunk after them in
  // their prefixes (a chunk's KV depends on all before it). One line each, naming the chunk.
  std::vector<std::string> removed;
  uint64_t chunks_removed = 0;
  // Problems Repair left alone: read errors (EIO may pass), chunks a Put was still writing.
  std::vector<std::string> remaining;
  // The Verify that found them.
  VerifyReport verify;
};

// What Gc did.
struct GcReport {
  uint64_t bytes_reclaimed = 0;   // segment blocks given back to the file system
  uint64_t segments_removed = 0;  // segment files that held no chunk, deleted
};

// Where one chunk of a stored prefix lives and how it ranks (Engine::DescribePrefix).
struct ChunkPlacement {
  ChunkKey key;
  uint32_t segment = 0;   // segment id: the file segments/seg-NNNNNNNN.ckv of the store
  uint32_t slot = 0;      // its slot in that segment (docs/format.md)
  uint64_t offset = 0;    // byte offset of its layer-0 record in the segment file
  uint64_t bytes = 0;     // bytes it occupies in the segment: all records, padded, summaries too
  double importance = 0;  // I: attention importance that Re-Prefill sessions added
  uint64_t loads = 0;     // F: loads of its records that sessions counted
  // S = I x F, the rank of its records in the tiers and for eviction (docs/tiers.md).
  double score() const { return importance * static_cast<double>(loads); }
};

// A stored prefix's spec and chunks, first to last.
struct PrefixDescription {
  ModelSpec spec;
  std::vector<ChunkPlacement> chunks;
};

// Called by long operations with work done and total work (bytes), from the calling thread.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct PutResult {
  uint64_t chunks = 0;           // whole chunks of the prefix, all stored now
  uint64_t chunks_written = 0;   // of which this call wrote
  uint64_t chunks_existing = 0;  // of which were stored already (deduplicated)
  uint64_t tail_tokens = 0;      // tokens past the last whole chunk; not stored
  uint64_t bytes_written = 0;    // segment bytes this call wrote
  uint64_t chunks_evicted = 0;   // chunks this call evicted to stay under the cap
  ChunkKey prefix_id;            // key of the last chunk: the id ListPrefixes reports
};

// How much of a prompt could be served (Engine::Probe): its leading whole chunks stored here, and
// how many chunks after them the remote tier holds in an unbroken chain (0 without a remote tier,
// or when the cluster cannot be reached in time).
struct PrefixExtent {
  uint64_t local_chunks = 0;
  uint64_t remote_chunks = 0;
  uint64_t chunks() const { return local_chunks + remote_chunks; }
};

// One stored prefix: a chain of chunks that a Put ended at (or that eviction trimmed to).
struct PrefixInfo {
  ChunkKey id;  // the key of its last chunk; names the prefix
  std::string model_id;
  ChunkKey model_fingerprint;
  uint64_t chunks = 0;
  uint64_t tokens = 0;          // chunks * chunk_tokens
  uint64_t bytes = 0;           // segment bytes of all its chunks (shared chunks counted in each)
  int64_t created_unix_ms = 0;  // when the Put that made it committed
};

}  // namespace ckv

#endif  // CKV_REPORTS_H_
