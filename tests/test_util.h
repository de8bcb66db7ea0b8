// SPDX-License-Identifier: Apache-2.0
// tests/test_util.h: helpers shared by ckv's tests.
#ifndef CKV_TESTS_TEST_UTIL_H_
#define CKV_TESTS_TEST_UTIL_H_

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckv/engine.h"
#include "engine/internal.h"
#include "gtest/gtest.h"
#include "kernels/summary.h"
#include "storage/chunk_store.h"
#include "tools/synthetic_kv.h"

// Which sanitizer this binary is built with (GCC defines __SANITIZE_*__, clang has
// __has_feature). Heavy tests scale themselves down under either; RSS means nothing under them.
#if defined(__SANITIZE_ADDRESS__)
#define CKV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKV_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CKV_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CKV_TEST_TSAN 1
#endif
#endif

namespace ckv::testing {

#ifdef CKV_TEST_ASAN
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#ifdef CKV_TEST_TSAN
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
inline constexpr bool kSanitizerBuild = kAddressSanitizer || kThreadSanitizer;

// Fails the process, naming `what`, when it is still alive `limit` after construction: a test
// that would hang (a wait that never ends) fails CI instead of stalling it. ctest runs each test
// in its own process, so only that test fails. The deadline is a bound, not a wait for work.
class Watchdog {
 public:
  Watchdog(std::string what, absl::Duration limit)
      : what_(std::move(what)), deadline_(absl::Now() + limit), thread_([this, limit] {
          absl::MutexLock lock(&mu_);
          while (!done_) {
            if (cv_.WaitWithDeadline(&mu_, deadline_) && !done_) {
              std::fprintf(stderr, "watchdog: %s still running after %s; aborting\n", what_.c_str(),
                           absl::FormatDuration(limit).c_str());
              std::fflush(stderr);
              std::abort();
            }
          }
        }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      cv_.Signal();
    }
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  const std::string what_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The process's resident set size in bytes (/proc/self/statm), or 0 when unreadable.
inline uint64_t RssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/ckv-test-XXXXXX";
    char* made = mkdtemp(templ.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

#define CKV_ASSERT_OK(expr)                                 \
  do {                                                      \
    const ::absl::Status ckv_test_status_ = (expr);         \
    ASSERT_TRUE(ckv_test_status_.ok()) << ckv_test_status_; \
  } while (false)

#define CKV_EXPECT_OK(expr)                                 \
  do {                                                      \
    const ::absl::Status ckv_test_status_ = (expr);         \
    EXPECT_TRUE(ckv_test_status_.ok()) << ckv_test_status_; \
  } while (false)

// Bytes of disk blocks allocated to the segment files of the store at `store` (st_blocks).
// Records an Engine stores per chunk: one per layer, plus the two key summary parts, the estimate
// part and the outlier part.
inline uint64_t RecordsPerChunk(const ModelSpec& spec) { return uint64_t{spec.layers} + 4; }

// Segment bytes one chunk stored by an Engine occupies: its records, its summaries, its estimate
// part and its outlier part, each in a slot rounded up to 4096 (storage/segment.h).
inline uint64_t ChunkDiskBytes(const ModelSpec& spec) {
  auto slot = [](uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  return spec.layers * slot(spec.RecordBytes()) + slot(f.MinMaxBytes()) + slot(f.MeanBytes()) +
         slot(f.EstimateBytes()) + slot(f.OutlierBytes());
}

inline uint64_t SegmentBlocksBytes(const std::string& store) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(store + "/segments")) {
    struct stat st;
    if (::stat(entry.path().c_str(), &st) == 0) total += uint64_t(st.st_blocks) * 512;
  }
  return total;
}

// Reads every record of the first `chunks` chunks of `tokens` and compares each with the
// generator, bit for bit. Returns the number of records that differ or failed to read.
inline int CountBadRecords(Engine& engine, const ModelSpec& spec,
                           const std::vector<int32_t>& tokens, size_t chunks) {
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  int bad = 0;
  for (size_t i = 0; i < chunks && i < keys.size(); ++i) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      synth::FillStoredRecord(spec, keys[i], l, want);
      absl::Status s = engine.ReadRecord(spec, keys[i], l, got);
      if (!s.ok() || got != want) ++bad;
    }
  }
  return bad;
}

// Waits until the store's background reclaimer is idle: a round in progress holds
// slots it is punching in disk_bytes_used, so exact stats are read after it.
inline void WaitForReclaim(Engine& engine) { engine::HostOf(engine).store().WaitForReclaimIdle(); }

// Puts the synthetic prefix `tokens`.
inline absl::StatusOr<PutResult> PutSynthetic(Engine& engine, const ModelSpec& spec,
                                              const std::vector<int32_t>& tokens) {
  synth::SyntheticKv kv(spec, tokens);
  return engine.Put(spec, tokens, kv.tensors());
}

// The addresses of `records`, in order, as the kernels take them.
inline std::vector<const std::byte*> Pointers(const std::vector<std::vector<std::byte>>& records) {
  std::vector<const std::byte*> out;
  out.reserve(records.size());
  for (const auto& r : records) out.push_back(r.data());
  return out;
}

// The value of the first `"key":"..."` in the JSON text `json` (a string without escapes), or ""
// when there is none: enough for the ids and names kvctl prints.
inline std::string JsonString(const std::string& json, const std::string& key) {
  const std::string open = "\"" + key + "\":\"";
  const size_t at = json.find(open);
  if (at == std::string::npos) return "";
  const size_t begin = at + open.size();
  return json.substr(begin, json.find('"', begin) - begin);
}

// What a program run through the shell printed (stdout and stderr together) and its exit status
// (-1 when it did not exit normally or could not be started).
struct ProgramRun {
  int exit_code = -1;
  std::string output;
};

// Runs `program args` with stderr merged into stdout, as the benchmark tests do, or dropped
// (`merge_stderr` false: stdout alone, e.g. the text a collector reads).
inline ProgramRun RunProgram(const std::string& program, const std::string& args,
                             bool merge_stderr = true) {
  ProgramRun r;
  const std::string cmd = program + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

#ifdef CKV_KVCTL_PATH
// Runs the kvctl this build made with `args`, as RunProgram does, its progress display set to
// `progress` ("off" by default: progress lines would go into the output).
inline ProgramRun RunKvctl(const std::string& args, bool merge_stderr = true,
                           const std::string& progress = "off") {
  return RunProgram("KVCTL_PROGRESS=" + progress + " " + std::string(CKV_KVCTL_PATH), args,
                    merge_stderr);
}

// kvctl `args`, stdout and stderr together, progress set to `progress`.
inline ProgramRun Kvctl(const std::string& args, const std::string& progress = "off") {
  return RunKvctl(args, /*merge_stderr=*/true, progress);
}

// kvctl `args`: its stdout alone (what --json writes and a collector reads; a log line on stderr,
// such as an io_uring fallback, is not part of it), progress off.
inline ProgramRun KvctlStdout(const std::string& args) {
  return RunKvctl(args, /*merge_stderr=*/false);
}
#endif

}  // namespace ckv::testing

#endif  // CKV_TESTS_TEST_UTIL_H_
