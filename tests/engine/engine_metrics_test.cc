// SPDX-License-Identifier: Apache-2.0
// Tests of Engine::Metrics(): the Prometheus text of an engine after Puts, Lookups, a Re-Prefill
// session and failing calls, read back with the strict reader of tests/prom_text.h.
#include <string>
#include <vector>

#include "ckv/engine.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "kernels/device_memory.h"
#include "tests/prom_text.h"
#include "tests/test_util.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

using ::ckv::testing::ParsePromText;
using ::ckv::testing::PromText;
using ::ckv::testing::PutSynthetic;
using ::ckv::testing::TempDir;

PromText Parsed(Engine& engine) {
  const std::string text = engine.Metrics();
  PromText p;
  std::string error;
  EXPECT_TRUE(ParsePromText(text, &p, &error)) << error << "\n" << text;
  return p;
}

// Runs a Re-Prefill of `tokens` over every layer and finishes it.
void RunSession(Engine& engine, const ModelSpec& spec, const std::vector<int32_t>& tokens) {
  ReprefillOptions o;
  o.selector = Selector::kQuest;
  o.window = 4;
  auto session = engine.BeginReprefill(spec, tokens, o);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<float> queries(size_t{o.window} * spec.q_heads * spec.head_dim, 0.25f);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    ASSERT_TRUE((*session)->SubmitQueries(l, queries).ok()) << l;
    auto view = (*session)->AwaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status();
  }
  ASSERT_TRUE((*session)->Finish().ok());
}

