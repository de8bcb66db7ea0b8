// SPDX-License-Identifier: Apache-2.0
// StderrLogger and NullLogger (see include/ckv/log.h).
#include "ckv/log.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ckv {
namespace {

// The installed Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which std::string_view does not convert to implicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string_view LevelPrefix(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "ckv: info: ";
    case LogLevel::kWarning:
      return "ckv: warning: ";
    case LogLevel::kError:
      return "ckv: error: ";
  }
  return "ckv: ";
}

class StderrLoggerImpl final : public Logger {
 public:
  void Log(LogLevel level, std::string_view message) override {
    // A message may carry strings from outside (host names, error texts sent by a server):
    // escaped, so the terminal shows them rather than obeys them. The whole line is built first and
    // written with one fwrite under a mutex, so lines from concurrent threads never interleave,
    // even with other stdio users of stderr.
    std::string line = absl::StrCat(Sv(LevelPrefix(level)), Printable(message), "\n");
    absl::MutexLock lock(&mu_);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }

 private:
  absl::Mutex mu_;
};

class NullLoggerImpl final : public Logger {
 public:
  void Log(LogLevel /*level*/, std::string_view /*message*/) override {}
};

}  // namespace

Logger* StderrLogger() {
  // Leaked on purpose: loggers may be used from other static destructors and detached threads.
  static Logger* const logger = new StderrLoggerImpl();
  return logger;
}

Logger* NullLogger() {
  static Logger* const logger = new NullLoggerImpl();
  return logger;
}

}  // namespace ckv
