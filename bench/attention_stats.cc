// SPDX-License-Identifier: Apache-2.0
// bench/attention_stats.cc: the statistics of the synthetic generator's attention
// (tools/synthetic_attention.h) that published measurements of real models report, so that a
// profile can be checked against them (docs/generator.md, "The calibrated profile").
//
//   attention_stats [--model qwen2.5-7b] [--tokens 8192] [--profile calibrated|planted-chunks]
//                   [--shift 0.5] [--head-agreement F] [--seed 1] [--window 32] [--request 0]
//                   [--layers all|N] [--json [PATH]]
//
// For every layer it computes the exact attention (kernels::TokenAttention over the records in
// the spec's dtype) of the window's suffix queries, per q head, and reports:
//   sink      mass on the first 4 tokens (StreamingLLM's sink);
//   top5/10   mass held by the top 5% / 10% of tokens, per q head (H2O's heavy hitters);
//   jac-in    Jaccard of the top-5% token sets of two q heads of one GQA group, mean over pairs;
//   jac-x     the same for pairs of q heads in different groups;
//   probe3    mean pairwise Jaccard of three probe heads' top-5% sets (q heads 0, q/3, 2q/3,
//             which spans groups as IMPRESS's probe heads would);
//   local     share of q heads with >= 80% of their mass on the first 4 and last 128 tokens;
//   adj       |A n B| / |A| of the top-10% 16-token chunks (mean over q heads' averaged mass) of
//             this layer and the previous one;
//   req       |A n B| / |A| of the top-5% tokens of request r and request r + 1 of the same
//             conversation (same seed, so same K and V; the next request's queries and query
//             noise); req-same is the same with request r's topics and new query noise alone,
//             the floor that noise sets;
//   q-cos     cosine similarity of consecutive window queries of one q head, mean over heads;
// and of the K and V tensors themselves (at layer l, of kv head l mod kv_heads; tokens
// subsampled to at most 4096 for the low-rank share):
//   v-lr/k-lr share of V's / K's centred energy in its top 8 principal directions (8 / head_dim
//             for isotropic noise);
//   v-nb      lag-1 correlation of V along the tokens (per channel, centred, pooled);
//   k-out/v-out  largest channel RMS / median channel RMS (KIVI's outlier channels);
// and, over the layers, the overlap of the top-10% chunks of adjacent period heads (layers 0, 8,
// 16, ...), the measure ContiguousKV reports as 52-64%.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/attention.h"
#include "kernels/fidelity.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

constexpr uint32_t kSinkTokens = 4;
constexpr uint32_t kLocalTail = 128;
constexpr uint32_t kPeriod = 8;

struct Flags {
  std::string model = "qwen2.5-7b";
  size_t tokens = 8192;
  uint32_t layers = 0;  // 0: all
  synth::AttentionParams params;
  cli::JsonOutput json;
};

// Returns the exit code when the program should stop (help, version, a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{
      "The synthetic generator's attention statistics, to check a profile against "
      "published measurements.",
      "attention_stats"};
  cli::Configure(app,
                 "The columns are described in bench/attention_stats.cc and "
                 "docs/generator.md.");
  app.add_option("--model", f->model, "model preset (default qwen2.5-7b)")->type_name("PRESET");
  cli::AddUint(app, "--tokens", &f->tokens, "prefix length, a multiple of 16 (default 8192)");
  cli::AddParsed(app, "--profile", "calibrated (default) or planted-chunks", "P",
                 "calibrated or planted-chunks", [f](const std::string& v) {
                   auto p = synth::ParseAttentionProfile(v);
                   if (p.ok()) f->params.profile = *p;
                   return p.ok();
                 });
  const double max_shift = 1 - f->params.calibrated.always_on_share;
  cli::AddParsed(app, "--shift", "request shift (default 0.5)", "F",
                 absl::StrFormat("a number in [0, %g]", max_shift),
                 [f, max_shift](const std::string& v) {
                   return cli::ParseDouble(v, &f->params.request_shift) &&
                          f->params.request_shift >= 0 && f->params.request_shift <= max_shift;
                 });
  cli::AddParsed(app, "--head-agreement",
                 "q heads' agreement within a GQA group: the "
                 "top-5% Jaccard it aims at (default 0.7)",
                 "F", "a number in [0, 1]", [f](const std::string& v) {
                   double a = 0;
                   if (!cli::ParseDouble(v, &a) || a < 0 || a > 1) return false;
                   f->params.calibrated.head_agreement = a;
                   return true;
                 });
  cli::AddUint(app, "--seed", &f->params.seed, "generator seed (default 1)", "S");
  cli::AddParsed(app, "--window", "suffix queries per request (default 32)", "N",
                 "a positive integer", [f](const std::string& v) {
                   uint64_t n = 0;
                   if (!cli::ParseUint(v, &n) || n == 0 || n > UINT32_MAX) return false;
                   f->params.window = static_cast<uint32_t>(n);
                   return true;
                 });
  cli::AddUint(app, "--request", &f->params.request, "request index (default 0)", "R");
  cli::AddLayerCount(app, &f->layers);
  cli::AddJson(app, &f->json);
  return cli::Parse(app, argc, argv);
}

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "attention_stats: %s\n", std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*v);
}

