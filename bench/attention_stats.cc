// bench/attention_stats.cc: the statistics of the synthetic generator's attention
// (tools/synthetic_attention.h) that published measurements of real models report, so that a
// profile can be checked against them (docs/generator.md, "The calibrated profile").
//
//   attention_stats [--model qwen2.5-7b] [--tokens 8192] [--profile calibrated|planted-chunks]
//                   [--shift 0.5] [--seed 1] [--window 32] [--request 0] [--layers all|N]
//                   [--json FILE]
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
//             the floor that noise sets.
// and, over the layers, the overlap of the top-10% chunks of adjacent period heads (layers 0, 8,
// 16, ...), the measure ContiguousKV reports as 52-64%.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "kernels/attention.h"
#include "kernels/fidelity.h"
#include "tools/json_writer.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

constexpr int kExitUsage = 2;
constexpr uint32_t kSinkTokens = 4;
constexpr uint32_t kLocalTail = 128;
constexpr uint32_t kPeriod = 8;

struct Flags {
  std::string model = "qwen2.5-7b";
  size_t tokens = 8192;
  uint32_t layers = 0;  // 0: all
  synth::AttentionParams params;
  std::string json;
};

void Usage(FILE* out) {
  std::fprintf(out,
               "Usage: attention_stats [--model qwen2.5-7b] [--tokens 8192]\n"
               "                       [--profile calibrated|planted-chunks] [--shift 0.5]\n"
               "                       [--seed 1] [--window 32] [--request 0]\n"
               "                       [--layers all|N] [--json FILE]\n");
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (a == "--model" && (v = value())) {
      f->model = v;
    } else if (a == "--tokens" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->tokens)) return false;
    } else if (a == "--profile" && (v = value())) {
      auto p = synth::ParseAttentionProfile(v);
      if (!p.ok()) {
        std::fprintf(stderr, "attention_stats: %s\n", std::string(p.status().message()).c_str());
        return false;
      }
      f->params.profile = *p;
    } else if (a == "--shift" && (v = value())) {
      if (!absl::SimpleAtod(v, &f->params.request_shift)) return false;
      if (!(f->params.request_shift >= 0 &&
            f->params.request_shift <= 1 - f->params.calibrated.always_on_share)) {
        std::fprintf(stderr, "attention_stats: --shift must be in [0, %g]\n",
                     1 - f->params.calibrated.always_on_share);
        return false;
      }
    } else if (a == "--seed" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->params.seed)) return false;
    } else if (a == "--window" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->params.window) || f->params.window == 0) return false;
    } else if (a == "--request" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->params.request)) return false;
    } else if (a == "--layers" && (v = value())) {
      if (std::string(v) != "all" && !absl::SimpleAtoi(v, &f->layers)) return false;
    } else if (a == "--json" && (v = value())) {
      f->json = v;
    } else {
      std::fprintf(stderr, "attention_stats: bad or incomplete flag '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
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
};

size_t Fraction(size_t n, double f) {
  return std::max<size_t>(1, static_cast<size_t>(std::lround(f * static_cast<double>(n))));
}

int Run(const Flags& f) {
  const ModelSpec spec = OrDie(ModelSpec::Preset(f.model));
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    std::fprintf(stderr, "attention_stats: --tokens must be a positive multiple of %u\n",
                 spec.chunk_tokens);
    return kExitUsage;
  }
  const synth::SyntheticAttention gen(spec, f.tokens, f.params);
  // The next request of the same conversation: same seed (same K, V), its own query noise.
  synth::AttentionParams next_p = f.params, same_p = f.params;
  next_p.request = f.params.request + 1;
  next_p.query_seed = 1000003 * (f.params.seed + 1) + next_p.request;
  same_p.query_seed = 2000003 * (f.params.seed + 1) + f.params.request;
  const synth::SyntheticAttention next(spec, f.tokens, next_p), same(spec, f.tokens, same_p);

  const kernels::KvShape shape = kernels::KvShape::Of(spec);
  const uint32_t layers = f.layers == 0 ? spec.layers : std::min(f.layers, spec.layers);
  const uint32_t window = f.params.window, g_n = spec.q_heads, m = spec.q_heads / spec.kv_heads;
  const size_t n = f.tokens, chunks = gen.chunks();
  const size_t k5 = Fraction(n, 0.05), k10 = Fraction(n, 0.10), kc10 = Fraction(chunks, 0.10);
  const uint32_t probes[3] = {0, g_n / 3, 2 * g_n / 3};

  std::vector<LayerStats> rows(layers);
  std::vector<std::vector<uint32_t>> chunk_tops(layers);
  synth::SyntheticAttention::Layer layer;
  std::vector<const std::byte*> record_ptr(chunks);
  for (uint32_t l = 0; l < layers; ++l) {
    gen.Generate(l, layer);
    const std::vector<std::byte> records = gen.Records(layer);
    for (size_t j = 0; j < chunks; ++j) record_ptr[j] = records.data() + j * shape.record_bytes();
    LayerStats& r = rows[l];
    std::vector<std::vector<uint32_t>> top5(g_n);
    std::vector<float> all(n, 0.0f);
    for (uint32_t g = 0; g < g_n; ++g) {
      const uint32_t head[1] = {g};
      const std::vector<float> mass =
          OrDie(kernels::TokenAttention(shape, layer.q, window, record_ptr, head));
      for (size_t t = 0; t < n; ++t) all[t] += mass[t] / static_cast<float>(g_n);
      double sink = 0, local = 0;
      for (size_t t = 0; t < std::min<size_t>(kSinkTokens, n); ++t) sink += mass[t];
      for (size_t t = n - std::min<size_t>(kLocalTail, n); t < n; ++t) local += mass[t];
      r.sink += sink / g_n;
      r.local += (sink + local >= 0.8 ? 1.0 : 0.0) / g_n;
      top5[g] = TopK(mass, k5);
      r.top5 += Held(mass, top5[g]) / g_n;
      r.top10 += Held(mass, TopK(mass, k10)) / g_n;
    }
    int in = 0, across = 0;
    for (uint32_t g = 0; g < g_n; ++g) {
      for (uint32_t h = g + 1; h < g_n; ++h) {
        const double j = kernels::Jaccard(top5[g], top5[h]);
        if (g / m == h / m) {
          r.jac_in += j;
          ++in;
        } else {
          r.jac_across += j;
          ++across;
        }
      }
    }
    r.jac_in = in ? r.jac_in / in : 0;
    r.jac_across = across ? r.jac_across / across : 0;
    r.probe3 = (kernels::Jaccard(top5[probes[0]], top5[probes[1]]) +
                kernels::Jaccard(top5[probes[0]], top5[probes[2]]) +
                kernels::Jaccard(top5[probes[1]], top5[probes[2]])) /
               3;
    chunk_tops[l] = TopK(kernels::PerChunk(all, spec.chunk_tokens), kc10);
    if (l > 0) r.adjacent = Shared(chunk_tops[l - 1], chunk_tops[l]);
    // Requests: the same keys, other queries (Queries() does not generate keys).
    const std::vector<uint32_t> here = TopK(all, k5);
    const auto next_mass =
        OrDie(kernels::TokenAttention(shape, next.Queries(l), window, record_ptr));
    const auto same_mass =
        OrDie(kernels::TokenAttention(shape, same.Queries(l), window, record_ptr));
    r.request = Shared(here, TopK(next_mass, k5));
    r.request_same = Shared(here, TopK(same_mass, k5));
    std::fprintf(stderr, "attention_stats: layer %u/%u\r", l + 1, layers);
  }
  std::fprintf(stderr, "\n");

  double period = 0;
  int period_pairs = 0;
  for (uint32_t l = kPeriod; l < layers; l += kPeriod) {
    period += Shared(chunk_tops[l - kPeriod], chunk_tops[l]);
    ++period_pairs;
  }
  period = period_pairs ? period / period_pairs : 0;
  LayerStats mean, mean_late;  // all layers; layers >= 2 (past the diffuse ones)
  int adjacent_n = 0, late_n = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    const LayerStats& r = rows[l];
    for (LayerStats* s : {&mean, &mean_late}) {
      if (s == &mean_late && l < 2) continue;
      s->sink += r.sink;
      s->top5 += r.top5;
      s->top10 += r.top10;
      s->jac_in += r.jac_in;
      s->jac_across += r.jac_across;
      s->probe3 += r.probe3;
      s->local += r.local;
      s->request += r.request;
      s->request_same += r.request_same;
      if (r.adjacent >= 0) s->adjacent = (s->adjacent < 0 ? 0 : s->adjacent) + r.adjacent;
    }
    if (r.adjacent >= 0) ++adjacent_n;
    if (l >= 2) ++late_n;
  }
  auto scale = [](LayerStats& s, double d, double adj_d) {
    for (double* x : {&s.sink, &s.top5, &s.top10, &s.jac_in, &s.jac_across, &s.probe3, &s.local,
                      &s.request, &s.request_same}) {
      *x /= d;
    }
    if (adj_d > 0) s.adjacent /= adj_d;
  };
  scale(mean, layers, adjacent_n);
  scale(mean_late, std::max(1, late_n), std::max(1, late_n));

  std::printf("Attention statistics: %s, %zu tokens, profile %s, shift %.2f, seed %llu, "
              "window %u, request %u -> %u\n",
              spec.DebugString().c_str(), n,
              std::string(synth::AttentionProfileName(f.params.profile)).c_str(),
              f.params.request_shift, static_cast<unsigned long long>(f.params.seed), window,
              f.params.request, next_p.request);
  std::printf("%-6s %6s %6s %6s %7s %6s %7s %6s %6s %6s %8s\n", "layer", "sink", "top5",
              "top10", "jac-in", "jac-x", "probe3", "local", "adj", "req", "req-same");
  auto print = [](const char* name, const LayerStats& r) {
    std::printf("%-6s %6.3f %6.3f %6.3f %7.3f %6.3f %7.3f %6.3f ", name, r.sink, r.top5, r.top10,
                r.jac_in, r.jac_across, r.probe3, r.local);
    if (r.adjacent >= 0) {
      std::printf("%6.3f ", r.adjacent);
    } else {
      std::printf("%6s ", "-");
    }
    std::printf("%6.3f %8.3f\n", r.request, r.request_same);
  };
  for (uint32_t l = 0; l < layers; ++l) print(std::to_string(l).c_str(), rows[l]);
  print("mean", mean);
  print("mean2+", mean_late);
  std::printf("adjacent period heads (period %u, top-10%% chunks): overlap %.3f over %d pairs\n",
              kPeriod, period, period_pairs);

  if (!f.json.empty()) {
    tools::JsonWriter w;
    auto row = [&w](const LayerStats& r) {
      w.BeginObject().Key("sink").Double(r.sink).Key("top5").Double(r.top5);
      w.Key("top10").Double(r.top10).Key("jaccard_in_group").Double(r.jac_in);
      w.Key("jaccard_across_groups").Double(r.jac_across).Key("probe3_jaccard").Double(r.probe3);
      w.Key("local_heads").Double(r.local).Key("adjacent_layer_overlap").Double(r.adjacent);
      w.Key("request_overlap").Double(r.request).Key("same_request_overlap").Double(r.request_same);
      w.EndObject();
    };
    w.BeginObject().Key("model").String(f.model).Key("tokens").Uint(n);
    w.Key("profile").String(synth::AttentionProfileName(f.params.profile));
    w.Key("shift").Double(f.params.request_shift).Key("seed").Uint(f.params.seed);
    w.Key("window").Uint(window).Key("request").Uint(f.params.request);
    w.Key("period_head_overlap").Double(period);
    w.Key("mean");
    row(mean);
    w.Key("mean_from_layer_2");
    row(mean_late);
    w.Key("layers").BeginArray();
    for (const LayerStats& r : rows) row(r);
    w.EndArray().EndObject();
    FILE* out = std::fopen(f.json.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "attention_stats: cannot write %s\n", f.json.c_str());
      return 1;
    }
    std::fprintf(out, "%s\n", w.str().c_str());
    std::fclose(out);
  }
  return 0;
}

}  // namespace
}  // namespace ckv::bench

int main(int argc, char** argv) {
  ckv::bench::Flags flags;
  if (!ckv::bench::ParseFlags(argc, argv, &flags)) {
    ckv::bench::Usage(stderr);
    return ckv::bench::kExitUsage;
  }
  return ckv::bench::Run(flags);
}
