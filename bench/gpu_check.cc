// SPDX-License-Identifier: Apache-2.0
// bench/gpu_check: what a GPU really takes, beside what the Re-Prefill benchmark's modelled GPU
// (bench/reprefill/gpu_model.h) charges for it. docs/kernels.md, "The device check", says how
// to run it and what each row means.
//
// On a qwen2.5-7b-shaped layer (8K-token prefix, 64 suffix tokens, a window of 32 queries; the
// reprefill_bench defaults) with seeded random K, V and queries, it:
//   - kernels.*    runs the CUDA selection kernels (kernels/cuda_kernels.h) against their CPU
//                  counterparts and times each call (copies in and out included: their form);
//   - tier.*       admits, looks up and demotes 7b records through a TierManager over the CUDA
//                  DeviceMemory, compares every byte read back, times Admit and Lookup;
//   - pcie.*       times cudaMemcpyAsync host to device from page-locked memory at the sizes the
//                  benchmark moves (one record; one layer's load at 5%, 25%, 100% of the prefix);
//   - launch.*     times a layer's worth of kernel launches;
//   - hbm.*        times one read of a layer's weights from device memory (the model's HBM term);
//   - attention.*  runs an exact attention kernel (bench/gpu_check_device.cu) over the records of
//                  the chunks a 5/10/25/50/100% selection loads, checks it against the CPU's
//                  ReferenceAttention and times the kernel alone,
// and prints every modelled time (compute, PCIe, launch) beside the measured one.
//
// --dry-run runs without a device: the CPU paths are compared against themselves (the scalar
// path against the dispatched one, AVX2 where present) where a CUDA path would be, those rows
// say "skipped: no device" (a CPU disagreement still fails), measured figures are null ("n/a"),
// every modelled figure is printed, and the JSON has the same schema. Without --dry-run a
// missing device is exit 2, naming kernels::cuda::DeviceAvailable()'s reason. A failed
// correctness check is exit 1; any other error exit 3.
//
// --budget-s bounds the run: each timed row takes at most a quarter of what is left of it
// (fewer repetitions, down to one; none once it is spent: "skipped: budget").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/reprefill/flags.h"
#include "bench/reprefill/gpu_model.h"
#include "ckv/model_spec.h"
#include "ckv/status.h"
#include "engine/tier_cache.h"
#include "kernels/attention.h"
#include "kernels/cpu_path.h"
#include "kernels/cuda_kernels.h"
#include "kernels/device_memory.h"
#include "kernels/half.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "tools/cli.h"
#include "tools/json_writer.h"

#if defined(CKV_HAVE_CUDA)
#include "bench/gpu_check_device.h"
#include "common/status_macros.h"
#endif

namespace ckv::bench {
namespace {

constexpr const char* kProgram = "gpu_check";
constexpr int kExitCheckFailed = 1;
// Kernels per decoder layer that the model's --launch-us stands for (docs/baselines.md,
// "Compute model": two RMSNorms, QKV and output projections, RoPE, attention, gate-up, SiLU
// product, down).
constexpr int kKernelsPerLayer = 9;
// The budgets of the attention rows: the shares of the prefix a system loads.
constexpr double kContextShares[] = {0.05, 0.10, 0.25, 0.50, 1.0};
// The layer whose summaries the selectors read (any layer: the data are random).
constexpr uint32_t kLayer = 2;
// Tolerances. Scores: a share of the largest score, as tests/kernels/kernels_cuda_test.cc allows
// (the reductions run in another order). Attention outputs: a share of the largest |output| (sums
// over thousands of tokens, expf against the CPU's exp). Gather: bit-exact.
constexpr double kScoreTolerance = 1e-4;
constexpr double kAttentionTolerance = 1e-3;

// The "check" column.
constexpr const char* kPass = "pass";
constexpr const char* kFail = "fail";
constexpr const char* kNotACheck = "n/a";
constexpr const char* kSkippedBudget = "skipped: budget";

struct Options {
  bool dry_run = false;
  double budget_s = 200;
  uint32_t reps = 20;
  std::string model = "qwen2.5-7b";
  // The benchmark's defaults (bench/reprefill/flags.h).
  uint32_t prefix_tokens = Flags{}.prefix_tokens;
  uint32_t suffix_tokens = Flags{}.suffix_tokens;
  uint32_t window = Flags{}.window;
  double gpu_tflops = Flags{}.gpu_tflops;
  double hbm_gb_s = Flags{}.hbm_gb_s;
  double launch_us = Flags{}.launch_us;
  double pcie_gb_s = Flags{}.pcie_gb_s;
  uint64_t seed = 1;
  cli::JsonOutput json;
};

// One row of the report. Times in ms, bandwidths in GB/s (`unit`).
struct Row {
  std::string name;
  std::string unit;
  std::optional<double> measured;
  std::optional<double> modelled;
  std::string check = kNotACheck;
  // What the correctness comparison compared: "cuda vs cpu", "cpu scalar vs cpu dispatched"
  // (dry run), or "" when the row is not a check.
  std::string compared;
  std::optional<double> max_abs_error;
  std::optional<double> tolerance;
  uint32_t reps = 0;
  uint64_t bytes = 0;
  std::string detail;
  // Further figures, named with their unit ("modelled_pcie_ms").
  std::vector<std::pair<std::string, std::optional<double>>> extra;
};

// The deadline of --budget-s.
class Budget {
 public:
  explicit Budget(double seconds)
      : deadline_(std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds))) {}
  double LeftSeconds() const {
    return std::chrono::duration<double>(deadline_ - std::chrono::steady_clock::now()).count();
  }
  // Repetitions, after one that took `first_s`, that fit in a quarter of what is left: between
  // 0 and `want` (0 once the budget is spent).
  uint32_t Reps(uint32_t want, double first_s) const {
    const double left = LeftSeconds();
    if (left <= 0) return 0;
    const double fit = 0.25 * left / std::max(first_s, 1e-6);
    return static_cast<uint32_t>(std::clamp(std::floor(fit), 1.0, static_cast<double>(want)));
  }
  bool Spent() const { return LeftSeconds() <= 0; }

