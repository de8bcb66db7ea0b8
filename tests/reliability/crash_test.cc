// SPDX-License-Identifier: Apache-2.0
// Crash tests: the crash matrix of docs/reliability.md.
//
// SIGKILL cells: a child process (tests/reliability/crash_child.cc) runs a seeded workload
// (tests/reliability/crash_workload.h) and acknowledges each operation on a pipe; the parent kills
// it with SIGKILL at random moments, reopens the store and checks that every acknowledged Put is
// present and bit-exact (or, under a cap, shortened only by evictions the child reported), that the
// F of acknowledged sessions is durable, that nothing partial is visible, that Verify is clean,
// that no orphaned space remains and that the disk is within the cap. Once per cell, the real
// `kvctl verify --synthetic` checks the closed store.
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

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "ckv/engine.h"
#include "ckv/log.h"
#include "engine/internal.h"
#include "io/fault_file_system.h"
#include "storage/chunk_store.h"
#include "tests/reliability/crash_spec.h"
#include "tests/reliability/crash_workload.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

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
// The simulated power losses are cheaper to check per crash but each reopens the store twice.
// Every check (the catalog behind the seam, the eviction ledger, deleted prefixes after every
// reopen) costs about 10% more per kill than a plain reopen; the defaults are sized so that CI's
// time stays bounded. The long mode (CKV_CRASH_KILLS) is
// where the numbers are.
#ifdef CKV_CRASH_SANITIZED
constexpr int kDefaultKills = 22;
constexpr int kDefaultPowerLosses = 18;
#else
constexpr int kDefaultKills = 60;
constexpr int kDefaultPowerLosses = 45;
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
//
// The eviction ledger: a chunk leaves the store only in a removal batch the store reported
// ("removing ..." before its commit, "removed" after). An acknowledged prefix's lower bound
// (`matched`) drops only when a batch that took one of its chunks is known committed; after a
// crash, every chunk of it that is gone must be in the one batch whose commit is unknown, and
// that batch must be entirely gone or entirely there. Nothing else may be missing: lost ⊆ evicted.
class Ledger {
 public:
  // `power_loss`: a crash may lose what reached the kernel but was not synced. Usage statistics
  // (I and F) are committed unsynced by contract (storage/catalog.h), so an acknowledged
  // session's F is required durable only once a later Put (a synced commit) was acknowledged.
  Ledger(uint64_t cap, bool power_loss) : cap_(cap), power_loss_(power_loss) {}

  void Clear() {
    expected_.clear();
    uncertain_.clear();
    deleting_.clear();
    deleted_.clear();
    ResetWindows();
  }

  // One line of a child's output (or of an in-process workload).
  void Consume(const std::string& line) {
    if (line.rfind("removing ", 0) == 0) {
      removal_pending_.clear();
      size_t pos = 9;
      while (pos < line.size()) {
        size_t sp = line.find(' ', pos);
        if (sp == std::string::npos) sp = line.size();
        auto key = ChunkKey::FromHex(line.substr(pos, sp - pos));
        ASSERT_TRUE(key.ok()) << line;
        removal_pending_.push_back(*key);
        pos = sp + 1;
      }
      ++removals_;
      return;
    }
    if (line == "removed") {
      // Committed: the lower bounds of the prefixes it cut drop to the first chunk it took.
      absl::flat_hash_set<ChunkKey> gone(removal_pending_.begin(), removal_pending_.end());
      auto cut = [&](Entry& e) {
        for (uint64_t i = 0; i < e.matched; ++i) {
          if (gone.contains(e.keys[i])) {
            e.matched = i;
            // A chunk that left may come back (a later Put) with F = 0: F is no longer owed.
            e.loads = e.loads_unsynced = 0;
            break;
          }
        }
      };
      for (auto& [seed, e] : expected_) cut(e);
      for (auto& [seed, e] : deleting_) cut(e);
      // The background reclaimer may evict a Put's chunks between its commit and its
      // acknowledgement: its lower bound starts below them.
      if (put_pending_) removed_since_putting_.insert(gone.begin(), gone.end());
      chunks_removed_ += removal_pending_.size();
      removal_pending_.clear();
      return;
    }
    std::string verb;
    crash::Prefix p;
    uint64_t value = 0;
    ASSERT_TRUE(crash::Parse(line, &verb, &p, &value)) << line;
    if (verb == "putting") {
      // Until acknowledged, the Put may or may not have committed.
      put_pending_ = p;
      removed_since_putting_.clear();
      in_flight_ = "put";
      return;
    }
    if (verb == "deleting") {
      auto it = expected_.find(p.seed);
      deleting_[p.seed] = it != expected_.end() ? it->second : MakeEntry(p);
      if (it != expected_.end()) expected_.erase(it);
      uncertain_[p.seed] = p;
      in_flight_ = "delete";
      return;
    }
    if (verb == "delmissed") {
      // Not deleted: the reclaimer had cut the prefix (the removal lines said so).
      auto it = deleting_.find(p.seed);
      if (it != deleting_.end()) expected_[p.seed] = it->second;
      deleting_.erase(p.seed);
      uncertain_.erase(p.seed);
      in_flight_.clear();
      ++acks_;
      return;
    }
    if (verb == "reprefilling") {
      in_flight_ = "session";
      return;
    }
    if (verb == "gcing") {
      in_flight_ = "gc";
      return;
    }
    in_flight_.clear();
    if (verb == "put") {
      Entry e = MakeEntry(p);
      for (uint64_t i = 0; i < e.matched; ++i) {
        if (removed_since_putting_.contains(e.keys[i])) {
          e.matched = i;
          break;
        }
      }
      expected_[p.seed] = std::move(e);
      deleted_.erase(p.seed);
      put_pending_.reset();
      removed_since_putting_.clear();
      // A synced commit: the usage statistics committed before it are durable now.
      for (auto& [seed, e] : expected_) e.loads = std::max(e.loads, e.loads_unsynced);
    } else if (verb == "del") {
      uncertain_.erase(p.seed);
      deleting_.erase(p.seed);
      deleted_[p.seed] = p;
    } else if (verb == "reprefill") {
      auto it = expected_.find(p.seed);
      if (it != expected_.end()) {
        uint64_t& loads = power_loss_ ? it->second.loads_unsynced : it->second.loads;
        loads = std::max(loads, value);
      }
      ++sessions_;
    } else if (verb == "gc") {
      ++gcs_;
    } else {
      FAIL() << "unknown line " << line;
    }
    ++acks_;
  }

