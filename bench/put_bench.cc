// put_bench: Put throughput of one large prefix into a fresh store.
//
//   put_bench --store DIR [--model PRESET] [--tokens N] [--repeat R] [--json FILE]
//             [--dtype fp16|bf16|fp32] [--seed S] [--layout layer-major|period-major]
//             [--io-backend auto|uring|threads] [--keep] [--print-bytes]
//
// Generates one synthetic prefix (tools/synthetic_kv.h; not timed), then R times: opens a fresh
// store in DIR/put-bench-<i> (removing the previous one first), times Engine::Put of the whole
// prefix (records written with O_DIRECT, fdatasync'd, catalog batch committed: everything a Put
// does before it returns), and closes the store. Nothing is dropped from caches: the data path
// uses O_DIRECT. Prints a table (GB, seconds, GB/s per repeat; median, min and max) and, with
// --json, writes the same as one JSON object. GB are 10^9 bytes, as fio counts them.
//
// bench/put_vs_fio.sh runs this program and fio back to back on the same filesystem.

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "tools/json_writer.h"
#include "tools/synthetic_kv.h"

namespace ckv::bench {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitError = 3;

struct Flags {
  std::string store;
  std::string model = "qwen2.5-7b";
  uint64_t tokens = 16384;
  uint64_t repeat = 3;
  uint64_t seed = 1;
  std::string json;
  DType dtype = DType::kFp16;
  RecordLayout layout = RecordLayout::kLayerMajor;
  IoBackend io_backend = IoBackend::kAuto;
  bool keep = false;
  double settle_seconds = 3;
  bool print_bytes = false;
};

void PrintUsage(FILE* out) {
  std::fputs(
      "Usage: put_bench --store DIR [--model PRESET] [--tokens N] [--repeat R] [--json FILE]\n"
      "                 [--dtype fp16|bf16|fp32] [--seed S] [--layout layer-major|period-major]\n"
      "                 [--io-backend auto|uring|threads] [--keep] [--print-bytes]\n\n"
      "Times Engine::Put of one synthetic prefix into a fresh store under DIR, R times.\n\n"
      "  --store DIR        directory for the stores (DIR/put-bench-<i>; created if missing)\n"
      "  --model PRESET     qwen2.5-0.5b, qwen2.5-7b (default), qwen2.5-14b, qwen2.5-32b\n"
      "  --tokens N         prefix length, a multiple of 16 (default 16384: ~0.94 GB for 7b)\n"
      "  --repeat R         timed Puts, each into a fresh store (default 3)\n"
      "  --json FILE        also write the results as one JSON object to FILE\n"
      "  --dtype T          fp16 (default), bf16, fp32\n"
      "  --seed S           seed of the prefix's tokens (default 1)\n"
      "  --layout L         record layout of the stores (default layer-major)\n"
      "  --io-backend B     auto (default), uring, threads\n"
      "  --keep             keep the last store instead of removing it\n"
      "  --settle S         seconds to wait (after a sync) between repeats, so that the discards\n"
      "                     of the deleted previous store finish outside the timing (default 3)\n"
      "  --print-bytes      print the KV bytes of the prefix and exit (for fio's --size)\n",
      out);
}

bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "put_bench: %s\nRun 'put_bench --help' for usage.\n", message.c_str());
  return kExitUsage;
}

