// SPDX-License-Identifier: Apache-2.0
// The Engine facade: today a thin layer over storage::ChunkStore that adds the key summaries
// to every Put. Re-Prefill sessions, tiers and
// the prefetch planner join it here.
#include "ckv/engine.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "engine/metrics.h"
#include "engine/remote_tier.h"
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

// The storage fields of the engine's stats: the StoreStats it derives from.
EngineStats EngineStatsOf(const storage::StoreStats& st) {
  EngineStats s;
  static_cast<StoreStats&>(s) = st;
  return s;
}

// What Metrics() reports beside the stats: latencies and failures of the public calls.
struct CallMetrics {
  engine::LatencyHistogram put, lookup, await_layer, reprefill;
  engine::FailureCounters failures;
};

absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

class MeteredSession;

// What an engine and its sessions share, so that Engine::Close can end the sessions and a
// session may outlive the close (Python keeps one as long as a reference to it lives).
// Lock order: mu, then live_mu, then a session's mu_.
struct EngineLife {
  // Held shared by every engine call and by a session's destructor while it tears down; held
  // exclusively by Close.
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::Mutex live_mu;
  absl::flat_hash_set<MeteredSession*> live ABSL_GUARDED_BY(live_mu);
};

// In an EngineImpl call: holds off Close until the call returns, and returns `closed_value`
// when the engine is closed.
#define CKV_OPEN_OR_RETURN(closed_value)           \
  absl::ReaderMutexLock ckv_life_lock(&life_->mu); \
  if (life_->closed) return closed_value

absl::Status EngineClosedError(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": the engine is closed"));
}

// A session that times AwaitLayer and the whole Re-Prefill (from BeginReprefill to the first
// Finish) and counts the failures of its calls. REQUIRES: `metrics` and `clock` outlive it
// while the engine is open; once Close ended it (End), it touches neither, and its calls fail
// with FailedPrecondition.
class MeteredSession final : public ReprefillSession {
 public:
  MeteredSession(std::unique_ptr<ReprefillSession> inner, CallMetrics& metrics, Clock& clock,
                 int64_t begin_ns, std::shared_ptr<EngineLife> life)
      : matched_chunks_(inner->matched_chunks()),
        inner_(std::move(inner)),
        metrics_(metrics),
        clock_(clock),
        begin_ns_(begin_ns),
        life_(std::move(life)) {}
  ~MeteredSession() override {
    absl::ReaderMutexLock life(&life_->mu);  // Close is not tearing the engine down meanwhile
    {
      absl::MutexLock lock(&life_->live_mu);
      life_->live.erase(this);
    }
    End();
  }
  // Ends the session now (its reads cancelled and waited for, its chunks unpinned); its calls
  // fail from now on. Waits for a call in progress.
  void End() {
    std::unique_ptr<ReprefillSession> inner;
    absl::MutexLock lock(&mu_);
    inner = std::move(inner_);
    inner.reset();
  }

  uint64_t matched_chunks() const override { return matched_chunks_; }
  absl::Status SubmitQueries(uint32_t layer, std::span<const float> queries) override {
    absl::MutexLock lock(&mu_);
    if (inner_ == nullptr) return EngineClosedError("SubmitQueries");
    absl::Status status = inner_->SubmitQueries(layer, queries);
    metrics_.failures.Record(engine::Op::kSubmitQueries, status);
    return status;
  }
  absl::StatusOr<LayerView> AwaitLayer(uint32_t layer) override {
    absl::MutexLock lock(&mu_);
    if (inner_ == nullptr) return EngineClosedError("AwaitLayer");
    const int64_t start_ns = clock_.MonotonicNanos();
    absl::StatusOr<LayerView> view = inner_->AwaitLayer(layer);
    if (view.ok()) {
      metrics_.await_layer.Observe(clock_.MonotonicNanos() - start_ns);
    } else {
      metrics_.failures.Record(engine::Op::kAwaitLayer, view.status());
    }
    return view;
  }
  absl::StatusOr<SessionStats> Finish() override {
    absl::MutexLock lock(&mu_);
    if (inner_ == nullptr) return EngineClosedError("Finish");
    absl::StatusOr<SessionStats> stats = inner_->Finish();
    if (!finished_) {  // a second Finish returns the same figures: counted once
      finished_ = true;
      if (stats.ok()) {
        metrics_.reprefill.Observe(clock_.MonotonicNanos() - begin_ns_);
      } else {
        metrics_.failures.Record(engine::Op::kFinish, stats.status());
      }
    }
    return stats;
  }

 private:
  const uint64_t matched_chunks_;
  // One session is driven by one thread at a time (ckv/session.h); the lock is for Close,
  // which ends it from another.
  absl::Mutex mu_;
  std::unique_ptr<ReprefillSession> inner_ ABSL_GUARDED_BY(mu_);
  CallMetrics& metrics_;
  Clock& clock_;
  const int64_t begin_ns_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<EngineLife> life_;
};

