// SPDX-License-Identifier: Apache-2.0
#include "tools/kvctl/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ckv::kvctl {
namespace {

// Plain lines: one every this long, and one when the phase ends.
constexpr auto kProgressLineInterval = std::chrono::seconds(5);

bool StderrIsTty() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}

}  // namespace

ProgressMode GetProgressMode() {
  static const ProgressMode mode = [] {
    const char* env = std::getenv("KVCTL_PROGRESS");
    const std::string_view v = env == nullptr ? "" : env;
    if (v == "bar") return ProgressMode::kBar;
    if (v == "lines") return ProgressMode::kLines;
    if (v == "off") return ProgressMode::kOff;
    return StderrIsTty() ? ProgressMode::kBar : ProgressMode::kLines;
  }();
  return mode;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      mode_(GetProgressMode()),
      start_(Clock::now()),
      last_draw_(start_) {}

void ProgressBar::Update(uint64_t done) {
  done_ = done;
  if (mode_ == ProgressMode::kOff || finished_) return;
  const auto now = Clock::now();
  if (mode_ == ProgressMode::kLines) {
    if (now - last_draw_ < kProgressLineInterval) return;
    last_draw_ = now;
    std::fprintf(stderr, "%s\n", Describe(done).c_str());
    std::fflush(stderr);
    return;
  }
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw(done);
}

void ProgressBar::Finish() {
  if (mode_ == ProgressMode::kOff || finished_) return;
  finished_ = true;
  if (mode_ == ProgressMode::kLines) {
    std::fprintf(stderr, "%s: %s in %s\n", label_.c_str(), FormatBytes(done_).c_str(),
                 FormatDuration(SecondsSince(start_)).c_str());
  } else {
    std::fputs("\r\033[K", stderr);
  }
  std::fflush(stderr);
}

std::string ProgressBar::Describe(uint64_t done, const std::string& bar) const {
  const double fraction =
      total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  const double elapsed = SecondsSince(start_);
  // A rate over the first instants is noise: show none until a quarter second has passed.
  const double rate = elapsed >= 0.25 ? static_cast<double>(done) / elapsed : 0;
  std::string eta = "-";
  if (rate > 0 && done < total_) {
    eta = FormatDuration(static_cast<double>(total_ - done) / rate);
  } else if (done >= total_) {
    eta = "0.0s";
  }
  char line[512];
  std::snprintf(line, sizeof(line), "%s%s %3d%%  %s / %s  %s  ETA %s", label_.c_str(), bar.c_str(),
                static_cast<int>(fraction * 100), FormatBytes(done).c_str(),
                FormatBytes(total_).c_str(), FormatRate(rate).c_str(), eta.c_str());
  return line;
}

void ProgressBar::Draw(uint64_t done) {
  constexpr int kWidth = 24;
  const double fraction =
      total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar = " [" + std::string(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  bar += "]";
  std::fprintf(stderr, "\r\033[K%s", Describe(done, bar).c_str());
  std::fflush(stderr);
}

// A new bar whenever the total changes (Repair verifies, then reports its own total).
ProgressFn ProgressFnBar::fn() {
  return [this](uint64_t done, uint64_t total) {
    if (!bar_ || total != total_) {
      bar_ = std::make_unique<ProgressBar>(label_, total);
      total_ = total;
    }
    bar_->Update(done);
  };
}

void ProgressFnBar::Finish() {
  if (bar_) bar_->Finish();
}

ElapsedTicker::ElapsedTicker(std::string label)
    : label_(std::move(label)), mode_(GetProgressMode()), start_(Clock::now()) {
  if (mode_ == ProgressMode::kOff) return;
  thread_ = std::thread([this] { Run(); });
}

ElapsedTicker::~ElapsedTicker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  if (mode_ == ProgressMode::kLines) {
    std::fprintf(stderr, "%s: done in %s\n", label_.c_str(),
                 FormatDuration(SecondsSince(start_)).c_str());
  } else {
    std::fputs("\r\033[K", stderr);
  }
  std::fflush(stderr);
}

void ElapsedTicker::Run() {
  const bool lines = mode_ == ProgressMode::kLines;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const auto wait =
        lines ? std::chrono::milliseconds(kProgressLineInterval) : std::chrono::milliseconds(200);
    if (cv_.wait_for(lock, wait, [this] { return stop_; })) return;
    std::fprintf(stderr, lines ? "%s ... %s\n" : "\r\033[K%s ... %s", label_.c_str(),
                 FormatDuration(SecondsSince(start_)).c_str());
    std::fflush(stderr);
  }
}

}  // namespace ckv::kvctl
