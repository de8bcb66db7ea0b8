// engine/tier_cache.h: the GPU and CPU tiers, records ranked by their chunk's S = I x F.
//
// Each tier keeps records (one chunk's K and V at one layer) in the memory of its DeviceMemory
// (device memory for the GPU tier; host memory for the CPU tier, and for the GPU tier in tests),
// under a byte budget it never exceeds. Records are ordered by score, then by last use: the
// lowest is the first to go.
//
// Policy (Admit, for a record just read from NVMe): it enters the GPU tier if it fits, or if it
// beats the tier's lowest unpinned records enough to make room by displacing them; each record
// it displaces drops to the CPU tier by the same rule, or is dropped (NVMe keeps every record).
// A record that does not enter the GPU tier is offered to the CPU tier by the same rule; one that
// enters neither is not cached. "Beats" compares (score, last use): at equal score the newer
// record wins. Pinned records (held by a Handle) are never evicted; when everything resident is
// pinned, new records are not cached (counted as refused).
//
// Scores are the caller's: UpdateScore re-ranks a chunk's records when its I or F change.
// Erase removes a chunk's records (deleted or evicted from the store); a pinned one stays valid
// until its last Handle goes, and its bytes count against the budget until then.
//
// Thread-safety: thread-safe; many sessions use one TierCache. Handles may be released from any
// thread. REQUIRES: every Handle is released before the TierCache is destroyed.
#ifndef CKV_ENGINE_TIER_CACHE_H_
#define CKV_ENGINE_TIER_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckv/chunk_key.h"
#include "kernels/device_memory.h"

namespace ckv::engine {

// Tiers are numbered as levels, fastest first. Do not renumber (they index the stats).
enum class TierLevel : uint8_t { kGpu = 0, kCpu = 1 };
inline constexpr size_t kTierLevels = 2;

// A record: a chunk's record at one layer, or (record >= kSummaryRecord) one of its summary
// parts, which sessions cache in the CPU tier ahead of records.
inline constexpr uint32_t kSummaryRecord = 0x80000000u;
// The rank summaries get: above any record's S.
inline constexpr double kSummaryScore = 1e300;
struct RecordId {
  ChunkKey chunk;
  uint32_t record = 0;
  friend bool operator==(const RecordId&, const RecordId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const RecordId& r) {
    return H::combine(std::move(h), r.chunk, r.record);
  }
};

struct TierStats {
  uint64_t budget_bytes = 0;
  uint64_t resident_bytes = 0;  // includes erased records still pinned
  uint64_t records = 0;
  uint64_t hits = 0;            // Lookups served from this tier
  uint64_t admissions = 0;      // records placed here (from NVMe or demoted)
  uint64_t demotions = 0;       // records displaced from here into the next tier
  uint64_t drops = 0;           // records displaced from here and cached nowhere
};

class TierCache {
 public:
  // A pinned record. Move-only; unpins when destroyed.
  class Handle {
   public:
    Handle() = default;
    Handle(Handle&& other) noexcept { *this = std::move(other); }
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { Release(); }

    explicit operator bool() const { return entry_ != nullptr; }
    TierLevel level() const;
    // The record's bytes in its tier's memory (a device pointer when device_pointer()).
    const std::byte* data() const;
    bool device_pointer() const;
    void Release();

   private:
    friend class TierCache;
    Handle(TierCache* cache, void* entry) : cache_(cache), entry_(entry) {}
    TierCache* cache_ = nullptr;
    void* entry_ = nullptr;
  };

  // Budgets in bytes (0: the tier holds nothing). `gpu_memory` / `cpu_memory`: where each keeps
  // records (host memory when null).
  TierCache(uint64_t gpu_budget_bytes, uint64_t cpu_budget_bytes,
            std::unique_ptr<kernels::DeviceMemory> gpu_memory = nullptr,
            std::unique_ptr<kernels::DeviceMemory> cpu_memory = nullptr);
  ~TierCache();
  TierCache(const TierCache&) = delete;
  TierCache& operator=(const TierCache&) = delete;

  // The record pinned where it is, or an empty Handle (a miss).
  Handle Lookup(const RecordId& id);

  // Offers a record just read from NVMe (host bytes) with its chunk's score, to the tiers from
  // `first` down. Returns it pinned where it landed, or an empty Handle when no tier took it. A
  // record already cached is returned where it is. Errors: a copy's error.
  absl::StatusOr<Handle> Admit(const RecordId& id, std::span<const std::byte> bytes, double score,
                               TierLevel first = TierLevel::kGpu);

  // Re-ranks every cached record of `chunk` (not its summaries).
  void UpdateScore(const ChunkKey& chunk, double score);
  // Removes every cached record of `chunk` (pinned ones once released).
  void Erase(const ChunkKey& chunk);

  TierStats stats(TierLevel level) const;
  uint64_t misses() const;
  uint64_t refusals() const;  // Admits that no tier took

 private:
  struct Entry {
    RecordId id;
    TierLevel level;
    std::byte* data;
    size_t bytes;
    double score;
    uint64_t tick;
    uint32_t pins = 0;
    bool erased = false;
  };
  using Rank = std::tuple<double, uint64_t, Entry*>;  // score, last use, entry
  struct Level {
    uint64_t budget = 0;
    uint64_t used = 0;
    std::unique_ptr<kernels::DeviceMemory> memory;
    std::set<Rank> unpinned;  // eviction order, lowest first
    TierStats stats;
  };

  Level& L(TierLevel level) { return levels_[static_cast<size_t>(level)]; }
  // Places `id` in `level` if it fits or can displace lower-ranked unpinned records; `copy`
  // fills the new memory. Returns the entry or nullptr.
  absl::StatusOr<Entry*> PlaceLocked(TierLevel level, const RecordId& id, size_t bytes,
                                     double score, uint64_t tick,
                                     const std::function<absl::Status(Level&, std::byte*)>& copy)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `e` out of its level into the next one if it ranks high enough there, else drops it.
  absl::Status DisplaceLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PinLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(Entry* e);

  mutable absl::Mutex mu_;
  Level levels_[kTierLevels] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RecordId, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Entry*, std::unique_ptr<Entry>> erased_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ChunkKey, std::vector<uint32_t>> by_chunk_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckv::engine

#endif  // CKV_ENGINE_TIER_CACHE_H_
