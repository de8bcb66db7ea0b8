// Crash tests: the crash matrix of docs/reliability.md.
//
// SIGKILL cells: a child process (tests/crash_child.cc) runs a seeded workload
// (tests/crash_workload.h) and acknowledges each operation on a pipe; the parent kills it with
// SIGKILL at random moments, reopens the store and checks that every acknowledged Put is present
// and bit-exact (or, under a cap, shortened only by evictions the child reported), that the F of
// acknowledged sessions is durable, that nothing partial is visible, that Verify is clean, that no
// orphaned space remains and that the disk is within the cap. Once per cell, the real `kvctl
// verify --synthetic` checks the closed store.
//
// Simulated power loss (SimulatedPowerLoss...): in process, the fault file system stops the store
// at a chosen operation and drops or tears every segment write not covered by a completed
// fdatasync before the store is reopened and checked the same way.
//
// CKV_CRASH_KILLS overrides the number of kills of each cell (and of simulated crashes).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <vector>
#include <string>

#include "ckv/engine.h"
#include "ckv/log.h"
#include "tests/crash_spec.h"
#include "tests/crash_workload.h"
#include "storage/fault_file_system.h"
#include "tests/test_util.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif
#ifndef CKV_CRASH_CHILD_PATH
#error "CKV_CRASH_CHILD_PATH must name the ckv_crash_child binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;

// Kills per SIGKILL cell, and simulated power losses per in-process cell; CKV_CRASH_KILLS
// overrides both. Sanitizers slow every child's start and reopen several times over, so their
// builds kill fewer times.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC
#define CKV_CRASH_SANITIZED 1
#elif defined(__has_feature)  // Clang
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CKV_CRASH_SANITIZED 1
#endif
#endif
// The simulated power losses are cheaper to check per crash but each reopens the store twice;
// 3 x 70 SIGKILLs + 2 x 50 power losses keep the suite's Release run of them near 30 s on an idle
// 2-core machine (60 s under other builds).
#ifdef CKV_CRASH_SANITIZED
constexpr int kDefaultKills = 25;
constexpr int kDefaultPowerLosses = 20;
#else
constexpr int kDefaultKills = 70;
constexpr int kDefaultPowerLosses = 50;
#endif

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
  std::string pending;
};

Child Spawn(const std::string& store, uint64_t seed, const char* mode, uint64_t cap,
            const std::string& known_file) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    const std::string seed_str = std::to_string(seed);
    const std::string cap_str = std::to_string(cap);
    ::execl(CKV_CRASH_CHILD_PATH, CKV_CRASH_CHILD_PATH, store.c_str(), seed_str.c_str(), mode,
            cap_str.c_str(), known_file.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  child.out = fds[0];
  return child;
}

