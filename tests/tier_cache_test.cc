// Tests of the GPU/CPU tiers (engine/tier_cache.h) on host memory.
#include "engine/tier_cache.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace ckv::engine {
namespace {

constexpr size_t kRecord = 1024;

ChunkKey Chunk(uint64_t i) { return ChunkKey{i, ~i}; }
RecordId Id(uint64_t chunk, uint32_t layer = 0) { return RecordId{Chunk(chunk), layer}; }

// A record's bytes are a function of its id, so any served copy can be checked.
std::vector<std::byte> Bytes(const RecordId& id) {
  std::vector<std::byte> b(kRecord);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>((id.chunk.hi * 31 + id.record * 7 + i) & 0xff);
  }
  return b;
}

// Host memory that counts copies in.
class CountingMemory final : public kernels::DeviceMemory {
 public:
  explicit CountingMemory(std::atomic<int>* copies) : copies_(copies) {}
  std::string name() const override { return "counting"; }
  bool device_pointers() const override { return false; }
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override { return host_->Allocate(bytes); }
  void Free(std::byte* p) override { host_->Free(p); }
  absl::Status CopyFromHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    ++*copies_;
    return host_->CopyFromHost(dst, src, bytes);
  }
  absl::Status CopyToHost(std::byte* dst, const std::byte* src, size_t bytes) override {
    return host_->CopyToHost(dst, src, bytes);
  }

 private:
  std::atomic<int>* copies_;
  std::unique_ptr<kernels::DeviceMemory> host_ = kernels::NewHostMemory();
};

TierCache::Handle Admit(TierCache& cache, uint64_t chunk, double score) {
  const RecordId id = Id(chunk);
  auto h = cache.Admit(id, Bytes(id), score);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : TierCache::Handle();
}

std::optional<TierLevel> Where(TierCache& cache, uint64_t chunk) {
  TierCache::Handle h = cache.Lookup(Id(chunk));
  if (!h) return std::nullopt;
  EXPECT_EQ(0, std::memcmp(h.data(), Bytes(Id(chunk)).data(), kRecord)) << "chunk " << chunk;
  return h.level();
}

TEST(TierCacheTest, FillsTheGpuTierThenDisplacesItsLowestIntoTheCpuTier) {
  TierCache cache(2 * kRecord, 2 * kRecord);
  Admit(cache, 1, 1.0);
  Admit(cache, 2, 2.0);
  EXPECT_EQ(Where(cache, 1), TierLevel::kGpu);
  EXPECT_EQ(Where(cache, 2), TierLevel::kGpu);
  Admit(cache, 3, 3.0);  // beats 1: 1 drops to the CPU tier
  EXPECT_EQ(Where(cache, 3), TierLevel::kGpu);
  EXPECT_EQ(Where(cache, 1), TierLevel::kCpu);
  Admit(cache, 4, 0.5);  // beats nothing on the GPU; the CPU tier has room
  EXPECT_EQ(Where(cache, 4), TierLevel::kCpu);
  Admit(cache, 5, 5.0);  // displaces 2 (2.0) to the CPU tier, which displaces 4 (0.5): dropped
  EXPECT_EQ(Where(cache, 5), TierLevel::kGpu);
  EXPECT_EQ(Where(cache, 2), TierLevel::kCpu);
  EXPECT_EQ(Where(cache, 4), std::nullopt);
  EXPECT_EQ(cache.stats(TierLevel::kGpu).demotions, 2u);
  EXPECT_EQ(cache.stats(TierLevel::kCpu).drops, 1u);
  auto low = cache.Admit(Id(6), Bytes(Id(6)), 0.1);  // beats nothing anywhere
  ASSERT_TRUE(low.ok());
  EXPECT_FALSE(*low);
  EXPECT_EQ(cache.refusals(), 1u);
  for (TierLevel l : {TierLevel::kGpu, TierLevel::kCpu}) {
    EXPECT_LE(cache.stats(l).resident_bytes, cache.stats(l).budget_bytes);
  }
}

TEST(TierCacheTest, EqualScoresGoToTheLeastRecentlyUsed) {
  TierCache cache(2 * kRecord, 0);
  Admit(cache, 1, 1.0);
  Admit(cache, 2, 1.0);
  ASSERT_TRUE(Where(cache, 1).has_value());  // a use: 2 is now the least recent
  Admit(cache, 3, 1.0);
  EXPECT_EQ(Where(cache, 2), std::nullopt);
  EXPECT_EQ(Where(cache, 1), TierLevel::kGpu);
}

TEST(TierCacheTest, PinnedRecordsAreNeverEvicted) {
  TierCache cache(2 * kRecord, kRecord);
  TierCache::Handle a = Admit(cache, 1, 1.0), b = Admit(cache, 2, 1.0);
  TierCache::Handle c = Admit(cache, 3, 100.0);  // GPU all pinned: goes to the CPU tier
  ASSERT_TRUE(c);
  EXPECT_EQ(c.level(), TierLevel::kCpu);
  TierCache::Handle d = Admit(cache, 4, 200.0);  // nowhere: everything is pinned
  EXPECT_FALSE(d);
  a.Release();
  TierCache::Handle e = Admit(cache, 5, 300.0);  // 1 is unpinned now: it goes (and is dropped)
  EXPECT_EQ(e.level(), TierLevel::kGpu);
  EXPECT_EQ(Where(cache, 1), std::nullopt);
  EXPECT_EQ(0, std::memcmp(b.data(), Bytes(Id(2)).data(), kRecord));
}