 private:
  const std::chrono::steady_clock::time_point deadline_;
};

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double WallSeconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// max |a - b|, and max |b| (the scale the tolerance is a share of). Sizes must agree.
struct Difference {
  double max_abs = 0;
  double scale = 0;
  bool sizes_differ = false;
};
Difference Compare(std::span<const float> got, std::span<const float> want) {
  Difference d;
  if (got.size() != want.size()) {
    d.sizes_differ = true;
    return d;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    // A NaN on either side is an error as large as it gets.
    d.max_abs = std::isnan(e) ? INFINITY : std::max(d.max_abs, e);
    d.scale = std::max(d.scale, std::fabs(static_cast<double>(want[i])));
  }
  return d;
}

// Host memory aligned to pages, page-locked for DMA when `pin` (kernels::cuda::PinHostMemory),
// released on destruction.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (pinned_) kernels::cuda::UnpinHostMemory(data_);
    std::free(data_);
  }
  absl::Status Allocate(size_t bytes, bool pin) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    data_ = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    if (data_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host buffer of ", rounded, " bytes"));
    }
    std::memset(data_, 0, rounded);
    size_ = bytes;
    if (pin) {
      if (absl::Status s = kernels::cuda::PinHostMemory(data_, rounded); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("page-locking ", rounded,
                                                   " bytes of host memory: ", s.message()));
      }
      pinned_ = true;
    }
    return absl::OkStatus();
  }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

// One layer of a prefix: its records back to back, their summaries, the selectors' window of
// queries and the suffix's queries.
struct Layer {
  ModelSpec spec;
  kernels::KvShape shape;
  kernels::SummaryFormat format;
  size_t chunks = 0;
  HostBuffer records;
  std::vector<std::byte> minmax, mean;
  std::vector<const std::byte*> record_ptr, minmax_ptr, mean_ptr;
  std::vector<float> window_queries;  // [window, q_heads, head_dim]
  std::vector<float> suffix_queries;  // [suffix, q_heads, head_dim]
  uint32_t window = 0;
  uint32_t suffix = 0;

  kernels::SelectorInput Input() const {
    kernels::SelectorInput in;
    in.shape = shape;
    in.layers = spec.layers;
    in.layer = kLayer;
    in.queries = window_queries;
    in.window = window;
    in.chunks = chunks;
    in.minmax = minmax_ptr;
    in.mean = mean_ptr;
    in.records = record_ptr;
    return in;
  }
};

absl::Status MakeLayer(const Options& o, bool pin, Layer* l) {
  CKV_ASSIGN_OR_RETURN(l->spec, ModelSpec::Preset(o.model));
  l->shape = kernels::KvShape::Of(l->spec);
  l->format = kernels::SummaryFormat::For(l->spec);
  l->chunks = o.prefix_tokens / l->spec.chunk_tokens;
  if (l->chunks < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--prefix-tokens ", o.prefix_tokens,
                                                   ": fewer than 2 chunks of ",
                                                   l->spec.chunk_tokens, " tokens"));
  }
  l->window = o.window;
  l->suffix = o.suffix_tokens;
  const size_t rb = l->shape.record_bytes();
  CKV_RETURN_IF_ERROR(l->records.Allocate(l->chunks * rb, pin));
  l->minmax.resize(l->chunks * l->format.MinMaxBytes());
  l->mean.resize(l->chunks * l->format.MeanBytes());
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::normal_distribution<float> normal;
  std::vector<float> x(rb / kernels::ElementBytes(l->shape.dtype));
  for (size_t j = 0; j < l->chunks; ++j) {
    for (float& v : x) v = normal(rng);
    std::byte* rec = l->records.data() + j * rb;
    kernels::FromFloat(l->shape.dtype, x.data(), x.size(), rec);
    std::byte* mm = l->minmax.data() + j * l->format.MinMaxBytes();
    std::byte* me = l->mean.data() + j * l->format.MeanBytes();
    kernels::SummarizeChunkLayer(l->spec, kLayer, std::span(rec, l->shape.half_record_bytes()),
                                 std::span(mm, l->format.MinMaxBytes()),
                                 std::span(me, l->format.MeanBytes()));
    l->record_ptr.push_back(rec);
    l->minmax_ptr.push_back(mm);
    l->mean_ptr.push_back(me);
  }
  const size_t per_query = size_t{l->shape.q_heads} * l->shape.head_dim;
  l->window_queries.resize(size_t{l->window} * per_query);
  l->suffix_queries.resize(size_t{l->suffix} * per_query);
  for (float& v : l->window_queries) v = normal(rng);
  for (float& v : l->suffix_queries) v = normal(rng);
  return absl::OkStatus();
}

// Where the CUDA parts run, and the reason they do not.
struct Device {
  bool use = false;
  std::string skipped;  // "skipped: no device" or "skipped: dry run" when !use
  std::string reason;   // DeviceAvailable()'s message when it is not OK
};

class Check {
 public:
  Check(const Options& o, const Device& d, const Layer& l)
      : o_(o), device_(d), layer_(l), budget_(o.budget_s), arch_(*ArchOf(o.model)), gpu_([&] {
          GpuParams p;
          p.flops_per_s = o.gpu_tflops * 1e12;
          p.hbm_bytes_per_s = o.hbm_gb_s * 1e9;
          p.launch_s = o.launch_us * 1e-6;
          p.pcie_bytes_per_s = o.pcie_gb_s * 1e9;
          return p;
        }()) {}

