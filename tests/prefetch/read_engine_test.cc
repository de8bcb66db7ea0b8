// SPDX-License-Identifier: Apache-2.0
// Tests of prefetch/read_engine.h, run for both backends of the I/O layer (io_uring and
// the thread fallback): exact bytes, checksums, coalescing, priorities under a backlog, injected
// faults (through io::FaultInjectingFileSystem over either backend), cancellation racing
// completions, bounded queues and waits.
#include "prefetch/read_engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "io/fault_file_system.h"
#include "io/file_system.h"
#include "tests/test_util.h"
#include "xxhash.h"

namespace ckv::prefetch {
namespace {

using ::ckv::testing::TempDir;

constexpr uint32_t kRecord = 16 * 1024;
constexpr absl::Duration kWait = absl::Seconds(20);

// The bytes of record `i`: a seeded pattern that differs in every 8 bytes and every record.
void FillPattern(uint64_t i, std::span<std::byte> out) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
  for (size_t o = 0; o + 8 <= out.size(); o += 8) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    uint64_t v = x + o;
    std::memcpy(out.data() + o, &v, 8);
  }
}

std::vector<std::byte> Pattern(uint64_t i, size_t bytes = kRecord) {
  std::vector<std::byte> v(bytes);
  FillPattern(i, v);
  return v;
}

// A file of `records` records of kRecord bytes, with the pattern above.
struct TestFile {
  TestFile(io::FileSystem* fs, const std::string& path, uint32_t records) : records(records) {
    auto f = fs->Open(path, io::FileSystem::OpenMode::kCreateReadWrite);
    EXPECT_TRUE(f.ok()) << f.status();
    file = std::move(*f);
    io::AlignedBuffer buf(size_t{records} * kRecord);
    for (uint32_t i = 0; i < records; ++i) {
      FillPattern(i, std::span<std::byte>(buf.data() + size_t{i} * kRecord, kRecord));
      checksums.push_back(XXH3_64bits(buf.data() + size_t{i} * kRecord, kRecord));
    }
    EXPECT_TRUE(file->WriteAt(0, buf.span()).ok());
  }
  uint32_t records;
  std::unique_ptr<io::File> file;
  std::vector<uint64_t> checksums;
};

ReadRequest RecordRequest(FileId id, const TestFile& f, uint32_t i,
                          Priority p = Priority::kDemand) {
  ReadRequest r;
  r.file = id;
  r.offset = uint64_t{i} * kRecord;
  r.length = kRecord;
  r.priority = p;
  r.verify_checksum = true;
  r.expected_checksum = f.checksums[i];
  r.name = "record " + std::to_string(i);
  return r;
}

class ReadEngineTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == IoBackend::kUring && !io::UringAvailable()) {
      GTEST_SKIP() << "io_uring unavailable: "
                   << "the threads backend runs the same tests";
    }
  }
  ReadEngineOptions Options() {
    ReadEngineOptions o;
    o.backend = GetParam();
    o.queue_depth = 16;
    o.max_io_bytes = 128 * 1024;
    return o;
  }
  // The fault-injecting file system over the POSIX one of the test's backend: files opened by
  // it, and an engine reading through it (o.file_system), get the hook's faults.
  io::FaultInjectingFileSystem* FaultFs(ReadEngineOptions& o) {
    fault_fs_ = std::make_unique<io::FaultInjectingFileSystem>(io::PosixFileSystem(GetParam()));
    o.file_system = fault_fs_.get();
    return fault_fs_.get();
  }
  std::unique_ptr<ReadEngine> Make(const ReadEngineOptions& o) {
    auto e = ReadEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  TempDir dir_;
  std::unique_ptr<io::FaultInjectingFileSystem> fault_fs_;  // outlives the engines
};

using OpInfo = io::FaultInjectingFileSystem::OpInfo;
using IoFault = io::FaultInjectingFileSystem::OpFault;

