// put_bench: Put throughput of one large prefix into a fresh store.
//
//   put_bench --store DIR [--model PRESET] [--tokens N] [--repeat R] [--json [PATH]]
//             [--dtype fp16|bf16|fp32] [--seed S] [--layout layer-major|period-major]
//             [--io-backend auto|uring|threads] [--keep] [--print-bytes]
//
// Generates one synthetic prefix (tools/synthetic_kv.h; not timed), then R times: opens a fresh
// store in DIR/put-bench-<i> (removing the previous one first), times Engine::Put of the whole
// prefix (records written with O_DIRECT, fdatasync'd, catalog batch committed: everything a Put
// does before it returns), and closes the store. Nothing is dropped from caches: the data path
// uses O_DIRECT. Prints a table (GB, seconds, GB/s per repeat; median, min and max), or with
// --json one JSON object of the same in its place (--json PATH: in PATH, beside the table; see
// tools/cli.h). GB are 10^9 bytes, as fio counts them.
//
// bench/put_vs_fio.sh runs this program and fio back to back on the same filesystem.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/status.h"
#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/synthetic_kv.h"

namespace ckv::bench {
namespace {

constexpr int kExitError = cli::kExitError;

struct Flags {
  std::string store;
  std::string model = "qwen2.5-7b";
  uint64_t tokens = 16384;
  uint64_t repeat = 3;
  uint64_t seed = 1;
  cli::JsonOutput json;
  DType dtype = DType::kFp16;
  RecordLayout layout = RecordLayout::kLayerMajor;
  IoBackend io_backend = IoBackend::kAuto;
  bool keep = false;
  double settle_seconds = 3;
  bool print_bytes = false;
};

int Usage(const std::string& message) {
  return cli::UsageError("put_bench", message);
}

// Returns the exit code when the program should stop (help, version, a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"Times Engine::Put of one synthetic prefix into a fresh store under DIR, R times.",
               "put_bench"};
  cli::Configure(app);
  app.add_option("--store", f->store, "directory for the stores (DIR/put-bench-<i>; created if "
                                      "missing)")
      ->type_name("DIR");
  app.add_option("--model", f->model,
                 "qwen2.5-0.5b, qwen2.5-7b (default), qwen2.5-14b, qwen2.5-32b")
      ->type_name("PRESET");
  cli::AddUint(app, "--tokens", &f->tokens,
               "prefix length, a multiple of 16 (default 16384: ~0.94 GB for 7b)");
  cli::AddUint(app, "--repeat", &f->repeat, "timed Puts, each into a fresh store (default 3)",
               "R");
  cli::AddJson(app, &f->json);
  cli::AddParsed(app, "--dtype", "fp16 (default), bf16, fp32", "T", "fp16, bf16 or fp32",
                 [f](const std::string& v) {
                   auto dtype = ParseDType(v);
                   if (dtype.ok()) f->dtype = *dtype;
                   return dtype.ok();
                 });
  cli::AddUint(app, "--seed", &f->seed, "seed of the prefix's tokens (default 1)", "S");
  cli::AddParsed(app, "--layout", "record layout of the stores (default layer-major)", "L",
                 "layer-major or period-major", [f](const std::string& v) {
                   if (v != "layer-major" && v != "period-major") return false;
                   f->layout = v == "layer-major" ? RecordLayout::kLayerMajor
                                                  : RecordLayout::kPeriodMajor;
                   return true;
                 });
  cli::AddParsed(app, "--io-backend", "auto (default), uring, threads", "B",
                 "auto, uring or threads", [f](const std::string& v) {
                   if (v == "auto") f->io_backend = IoBackend::kAuto;
                   else if (v == "uring") f->io_backend = IoBackend::kUring;
                   else if (v == "threads") f->io_backend = IoBackend::kThreads;
                   else return false;
                   return true;
                 });
  app.add_flag("--keep", f->keep, "keep the last store instead of removing it");
  cli::AddParsed(app, "--settle",
                 "seconds to wait (after a sync) between repeats, so that the discards of the "
                 "deleted previous store finish outside the timing (default 3)",
                 "S", "a number of seconds >= 0", [f](const std::string& v) {
                   return cli::ParseDouble(v, &f->settle_seconds) && f->settle_seconds >= 0;
                 });
  app.add_flag("--print-bytes", f->print_bytes,
               "print the KV bytes of the prefix and exit (for fio's --size)");
  return cli::Parse(app, argc, argv);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Run {
  uint64_t bytes_written = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes_written) / 1e9 / seconds : 0; }
};

