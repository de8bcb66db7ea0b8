// SPDX-License-Identifier: Apache-2.0
// Tests of the GPU/CPU tiers (engine/tier_cache.h) and of the device-memory backends
// (kernels/device_memory.h). The tiers run on host memory, or on a test DeviceMemory that counts
// what it is asked to do; the CUDA tests skip without a device.
#include "engine/tier_cache.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace ckv::engine {
namespace {

constexpr size_t kRecord = 1024;

ChunkKey Chunk(uint64_t i) { return ChunkKey{i, ~i}; }
RecordId Id(uint64_t chunk, uint32_t layer = 0) { return RecordId{Chunk(chunk), layer}; }

// A record's bytes are a function of its id and size, so any served copy can be checked.
std::vector<std::byte> Bytes(const RecordId& id, size_t size = kRecord) {
  std::vector<std::byte> b(size);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>((id.chunk.hi * 31 + id.record * 7 + i) & 0xff);
  }
  return b;
}
bool Intact(const TierManager::Handle& h, const RecordId& id) {
  return h && std::memcmp(h.data(), Bytes(id, h.size()).data(), h.size()) == 0;
}

// What a TestMemory was asked to do.
struct Counters {
  std::atomic<int64_t> allocated_bytes{0};  // outstanding
  std::atomic<int64_t> registered{0};       // outstanding host registrations
  std::atomic<int> copies{0};
  std::atomic<int> waits{0};             // CopyEvent::Wait calls begun
  std::atomic<int> fail_copies{0};       // the next this many copies fail (when waited for)
  std::atomic<int> fail_allocations{0};  // the next this many allocations fail
};

// Host memory that counts, can pretend to hold device pointers (so that the tiers register the
// CPU tier's slabs with it), can fail copies, and can hold copies back until `gate` opens (run
// in issue order then, as the interface promises).
class TestMemory final : public kernels::DeviceMemory {
 public:
  explicit TestMemory(Counters* counters, bool device = false, absl::Notification* gate = nullptr)
      : counters_(counters), device_(device), gate_(gate) {}
  std::string name() const override { return device_ ? "test-device" : "test-host"; }
  bool device_pointers() const override { return device_; }
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    for (int n = counters_->fail_allocations.load(); n > 0;) {
      if (counters_->fail_allocations.compare_exchange_weak(n, n - 1)) {
        return absl::ResourceExhaustedError(absl::StrCat(name(), ": ", bytes, " bytes"));
      }
    }
    auto p = host_->Allocate(bytes);
    if (p.ok()) {
      counters_->allocated_bytes += static_cast<int64_t>(bytes);
      absl::MutexLock lock(&mu_);
      sizes_[*p] = bytes;
    }
    return p;
  }
  void Free(std::byte* p) override {
    absl::MutexLock lock(&mu_);
    counters_->allocated_bytes -= static_cast<int64_t>(sizes_.at(p));
    sizes_.erase(p);
    host_->Free(p);
  }
  absl::StatusOr<std::unique_ptr<kernels::CopyEvent>> CopyFromHostAsync(std::byte* dst,
                                                                        const std::byte* src,
                                                                        size_t bytes) override {
    ++counters_->copies;
    bool fail = false;
    for (int n = counters_->fail_copies.load(); n > 0 && !fail;) {
      fail = counters_->fail_copies.compare_exchange_weak(n, n - 1);
    }
    absl::MutexLock lock(&mu_);
    queued_.push_back(Copy{dst, src, bytes});
    if (gate_ == nullptr) RunQueuedLocked();
    return std::unique_ptr<kernels::CopyEvent>(std::make_unique<Event>(this, fail));
  }
  absl::StatusOr<std::unique_ptr<kernels::CopyEvent>> CopyToHostAsync(std::byte* dst,
                                                                      const std::byte* src,
                                                                      size_t bytes) override {
    return CopyFromHostAsync(dst, src, bytes);
  }
  absl::Status RegisterHost(void*, size_t) override {
    ++counters_->registered;
    return absl::OkStatus();
  }
  absl::Status UnregisterHost(void*) override {
    --counters_->registered;
    return absl::OkStatus();
  }

 private:
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    size_t bytes;
  };
  class Event final : public kernels::CopyEvent {
   public:
    Event(TestMemory* memory, bool fail) : memory_(memory), fail_(fail) {}
    bool Ready() override { return memory_->gate_ == nullptr || memory_->gate_->HasBeenNotified(); }
    absl::Status Wait() override {
      ++memory_->counters_->waits;
      if (memory_->gate_ != nullptr) {
        memory_->gate_->WaitForNotification();
        absl::MutexLock lock(&memory_->mu_);
        memory_->RunQueuedLocked();
      }
      if (fail_) return absl::DataLossError("test memory: copy failed");
      return absl::OkStatus();
    }

   private:
    TestMemory* const memory_;
    const bool fail_;
  };
  void RunQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Copy& c : queued_) std::memcpy(c.dst, c.src, c.bytes);
    queued_.clear();
  }

  Counters* const counters_;
  const bool device_;
  absl::Notification* const gate_;
  const std::unique_ptr<kernels::DeviceMemory> host_ = kernels::NewHostMemory();
  absl::Mutex mu_;
  std::map<std::byte*, size_t> sizes_ ABSL_GUARDED_BY(mu_);
  std::deque<Copy> queued_ ABSL_GUARDED_BY(mu_);
};

