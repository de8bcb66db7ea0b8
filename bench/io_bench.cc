// SPDX-License-Identifier: Apache-2.0
// io_bench: read throughput and CPU cost of the prefetch read engine (prefetch/read_engine.h).
//
//   io_bench --file F [--file-size 2G] [--pattern random|runs] [--io-size 32K] [--qd 64]
//            [--seconds 5] [--backend auto|uring|threads] [--run-records 8] [--io-threads 1]
//            [--backlog 2] [--poll-us 50] [--no-verify] [--no-register] [--seed S] [--json [PATH]]
//
// Creates F at --file-size when it does not exist (written sequentially with O_DIRECT, 8 MiB at a
// time, then fdatasync'd; every 4 KiB block holds a seeded pattern), then for --seconds keeps the
// engine busy with reads of records of --io-size bytes:
//   random  reads at random io-size-aligned offsets (fio's randread);
//   runs    runs of --run-records adjacent records, each record submitted as a separate
//           requests (SubmitBatch) that the engine coalesces into one read of
//           run-records x io-size bytes (the "coalesced size"; max_io_bytes is set to it).
// Each record's XXH3-64 is checked by the engine as it lands (the expected values are computed
// from the generator once and cached beside F in F.sums-<io-size>), unless --no-verify.
// --poll-us sets ReadEngineOptions::poll_before_sleep_us; --no-register reads without registered
// buffers and files (plain IORING_OP_READ).
// The engine keeps --qd reads in the device (its queue_depth, fio's --iodepth); the program keeps
// --backlog x --qd units (reads or runs) submitted, resubmitting each from its completion
// callback, so that the engine always has queued work, as a prefetcher does. Prints MB/s (10^6
// bytes), device reads per second (IOPS), requests per second and CPU seconds per GB (getrusage
// user+system of the whole process over the run, divided by 10^9-byte GB read), plus the engine's
// counters; --json prints one JSON object instead (--json PATH: in PATH, beside the table; see
// tools/cli.h). bench/io_vs_fio.sh runs this beside fio on the same file.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "io/file_system.h"
#include "prefetch/read_engine.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "xxhash.h"

namespace ckv::bench {
namespace {

constexpr int kExitError = cli::kExitError;
constexpr size_t kBlock = 4096;

struct Flags {
  std::string file;
  uint64_t file_size = uint64_t{2} << 30;
  std::string pattern = "random";
  uint64_t io_size = 32 * 1024;
  uint32_t qd = 64;
  double seconds = 5;
  IoBackend backend = IoBackend::kAuto;
  uint32_t run_records = 8;
  uint32_t io_threads = 1;
  uint32_t backlog = 2;
  uint32_t poll_us = 50;
  bool register_with_ring = true;
  bool verify = true;
  uint64_t seed = 1;
  cli::JsonOutput json;
};

bool ParseSize(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t mult = 1;
  const char last = s.back();
  if (last == 'K' || last == 'k') mult = uint64_t{1} << 10;
  if (last == 'M' || last == 'm') mult = uint64_t{1} << 20;
  if (last == 'G' || last == 'g') mult = uint64_t{1} << 30;
  if (mult != 1) s.remove_suffix(1);
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v * mult;
  return *out > 0;
}

// The content of 4 KiB block `b` of a bench file.
void FillBlock(uint64_t b, std::byte* out) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (b + 1);
  for (size_t o = 0; o < kBlock; o += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out + o, &x, 8);
  }
}

absl::Status CreateFile(io::File* f, uint64_t size) {
  constexpr size_t kChunk = 8 << 20;
  io::AlignedBuffer buf(kChunk);
  for (uint64_t off = 0; off < size; off += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - off));
    for (size_t o = 0; o < n; o += kBlock) FillBlock((off + o) / kBlock, buf.data() + o);
    absl::Status s = f->WriteAt(off, std::span<const std::byte>(buf.data(), n));
    if (!s.ok()) return s;
  }
  return f->Sync();
}

