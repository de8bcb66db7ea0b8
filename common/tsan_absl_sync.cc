// SPDX-License-Identifier: Apache-2.0
// common/tsan_absl_sync.cc: makes absl::Mutex visible to ThreadSanitizer. TSan builds only.
//
// Debian's Abseil is a shared library built without -fsanitize=thread, so TSan never sees the
// lock hand-offs inside absl::Mutex and reports every pair of accesses it orders as a race. Under
// TSan this file defines the Mutex and CondVar entry points ckv's code calls: each forwards to the
// library's own (found with dlsym(RTLD_NEXT)) and tells TSan what it did: an acquire after taking
// the mutex, a release before letting it go (Await and CondVar waits do both), and both around
// each evaluation of a Condition, which Abseil makes inside the library. Definitions in the
// executable take precedence over the shared library's for every call made from ckv's code.
// Shared (reader) locks are annotated like exclusive ones: that can hide a race between two
// readers, never invent one.
#if defined(__SANITIZE_THREAD__)

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"

namespace {

#define CKV_STR2(x) #x
#define CKV_STR(x) CKV_STR2(x)

// The mangled name of absl::<rest>, with the inline namespace this Abseil was built with.
std::string AbslSymbol(const char* rest) {
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const char* ns = CKV_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string("_ZN4absl") + std::to_string(std::strlen(ns)) + ns + rest;
#else
  return std::string("_ZN4absl") + rest;
#endif
}

template <typename Fn>
Fn Real(const char* rest) {
  void* f = dlsym(RTLD_NEXT, AbslSymbol(rest).c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "ckv tsan: %s not found in Abseil\n", AbslSymbol(rest).c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// A Condition whose evaluation TSan sees as done under the mutex. Abseil evaluates a waiter's
// condition inside the library, with the mutex held but after the annotated release of Await (or
// before the annotated acquire of LockWhen), and may do so on another thread, the one releasing
// the mutex: unannotated, every read the condition makes looks unordered with the writes made
// under the mutex by other threads. Each evaluation is bracketed by an acquire and a release.
struct AnnotatedCondition {
  const absl::Condition* cond;
  absl::Mutex* mu;

  static bool Eval(AnnotatedCondition* self) {
    __tsan_acquire(self->mu);
    const bool met = self->cond->Eval();
    __tsan_release(self->mu);
    return met;
  }
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated{&cond, this};
  real(this, Condition(&AnnotatedCondition::Eval, &annotated));
  __tsan_acquire(this);
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  AnnotatedCondition annotated{&cond, this};
  real(this, Condition(&AnnotatedCondition::Eval, &annotated));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  AnnotatedCondition annotated{&cond, this};
  const bool met = real(this, Condition(&AnnotatedCondition::Eval, &annotated), timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  AnnotatedCondition annotated{&cond, this};
  const bool met = real(this, Condition(&AnnotatedCondition::Eval, &annotated), deadline);
  __tsan_acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // __SANITIZE_THREAD__
