// SPDX-License-Identifier: Apache-2.0
// prefetch/planner.h: the prefetch planner: once the chunks of a layer are selected, which other
// layers to request for the same chunks, and at which priority (cross-layer similarity of the
// important chunks, docs/tiers.md).
//
//   - per-layer scoring: the selection of layer l is requested speculatively for layer l + 1;
//   - period scoring (one selection per period of p layers, made at its head): the other layers
//     of the period are requested at once (intra-period), the layers of the next period after its
//     head speculatively; with exact scoring, which reads a head's keys, the next head's keys
//     (every chunk) are read ahead speculatively, since keys do not depend on the queries.
//
// The planner knows layers, periods and priorities only: the caller (a Re-Prefill session) owns
// the selection, the tiers and what to cancel.
//
// Thread-safety: a pure function.
#ifndef CKV_PREFETCH_PLANNER_H_
#define CKV_PREFETCH_PLANNER_H_

#include <cstdint>
#include <vector>

#include "prefetch/read_engine.h"

namespace ckv::prefetch {

struct PlanOptions {
  uint32_t layers = 0;         // of the model
  uint32_t period_layers = 1;  // p; 0 counts as 1
  bool per_layer = false;      // every layer is scored on its own
  // Period scoring reads each head's keys: read the next head's ahead.
  bool read_keys_ahead = false;
};

// One read the plan asks for: the selection's chunks of `layer`, or, with keys_only, the keys of
// every chunk of `layer`.
struct PlannedRead {
  uint32_t layer = 0;
  Priority priority = Priority::kSpeculative;
  bool keys_only = false;
};

// The reads to issue, in order, after the selection of `layer` (a period head unless per_layer)
// was requested on demand. REQUIRES: layer < options.layers.
std::vector<PlannedRead> PlanAfterSelection(uint32_t layer, const PlanOptions& options);

}  // namespace ckv::prefetch

#endif  // CKV_PREFETCH_PLANNER_H_
