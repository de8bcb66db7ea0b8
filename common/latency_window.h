// SPDX-License-Identifier: Apache-2.0
// common/latency_window.h: percentiles of the latest operation latencies, in bounded memory.
//
// Keeps the last kWindow latencies in a ring and the largest ever recorded; p50 and p99 are over
// the ring (nearest rank), so they describe recent behaviour and the memory stays fixed.
//
// Thread-safety: thread-safe.
#ifndef CKV_COMMON_LATENCY_WINDOW_H_
#define CKV_COMMON_LATENCY_WINDOW_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckv {

class LatencyWindow {
 public:
  static constexpr size_t kWindow = 4096;

  struct Summary {
    uint64_t count = 0;   // latencies recorded in all
    uint64_t window = 0;  // of which p50 and p99 are computed (the latest, at most kWindow)
    uint64_t p50_us = 0;
    uint64_t p99_us = 0;
    uint64_t max_us = 0;  // over all recorded
  };

  void Record(uint64_t latency_us) {
    absl::MutexLock lock(&mu_);
    ring_[count_ % kWindow] = latency_us;
    ++count_;
    max_us_ = std::max(max_us_, latency_us);
  }

  Summary Summarize() const {
    std::vector<uint64_t> v;
    Summary s;
    {
      absl::MutexLock lock(&mu_);
      s.count = count_;
      s.max_us = max_us_;
      v.assign(ring_.begin(),
               ring_.begin() + static_cast<ptrdiff_t>(std::min<uint64_t>(count_, kWindow)));
    }
    s.window = v.size();
    if (v.empty()) return s;
    s.p50_us = Rank(v, 50);
    s.p99_us = Rank(v, 99);
    return s;
  }

 private:
  // Nearest-rank percentile: the smallest value with at least pct% of the values at or below it.
  static uint64_t Rank(std::vector<uint64_t>& v, uint64_t pct) {
    const size_t rank = static_cast<size_t>((pct * v.size() + 99) / 100);  // 1-based, >= 1
    auto nth = v.begin() + static_cast<ptrdiff_t>(rank - 1);
    std::nth_element(v.begin(), nth, v.end());
    return *nth;
  }

  mutable absl::Mutex mu_;
  std::array<uint64_t, kWindow> ring_ ABSL_GUARDED_BY(mu_) = {};
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_us_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckv

#endif  // CKV_COMMON_LATENCY_WINDOW_H_