class EngineImpl final : public Engine, public engine::SessionHost {
 public:
  EngineImpl(const EngineOptions& options, io::FileSystem* file_system,
             std::unique_ptr<storage::ChunkStore> store)
      : options_(options), file_system_(file_system), store_(std::move(store)) {
    if (options.gpu_tier_bytes > 0 || options.cpu_tier_bytes > 0) {
      // The GPU tier is device memory where a device is present, host memory otherwise.
      auto cuda = kernels::NewCudaMemory();
      gpu_tier_on_device_ = options.gpu_tier_bytes > 0 && cuda.ok();
      tiers_ = std::make_unique<engine::TierCache>(
          options.gpu_tier_bytes, options.cpu_tier_bytes,
          cuda.ok() ? std::move(*cuda) : kernels::NewHostMemory(), kernels::NewHostMemory());
      // A chunk that leaves the store leaves the tiers: its records would only hold budget
      // until they aged out (pinned ones stay valid until their views are released).
      store_->SetRemovalListener(
          [tiers = tiers_.get()](const ChunkKey& chunk) { tiers->Erase(chunk); });
    }
  }
  // Sessions still open are ended first (Close); their views must go before the engine (the
  // tiers they may pin live until here).
  ~EngineImpl() override { Close().IgnoreError(); }  // always OK

  absl::Status Close() override {
    absl::WriterMutexLock life(&life_->mu);  // waits for the calls in progress
    if (life_->closed) return absl::OkStatus();
    life_->closed = true;
    // End the live sessions: each waits for its call in progress, then cancels its reads and
    // unpins its chunks, while the store and the read engine still exist.
    std::vector<MeteredSession*> live;
    {
      absl::MutexLock lock(&life_->live_mu);
      live.assign(life_->live.begin(), life_->live.end());
    }
    for (MeteredSession* session : live) session->End();
    // The read engine goes before the store so that no read lands after it is closed. Closing
    // the store releases its lock: it can be opened again at once.
    remote_.reset();  // its publisher reads the store
    store_->SetRemovalListener(nullptr);
    {
      absl::MutexLock lock(&mu_);
      reads_.reset();
    }
    store_.reset();
    return absl::OkStatus();
  }

  // Starts the remote tier per options_.remote (after construction: it can fail).
  absl::Status StartRemoteTier() {
    if (options_.remote.seeds.empty()) return absl::OkStatus();
    CKV_ASSIGN_OR_RETURN(
        remote_, engine::RemoteTier::Create(options_.remote, store_.get(), options_.logger));
    return absl::OkStatus();
  }
  engine::RemoteTier* remote_tier() override { return remote_.get(); }

  absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                const KvTensors& kv) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Put"));
    const storage::AuxRecords summaries = engine::SummaryRecords(spec, kv);
    // The store times the Put once, for its put latency (EngineStats::put_latency_*) and for the
    // histogram here.
    int64_t latency_ns = 0;
    absl::StatusOr<PutResult> result = store_->Put(spec, tokens, kv, &summaries, &latency_ns);
    if (!result.ok()) return Counted(engine::Op::kPut, result.status());
    metrics_.put.Observe(latency_ns);
    if (remote_ != nullptr && result->chunks > 0) {
      // Committed locally: now (in the background) to the cluster as well.
      const std::vector<ChunkKey> keys = ChainChunkKeys(
          spec.Fingerprint(), spec.chunk_tokens, tokens.first(result->chunks * spec.chunk_tokens));
      remote_->Publish(spec, keys);
    }
    return result;
  }
  absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Lookup"));
    const int64_t start_ns = clock().MonotonicNanos();
    absl::StatusOr<uint64_t> local = store_->Lookup(spec, tokens);
    if (local.ok()) local = FillFromRemote(spec, tokens, *local);
    return Timed(engine::Op::kLookup, metrics_.lookup, start_ns, std::move(local));
  }
  absl::StatusOr<PrefixExtent> Probe(const ModelSpec& spec,
                                     std::span<const int32_t> tokens) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Probe"));
    absl::StatusOr<uint64_t> local = store_->Lookup(spec, tokens, /*touch=*/false);
    if (!local.ok()) return Counted(engine::Op::kProbe, local.status());
    PrefixExtent extent{.local_chunks = *local};
    if (remote_ != nullptr) extent.remote_chunks = remote_->ChainLength(spec, tokens, *local);
    return extent;
  }
  absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                          std::span<std::byte> out) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("ReadRecord"));
    return Counted(engine::Op::kReadRecord, store_->ReadRecord(spec, key, layer, out));
  }
  absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Delete"));
    return Counted(engine::Op::kDelete, store_->Delete(spec, tokens));
  }
  absl::Status DeletePrefix(const ChunkKey& prefix_id) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("DeletePrefix"));
    return Counted(engine::Op::kDeletePrefix, store_->DeletePrefix(prefix_id));
  }
  std::vector<PrefixInfo> ListPrefixes() override {
    CKV_OPEN_OR_RETURN(std::vector<PrefixInfo>{});
    return store_->ListPrefixes();
  }
  absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id,
                                                     ModelSpec* spec) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("PrefixChunks"));
    return Counted(engine::Op::kPrefixChunks, store_->PrefixChunks(prefix_id, spec));
  }
  absl::StatusOr<PrefixDescription> DescribePrefix(const ChunkKey& prefix_id) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("DescribePrefix"));
    return Counted(engine::Op::kDescribePrefix, store_->DescribePrefix(prefix_id));
  }
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Verify"));
    return Counted(engine::Op::kVerify, store_->Verify(progress));
  }
  absl::StatusOr<RepairReport> Repair(const ProgressFn& progress) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Repair"));
    return Counted(engine::Op::kRepair, store_->Repair(progress));
  }
  absl::StatusOr<GcReport> Gc() override {
    CKV_OPEN_OR_RETURN(EngineClosedError("Gc"));
    return Counted(engine::Op::kGc, store_->Gc());
  }
  // All zeros once closed.
  EngineStats Stats() override {
    CKV_OPEN_OR_RETURN(EngineStats{});
    return StatsOpen();
  }
  EngineStats StatsOpen() {
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
    if (reads_ != nullptr)
      s.read_idle_with_pending_seconds = reads_->stats().idle_with_pending_seconds;
    if (tiers_ != nullptr) {
      const engine::TierStats gpu = tiers_->stats(engine::TierLevel::kGpu);
      const engine::TierStats cpu = tiers_->stats(engine::TierLevel::kCpu);
      s.gpu_tier_budget_bytes = gpu.budget_bytes;
      s.gpu_tier_resident_bytes = gpu.resident_bytes;
      s.cpu_tier_budget_bytes = cpu.budget_bytes;
      s.cpu_tier_resident_bytes = cpu.resident_bytes;
    }
    if (remote_ != nullptr) {
      const engine::RemoteTierStats r = remote_->stats();
      s.remote_enabled = true;
      s.remote_publish_queued = r.publish_queued;
      s.remote_publish_dropped = r.publish_dropped;
      s.remote_published_chunks = r.published_chunks;
      s.remote_published_bytes = r.published_bytes;
      s.remote_publish_failures = r.publish_failures;
      s.remote_fills = r.fills;
      s.remote_fill_misses = r.fill_misses;
      s.remote_fetched_chunks = r.fetched_chunks;
      s.remote_fetched_bytes = r.fetched_bytes;
      s.remote_head_reads = r.head_reads;
      s.remote_head_misses = r.head_misses;
      s.remote_head_chunks = r.head_chunks;
      s.remote_session_records = r.session_records;
      s.remote_session_record_bytes = r.session_record_bytes;
      s.remote_fills_queued = r.fills_queued;
      s.remote_fills_dropped = r.fills_dropped;
      s.remote_corrupt_chunks = r.corrupt_chunks;
      s.remote_errors = r.errors;
      s.remote_timeouts = r.timeouts;
      s.remote_publish_queue_depth = r.queue_depth;
      s.remote_budget_bytes = r.budget_bytes;
    }
    return s;
  }

  absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginReprefill(
      const ModelSpec& spec, std::span<const int32_t> tokens,
      const ReprefillOptions& options) override {
    CKV_OPEN_OR_RETURN(EngineClosedError("BeginReprefill"));
    const int64_t begin_ns = clock().MonotonicNanos();
    if (remote_ != nullptr && spec.Validate().ok() && !engine::SelectsRemoteRecords(options)) {
      // A session that reads every chunk anyway has a local miss filled from the cluster first,
      // so that it pins the chunks fetched like any other stored chunk. One that selects reads
      // only its selection from the cluster (engine/session.h).
      absl::StatusOr<uint64_t> local = store_->Lookup(spec, tokens);
      if (local.ok()) FillFromRemote(spec, tokens, *local);
    }
    // The session gets the engine's parts now and never calls back into the engine.
    const absl::StatusOr<engine::SessionParts> parts = engine::PartsOf(*this);
    absl::StatusOr<std::unique_ptr<ReprefillSession>> session =
        parts.ok() ? engine::BeginSession(*parts, spec, tokens, options)
                   : absl::StatusOr<std::unique_ptr<ReprefillSession>>(parts.status());
    if (!session.ok()) {
      metrics_.failures.Record(engine::Op::kBeginReprefill, session.status());
      return session.status();
    }
    auto metered =
        std::make_unique<MeteredSession>(std::move(*session), metrics_, clock(), begin_ns, life_);
    absl::MutexLock lock(&life_->live_mu);
    life_->live.insert(metered.get());
    return std::unique_ptr<ReprefillSession>(std::move(metered));
  }

  std::string Metrics() override;

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
  engine::ScoringKeys* scoring_keys() override { return scoring_keys_.load(); }
  void set_scoring_keys(engine::ScoringKeys* keys) { scoring_keys_.store(keys); }
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
  // The store's clock (tests step a FakeClock): the latencies are measured on it.
  Clock& clock() { return *store_->clock(); }
  template <typename T>
  T Counted(engine::Op op, T result) {
    metrics_.failures.Record(op, StatusOf(result));
    return result;
  }
  // Observes the latency of a call that returned OK; counts a failure otherwise.
  template <typename T>
  T Timed(engine::Op op, engine::LatencyHistogram& histogram, int64_t start_ns, T result) {
    if (result.ok()) {
      histogram.Observe(clock().MonotonicNanos() - start_ns);
    } else {
      metrics_.failures.Record(op, result.status());
    }
    return result;
  }
  // How many leading chunks of `tokens` are stored locally once the remote tier (if any) filled
  // what continues past the `local` ones.
  uint64_t FillFromRemote(const ModelSpec& spec, std::span<const int32_t> tokens, uint64_t local) {
    if (remote_ == nullptr) return local;
    return remote_->Fill(spec, tokens, local);
  }
  // "io_uring" or "threads": the backend of the engine's I/O layer, asked of the read engine
  // when it exists, else of an I/O queue made once for the purpose.
  std::string IoBackendInUse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  io::FileSystem* const file_system_;  // nullptr: the POSIX one (engine::Seams)
  std::unique_ptr<storage::ChunkStore> store_;
  absl::Mutex mu_;
  std::unique_ptr<prefetch::ReadEngine> reads_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<engine::TierCache> tiers_;
  EngineStats session_totals_ ABSL_GUARDED_BY(mu_);  // the session fields only
  std::atomic<engine::SelectorClock*> clock_{nullptr};
  std::atomic<engine::ScoringKeys*> scoring_keys_{nullptr};
  CallMetrics metrics_;
  bool gpu_tier_on_device_ = false;              // the GPU tier's memory is a CUDA device's
  std::string io_backend_ ABSL_GUARDED_BY(mu_);  // IoBackendInUse's answer, once known
  std::unique_ptr<engine::RemoteTier> remote_;   // null: no remote tier
  const std::shared_ptr<EngineLife> life_ = std::make_shared<EngineLife>();
};

