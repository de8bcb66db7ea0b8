// SPDX-License-Identifier: Apache-2.0
// storage/eviction_policy.h: which chunk leaves the disk first when the store is at its cap.
//
// Only leaves are candidates (chunks that no stored chunk extends): a chunk's KV is useless
// without its parent's, so evicting an inner chunk would strand its descendants, and every use of
// a descendant is also a use of its ancestors, so an ancestor is never less valuable. Evicting a
// leaf may make its parent a leaf, which then competes like any other.
//
// Among leaves the least recently used goes first; the score S = I x F (I: accumulated attention
// importance, F: loads into a faster tier) only breaks ties, then the key. Chunks that a reader or
// a Put holds are never candidates (ChunkStore filters them).
//
// Why not the lowest score first: S is zero until Re-Prefill sessions fill it and never decays.
// Ranked by S, every chunk a Put just wrote (S = 0) leaves before any chunk a session ever loaded,
// however long ago: a conversation's first turn is evicted before its second turn can reuse it,
// while chunks popular once stay for good. On Mooncake-shaped traces that lost to plain LRU by up
// to 15 points of token hit rate (docs/results.md, "Capacity policy on traces"); recency first
// matches a simulated leaf-only LRU. S still ranks the records in the GPU and CPU tiers, where
// the published method uses it.
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
  // True when `a` should be evicted before `b`: less recently used, then lower score, then key.
  static bool EvictBefore(const EvictionCandidate& a, const EvictionCandidate& b) {
    if (a.last_use != b.last_use) return a.last_use < b.last_use;
    if (a.score != b.score) return a.score < b.score;
    return a.key < b.key;
  }
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_EVICTION_POLICY_H_
