// SPDX-License-Identifier: Apache-2.0
// ckv/log.h: where ckv's few log lines go.
//
// ckv logs rarely: once when it falls back from io_uring to a thread pool, when it reclaims orphaned
// space on open, when it finds corruption. A serving system can route these lines into its own
// logging by passing a Logger in EngineOptions.
//
// Thread-safety: Log() may be called from any thread; implementations must be thread-safe.
#ifndef CKV_LOG_H_
#define CKV_LOG_H_

#include <string_view>

namespace ckv {

enum class LogLevel { kInfo, kWarning, kError };

class Logger {
 public:
  virtual ~Logger() = default;
  virtual void Log(LogLevel level, std::string_view message) = 0;
};

// Writes "ckv: warning: message" lines to stderr. Never destroyed.
Logger* StderrLogger();
// Drops every line. Never destroyed.
Logger* NullLogger();

}  // namespace ckv

#endif  // CKV_LOG_H_
