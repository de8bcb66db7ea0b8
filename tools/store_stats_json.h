// SPDX-License-Identifier: Apache-2.0
// tools/store_stats_json.h: the store's figures (ckv::StoreStats) as JSON members, one per entry
// of CKV_STORE_STATS_FIELDS (ckv/stats.h), keyed by the field's name, in the list's order.
// kvctl's stats objects and put_bench's store_stats are written by it, so they name the figures
// alike and gain a new one without a change here.
//
// Header-only, like tools/json_writer.h. Thread-safety: none (one writer per thread).
#ifndef CKV_TOOLS_STORE_STATS_JSON_H_
#define CKV_TOOLS_STORE_STATS_JSON_H_

#include <cstdint>

#include "ckv/stats.h"
#include "tools/json_writer.h"

namespace ckv::tools {

inline void StoreStatJson(JsonWriter& w, uint64_t value) { w.Uint(value); }
inline void StoreStatJson(JsonWriter& w, bool value) { w.Bool(value); }

// Writes a Key and value per field of `s` into the object `w` is in.
inline void WriteStoreStatsMembers(JsonWriter& w, const StoreStats& s) {
#define CKV_STORE_STAT_JSON_(type, name, kind, scope, metric, help) \
  w.Key(#name);                                                     \
  StoreStatJson(w, s.name);
  CKV_STORE_STATS_FIELDS(CKV_STORE_STAT_JSON_)
#undef CKV_STORE_STAT_JSON_
}

}  // namespace ckv::tools

#endif  // CKV_TOOLS_STORE_STATS_JSON_H_
