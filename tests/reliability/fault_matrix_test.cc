// SPDX-License-Identifier: Apache-2.0
// The fault matrix (docs/reliability.md): EIO, short I/O, ENOSPC and slow I/O at several rates,
// injected through the fault-injecting file system (io/fault_file_system.h: its rules, or
// its op hook on the read engine's reads), which wraps the one I/O layer's queues, io_uring where
// the kernel allows it, during Puts, during Re-Prefill sessions (summary
// reads, period heads, prefetches, demand reads) and during eviction and Gc. Each case checks:
//   - every failed call returns the documented code for its fault, naming what failed;
//   - nothing hangs (a watchdog aborts a case that outlives its deadline);
//   - every record a session served under faults is bit-exact;
//   - once the faults are gone: Gc and Verify are clean, every acknowledged Put is present and
//     bit-exact, every failed Put is absent, the segment files hold exactly the catalog's bytes
//     (and a reopen finds nothing to reclaim), and new sessions serve every prefix bit-exact.
// Seeds are fixed per case, so a case injects the same faults on every run (up to the order in
// which concurrent I/O threads draw them).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "io/fault_file_system.h"
#include "storage/chunk_store.h"
#include "tests/served_bytes.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

using ::ckv::testing::ServedEquals;

using ::ckv::io::FaultInjectingFileSystem;
using ::ckv::io::FaultRule;
using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::kSanitizerBuild;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;
using ::ckv::testing::Watchdog;

enum class Fault { kEio, kShortIo, kEnospc, kSlow };
enum class Phase { kPut, kSession, kEviction };
// Where the fault is injected: the file system (every data-path op; sessions then read through
// the thread-pool backend) or the read engine's hook (session reads only, on the default
// backend: io_uring where available).
enum class Seam { kFileSystem, kReadEngine };

const char* Name(Fault f) {
  switch (f) {
    case Fault::kEio:
      return "Eio";
    case Fault::kShortIo:
      return "ShortIo";
    case Fault::kEnospc:
      return "Enospc";
    case Fault::kSlow:
      return "Slow";
  }
  return "?";
}
const char* Name(Phase p) {
  switch (p) {
    case Phase::kPut:
      return "Put";
    case Phase::kSession:
      return "Session";
    case Phase::kEviction:
      return "Eviction";
  }
  return "?";
}

struct FaultCase {
  Fault fault;
  double rate;  // per operation
  Phase phase;
  Seam seam = Seam::kFileSystem;
};

std::string CaseName(const ::testing::TestParamInfo<FaultCase>& info) {
  const FaultCase& c = info.param;
  return absl::StrCat(Name(c.fault), "_", static_cast<int>(c.rate * 100 + 0.5), "pct_",
                      Name(c.phase), c.seam == Seam::kReadEngine ? "_ReadEngine" : "");
}

// Slow I/O: this long, added to an op with probability `rate`.
constexpr uint64_t kSlowUs = 500;

// What the matrix did, summed over its cases, printed once at the end.
struct Totals {
  std::atomic<uint64_t> cases{0}, faults{0}, failed_calls{0}, records_served{0}, bytes_verified{0};
};
Totals& MatrixTotals() {
  static Totals t;
  return t;
}

// The status codes a fault may produce, per kind of operation (status.cc maps errno once): EIO
// while reading is DataLoss (the medium did not return the data), while writing, syncing or
// punching it is Internal; a short read is DataLoss; a short (torn) write reports EIO; ENOSPC is
// ResourceExhausted. Slow I/O fails nothing.
absl::StatusCode WriteCode(Fault f) {
  return f == Fault::kEnospc ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
}

class FaultMatrixTest : public ::testing::TestWithParam<FaultCase> {
 protected:
  static constexpr size_t kChunks = 8;  // chunks of each base prefix
  static constexpr size_t kBase = 3;    // base prefixes, stored before the faults

  struct Prefix {
    std::vector<int32_t> tokens;
    bool acknowledged = false;
  };

  // One line for the whole matrix when the binary runs it in one process (ctest runs each case
  // alone: then it sums one case).
  static void TearDownTestSuite() {
    const Totals& t = MatrixTotals();
    std::printf(
        "fault matrix: %llu cases, %llu faults injected, %llu calls failed with the "
        "fault's code, %llu records served by sessions (under faults and after), "
        "%.1f MiB verified\n",
        (unsigned long long)t.cases.load(), (unsigned long long)t.faults.load(),
        (unsigned long long)t.failed_calls.load(), (unsigned long long)t.records_served.load(),
        t.bytes_verified.load() / 1048576.0);
  }

