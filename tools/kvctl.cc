// kvctl: create, populate and inspect ckv stores from the command line.
//
//   kvctl init STORE [--max-disk-bytes N] [--layout layer-major|period-major]
//   kvctl put STORE --model PRESET --tokens N --seed S [--shared-tokens K --shared-seed S2]
//                   [--dtype fp16|bf16|fp32] [--model-id ID] [--chunk-tokens C] [--json]
//   kvctl ls STORE [--json]
//   kvctl show STORE PREFIX [--json]
//   kvctl stats STORE [--gpu-tier-bytes B] [--cpu-tier-bytes B] [--json]
//   kvctl verify STORE [--synthetic | --repair] [--json]
//   kvctl rm STORE PREFIX [--json]
//   kvctl gc STORE [--json]
//   kvctl import STORE FILE (--model PRESET | --spec FILE) [--model-id ID] [--tokens-file F]
//                [--json]
//   kvctl export STORE PREFIX OUT.safetensors [--json]
//   kvctl replay STORE TRACE --model PRESET [--selector S] [--budget F] [--gpu-tier-bytes B]
//                [--cpu-tier-bytes B] [--no-put] [--json]
//
// Exit codes: 0 ok, 1 problems found (verify), 2 usage error, 3 I/O or store error.
// Results go to stdout (a table, or one JSON object with --json); errors and progress go to
// stderr: a bar on a terminal, plain lines otherwise (KVCTL_PROGRESS=bar|lines|off chooses).
//
// kvctl uses the public API (include/ckv/) and tools/ (the synthetic generator, safetensors),
// with two exceptions: export reads a prefix's token ids from the catalog, which the Engine API
// does not expose (see ReadPrefixTokens), and stats takes the CPU tier's summary share from
// engine/tier_cache.h.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckv/chunk_key.h"
#include "ckv/engine.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "ckv/session.h"
#include "ckv/stats.h"
#include "ckv/status.h"
#include "engine/tier_cache.h"
#include "storage/catalog.h"
#include "tools/json_writer.h"
#include "tools/model_spec_json.h"
#include "tools/replay_trace.h"
#include "tools/safetensors.h"
#include "tools/synthetic_kv.h"

namespace ckv::kvctl {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitProblems = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStoreError = 3;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Errors

int UsageError(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "kvctl: %s\n", message.c_str());
  if (command.empty()) {
    std::fprintf(stderr, "Run 'kvctl help' for usage.\n");
  } else {
    std::fprintf(stderr, "Run 'kvctl %s --help' for usage.\n", command.c_str());
  }
  return kExitUsage;
}

// "kvctl: <what>: <status message>", exit 3.
int StoreError(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "kvctl: %s: %s\n", what.c_str(), status.ToString().c_str());
  return kExitStoreError;
}

// ---------------------------------------------------------------------------------------------
// Numbers

// A decimal integer in [0, 2^64): digits only (no sign, space or trailing text), no overflow.
bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  *out = value;
  return true;
}

// A byte count: a decimal integer, optionally followed by K, M, G or T (powers of 1024, either
// case), optionally followed by "B" or "iB": 4096, 64K, 2GiB, 1T. No overflow.
bool ParseBytes(std::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t value = 0;
  if (!ParseUint(text.substr(0, digits), &value)) return false;
  std::string_view suffix = text.substr(digits);
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      default: return false;
    }
    suffix.remove_prefix(1);
    if (!suffix.empty() && suffix != "B" && suffix != "iB") return false;
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

// "1.5 GiB", "512 B".
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

// Local time, "2026-01-20 14:03:11".
std::string FormatLocalTime(int64_t unix_ms) {
  const time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm_local;
  if (localtime_r(&t, &tm_local) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm_local);
  return buf;
}

// UTC, ISO 8601 with milliseconds: "2026-01-20T13:03:11.123Z".
std::string FormatIsoUtc(int64_t unix_ms) {
  const time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm_utc;
  if (gmtime_r(&t, &tm_utc) == nullptr) return "";
  char buf[40];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm_utc);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(unix_ms % 1000));
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise.

bool StderrIsTty() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}

enum class ProgressMode { kBar, kLines, kOff };

// KVCTL_PROGRESS=bar|lines|off; unset (or anything else): a bar when stderr is a terminal, plain
// lines when it is not.
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

// Plain lines: one every this long, and one when the phase ends.
constexpr auto kProgressLineInterval = std::chrono::seconds(5);

// Percentage, bytes, rate and ETA: a bar redrawn at most 10 times a second, or a line every
// kProgressLineInterval and a last one when finished.
class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_bytes)
      : label_(std::move(label)), total_(total_bytes), mode_(GetProgressMode()),
        start_(Clock::now()), last_draw_(start_) {}
  ~ProgressBar() { Finish(); }

  void Update(uint64_t done) {
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

  // Clears the bar's line, or prints the last line.
  void Finish() {
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

 private:
  // "label 40%  1.2 GiB / 3.0 GiB  300.0 MiB/s  ETA 6.0s" (bar: with the bar after the label).
  std::string Describe(uint64_t done, const std::string& bar = "") const {
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
    std::snprintf(line, sizeof(line), "%s%s %3d%%  %s / %s  %s  ETA %s", label_.c_str(),
                  bar.c_str(), static_cast<int>(fraction * 100), FormatBytes(done).c_str(),
                  FormatBytes(total_).c_str(), FormatRate(rate).c_str(), eta.c_str());
    return line;
  }

  void Draw(uint64_t done) {
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

  std::string label_;
  uint64_t total_;
  ProgressMode mode_;
  uint64_t done_ = 0;
  bool finished_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

// For a phase that reports no progress (Engine::Put): shows the label and the time elapsed until
// destroyed.
class ElapsedTicker {
 public:
  explicit ElapsedTicker(std::string label)
      : label_(std::move(label)), mode_(GetProgressMode()), start_(Clock::now()) {
    if (mode_ == ProgressMode::kOff) return;
    thread_ = std::thread([this] { Run(); });
  }
  ~ElapsedTicker() {
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

 private:
  void Run() {
    const bool lines = mode_ == ProgressMode::kLines;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      const auto wait = lines ? std::chrono::milliseconds(kProgressLineInterval)
                              : std::chrono::milliseconds(200);
      if (cv_.wait_for(lock, wait, [this] { return stop_; })) return;
      std::fprintf(stderr, lines ? "%s ... %s\n" : "\r\033[K%s ... %s", label_.c_str(),
                   FormatDuration(SecondsSince(start_)).c_str());
      std::fflush(stderr);
    }
  }

  std::string label_;
  ProgressMode mode_;
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------
// Command line

struct OptionSpec {
  std::string_view name;   // "--tokens"
  std::string_view value;  // "N" for an option that takes a value, "" for a flag
  std::string_view help;
};

struct CommandSpec {
  std::string_view name;
  std::string_view synopsis;
  std::string_view summary;
  std::string_view details;
  std::vector<OptionSpec> options;
};

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string, std::less<>> values;
  std::set<std::string, std::less<>> flags;
  bool help = false;

  bool Has(std::string_view name) const {
    return values.find(name) != values.end() || flags.find(name) != flags.end();
  }
  const std::string* Value(std::string_view name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  }
};

void PrintCommandHelp(const CommandSpec& cmd, FILE* out) {
  std::fprintf(out, "Usage: kvctl %.*s\n\n%.*s\n", static_cast<int>(cmd.synopsis.size()),
               cmd.synopsis.data(), static_cast<int>(cmd.summary.size()), cmd.summary.data());
  if (!cmd.details.empty()) {
    std::fprintf(out, "\n%.*s\n", static_cast<int>(cmd.details.size()), cmd.details.data());
  }
  std::fprintf(out, "\nOptions:\n");
  for (const OptionSpec& opt : cmd.options) {
    std::string left(opt.name);
    if (!opt.value.empty()) {
      left += ' ';
      left += opt.value;
    }
    std::fprintf(out, "  %-26s %.*s\n", left.c_str(), static_cast<int>(opt.help.size()),
                 opt.help.data());
  }
  std::fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}

// Parses `args` (after the command name) against `cmd`'s options: "--name value",
// "--name=value", flags, positionals, "--" ends options. Returns false with `*error` set on a
// usage error.
bool ParseArgs(const CommandSpec& cmd, const std::vector<std::string>& args, ParsedArgs* parsed,
               std::string* error) {
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      parsed->positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      parsed->help = true;
      continue;
    }
    std::string name = arg;
    std::string inline_value;
    bool has_inline_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
      has_inline_value = true;
    }
    const auto it = std::find_if(cmd.options.begin(), cmd.options.end(),
                                 [&](const OptionSpec& o) { return o.name == name; });
    if (it == cmd.options.end()) {
      *error = "unknown option " + name + " for '" + std::string(cmd.name) + "'";
      return false;
    }
    if (parsed->Has(name)) {
      *error = "option " + name + " given twice";
      return false;
    }
    if (it->value.empty()) {
      if (has_inline_value) {
        *error = "option " + name + " takes no value";
        return false;
      }
      parsed->flags.insert(name);
      continue;
    }
    if (has_inline_value) {
      parsed->values[name] = inline_value;
    } else if (i + 1 < args.size()) {
      parsed->values[name] = args[++i];
    } else {
      *error = "option " + name + " needs a value (" + std::string(it->value) + ")";
      return false;
    }
  }
  return true;
}