TEST(TierCacheTest, AnErasedPinnedRecordStaysValidUntilReleased) {
  TierCache cache(4 * kRecord, 0);
  TierCache::Handle h = Admit(cache, 1, 1.0);
  ASSERT_TRUE(cache.Admit(Id(1, 3), Bytes(Id(1, 3)), 1.0).ok());  // another layer, unpinned
  cache.Erase(Chunk(1));
  EXPECT_EQ(Where(cache, 1), std::nullopt);
  EXPECT_EQ(0, std::memcmp(h.data(), Bytes(Id(1)).data(), kRecord));
  EXPECT_EQ(cache.stats(TierLevel::kGpu).resident_bytes, kRecord);  // only the pinned one
  h.Release();
  EXPECT_EQ(cache.stats(TierLevel::kGpu).resident_bytes, 0u);
  EXPECT_EQ(cache.stats(TierLevel::kGpu).records, 0u);
}

TEST(TierCacheTest, ScoreUpdatesReorder) {
  TierCache cache(2 * kRecord, 0);
  Admit(cache, 1, 1.0);
  Admit(cache, 2, 2.0);
  cache.UpdateScore(Chunk(1), 10.0);
  Admit(cache, 3, 5.0);  // now displaces 2, not 1
  EXPECT_EQ(Where(cache, 1), TierLevel::kGpu);
  EXPECT_EQ(Where(cache, 2), std::nullopt);
}

TEST(TierCacheTest, AHitCopiesNothing) {
  std::atomic<int> copies{0};
  TierCache cache(4 * kRecord, 4 * kRecord, std::make_unique<CountingMemory>(&copies));
  Admit(cache, 1, 1.0);
  EXPECT_EQ(copies.load(), 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Where(cache, 1), TierLevel::kGpu);
  Admit(cache, 1, 1.0);  // already cached: returned where it is
  EXPECT_EQ(copies.load(), 1);
  EXPECT_EQ(cache.stats(TierLevel::kGpu).hits, 5u);
}

TEST(TierCacheStressTest, InvariantsHoldUnderConcurrentSessions) {
  TierCache cache(16 * kRecord, 32 * kRecord);
  std::atomic<bool> bad{false};
  auto worker = [&](int seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<RecordId, TierCache::Handle>> held;
    for (int op = 0; op < 4000; ++op) {
      const uint64_t chunk = rng() % 64;
      const uint32_t layer = static_cast<uint32_t>(rng() % 3);
      switch (rng() % 6) {
        case 0:
        case 1: {
          auto h = cache.Admit(Id(chunk, layer), Bytes(Id(chunk, layer)),
                               static_cast<double>(rng() % 100));
          if (!h.ok()) bad = true;
          if (h.ok() && *h) held.emplace_back(Id(chunk, layer), std::move(*h));
          break;
        }
        case 2: {
          TierCache::Handle h = cache.Lookup(Id(chunk, layer));
          if (h) held.emplace_back(Id(chunk, layer), std::move(h));
          break;
        }
        case 3:
          cache.UpdateScore(Chunk(chunk), static_cast<double>(rng() % 100));
          break;
        case 4:
          if (rng() % 8 == 0) cache.Erase(Chunk(chunk));
          break;
        default:
          if (!held.empty()) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      }
      // Everything this thread holds is intact, wherever it is, erased or not.
      for (const auto& [id, h] : held) {
        if (std::memcmp(h.data(), Bytes(id).data(), kRecord) != 0) bad = true;
      }
      if (held.size() > 12) held.erase(held.begin());
      for (TierLevel l : {TierLevel::kGpu, TierLevel::kCpu}) {
        const TierStats s = cache.stats(l);
        if (s.resident_bytes > s.budget_bytes) bad = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(bad.load());
  // Every record still cached holds its own bytes.
  for (uint64_t c = 0; c < 64; ++c) {
    for (uint32_t l = 0; l < 3; ++l) {
      TierCache::Handle h = cache.Lookup(Id(c, l));
      if (h) {
        ASSERT_EQ(0, std::memcmp(h.data(), Bytes(Id(c, l)).data(), kRecord));
      }
    }
  }
}

TEST(TierCacheCudaTest, TheCudaMemoryIsUsableWhereADeviceIsPresent) {
  auto memory = kernels::NewCudaMemory();
  if (!memory.ok()) GTEST_SKIP() << memory.status().message();
  TierCache cache(4 * kRecord, 4 * kRecord, std::move(*memory));
  TierCache::Handle h = Admit(cache, 1, 1.0);
  ASSERT_TRUE(h);
  EXPECT_TRUE(h.device_pointer());
}

}  // namespace
}  // namespace ckv::engine
