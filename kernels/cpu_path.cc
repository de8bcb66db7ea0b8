// SPDX-License-Identifier: Apache-2.0
#include "kernels/cpu_path.h"

#include <atomic>

namespace ckv::kernels {
namespace {

bool CpuHasAvx2() {
#if CKV_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

std::atomic<CpuPath> g_path{CpuPath::kAuto};

}  // namespace

void SetCpuPath(CpuPath path) { g_path.store(path, std::memory_order_relaxed); }

bool UseAvx2() { return g_path.load(std::memory_order_relaxed) != CpuPath::kScalar && CpuHasAvx2(); }

}  // namespace ckv::kernels