// Reads option `name` as an integer (bytes: with K/M/G/T suffixes). Returns false with `*error`
// set when present and malformed; leaves `*out` alone when absent.
bool OptionUint(const ParsedArgs& args, std::string_view name, bool bytes, uint64_t* out,
                std::string* error) {
  const std::string* text = args.Value(name);
  if (text == nullptr) return true;
  const bool ok = bytes ? ParseBytes(*text, out) : ParseUint(*text, out);
  if (!ok) {
    *error = std::string(name) + ": '" + *text + "' is not " +
             (bytes ? "a byte count (an integer, optionally with a K/M/G/T suffix)"
                    : "a non-negative integer");
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Store access

absl::StatusOr<std::unique_ptr<Engine>> OpenExisting(const std::string& path) {
  EngineOptions options;
  options.create_if_missing = false;
  return Engine::Open(options, path);
}

void WriteStatsJson(tools::JsonWriter& w, const EngineStats& s) {
  w.BeginObject()
      .Key("puts").Uint(s.puts)
      .Key("chunks_written").Uint(s.chunks_written)
      .Key("chunks_deduplicated").Uint(s.chunks_deduplicated)
      .Key("bytes_written").Uint(s.bytes_written)
      .Key("chunks_evicted").Uint(s.chunks_evicted)
      .Key("bytes_evicted").Uint(s.bytes_evicted)
      .Key("chunks_deleted").Uint(s.chunks_deleted)
      .Key("records_read").Uint(s.records_read)
      .Key("bytes_read").Uint(s.bytes_read)
      .Key("checksum_failures").Uint(s.checksum_failures)
      .Key("chunks").Uint(s.chunks)
      .Key("prefixes").Uint(s.prefixes)
      .Key("segments").Uint(s.segments)
      .Key("disk_bytes_used").Uint(s.disk_bytes_used)
      .Key("max_disk_bytes").Uint(s.max_disk_bytes)
      .Key("orphan_bytes_reclaimed").Uint(s.orphan_bytes_reclaimed)
      .EndObject();
}

// The spec of --model PRESET (required), --dtype, --chunk-tokens and --model-id, as put and
// replay take them. Returns false with `*error` set on a usage error.
bool PresetSpec(const ParsedArgs& args, ModelSpec* spec, std::string* error) {
  DType dtype = DType::kFp16;
  if (const std::string* text = args.Value("--dtype")) {
    auto parsed = ParseDType(*text);
    if (!parsed.ok()) {
      *error = "--dtype: '" + *text + "' is not fp16, bf16 or fp32";
      return false;
    }
    dtype = *parsed;
  }
  const std::string& preset = *args.Value("--model");
  const std::vector<std::string> presets = ModelSpec::PresetNames();
  if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
    std::string list;
    for (const std::string& p : presets) list += (list.empty() ? "" : ", ") + p;
    *error = "--model: unknown preset '" + preset + "' (known: " + list + ")";
    return false;
  }
  uint64_t chunk_tokens = 16;
  if (!OptionUint(args, "--chunk-tokens", false, &chunk_tokens, error)) return false;
  if (chunk_tokens == 0 || chunk_tokens > 4096) {
    *error = "--chunk-tokens: " + std::to_string(chunk_tokens) + " is out of range 1..4096";
    return false;
  }
  auto spec_or = ModelSpec::Preset(preset, dtype, static_cast<uint32_t>(chunk_tokens));
  if (!spec_or.ok()) {
    *error = std::string(spec_or.status().message());
    return false;
  }
  *spec = *std::move(spec_or);
  if (const std::string* id = args.Value("--model-id")) spec->model_id = *id;
  if (absl::Status valid = spec->Validate(); !valid.ok()) {
    *error = std::string(valid.message());
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Naming a stored prefix (export, show, rm)

// Checks and lower-cases a PREFIX argument: 1 to 32 hex digits, the id 'kvctl ls' prints (its
// first 16 digits) or any leading part of the full id. Returns false with `*error` set.
bool NormalizePrefixArg(std::string* wanted, std::string* error) {
  if (wanted->empty() || wanted->size() > 32 ||
      !std::all_of(wanted->begin(), wanted->end(),
                   [](unsigned char c) { return std::isxdigit(c) != 0; })) {
    *error = "PREFIX: '" + *wanted +
             "' is not a prefix id (1 to 32 hex digits, as 'kvctl ls' prints it)";
    return false;
  }
  std::transform(wanted->begin(), wanted->end(), wanted->begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return true;
}

// The one stored prefix whose id starts with `wanted` (normalized). Returns kExitOk with `*id`
// set, else prints the error and returns its exit code: 3 when none matches (the store does not
// hold it), 2 when several do (the argument is too short).
int FindPrefix(Engine& engine, const std::string& command, const std::string& store,
               const std::string& wanted, ChunkKey* id) {
  std::vector<ChunkKey> matches;
  for (const PrefixInfo& p : engine.ListPrefixes()) {
    if (p.id.ToHex().rfind(wanted, 0) == 0) matches.push_back(p.id);
  }
  if (matches.empty()) {
    return StoreError(command + " " + store,
                      absl::NotFoundError("no stored prefix id starts with " + wanted));
  }
  if (matches.size() > 1) {
    return UsageError(command, "PREFIX " + wanted + " is ambiguous: " +
                                   std::to_string(matches.size()) +
                                   " stored prefix ids start with it; give more digits");
  }
  *id = matches[0];
  return kExitOk;
}

// Options that several commands take.
const OptionSpec kModelOption = {
    "--model", "PRESET", "model shape: qwen2.5-0.5b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b"};
const OptionSpec kJsonOption = {"--json", "", "print one JSON object instead of text"};
const OptionSpec kDtypeOption = {"--dtype", "T", "element type: fp16 (default), bf16, fp32"};
const OptionSpec kPresetModelIdOption = {
    "--model-id", "ID", "model id bound into every chunk key (default: the preset name)"};
const OptionSpec kChunkTokensOption = {"--chunk-tokens", "C", "tokens per chunk (default 16)"};

// ---------------------------------------------------------------------------------------------
// kvctl init

const CommandSpec kInit = {
    "init",
    "init STORE [--max-disk-bytes N] [--layout layer-major|period-major]",
    "Create an empty store in directory STORE (the directory is created if missing).",
    "Fails (exit 3) when STORE already holds a store. The cap and the layout are persisted:\n"
    "later commands keep them.",
    {
        {"--max-disk-bytes", "N",
         "hard cap on segment bytes; K/M/G/T suffixes (powers of 1024); 0 = unlimited (default)"},
        {"--layout", "L", "record layout of segments: layer-major (default) or period-major"},
    },
};

int RunInit(const ParsedArgs& args) {
  std::string error;
  if (args.positional.size() != 1) return UsageError("init", "init needs exactly one STORE");
  const std::string& store = args.positional[0];
  EngineOptions options;
  options.create_if_missing = true;
  options.error_if_exists = true;
  uint64_t cap = 0;
  if (!OptionUint(args, "--max-disk-bytes", /*bytes=*/true, &cap, &error)) {
    return UsageError("init", error);
  }
  options.max_disk_bytes = cap;
  RecordLayout layout = RecordLayout::kLayerMajor;
  if (const std::string* text = args.Value("--layout")) {
    if (*text == "layer-major") {
      layout = RecordLayout::kLayerMajor;
    } else if (*text == "period-major") {
      layout = RecordLayout::kPeriodMajor;
    } else {
      return UsageError("init", "--layout: '" + *text + "' is not layer-major or period-major");
    }
  }
  options.layout = layout;

  auto engine = Engine::Open(options, store);
  if (absl::IsAlreadyExists(engine.status())) {
    std::fprintf(stderr, "kvctl: init %s: store already exists\n", store.c_str());
    return kExitStoreError;
  }
  if (!engine.ok()) return StoreError("init " + store, engine.status());
  std::printf("initialized store %s (layout %s, cap %s)\n", store.c_str(),
              layout == RecordLayout::kLayerMajor ? "layer-major" : "period-major",
              cap == 0 ? "unlimited" : FormatBytes(cap).c_str());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl put

const CommandSpec kPut = {
    "put",
    "put STORE --model PRESET --tokens N --seed S [--shared-tokens K --shared-seed S2]\n"
    "                 [--dtype fp16|bf16|fp32] [--model-id ID] [--chunk-tokens C] [--json]",
    "Store a synthetic prefix of N tokens and its KV (see docs/generator.md).",
    "Tokens come from --seed; with --shared-tokens K and --shared-seed S2 the first K tokens come\n"
    "from S2 instead, so prefixes that use the same S2 share their first K tokens, and the whole\n"
    "chunks among them are stored once (deduplicated). N must be a multiple of the chunk size.\n"
    "Example: kvctl put ./store --model qwen2.5-7b --tokens 4096 --seed 1",
    {
        kModelOption,
        {"--tokens", "N", "prefix length in tokens; a multiple of the chunk size"},
        {"--seed", "S", "seed of the tokens"},
        {"--shared-tokens", "K", "the first K tokens come from --shared-seed (K <= N)"},
        {"--shared-seed", "S2", "seed of the shared first K tokens"},
        kDtypeOption,
        kPresetModelIdOption,
        kChunkTokensOption,
        kJsonOption,
    },
};

// The KV of `tokens` (whole chunks only) laid out as ckv/kv.h says, generated record by record
// with synth::FillRecord so that generation can show progress. For whole chunks this is exactly
// what synth::SyntheticKv generates: a record is a pure function of (chunk key, layer, spec).
class GeneratedKv {
 public:
  // `progress`: show the generation's progress (see ProgressBar).
  GeneratedKv(const ModelSpec& spec, std::span<const int32_t> tokens, bool progress = true) {
    const size_t c = spec.chunk_tokens;
    const size_t chunks = tokens.size() / c;
    const size_t token_bytes = spec.TokenBytesPerLayer();
    const size_t half = c * token_bytes;  // bytes of K (or V) of one chunk at one layer
    const std::vector<ChunkKey> keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    const size_t tensor_bytes = tokens.size() * token_bytes;
    total_bytes_ = 2 * tensor_bytes * spec.layers;

    std::optional<ProgressBar> bar;
    if (progress) bar.emplace("generate", total_bytes_);
    std::vector<std::byte> record(spec.RecordBytes());
    tensors_.tokens = tokens.size();
    uint64_t done = 0;
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      k_.push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
      v_.push_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes));
      std::byte* k = k_.back().get();
      std::byte* v = v_.back().get();
      for (size_t i = 0; i < chunks; ++i) {
        synth::FillRecord(spec, keys[i], layer, record);
        std::memcpy(k + i * half, record.data(), half);
        std::memcpy(v + i * half, record.data() + half, half);
        done += record.size();
        if (bar) bar->Update(done);
      }
      tensors_.k.emplace_back(k, tensor_bytes);
      tensors_.v.emplace_back(v, tensor_bytes);
    }
    if (bar) bar->Finish();
  }

  const KvTensors& tensors() const { return tensors_; }
  uint64_t bytes() const { return total_bytes_; }

 private:
  std::vector<std::unique_ptr<std::byte[]>> k_, v_;
  KvTensors tensors_;
  uint64_t total_bytes_ = 0;
};

int RunPut(const ParsedArgs& args) {
  std::string error;
  if (args.positional.size() != 1) return UsageError("put", "put needs exactly one STORE");
  const std::string& store = args.positional[0];
  for (std::string_view required : {"--model", "--tokens", "--seed"}) {
    if (!args.Has(required)) return UsageError("put", "put needs " + std::string(required));
  }
  if (args.Has("--shared-tokens") != args.Has("--shared-seed")) {
    return UsageError("put", "--shared-tokens and --shared-seed go together");
  }
  uint64_t tokens_n = 0, seed = 0, shared_tokens = 0, shared_seed = 0;
  if (!OptionUint(args, "--tokens", false, &tokens_n, &error) ||
      !OptionUint(args, "--seed", false, &seed, &error) ||
      !OptionUint(args, "--shared-tokens", false, &shared_tokens, &error) ||
      !OptionUint(args, "--shared-seed", false, &shared_seed, &error)) {
    return UsageError("put", error);
  }
  ModelSpec spec;
  if (!PresetSpec(args, &spec, &error)) return UsageError("put", error);
  const std::string& preset = *args.Value("--model");
  if (tokens_n == 0 || tokens_n % spec.chunk_tokens != 0) {
    return UsageError("put", "--tokens: " + std::to_string(tokens_n) +
                                 " is not a positive multiple of the chunk size " +
                                 std::to_string(spec.chunk_tokens));
  }
  // Keep the generated KV addressable (and sane) on any host: 1 TiB of KV is far past a demo.
  if (tokens_n > (uint64_t{1} << 40) / spec.KvBytesPerToken()) {
    return UsageError("put", "--tokens: " + std::to_string(tokens_n) +
                                 " tokens would need more than 1 TiB of KV");
  }
  if (shared_tokens > tokens_n) {
    return UsageError("put", "--shared-tokens " + std::to_string(shared_tokens) +
                                 " is more than --tokens " + std::to_string(tokens_n));
  }
  const bool json = args.Has("--json");

  // Open first: a missing store is reported before generating gigabytes.
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());

  const auto gen_start = Clock::now();
  const std::vector<int32_t> tokens =
      args.Has("--shared-tokens")
          ? synth::TokensWithSharedPrefix(shared_seed, shared_tokens, seed, tokens_n)
          : synth::Tokens(seed, tokens_n);
  GeneratedKv kv(spec, tokens);
  const double gen_seconds = SecondsSince(gen_start);

  const auto put_start = Clock::now();
  absl::StatusOr<PutResult> result;
  {
    ElapsedTicker ticker("write " + FormatBytes(kv.bytes()));
    result = (*engine)->Put(spec, tokens, kv.tensors());
  }
  const double put_seconds = SecondsSince(put_start);
  if (!result.ok()) return StoreError("put " + store, result.status());

  if (json) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("prefix_id").String(result->prefix_id.ToHex())
        .Key("model").String(preset)
        .Key("model_id").String(spec.model_id)
        .Key("dtype").String(DTypeName(spec.dtype))
        .Key("chunk_tokens").Uint(spec.chunk_tokens)
        .Key("tokens").Uint(tokens_n)
        .Key("seed").Uint(seed);
    if (args.Has("--shared-tokens")) {
      w.Key("shared_tokens").Uint(shared_tokens).Key("shared_seed").Uint(shared_seed);
    }
    w.Key("kv_bytes").Uint(kv.bytes())
        .Key("chunks").Uint(result->chunks)
        .Key("chunks_written").Uint(result->chunks_written)
        .Key("chunks_deduplicated").Uint(result->chunks_existing)
        .Key("tail_tokens").Uint(result->tail_tokens)
        .Key("bytes_written").Uint(result->bytes_written)
        .Key("chunks_evicted").Uint(result->chunks_evicted)
        .Key("generate_seconds").Double(gen_seconds)
        .Key("put_seconds").Double(put_seconds)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("put %s: %s, %llu tokens (%llu chunks)\n", result->prefix_id.ToHex().c_str(),
              spec.DebugString().c_str(), static_cast<unsigned long long>(tokens_n),
              static_cast<unsigned long long>(result->chunks));
  std::printf("  chunks written       %llu (%s)\n",
              static_cast<unsigned long long>(result->chunks_written),
              FormatBytes(result->bytes_written).c_str());
  std::printf("  chunks deduplicated  %llu (already stored)\n",
              static_cast<unsigned long long>(result->chunks_existing));
  std::printf("  chunks evicted       %llu\n", static_cast<unsigned long long>(result->chunks_evicted));
  std::printf("  time                 generate %.2fs, put %.2fs (%s)\n", gen_seconds, put_seconds,
              FormatRate(put_seconds > 0 ? static_cast<double>(result->bytes_written) / put_seconds
                                         : 0)
                  .c_str());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl ls

const CommandSpec kLs = {
    "ls",
    "ls STORE [--json]",
    "List the stored prefixes, newest first, with totals and disk use.",
    "BYTES counts every chunk of a prefix, so chunks shared by several prefixes are counted in\n"
    "each; the footer's disk figure counts them once.",
    {
        {"--json", "", "print one JSON object instead of a table"},
    },
};

int RunLs(const ParsedArgs& args) {
  if (args.positional.size() != 1) return UsageError("ls", "ls needs exactly one STORE");
  const std::string& store = args.positional[0];
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  const std::vector<PrefixInfo> prefixes = (*engine)->ListPrefixes();
  const EngineStats stats = (*engine)->Stats();
  uint64_t total_tokens = 0, total_chunks = 0, total_bytes = 0;
  for (const PrefixInfo& p : prefixes) {
    total_tokens += p.tokens;
    total_chunks += p.chunks;
    total_bytes += p.bytes;
  }

  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject().Key("store").String(store).Key("prefixes").BeginArray();
    for (const PrefixInfo& p : prefixes) {
      w.BeginObject()
          .Key("id").String(p.id.ToHex())
          .Key("model_id").String(p.model_id)
          .Key("model_fingerprint").String(p.model_fingerprint.ToHex())
          .Key("tokens").Uint(p.tokens)
          .Key("chunks").Uint(p.chunks)
          .Key("bytes").Uint(p.bytes)
          .Key("created_unix_ms").Int(p.created_unix_ms)
          .Key("created").String(FormatIsoUtc(p.created_unix_ms))
          .EndObject();
    }
    w.EndArray()
        .Key("totals").BeginObject()
        .Key("prefixes").Uint(prefixes.size())
        .Key("tokens").Uint(total_tokens)
        .Key("chunks").Uint(total_chunks)
        .Key("bytes").Uint(total_bytes)
        .Key("stored_chunks").Uint(stats.chunks)
        .Key("disk_bytes_used").Uint(stats.disk_bytes_used)
        .Key("max_disk_bytes").Uint(stats.max_disk_bytes)
        .EndObject()
        .Key("stats");
    WriteStatsJson(w, stats);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }

  std::printf("%-16s  %-24s  %10s  %8s  %11s  %s\n", "PREFIX", "MODEL", "TOKENS", "CHUNKS",
              "BYTES", "CREATED");
  for (const PrefixInfo& p : prefixes) {
    std::string model = p.model_id;
    if (model.size() > 24) model = model.substr(0, 23) + "~";
    std::printf("%-16s  %-24s  %10llu  %8llu  %11s  %s\n", p.id.ToHex().substr(0, 16).c_str(),
                model.c_str(), static_cast<unsigned long long>(p.tokens),
                static_cast<unsigned long long>(p.chunks), FormatBytes(p.bytes).c_str(),
                FormatLocalTime(p.created_unix_ms).c_str());
  }
  std::printf("%zu prefix%s, %llu tokens, %llu chunks, %s (shared chunks counted per prefix)\n",
              prefixes.size(), prefixes.size() == 1 ? "" : "es",
              static_cast<unsigned long long>(total_tokens),
              static_cast<unsigned long long>(total_chunks), FormatBytes(total_bytes).c_str());
  std::string cap = "unlimited";
  if (stats.max_disk_bytes > 0) {
    char pct[32];
    std::snprintf(pct, sizeof(pct), " (%.1f%% used)",
                  100.0 * static_cast<double>(stats.disk_bytes_used) /
                      static_cast<double>(stats.max_disk_bytes));
    cap = FormatBytes(stats.max_disk_bytes) + pct;
  }
  std::printf("stored: %llu chunks in %llu segment%s; disk used %s, cap %s\n",
              static_cast<unsigned long long>(stats.chunks),
              static_cast<unsigned long long>(stats.segments), stats.segments == 1 ? "" : "s",
              FormatBytes(stats.disk_bytes_used).c_str(), cap.c_str());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl verify

const CommandSpec kVerify = {
    "verify",
    "verify STORE [--synthetic | --repair] [--json]",
    "Read back every record, check its checksum, and check the catalog.",
    "Exit 0 when clean, 1 when a problem was found (each is listed), 3 when the check could not\n"
    "run. With --synthetic, also compare every record byte for byte with what the synthetic\n"
    "generator makes for its chunk key (for stores that kvctl put populated).\n"
    "With --repair, also remove what is corrupt (Engine::Repair): each chunk that failed a check\n"
    "and every chunk after it in its prefixes (a chunk's KV depends on all before it); a prefix\n"
    "that ran through one then ends at the last good chunk, under a new id. It lists what it\n"
    "removed and what it left (read errors may pass, so they are not repaired). The exit code\n"
    "is still 1 when a problem was found, repaired or not; run verify again to see it clean.\n"
    "Example: kvctl verify ./store --repair",
    {
        {"--synthetic", "", "also compare every record with the synthetic generator"},
        {"--repair", "", "remove the corrupt chunks (and those after them) from the store"},
        kJsonOption,
    },
};

struct ContentReport {
  uint64_t records_compared = 0;
  uint64_t bytes_compared = 0;
  std::vector<std::string> problems;
};

// Reads every record of every stored prefix once and compares it with synth::FillRecord.
absl::StatusOr<ContentReport> CompareWithGenerator(Engine& engine) {
  ContentReport report;
  struct Work {
    ChunkKey prefix;
    ModelSpec spec;
    std::vector<ChunkKey> chunks;
  };
  std::vector<Work> work;
  uint64_t total_bytes = 0;
  std::set<std::pair<ChunkKey, ChunkKey>> seen;  // (fingerprint, chunk): shared chunks once
  for (const PrefixInfo& p : engine.ListPrefixes()) {
    Work w;
    w.prefix = p.id;
    auto chunks = engine.PrefixChunks(p.id, &w.spec);
    if (absl::IsNotFound(chunks.status())) continue;  // evicted or deleted meanwhile
    if (!chunks.ok()) return chunks.status();
    const ChunkKey fingerprint = w.spec.Fingerprint();
    for (const ChunkKey& key : *chunks) {
      if (seen.insert({fingerprint, key}).second) w.chunks.push_back(key);
    }
    total_bytes += static_cast<uint64_t>(w.chunks.size()) * w.spec.layers * w.spec.RecordBytes();
    work.push_back(std::move(w));
  }

  ProgressBar bar("compare", total_bytes);
  uint64_t done = 0;
  for (const Work& w : work) {
    std::vector<std::byte> stored(w.spec.RecordBytes()), expected(w.spec.RecordBytes());
    for (size_t i = 0; i < w.chunks.size(); ++i) {
      for (uint32_t layer = 0; layer < w.spec.layers; ++layer) {
        const absl::Status read = engine.ReadRecord(w.spec, w.chunks[i], layer, stored);
        done += stored.size();
        bar.Update(done);
        if (absl::IsNotFound(read)) continue;  // evicted meanwhile
        // A checksum mismatch is already among Verify's problems: do not list it twice.
        if (absl::IsDataLoss(read)) continue;
        if (!read.ok()) {
          report.problems.push_back("record " + w.chunks[i].ToHex() + "/L" +
                                    std::to_string(layer) + " of prefix " + w.prefix.ToHex() +
                                    ": " + read.ToString());
          continue;
        }
        synth::FillRecord(w.spec, w.chunks[i], layer, expected);
        ++report.records_compared;
        report.bytes_compared += stored.size();
        if (stored != expected) {
          const auto mismatch = std::mismatch(stored.begin(), stored.end(), expected.begin());
          report.problems.push_back(
              "record " + w.chunks[i].ToHex() + "/L" + std::to_string(layer) + " of prefix " +
              w.prefix.ToHex() + " (chunk " + std::to_string(i) + "): differs from the generator at byte " +
              std::to_string(mismatch.first - stored.begin()));
        }
      }
    }
  }
  bar.Finish();
  return report;
}

int RunVerify(const ParsedArgs& args) {
  if (args.positional.size() != 1) return UsageError("verify", "verify needs exactly one STORE");
  const std::string& store = args.positional[0];
  const bool repair = args.Has("--repair");
  if (repair && args.Has("--synthetic")) {
    return UsageError("verify", "--repair and --synthetic do not go together (repair acts on "
                                "checksums and the catalog only)");
  }
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());

  const auto start = Clock::now();
  absl::StatusOr<VerifyReport> report;
  std::optional<RepairReport> repaired;
  {
    uint64_t last_total = 0;
    std::unique_ptr<ProgressBar> sized;
    const ProgressFn progress = [&](uint64_t done, uint64_t total) {
      if (!sized || total != last_total) {
        sized = std::make_unique<ProgressBar>(repair ? "repair" : "verify", total);
        last_total = total;
      }
      sized->Update(done);
    };
    if (repair) {
      absl::StatusOr<RepairReport> r = (*engine)->Repair(progress);
      if (r.ok()) {
        repaired = *std::move(r);
        report = repaired->verify;
      } else {
        report = r.status();
      }
    } else {
      report = (*engine)->Verify(progress);
    }
    if (sized) sized->Finish();
  }
  if (!report.ok()) return StoreError((repair ? "repair " : "verify ") + store, report.status());
  std::vector<std::string> problems = report->problems;

  ContentReport content;
  const bool synthetic = args.Has("--synthetic");
  if (synthetic) {
    auto compared = CompareWithGenerator(**engine);
    if (!compared.ok()) return StoreError("verify " + store, compared.status());
    content = *std::move(compared);
    problems.insert(problems.end(), content.problems.begin(), content.problems.end());
  }
  const double seconds = SecondsSince(start);

  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("ok").Bool(problems.empty())
        .Key("chunks_checked").Uint(report->chunks_checked)
        .Key("records_checked").Uint(report->records_checked)
        .Key("bytes_checked").Uint(report->bytes_checked)
        .Key("checksum_failures").Uint(report->checksum_failures);
    if (synthetic) {
      w.Key("records_compared").Uint(content.records_compared)
          .Key("bytes_compared").Uint(content.bytes_compared);
    }
    w.Key("seconds").Double(seconds).Key("problems").BeginArray();
    for (const std::string& p : problems) w.String(p);
    w.EndArray();
    if (repaired) {
      w.Key("repair").BeginObject().Key("chunks_removed").Uint(repaired->chunks_removed);
      w.Key("removed").BeginArray();
      for (const std::string& r : repaired->removed) w.String(r);
      w.EndArray().Key("remaining").BeginArray();
      for (const std::string& r : repaired->remaining) w.String(r);
      w.EndArray().EndObject();
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("verified %s: %llu chunks, %llu records, %s in %.2fs; %llu checksum failure%s\n",
                store.c_str(), static_cast<unsigned long long>(report->chunks_checked),
                static_cast<unsigned long long>(report->records_checked),
                FormatBytes(report->bytes_checked).c_str(), seconds,
                static_cast<unsigned long long>(report->checksum_failures),
                report->checksum_failures == 1 ? "" : "s");
    if (synthetic) {
      std::printf("compared %llu records (%s) with the synthetic generator\n",
                  static_cast<unsigned long long>(content.records_compared),
                  FormatBytes(content.bytes_compared).c_str());
    }
    if (problems.empty()) {
      std::printf("clean\n");
    } else {
      std::printf("%zu problem%s:\n", problems.size(), problems.size() == 1 ? "" : "s");
      for (const std::string& p : problems) std::printf("  %s\n", p.c_str());
    }
    if (repaired && !problems.empty()) {
      std::printf("repair removed %llu chunk%s:\n",
                  static_cast<unsigned long long>(repaired->chunks_removed),
                  repaired->chunks_removed == 1 ? "" : "s");
      for (const std::string& r : repaired->removed) std::printf("  %s\n", r.c_str());
      if (repaired->remaining.empty()) {
        std::printf("nothing left to repair\n");
      } else {
        std::printf("left as it was (%zu):\n", repaired->remaining.size());
        for (const std::string& r : repaired->remaining) std::printf("  %s\n", r.c_str());
      }
    }
  }
  return problems.empty() ? kExitOk : kExitProblems;
}

// ---------------------------------------------------------------------------------------------
// kvctl import

const CommandSpec kImport = {
    "import",
    "import STORE FILE (--model PRESET | --spec SPEC.json) [--model-id ID]\n"
    "                 [--tokens-file F] [--json]",
    "Store the KV of a prefix read from a safetensors file.",
    "FILE holds token_ids (I32 or I64, [tokens]) and, for every layer l of the model,\n"
    "layers.{l}.key and layers.{l}.value, each [tokens, kv_heads, head_dim] or each\n"
    "[kv_heads, tokens, head_dim] (detected from the shapes; tokens-first when tokens ==\n"
    "kv_heads), all F16, all BF16 or all F32. The whole chunks are stored (those stored already\n"
    "are not written again); a tail shorter than a chunk is not.\n"
    "What the options leave open comes from FILE: the dtype from its tensors, the model id and\n"
    "the chunk size from its __metadata__ (as 'kvctl export' writes them), else the preset's\n"
    "name and 16. A --spec file is a JSON object of ModelSpec's fields: model_id, layers,\n"
    "q_heads, kv_heads, head_dim (required), dtype and chunk_tokens (optional; a dtype given\n"
    "must be FILE's). With --tokens-file the token ids come from F, a JSON array of integers,\n"
    "and FILE must hold no token_ids. A malformed FILE, spec or token file exits 3 with the\n"
    "store unchanged. The prefix's whole KV is held in memory while it is stored (about\n"
    "FILE's size; the store takes a prefix in one Put).\n"
    "Example: kvctl import ./store prefix.safetensors --model qwen2.5-7b",
    {
        kModelOption,
        {"--spec", "SPEC.json", "model shape from a JSON spec file instead of a preset"},
        {"--model-id", "ID", "model id bound into every chunk key (default: see above)"},
        {"--tokens-file", "F", "token ids from F, a JSON array of integers"},
        kJsonOption,
    },
};

// A ProgressBar for a callback that reports its total with every call.
class ProgressFnBar {
 public:
  explicit ProgressFnBar(std::string label) : label_(std::move(label)) {}
  ProgressFn fn() {
    return [this](uint64_t done, uint64_t total) {
      if (!bar_) bar_ = std::make_unique<ProgressBar>(label_, total);
      bar_->Update(done);
    };
  }
  void Finish() {
    if (bar_) bar_->Finish();
  }

 private:
  std::string label_;
  std::unique_ptr<ProgressBar> bar_;
};

int RunImport(const ParsedArgs& args) {
  if (args.positional.size() != 2) return UsageError("import", "import needs STORE and FILE");
  const std::string& store = args.positional[0];
  const std::string& file = args.positional[1];
  if (args.Has("--model") == args.Has("--spec")) {
    return UsageError("import", "import needs one of --model and --spec");
  }
  // The spec, and which of its fields the file may fill in (see kImport's details).
  tools::ModelSpecJson given;
  if (const std::string* preset = args.Value("--model")) {
    auto spec = ModelSpec::Preset(*preset);
    if (!spec.ok()) return UsageError("import", "--model: " + std::string(spec.status().message()));
    given.spec = *std::move(spec);
  } else {
    auto spec = tools::ReadModelSpecFile(*args.Value("--spec"));
    if (!spec.ok()) return StoreError("import --spec", spec.status());
    given = *std::move(spec);
  }
  safetensors::ImportOptions options;
  options.dtype_from_file = !given.has_dtype;
  options.chunk_tokens_from_file = !given.has_chunk_tokens;
  options.model_id_from_file = args.Has("--model");
  if (const std::string* id = args.Value("--model-id")) {
    given.spec.model_id = *id;
    options.model_id_from_file = false;
    if (absl::Status valid = given.spec.Validate(); !valid.ok()) {
      return UsageError("import", "--model-id: " + std::string(valid.message()));
    }
  }
  const bool json = args.Has("--json");

  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  if (const std::string* path = args.Value("--tokens-file")) {
    auto ids = safetensors::ReadTokenIdsFile(*path);
    if (!ids.ok()) return StoreError("import --tokens-file", ids.status());
    options.token_ids = *std::move(ids);
  }

  const auto read_start = Clock::now();
  auto reader = safetensors::Reader::OpenFile(file);
  if (!reader.ok()) return StoreError("import " + file, reader.status());
  ProgressFnBar bar("read");
  options.progress = bar.fn();
  auto imported = safetensors::ImportKv(**reader, given.spec, options);
  bar.Finish();
  if (!imported.ok()) return StoreError("import " + file, imported.status());
  const double read_seconds = SecondsSince(read_start);
  const ModelSpec& spec = imported->spec;
  const uint64_t tokens = imported->token_ids.size();
  const uint64_t kv_bytes = tokens * spec.KvBytesPerToken();

  const auto put_start = Clock::now();
  absl::StatusOr<PutResult> result;
  {
    ElapsedTicker ticker("write " + FormatBytes(kv_bytes));
    result = (*engine)->Put(spec, imported->token_ids, imported->kv);
  }
  const double put_seconds = SecondsSince(put_start);
  if (!result.ok()) return StoreError("import " + file, result.status());

  const bool heads_first = imported->file_layout == safetensors::KvLayout::kHeadsFirst;
  if (json) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("file").String(file)
        .Key("prefix_id").String(result->prefix_id.ToHex())
        .Key("model_id").String(spec.model_id)
        .Key("dtype").String(DTypeName(spec.dtype))
        .Key("chunk_tokens").Uint(spec.chunk_tokens)
        .Key("tokens").Uint(tokens)
        .Key("layout").String(heads_first ? "heads-first" : "tokens-first")
        .Key("layout_ambiguous").Bool(imported->layout_ambiguous)
        .Key("kv_bytes").Uint(kv_bytes)
        .Key("chunks").Uint(result->chunks)
        .Key("chunks_written").Uint(result->chunks_written)
        .Key("chunks_deduplicated").Uint(result->chunks_existing)
        .Key("tail_tokens").Uint(result->tail_tokens)
        .Key("bytes_written").Uint(result->bytes_written)
        .Key("chunks_evicted").Uint(result->chunks_evicted)
        .Key("read_seconds").Double(read_seconds)
        .Key("put_seconds").Double(put_seconds)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("imported %s from %s: %s, %llu tokens (%llu chunks)\n",
              result->prefix_id.ToHex().c_str(), file.c_str(), spec.DebugString().c_str(),
              static_cast<unsigned long long>(tokens),
              static_cast<unsigned long long>(result->chunks));
  std::printf("  chunks written       %llu (%s)\n",
              static_cast<unsigned long long>(result->chunks_written),
              FormatBytes(result->bytes_written).c_str());
  std::printf("  chunks deduplicated  %llu (already stored)\n",
              static_cast<unsigned long long>(result->chunks_existing));
  std::printf("  tail tokens          %llu (not stored: less than a chunk)\n",
              static_cast<unsigned long long>(result->tail_tokens));
  std::printf("  chunks evicted       %llu\n",
              static_cast<unsigned long long>(result->chunks_evicted));
  std::printf("  layout               %s%s\n",
              heads_first ? "[kv_heads, tokens, head_dim], transposed"
                          : "[tokens, kv_heads, head_dim]",
              imported->layout_ambiguous
                  ? " (tokens == kv_heads: both layouts fit; read as tokens-first)"
                  : "");
  std::printf("  time                 read %.2fs, put %.2fs (%s)\n", read_seconds, put_seconds,
              FormatRate(put_seconds > 0 ? static_cast<double>(result->bytes_written) / put_seconds
                                         : 0)
                  .c_str());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl export

const CommandSpec kExport = {
    "export",
    "export STORE PREFIX OUT.safetensors [--json]",
    "Write a stored prefix's token ids and KV to a safetensors file.",
    "PREFIX is a prefix id as 'kvctl ls' prints it (its first 16 hex digits), or any leading\n"
    "part of the full id ('kvctl ls --json' prints it whole) that names one stored prefix.\n"
    "Every record is read with its checksum verified. OUT holds token_ids (I32 [tokens]) and,\n"
    "for every layer l, layers.{l}.key and layers.{l}.value ([tokens, kv_heads, head_dim] in\n"
    "the store's dtype), with the model id, dtype and chunk size in its __metadata__: 'kvctl\n"
    "import' stores it back as the same chunks. OUT is written as OUT.tmp, synced, and renamed.\n"
    "The prefix's whole KV is held in memory while OUT is written (about OUT's size).\n"
    "Example: kvctl export ./store 9f3c0a17b2d4e6f8 prefix.safetensors",
    {
        kJsonOption,
    },
};

// The token ids of the chunks `keys` of a prefix stored under `spec`, from the catalog of the
// store at `store`. The Engine API does not return token ids, so export reads them here, with
// the Engine closed (RocksDB admits one opener at a time). Chunk keys hash the tokens, so the
// ids are checked against the keys: they are the ones the records were stored under.
absl::StatusOr<std::vector<int32_t>> ReadPrefixTokens(const std::string& store,
                                                      const ModelSpec& spec,
                                                      const std::vector<ChunkKey>& keys) {
  storage::Catalog::Contents contents;
  // The catalog's directory in a store: docs/format.md.
  auto catalog = storage::Catalog::Open(store + "/catalog", /*create_if_missing=*/false,
                                        /*error_if_exists=*/false, &contents);
  if (!catalog.ok()) return catalog.status();
  std::vector<int32_t> tokens;
  tokens.reserve(keys.size() * spec.chunk_tokens);
  for (const ChunkKey& key : keys) {
    auto chunk = (*catalog)->GetChunk(key);
    if (!chunk.ok()) return chunk.status();
    tokens.insert(tokens.end(), chunk->tokens.begin(), chunk->tokens.end());
  }
  if (ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens) != keys) {
    return absl::DataLossError("the catalog's token ids of prefix " + keys.back().ToHex() +
                               " do not hash to its chunk keys");
  }
  return tokens;
}

int RunExport(const ParsedArgs& args) {
  if (args.positional.size() != 3) {
    return UsageError("export", "export needs STORE, PREFIX and OUT.safetensors");
  }
  const std::string& store = args.positional[0];
  std::string wanted = args.positional[1];
  const std::string& out = args.positional[2];
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("export", error);
  const bool json = args.Has("--json");
  // Fail before reading the whole prefix when OUT cannot be written where it is asked for.
  {
    std::error_code ec;
    std::string dir = std::filesystem::path(out).parent_path().string();
    if (dir.empty()) dir = ".";
    if (!std::filesystem::is_directory(dir, ec)) {
      return StoreError("export " + out,
                        absl::NotFoundError("directory " + dir + " does not exist"));
    }
    if (std::filesystem::is_directory(out, ec)) {
      return StoreError("export " + out,
                        absl::InvalidArgumentError(out + " is a directory, not a file name"));
    }
  }

  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  ChunkKey prefix_id;
  if (const int code = FindPrefix(**engine, "export", store, wanted, &prefix_id); code != kExitOk) {
    return code;
  }
  ModelSpec spec;
  auto keys = (*engine)->PrefixChunks(prefix_id, &spec);
  if (!keys.ok()) return StoreError("export " + prefix_id.ToHex(), keys.status());

  // K and V of every layer, [tokens, kv_heads, head_dim], from the records (K then V of one
  // chunk at one layer). Layer by layer: a layer's records of consecutive chunks are adjacent in
  // layer-major segments.
  const auto read_start = Clock::now();
  const size_t tokens = keys->size() * spec.chunk_tokens;
  const size_t half = spec.RecordBytes() / 2;
  const size_t tensor_bytes = tokens * spec.TokenBytesPerLayer();
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  KvTensors kv;
  kv.tokens = tokens;
  std::vector<std::byte> record(spec.RecordBytes());
  {
    ProgressBar bar("read", uint64_t{spec.layers} * keys->size() * record.size());
    uint64_t done = 0;
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      std::byte* k =
          buffers.emplace_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes)).get();
      std::byte* v =
          buffers.emplace_back(std::make_unique_for_overwrite<std::byte[]>(tensor_bytes)).get();
      for (size_t i = 0; i < keys->size(); ++i) {
        const absl::Status read = (*engine)->ReadRecord(spec, (*keys)[i], layer, record);
        if (!read.ok()) {
          return StoreError("export " + prefix_id.ToHex() + ": record " + std::to_string(i) +
                                "/L" + std::to_string(layer),
                            read);
        }
        std::memcpy(k + i * half, record.data(), half);
        std::memcpy(v + i * half, record.data() + half, half);
        done += record.size();
        bar.Update(done);
      }
      kv.k.emplace_back(k, tensor_bytes);
      kv.v.emplace_back(v, tensor_bytes);
    }
  }
  engine->reset();  // ReadPrefixTokens opens the catalog
  auto token_ids = ReadPrefixTokens(store, spec, *keys);
  if (!token_ids.ok()) return StoreError("export " + prefix_id.ToHex(), token_ids.status());
  const double read_seconds = SecondsSince(read_start);

  const auto write_start = Clock::now();
  ProgressFnBar bar("write");
  const absl::Status written = safetensors::ExportKv(out, spec, *token_ids, kv, bar.fn());
  bar.Finish();
  if (!written.ok()) return StoreError("export " + out, written);
  const double write_seconds = SecondsSince(write_start);
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(out, ec);

  if (json) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("prefix_id").String(prefix_id.ToHex())
        .Key("file").String(out)
        .Key("model_id").String(spec.model_id)
        .Key("dtype").String(DTypeName(spec.dtype))
        .Key("chunk_tokens").Uint(spec.chunk_tokens)
        .Key("tokens").Uint(tokens)
        .Key("chunks").Uint(keys->size())
        .Key("kv_bytes").Uint(2 * uint64_t{spec.layers} * tensor_bytes)
        .Key("file_bytes").Uint(file_bytes)
        .Key("read_seconds").Double(read_seconds)
        .Key("write_seconds").Double(write_seconds)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("exported %s to %s: %s, %zu tokens (%zu chunks), %s\n", prefix_id.ToHex().c_str(),
              out.c_str(), spec.DebugString().c_str(), tokens, keys->size(),
              FormatBytes(file_bytes).c_str());
  std::printf("  time                 read %.2fs, write %.2fs\n", read_seconds, write_seconds);
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl show