// Indices of the k largest values (ties to the lower index), sorted.
std::vector<uint32_t> TopK(const std::vector<float>& mass, size_t k) {
  std::vector<uint32_t> idx(mass.size());
  std::iota(idx.begin(), idx.end(), 0u);
  k = std::min(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
    return mass[a] > mass[b] || (mass[a] == mass[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

double Held(const std::vector<float>& mass, const std::vector<uint32_t>& set) {
  double s = 0;
  for (uint32_t i : set) s += mass[i];
  return s;
}

// |a n b| / |a| for sorted sets of equal size.
double Shared(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  std::vector<uint32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return a.empty() ? 0 : static_cast<double>(both.size()) / static_cast<double>(a.size());
}

struct LayerStats {
  double sink = 0, top5 = 0, top10 = 0, jac_in = 0, jac_across = 0, probe3 = 0, local = 0;
  double adjacent = -1, request = 0, request_same = 0;
  double query_cos = 0, v_low_rank = 0, k_low_rank = 0, v_neighbour = 0, k_outlier = 0,
         v_outlier = 0;
};

constexpr uint32_t kPrincipal = 8;          // directions of the low-rank share
constexpr size_t kCovarianceTokens = 4096;  // tokens sampled for it

// Statistics of one kv head's tensor x [n, kv_heads, head_dim] (head h).
struct TensorStats {
  double low_rank = 0, neighbour = 0, outlier = 0;
};
TensorStats OfTensor(const std::vector<float>& x, size_t n, uint32_t h_n, uint32_t h,
                     uint32_t d_n) {
  auto at = [&](size_t t) { return x.data() + (t * h_n + h) * d_n; };
  std::vector<double> mean(d_n, 0.0), sq(d_n, 0.0);
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t d = 0; d < d_n; ++d) {
      mean[d] += at(t)[d];
      sq[d] += double{at(t)[d]} * at(t)[d];
    }
  }
  for (uint32_t d = 0; d < d_n; ++d) mean[d] /= static_cast<double>(n);
  TensorStats s;
  // Outliers: channel RMS, largest over the median.
  std::vector<double> rms(d_n);
  for (uint32_t d = 0; d < d_n; ++d) rms[d] = std::sqrt(sq[d] / static_cast<double>(n));
  std::vector<double> sorted = rms;
  std::nth_element(sorted.begin(), sorted.begin() + d_n / 2, sorted.end());
  s.outlier = *std::max_element(rms.begin(), rms.end()) / sorted[d_n / 2];
  // Lag-1 correlation along the tokens, pooled over the channels.
  double lag = 0, var = 0;
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t d = 0; d < d_n; ++d) {
      const double a = at(t)[d] - mean[d];
      var += a * a;
      if (t + 1 < n) lag += a * (at(t + 1)[d] - mean[d]);
    }
  }
  s.neighbour = var > 0 ? lag / var : 0;
  // Low-rank share: the centred covariance (float, so that the rank-1 updates vectorise) of a
  // subsample of tokens, and its top kPrincipal eigenvalues by subspace iteration.
  const size_t stride = std::max<size_t>(1, n / kCovarianceTokens);
  std::vector<float> cov(size_t{d_n} * d_n, 0.0f), row(d_n);
  for (size_t t = 0; t < n; t += stride) {
    for (uint32_t d = 0; d < d_n; ++d) row[d] = static_cast<float>(at(t)[d] - mean[d]);
    for (uint32_t i = 0; i < d_n; ++i) {
      float* c = cov.data() + size_t{i} * d_n;
      const float ri = row[i];
      for (uint32_t j = 0; j < d_n; ++j) c[j] += ri * row[j];
    }
  }
  double trace = 0;
  for (uint32_t i = 0; i < d_n; ++i) trace += cov[size_t{i} * d_n + i];
  const uint32_t r_n = std::min(kPrincipal, d_n);
  std::vector<double> q(size_t{r_n} * d_n), z(size_t{r_n} * d_n);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.0 + 7.0 * static_cast<double>(i));
  double energy = 0;
  for (int iter = 0; iter < 60; ++iter) {
    // z = C q, then Gram-Schmidt; the Rayleigh quotients of the last pass sum to the energy.
    energy = 0;
    for (uint32_t r = 0; r < r_n; ++r) {
      const double* qr = q.data() + size_t{r} * d_n;
      double* zr = z.data() + size_t{r} * d_n;
      for (uint32_t i = 0; i < d_n; ++i) {
        const float* c = cov.data() + size_t{i} * d_n;
        double acc = 0;
        for (uint32_t j = 0; j < d_n; ++j) acc += c[j] * qr[j];
        zr[i] = acc;
      }
      for (uint32_t i = 0; i < d_n; ++i) energy += qr[i] * zr[i];
    }
    for (uint32_t r = 0; r < r_n; ++r) {
      double* zr = z.data() + size_t{r} * d_n;
      for (uint32_t b = 0; b < r; ++b) {
        const double* zb = z.data() + size_t{b} * d_n;
        double dot = 0;
        for (uint32_t i = 0; i < d_n; ++i) dot += zr[i] * zb[i];
        for (uint32_t i = 0; i < d_n; ++i) zr[i] -= dot * zb[i];
      }
      double norm = 0;
      for (uint32_t i = 0; i < d_n; ++i) norm += zr[i] * zr[i];
      norm = std::sqrt(std::max(norm, 1e-300));
      for (uint32_t i = 0; i < d_n; ++i) zr[i] /= norm;
    }
    q.swap(z);
  }
  s.low_rank = trace > 0 ? energy / trace : 0;
  return s;
}