  void Run() {
    Kernels();
    Tier();
    Pcie();
    Launch();
    Weights();
    Attention();
  }
  const std::vector<Row>& rows() const { return rows_; }
  const GpuParams& gpu() const { return gpu_; }

 private:
  double PcieMs(double bytes) const { return bytes / gpu_.pcie_bytes_per_s * 1e3; }

  // A correctness row: `cpu` against `cuda` on a device (timing `cuda`), else the CPU's scalar
  // path against its dispatched one.
  using Floats = absl::StatusOr<std::vector<float>>;
  void KernelRow(Row row, double relative_tolerance, const std::function<Floats()>& cpu,
                 const std::function<Floats()>& cuda) {
    Floats want = cpu();
    if (!want.ok()) return Fail(std::move(row), want.status());
    Floats got;
    if (device_.use) {
      row.compared = "cuda vs cpu";
      std::vector<double> ms;
      const double first = WallSeconds([&] { got = cuda(); });
      if (!got.ok()) return Fail(std::move(row), got.status());
      const uint32_t reps = budget_.Reps(o_.reps, first);
      for (uint32_t i = 0; i < reps; ++i) {
        Floats again;
        ms.push_back(WallSeconds([&] { again = cuda(); }) * 1e3);
        if (!again.ok()) return Fail(std::move(row), again.status());
      }
      row.reps = reps;
      if (reps > 0) row.measured = Median(ms);
    } else {
      row.compared = "cpu scalar vs cpu dispatched";
      kernels::SetCpuPath(kernels::CpuPath::kScalar);
      got = cpu();
      kernels::SetCpuPath(kernels::CpuPath::kAuto);
      if (!got.ok()) return Fail(std::move(row), got.status());
    }
    Judge(std::move(row), *got, *want, relative_tolerance);
  }

  // Sets the error columns and the check, and adds the row.
  void Judge(Row row, std::span<const float> got, std::span<const float> want,
             double relative_tolerance) {
    const Difference d = Compare(got, want);
    if (d.sizes_differ) {
      row.check = kFail;
      row.detail = absl::StrCat(got.size(), " values against ", want.size(), "; ", row.detail);
      rows_.push_back(std::move(row));
      return;
    }
    row.max_abs_error = d.max_abs;
    row.tolerance = relative_tolerance * d.scale;
    const bool ok = d.max_abs <= *row.tolerance;
    if (device_.use) {
      row.check = ok ? kPass : kFail;
    } else {
      row.check = ok ? device_.skipped : kFail;
      row.detail =
          absl::StrCat(ok ? "CPU self-check agrees; " : "CPU self-check DISAGREES; ", row.detail);
    }
    rows_.push_back(std::move(row));
  }

  void Fail(Row row, const absl::Status& status) {
    row.check = kFail;
    row.detail = absl::StrCat(row.detail.empty() ? "" : row.detail + "; ", status.ToString());
    rows_.push_back(std::move(row));
  }

  void Kernels() {
    const kernels::SelectorInput in = layer_.Input();
    const kernels::SelectOptions so;
    const auto modelled = [&](kernels::SelectorKind kind) {
      return kernels::ScoringFlops(kind, in, so) / gpu_.flops_per_s * 1e3;
    };
    const std::string form = "wall time of one call, copies in and out included";
    Row quest;
    quest.name = "kernels.quest";
    quest.unit = "ms";
    quest.modelled = modelled(kernels::SelectorKind::kQuest);
    quest.detail = absl::StrCat(layer_.chunks, " chunks; ", form);
    KernelRow(
        std::move(quest), kScoreTolerance,
        [&] { return kernels::ScoreChunks(kernels::SelectorKind::kQuest, in, so); },
        [&] { return kernels::cuda::QuestScores(in); });
    Row mean;
    mean.name = "kernels.mean_key";
    mean.unit = "ms";
    mean.modelled = modelled(kernels::SelectorKind::kMeanKey);
    mean.detail = absl::StrCat(layer_.chunks, " chunks; ", form);
    KernelRow(
        std::move(mean), kScoreTolerance,
        [&] { return kernels::ScoreChunks(kernels::SelectorKind::kMeanKey, in, so); },
        [&] { return kernels::cuda::MeanKeyScores(in); });
    Row token;
    token.name = "kernels.token_attention";
    token.unit = "ms";
    token.modelled = modelled(kernels::SelectorKind::kPeriodExact);
    token.detail = absl::StrCat("period-exact's scoring, ", layer_.window, " queries over ",
                                layer_.chunks * layer_.shape.chunk_tokens, " tokens; ", form);
    KernelRow(
        std::move(token), kScoreTolerance,
        [&] {
          return kernels::TokenAttention(layer_.shape, layer_.window_queries, layer_.window,
                                         layer_.record_ptr);
        },
        [&] {
          return kernels::cuda::TokenAttention(layer_.shape, layer_.window_queries, layer_.window,
                                               layer_.record_ptr);
        });
    // Gather of a 10% selection: K and V side by side in one float vector, compared bit for
    // bit (a tolerance of 0).
    kernels::SelectOptions ten;
    ten.budget_fraction = 0.10;
    absl::StatusOr<kernels::Selection> sel =
        kernels::Select(kernels::SelectorKind::kQuest, in, ten);
    Row gather;
    gather.name = "kernels.gather";
    gather.unit = "ms";
    gather.detail = "10% of the chunks (quest's choice); the model charges no gather time; " + form;
    if (!sel.ok()) return Fail(std::move(gather), sel.status());
    const std::vector<uint32_t> chosen = sel->chunks;
    const auto flat = [](absl::StatusOr<kernels::GatheredKv> kv) -> Floats {
      if (!kv.ok()) return kv.status();
      std::vector<float> all = std::move(kv->k);
      all.insert(all.end(), kv->v.begin(), kv->v.end());
      for (uint32_t p : kv->positions) all.push_back(static_cast<float>(p));
      return all;
    };
    KernelRow(
        std::move(gather), 0.0,
        [&] { return flat(kernels::Gather(layer_.shape, layer_.record_ptr, chosen)); },
        [&] { return flat(kernels::cuda::Gather(layer_.shape, layer_.record_ptr, chosen)); });
  }

