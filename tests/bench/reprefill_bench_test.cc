// SPDX-License-Identifier: Apache-2.0
// The Re-Prefill benchmark harness (bench/reprefill_bench) on a tiny configuration: its JSON
// has the documented schema and its figures keep the relations that hold by construction.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tools/attention_profile_writer.h"
#include "tests/json_test_util.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using tools::JsonValue;

#ifdef CKV_REPREFILL_BENCH_PATH

using Ran = ::ckv::testing::ProgramRun;

Ran RunReprefillBench(const std::string& args) {
  return ::ckv::testing::RunProgram(CKV_REPREFILL_BENCH_PATH, args);
}

using ::ckv::testing::JsonNumber;

bool IsInt(const JsonValue& v, const char* key) {
  const JsonValue* x = v.Find(key);
  return x != nullptr && x->AsInt() != nullptr;
}

constexpr const char* kSystems = "full,h2o,impress,ckv-paper,ckv";

// Flips one bit of the byte at `at` of `path` (twice restores it).
void FlipByte(const std::string& path, long at) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  std::fseek(f, at, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, at, SEEK_SET);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
}

TEST(ReprefillBenchTest, TinyRunHasTheSchemaAndSaneFigures) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  const std::string json = dir.path() + "/out.json";
  const std::string plot = dir.path() + "/out.png";
  const std::string args =
      "--store " + store +
      " --model qwen2.5-0.5b --prefix-tokens 256 --suffix-tokens 16 "
      "--conversations 2 --turns 2 --budgets 10,50 --systems " +
      kSystems + " --gpu-tier-bytes 0 --cpu-tier-bytes 0 --fidelity --no-fio --rounds 2 --json " +
      json;
  const Ran first = RunReprefillBench(args + " --plot " + plot);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("making a new store"), std::string::npos) << first.output;
  // The table names every system, the modelled recompute and the equal-recall comparison.
  EXPECT_NE(first.output.find("equal recall"), std::string::npos) << first.output;
  for (const char* s : {"full ", "h2o ", "impress ", "ckv-paper ", "ckv ", "recompute "}) {
    EXPECT_NE(first.output.find(s), std::string::npos) << s << "\n" << first.output;
  }
  struct stat st {};
  if (first.output.find("gnuplot failed") == std::string::npos) {
    EXPECT_EQ(::stat(plot.c_str(), &st), 0) << "no plot at " << plot;
  }

  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const JsonValue* workload = doc->Find("workload");
  ASSERT_NE(workload, nullptr);
  EXPECT_EQ(*workload->Find("model")->AsString(), "qwen2.5-0.5b");
  for (const char* k :
       {"prefix_tokens", "suffix_tokens", "conversations", "turns", "warmup_turns", "concurrency",
        "window", "gpu_tier_bytes", "cpu_tier_bytes", "seed", "store_bytes"}) {
    EXPECT_TRUE(IsInt(*workload, k)) << k;
  }
  EXPECT_EQ(JsonNumber(*workload, "prefix_tokens"), 256);
  const JsonValue* results = doc->Find("results");
  ASSERT_NE(results, nullptr);
  ASSERT_NE(results->AsArray(), nullptr);
  ASSERT_EQ(results->AsArray()->size(), 12u);  // (5 systems + recompute) x 2 budgets

  std::map<std::pair<std::string, double>, const JsonValue*> by;
  std::map<std::string, std::set<double>> budgets_of;
  for (const JsonValue& r : *results->AsArray()) {
    ASSERT_NE(r.Find("system"), nullptr);
    const std::string system = *r.Find("system")->AsString();
    const double budget = JsonNumber(r, "budget");
    SCOPED_TRACE(system + " at " + std::to_string(budget));
    by[{system, budget}] = &r;
    budgets_of[system].insert(budget);
    EXPECT_TRUE(budget == 0.1 || budget == 0.5);
    ASSERT_NE(r.Find("config")->AsString(), nullptr);
    EXPECT_EQ(*r.Find("tiers")->AsString(), "default");
    const JsonValue* rounds = r.Find("latency_ms")->Find("rounds");
    ASSERT_NE(rounds, nullptr);
    ASSERT_NE(rounds->AsArray(), nullptr);
    EXPECT_EQ(rounds->AsArray()->size(), 2u) << "one mean per round";
    if (system == "recompute") {
      // Modelled: no I/O, the whole prompt prefilled, exact.
      EXPECT_TRUE(*r.Find("modelled")->AsBool());
      EXPECT_EQ(JsonNumber(r, "bytes_read"), 0);
      EXPECT_GT(JsonNumber(*r.Find("latency_ms"), "mean"), 0);
      EXPECT_EQ(JsonNumber(r, "attention_recall"), 1.0);
      continue;
    }
    EXPECT_FALSE(*r.Find("modelled")->AsBool());
    // Recall counts what a system attends to; a token-level system attends to its selected
    // tokens only, never to more than the blocks it read.
    EXPECT_LE(JsonNumber(r, "attention_recall"), JsonNumber(r, "attention_recall_loaded") + 1e-9);
    if (system == "full" || system == "ckv" || system == "ckv-paper") {
      EXPECT_NEAR(JsonNumber(r, "attention_recall"), JsonNumber(r, "attention_recall_loaded"),
                  1e-9);
    }
    EXPECT_GT(JsonNumber(r, "h2d_bytes"), 0) << "every byte loaded crosses PCIe with no tiers";
    EXPECT_EQ(JsonNumber(r, "requests"), 2);  // 2 conversations x (2 turns - 1 warm-up turn)
    const JsonValue* lat = r.Find("latency_ms");
    ASSERT_NE(lat, nullptr);
    EXPECT_GT(JsonNumber(*lat, "mean"), 0);
    EXPECT_GT(JsonNumber(*lat, "p50"), 0);
    EXPECT_LE(JsonNumber(*lat, "p50"), JsonNumber(*lat, "p95"));
    EXPECT_GE(JsonNumber(r, "wall_ms"),
              JsonNumber(*lat, "mean") - 1e-9);  // the modelled GPU takes CPU scoring out
    EXPECT_GE(JsonNumber(r, "scoring_cpu_ms"), 0);
    EXPECT_GE(JsonNumber(r, "bubble_ms"), 0);
    EXPECT_TRUE(IsInt(r, "bytes_needed"));
    EXPECT_TRUE(IsInt(r, "bytes_read"));
    EXPECT_TRUE(IsInt(r, "wasted_prefetch_bytes"));
    EXPECT_TRUE(IsInt(r, "dominant_io_bytes"));
    const double needed = JsonNumber(r, "bytes_needed"), read = JsonNumber(r, "bytes_read");
    EXPECT_GT(needed, 0);
    EXPECT_GT(read, 0);  // no tiers: everything comes from NVMe
    EXPECT_NEAR(JsonNumber(r, "read_amplification"), read / needed, 1e-9);
    EXPECT_GT(JsonNumber(r, "device_mb_s"), 0);
    EXPECT_EQ(JsonNumber(r, "fio_mb_s"), 0);  // --no-fio
    const double recall = JsonNumber(r, "attention_recall");
    EXPECT_GT(recall, 0);
    EXPECT_LE(recall, 1 + 1e-5);
    EXPECT_GE(JsonNumber(r, "output_rel_error"), 0);
    const JsonValue* hits = r.Find("hit_rate");
    ASSERT_NE(hits, nullptr);
    EXPECT_EQ(JsonNumber(*hits, "gpu"), 0);  // tiers of 0 bytes
    EXPECT_EQ(JsonNumber(*hits, "cpu"), 0);
  }
  ASSERT_EQ(by.size(), 12u);
  // Every system has its budget sweep.
  for (const char* s : {"full", "h2o", "impress", "ckv-paper", "ckv", "recompute"}) {
    EXPECT_EQ(budgets_of[s], (std::set<double>{0.1, 0.5})) << s;
  }
  // impress reorders to convergence before measuring: the warm-up pass, then at least one that
  // rewrote nothing.
  for (double b : {0.1, 0.5}) {
    EXPECT_GE(JsonNumber(*by.at({"impress", b}), "reorder_passes"), 2);
    EXPECT_TRUE(*by.at({"impress", b})->Find("reorder_converged")->AsBool());
    EXPECT_EQ(JsonNumber(*by.at({"ckv", b}), "reorder_passes"), 0);
  }
  // A token-level system attends to fewer tokens than its blocks hold: its recall over them is
  // below the recall over everything it read (here, at 10%, strictly).
  for (const char* s : {"h2o", "impress"}) {
    EXPECT_LT(JsonNumber(*by.at({s, 0.1}), "attention_recall"),
              JsonNumber(*by.at({s, 0.1}), "attention_recall_loaded"))
        << s;
  }
  // The headline: ckv against each baseline at the baseline's recall at its reference budget
  // (the run's budget closest to 5%: 10% here), and against full at recall 0.95.
  const JsonValue* eq = doc->Find("equal_recall");
  ASSERT_NE(eq, nullptr);
  ASSERT_NE(eq->AsArray(), nullptr);
  std::set<std::string> baselines;
  for (const JsonValue& e : *eq->AsArray()) {
    const std::string base = *e.Find("baseline")->AsString();
    SCOPED_TRACE(base);
    baselines.insert(base);
    EXPECT_EQ(*e.Find("ckv_system")->AsString(), "ckv");
    EXPECT_EQ(*e.Find("tiers")->AsString(), "default");
    if (base == "full") {
      EXPECT_EQ(JsonNumber(e, "recall"), 0.95);
    } else {
      EXPECT_EQ(JsonNumber(e, "baseline_budget"), 0.1);
      EXPECT_NEAR(JsonNumber(e, "recall"), JsonNumber(*by.at({base, 0.1}), "attention_recall"),
                  1e-12);
      EXPECT_NEAR(JsonNumber(e, "baseline_latency_ms"),
                  JsonNumber(*by.at({base, 0.1})->Find("latency_ms"), "round_median"), 1e-9);
    }
    for (const char* k :
         {"ckv_latency_ms", "speedup", "speedup_min", "speedup_max", "ckv_budget"}) {
      ASSERT_NE(e.Find(k), nullptr) << k;
    }
    if (e.Find("speedup")->AsDouble() != nullptr || e.Find("speedup")->AsInt() != nullptr) {
      EXPECT_GT(JsonNumber(e, "speedup"), 0);
      EXPECT_LE(JsonNumber(e, "speedup_min"), JsonNumber(e, "speedup_round_median") + 1e-12);
      EXPECT_GE(JsonNumber(e, "speedup_max"), JsonNumber(e, "speedup_round_median") - 1e-12);
      EXPECT_NEAR(JsonNumber(e, "speedup"),
                  JsonNumber(e, "baseline_latency_ms") / JsonNumber(e, "ckv_latency_ms"), 1e-9);
    } else {
      EXPECT_FALSE(e.Find("note")->AsString()->empty()) << "a missing ratio says why";
    }
  }
  EXPECT_EQ(baselines, (std::set<std::string>{"impress", "ckv-paper", "h2o", "full"}));

  // Every row's quality is over both distinct measured requests: a mean, a p95, the worst layer.
  for (const JsonValue& r : *results->AsArray()) {
    SCOPED_TRACE(*r.Find("system")->AsString());
    EXPECT_EQ(JsonNumber(r, "quality_requests"),
              *r.Find("system")->AsString() == "recompute" ? 0 : 2);
    EXPECT_GE(JsonNumber(r, "output_rel_error_p95") + 1e-12, JsonNumber(r, "output_rel_error"));
    EXPECT_GE(JsonNumber(r, "worst_layer_error") + 1e-12, JsonNumber(r, "output_rel_error"));
  }
  // The headline: at equal output error, every baseline (full and recompute included) at each of
  // 0.05, 0.1 and 0.2; a system's latency there lies on its own curve, never beyond it.
  const JsonValue* ee = doc->Find("equal_error");
  ASSERT_NE(ee, nullptr);
  ASSERT_NE(ee->AsArray(), nullptr);
  std::set<std::pair<std::string, double>> seen;
  auto curve_of = [&](const std::string& s) {
    std::vector<const JsonValue*> c;
    for (double b : {0.1, 0.5}) c.push_back(by.at({s, b}));
    return c;
  };
  auto on_curve = [&](const std::string& system, const JsonValue& point, double error,
                      const JsonValue* latency) {
    SCOPED_TRACE(system);
    const std::vector<const JsonValue*> c = curve_of(system);
    bool reaches = false;
    double lo = 1e300, hi = 0;
    for (const JsonValue* r : c) {
      reaches |= JsonNumber(*r, "output_rel_error") <= error + 1e-12;
      for (const JsonValue& m : *r->Find("latency_ms")->Find("rounds")->AsArray()) {
        const double ms = m.AsDouble() ? *m.AsDouble() : double(*m.AsInt());
        lo = std::min(lo, ms);
        hi = std::max(hi, ms);
      }
    }
    EXPECT_EQ(*point.Find("reached")->AsBool(), reaches);
    if (!reaches) {
      EXPECT_TRUE(latency->IsNull()) << "not reached is never extrapolated";
      EXPECT_GT(JsonNumber(point, "closest_error"), error);
      return;
    }
    EXPECT_GE(JsonNumber(point, "latency_ms"), lo - 1e-9);
    EXPECT_LE(JsonNumber(point, "latency_ms"), hi + 1e-9);
    if (!point.Find("budget")->IsNull()) {
      EXPECT_GE(JsonNumber(point, "budget"), 0.1 - 1e-12);
      EXPECT_LE(JsonNumber(point, "budget"), 0.5 + 1e-12);
    }
  };
  for (const JsonValue& e : *ee->AsArray()) {
    const std::string base = *e.Find("baseline")->AsString();
    const double error = JsonNumber(e, "error");
    SCOPED_TRACE(base + " at error " + std::to_string(error));
    seen.insert({base, error});
    EXPECT_EQ(*e.Find("ckv_system")->AsString(), "ckv");
    for (const char* k :
         {"baseline_latency_ms", "ckv_latency_ms", "speedup", "speedup_min", "speedup_max"}) {
      ASSERT_NE(e.Find(k), nullptr) << k;
    }
    on_curve(base, *e.Find("points")->Find("baseline"), error, e.Find("baseline_latency_ms"));
    on_curve("ckv", *e.Find("points")->Find("ckv"), error, e.Find("ckv_latency_ms"));
    if (base == "full" || base == "recompute") {
      // Exact: error 0, so reached at every error, at its one latency.
      EXPECT_NEAR(JsonNumber(e, "baseline_latency_ms"),
                  JsonNumber(*by.at({base, 0.1})->Find("latency_ms"), "round_median"), 1e-9);
    }
    if (e.Find("speedup")->IsNull()) {
      EXPECT_FALSE(e.Find("note")->AsString()->empty()) << "a missing ratio says why";
      continue;
    }
    // The ratio of the medians; the per-round ratios beside it.
    EXPECT_NEAR(JsonNumber(e, "speedup"),
                JsonNumber(e, "baseline_latency_ms") / JsonNumber(e, "ckv_latency_ms"), 1e-9);
    EXPECT_LE(JsonNumber(e, "speedup_min"), JsonNumber(e, "speedup_max"));
  }
  for (const char* base : {"impress", "ckv-paper", "h2o", "full", "recompute"}) {
    for (double error : {0.05, 0.1, 0.2}) {
      EXPECT_TRUE(seen.contains({base, error})) << base << " at " << error;
    }
  }
  // Baseline-anchored: each selecting baseline at its 10% row, ckv at that row's error.
  const JsonValue* anchored = doc->Find("baseline_anchored");
  ASSERT_NE(anchored, nullptr);
  ASSERT_NE(anchored->AsArray(), nullptr);
  EXPECT_EQ(anchored->AsArray()->size(), 3u);
  for (const JsonValue& e : *anchored->AsArray()) {
    const std::string base = *e.Find("baseline")->AsString();
    SCOPED_TRACE(base);
    EXPECT_EQ(JsonNumber(e, "anchor_budget"), 0.1);
    EXPECT_EQ(JsonNumber(*e.Find("points")->Find("baseline"), "budget"), 0.1);
    EXPECT_NEAR(JsonNumber(e, "error"), JsonNumber(*by.at({base, 0.1}), "output_rel_error"), 1e-12);
    EXPECT_NEAR(JsonNumber(e, "baseline_latency_ms"),
                JsonNumber(*by.at({base, 0.1})->Find("latency_ms"), "round_median"), 1e-9);
  }
  for (double b : {0.1, 0.5}) {
    // full loads everything: recall 1, the exact output, and it reads exactly what it needs.
    const JsonValue& full = *by.at({"full", b});
    EXPECT_NEAR(JsonNumber(full, "attention_recall"), 1.0, 1e-6);
    EXPECT_LT(JsonNumber(full, "output_rel_error"), 1e-5);
    EXPECT_EQ(JsonNumber(full, "bytes_read"), JsonNumber(full, "bytes_needed"));
    // The block baselines read at least what their tokens need (keys to identify, whole blocks);
    // period-exact reads its head layers whole to score them.
    for (const char* s : {"h2o", "impress", "ckv-paper"}) {
      EXPECT_GE(JsonNumber(*by.at({s, b}), "bytes_read"),
                JsonNumber(*by.at({s, b}), "bytes_needed"))
          << s;
    }
  }
  // A larger budget keeps a superset of the chunks (same scores, larger top-k): recall only grows.
  for (const char* s : {"h2o", "impress", "ckv-paper", "ckv"}) {
    EXPECT_GE(JsonNumber(*by.at({s, 0.5}), "attention_recall") + 1e-9,
              JsonNumber(*by.at({s, 0.1}), "attention_recall"))
        << s;
  }

  // The same workload again reuses the store.
  const Ran second = RunReprefillBench(args);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("reusing the store"), std::string::npos) << second.output;
}

