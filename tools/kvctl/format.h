// SPDX-License-Identifier: Apache-2.0
// tools/kvctl/format.h: how kvctl writes numbers, sizes, durations and times for people.
#ifndef CKV_TOOLS_KVCTL_FORMAT_H_
#define CKV_TOOLS_KVCTL_FORMAT_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace ckv::kvctl {

using Clock = std::chrono::steady_clock;

// Seconds from `start` until now.
double SecondsSince(Clock::time_point start);

// "1.5 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);
// "300.0 MiB/s"; "-" for no rate.
std::string FormatRate(double bytes_per_second);
// "6.0s", "2m05s".
std::string FormatDuration(double seconds);
// Local time, "2026-01-20 14:03:11".
std::string FormatLocalTime(int64_t unix_ms);
// UTC, ISO 8601 with milliseconds: "2026-01-20T13:03:11.123Z".
std::string FormatIsoUtc(int64_t unix_ms);

}  // namespace ckv::kvctl

#endif  // CKV_TOOLS_KVCTL_FORMAT_H_