const CommandSpec kShow = {
    "show",
    "show STORE PREFIX [--json]",
    "Show a prefix's chunks: where each lives, its S = I x F, and a heat strip of I.",
    "PREFIX as for 'kvctl export'. Per chunk: its key, segment file and slot, the byte offset of\n"
    "its layer-0 record in that file, and its score S = I x F (I: attention importance, F:\n"
    "loads, both added by Re-Prefill sessions; 0 in a store no session has read). The heat strip\n"
    "draws I along the prefix, one character per chunk from ' ' (0) through .:-=+*#%@ (the\n"
    "prefix's largest I), wrapped to the terminal's width (64 columns when not a terminal).\n"
    "Tier: at rest every chunk lives on NVMe (its segment). The GPU and CPU tiers exist only in\n"
    "a serving process, so show has no tier column; 'kvctl stats --gpu-tier-bytes' shows which\n"
    "chunks the ranking would keep in them.\n"
    "Example: kvctl show ./store 9f3c0a17b2d4e6f8",
    {
        kJsonOption,
    },
};

// Columns for the heat strip: the terminal's width when stdout is one, else 64.
size_t StripColumns() {
  struct winsize ws;
  if (isatty(STDOUT_FILENO) == 1 && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    return ws.ws_col;
  }
  return 64;
}