// The baselines admit what they read when a request ends (a GPU system's tier copies are DMA
// off the request's path): the measured turn of a conversation is served from the tiers its
// warm-up turn filled.
TEST(ReprefillBenchTest, BaselinesAdmitAtTheRequestsEndAndHitOnTheNextTurn) {
  TempDir dir;
  const std::string json = dir.path() + "/out.json";
  const Ran ran = RunReprefillBench(
      "--store " + dir.path() +
      "/store --model qwen2.5-0.5b --prefix-tokens 256 "
      "--suffix-tokens 16 --conversations 2 --turns 2 --request-shift 0 --budgets 50 "
      "--systems full,h2o,impress --gpu-tier-bytes 67108864 --cpu-tier-bytes 67108864 --no-fio "
      "--rounds 1 --json " +
      json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->Find("results")->AsArray()->size(), 4u);  // and the modelled recompute
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    const std::string system = *r.Find("system")->AsString();
    if (system == "recompute") continue;
    const JsonValue* hits = r.Find("hit_rate");
    ASSERT_NE(hits, nullptr) << system;
    EXPECT_GT(JsonNumber(*hits, "gpu") + JsonNumber(*hits, "cpu"), 0.5) << system << " hit nothing";
  }
}

// IMPRESS anchors (docs/baselines.md, "impress"): where a prefix's important tokens stay the
// same from request to request (request shift 0, the regime IMPRESS's reordering is built for),
// impress reads fewer bytes than full at 5% and 10% and at most 16x the bytes it needs at 5%.
// (From 25% on it reads more than full on this generator; baselines.md shows why.) Then
// the baselines' own files are verified as they are read: a flipped byte in keys.bin or
// impress.bin fails the run with DataLoss naming the file, never a wrong answer.
TEST(ReprefillBenchTest, ImpressAnchorsHoldAndItsFilesAreVerifiedOnRead) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  const std::string json = dir.path() + "/out.json";
  const std::string args =
      "--store " + store +
      " --model qwen2.5-0.5b --prefix-tokens 2048 --suffix-tokens 16 "
      "--conversations 2 --turns 3 --request-shift 0 --gpu-tier-bytes 0 --cpu-tier-bytes 0 "
      "--no-fio --rounds 1 --json " +
      json;
  const Ran ran = RunReprefillBench(args + " --budgets 5,10 --systems full,impress");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  std::map<std::pair<std::string, double>, const JsonValue*> by;
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    by[{*r.Find("system")->AsString(), *r.Find("budget")->AsDouble()}] = &r;
  }
  for (double b : {0.05, 0.1}) {
    ASSERT_TRUE(by.count({"impress", b}) && by.count({"full", b})) << b;
    EXPECT_LT(JsonNumber(*by.at({"impress", b}), "bytes_read"),
              JsonNumber(*by.at({"full", b}), "bytes_read"))
        << "impress reads more than full at budget " << b;
  }
  // Read amplification: bytes read (probe keys and 64-token blocks) over the selected tokens'.
  const double amp = JsonNumber(*by.at({"impress", 0.05}), "read_amplification");
  EXPECT_GT(amp, 1.0);
  EXPECT_LE(amp, 16.0);
  EXPECT_TRUE(*by.at({"impress", 0.05})->Find("reorder_converged")->AsBool());
  // The benchmark reports the same relations itself, per budget.
  const JsonValue* anchors = doc->Find("impress_anchors");
  ASSERT_NE(anchors, nullptr);
  ASSERT_EQ(anchors->AsArray()->size(), 2u);
  for (const JsonValue& a : *anchors->AsArray()) {
    const double b = JsonNumber(a, "budget");
    EXPECT_NEAR(JsonNumber(a, "bytes_vs_full"),
                JsonNumber(*by.at({"impress", b}), "bytes_read") /
                    JsonNumber(*by.at({"full", b}), "bytes_read"),
                1e-9);
    EXPECT_GT(JsonNumber(a, "speedup_vs_full"), 0);
  }

  // A flipped byte in a file the baselines read: the run fails, naming it.
  auto flip = [&](const std::string& name) { FlipByte(store + "/" + name, 0); };
  for (const char* name : {"impress.bin", "keys.bin"}) {
    flip(name);
    const Ran bad = RunReprefillBench(args + " --budgets 5 --systems impress");
    EXPECT_NE(bad.exit_code, 0) << name << ": " << bad.output;
    EXPECT_NE(bad.output.find(name), std::string::npos) << bad.output;
    EXPECT_NE(bad.output.find("checksum"), std::string::npos) << bad.output;
    // The failed run put impress's reordered blocks back: no impress.map is left behind.
    struct stat st {};
    EXPECT_NE(::stat((store + "/impress.map").c_str(), &st), 0) << name;
    flip(name);  // restored: the next file's check starts from a good store
  }
}