  // What was in flight when the crash came ("put", "delete", "session", "gc"), or empty.
  const std::string& in_flight() const { return in_flight_; }

  // Checks the store reopened after a crash, then adopts what it holds as the new truth.
  void Check(Engine& engine, const std::string& store, const std::string& run) {
    const ModelSpec spec = crash::Spec();
    storage::ChunkStore& chunks = engine::HostOf(engine).store();
    auto stored = [&](const ChunkKey& key) {
      return chunks.Pin(spec, std::span<const ChunkKey>(&key, 1)).ok();
    };
    // The removal whose commit is unknown happened entirely or not at all.
    absl::flat_hash_set<ChunkKey> pending(removal_pending_.begin(), removal_pending_.end());
    size_t pending_gone = 0;
    for (const ChunkKey& key : removal_pending_) pending_gone += stored(key) ? 0 : 1;
    ASSERT_TRUE(pending_gone == 0 || pending_gone == removal_pending_.size())
        << run << ": a removal batch of " << removal_pending_.size()
        << " chunks is partly applied (" << pending_gone << " gone)";
    // Every acknowledged Put is there, bit-exact: whole, or (with a cap) shortened by removals
    // the store reported; a chunk below the lower bound may be missing only if the removal in
    // flight took it.
    for (auto& [seed, e] : expected_) {
      const auto tokens = crash::TokensOf(spec, e.prefix);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok()) << matched.status();
      for (uint64_t i = *matched; i < e.matched; ++i) {
        ASSERT_TRUE(pending.contains(e.keys[i]))
            << run << ": acknowledged prefix " << seed << " lost chunk " << i << " of "
            << e.prefix.chunks << " (" << e.keys[i].ToHex() << "), which no committed removal took";
      }
      ASSERT_LE(*matched, e.prefix.chunks);
      ASSERT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0)
          << run << ": acknowledged prefix " << seed;
      if (*matched == e.prefix.chunks && e.loads > 0) {
        // I and F of an acknowledged session are durable: F only grows while the prefix lives.
        auto described = engine.DescribePrefix(e.keys.back());
        ASSERT_TRUE(described.ok()) << described.status();
        uint64_t loads = 0;
        for (const ChunkPlacement& c : described->chunks) loads += c.loads;
        ASSERT_GE(loads, e.loads) << run << ": prefix " << seed << " lost loads F";
        ++loads_checked_;
      }
      e.matched = *matched;
      e.loads_unsynced = e.loads;
    }
    // A Put cut short is whole or absent: only chunks it shares with others may be stored.
    if (put_pending_) {
      const crash::Prefix p = *put_pending_;
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      const Entry e = MakeEntry(p);
      if (*matched == p.chunks) {
        ASSERT_EQ(CountBadRecords(engine, spec, tokens, p.chunks), 0) << run;
        expected_[p.seed] = e;
        ++puts_cut_short_committed_;
      } else if (*matched > p.shared_chunks && (removed_since_putting_.contains(e.keys[*matched]) ||
                                                pending.contains(e.keys[*matched]))) {
        // Committed, then cut by a removal (the reclaimer's) that took the next chunk.
        ASSERT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0) << run;
        expected_[p.seed] = e;
        expected_[p.seed].matched = *matched;
        ++puts_cut_short_committed_;
      } else {
        ASSERT_LE(*matched, p.shared_chunks) << run << ": a Put cut short is partly visible";
      }
    }
    // A Delete cut short either happened or did not: the prefix is whole (adopted again) or
    // deleted (checked as such from now on).
    // Under a cap the reclaimer may also have cut it meanwhile: then, not deleted, it keeps more
    // than other prefixes share with it, and lost no more than removals took.
    for (const auto& [seed, p] : uncertain_) {
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      ASSERT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0) << run;
      if (*matched == p.chunks) {
        expected_[seed] = MakeEntry(p);
        continue;
      }
      const Entry before = deleting_.contains(seed) ? deleting_.at(seed) : MakeEntry(p);
      if (*matched > SharedWithOthers(before.keys)) {
        for (uint64_t i = *matched; i < before.matched; ++i) {
          ASSERT_TRUE(pending.contains(before.keys[i]))
              << run << ": prefix " << seed << " whose Delete was cut short lost chunk " << i
              << ", which no removal took";
        }
        expected_[seed] = before;
        expected_[seed].matched = *matched;
      } else {
        deleted_[seed] = p;
      }
    }
    uncertain_.clear();
    deleting_.clear();
    // An acknowledged Delete stays deleted: its prefix is not listed, and no more of it is
    // stored than what a prefix still stored shares with it.
    absl::flat_hash_set<ChunkKey> listed;
    for (const PrefixInfo& info : engine.ListPrefixes()) listed.insert(info.id);
    for (const auto& [seed, p] : deleted_) {
      const auto tokens = crash::TokensOf(spec, p);
      const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
      ASSERT_FALSE(listed.contains(keys.back()))
          << run << ": deleted prefix " << seed << " is listed again";
      const uint64_t shared = SharedWithOthers(keys);
      auto matched = engine.Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      ASSERT_LE(*matched, shared) << run << ": deleted prefix " << seed << " is back (" << *matched
                                  << " of its " << p.chunks << " chunks stored)";
      ++deletes_checked_;
    }
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
    for (const crash::Known& k : Known())
      out << crash::Format("known", k.prefix, k.matched) << "\n";
  }

  int acks() const { return acks_; }
  int sessions() const { return sessions_; }
  int gcs() const { return gcs_; }
  int loads_checked() const { return loads_checked_; }
  int deletes_checked() const { return deletes_checked_; }
  int removals() const { return removals_; }
  uint64_t chunks_removed() const { return chunks_removed_; }
  size_t stored() const { return expected_.size(); }

 private:
  struct Entry {
    crash::Prefix prefix;
    std::vector<ChunkKey> keys;   // its chunk keys
    uint64_t matched = 0;         // leading chunks known to be stored (a lower bound)
    uint64_t loads = 0;           // F summed over its chunks after the last acknowledged session
    uint64_t loads_unsynced = 0;  // the same, not yet followed by a synced commit (power loss)
  };
  static Entry MakeEntry(const crash::Prefix& p) {
    const ModelSpec spec = crash::Spec();
    return Entry{p, ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, crash::TokensOf(spec, p)),
                 p.chunks, 0, 0};
  }
  // The most leading chunks of `keys` that an expected prefix holds too.
  uint64_t SharedWithOthers(const std::vector<ChunkKey>& keys) const {
    uint64_t shared = 0;
    for (const auto& [other, e] : expected_) {
      uint64_t n = 0;
      while (n < keys.size() && n < e.keys.size() && keys[n] == e.keys[n]) ++n;
      shared = std::max(shared, n);
    }
    return shared;
  }
  void ResetWindows() {
    put_pending_.reset();
    removed_since_putting_.clear();
    removal_pending_.clear();
    in_flight_.clear();
  }

  const uint64_t cap_;
  const bool power_loss_;
  std::map<uint64_t, Entry> expected_;                   // acknowledged and not deleted, by seed
  std::map<uint64_t, crash::Prefix> uncertain_;          // a Delete began but was not acknowledged
  std::map<uint64_t, crash::Prefix> deleted_;            // acknowledged Deletes
  std::map<uint64_t, Entry> deleting_;                   // their entries when the Delete began
  std::optional<crash::Prefix> put_pending_;             // a Put began but was not acknowledged
  absl::flat_hash_set<ChunkKey> removed_since_putting_;  // committed removals since "putting"
  std::vector<ChunkKey> removal_pending_;                // reported "removing", not yet "removed"
  std::string in_flight_;
  int acks_ = 0, sessions_ = 0, gcs_ = 0, loads_checked_ = 0, puts_cut_short_committed_ = 0;
  int deletes_checked_ = 0, removals_ = 0;
  uint64_t chunks_removed_ = 0;
};