  void SetUp() override {
    spec_ = *ModelSpec::Preset("qwen2.5-0.5b");
    // Small under sanitizers: fewer layers make each session and Put proportionally cheaper.
    // 12 layers (8 under sanitizers) keep a case's Puts and sessions cheap; the paths are the same.
    spec_.layers = kSanitizerBuild ? 8 : 12;
    const FaultCase& c = GetParam();
    seed_ =
        synth::Mix64(static_cast<uint64_t>(c.fault) * 1000 + static_cast<uint64_t>(c.phase) * 100 +
                     static_cast<uint64_t>(c.rate * 100) + (c.seam == Seam::kReadEngine ? 7 : 0));
    fs_ = std::make_unique<FaultInjectingFileSystem>(io::PosixFileSystem(), seed_);
    // Slow I/O really is slow (that is what bounds are tested against), but only for the ops
    // the rate picks; every other fault leaves the sleeper unused.
    fs_->SetSleeper([this](uint64_t us) {
      if (GetParam().seam == Seam::kReadEngine) {  // the hook drew the op already
        absl::SleepFor(absl::Microseconds(us));
        return;
      }
      uint64_t draw;
      {
        absl::MutexLock lock(&slow_mu_);
        draw = synth::Mix64(seed_ ^ ++slow_draws_);
      }
      if (static_cast<double>(draw % 1000000) < GetParam().rate * 1e6) {
        slow_ops_++;
        absl::SleepFor(absl::Microseconds(us));
      }
    });
    OpenEngine();
    for (size_t b = 0; b < kBase; ++b) {
      Prefix p{synth::Tokens(100 + b, kChunks * spec_.chunk_tokens), true};
      auto put = PutSynthetic(*engine_, spec_, p.tokens);
      ASSERT_TRUE(put.ok()) << put.status();
      prefixes_.push_back(std::move(p));
    }
  }

  void OpenEngine() {
    EngineOptions o;
    const engine::Seams seams{.file_system = fs_.get()};
    if (GetParam().phase == Phase::kEviction) {
      // Room for about four prefixes of kChunks chunks: the base three and one more.
      o.max_disk_bytes = (4 * kChunks + 2) * ChunkDiskBytes(spec_);
    }
    auto engine = engine::OpenWithSeams(o, dir_.path(), seams);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    // The eviction ledger: every chunk whose removal the store committed.
    engine::HostOf(*engine_).store().SetRemovalObserver(
        [this](const storage::ChunkStore::RemovalEvent& e) {
          if (e.phase != storage::ChunkStore::RemovalEvent::Phase::kCommitted) return;
          absl::MutexLock lock(&removed_mu_);
          removed_.insert(e.keys.begin(), e.keys.end());
        });
    if (GetParam().seam == Seam::kReadEngine) {
      fs_->SetOpHook([this](const FaultInjectingFileSystem::OpInfo& op) {
        const size_t length = op.length;
        FaultInjectingFileSystem::OpFault f;
        if (!hook_on_.load() || !op.read) return f;
        uint64_t draw;
        {
          absl::MutexLock lock(&slow_mu_);
          draw = synth::Mix64(seed_ ^ (0x5eed0000 + ++hook_draws_));
        }
        if (static_cast<double>(draw % 1000000) >= GetParam().rate * 1e6) return f;
        hook_faults_++;
        switch (GetParam().fault) {
          case Fault::kEio:
            f.error = EIO;
            break;
          // A short transfer: the queue requeues the rest, unless nothing came (end of file).
          case Fault::kShortIo:
            f.transfer_limit =
                (draw >> 32) % 2 == 0 ? 0 : static_cast<int64_t>((length / 2) / 4096 * 4096);
            break;
          case Fault::kSlow:
            f.latency_us = kSlowUs;
            break;
          case Fault::kEnospc:
            break;
        }
        return f;
      });
    }
  }

