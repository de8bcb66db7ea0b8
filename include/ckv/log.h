// SPDX-License-Identifier: Apache-2.0
// ckv/log.h: where ckv's few log lines go.
//
// ckv logs rarely: once when it falls back from io_uring to a thread pool, when it reclaims
// orphaned space on open, when it finds corruption. A serving system can route these lines into its
// own logging by passing a Logger in EngineOptions.
//
// Thread-safety: Log() may be called from any thread; implementations must be thread-safe.
#ifndef CKV_LOG_H_
#define CKV_LOG_H_

#include <string>
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

// Untrusted bytes made safe to print on a terminal or in a log line. Strings that come from
// outside (a model id from an imported file, a host name or an error text sent by a cluster
// node, a trace's fields) can hold escape sequences a terminal would obey: move the cursor,
// retitle the window, hide what follows. Printable(s) is `s` with every byte that is not part
// of a printable UTF-8 character shown as a C escape (\n, \r, \t, others as \xNN): the C0
// controls, DEL, the C1 controls U+0080..U+009F (which some terminals obey UTF-8 encoded) and
// bytes that are not valid UTF-8 (which an 8-bit terminal may read as C1). Text, UTF-8 and
// backslashes are kept, so that Printable(Printable(s)) == Printable(s): a message escaped once
// may pass through a logger that escapes again. StderrLogger applies it to every message.
std::string Printable(std::string_view s);
// True when Printable(s) == s.
bool IsPrintable(std::string_view s);

}  // namespace ckv

#endif  // CKV_LOG_H_
