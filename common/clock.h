// SPDX-License-Identifier: Apache-2.0
// common/clock.h: the clock seam.
//
// Code under engine/, storage/ and prefetch/ reads time only through a Clock, so that tests can
// step time instead of sleeping (LevelDB's Env::NowMicros and SleepForMicroseconds, TigerBeetle's
// simulated time). RealClock() is the process-wide real one; FakeClock is for tests: its time
// moves only when a test advances it or something sleeps on it.
//
// Thread-safety: every method of both is thread-safe.
#ifndef CKV_COMMON_CLOCK_H_
#define CKV_COMMON_CLOCK_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckv {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time (timestamps written to the catalog, log lines).
  virtual absl::Time Now() = 0;
  // A monotonic reading in nanoseconds, for durations; unrelated to Now().
  virtual int64_t MonotonicNanos() = 0;
  // Blocks the calling thread for `d` (a FakeClock advances itself instead).
  virtual void SleepFor(absl::Duration d) = 0;
};

// The real clock: absl::Now, CLOCK_MONOTONIC and absl::SleepFor. Never destroyed.
Clock* RealClock();

// A clock for tests. Starts at `start` (monotonic reading 0) and moves only by Advance or
// SleepFor, which advances it by the slept duration and returns at once.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  int64_t MonotonicNanos() override {
    absl::MutexLock lock(&mu_);
    return elapsed_ns_;
  }
  void SleepFor(absl::Duration d) override { Advance(d); }

  // Moves the clock forward by `d` (negative durations are ignored: time never goes back).
  void Advance(absl::Duration d) {
    if (d <= absl::ZeroDuration()) return;
    absl::MutexLock lock(&mu_);
    now_ += d;
    elapsed_ns_ += absl::ToInt64Nanoseconds(d);
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int64_t elapsed_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckv

#endif  // CKV_COMMON_CLOCK_H_