TierManager::Handle Admit(TierManager& tiers, uint64_t chunk, double score, uint32_t layer = 0) {
  const RecordId id = Id(chunk, layer);
  auto h = tiers.Admit(id, Bytes(id), score);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : TierManager::Handle();
}

// Where the record is (a Lookup: it counts, and makes the record the most recently used).
std::optional<TierLevel> Where(TierManager& tiers, uint64_t chunk, uint32_t layer = 0) {
  TierManager::Handle h = tiers.Lookup(Id(chunk, layer));
  if (!h) return std::nullopt;
  EXPECT_TRUE(Intact(h, Id(chunk, layer))) << "chunk " << chunk << " layer " << layer;
  return h.level();
}

void ExpectWithinBudgets(const TierManager& tiers) {
  EXPECT_TRUE(tiers.CheckInvariants().ok()) << tiers.CheckInvariants();
  for (const TierStats& s :
       {tiers.stats(TierLevel::kGpu), tiers.stats(TierLevel::kCpu), tiers.summary_stats()}) {
    EXPECT_LE(s.resident_bytes, s.allocated_bytes);
    EXPECT_LE(s.allocated_bytes, s.budget_bytes);
  }
}

// The CPU tier's budget that leaves `record_bytes` to records.
uint64_t CpuBudgetFor(uint64_t record_bytes) {
  return static_cast<uint64_t>(static_cast<double>(record_bytes) / (1 - kSummaryShare));
}

TEST(HostDeviceMemoryTest, AllocatesAlignedAndCopiesAtOnce) {
  std::unique_ptr<kernels::DeviceMemory> host = kernels::NewHostMemory();
  EXPECT_EQ(host->name(), "host");
  EXPECT_FALSE(host->device_pointers());
  auto p = host->Allocate(3 * kRecord);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % kernels::kDeviceAlignment, 0u);
  EXPECT_TRUE(host->RegisterHost(*p, 3 * kRecord).ok());
  const std::vector<std::byte> src = Bytes(Id(7), 3 * kRecord);
  auto copied = host->CopyFromHostAsync(*p, src.data(), src.size());
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_TRUE((*copied)->Ready());
  EXPECT_TRUE((*copied)->Wait().ok());
  std::vector<std::byte> back(src.size());
  auto returned = host->CopyToHostAsync(back.data(), *p, back.size());
  ASSERT_TRUE(returned.ok() && (*returned)->Wait().ok());
  EXPECT_EQ(back, src);
  EXPECT_TRUE(host->UnregisterHost(*p).ok());
  host->Free(*p);
}

TEST(TierManagerTest, FillsTheGpuTierThenDisplacesItsLowestIntoTheCpuTier) {
  TierManager tiers(2 * kRecord, CpuBudgetFor(2 * kRecord));
  Admit(tiers, 1, 1.0);
  Admit(tiers, 2, 2.0);
  EXPECT_EQ(Where(tiers, 1), TierLevel::kGpu);
  EXPECT_EQ(Where(tiers, 2), TierLevel::kGpu);
  Admit(tiers, 3, 3.0);  // beats 1: 1 drops to the CPU tier
  EXPECT_EQ(Where(tiers, 3), TierLevel::kGpu);
  EXPECT_EQ(Where(tiers, 1), TierLevel::kCpu);
  Admit(tiers, 4, 0.5);  // beats nothing on the GPU; the CPU tier has room
  EXPECT_EQ(Where(tiers, 4), TierLevel::kCpu);
  Admit(tiers, 5, 5.0);  // displaces 2 (2.0) to the CPU tier, which displaces 4 (0.5): dropped
  EXPECT_EQ(Where(tiers, 5), TierLevel::kGpu);
  EXPECT_EQ(Where(tiers, 2), TierLevel::kCpu);
  EXPECT_EQ(Where(tiers, 4), std::nullopt);
  auto low = tiers.Admit(Id(6), Bytes(Id(6)), 0.1);  // beats nothing anywhere
  ASSERT_TRUE(low.ok());
  EXPECT_FALSE(*low);
  const TierStats gpu = tiers.stats(TierLevel::kGpu), cpu = tiers.stats(TierLevel::kCpu);
  EXPECT_EQ(gpu.admissions, 4u);  // 1, 2, 3, 5
  EXPECT_EQ(gpu.demotions, 2u);
  EXPECT_EQ(gpu.drops, 0u);
  EXPECT_EQ(cpu.admissions, 3u);  // 1 and 2 demoted, 4 admitted
  EXPECT_EQ(cpu.drops, 1u);
  EXPECT_EQ(gpu.refusals, 2u);  // 4 and 6
  EXPECT_EQ(cpu.refusals, 1u);  // 6
  EXPECT_EQ(gpu.records, 2u);
  EXPECT_EQ(cpu.records, 2u);
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, EqualScoresGoToTheLeastRecentlyUsed) {
  TierManager tiers(2 * kRecord, 0);
  Admit(tiers, 1, 1.0);
  Admit(tiers, 2, 1.0);
  ASSERT_TRUE(Where(tiers, 1).has_value());  // a use: 2 is now the least recent
  Admit(tiers, 3, 1.0);                      // a newcomer beats an equal score
  EXPECT_EQ(Where(tiers, 2), std::nullopt);
  EXPECT_EQ(Where(tiers, 1), TierLevel::kGpu);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).drops, 1u);  // no CPU tier: displaced means dropped
}