  // Admits twice as many records as the GPU tier holds, with rising scores, so that every later
  // record displaces an earlier one into the CPU tier (a device-to-host copy on a device); then
  // looks every one up and compares its bytes with what went in.
  void Tier() {
    const size_t rb = layer_.shape.record_bytes();
    const size_t gpu_records = std::min<size_t>(128, layer_.chunks / 2);
    const size_t admitted = 2 * gpu_records;
    Row admit;
    admit.name = "tier.admit";
    admit.unit = "ms";
    admit.modelled = PcieMs(rb);
    admit.bytes = rb;
    admit.detail =
        "per record, wall time of TierManager::Admit into the GPU tier; modelled: its PCIe "
        "crossing";
    Row lookup;
    lookup.name = "tier.lookup";
    lookup.unit = "ms";
    lookup.bytes = rb;
    lookup.detail =
        "per record, wall time of TierManager::Lookup; the model charges nothing for a tier hit";
    Row roundtrip;
    roundtrip.name = "tier.roundtrip";
    roundtrip.compared = device_.use ? "cuda vs cpu" : "host tier (device memory: host)";
    roundtrip.bytes = admitted * rb;
    std::unique_ptr<kernels::DeviceMemory> memory, readback;
    if (device_.use) {
      absl::StatusOr<std::unique_ptr<kernels::DeviceMemory>> m = kernels::NewCudaMemory(0);
      absl::StatusOr<std::unique_ptr<kernels::DeviceMemory>> r = kernels::NewCudaMemory(0);
      if (!m.ok() || !r.ok()) return Fail(std::move(roundtrip), m.ok() ? r.status() : m.status());
      memory = std::move(*m);
      readback = std::move(*r);
    } else {
      memory = kernels::NewHostMemory();
    }
    const std::string memory_name = memory->name();
    std::vector<double> admit_ms, lookup_ms;
    size_t at_gpu = 0, at_cpu = 0, missing = 0, differing = 0;
    absl::Status error, invariants;
    engine::TierStats gpu_stats;
    {
      engine::TierManager tiers(gpu_records * rb, 4 * gpu_records * rb, std::move(memory), nullptr,
                                /*summary_share=*/0);
      const auto id = [](size_t j) {
        return engine::RecordId{ChunkKey{0x6770755f636865ull, j + 1}, kLayer};
      };
      for (size_t j = 0; j < admitted && error.ok(); ++j) {
        std::span<const std::byte> bytes(layer_.record_ptr[j], rb);
        absl::StatusOr<engine::TierManager::Handle> h;
        admit_ms.push_back(
            WallSeconds([&] { h = tiers.Admit(id(j), bytes, static_cast<double>(j)); }) * 1e3);
        if (!h.ok()) error = h.status();
        // The handle is dropped at once: a pinned record could not be displaced.
      }
      std::vector<std::byte> back(rb);
      for (size_t j = 0; j < admitted && error.ok(); ++j) {
        engine::TierManager::Handle h;
        lookup_ms.push_back(WallSeconds([&] { h = tiers.Lookup(id(j)); }) * 1e3);
        if (!h) {
          ++missing;
          continue;
        }
        (h.level() == engine::TierLevel::kGpu ? at_gpu : at_cpu)++;
        const std::byte* bytes = h.data();
        if (h.device_pointer()) {
          absl::StatusOr<std::unique_ptr<kernels::CopyEvent>> copy =
              readback->CopyToHostAsync(back.data(), h.data(), rb);
          absl::Status done = copy.ok() ? (*copy)->Wait() : copy.status();
          if (!done.ok()) {
            error = done;
            break;
          }
          bytes = back.data();
        }
        if (h.size() != rb || std::memcmp(bytes, layer_.record_ptr[j], rb) != 0) ++differing;
      }
      invariants = tiers.CheckInvariants();
      gpu_stats = tiers.stats(engine::TierLevel::kGpu);
    }
    if (device_.use) {
      admit.reps = lookup.reps = static_cast<uint32_t>(admit_ms.size());
      admit.measured = Median(admit_ms);
      lookup.measured = Median(lookup_ms);
    } else {
      admit.detail += "; not timed on the host tier";
      lookup.detail += "; not timed on the host tier";
    }
    rows_.push_back(std::move(admit));
    rows_.push_back(std::move(lookup));
    roundtrip.detail =
        absl::StrCat(admitted, " records of ", rb, " bytes into a GPU tier of ", gpu_records, " (",
                     memory_name, "): ", at_gpu, " on the GPU, ", at_cpu, " demoted to the CPU, ",
                     missing, " missing, ", differing, " differing; GPU demotions ",
                     gpu_stats.demotions, ", errors ", gpu_stats.errors);
    const bool ok = error.ok() && invariants.ok() && missing == 0 && differing == 0 &&
                    at_gpu == gpu_records && at_cpu == admitted - gpu_records &&
                    gpu_stats.demotions == admitted - gpu_records;
    if (!error.ok()) roundtrip.detail += "; " + error.ToString();
    if (!invariants.ok()) roundtrip.detail += "; " + invariants.ToString();
    roundtrip.check = !ok ? kFail : device_.use ? kPass : device_.skipped;
    rows_.push_back(std::move(roundtrip));
  }

