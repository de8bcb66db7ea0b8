// SPDX-License-Identifier: Apache-2.0
// bench/selector_fidelity.cc: how well each selector stands in for the full KV, on the planted
// attention of the synthetic generator (tools/synthetic_attention.h).
//
//   selector_fidelity [--model qwen2.5-7b] [--tokens 8192] [--budgets 0.05,0.1,0.25,0.5]
//                     [--layers all|N] [--period 8] [--seed 1] [--overlap 0.6] [--json [PATH]]
//                     [--plot PNG]
//
// For every layer (or the first N), the generator makes K, V and the suffix queries; the records
// are stored in the spec's dtype as ckv stores them and the summaries computed as Put computes
// them. The exact attention over all keys is the truth. For every selector and budget the program
// measures, per layer, averaged over layers:
//   recall    the share of the true attention mass held by the selected chunks;
//   error     the relative L2 error of the attention output over the selected chunks against
//             the output over the full KV;
//   jaccard   the overlap of the selection with the oracle's at the same budget;
//   loaded    chunks loaded / chunks in the prefix (the token-level baselines load whole chunks
//             or 64-token blocks around their tokens, so theirs exceeds the budget).
// period-exact scores each period's head layer (--period) and serves the period with it.
// quest-fp32 and mean-key-fp32 are the same selectors on unquantised summaries: the recall the
// 8-bit summaries cost. With --proposals it also scores, in float32 from the keys, summaries ckv
// does not store (Proposal below), to find what the stored ones miss. It also reports the overlap
// of the oracle's selections of adjacent period heads (the generator's drift) and the summaries'
// size as a fraction of the KV bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/attention.h"
#include "kernels/estimate.h"
#include "kernels/fidelity.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

struct Flags {
  std::string model = "qwen2.5-7b";
  size_t tokens = 8192;
  std::vector<double> budgets = {0.05, 0.1, 0.25, 0.5};
  uint32_t layers = 0;  // 0: all
  synth::AttentionParams params;
  cli::JsonOutput json;
  std::string plot;
  // The budgets are target masses (kernels::SelectOptions::target_mass): each layer selects the
  // fewest chunks whose scores reach the target, and `loaded` says how many that was.
  bool target = false;
  // Also score the summaries ckv does not store (Proposal), to find what the stored ones miss.
  bool proposals = false;
};

// Returns the exit code when the program should stop (help, version, a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{
      "How well each selector stands in for the full KV, on the synthetic generator's "
      "planted attention.",
      "selector_fidelity"};
  cli::Configure(app, "The measures are described in bench/selector_fidelity.cc.");
  app.add_option("--model", f->model, "model preset (default qwen2.5-7b)")->type_name("PRESET");
  cli::AddUint(app, "--tokens", &f->tokens, "prefix length, a multiple of 16 (default 8192)");
  cli::AddParsed(
      app, "--budgets",
      "comma-separated fractions of the chunks (default "
      "0.05,0.1,0.25,0.5)",
      "B,...", "a list of fractions in (0, 1]", [f](const std::string& v) {
        f->budgets.clear();
        for (absl::string_view s : absl::StrSplit(v, ',')) {
          double b = 0;
          if (!cli::ParseDouble(std::string_view(s.data(), s.size()), &b) || !(b > 0 && b <= 1)) {
            return false;
          }
          f->budgets.push_back(b);
        }
        return true;
      });
  cli::AddLayerCount(app, &f->layers);
  cli::AddParsed(app, "--period", "layers per period (default 8)", "P", "a positive integer",
                 [f](const std::string& v) {
                   uint64_t n = 0;
                   if (!cli::ParseUint(v, &n) || n == 0 || n > UINT32_MAX) return false;
                   f->params.period_layers = static_cast<uint32_t>(n);
                   return true;
                 });
  cli::AddUint(app, "--seed", &f->params.seed, "generator seed (default 1)", "S");
  cli::AddDouble(app, "--overlap", &f->params.period_overlap,
                 "overlap of adjacent period heads' topics (default 0.6)");
  cli::AddJson(app, &f->json);
  app.add_flag("--target", f->target,
               "read --budgets as target masses: per layer, the fewest chunks whose scores "
               "(the oracle's: exact masses) reach the target; impress and h2o are left out");
  app.add_flag("--proposals", f->proposals,
               "also score summaries ckv does not store (float32, from the keys): exact-lse, "
               "gauss-var, gauss-box, outlier-1, outlier-2 (bench/selector_fidelity.cc)");
  app.add_option("--plot", f->plot, "draw recall by budget with gnuplot into PNG")
      ->type_name("PNG");
  return cli::Parse(app, argc, argv);
}

