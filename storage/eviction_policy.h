// storage/eviction_policy.h: which chunk leaves the disk first when the store is at its cap.
//
// Only leaves are candidates (chunks that no stored chunk extends): a chunk's KV is useless
// without its parent's, so evicting an inner chunk would strand its descendants, and every use of
// a descendant is also a use of its ancestors, so an ancestor is never less valuable. Evicting a
// leaf may make its parent a leaf, which then competes like any other.
//
// Among leaves the lowest score S = I x F goes first (I: accumulated attention importance, F:
// loads into a faster tier; both zero until Re-Prefill sessions fill them), ties broken by least
// recent use. Chunks that a reader or a Put holds are never candidates (ChunkStore filters them).
//
// Thread-safety: stateless; thread-safe.
#ifndef CKV_STORAGE_EVICTION_POLICY_H_
#define CKV_STORAGE_EVICTION_POLICY_H_

#include <cstdint>

#include "ckv/chunk_key.h"

namespace ckv::storage {

struct EvictionCandidate {
  double score = 0;       // S = I x F
  uint64_t last_use = 0;  // larger = more recent
  ChunkKey key;           // final tie-break, for a deterministic order
};

class EvictionPolicy {
 public:
  static double Score(double importance, uint64_t loads) {
    return importance * static_cast<double>(loads);
  }
  // True when `a` should be evicted before `b`.
  static bool EvictBefore(const EvictionCandidate& a, const EvictionCandidate& b) {
    if (a.score != b.score) return a.score < b.score;
    if (a.last_use != b.last_use) return a.last_use < b.last_use;
    return a.key < b.key;
  }
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_EVICTION_POLICY_H_
