// SPDX-License-Identifier: Apache-2.0
#include "prefetch/planner.h"

#include <algorithm>

namespace ckv::prefetch {

std::vector<PlannedRead> PlanAfterSelection(uint32_t layer, const PlanOptions& options) {
  std::vector<PlannedRead> plan;
  const uint32_t layers = options.layers;
  if (options.per_layer) {
    if (layer + 1 < layers) plan.push_back({layer + 1, Priority::kSpeculative, false});
    return plan;
  }
  const uint32_t p = std::max<uint32_t>(1, options.period_layers);
  // The rest of the period at once; the next period (after its head) on speculation.
  for (uint32_t l = layer + 1; l < std::min(layers, layer + p); ++l) {
    plan.push_back({l, Priority::kIntraPeriod, false});
  }
  for (uint32_t l = layer + p + 1; l < std::min(layers, layer + 2 * p); ++l) {
    plan.push_back({l, Priority::kSpeculative, false});
  }
  if (options.read_keys_ahead && layer + p < layers) {
    plan.push_back({layer + p, Priority::kSpeculative, true});
  }
  return plan;
}

}  // namespace ckv::prefetch
