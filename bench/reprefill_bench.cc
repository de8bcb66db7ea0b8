// bench/reprefill_bench.cc: Re-Prefill latency of ckv against the published baselines, on one
// store, with one I/O engine and the same tier budgets (docs/baselines.md says how each baseline
// follows its original, docs/results.md holds the measured tables).
//
//   reprefill_bench [--store DIR] [--model qwen2.5-7b] [--prefix-tokens 8192]
//                   [--suffix-tokens 64] [--conversations 8] [--turns 4] [--warmup-turns 1]
//                   [--system-prompt-share 0] [--concurrency 1] [--budgets 5,10,25,50]
//                   [--systems full,h2o,impress,ckv-paper,ckv] [--gpu-tier-bytes 64M]
//                   [--cpu-tier-bytes 192M] [--window 32] [--gpu-tflops 156] [--seed 1]
//                   [--fidelity] [--fidelity-requests 4] [--no-fio] [--fio-seconds 3]
//                   [--json FILE] [--plot FILE.png]
//
// Workload. `conversations` conversations, each a prefix of `prefix-tokens` tokens (the first
// `system-prompt-share` of them common to all) followed by `turns` requests: request t reuses the
// prefix plus the t earlier suffixes (each turn's prefix is the previous one plus that turn) and
// brings a `suffix-tokens` suffix. The KV is the planted-attention generator's
// (tools/synthetic_attention.h), the same for every conversation (distinct token ids, so distinct
// chunks on disk); each request's queries differ (query_seed). Turns below `warmup-turns` warm
// the tiers and are not measured. Requests run closed-loop, `concurrency` at a time.
//
// Per request and layer: the system's identification and loads, then the layer's dense compute
// (the model's FLOPs for the suffix over the loaded context at --gpu-tflops, an A800 in bf16 at
// 50% of its 312 TFLOPS by default) spent as a timed wait on one shared modelled GPU, so that I/O
// and compute overlap as they would. Selection scoring runs for real on this CPU (a GPU would do
// it in microseconds); its time is reported as scoring_ms.
//
// The store lives under DIR, one ckv store per record layout that the systems use, plus the
// probe/key file the token-level baselines read their keys from (laid out as their originals
// store keys). DIR/manifest.json names the workload; a store whose manifest matches and which
// holds every prefix is reused.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "engine/session.h"
#include "engine/tier_cache.h"
#include "kernels/attention.h"
#include "kernels/fidelity.h"
#include "kernels/selector.h"
#include "prefetch/read_engine.h"
#include "storage/file_system.h"
#include "tools/json_reader.h"
#include "tools/json_writer.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

constexpr int kExitUsage = 2;
constexpr const char* kProg = "reprefill_bench";

// ---------------------------------------------------------------------------------------------
// Flags.

struct Flags {
  std::string store = "ckv-bench-store";
  std::string model = "qwen2.5-7b";
  uint32_t prefix_tokens = 8192;
  uint32_t suffix_tokens = 64;
  uint32_t conversations = 8;
  uint32_t turns = 4;
  uint32_t warmup_turns = 1;
  double system_prompt_share = 0;
  uint32_t concurrency = 1;
  std::vector<double> budgets = {0.05, 0.10, 0.25, 0.50};
  std::vector<std::string> systems = {"full", "h2o", "impress", "ckv-paper", "ckv"};
  uint64_t gpu_tier_bytes = 64ull << 20;
  uint64_t cpu_tier_bytes = 192ull << 20;
  uint32_t window = 32;
  double gpu_tflops = 156;  // A800 bf16 dense peak 312 TFLOPS at 50%
  uint64_t seed = 1;
  bool fidelity = false;
  uint32_t fidelity_requests = 4;
  bool fio = true;
  double fio_seconds = 3;
  std::string json, plot;
};

void Usage(FILE* out) {
  std::fprintf(
      out,
      "Usage: reprefill_bench [--store DIR] [--model qwen2.5-7b] [--prefix-tokens 8192]\n"
      "                       [--suffix-tokens 64] [--conversations 8] [--turns 4]\n"
      "                       [--warmup-turns 1] [--system-prompt-share 0] [--concurrency 1]\n"
      "                       [--budgets 5,10,25,50] [--systems full,h2o,impress,ckv-paper,ckv]\n"
      "                       [--gpu-tier-bytes 64M] [--cpu-tier-bytes 192M] [--window 32]\n"
      "                       [--gpu-tflops 156] [--seed 1] [--fidelity]\n"
      "                       [--fidelity-requests 4] [--no-fio] [--fio-seconds 3]\n"
      "                       [--json FILE] [--plot FILE.png]\n"
      "Systems: full, h2o, impress, ckv-paper, ckv, or a ckv variant\n"
      "  ckv:<selector>:<layer-major|period-major>[:<period>][:noprefetch]\n"
      "  (selector: period-exact, quest, mean-key, oracle; period > 1 shares a selection\n"
      "  over a period only for period-exact).\n");
}

bool ParseBytes(std::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(std::string(s), &v) || v > (~0ull) / mult) return false;
  *out = v * mult;
  return true;
}