// One character per value: ' ' for 0, else one of .:-=+*#%@ in proportion to `max`.
std::string HeatStrip(const std::vector<double>& values, double max) {
  static constexpr std::string_view kLevels = " .:-=+*#%@";
  std::string strip;
  strip.reserve(values.size());
  for (double v : values) {
    if (!(v > 0) || !(max > 0)) {
      strip += ' ';
      continue;
    }
    const double f = std::min(1.0, v / max);
    const size_t level = 1 + static_cast<size_t>(f * static_cast<double>(kLevels.size() - 2) + 0.5);
    strip += kLevels[std::min(level, kLevels.size() - 1)];
  }
  return strip;
}

// "segments/seg-00000001.ckv": where docs/format.md puts segment `id` in a store.
std::string SegmentFile(uint32_t id) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "segments/seg-%08u.ckv", id);
  return buf;
}

int RunShow(const ParsedArgs& args) {
  if (args.positional.size() != 2) return UsageError("show", "show needs STORE and PREFIX");
  const std::string& store = args.positional[0];
  std::string wanted = args.positional[1];
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("show", error);
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  ChunkKey prefix_id;
  if (const int code = FindPrefix(**engine, "show", store, wanted, &prefix_id); code != kExitOk) {
    return code;
  }
  auto d = (*engine)->DescribePrefix(prefix_id);
  if (!d.ok()) return StoreError("show " + prefix_id.ToHex(), d.status());
  const ModelSpec& spec = d->spec;
  std::vector<double> importance;
  double max_i = 0;
  uint64_t bytes = 0;
  for (const ChunkPlacement& c : d->chunks) {
    importance.push_back(c.importance);
    max_i = std::max(max_i, c.importance);
    bytes += c.bytes;
  }
  const std::string strip = HeatStrip(importance, max_i);

  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("prefix_id").String(prefix_id.ToHex())
        .Key("model_id").String(spec.model_id)
        .Key("dtype").String(DTypeName(spec.dtype))
        .Key("layers").Uint(spec.layers)
        .Key("chunk_tokens").Uint(spec.chunk_tokens)
        .Key("tokens").Uint(d->chunks.size() * spec.chunk_tokens)
        .Key("bytes").Uint(bytes)
        .Key("max_importance").Double(max_i)
        .Key("heat").String(strip)
        .Key("chunks").BeginArray();
    for (size_t i = 0; i < d->chunks.size(); ++i) {
      const ChunkPlacement& c = d->chunks[i];
      w.BeginObject()
          .Key("index").Uint(i)
          .Key("key").String(c.key.ToHex())
          .Key("tier").String("nvme")
          .Key("segment").Uint(c.segment)
          .Key("segment_file").String(SegmentFile(c.segment))
          .Key("slot").Uint(c.slot)
          .Key("offset").Uint(c.offset)
          .Key("bytes").Uint(c.bytes)
          .Key("importance").Double(c.importance)
          .Key("loads").Uint(c.loads)
          .Key("score").Double(c.score())
          .EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("prefix %s: %s, %zu tokens (%zu chunks), %s\n", prefix_id.ToHex().c_str(),
              spec.DebugString().c_str(), d->chunks.size() * spec.chunk_tokens, d->chunks.size(),
              FormatBytes(bytes).c_str());
  std::printf("tier: all on NVMe (GPU and CPU tiers exist only in a serving process)\n\n");
  std::printf("importance I along the prefix, one character per chunk (max I %.4g%s):\n", max_i,
              max_i > 0 ? "" : "; no session has read this prefix");
  const size_t margin = 9;  // "%6zu |" before the strip and "|" after it
  const size_t width = StripColumns();
  const size_t columns = width > margin + 8 ? width - margin : 8;
  for (size_t at = 0; at < strip.size(); at += columns) {
    std::printf("%6zu |%s|\n", at, strip.substr(at, columns).c_str());
  }
  std::printf("\n%6s  %-16s  %-26s  %6s  %14s  %10s  %10s  %8s\n", "CHUNK", "KEY", "SEGMENT",
              "SLOT", "OFFSET", "S", "I", "F");
  for (size_t i = 0; i < d->chunks.size(); ++i) {
    const ChunkPlacement& c = d->chunks[i];
    std::printf("%6zu  %-16s  %-26s  %6u  %14llu  %10.4g  %10.4g  %8llu\n", i,
                c.key.ToHex().substr(0, 16).c_str(), SegmentFile(c.segment).c_str(), c.slot,
                static_cast<unsigned long long>(c.offset), c.score(), c.importance,
                static_cast<unsigned long long>(c.loads));
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl stats

const CommandSpec kStats = {
    "stats",
    "stats STORE [--gpu-tier-bytes B] [--cpu-tier-bytes B] [--json]",
    "Show the store's figures, the spread of S = I x F, and what the tiers would hold.",
    "The store: chunks, prefixes, segments, disk used against the cap, and the counters kept in\n"
    "the catalog (puts, chunks written, deduplicated, evicted, deleted). The score S = I x F of\n"
    "each chunk (I and F are what Re-Prefill sessions added): how many have S = 0, and its\n"
    "quartiles. With --gpu-tier-bytes and/or --cpu-tier-bytes, the ranking at rest: how many\n"
    "records (a record is one chunk at one layer) and chunks the tiers would keep, and their\n"
    "share of the total S, if they held the top-S records as docs/tiers.md's policy does\n"
    "(records take the whole GPU budget and three quarters of the CPU budget, the rest being\n"
    "the summary cache; slots are rounded up to 256 bytes; ties in S are broken by chunk key,\n"
    "where a serving process breaks them by last use).\n"
    "A store at rest has no running tiers: the figures of sessions (tier hits, bytes read,\n"
    "prefetch use, time blocked on I/O, bubbles) live in the serving process that ran them\n"
    "(Engine::Stats() there; 'kvctl replay' prints them for its own run).\n"
    "Example: kvctl stats ./store --gpu-tier-bytes 1G --cpu-tier-bytes 4G",
    {
        {"--gpu-tier-bytes", "B", "GPU tier budget to rank against (default 0: not shown)"},
        {"--cpu-tier-bytes", "B", "CPU tier budget to rank against (default 0: not shown)"},
        kJsonOption,
    },
};

// What the tiers would hold if they kept the top-S records (see kStats).
struct TierFill {
  uint64_t budget_bytes = 0;          // as given
  uint64_t record_budget_bytes = 0;   // the part records may use
  uint64_t records = 0;
  uint64_t bytes = 0;                 // slot bytes of those records
  uint64_t chunks = 0;                // chunks all of whose records it holds
  double score = 0;                   // sum of the S of its records
};

struct ScoreSpread {
  uint64_t chunks = 0;
  uint64_t zero = 0;
  double min = 0, q1 = 0, median = 0, q3 = 0, max = 0, total = 0;
};

// Linear interpolation between the closest ranks of `sorted` (ascending, not empty).
double Quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - static_cast<double>(lo));
}

int RunStats(const ParsedArgs& args) {
  std::string error;
  if (args.positional.size() != 1) return UsageError("stats", "stats needs exactly one STORE");
  const std::string& store = args.positional[0];
  TierFill gpu, cpu;
  if (!OptionUint(args, "--gpu-tier-bytes", true, &gpu.budget_bytes, &error) ||
      !OptionUint(args, "--cpu-tier-bytes", true, &cpu.budget_bytes, &error)) {
    return UsageError("stats", error);
  }
  gpu.record_budget_bytes = gpu.budget_bytes;
  cpu.record_budget_bytes = cpu.budget_bytes - static_cast<uint64_t>(
      static_cast<double>(cpu.budget_bytes) * engine::kSummaryShare);
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());

  // Every stored chunk once (prefixes share chunks), with its S and its records' slot size.
  struct Ranked {
    ChunkKey key;
    double score;
    uint32_t layers;
    uint64_t slot_bytes;
  };
  std::vector<Ranked> ranked;
  std::set<ChunkKey> seen;
  for (const PrefixInfo& p : (*engine)->ListPrefixes()) {
    auto d = (*engine)->DescribePrefix(p.id);
    if (!d.ok()) return StoreError("stats " + p.id.ToHex(), d.status());
    const uint64_t slot = (d->spec.RecordBytes() + 255) / 256 * 256;
    for (const ChunkPlacement& c : d->chunks) {
      if (seen.insert(c.key).second) ranked.push_back({c.key, c.score(), d->spec.layers, slot});
    }
  }
  const EngineStats stats = (*engine)->Stats();

  ScoreSpread spread;
  spread.chunks = ranked.size();
  double total_record_score = 0;
  if (!ranked.empty()) {
    std::vector<double> s;
    for (const Ranked& r : ranked) {
      s.push_back(r.score);
      spread.total += r.score;
      total_record_score += r.score * r.layers;
      if (!(r.score > 0)) spread.zero++;
    }
    std::sort(s.begin(), s.end());
    spread.min = s.front();
    spread.q1 = Quantile(s, 0.25);
    spread.median = Quantile(s, 0.5);
    spread.q3 = Quantile(s, 0.75);
    spread.max = s.back();
  }
  // Top S first: a record enters the GPU tier while it has room, else the CPU tier, else none.
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.key < b.key;
  });
  for (const Ranked& r : ranked) {
    uint32_t in_gpu = 0, in_cpu = 0;
    for (uint32_t l = 0; l < r.layers; ++l) {
      for (TierFill* t : {&gpu, &cpu}) {
        if (t->bytes + r.slot_bytes > t->record_budget_bytes) continue;
        t->bytes += r.slot_bytes;
        t->records++;
        t->score += r.score;
        (t == &gpu ? in_gpu : in_cpu)++;
        break;
      }
    }
    if (in_gpu == r.layers) gpu.chunks++;
    if (in_cpu == r.layers) cpu.chunks++;
  }
  const auto share = [&](const TierFill& t) {
    return total_record_score > 0 ? t.score / total_record_score : 0.0;
  };
  const double fill = stats.max_disk_bytes == 0
                          ? 0
                          : static_cast<double>(stats.disk_bytes_used) /
                                static_cast<double>(stats.max_disk_bytes);

  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject().Key("store").String(store).Key("stats");
    WriteStatsJson(w, stats);
    w.Key("fill").Double(fill)
        .Key("score").BeginObject()
        .Key("chunks").Uint(spread.chunks)
        .Key("zero").Uint(spread.zero)
        .Key("min").Double(spread.min)
        .Key("q1").Double(spread.q1)
        .Key("median").Double(spread.median)
        .Key("q3").Double(spread.q3)
        .Key("max").Double(spread.max)
        .Key("total").Double(spread.total)
        .EndObject()
        .Key("tiers").BeginObject();
    for (const auto& [name, t] : {std::pair<const char*, const TierFill*>{"gpu", &gpu},
                                  std::pair<const char*, const TierFill*>{"cpu", &cpu}}) {
      if (t->budget_bytes == 0) continue;
      w.Key(name).BeginObject()
          .Key("budget_bytes").Uint(t->budget_bytes)
          .Key("record_budget_bytes").Uint(t->record_budget_bytes)
          .Key("records").Uint(t->records)
          .Key("bytes").Uint(t->bytes)
          .Key("chunks").Uint(t->chunks)
          .Key("score_share").Double(share(*t))
          .EndObject();
    }
    w.EndObject().EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("store %s: %llu chunks, %llu prefix%s, %llu segment%s\n", store.c_str(),
              static_cast<unsigned long long>(stats.chunks),
              static_cast<unsigned long long>(stats.prefixes), stats.prefixes == 1 ? "" : "es",
              static_cast<unsigned long long>(stats.segments), stats.segments == 1 ? "" : "s");
  if (stats.max_disk_bytes == 0) {
    std::printf("  disk used      %s, cap unlimited\n", FormatBytes(stats.disk_bytes_used).c_str());
  } else {
    std::printf("  disk used      %s of cap %s (%.1f%% full)\n",
                FormatBytes(stats.disk_bytes_used).c_str(),
                FormatBytes(stats.max_disk_bytes).c_str(), fill * 100);
  }
  std::printf("  since created  %llu puts, %llu chunks written (%s), %llu deduplicated, "
              "%llu evicted (%s), %llu deleted\n",
              static_cast<unsigned long long>(stats.puts),
              static_cast<unsigned long long>(stats.chunks_written),
              FormatBytes(stats.bytes_written).c_str(),
              static_cast<unsigned long long>(stats.chunks_deduplicated),
              static_cast<unsigned long long>(stats.chunks_evicted),
              FormatBytes(stats.bytes_evicted).c_str(),
              static_cast<unsigned long long>(stats.chunks_deleted));
  if (stats.orphan_bytes_reclaimed > 0) {
    std::printf("  on this open   %s of orphaned segment space reclaimed\n",
                FormatBytes(stats.orphan_bytes_reclaimed).c_str());
  }
  std::printf("  S = I x F      %llu chunks, %llu with S = 0; min %.4g, q1 %.4g, median %.4g, "
              "q3 %.4g, max %.4g\n",
              static_cast<unsigned long long>(spread.chunks),
              static_cast<unsigned long long>(spread.zero), spread.min, spread.q1,
              spread.median, spread.q3, spread.max);
  for (const auto& [name, t] : {std::pair<const char*, const TierFill*>{"gpu", &gpu},
                                std::pair<const char*, const TierFill*>{"cpu", &cpu}}) {
    if (t->budget_bytes == 0) continue;
    std::printf("  %s tier %-9s would hold %llu records (%llu whole chunks), %.1f%% of S\n", name,
                FormatBytes(t->budget_bytes).c_str(), static_cast<unsigned long long>(t->records),
                static_cast<unsigned long long>(t->chunks), share(*t) * 100);
  }
  std::printf("session figures (tier hits, bubbles) belong to a serving process: see "
              "'kvctl stats --help'\n");
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl rm

