// SPDX-License-Identifier: Apache-2.0
// kernels/cpu_path.h: which CPU implementation the kernels use.
//
// Every kernel has a scalar implementation and, where the CPU has AVX2, FMA and F16C, a vectorised
// one chosen at run time. Tests force each path to compare them.
//
// Thread-safety: SetCpuPath is for tests and benchmarks, called before kernels run.
#ifndef CKV_KERNELS_CPU_PATH_H_
#define CKV_KERNELS_CPU_PATH_H_

namespace ckv::kernels {

enum class CpuPath { kAuto, kScalar, kAvx2 };

// kAuto: AVX2 when the CPU has it. Forcing kAvx2 on a CPU without it falls back to scalar.
void SetCpuPath(CpuPath path);
// True when the vectorised path is in use.
bool UseAvx2();

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_CPU_PATH_H_