// A count of callbacks that a test can wait on: bumped by the engine's threads, waited for on
// the test's (a wait on a condition, not a poll with sleeps).
class Counter {
 public:
  Counter& operator++() {
    absl::MutexLock lock(&mu_);
    ++n_;
    return *this;
  }
  int load() const {
    absl::MutexLock lock(&mu_);
    return n_;
  }
  // Waits (bounded) until the count reaches `target`.
  bool WaitFor(int target, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, target] { return n_ >= target; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  mutable absl::Mutex mu_;
  int n_ = 0;
};

// Waits (bounded) until `counter` reaches `target`.
bool WaitFor(const Counter& counter, int target, absl::Duration timeout = kWait) {
  return counter.WaitFor(target, timeout);
}

TEST_P(ReadEngineTest, EveryCompletionDeliversExactlyTheRequestedBytes) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 512);
  auto engine = Make(Options());
  ASSERT_NE(engine, nullptr);
  EXPECT_STREQ(engine->backend(), GetParam() == IoBackend::kUring ? "io_uring" : "threads");
  if (GetParam() == IoBackend::kUring) {
    EXPECT_TRUE(engine->uses_fixed_buffers());
  }
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok()) << id.status();

  std::mt19937_64 rng(7);
  std::vector<uint32_t> order(f.records);
  for (uint32_t i = 0; i < f.records; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  // Every record twice: once into dest (with a future), once viewed in the callback.
  std::vector<std::vector<std::byte>> dest(f.records, std::vector<std::byte>(kRecord));
  std::vector<std::shared_ptr<ReadFuture>> futures;
  std::atomic<int> viewed_ok{0}, viewed_bad{0};
  Counter done;
  for (uint32_t i : order) {
    ReadRequest a = RecordRequest(*id, f, i, static_cast<Priority>(rng() % 3));
    a.dest = dest[i];
    auto fut = engine->SubmitWithFuture(std::move(a));
    ASSERT_TRUE(fut.ok()) << fut.status();
    futures.push_back(*fut);
    ReadRequest b = RecordRequest(*id, f, i, static_cast<Priority>(rng() % 3));
    b.callback = [&, i](const ReadResult& r) {
      const auto want = Pattern(i);
      if (r.status.ok() && r.data.size() == kRecord &&
          std::memcmp(r.data.data(), want.data(), kRecord) == 0) {
        ++viewed_ok;
      } else {
        ++viewed_bad;
      }
      ++done;
    };
    ASSERT_TRUE(engine->Submit(std::move(b)).ok());
  }
  for (auto& fut : futures) CKV_EXPECT_OK(fut->Wait(kWait));
  ASSERT_TRUE(WaitFor(done, static_cast<int>(f.records)));
  EXPECT_EQ(viewed_ok.load(), static_cast<int>(f.records));
  EXPECT_EQ(viewed_bad.load(), 0);
  for (uint32_t i = 0; i < f.records; ++i) EXPECT_EQ(dest[i], Pattern(i)) << "record " << i;

  const ReadEngineStats s = engine->stats();
  EXPECT_EQ(s.requests_ok, 2u * f.records);
  EXPECT_EQ(s.requests_failed, 0u);
  EXPECT_EQ(s.bytes_read, s.bytes_requested);
  EXPECT_DOUBLE_EQ(s.read_amplification(), 1.0);
  EXPECT_GE(s.ios_issued, 1u);
  uint64_t sampled = 0;
  for (uint64_t c : s.queue_depth_histogram) sampled += c;
  EXPECT_EQ(sampled + s.requests_coalesced, 2u * f.records);
  // Reads were in flight for some of the time, never longer than the engine has run.
  EXPECT_GT(s.busy_seconds, 0.0);
  EXPECT_LE(s.busy_seconds, s.elapsed_seconds);
}

TEST_P(ReadEngineTest, CoalescesAdjacentRecordsAndVerifiesEachChecksum) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 64);
  ReadEngineOptions o = Options();
  o.start_paused = true;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  // Records 8..15 submitted out of order; record 11's expected checksum is wrong.
  absl::Mutex mu;
  std::map<uint32_t, ReadResult> results;
  Counter done;
  for (uint32_t i : {12u, 8u, 9u, 15u, 10u, 11u, 14u, 13u}) {
    ReadRequest r = RecordRequest(*id, f, i);
    if (i == 11) r.expected_checksum ^= 1;
    r.callback = [&, i](const ReadResult& res) {
      ReadResult copy = res;
      if (res.status.ok()) {
        copy.data = {};
        EXPECT_EQ(std::memcmp(res.data.data(), Pattern(i).data(), kRecord), 0) << i;
      }
      absl::MutexLock lock(&mu);
      results[i] = copy;
      ++done;
    };
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
  engine->Resume();
  ASSERT_TRUE(WaitFor(done, 8));
  // 8 records of 16 KiB = 128 KiB = max_io_bytes: one read.
  for (auto& [i, r] : results) {
    EXPECT_EQ(r.coalesced, 8u) << i;
    EXPECT_EQ(r.issue_seq, results[8].issue_seq) << i;
    if (i == 11) {
      EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
      EXPECT_NE(r.status.message().find("record 11"), absl::string_view::npos) << r.status;
      EXPECT_NE(r.status.message().find("checksum"), absl::string_view::npos) << r.status;
    } else {
      CKV_EXPECT_OK(r.status);
    }
  }
  const ReadEngineStats s = engine->stats();
  EXPECT_EQ(s.requests_coalesced, 7u);
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.requests_failed, 1u);
  EXPECT_EQ(s.bytes_requested, 8u * kRecord);
  EXPECT_GT(s.idle_with_pending_seconds, 0.0);  // paused with work queued
  // Paused time with nothing in flight is not busy time.
  EXPECT_LE(s.busy_seconds + s.idle_with_pending_seconds, s.elapsed_seconds + 1e-9);
}

