// SPDX-License-Identifier: Apache-2.0
// engine/session.h: the Re-Prefill session behind ckv/session.h, and what it needs of the engine.
//
// A session pins the matched chunks of its prefix (storage::PinnedChunks), loads the summaries
// its selector reads, and per layer selects chunks (kernels/selector.h) and reads their records
// through the engine's read engine into buffers of its own, which LayerViews share. The planner
// part of it decides what to request when and at which priority:
//   - period-exact: a period head reads its whole layer (demand), is scored, and then the other
//     layers of the period are requested for the selection at once (intra-period); the layers of
//     the next period (after its head) are requested speculatively for the same selection;
//   - per-layer selectors (quest, mean-key): the selection of layer l is read on demand and
//     requested speculatively for layer l + 1; with period_selection they are scored at period
//     heads only (from summaries) and planned as period-exact is, the head's records included;
//   - oracle: every layer is read whole and scored.
// When a selection is known, queued requests for records it does not need are cancelled; a
// queued prefetch that becomes needed is resubmitted as a demand read. Prefetched bytes that no
// view used are wasted.
//
// Tiers: before reading a record from NVMe the session looks it up in the tiers (a hit does no
// I/O); a record read from NVMe is offered to them with its chunk's S = I x F when a layer first
// waits for it, on the session's thread (the read engine's thread only reads, verifies and
// copies), and served from where it landed, or from the session's own buffer when no tier took
// it. A prefetched record that no layer waited for is not offered. Finish re-ranks the session's
// chunks with their new scores.
//
// The shared tier: where the engine has one and SelectsRemoteRecords, the chunks that continue the
// prefix in the cluster (their verified heads: RemoteTier::FindHeads) follow the pinned ones.
// Their summaries come from the heads, and each record selected of them is read from the cluster
// (RemoteTier::FetchRecords: verified, then offered to the tiers like one read from NVMe), demand
// reads first; a read ahead that a layer comes to need is promoted in place rather than
// resubmitted, and Finish takes back those still queued (RemoteTier::CancelFetches). A record
// the cluster no longer gives fails the layers that need it (as a failed read does). Finish
// queues a fill of the whole prefix into the local store (RemoteTier::FillLater).
//
// Bubbles: SessionStats::device_idle_seconds is the read engine's idle-with-work time during the
// session (engine-wide: with several sessions at once it is shared, not split).
//
// Not yet: a session needs host bytes of a period head's records to score them, so with a CUDA
// GPU tier (device pointers) those are read from NVMe.
//
// Thread-safety: as ckv/session.h; the read engine's callbacks run on its threads and touch only
// the shared record slots, under the session's mutex.
#ifndef CKV_ENGINE_SESSION_H_
#define CKV_ENGINE_SESSION_H_

#include <functional>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/session.h"
#include "prefetch/read_engine.h"
#include "engine/tier_cache.h"
#include "storage/chunk_store.h"