TEST(TierManagerTest, PinnedRecordsAreNeverEvicted) {
  TierManager tiers(2 * kRecord, CpuBudgetFor(kRecord));
  TierManager::Handle a = Admit(tiers, 1, 1.0), b = Admit(tiers, 2, 1.0);
  TierManager::Handle c = Admit(tiers, 3, 100.0);  // GPU all pinned: goes to the CPU tier
  ASSERT_TRUE(c);
  EXPECT_EQ(c.level(), TierLevel::kCpu);
  TierManager::Handle d = Admit(tiers, 4, 200.0);  // nowhere: everything is pinned
  EXPECT_FALSE(d);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).refusals, 2u);
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).refusals, 1u);
  a.Release();
  TierManager::Handle e = Admit(tiers, 5, 300.0);  // 1 is unpinned now: it goes (and is dropped)
  EXPECT_EQ(e.level(), TierLevel::kGpu);
  EXPECT_EQ(Where(tiers, 1), std::nullopt);
  EXPECT_TRUE(Intact(b, Id(2)));
  EXPECT_TRUE(Intact(c, Id(3)));
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, AnErasedPinnedRecordStaysValidUntilReleased) {
  TierManager tiers(4 * kRecord, 0);
  TierManager::Handle h = Admit(tiers, 1, 1.0);
  ASSERT_TRUE(tiers.Admit(Id(1, 3), Bytes(Id(1, 3)), 1.0).ok());  // another layer, unpinned
  tiers.Erase(Chunk(1));
  EXPECT_EQ(Where(tiers, 1), std::nullopt);
  EXPECT_EQ(Where(tiers, 1, 3), std::nullopt);
  EXPECT_TRUE(Intact(h, Id(1)));
  TierStats s = tiers.stats(TierLevel::kGpu);
  EXPECT_EQ(s.resident_bytes, kRecord);  // only the pinned one
  EXPECT_EQ(s.evictions, 2u);
  // Its slot is still taken: three more fit, not four.
  for (uint64_t c = 10; c < 14; ++c) Admit(tiers, c, 1.0);
  EXPECT_TRUE(Intact(h, Id(1)));
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).records, 4u);
  ExpectWithinBudgets(tiers);
  h.Release();
  s = tiers.stats(TierLevel::kGpu);
  EXPECT_EQ(s.resident_bytes, 3 * kRecord);
  EXPECT_EQ(s.records, 3u);
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, ScoreUpdatesReorder) {
  TierManager tiers(3 * kRecord, 0);
  Admit(tiers, 1, 1.0, /*layer=*/0);
  Admit(tiers, 1, 1.0, /*layer=*/1);
  Admit(tiers, 2, 2.0);
  tiers.UpdateScore(Chunk(1), 10.0);  // both of chunk 1's records
  Admit(tiers, 3, 5.0);               // now displaces 2, not chunk 1
  EXPECT_EQ(Where(tiers, 2), std::nullopt);
  EXPECT_EQ(Where(tiers, 1, 0), TierLevel::kGpu);
  EXPECT_EQ(Where(tiers, 1, 1), TierLevel::kGpu);
  tiers.UpdateScore(Chunk(1), 0.0);
  Admit(tiers, 4, 1.0);  // displaces the least recently used of chunk 1: layer 0
  EXPECT_EQ(Where(tiers, 1, 0), std::nullopt);
  EXPECT_EQ(Where(tiers, 1, 1), TierLevel::kGpu);
}