std::string EngineImpl::IoBackendInUse() {
  if (reads_ != nullptr) return reads_->backend();
  if (io_backend_.empty()) {
    io::FileSystem* fs =
        file_system_ != nullptr ? file_system_ : io::PosixFileSystem(options_.io_backend);
    absl::StatusOr<std::unique_ptr<io::IoQueue>> queue = fs->NewIoQueue(1);
    if (!queue.ok()) return "unknown";  // asked again next time
    io_backend_ = (*queue)->backend();
  }
  return io_backend_;
}

namespace {

// The families of the tiers' figures, a sample per tier, in Engine::Metrics().
struct TierFamily {
  const char* name;
  const char* type;
  const char* help;
  uint64_t engine::TierStats::*field;
};
constexpr TierFamily kTierFamilies[] = {
    {"ckv_tier_budget_bytes", "gauge",
     "The tier's byte budget for records (the CPU tier's without the summary cache's share); "
     "0 = disabled.",
     &engine::TierStats::budget_bytes},
    {"ckv_tier_allocated_bytes", "gauge",
     "Slab bytes the tier took from its memory: resident and free slots.",
     &engine::TierStats::allocated_bytes},
    {"ckv_tier_resident_bytes", "gauge",
     "Bytes of the records the tier holds, erased-but-pinned ones included.",
     &engine::TierStats::resident_bytes},
    {"ckv_tier_records", "gauge", "Records the tier holds, erased-but-pinned ones included.",
     &engine::TierStats::records},
    {"ckv_tier_hits_total", "counter", "Lookups the tier served, since Open.",
     &engine::TierStats::hits},
    {"ckv_tier_misses_total", "counter",
     "Lookups that reached the tier and found nothing (a CPU hit is a GPU miss), since Open.",
     &engine::TierStats::misses},
    {"ckv_tier_admissions_total", "counter",
     "Records placed in the tier: admitted, or demoted into it, since Open.",
     &engine::TierStats::admissions},
    {"ckv_tier_demotions_total", "counter",
     "Records displaced from the tier into the next tier, since Open.",
     &engine::TierStats::demotions},
    {"ckv_tier_drops_total", "counter",
     "Records displaced from the tier and cached nowhere, since Open.", &engine::TierStats::drops},
    {"ckv_tier_evictions_total", "counter",
     "Records removed because their chunk left the store, since Open.",
     &engine::TierStats::evictions},
    {"ckv_tier_refusals_total", "counter",
     "Records offered to the tier and not taken (outranked, or too much pinned), since Open.",
     &engine::TierStats::refusals},
    {"ckv_tier_errors_total", "counter",
     "Records not cached because an allocation or copy failed, since Open.",
     &engine::TierStats::errors},
};

// The read engine's families in Engine::Metrics(), since Open.
using ReadStats = prefetch::ReadEngineStats;
struct ReadFamily {
  const char* name;
  StatKind kind;
  const char* help;
  std::variant<uint64_t ReadStats::*, double ReadStats::*> field;
};
const ReadFamily kReadFamilies[] = {
    {"ckv_read_requests_submitted_total", StatKind::kCounter,
     "Requests submitted to the read engine, since Open.", &ReadStats::requests_submitted},
    {"ckv_read_checksum_failures_total", StatKind::kCounter,
     "Read engine requests whose checksum did not match, since Open.",
     &ReadStats::checksum_failures},
    {"ckv_read_requests_coalesced_total", StatKind::kCounter,
     "Requests that rode in another request's device read, since Open.",
     &ReadStats::requests_coalesced},
    {"ckv_read_requested_bytes_total", StatKind::kCounter,
     "Lengths of the requests issued to the device, since Open.", &ReadStats::bytes_requested},
    {"ckv_read_device_bytes_total", StatKind::kCounter,
     "Bytes the device transferred for the read engine (retries included), since Open.",
     &ReadStats::bytes_read},
    {"ckv_read_device_ios_total", StatKind::kCounter,
     "Transfers the read engine's I/O queues issued (requeued remainders and retries "
     "included), since Open.",
     &ReadStats::ios_issued},
    {"ckv_read_busy_seconds_total", StatKind::kCounter,
     "Time at least one device read was in flight, since the read engine started.",
     &ReadStats::busy_seconds},
    {"ckv_read_idle_with_pending_seconds_total", StatKind::kCounter,
     "Time no device read was in flight while requests were queued (bubbles), since the read "
     "engine started.",
     &ReadStats::idle_with_pending_seconds},
    {"ckv_read_elapsed_seconds_total", StatKind::kCounter, "Time since the read engine started.",
     &ReadStats::elapsed_seconds},
    {"ckv_read_mean_queue_depth", StatKind::kGauge,
     "Time-weighted mean of device reads in flight since the read engine started.",
     &ReadStats::mean_queue_depth},
};

}  // namespace

