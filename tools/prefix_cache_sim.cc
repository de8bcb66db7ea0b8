// SPDX-License-Identifier: Apache-2.0
// tools/prefix_cache_sim.cc: see prefix_cache_sim.h.
#include "tools/prefix_cache_sim.h"

#include <vector>

namespace ckv::tools {

PrefixLruSim::Entry& PrefixLruSim::At(uint32_t id) {
  if (id >= entries_.size()) entries_.resize(static_cast<size_t>(id) + 1);
  return entries_[id];
}

uint64_t PrefixLruSim::Access(std::span<const uint32_t> chain) {
  const uint64_t now = ++tick_;
  size_t hit = 0;
  while (hit < chain.size() && At(chain[hit]).present) {
    Entry& e = At(chain[hit]);
    if (e.children == 0) {  // a leaf: its place in the order moves
      leaves_.erase({e.last_use, chain[hit]});
      leaves_.insert({now, chain[hit]});
    }
    e.last_use = now;
    ++hit;
  }
  const uint64_t need = chain.size() - hit;
  if (need == 0) return hit;
  const uint32_t held = hit > 0 ? chain[hit - 1] : kNone;
  if (!MakeRoom(need, hit, held)) {
    ++refused_;
    return hit;
  }
  for (size_t i = hit; i < chain.size(); ++i) {
    const uint32_t parent = i > 0 ? chain[i - 1] : kNone;
    if (parent != kNone) {
      Entry& p = At(parent);
      if (p.children++ == 0) leaves_.erase({p.last_use, parent});
    }
    Entry& e = At(chain[i]);
    e = Entry{true, parent, 0, now};
    ++size_;
  }
  leaves_.insert({now, chain.back()});
  return hit;
}

bool PrefixLruSim::MakeRoom(uint64_t need, uint64_t held_chunks, uint32_t held) {
  if (capacity_ == 0) return true;
  // Everything but the held chain (whose end is held, so its ancestors are no leaves) can go.
  if (held_chunks + need > capacity_) return false;
  while (size_ + need > capacity_) {
    auto it = leaves_.begin();
    if (it->second == held) ++it;
    const uint32_t id = it->second;
    leaves_.erase(it);
    Entry& e = entries_[id];
    if (e.parent != kNone) {
      Entry& p = entries_[e.parent];
      if (--p.children == 0) leaves_.insert({p.last_use, e.parent});
    }
    e.present = false;
    --size_;
    ++evicted_;
  }
  return true;
}

}  // namespace ckv::tools