TEST_P(ReadEngineTest, CoalescingStopsAtMaxIoBytes) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 64);
  ReadEngineOptions o = Options();
  o.start_paused = true;
  o.max_io_bytes = 64 * 1024;  // 4 records
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  std::vector<std::shared_ptr<ReadFuture>> futures;
  std::vector<std::vector<std::byte>> dest(10, std::vector<std::byte>(kRecord));
  for (uint32_t i = 0; i < 10; ++i) {
    ReadRequest r = RecordRequest(*id, f, 20 + i, Priority::kIntraPeriod);
    r.dest = dest[i];
    futures.push_back(*engine->SubmitWithFuture(std::move(r)));
  }
  engine->Resume();
  for (auto& fut : futures) CKV_EXPECT_OK(fut->Wait(kWait));
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(dest[i], Pattern(20 + i));
  const ReadEngineStats s = engine->stats();
  EXPECT_EQ(s.requests_coalesced, 10u - 3u);  // reads of 4, 4 and 2 records
}

// Holds every read of `fs` at issue until `release` is notified: `reading` is notified at the
// first, and `issued` counts them. Tests step through what is in flight with no latency race.
struct HeldAtIssue {
  explicit HeldAtIssue(io::FaultInjectingFileSystem* fs) {
    fs->SetOpHook([this](const OpInfo&) {
      issued.fetch_add(1);
      if (!reading.HasBeenNotified()) reading.Notify();
      release.WaitForNotification();
      return IoFault{};
    });
  }
  absl::Notification reading, release;
  std::atomic<int> issued{0};
};

TEST_P(ReadEngineTest, DemandIsIssuedBeforeABacklogOfSpeculation) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 128);
  ReadEngineOptions o = Options();
  o.queue_depth = 1;
  o.coalesce = false;
  o.start_paused = true;
  o.max_outstanding_requests = 70;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  absl::Mutex mu;
  std::map<uint32_t, uint64_t> seq;  // record -> issue_seq
  Counter done;
  auto submit = [&](uint32_t i, Priority p) {
    ReadRequest r = RecordRequest(*id, f, i, p);
    r.callback = [&, i](const ReadResult& res) {
      EXPECT_TRUE(res.status.ok()) << res.status;
      absl::MutexLock lock(&mu);
      seq[i] = res.issue_seq;
      ++done;
    };
    return engine->Submit(std::move(r));
  };
  for (uint32_t i = 0; i < 50; ++i) ASSERT_TRUE(submit(i, Priority::kSpeculative).ok());
  for (uint32_t i = 50; i < 60; ++i) ASSERT_TRUE(submit(i, Priority::kIntraPeriod).ok());
  for (uint32_t i = 60; i < 70; ++i) ASSERT_TRUE(submit(i, Priority::kDemand).ok());
  // The queue is full: the 71st request is refused.
  auto refused = submit(70, Priority::kDemand);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  engine->Resume();
  ASSERT_TRUE(WaitFor(done, 70));
  absl::MutexLock lock(&mu);
  for (uint32_t i = 60; i < 70; ++i) EXPECT_LE(seq[i], 10u) << "demand " << i;
  for (uint32_t i = 50; i < 60; ++i) EXPECT_TRUE(seq[i] > 10 && seq[i] <= 20) << "intra " << i;
  for (uint32_t i = 0; i < 50; ++i) EXPECT_GT(seq[i], 20u) << "speculative " << i;
  // FIFO within a priority.
  for (uint32_t i = 1; i < 50; ++i) EXPECT_LT(seq[i - 1], seq[i]);
}

