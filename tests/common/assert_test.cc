// SPDX-License-Identifier: Apache-2.0
// Tests of common/assert.h: a broken invariant stops the process with its file, line and
// condition; CKV_DCHECK is on exactly where the build says so, and never evaluates its condition
// when compiled out.
#include "common/assert.h"

#include <gtest/gtest.h>

#include "ckv/status.h"
#include "common/status_macros.h"
#include "io/mem_file_system.h"
#include "prefetch/read_engine.h"
#include "storage/chunk_store.h"
#include "storage/segment.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

int Twice(int x) { return 2 * x; }

TEST(AssertDeathTest, CheckStopsTheProcessWithFileLineAndCondition) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(CKV_CHECK(Twice(2) == 5),
               "ckv: check failed: .*assert_test\\.cc:[0-9]+: Twice\\(2\\) == 5");
}

TEST(AssertDeathTest, CheckThatHoldsDoesNothing) {
  int evaluated = 0;
  CKV_CHECK(++evaluated == 1);
  EXPECT_EQ(evaluated, 1);
}

TEST(AssertDeathTest, DcheckFollowsTheBuild) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int evaluated = 0;
  CKV_DCHECK(++evaluated == 1);
#if CKV_DCHECK_IS_ON
  EXPECT_EQ(evaluated, 1);
  EXPECT_DEATH(CKV_DCHECK(Twice(1) == 3), "ckv: check failed: .*Twice\\(1\\) == 3");
#else
  // Compiled out: the condition is not evaluated, and a false one does not stop anything.
  EXPECT_EQ(evaluated, 0);
  CKV_DCHECK(Twice(1) == 3);
#endif
}

#if defined(CKV_ENABLE_DCHECK)
TEST(AssertDeathTest, EnableDcheckTurnsItOn) { EXPECT_EQ(CKV_DCHECK_IS_ON, 1); }
#endif

// A real invariant: freeing slots a segment does not hold in use would hand one slot to two
// chunks. The store never does; if it did, the process stops before a reader gets wrong bytes.
TEST(AssertDeathTest, SegmentDoubleFreeStopsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  io::MemFileSystem fs;
  auto file = fs.Open("/seg", io::FileSystem::OpenMode::kCreateReadWrite);
  ASSERT_TRUE(file.ok()) << file.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const storage::SegmentRecord geometry =
      storage::Segment::GeometryFor(spec, RecordLayout::kLayerMajor, 1, 64 << 20, 0, {});
  storage::Segment segment(1, geometry, std::move(*file));
  const storage::SlotRun run = segment.Allocate(2);
  ASSERT_EQ(run.count, 2u);
  segment.Free(run);
  EXPECT_DEATH(segment.Free(run),
               "ckv: check failed: .*segment\\.cc:[0-9]+: run\\.count <= used_slots_");
}

#if CKV_DCHECK_IS_ON
// The I/O layer's seam, broken on purpose: a queue that runs every op's callback twice, as a
// faulty IoQueue would. The layers above check that each op completes exactly once, and stop at
// the second completion, before a staging buffer is handed to two ops.
class TwiceCompletingQueue final : public io::IoQueue {
 public:
  explicit TwiceCompletingQueue(std::unique_ptr<io::IoQueue> inner) : inner_(std::move(inner)) {}
  absl::Status Submit(const io::IoOp& op, Callback done) override {
    return inner_->Submit(op, [done = std::move(done)](const absl::Status& status) {
      done(status);
      done(status);
    });
  }
  absl::Status Drain() override { return inner_->Drain(); }
  absl::Status Reap(bool wait) override { return inner_->Reap(wait); }
  bool HasCompletions() const override { return inner_->HasCompletions(); }
  void Wake() override { inner_->Wake(); }
  const char* backend() const override { return inner_->backend(); }

 private:
  std::unique_ptr<io::IoQueue> inner_;
};

class TwiceCompletingFileSystem final : public io::FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<io::File>> Open(const std::string& path, OpenMode mode) override {
    return mem_.Open(path, mode);
  }
  absl::Status CreateDir(const std::string& path) override { return mem_.CreateDir(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return mem_.ListDir(path);
  }
  absl::Status DeleteFile(const std::string& path) override { return mem_.DeleteFile(path); }
  absl::Status SyncDir(const std::string& path) override { return mem_.SyncDir(path); }
  bool Exists(const std::string& path) override { return mem_.Exists(path); }
  absl::StatusOr<std::unique_ptr<io::IoQueue>> NewIoQueue(uint32_t depth) override {
    CKV_ASSIGN_OR_RETURN(std::unique_ptr<io::IoQueue> inner, mem_.NewIoQueue(depth));
    return std::unique_ptr<io::IoQueue>(new TwiceCompletingQueue(std::move(inner)));
  }
  io::MemFileSystem& mem() { return mem_; }

 private:
  io::MemFileSystem mem_;
};

// The chunk store: a Put's write that completes twice would return its staging buffer twice.
TEST(AssertDeathTest, ChunkStoreWriteCompletingTwiceStopsThePut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::TempDir dir;  // the catalog's; the segments are in memory
  TwiceCompletingFileSystem fs;
  CKV_ASSERT_OK(fs.mem().CreateDirs(dir.path()));
  storage::StoreOptions options;
  options.file_system = &fs;
  auto store = storage::ChunkStore::Open(options, dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const std::vector<int32_t> tokens = synth::Tokens(1, spec.chunk_tokens);
  synth::SyntheticKv kv(spec, tokens);
  EXPECT_DEATH((*store)->Put(spec, tokens, kv.tensors()).IgnoreError(),
               "ckv: check failed: .*chunk_store_put\\.cc:[0-9]+: std::find\\(free_buffers");
}

// The read engine: a device read that lands twice would be verified, called back and released
// twice, its slot's buffer reused under the first read's callback.
TEST(AssertDeathTest, ReadEngineReadLandingTwiceStopsTheIoThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TwiceCompletingFileSystem fs;
  auto file = fs.Open("/data", io::FileSystem::OpenMode::kCreateReadWrite);
  ASSERT_TRUE(file.ok()) << file.status();
  io::AlignedBuffer block(4096);
  CKV_ASSERT_OK((*file)->WriteAt(0, std::span<const std::byte>(block.data(), block.size())));
  prefetch::ReadEngineOptions options;
  options.file_system = &fs;
  options.queue_depth = 2;
  EXPECT_DEATH(
      {
        auto engine = prefetch::ReadEngine::Create(options);
        CKV_CHECK(engine.ok());
        auto id = (*engine)->RegisterFile(file->get());
        CKV_CHECK(id.ok());
        prefetch::ReadRequest request;
        request.file = *id;
        request.length = 4096;
        auto future = (*engine)->SubmitWithFuture(std::move(request));
        CKV_CHECK(future.ok());
        (*future)->Wait(absl::Seconds(30)).IgnoreError();
        absl::SleepFor(absl::Seconds(1));  // the second completion comes just after the first
      },
      "ckv: check failed: .*io_threads\\.cc:[0-9]+: s->in_queue && tp->in_queue > 0");
}
#endif  // CKV_DCHECK_IS_ON

}  // namespace
}  // namespace ckv