  // The rule for the case's fault on the segment files (the catalog is RocksDB's, outside the
  // seam). Every op kind the fault can hit draws it at the case's rate.
  void InjectFaults() {
    const FaultCase& c = GetParam();
    if (c.seam == Seam::kReadEngine) {
      hook_on_ = true;
      return;
    }
    FaultRule rule;
    rule.path_substring = "seg-";
    switch (c.fault) {
      case Fault::kEio:
        rule.read_eio = rule.write_eio = rule.sync_fail = rule.punch_hole_fail = c.rate;
        break;
      case Fault::kShortIo:
        rule.short_read = rule.torn_write = c.rate;  // a torn write that reports EIO
        break;
      case Fault::kEnospc:
        rule.write_enospc = c.rate;
        rule.punch_hole_fail = c.rate;  // punching can need a block too (XFS, ext4 extents)
        rule.punch_hole_errno = ENOSPC;
        break;
      case Fault::kSlow:
        rule.latency_us = kSlowUs;
        break;
    }
    fs_->AddRule(rule);
  }
  void RemoveFaults() {
    hook_on_ = false;
    fs_->ClearRules();
  }
  uint64_t FaultsInjected() const {
    return fs_->total_injected() - fs_->injected(io::FaultKind::kLatency) + slow_ops_ +
           hook_faults_;
  }