TEST(TierManagerTest, AdmitFromTheCpuLevelSkipsTheGpuTier) {
  TierManager tiers(4 * kRecord, CpuBudgetFor(4 * kRecord));
  auto h = tiers.Admit(Id(1), Bytes(Id(1)), 9.0, TierLevel::kCpu);
  ASSERT_TRUE(h.ok() && *h);
  EXPECT_EQ(h->level(), TierLevel::kCpu);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).refusals, 0u);
}

TEST(TierManagerTest, AHitCopiesNothing) {
  Counters counters;
  TierManager tiers(4 * kRecord, CpuBudgetFor(4 * kRecord),
                    std::make_unique<TestMemory>(&counters));
  Admit(tiers, 1, 1.0);
  EXPECT_EQ(counters.copies.load(), 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Where(tiers, 1), TierLevel::kGpu);
  Admit(tiers, 1, 1.0);  // cached already: returned where it is
  EXPECT_EQ(counters.copies.load(), 1);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).hits, 5u);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).admissions, 1u);
  EXPECT_EQ(Where(tiers, 2), std::nullopt);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).misses, 1u);
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).misses, 1u);  // a GPU miss goes on to the CPU tier
}

TEST(TierManagerTest, DeviceTiersRegisterTheCpuSlabsAndReturnAllMemory) {
  Counters gpu, cpu;
  {
    TierManager tiers(2 * kRecord, CpuBudgetFor(2 * kRecord),
                      std::make_unique<TestMemory>(&gpu, /*device=*/true),
                      std::make_unique<TestMemory>(&cpu));
    TierManager::Handle h = Admit(tiers, 1, 3.0);
    EXPECT_TRUE(h.device_pointer());
    for (uint64_t c = 2; c < 6; ++c) Admit(tiers, c, static_cast<double>(c));
    EXPECT_EQ(Where(tiers, 4), TierLevel::kCpu);  // demoted: copied back by the device
    ASSERT_TRUE(tiers.PutSummaries(Chunk(1), 0, Bytes(Id(1), 100)).ok());
    EXPECT_GT(gpu.allocated_bytes.load(), 0);
    EXPECT_GT(cpu.allocated_bytes.load(), 0);
    EXPECT_GE(gpu.registered.load(), 2) << "the CPU tier's and the summaries' slabs";
    ExpectWithinBudgets(tiers);
  }
  EXPECT_EQ(gpu.allocated_bytes.load(), 0);
  EXPECT_EQ(cpu.allocated_bytes.load(), 0);
  EXPECT_EQ(gpu.registered.load(), 0);
}