// Reads what the child has written within `timeout_ms`; calls `line` for each whole line.
// Returns false at end of file.
template <typename Fn>
bool Pump(Child& child, int timeout_ms, Fn line) {
  pollfd p{child.out, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;
  char buf[4096];
  ssize_t n = ::read(child.out, buf, sizeof(buf));
  if (n <= 0) return false;
  child.pending.append(buf, static_cast<size_t>(n));
  size_t nl;
  while ((nl = child.pending.find('\n')) != std::string::npos) {
    line(child.pending.substr(0, nl));
    child.pending.erase(0, nl + 1);
  }
  return true;
}

// What the parent knows of the store from the lines children acknowledged (crash_workload.h),
// and the checks of a reopened store against it.
class Ledger {
 public:
  explicit Ledger(uint64_t cap) : cap_(cap) {}

  void Clear() {
    expected_.clear();
    uncertain_.clear();
    ResetWindows();
  }

  // One line of a child's output (or of an in-process workload).
  void Consume(const std::string& line) {
    std::string verb;
    crash::Prefix p;
    uint64_t value = 0;
    ASSERT_TRUE(crash::Parse(line, &verb, &p, &value)) << line;
    if (verb == "putting") {
      // Until acknowledged, the Put may or may not have committed; with a cap, its eviction
      // may have shortened any prefix until the child reports the matches ("settled").
      put_pending_ = p;
      evict_window_ = cap_ > 0;
      return;
    }
    if (verb == "put") {
      expected_[p.seed] = Entry{p, p.chunks, 0};
      put_pending_.reset();
    } else if (verb == "match") {
      auto it = expected_.find(p.seed);
      if (it != expected_.end()) it->second.matched = value;
      return;
    } else if (verb == "settled") {
      evict_window_ = false;
      return;
    } else if (verb == "deleting") {
      expected_.erase(p.seed);
      uncertain_[p.seed] = p;
      // With a cap, a Delete may take chunks that only the deleted prefix still held for a
      // prefix that eviction had cut back to them, until the child reports the matches.
      evict_window_ = cap_ > 0;
      return;
    } else if (verb == "del") {
      uncertain_.erase(p.seed);
    } else if (verb == "reprefill") {
      auto it = expected_.find(p.seed);
      if (it != expected_.end()) it->second.loads = std::max(it->second.loads, value);
      ++sessions_;
    } else if (verb == "gc") {
      ++gcs_;
    } else {
      FAIL() << "unknown line " << line;
    }
    ++acks_;
  }

  // Checks the store reopened after a crash, then adopts what it holds as the new truth.
  void Check(Engine& engine, const std::string& store, const std::string& run) {
    const ModelSpec spec = crash::Spec();
    // Every acknowledged Put is there, bit-exact: whole, or (with a cap) shortened by reported
    // evictions; only a Put or Delete in flight at the crash may have shortened it unreported.
    for (auto& [seed, e] : expected_) {
      const auto tokens = crash::TokensOf(spec, e.prefix);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok()) << matched.status();
      if (!evict_window_) {
        ASSERT_GE(*matched, e.matched) << run << ": acknowledged prefix " << seed << " lost chunks";
      }
      ASSERT_LE(*matched, e.prefix.chunks);
      ASSERT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0)
          << run << ": acknowledged prefix " << seed;
      if (*matched == e.prefix.chunks && e.loads > 0) {
        // I and F of an acknowledged session are durable: F only grows while the prefix lives.
        const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
        auto described = engine.DescribePrefix(keys.back());
        ASSERT_TRUE(described.ok()) << described.status();
        uint64_t loads = 0;
        for (const ChunkPlacement& c : described->chunks) loads += c.loads;
        ASSERT_GE(loads, e.loads) << run << ": prefix " << seed << " lost loads F";
        ++loads_checked_;
      }
      e.matched = *matched;
    }
    // A Put cut short is whole or absent: only chunks it shares with others may be stored.
    if (put_pending_) {
      const crash::Prefix p = *put_pending_;
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      if (*matched == p.chunks) {
        ASSERT_EQ(CountBadRecords(engine, spec, tokens, p.chunks), 0) << run;
        expected_[p.seed] = Entry{p, p.chunks, 0};
        ++puts_cut_short_committed_;
      } else {
        ASSERT_LE(*matched, p.shared_chunks) << run << ": a Put cut short is partly visible";
      }
    }
    // A Delete cut short either happened or did not: the prefix is whole (adopted again) or no
    // longer listed.
    for (const auto& [seed, p] : uncertain_) {
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      ASSERT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0) << run;
      if (*matched == p.chunks) expected_[seed] = Entry{p, p.chunks, 0};
    }
    uncertain_.clear();
    // Whatever is listed (acknowledged or not) is whole.
    for (const PrefixInfo& info : engine.ListPrefixes()) {
      ModelSpec got;
      auto keys = engine.PrefixChunks(info.id, &got);
      ASSERT_TRUE(keys.ok()) << keys.status();
      ASSERT_EQ(keys->size(), info.chunks);
    }
    auto report = engine.Verify();
    ASSERT_TRUE(report.ok());
    ASSERT_TRUE(report->ok()) << run << ": " << report->problems.front();
    // No space is held by anything uncommitted, and the disk is within the cap.
    const EngineStats stats = engine.Stats();
    ASSERT_EQ(stats.disk_bytes_used, stats.chunks * ChunkDiskBytes(spec)) << run;
    // (ext4 may add a few blocks of extent tree to a sparse file: allowed up to 64 KiB + 1/256.)
    const uint64_t blocks = SegmentBlocksBytes(store);
    ASSERT_GE(blocks, stats.disk_bytes_used) << run;
    ASSERT_LE(blocks, stats.disk_bytes_used + 64 * 1024 + stats.disk_bytes_used / 256)
        << run << ": uncommitted space was not reclaimed";
    if (cap_ > 0) {
      ASSERT_LE(blocks, cap_) << run << ": segment blocks past the cap";
      ASSERT_LE(stats.disk_bytes_used, cap_) << run;
    }
    ResetWindows();
  }

  // The prefixes the store holds, as a child's KNOWN file lists them.
  std::vector<crash::Known> Known() const {
    std::vector<crash::Known> known;
    for (const auto& [seed, e] : expected_) known.push_back({e.prefix, e.matched});
    return known;
  }
  void WriteKnown(const std::string& path) const {
    std::ofstream out(path, std::ios::trunc);
    for (const crash::Known& k : Known()) out << crash::Format("known", k.prefix, k.matched) << "\n";
  }

  int acks() const { return acks_; }
  int sessions() const { return sessions_; }
  int gcs() const { return gcs_; }
  int loads_checked() const { return loads_checked_; }
  size_t stored() const { return expected_.size(); }

 private:
  struct Entry {
    crash::Prefix prefix;
    uint64_t matched = 0;  // leading chunks known to be stored (a lower bound)
    uint64_t loads = 0;    // F summed over its chunks after the last acknowledged session
  };
  void ResetWindows() {
    put_pending_.reset();
    evict_window_ = false;
  }

  const uint64_t cap_;
  std::map<uint64_t, Entry> expected_;          // acknowledged and not deleted, by seed
  std::map<uint64_t, crash::Prefix> uncertain_;  // a Delete began but was not acknowledged
  std::optional<crash::Prefix> put_pending_;     // a Put began but was not acknowledged
  bool evict_window_ = false;
  int acks_ = 0, sessions_ = 0, gcs_ = 0, loads_checked_ = 0, puts_cut_short_committed_ = 0;
};

