// SPDX-License-Identifier: Apache-2.0
// engine/tier_cache.h: the GPU and CPU tiers, records ranked by their chunk's S = I x F.
//
// A tier caches records (one chunk's K and V at one layer, RecordId) in the memory of one
// kernels::DeviceMemory under a byte budget. TierManager holds two, numbered as levels: the GPU
// tier (level 0: device memory where a device is present; host memory in tests and elsewhere) and
// the CPU tier (level 1: host memory, registered for DMA with the GPU tier's device when it has
// one). NVMe, below them, keeps every record.
//
// Rank. A record ranks by (score, last use): the caller's S = I x F of its chunk first, then the
// tick of its last Lookup or Admit, so at equal score the least recently used ranks lowest. A
// newcomer's last use is now: it beats any record of equal score.
//
// Policy (Admit, a record just loaded from NVMe). It enters the GPU tier when the tier has room;
// else when it outranks the tier's lowest unpinned records, displacing as many of them (lowest
// first) as its bytes need. Each displaced record drops to the CPU tier by the same rule (with its
// own rank), or is dropped. A record the GPU tier does not take is offered to the CPU tier by the
// same rule; one that neither takes is not cached (each tier counts a refusal). Pinned records are
// never displaced: when everything that could make room is pinned, the record is not cached.
// Records of a chunk are re-ranked together by UpdateScore.
//
// Pins. Lookup and Admit return a Handle that pins the record where it is until released: its
// bytes stay valid and in place. Erase removes a chunk's records (it left the store); a pinned one
// leaves the index at once, stays valid until its last Handle goes, and its bytes count against
// the budget until then.
//
// Memory. Each tier takes slabs of kSlabBytes (at most 1/16 of its budget) from its DeviceMemory
// per size class (a record's bytes rounded up to kernels::kDeviceAlignment) and carves them into
// slots; a record takes a slot. The bytes of its slabs (resident + free slots) never exceed the
// budget: the last slab of a class is cut to what the budget leaves, and an empty slab of one class
// is returned to make room for another. Slabs go back to the DeviceMemory when the TierManager is
// destroyed.
//
// Copies. Admit copies the record into its slot with the DeviceMemory's asynchronous copy, and a
// displaced GPU record into its CPU slot the same way (device to host); the record is pinned while
// its copy runs, and Admit waits for the copies it issued with the lock released. A Lookup that
// finds a record whose copy is still running waits for it. A failed copy uncaches the record
// (counted in errors).
//
// Summary cache. The CPU tier keeps the summary parts of the prefixes sessions use ahead of
// records: kSummaryShare of its budget is reserved for them (records get the rest), so records
// never displace summaries. Entries are keyed by (id, part), where id is a chunk key or a prefix
// id, and rank by last use alone (UpdateScore does not touch them); Erase(id) removes them too.
//
// Thread-safety: thread-safe; many sessions share one TierManager. A Handle may be released from
// any thread. REQUIRES: every Handle is released before the TierManager is destroyed.
#ifndef CKV_ENGINE_TIER_CACHE_H_
#define CKV_ENGINE_TIER_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckv/chunk_key.h"
#include "kernels/device_memory.h"