  void Pcie() {
    const size_t rb = layer_.shape.record_bytes();
    struct Size {
      std::string name;
      size_t bytes;
      std::string what;
    };
    std::vector<Size> sizes = {{"pcie.h2d.record", rb, "one record"}};
    for (double share : {0.05, 0.25, 1.0}) {
      kernels::SelectOptions so;
      so.budget_fraction = share;
      const size_t k = kernels::BudgetChunks(layer_.chunks, so);
      sizes.push_back({absl::StrFormat("pcie.h2d.layer_%03.0fpct", share * 100), k * rb,
                       absl::StrCat("one layer's load at ", share * 100, "%: ", k, " records")});
    }
    for (const Size& s : sizes) {
      Row row;
      row.name = s.name;
      row.unit = "GB/s";
      row.modelled = gpu_.pcie_bytes_per_s / 1e9;
      row.bytes = s.bytes;
      row.detail = s.what + ", cudaMemcpyAsync from page-locked memory, event-timed";
      row.extra = {{"modelled_ms", PcieMs(static_cast<double>(s.bytes))}, {"measured_ms", {}}};
#if defined(CKV_HAVE_CUDA)
      if (device_.use) {
        double first = 0;
        if (std::string e = gpu_device::TimeHostToDevice(layer_.records.data(), s.bytes, 1, &first);
            !e.empty()) {
          Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
          continue;
        }
        std::vector<double> ms(budget_.Reps(o_.reps, first * 1e-3 + 1e-4));
        if (!ms.empty()) {
          if (std::string e = gpu_device::TimeHostToDevice(layer_.records.data(), s.bytes,
                                                           static_cast<int>(ms.size()), ms.data());
              !e.empty()) {
            Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
            continue;
          }
          const double med = Median(ms);
          row.measured = static_cast<double>(s.bytes) / (med * 1e-3) / 1e9;
          row.extra[1].second = med;
        } else {
          row.check = kSkippedBudget;
        }
        row.reps = static_cast<uint32_t>(ms.size());
      }
#endif
      rows_.push_back(std::move(row));
    }
  }

  void Launch() {
    Row row;
    row.name = "launch.layer";
    row.unit = "ms";
    row.modelled = gpu_.launch_s * 1e3;
    row.detail = absl::StrCat(kKernelsPerLayer,
                              " empty kernels launched back to back and synchronised, host wall "
                              "time");
    row.extra = {{"measured_event_ms", {}}};
#if defined(CKV_HAVE_CUDA)
    if (device_.use) {
      double wall = 0, event = 0;
      if (std::string e = gpu_device::TimeLaunches(kKernelsPerLayer, 1, &wall, &event);
          !e.empty()) {
        return Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
      }
      const uint32_t reps = budget_.Reps(o_.reps * 5, wall * 1e-3);
      std::vector<double> walls(reps), events(reps);
      if (reps > 0) {
        if (std::string e = gpu_device::TimeLaunches(kKernelsPerLayer, static_cast<int>(reps),
                                                     walls.data(), events.data());
            !e.empty()) {
          return Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
        }
        row.measured = Median(walls);
        row.extra[0].second = Median(events);
      } else {
        row.check = kSkippedBudget;
      }
      row.reps = reps;
    }
#endif
    rows_.push_back(std::move(row));
  }

  void Weights() {
    const double bytes = LayerWeightBytes(layer_.spec, arch_);
    Row row;
    row.name = "hbm.layer_weights";
    row.unit = "ms";
    row.modelled = bytes / gpu_.hbm_bytes_per_s * 1e3;
    row.bytes = static_cast<uint64_t>(bytes);
    row.detail = "one read of a layer's weights from device memory (the model's HBM term)";
    row.extra = {{"modelled_gb_s", gpu_.hbm_bytes_per_s / 1e9}, {"measured_gb_s", {}}};
#if defined(CKV_HAVE_CUDA)
    if (device_.use) {
      double first = 0;
      if (std::string e = gpu_device::TimeDeviceRead(static_cast<size_t>(bytes), 1, &first);
          !e.empty()) {
        return Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
      }
      std::vector<double> ms(budget_.Reps(o_.reps, first * 1e-3 + 0.01));
      if (!ms.empty()) {
        if (std::string e = gpu_device::TimeDeviceRead(static_cast<size_t>(bytes),
                                                       static_cast<int>(ms.size()), ms.data());
            !e.empty()) {
          return Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
        }
        row.measured = Median(ms);
        row.extra[1].second = bytes / (*row.measured * 1e-3) / 1e9;
      } else {
        row.check = kSkippedBudget;
      }
      row.reps = static_cast<uint32_t>(ms.size());
    }
#endif
    rows_.push_back(std::move(row));
    // The FLOPs of the projections and the MLP: modelled only.
    const double s = layer_.suffix;
    Row flops;
    flops.name = "model.layer_weight_flops";
    flops.unit = "ms";
    flops.modelled = LayerFlops(layer_.spec, arch_, s, -s) / gpu_.flops_per_s * 1e3;
    flops.detail = absl::StrCat("projections and MLP for ", layer_.suffix,
                                " tokens at --gpu-tflops; not measured: no GEMM is run (cuBLAS is "
                                "not linked)");
    rows_.push_back(std::move(flops));
  }