// XXH3-64 of every io_size record, cached in `<file>.sums-<io_size>`.
std::vector<uint64_t> RecordChecksums(const std::string& file, uint64_t file_size,
                                      uint64_t io_size) {
  const uint64_t records = file_size / io_size;
  const std::string cache = absl::StrCat(file, ".sums-", io_size);
  std::vector<uint64_t> sums(records);
  {
    std::ifstream in(cache, std::ios::binary);
    uint64_t header[2] = {0, 0};
    if (in.read(reinterpret_cast<char*>(header), sizeof(header)) && header[0] == file_size &&
        header[1] == io_size &&
        in.read(reinterpret_cast<char*>(sums.data()), static_cast<std::streamsize>(records * 8))) {
      return sums;
    }
  }
  std::vector<std::byte> rec(io_size);
  for (uint64_t r = 0; r < records; ++r) {
    for (uint64_t o = 0; o < io_size; o += kBlock)
      FillBlock((r * io_size + o) / kBlock, rec.data() + o);
    sums[r] = XXH3_64bits(rec.data(), io_size);
  }
  std::ofstream out(cache, std::ios::binary | std::ios::trunc);
  const uint64_t header[2] = {file_size, io_size};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(sums.data()), static_cast<std::streamsize>(records * 8));
  return sums;
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "io_bench: %s\n", std::string(status.message()).c_str());
  return kExitError;
}

// The bench file, created (or rewritten when smaller than --file-size) first; `size` is its size.
absl::StatusOr<std::unique_ptr<io::File>> OpenBenchFile(const Flags& fl, uint64_t* size) {
  io::FileSystem* fs = io::PosixFileSystem();
  const bool exists = fs->Exists(fl.file);
  auto opened = fs->Open(fl.file, io::FileSystem::OpenMode::kCreateReadWrite);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<io::File> file = std::move(*opened);
  *size = 0;
  if (auto s = file->Size(); s.ok()) *size = *s;
  if (!exists || *size < fl.file_size) {
    if (exists)
      std::fprintf(stderr, "io_bench: %s is smaller than --file-size; rewriting it\n",
                   fl.file.c_str());
    std::fprintf(stderr, "io_bench: creating %s (%llu bytes, O_DIRECT)\n", fl.file.c_str(),
                 static_cast<unsigned long long>(fl.file_size));
    CKV_RETURN_IF_ERROR(CreateFile(file.get(), fl.file_size));
    *size = fl.file_size;
  }
  return file;
}

// The shape of the load: `units` units (a record, or a run of records) kept submitted.
struct Shape {
  uint32_t per_unit;       // records per unit
  uint64_t unit_bytes;     // bytes per unit: the coalesced read size
  uint64_t units_in_file;  // distinct units the file holds
  uint32_t units;          // units kept submitted
};

absl::StatusOr<std::unique_ptr<prefetch::ReadEngine>> NewEngine(const Flags& fl,
                                                                const Shape& shape) {
  prefetch::ReadEngineOptions o;
  o.backend = fl.backend;
  o.queue_depth = fl.qd;
  o.io_threads = fl.io_threads;
  o.poll_before_sleep_us = fl.poll_us;
  o.register_with_ring = fl.register_with_ring;
  o.max_io_bytes = static_cast<uint32_t>(shape.unit_bytes);
  // + reads landed, not yet released
  o.max_outstanding_requests = (shape.units + 2 * fl.qd) * shape.per_unit + 16;
  return prefetch::ReadEngine::Create(o);
}

// What a run measured.
struct Outcome {
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t bytes = 0;
  uint64_t requests = 0;
  uint64_t failures = 0;
  std::string first_error;
};

// A closed loop of reads: each unit is resubmitted from the completion callback of its last
// record until Stop, as a prefetcher keeps the engine fed.
class ClosedLoop {
 public:
  ClosedLoop(const Flags& fl, const Shape& shape, prefetch::ReadEngine* engine, uint32_t file,
             const std::vector<uint64_t>& sums)
      : fl_(fl), shape_(shape), engine_(engine), file_(file), sums_(sums), remaining_(shape.units) {
    for (uint32_t u = 0; u < shape.units; ++u) rngs_.emplace_back(fl.seed * 1000003 + u);
  }

