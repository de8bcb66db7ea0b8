// Tests of common/assert.h: a broken invariant stops the process with its file, line and
// condition; CKV_DCHECK is on exactly where the build says so, and never evaluates its condition
// when compiled out.
#include "common/assert.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ckv
