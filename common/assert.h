// SPDX-License-Identifier: Apache-2.0
// common/assert.h: invariant checks (the discipline of TigerBeetle's assert and LevelDB's
// assert): a condition that holds by construction is asserted where it holds, so that a broken
// invariant stops the process at the line that knows, instead of serving wrong bytes later.
//
//   CKV_CHECK(cond)   always on. For cold paths (open, recovery, format decoding, a refusal that
//                     is about to be returned) where a broken invariant must stop the process.
//   CKV_DCHECK(cond)  on in debug builds (NDEBUG not defined) and wherever CKV_ENABLE_DCHECK is
//                     defined (the sanitizer builds of tools/ckv.sh define it); compiled out of
//                     Release, so it may sit in hot paths. Compiled out, `cond` is still parsed
//                     and type-checked, but never evaluated: it must have no side effects.
//
// A failed check prints "ckv: check failed: FILE:LINE: COND" to stderr and aborts (no
// unwinding, no destructors: the state is already wrong). Errors the caller can cause or the
// disk can produce are absl::Status values, never checks.
//
// Header-only and free of any other ckv header, so that every folder (kernels/ and storage/
// included) may use it. C++17, for the CUDA sources of kernels/.
#ifndef CKV_COMMON_ASSERT_H_
#define CKV_COMMON_ASSERT_H_

#include <cstdio>
#include <cstdlib>

#if !defined(NDEBUG) || defined(CKV_ENABLE_DCHECK)
#define CKV_DCHECK_IS_ON 1
#else
#define CKV_DCHECK_IS_ON 0
#endif

namespace ckv::internal {

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "ckv: check failed: %s:%d: %s\n", file, line, condition);
  std::fflush(stderr);
  std::abort();
}

}  // namespace ckv::internal

#define CKV_CHECK(cond)                                        \
  do {                                                         \
    if (__builtin_expect(!(cond), 0)) {                        \
      ::ckv::internal::CheckFailed(__FILE__, __LINE__, #cond); \
    }                                                          \
  } while (false)

#if CKV_DCHECK_IS_ON
#define CKV_DCHECK(cond) CKV_CHECK(cond)
#else
#define CKV_DCHECK(cond)       \
  do {                         \
    if (false) {               \
      static_cast<void>(cond); \
    }                          \
  } while (false)
#endif

#endif  // CKV_COMMON_ASSERT_H_