// The estimates of the chunks not loaded (kernels/estimate.h), measured for the selectors that
// load whole chunks; estimated[kind] sums the output error with that estimate.
constexpr kernels::EstimateKind kEstimates[] = {
    kernels::EstimateKind::kMean, kernels::EstimateKind::kGaussian,
    kernels::EstimateKind::kGaussianWindow, kernels::EstimateKind::kGaussianCapped};
bool Estimates(const std::string& selector) {
  return selector == "oracle" || selector == "period-exact" || selector == "quest" ||
         selector == "mean-key" || selector == "outlier-key";
}

struct Sums {
  double recall = 0, error = 0, jaccard = 0, loaded = 0;
  double estimated[5] = {0, 0, 0, 0, 0};  // by EstimateKind
  int layers = 0;
};

void Die(const absl::Status& s) {
  std::fprintf(stderr, "selector_fidelity: %s\n", std::string(s.message()).c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return std::move(*v);
}

// Quest / mean-key scores from exact (float) summaries: what quantisation costs.
std::vector<float> UnquantisedScores(bool quest, const kernels::KvShape& s,
                                     const std::vector<float>& q, uint32_t window,
                                     const std::vector<float>& k, size_t chunks) {
  const uint32_t d_n = s.head_dim, c = s.chunk_tokens;
  std::vector<float> mn(d_n), mx(d_n), mean(d_n), scores(chunks, 0.0f), logits(chunks);
  std::vector<std::vector<float>> box(chunks * s.kv_heads);
  for (size_t j = 0; j < chunks; ++j) {
    for (uint32_t h = 0; h < s.kv_heads; ++h) {
      kernels::ExactSummary(k.data() + j * c * s.kv_heads * d_n, c, s.kv_heads, d_n, h, mn.data(),
                            mx.data(), mean.data());
      auto& b = box[j * s.kv_heads + h];
      b.assign(mn.begin(), mn.end());
      b.insert(b.end(), mx.begin(), mx.end());
      b.insert(b.end(), mean.begin(), mean.end());
    }
  }
  for (uint32_t g = 0; g < s.q_heads; ++g) {
    const uint32_t h = g / s.group();
    for (size_t j = 0; j < chunks; ++j) {
      const auto& b = box[j * s.kv_heads + h];
      double sum = 0;
      for (uint32_t i = 0; i < window; ++i) {
        const float* qi = q.data() + (size_t{i} * s.q_heads + g) * d_n;
        for (uint32_t d = 0; d < d_n; ++d) {
          sum += quest ? std::max(qi[d] * b[d], qi[d] * b[d_n + d]) : qi[d] * b[2 * d_n + d];
        }
      }
      // Both are per-q-head softmaxes of the window's mean logit (kernels/selector.h).
      logits[j] = static_cast<float>(sum / std::sqrt(double(d_n)) / window);
    }
    const float max = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (float& x : logits) total += (x = std::exp(x - max));
    for (size_t j = 0; j < chunks; ++j) {
      scores[j] += static_cast<float>(logits[j] / total / s.q_heads);
    }
  }
  return scores;
}

// Summaries ckv does not store, scored in float32 from the keys, to find out what the stored ones
// miss. Each estimates a chunk's log-mean-exp of q.k / sqrt(d) over its c tokens, with q the
// window's mean query of a q head (as mean-key scores), and feeds the same per-q-head softmax:
//   kExactLse    the log-mean-exp itself, from every key: the best any chunk summary scored with
//                the mean query can do (it needs all keys, so it is a reference, not a selector);
//   kGaussVar    the key mean plus a per-channel key variance (the Gaussian expectation,
//                kernels/estimate.h), with the window's mean q^2: 2 vectors per entry;
//   kGaussBox    the same with the variance taken from the stored min/max box (the expected range
//                of 16 normal draws is 3.53 standard deviations): the 3 vectors stored today;
//   kOutlier1/2  the key (keys) farthest from the chunk's mean kept exactly, the rest as their
//                mean with its count: 2 and 3 vectors per entry.
// mean-key stores 1 vector per entry, quest 2 (min and max); today's summaries are 3.
enum class Proposal { kExactLse, kGaussVar, kGaussBox, kOutlier1, kOutlier2 };
struct ProposalName {
  Proposal p;
  const char* name;
};
constexpr ProposalName kProposals[] = {{Proposal::kExactLse, "exact-lse"},
                                       {Proposal::kGaussVar, "gauss-var"},
                                       {Proposal::kGaussBox, "gauss-box"},
                                       {Proposal::kOutlier1, "outlier-1"},
                                       {Proposal::kOutlier2, "outlier-2"}};

double LogMeanExp(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double acc = 0;
  for (double v : x) acc += std::exp(v - m);
  return m + std::log(acc / static_cast<double>(x.size()));
}

// One chunk's estimated log-mean-exp for kv head h under `p`; keys [c, kv_heads, d].
double ProposalLogit(Proposal p, const kernels::KvShape& s, const float* keys, uint32_t h,
                     const std::vector<double>& qbar, const std::vector<double>& q2) {
  const uint32_t d_n = s.head_dim, c = s.chunk_tokens;
  const double isd = 1.0 / std::sqrt(double(d_n));
  auto key = [&](uint32_t t) { return keys + (size_t{t} * s.kv_heads + h) * d_n; };
  auto dot = [&](const float* k) {
    double z = 0;
    for (uint32_t d = 0; d < d_n; ++d) z += qbar[d] * k[d];
    return z * isd;
  };
  std::vector<double> mean(d_n, 0.0);
  for (uint32_t t = 0; t < c; ++t) {
    for (uint32_t d = 0; d < d_n; ++d) mean[d] += key(t)[d] / c;
  }
  double lin = 0;
  for (uint32_t d = 0; d < d_n; ++d) lin += qbar[d] * mean[d] * isd;
  switch (p) {
    case Proposal::kExactLse: {
      std::vector<double> x(c);
      for (uint32_t t = 0; t < c; ++t) x[t] = dot(key(t));
      return LogMeanExp(x);
    }
    case Proposal::kGaussVar:
    case Proposal::kGaussBox: {
      double corr = 0;
      for (uint32_t d = 0; d < d_n; ++d) {
        double var = 0, lo = key(0)[d], hi = key(0)[d];
        for (uint32_t t = 0; t < c; ++t) {
          const double e = key(t)[d] - mean[d];
          var += e * e / c;
          lo = std::min<double>(lo, key(t)[d]);
          hi = std::max<double>(hi, key(t)[d]);
        }
        if (p == Proposal::kGaussBox) var = std::pow((hi - lo) / 3.53, 2);
        corr += q2[d] * var;
      }
      return lin + 0.5 * corr / d_n;
    }
    case Proposal::kOutlier1:
    case Proposal::kOutlier2: {
      const uint32_t m = p == Proposal::kOutlier1 ? 1 : 2;
      std::vector<std::pair<double, uint32_t>> far(c);
      for (uint32_t t = 0; t < c; ++t) {
        double z = 0;
        for (uint32_t d = 0; d < d_n; ++d) z += (key(t)[d] - mean[d]) * (key(t)[d] - mean[d]);
        far[t] = {-z, t};
      }
      std::sort(far.begin(), far.end());
      std::vector<double> rest(d_n, 0.0), x;
      for (uint32_t r = 0; r < c; ++r) {
        if (r < m) {
          x.push_back(dot(key(far[r].second)));
        } else {
          for (uint32_t d = 0; d < d_n; ++d) rest[d] += key(far[r].second)[d] / (c - m);
        }
      }
      double z = 0;
      for (uint32_t d = 0; d < d_n; ++d) z += qbar[d] * rest[d];
      // c - m copies of the rest's mean beside the m kept keys.
      x.insert(x.end(), c - m, z * isd);
      return LogMeanExp(x);
    }
  }
  return lin;
}

// Chunk scores under `p`: per q head the softmax of the chunks' logits, averaged over q heads.
std::vector<float> ProposalScores(Proposal p, const kernels::KvShape& s,
                                  const std::vector<float>& q, uint32_t window,
                                  const std::vector<float>& k, size_t chunks) {
  const uint32_t d_n = s.head_dim;
  std::vector<float> scores(chunks, 0.0f);
  std::vector<double> logits(chunks);
  for (uint32_t g = 0; g < s.q_heads; ++g) {
    std::vector<double> qbar(d_n, 0.0), q2(d_n, 0.0);
    for (uint32_t i = 0; i < window; ++i) {
      for (uint32_t d = 0; d < d_n; ++d) {
        const double x = q[(size_t{i} * s.q_heads + g) * d_n + d];
        qbar[d] += x / window;
        q2[d] += x * x / window;
      }
    }
    for (size_t j = 0; j < chunks; ++j) {
      logits[j] = ProposalLogit(p, s, k.data() + j * s.chunk_tokens * s.kv_heads * d_n,
                                g / s.group(), qbar, q2);
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double& x : logits) total += (x = std::exp(x - max));
    for (size_t j = 0; j < chunks; ++j) {
      scores[j] += static_cast<float>(logits[j] / total / s.q_heads);
    }
  }
  return scores;
}

std::optional<Proposal> ProposalOf(const std::string& name) {
  for (const ProposalName& pn : kProposals) {
    if (name == pn.name) return pn.p;
  }
  return std::nullopt;
}

const std::vector<std::string> kSelectors = {"oracle",      "period-exact", "quest",
                                             "quest-fp32",  "mean-key",     "mean-key-fp32",
                                             "outlier-key", "impress",      "h2o"};

// The selectors measured: all, or with --target those that select whole chunks by score.
std::vector<std::string> Selectors(const Flags& f) {
  std::vector<std::string> out;
  for (const std::string& name : kSelectors) {
    if (!f.target || (name != "impress" && name != "h2o")) out.push_back(name);
  }
  if (f.proposals) {
    for (const ProposalName& pn : kProposals) out.push_back(pn.name);
  }
  return out;
}

// The measures summed over layers, per (selector, budget), and the period heads' overlap.
struct Fidelity {
  std::map<std::pair<std::string, double>, Sums> sums;
  std::map<double, double> overlap_sum;  // budget -> sum of |A ∩ B| / |A| over head pairs
  int overlap_count = 0;

  double Overlap(double b) const { return overlap_count ? overlap_sum.at(b) / overlap_count : 0.0; }
};

// Runs every selector at every budget on one layer after another (see the banner).
class Measure {
 public:
  Measure(const ModelSpec& spec, const Flags& f)
      : spec_(spec),
        f_(f),
        gen_(spec, f.tokens, f.params),
        shape_(kernels::KvShape::Of(spec)),
        sf_(kernels::SummaryFormat::For(spec)),
        n_(gen_.chunks()),
        minmax_(n_ * sf_.MinMaxBytes()),
        mean_(n_ * sf_.MeanBytes()),
        outlier_(n_ * sf_.OutlierBytes()),
        minmax_ptr_(n_),
        mean_ptr_(n_),
        outlier_ptr_(n_),
        record_ptr_(n_) {
    for (double b : f.budgets) fidelity_.overlap_sum[b] = 0;
  }

  size_t chunks() const { return n_; }
  const Fidelity& fidelity() const { return fidelity_; }

  void Layer(uint32_t l) {
    const synth::SyntheticAttention::Layer layer = gen_.Generate(l);
    const std::vector<std::byte> records = gen_.Records(layer);
    const size_t half = shape_.half_record_bytes();
    for (size_t j = 0; j < n_; ++j) {
      record_ptr_[j] = records.data() + j * shape_.record_bytes();
      minmax_ptr_[j] = minmax_.data() + j * sf_.MinMaxBytes();
      mean_ptr_[j] = mean_.data() + j * sf_.MeanBytes();
      outlier_ptr_[j] = outlier_.data() + j * sf_.OutlierBytes();
      kernels::SummarizeChunkLayer(
          spec_, l, std::span(record_ptr_[j], half),
          std::span(minmax_.data() + j * sf_.MinMaxBytes(), sf_.MinMaxBytes()),
          std::span(mean_.data() + j * sf_.MeanBytes(), sf_.MeanBytes()),
          std::span(outlier_.data() + j * sf_.OutlierBytes(), sf_.OutlierBytes()));
    }
    kernels::SelectorInput in;
    in.shape = shape_;
    in.layers = spec_.layers;
    in.layer = l;
    in.queries = layer.q;
    in.window = f_.params.window;
    in.chunks = n_;
    in.minmax = minmax_ptr_;
    in.mean = mean_ptr_;
    in.outlier = outlier_ptr_;
    in.records = record_ptr_;
    // The truth: exact attention mass per chunk and the output over the full KV, both over the
    // stored (dtype-rounded) keys and values.
    const uint32_t window = f_.params.window;
    const auto mass = kernels::PerChunk(
        OrDie(kernels::TokenAttention(shape_, layer.q, window, record_ptr_)), spec_.chunk_tokens);
    std::vector<uint32_t> all(n_);
    for (uint32_t j = 0; j < n_; ++j) all[j] = j;
    const auto full_kv = OrDie(kernels::Gather(shape_, record_ptr_, all));
    kernels::ChunkStats stats = OrDie(kernels::ChunkStats::Of(shape_, record_ptr_, all));
    stats.RoundTripInt8(shape_.kv_heads, shape_.head_dim);  // as they would be stored
    const Truth truth{mass, OrDie(kernels::ReferenceAttention(shape_, layer.q, window, full_kv)),
                      UnquantisedScores(true, shape_, layer.q, window, layer.k, n_),
                      UnquantisedScores(false, shape_, layer.q, window, layer.k, n_),
                      std::move(stats)};
    for (double b : f_.budgets) Budget(l, b, layer, in, truth);
  }

 private:
  struct Truth {
    std::vector<float> mass;             // attention mass per chunk
    std::vector<float> full_out;         // attention output over the full KV
    std::vector<float> quest32, mean32;  // unquantised summaries' scores
    kernels::ChunkStats stats;           // every chunk's, through 8 bits
  };

  // Every selector at budget `b` on layer `l`.
  void Budget(uint32_t l, double b, const synth::SyntheticAttention::Layer& layer,
              const kernels::SelectorInput& in, const Truth& t) {
    kernels::SelectOptions o;
    o.budget_fraction = f_.target ? 1.0 : b;
    o.target_mass = f_.target ? b : 0.0;
    const size_t k = kernels::SelectedCount(t.mass, o);
    const auto oracle = kernels::TopKChunks(t.mass, k, o.sink_chunks, o.recent_chunks);
    if (l % f_.params.period_layers == 0) {
      period_selection_[b] = oracle;  // the head's exact selection serves the period
      if (!previous_head_oracle_[b].empty()) {
        const double j = kernels::Jaccard(previous_head_oracle_[b], oracle);
        // Both have k members: |A ∩ B| / k = 2J / (1 + J).
        fidelity_.overlap_sum[b] += 2 * j / (1 + j);
        if (b == f_.budgets.front()) ++fidelity_.overlap_count;
      }
      previous_head_oracle_[b] = oracle;
    }
    for (const std::string& name : Selectors(f_)) {
      std::vector<uint32_t> chosen;
      if (name == "oracle") {
        chosen = oracle;
      } else if (name == "period-exact") {
        chosen = period_selection_[b];
      } else if (const std::optional<Proposal> p = ProposalOf(name)) {
        const std::vector<float> scores =
            ProposalScores(*p, shape_, layer.q, f_.params.window, layer.k, n_);
        chosen = kernels::TopKChunks(scores, kernels::SelectedCount(scores, o), o.sink_chunks,
                                     o.recent_chunks);
      } else if (name == "quest-fp32" || name == "mean-key-fp32") {
        const std::vector<float>& scores = name == "quest-fp32" ? t.quest32 : t.mean32;
        chosen = kernels::TopKChunks(scores, kernels::SelectedCount(scores, o), o.sink_chunks,
                                     o.recent_chunks);
      } else {
        const auto kind = OrDie(kernels::ParseSelectorKind(name));
        chosen = OrDie(kernels::Select(kind, in, o)).chunks;
      }
      const auto kv = OrDie(kernels::Gather(shape_, record_ptr_, chosen));
      const auto out = OrDie(kernels::ReferenceAttention(shape_, layer.q, f_.params.window, kv));
      Sums& s = fidelity_.sums[{name, b}];
      s.recall += kernels::AttentionRecall(t.mass, chosen);
      s.error += kernels::RelativeL2Error(out, t.full_out);
      s.jaccard += kernels::Jaccard(chosen, oracle);
      if (Estimates(name)) {
        std::vector<uint32_t> rest;
        std::vector<bool> in(n_, false);
        for (uint32_t j : chosen) in[j] = true;
        for (uint32_t j = 0; j < n_; ++j) {
          if (!in[j]) rest.push_back(j);
        }
        const kernels::ChunkStats others = t.stats.Subset(rest, shape_.kv_heads, shape_.head_dim);
        for (kernels::EstimateKind e : kEstimates) {
          const auto est =
              OrDie(kernels::EstimatedAttention(shape_, layer.q, f_.params.window, kv, others, e));
          s.estimated[static_cast<int>(e)] += kernels::RelativeL2Error(est, t.full_out);
        }
      }
      s.loaded += static_cast<double>(chosen.size()) / static_cast<double>(n_);
      s.layers++;
    }
  }

  const ModelSpec& spec_;
  const Flags& f_;
  const synth::SyntheticAttention gen_;
  const kernels::KvShape shape_;
  const kernels::SummaryFormat sf_;
  const size_t n_;
  std::vector<std::byte> minmax_, mean_, outlier_;
  std::vector<const std::byte*> minmax_ptr_, mean_ptr_, outlier_ptr_, record_ptr_;
  std::map<double, std::vector<uint32_t>> period_selection_;  // budget -> head's selection
  std::map<double, std::vector<uint32_t>> previous_head_oracle_;
  Fidelity fidelity_;
};

void PrintTable(const Flags& f, const ModelSpec& spec, size_t n, uint32_t layers,
                const Fidelity& fid) {
  const kernels::SummaryFormat sf = kernels::SummaryFormat::For(spec);
  const double kv_bytes = double(spec.layers) * double(spec.RecordBytes());
  std::printf(
      "Selector fidelity: %s, %zu tokens (%zu chunks), %u layers, window %u, period %u, "
      "seed %llu\n",
      spec.DebugString().c_str(), f.tokens, n, layers, f.params.window, f.params.period_layers,
      static_cast<unsigned long long>(f.params.seed));
  std::printf("summaries per chunk: min/max %.4f of the KV bytes (1/%.1f), mean %.4f (1/%.1f)\n",
              sf.MinMaxBytes() / kv_bytes, kv_bytes / sf.MinMaxBytes(), sf.MeanBytes() / kv_bytes,
              kv_bytes / sf.MeanBytes());
  std::printf("oracle selections of adjacent period heads overlap (|A n B| / |A|):");
  for (double b : f.budgets) {
    std::printf(" %.3f at %.0f%%%s", fid.Overlap(b), b * 100, b == f.budgets.back() ? "\n" : ",");
  }
  const char* budget = f.target ? "target" : "budget";
  std::printf("%-14s %7s %8s %8s %8s %8s %12s\n", "selector", budget, "recall", "error", "jaccard",
              "loaded", "vs oracle");
  for (const std::string& name : Selectors(f)) {
    for (double b : f.budgets) {
      const Sums& s = fid.sums.at({name, b});
      const double d = s.layers;
      const double oracle = fid.sums.at({"oracle", b}).recall / d;
      std::printf("%-14s %6.0f%% %8.3f %8.3f %8.3f %8.3f %11.3fx\n", name.c_str(), b * 100,
                  s.recall / d, s.error / d, s.jaccard / d, s.loaded / d, (s.recall / d) / oracle);
    }
  }
  const double entry = double(spec.head_dim + 2) * spec.layers * spec.kv_heads;
  std::printf(
      "\noutput error with the chunks not loaded estimated (8-bit statistics; per chunk "
      "the value mean costs %.4f of the KV bytes, the key variance as much again):\n",
      entry / kv_bytes);
  std::printf("%-14s %7s %8s", "selector", budget, "drop");
  for (kernels::EstimateKind e : kEstimates) {
    std::printf(" %13s", std::string(kernels::EstimateKindName(e)).c_str());
  }
  std::printf("\n");
  for (const std::string& name : Selectors(f)) {
    if (!Estimates(name)) continue;
    for (double b : f.budgets) {
      const Sums& s = fid.sums.at({name, b});
      std::printf("%-14s %6.0f%% %8.3f", name.c_str(), b * 100, s.error / s.layers);
      for (kernels::EstimateKind e : kEstimates) {
        std::printf(" %13.3f", s.estimated[static_cast<int>(e)] / s.layers);
      }
      std::printf("\n");
    }
  }
}

std::string ResultJson(const Flags& f, uint32_t layers, const Fidelity& fid) {
  tools::JsonWriter w;
  w.BeginObject().Key("model").String(f.model).Key("tokens").Uint(f.tokens);
  w.Key("layers").Uint(layers).Key("period").Uint(f.params.period_layers);
  w.Key("seed").Uint(f.params.seed).Key("budgets_are_targets").Bool(f.target);
  w.Key("period_head_overlap").BeginArray();
  for (double b : f.budgets) w.Double(fid.Overlap(b));
  w.EndArray();
  w.Key("rows").BeginArray();
  for (const std::string& name : Selectors(f)) {
    for (double b : f.budgets) {
      const Sums& s = fid.sums.at({name, b});
      const double d = s.layers;
      const double oracle = fid.sums.at({"oracle", b}).recall / d;
      w.BeginObject().Key("selector").String(name).Key("budget").Double(b);
      w.Key("recall").Double(s.recall / d).Key("error").Double(s.error / d);
      w.Key("jaccard").Double(s.jaccard / d).Key("loaded").Double(s.loaded / d);
      w.Key("recall_vs_oracle").Double((s.recall / d) / oracle);
      if (Estimates(name)) {
        w.Key("estimated_error").BeginObject();
        for (kernels::EstimateKind e : kEstimates) {
          w.Key(std::string(kernels::EstimateKindName(e)))
              .Double(s.estimated[static_cast<int>(e)] / d);
        }
        w.EndObject();
      }
      w.EndObject();
    }
  }
  w.EndArray().EndObject();
  return w.str();
}

// Recall by budget, one line per selector, drawn by gnuplot into f.plot.
void Plot(const Flags& f, const Fidelity& fid) {
  std::string script = "set terminal png size 900,560\nset output '" + f.plot + "'\n";
  script += "set title 'Attention recall by budget (" + f.model + ", " + std::to_string(f.tokens) +
            " tokens)'\n";
  script += "set xlabel '";
  script += f.target ? "chunks loaded at each target mass (%)" : "budget (% of chunks)";
  script += "'\nset ylabel 'attention recall'\nset key bottom right\n";
  script += "set yrange [0:1]\nplot ";
  const std::vector<std::string> selectors = Selectors(f);
  for (size_t i = 0; i < selectors.size(); ++i) {
    script += "'-' with linespoints title '" + selectors[i] + "'";
    script += i + 1 < selectors.size() ? ", " : "\n";
  }
  for (const std::string& name : Selectors(f)) {
    for (double b : f.budgets) {
      const Sums& s = fid.sums.at({name, b});
      const double x = f.target ? s.loaded / s.layers : b;
      script += std::to_string(x * 100) + " " + std::to_string(s.recall / s.layers) + "\n";
    }
    script += "e\n";
  }
  FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr || std::fwrite(script.data(), 1, script.size(), gp) != script.size() ||
      pclose(gp) != 0) {
    std::fprintf(stderr, "selector_fidelity: gnuplot failed; no plot drawn\n");
  }
}

int Run(const Flags& f) {
  auto spec_or = ModelSpec::Preset(f.model);
  if (!spec_or.ok()) Die(spec_or.status());
  const ModelSpec spec = *spec_or;
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    return cli::UsageError("selector_fidelity", "--tokens must be a positive multiple of " +
                                                    std::to_string(spec.chunk_tokens));
  }
  Measure measure(spec, f);
  const uint32_t layers = f.layers == 0 ? spec.layers : std::min(f.layers, spec.layers);
  for (uint32_t l = 0; l < layers; ++l) {
    measure.Layer(l);
    std::fprintf(stderr, "selector_fidelity: layer %u/%u\r", l + 1, layers);
  }
  std::fprintf(stderr, "\n");

  if (!f.json.ToStdout()) PrintTable(f, spec, measure.chunks(), layers, measure.fidelity());
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ResultJson(f, layers, measure.fidelity())); !s.ok()) {
      std::fprintf(stderr, "selector_fidelity: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!f.plot.empty()) Plot(f, measure.fidelity());
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  return ckv::cli::Main(argc, argv, ckv::bench::ParseFlags, ckv::bench::Run);
}