// Runs the real kvctl verify (with the generator's check of every record) on a closed store.
void KvctlVerify(const std::string& store) {
  const ::ckv::testing::ProgramRun r =
      ::ckv::testing::RunKvctl("verify " + store + " --synthetic --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("\"ok\":true"), std::string::npos) << r.output;
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
  // Of the kills, the fraction that must land while an operation is in flight (announced, not
  // acknowledged): kills between operations test little.
  double min_in_flight_fraction = 0.3;
};

void RunKillCell(const Cell& cell) {
  TempDir dir;
  std::string store;
  const std::string known_file = dir.Sub("known");
  Ledger ledger(cell.cap, /*power_loss=*/false);
  uint64_t rng = cell.rng_seed;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int killed = 0;
  std::map<std::string, int> killed_in;  // kills that landed inside an operation, by kind
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
    // Every other kill is aimed: it waits for the child to announce its next operation and
    // lands within 2 ms of that, so that kills inside operations do not depend on how long the
    // child spends between them (preparing its next tensors takes longer on a loaded machine).
    // The others land at any moment within 20 ms.
    const bool aimed = k % 2 == 1;
    while (aimed && alive && ledger.in_flight().empty() &&
           std::chrono::steady_clock::now() < deadline) {
      alive = Pump(child, 50, on_line);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    ASSERT_TRUE(alive) << "child exited early in run " << k;
    const auto delay = std::chrono::microseconds(next() % (aimed ? 2000 : 20000));
    const auto kill_at = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < kill_at) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          kill_at - std::chrono::steady_clock::now());
      Pump(child, static_cast<int>(std::max<int64_t>(0, left.count())), on_line);
    }
    ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child.pid, &status, 0), child.pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "child ended on its own in run " << k << " status " << status;
    ++killed;
    // Lines written before the kill are acknowledged.
    while (Pump(child, 0, on_line)) {
    }
    ::close(child.out);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    if (!ledger.in_flight().empty()) ++killed_in[ledger.in_flight()];

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
  int in_flight = 0;
  for (const auto& [kind, n] : killed_in) in_flight += n;
  EXPECT_EQ(killed, cell.kills);
  EXPECT_GT(ledger.acks(), cell.kills / 2);
  // The kills must land inside operations, not only between them.
  EXPECT_GE(in_flight, static_cast<int>(cell.min_in_flight_fraction * cell.kills))
      << "of " << cell.kills << " kills, only " << in_flight << " landed inside an operation";
  EXPECT_GT(killed_in["put"], 0) << "no kill landed inside a Put";
  if (cell.mode == crash::Mode::kMixed) {
    EXPECT_GT(killed_in["delete"] + killed_in["session"], 0)
        << "no kill landed inside a Delete or a session";
  }
  if (cell.cap > 0) {
    EXPECT_GT(ledger.removals(), 0) << "nothing was evicted under the cap";
  }
  std::printf(
      "crash test (%s, cap %llu): %d kills, %d inside an operation (put %d, delete %d, "
      "session %d, gc %d); %d acknowledged operations (%d sessions, %d gc), %d removals "
      "of %llu chunks in the ledger, %d F checks, %d deleted-prefix checks, %.1f s\n",
      cell.mode_name, static_cast<unsigned long long>(cell.cap), killed, in_flight,
      killed_in["put"], killed_in["delete"], killed_in["session"], killed_in["gc"], ledger.acks(),
      ledger.sessions(), ledger.gcs(), ledger.removals(),
      static_cast<unsigned long long>(ledger.chunks_removed()), ledger.loads_checked(),
      ledger.deletes_checked(), seconds);
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
// kept (io/fault_file_system.h), and the store is reopened and checked as after a SIGKILL.
void RunPowerLossCell(uint64_t cap, int crashes, uint64_t rng_seed) {
  TempDir dir;
  std::string store;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem(), rng_seed);
  Ledger ledger(cap, /*power_loss=*/true);
  uint64_t rng = rng_seed;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  absl::Mutex ledger_mu;
  uint64_t reclaim_rounds = 0, inline_evictions = 0;  // of the background reclaimer
  io::FaultInjectingFileSystem::CrashReport total;
  int crashed = 0, steps = 0, in_catalog = 0, in_segments = 0;
  std::map<std::string, int> crashed_in;  // by the operation in flight
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < crashes; ++c) {
    if (c % 20 == 0) {
      store = dir.Sub("store" + std::to_string(c));
      ledger.Clear();
    }
    const std::string run = "simulated crash " + std::to_string(c);
    {
      EngineOptions options;
      const engine::Seams seams{.file_system = &fs};
      options.logger = NullLogger();  // the failures after the crash are expected
      // Segments of 12 chunks: Puts create segment files (and Gc deletes them) often, so that
      // crashes land between a file's creation and its directory's fsync too.
      options.segment_bytes = 12 * ChunkDiskBytes(crash::Spec());
      if (cap > 0) {
        options.max_disk_bytes = cap;
        options.reclaim_margin_bytes = cap / 3;  // most evictions by the background reclaimer
      }
      auto engine = engine::OpenWithSeams(options, store, seams);
      ASSERT_TRUE(engine.ok()) << run << ": " << engine.status();
      // The reclaimer's removal lines come from its own thread.
      crash::Workload workload(**engine, crash::Mode::kMixed, c + 1, cap > 0, ledger.Known(),
                               [&](const std::string& line) {
                                 absl::MutexLock lock(&ledger_mu);
                                 ledger.Consume(line);
                               });
      // A Put is about 25 data operations here (an allocation and a write per band, a sync, the
      // catalog's WAL append and sync).
      // Every eighth crash is drawn among the catalog's operations alone: under a cap the
      // reclaimer's punches make segment operations so many that crashes counted over all of
      // them landed in the catalog 1 to 4 times in 45, and the coverage check below flaked.
      if (c % 8 == 7) {
        fs.ArmCrash(next() % 6, /*catalog_only=*/true);
      } else {
        fs.ArmCrash(next() % 130);
      }
      absl::Status s;
      for (int i = 0; i < 1000 && s.ok(); ++i, ++steps) s = workload.Step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ASSERT_TRUE(fs.crashed()) << run << ": no crash after 1000 operations";
      // The crash surfaces as its own error: Unavailable from a segment operation, the
      // catalog's I/O error (Internal) from a RocksDB one, or, under a cap, the Put that
      // eviction's failed punches could not make room for (ResourceExhausted, the punch's error
      // quoted).
      ASSERT_NE(s.message().find("simulated crash"), absl::string_view::npos) << run << ": " << s;
      const EngineStats before_crash = (*engine)->Stats();
      reclaim_rounds += before_crash.reclaim_rounds;
      inline_evictions += before_crash.inline_evictions;
      ++crashed;
      const std::string point = fs.crash_point();
      (point.rfind("catalog", 0) == 0 ? in_catalog : in_segments)++;
      absl::MutexLock lock(&ledger_mu);
      ++crashed_in[ledger.in_flight()];
    }  // abandoned: the Engine is gone, its I/O done; RocksDB closed, writing nothing
    auto report = fs.ApplyCrash(next());
    ASSERT_TRUE(report.ok()) << report.status();
    total.writes_dropped += report->writes_dropped;
    total.writes_torn += report->writes_torn;
    total.writes_kept += report->writes_kept;
    total.catalog_tails_dropped += report->catalog_tails_dropped;
    total.catalog_tails_torn += report->catalog_tails_torn;
    total.catalog_tails_kept += report->catalog_tails_kept;
    total.entries_undone += report->entries_undone;
    total.entries_kept += report->entries_kept;
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
  // The crashes cut unsynced writes, the catalog's included, not only clean points between
  // operations, and they land in both the segments and the catalog.
  // Always some cut; each kind separately once the cell is large enough for the draws to
  // reach it (the sanitizer builds run 18 crashes, where a kind can miss by chance: a
  // regression of this test seen under ASan, writes_dropped 0 with torn 3).
  EXPECT_GT(total.writes_dropped + total.writes_torn + total.catalog_tails_dropped +
                total.catalog_tails_torn,
            0u);
  if (crashes >= 40) {
    EXPECT_GT(total.writes_dropped, 0u);
    EXPECT_GT(total.writes_torn, 0u);
    EXPECT_GT(total.catalog_tails_dropped + total.catalog_tails_torn, 0u);
  }
  EXPECT_GE(in_catalog, crashes / 20) << "too few crashes landed in the catalog";
  EXPECT_GE(in_segments, crashes / 10) << "too few crashes landed in segment I/O";
  EXPECT_GE(crashed_in["put"], crashes / 5) << "too few crashes landed inside a Put";
  if (cap > 0) {
    // The crashes land while the background reclaimer works too (its own thread, any moment).
    EXPECT_GT(reclaim_rounds, 0u) << "the background reclaimer never ran";
  }
  std::printf(
      "simulated power loss (cap %llu): background reclaimer rounds %llu, Puts that "
      "evicted inline %llu\n",
      static_cast<unsigned long long>(cap), static_cast<unsigned long long>(reclaim_rounds),
      static_cast<unsigned long long>(inline_evictions));
  std::printf(
      "simulated power loss (cap %llu): %d crashes (%d in the catalog, %d in segment "
      "I/O; inside put %d, delete %d, session %d, gc %d), %d operations, %d "
      "acknowledged; unsynced segment writes dropped %llu, torn %llu, kept %llu; catalog "
      "tails dropped %llu, torn %llu, kept %llu; directory entries undone %llu, kept "
      "%llu; %d removals of %llu chunks in the ledger, %d F checks, %d deleted-prefix "
      "checks, %.1f s\n",
      static_cast<unsigned long long>(cap), crashed, in_catalog, in_segments, crashed_in["put"],
      crashed_in["delete"], crashed_in["session"], crashed_in["gc"], steps, ledger.acks(),
      static_cast<unsigned long long>(total.writes_dropped),
      static_cast<unsigned long long>(total.writes_torn),
      static_cast<unsigned long long>(total.writes_kept),
      static_cast<unsigned long long>(total.catalog_tails_dropped),
      static_cast<unsigned long long>(total.catalog_tails_torn),
      static_cast<unsigned long long>(total.catalog_tails_kept),
      static_cast<unsigned long long>(total.entries_undone),
      static_cast<unsigned long long>(total.entries_kept), ledger.removals(),
      static_cast<unsigned long long>(ledger.chunks_removed()), ledger.loads_checked(),
      ledger.deletes_checked(), seconds);
}