// Returns -1 when parsed, else the exit code.
int ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      PrintUsage(stdout);
      return 0;
    }
    if (arg == "--settle") {
      if (i + 1 >= argc) return Usage("--settle needs a value");
      char* end = nullptr;
      f->settle_seconds = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(f->settle_seconds >= 0)) {
        return Usage("--settle takes a number of seconds >= 0");
      }
      continue;
    }
    if (arg == "--keep") {
      f->keep = true;
      continue;
    }
    if (arg == "--print-bytes") {
      f->print_bytes = true;
      continue;
    }
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage("option " + arg + " needs a value");
    }
    uint64_t* number = nullptr;
    if (arg == "--store") {
      f->store = value;
    } else if (arg == "--model") {
      f->model = value;
    } else if (arg == "--json") {
      f->json = value;
    } else if (arg == "--tokens") {
      number = &f->tokens;
    } else if (arg == "--repeat") {
      number = &f->repeat;
    } else if (arg == "--seed") {
      number = &f->seed;
    } else if (arg == "--dtype") {
      auto dtype = ParseDType(value);
      if (!dtype.ok()) return Usage("--dtype: '" + value + "' is not fp16, bf16 or fp32");
      f->dtype = *dtype;
    } else if (arg == "--layout") {
      if (value == "layer-major") {
        f->layout = RecordLayout::kLayerMajor;
      } else if (value == "period-major") {
        f->layout = RecordLayout::kPeriodMajor;
      } else {
        return Usage("--layout: '" + value + "' is not layer-major or period-major");
      }
    } else if (arg == "--io-backend") {
      if (value == "auto") {
        f->io_backend = IoBackend::kAuto;
      } else if (value == "uring") {
        f->io_backend = IoBackend::kUring;
      } else if (value == "threads") {
        f->io_backend = IoBackend::kThreads;
      } else {
        return Usage("--io-backend: '" + value + "' is not auto, uring or threads");
      }
    } else {
      return Usage("unknown option " + arg);
    }
    if (number != nullptr && !ParseUint(value, number)) {
      return Usage(arg + ": '" + value + "' is not a non-negative integer");
    }
  }
  return -1;
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

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseFlags(argc, argv, &f); rc >= 0) return rc;
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

  std::vector<Run> runs;
  std::string previous;
  for (uint64_t i = 1; i <= f.repeat; ++i) {
    const std::string dir = (std::filesystem::path(f.store) / ("put-bench-" + std::to_string(i))).string();
    for (const std::string& stale : {previous, dir}) {
      if (stale.empty()) continue;
      std::filesystem::remove_all(stale, ec);
      if (ec) {
        std::fprintf(stderr, "put_bench: remove %s: %s\n", stale.c_str(), ec.message().c_str());
        return kExitError;
      }
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
        std::fprintf(stderr, "put_bench: open %s: %s\n", dir.c_str(),
                     engine.status().ToString().c_str());
        return kExitError;
      }
      const auto start = std::chrono::steady_clock::now();
      auto result = (*engine)->Put(spec, tokens, kv.tensors());
      run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!result.ok()) {
        std::fprintf(stderr, "put_bench: put into %s: %s\n", dir.c_str(),
                     result.status().ToString().c_str());
        return kExitError;
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

  std::vector<double> gbps;
  for (const Run& r : runs) gbps.push_back(r.gbps());
  const double median = Median(gbps);
  const double min = *std::min_element(gbps.begin(), gbps.end());
  const double max = *std::max_element(gbps.begin(), gbps.end());

  std::printf("Put of one prefix: %s, %llu tokens, %.3f GB of KV, store under %s\n",
              spec.DebugString().c_str(), static_cast<unsigned long long>(f.tokens),
              static_cast<double>(kv_bytes) / 1e9, f.store.c_str());
  std::printf("%-8s %10s %10s %10s\n", "repeat", "GB", "seconds", "GB/s");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::printf("%-8zu %10.3f %10.3f %10.3f\n", i + 1,
                static_cast<double>(runs[i].bytes_written) / 1e9, runs[i].seconds, runs[i].gbps());
  }
  std::printf("median %.3f GB/s, min %.3f, max %.3f (spread %.1f%% of the median)\n", median, min,
              max, median > 0 ? 100.0 * (max - min) / median : 0.0);

  if (!f.json.empty()) {
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
        .Key("median_gbps").Double(median)
        .Key("min_gbps").Double(min)
        .Key("max_gbps").Double(max)
        .EndObject();
    std::ofstream out(f.json, std::ios::trunc);
    out << w.str() << '\n';
    out.close();
    if (!out) {
      std::fprintf(stderr, "put_bench: cannot write %s\n", f.json.c_str());
      return kExitError;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) { return ckv::bench::Main(argc, argv); }