std::string EngineImpl::Metrics() {
  CKV_OPEN_OR_RETURN(std::string());
  const EngineStats s = StatsOpen();
  prefetch::ReadEngineStats r;  // zeros until the first session makes the read engine
  std::string backend;
  {
    absl::MutexLock lock(&mu_);
    if (reads_ != nullptr) r = reads_->stats();
    backend = IoBackendInUse();
  }
  engine::TierStats tiers[engine::kTierLevels];
  if (tiers_ != nullptr) {
    tiers[0] = tiers_->stats(engine::TierLevel::kGpu);
    tiers[1] = tiers_->stats(engine::TierLevel::kCpu);
  }

  engine::MetricsText out;
  engine::StoreMetrics(s, out);

  // The store, since Open.
  engine::StoreMetricsSinceOpen(s, out);

  // The engine's own figures (CKV_ENGINE_STATS_FIELDS: Re-Prefill sessions, summed when they
  // finish, and the remote tier), then what the list has no line for: the tier hits by tier.
  engine::EngineMetricsSinceOpen(s, out);
  out.Family("ckv_session_tier_hits_total", "counter",
             "Records finished sessions found in a tier instead of reading them, since Open.");
  out.Sample("ckv_session_tier_hits_total", {{"tier", "gpu"}}, s.gpu_hits);
  out.Sample("ckv_session_tier_hits_total", {{"tier", "cpu"}}, s.cpu_hits);

  // The tiers.
  for (const TierFamily& f : kTierFamilies) {
    out.Family(f.name, f.type, f.help);
    out.Sample(f.name, {{"tier", "gpu"}}, tiers[0].*f.field);
    out.Sample(f.name, {{"tier", "cpu"}}, tiers[1].*f.field);
  }
  out.Gauge("ckv_gpu_tier_on_device",
            "1 when the GPU tier is in a CUDA device's memory; 0 when it is host memory or "
            "disabled.",
            uint64_t{gpu_tier_on_device_ ? 1u : 0u});

  // The read engine (made by the first Re-Prefill session; zeros before), since Open.
  for (const ReadFamily& f : kReadFamilies) {
    std::visit([&](auto field) { out.Single(f.kind, f.name, f.help, r.*field); }, f.field);
  }
  out.Family("ckv_read_requests_completed_total", "counter",
             "Read engine requests by outcome (failed: I/O error or checksum mismatch; "
             "cancelled: by Cancel or shutdown), since Open.");
  out.Sample("ckv_read_requests_completed_total", {{"outcome", "ok"}}, r.requests_ok);
  out.Sample("ckv_read_requests_completed_total", {{"outcome", "failed"}}, r.requests_failed);
  out.Sample("ckv_read_requests_completed_total", {{"outcome", "cancelled"}}, r.requests_cancelled);

  // Latencies of the calls that returned OK, and failures.
  out.Histogram("ckv_put_latency_seconds",
                "Time Engine::Put took, of the Puts that returned OK, since Open.",
                metrics_.put.snapshot());
  out.Histogram("ckv_lookup_latency_seconds",
                "Time Engine::Lookup took, of the Lookups that returned OK, since Open.",
                metrics_.lookup.snapshot());
  out.Histogram("ckv_await_layer_latency_seconds",
                "Time ReprefillSession::AwaitLayer took, of the calls that returned OK, since "
                "Open.",
                metrics_.await_layer.snapshot());
  out.Histogram("ckv_reprefill_latency_seconds",
                "Time from Engine::BeginReprefill to the session's Finish, of the sessions that "
                "finished OK, since Open.",
                metrics_.reprefill.snapshot());
  out.Failures("ckv_failures_total",
               "Calls of the public API that returned an error, by operation and status code, "
               "since Open.",
               metrics_.failures);

  out.Family("ckv_io_backend_info", "gauge", "The disk I/O backend in use (io_uring or threads).");
  out.Sample("ckv_io_backend_info", {{"backend", backend}}, uint64_t{1});
  return out.Take();
}