  // Exact attention of the suffix's queries over the records a selection of each share loads.
  void Attention() {
    const kernels::SelectorInput in = layer_.Input();
    const size_t rb = layer_.shape.record_bytes();
    const double s = layer_.suffix;
    HostBuffer loaded;
    if (absl::Status st = loaded.Allocate(layer_.chunks * rb, device_.use); !st.ok()) {
      Row row;
      row.name = "attention";
      return Fail(std::move(row), st);
    }
    for (double share : kContextShares) {
      kernels::SelectOptions so;
      so.budget_fraction = share;
      absl::StatusOr<kernels::Selection> sel =
          kernels::Select(kernels::SelectorKind::kQuest, in, so);
      Row row;
      row.name = absl::StrFormat("attention.ctx_%03.0fpct", share * 100);
      row.unit = "ms";
      if (!sel.ok()) {
        Fail(std::move(row), sel.status());
        continue;
      }
      const size_t k = sel->chunks.size();
      const double context = static_cast<double>(k * layer_.shape.chunk_tokens);
      row.bytes = k * rb;
      // LayerFlops's attention term, 4 s (C + s) q_heads d, vanishes at C = -s, which leaves the
      // weights' term; the K and V that LayerSeconds reads from HBM are (C + s) tokens' worth.
      const double attn_flops =
          LayerFlops(layer_.spec, arch_, s, context) - LayerFlops(layer_.spec, arch_, s, -s);
      const double kv_bytes = (context + s) * layer_.spec.TokenBytesPerLayer() * 2.0;
      row.modelled = std::max(attn_flops / gpu_.flops_per_s, kv_bytes / gpu_.hbm_bytes_per_s) * 1e3;
      const double layer_s = LayerSeconds(layer_.spec, arch_, gpu_, s, context);
      row.extra = {
          {"tokens", context},
          {"modelled_attention_flops_ms", attn_flops / gpu_.flops_per_s * 1e3},
          {"modelled_attention_hbm_ms", kv_bytes / gpu_.hbm_bytes_per_s * 1e3},
          {"modelled_marginal_ms", (layer_s - LayerSeconds(layer_.spec, arch_, gpu_, s, 0)) * 1e3},
          {"modelled_launch_ms", gpu_.launch_s * 1e3},
          {"modelled_pcie_ms", PcieMs(static_cast<double>(row.bytes))},
          {"modelled_layer_ms", layer_s * 1e3},
      };
      row.detail = absl::StrCat(layer_.suffix, " queries over ", k, " chunks (quest's ",
                                share * 100, "%), kernel alone, event-timed");
      // What the system loaded, back to back as it lands on the device.
      for (size_t i = 0; i < k; ++i) {
        std::memcpy(loaded.data() + i * rb, layer_.record_ptr[sel->chunks[i]], rb);
      }
      // The CPU reference: on a device at every share; in a dry run, scalar against dispatched
      // at the smallest only (the scalar path over 8K tokens takes seconds).
      const bool reference = device_.use || share == kContextShares[0];
      if (!reference) {
        row.check = device_.skipped;
        row.detail += "; no CPU self-check at this share (time)";
        rows_.push_back(std::move(row));
        continue;
      }
      const auto cpu = [&]() -> Floats {
        absl::StatusOr<kernels::GatheredKv> kv =
            kernels::Gather(layer_.shape, layer_.record_ptr, sel->chunks);
        if (!kv.ok()) return kv.status();
        return kernels::ReferenceAttention(layer_.shape, layer_.suffix_queries, layer_.suffix, *kv);
      };
      Floats want = cpu();
      if (!want.ok()) {
        Fail(std::move(row), want.status());
        continue;
      }
      std::vector<float> got(want->size());
      if (device_.use) {
        row.compared = "cuda vs cpu";
#if defined(CKV_HAVE_CUDA)
        const gpu_device::AttentionShape shape{static_cast<int>(layer_.shape.q_heads),
                                               static_cast<int>(layer_.shape.kv_heads),
                                               static_cast<int>(layer_.shape.head_dim),
                                               static_cast<int>(layer_.shape.chunk_tokens), rb};
        if (layer_.shape.dtype != DType::kFp16) {
          Fail(std::move(row),
               absl::InvalidArgumentError("the attention kernel reads fp16 records only"));
          continue;
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(layer_.shape.head_dim));
        const unsigned char* bytes = reinterpret_cast<const unsigned char*>(loaded.data());
        double first = 0;
        const double first_wall = WallSeconds([&] {
          if (std::string e = gpu_device::Attention(shape, bytes, k, layer_.suffix_queries.data(),
                                                    static_cast<int>(layer_.suffix), scale, 1,
                                                    got.data(), &first);
              !e.empty()) {
            row.detail += "; CUDA: " + e;
            first = -1;
          }
        });
        if (first < 0) {
          Fail(std::move(row), absl::InternalError("attention kernel failed"));
          continue;
        }
        // Each call copies the records in again: the repetitions' budget counts its wall time.
        std::vector<double> ms(budget_.Reps(o_.reps, first_wall / 2));
        if (!ms.empty()) {
          if (std::string e = gpu_device::Attention(
                  shape, bytes, k, layer_.suffix_queries.data(), static_cast<int>(layer_.suffix),
                  scale, static_cast<int>(ms.size()), got.data(), ms.data());
              !e.empty()) {
            Fail(std::move(row), absl::InternalError(absl::StrCat("CUDA: ", e)));
            continue;
          }
          row.measured = Median(ms);
        }
        row.reps = static_cast<uint32_t>(ms.size());
#endif
      } else {
        row.compared = "cpu scalar vs cpu dispatched";
        kernels::SetCpuPath(kernels::CpuPath::kScalar);
        Floats scalar = cpu();
        kernels::SetCpuPath(kernels::CpuPath::kAuto);
        if (!scalar.ok()) {
          Fail(std::move(row), scalar.status());
          continue;
        }
        got = std::move(*scalar);
      }
      Judge(std::move(row), got, *want, kAttentionTolerance);
    }
  }