  // A call under faults failed: its code must be the fault's, and it must say what failed.
  void ExpectFaultError(const absl::Status& s, absl::StatusCode want, const std::string& what) {
    MatrixTotals().failed_calls++;
    failed_calls_++;
    EXPECT_NE(GetParam().fault, Fault::kSlow) << what << ": slow I/O failed a call: " << s;
    EXPECT_EQ(s.code(), want) << what << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "injected")) << what << ": " << s;
  }

  // Whether acknowledged chunks may leave the store in this case: under a cap, and on a full file
  // system (ENOSPC), where a Put gives back room by evicting in eviction order and retries once.
  static bool MayEvict() {
    return GetParam().phase == Phase::kEviction || GetParam().fault == Fault::kEnospc;
  }

  // A Put under faults: OK (acknowledged) or the fault's code and nothing of it visible.
  void PutUnderFaults(std::vector<int32_t> tokens) {
    auto put = PutSynthetic(*engine_, spec_, tokens);
    if (GetParam().phase == Phase::kEviction) {
      // The cap holds on disk even while punches fail: freed slots are reused before new ones.
      EXPECT_LE(SegmentBlocksBytes(dir_.path()), engine_->Stats().max_disk_bytes);
    }
    if (put.ok()) {
      prefixes_.push_back({std::move(tokens), true});
      return;
    }
    if (GetParam().phase == Phase::kEviction && absl::IsResourceExhausted(put.status()) &&
        absl::StrContains(put.status().message(), "cannot make room")) {
      // Eviction's punches failed: the blocks are still there, so the cap refuses the Put.
      EXPECT_TRUE(absl::StrContains(put.status().message(), "could not give back"))
          << "the cap could not be met although only one prefix is pinned: " << put.status();
      ExpectFaultError(put.status(), absl::StatusCode::kResourceExhausted, "Put");
    } else {
      ExpectFaultError(put.status(), WriteCode(GetParam().fault), "Put");
    }
    EXPECT_TRUE(absl::StrContains(put.status().message(), "seg-")) << put.status();
    prefixes_.push_back({std::move(tokens), false});
  }

  // Runs a session over prefix `p` with faults on: every layer is submitted and awaited even
  // after a failure (a caller recomputes the failed layer and carries on). Served records must be
  // bit-exact; failures must be DataLoss naming the record. `mid` runs after half the layers.
  void SessionUnderFaults(const Prefix& p, Selector selector, const std::function<void()>& mid) {
    ReprefillOptions o;
    o.selector = selector;
    o.budget_fraction = 0.25;
    o.period_layers = 4;
    o.window = 4;
    const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, p.tokens);
    auto session = engine_->BeginReprefill(spec_, p.tokens, o);
    if (!session.ok()) {
      // Only summary reads happen in Begin.
      ExpectFaultError(session.status(), absl::StatusCode::kDataLoss, "BeginReprefill");
      EXPECT_NE(selector, Selector::kPeriodExact) << session.status();
      if (mid) mid();
      return;
    }
    if (!MayEvict()) {
      EXPECT_EQ((*session)->matched_chunks(), keys.size()) << "a stored prefix matched short";
    }
    std::vector<std::byte> want(spec_.RecordBytes());
    const std::vector<float> q = Queries(o.window);
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      if (l == spec_.layers / 2 && mid) mid();
      const absl::Status submitted = (*session)->SubmitQueries(l, q);
      if (!submitted.ok()) {
        // A period head reads its whole layer to score it.
        ExpectFaultError(submitted, absl::StatusCode::kDataLoss,
                         absl::StrCat("SubmitQueries L", l));
        EXPECT_TRUE(absl::StrContains(submitted.message(), "record ")) << submitted;
      }
      auto view = (*session)->AwaitLayer(l);
      if (!view.ok()) {
        ExpectFaultError(view.status(), absl::StatusCode::kDataLoss,
                         absl::StrCat("AwaitLayer L", l));
        // Names the record (chunk key and layer) or, for a layer of a failed period head, the
        // head's record.
        EXPECT_TRUE(absl::StrContains(view.status().message(), "record ")) << view.status();
        continue;
      }
      EXPECT_TRUE(submitted.ok()) << "layer " << l << " served after its queries failed";
      const size_t n = (*session)->matched_chunks();
      EXPECT_EQ(view->records().size(),
                std::clamp<size_t>(static_cast<size_t>(0.25 * n + 0.5), std::min<size_t>(n, 2), n))
          << "layer " << l << " of " << n << " matched chunks";
      for (const auto& r : view->records()) {
        synth::FillRecord(spec_, keys[r.chunk], l, want);
        ASSERT_TRUE(ServedEquals(r, want.data(), want.size()))
            << "wrong bytes served for chunk " << r.chunk << " layer " << l;
        MatrixTotals().records_served++;
        MatrixTotals().bytes_verified += want.size();
      }
    }
    auto finished = (*session)->Finish();
    EXPECT_TRUE(finished.ok()) << finished.status();  // Finish reads nothing
  }

  std::vector<float> Queries(uint32_t window) const {
    std::vector<float> q(size_t{window} * spec_.q_heads * spec_.head_dim);
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = static_cast<float>(synth::Mix64(seed_ + i) % 4000) / 1000.0f - 2.0f;
    }
    return q;
  }

  // Once the faults are gone, the store is as the acknowledged Puts left it.
  void ExpectConsistentWithoutFaults() {
    RemoveFaults();
    // A background reclaim round in flight still counts the slots it punches.
    ::ckv::testing::WaitForReclaim(*engine_);
    auto gc = engine_->Gc();
    ASSERT_TRUE(gc.ok()) << gc.status();
    auto report = engine_->Verify();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->ok()) << report->problems.size()
                              << " problems, first: " << report->problems.front();
    EXPECT_EQ(report->checksum_failures, 0u);
    MatrixTotals().bytes_verified += report->bytes_checked;

    // Every acknowledged prefix: whole (or, under a cap or ENOSPC, evicted from its end),
    // bit-exact.
    absl::flat_hash_set<ChunkKey> present;
    const bool capped = MayEvict();
    const EngineStats stats = engine_->Stats();
    for (const Prefix& p : prefixes_) {
      if (!p.acknowledged) continue;
      const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, p.tokens);
      auto found = engine_->Lookup(spec_, p.tokens);
      ASSERT_TRUE(found.ok()) << found.status();
      if (!capped) {
        EXPECT_EQ(*found, keys.size()) << "an acknowledged Put lost chunks";
      }
      {
        // Under a cap, lost ⊆ evicted: a chunk may be gone only by a removal the store committed.
        absl::MutexLock lock(&removed_mu_);
        for (size_t i = *found; i < keys.size(); ++i) {
          EXPECT_TRUE(removed_.contains(keys[i]))
              << "chunk " << i << " of an acknowledged Put is gone, and no committed eviction "
              << "took it: " << keys[i].ToHex();
        }
      }
      EXPECT_EQ(CountBadRecords(*engine_, spec_, p.tokens, *found), 0);
      MatrixTotals().bytes_verified += *found * spec_.layers * spec_.RecordBytes();
      for (size_t i = 0; i < *found; ++i) present.insert(keys[i]);
    }
    // Every failed Put: none of its own chunks (a shared beginning may be another's).
    for (const Prefix& p : prefixes_) {
      if (p.acknowledged) continue;
      const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, p.tokens);
      auto found = engine_->Lookup(spec_, p.tokens);
      ASSERT_TRUE(found.ok());
      for (size_t i = 0; i < *found; ++i) {
        EXPECT_TRUE(present.contains(keys[i]))
            << "chunk " << i << " of a failed Put is visible: " << keys[i].ToHex();
      }
    }
    EXPECT_EQ(stats.chunks, present.size()) << "the catalog holds chunks no acknowledged Put made";
    // No leaked blocks: the segment files hold exactly the live chunks.
    EXPECT_EQ(stats.disk_bytes_used, present.size() * ChunkDiskBytes(spec_));
    // st_blocks also counts the file system's extent blocks (ext4: one per ~340 extents, at
    // least one per segment in practice), which the cap reserves for (docs/format.md). A leaked
    // record slot is 8 KiB and a leaked chunk ~200 KiB; the reopen below, which punches whatever
    // no chunk names, must then find nothing to reclaim.
    const uint64_t blocks = SegmentBlocksBytes(dir_.path());
    EXPECT_GE(blocks, stats.disk_bytes_used);
    EXPECT_LE(blocks, stats.disk_bytes_used + stats.segments * 4096 +
                          4096 * (stats.disk_bytes_used / (4096 * 340) + 1))
        << "segment blocks exceed the catalog's chunks by more than extent metadata";
    extra_blocks_ = blocks - std::min(blocks, stats.disk_bytes_used);
    if (GetParam().phase == Phase::kEviction) {
      EXPECT_LE(SegmentBlocksBytes(dir_.path()), stats.max_disk_bytes);
    }

    // A new session over every acknowledged prefix serves it bit-exact (no fault is drawn now).
    for (const Prefix& p : prefixes_) {
      if (!p.acknowledged) continue;
      const uint64_t failed_before = failed_calls_;
      SessionUnderFaults(p, Selector::kQuest, nullptr);
      EXPECT_EQ(failed_calls_, failed_before) << "a fault-free session failed";
    }

    // Reopen: nothing to reclaim, and the failed Puts now succeed.
    engine_.reset();
    OpenEngine();
    EXPECT_EQ(engine_->Stats().orphan_bytes_reclaimed, 0u);
    for (Prefix& p : prefixes_) {
      if (p.acknowledged) continue;
      auto again = PutSynthetic(*engine_, spec_, p.tokens);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(CountBadRecords(*engine_, spec_, p.tokens, p.tokens.size() / spec_.chunk_tokens),
                0);
    }
  }

  TempDir dir_;
  ModelSpec spec_;
  uint64_t seed_ = 0;
  std::unique_ptr<FaultInjectingFileSystem> fs_;
  std::unique_ptr<Engine> engine_;
  std::vector<Prefix> prefixes_;
  absl::Mutex slow_mu_;
  uint64_t slow_draws_ ABSL_GUARDED_BY(slow_mu_) = 0;
  uint64_t hook_draws_ ABSL_GUARDED_BY(slow_mu_) = 0;
  std::atomic<uint64_t> slow_ops_{0};
  std::atomic<uint64_t> hook_faults_{0};
  std::atomic<bool> hook_on_{false};
  absl::Mutex removed_mu_;
  absl::flat_hash_set<ChunkKey> removed_ ABSL_GUARDED_BY(removed_mu_);
  uint64_t failed_calls_ = 0;
  uint64_t extra_blocks_ = 0;  // segment blocks beyond the catalog's chunks, after Gc  // calls
                               // under faults that failed (the test's thread only)
};