// Mean cosine similarity of consecutive window queries of each q head.
double QueryCosine(const std::vector<float>& q, uint32_t window, uint32_t g_n, uint32_t d_n) {
  if (window < 2) return 1;
  double sum = 0;
  for (uint32_t g = 0; g < g_n; ++g) {
    for (uint32_t w = 0; w + 1 < window; ++w) {
      const float* a = q.data() + (size_t{w} * g_n + g) * d_n;
      const float* b = a + size_t{g_n} * d_n;
      double ab = 0, aa = 0, bb = 0;
      for (uint32_t d = 0; d < d_n; ++d) {
        ab += double{a[d]} * b[d];
        aa += double{a[d]} * a[d];
        bb += double{b[d]} * b[d];
      }
      sum += ab / std::sqrt(std::max(aa * bb, 1e-300));
    }
  }
  return sum / (static_cast<double>(g_n) * (window - 1));
}

size_t Fraction(size_t n, double f) {
  return std::max<size_t>(1, static_cast<size_t>(std::lround(f * static_cast<double>(n))));
}

// What one run measures.
struct Results {
  std::vector<LayerStats> rows;
  std::vector<std::vector<uint32_t>> chunk_tops;  // per layer: its top-10% chunks
  LayerStats mean, mean_late;                     // all layers; layers >= 2 (past the diffuse)
  double period = 0;                              // overlap of adjacent period heads
  int period_pairs = 0;
};