TEST(TierManagerTest, BudgetsHoldWithTwoRecordSizes) {
  Counters counters;
  constexpr size_t kBig = 3 * kRecord;
  // Slabs of 1/16 of the budget: one small record each.
  TierManager tiers(16 * kRecord, 0, std::make_unique<TestMemory>(&counters));
  for (uint64_t c = 0; c < 16; ++c) Admit(tiers, c, static_cast<double>(c));
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).allocated_bytes, 16 * kRecord);
  // A big record that outranks the lowest three: their slabs are emptied and returned.
  auto big = tiers.Admit(Id(100), Bytes(Id(100), kBig), 50.0);
  ASSERT_TRUE(big.ok() && *big);
  EXPECT_TRUE(Intact(*big, Id(100)));
  for (uint64_t c = 0; c < 3; ++c) EXPECT_EQ(Where(tiers, c), std::nullopt) << c;
  for (uint64_t c = 3; c < 16; ++c) EXPECT_EQ(Where(tiers, c), TierLevel::kGpu) << c;
  // One that outranks nothing is refused.
  auto low = tiers.Admit(Id(101), Bytes(Id(101), kBig), 0.5);
  ASSERT_TRUE(low.ok());
  EXPECT_FALSE(*low);
  EXPECT_LE(counters.allocated_bytes.load(), static_cast<int64_t>(16 * kRecord));
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, AUserWithoutSummariesKeepsTheWholeCpuBudgetForRecords) {
  // The benchmark's baselines use no summaries: a share kept for them would shrink their tier.
  const uint64_t cpu_budget = 64 * kRecord;
  TierManager tiers(0, cpu_budget, nullptr, nullptr, /*summary_share=*/0.0);
  EXPECT_EQ(tiers.summary_stats().budget_bytes, 0u);
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).budget_bytes, cpu_budget);
  for (uint64_t c = 0; c < 64; ++c) Admit(tiers, c, 1e9);
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).records, 64u);
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, SummariesKeepTheirShareAndRankByLastUse) {
  const uint64_t cpu_budget = 64 * kRecord;
  TierManager tiers(0, cpu_budget);
  const TierStats share = tiers.summary_stats();
  EXPECT_EQ(share.budget_bytes, static_cast<uint64_t>(cpu_budget * kSummaryShare));
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).budget_bytes, cpu_budget - share.budget_bytes);
  const uint64_t fit = share.budget_bytes / kRecord;  // 16 parts of kRecord
  std::vector<TierManager::Handle> pins;
  for (uint64_t p = 0; p < fit; ++p) {
    auto h = tiers.PutSummaries(Chunk(p), 0, Bytes(Id(p, kSummaryRecord)));
    ASSERT_TRUE(h.ok() && *h);
    EXPECT_EQ(h->level(), TierLevel::kCpu);
    if (p == 0) pins.push_back(std::move(*h));
  }
  // Records fill the rest of the tier, and never displace a summary part.
  for (uint64_t c = 0; c < 200; ++c) Admit(tiers, 1000 + c, 1e9);
  EXPECT_EQ(tiers.summary_stats().records, fit);
  EXPECT_TRUE(Intact(tiers.GetSummaries(Chunk(1), 0), Id(1, kSummaryRecord)));
  // Scores do not touch them; a new part displaces the least recently used unpinned one: 2
  // (0 is pinned, 1 was just used).
  tiers.UpdateScore(Chunk(2), 1e12);
  ASSERT_TRUE(tiers.PutSummaries(Chunk(99), 0, Bytes(Id(99, kSummaryRecord))).ok());
  EXPECT_FALSE(tiers.GetSummaries(Chunk(2), 0));
  EXPECT_TRUE(tiers.GetSummaries(Chunk(0), 0));
  // The record-id spelling reaches the same cache.
  EXPECT_TRUE(Intact(tiers.Lookup(RecordId{Chunk(99), kSummaryRecord}), Id(99, kSummaryRecord)));
  EXPECT_FALSE(tiers.GetSummaries(Chunk(99), 1)) << "another part";
  // A part that would wrap around into record indices is refused.
  EXPECT_EQ(tiers.PutSummaries(Chunk(99), kSummaryRecord, Bytes(Id(99))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tiers.GetSummaries(Chunk(99), kSummaryRecord));
  tiers.Erase(Chunk(99));
  EXPECT_FALSE(tiers.GetSummaries(Chunk(99), 0));
  const TierStats s = tiers.summary_stats();
  EXPECT_EQ(s.drops, 1u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_GE(s.hits, 3u);
  ExpectWithinBudgets(tiers);
}

TEST(TierManagerTest, AFailedCopyIsNotCached) {
  Counters counters;
  TierManager tiers(2 * kRecord, CpuBudgetFor(2 * kRecord),
                    std::make_unique<TestMemory>(&counters));
  counters.fail_copies = 1;
  auto h = tiers.Admit(Id(1), Bytes(Id(1)), 1.0);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << h.status();
  EXPECT_EQ(Where(tiers, 1), std::nullopt);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).errors, 1u);
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).records, 0u);
  EXPECT_TRUE(Admit(tiers, 1, 1.0));  // the slot is free again
  EXPECT_EQ(tiers.Admit(Id(2), {}, 1.0).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectWithinBudgets(tiers);
}

// Regression: an allocation failure in the GPU tier returned the error at once, so a device out
// of memory kept the CPU tier empty too.
TEST(TierManagerTest, AFailingGpuTierPassesTheRecordToTheCpuTier) {
  Counters gpu, cpu;
  TierManager tiers(2 * kRecord, CpuBudgetFor(2 * kRecord),
                    std::make_unique<TestMemory>(&gpu, /*device=*/true),
                    std::make_unique<TestMemory>(&cpu));
  gpu.fail_allocations = 1;
  TierManager::Handle first = Admit(tiers, 1, 1.0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first.level(), TierLevel::kCpu);
  EXPECT_TRUE(Intact(first, Id(1)));
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).errors, 1u);
  EXPECT_EQ(tiers.stats(TierLevel::kCpu).admissions, 1u);
  TierManager::Handle second = Admit(tiers, 2, 1.0);  // the device has memory again
  ASSERT_TRUE(second);
  EXPECT_EQ(second.level(), TierLevel::kGpu);
  ExpectWithinBudgets(tiers);

  // Cached nowhere: the error names the tier and the record.
  TierManager gpu_only(2 * kRecord, 0, std::make_unique<TestMemory>(&gpu, /*device=*/true));
  gpu.fail_allocations = 1;
  auto h = gpu_only.Admit(Id(3), Bytes(Id(3)), 1.0);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << h.status();
  EXPECT_NE(h.status().message().find("GPU tier: record " + Chunk(3).ToHex() + "/0"),
            std::string::npos)
      << h.status();
  ExpectWithinBudgets(gpu_only);
}