// ckv-paper scores from a key file of its own (scoring_keys.bin, read through
// engine::ScoringKeys) and h2o reads its values from one (values.bin), as both keep keys and
// values apart, and each verifies what it reads: a flipped byte in the half of conversation 1,
// layer 16 (a period head of ckv-paper's), chunk 20 fails the run with DataLoss naming the
// file. Read as halves of records, as before, neither would be verified (a record's checksum
// covers K and V together). And ckv-paper's keys are keys: scoring from them, it finds most of
// the attention at 10% (values in their place would score no better than chance).
TEST(ReprefillBenchTest, CkvPaperAndH2oReadVerifiedFilesOfTheirOwn) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  const std::string json = dir.path() + "/out.json";
  const std::string args =
      "--store " + store +
      " --model qwen2.5-0.5b --prefix-tokens 512 --suffix-tokens 16 "
      "--conversations 2 --turns 2 --gpu-tier-bytes 0 --cpu-tier-bytes 0 --no-fio --rounds 1 ";
  const Ran ran =
      RunReprefillBench(args + "--budgets 10 --fidelity --systems ckv-paper,h2o --json " + json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  bool found = false;
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    if (*r.Find("system")->AsString() != "ckv-paper") continue;
    found = true;
    EXPECT_GT(JsonNumber(r, "attention_recall"), 0.5) << "ckv-paper at 10%";
  }
  EXPECT_TRUE(found);
  // qwen2.5-0.5b: 24 layers; a half (16 tokens x 2 kv heads x 64 x 2 bytes) is one 4 KiB page.
  constexpr uint64_t kLayers = 24, kHalf = 4096;
  for (const auto& [system, name] : std::vector<std::pair<std::string, std::string>>{
           {"ckv-paper", "scoring_keys.bin"}, {"h2o", "values.bin"}}) {
    const std::string path = store + "/" + name;
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << name;
    const uint64_t chunks = uint64_t(st.st_size) / (2 * kLayers * kHalf);  // per (conv., layer)
    ASSERT_EQ(uint64_t(st.st_size), 2 * kLayers * chunks * kHalf) << name;
    ASSERT_GT(chunks, 20u) << name;
    const long at = static_cast<long>(((1 * kLayers + 16) * chunks + 20) * kHalf + 100);
    FlipByte(path, at);
    const Ran bad = RunReprefillBench(args + "--budgets 90 --systems " + system);
    EXPECT_NE(bad.exit_code, 0) << system << ": " << bad.output;
    EXPECT_NE(bad.output.find(name + ": conversation 1, layer 16, chunk 20"), std::string::npos)
        << bad.output;
    EXPECT_NE(bad.output.find("checksum"), std::string::npos) << bad.output;
    FlipByte(path, at);  // restored
  }
}