// Measures the layers of one generator against the next request's and a re-noised one's
// queries (see the banner).
class Measure {
 public:
  Measure(const ModelSpec& spec, const Flags& f, const synth::AttentionParams& next_p,
          const synth::AttentionParams& same_p)
      : spec_(spec),
        f_(f),
        gen_(spec, f.tokens, f.params),
        next_(spec, f.tokens, next_p),
        same_(spec, f.tokens, same_p),
        shape_(kernels::KvShape::Of(spec)),
        n_(f.tokens),
        chunks_(gen_.chunks()),
        k5_(Fraction(n_, 0.05)),
        k10_(Fraction(n_, 0.10)),
        kc10_(Fraction(chunks_, 0.10)),
        record_ptr_(chunks_) {}

  // Layer l's statistics (all but `adjacent`); `*chunk_top` gets its top-10% chunks.
  LayerStats Layer(uint32_t l, std::vector<uint32_t>* chunk_top) {
    const uint32_t window = f_.params.window, g_n = spec_.q_heads;
    gen_.Generate(l, layer_);
    const std::vector<std::byte> records = gen_.Records(layer_);
    for (size_t j = 0; j < chunks_; ++j) {
      record_ptr_[j] = records.data() + j * shape_.record_bytes();
    }
    LayerStats r;
    std::vector<std::vector<uint32_t>> top5(g_n);
    std::vector<float> all(n_, 0.0f);
    for (uint32_t g = 0; g < g_n; ++g) {
      const uint32_t head[1] = {g};
      const std::vector<float> mass =
          OrDie(kernels::TokenAttention(shape_, layer_.q, window, record_ptr_, head));
      for (size_t t = 0; t < n_; ++t) all[t] += mass[t] / static_cast<float>(g_n);
      double sink = 0, local = 0;
      for (size_t t = 0; t < std::min<size_t>(kSinkTokens, n_); ++t) sink += mass[t];
      for (size_t t = n_ - std::min<size_t>(kLocalTail, n_); t < n_; ++t) local += mass[t];
      r.sink += sink / g_n;
      r.local += (sink + local >= 0.8 ? 1.0 : 0.0) / g_n;
      top5[g] = TopK(mass, k5_);
      r.top5 += Held(mass, top5[g]) / g_n;
      r.top10 += Held(mass, TopK(mass, k10_)) / g_n;
    }
    HeadOverlaps(top5, &r);
    r.query_cos = QueryCosine(layer_.q, window, g_n, spec_.head_dim);
    // One kv head per layer (they are alike), a different one at each layer.
    const uint32_t h = l % spec_.kv_heads;
    const TensorStats v = OfTensor(layer_.v, n_, spec_.kv_heads, h, spec_.head_dim);
    const TensorStats k = OfTensor(layer_.k, n_, spec_.kv_heads, h, spec_.head_dim);
    r.v_low_rank = v.low_rank;
    r.v_neighbour = v.neighbour;
    r.v_outlier = v.outlier;
    r.k_low_rank = k.low_rank;
    r.k_outlier = k.outlier;
    *chunk_top = TopK(kernels::PerChunk(all, spec_.chunk_tokens), kc10_);
    // Requests: the same keys, other queries (Queries() does not generate keys).
    const std::vector<uint32_t> here = TopK(all, k5_);
    const auto next_mass =
        OrDie(kernels::TokenAttention(shape_, next_.Queries(l), window, record_ptr_));
    const auto same_mass =
        OrDie(kernels::TokenAttention(shape_, same_.Queries(l), window, record_ptr_));
    r.request = Shared(here, TopK(next_mass, k5_));
    r.request_same = Shared(here, TopK(same_mass, k5_));
    return r;
  }

 private:
  // jac-in, jac-x and probe3 from the q heads' top-5% token sets.
  void HeadOverlaps(const std::vector<std::vector<uint32_t>>& top5, LayerStats* r) const {
    const uint32_t g_n = spec_.q_heads, m = spec_.q_heads / spec_.kv_heads;
    const uint32_t probes[3] = {0, g_n / 3, 2 * g_n / 3};
    int in = 0, across = 0;
    for (uint32_t g = 0; g < g_n; ++g) {
      for (uint32_t h = g + 1; h < g_n; ++h) {
        const double j = kernels::Jaccard(top5[g], top5[h]);
        if (g / m == h / m) {
          r->jac_in += j;
          ++in;
        } else {
          r->jac_across += j;
          ++across;
        }
      }
    }
    r->jac_in = in ? r->jac_in / in : 0;
    r->jac_across = across ? r->jac_across / across : 0;
    r->probe3 = (kernels::Jaccard(top5[probes[0]], top5[probes[1]]) +
                 kernels::Jaccard(top5[probes[0]], top5[probes[2]]) +
                 kernels::Jaccard(top5[probes[1]], top5[probes[2]])) /
                3;
  }