TEST(CrashTest, SimulatedPowerLossDropsOrTearsUnsyncedWritesAndLosesNothingAcknowledged) {
  RunPowerLossCell(/*cap=*/0, KillsFromEnv(kDefaultPowerLosses), 0x9a11);
}

TEST(CrashTest, SimulatedPowerLossUnderACapKeepsTheCapAndWholePrefixes) {
  RunPowerLossCell(24 * ChunkDiskBytes(crash::Spec()), KillsFromEnv(kDefaultPowerLosses), 0x9a12);
}

// A power loss at each data operation of one background-reclaimer round and of the
// Put that follows it, in turn: inside the round's catalog batch (WAL append, sync), then inside
// the Put that writes over the slots the round freed without punching (its writes, fdatasync
// and catalog batch), until both complete. After each, the round's removal is entirely applied
// or not at all (and applied if its commit was reported), the Put's prefix is whole and
// bit-exact or absent (and whole if the Put returned), every prefix the round did not take is
// whole and bit-exact, the deleted prefix stays deleted, Verify is clean, the slots the round
// kept hold nothing once reopened and the disk is within the cap. The round is run with
// ChunkStore::ReclaimNow on a store whose reclaimer thread has not been woken (no Put since
// Open), so the op count lands the same way each time.
TEST(CrashTest, APowerLossAtEachStepOfAReclaimRoundAndThePutAfterItKeepsTheCapAndWholePrefixes) {
  const ModelSpec spec = crash::Spec();
  const uint64_t chunk = ChunkDiskBytes(spec);
  const uint64_t cap = 24 * chunk;
  const std::vector<crash::Prefix> prefixes = {
      {1, 4, 0}, {2, 4, 0}, {3, 4, 0}, {4, 4, 0}, {5, 4, 0}};
  const crash::Prefix deleted = prefixes[1];  // frees slots 4..7: the round's victims make runs
  const crash::Prefix after = {6, 4, 0};      // the Put after the round, over its slots
  auto put = [&](Engine& engine, const crash::Prefix& p) {
    const auto tokens = crash::TokensOf(spec, p);
    synth::SyntheticKv kv(spec, tokens);
    return engine.Put(spec, tokens, kv.tensors()).status();
  };
  int in_catalog = 0, in_put = 0, applied = 0, steps = 0;
  bool completed = false;
  // Every op, about 20 in all.
  for (uint64_t n = 0; n < 160 && !completed; ++n, ++steps) {
    const std::string run = "crash at op " + std::to_string(n) + " of the round and the Put";
    TempDir dir;
    const std::string store = dir.Sub("store");
    io::FaultInjectingFileSystem fs(io::PosixFileSystem(), 500 + n);
    EngineOptions options;
    const engine::Seams seams{.file_system = &fs};
    options.logger = NullLogger();
    options.max_disk_bytes = cap;
    options.reclaim_margin_bytes = 0;  // filled without the reclaimer
    {
      auto engine = engine::OpenWithSeams(options, store, seams);
      ASSERT_TRUE(engine.ok()) << engine.status();
      for (const crash::Prefix& p : prefixes) ASSERT_TRUE(put(**engine, p).ok());
      ASSERT_TRUE((*engine)->Delete(spec, crash::TokensOf(spec, deleted)).ok());
    }
    // 16 chunks stored; a margin of 14 leaves room for about 9: the round takes about 7.
    options.reclaim_margin_bytes = 14 * chunk;
    // The Put after the round leaves more than half the margin free: the reclaimer thread stays
    // asleep.
    std::vector<ChunkKey> batch;  // the round's
    bool committed = false, put_returned = false;
    int batches = 0;
    {
      auto engine = engine::OpenWithSeams(options, store, seams);
      ASSERT_TRUE(engine.ok()) << engine.status();
      storage::ChunkStore& chunks = engine::HostOf(**engine).store();
      chunks.SetRemovalObserver([&](const storage::ChunkStore::RemovalEvent& e) {
        if (e.phase == storage::ChunkStore::RemovalEvent::Phase::kCommitting) {
          ++batches;
          batch = e.keys;
          committed = false;
        } else {
          committed = true;
        }
      });
      fs.ArmCrash(n);
      const absl::StatusOr<uint64_t> reclaimed = chunks.ReclaimNow();
      chunks.SetRemovalObserver(nullptr);
      const bool in_round = fs.crashed();
      if (!in_round) {
        ASSERT_TRUE(reclaimed.ok()) << run << ": " << reclaimed.status();
        ASSERT_GT(*reclaimed, 0u) << run;
        const uint64_t kept = (*engine)->Stats().free_kept_bytes;
        ASSERT_GE(kept, after.chunks * chunk) << run << ": the round punched";
        const absl::Status s = put(**engine, after);
        put_returned = s.ok();
        if (!fs.crashed()) {
          ASSERT_TRUE(s.ok()) << run << ": " << s;
          ASSERT_EQ((*engine)->Stats().free_kept_bytes, kept - after.chunks * chunk)
              << run << ": the Put did not write over the round's slots";
          completed = true;
        }
      }
      if (fs.crashed()) {
        const std::string point = fs.crash_point();
        if (in_round) {
          ASSERT_EQ(point.rfind("catalog", 0), 0u) << run << ": crashed at " << point;
          ++in_catalog;
        } else {
          ++in_put;
        }
      }
    }
    if (fs.crashed()) {
      ASSERT_TRUE(fs.ApplyCrash(n).ok());
    }
    ASSERT_FALSE(batch.empty()) << run << ": the round chose nothing";
    ASSERT_EQ(batches, 1) << run << ": ReclaimNow ran more than one round";
    EngineOptions reopen;
    reopen.logger = NullLogger();
    auto engine = Engine::Open(reopen, store);
    ASSERT_TRUE(engine.ok()) << run << ": " << engine.status();
    storage::ChunkStore& chunks = engine::HostOf(**engine).store();
    size_t gone = 0;
    for (const ChunkKey& key : batch) {
      gone += chunks.Pin(spec, std::span<const ChunkKey>(&key, 1)).ok() ? 0 : 1;
    }
    ASSERT_TRUE(gone == 0 || gone == batch.size())
        << run << ": the round's batch of " << batch.size() << " is partly applied (" << gone
        << " gone)";
    if (committed) {
      ASSERT_EQ(gone, batch.size()) << run << ": a committed removal came back";
    }
    applied += gone > 0 ? 1 : 0;
    const absl::flat_hash_set<ChunkKey> taken(batch.begin(), batch.end());
    for (const crash::Prefix& p : prefixes) {
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = (*engine)->Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      if (p.seed == deleted.seed) {
        ASSERT_EQ(*matched, 0u) << run << ": the deleted prefix is back";
        continue;
      }
      const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
      uint64_t want = p.chunks;
      if (gone > 0) {
        for (uint64_t i = 0; i < keys.size(); ++i) {
          if (taken.contains(keys[i])) {
            want = i;
            break;
          }
        }
      }
      ASSERT_EQ(*matched, want) << run << ": prefix " << p.seed;
      ASSERT_EQ(CountBadRecords(**engine, spec, tokens, *matched), 0) << run;
    }
    const auto after_tokens = crash::TokensOf(spec, after);
    auto matched = (*engine)->Lookup(spec, after_tokens);
    ASSERT_TRUE(matched.ok());
    ASSERT_TRUE(*matched == 0 || *matched == after.chunks)
        << run << ": the Put after the round is partly stored (" << *matched << " chunks)";
    if (put_returned) {
      ASSERT_EQ(*matched, after.chunks) << run << ": an acknowledged Put is lost";
    }
    ASSERT_EQ(CountBadRecords(**engine, spec, after_tokens, *matched), 0) << run;
    auto report = (*engine)->Verify();
    ASSERT_TRUE(report.ok());
    ASSERT_TRUE(report->ok()) << run << ": " << report->problems.front();
    const EngineStats stats = (*engine)->Stats();
    ASSERT_EQ(stats.disk_bytes_used, stats.chunks * chunk) << run;
    const uint64_t blocks = SegmentBlocksBytes(store);
    ASSERT_LE(blocks, cap) << run;
    ASSERT_LE(blocks, stats.disk_bytes_used + 64 * 1024 + stats.disk_bytes_used / 256)
        << run << ": the round's kept slots were not reclaimed";
  }
  EXPECT_TRUE(completed) << "the round and the Put never completed within 160 operations";
  EXPECT_GT(in_catalog, 0) << "no crash landed in the round's catalog batch";
  EXPECT_GT(in_put, 2) << "crashes did not land in the Put over the round's slots";
  EXPECT_GT(applied, 0);
  std::printf(
      "reclaim round crashes: %d steps, %d in the round's catalog batch, %d in the Put "
      "after it, %d with the removal applied\n",
      steps, in_catalog, in_put, applied);
}