TEST(TierManagerTest, ALookupWaitsForACopyStillRunning) {
  Counters counters;
  absl::Notification gate;
  TierManager tiers(2 * kRecord, 0,
                    std::make_unique<TestMemory>(&counters, /*device=*/false, &gate));
  std::thread admitter([&] { EXPECT_TRUE(Intact(Admit(tiers, 1, 1.0), Id(1))); });
  std::thread reader([&] {
    while (counters.waits.load() == 0) std::this_thread::yield();  // the admitter waits
    EXPECT_TRUE(Intact(tiers.Lookup(Id(1)), Id(1)));  // served once its bytes are there
  });
  // Both wait for the copy, which has not run: its bytes are not in the tier yet.
  while (counters.waits.load() < 2) std::this_thread::yield();
  gate.Notify();
  admitter.join();
  reader.join();
  EXPECT_EQ(tiers.stats(TierLevel::kGpu).hits, 1u);
  ExpectWithinBudgets(tiers);
}

// A reference model of the policy, for one record size, without concurrency: budgets in records.
class PolicyModel {
 public:
  struct Entry {
    RecordId id;
    size_t level;
    double score;
    uint64_t tick;
    int pins = 0;
    bool erased = false;
  };

  PolicyModel(size_t gpu_records, size_t cpu_records) : capacity_{gpu_records, cpu_records} {}

  // The entry id of the admitted record, or -1.
  int Admit(const RecordId& id, double score) {
    if (int e = Find(id); e >= 0) return Pin(e);
    const uint64_t tick = ++tick_;
    for (size_t level = 0; level < kTierLevels; ++level) {
      if (int e = Place(level, id, score, tick); e >= 0) return Pin(e);
    }
    return -1;
  }
  int Lookup(const RecordId& id) {
    const int e = Find(id);
    for (size_t level = 0; level < kTierLevels; ++level) {
      if (e >= 0 && entries_[e].level == level) {
        stats_[level].hits++;
        break;
      }
      stats_[level].misses++;
    }
    return e >= 0 ? Pin(e) : -1;
  }
  void Release(int e) { entries_[e].pins--; }
  void UpdateScore(const ChunkKey& chunk, double score) {
    for (Entry& e : entries_) {
      if (Live(e) && !e.erased && e.id.chunk == chunk) e.score = score;
    }
  }
  void Erase(const ChunkKey& chunk) {
    for (Entry& e : entries_) {
      if (Live(e) && !e.erased && e.id.chunk == chunk) {
        stats_[e.level].evictions++;
        e.erased = true;
      }
    }
  }
  const TierStats& stats(size_t level) const { return stats_[level]; }
  const Entry& entry(int e) const { return entries_[e]; }

 private:
  static bool Live(const Entry& e) { return !e.erased || e.pins > 0; }
  int Find(const RecordId& id) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (Live(entries_[i]) && !entries_[i].erased && entries_[i].id == id) return int(i);
    }
    return -1;
  }
  int Pin(int e) {
    entries_[e].pins++;
    entries_[e].tick = ++tick_;
    return e;
  }
  int Place(size_t level, const RecordId& id, double score, uint64_t tick) {
    size_t used = 0;
    int lowest = -1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.level != level || !Live(e)) continue;
      ++used;
      if (e.pins == 0 &&
          (lowest < 0 ||
           std::tie(e.score, e.tick) < std::tie(entries_[lowest].score, entries_[lowest].tick))) {
        lowest = int(i);
      }
    }
    if (used >= capacity_[level]) {
      if (capacity_[level] == 0 || lowest < 0 ||
          !(std::tie(entries_[lowest].score, entries_[lowest].tick) < std::tie(score, tick))) {
        stats_[level].refusals++;
        return -1;
      }
      Entry v = entries_[lowest];
      entries_[lowest].erased = true;  // gone: unpinned, so no longer live
      bool kept = level == 0 && Place(1, v.id, v.score, v.tick) >= 0;
      (kept ? stats_[level].demotions : stats_[level].drops)++;
    }
    stats_[level].admissions++;
    entries_.push_back(Entry{id, level, score, tick});
    return int(entries_.size() - 1);
  }

  const size_t capacity_[kTierLevels];
  std::vector<Entry> entries_;
  TierStats stats_[kTierLevels];
  uint64_t tick_ = 0;
};