absl::Status ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (a == "--fidelity") { f->fidelity = true; continue; }
    if (a == "--no-fio") { f->fio = false; continue; }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--store") f->store = v;
    else if (a == "--model") f->model = v;
    else if (a == "--prefix-tokens") ok = absl::SimpleAtoi(v, &f->prefix_tokens);
    else if (a == "--suffix-tokens") ok = absl::SimpleAtoi(v, &f->suffix_tokens);
    else if (a == "--conversations") ok = absl::SimpleAtoi(v, &f->conversations);
    else if (a == "--turns") ok = absl::SimpleAtoi(v, &f->turns);
    else if (a == "--warmup-turns") ok = absl::SimpleAtoi(v, &f->warmup_turns);
    else if (a == "--system-prompt-share") ok = absl::SimpleAtod(v, &f->system_prompt_share);
    else if (a == "--concurrency") ok = absl::SimpleAtoi(v, &f->concurrency);
    else if (a == "--gpu-tier-bytes") ok = ParseBytes(v, &f->gpu_tier_bytes);
    else if (a == "--cpu-tier-bytes") ok = ParseBytes(v, &f->cpu_tier_bytes);
    else if (a == "--window") ok = absl::SimpleAtoi(v, &f->window);
    else if (a == "--gpu-tflops") ok = absl::SimpleAtod(v, &f->gpu_tflops);
    else if (a == "--seed") ok = absl::SimpleAtoi(v, &f->seed);
    else if (a == "--fidelity-requests") ok = absl::SimpleAtoi(v, &f->fidelity_requests);
    else if (a == "--fio-seconds") ok = absl::SimpleAtod(v, &f->fio_seconds);
    else if (a == "--json") f->json = v;
    else if (a == "--plot") f->plot = v;
    else if (a == "--budgets") {
      f->budgets.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        double b = 0;
        if (!absl::SimpleAtod(s, &b) || !(b > 0 && b <= 100)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--budgets: '", std::string(s), "' is not a percentage in (0, 100]"));
        }
        f->budgets.push_back(b / 100);
      }
    } else if (a == "--systems") {
      f->systems.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) f->systems.emplace_back(s);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(a, ": bad value '", v, "'"));
  }
  if (f->prefix_tokens < 16 || f->turns < 1 || f->conversations < 1 || f->concurrency < 1 ||
      f->warmup_turns >= f->turns || f->window < 1 || f->suffix_tokens < 1 ||
      !(f->system_prompt_share >= 0 && f->system_prompt_share <= 1) || !(f->gpu_tflops > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need prefix-tokens >= 16 (got ", f->prefix_tokens, "), turns >= 1 (", f->turns,
        "), warmup-turns < turns (", f->warmup_turns, "), conversations >= 1, concurrency >= 1, "
        "window >= 1, suffix-tokens >= 1, system-prompt-share in [0, 1], gpu-tflops > 0"));
  }
  if (f->budgets.empty() || f->systems.empty()) {
    return absl::InvalidArgumentError("--budgets and --systems must not be empty");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The model's dense compute (docs/baselines.md, "Compute model").

struct Arch {
  uint32_t hidden = 0;
  uint32_t intermediate = 0;
};

// Hidden and MLP sizes of the presets, from the models' config.json.
absl::StatusOr<Arch> ArchOf(const std::string& model) {
  if (model == "qwen2.5-0.5b") return Arch{896, 4864};
  if (model == "qwen2.5-7b") return Arch{3584, 18944};
  if (model == "qwen2.5-14b") return Arch{5120, 13824};
  if (model == "qwen2.5-32b") return Arch{5120, 27648};
  return absl::InvalidArgumentError(absl::StrCat("no architecture figures for model ", model));
}

// FLOPs of one decoder layer for `s` suffix tokens attending over `context` loaded tokens plus
// the suffix: the projections and the MLP (2 FLOPs per weight per token) and the attention
// (QK^T and AV, 4 FLOPs per q head dimension per pair).
double LayerFlops(const ModelSpec& spec, const Arch& arch, double s, double context) {
  const double qd = double(spec.q_heads) * spec.head_dim;
  const double kvd = double(spec.kv_heads) * spec.head_dim;
  const double weights = 2 * arch.hidden * qd + 2 * arch.hidden * kvd +
                         3.0 * arch.hidden * arch.intermediate;
  return 2 * s * weights + 4 * s * (context + s) * qd;
}

// One modelled GPU shared by every request: computes run one after another in submission order.
class ModelledGpu {
 public:
  explicit ModelledGpu(double flops_per_second) : rate_(flops_per_second) {}
  void Compute(double flops) {
    const absl::Duration d = absl::Seconds(flops / rate_);
    absl::Time end;
    {
      absl::MutexLock lock(&mu_);
      end = std::max(absl::Now(), busy_until_) + d;
      busy_until_ = end;
    }
    const absl::Duration left = end - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
  }

 private:
  const double rate_;
  absl::Mutex mu_;
  absl::Time busy_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The selectors run on this CPU, where scoring a layer takes milliseconds that a GPU spends
// microseconds on. While one runs, the read engine is held (reads in flight still land) and the
// time is taken out of the request's latency; the scoring's FLOPs are spent on the modelled GPU
// instead. So the timeline is the one a GPU would see, up to the reads in flight at the pause.
// Per worker thread (one request at a time each); exact at concurrency 1, where nothing else
// runs while the engine is held (with more, the hold delays the other requests' reads and they
// are not credited: their latency errs high).
class ScoringClock final : public engine::SelectorClock {
 public:
  ScoringClock(prefetch::ReadEngine* reads, ModelledGpu* gpu, bool hold_reads)
      : reads_(reads), gpu_(gpu), hold_(hold_reads) {}
  void Begin() override {
    if (hold_) reads_->Pause();
    begin_ = absl::Now();
  }
  void End(double flops) override {
    cpu_seconds_ += absl::ToDoubleSeconds(absl::Now() - begin_);
    if (hold_) reads_->Resume();
    gpu_->Compute(flops);
  }
  // CPU seconds of scoring on this thread since the last call.
  static double Take() {
    const double s = cpu_seconds_;
    cpu_seconds_ = 0;
    return s;
  }

 private:
  prefetch::ReadEngine* reads_;
  ModelledGpu* gpu_;
  const bool hold_;
  static thread_local absl::Time begin_;
  static thread_local double cpu_seconds_;
};
thread_local absl::Time ScoringClock::begin_;
thread_local double ScoringClock::cpu_seconds_ = 0;

// ---------------------------------------------------------------------------------------------
// Workload.

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Request {
  uint32_t conversation = 0;
  uint32_t turn = 0;
  bool warmup = false;
};

class Workload {
 public:
  Workload(const Flags& f, ModelSpec spec) : f_(f), spec_(std::move(spec)) {
    stored_tokens_ = f.prefix_tokens + size_t{f.turns - 1} * f.suffix_tokens;
    const size_t shared = static_cast<size_t>(std::llround(f.system_prompt_share * f.prefix_tokens));
    tokens_.resize(f.conversations);
    for (uint32_t c = 0; c < f.conversations; ++c) {
      auto& t = tokens_[c];
      t.resize(stored_tokens_ + f.suffix_tokens);
      for (size_t i = 0; i < t.size(); ++i) {
        const uint64_t h = i < shared ? Mix(f.seed * 1000003 + i) : Mix(Mix(f.seed + 7919 * (c + 1)) + i);
        t[i] = static_cast<int32_t>(h % 151643);  // qwen2.5's vocabulary
      }
    }
    params_.seed = f.seed;
    params_.window = f.window;
    for (uint32_t turn = 0; turn < f.turns; ++turn) {
      for (uint32_t c = 0; c < f.conversations; ++c) {
        requests_.push_back({c, turn, turn < f.warmup_turns});
      }
    }
  }

  const ModelSpec& spec() const { return spec_; }
  const Flags& flags() const { return f_; }
  size_t stored_tokens() const { return stored_tokens_; }
  const std::vector<Request>& requests() const { return requests_; }
  const synth::AttentionParams& params() const { return params_; }
  std::span<const int32_t> StoredTokens(uint32_t c) const {
    return std::span(tokens_[c]).first(stored_tokens_);
  }
  // The prefix a request reuses.
  std::span<const int32_t> Prefix(const Request& r) const {
    return std::span(tokens_[r.conversation]).first(f_.prefix_tokens + size_t{r.turn} * f_.suffix_tokens);
  }
  // Its queries, every layer: [layers][window * q_heads * head_dim].
  std::vector<std::vector<float>> Queries(const Request& r) const {
    synth::AttentionParams p = params_;
    p.query_seed = Mix(f_.seed * 31 + r.conversation * 1009 + r.turn + 1);
    synth::SyntheticAttention gen(spec_, stored_tokens_, p);
    std::vector<std::vector<float>> q(spec_.layers);
    for (uint32_t l = 0; l < spec_.layers; ++l) q[l] = gen.Queries(l);
    return q;
  }
  // What the store's contents depend on.
  std::string Manifest() const {
    tools::JsonWriter w;
    w.BeginObject().Key("model").String(f_.model).Key("prefix_tokens").Uint(f_.prefix_tokens);
    w.Key("suffix_tokens").Uint(f_.suffix_tokens).Key("conversations").Uint(f_.conversations);
    w.Key("turns").Uint(f_.turns).Key("system_prompt_share").Double(f_.system_prompt_share);
    w.Key("seed").Uint(f_.seed).Key("window").Uint(f_.window).Key("generator").Uint(1);
    w.EndObject();
    return w.str();
  }

 private:
  const Flags& f_;
  ModelSpec spec_;
  size_t stored_tokens_ = 0;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<Request> requests_;
  synth::AttentionParams params_;
};

// ---------------------------------------------------------------------------------------------
// Systems.

enum class Kind { kFull, kH2o, kImpress, kCkv };

// `ckv`: the configuration chosen by measurement (docs/baselines.md, "Choosing ckv").
constexpr const char* kBestCkv = "ckv:mean-key:period-major:8";

// The token-level baselines identify from keys kept apart from values (the key file below).
bool NeedsKeyFile(Kind k) { return k == Kind::kH2o || k == Kind::kImpress; }

struct System {
  std::string name;
  Kind kind = Kind::kCkv;
  RecordLayout layout = RecordLayout::kLayerMajor;
  Selector selector = Selector::kPeriodExact;
  uint32_t period = 8;
  bool period_selection = false;  // quest / mean-key scored at period heads only
  bool prefetch = true;
};

const char* LayoutName(RecordLayout l) {
  return l == RecordLayout::kLayerMajor ? "layer-major" : "period-major";
}

absl::StatusOr<System> ParseSystem(const std::string& name) {
  System s;
  s.name = name;
  if (name == "full") { s.kind = Kind::kFull; return s; }
  if (name == "h2o") { s.kind = Kind::kH2o; return s; }
  if (name == "impress") { s.kind = Kind::kImpress; return s; }
  if (name == "ckv-paper") {
    // ContiguousKV as published: c = 16, p = 8, period-exact, intra- and inter-period prefetch.
    s.selector = Selector::kPeriodExact;
    s.layout = RecordLayout::kLayerMajor;
    return s;
  }
  // ckv, our best configuration (docs/baselines.md, "Choosing ckv").
  std::string spec = name == "ckv" ? std::string(kBestCkv) : name;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() < 3 || parts[0] != "ckv") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown system '", name,
        "' (full, h2o, impress, ckv-paper, ckv, ckv:<selector>:<layout>[:<period>][:noprefetch])"));
  }
  CKV_ASSIGN_OR_RETURN(s.selector, ParseSelector(parts[1]));
  if (parts[2] == "layer-major") s.layout = RecordLayout::kLayerMajor;
  else if (parts[2] == "period-major") s.layout = RecordLayout::kPeriodMajor;
  else return absl::InvalidArgumentError(absl::StrCat("system ", name, ": unknown layout ", parts[2]));
  for (size_t i = 3; i < parts.size(); ++i) {
    if (parts[i] == "noprefetch") s.prefetch = false;
    else if (!absl::SimpleAtoi(parts[i], &s.period) || s.period < 1) {
      return absl::InvalidArgumentError(absl::StrCat("system ", name, ": bad part ", parts[i]));
    } else {
      s.period_selection = s.selector == Selector::kQuest || s.selector == Selector::kMeanKey;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// The store: one ckv store per layout, and the key file of the token-level baselines.
//
// keys.bin holds every conversation's keys head-major, as IMPRESS and AttentionStore+H2O keep
// keys apart from values: for conversation c, layer l, kv head h, the keys of all stored tokens,
// [tokens, head_dim], back to back. One kv head's keys of a run of tokens is one read.

class KeyFile {
 public:
  KeyFile(const ModelSpec& spec, size_t tokens, uint32_t conversations)
      : spec_(spec), tokens_(tokens) {
    run_bytes_ = RoundUp(tokens * spec.head_dim * kernels::ElementBytes(spec.dtype));
    bytes_ = run_bytes_ * spec.layers * spec.kv_heads * conversations;
  }
  static uint64_t RoundUp(uint64_t b) { return (b + 4095) / 4096 * 4096; }
  uint64_t bytes() const { return bytes_; }
  size_t key_bytes() const { return spec_.head_dim * kernels::ElementBytes(spec_.dtype); }
  // Offset of token `token`'s key of (conversation, layer, head).
  uint64_t Offset(uint32_t c, uint32_t layer, uint32_t head, size_t token) const {
    return ((uint64_t{c} * spec_.layers + layer) * spec_.kv_heads + head) * run_bytes_ +
           token * key_bytes();
  }

 private:
  ModelSpec spec_;
  size_t tokens_;
  uint64_t run_bytes_ = 0;
  uint64_t bytes_ = 0;
};

absl::Status WriteKeyFile(const Workload& w, const KeyFile& kf, const synth::PlantedKv& kv,
                          const std::string& path) {
  const ModelSpec& spec = w.spec();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  const size_t kb = kf.key_bytes();
  const size_t tok_bytes = spec.TokenBytesPerLayer();
  std::vector<char> run(KeyFile::RoundUp(w.stored_tokens() * kb), 0);
  for (uint32_t c = 0; c < w.flags().conversations; ++c) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      const std::byte* k = kv.tensors().k[l].data();
      for (uint32_t h = 0; h < spec.kv_heads; ++h) {
        for (size_t t = 0; t < w.stored_tokens(); ++t) {
          std::memcpy(run.data() + t * kb, k + t * tok_bytes + h * kb, kb);
        }
        out.write(run.data(), static_cast<std::streamsize>(run.size()));
      }
    }
  }
  out.flush();
  if (!out) return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed (disk full?)"));
  return absl::OkStatus();
}