TEST_P(FaultMatrixTest, FailsWithTheFaultsCodeServesExactBytesAndIsConsistentAfter) {
  const FaultCase& c = GetParam();
  Watchdog watchdog(CaseName({c, 0}), absl::Seconds(kSanitizerBuild ? 300 : 60));
  const absl::Time start = absl::Now();
  const Selector selectors[] = {Selector::kPeriodExact, Selector::kQuest, Selector::kMeanKey};
  InjectFaults();
  switch (c.phase) {
    case Phase::kPut:
      // New prefixes, and prefixes that extend a base one (their beginning is deduplicated).
      for (uint64_t i = 0; i < 2; ++i) {
        PutUnderFaults(synth::Tokens(200 + i, kChunks * spec_.chunk_tokens));
        PutUnderFaults(synth::TokensWithSharedPrefix(100 + i, kChunks * spec_.chunk_tokens, 210 + i,
                                                     (kChunks + 4) * spec_.chunk_tokens));
      }
      break;
    case Phase::kSession:
      // Each base prefix with another selector; a Put of a new prefix halfway through. The
      // read engine coalesces a session's reads into few device reads, the hook's unit: four
      // rounds of sessions give a 1% rate a few faults to draw.
      for (int round = 0; round < (c.seam == Seam::kReadEngine ? 4 : 1); ++round) {
        for (size_t b = 0; b < kBase; ++b) {
          const Prefix p = prefixes_[b];
          SessionUnderFaults(p, selectors[(b + round) % 3], [&] {
            if (round == 0) PutUnderFaults(synth::Tokens(300 + b, kChunks * spec_.chunk_tokens));
          });
        }
      }
      break;
    case Phase::kEviction: {
      // A session holds base prefix 0 while Puts evict the others under the cap; then a Delete
      // and a Gc, all under the faults.
      const Prefix p = prefixes_[0];
      SessionUnderFaults(p, Selector::kPeriodExact, [&] {
        for (uint64_t i = 0; i < 3; ++i) {
          PutUnderFaults(synth::Tokens(400 + i, kChunks * spec_.chunk_tokens));
        }
      });
      const absl::Status deleted = engine_->Delete(spec_, prefixes_[1].tokens);
      // Evicted already (NotFound), or deleted; a Delete's punch failure is only logged.
      EXPECT_TRUE(deleted.ok() || absl::IsNotFound(deleted)) << deleted;
      if (deleted.ok()) prefixes_[1].acknowledged = false;
      auto gc = engine_->Gc();
      if (!gc.ok()) ExpectFaultError(gc.status(), WriteCode(c.fault), "Gc");
      break;
    }
  }
  const uint64_t faults = FaultsInjected();
  auto reads = engine::HostOf(*engine_).reads();
  ASSERT_TRUE(reads.ok()) << reads.status();
  const std::string backend = (*reads)->backend();
  if (c.rate >= 1.0) {
    EXPECT_GT(faults, 0u) << "a rate of 1 injected nothing";
  }
  if (c.rate >= 1.0 && c.phase == Phase::kPut) {
    for (size_t i = kBase; i < prefixes_.size(); ++i) {
      EXPECT_EQ(prefixes_[i].acknowledged, c.fault == Fault::kSlow) << "Put " << i;
    }
  }
  if (c.fault == Fault::kSlow) {
    EXPECT_EQ(failed_calls_, 0u);
  }
  // The faults went through the one I/O layer, on io_uring where the kernel allows it: Put's
  // writes (a rate of 1 hits every one of them but ENOSPC's, which the block reservation meets
  // first) and the read engine's reads (the hook sees only those).
  if (io::UringAvailable()) {
    EXPECT_EQ(backend, "io_uring");
  }
  if (c.rate >= 1.0 && c.phase == Phase::kPut && c.fault != Fault::kEnospc) {
    EXPECT_GT(fs_->queue_faults(backend).writes, 0u) << backend;
  }
  if (c.seam == Seam::kReadEngine && hook_faults_ > 0) {
    EXPECT_GT(fs_->queue_faults(backend).reads, 0u) << backend;
  }
  ExpectConsistentWithoutFaults();
  MatrixTotals().cases++;
  MatrixTotals().faults += faults;
  std::printf(
      "fault matrix %s: %llu faults injected, %llu calls failed, %llu B of extent "
      "metadata, reads on %s, %.2f s\n",
      CaseName({c, 0}).c_str(), static_cast<unsigned long long>(faults),
      static_cast<unsigned long long>(failed_calls_),
      static_cast<unsigned long long>(extra_blocks_), backend.c_str(),
      absl::ToDoubleSeconds(absl::Now() - start));
}

std::vector<FaultCase> Cases() {
  std::vector<FaultCase> out;
  // Under sanitizers: the 10% and 100% rates only.
  std::vector<double> rates = {0.01, 0.1, 1.0};
  if (kSanitizerBuild) rates = {0.1, 1.0};
  for (Phase phase : {Phase::kPut, Phase::kSession, Phase::kEviction}) {
    for (Fault fault : {Fault::kEio, Fault::kShortIo, Fault::kEnospc, Fault::kSlow}) {
      for (double rate : rates) out.push_back({fault, rate, phase, Seam::kFileSystem});
    }
  }
  for (Fault fault : {Fault::kEio, Fault::kShortIo, Fault::kSlow}) {
    for (double rate : rates) out.push_back({fault, rate, Phase::kSession, Seam::kReadEngine});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, FaultMatrixTest, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace ckv