// The time-weighted stats are measured on the engine's clock: on a FakeClock, exactly the time
// the test steps, however long the reads really take.
TEST_P(ReadEngineTest, StatsAreTimedOnTheEnginesClock) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 4);
  FakeClock clock;
  ReadEngineOptions o = Options();
  o.clock = &clock;
  o.start_paused = true;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok()) << id.status();
  auto future = engine->SubmitWithFuture(RecordRequest(*id, f, 2));
  ASSERT_TRUE(future.ok()) << future.status();
  clock.Advance(absl::Seconds(2));  // paused, with a request pending
  ReadEngineStats s = engine->stats();
  EXPECT_DOUBLE_EQ(s.elapsed_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.idle_with_pending_seconds, 2.0);
  EXPECT_EQ(s.busy_seconds, 0.0);
  engine->Resume();
  CKV_ASSERT_OK((*future)->Wait(kWait));
  s = engine->stats();
  EXPECT_EQ(s.requests_ok, 1u);
  EXPECT_DOUBLE_EQ(s.elapsed_seconds, 2.0);  // the read took no fake time
  EXPECT_DOUBLE_EQ(s.idle_with_pending_seconds, 2.0);
  EXPECT_EQ(s.busy_seconds, 0.0);
  clock.Advance(absl::Seconds(1));
  EXPECT_DOUBLE_EQ(engine->stats().elapsed_seconds, 3.0);
}

// A queue depth of 1 (one read in flight, the smallest ring: one entry besides the wake-up poll)
// still reads everything, fed by submissions from another thread.
TEST_P(ReadEngineTest, QueueDepthOneReadsEverything) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 64);
  ReadEngineOptions o = Options();
  o.queue_depth = 1;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok()) << id.status();
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<ReadFuture>> futures;
    for (uint32_t i = 0; i < f.records; ++i) {
      futures.push_back(*engine->SubmitWithFuture(RecordRequest(*id, f, i)));
      if (i % 7 == 0) absl::SleepFor(absl::Microseconds(200));  // let the thread go to sleep
    }
    for (auto& fut : futures) CKV_ASSERT_OK(fut->Wait(kWait));
  }
  EXPECT_EQ(engine->stats().requests_ok, 3u * f.records);
}

