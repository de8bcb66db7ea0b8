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

#include <span>

#include "absl/time/time.h"
#include "ckv/engine.h"
#include "common/clock.h"
#include "engine/remote_tier.h"
#include "engine/session.h"
#include "engine/tier_cache.h"
#include "io/file_system.h"
#include "prefetch/read_engine.h"
#include "storage/chunk_store.h"

namespace ckv::engine {

// The SessionHost behind an Engine that Engine::Open made: its store, read engine and tiers.
SessionHost& HostOf(Engine& engine);

// Sets (null: removes) the clock the sessions of `engine` call around selector runs. Not owned;
// must outlive the sessions that start while it is set.
void SetSelectorClock(Engine& engine, SelectorClock* clock);

// Sets (null: removes) where the sessions of `engine` read their scoring keys from (ScoringKeys,
// engine/session.h). Not owned; must outlive the sessions that start while it is set.
void SetScoringKeys(Engine& engine, ScoringKeys* keys);

// What Engine::Open takes that the public API does not name, as it names no storage type: for
// tests. nullptr: the real one. Not owned; each must outlive the engine.
struct Seams {
  // The time the engine reads: its store's timestamps, its sessions' await_blocked_seconds and
  // its read engine's stats (tests step a FakeClock).
  Clock* clock = nullptr;
  // The file system the store's and the read engine's data path goes through: an in-memory or
  // fault-injecting one (io/fault_file_system.h), over io_uring or threads alike.
  io::FileSystem* file_system = nullptr;
};

// Engine::Open and Engine::OpenReadOnly, through `seams` (a read-only engine uses only the file
// system).
absl::StatusOr<std::unique_ptr<Engine>> OpenWithSeams(const EngineOptions& options,
                                                      const std::string& path, const Seams& seams);
absl::StatusOr<std::unique_ptr<Engine>> OpenReadOnlyWithSeams(const EngineOptions& options,
                                                              const std::string& path,
                                                              const Seams& seams);

// storage::ChunkStore::FreeSpaceToOpen for the store an Engine::Open with `options` would open at
// `path`, through `seams`' file system: what kvctl rm and gc do when the file system is too full
// for the store to open (IsNoSpace), before they open it again.
absl::StatusOr<uint64_t> FreeSpaceToOpen(const EngineOptions& options, const std::string& path,
                                         std::span<const ChunkKey> delete_prefixes,
                                         const Seams& seams = {});

// Waits until the remote tier of `engine` (EngineOptions::remote) has published every chunk
// queued so far, or failed to, up to `timeout`: for tests and kvctl, which exit right after a
// Put. True at once for an engine without one; false on timeout.
bool WaitUntilRemotePublished(Engine& engine, absl::Duration timeout);

// Compares the cluster's copy of every chunk `engine` stores with its local records (kvctl
// verify --remote; see RemoteTier::Check). FailedPrecondition when the engine has no remote
// tier.
absl::StatusOr<RemoteCheckReport> VerifyRemote(Engine& engine);

}  // namespace ckv::engine

#endif  // CKV_ENGINE_INTERNAL_H_