std::string StorePath(const Flags& f, RecordLayout layout) {
  return f.store + "/" + LayoutName(layout);
}

absl::StatusOr<bool> StoreHolds(const Workload& w, RecordLayout layout) {
  EngineOptions o;
  o.create_if_missing = false;
  auto engine = Engine::Open(o, StorePath(w.flags(), layout));
  if (!engine.ok()) return false;
  for (uint32_t c = 0; c < w.flags().conversations; ++c) {
    CKV_ASSIGN_OR_RETURN(uint64_t n, (*engine)->Lookup(w.spec(), w.StoredTokens(c)));
    if (n != w.stored_tokens() / w.spec().chunk_tokens) return false;
  }
  return true;
}

// The store's manifest, or "" when it has none or one larger than any this program writes (a
// manifest is a few hundred bytes; the file's size is not trusted: it may be /dev/zero behind a
// symlink), so that the store is rebuilt.
std::string ReadManifest(const std::string& path) {
  constexpr size_t kMaxManifestBytes = 64 << 10;
  absl::StatusOr<std::string> text = tools::ReadFileUpTo(path, kMaxManifestBytes, "manifest");
  return text.ok() ? *std::move(text) : std::string();
}

// Makes (or reuses) the stores for `layouts` and the key file.
absl::Status Populate(const Workload& w, const std::set<RecordLayout>& layouts, bool need_keys) {
  const Flags& f = w.flags();
  ::mkdir(f.store.c_str(), 0700);
  const std::string manifest_path = f.store + "/manifest.json";
  const std::string manifest = w.Manifest();
  if (ReadManifest(manifest_path) != manifest) {
    // Another workload's store: start over.
    std::fprintf(stderr, "%s: making a new store in %s\n", kProg, f.store.c_str());
    // Only what this harness makes, never the rest of DIR.
    for (const char* name : {"layer-major", "period-major", "keys.bin", "fio.dat"}) {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(f.store) / name, ec);
      if (ec) return absl::InternalError(absl::StrCat("could not remove ", f.store, "/", name, ": ", ec.message()));
    }
    std::remove(manifest_path.c_str());
  }
  std::vector<RecordLayout> todo;
  for (RecordLayout l : layouts) {
    CKV_ASSIGN_OR_RETURN(bool holds, StoreHolds(w, l));
    if (!holds) todo.push_back(l);
  }
  const KeyFile kf(w.spec(), w.stored_tokens(), f.conversations);
  const std::string key_path = f.store + "/keys.bin";
  struct stat st {};
  const bool keys_ok = !need_keys || (::stat(key_path.c_str(), &st) == 0 &&
                                      uint64_t(st.st_size) == kf.bytes());
  if (todo.empty() && keys_ok) {
    std::fprintf(stderr, "%s: reusing the store in %s\n", kProg, f.store.c_str());
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  std::fprintf(stderr, "%s: generating the KV of %zu tokens (%s)\n", kProg, w.stored_tokens(),
               w.spec().DebugString().c_str());
  synth::SyntheticAttention gen(w.spec(), w.stored_tokens(), w.params());
  synth::PlantedKv kv(gen);
  for (RecordLayout layout : todo) {
    EngineOptions o;
    o.layout = layout;
    CKV_ASSIGN_OR_RETURN(auto engine, Engine::Open(o, StorePath(f, layout)));
    for (uint32_t c = 0; c < f.conversations; ++c) {
      CKV_ASSIGN_OR_RETURN(PutResult r, engine->Put(w.spec(), w.StoredTokens(c), kv.tensors()));
      std::fprintf(stderr, "%s: %s store: conversation %u/%u: %llu chunks written\n", kProg,
                   LayoutName(layout), c + 1, f.conversations,
                   static_cast<unsigned long long>(r.chunks_written));
    }
  }
  if (!keys_ok) {
    std::fprintf(stderr, "%s: writing the key file (%.2f GB)\n", kProg, kf.bytes() / 1e9);
    CKV_RETURN_IF_ERROR(WriteKeyFile(w, kf, kv, key_path));
  }
  std::ofstream(manifest_path, std::ios::trunc) << manifest;
  std::fprintf(stderr, "%s: store ready in %.1f s\n", kProg, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reads through the engine's read engine, waited for as a batch.

class ReadBatch {
 public:
  explicit ReadBatch(prefetch::ReadEngine* engine) : engine_(engine) {}
  ~ReadBatch() { Wait().IgnoreError(); }

  void Add(prefetch::ReadRequest r) {
    r.callback = [this](const prefetch::ReadResult& result) {
      absl::MutexLock lock(&mu_);
      if (!result.status.ok() && status_.ok()) status_ = result.status;
      --pending_;
    };
    queued_.push_back(std::move(r));
  }
  absl::Status Submit() {
    if (queued_.empty()) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      pending_ += queued_.size();
    }
    auto ids = engine_->SubmitBatch(queued_);
    if (!ids.ok()) {
      absl::MutexLock lock(&mu_);
      pending_ -= queued_.size();
      queued_.clear();
      return ids.status();
    }
    queued_.clear();
    return absl::OkStatus();
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](size_t* p) { return *p == 0; }, &pending_));
    return status_;
  }

 private:
  prefetch::ReadEngine* engine_;
  std::vector<prefetch::ReadRequest> queued_;
  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Splits [offset, offset + length) into reads of at most `max` bytes into `dest`.
void AddRange(ReadBatch& batch, prefetch::FileId file, uint64_t offset, uint64_t length,
              std::byte* dest, uint32_t max) {
  while (length > 0) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(length, max));
    prefetch::ReadRequest r;
    r.file = file;
    r.offset = offset;
    r.length = n;
    r.dest = std::span<std::byte>(dest, n);
    batch.Add(std::move(r));
    offset += n;
    dest += n;
    length -= n;
  }
}

// ---------------------------------------------------------------------------------------------
// One request's figures.

struct RequestResult {
  double latency_s = 0;   // on the modelled GPU: wall time less the CPU scoring
  double wall_s = 0;      // as measured here
  double scoring_s = 0;   // selection on this CPU
  double blocked_s = 0;   // the compute stream waiting for data (bubbles)
  uint64_t bytes_needed = 0;
  uint64_t bytes_read = 0;
  uint64_t gpu_hits = 0, cpu_hits = 0, nvme_records = 0;
  uint64_t wasted_prefetch_bytes = 0;
  std::vector<std::vector<uint32_t>> loaded;  // per layer: chunks whose KV attention used
};