// An engine over a read-only view of a store that another process may write
// (Engine::OpenReadOnly). The view is a ChunkStore opened read-only; CatchUp swaps in a new one,
// and calls already under way keep the one they took.
class ReadOnlyEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options,
                                                      const std::string& path,
                                                      io::FileSystem* file_system) {
    // A view can neither publish (it writes nothing) nor keep what it would fetch (a fill is a
    // Put into the local store): a remote tier here would silently do nothing, so say so.
    if (!options.remote.seeds.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OpenReadOnly ", path, ": remote.seeds names ", options.remote.seeds.size(),
          " node(s) (first ", options.remote.seeds.front(),
          "), but a read-only engine can neither publish to the remote tier nor store chunks "
          "fetched from it; open it with Engine::Open, or leave remote.seeds empty"));
    }
    storage::StoreOptions o = StoreOptionsOf(options);
    o.read_only = true;
    o.file_system = file_system;
    o.put_staging_bytes = 1u << 20;  // a view writes nothing: the smallest staging pool
    auto engine = std::unique_ptr<ReadOnlyEngine>(new ReadOnlyEngine(o, path));
    CKV_RETURN_IF_ERROR(engine->CatchUpAfter(engine->Tick()));
    return std::unique_ptr<Engine>(std::move(engine));
  }

  absl::Status CatchUp() override { return CatchUpAfter(Tick()); }

  // The writes reach the read-only view, which refuses them (ChunkStore::RefuseIfReadOnly).
  absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                const KvTensors& kv) override {
    return View().store->Put(spec, tokens, kv);
  }
  absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    return View().store->Lookup(spec, tokens);
  }
  absl::StatusOr<PrefixExtent> Probe(const ModelSpec& spec,
                                     std::span<const int32_t> tokens) override {
    CKV_ASSIGN_OR_RETURN(uint64_t local, View().store->Lookup(spec, tokens, /*touch=*/false));
    return PrefixExtent{.local_chunks = local};  // a view has no remote tier
  }
  absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                          std::span<std::byte> out) override {
    // The writer may have evicted or deleted the chunk after this view was taken and written
    // another into its slot: a newer view says whether it is still stored, and where. It commits
    // an eviction (synced) before it reuses the slot, and a chunk's bytes before the catalog names
    // them, so a view opened after a failed read that still names the place that failed shows
    // damage, unless the writer stored the chunk there again meanwhile: a second read tells. A
    // chunk that keeps moving (stored again elsewhere, evicted again before this read reached it)
    // is followed through up to kReadRetries newer views, then Unavailable. Each newer view is
    // one whose open began after the failed read (CatchUpAfter), not merely a newer one: a view
    // another thread opened before the failure may still name the reused slot.
    constexpr int kReadRetries = 8;
    ViewRef view = View();
    absl::Status s = view.store->ReadRecord(spec, key, layer, out);
    // Where the read failed in the previous view, if that view named a place.
    absl::StatusOr<storage::ChunkStore::RecordLocation> failed_at =
        absl::NotFoundError("no read failed yet");
    for (int retry = 0; absl::IsDataLoss(s); ++retry) {
      auto where = view.store->LocateRecord(key, layer);
      if (where.ok() && failed_at.ok() && SamePlace(*where, *failed_at)) {
        LogError(s);  // it failed at the same place in two views: damage
        return s;
      }
      if (retry == kReadRetries) {
        return absl::UnavailableError(absl::StrCat(
            "chunk ", key.ToHex(), " layer ", layer, " moved through ", kReadRetries,
            " views of the store while it was read (its writer keeps evicting and storing it); "
            "last: ",
            s.message()));
      }
      failed_at = std::move(where);
      CKV_RETURN_IF_ERROR(CatchUpAfter(Tick()));
      view = View();
      s = view.store->ReadRecord(spec, key, layer, out);
      if (absl::IsNotFound(s)) {
        return absl::NotFoundError(
            absl::StrCat("chunk ", key.ToHex(),
                         " was evicted or deleted by the store's writer while it was "
                         "read (",
                         s.message(), ")"));
      }
    }
    return s;
  }
  absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    return View().store->Delete(spec, tokens);
  }
  absl::Status DeletePrefix(const ChunkKey& prefix_id) override {
    return View().store->DeletePrefix(prefix_id);
  }
  std::vector<PrefixInfo> ListPrefixes() override { return View().store->ListPrefixes(); }
  absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id,
                                                     ModelSpec* spec) override {
    return View().store->PrefixChunks(prefix_id, spec);
  }
  absl::StatusOr<PrefixDescription> DescribePrefix(const ChunkKey& prefix_id) override {
    return View().store->DescribePrefix(prefix_id);
  }
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress) override {
    // A chunk the writer evicted, deleted or moved while it was read is no problem of the store.
    // Problems are reported only when they show again in a newer view, with the chunk still in
    // the same place: a failure that moves on with the writer's churn is not damage. Up to three
    // views; the last one's problems are reported.
    ViewRef view = View();
    absl::flat_hash_set<ChunkKey> failed;
    CKV_ASSIGN_OR_RETURN(VerifyReport report, view.store->Verify(progress, &failed));
    for (int round = 0; round < 2 && !failed.empty(); ++round) {
      CKV_RETURN_IF_ERROR(CatchUpAfter(Tick()));
      const ViewRef now = View();
      bool all_moved = true;
      for (const ChunkKey& key : failed) {
        auto before = view.store->LocateRecord(key, 0);
        auto after = now.store->LocateRecord(key, 0);
        if (before.ok() && after.ok() && SamePlace(*before, *after)) {
          all_moved = false;
          break;
        }
      }
      if (all_moved) {
        // Every failure was of a chunk the writer took away or moved: its problems go; the rest
        // stay.
        std::erase_if(report.problems, [&](const VerifyProblem& p) {
          if (!failed.contains(p.chunk)) return false;
          if (p.kind == VerifyProblem::Kind::kChecksum && report.checksum_failures > 0) {
            report.checksum_failures--;
          }
          return true;
        });
        return report;
      }
      // Some chunk is still where it failed: check the whole store again in the newer view
      // (the slot may have been reused and the chunk stored there again meanwhile).
      view = now;
      failed.clear();
      CKV_ASSIGN_OR_RETURN(report, view.store->Verify(progress, &failed));
    }
    return report;
  }
  absl::StatusOr<RepairReport> Repair(const ProgressFn& progress) override {
    return View().store->Repair(progress);
  }
  absl::StatusOr<GcReport> Gc() override { return View().store->Gc(); }
  // Sessions add usage (I and F) to the store at Finish: a read-only view serves none.
  absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginReprefill(
      const ModelSpec&, std::span<const int32_t>, const ReprefillOptions&) override {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginReprefill on ", path_, ": the engine is read-only (Engine::OpenReadOnly)"));
  }
  EngineStats Stats() override { return EngineStatsOf(View().store->Stats()); }
  std::string Metrics() override {
    engine::MetricsText out;
    engine::StoreMetrics(Stats(), out);
    return out.Take();
  }

 private:
  // A view and when its open began, on the engine's clock (Tick).
  struct ViewRef {
    std::shared_ptr<storage::ChunkStore> store;
    uint64_t opened_at = 0;
  };

  ReadOnlyEngine(storage::StoreOptions options, std::string path)
      : options_(std::move(options)), path_(std::move(path)) {}

  static bool SamePlace(const storage::ChunkStore::RecordLocation& a,
                        const storage::ChunkStore::RecordLocation& b) {
    return a.segment_path == b.segment_path && a.offset == b.offset;
  }

  ViewRef View() {
    absl::MutexLock lock(&mu_);
    return {view_, opened_at_};
  }

  // The engine's clock: every call returns a later time than every earlier call.
  uint64_t Tick() { return clock_.fetch_add(1, std::memory_order_acq_rel) + 1; }

  // Makes the view one whose open began after time `tick` (taken after whatever the caller must
  // see, e.g. a failed read): one caller reopens while the others wait and use its view when it
  // began late enough (a corrupt record read by many threads costs one reopen, not one each).
  absl::Status CatchUpAfter(uint64_t tick) {
    absl::MutexLock reopening(&catch_up_mu_);
    if (View().opened_at > tick) return absl::OkStatus();
    const uint64_t opened_at = Tick();
    CKV_ASSIGN_OR_RETURN(std::shared_ptr<storage::ChunkStore> fresh, NewView());
    {
      absl::MutexLock lock(&mu_);
      std::swap(view_, fresh);
      opened_at_ = opened_at;
    }
    fresh.reset();  // the old view closes here, outside mu_, once no call holds it
    return absl::OkStatus();
  }

  // A fresh view. The writer may flush, compact or Gc under the open, so that a file the catalog
  // named is gone: the open is tried again while the catalog's directory keeps changing between
  // tries (at most 20 tries); a failure that repeats over an unchanged catalog is the store's
  // own, and is returned as it is.
  absl::StatusOr<std::shared_ptr<storage::ChunkStore>> NewView() {
    absl::Status last;
    std::string catalog_before = CatalogState();
    for (int attempt = 0; attempt < 20; ++attempt) {
      absl::StatusOr<std::unique_ptr<storage::ChunkStore>> store =
          storage::ChunkStore::Open(options_, path_);
      if (store.ok()) return std::shared_ptr<storage::ChunkStore>(std::move(*store));
      last = store.status();
      if (absl::IsFailedPrecondition(last) || absl::IsInvalidArgument(last) ||
          absl::IsPermissionDenied(last)) {
        return last;
      }
      const std::string catalog_now = CatalogState();
      if (!absl::IsUnavailable(last) && catalog_now == catalog_before) return last;
      catalog_before = catalog_now;
      absl::SleepFor(absl::Milliseconds(5 * (attempt + 1)));
    }
    return absl::UnavailableError(absl::StrCat("open ", path_,
                                               " read-only: the writer changed the store under "
                                               "20 tries; last: ",
                                               last.message()));
  }

  // The names and sizes of the catalog's files and the segment files: what a writer's commit,
  // flush, compaction or Gc changes.
  std::string CatalogState() const {
    std::string state;
    std::error_code ec;
    for (const char* sub : {"/catalog", "/segments"}) {
      for (const auto& e : std::filesystem::directory_iterator(path_ + sub, ec)) {
        absl::StrAppend(&state, e.path().filename().string(), ":",
                        e.is_regular_file(ec) ? e.file_size(ec) : 0, ";");
      }
    }
    return state;
  }

  void LogError(const absl::Status& s) const {
    Logger* logger = options_.logger != nullptr ? options_.logger : StderrLogger();
    logger->Log(LogLevel::kError, std::string(s.message()));
  }

  const storage::StoreOptions options_;
  const std::string path_;
  std::atomic<uint64_t> clock_{0};
  absl::Mutex catch_up_mu_;  // one reopen at a time (CatchUpAfter)
  absl::Mutex mu_;
  std::shared_ptr<storage::ChunkStore> view_ ABSL_GUARDED_BY(mu_);
  uint64_t opened_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

