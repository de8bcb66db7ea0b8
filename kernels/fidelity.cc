// SPDX-License-Identifier: Apache-2.0
#include "kernels/fidelity.h"

#include <cmath>

namespace ckv::kernels {

double AttentionRecall(std::span<const float> chunk_mass, std::span<const uint32_t> selected) {
  double held = 0, total = 0;
  for (float m : chunk_mass) total += m;
  for (uint32_t j : selected) {
    if (j < chunk_mass.size()) held += chunk_mass[j];
  }
  return total > 0 ? held / total : 0.0;
}

double RelativeL2Error(std::span<const float> out, std::span<const float> reference) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double o = i < out.size() ? out[i] : 0.0;
    diff += (o - reference[i]) * (o - reference[i]);
    ref += double{reference[i]} * reference[i];
  }
  if (ref == 0) return diff == 0 ? 0.0 : INFINITY;
  return std::sqrt(diff / ref);
}

double Jaccard(std::span<const uint32_t> a, std::span<const uint32_t> b) {
  size_t i = 0, j = 0, both = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      ++both;
      ++i;
      ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  const size_t either = a.size() + b.size() - both;
  return either == 0 ? 1.0 : static_cast<double>(both) / static_cast<double>(either);
}

}  // namespace ckv::kernels