// The baselines' tiers: a TierManager per system run, with the original's policy.
struct BaselineState {
  std::unique_ptr<engine::TierManager> tiers;
  std::atomic<uint64_t> tick{1};
  absl::Mutex mu;
  std::map<ChunkKey, uint64_t> freq;  // impress: requests that loaded the chunk's block
};

class Runner {
 public:
  Runner(const Workload& w, const System& sys, double budget, Engine* engine,
         prefetch::ReadEngine* reads, prefetch::FileId key_file, ModelledGpu* gpu,
         ScoringClock* clock, BaselineState* state)
      : w_(w), spec_(w.spec()), sys_(sys), budget_(budget), engine_(engine), reads_(reads),
        key_file_(key_file), gpu_(gpu), clock_(clock), state_(state),
        kf_(w.spec(), w.stored_tokens(), w.flags().conversations) {
    arch_ = *ArchOf(w.flags().model);
  }

  absl::StatusOr<RequestResult> Run(const Request& r,
                                    const std::vector<std::vector<float>>& queries) {
    ScoringClock::Take();
    auto res = sys_.kind == Kind::kCkv ? RunCkv(r, queries) : RunBaseline(r, queries);
    if (res.ok()) {
      res->scoring_s = ScoringClock::Take();
      res->wall_s = res->latency_s;
      res->latency_s -= res->scoring_s;
    }
    return res;
  }

 private:
  double Flops(size_t context_tokens) const {
    return LayerFlops(spec_, arch_, w_.flags().suffix_tokens, double(context_tokens));
  }

  absl::StatusOr<RequestResult> RunCkv(const Request& r,
                                       const std::vector<std::vector<float>>& queries) {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    ReprefillOptions o;
    o.budget_fraction = budget_;
    o.selector = sys_.selector;
    o.period_layers = sys_.period;
    o.period_selection = sys_.period_selection;
    o.window = w_.flags().window;
    o.prefetch = sys_.prefetch;
    const absl::Time start = absl::Now();
    CKV_ASSIGN_OR_RETURN(auto session, engine_->BeginReprefill(spec_, w_.Prefix(r), o));
    for (uint32_t l = 0; l < spec_.layers; ++l) {
      CKV_RETURN_IF_ERROR(session->SubmitQueries(l, queries[l]));
      CKV_ASSIGN_OR_RETURN(LayerView view, session->AwaitLayer(l));
      for (const auto& rec : view.records()) out.loaded[l].push_back(rec.chunk);
      const size_t context = view.records().size() * spec_.chunk_tokens;
      view.Release();
      gpu_->Compute(Flops(context));
    }
    CKV_ASSIGN_OR_RETURN(SessionStats st, session->Finish());
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    // SubmitQueries of a period head waits for the head layer's reads, then scores: the wait is
    // a bubble, the rest scoring. AwaitLayer's waits are bubbles too.
    out.blocked_s = st.await_blocked_seconds;
    out.bytes_needed = st.bytes_needed;
    out.bytes_read = st.bytes_read;
    out.gpu_hits = st.gpu_hits;
    out.cpu_hits = st.cpu_hits;
    out.nvme_records = st.nvme_records;
    out.wasted_prefetch_bytes = st.prefetched_bytes_wasted;
    return out;
  }

  // The baselines, over the engine's store and read engine, with tiers of their own.
  struct Layer {
    std::vector<const std::byte*> rec;            // per chunk: its record (or K-only scratch)
    std::vector<std::vector<std::byte>> own;      // buffers read into
    std::vector<engine::TierManager::Handle> pins;
    std::vector<std::byte> keys;                  // key-file bytes of this layer
    std::unique_ptr<ReadBatch> batch;             // last: waited for before the buffers go
  };

  engine::TierManager::Handle Lookup(const ChunkKey& k, uint32_t record, RequestResult& out) {
    if (!state_->tiers) return {};
    auto h = state_->tiers->Lookup(engine::RecordId{k, record});
    if (h) {
      (h.level() == engine::TierLevel::kGpu ? out.gpu_hits : out.cpu_hits)++;
      // LRU (full, h2o): a hit is a use. impress re-ranks by its block score after the request.
      if (sys_.kind != Kind::kImpress) state_->tiers->UpdateScore(k, Tick());
    }
    return h;
  }
  void Admit(const ChunkKey& k, uint32_t record, std::span<const std::byte> bytes, double score,
             std::vector<engine::TierManager::Handle>& pins) {
    if (!state_->tiers) return;
    auto h = state_->tiers->Admit(engine::RecordId{k, record}, bytes, score);
    if (h.ok() && *h) pins.push_back(std::move(*h));
  }
  double Tick() { return double(state_->tick.fetch_add(1)); }

  // Requests whole records `chunks` of `layer` that the tiers do not hold (full, impress).
  absl::Status RequestRecords(const storage::PinnedChunks& pinned, uint32_t layer,
                              std::span<const uint32_t> chunks, Layer& L, RequestResult& out) {
    const auto& keys = pinned.chunks();
    L.batch = std::make_unique<ReadBatch>(reads_);
    for (uint32_t j : chunks) {
      if (auto h = Lookup(keys[j].key, layer, out)) {
        L.rec[j] = h.data();
        L.pins.push_back(std::move(h));
        continue;
      }
      const auto where = pinned.RecordAt(j, layer);
      CKV_ASSIGN_OR_RETURN(prefetch::FileId file, engine::HostOf(*engine_).FileIdOf(where.file));
      auto& buf = L.own[j];
      const uint32_t padded = static_cast<uint32_t>((where.length + 4095) / 4096 * 4096);
      buf.resize(padded);
      prefetch::ReadRequest q;
      q.file = file;
      q.offset = where.offset;
      q.length = padded;
      q.verify_checksum = true;
      q.expected_checksum = where.checksum;
      q.checksum_bytes = where.length;
      q.dest = std::span<std::byte>(buf);
      L.batch->Add(std::move(q));
      L.rec[j] = buf.data();
      out.bytes_read += padded;
      out.nvme_records++;
    }
    return L.batch->Submit();
  }

  absl::StatusOr<RequestResult> RunBaseline(const Request& r,
                                            const std::vector<std::vector<float>>& queries) {
    RequestResult out;
    out.loaded.resize(spec_.layers);
    const absl::Time start = absl::Now();
    const std::vector<ChunkKey> keys =
        ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, w_.Prefix(r));
    storage::ChunkStore& store = engine::HostOf(*engine_).store();
    CKV_ASSIGN_OR_RETURN(auto pinned, store.PinLeading(spec_, keys));
    const uint32_t n = static_cast<uint32_t>(pinned->chunks().size());
    const uint32_t c = spec_.chunk_tokens;
    const size_t half = spec_.RecordBytes() / 2;
    const size_t tok_bytes = spec_.TokenBytesPerLayer();  // K (or V) of one token
    const uint32_t max_io = 256 * 1024;
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    kernels::SelectOptions so;
    so.budget_fraction = budget_;
    const kernels::SelectorKind kind =
        sys_.kind == Kind::kH2o ? kernels::SelectorKind::kH2o : kernels::SelectorKind::kImpress;
    // impress's probe kv heads (kernels/selector.h: q heads i * q_heads / 3).
    std::set<uint32_t> probe_kv;
    for (uint32_t i = 0; i < so.impress_probe_heads; ++i) {
      probe_kv.insert(i * spec_.q_heads / so.impress_probe_heads / (spec_.q_heads / spec_.kv_heads));
    }
    std::vector<double> block_share;  // impress: per chunk, share of important tokens summed
    if (sys_.kind == Kind::kImpress) block_share.assign(n, 0.0);