namespace ckv::engine {

class RemoteTier;

// A clock around each selector run of a session, for the benchmark harness: Begin just before a
// selector scores a layer, End just after, with the FLOPs of that scoring
// (kernels::ScoringFlops). While one is set, a session admits nothing to the tiers as its layers
// are served: a GPU system's tier copies are DMA on copy engines, off the request's path. It
// holds the records it would admit (their bytes stay in HBM for the whole prefill anyway) and
// offers them in Finish, once no read of it is in flight, inside one bracket (End(0)), so
// that the bracket never lets a read land off the clock; a session dropped without
// Finish admits nothing. Called on the session's calling thread.
class SelectorClock {
 public:
  virtual ~SelectorClock() = default;
  virtual void Begin() = 0;
  virtual void End(double flops) = 0;
};

// Where an exact selector's scoring reads take a chunk's keys from instead of the K half of its
// record, for the benchmark harness (bench/reprefill): a key file of its own, as the systems that
// keep keys apart from values read theirs (h2o's and IMPRESS's). Called under a session's lock,
// from any session's thread: it must be thread-safe and must not call back into the session.
class ScoringKeys {
 public:
  virtual ~ScoringKeys() = default;
  // The read, on the host's read engine, of the keys of chunk `chunk` at `layer` into `dest`
  // (spec.RecordBytes() / 2 bytes, laid out as a record's K half; never asked for a spec with a
  // codec, whose sessions read the records' encoded K parts), with their checksum
  // verified; NotFound when it holds no keys for the chunk (the record's K half is read then).
  virtual absl::StatusOr<prefetch::ReadRequest> KeysRead(const ChunkKey& chunk, uint32_t layer,
                                                         prefetch::Priority priority,
                                                         std::span<std::byte> dest) = 0;
};

// What the engine lends its sessions, and the benchmark harness (HostOf, engine/internal.h): the
// store, the read engine, the tiers and the seams. A session does not keep it: BeginSession takes
// the parts it names (SessionParts), so that a session never calls back into the engine.
class SessionHost {
 public:
  virtual ~SessionHost() = default;
  virtual storage::ChunkStore& store() = 0;
  // The engine's read engine, created on first use.
  virtual absl::StatusOr<prefetch::ReadEngine*> reads() = 0;
  // The GPU and CPU tiers, or null when both budgets are 0.
  virtual TierCache* tiers() = 0;
  // Adds a finished session's figures to the engine's.
  virtual void RecordSession(const SessionStats& stats) = 0;
  // The clock set by SetSelectorClock (engine/internal.h), or null.
  virtual SelectorClock* selector_clock() { return nullptr; }
  // The key source set by SetScoringKeys (engine/internal.h), or null.
  virtual ScoringKeys* scoring_keys() { return nullptr; }
  // The shared tier on a Redis Cluster (EngineOptions::remote), or null.
  virtual RemoteTier* remote_tier() { return nullptr; }
};

// What a session works with, given at BeginSession. The engine keeps each alive longer than any
// session it begins.
struct SessionParts {
  storage::ChunkStore* store = nullptr;     // required
  prefetch::ReadEngine* reads = nullptr;    // required
  TierCache* tiers = nullptr;               // the GPU and CPU tiers, or null
  RemoteTier* remote = nullptr;             // the shared tier on a Redis Cluster, or null
  SelectorClock* selector_clock = nullptr;  // SetSelectorClock's (engine/internal.h), or null
  ScoringKeys* scoring_keys = nullptr;      // SetScoringKeys's (engine/internal.h), or null
  // Adds a finished session's figures to the engine's; may be empty.
  std::function<void(const SessionStats&)> record_session;
};

// The parts `host` lends now (its read engine made, on first use).
absl::StatusOr<SessionParts> PartsOf(SessionHost& host);

// Whether a session with `options`, on a local miss, reads the chunks that continue its prefix
// in the shared tier record by record, only those it selects (a selector that reads summaries,
// below budget 1), rather than having the engine fill the whole prefix into the local store
// before it begins (RemoteTier::Fill).
bool SelectsRemoteRecords(const ReprefillOptions& options);

// The most chunks past the local ones a session takes from the shared tier (their heads stay in
// memory for the session: qwen2.5-7b's are 44 KB each).
inline constexpr uint64_t kMaxRemoteSessionChunks = 8192;

// The read of record `record` (a layer, or an auxiliary record) of pinned chunk `chunk` into
// `dest`: the pinned location's ready read (PinnedChunks::ReadOf: offset, length padded to the
// file's alignment, checksum) as a request of `reads`, named after the record.
// `bytes` > 0 reads only the record's first `bytes` bytes (PartOf), unverified. Sessions and the
// benchmark's baselines build their record reads with it, so both read alike.
absl::StatusOr<prefetch::ReadRequest> RecordRead(prefetch::ReadEngine& reads,
                                                 const storage::PinnedChunks& pinned, size_t chunk,
                                                 uint32_t record, prefetch::Priority priority,
                                                 std::span<std::byte> dest, uint32_t bytes = 0);

absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginSession(const SessionParts& parts,
                                                               const ModelSpec& spec,
                                                               std::span<const int32_t> tokens,
                                                               const ReprefillOptions& options);

}  // namespace ckv::engine

#endif  // CKV_ENGINE_SESSION_H_
