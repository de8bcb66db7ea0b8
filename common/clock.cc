// SPDX-License-Identifier: Apache-2.0
// The real clock (see common/clock.h).
#include "common/clock.h"

#include <time.h>

namespace ckv {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  int64_t MonotonicNanos() override {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* RealClock() {
  static Clock* const clock = new RealClockImpl();
  return clock;
}

}  // namespace ckv
