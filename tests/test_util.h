// tests/test_util.h: helpers shared by ckv's tests.
#ifndef CKV_TESTS_TEST_UTIL_H_
#define CKV_TESTS_TEST_UTIL_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckv/engine.h"
#include "gtest/gtest.h"
#include "kernels/summary.h"
#include "tools/synthetic_kv.h"

namespace ckv::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/ckv-test-XXXXXX";
    char* made = mkdtemp(templ.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

#define CKV_ASSERT_OK(expr)                                      \
  do {                                                           \
    const ::absl::Status ckv_test_status_ = (expr);              \
    ASSERT_TRUE(ckv_test_status_.ok()) << ckv_test_status_;     \
  } while (false)

#define CKV_EXPECT_OK(expr)                                      \
  do {                                                           \
    const ::absl::Status ckv_test_status_ = (expr);              \
    EXPECT_TRUE(ckv_test_status_.ok()) << ckv_test_status_;     \
  } while (false)

// Bytes of disk blocks allocated to the segment files of the store at `store` (st_blocks).
// Records an Engine stores per chunk: one per layer, plus the two key summary parts.
inline uint64_t RecordsPerChunk(const ModelSpec& spec) { return uint64_t{spec.layers} + 2; }

// Segment bytes one chunk stored by an Engine occupies: its records and its summaries, each in a
// slot rounded up to 4096 (storage/segment.h).
inline uint64_t ChunkDiskBytes(const ModelSpec& spec) {
  auto slot = [](uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  const kernels::SummaryFormat f = kernels::SummaryFormat::For(spec);
  return spec.layers * slot(spec.RecordBytes()) + slot(f.MinMaxBytes()) + slot(f.MeanBytes());
}

inline uint64_t SegmentBlocksBytes(const std::string& store) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(store + "/segments")) {
    struct stat st;
    if (::stat(entry.path().c_str(), &st) == 0) total += uint64_t(st.st_blocks) * 512;
  }
  return total;
}

// Reads every record of the first `chunks` chunks of `tokens` and compares each with the
// generator, bit for bit. Returns the number of records that differ or failed to read.
inline int CountBadRecords(Engine& engine, const ModelSpec& spec,
                           const std::vector<int32_t>& tokens, size_t chunks) {
  const auto keys = ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
  std::vector<std::byte> got(spec.RecordBytes()), want(spec.RecordBytes());
  int bad = 0;
  for (size_t i = 0; i < chunks && i < keys.size(); ++i) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      synth::FillRecord(spec, keys[i], l, want);
      absl::Status s = engine.ReadRecord(spec, keys[i], l, got);
      if (!s.ok() || got != want) ++bad;
    }
  }
  return bad;
}

// Puts the synthetic prefix `tokens`.
inline absl::StatusOr<PutResult> PutSynthetic(Engine& engine, const ModelSpec& spec,
                                              const std::vector<int32_t>& tokens) {
  synth::SyntheticKv kv(spec, tokens);
  return engine.Put(spec, tokens, kv.tensors());
}

}  // namespace ckv::testing

#endif  // CKV_TESTS_TEST_UTIL_H_