  const ModelSpec& spec_;
  const Flags& f_;
  const synth::SyntheticAttention gen_, next_, same_;
  const kernels::KvShape shape_;
  const size_t n_, chunks_, k5_, k10_, kc10_;
  synth::SyntheticAttention::Layer layer_;
  std::vector<const std::byte*> record_ptr_;
};

// The means over the layers and the period heads' overlap.
void Average(uint32_t layers, Results* res) {
  for (uint32_t l = kPeriod; l < layers; l += kPeriod) {
    res->period += Shared(res->chunk_tops[l - kPeriod], res->chunk_tops[l]);
    ++res->period_pairs;
  }
  res->period = res->period_pairs ? res->period / res->period_pairs : 0;
  int adjacent_n = 0, late_n = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    const LayerStats& r = res->rows[l];
    for (LayerStats* s : {&res->mean, &res->mean_late}) {
      if (s == &res->mean_late && l < 2) continue;
      s->sink += r.sink;
      s->top5 += r.top5;
      s->top10 += r.top10;
      s->jac_in += r.jac_in;
      s->jac_across += r.jac_across;
      s->probe3 += r.probe3;
      s->local += r.local;
      s->request += r.request;
      s->request_same += r.request_same;
      s->query_cos += r.query_cos;
      s->v_low_rank += r.v_low_rank;
      s->k_low_rank += r.k_low_rank;
      s->v_neighbour += r.v_neighbour;
      s->k_outlier += r.k_outlier;
      s->v_outlier += r.v_outlier;
      if (r.adjacent >= 0) s->adjacent = (s->adjacent < 0 ? 0 : s->adjacent) + r.adjacent;
    }
    if (r.adjacent >= 0) ++adjacent_n;
    if (l >= 2) ++late_n;
  }
  auto scale = [](LayerStats& s, double d, double adj_d) {
    for (double* x : {&s.sink, &s.top5, &s.top10, &s.jac_in, &s.jac_across, &s.probe3, &s.local,
                      &s.request, &s.request_same, &s.query_cos, &s.v_low_rank, &s.k_low_rank,
                      &s.v_neighbour, &s.k_outlier, &s.v_outlier}) {
      *x /= d;
    }
    if (adj_d > 0) s.adjacent /= adj_d;
  };
  scale(res->mean, layers, adjacent_n);
  scale(res->mean_late, std::max(1, late_n), std::max(1, late_n));
}

void PrintTable(const Flags& f, const ModelSpec& spec, uint32_t next_request, const Results& res) {
  std::printf(
      "Attention statistics: %s, %zu tokens, profile %s, shift %.2f, head agreement "
      "%.2f, seed %llu, window %u, request %u -> %u\n",
      spec.DebugString().c_str(), f.tokens,
      std::string(synth::AttentionProfileName(f.params.profile)).c_str(), f.params.request_shift,
      f.params.calibrated.head_agreement, static_cast<unsigned long long>(f.params.seed),
      f.params.window, f.params.request, next_request);
  std::printf("%-6s %6s %6s %6s %7s %6s %7s %6s %6s %6s %8s %6s %6s %6s %6s %6s %6s\n", "layer",
              "sink", "top5", "top10", "jac-in", "jac-x", "probe3", "local", "adj", "req",
              "req-same", "q-cos", "v-lr", "k-lr", "v-nb", "k-out", "v-out");
  auto print = [](const char* name, const LayerStats& r) {
    std::printf("%-6s %6.3f %6.3f %6.3f %7.3f %6.3f %7.3f %6.3f ", name, r.sink, r.top5, r.top10,
                r.jac_in, r.jac_across, r.probe3, r.local);
    if (r.adjacent >= 0) {
      std::printf("%6.3f ", r.adjacent);
    } else {
      std::printf("%6s ", "-");
    }
    std::printf("%6.3f %8.3f %6.3f %6.3f %6.3f %6.3f %6.2f %6.2f\n", r.request, r.request_same,
                r.query_cos, r.v_low_rank, r.k_low_rank, r.v_neighbour, r.k_outlier, r.v_outlier);
  };
  for (size_t l = 0; l < res.rows.size(); ++l) print(std::to_string(l).c_str(), res.rows[l]);
  print("mean", res.mean);
  print("mean2+", res.mean_late);
  std::printf("adjacent period heads (period %u, top-10%% chunks): overlap %.3f over %d pairs\n",
              kPeriod, res.period, res.period_pairs);
}

