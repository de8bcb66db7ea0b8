// SPDX-License-Identifier: Apache-2.0
#include "tools/kvctl/format.h"

#include <cstdio>
#include <ctime>

namespace ckv::kvctl {

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::string FormatRate(double bytes_per_second) {
  if (!(bytes_per_second > 0)) return "-";
  return FormatBytes(static_cast<uint64_t>(bytes_per_second)) + "/s";
}

std::string FormatDuration(double seconds) {
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", seconds);
  } else {
    const uint64_t s = static_cast<uint64_t>(seconds);
    std::snprintf(buf, sizeof(buf), "%llum%02llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  }
  return buf;
}

std::string FormatLocalTime(int64_t unix_ms) {
  const time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm_local;
  if (localtime_r(&t, &tm_local) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm_local);
  return buf;
}

std::string FormatIsoUtc(int64_t unix_ms) {
  const time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm_utc;
  if (gmtime_r(&t, &tm_utc) == nullptr) return "";
  char buf[40];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm_utc);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(unix_ms % 1000));
  return buf;
}
}  // namespace ckv::kvctl