namespace ckv::engine {

// Tiers, fastest first. Do not renumber (they index the stats).
enum class TierLevel : uint8_t { kGpu = 0, kCpu = 1 };
inline constexpr size_t kTierLevels = 2;

// Record indices from kSummaryRecord up name summary parts: RecordId{id, kSummaryRecord + part}.
// Lookup and Admit of such an id are GetSummaries and PutSummaries.
inline constexpr uint32_t kSummaryRecord = 0x80000000u;
// Share of the CPU tier's budget reserved for the summary cache.
inline constexpr double kSummaryShare = 0.25;
// Bytes a tier asks its DeviceMemory for at a time (less for budgets under 16 slabs, or when the
// budget leaves less).
inline constexpr uint64_t kSlabBytes = 2ull << 20;

// A record: chunk `chunk`'s record at layer `record` (or a summary part, see kSummaryRecord).
struct RecordId {
  ChunkKey chunk;
  uint32_t record = 0;
  friend bool operator==(const RecordId&, const RecordId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const RecordId& r) {
    return H::combine(std::move(h), r.chunk, r.record);
  }
};

// One tier's figures (or the summary cache's). Counters are since construction.
struct TierStats {
  uint64_t budget_bytes = 0;
  uint64_t allocated_bytes = 0;  // slabs taken from the DeviceMemory: resident + free; <= budget
  uint64_t resident_bytes = 0;   // bytes of the records held, erased-but-pinned ones included
  uint64_t records = 0;          // records held, erased-but-pinned ones included
  uint64_t hits = 0;             // Lookups served from here
  uint64_t misses = 0;           // Lookups that reached this tier and found nothing (a GPU miss
                                 // goes on to the CPU tier: a CPU hit is a GPU miss)
  uint64_t admissions = 0;       // records placed here: admitted, or demoted into it
  uint64_t demotions = 0;        // records displaced from here into the next tier
  uint64_t drops = 0;            // records displaced from here and cached nowhere
  uint64_t evictions = 0;        // records removed by Erase (their chunk left the store)
  uint64_t refusals = 0;         // records offered here and not taken (outranked, or too
                                 // much of the tier pinned)
  uint64_t errors = 0;           // records not cached because an allocation or copy failed
};

class TierManager {
 private:
  struct Entry;

 public:
  // A pinned record. Move-only; unpins when released or destroyed.
  class Handle {
   public:
    Handle() = default;
    Handle(Handle&& other) noexcept { *this = std::move(other); }
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { Release(); }

    explicit operator bool() const { return entry_ != nullptr; }
    // Where the record is (summaries: kCpu). REQUIRES: *this.
    TierLevel level() const;
    // The record's bytes in its tier's memory; a device pointer when device_pointer().
    const std::byte* data() const;
    size_t size() const;
    bool device_pointer() const;
    void Release();

   private:
    friend class TierManager;
    Handle(TierManager* manager, Entry* entry) : manager_(manager), entry_(entry) {}
    TierManager* manager_ = nullptr;
    Entry* entry_ = nullptr;
  };

  // Budgets in bytes (0: the tier holds nothing; the CPU budget includes the summary share).
  // `gpu_memory` / `cpu_memory`: where each tier keeps records; host memory when null.
  // `summary_share`: the share of the CPU budget kept for summaries, in [0, 1] (0 for a user
  // that keeps none, as the benchmark's baselines).
  // REQUIRES: cpu_memory, if given, returns host pointers; 0 <= summary_share <= 1.
  TierManager(uint64_t gpu_budget_bytes, uint64_t cpu_budget_bytes,
              std::unique_ptr<kernels::DeviceMemory> gpu_memory = nullptr,
              std::unique_ptr<kernels::DeviceMemory> cpu_memory = nullptr,
              double summary_share = kSummaryShare);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // The record pinned where it is (a hit), or an empty Handle (a miss). Copies nothing; waits when
  // the record's copy into its tier (another call's Admit) is still running.
  Handle Lookup(const RecordId& id);

  // Offers a record just loaded from NVMe: its bytes on the host and its chunk's score, to the
  // tiers from `first` down (see Policy). Returns it pinned where it landed (Handle::level()), or
  // an empty Handle when it was not cached; a caller that does not need the bytes to stay drops
  // the Handle. A record cached already is returned where it is, with no copy.
  // Errors: InvalidArgument for empty bytes. A tier whose allocation or copy fails counts an
  // error and passes the record on to the next tier; the first such error is returned, annotated
  // with the tier and the record, when the record is then cached nowhere (a copy that fails once
  // issued uncaches the record, and its error is returned).
  absl::StatusOr<Handle> Admit(const RecordId& id, std::span<const std::byte> bytes, double score,
                               TierLevel first = TierLevel::kGpu);

  // Re-ranks every cached record of `chunk` (not its summaries).
  void UpdateScore(const ChunkKey& chunk, double score);
  // Removes every cached record and summary part of `chunk` (pinned ones once released).
  void Erase(const ChunkKey& chunk);