std::string ResultJson(const Flags& f, const Results& res) {
  tools::JsonWriter w;
  auto row = [&w](const LayerStats& r) {
    w.BeginObject().Key("sink").Double(r.sink).Key("top5").Double(r.top5);
    w.Key("top10").Double(r.top10).Key("jaccard_in_group").Double(r.jac_in);
    w.Key("jaccard_across_groups").Double(r.jac_across).Key("probe3_jaccard").Double(r.probe3);
    w.Key("local_heads").Double(r.local).Key("adjacent_layer_overlap").Double(r.adjacent);
    w.Key("request_overlap").Double(r.request).Key("same_request_overlap").Double(r.request_same);
    w.Key("query_cosine").Double(r.query_cos).Key("value_low_rank_share").Double(r.v_low_rank);
    w.Key("key_low_rank_share").Double(r.k_low_rank);
    w.Key("value_neighbour_correlation").Double(r.v_neighbour);
    w.Key("key_outlier_ratio").Double(r.k_outlier).Key("value_outlier_ratio").Double(r.v_outlier);
    w.EndObject();
  };
  w.BeginObject().Key("model").String(f.model).Key("tokens").Uint(f.tokens);
  w.Key("profile").String(synth::AttentionProfileName(f.params.profile));
  w.Key("shift").Double(f.params.request_shift).Key("seed").Uint(f.params.seed);
  w.Key("head_agreement").Double(f.params.calibrated.head_agreement);
  w.Key("window").Uint(f.params.window).Key("request").Uint(f.params.request);
  w.Key("period_head_overlap").Double(res.period);
  w.Key("mean");
  row(res.mean);
  w.Key("mean_from_layer_2");
  row(res.mean_late);
  w.Key("layers").BeginArray();
  for (const LayerStats& r : res.rows) row(r);
  w.EndArray().EndObject();
  return w.str();
}

int Run(const Flags& f) {
  const ModelSpec spec = OrDie(ModelSpec::Preset(f.model));
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    return cli::UsageError("attention_stats", "--tokens must be a positive multiple of " +
                                                  std::to_string(spec.chunk_tokens));
  }
  // The next request of the same conversation: same seed (same K, V), its own query noise.
  synth::AttentionParams next_p = f.params, same_p = f.params;
  next_p.request = f.params.request + 1;
  next_p.query_seed = 1000003 * (f.params.seed + 1) + next_p.request;
  same_p.query_seed = 2000003 * (f.params.seed + 1) + f.params.request;
  Measure measure(spec, f, next_p, same_p);

  const uint32_t layers = f.layers == 0 ? spec.layers : std::min(f.layers, spec.layers);
  Results res;
  res.rows.resize(layers);
  res.chunk_tops.resize(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    res.rows[l] = measure.Layer(l, &res.chunk_tops[l]);
    if (l > 0) res.rows[l].adjacent = Shared(res.chunk_tops[l - 1], res.chunk_tops[l]);
    std::fprintf(stderr, "attention_stats: layer %u/%u\r", l + 1, layers);
  }
  std::fprintf(stderr, "\n");
  Average(layers, &res);

  if (!f.json.ToStdout()) PrintTable(f, spec, next_p.request, res);
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ResultJson(f, res)); !s.ok()) {
      std::fprintf(stderr, "attention_stats: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  return ckv::cli::Main(argc, argv, ckv::bench::ParseFlags, ckv::bench::Run);
}
