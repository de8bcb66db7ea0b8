// SPDX-License-Identifier: Apache-2.0
// ckv/record_layout.h: how the records of a chunk are placed in a segment file (docs/format.md).
//
// Thread-safety: a plain enum.
#ifndef CKV_RECORD_LAYOUT_H_
#define CKV_RECORD_LAYOUT_H_

#include <cstdint>

namespace ckv {

// How the records of a chunk are placed in a segment. Persisted per segment: do not renumber.
enum class RecordLayout : uint8_t {
  // Each layer is a band: the records of one layer for consecutive chunks are adjacent, so a layer
  // of a run of chunks is one read.
  kLayerMajor = 1,
  // Each period of p layers is a band: one chunk's p records of a period are adjacent, so a chunk
  // of a period is one read.
  kPeriodMajor = 2,
};

}  // namespace ckv

#endif  // CKV_RECORD_LAYOUT_H_