TEST_P(ReadEngineTest, DemandOvertakesRunningSpeculation) {
  // Not paused: speculation is already being read when demand arrives. Deterministic: the fault
  // hook holds every read at issue until the demand is queued (explicit steps, no latency race),
  // so the reads issued before it are at most the queue depth.
  ReadEngineOptions o = Options();
  io::FaultInjectingFileSystem* fs = FaultFs(o);
  TestFile f(fs, dir_.Sub("data"), 128);
  o.queue_depth = 2;
  o.coalesce = false;
  HeldAtIssue held(fs);
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  std::vector<std::shared_ptr<ReadFuture>> spec;
  std::atomic<uint64_t> max_demand_seq{0};
  Counter done;
  for (uint32_t i = 0; i < 60; ++i)
    spec.push_back(*engine->SubmitWithFuture(RecordRequest(*id, f, i, Priority::kSpeculative)));
  // Speculation is running: its first read is issued (and held).
  ASSERT_TRUE(held.reading.WaitForNotificationWithTimeout(kWait));
  for (uint32_t i = 60; i < 65; ++i) {
    ReadRequest r = RecordRequest(*id, f, i, Priority::kDemand);
    r.callback = [&](const ReadResult& res) {
      EXPECT_TRUE(res.status.ok()) << res.status;
      uint64_t prev = max_demand_seq.load();
      while (prev < res.issue_seq && !max_demand_seq.compare_exchange_weak(prev, res.issue_seq)) {
      }
      ++done;
    };
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
  held.release.Notify();
  ASSERT_TRUE(WaitFor(done, 5));
  for (auto& fut : spec) CKV_EXPECT_OK(fut->Wait(kWait));
  // Issued right after the reads already in flight, before the speculation queued ahead.
  EXPECT_LE(max_demand_seq.load(), o.queue_depth + 5u);
}

// PauseAndDrain returns only once the reads already issued have landed, and issues nothing
// more until Resume. The fault hook holds each read at issue, so the reads in flight when it is
// called are known, and it cannot return before they are released.
TEST_P(ReadEngineTest, PauseAndDrainWaitsForTheReadsInFlightAndIssuesNoMore) {
  ReadEngineOptions o = Options();
  io::FaultInjectingFileSystem* fs = FaultFs(o);
  TestFile f(fs, dir_.Sub("data"), 32);
  o.queue_depth = 2;
  o.coalesce = false;
  HeldAtIssue held(fs);
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok()) << id.status();
  Counter done;
  for (uint32_t i = 0; i < f.records; ++i) {
    ReadRequest r = RecordRequest(*id, f, i);
    r.callback = [&](const ReadResult& res) {
      EXPECT_TRUE(res.status.ok()) << res.status;
      ++done;
    };
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
  ASSERT_TRUE(held.reading.WaitForNotificationWithTimeout(kWait));
  absl::Notification drained;
  std::thread drainer([&] {
    engine->PauseAndDrain();
    drained.Notify();
  });
  // Held at issue: the drain cannot have returned.
  EXPECT_FALSE(drained.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(done.load(), 0);
  held.release.Notify();
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(kWait));
  drainer.join();
  // Every read issued before the pause has called back; none was issued after it.
  const int landed = done.load();
  EXPECT_GT(landed, 0);
  EXPECT_LT(landed, static_cast<int>(f.records));
  EXPECT_EQ(held.issued.load(), landed);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(held.issued.load(), landed) << "a read was issued while paused";
  engine->Resume();
  ASSERT_TRUE(WaitFor(done, static_cast<int>(f.records)));
  EXPECT_EQ(held.issued.load(), static_cast<int>(f.records));
}

TEST_P(ReadEngineTest, InjectedFaultsEndInTheRightStatus) {
  ReadEngineOptions o = Options();
  io::FaultInjectingFileSystem* fs = FaultFs(o);
  TestFile f(fs, dir_.Sub("data"), 256);
  o.coalesce = false;  // one request per device read, so each fault maps to one request
  absl::Mutex mu;
  std::mt19937_64 rng(1234);
  std::map<uint32_t, std::string> fatal;  // record -> "eio" | "eof"
  int eintr = 0, partial = 0;
  fs->SetOpHook([&](const OpInfo& op) {
    const uint64_t offset = op.offset;
    const size_t length = op.length;
    absl::MutexLock lock(&mu);
    const uint32_t record = static_cast<uint32_t>(offset / kRecord);
    const uint64_t dice = rng() % 100;
    IoFault fault;
    if (dice < 10) {
      fault.error = EIO;
      fatal[record] = "eio";
    } else if (dice < 15) {
      fault.transfer_limit = 0;
      fatal[record] = "eof";
    } else if (dice < 25) {
      fault.error = EINTR;
      ++eintr;
    } else if (dice < 45 && length > 4096) {
      fault.transfer_limit = 4096 * static_cast<int64_t>(1 + rng() % (length / 4096 - 1));
      ++partial;
    } else if (dice < 50) {
      fault.latency_us = 300;
    }
    return fault;
  });
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  std::vector<std::vector<std::byte>> dest(f.records, std::vector<std::byte>(kRecord));
  std::vector<std::shared_ptr<ReadFuture>> futures;
  for (uint32_t i = 0; i < f.records; ++i) {
    ReadRequest r = RecordRequest(*id, f, i);
    r.dest = dest[i];
    futures.push_back(*engine->SubmitWithFuture(std::move(r)));
  }
  int ok = 0;
  for (uint32_t i = 0; i < f.records; ++i) {
    const absl::Status s = futures[i]->Wait(kWait);
    ASSERT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << "record " << i << " hangs";
    absl::MutexLock lock(&mu);
    auto it = fatal.find(i);
    if (it == fatal.end()) {
      EXPECT_TRUE(s.ok()) << i << ": " << s;
      EXPECT_EQ(dest[i], Pattern(i)) << "record " << i;
      ++ok;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << i << ": " << s;
      EXPECT_NE(s.message().find("record " + std::to_string(i)), absl::string_view::npos) << s;
      const char* want = it->second == "eio" ? "Input/output error" : "short read";
      EXPECT_NE(s.message().find(want), absl::string_view::npos) << s;
    }
  }
  absl::MutexLock lock(&mu);
  EXPECT_GT(eintr, 0);
  EXPECT_GT(partial, 0);
  EXPECT_GT(ok, 100);
  EXPECT_GT(fatal.size(), 10u);
  const ReadEngineStats s = engine->stats();
  EXPECT_EQ(s.requests_failed, fatal.size());
  EXPECT_EQ(s.requests_ok, static_cast<uint64_t>(ok));
}

TEST_P(ReadEngineTest, CancelsRaceCompletionsWithoutTouchingFreedBuffers) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 256);
  ReadEngineOptions o = Options();
  o.max_outstanding_requests = 256;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  // Each request copies into a heap buffer that is freed as soon as the request is over: at
  // its callback, or right after a successful Cancel. A write after Cancel would hit freed
  // memory (ASAN reports it; without ASAN the pattern check below catches most).
  std::atomic<int> completed{0}, cancelled{0}, bad{0};
  Counter calls;
  std::mt19937_64 rng(99);
  int submitted = 0;
  for (int round = 0; round < 40; ++round) {
    std::vector<std::pair<RequestId, std::byte*>> ids;
    for (int k = 0; k < 100; ++k) {
      const uint32_t i = static_cast<uint32_t>(rng() % f.records);
      auto* buf = new std::byte[kRecord];
      ReadRequest r = RecordRequest(*id, f, i, static_cast<Priority>(rng() % 3));
      r.dest = std::span<std::byte>(buf, kRecord);
      r.callback = [&, i, buf](const ReadResult& res) {
        if (res.status.ok()) {
          if (std::memcmp(buf, Pattern(i).data(), kRecord) != 0) ++bad;
          ++completed;
          delete[] buf;
        } else if (res.status.code() == absl::StatusCode::kCancelled) {
          ++cancelled;  // the canceller frees buf
        } else {
          ++bad;
          delete[] buf;
        }
        ++calls;  // last: the test waits on it
      };
      auto rid = engine->Submit(std::move(r));
      if (!rid.ok()) {  // full: the callback will not run
        EXPECT_EQ(rid.status().code(), absl::StatusCode::kResourceExhausted);
        delete[] buf;
        continue;
      }
      ++submitted;
      ids.emplace_back(*rid, buf);
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(ids.size() / 2);  // cancel half, in random order, while the rest are read
    for (auto& [rid, buf] : ids) {
      const absl::Status s = engine->Cancel(rid);
      if (s.ok()) {
        std::memset(buf, 0xEE, kRecord);  // would corrupt a read still landing here
        delete[] buf;
      } else {
        EXPECT_TRUE(s.code() == absl::StatusCode::kFailedPrecondition ||
                    s.code() == absl::StatusCode::kNotFound)
            << s;
      }
    }
  }
  ASSERT_TRUE(WaitFor(calls, submitted));
  EXPECT_EQ(completed.load() + cancelled.load(), submitted);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(cancelled.load(), 0);
  EXPECT_GT(completed.load(), 0);
  const ReadEngineStats s = engine->stats();
  EXPECT_EQ(s.requests_cancelled, static_cast<uint64_t>(cancelled.load()));
}

