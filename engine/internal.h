// SPDX-License-Identifier: Apache-2.0
// engine/internal.h: the engine's internals that the benchmark harness (bench/reprefill) and the
// tests reach. Not part of the public API: what it offers may change with the engine.
//
// The harness's baselines read the store through the engine's own read engine and tiers, so that
// every system it compares reads alike; the tests observe and reset the store behind an Engine.
// Outside engine/, this is the one engine header that tools/ and bench/ may include.
//
// Thread-safety: as the headers it includes.
#ifndef CKV_ENGINE_INTERNAL_H_
#define CKV_ENGINE_INTERNAL_H_

#include "ckv/engine.h"
#include "engine/session.h"
#include "engine/tier_cache.h"
#include "prefetch/read_engine.h"
#include "storage/chunk_store.h"
#include "storage/clock.h"
#include "storage/file_system.h"

namespace ckv::engine {

// The SessionHost behind an Engine that Engine::Open made: its store, read engine and tiers.
SessionHost& HostOf(Engine& engine);

// Sets (null: removes) the clock the sessions of `engine` call around selector runs. Not owned;
// must outlive the sessions that start while it is set.
void SetSelectorClock(Engine& engine, SelectorClock* clock);

// Engine::Open, with `clock` (storage/clock.h; nullptr: the real one) as the time the engine
// reads: its store's timestamps, its sessions' await_blocked_seconds and its read engine's stats.
// For tests that step a FakeClock; EngineOptions has no clock, as the public API names no
// storage type. Not owned; must outlive the engine.
absl::StatusOr<std::unique_ptr<Engine>> OpenWithClock(const EngineOptions& options,
                                                      const std::string& path,
                                                      storage::Clock* clock);

}  // namespace ckv::engine

#endif  // CKV_ENGINE_INTERNAL_H_
