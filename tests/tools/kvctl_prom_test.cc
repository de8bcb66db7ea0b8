// SPDX-License-Identifier: Apache-2.0
// kvctl stats --format prom, driven as an operator would: the store's figures at rest in the
// Prometheus text format, read back with the strict reader of tests/prom_text.h.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "tests/json_test_util.h"
#include "tests/prom_text.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

#ifndef CKV_KVCTL_PATH
#error "CKV_KVCTL_PATH must name the kvctl binary"
#endif

namespace ckv {
namespace {

using ::ckv::testing::ParsePromText;
using ::ckv::testing::ProgramRun;
using ::ckv::testing::PromText;
using ::ckv::testing::TempDir;
using ::testing::HasSubstr;

using ::ckv::testing::Kvctl;
using ::ckv::testing::KvctlStdout;

using ::ckv::testing::JsonInt;

// stats --format prom: the store's figures at rest in the Prometheus text format, the same
// figures the table and --json print, under the names Engine::Metrics() gives them.
TEST(KvctlStatsPromTest, PrintsTheStoreAtRestForTheTextfileCollector) {
  TempDir dir;
  const std::string store = dir.Sub("store \"q\"");  // a label value that needs escapes
  const std::string quoted = "'" + store + "'";
  ASSERT_EQ(Kvctl("init " + quoted + " --max-disk-bytes 64M").exit_code, 0);
  // A: 16 chunks; B: 16 chunks of which the first 12 are A's.
  ASSERT_EQ(Kvctl("put " + quoted + " --model qwen2.5-0.5b --tokens 256 --seed 1").exit_code, 0);
  ASSERT_EQ(Kvctl("put " + quoted +
                  " --model qwen2.5-0.5b --tokens 256 --seed 2 --shared-tokens 192 "
                  "--shared-seed 1")
                .exit_code,
            0);

  const ProgramRun prom = KvctlStdout("stats " + quoted + " --format prom");
  ASSERT_EQ(prom.exit_code, 0) << prom.output;
  PromText p;
  std::string error;
  ASSERT_TRUE(ParsePromText(prom.output, &p, &error)) << error << "\n" << prom.output;
  const std::map<std::string, std::string> label{{"store", store}};
  EXPECT_EQ(p.Value("ckv_chunks", label), 20) << prom.output;
  EXPECT_EQ(p.Value("ckv_prefixes", label), 2);
  EXPECT_EQ(p.Value("ckv_segments", label), 1);
  EXPECT_EQ(p.Value("ckv_disk_cap_bytes", label), 64 << 20);
  EXPECT_EQ(p.Value("ckv_puts_total", label), 2);
  EXPECT_EQ(p.Value("ckv_chunks_written_total", label), 20);
  EXPECT_EQ(p.Value("ckv_chunks_deduplicated_total", label), 12);
  EXPECT_EQ(p.Value("ckv_chunks_evicted_total", label), 0);
  EXPECT_EQ(p.Value("ckv_chunks_deleted_total", label), 0);
  EXPECT_EQ(p.type["ckv_chunks"], "gauge");
  EXPECT_EQ(p.type["ckv_puts_total"], "counter");
  // Only the at-rest families: nothing a serving process measures since its Open.
  EXPECT_EQ(p.samples.size(), 14u) << prom.output;
  EXPECT_EQ(p.help.count("ckv_put_latency_seconds"), 0u);
  EXPECT_EQ(p.help.count("ckv_io_backend_info"), 0u);

  // The same figures as the table and --json.
  ProgramRun r = Kvctl("stats " + quoted);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(": 20 chunks, 2 prefixes, 1 segment\n")) << r.output;
  r = Kvctl("stats " + quoted + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto json = tools::ParseJson(r.output);
  ASSERT_TRUE(json.ok()) << json.status() << r.output;
  const tools::JsonValue& stats = *json->Find("stats");
  EXPECT_EQ(p.Value("ckv_disk_used_bytes", label),
            static_cast<double>(JsonInt(stats, "disk_bytes_used")));
  EXPECT_GT(p.Value("ckv_disk_used_bytes", label), 0);
  EXPECT_EQ(p.Value("ckv_written_bytes_total", label),
            static_cast<double>(JsonInt(stats, "bytes_written")));
  EXPECT_EQ(p.Value("ckv_index_memory_bytes", label),
            static_cast<double>(JsonInt(stats, "index_memory_bytes")));
  // --format json is --json; --format table is the default.
  EXPECT_EQ(Kvctl("stats " + quoted + " --format json").output, r.output);
  EXPECT_EQ(Kvctl("stats " + quoted + " --format table").output, Kvctl("stats " + quoted).output);

  // Both on stdout, or a format kvctl does not know: usage errors.
  r = Kvctl("stats " + quoted + " --format prom --json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--format prom and --json both write stdout"));
  r = Kvctl("stats " + quoted + " --format xml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--format: 'xml' is not table, json or prom")) << r.output;
  // --json PATH beside --format prom: the JSON goes to PATH, the text to stdout.
  const std::string path = dir.Sub("stats.json");
  const ProgramRun both = KvctlStdout("stats " + quoted + " --format prom --json " + path);
  ASSERT_EQ(both.exit_code, 0) << both.output;
  EXPECT_EQ(both.output, prom.output);
  std::ifstream in(path);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(written, HasSubstr("\"chunks\":20")) << written;
}

}  // namespace
}  // namespace ckv