namespace engine {
SessionHost& HostOf(Engine& engine) { return dynamic_cast<EngineImpl&>(engine); }
void SetSelectorClock(Engine& engine, SelectorClock* clock) {
  dynamic_cast<EngineImpl&>(engine).set_selector_clock(clock);
}
void SetScoringKeys(Engine& engine, ScoringKeys* keys) {
  dynamic_cast<EngineImpl&>(engine).set_scoring_keys(keys);
}
absl::StatusOr<std::unique_ptr<Engine>> OpenWithSeams(const EngineOptions& options,
                                                      const std::string& path, const Seams& seams) {
  storage::StoreOptions store_options = StoreOptionsOf(options);
  if (seams.clock != nullptr) store_options.clock = seams.clock;
  store_options.file_system = seams.file_system;
  auto store = storage::ChunkStore::Open(store_options, path);
  if (!store.ok()) return store.status();
  auto engine = std::make_unique<EngineImpl>(options, seams.file_system, std::move(*store));
  CKV_RETURN_IF_ERROR(engine->StartRemoteTier());
  return std::unique_ptr<Engine>(std::move(engine));
}
absl::StatusOr<RemoteCheckReport> VerifyRemote(Engine& engine) {
  auto* impl = dynamic_cast<EngineImpl*>(&engine);
  if (impl == nullptr || impl->remote_tier() == nullptr) {
    return absl::FailedPreconditionError("the engine has no remote tier (EngineOptions::remote)");
  }
  // Every stored chunk once, grouped by the spec it is stored under.
  RemoteCheckReport total;
  absl::flat_hash_set<ChunkKey> seen;
  for (const PrefixInfo& prefix : engine.ListPrefixes()) {
    ModelSpec spec;
    absl::StatusOr<std::vector<ChunkKey>> chunks = engine.PrefixChunks(prefix.id, &spec);
    if (!chunks.ok()) continue;  // deleted since ListPrefixes
    std::vector<ChunkKey> fresh;
    for (const ChunkKey& key : *chunks) {
      if (seen.insert(key).second) fresh.push_back(key);
    }
    RemoteCheckReport r = impl->remote_tier()->Check(spec, fresh);
    total.chunks_checked += r.chunks_checked;
    total.present += r.present;
    total.missing += r.missing;
    total.corrupt += r.corrupt;
    total.differing += r.differing;
    total.unreachable += r.unreachable;
    for (std::string& p : r.problems) {
      if (total.problems.size() < 100) total.problems.push_back(std::move(p));
    }
  }
  return total;
}

bool WaitUntilRemotePublished(Engine& engine, absl::Duration timeout) {
  auto* impl = dynamic_cast<EngineImpl*>(&engine);
  if (impl == nullptr || impl->remote_tier() == nullptr) return true;
  return impl->remote_tier()->WaitUntilPublished(timeout);
}
absl::StatusOr<uint64_t> FreeSpaceToOpen(const EngineOptions& options, const std::string& path,
                                         std::span<const ChunkKey> delete_prefixes,
                                         const Seams& seams) {
  storage::StoreOptions store_options = StoreOptionsOf(options);
  if (seams.clock != nullptr) store_options.clock = seams.clock;
  store_options.file_system = seams.file_system;
  return storage::ChunkStore::FreeSpaceToOpen(store_options, path, delete_prefixes);
}

absl::StatusOr<std::unique_ptr<Engine>> OpenReadOnlyWithSeams(const EngineOptions& options,
                                                              const std::string& path,
                                                              const Seams& seams) {
  return ReadOnlyEngine::Open(options, path, seams.file_system);
}
}  // namespace engine

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     const std::string& path) {
  return engine::OpenWithSeams(options, path, {});
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::OpenReadOnly(const EngineOptions& options,
                                                             const std::string& path) {
  return engine::OpenReadOnlyWithSeams(options, path, {});
}

}  // namespace ckv