    auto new_layer = [&]() {
      auto L = std::make_unique<Layer>();
      L->rec.assign(n, nullptr);
      L->own.resize(n);
      return L;
    };
    // Keys of `layer` for every chunk whose K is not at hand, from the key file: kv heads
    // `heads`, runs of consecutive chunks (whole 64-token blocks for impress).
    auto request_keys = [&](uint32_t layer, const std::vector<bool>& need,
                            const std::vector<uint32_t>& heads, Layer& L) -> absl::Status {
      L.keys.assign(size_t{n} * c * spec_.kv_heads * kf_.key_bytes(), std::byte{0});
      if (!L.batch) L.batch = std::make_unique<ReadBatch>(reads_);
      for (uint32_t j = 0; j < n;) {
        if (!need[j]) { ++j; continue; }
        uint32_t e = j;
        while (e < n && need[e]) ++e;
        for (uint32_t h : heads) {
          const size_t run = size_t{e - j} * c * kf_.key_bytes();
          std::byte* dst = L.keys.data() + (size_t{h} * n * c + size_t{j} * c) * kf_.key_bytes();
          AddRange(*L.batch, key_file_, kf_.Offset(r.conversation, layer, h, size_t{j} * c), run,
                   dst, max_io);
          out.bytes_read += run;
        }
        j = e;
      }
      return L.batch->Submit();
    };
    // K-only scratch records for the selector, from the key file's head-major bytes.
    auto scratch_records = [&](const std::vector<bool>& from_keys, const std::vector<uint32_t>& heads,
                               Layer& L) {
      const size_t kb = kf_.key_bytes();
      for (uint32_t j = 0; j < n; ++j) {
        if (!from_keys[j]) continue;
        auto& buf = L.own[j];
        buf.assign(spec_.RecordBytes(), std::byte{0});
        for (uint32_t h : heads) {
          for (uint32_t t = 0; t < c; ++t) {
            std::memcpy(buf.data() + (size_t{t} * spec_.kv_heads + h) * kb,
                        L.keys.data() + (size_t{h} * n * c + size_t{j} * c + t) * kb, kb);
          }
        }
        L.rec[j] = buf.data();
      }
    };

    std::vector<uint32_t> heads_all(spec_.kv_heads);
    std::iota(heads_all.begin(), heads_all.end(), 0u);
    const std::vector<uint32_t> probe_heads(probe_kv.begin(), probe_kv.end());

    // full and h2o preload layer l + 1 while layer l computes (AttentionStore); impress does not.
    std::unique_ptr<Layer> next;
    auto start_layer = [&](uint32_t layer) -> absl::StatusOr<std::unique_ptr<Layer>> {
      auto L = new_layer();
      if (sys_.kind == Kind::kFull) {
        CKV_RETURN_IF_ERROR(RequestRecords(*pinned, layer, all, *L, out));
      } else if (sys_.kind == Kind::kH2o) {
        // Every key: K halves the tiers hold (record 2l), the rest from the key file.
        std::vector<bool> need(n, true);
        for (uint32_t j = 0; j < n; ++j) {
          if (auto h = Lookup(pinned->chunks()[j].key, 2 * layer, out)) {
            L->rec[j] = h.data();
            L->pins.push_back(std::move(h));
            need[j] = false;
          }
        }
        CKV_RETURN_IF_ERROR(request_keys(layer, need, heads_all, *L));
      } else {
        // impress: the probe heads' keys of the 64-token blocks the tiers do not hold whole.
        const uint32_t bc = so.impress_block_tokens / c;
        std::vector<bool> need(n, false);
        for (uint32_t b = 0; b < n; b += bc) {
          const uint32_t e = std::min(n, b + bc);
          std::vector<engine::TierManager::Handle> hs;
          for (uint32_t j = b; j < e; ++j) {
            if (auto h = Lookup(pinned->chunks()[j].key, layer, out)) hs.push_back(std::move(h));
            else break;
          }
          if (hs.size() == e - b) {
            for (uint32_t j = b; j < e; ++j) {
              L->rec[j] = hs[j - b].data();
              L->pins.push_back(std::move(hs[j - b]));
            }
          } else {
            // Lookup counted hits for a block it does not use whole: take them back.
            for (auto& h : hs) (h.level() == engine::TierLevel::kGpu ? out.gpu_hits : out.cpu_hits)--;
            for (uint32_t j = b; j < e; ++j) need[j] = true;
          }
        }
        CKV_RETURN_IF_ERROR(request_keys(layer, need, probe_heads, *L));
      }
      return L;
    };

    for (uint32_t l = 0; l < spec_.layers; ++l) {
      std::unique_ptr<Layer> L;
      if (next) {
        L = std::move(next);
      } else {
        CKV_ASSIGN_OR_RETURN(L, start_layer(l));
      }
      if (sys_.kind != Kind::kImpress && l + 1 < spec_.layers) {
        CKV_ASSIGN_OR_RETURN(next, start_layer(l + 1));
      }
      const absl::Time w0 = absl::Now();
      CKV_RETURN_IF_ERROR(L->batch->Wait());
      out.blocked_s += absl::ToDoubleSeconds(absl::Now() - w0);
      size_t context = 0;
      if (sys_.kind == Kind::kFull) {
        for (uint32_t j = 0; j < n; ++j) {
          if (!L->own[j].empty()) Admit(pinned->chunks()[j].key, l, L->own[j], Tick(), L->pins);
        }
        out.loaded[l] = all;
        out.bytes_needed += size_t{n} * spec_.RecordBytes();
        context = size_t{n} * c;
      } else {
        std::vector<bool> from_keys(n, false);
        for (uint32_t j = 0; j < n; ++j) from_keys[j] = L->rec[j] == nullptr;
        scratch_records(from_keys, sys_.kind == Kind::kH2o ? heads_all : probe_heads, *L);
        kernels::SelectorInput in;
        in.shape = kernels::KvShape::Of(spec_);
        in.layers = spec_.layers;
        in.layer = l;
        in.queries = queries[l];
        in.window = w_.flags().window;
        in.chunks = n;
        in.records = L->rec;
        clock_->Begin();
        auto selected = kernels::Select(kind, in, so);
        clock_->End(kernels::ScoringFlops(kind, in, so));
        CKV_ASSIGN_OR_RETURN(kernels::Selection sel, std::move(selected));
        out.bytes_needed += sel.tokens.size() * 2 * tok_bytes;
        out.loaded[l] = sel.chunks;
        context = sel.chunks.size() * c;
        if (sys_.kind == Kind::kH2o) {
          // Cache the keys read (LRU), then read the selected chunks' values.
          for (uint32_t j = 0; j < n; ++j) {
            if (from_keys[j]) {
              Admit(pinned->chunks()[j].key, 2 * l, std::span(L->own[j]).first(half), Tick(), L->pins);
            }
          }
          std::vector<std::vector<std::byte>> vbuf(n);
          ReadBatch values(reads_);  // after vbuf: waited for before vbuf goes
          for (uint32_t j : sel.chunks) {
            if (auto h = Lookup(pinned->chunks()[j].key, 2 * l + 1, out)) {
              L->pins.push_back(std::move(h));
              continue;
            }
            const auto where = pinned->RecordAt(j, l);
            CKV_ASSIGN_OR_RETURN(prefetch::FileId file, engine::HostOf(*engine_).FileIdOf(where.file));
            // V of a chunk is the record's second half; read whole pages around it.
            const uint64_t b = (where.offset + half) / 4096 * 4096;
            const uint64_t e = (where.offset + 2 * half + 4095) / 4096 * 4096;
            vbuf[j].resize(e - b);
            AddRange(values, file, b, e - b, vbuf[j].data(), max_io);
            out.bytes_read += e - b;
            out.nvme_records++;
          }
          CKV_RETURN_IF_ERROR(values.Submit());
          const absl::Time v0 = absl::Now();
          CKV_RETURN_IF_ERROR(values.Wait());
          out.blocked_s += absl::ToDoubleSeconds(absl::Now() - v0);
          for (uint32_t j : sel.chunks) {
            if (!vbuf[j].empty()) {
              Admit(pinned->chunks()[j].key, 2 * l + 1, std::span(vbuf[j]).first(half), Tick(), L->pins);
            }
          }
        } else {
          // impress: load the selected tokens' 64-token blocks whole, K and V.
          std::vector<uint32_t> missing;
          for (uint32_t j : sel.chunks) {
            if (from_keys[j]) missing.push_back(j);
          }
          // Share of important tokens per chunk, for the block score.
          std::vector<uint32_t> hot(n, 0);
          for (uint32_t t : sel.tokens) hot[t / c]++;
          Layer loads;
          loads.rec.assign(n, nullptr);
          loads.own.resize(n);
          CKV_RETURN_IF_ERROR(RequestRecords(*pinned, l, missing, loads, out));
          const absl::Time v0 = absl::Now();
          CKV_RETURN_IF_ERROR(loads.batch->Wait());
          out.blocked_s += absl::ToDoubleSeconds(absl::Now() - v0);
          const uint32_t bc = so.impress_block_tokens / c;
          absl::MutexLock lock(&state_->mu);
          for (uint32_t j : sel.chunks) {
            const uint32_t b = j / bc * bc, e = std::min(n, b + bc);
            uint32_t block_hot = 0;
            for (uint32_t k = b; k < e; ++k) block_hot += hot[k];
            const double share = double(block_hot) / ((e - b) * c);
            block_share[j] += share;
            const double f = double(state_->freq[pinned->chunks()[j].key] + 1);
            if (!loads.own[j].empty()) {
              Admit(pinned->chunks()[j].key, l, loads.own[j], f * share, L->pins);
            }
          }
        }
      }
      gpu_->Compute(Flops(context));
    }
    if (sys_.kind == Kind::kImpress && state_->tiers) {
      // Block score = frequency x share of important tokens (averaged over the layers).
      absl::MutexLock lock(&state_->mu);
      for (uint32_t j = 0; j < n; ++j) {
        if (block_share[j] <= 0) continue;
        const ChunkKey& k = pinned->chunks()[j].key;
        const uint64_t f = ++state_->freq[k];
        state_->tiers->UpdateScore(k, double(f) * block_share[j] / spec_.layers);
      }
    }
    out.latency_s = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

