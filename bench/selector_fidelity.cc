// bench/selector_fidelity.cc: how well each selector stands in for the full KV, on the planted
// attention of the synthetic generator (tools/synthetic_attention.h).
//
//   selector_fidelity [--model qwen2.5-7b] [--tokens 8192] [--budgets 0.05,0.1,0.25,0.5]
//                     [--layers all|N] [--period 8] [--seed 1] [--overlap 0.6] [--json FILE]
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
// 8-bit summaries cost. It also reports the overlap of the oracle's selections of adjacent
// period heads (the generator's drift) and the summaries' size as a fraction of the KV bytes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/attention.h"
#include "kernels/fidelity.h"
#include "kernels/selector.h"
#include "kernels/summary.h"
#include "tools/json_writer.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {
namespace {

constexpr int kExitUsage = 2;

struct Flags {
  std::string model = "qwen2.5-7b";
  size_t tokens = 8192;
  std::vector<double> budgets = {0.05, 0.1, 0.25, 0.5};
  uint32_t layers = 0;  // 0: all
  synth::AttentionParams params;
  std::string json, plot;
};

void Usage(FILE* out) {
  std::fprintf(out,
               "Usage: selector_fidelity [--model qwen2.5-7b] [--tokens 8192]\n"
               "                         [--budgets 0.05,0.1,0.25,0.5] [--layers all|N]\n"
               "                         [--period 8] [--seed 1] [--overlap 0.6]\n"
               "                         [--json FILE] [--plot PNG]\n");
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
    } else if (a == "--budgets" && (v = value())) {
      f->budgets.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        double b;
        if (!absl::SimpleAtod(s, &b) || !(b > 0 && b <= 1)) return false;
        f->budgets.push_back(b);
      }
    } else if (a == "--layers" && (v = value())) {
      if (std::string(v) != "all" && !absl::SimpleAtoi(v, &f->layers)) return false;
    } else if (a == "--period" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->params.period_layers) || f->params.period_layers == 0) {
        return false;
      }
    } else if (a == "--seed" && (v = value())) {
      if (!absl::SimpleAtoi(v, &f->params.seed)) return false;
    } else if (a == "--overlap" && (v = value())) {
      if (!absl::SimpleAtod(v, &f->params.period_overlap)) return false;
    } else if (a == "--json" && (v = value())) {
      f->json = v;
    } else if (a == "--plot" && (v = value())) {
      f->plot = v;
    } else {
      std::fprintf(stderr, "selector_fidelity: bad or incomplete flag '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
}

struct Sums {
  double recall = 0, error = 0, jaccard = 0, loaded = 0;
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
      kernels::ExactSummary(k.data() + j * c * s.kv_heads * d_n, c, s.kv_heads, d_n, h,
                            mn.data(), mx.data(), mean.data());
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

int Run(const Flags& f) {
  auto spec_or = ModelSpec::Preset(f.model);
  if (!spec_or.ok()) Die(spec_or.status());
  const ModelSpec spec = *spec_or;
  if (f.tokens == 0 || f.tokens % spec.chunk_tokens != 0) {
    std::fprintf(stderr, "selector_fidelity: --tokens must be a positive multiple of %u\n",
                 spec.chunk_tokens);
    return kExitUsage;
  }
  const synth::SyntheticAttention gen(spec, f.tokens, f.params);
  const kernels::KvShape shape = kernels::KvShape::Of(spec);
  const kernels::SummaryFormat sf = kernels::SummaryFormat::For(spec);
  const size_t n = gen.chunks();
  const uint32_t window = f.params.window;
  const uint32_t layers = f.layers == 0 ? spec.layers : std::min(f.layers, spec.layers);
  const uint32_t p = f.params.period_layers;

  const std::vector<std::string> names = {"oracle", "period-exact", "quest", "quest-fp32",
                                          "mean-key", "mean-key-fp32", "impress", "h2o"};
  std::map<std::pair<std::string, double>, Sums> sums;
  std::map<double, std::vector<uint32_t>> period_selection;  // budget -> head's selection
  std::map<double, std::vector<uint32_t>> previous_head_oracle;
  std::map<double, double> overlap_sum;  // budget -> sum of |A ∩ B| / |A| over head pairs
  int overlap_count = 0;
  std::vector<std::byte> minmax(n * sf.MinMaxBytes()), mean(n * sf.MeanBytes());
  std::vector<const std::byte*> minmax_ptr(n), mean_ptr(n), record_ptr(n);

  for (uint32_t l = 0; l < layers; ++l) {
    const synth::SyntheticAttention::Layer layer = gen.Generate(l);
    const std::vector<std::byte> records = gen.Records(layer);
    const size_t half = shape.half_record_bytes();
    for (size_t j = 0; j < n; ++j) {
      record_ptr[j] = records.data() + j * shape.record_bytes();
      minmax_ptr[j] = minmax.data() + j * sf.MinMaxBytes();
      mean_ptr[j] = mean.data() + j * sf.MeanBytes();
      kernels::SummarizeChunkLayer(
          spec, l, std::span(record_ptr[j], half),
          std::span(minmax.data() + j * sf.MinMaxBytes(), sf.MinMaxBytes()),
          std::span(mean.data() + j * sf.MeanBytes(), sf.MeanBytes()));
    }
    kernels::SelectorInput in;
    in.shape = shape;
    in.layers = spec.layers;
    in.layer = l;
    in.queries = layer.q;
    in.window = window;
    in.chunks = n;
    in.minmax = minmax_ptr;
    in.mean = mean_ptr;
    in.records = record_ptr;
    // The truth: exact attention mass per chunk and the output over the full KV, both over the
    // stored (dtype-rounded) keys and values.
    const auto mass = kernels::PerChunk(
        OrDie(kernels::TokenAttention(shape, layer.q, window, record_ptr)), spec.chunk_tokens);
    std::vector<uint32_t> all(n);
    for (uint32_t j = 0; j < n; ++j) all[j] = j;
    const auto full_kv = OrDie(kernels::Gather(shape, record_ptr, all));
    const auto full_out = OrDie(kernels::ReferenceAttention(shape, layer.q, window, full_kv));
    const auto quest32 = UnquantisedScores(true, shape, layer.q, window, layer.k, n);
    const auto mean32 = UnquantisedScores(false, shape, layer.q, window, layer.k, n);

    for (double b : f.budgets) {
      kernels::SelectOptions o;
      o.budget_fraction = b;
      const size_t k = kernels::BudgetChunks(n, o);
      const auto oracle = kernels::TopKChunks(mass, k, o.sink_chunks, o.recent_chunks);
      if (l % p == 0) {
        period_selection[b] = oracle;  // the head's exact selection serves the period
        if (!previous_head_oracle[b].empty()) {
          const double j = kernels::Jaccard(previous_head_oracle[b], oracle);
          // Both have k members: |A ∩ B| / k = 2J / (1 + J).
          overlap_sum[b] += 2 * j / (1 + j);
          if (b == f.budgets.front()) ++overlap_count;
        }
        previous_head_oracle[b] = oracle;
      }
      for (const std::string& name : names) {
        std::vector<uint32_t> chosen;
        if (name == "oracle") {
          chosen = oracle;
        } else if (name == "period-exact") {
          chosen = period_selection[b];
        } else if (name == "quest-fp32" || name == "mean-key-fp32") {
          chosen = kernels::TopKChunks(name == "quest-fp32" ? quest32 : mean32, k, o.sink_chunks,
                                       o.recent_chunks);
        } else {
          const auto kind = OrDie(kernels::ParseSelectorKind(name));
          chosen = OrDie(kernels::Select(kind, in, o)).chunks;
        }
        const auto kv = OrDie(kernels::Gather(shape, record_ptr, chosen));
        const auto out = OrDie(kernels::ReferenceAttention(shape, layer.q, window, kv));
        Sums& s = sums[{name, b}];
        s.recall += kernels::AttentionRecall(mass, chosen);
        s.error += kernels::RelativeL2Error(out, full_out);
        s.jaccard += kernels::Jaccard(chosen, oracle);
        s.loaded += static_cast<double>(chosen.size()) / static_cast<double>(n);
        s.layers++;
      }
    }
    std::fprintf(stderr, "selector_fidelity: layer %u/%u\r", l + 1, layers);
  }
  std::fprintf(stderr, "\n");

  const double kv_bytes = double(spec.layers) * double(spec.RecordBytes());
  std::printf("Selector fidelity: %s, %zu tokens (%zu chunks), %u layers, window %u, period %u, "
              "seed %llu\n",
              spec.DebugString().c_str(), f.tokens, n, layers, window, p,
              static_cast<unsigned long long>(f.params.seed));
  std::printf("summaries per chunk: min/max %.4f of the KV bytes (1/%.1f), mean %.4f (1/%.1f)\n",
              sf.MinMaxBytes() / kv_bytes, kv_bytes / sf.MinMaxBytes(), sf.MeanBytes() / kv_bytes,
              kv_bytes / sf.MeanBytes());
  std::printf("oracle selections of adjacent period heads overlap (|A n B| / |A|):");
  for (double b : f.budgets) {
    std::printf(" %.3f at %.0f%%%s", overlap_count ? overlap_sum[b] / overlap_count : 0.0,
                b * 100, b == f.budgets.back() ? "\n" : ",");
  }
  std::printf("%-14s %7s %8s %8s %8s %8s %12s\n", "selector", "budget", "recall", "error",
              "jaccard", "loaded", "vs oracle");
  tools::JsonWriter w;
  w.BeginObject().Key("model").String(f.model).Key("tokens").Uint(f.tokens);
  w.Key("layers").Uint(layers).Key("period").Uint(p).Key("seed").Uint(f.params.seed);
  w.Key("period_head_overlap").BeginArray();
  for (double b : f.budgets) w.Double(overlap_count ? overlap_sum[b] / overlap_count : 0.0);
  w.EndArray();
  w.Key("rows").BeginArray();
  for (const std::string& name : names) {
    for (double b : f.budgets) {
      const Sums& s = sums[{name, b}];
      const double d = s.layers;
      const double oracle = sums[{"oracle", b}].recall / d;
      std::printf("%-14s %6.0f%% %8.3f %8.3f %8.3f %8.3f %11.3fx\n", name.c_str(), b * 100,
                  s.recall / d, s.error / d, s.jaccard / d, s.loaded / d, (s.recall / d) / oracle);
      w.BeginObject().Key("selector").String(name).Key("budget").Double(b);
      w.Key("recall").Double(s.recall / d).Key("error").Double(s.error / d);
      w.Key("jaccard").Double(s.jaccard / d).Key("loaded").Double(s.loaded / d);
      w.Key("recall_vs_oracle").Double((s.recall / d) / oracle).EndObject();
    }
  }
  w.EndArray().EndObject();
  if (!f.json.empty()) {
    FILE* out = std::fopen(f.json.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "selector_fidelity: cannot write %s\n", f.json.c_str());
      return 1;
    }
    std::fprintf(out, "%s\n", w.str().c_str());
    std::fclose(out);
  }
  if (!f.plot.empty()) {
    std::string script = "set terminal png size 900,560\nset output '" + f.plot + "'\n";
    script += "set title 'Attention recall by budget (" + f.model + ", " +
              std::to_string(f.tokens) + " tokens)'\n";
    script += "set xlabel 'budget (% of chunks)'\nset ylabel 'attention recall'\nset key bottom right\n";
    script += "set yrange [0:1]\nplot ";
    for (size_t i = 0; i < names.size(); ++i) {
      script += "'-' with linespoints title '" + names[i] + "'";
      script += i + 1 < names.size() ? ", " : "\n";
    }
    for (const std::string& name : names) {
      for (double b : f.budgets) {
        const Sums& s = sums[{name, b}];
        script += std::to_string(b * 100) + " " + std::to_string(s.recall / s.layers) + "\n";
      }
      script += "e\n";
    }
    FILE* gp = popen("gnuplot", "w");
    if (gp == nullptr || std::fwrite(script.data(), 1, script.size(), gp) != script.size() ||
        pclose(gp) != 0) {
      std::fprintf(stderr, "selector_fidelity: gnuplot failed; no plot drawn\n");
    }
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