  void Start() {
    outstanding_units_.store(shape_.units);
    for (uint32_t u = 0; u < shape_.units; ++u) SubmitUnit(u);
  }
  // Stops resubmitting and waits (at most `limit`) for the units in flight; false on timeout.
  bool Stop(std::chrono::seconds limit) {
    stop_.store(true);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (outstanding_units_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return outstanding_units_.load() == 0;
  }
  void Fill(Outcome* out) {
    out->bytes = bytes_.load();
    out->requests = requests_.load();
    out->failures = failures_.load();
    absl::MutexLock lock(&error_mu_);
    out->first_error = first_error_;
  }

 private:
  void Failed(absl::string_view message) {
    if (failures_.fetch_add(1) == 0) {
      absl::MutexLock lock(&error_mu_);
      first_error_ = std::string(message);
    }
  }

  void Completed(uint32_t slot, const prefetch::ReadResult& res) {
    if (res.status.ok()) {
      bytes_.fetch_add(res.data.size(), std::memory_order_relaxed);
    } else {
      Failed(res.status.message());
    }
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (remaining_[slot].fetch_sub(1) != 1) return;
    if (!stop_.load(std::memory_order_relaxed)) {
      SubmitUnit(slot);
    } else {
      outstanding_units_.fetch_sub(1);
    }
  }

  void SubmitUnit(uint32_t slot) {
    const uint64_t unit = rngs_[slot]() % shape_.units_in_file;
    std::vector<prefetch::ReadRequest> batch(shape_.per_unit);
    for (uint32_t k = 0; k < shape_.per_unit; ++k) {
      const uint64_t record = unit * shape_.per_unit + k;
      prefetch::ReadRequest& r = batch[k];
      r.file = file_;
      r.offset = record * fl_.io_size;
      r.length = static_cast<uint32_t>(fl_.io_size);
      r.priority = prefetch::Priority::kDemand;
      if (fl_.verify) {
        r.verify_checksum = true;
        r.expected_checksum = sums_[record];
      }
      r.callback = [this, slot](const prefetch::ReadResult& res) { Completed(slot, res); };
    }
    remaining_[slot].store(shape_.per_unit);
    auto ids = engine_->SubmitBatch(batch);
    if (!ids.ok()) {
      Failed(ids.status().message());
      outstanding_units_.fetch_sub(1);
    }
  }

  const Flags& fl_;
  const Shape shape_;
  prefetch::ReadEngine* const engine_;
  const uint32_t file_;
  const std::vector<uint64_t>& sums_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> outstanding_units_{0};
  std::atomic<uint64_t> bytes_{0}, requests_{0}, failures_{0};
  std::vector<std::atomic<uint32_t>> remaining_;
  std::vector<std::mt19937_64> rngs_;
  absl::Mutex error_mu_;
  std::string first_error_ ABSL_GUARDED_BY(error_mu_);
};

// The figures, as a table and/or JSON (--json).
absl::Status Report(const Flags& fl, const Shape& shape, const prefetch::ReadEngine& engine,
                    const Outcome& out) {
  const prefetch::ReadEngineStats st = engine.stats();
  const double secs = out.seconds;
  const double gb = static_cast<double>(out.bytes) / 1e9;
  const double mbps = static_cast<double>(out.bytes) / 1e6 / secs;
  const double iops = static_cast<double>(st.ios_issued) / secs;
  const double rps = static_cast<double>(out.requests) / secs;
  const double cpu_per_gb = gb > 0 ? out.cpu_seconds / gb : 0;
  if (fl.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("backend")
        .String(engine.backend())
        .Key("fixed_buffers")
        .Bool(engine.uses_fixed_buffers())
        .Key("pattern")
        .String(fl.pattern)
        .Key("io_size")
        .Int(static_cast<int64_t>(fl.io_size))
        .Key("coalesced_size")
        .Int(static_cast<int64_t>(shape.unit_bytes))
        .Key("qd")
        .Int(fl.qd)
        .Key("backlog")
        .Int(fl.backlog)
        .Key("seconds")
        .Double(secs)
        .Key("bytes")
        .Int(static_cast<int64_t>(out.bytes))
        .Key("mb_per_s")
        .Double(mbps)
        .Key("iops")
        .Double(iops)
        .Key("requests_per_s")
        .Double(rps)
        .Key("cpu_seconds")
        .Double(out.cpu_seconds)
        .Key("cpu_s_per_gb")
        .Double(cpu_per_gb)
        .Key("verify")
        .Bool(fl.verify)
        .Key("failures")
        .Int(static_cast<int64_t>(out.failures))
        .Key("read_amplification")
        .Double(st.read_amplification())
        .Key("mean_queue_depth")
        .Double(st.mean_queue_depth)
        .Key("idle_with_pending_s")
        .Double(st.idle_with_pending_seconds)
        .Key("ios")
        .Int(static_cast<int64_t>(st.ios_issued))
        .Key("requests_coalesced")
        .Int(static_cast<int64_t>(st.requests_coalesced))
        .EndObject();
    CKV_RETURN_IF_ERROR(fl.json.Write(w.str()));
  }
  if (!fl.json.ToStdout()) {
    std::printf("io_bench: %s%s, pattern %s, io %llu B (reads of %llu B), qd %u, %.2f s%s\n",
                engine.backend(), engine.uses_fixed_buffers() ? " (fixed buffers and files)" : "",
                fl.pattern.c_str(), static_cast<unsigned long long>(fl.io_size),
                static_cast<unsigned long long>(shape.unit_bytes), fl.qd, secs,
                fl.verify ? ", checksums verified" : "");
    std::printf("%10s %10s %12s %10s %9s %8s %12s\n", "MB/s", "IOPS", "requests/s", "CPU s/GB",
                "read amp", "mean qd", "idle+pend s");
    std::printf("%10.1f %10.0f %12.0f %10.4f %9.3f %8.1f %12.4f\n", mbps, iops, rps, cpu_per_gb,
                st.read_amplification(), st.mean_queue_depth, st.idle_with_pending_seconds);
  }
  return absl::OkStatus();
}

int Run(const Flags& fl) {
  uint64_t size = 0;
  auto file = OpenBenchFile(fl, &size);
  if (!file.ok()) return Fail(file.status());
  Shape shape;
  shape.per_unit = fl.pattern == "runs" ? fl.run_records : 1;
  shape.unit_bytes = fl.io_size * shape.per_unit;
  shape.units_in_file = size / shape.unit_bytes;
  shape.units = fl.qd * std::max<uint32_t>(1, fl.backlog);
  if (shape.units_in_file == 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        fl.file, " (", size, " bytes) is smaller than one read of ", shape.unit_bytes, " bytes")));
  }
  std::vector<uint64_t> sums;
  if (fl.verify) sums = RecordChecksums(fl.file, size, fl.io_size);
  auto engine = NewEngine(fl, shape);
  if (!engine.ok()) return Fail(engine.status());
  auto fid = (*engine)->RegisterFile(file->get());
  if (!fid.ok()) return Fail(fid.status());

  ClosedLoop loop(fl, shape, engine->get(), *fid, sums);
  Outcome out;
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  loop.Start();
  std::this_thread::sleep_for(std::chrono::duration<double>(fl.seconds));
  const bool drained = loop.Stop(std::chrono::seconds(30));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.cpu_seconds = CpuSeconds() - cpu0;
  if (!drained) {
    std::fprintf(stderr, "io_bench: reads still outstanding 30 s after the run\n");
    return kExitError;
  }
  loop.Fill(&out);
  if (absl::Status s = Report(fl, shape, **engine, out); !s.ok()) return Fail(s);
  if (out.failures > 0) {
    std::fprintf(stderr, "io_bench: %llu requests failed; first: %s\n",
                 static_cast<unsigned long long>(out.failures), out.first_error.c_str());
    return kExitError;
  }
  return 0;
}