  const Workload& w_;
  const ModelSpec& spec_;
  const System& sys_;
  const double budget_;
  Engine* engine_;
  prefetch::ReadEngine* reads_;
  prefetch::FileId key_file_;
  ModelledGpu* gpu_;
  ScoringClock* clock_;
  BaselineState* state_;
  KeyFile kf_;
  Arch arch_;
};

// ---------------------------------------------------------------------------------------------
// Fidelity: the attention over what a system loaded against the attention over the full KV,
// computed on the CPU from the generator (whose records are the stored bytes).

class Fidelity {
 public:
  explicit Fidelity(const Workload& w)
      : w_(w), gen_(w.spec(), w.stored_tokens(), w.params()) {}

  struct Truth {
    std::vector<float> chunk_mass;  // per chunk of the request's prefix
    std::vector<float> output;      // attention output over every chunk
  };

  // Recall and relative error of `loaded` (per layer) for request r.
  absl::Status Measure(const Request& r, const std::vector<std::vector<float>>& queries,
                       const std::vector<std::vector<uint32_t>>& loaded, double* recall,
                       double* error) {
    const ModelSpec& spec = w_.spec();
    const kernels::KvShape shape = kernels::KvShape::Of(spec);
    const size_t n = w_.Prefix(r).size() / spec.chunk_tokens;
    double rs = 0, es = 0;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      const std::vector<std::byte>& recs = Records(l);
      std::vector<const std::byte*> ptr(n);
      for (size_t j = 0; j < n; ++j) ptr[j] = recs.data() + j * spec.RecordBytes();
      const auto key = std::make_tuple(r.conversation, r.turn, l);
      auto it = truth_.find(key);
      if (it == truth_.end()) {
        Truth t;
        CKV_ASSIGN_OR_RETURN(auto mass, kernels::TokenAttention(shape, queries[l], w_.flags().window, ptr));
        t.chunk_mass = kernels::PerChunk(mass, spec.chunk_tokens);
        CKV_ASSIGN_OR_RETURN(t.output, Output(shape, queries[l], ptr, {}));
        it = truth_.emplace(key, std::move(t)).first;
      }
      rs += kernels::AttentionRecall(it->second.chunk_mass, loaded[l]);
      CKV_ASSIGN_OR_RETURN(auto out, Output(shape, queries[l], ptr, loaded[l]));
      es += kernels::RelativeL2Error(out, it->second.output);
    }
    *recall = rs / spec.layers;
    *error = es / spec.layers;
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::vector<float>> Output(const kernels::KvShape& shape,
                                            std::span<const float> q,
                                            std::span<const std::byte* const> ptr,
                                            std::span<const uint32_t> chunks) {
    std::vector<uint32_t> all;
    if (chunks.empty()) {
      all.resize(ptr.size());
      std::iota(all.begin(), all.end(), 0u);
      chunks = all;
    }
    CKV_ASSIGN_OR_RETURN(kernels::GatheredKv kv, kernels::Gather(shape, ptr, chunks));
    return kernels::ReferenceAttention(shape, q, w_.flags().window, kv);
  }
  const std::vector<std::byte>& Records(uint32_t l) {
    auto it = records_.find(l);
    if (it == records_.end()) {
      it = records_.emplace(l, gen_.Records(gen_.Generate(l))).first;
    }
    return it->second;
  }

  const Workload& w_;
  synth::SyntheticAttention gen_;
  std::map<uint32_t, std::vector<std::byte>> records_;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, Truth> truth_;
};

// ---------------------------------------------------------------------------------------------
// fio on the store's file system at a given read size (the physical limit for that size).

// `s` as one word for /bin/sh: in single quotes, each ' written as '\''.
std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class Fio {
 public:
  Fio(const Flags& f, uint32_t qd) : f_(f), qd_(qd) {}
  // MB/s of fio's random reads of `bytes` (rounded up to 4 KiB) at queue depth `qd` (at most the
  // read engine's), right after a system ran. fio reads DIR/fio.dat, a dense file on the store's
  // file system as large as the allocated bytes of the largest segment file of the store in
  // `dir`. Not the segment itself: segments are sparse (a band's unused slots are holes), and a
  // read of a hole returns zeros without touching the device, so fio over a segment's first
  // bytes measured the page of zeros, not the disk (4-13 GB/s from a 2 GB/s device). 0 when fio
  // is missing or failed.
  double MbPerS(uint64_t bytes, uint32_t qd, const std::string& dir) {
    bytes = std::max<uint64_t>(4096, (bytes + 4095) / 4096 * 4096);
    qd = std::clamp<uint32_t>(qd, 1, qd_);
    uint64_t size = 0;
    auto names = storage::PosixFileSystem()->ListDir(dir + "/segments");
    if (names.ok()) {
      for (const std::string& name : *names) {
        struct stat st {};
        const std::string path = dir + "/segments/" + name;
        if (::stat(path.c_str(), &st) == 0) size = std::max<uint64_t>(size, uint64_t(st.st_blocks) * 512);
      }
    }
    size = size / (1 << 20) * (1 << 20);
    if (size < bytes || !EnsureFile(size)) return 0;
    const auto key = std::make_pair(bytes, qd);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const std::string out = f_.store + "/fio.json";
    const std::string cmd = absl::StrCat(
        "fio --name=randread --ioengine=io_uring --direct=1 --rw=randread --readonly --bs=", bytes,
        " --iodepth=", qd, " --size=", file_bytes_, " --filename=", FioFileName(), " --time_based --runtime=",
        f_.fio_seconds, " --output-format=json --output=", ShellQuote(out), " >/dev/null 2>&1");
    double mb = 0;
    if (std::system(cmd.c_str()) == 0) {
      auto json = tools::ReadJsonFile(out);
      if (json.ok()) {
        const tools::JsonValue* jobs = json->Find("jobs");
        if (jobs != nullptr && jobs->AsArray() != nullptr && !jobs->AsArray()->empty()) {
          const tools::JsonValue* read = (*jobs->AsArray())[0].Find("read");
          const tools::JsonValue* bw = read != nullptr ? read->Find("bw_bytes") : nullptr;
          if (bw != nullptr && bw->AsInt() != nullptr) mb = double(*bw->AsInt()) / 1e6;
          if (bw != nullptr && bw->AsDouble() != nullptr) mb = *bw->AsDouble() / 1e6;
        }
      }
      std::remove(out.c_str());
    } else {
      std::fprintf(stderr, "%s: fio failed or is missing; fio_mb_s is 0\n", kProg);
    }
    cache_[key] = mb;
    return mb;
  }

 private:
  std::string Path() const { return f_.store + "/fio.dat"; }
  // Path() as fio's --filename value: fio splits file names at ':' unless escaped.
  std::string FioFileName() const {
    std::string n;
    for (char c : Path()) n += c == ':' ? std::string("\\:") : std::string(1, c);
    return ShellQuote(n);
  }

  // Makes DIR/fio.dat at least `size` bytes and fully allocated (written by fio with O_DIRECT),
  // reusing one from an earlier run. Later runs compare against the same file.
  bool EnsureFile(uint64_t size) {
    if (file_bytes_ >= size) return true;
    struct stat st {};
    if (::stat(Path().c_str(), &st) == 0 && uint64_t(st.st_size) >= size &&
        uint64_t(st.st_blocks) * 512 >= uint64_t(st.st_size)) {
      file_bytes_ = uint64_t(st.st_size) / (1 << 20) * (1 << 20);
      return true;
    }
    std::fprintf(stderr, "%s: writing %s (%.2f GB) for fio's reference reads\n", kProg,
                 Path().c_str(), size / 1e9);
    std::remove(Path().c_str());
    const std::string cmd = absl::StrCat(
        "fio --name=fill --ioengine=io_uring --direct=1 --rw=write --bs=1M --iodepth=16 --size=",
        size, " --filename=", FioFileName(), " >/dev/null 2>&1 && sync");
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "%s: could not write %s with fio; fio_mb_s is 0\n", kProg, Path().c_str());
      std::remove(Path().c_str());
      cache_.clear();
      return false;
    }
    file_bytes_ = size;
    cache_.clear();  // figures of a smaller file are not comparable
    return true;
  }

  const Flags& f_;
  const uint32_t qd_;
  uint64_t file_bytes_ = 0;
  std::map<std::pair<uint64_t, uint32_t>, double> cache_;
};

