// SPDX-License-Identifier: Apache-2.0
#include "kernels/cpu_path.h"

#include <atomic>

#if CKV_X86
#include <cpuid.h>
#endif

namespace ckv::kernels {
namespace {

#if CKV_X86
// F16C from CPUID leaf 1 (ECX bit 29), as g++'s __builtin_cpu_supports("f16c") reads it: clang
// 14 (Debian 12's; tools/thread_safety.sh parses this file with it) does not know that feature
// name and rejects the call. Its YMM state needs no check of its own: AVX2, checked beside it,
// needs the same.
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

bool CpuHasAvx2() {
#if CKV_X86
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
  return has;
#else
  return false;
#endif
}

std::atomic<CpuPath> g_path{CpuPath::kAuto};

}  // namespace

void SetCpuPath(CpuPath path) { g_path.store(path, std::memory_order_relaxed); }

bool UseAvx2() {
  return g_path.load(std::memory_order_relaxed) != CpuPath::kScalar && CpuHasAvx2();
}

}  // namespace ckv::kernels
