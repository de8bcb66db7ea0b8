// Crash test: a child process Puts and Deletes in a loop; the parent kills it with SIGKILL at
// random moments, reopens the store and checks that every acknowledged Put is present and
// bit-exact, that nothing partial is visible, and that no orphaned space remains.
//
// CKV_CRASH_KILLS overrides the number of kills (default 100).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>

#include "ckv/engine.h"
#include "tests/crash_spec.h"
#include "tests/test_util.h"

#ifndef CKV_CRASH_CHILD_PATH
#error "CKV_CRASH_CHILD_PATH must name the ckv_crash_child binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::ChunkDiskBytes;
using ::ckv::testing::CountBadRecords;
using ::ckv::testing::SegmentBlocksBytes;
using ::ckv::testing::TempDir;

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
  std::string pending;
};

Child Spawn(const std::string& store, uint64_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    const std::string seed_str = std::to_string(seed);
    ::execl(CKV_CRASH_CHILD_PATH, CKV_CRASH_CHILD_PATH, store.c_str(), seed_str.c_str(),
            static_cast<char*>(nullptr));
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

TEST(CrashTest, SigkillDuringPutsLosesNothingAcknowledgedAndShowsNothingPartial) {
  int kills = 100;
  if (const char* env = std::getenv("CKV_CRASH_KILLS")) kills = std::atoi(env);
  const ModelSpec spec = crash::Spec();
  const uint64_t chunk_bytes = ChunkDiskBytes(spec);
  TempDir dir;
  std::string store;
  std::map<uint64_t, crash::Prefix> expected;   // acknowledged and not deleted, by seed
  std::map<uint64_t, crash::Prefix> uncertain;  // a Delete began but was not acknowledged
  uint64_t rng = 0x5eed;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int total_acks = 0, killed_mid_run = 0;
  for (int k = 0; k < kills; ++k) {
    if (k % 15 == 0) {
      // A fresh store now and then keeps each run's verification small.
      store = dir.Sub("store" + std::to_string(k));
      expected.clear();
      uncertain.clear();
    }
    Child child = Spawn(store, k + 1);
    // Let it acknowledge a few operations, then kill it at a random moment after that.
    const int acks_wanted = static_cast<int>(next() % 4);
    int acks = 0;
    auto on_line = [&](const std::string& line) {
      std::string verb;
      crash::Prefix p;
      ASSERT_TRUE(crash::Parse(line, &verb, &p)) << line;
      if (verb == "deleting") {
        // Until acknowledged, the Delete may or may not have happened.
        expected.erase(p.seed);
        uncertain[p.seed] = p;
        return;
      }
      if (verb == "put") {
        expected[p.seed] = p;
      } else {
        uncertain.erase(p.seed);
      }
      ++acks;
      ++total_acks;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool alive = true;
    while (alive && acks < acks_wanted && std::chrono::steady_clock::now() < deadline) {
      alive = Pump(child, 50, on_line);
    }
    ASSERT_TRUE(alive) << "child exited early in run " << k;
    ASSERT_GE(acks, acks_wanted) << "child made no progress in run " << k;
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

    auto engine = Engine::Open(EngineOptions{}, store);
    ASSERT_TRUE(engine.ok()) << "run " << k << ": " << engine.status();
    for (const auto& [seed, p] : expected) {
      const auto tokens = crash::TokensOf(spec, p);
      auto matched = (*engine)->Lookup(spec, tokens);
      ASSERT_TRUE(matched.ok());
      ASSERT_EQ(*matched, p.chunks) << "run " << k << ": acknowledged prefix " << seed
                                    << " lost chunks";
      ASSERT_EQ(CountBadRecords(**engine, spec, tokens, p.chunks), 0)
          << "run " << k << ": acknowledged prefix " << seed;
    }
    // A Delete cut short either happened or did not: the prefix is whole or no longer listed.
    for (auto it = uncertain.begin(); it != uncertain.end();) {
      const auto tokens = crash::TokensOf(spec, it->second);
      if (*(*engine)->Lookup(spec, tokens) == it->second.chunks) {
        ASSERT_EQ(CountBadRecords(**engine, spec, tokens, it->second.chunks), 0);
        ++it;  // (the next run's child does not know of it; leave it uncertain)
      } else {
        it = uncertain.erase(it);
      }
    }
    // Whatever is listed (acknowledged or not) is whole.
    for (const PrefixInfo& info : (*engine)->ListPrefixes()) {
      ModelSpec got;
      auto keys = (*engine)->PrefixChunks(info.id, &got);
      ASSERT_TRUE(keys.ok()) << keys.status();
      ASSERT_EQ(keys->size(), info.chunks);
    }
    auto report = (*engine)->Verify();
    ASSERT_TRUE(report.ok());
    ASSERT_TRUE(report->ok()) << "run " << k << ": " << report->problems.front();
    // No space is held by anything uncommitted.
    const EngineStats stats = (*engine)->Stats();
    ASSERT_EQ(stats.disk_bytes_used, stats.chunks * chunk_bytes);
    // (ext4 may add a few blocks of extent tree to a sparse file: allowed up to 64 KiB + 1/256.)
    const uint64_t blocks = SegmentBlocksBytes(store);
    ASSERT_GE(blocks, stats.disk_bytes_used) << "run " << k;
    ASSERT_LE(blocks, stats.disk_bytes_used + 64 * 1024 + stats.disk_bytes_used / 256)
        << "run " << k << ": uncommitted space was not reclaimed";
  }
  EXPECT_EQ(killed_mid_run, kills);
  EXPECT_GT(total_acks, kills);
  std::printf("crash test: %d kills, %d acknowledged operations checked\n", killed_mid_run,
              total_acks);
}

}  // namespace
}  // namespace ckv