// ---------------------------------------------------------------------------------------------
// One system at one budget.

struct Row {
  std::string system;
  double budget = 0;
  std::string config;
  size_t requests = 0;
  double mean_ms = 0, p50_ms = 0, p95_ms = 0;
  double wall_ms = 0, scoring_ms = 0, bubble_ms = 0;
  uint64_t bytes_needed = 0, bytes_read = 0;
  double read_amplification = 0;
  double device_mb_s = 0, fio_mb_s = 0, fio_full_depth_mb_s = 0;
  uint64_t dominant_io_bytes = 0;
  double busy_queue_depth = 0;
  std::optional<double> recall, rel_error;
  double gpu_hit_rate = 0, cpu_hit_rate = 0;
  uint64_t wasted_prefetch_bytes = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p * v.size())) - (p > 0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

absl::StatusOr<Row> RunSystem(const Workload& w, const System& sys, double budget,
                              Fidelity* fidelity, Fio* fio) {
  const Flags& f = w.flags();
  EngineOptions o;
  o.create_if_missing = false;
  if (sys.kind == Kind::kCkv) {
    o.gpu_tier_bytes = f.gpu_tier_bytes;
    o.cpu_tier_bytes = f.cpu_tier_bytes;
  }
  CKV_ASSIGN_OR_RETURN(auto engine, Engine::Open(o, StorePath(f, sys.layout)));
  engine::SessionHost& host = engine::HostOf(*engine);
  CKV_RETURN_IF_ERROR(host.store().ResetUsage().status());  // every system starts from no history
  CKV_ASSIGN_OR_RETURN(prefetch::ReadEngine * reads, host.reads());
  std::unique_ptr<storage::File> key_file;
  prefetch::FileId key_id = 0;
  BaselineState state;
  if (sys.kind != Kind::kCkv) {
    // The baselines' tiers: the same budgets, the original's policy.
    state.tiers = std::make_unique<engine::TierManager>(f.gpu_tier_bytes, f.cpu_tier_bytes);
  }
  if (NeedsKeyFile(sys.kind)) {
    CKV_ASSIGN_OR_RETURN(key_file, storage::PosixFileSystem()->Open(
                                       f.store + "/keys.bin", storage::FileSystem::OpenMode::kReadWrite));
    CKV_ASSIGN_OR_RETURN(key_id, reads->RegisterFile(key_file.get()));
  }
  ModelledGpu gpu(f.gpu_tflops * 1e12);
  ScoringClock clock(reads, &gpu, /*hold_reads=*/f.concurrency == 1);
  engine::SetSelectorClock(*engine, &clock);
  Runner runner(w, sys, budget, engine.get(), reads, key_id, &gpu, &clock, &state);

  std::vector<Request> warm, measured;
  for (const Request& r : w.requests()) (r.warmup ? warm : measured).push_back(r);
  std::vector<RequestResult> results(measured.size());

  // Closed loop: `concurrency` workers take the next request as they finish one.
  auto run_all = [&](const std::vector<Request>& reqs,
                     std::vector<RequestResult>* into) -> absl::Status {
    std::atomic<size_t> next{0};
    absl::Mutex mu;
    absl::Status first;
    auto worker = [&]() {
      for (;;) {
        const size_t i = next.fetch_add(1);
        if (i >= reqs.size()) return;
        const auto queries = w.Queries(reqs[i]);
        auto res = runner.Run(reqs[i], queries);
        absl::MutexLock lock(&mu);
        if (!res.ok()) {
          if (first.ok()) first = res.status();
          continue;
        }
        if (into != nullptr) (*into)[i] = std::move(*res);
      }
    };
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < f.concurrency; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    return first;
  };
  CKV_RETURN_IF_ERROR(run_all(warm, nullptr));
  const prefetch::ReadEngineStats before = reads->stats();
  CKV_RETURN_IF_ERROR(run_all(measured, &results));
  const prefetch::ReadEngineStats after = reads->stats();

  Row row;
  row.system = sys.name;
  row.budget = budget;
  row.config = sys.kind == Kind::kCkv
                   ? absl::StrCat(std::string(SelectorName(sys.selector)), ", ", LayoutName(sys.layout),
                                  sys.selector == Selector::kPeriodExact || sys.period_selection
                                      ? absl::StrCat(", one selection per ", sys.period, " layers")
                                      : ", every layer scored",
                                  sys.prefetch ? ", prefetch" : ", no prefetch", ", S=IxF tiers")
                   : sys.kind == Kind::kFull ? "all chunks, layer-major runs, next-layer preload, LRU tiers"
                   : sys.kind == Kind::kH2o ? "all keys + selected values, next-layer key preload, LRU tiers"
                   : "3 probe heads, 64-token blocks, identify-then-load, freq x share tiers";
  row.requests = results.size();
  std::vector<double> lat;
  uint64_t hits_gpu = 0, hits_cpu = 0, records = 0;
  for (const RequestResult& r : results) {
    lat.push_back(r.latency_s * 1e3);
    row.scoring_ms += r.scoring_s * 1e3;
    row.wall_ms += r.wall_s * 1e3;
    row.bubble_ms += r.blocked_s * 1e3;
    row.bytes_needed += r.bytes_needed;
    row.bytes_read += r.bytes_read;
    row.wasted_prefetch_bytes += r.wasted_prefetch_bytes;
    hits_gpu += r.gpu_hits;
    hits_cpu += r.cpu_hits;
    records += r.gpu_hits + r.cpu_hits + r.nvme_records;
  }
  const double nreq = std::max<size_t>(1, results.size());
  row.mean_ms = std::accumulate(lat.begin(), lat.end(), 0.0) / nreq;
  row.p50_ms = Percentile(lat, 0.5);
  row.p95_ms = Percentile(lat, 0.95);
  row.scoring_ms /= nreq;
  row.wall_ms /= nreq;
  row.bubble_ms /= nreq;
  row.read_amplification = row.bytes_needed ? double(row.bytes_read) / row.bytes_needed : 0;
  row.gpu_hit_rate = records ? double(hits_gpu) / records : 0;
  row.cpu_hit_rate = records ? double(hits_cpu) / records : 0;
  const double busy = after.busy_seconds - before.busy_seconds;
  const uint64_t dev_bytes = after.bytes_read - before.bytes_read;
  const uint64_t ios = after.ios_issued - before.ios_issued;
  row.device_mb_s = busy > 0 ? dev_bytes / busy / 1e6 : 0;
  row.dominant_io_bytes = ios ? dev_bytes / ios : 0;
  // Reads in flight while the device was busy, time-weighted.
  const double area = after.mean_queue_depth * after.elapsed_seconds -
                      before.mean_queue_depth * before.elapsed_seconds;
  row.busy_queue_depth = busy > 0 ? area / busy : 0;
  if (NeedsKeyFile(sys.kind)) CKV_RETURN_IF_ERROR(reads->UnregisterFile(key_id));
  engine::SetSelectorClock(*engine, nullptr);
  engine.reset();  // the device to fio alone
  if (fio != nullptr && row.dominant_io_bytes > 0) row.fio_mb_s = fio->MbPerS(row.dominant_io_bytes,
                                static_cast<uint32_t>(std::lround(row.busy_queue_depth)),
                                StorePath(f, sys.layout));
  if (fio != nullptr && row.dominant_io_bytes > 0) {
    row.fio_full_depth_mb_s = fio->MbPerS(row.dominant_io_bytes, prefetch::ReadEngineOptions{}.queue_depth,
                                          StorePath(f, sys.layout));
  }
  if (fidelity != nullptr) {
    double rs = 0, es = 0;
    size_t k = 0;
    for (size_t i = 0; i < measured.size() && k < f.fidelity_requests; ++i, ++k) {
      double rec = 0, err = 0;
      CKV_RETURN_IF_ERROR(fidelity->Measure(measured[i], w.Queries(measured[i]), results[i].loaded, &rec, &err));
      rs += rec;
      es += err;
    }
    if (k > 0) {
      row.recall = rs / k;
      row.rel_error = es / k;
    }
  }
  return row;
}

// ---------------------------------------------------------------------------------------------
// Output.

void PrintTable(const std::vector<Row>& rows, const std::map<double, double>& impress,
                const std::map<double, double>& full) {
  std::printf("%-32s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s %7s %6s %6s %6s %7s\n", "system",
              "budget", "mean ms", "p50 ms", "p95 ms", "vs imp", "vs full", "MB read", "read amp",
              "dev MB/s", "fio MB/s", "recall", "gpu %", "cpu %", "wall", "cpu sc");
  for (const Row& r : rows) {
    const auto ratio = [&](const std::map<double, double>& base) {
      auto it = base.find(r.budget);
      return it == base.end() || r.mean_ms <= 0 ? std::string("-")
                                                : absl::StrFormat("%.2fx", it->second / r.mean_ms);
    };
    const std::string recall = r.recall ? absl::StrFormat("%.3f", *r.recall) : "-";
    std::printf("%-32s %5.0f%% %8.1f %8.1f %8.1f %8s %8s %8.1f %8.2f %8.0f %8.0f %7s %6.1f %6.1f %6.0f %7.1f\n",
                r.system.c_str(), r.budget * 100, r.mean_ms, r.p50_ms, r.p95_ms,
                ratio(impress).c_str(), ratio(full).c_str(),
                r.bytes_read / 1e6 / std::max<size_t>(1, r.requests), r.read_amplification,
                r.device_mb_s, r.fio_mb_s, recall.c_str(), r.gpu_hit_rate * 100,
                r.cpu_hit_rate * 100, r.wall_ms, r.scoring_ms);
  }
}

std::string ToJson(const Workload& w, const std::vector<Row>& rows) {
  const Flags& f = w.flags();
  tools::JsonWriter j;
  j.BeginObject();
  j.Key("workload").BeginObject().Key("model").String(f.model);
  j.Key("prefix_tokens").Uint(f.prefix_tokens).Key("suffix_tokens").Uint(f.suffix_tokens);
  j.Key("conversations").Uint(f.conversations).Key("turns").Uint(f.turns);
  j.Key("warmup_turns").Uint(f.warmup_turns).Key("system_prompt_share").Double(f.system_prompt_share);
  j.Key("concurrency").Uint(f.concurrency).Key("window").Uint(f.window);
  j.Key("gpu_tier_bytes").Uint(f.gpu_tier_bytes).Key("cpu_tier_bytes").Uint(f.cpu_tier_bytes);
  j.Key("gpu_tflops").Double(f.gpu_tflops).Key("seed").Uint(f.seed);
  j.Key("store_bytes").Uint(uint64_t(w.stored_tokens() / w.spec().chunk_tokens) *
                            w.spec().RecordBytes() * w.spec().layers * f.conversations);
  j.EndObject();
  j.Key("results").BeginArray();
  for (const Row& r : rows) {
    j.BeginObject().Key("system").String(r.system).Key("config").String(r.config);
    j.Key("budget").Double(r.budget).Key("requests").Uint(r.requests);
    j.Key("latency_ms").BeginObject().Key("mean").Double(r.mean_ms).Key("p50").Double(r.p50_ms);
    j.Key("p95").Double(r.p95_ms).EndObject();
    j.Key("wall_ms").Double(r.wall_ms).Key("scoring_cpu_ms").Double(r.scoring_ms).Key("bubble_ms").Double(r.bubble_ms);
    j.Key("bytes_needed").Uint(r.bytes_needed).Key("bytes_read").Uint(r.bytes_read);
    j.Key("read_amplification").Double(r.read_amplification);
    j.Key("device_mb_s").Double(r.device_mb_s).Key("fio_mb_s").Double(r.fio_mb_s);
    j.Key("fio_engine_depth_mb_s").Double(r.fio_full_depth_mb_s);
    j.Key("dominant_io_bytes").Uint(r.dominant_io_bytes);
    j.Key("queue_depth").Double(r.busy_queue_depth);
    j.Key("attention_recall");
    if (r.recall) j.Double(*r.recall); else j.Null();
    j.Key("output_rel_error");
    if (r.rel_error) j.Double(*r.rel_error); else j.Null();
    j.Key("hit_rate").BeginObject().Key("gpu").Double(r.gpu_hit_rate).Key("cpu").Double(r.cpu_hit_rate);
    j.EndObject();
    j.Key("wasted_prefetch_bytes").Uint(r.wasted_prefetch_bytes);
    j.EndObject();
  }
  j.EndArray().EndObject();
  return j.str();
}

void Plot(const Workload& w, const std::vector<Row>& rows, const std::vector<std::string>& systems) {
  const Flags& f = w.flags();
  std::string s = "set terminal png size 1200,520\nset output '" + f.plot + "'\n";
  s += "set multiplot layout 1,2 title 'Re-Prefill, " + f.model + ", " +
       std::to_string(f.prefix_tokens) + "-token prefixes, " + std::to_string(f.suffix_tokens) +
       "-token suffixes'\n";
  s += "set xlabel 'budget (% of the prefix)'\nset key below\nset grid\nset logscale y\n";
  auto series = [&](const char* ylabel, auto value) {
    s += std::string("set ylabel '") + ylabel + "'\nplot ";
    for (size_t i = 0; i < systems.size(); ++i) {
      s += "'-' with linespoints lw 2 title '" + systems[i] + "'";
      s += i + 1 < systems.size() ? ", " : "\n";
    }
    for (const std::string& name : systems) {
      for (const Row& r : rows) {
        if (r.system == name) s += absl::StrFormat("%g %g\n", r.budget * 100, value(r));
      }
      s += "e\n";
    }
  };
  series("mean Re-Prefill latency (ms)", [](const Row& r) { return r.mean_ms; });
  series("read amplification (bytes read / needed)",
         [](const Row& r) { return std::max(r.read_amplification, 1e-3); });
  s += "unset multiplot\n";
  FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr || std::fwrite(s.data(), 1, s.size(), gp) != s.size() || pclose(gp) != 0) {
    std::fprintf(stderr, "%s: gnuplot failed; no plot drawn\n", kProg);
    return;
  }
  std::printf("plot: %s\n", f.plot.c_str());
}