// A size with an optional K/M/G suffix (ParseSize), at most `max`.
CLI::Option* AddSize(CLI::App& app, const std::string& name, uint64_t max, const std::string& help,
                     std::function<void(uint64_t)> set) {
  return cli::AddParsed(app, name, help, "N",
                        "a positive count (K/M/G suffixes) up to " + std::to_string(max),
                        [max, set](const std::string& v) {
                          uint64_t n = 0;
                          if (!ParseSize(v, &n) || n > max) return false;
                          set(n);
                          return true;
                        });
}

// Returns the exit code when the program should stop (help, version, a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* fl) {
  CLI::App app{"Read throughput and CPU cost of the prefetch read engine.", "io_bench"};
  cli::Configure(app,
                 "See bench/io_bench.cc for what each pattern reads, and bench/io_vs_fio.sh "
                 "for the comparison with fio.");
  app.add_option("--file", fl->file, "the file to read (created at --file-size when missing)")
      ->required()
      ->type_name("F");
  cli::AddParsed(app, "--file-size", "size of a file it creates (default 2G)", "BYTES",
                 "a positive size (K/M/G suffixes)",
                 [fl](const std::string& v) { return ParseSize(v, &fl->file_size); });
  cli::AddChoice(app, "--pattern", &fl->pattern, {"random", "runs"},
                 "random (default) or runs of --run-records adjacent records");
  cli::AddParsed(app, "--io-size", "bytes per record, a multiple of 4096 (default 32K)", "BYTES",
                 "a positive multiple of 4096 (K/M/G suffixes)", [fl](const std::string& v) {
                   return ParseSize(v, &fl->io_size) && fl->io_size % 4096 == 0;
                 });
  AddSize(app, "--qd", 1024, "reads kept in the device (default 64)",
          [fl](uint64_t n) { fl->qd = static_cast<uint32_t>(n); });
  cli::AddParsed(
      app, "--seconds", "how long to read (default 5)", "S", "a number of seconds > 0",
      [fl](const std::string& v) { return cli::ParseDouble(v, &fl->seconds) && fl->seconds > 0; });
  cli::AddParsed(app, "--backend", "auto (default), uring or threads", "B",
                 "auto, uring or threads", [fl](const std::string& v) {
                   using Backend = decltype(fl->backend);
                   if (v == "auto")
                     fl->backend = Backend::kAuto;
                   else if (v == "uring")
                     fl->backend = Backend::kUring;
                   else if (v == "threads")
                     fl->backend = Backend::kThreads;
                   else
                     return false;
                   return true;
                 });
  AddSize(app, "--run-records", 256, "records per run with --pattern runs (default 8)",
          [fl](uint64_t n) { fl->run_records = static_cast<uint32_t>(n); });
  AddSize(app, "--io-threads", 64, "I/O threads of the engine (default 1)",
          [fl](uint64_t n) { fl->io_threads = static_cast<uint32_t>(n); });
  AddSize(app, "--backlog", 64, "units kept submitted, in multiples of --qd (default 2)",
          [fl](uint64_t n) { fl->backlog = static_cast<uint32_t>(n); });
  cli::AddUint(app, "--poll-us", &fl->poll_us,
               "ReadEngineOptions::poll_before_sleep_us (default 50)", "US");
  app.add_flag("--no-verify{false}", fl->verify, "do not check each record's checksum");
  app.add_flag("--no-register{false}", fl->register_with_ring,
               "read without registered buffers and files");
  AddSize(app, "--seed", UINT64_MAX, "seed of the file's contents (default 1)",
          [fl](uint64_t n) { fl->seed = n; });
  cli::AddJson(app, &fl->json);
  return cli::Parse(app, argc, argv);
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  ckv::bench::Flags fl;
  if (const std::optional<int> exit = ckv::bench::ParseFlags(argc, argv, &fl)) return *exit;
  return ckv::bench::Run(fl);
}