  const Options& o_;
  const Device& device_;
  const Layer& layer_;
  const Budget budget_;
  const Arch arch_;
  const GpuParams gpu_;
  std::vector<Row> rows_;
};

std::string Figure(const std::optional<double>& v) {
  if (!v.has_value()) return "n/a";
  const double x = *v;
  if (x != 0 && std::fabs(x) < 0.01) return absl::StrFormat("%.2e", x);
  return absl::StrFormat("%.4g", x);
}

void PrintTable(const Options& o, const Device& d, const std::string& device_line,
                const std::vector<Row>& rows) {
  std::printf(
      "gpu_check: %s, %u-token prefix, %u suffix tokens, window %u; %s\n", o.model.c_str(),
      o.prefix_tokens, o.suffix_tokens, o.window,
      d.use ? device_line.c_str()
            : absl::StrCat("dry run (", d.reason.empty() ? "--dry-run" : d.reason, ")").c_str());
  std::printf(
      "modelled GPU: %.4g TFLOPS, HBM %.4g GB/s, launch %.4g us per layer, PCIe %.4g GB/s\n\n",
      o.gpu_tflops, o.hbm_gb_s, o.launch_us, o.pcie_gb_s);
  std::printf("%-28s %-5s %10s %10s %9s %5s  %-20s %s\n", "check", "unit", "measured", "modelled",
              "ratio", "reps", "result", "max abs err / tolerance");
  for (const Row& r : rows) {
    std::optional<double> ratio;
    if (r.measured && r.modelled && *r.modelled != 0) ratio = *r.measured / *r.modelled;
    const std::string err =
        r.max_abs_error ? absl::StrCat(Figure(r.max_abs_error), " / ", Figure(r.tolerance)) : "";
    std::printf("%-28s %-5s %10s %10s %9s %5u  %-20s %s\n", r.name.c_str(), r.unit.c_str(),
                Figure(r.measured).c_str(), Figure(r.modelled).c_str(), Figure(ratio).c_str(),
                r.reps, r.check.c_str(), err.c_str());
  }
  std::printf("\nattention per layer (ms): measured kernel beside the model's figures\n");
  std::printf("%-22s %7s %10s %10s %10s %10s %10s %10s\n", "context", "tokens", "measured",
              "attention", "marginal", "launch", "pcie", "layer");
  for (const Row& r : rows) {
    if (r.name.rfind("attention.", 0) != 0) continue;
    const auto get = [&](const std::string& key) -> std::optional<double> {
      for (const auto& [k, v] : r.extra) {
        if (k == key) return v;
      }
      return std::nullopt;
    };
    std::printf("%-22s %7s %10s %10s %10s %10s %10s %10s\n", r.name.c_str(),
                Figure(get("tokens")).c_str(), Figure(r.measured).c_str(),
                Figure(r.modelled).c_str(), Figure(get("modelled_marginal_ms")).c_str(),
                Figure(get("modelled_launch_ms")).c_str(), Figure(get("modelled_pcie_ms")).c_str(),
                Figure(get("modelled_layer_ms")).c_str());
  }
  std::printf("\n");
  for (const Row& r : rows) std::printf("%s: %s\n", r.name.c_str(), r.detail.c_str());
}

void OptionalDouble(tools::JsonWriter& w, const std::optional<double>& v) {
  if (v.has_value()) {
    w.Double(*v);
  } else {
    w.Null();
  }
}