// Regression: fio_mb_s read the first bytes of a sparse segment file, mostly holes that return
// zeros without touching the device, and so reported several times the disk's speed. fio now
// reads a dense file as large as the store's allocated segment bytes.
TEST(ReprefillBenchTest, FioReadsADenseFileNotTheHolesOfASegment) {
  if (std::system("fio --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "fio is not installed";
  TempDir dir;
  const std::string store = dir.path() + "/store";
  const std::string json = dir.path() + "/out.json";
  const Ran ran = RunReprefillBench("--store " + store +
                                    " --model qwen2.5-0.5b --prefix-tokens 1024 "
                                    "--suffix-tokens 16 --conversations 2 --turns 2 --budgets 10 "
                                    "--systems full,ckv --fio-seconds 1 --json " +
                                    json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  struct stat fio_st {};
  ASSERT_EQ(::stat((store + "/fio.dat").c_str(), &fio_st), 0) << ran.output;
  EXPECT_GT(fio_st.st_size, 0);
  EXPECT_GE(uint64_t(fio_st.st_blocks) * 512, uint64_t(fio_st.st_size)) << "fio.dat has holes";
  // As large as the allocated bytes of the largest segment of the store it was sized for.
  uint64_t largest = 0;
  for (const char* layout : {"layer-major", "period-major"}) {
    std::error_code ec;
    for (const auto& e :
         std::filesystem::directory_iterator(store + "/" + layout + "/segments", ec)) {
      struct stat st {};
      if (::stat(e.path().c_str(), &st) == 0) {
        largest = std::max<uint64_t>(largest, uint64_t(st.st_blocks) * 512);
      }
    }
  }
  ASSERT_GT(largest, 0u);
  EXPECT_EQ(uint64_t(fio_st.st_size), largest / (1 << 20) * (1 << 20));
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    if (*r.Find("modelled")->AsBool()) continue;  // recompute does no I/O
    EXPECT_GT(JsonNumber(r, "fio_mb_s"), 0) << *r.Find("system")->AsString();
    EXPECT_GT(JsonNumber(r, "fio_engine_depth_mb_s"), 0) << *r.Find("system")->AsString();
  }
}

// Regression: another workload's store was cleared with `rm -rf '<store>/...'` through the
// shell, so a quote in --store broke the command (and could have run another).
// fio's commands quote the path too (and escape ':', which fio's --filename splits at).
TEST(ReprefillBenchTest, AStorePathWithAQuoteIsClearedAndRebuilt) {
  TempDir dir;
  const std::string store = dir.path() + "/it's a: store";
  const std::string json = dir.path() + "/out.json";
  const std::string args = "--store \"" + store +
                           "\" --model qwen2.5-0.5b --prefix-tokens 256 "
                           "--suffix-tokens 16 --conversations 1 --turns 2 --budgets 10 "
                           "--systems full,ckv";
  const bool have_fio = std::system("fio --version >/dev/null 2>&1") == 0;
  const Ran first =
      RunReprefillBench(args + (have_fio ? " --fio-seconds 1 --json " + json : " --no-fio"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  if (have_fio) {
    auto doc = tools::ReadJsonFile(json);
    ASSERT_TRUE(doc.ok()) << doc.status();
    for (const JsonValue& r : *doc->Find("results")->AsArray()) {
      if (*r.Find("modelled")->AsBool()) continue;  // recompute does no I/O
      EXPECT_GT(JsonNumber(r, "fio_mb_s"), 0) << first.output;
    }
  }
  // Another workload: the store is cleared and made anew, and a file of the user's stays.
  const std::string mine = store + "/notes.txt";
  std::FILE* f = std::fopen(mine.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const Ran other = RunReprefillBench(args + " --no-fio --seed 2");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("making a new store"), std::string::npos) << other.output;
  struct stat st {};
  EXPECT_EQ(::stat(mine.c_str(), &st), 0) << "a file the harness did not make was removed";
}

TEST(ReprefillBenchTest, BadFlagsAreRefusedByName) {
  TempDir dir;
  const Ran bad_system =
      RunReprefillBench("--store " + dir.path() + "/s --systems full,bogus --no-fio");
  EXPECT_EQ(bad_system.exit_code, 2);
  EXPECT_NE(bad_system.output.find("unknown system 'bogus'"), std::string::npos)
      << bad_system.output;
  const Ran bad_budget = RunReprefillBench("--store " + dir.path() + "/s --budgets 5,0 --no-fio");
  EXPECT_EQ(bad_budget.exit_code, 2);
  EXPECT_NE(bad_budget.output.find("--budgets: '0'"), std::string::npos) << bad_budget.output;
  const Ran bad_model = RunReprefillBench("--store " + dir.path() + "/s --model gpt-9 --no-fio");
  EXPECT_EQ(bad_model.exit_code, 2);
  EXPECT_NE(bad_model.output.find("gpt-9"), std::string::npos) << bad_model.output;
  // Nothing was made for a refused run.
  struct stat st {};
  EXPECT_NE(::stat((dir.path() + "/s").c_str(), &st), 0);
}

// A tiny run with the fidelity (qwen2.5-0.5b, one conversation of a 256-token prefix and two
// 16-token turns, 50%, one round) of `systems`, its JSON into `json`.
Ran RunTinyFidelity(const TempDir& dir, const std::string& systems, const std::string& json) {
  return RunReprefillBench("--store " + dir.path() +
                           "/s --model qwen2.5-0.5b --prefix-tokens 256 "
                           "--suffix-tokens 16 --conversations 1 --turns 2 --budgets 50 --rounds 1 "
                           "--fidelity --no-fio --systems " +
                           systems + " --json " + json);
}

// The ckv variants with an estimate, a target mass and rescored layers run, the fidelity
// checking the virtual tokens a session served against its rebuild from the records; the
// estimate lowers the error at the same selection; :rescore without a period is refused.
TEST(ReprefillBenchTest, EstimateTargetAndRescoreVariantsRunAndTheServedTokensCheckOut) {
  TempDir dir;
  const std::string json = dir.path() + "/out.json";
  const Ran ran =
      RunTinyFidelity(dir, "ckv,ckv-est,ckv:mean-key:period-major:2:estimate:target:rescore", json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  std::map<std::string, double> error;
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    error[*r.Find("system")->AsString()] = JsonNumber(r, "output_rel_error");
  }
  ASSERT_EQ(error.count("ckv-est"), 1u) << ran.output;
  ASSERT_EQ(error.count("ckv:mean-key:period-major:2:estimate:target:rescore"), 1u) << ran.output;
  EXPECT_GT(error["ckv"], 0);
  EXPECT_LT(error["ckv-est"], error["ckv"]) << "the same selections, the rest estimated";
  const Ran bad = RunReprefillBench("--store " + dir.path() +
                                    "/s --systems ckv:quest:layer-major:rescore "
                                    "--no-fio");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("rescore needs quest, mean-key or outlier-key with a period"),
            std::string::npos)
      << bad.output;
}

// Systems with a codec suffix run beside those without, in one run, each over a store of its
// own codec: full@int4 reads fewer bytes, and the error of full at a codec is the codec's alone
// (full in the dtype has none, int8 less than int4). h2o and impress, which keep their own files
// in the dtype, take no codec, by suffix or by --codec.
TEST(ReprefillBenchTest, CodecSuffixesRunBesideTheDtypeInOneRun) {
  TempDir dir;
  const std::string json = dir.path() + "/out.json";
  const Ran ran = RunTinyFidelity(dir, "full,full@int8,full@int4,ckv@int8", json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  std::map<std::string, const JsonValue*> row;
  for (const JsonValue& r : *doc->Find("results")->AsArray()) {
    row[*r.Find("system")->AsString()] = &r;
  }
  for (const char* name : {"full", "full@int8", "full@int4", "ckv@int8"}) {
    ASSERT_EQ(row.count(name), 1u) << name << "\n" << ran.output;
  }
  EXPECT_EQ(JsonNumber(*row["full"], "output_rel_error"), 0);
  const double int8_error = JsonNumber(*row["full@int8"], "output_rel_error");
  EXPECT_GT(int8_error, 0) << "the codec's rounding is served";
  EXPECT_LT(int8_error, JsonNumber(*row["full@int4"], "output_rel_error"));
  EXPECT_GT(JsonNumber(*row["ckv@int8"], "output_rel_error"), int8_error)
      << "half the chunks, at int8";
  // qwen2.5-0.5b's 16-token record fills an 8 KiB slot in fp16 and a 4 KiB one at int4 (2,688
  // bytes); at int8 (4,416 bytes) it still takes 8 KiB.
  const double fp16_read = JsonNumber(*row["full"], "bytes_read");
  EXPECT_GT(fp16_read, 0);
  EXPECT_EQ(JsonNumber(*row["full@int4"], "bytes_read"), fp16_read / 2);
  EXPECT_NE(row["full@int8"]->Find("config")->AsString()->find("stored int8"), std::string::npos);
  for (const char* name : {"layer-major", "layer-major-int8", "layer-major-int4"}) {
    EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/s/" + name)) << name;
  }
  const Ran suffixed =
      RunReprefillBench("--store " + dir.path() + "/s --systems full,impress@int8 --no-fio");
  EXPECT_EQ(suffixed.exit_code, 2);
  EXPECT_NE(suffixed.output.find("impress keeps its own files in the dtype"), std::string::npos)
      << suffixed.output;
  const Ran defaulted = RunReprefillBench("--store " + dir.path() +
                                          "/s --systems full,h2o --codec fp8 "
                                          "--no-fio");
  EXPECT_EQ(defaulted.exit_code, 2);
  EXPECT_NE(defaulted.output.find("system h2o keeps its own files"), std::string::npos)
      << defaulted.output;
  const Ran unknown =
      RunReprefillBench("--store " + dir.path() + "/s --systems full@int3 --no-fio");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("full@int3"), std::string::npos) << unknown.output;
}

// Regression (security audit): the store's manifest.json was read whole, however large; a
// manifest that never ends (/dev/zero behind a symlink) grew memory until the process died. It
// is now read up to 64 KiB, and anything larger is another workload's store, rebuilt.
TEST(ReprefillBenchTest, AnEndlessManifestIsNotReadWholeAndTheStoreIsRebuilt) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  ASSERT_EQ(::mkdir(store.c_str(), 0700), 0);
  ASSERT_EQ(::symlink("/dev/zero", (store + "/manifest.json").c_str()), 0);
  const Ran ran =
      RunReprefillBench("--store " + store +
                        " --model qwen2.5-0.5b --prefix-tokens 64 --suffix-tokens 16 "
                        "--conversations 1 --turns 2 --budgets 50 --systems ckv --no-fio");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("making a new store"), std::string::npos) << ran.output;
  struct stat st {};
  ASSERT_EQ(::lstat((store + "/manifest.json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the symlink was replaced by the manifest";
}

// A trained network's profile (here seeded random data in the file's format): the whole
// benchmark runs on it, the workload's shape and the model are the file's, and every selector's
// fidelity is measured on the file's KV and queries.
TEST(ReprefillBenchTest, TrainedProfileFileRunsEverySystemOnTheFilesAttention) {
  TempDir dir;
  const std::string profile = dir.path() + "/profile.safetensors";
  ::ckv::testing::TestProfile p;
  p.layers = 2, p.q_heads = 14, p.kv_heads = 2, p.head_dim = 64;
  p.prefix_tokens = 128, p.suffix_tokens = 32, p.turns = 3, p.window = 8;
  p.model_id = "test/trained-tiny";
  ASSERT_TRUE(p.Write(profile).ok());
  const std::string store = dir.path() + "/store";
  const std::string json = dir.path() + "/out.json";
  const Ran ran =
      RunReprefillBench("--store " + store + " --attention-profile trained-tiny " +
                        "--profile-file " + profile + " --budgets 10,50 --systems " + kSystems +
                        " --gpu-tier-bytes 0 --cpu-tier-bytes 0 --fidelity --no-fio "
                        "--rounds 1 --json " +
                        json);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("attention profile " + profile + ": test/trained-tiny"),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("reading the KV of 192 tokens"), std::string::npos) << ran.output;
  auto doc = tools::ReadJsonFile(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const JsonValue* workload = doc->Find("workload");
  ASSERT_NE(workload, nullptr);
  EXPECT_EQ(*workload->Find("model")->AsString(), "test/trained-tiny");
  EXPECT_EQ(*workload->Find("attention_profile")->AsString(), "trained-tiny");
  EXPECT_EQ(*workload->Find("profile_file")->AsString(), profile);
  EXPECT_EQ(workload->Find("request_shift"), nullptr);  // the generator's alone
  EXPECT_EQ(JsonNumber(*workload, "prefix_tokens"), 128);
  EXPECT_EQ(JsonNumber(*workload, "suffix_tokens"), 32);
  EXPECT_EQ(JsonNumber(*workload, "conversations"), 2);
  EXPECT_EQ(JsonNumber(*workload, "turns"), 3);
  EXPECT_EQ(JsonNumber(*workload, "window"), 8);
  const JsonValue* results = doc->Find("results");
  ASSERT_NE(results, nullptr);
  std::set<std::string> systems;
  for (const JsonValue& r : *results->AsArray()) {
    const std::string sys = *r.Find("system")->AsString();
    systems.insert(sys);
    const double recall = JsonNumber(r, "attention_recall");
    EXPECT_GE(recall, 0) << sys;
    EXPECT_LE(recall, 1 + 1e-6) << sys;
    const double error = JsonNumber(r, "output_rel_error");
    EXPECT_GE(error, 0) << sys;
    if (sys == "full") {
      EXPECT_NEAR(recall, 1, 1e-5);
      EXPECT_NEAR(error, 0, 1e-5);
    }
  }
  EXPECT_EQ(systems,
            (std::set<std::string>{"full", "h2o", "impress", "ckv-paper", "ckv", "recompute"}));

  // Rerun: the store is reused; a rewritten file (another seed) makes a new one.
  const std::string again = "--store " + store +
                            " --attention-profile trained-tiny "
                            "--profile-file " +
                            profile +
                            " --budgets 50 --systems ckv --no-fio "
                            "--rounds 1";
  const Ran reused = RunReprefillBench(again);
  ASSERT_EQ(reused.exit_code, 0) << reused.output;
  EXPECT_NE(reused.output.find("reusing the store"), std::string::npos) << reused.output;
  p.seed = 2;
  p.prefix_tokens = 160;
  ASSERT_TRUE(p.Write(profile).ok());
  const Ran rebuilt = RunReprefillBench(again);
  ASSERT_EQ(rebuilt.exit_code, 0) << rebuilt.output;
  EXPECT_NE(rebuilt.output.find("making a new store"), std::string::npos) << rebuilt.output;
}

TEST(ReprefillBenchTest, ProfileFileFlagsAreRefusedByName) {
  TempDir dir;
  const std::string profile = dir.path() + "/profile.safetensors";
  ::ckv::testing::TestProfile p;
  ASSERT_TRUE(p.Write(profile).ok());
  const std::string base = "--store " + dir.path() + "/s --no-fio --rounds 1 ";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--attention-profile trained-tiny", "needs --profile-file PATH"},
           {"--profile-file " + profile, "--profile-file needs --attention-profile trained-tiny"},
           {"--attention-profile trained-tiny --profile-file " + dir.path() + "/absent",
            dir.path() + "/absent"},
           {"--attention-profile trained-tiny --profile-file " + profile + " --turns 5",
            "--turns 5 contradicts the profile file " + profile + ", which has 2"},
           {"--attention-profile trained-tiny --profile-file " + profile + " --model qwen2.5-7b",
            "--model qwen2.5-7b contradicts the profile file"},
           {"--attention-profile trained-tiny --profile-file " + profile + " --request-shift 0.5",
            "--request-shift is the synthetic generator's"},
           {"--attention-profile trained-tiny --profile-file " + profile + " --head-agreement 0.95",
            "--head-agreement is the synthetic generator's"},
           {"--attention-profile bogus", "or trained-tiny (with --profile-file)"}}) {
    const Ran ran = RunReprefillBench(base + c.args);
    EXPECT_EQ(ran.exit_code, 2) << c.args << "\n" << ran.output;
    EXPECT_NE(ran.output.find(c.message), std::string::npos) << c.args << "\n" << ran.output;
  }
  // Flags that agree with the file are accepted (checked by a run that gets past them).
  const Ran agreeing =
      RunReprefillBench(base + "--attention-profile trained-tiny --profile-file " + profile +
                        " --turns 2 --window 4 --budgets 50 --systems ckv");
  EXPECT_EQ(agreeing.exit_code, 0) << agreeing.output;
}

#else

TEST(ReprefillBenchTest, TinyRunHasTheSchemaAndSaneFigures) {
  GTEST_SKIP() << "built without the benchmarks (CKV_BUILD_BENCH=OFF)";
}

#endif

}  // namespace
}  // namespace ckv