TEST(TierManagerTest, FollowsAReferenceModelOfThePolicy) {
  constexpr size_t kGpuRecords = 6, kCpuRecords = 8;
  TierManager tiers(kGpuRecords * kRecord, CpuBudgetFor(kCpuRecords * kRecord));
  PolicyModel model(kGpuRecords, kCpuRecords);
  std::mt19937_64 rng(7);
  std::vector<std::pair<int, TierManager::Handle>> held;  // model entry, handle
  for (int op = 0; op < 4000; ++op) {
    SCOPED_TRACE(op);
    const RecordId id = Id(rng() % 20, static_cast<uint32_t>(rng() % 2));
    const double score = static_cast<double>(rng() % 6);  // few values: many ties
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {
        auto h = tiers.Admit(id, Bytes(id), score);
        ASSERT_TRUE(h.ok()) << h.status();
        const int e = model.Admit(id, score);
        ASSERT_EQ(bool(*h), e >= 0);
        if (e < 0) break;
        ASSERT_EQ(static_cast<size_t>(h->level()), model.entry(e).level);
        ASSERT_TRUE(Intact(*h, id));
        held.emplace_back(e, std::move(*h));
        break;
      }
      case 3: {
        TierManager::Handle h = tiers.Lookup(id);
        const int e = model.Lookup(id);
        ASSERT_EQ(bool(h), e >= 0);
        if (e < 0) break;
        ASSERT_EQ(static_cast<size_t>(h.level()), model.entry(e).level);
        held.emplace_back(e, std::move(h));
        break;
      }
      case 4:
        tiers.UpdateScore(id.chunk, score);
        model.UpdateScore(id.chunk, score);
        break;
      case 5:
        if (rng() % 4 != 0) break;
        tiers.Erase(id.chunk);
        model.Erase(id.chunk);
        break;
      default:
        // Hold a few at a time; release one at random.
        while (!held.empty() && (held.size() > 4 || rng() % 2 == 0)) {
          const size_t i = rng() % held.size();
          model.Release(held[i].first);
          held.erase(held.begin() + static_cast<long>(i));
        }
    }
    for (size_t level = 0; level < kTierLevels; ++level) {
      const TierStats got = tiers.stats(static_cast<TierLevel>(level));
      const TierStats& want = model.stats(level);
      ASSERT_EQ(got.admissions, want.admissions) << "level " << level;
      ASSERT_EQ(got.demotions, want.demotions) << "level " << level;
      ASSERT_EQ(got.drops, want.drops) << "level " << level;
      ASSERT_EQ(got.refusals, want.refusals) << "level " << level;
      ASSERT_EQ(got.evictions, want.evictions) << "level " << level;
      ASSERT_EQ(got.hits, want.hits) << "level " << level;
      ASSERT_EQ(got.misses, want.misses) << "level " << level;
    }
    ASSERT_TRUE(tiers.CheckInvariants().ok()) << tiers.CheckInvariants();
  }
  for (auto& [e, h] : held) ASSERT_TRUE(Intact(h, model.entry(e).id));
}

TEST(TierManagerStressTest, InvariantsHoldUnderConcurrentSessions) {
  Counters gpu, cpu;
  constexpr size_t kSizes[] = {kRecord, 3 * kRecord};  // two size classes share the tiers
  {
    TierManager tiers(32 * kRecord, CpuBudgetFor(48 * kRecord),
                      std::make_unique<TestMemory>(&gpu, /*device=*/true),
                      std::make_unique<TestMemory>(&cpu));
    std::atomic<int> failures{0};
    auto fail = [&](const std::string& what) {
      if (failures++ < 5) ADD_FAILURE() << what;
    };
    auto worker = [&](int seed) {
      std::mt19937_64 rng(seed);
      std::vector<std::pair<RecordId, TierManager::Handle>> held;
      for (int op = 0; op < 5000; ++op) {
        const uint64_t chunk = rng() % 48;
        const auto layer = static_cast<uint32_t>(rng() % 3);
        // A chunk's records all have one size, as under one model spec.
        const RecordId id = Id(chunk, layer);
        const size_t size = kSizes[chunk % 2];
        switch (rng() % 8) {
          case 0:
          case 1: {
            auto h = tiers.Admit(id, Bytes(id, size), static_cast<double>(rng() % 100));
            if (!h.ok()) fail(std::string(h.status().message()));
            if (h.ok() && *h) held.emplace_back(id, std::move(*h));
            break;
          }
          case 2: {
            TierManager::Handle h = tiers.Lookup(id);
            if (h) held.emplace_back(id, std::move(h));
            break;
          }
          case 3: {
            const RecordId part{Chunk(chunk), kSummaryRecord + layer};
            TierManager::Handle h = tiers.GetSummaries(Chunk(chunk), layer);
            if (!h) {
              auto put = tiers.PutSummaries(Chunk(chunk), layer, Bytes(part, size));
              if (!put.ok()) fail(std::string(put.status().message()));
              if (put.ok()) h = std::move(*put);
            }
            if (h) held.emplace_back(part, std::move(h));
            break;
          }
          case 4:
            tiers.UpdateScore(Chunk(chunk), static_cast<double>(rng() % 100));
            break;
          case 5:
            if (rng() % 8 == 0) tiers.Erase(Chunk(chunk));
            break;
          default:
            if (!held.empty()) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
        }
        if (held.size() > 6) held.erase(held.begin());
        // Everything this thread holds is intact and stays put, erased or displaced or not.
        for (const auto& [held_id, h] : held) {
          if (op % 4 == 0 && !Intact(h, held_id)) fail("a pinned record changed");
        }
        if (op % 64 == 0) {
          if (absl::Status s = tiers.CheckInvariants(); !s.ok()) fail(std::string(s.message()));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t + 1);
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    ExpectWithinBudgets(tiers);
    // Every record still cached holds its own bytes.
    for (uint64_t c = 0; c < 48; ++c) {
      for (uint32_t l = 0; l < 3; ++l) {
        TierManager::Handle h = tiers.Lookup(Id(c, l));
        EXPECT_TRUE(!h || Intact(h, Id(c, l))) << c << "/" << l;
      }
    }
    const TierStats g = tiers.stats(TierLevel::kGpu), c = tiers.stats(TierLevel::kCpu);
    EXPECT_GT(g.demotions, 0u);
    EXPECT_GT(c.drops, 0u);
    EXPECT_GT(g.hits + c.hits, 0u);
  }
  // No leak: the slabs went back, the registrations were undone.
  EXPECT_EQ(gpu.allocated_bytes.load(), 0);
  EXPECT_EQ(cpu.allocated_bytes.load(), 0);
  EXPECT_EQ(gpu.registered.load(), 0);
}

// The CUDA backend, compared with the host's; skips (saying why) without a device.
absl::StatusOr<std::unique_ptr<kernels::DeviceMemory>> CudaOrSkipReason() {
  auto cuda = kernels::NewCudaMemory();
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable) << cuda.status();
  }
  return cuda;
}