std::string Json(const Options& o, const Device& d, const std::string& device_line,
                 const std::vector<Row>& rows, int failed, double seconds) {
  tools::JsonWriter w;
  w.BeginObject();
  w.Key("program").String(kProgram);
  w.Key("mode").String(o.dry_run ? "dry-run" : "device");
  w.Key("device");
  if (d.use) {
    w.String(device_line);
  } else {
    w.Null();
  }
  w.Key("device_reason").String(d.reason);
  w.Key("params").BeginObject();
  w.Key("model").String(o.model);
  w.Key("prefix_tokens").Uint(o.prefix_tokens);
  w.Key("suffix_tokens").Uint(o.suffix_tokens);
  w.Key("window").Uint(o.window);
  w.Key("layer").Uint(kLayer);
  w.Key("seed").Uint(o.seed);
  w.Key("reps").Uint(o.reps);
  w.Key("budget_s").Double(o.budget_s);
  w.Key("gpu_tflops").Double(o.gpu_tflops);
  w.Key("hbm_gb_s").Double(o.hbm_gb_s);
  w.Key("launch_us").Double(o.launch_us);
  w.Key("pcie_gb_s").Double(o.pcie_gb_s);
  w.Key("kernels_per_layer").Int(kKernelsPerLayer);
  w.EndObject();
  w.Key("rows").BeginArray();
  for (const Row& r : rows) {
    std::optional<double> ratio;
    if (r.measured && r.modelled && *r.modelled != 0) ratio = *r.measured / *r.modelled;
    w.BeginObject();
    w.Key("name").String(r.name);
    w.Key("unit").String(r.unit);
    w.Key("measured");
    OptionalDouble(w, r.measured);
    w.Key("modelled");
    OptionalDouble(w, r.modelled);
    w.Key("ratio");
    OptionalDouble(w, ratio);
    w.Key("check").String(r.check);
    w.Key("compared").String(r.compared);
    w.Key("max_abs_error");
    OptionalDouble(w, r.max_abs_error);
    w.Key("tolerance");
    OptionalDouble(w, r.tolerance);
    w.Key("reps").Uint(r.reps);
    w.Key("bytes").Uint(r.bytes);
    w.Key("detail").String(r.detail);
    w.Key("extra").BeginObject();
    for (const auto& [k, v] : r.extra) {
      w.Key(k);
      OptionalDouble(w, v);
    }
    w.EndObject();
    w.EndObject();
  }
  w.EndArray();
  w.Key("failed").Int(failed);
  w.Key("seconds").Double(seconds);
  w.EndObject();
  return w.str();
}

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Runs ckv's CUDA kernels, the CUDA tier, PCIe copies and an attention kernel on a "
      "GPU and prints each measured time beside what bench/reprefill/gpu_model.h "
      "models. --dry-run runs on the CPU without a device.",
      kProgram};
  cli::Configure(app,
                 "Exit: 0 all checks passed (or skipped), 1 a correctness check failed, 2 "
                 "usage or no device without --dry-run, 3 another error.");
  app.add_flag("--dry-run", o.dry_run,
               "run on the CPU: CPU paths against themselves, modelled figures only");
  cli::AddDouble(app, "--budget-s", &o.budget_s,
                 "seconds the timed repetitions may take in all (default 200)");
  cli::AddUint(app, "--reps", &o.reps, "repetitions of each timing, at most (default 20)");
  std::vector<std::string> models;
  for (const std::string& m : ModelSpec::PresetNames()) {
    if (ArchOf(m).ok()) models.push_back(m);
  }
  cli::AddChoice(app, "--model", &o.model, models, "model preset (default qwen2.5-7b)");
  cli::AddUint(app, "--prefix-tokens", &o.prefix_tokens, "prefix tokens (default 8192)");
  cli::AddUint(app, "--suffix-tokens", &o.suffix_tokens, "suffix tokens (default 64)");
  cli::AddUint(app, "--window", &o.window, "selector query window (default 32)");
  cli::AddDouble(app, "--gpu-tflops", &o.gpu_tflops, "modelled effective TFLOPS (default 156)");
  cli::AddDouble(app, "--hbm-gb-s", &o.hbm_gb_s, "modelled HBM GB/s (default 1630)");
  cli::AddDouble(app, "--launch-us", &o.launch_us, "modelled launch us per layer (default 40)");
  cli::AddDouble(app, "--pcie-gb-s", &o.pcie_gb_s, "modelled PCIe GB/s (default 25)");
  cli::AddUint(app, "--seed", &o.seed, "seed of the random K, V and queries (default 1)");
  cli::AddJson(app, &o.json);
  if (const std::optional<int> exit = cli::Parse(app, argc, argv)) return *exit;
  if (o.suffix_tokens == 0 || o.window == 0 || o.reps == 0) {
    return cli::UsageError(
        kProgram, absl::StrCat("--suffix-tokens ", o.suffix_tokens, ", --window ", o.window,
                               ", --reps ", o.reps, ": each must be at least 1"));
  }
  if (!(o.budget_s > 0) || !(o.gpu_tflops > 0) || !(o.hbm_gb_s > 0) || !(o.launch_us >= 0) ||
      !(o.pcie_gb_s > 0)) {
    return cli::UsageError(kProgram,
                           "--budget-s, --gpu-tflops, --hbm-gb-s and --pcie-gb-s must "
                           "be positive, --launch-us not negative");
  }
  const auto start = std::chrono::steady_clock::now();

  Device d;
  const absl::Status available = kernels::cuda::DeviceAvailable();
  if (!available.ok()) d.reason = std::string(available.message());
  d.use = available.ok() && !o.dry_run;
#if !defined(CKV_HAVE_CUDA)
  // kernels/ has CUDA but this program's device code was not built: cannot happen with the
  // build files as they are, but say so rather than run half a check.
  if (d.use) {
    d.use = false;
    d.reason = "gpu_check was built without its device code";
  }
#endif
  if (!o.dry_run && !d.use) {
    std::fprintf(stderr,
                 "%s: no device to check: kernels::cuda::DeviceAvailable() says \"%s\"; "
                 "--dry-run checks on the CPU\n",
                 kProgram, d.reason.c_str());
    return cli::kExitUsage;
  }
  d.skipped = available.ok() ? "skipped: dry run" : "skipped: no device";
  std::string device_line;
#if defined(CKV_HAVE_CUDA)
  if (d.use) {
    gpu_device::DeviceInfo info;
    if (std::string e = gpu_device::Describe(&info); !e.empty()) {
      std::fprintf(stderr, "%s: describing device 0: %s\n", kProgram, e.c_str());
      return cli::kExitError;
    }
    device_line = absl::StrFormat("%s (sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d)",
                                  info.name, info.major, info.minor, info.multiprocessors,
                                  info.memory_gib, info.driver_version, info.runtime_version);
  }
#endif

  Layer layer;
  if (absl::Status s = MakeLayer(o, d.use, &layer); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, s.ToString().c_str());
    return cli::kExitError;
  }
  Check check(o, d, layer);
  check.Run();
  int failed = 0;
  for (const Row& r : check.rows()) failed += r.check == kFail ? 1 : 0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.json.ToStdout()) PrintTable(o, d, device_line, check.rows());
  if (o.json.enabled) {
    if (absl::Status s = o.json.Write(Json(o, d, device_line, check.rows(), failed, seconds));
        !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProgram, s.ToString().c_str());
      return cli::kExitError;
    }
  }
  if (!o.json.ToStdout()) {
    std::printf("\n%d of %zu rows failed; %.1f s\n", failed, check.rows().size(), seconds);
  }
  return failed > 0 ? kExitCheckFailed : cli::kExitOk;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) { return ckv::bench::Main(argc, argv); }
