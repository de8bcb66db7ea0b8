// SPDX-License-Identifier: Apache-2.0
// index_bench (bench/index_bench.cc) at two tiny sizes: its JSON has the documented fields, the
// store it builds opens with every chunk, Lookup finds whole chains, every Put evicted as many
// chunks as it wrote, and the index's memory and catalog grow with N. Nothing here is timed: the
// figures are checked only for the relations that hold by construction.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/json_test_util.h"
#include "tests/test_util.h"
#include "tools/json_reader.h"

namespace ckv {
namespace {

using ::ckv::testing::TempDir;
using tools::JsonValue;

#ifdef CKV_INDEX_BENCH_PATH

using ::ckv::testing::JsonNumber;

TEST(IndexBenchTest, TwoTinySizesReportSaneFiguresThatGrowWithN) {
  TempDir dir;
  const std::string json = dir.path() + "/out.json";
  // The larger size is big enough that its index outweighs the noise of a process's RSS.
  const auto r = ::ckv::testing::RunProgram(
      CKV_INDEX_BENCH_PATH, "--store " + dir.path() +
                                "/stores --chunks 2000,40000 "
                                "--prefix-chunks 100 --cold-chains 8 --hot-lookups 20 --puts 5 "
                                "--chunks-per-put 2 --json " +
                                json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << json << " not written; output: " << r.output;
  std::stringstream text;
  text << in.rdbuf();
  auto v = tools::ParseJson(text.str());
  ASSERT_TRUE(v.ok()) << v.status() << text.str();
  ASSERT_NE(v->Find("fake_records_readable"), nullptr);
  EXPECT_FALSE(*v->Find("fake_records_readable")->AsBool());
  const JsonValue::Array* sizes = v->Find("sizes")->AsArray();
  ASSERT_NE(sizes, nullptr);
  ASSERT_EQ(sizes->size(), 2u);
  const JsonValue& small = (*sizes)[0];
  const JsonValue& large = (*sizes)[1];
  EXPECT_EQ(JsonNumber(small, "chunks"), 2000);
  EXPECT_EQ(JsonNumber(large, "chunks"), 40000);
  for (const JsonValue* s : {&small, &large}) {
    // The probe's one-chunk prefix and prefixes of 100 chunks.
    const auto chunks = static_cast<uint64_t>(JsonNumber(*s, "chunks"));
    EXPECT_EQ(JsonNumber(*s, "prefixes"), static_cast<double>(1 + (chunks - 1 + 99) / 100));
    EXPECT_GE(JsonNumber(*s, "segments"), 2);
    EXPECT_GT(JsonNumber(*s, "open_seconds"), 0);
    EXPECT_GT(JsonNumber(*s, "rss_after_open_bytes"), JsonNumber(*s, "rss_before_open_bytes"));
    EXPECT_GE(JsonNumber(*s, "rss_peak_bytes"), JsonNumber(*s, "rss_after_open_bytes"));
    EXPECT_GT(JsonNumber(*s, "rss_bytes_per_chunk"), 0);
    EXPECT_EQ(JsonNumber(*s, "lookup_chain_chunks"), 100);
    EXPECT_EQ(JsonNumber(*s, "cold_chains"), 8);
    EXPECT_EQ(JsonNumber(*s, "hot_lookups"), 20);
    EXPECT_GT(JsonNumber(*s, "lookup_cold_p50_ms"), 0);
    EXPECT_LE(JsonNumber(*s, "lookup_cold_p50_ms"), JsonNumber(*s, "lookup_cold_p99_ms"));
    EXPECT_GT(JsonNumber(*s, "lookup_hot_p50_ms"), 0);
    EXPECT_LE(JsonNumber(*s, "lookup_hot_p50_ms"), JsonNumber(*s, "lookup_hot_p99_ms"));
    // Every Put wrote its chunks and evicted as many to stay under a cap at the store's use.
    EXPECT_EQ(JsonNumber(*s, "puts"), 5);
    EXPECT_EQ(JsonNumber(*s, "put_chunks_written"), 10);
    EXPECT_GE(JsonNumber(*s, "put_chunks_evicted"), 10);
    EXPECT_GT(JsonNumber(*s, "puts_per_second"), 0);
    EXPECT_GT(JsonNumber(*s, "evicted_chunks_per_second"), 0);
    EXPECT_GT(JsonNumber(*s, "catalog_bytes"), 0);
    // The index holds at least each chunk's key and a checksum, and is in the RSS the open added.
    EXPECT_GE(JsonNumber(*s, "index_memory_bytes"), static_cast<double>(chunks) * (16 + 8));
    EXPECT_LE(JsonNumber(*s, "index_memory_bytes"),
              JsonNumber(*s, "rss_after_open_bytes") - JsonNumber(*s, "rss_before_open_bytes"));
    EXPECT_DOUBLE_EQ(JsonNumber(*s, "index_bytes_per_chunk"),
                     JsonNumber(*s, "index_memory_bytes") / static_cast<double>(chunks));
  }
  EXPECT_GT(JsonNumber(large, "rss_after_open_bytes") - JsonNumber(large, "rss_before_open_bytes"),
            JsonNumber(small, "rss_after_open_bytes") - JsonNumber(small, "rss_before_open_bytes"));
  EXPECT_GT(JsonNumber(large, "catalog_bytes"), JsonNumber(small, "catalog_bytes"));
}

TEST(IndexBenchTest, RefusesACountBelowTwo) {
  TempDir dir;
  const auto r =
      ::ckv::testing::RunProgram(CKV_INDEX_BENCH_PATH, "--store " + dir.path() + " --chunks 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--chunks"), std::string::npos) << r.output;
}

#else

TEST(IndexBenchTest, TwoTinySizesReportSaneFiguresThatGrowWithN) {
  GTEST_SKIP() << "built without the benchmarks (CKV_BUILD_BENCH=OFF)";
}

#endif

}  // namespace
}  // namespace ckv
