// SPDX-License-Identifier: Apache-2.0
// kernels/cpu_path.h: which CPU implementation the kernels use.
//
// Every kernel has a scalar implementation and, where the CPU has AVX2, FMA and F16C, a vectorised
// one chosen at run time. Tests force each path to compare them.
//
// The vectorised code is x86 only: it is compiled where CKV_X86 is 1 (x86-64 and i386), and
// every x86 include, intrinsic, target attribute and CPU check in kernels/ sits behind it.
// Elsewhere (aarch64) only the scalar path is built and UseAvx2() is false.
//
// Thread-safety: SetCpuPath is for tests and benchmarks, called before kernels run.
#ifndef CKV_KERNELS_CPU_PATH_H_
#define CKV_KERNELS_CPU_PATH_H_

#if defined(__x86_64__) || defined(__i386__)
#define CKV_X86 1
#else
#define CKV_X86 0
#endif

namespace ckv::kernels {

enum class CpuPath { kAuto, kScalar, kAvx2 };

// kAuto: AVX2 when the CPU has it. Forcing kAvx2 on a CPU without it (or on a non-x86 build)
// falls back to scalar.
void SetCpuPath(CpuPath path);
// True when the vectorised path is in use; always false when CKV_X86 is 0.
bool UseAvx2();

}  // namespace ckv::kernels

#endif  // CKV_KERNELS_CPU_PATH_H_
