// SPDX-License-Identifier: Apache-2.0
// storage/chunk_table.h: a map from ChunkKey to a value, laid out for tens of millions of keys.
//
// ChunkStore keeps one entry per stored chunk in RAM, in an index that scales to millions of
// chunks. A flat_hash_map<ChunkKey, Entry> sizes its slot array to a power of two at most 7/8
// full, so between 12% and 56% of its (key + entry)-sized slots are empty: at 1M chunks it held
// 2.1M slots.
// ChunkTable keeps the keys and values densely, in fixed blocks of kBlock (no reallocation, no
// slack beyond one block), and hashes only 4-byte ids into them: the empty slots of its index cost
// 4 bytes each, not sizeof(key + value).
//
// The interface is the part of flat_hash_map that ChunkStore uses: find/end, contains, at,
// operator[] on a present key, emplace, erase, size, reserve and iteration, whose elements are
// pairs of references (key, value). Erasing or emplacing invalidates iterators; references to
// values stay valid until their own key is erased (blocks never move).
//
// Thread-safety: none; ChunkStore holds its mutex.
#ifndef CKV_STORAGE_CHUNK_TABLE_H_
#define CKV_STORAGE_CHUNK_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "ckv/chunk_key.h"
#include "common/assert.h"

namespace ckv::storage {

template <typename V>
class ChunkTable {
  struct Slot {
    ChunkKey key;
    V value;
  };

 public:
  static constexpr uint32_t kBlock = 1u << 16;

  // What iteration and find give: the key and a reference to its value.
  struct Ref {
    const ChunkKey& first;
    V& second;
  };
  class iterator {
   public:
    Ref operator*() const { return Ref{table_->SlotOf(id_).key, table_->SlotOf(id_).value}; }
    // it->second.x, as with a map's iterator.
    struct Arrow {
      Ref ref;
      const Ref* operator->() const { return &ref; }
    };
    Arrow operator->() const { return Arrow{**this}; }
    iterator& operator++() {
      id_ = table_->NextLive(id_ + 1);
      return *this;
    }
    // The entry's id: stable while its key is present (ids of erased keys are reused).
    uint32_t id() const { return id_; }
    bool operator==(const iterator& o) const { return id_ == o.id_; }
    bool operator!=(const iterator& o) const { return id_ != o.id_; }

   private:
    friend class ChunkTable;
    iterator(const ChunkTable* table, uint32_t id) : table_(table), id_(id) {}
    const ChunkTable* table_;
    uint32_t id_;
  };

  ChunkTable() : index_(0, IdHash{this}, IdEq{this}) {}
  ChunkTable(const ChunkTable&) = delete;  // the index's functors point at this table
  ChunkTable& operator=(const ChunkTable&) = delete;

  size_t size() const { return index_.size(); }
  bool empty() const { return index_.empty(); }
  void reserve(size_t n) { index_.reserve(n); }

  iterator begin() const { return iterator(this, NextLive(0)); }
  iterator end() const { return iterator(this, kEnd); }
  iterator find(const ChunkKey& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? end() : iterator(this, *it);
  }
  bool contains(const ChunkKey& key) const { return index_.contains(key); }
  // REQUIRES: `key` is present.
  V& at(const ChunkKey& key) const {
    auto it = index_.find(key);
    CKV_CHECK(it != index_.end());
    return SlotOf(*it).value;
  }
  V& operator[](const ChunkKey& key) const { return at(key); }