TEST_P(ReadEngineTest, DestroyingWithReadsInFlightCompletesOrCancelsEach) {
  ReadEngineOptions o = Options();
  io::FaultInjectingFileSystem* fs = FaultFs(o);
  TestFile f(fs, dir_.Sub("data"), 256);
  std::atomic<int> calls{0}, ok{0}, cancelled{0};
  {
    fs->SetOpHook([](const OpInfo&) { return IoFault{.latency_us = 100}; });
    auto engine = Make(o);
    ASSERT_NE(engine, nullptr);
    auto id = engine->RegisterFile(f.file.get());
    ASSERT_TRUE(id.ok());
    for (uint32_t i = 0; i < 256; ++i) {
      ReadRequest r = RecordRequest(*id, f, i, Priority::kSpeculative);
      r.callback = [&](const ReadResult& res) {
        ++calls;
        if (res.status.ok()) ++ok;
        if (res.status.code() == absl::StatusCode::kCancelled) ++cancelled;
      };
      ASSERT_TRUE(engine->Submit(std::move(r)).ok());
    }
  }
  EXPECT_EQ(calls.load(), 256);
  EXPECT_EQ(ok.load() + cancelled.load(), 256);
}

// A queue that fails as a whole (its submission or reap, not one op) fails the reads it held and
// everything queued with its error, the engine refuses later reads with it, and shutdown neither
// hangs nor frees the buffers the kernel may still hold.
TEST_P(ReadEngineTest, ABrokenIoQueueFailsEveryReadAndEveryLaterSubmissionWithItsError) {
  ReadEngineOptions o = Options();
  io::FaultInjectingFileSystem* fs = FaultFs(o);
  // The read the broken queue holds stays in the queue it wraps, which is healthy: on the thread
  // backend a worker may still read the file after the test. The file and the file system stay
  // alive to the end of the process (reachable: no leak is reported), as the engine keeps the
  // broken queue and its buffers.
  static auto* kept_files = new std::vector<std::unique_ptr<TestFile>>;
  static auto* kept_fs = new std::vector<std::unique_ptr<io::FaultInjectingFileSystem>>;
  kept_files->push_back(std::make_unique<TestFile>(fs, dir_.Sub("data"), 64));
  const TestFile& f = *kept_files->back();
  kept_fs->push_back(std::move(fault_fs_));
  o.queue_depth = 2;
  o.coalesce = false;
  // The first read issued breaks every queue: it goes into the queue and is never reaped.
  std::atomic<int> issued{0};
  fs->SetOpHook([&](const OpInfo&) {
    if (issued.fetch_add(1) == 0) fs->BreakIoQueues(absl::InternalError("ring gone (test)"));
    return IoFault{};
  });
  Counter called;
  std::atomic<int> failed{0}, refused{0};
  {
    auto engine = Make(o);
    ASSERT_NE(engine, nullptr);
    auto id = engine->RegisterFile(f.file.get());
    ASSERT_TRUE(id.ok()) << id.status();
    for (uint32_t i = 0; i < f.records; ++i) {
      ReadRequest r = RecordRequest(*id, f, i);
      r.callback = [&, i](const ReadResult& res) {
        if (res.status.code() == absl::StatusCode::kInternal &&
            absl::StrContains(res.status.message(), "I/O queue") &&
            absl::StrContains(res.status.message(), "ring gone (test)")) {
          ++failed;
        } else {
          ADD_FAILURE() << "record " << i << ": " << res.status;
        }
        ++called;
      };
      // Submissions after the break are refused with its error instead of being queued.
      const absl::Status s = engine->Submit(std::move(r)).status();
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
        EXPECT_TRUE(absl::StrContains(s.message(), "ring gone (test)")) << s;
        ++refused;
      }
    }
    ASSERT_TRUE(WaitFor(called, static_cast<int>(f.records) - refused.load()));
    const absl::Status later = engine->Submit(RecordRequest(*id, f, 0)).status();
    EXPECT_EQ(later.code(), absl::StatusCode::kInternal) << later;
    EXPECT_TRUE(absl::StrContains(later.message(), "ring gone (test)")) << later;
  }  // the engine shuts down: it must not wait for the read the broken queue holds
  EXPECT_EQ(failed.load() + refused.load(), static_cast<int>(f.records));
  EXPECT_EQ(called.load(), failed.load());
  EXPECT_GE(issued.load(), 1);
}