// Runs the real kvctl verify (with the generator's check of every record) on a closed store.
void KvctlVerify(const std::string& store) {
  const std::string cmd = "KVCTL_PROGRESS=off " + std::string(CKV_KVCTL_PATH) + " verify " +
                          store + " --synthetic --json 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  ASSERT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

int KillsFromEnv(int default_kills) {
  if (const char* env = std::getenv("CKV_CRASH_KILLS")) return std::atoi(env);
  return default_kills;
}

// One cell of the crash matrix: a workload, a cap, and how many times to kill it.
struct Cell {
  crash::Mode mode = crash::Mode::kPuts;
  const char* mode_name = "puts";
  uint64_t cap = 0;  // bytes; 0 = none
  int kills = 100;
  int fresh_store_every = 15;  // a fresh store now and then keeps each verification small
  int max_acks_before_kill = 4;
  uint64_t rng_seed = 0x5eed;
};

void RunKillCell(const Cell& cell) {
  TempDir dir;
  std::string store;
  const std::string known_file = dir.Sub("known");
  Ledger ledger(cell.cap);
  uint64_t rng = cell.rng_seed;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int killed_mid_run = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < cell.kills; ++k) {
    if (k % cell.fresh_store_every == 0) {
      store = dir.Sub("store" + std::to_string(k));
      ledger.Clear();
    }
    ledger.WriteKnown(known_file);
    Child child = Spawn(store, k + 1, cell.mode_name, cell.cap, known_file);
    // Let it acknowledge a few operations, then kill it at a random moment after that.
    const int acks_wanted = ledger.acks() + static_cast<int>(next() % cell.max_acks_before_kill);
    auto on_line = [&](const std::string& line) { ledger.Consume(line); };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool alive = true;
    while (alive && ledger.acks() < acks_wanted && std::chrono::steady_clock::now() < deadline) {
      alive = Pump(child, 50, on_line);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    ASSERT_TRUE(alive) << "child exited early in run " << k;
    ASSERT_GE(ledger.acks(), acks_wanted) << "child made no progress in run " << k;
    const auto delay = std::chrono::microseconds(next() % 20000);
    const auto kill_at = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < kill_at) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          kill_at - std::chrono::steady_clock::now());
      Pump(child, static_cast<int>(std::max<int64_t>(0, left.count())), on_line);
    }
    ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child.pid, &status, 0), child.pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child ended on its own in run " << k << " status "
                                     << status;
    ++killed_mid_run;
    // Lines written before the kill are acknowledged.
    while (Pump(child, 0, on_line)) {
    }
    ::close(child.out);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());

    {
      auto engine = Engine::Open(EngineOptions{}, store);
      ASSERT_TRUE(engine.ok()) << "run " << k << ": " << engine.status();
      ledger.Check(**engine, store, "run " + std::to_string(k));
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    if (k == cell.kills - 1) KvctlVerify(store);  // once per cell, on the closed store
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(killed_mid_run, cell.kills);
  EXPECT_GT(ledger.acks(), cell.kills / 2);
  std::printf("crash test (%s, cap %llu): %d kills, %d acknowledged operations (%d sessions, "
              "%d gc), %d F checks, %.1f s\n",
              cell.mode_name, static_cast<unsigned long long>(cell.cap), killed_mid_run,
              ledger.acks(), ledger.sessions(), ledger.gcs(), ledger.loads_checked(), seconds);
}

TEST(CrashTest, SigkillDuringPutsLosesNothingAcknowledgedAndShowsNothingPartial) {
  Cell cell;
  cell.kills = KillsFromEnv(kDefaultKills);
  RunKillCell(cell);
}

TEST(CrashTest, SigkillDuringSessionsDeletesAndGcLosesNothingAcknowledged) {
  Cell cell;
  cell.mode = crash::Mode::kMixed;
  cell.mode_name = "mixed";
  cell.kills = KillsFromEnv(kDefaultKills);
  cell.max_acks_before_kill = 6;
  cell.rng_seed = 0xc0ffee;
  RunKillCell(cell);
}