// R timed Puts of `tokens` into fresh stores under f.store (see the banner).
absl::StatusOr<std::vector<Run>> TimePuts(const Flags& f, const ModelSpec& spec,
                                          const std::vector<int32_t>& tokens,
                                          const synth::SyntheticKv& kv) {
  std::error_code ec;
  std::vector<Run> runs;
  std::string previous;
  for (uint64_t i = 1; i <= f.repeat; ++i) {
    const std::string dir = (std::filesystem::path(f.store) / ("put-bench-" + std::to_string(i))).string();
    for (const std::string& stale : {previous, dir}) {
      if (stale.empty()) continue;
      std::filesystem::remove_all(stale, ec);
      if (ec) return ErrnoToStatus(ec.value(), "remove " + stale);
    }
    if (i > 1 && f.settle_seconds > 0) {
      // The previous store was just deleted: on a file system mounted with online discard its
      // freed blocks go to the device now. Let that finish outside the timed Put.
      ::sync();
      std::this_thread::sleep_for(std::chrono::duration<double>(f.settle_seconds));
    }
    EngineOptions options;
    options.create_if_missing = true;
    options.error_if_exists = true;
    options.layout = f.layout;
    options.io_backend = f.io_backend;
    Run run;
    {
      auto engine = Engine::Open(options, dir);
      if (!engine.ok()) {
        return absl::Status(engine.status().code(), "open " + dir + ": " + engine.status().ToString());
      }
      const auto start = std::chrono::steady_clock::now();
      auto result = (*engine)->Put(spec, tokens, kv.tensors());
      run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!result.ok()) {
        return absl::Status(result.status().code(),
                            "put into " + dir + ": " + result.status().ToString());
      }
      run.bytes_written = result->bytes_written;
    }  // the store closes here, untimed
    std::fprintf(stderr, "put_bench: repeat %llu/%llu: %.3f GB in %.3f s = %.3f GB/s\n",
                 static_cast<unsigned long long>(i), static_cast<unsigned long long>(f.repeat),
                 static_cast<double>(run.bytes_written) / 1e9, run.seconds, run.gbps());
    runs.push_back(run);
    previous = dir;
  }
  if (!f.keep && !previous.empty()) {
    std::filesystem::remove_all(previous, ec);
    if (ec) {
      std::fprintf(stderr, "put_bench: remove %s: %s\n", previous.c_str(), ec.message().c_str());
    }
  }
  return runs;
}

struct Summary {
  double median = 0, min = 0, max = 0;  // GB/s
};

Summary Summarize(const std::vector<Run>& runs) {
  std::vector<double> gbps;
  for (const Run& r : runs) gbps.push_back(r.gbps());
  return {Median(gbps), *std::min_element(gbps.begin(), gbps.end()),
          *std::max_element(gbps.begin(), gbps.end())};
}

void PrintTable(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes,
                const std::vector<Run>& runs, const Summary& s) {
  std::printf("Put of one prefix: %s, %llu tokens, %.3f GB of KV, store under %s\n",
              spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
              static_cast<double>(kv_bytes) / 1e9, f.store.c_str());
  std::printf("%-8s %10s %10s %10s\n", "repeat", "GB", "seconds", "GB/s");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::printf("%-8zu %10.3f %10.3f %10.3f\n", i + 1,
                static_cast<double>(runs[i].bytes_written) / 1e9, runs[i].seconds, runs[i].gbps());
  }
  std::printf("median %.3f GB/s, min %.3f, max %.3f (spread %.1f%% of the median)\n", s.median,
              s.min, s.max, s.median > 0 ? 100.0 * (s.max - s.min) / s.median : 0.0);
}