TEST_P(ReadEngineTest, WaitsAreBoundedAndRequestsAreValidated) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 8);
  ReadEngineOptions o = Options();
  o.start_paused = true;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  auto fut = engine->SubmitWithFuture(RecordRequest(*id, f, 3));
  ASSERT_TRUE(fut.ok());
  EXPECT_EQ((*fut)->Wait(absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  engine->Resume();
  CKV_EXPECT_OK((*fut)->Wait(kWait));
  // Completed: NotFound, or FailedPrecondition while its read's slot is being released.
  const absl::StatusCode late = engine->Cancel((*fut)->id()).code();
  EXPECT_TRUE(late == absl::StatusCode::kNotFound || late == absl::StatusCode::kFailedPrecondition);

  ReadRequest misaligned = RecordRequest(*id, f, 1);
  misaligned.offset += 100;
  EXPECT_EQ(engine->Submit(misaligned).status().code(), absl::StatusCode::kInvalidArgument);
  ReadRequest too_long = RecordRequest(*id, f, 1);
  too_long.length = o.max_io_bytes + 4096;
  EXPECT_EQ(engine->Submit(too_long).status().code(), absl::StatusCode::kInvalidArgument);
  ReadRequest unknown = RecordRequest(*id, f, 1);
  unknown.file = 77;
  EXPECT_EQ(engine->Submit(unknown).status().code(), absl::StatusCode::kInvalidArgument);

  // Past the end of the file: DataLoss "short read".
  ReadRequest past = RecordRequest(*id, f, 0);
  past.offset = uint64_t{f.records} * kRecord;
  past.verify_checksum = false;
  auto pf = engine->SubmitWithFuture(past);
  ASSERT_TRUE(pf.ok());
  const absl::Status s = (*pf)->Wait(kWait);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("short read"), absl::string_view::npos) << s;
  CKV_EXPECT_OK(engine->UnregisterFile(*id));
  EXPECT_EQ(engine->Submit(RecordRequest(*id, f, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ReadEngineTest, SeveralIoThreadsDeliverEverything) {
  TestFile f(io::PosixFileSystem(), dir_.Sub("data"), 256);
  ReadEngineOptions o = Options();
  o.io_threads = 3;
  o.queue_depth = 4;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  auto id = engine->RegisterFile(f.file.get());
  ASSERT_TRUE(id.ok());
  std::vector<std::vector<std::byte>> dest(f.records, std::vector<std::byte>(kRecord));
  std::vector<std::shared_ptr<ReadFuture>> futures;
  for (uint32_t i = 0; i < f.records; i += 2) {  // every other record: nothing coalesces
    ReadRequest r = RecordRequest(*id, f, i);
    r.dest = dest[i];
    futures.push_back(*engine->SubmitWithFuture(std::move(r)));
  }
  for (auto& fut : futures) CKV_EXPECT_OK(fut->Wait(kWait));
  for (uint32_t i = 0; i < f.records; i += 2) EXPECT_EQ(dest[i], Pattern(i)) << i;
  EXPECT_EQ(engine->stats().requests_coalesced, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, ReadEngineTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kThreads),
                         [](const ::testing::TestParamInfo<IoBackend>& info) {
                           return std::string(info.param == IoBackend::kUring ? "Uring"
                                                                              : "Threads");
                         });

// The fault file system's rules under each backend: its queue wraps the backend's queue, so
// the faults reach io_uring reads as well as the thread fallback's, and are counted there.
TEST(ReadEngineFaultFsTest, EioAndShortReadsFromTheFaultFileSystem) {
  for (IoBackend backend : {IoBackend::kThreads, IoBackend::kUring}) {
    if (backend == IoBackend::kUring && !io::UringAvailable()) continue;
    SCOPED_TRACE(IoBackendName(backend));
    TempDir dir;
    io::FaultInjectingFileSystem fs(io::PosixFileSystem(backend), /*seed=*/5);
    TestFile f(&fs, dir.Sub("seg-1"), 256);
    fs.AddRule({.path_substring = "seg-", .read_eio = 0.1, .short_read = 0.1});
    fs.ResetCounters();
    ReadEngineOptions o;
    o.file_system = &fs;
    o.queue_depth = 8;
    o.coalesce = false;
    auto engine = ReadEngine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_STREQ((*engine)->backend(), IoBackendName(backend));
    auto id = (*engine)->RegisterFile(f.file.get());
    ASSERT_TRUE(id.ok()) << id.status();
    std::vector<std::vector<std::byte>> dest(f.records, std::vector<std::byte>(kRecord));
    std::vector<std::shared_ptr<ReadFuture>> futures;
    for (uint32_t i = 0; i < f.records; ++i) {
      ReadRequest r = RecordRequest(*id, f, i);
      r.dest = dest[i];
      futures.push_back(*(*engine)->SubmitWithFuture(std::move(r)));
    }
    uint64_t failed = 0;
    for (uint32_t i = 0; i < f.records; ++i) {
      const absl::Status s = futures[i]->Wait(kWait);
      if (s.ok()) {
        EXPECT_EQ(dest[i], Pattern(i)) << i;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        EXPECT_NE(s.message().find("(injected)"), absl::string_view::npos) << s;
        EXPECT_NE(s.message().find("record " + std::to_string(i)), absl::string_view::npos) << s;
        ++failed;
      }
    }
    EXPECT_GT(failed, 0u);
    EXPECT_EQ(failed,
              fs.injected(io::FaultKind::kReadEio) + fs.injected(io::FaultKind::kShortRead));
    // Every fault went through the queue of this backend.
    EXPECT_EQ(fs.queue_faults(IoBackendName(backend)).reads, failed);
  }
}

// kAuto takes io_uring where the kernel allows it, else threads (with one log line).
TEST(ReadEngineAutoTest, AutoPicksUringWhenAvailable) {
  ReadEngineOptions o;
  o.queue_depth = 2;
  auto engine = ReadEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_STREQ((*engine)->backend(), io::UringAvailable() ? "io_uring" : "threads");
  o.queue_depth = 0;
  EXPECT_EQ(ReadEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A file must come from the engine's file system: the POSIX one's io_uring queue refuses a
// wrapped file it has no descriptor for.
TEST(ReadEngineFaultFsTest, UringBackendRefusesFilesOfAnotherFileSystem) {
  if (!io::UringAvailable()) GTEST_SKIP() << "io_uring unavailable";
  TempDir dir;
  io::FaultInjectingFileSystem fs(io::PosixFileSystem(), 1);
  TestFile f(&fs, dir.Sub("seg-1"), 2);
  ReadEngineOptions o;
  o.backend = IoBackend::kUring;
  o.queue_depth = 4;
  auto engine = ReadEngine::Create(o);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->RegisterFile(f.file.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckv::prefetch
