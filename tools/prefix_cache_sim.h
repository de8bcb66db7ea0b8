// SPDX-License-Identifier: Apache-2.0
// tools/prefix_cache_sim.h: a simulated prefix cache, the yardstick bench/replay_bench puts the
// store's own eviction beside.
//
// Requests arrive as chains of chunk ids (chain[i] is the parent of chain[i + 1], as chunk keys
// are hash chains). A request hits the leading chunks of its chain that the cache holds, then the
// cache takes the rest of the chain. With a capacity (in chunks), room is made first, as the
// store's Put does, by evicting the least recently used leaf (a chunk no cached chunk extends);
// an evicted leaf's parent may become a leaf and compete in turn. Only leaves go, as in the store:
// evicting an inner chunk would strand its descendants, which a prefix lookup can no longer reach,
// so leaf-only LRU is never worse than plain LRU for prefix hits. The request's own matched chunks
// are held (the store pins them during the Put), and a request that cannot make room is not
// cached (the store's ResourceExhausted). Capacity 0 is the infinite cache: the bound on hits.
//
// Memory: a few words per chunk id ever seen (ids are dense, 0..max id).
//
// Thread-safety: none; one thread.
#ifndef CKV_TOOLS_PREFIX_CACHE_SIM_H_
#define CKV_TOOLS_PREFIX_CACHE_SIM_H_

#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

namespace ckv::tools {

class PrefixLruSim {
 public:
  // capacity_chunks: most chunks held; 0 = unlimited.
  explicit PrefixLruSim(uint64_t capacity_chunks) : capacity_(capacity_chunks) {}

  // One request. Returns the number of leading chunks of `chain` the cache held.
  uint64_t Access(std::span<const uint32_t> chain);

  uint64_t chunks() const { return size_; }
  uint64_t evicted() const { return evicted_; }
  uint64_t refused() const { return refused_; }  // requests that could not be cached

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    bool present = false;
    uint32_t parent = kNone;
    uint32_t children = 0;
    uint64_t last_use = 0;
  };
  Entry& At(uint32_t id);
  // Evicts least recent leaves until `need` more chunks fit; false (nothing evicted) when they
  // cannot, because the held chain of `held_chunks` chunks ending at `held` stays.
  bool MakeRoom(uint64_t need, uint64_t held_chunks, uint32_t held);

  uint64_t capacity_;
  uint64_t size_ = 0;
  uint64_t tick_ = 0;
  uint64_t evicted_ = 0;
  uint64_t refused_ = 0;
  std::vector<Entry> entries_;
  std::set<std::pair<uint64_t, uint32_t>> leaves_;  // (last use, id)
};

}  // namespace ckv::tools

#endif  // CKV_TOOLS_PREFIX_CACHE_SIM_H_