  // The summary cache: part `part` (< kSummaryRecord) of the summaries of `id`. PutSummaries
  // copies `bytes` into the CPU tier's summary share, displacing the least recently used parts
  // that are not pinned; returns them pinned, or an empty Handle when they do not fit.
  // InvalidArgument for empty bytes or a part >= kSummaryRecord (GetSummaries: a miss).
  Handle GetSummaries(const ChunkKey& id, uint32_t part);
  absl::StatusOr<Handle> PutSummaries(const ChunkKey& id, uint32_t part,
                                      std::span<const std::byte> bytes);

  TierStats stats(TierLevel level) const;
  TierStats summary_stats() const;

  // For tests: OK when the internal bookkeeping agrees with itself (budgets, slabs and slots,
  // ranks, pins); Internal naming the first disagreement otherwise. O(records).
  absl::Status CheckInvariants() const;

 private:
  struct Slab;
  struct Pool;
  struct Slot {
    Slab* slab = nullptr;
    std::byte* data = nullptr;
  };
  // Copies running for entries, and the entries they fill.
  using Fills = std::vector<std::pair<Entry*, std::shared_ptr<kernels::CopyEvent>>>;
  // A copy into a new slot.
  using CopyFn = absl::FunctionRef<absl::StatusOr<std::unique_ptr<kernels::CopyEvent>>(std::byte*)>;

  // GPU, CPU and the summary cache.
  static constexpr size_t kPools = kTierLevels + 1;
  static constexpr size_t kSummaryPool = kTierLevels;

  // Admit and PutSummaries: offers the record to pools first_pool..last_pool in turn.
  absl::StatusOr<Handle> Place(size_t first_pool, size_t last_pool, const RecordId& id,
                               std::span<const std::byte> bytes, double score);
  Entry* FindLocked(const RecordId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountLookupLocked(const RecordId& id, const Entry* found) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places a record in `pool` if it has room or can make it (see Policy); `copy` fills the slot.
  // Returns the entry, pinned while its copy (added to `fills`) runs, or nullptr (refused).
  absl::StatusOr<Entry*> PlaceLocked(size_t pool, const RecordId& id, size_t bytes, double score,
                                     uint64_t tick, CopyFn copy, Fills* fills)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A slot for a record ranked (score, tick): free, new, or made by displacing lower-ranked
  // unpinned records. An empty Slot when refused; then no record has moved (empty slabs of other
  // sizes may have been returned).
  absl::StatusOr<Slot> MakeRoomLocked(size_t pool, size_t slot_bytes, double score, uint64_t tick,
                                      Fills* fills) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot, or one of a new slab within the budget; an empty Slot when the budget is spent.
  absl::StatusOr<Slot> TakeSlotLocked(Pool& pool, size_t slot_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSlabLocked(Pool& pool, size_t slot_bytes, const Slab* slab)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves an unpinned record out of its tier: into the next one if it ranks high enough there,
  // else nowhere.
  void DisplaceLocked(Entry* e, Fills* fills) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `e` out of the index; returns its ownership.
  std::unique_ptr<Entry> UnindexLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Uncaches `e`: freed now when unpinned, else when its last pin goes.
  void RemoveLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PinLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the copies a call issued (`fills`) with the lock released, then settles them: drops
  // the pin each holds, uncaching the entries whose copy failed. Only the issuer settles, so an
  // entry outlives its fill. Returns the outcome of `e`'s copy (OK when `e` has none in `fills`).
  absl::Status AwaitFills(const Fills& fills, const Entry* e) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<kernels::DeviceMemory> gpu_memory_;
  const std::unique_ptr<kernels::DeviceMemory> cpu_memory_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Pool> pools_[kPools] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RecordId, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Erased entries still pinned, owned here until their last unpin.
  absl::flat_hash_map<Entry*, std::unique_ptr<Entry>> erased_ ABSL_GUARDED_BY(mu_);
  // The record indices (and summary ids) cached per chunk.
  absl::flat_hash_map<ChunkKey, std::vector<uint32_t>> by_chunk_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

// The name sessions and the engine use.
using TierCache = TierManager;

}  // namespace ckv::engine

#endif  // CKV_ENGINE_TIER_CACHE_H_
