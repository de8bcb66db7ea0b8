// Tests of common/assert.h: a broken invariant stops the process with its file, line and
// condition; CKV_DCHECK is on exactly where the build says so, and never evaluates its condition
// when compiled out.
#include "common/assert.h"

#include <gtest/gtest.h>

#include "storage/mem_file_system.h"
#include "storage/segment.h"

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
  storage::MemFileSystem fs;
  auto file = fs.Open("/seg", storage::FileSystem::OpenMode::kCreateReadWrite);
  ASSERT_TRUE(file.ok()) << file.status();
  const ModelSpec spec = *ModelSpec::Preset("qwen2.5-0.5b");
  const storage::SegmentRecord geometry = storage::Segment::GeometryFor(
      spec, RecordLayout::kLayerMajor, 1, 64 << 20, 0, {});
  storage::Segment segment(1, geometry, std::move(*file));
  const storage::SlotRun run = segment.Allocate(2);
  ASSERT_EQ(run.count, 2u);
  segment.Free(run);
  EXPECT_DEATH(segment.Free(run),
               "ckv: check failed: .*segment\\.cc:[0-9]+: run\\.count <= used_slots_");
}

}  // namespace
}  // namespace ckv