// The deterministic crash seams (io/file_system.h): a power loss exactly between a Put's
// data sync and its catalog commit, and exactly after the commit, each followed by the worst case
// a power loss allows (every unsynced write dropped, every directory entry no fsync made durable
// undone, in the segments' and the catalog's directories alike).
class CrashSeamTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Open(bool faulty) {
    EngineOptions options;
    options.logger = NullLogger();
    const engine::Seams seams{.file_system = faulty ? &fs_ : nullptr};
    auto engine = engine::OpenWithSeams(options, store_, seams);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  static absl::Status Put(Engine& engine, const crash::Prefix& p) {
    const ModelSpec spec = crash::Spec();
    const auto tokens = crash::TokensOf(spec, p);
    synth::SyntheticKv kv(spec, tokens);
    return engine.Put(spec, tokens, kv.tensors()).status();
  }
  // Leading chunks of `p` stored, after checking every one of them bit-exact.
  static uint64_t Stored(Engine& engine, const crash::Prefix& p) {
    const ModelSpec spec = crash::Spec();
    const auto tokens = crash::TokensOf(spec, p);
    auto matched = engine.Lookup(spec, tokens);
    EXPECT_TRUE(matched.ok()) << matched.status();
    if (!matched.ok()) return 0;
    EXPECT_EQ(CountBadRecords(engine, spec, tokens, *matched), 0) << "prefix " << p.seed;
    return *matched;
  }
  // Drops the engine, applies the worst-case power loss, reopens without faults and checks
  // that Verify is clean and no space is held by anything uncommitted.
  std::unique_ptr<Engine> CrashAndReopen(std::unique_ptr<Engine> engine) {
    EXPECT_TRUE(fs_.crashed());
    engine.reset();
    auto report = fs_.ApplyCrash(1, io::FaultInjectingFileSystem::CrashOutcome::kDropAll);
    EXPECT_TRUE(report.ok()) << report.status();
    auto reopened = Open(/*faulty=*/false);
    if (reopened == nullptr) return nullptr;
    auto verify = reopened->Verify();
    EXPECT_TRUE(verify.ok() && verify->ok())
        << (verify.ok() && !verify->ok() ? verify->problems.front().message
                                         : std::string("verify failed"));
    const EngineStats stats = reopened->Stats();
    EXPECT_EQ(stats.disk_bytes_used, stats.chunks * ChunkDiskBytes(crash::Spec()));
    return reopened;
  }