TEST(CrashTest, SigkillWhilePutsEvictUnderACapKeepsTheCapAndWholePrefixes) {
  Cell cell;
  cell.mode = crash::Mode::kMixed;
  cell.mode_name = "mixed";
  // About 24 chunks of the crash model: four or five prefixes; most Puts evict.
  cell.cap = 24 * ChunkDiskBytes(crash::Spec());
  cell.kills = KillsFromEnv(kDefaultKills);
  cell.max_acks_before_kill = 6;
  cell.fresh_store_every = 25;
  cell.rng_seed = 0xcab;
  RunKillCell(cell);
}

// Simulated power loss, in process: the workload runs on a store whose segment files go through
// the fault file system, armed to "crash" after a random number of data operations; the store is
// then abandoned, every segment write not covered by a completed fdatasync is dropped, torn or
// kept (storage/fault_file_system.h), and the store is reopened and checked as after a SIGKILL.
void RunPowerLossCell(uint64_t cap, int crashes, uint64_t rng_seed) {
  TempDir dir;
  std::string store;
  storage::FaultInjectingFileSystem fs(storage::PosixFileSystem(), rng_seed);
  Ledger ledger(cap);
  uint64_t rng = rng_seed;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  storage::FaultInjectingFileSystem::CrashReport total;
  int crashed = 0, steps = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < crashes; ++c) {
    if (c % 20 == 0) {
      store = dir.Sub("store" + std::to_string(c));
      ledger.Clear();
    }
    const std::string run = "simulated crash " + std::to_string(c);
    {
      EngineOptions options;
      options.file_system = &fs;
      options.logger = NullLogger();  // the failures after the crash are expected
      if (cap > 0) options.max_disk_bytes = cap;
      auto engine = Engine::Open(options, store);
      ASSERT_TRUE(engine.ok()) << run << ": " << engine.status();
      crash::Workload workload(**engine, crash::Mode::kMixed, c + 1, cap > 0, ledger.Known(),
                               [&](const std::string& line) { ledger.Consume(line); });
      // A Put is about 21 data operations here (an allocation and a write per band, a sync).
      fs.ArmCrash(next() % 120);
      absl::Status s;
      for (int i = 0; i < 1000 && s.ok(); ++i, ++steps) s = workload.Step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ASSERT_TRUE(fs.crashed()) << run << ": no crash after 1000 operations";
      // The crash surfaces as its own Unavailable, or, under a cap, as the Put that eviction's
      // failed punches could not make room for (ResourceExhausted, the punch's error quoted).
      const bool refused_at_cap = cap > 0 && absl::IsResourceExhausted(s) &&
                                  s.message().find("could not give back") != absl::string_view::npos;
      ASSERT_TRUE(absl::IsUnavailable(s) || refused_at_cap) << run << ": " << s;
      ASSERT_NE(s.message().find("simulated crash"), absl::string_view::npos) << s;
      ++crashed;
    }  // abandoned: the Engine is gone, its I/O done
    auto report = fs.ApplyCrash(next());
    ASSERT_TRUE(report.ok()) << report.status();
    total.writes_dropped += report->writes_dropped;
    total.writes_torn += report->writes_torn;
    total.writes_kept += report->writes_kept;
    EngineOptions reopen;
    reopen.logger = NullLogger();  // (it reports the space it reclaims)
    auto engine = Engine::Open(reopen, store);
    ASSERT_TRUE(engine.ok()) << run << ": " << engine.status();
    ledger.Check(**engine, store, run);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    if (c == crashes - 1) {
      engine->reset();
      KvctlVerify(store);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(crashed, crashes);
  // The crashes cut unsynced writes, not only clean points between operations.
  EXPECT_GT(total.writes_dropped, 0u);
  EXPECT_GT(total.writes_torn, 0u);
  std::printf("simulated power loss (cap %llu): %d crashes, %d operations, %d acknowledged; "
              "unsynced writes dropped %llu, torn %llu, kept %llu; %d F checks, %.1f s\n",
              static_cast<unsigned long long>(cap), crashed, steps, ledger.acks(),
              static_cast<unsigned long long>(total.writes_dropped),
              static_cast<unsigned long long>(total.writes_torn),
              static_cast<unsigned long long>(total.writes_kept), ledger.loads_checked(), seconds);
}

TEST(CrashTest, SimulatedPowerLossDropsOrTearsUnsyncedWritesAndLosesNothingAcknowledged) {
  RunPowerLossCell(/*cap=*/0, KillsFromEnv(kDefaultPowerLosses), 0x9a11);
}

TEST(CrashTest, SimulatedPowerLossUnderACapKeepsTheCapAndWholePrefixes) {
  RunPowerLossCell(24 * ChunkDiskBytes(crash::Spec()), KillsFromEnv(kDefaultPowerLosses),
                   0x9a12);
}

}  // namespace
}  // namespace ckv