TEST(TierManagerCudaTest, CudaMemoryCopiesAsTheHostDoes) {
  auto cuda = CudaOrSkipReason();
  if (!cuda.ok()) GTEST_SKIP() << cuda.status().message();
  kernels::DeviceMemory& device = **cuda;
  EXPECT_EQ(device.name(), "cuda:0");
  EXPECT_TRUE(device.device_pointers());
  const std::vector<std::byte> src = Bytes(Id(5), 5 * kRecord);
  auto p = device.Allocate(src.size());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % kernels::kDeviceAlignment, 0u);
  std::vector<std::byte> back(src.size());
  ASSERT_TRUE(device.RegisterHost(back.data(), back.size()).ok());
  auto in = device.CopyFromHostAsync(*p, src.data(), src.size());
  ASSERT_TRUE(in.ok()) << in.status();
  auto out = device.CopyToHostAsync(back.data(), *p, back.size());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE((*out)->Wait().ok());
  EXPECT_TRUE((*in)->Ready());  // issued first: done first
  EXPECT_EQ(back, src);
  EXPECT_TRUE(device.UnregisterHost(back.data()).ok());
  device.Free(*p);
}

TEST(TierManagerCudaTest, TiersOnTheDevicePlaceAndServeAsOnTheHost) {
  auto cuda = CudaOrSkipReason();
  if (!cuda.ok()) GTEST_SKIP() << cuda.status().message();
  auto reader = kernels::NewCudaMemory();  // copies GPU-tier records back to check them
  ASSERT_TRUE(reader.ok()) << reader.status();
  TierManager on_device(4 * kRecord, CpuBudgetFor(4 * kRecord), std::move(*cuda));
  TierManager on_host(4 * kRecord, CpuBudgetFor(4 * kRecord));
  for (uint64_t c = 0; c < 12; ++c) {
    const double score = static_cast<double>((c * 7) % 5);
    auto d = on_device.Admit(Id(c), Bytes(Id(c)), score);
    auto h = on_host.Admit(Id(c), Bytes(Id(c)), score);
    ASSERT_TRUE(d.ok() && h.ok()) << d.status() << " " << h.status();
    ASSERT_EQ(bool(*d), bool(*h)) << c;
  }
  for (uint64_t c = 0; c < 12; ++c) {
    TierManager::Handle d = on_device.Lookup(Id(c)), h = on_host.Lookup(Id(c));
    ASSERT_EQ(bool(d), bool(h)) << c;
    if (!d) continue;
    ASSERT_EQ(d.level(), h.level()) << c;
    std::vector<std::byte> bytes(kRecord);
    if (d.device_pointer()) {
      auto copy = (*reader)->CopyToHostAsync(bytes.data(), d.data(), kRecord);
      ASSERT_TRUE(copy.ok() && (*copy)->Wait().ok());
    } else {
      std::memcpy(bytes.data(), d.data(), kRecord);
    }
    EXPECT_EQ(bytes, Bytes(Id(c))) << c;
  }
  for (TierLevel l : {TierLevel::kGpu, TierLevel::kCpu}) {
    EXPECT_EQ(on_device.stats(l).demotions, on_host.stats(l).demotions);
    EXPECT_EQ(on_device.stats(l).drops, on_host.stats(l).drops);
  }
  ExpectWithinBudgets(on_device);
}

}  // namespace
}  // namespace ckv::engine