  TempDir dir_;
  const std::string store_ = dir_.Sub("store");
  io::FaultInjectingFileSystem fs_{io::PosixFileSystem(), 7};
};

TEST_F(CrashSeamTest, APowerLossBetweenDataSyncAndCatalogCommitShowsNothingOfThePut) {
  const crash::Prefix a{1, 4, 0}, b{2, 5, 2};
  auto engine = Open(/*faulty=*/true);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Put(*engine, a).ok());
  fs_.ArmCrashAt(io::kSeamPutDataSynced);
  const absl::Status s = Put(*engine, b);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(fs_.crash_point(), io::kSeamPutDataSynced);
  engine = CrashAndReopen(std::move(engine));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(Stored(*engine, a), a.chunks) << "the acknowledged Put before the crash";
  EXPECT_EQ(Stored(*engine, b), 0u) << "synced data, uncommitted: nothing may be visible";
  EXPECT_EQ(engine->ListPrefixes().size(), 1u);
  EXPECT_EQ(engine->Stats().chunks, a.chunks);
}

TEST_F(CrashSeamTest, APowerLossAfterTheCatalogCommitShowsAllOfThePut) {
  // The first Put of a store creates its segment file: its directory entry, as well as the
  // records and the catalog batch, must be durable once the batch is committed.
  const crash::Prefix a{1, 4, 0}, b{2, 5, 2};
  auto engine = Open(/*faulty=*/true);
  ASSERT_NE(engine, nullptr);
  fs_.ArmCrashAt(io::kSeamPutCommitted);
  absl::Status s = Put(*engine, a);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(fs_.crash_point(), io::kSeamPutCommitted);
  engine = CrashAndReopen(std::move(engine));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(Stored(*engine, a), a.chunks) << "committed: everything must be visible";

  // Again in a store whose segment exists, for a Put that shares chunks.
  engine.reset();
  engine = Open(/*faulty=*/true);
  ASSERT_NE(engine, nullptr);
  fs_.ArmCrashAt(io::kSeamPutCommitted);
  s = Put(*engine, b);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  engine = CrashAndReopen(std::move(engine));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(Stored(*engine, a), a.chunks);
  EXPECT_EQ(Stored(*engine, b), b.chunks);
  EXPECT_EQ(engine->ListPrefixes().size(), 2u);
}

TEST_F(CrashSeamTest, AnAcknowledgedDeleteStaysDeletedAfterAPowerLoss) {
  // Put a and b, delete a, then lose power in the next Put before it commits anything: the
  // Delete's catalog batch must have been synced when it returned.
  const crash::Prefix a{1, 4, 2}, b{2, 3, 2}, c{3, 3, 0};
  auto engine = Open(/*faulty=*/true);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Put(*engine, a).ok());
  ASSERT_TRUE(Put(*engine, b).ok());
  fs_.ArmCrashAt(io::kSeamPutDataSynced);
  const ModelSpec spec = crash::Spec();
  ASSERT_TRUE(engine->Delete(spec, crash::TokensOf(spec, a)).ok());
  EXPECT_TRUE(absl::IsUnavailable(Put(*engine, c)));
  engine = CrashAndReopen(std::move(engine));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(Stored(*engine, a), a.shared_chunks) << "the deleted prefix is back";
  EXPECT_EQ(Stored(*engine, b), b.chunks);
  EXPECT_EQ(Stored(*engine, c), 0u);
  EXPECT_EQ(engine->ListPrefixes().size(), 1u);
}

}  // namespace
}  // namespace ckv