TEST(EngineMetricsTest, CountsCallsLatenciesSessionsAndFailuresByCode) {
  TempDir dir;
  EngineOptions options;
  options.gpu_tier_bytes = 1 << 20;
  options.cpu_tier_bytes = 4 << 20;
  auto engine = Engine::Open(options, dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::vector<int32_t> tokens = synth::Tokens(11, 8 * spec.chunk_tokens);

  {
    // Before any call: every histogram is empty, no failure is counted.
    const PromText p = Parsed(**engine);
    EXPECT_EQ(p.Value("ckv_put_latency_seconds_count"), 0);
    EXPECT_EQ(p.Value("ckv_reprefill_latency_seconds_bucket", {{"le", "+Inf"}}), 0);
    EXPECT_EQ(p.Count("ckv_failures_total"), 0u);
    EXPECT_EQ(p.help.count("ckv_failures_total"), 1u) << "the family is declared empty";
    EXPECT_EQ(p.Value("ckv_read_requests_submitted_total"), 0) << "no read engine yet";
  }

  // Two Puts (the second stores nothing new), three Lookups.
  ASSERT_TRUE(PutSynthetic(**engine, spec, tokens).ok());
  ASSERT_TRUE(PutSynthetic(**engine, spec, tokens).ok());
  for (int i = 0; i < 3; ++i) {
    auto n = (*engine)->Lookup(spec, tokens);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, 8u);
  }
  // Failing calls: a Put whose tensors have the wrong shape, a Delete of what is not stored, a
  // Re-Prefill with a budget out of range, and an AwaitLayer before SubmitQueries.
  {
    synth::SyntheticKv kv(spec, tokens);
    KvTensors bad = kv.tensors();
    bad.k.pop_back();  // one layer short
    auto put = (*engine)->Put(spec, tokens, bad);
    ASSERT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  }
  const std::vector<int32_t> other = synth::Tokens(12, 2 * spec.chunk_tokens);
  ASSERT_EQ((*engine)->Delete(spec, other).code(), absl::StatusCode::kNotFound);
  ReprefillOptions too_much;
  too_much.budget_fraction = 2;
  ASSERT_EQ((*engine)->BeginReprefill(spec, tokens, too_much).status().code(),
            absl::StatusCode::kInvalidArgument);
  {
    auto session = (*engine)->BeginReprefill(spec, tokens);
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_EQ((*session)->AwaitLayer(0).status().code(), absl::StatusCode::kFailedPrecondition);
  }  // destroyed without Finish: not a Re-Prefill that finished
  // One whole Re-Prefill.
  RunSession(**engine, spec, tokens);

  const EngineStats stats = (*engine)->Stats();
  const PromText p = Parsed(**engine);
  // The store.
  EXPECT_EQ(p.Value("ckv_chunks"), 8);
  EXPECT_EQ(p.Value("ckv_chunks"), static_cast<double>(stats.chunks));
  EXPECT_EQ(p.Value("ckv_prefixes"), 1);
  EXPECT_EQ(p.Value("ckv_puts_total"), 2);
  EXPECT_EQ(p.Value("ckv_chunks_written_total"), 8);
  EXPECT_EQ(p.Value("ckv_chunks_deduplicated_total"), 8);
  EXPECT_EQ(p.Value("ckv_disk_used_bytes"), static_cast<double>(stats.disk_bytes_used));
  EXPECT_GT(p.Value("ckv_disk_used_bytes"), 0);
  // Latencies of the calls that returned OK; the failed Put is not among them.
  EXPECT_EQ(p.Value("ckv_put_latency_seconds_count"), 2);
  EXPECT_EQ(p.Value("ckv_put_latency_seconds_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_GT(p.Value("ckv_put_latency_seconds_sum"), 0);
  EXPECT_EQ(p.Value("ckv_lookup_latency_seconds_count"), 3);
  EXPECT_EQ(p.Value("ckv_await_layer_latency_seconds_count"), spec.layers);
  EXPECT_EQ(p.Value("ckv_reprefill_latency_seconds_count"), 1);
  EXPECT_GE(p.Value("ckv_reprefill_latency_seconds_sum"),
            p.Value("ckv_await_layer_latency_seconds_sum"));
  // Failures, each by its operation and code, and nothing else.
  EXPECT_EQ(p.Value("ckv_failures_total", {{"op", "put"}, {"code", "INVALID_ARGUMENT"}}), 1);
  EXPECT_EQ(p.Value("ckv_failures_total", {{"op", "delete"}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(
      p.Value("ckv_failures_total", {{"op", "begin_reprefill"}, {"code", "INVALID_ARGUMENT"}}), 1);
  EXPECT_EQ(p.Value("ckv_failures_total", {{"op", "await_layer"}, {"code", "FAILED_PRECONDITION"}}),
            1);
  EXPECT_EQ(p.Count("ckv_failures_total"), 4u);
  // Sessions, the read engine and the tiers.
  EXPECT_EQ(p.Value("ckv_sessions_total"), 1);
  EXPECT_EQ(p.Value("ckv_session_records_served_total"),
            static_cast<double>(stats.session_records_served));
  EXPECT_GT(p.Value("ckv_session_records_served_total"), 0);
  EXPECT_GT(p.Value("ckv_read_requests_submitted_total"), 0);
  EXPECT_EQ(p.Value("ckv_read_requests_completed_total", {{"outcome", "failed"}}), 0);
  EXPECT_GT(p.Value("ckv_read_requests_completed_total", {{"outcome", "ok"}}), 0);
  EXPECT_GT(p.Value("ckv_read_device_bytes_total"), 0);
  EXPECT_EQ(p.Value("ckv_tier_budget_bytes", {{"tier", "gpu"}}), 1 << 20);
  // The CPU tier's records get what the summary cache (a quarter) leaves.
  EXPECT_EQ(p.Value("ckv_tier_budget_bytes", {{"tier", "cpu"}}), 3 << 20);
  EXPECT_EQ(p.Value("ckv_tier_budget_bytes", {{"tier", "cpu"}}),
            static_cast<double>(stats.cpu_tier_budget_bytes));
  EXPECT_EQ(p.Value("ckv_tier_resident_bytes", {{"tier", "gpu"}}),
            static_cast<double>(stats.gpu_tier_resident_bytes));
  EXPECT_EQ(p.Value("ckv_gpu_tier_on_device"), kernels::NewCudaMemory().ok() ? 1 : 0);
  // The backend: the read engine's, the one the POSIX file system picks for kAuto.
  EXPECT_EQ(p.Count("ckv_io_backend_info"), 1u);
  EXPECT_EQ(
      p.Value("ckv_io_backend_info", {{"backend", io::UringAvailable() ? "io_uring" : "threads"}}),
      1);
}

TEST(EngineMetricsTest, NamesTheThreadsBackendAndNoDeviceTierBeforeAnySession) {
  TempDir dir;
  EngineOptions options;
  options.io_backend = IoBackend::kThreads;
  auto engine = Engine::Open(options, dir.path());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const PromText p = Parsed(**engine);
  EXPECT_EQ(p.Value("ckv_io_backend_info", {{"backend", "threads"}}), 1);
  EXPECT_EQ(p.Value("ckv_gpu_tier_on_device"), 0);
  EXPECT_EQ(p.Value("ckv_tier_budget_bytes", {{"tier", "gpu"}}), 0);
  EXPECT_EQ(p.Value("ckv_chunks"), 0);
  EXPECT_EQ(p.Value("ckv_sessions_total"), 0);
}

}  // namespace
}  // namespace ckv
