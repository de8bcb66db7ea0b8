// SPDX-License-Identifier: Apache-2.0
// The Engine facade: today a thin layer over storage::ChunkStore that adds the key summaries
// to every Put. Re-Prefill sessions, tiers and
// the prefetch planner join it here.
#include "ckv/engine.h"

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "engine/internal.h"
#include "engine/session.h"
#include "engine/summaries.h"
#include "kernels/cuda_kernels.h"
#include "kernels/device_memory.h"
#include "prefetch/read_engine.h"
#include "storage/chunk_store.h"

namespace ckv {
namespace {

// The storage part of the engine's options.
storage::StoreOptions StoreOptionsOf(const EngineOptions& options) {
  storage::StoreOptions o;
  o.create_if_missing = options.create_if_missing;
  o.error_if_exists = options.error_if_exists;
  o.max_disk_bytes = options.max_disk_bytes;
  o.layout = options.layout;
  o.period_layers = options.period_layers;
  o.segment_bytes = options.segment_bytes;
  o.io_backend = options.io_backend;
  o.io_queue_depth = options.io_queue_depth;
  o.max_write_bytes = options.max_write_bytes;
  o.put_staging_bytes = options.put_staging_bytes;
  o.put_direct_writes = options.put_direct_writes;
  o.logger = options.logger;
  o.reclaim_margin_bytes = options.reclaim_margin_bytes;
  return o;
}

// The storage fields of the engine's stats.
EngineStats EngineStatsOf(const storage::StoreStats& st) {
  EngineStats s;
  s.puts = st.puts;
  s.chunks_written = st.chunks_written;
  s.chunks_deduplicated = st.chunks_deduplicated;
  s.bytes_written = st.bytes_written;
  s.chunks_evicted = st.chunks_evicted;
  s.bytes_evicted = st.bytes_evicted;
  s.chunks_deleted = st.chunks_deleted;
  s.records_read = st.records_read;
  s.bytes_read = st.bytes_read;
  s.checksum_failures = st.checksum_failures;
  s.chunks = st.chunks;
  s.prefixes = st.prefixes;
  s.segments = st.segments;
  s.index_memory_bytes = st.index_memory_bytes;
  s.disk_bytes_used = st.disk_bytes_used;
  s.max_disk_bytes = st.max_disk_bytes;
  s.orphan_bytes_reclaimed = st.orphan_bytes_reclaimed;
  s.index_from_snapshot = st.index_from_snapshot;
  s.reclaim_rounds = st.reclaim_rounds;
  s.reclaim_chunks = st.reclaim_chunks;
  s.reclaim_bytes = st.reclaim_bytes;
  s.free_kept_bytes = st.free_kept_bytes;
  s.inline_evictions = st.inline_evictions;
  s.no_space_puts = st.no_space_puts;
  s.no_space_recovered = st.no_space_recovered;
  s.no_space_evictions = st.no_space_evictions;
  s.reclaim_margin_bytes = st.reclaim_margin_bytes;
  s.put_latency_p50_us = st.put_latency_p50_us;
  s.put_latency_p99_us = st.put_latency_p99_us;
  s.put_latency_max_us = st.put_latency_max_us;
  s.put_latency_window = st.put_latency_window;
  s.put_staging_waits = st.put_staging_waits;
  s.put_direct_bytes = st.put_direct_bytes;
  return s;
}

class EngineImpl final : public Engine, public engine::SessionHost {
 public:
  EngineImpl(const EngineOptions& options, storage::FileSystem* file_system,
             std::unique_ptr<storage::ChunkStore> store)
      : options_(options), file_system_(file_system), store_(std::move(store)) {
    if (options.gpu_tier_bytes > 0 || options.cpu_tier_bytes > 0) {
      // The GPU tier is device memory where a device is present, host memory otherwise.
      auto cuda = kernels::NewCudaMemory();
      tiers_ = std::make_unique<engine::TierCache>(
          options.gpu_tier_bytes, options.cpu_tier_bytes,
          cuda.ok() ? std::move(*cuda) : kernels::NewHostMemory(), kernels::NewHostMemory());
      // A chunk that leaves the store leaves the tiers: its records would only hold budget
      // until they aged out (pinned ones stay valid until their views are released).
      store_->SetRemovalListener(
          [tiers = tiers_.get()](const ChunkKey& chunk) { tiers->Erase(chunk); });
    }
  }
  // Sessions must be finished or destroyed before the engine; the read engine goes first so
  // that no read lands after the store is closed.
  ~EngineImpl() override {
    store_->SetRemovalListener(nullptr);
    reads_.reset();
  }

  absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                const KvTensors& kv) override {
    const storage::AuxRecords summaries = engine::SummaryRecords(spec, kv);
    return store_->Put(spec, tokens, kv, &summaries);
  }
  absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec,
                                  std::span<const int32_t> tokens) override {
    return store_->Lookup(spec, tokens);
  }
  absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                          std::span<std::byte> out) override {
    return store_->ReadRecord(spec, key, layer, out);
  }
  absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    return store_->Delete(spec, tokens);
  }
  absl::Status DeletePrefix(const ChunkKey& prefix_id) override {
    return store_->DeletePrefix(prefix_id);
  }
  std::vector<PrefixInfo> ListPrefixes() override { return store_->ListPrefixes(); }
  absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id,
                                                     ModelSpec* spec) override {
    return store_->PrefixChunks(prefix_id, spec);
  }
  absl::StatusOr<PrefixDescription> DescribePrefix(const ChunkKey& prefix_id) override {
    return store_->DescribePrefix(prefix_id);
  }
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress) override {
    return store_->Verify(progress);
  }
  absl::StatusOr<RepairReport> Repair(const ProgressFn& progress) override {
    return store_->Repair(progress);
  }
  absl::StatusOr<GcReport> Gc() override { return store_->Gc(); }
  EngineStats Stats() override {
    EngineStats s = EngineStatsOf(store_->Stats());
    absl::MutexLock lock(&mu_);
    const EngineStats& t = session_totals_;
    s.sessions = t.sessions;
    s.session_records_served = t.session_records_served;
    s.session_bytes_needed = t.session_bytes_needed;
    s.session_bytes_read = t.session_bytes_read;
    s.gpu_hits = t.gpu_hits;
    s.cpu_hits = t.cpu_hits;
    s.summary_cache_hits = t.summary_cache_hits;
    s.prefetched_bytes_used = t.prefetched_bytes_used;
    s.prefetched_bytes_wasted = t.prefetched_bytes_wasted;
    s.await_blocked_seconds = t.await_blocked_seconds;
    if (reads_ != nullptr) s.read_idle_with_pending_seconds = reads_->stats().idle_with_pending_seconds;
    if (tiers_ != nullptr) {
      const engine::TierStats gpu = tiers_->stats(engine::TierLevel::kGpu);
      const engine::TierStats cpu = tiers_->stats(engine::TierLevel::kCpu);
      s.gpu_tier_budget_bytes = gpu.budget_bytes;
      s.gpu_tier_resident_bytes = gpu.resident_bytes;
      s.cpu_tier_budget_bytes = cpu.budget_bytes;
      s.cpu_tier_resident_bytes = cpu.resident_bytes;
    }
    return s;
  }

  absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginReprefill(
      const ModelSpec& spec, std::span<const int32_t> tokens,
      const ReprefillOptions& options) override {
    return engine::BeginSession(*this, spec, tokens, options);
  }

  // engine::SessionHost
  storage::ChunkStore& store() override { return *store_; }
  engine::TierCache* tiers() override { return tiers_.get(); }

  void RecordSession(const SessionStats& st) override {
    absl::MutexLock lock(&mu_);
    EngineStats& t = session_totals_;
    t.sessions++;
    t.session_records_served += st.records_served;
    t.session_bytes_needed += st.bytes_needed;
    t.session_bytes_read += st.bytes_read;
    t.gpu_hits += st.gpu_hits;
    t.cpu_hits += st.cpu_hits;
    t.summary_cache_hits += st.summary_cache_hits;
    t.prefetched_bytes_used += st.prefetched_bytes_used;
    t.prefetched_bytes_wasted += st.prefetched_bytes_wasted;
    t.await_blocked_seconds += st.await_blocked_seconds;
  }

  engine::SelectorClock* selector_clock() override { return clock_.load(); }
  void set_selector_clock(engine::SelectorClock* clock) { clock_.store(clock); }
  absl::StatusOr<prefetch::ReadEngine*> reads() override {
    absl::MutexLock lock(&mu_);
    if (reads_ == nullptr) {
      prefetch::ReadEngineOptions o;
      // Reads go through the same I/O layer as the store's writes: the caller's file system
      // (the fault-injecting one in tests, over io_uring or threads alike), else the POSIX one
      // for io_backend.
      o.file_system = file_system_;
      o.backend = options_.io_backend;
      o.logger = options_.logger;
      o.clock = store_->clock();
      if (kernels::cuda::DeviceAvailable().ok()) {
        // Staging buffers a GPU tier can copy from by DMA.
        o.pin_memory = [](void* address, size_t bytes) {
          return kernels::cuda::PinHostMemory(address, bytes);
        };
        o.unpin_memory = [](void* address, size_t) { kernels::cuda::UnpinHostMemory(address); };
      }
      auto created = prefetch::ReadEngine::Create(o);
      if (!created.ok()) return created.status();
      reads_ = std::move(*created);
    }
    return reads_.get();
  }

 private:
  const EngineOptions options_;
  storage::FileSystem* const file_system_;  // nullptr: the POSIX one (engine::Seams)
  std::unique_ptr<storage::ChunkStore> store_;
  absl::Mutex mu_;
  std::unique_ptr<prefetch::ReadEngine> reads_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<engine::TierCache> tiers_;
  EngineStats session_totals_ ABSL_GUARDED_BY(mu_);  // the session fields only
  std::atomic<engine::SelectorClock*> clock_{nullptr};
};

}  // namespace

namespace engine {
SessionHost& HostOf(Engine& engine) { return dynamic_cast<EngineImpl&>(engine); }
void SetSelectorClock(Engine& engine, SelectorClock* clock) {
  dynamic_cast<EngineImpl&>(engine).set_selector_clock(clock);
}
absl::StatusOr<std::unique_ptr<Engine>> OpenWithSeams(const EngineOptions& options,
                                                      const std::string& path, const Seams& seams) {
  storage::StoreOptions store_options = StoreOptionsOf(options);
  if (seams.clock != nullptr) store_options.clock = seams.clock;
  store_options.file_system = seams.file_system;
  auto store = storage::ChunkStore::Open(store_options, path);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Engine>(new EngineImpl(options, seams.file_system, std::move(*store)));
}
}  // namespace engine

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     const std::string& path) {
  return engine::OpenWithSeams(options, path, {});
}

}  // namespace ckv