std::string ResultJson(const Flags& f, const ModelSpec& spec, uint64_t kv_bytes,
                       const std::vector<Run>& runs, const Summary& s) {
  tools::JsonWriter w;
  w.BeginObject()
      .Key("benchmark").String("put_bench")
      .Key("model").String(f.model)
      .Key("spec").String(spec.DebugString())
      .Key("dtype").String(DTypeName(spec.dtype))
      .Key("layout").String(f.layout == RecordLayout::kLayerMajor ? "layer-major" : "period-major")
      .Key("tokens").Uint(f.tokens)
      .Key("chunks").Uint(f.tokens / spec.chunk_tokens)
      .Key("kv_bytes").Uint(kv_bytes)
      .Key("store").String(f.store)
      .Key("runs").BeginArray();
  for (const Run& r : runs) {
    w.BeginObject()
        .Key("bytes_written").Uint(r.bytes_written)
        .Key("seconds").Double(r.seconds)
        .Key("gbps").Double(r.gbps())
        .EndObject();
  }
  w.EndArray()
      .Key("median_gbps").Double(s.median)
      .Key("min_gbps").Double(s.min)
      .Key("max_gbps").Double(s.max)
      .EndObject();
  return w.str();
}

int Main(int argc, char** argv) {
  Flags f;
  if (const std::optional<int> exit = ParseFlags(argc, argv, &f)) return *exit;
  auto spec_or = ModelSpec::Preset(f.model, f.dtype);
  if (!spec_or.ok()) return Usage(std::string(spec_or.status().message()));
  const ModelSpec spec = *spec_or;
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    return Usage("--tokens: " + std::to_string(f.tokens) + " is not a positive multiple of " +
                 std::to_string(spec.chunk_tokens));
  }
  if (f.tokens > (uint64_t{1} << 40) / spec.KvBytesPerToken()) {
    return Usage("--tokens: " + std::to_string(f.tokens) + " tokens would need more than 1 TiB");
  }
  const uint64_t kv_bytes = f.tokens * spec.KvBytesPerToken();
  if (f.print_bytes) {
    std::printf("%llu\n", static_cast<unsigned long long>(kv_bytes));
    return 0;
  }
  if (f.store.empty()) return Usage("--store DIR is required");
  if (f.repeat == 0 || f.repeat > 1000) return Usage("--repeat must be in 1..1000");

  std::error_code ec;
  std::filesystem::create_directories(f.store, ec);
  if (ec) {
    std::fprintf(stderr, "put_bench: create %s: %s\n", f.store.c_str(), ec.message().c_str());
    return kExitError;
  }

  std::fprintf(stderr, "put_bench: generating %s, %llu tokens (%.3f GB of KV)...\n",
               spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
               static_cast<double>(kv_bytes) / 1e9);
  const std::vector<int32_t> tokens = synth::Tokens(f.seed, f.tokens);
  const synth::SyntheticKv kv(spec, tokens);
  const absl::StatusOr<std::vector<Run>> runs = TimePuts(f, spec, tokens, kv);
  if (!runs.ok()) {
    std::fprintf(stderr, "put_bench: %s\n", std::string(runs.status().message()).c_str());
    return kExitError;
  }
  const Summary summary = Summarize(*runs);
  if (!f.json.ToStdout()) PrintTable(f, spec, kv_bytes, *runs, summary);
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ResultJson(f, spec, kv_bytes, *runs, summary)); !s.ok()) {
      std::fprintf(stderr, "put_bench: %s\n", s.ToString().c_str());
      return kExitError;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) { return ckv::bench::Main(argc, argv); }