int Run(const Flags& f) {
  auto spec = ModelSpec::Preset(f.model);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, spec.status().ToString().c_str());
    return kExitUsage;
  }
  if (auto arch = ArchOf(f.model); !arch.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, arch.status().ToString().c_str());
    return kExitUsage;
  }
  std::vector<System> systems;
  std::set<RecordLayout> layouts;
  bool need_keys = false;
  for (const std::string& name : f.systems) {
    auto s = ParseSystem(name);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, s.status().ToString().c_str());
      return kExitUsage;
    }
    layouts.insert(s->layout);
    need_keys |= NeedsKeyFile(s->kind);
    systems.push_back(*s);
  }
  const Workload w(f, *spec);
  if (absl::Status st = Populate(w, layouts, need_keys); !st.ok()) {
    std::fprintf(stderr, "%s: populating %s: %s\n", kProg, f.store.c_str(), st.ToString().c_str());
    return 1;
  }
  std::unique_ptr<Fidelity> fidelity;
  if (f.fidelity) fidelity = std::make_unique<Fidelity>(w);
  std::unique_ptr<Fio> fio;
  if (f.fio) fio = std::make_unique<Fio>(f, prefetch::ReadEngineOptions{}.queue_depth);
  std::vector<Row> rows;
  std::map<double, double> impress, full;
  for (const System& sys : systems) {
    for (double b : f.budgets) {
      if (sys.kind == Kind::kFull && b != f.budgets.front()) {
        // full loads everything at every budget: run once, report at each.
        Row copy = rows.back();
        copy.budget = b;
        rows.push_back(copy);
        full[b] = copy.mean_ms;
        continue;
      }
      std::fprintf(stderr, "%s: %s at %.0f%% ...\n", kProg, sys.name.c_str(), b * 100);
      auto row = RunSystem(w, sys, b, fidelity.get(), fio.get());
      if (!row.ok()) {
        std::fprintf(stderr, "%s: %s at %.0f%%: %s\n", kProg, sys.name.c_str(), b * 100,
                     row.status().ToString().c_str());
        return 1;
      }
      if (sys.kind == Kind::kImpress) impress[b] = row->mean_ms;
      if (sys.kind == Kind::kFull) full[b] = row->mean_ms;
      rows.push_back(*row);
    }
  }
  PrintTable(rows, impress, full);
  if (!f.json.empty()) {
    std::ofstream out(f.json, std::ios::trunc);
    out << ToJson(w, rows) << "\n";
    if (!out) {
      std::fprintf(stderr, "%s: cannot write %s\n", kProg, f.json.c_str());
      return 1;
    }
  }
  if (!f.plot.empty()) Plot(w, rows, f.systems);
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  ckv::bench::Flags flags;
  if (absl::Status st = ckv::bench::ParseFlags(argc, argv, &flags); !st.ok()) {
    std::fprintf(stderr, "reprefill_bench: %s\n", std::string(st.message()).c_str());
    ckv::bench::Usage(stderr);
    return ckv::bench::kExitUsage;
  }
  return ckv::bench::Run(flags);
}