const CommandSpec kRm = {
    "rm",
    "rm STORE PREFIX [--json]",
    "Remove a stored prefix (Engine::DeletePrefix).",
    "PREFIX as for 'kvctl export'. The prefix's chunks that no other stored prefix uses are\n"
    "freed at once (their blocks are given back to the file system); shared ones stay.\n"
    "Example: kvctl rm ./store 9f3c0a17b2d4e6f8",
    {
        kJsonOption,
    },
};

int RunRm(const ParsedArgs& args) {
  if (args.positional.size() != 2) return UsageError("rm", "rm needs STORE and PREFIX");
  const std::string& store = args.positional[0];
  std::string wanted = args.positional[1];
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("rm", error);
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  ChunkKey prefix_id;
  if (const int code = FindPrefix(**engine, "rm", store, wanted, &prefix_id); code != kExitOk) {
    return code;
  }
  const EngineStats before = (*engine)->Stats();
  uint64_t chunks = 0;
  for (const PrefixInfo& p : (*engine)->ListPrefixes()) {
    if (p.id == prefix_id) chunks = p.chunks;
  }
  if (absl::Status s = (*engine)->DeletePrefix(prefix_id); !s.ok()) {
    return StoreError("rm " + prefix_id.ToHex(), s);
  }
  const EngineStats after = (*engine)->Stats();
  // Nothing else writes a store at rest; the guards keep a concurrent writer from wrapping them.
  const uint64_t freed = before.chunks > after.chunks ? before.chunks - after.chunks : 0;
  const uint64_t freed_bytes = before.disk_bytes_used > after.disk_bytes_used
                                   ? before.disk_bytes_used - after.disk_bytes_used
                                   : 0;
  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("prefix_id").String(prefix_id.ToHex())
        .Key("chunks").Uint(chunks)
        .Key("chunks_freed").Uint(freed)
        .Key("bytes_freed").Uint(freed_bytes)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("removed prefix %s (%llu chunks): %llu chunks freed (%s), %llu shared with other "
              "prefixes kept\n",
              prefix_id.ToHex().c_str(), static_cast<unsigned long long>(chunks),
              static_cast<unsigned long long>(freed), FormatBytes(freed_bytes).c_str(),
              static_cast<unsigned long long>(chunks - std::min(chunks, freed)));
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl gc

const CommandSpec kGc = {
    "gc",
    "gc STORE [--json]",
    "Give back segment space no chunk uses, and delete segment files that hold no chunk.",
    "Removing a chunk normally frees its blocks at once; what is left for gc is the space a\n"
    "crash or a failed hole punch left behind. Opening the store reclaims the space of slots no\n"
    "committed chunk names (orphaned space); Engine::Gc then gives back the blocks of free\n"
    "slots still allocated and deletes the segment files that hold no chunk. gc reports both;\n"
    "bytes_reclaimed is their sum. It does not move chunks: a segment with one live chunk keeps\n"
    "its file.\n"
    "Example: kvctl gc ./store",
    {
        kJsonOption,
    },
};

int RunGc(const ParsedArgs& args) {
  if (args.positional.size() != 1) return UsageError("gc", "gc needs exactly one STORE");
  const std::string& store = args.positional[0];
  auto engine = OpenExisting(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  const EngineStats before = (*engine)->Stats();
  const auto start = Clock::now();
  absl::StatusOr<GcReport> report;
  {
    ElapsedTicker ticker("gc");  // Engine::Gc reports no progress
    report = (*engine)->Gc();
  }
  if (!report.ok()) return StoreError("gc " + store, report.status());
  const double seconds = SecondsSince(start);
  const EngineStats after = (*engine)->Stats();
  const uint64_t total = before.orphan_bytes_reclaimed + report->bytes_reclaimed;
  if (args.Has("--json")) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("bytes_reclaimed").Uint(total)
        .Key("open_bytes_reclaimed").Uint(before.orphan_bytes_reclaimed)
        .Key("gc_bytes_reclaimed").Uint(report->bytes_reclaimed)
        .Key("segments_removed").Uint(report->segments_removed)
        .Key("segments").Uint(after.segments)
        .Key("disk_bytes_used").Uint(after.disk_bytes_used)
        .Key("seconds").Double(seconds)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("gc %s: reclaimed %s (%s orphaned on open, %s of free slots and empty segments); "
              "%llu segment file%s removed, %llu left; disk used %s\n",
              store.c_str(), FormatBytes(total).c_str(),
              FormatBytes(before.orphan_bytes_reclaimed).c_str(),
              FormatBytes(report->bytes_reclaimed).c_str(),
              static_cast<unsigned long long>(report->segments_removed),
              report->segments_removed == 1 ? "" : "s",
              static_cast<unsigned long long>(after.segments),
              FormatBytes(after.disk_bytes_used).c_str());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// kvctl replay

const CommandSpec kReplay = {
    "replay",
    "replay STORE TRACE --model PRESET [--selector S] [--budget F] [--gpu-tier-bytes B]\n"
    "                   [--cpu-tier-bytes B] [--no-put] [--dtype T] [--model-id ID]\n"
    "                   [--chunk-tokens C] [--json]",
    "Run a multi-turn trace against the store: per turn, a Re-Prefill, then a Put.",
    "TRACE is JSON Lines, one turn per line, in arrival order:\n"
    "  {\"conversation\": \"c1\", \"turn\": 1, \"generate\": {\"seed\": 7, \"tokens\": 1024}}\n"
    "  {\"conversation\": \"c1\", \"turn\": 2, \"tokens\": [151644, 8948, 198]}\n"
    "A turn's tokens (listed, or generated from a seed as 'kvctl put' does) are appended to its\n"
    "conversation's context, and the turn's request is the whole context. For each turn, replay\n"
    "runs a Re-Prefill session over the stored leading chunks of the request (every layer, with\n"
    "synthetic queries, through the selector and tiers), then stores the request's whole chunks\n"
    "with synthetic KV (as 'kvctl put'; chunks already stored are not written again), so the\n"
    "next turn matches them. It prints per turn the match length and the Re-Prefill figures,\n"
    "then the totals. The tiers live only as long as the replay. A request's KV is held in\n"
    "memory while it is stored; replay refuses a request of more than 8 GiB of KV.\n"
    "Example: kvctl replay ./store trace.jsonl --model qwen2.5-7b --gpu-tier-bytes 1G",
    {
        kModelOption,
        {"--selector", "S", "period-exact (default), quest, mean-key or oracle"},
        {"--budget", "F", "fraction of the matched chunks loaded per layer, (0, 1] (default 0.1)"},
        {"--gpu-tier-bytes", "B", "GPU tier budget (host memory here; default 0: none)"},
        {"--cpu-tier-bytes", "B", "CPU tier budget (default 0: none)"},
        {"--no-put", "", "do not store the turns (measure Re-Prefill of what is stored)"},
        kDtypeOption,
        kPresetModelIdOption,
        kChunkTokensOption,
        kJsonOption,
    },
};

// Deterministic stand-in queries for one layer of one turn: [window, q_heads, head_dim], values
// in [-1, 1). Replay measures I/O and tiers, not the quality of a selection.
std::vector<float> ReplayQueries(const ModelSpec& spec, uint32_t window, uint64_t turn_seed,
                                 uint32_t layer) {
  std::vector<float> q(size_t{window} * spec.q_heads * spec.head_dim);
  uint64_t x = turn_seed * 0x9E3779B97F4A7C15ull + layer;
  for (float& v : q) {
    x += 0x9E3779B97F4A7C15ull;
    const uint64_t z = synth::Mix64(x);
    v = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
  }
  return q;
}

struct ReplayTurnFigures {
  std::string conversation;
  uint64_t turn = 0;
  uint64_t prompt_tokens = 0;
  uint64_t prompt_chunks = 0;
  uint64_t matched_chunks = 0;
  SessionStats session;
  double reprefill_seconds = 0;
  uint64_t chunks_written = 0;
  uint64_t chunks_evicted = 0;
  double put_seconds = 0;
};

// One turn: a Re-Prefill over the stored leading chunks of `prompt`, then (unless no_put) a Put.
absl::StatusOr<ReplayTurnFigures> ReplayTurn(Engine& engine, const ModelSpec& spec,
                                             const ReprefillOptions& options,
                                             const tools::TraceTurn& turn,
                                             std::span<const int32_t> prompt, bool no_put) {
  ReplayTurnFigures f;
  f.conversation = turn.conversation;
  f.turn = turn.turn;
  f.prompt_tokens = prompt.size();
  f.prompt_chunks = prompt.size() / spec.chunk_tokens;
  const uint64_t turn_seed = std::hash<std::string>{}(turn.conversation) ^ (turn.turn << 32);
  const auto reprefill_start = Clock::now();
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<ReprefillSession> session,
                       engine.BeginReprefill(spec, prompt, options));
  f.matched_chunks = session->matched_chunks();
  if (f.matched_chunks > 0) {
    for (uint32_t layer = 0; layer < spec.layers; ++layer) {
      const std::vector<float> q = ReplayQueries(spec, options.window, turn_seed, layer);
      CKV_RETURN_IF_ERROR(session->SubmitQueries(layer, q));
      CKV_ASSIGN_OR_RETURN(LayerView view, session->AwaitLayer(layer));
    }
  }
  CKV_ASSIGN_OR_RETURN(f.session, session->Finish());
  f.reprefill_seconds = SecondsSince(reprefill_start);
  if (!no_put && f.prompt_chunks > 0) {
    const std::span<const int32_t> whole = prompt.first(f.prompt_chunks * spec.chunk_tokens);
    GeneratedKv kv(spec, whole, /*progress=*/false);
    const auto put_start = Clock::now();
    CKV_ASSIGN_OR_RETURN(PutResult put, engine.Put(spec, whole, kv.tensors()));
    f.put_seconds = SecondsSince(put_start);
    f.chunks_written = put.chunks_written;
    f.chunks_evicted = put.chunks_evicted;
  }
  return f;
}

void WriteTurnJson(tools::JsonWriter& w, const ReplayTurnFigures& f) {
  const SessionStats& s = f.session;
  w.BeginObject()
      .Key("conversation").String(f.conversation)
      .Key("turn").Uint(f.turn)
      .Key("prompt_tokens").Uint(f.prompt_tokens)
      .Key("prompt_chunks").Uint(f.prompt_chunks)
      .Key("matched_chunks").Uint(f.matched_chunks)
      .Key("records_served").Uint(s.records_served)
      .Key("bytes_needed").Uint(s.bytes_needed)
      .Key("bytes_read").Uint(s.bytes_read)
      .Key("read_amplification").Double(s.read_amplification())
      .Key("gpu_hits").Uint(s.gpu_hits)
      .Key("cpu_hits").Uint(s.cpu_hits)
      .Key("nvme_records").Uint(s.nvme_records)
      .Key("summary_cache_hits").Uint(s.summary_cache_hits)
      .Key("prefetched_bytes_used").Uint(s.prefetched_bytes_used)
      .Key("prefetched_bytes_wasted").Uint(s.prefetched_bytes_wasted)
      .Key("await_blocked_seconds").Double(s.await_blocked_seconds)
      .Key("reprefill_seconds").Double(f.reprefill_seconds)
      .Key("chunks_written").Uint(f.chunks_written)
      .Key("chunks_evicted").Uint(f.chunks_evicted)
      .Key("put_seconds").Double(f.put_seconds)
      .EndObject();
}

int RunReplay(const ParsedArgs& args) {
  std::string error;
  if (args.positional.size() != 2) return UsageError("replay", "replay needs STORE and TRACE");
  const std::string& store = args.positional[0];
  const std::string& trace_path = args.positional[1];
  if (!args.Has("--model")) return UsageError("replay", "replay needs --model");
  ModelSpec spec;
  if (!PresetSpec(args, &spec, &error)) return UsageError("replay", error);
  ReprefillOptions options;
  if (const std::string* text = args.Value("--selector")) {
    auto selector = ParseSelector(*text);
    if (!selector.ok()) {
      return UsageError("replay", "--selector: '" + *text +
                                      "' is not period-exact, quest, mean-key or oracle");
    }
    options.selector = *selector;
  }
  if (const std::string* text = args.Value("--budget")) {
    double budget = 0;
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), budget);
    if (ec != std::errc() || end != text->data() + text->size() || !(budget > 0) ||
        budget > 1) {
      return UsageError("replay", "--budget: '" + *text + "' is not a number in (0, 1]");
    }
    options.budget_fraction = budget;
  }
  EngineOptions engine_options;
  engine_options.create_if_missing = false;
  if (!OptionUint(args, "--gpu-tier-bytes", true, &engine_options.gpu_tier_bytes, &error) ||
      !OptionUint(args, "--cpu-tier-bytes", true, &engine_options.cpu_tier_bytes, &error)) {
    return UsageError("replay", error);
  }
  const bool no_put = args.Has("--no-put");
  const bool json = args.Has("--json");

  auto turns = tools::ReadTraceFile(trace_path);
  if (!turns.ok()) return StoreError("replay " + trace_path, turns.status());
  // A request's KV is generated whole for its Put: bound it before starting.
  constexpr uint64_t kMaxRequestKvBytes = uint64_t{8} << 30;
  absl::flat_hash_map<std::string, uint64_t> context_tokens;
  uint64_t total_kv_bytes = 0;
  for (const tools::TraceTurn& t : *turns) {
    const uint64_t tokens = context_tokens[t.conversation] += t.tokens.size();
    const uint64_t kv_bytes = tokens * spec.KvBytesPerToken();
    if (kv_bytes > kMaxRequestKvBytes) {
      return StoreError(
          "replay " + trace_path,
          absl::InvalidArgumentError(absl::StrCat(
              trace_path, ":", t.line, ": turn ", t.turn, " of conversation \"",
              t.conversation, "\" is a request of ", tokens, " tokens, ", FormatBytes(kv_bytes),
              " of KV; replay holds a request's KV in memory and refuses more than ",
              FormatBytes(kMaxRequestKvBytes))));
    }
    total_kv_bytes += kv_bytes;
  }

  auto engine = Engine::Open(engine_options, store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());

  std::vector<ReplayTurnFigures> figures;
  absl::flat_hash_map<std::string, std::vector<int32_t>> contexts;
  const auto start = Clock::now();
  {
    ProgressBar bar("replay", total_kv_bytes);
    uint64_t done = 0;
    for (const tools::TraceTurn& t : *turns) {
      std::vector<int32_t>& context = contexts[t.conversation];
      context.insert(context.end(), t.tokens.begin(), t.tokens.end());
      auto f = ReplayTurn(**engine, spec, options, t, context, no_put);
      if (!f.ok()) {
        bar.Finish();
        return StoreError(absl::StrCat("replay ", trace_path, ":", t.line, " (conversation \"",
                                       t.conversation, "\", turn ", t.turn, ")"),
                          f.status());
      }
      figures.push_back(*std::move(f));
      done += context.size() * spec.KvBytesPerToken();
      bar.Update(done);
    }
  }
  const double seconds = SecondsSince(start);

  SessionStats total;
  uint64_t prompt_chunks = 0, matched = 0, written = 0;
  for (const ReplayTurnFigures& f : figures) {
    prompt_chunks += f.prompt_chunks;
    matched += f.matched_chunks;
    written += f.chunks_written;
    total.records_served += f.session.records_served;
    total.bytes_needed += f.session.bytes_needed;
    total.bytes_read += f.session.bytes_read;
    total.gpu_hits += f.session.gpu_hits;
    total.cpu_hits += f.session.cpu_hits;
    total.nvme_records += f.session.nvme_records;
  }
  const EngineStats stats = (*engine)->Stats();
  if (json) {
    tools::JsonWriter w;
    w.BeginObject()
        .Key("store").String(store)
        .Key("trace").String(trace_path)
        .Key("model_id").String(spec.model_id)
        .Key("selector").String(std::string(SelectorName(options.selector)))
        .Key("budget").Double(options.budget_fraction)
        .Key("put").Bool(!no_put)
        .Key("turns").BeginArray();
    for (const ReplayTurnFigures& f : figures) WriteTurnJson(w, f);
    w.EndArray()
        .Key("prompt_chunks").Uint(prompt_chunks)
        .Key("matched_chunks").Uint(matched)
        .Key("chunks_written").Uint(written)
        .Key("records_served").Uint(total.records_served)
        .Key("bytes_needed").Uint(total.bytes_needed)
        .Key("bytes_read").Uint(total.bytes_read)
        .Key("read_amplification").Double(total.read_amplification())
        .Key("gpu_hits").Uint(total.gpu_hits)
        .Key("cpu_hits").Uint(total.cpu_hits)
        .Key("nvme_records").Uint(total.nvme_records)
        .Key("seconds").Double(seconds)
        .Key("engine");
    WriteStatsJson(w, stats);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("replay %s: %zu turns, %s, %s at %.0f%%\n", trace_path.c_str(), figures.size(),
              spec.DebugString().c_str(), std::string(SelectorName(options.selector)).c_str(),
              options.budget_fraction * 100);
  std::printf("%-14s %5s %8s %15s %8s %10s %6s %7s %7s %9s %8s %9s\n", "conversation", "turn",
              "tokens", "matched", "records", "read", "amp", "gpu", "cpu", "reprefill", "written",
              "put");
  for (const ReplayTurnFigures& f : figures) {
    const std::string matched_text = absl::StrCat(f.matched_chunks, "/", f.prompt_chunks);
    std::printf("%-14s %5llu %8llu %15s %8llu %10s %6.2f %7llu %7llu %8.1fms %8llu %8.1fms\n",
                f.conversation.substr(0, 14).c_str(), static_cast<unsigned long long>(f.turn),
                static_cast<unsigned long long>(f.prompt_tokens), matched_text.c_str(),
                static_cast<unsigned long long>(f.session.records_served),
                FormatBytes(f.session.bytes_read).c_str(), f.session.read_amplification(),
                static_cast<unsigned long long>(f.session.gpu_hits),
                static_cast<unsigned long long>(f.session.cpu_hits), f.reprefill_seconds * 1e3,
                static_cast<unsigned long long>(f.chunks_written), f.put_seconds * 1e3);
  }
  const double hit_rate =
      total.records_served == 0
          ? 0
          : static_cast<double>(total.gpu_hits + total.cpu_hits) / total.records_served;
  std::printf("totals: %llu of %llu request chunks matched, %llu records served, %s read "
              "(amplification %.2f), tier hits %.0f%% (gpu %llu, cpu %llu), %llu chunks "
              "written, %.2fs\n",
              static_cast<unsigned long long>(matched),
              static_cast<unsigned long long>(prompt_chunks),
              static_cast<unsigned long long>(total.records_served),
              FormatBytes(total.bytes_read).c_str(), total.read_amplification(), hit_rate * 100,
              static_cast<unsigned long long>(total.gpu_hits),
              static_cast<unsigned long long>(total.cpu_hits),
              static_cast<unsigned long long>(written), seconds);
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// main

struct Command {
  const CommandSpec* spec;
  int (*run)(const ParsedArgs&);
};

const Command kCommands[] = {
    {&kInit, RunInit},
    {&kPut, RunPut},
    {&kLs, RunLs},
    {&kShow, RunShow},
    {&kStats, RunStats},
    {&kVerify, RunVerify},
    {&kRm, RunRm},
    {&kGc, RunGc},
    {&kImport, RunImport},
    {&kExport, RunExport},
    {&kReplay, RunReplay},
};

void PrintHelp(FILE* out) {
  std::fprintf(out,
               "kvctl: create, populate and inspect ckv stores.\n\n"
               "Usage: kvctl COMMAND [ARGS]\n\nCommands:\n");
  for (const Command& c : kCommands) {
    std::fprintf(out, "  %-8.*s %.*s\n", static_cast<int>(c.spec->name.size()),
                 c.spec->name.data(), static_cast<int>(c.spec->summary.size()),
                 c.spec->summary.data());
  }
  std::fprintf(out,
               "  %-8s %s\n\n"
               "Run 'kvctl COMMAND --help' for a command's options.\n"
               "Exit codes: 0 ok, 1 problems found, 2 usage error, 3 I/O or store error.\n",
               "help", "show this help, or 'kvctl help COMMAND' for one command");
}

const Command* FindCommand(std::string_view name) {
  for (const Command& c : kCommands) {
    if (c.spec->name == name) return &c;
  }
  return nullptr;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    PrintHelp(stderr);
    return kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "help" || name == "-h" || name == "--help") {
    if (argc >= 3) {
      const Command* cmd = FindCommand(argv[2]);
      if (cmd == nullptr) return UsageError("", "unknown command '" + std::string(argv[2]) + "'");
      PrintCommandHelp(*cmd->spec, stdout);
      return kExitOk;
    }
    PrintHelp(stdout);
    return kExitOk;
  }
  const Command* cmd = FindCommand(name);
  if (cmd == nullptr) return UsageError("", "unknown command '" + std::string(name) + "'");
  const std::vector<std::string> args(argv + 2, argv + argc);
  ParsedArgs parsed;
  std::string error;
  if (!ParseArgs(*cmd->spec, args, &parsed, &error)) return UsageError(std::string(name), error);
  if (parsed.help) {
    PrintCommandHelp(*cmd->spec, stdout);
    return kExitOk;
  }
  return cmd->run(parsed);
}

}  // namespace
}  // namespace ckv::kvctl

int main(int argc, char** argv) { return ckv::kvctl::Main(argc, argv); }