  // Every id is below this (ids of erased keys included).
  uint32_t IdBound() const { return used_; }
  // The entry with id `id`. REQUIRES: an id of a present key.
  iterator AtId(uint32_t id) const {
    CKV_DCHECK(id < used_ && Live(id));
    return iterator(this, id);
  }
  // The key and value of the entry with id `id`. REQUIRES: an id of a present key.
  const ChunkKey& KeyAt(uint32_t id) const {
    CKV_DCHECK(id < used_ && Live(id));
    return SlotOf(id).key;
  }
  V& ValueAt(uint32_t id) const {
    CKV_DCHECK(id < used_ && Live(id));
    return SlotOf(id).value;
  }
  // Inserts `value` under `key` unless the key is present; true when it inserted.
  bool emplace(const ChunkKey& key, V value) { return Insert(key, std::move(value)) != kNoId; }
  // As emplace; returns the new entry's id, or kNoId when the key was present.
  static constexpr uint32_t kNoId = UINT32_MAX;
  uint32_t Insert(const ChunkKey& key, V value) {
    uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      if (used_ % kBlock == 0) blocks_.push_back(std::make_unique<Slot[]>(kBlock));
      id = used_++;
      live_.resize((used_ + 63) / 64);
    }
    Slot& s = SlotOf(id);
    s.key = key;
    // One probe of the index: the insert finds a present key by the id's key, which is `key`.
    if (!index_.insert(id).second) {
      free_.push_back(id);
      return kNoId;
    }
    s.value = std::move(value);
    live_[id / 64] |= uint64_t{1} << (id % 64);
    return id;
  }
  // Starts loading the index's memory for `key`, for a find soon after (a scan that looks up
  // keys at random hides the cache misses this way).
  void Prefetch(const ChunkKey& key) const { index_.prefetch(key); }
  void erase(iterator it) { EraseId(it.id_); }
  // Returns how many were erased (0 or 1).
  size_t erase(const ChunkKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return 0;
    EraseId(*it);
    return 1;
  }

  // Bytes of memory the table holds (blocks, index, free list and live bits).
  size_t MemoryBytes() const {
    return blocks_.size() * kBlock * sizeof(Slot) + index_.capacity() * (sizeof(uint32_t) + 1) +
           free_.capacity() * sizeof(uint32_t) + live_.capacity() * sizeof(uint64_t);
  }

 private:
  static constexpr uint32_t kEnd = kNoId;

  struct IdHash {
    using is_transparent = void;
    const ChunkTable* table;
    size_t operator()(uint32_t id) const { return absl::Hash<ChunkKey>()(table->SlotOf(id).key); }
    size_t operator()(const ChunkKey& key) const { return absl::Hash<ChunkKey>()(key); }
  };
  struct IdEq {
    using is_transparent = void;
    const ChunkTable* table;
    // Two ids are equal when their keys are: an insert of a new id finds a present key.
    bool operator()(uint32_t a, uint32_t b) const {
      return a == b || table->SlotOf(a).key == table->SlotOf(b).key;
    }
    bool operator()(uint32_t id, const ChunkKey& key) const { return table->SlotOf(id).key == key; }
    bool operator()(const ChunkKey& key, uint32_t id) const { return table->SlotOf(id).key == key; }
  };

  Slot& SlotOf(uint32_t id) const { return blocks_[id / kBlock][id % kBlock]; }
  bool Live(uint32_t id) const { return (live_[id / 64] >> (id % 64)) & 1; }
  uint32_t NextLive(uint32_t id) const {
    for (; id < used_; ++id) {
      if (id % 64 == 0 && live_[id / 64] == 0) {
        id += 63;  // a word of dead ids
        continue;
      }
      if (Live(id)) return id;
    }
    return kEnd;
  }
  void EraseId(uint32_t id) {
    index_.erase(id);
    live_[id / 64] &= ~(uint64_t{1} << (id % 64));
    SlotOf(id).value = V();  // frees what the value holds
    free_.push_back(id);
  }

  std::vector<std::unique_ptr<Slot[]>> blocks_;
  uint32_t used_ = 0;           // ids handed out: [0, used_)
  std::vector<uint32_t> free_;  // erased ids, reused first
  std::vector<uint64_t> live_;  // bit id set = id holds a key
  absl::flat_hash_set<uint32_t, IdHash, IdEq> index_;
};

}  // namespace ckv::storage

#endif  // CKV_STORAGE_CHUNK_TABLE_H_
