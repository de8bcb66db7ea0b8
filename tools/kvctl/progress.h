// SPDX-License-Identifier: Apache-2.0
// tools/kvctl/progress.h: kvctl's progress on stderr, a bar redrawn in place on a terminal and
// plain lines otherwise. KVCTL_PROGRESS=bar|lines|off chooses; unset (or anything else): a bar
// when stderr is a terminal, plain lines when it is not. Results never go here: they go to
// stdout (a table, or JSON with --json).
//
// Thread-safety: each object is used by one thread (ElapsedTicker draws from its own thread).
#ifndef CKV_TOOLS_KVCTL_PROGRESS_H_
#define CKV_TOOLS_KVCTL_PROGRESS_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ckv/engine.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {

enum class ProgressMode { kBar, kLines, kOff };

// KVCTL_PROGRESS, read once.
ProgressMode GetProgressMode();

// Percentage, bytes, rate and ETA: a bar redrawn at most 10 times a second, or a line every 5
// seconds and a last one when finished.
class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_bytes);
  ~ProgressBar() { Finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(uint64_t done);
  // Clears the bar's line, or prints the last line.
  void Finish();

 private:
  // "label 40%  1.2 GiB / 3.0 GiB  300.0 MiB/s  ETA 6.0s" (bar: with the bar after the label).
  std::string Describe(uint64_t done, const std::string& bar = "") const;
  void Draw(uint64_t done);

  std::string label_;
  uint64_t total_;
  ProgressMode mode_;
  uint64_t done_ = 0;
  bool finished_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

// A ProgressBar for a callback that reports its total with every call (ckv::ProgressFn).
class ProgressFnBar {
 public:
  explicit ProgressFnBar(std::string label) : label_(std::move(label)) {}
  ProgressFn fn();
  void Finish();

 private:
  std::string label_;
  uint64_t total_ = 0;
  std::unique_ptr<ProgressBar> bar_;
};

// For a phase that reports no progress (Engine::Put): shows the label and the time elapsed until
// destroyed.
class ElapsedTicker {
 public:
  explicit ElapsedTicker(std::string label);
  ~ElapsedTicker();
  ElapsedTicker(const ElapsedTicker&) = delete;
  ElapsedTicker& operator=(const ElapsedTicker&) = delete;

 private:
  void Run();

  std::string label_;
  ProgressMode mode_;
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ckv::kvctl

#endif  // CKV_TOOLS_KVCTL_PROGRESS_H_
