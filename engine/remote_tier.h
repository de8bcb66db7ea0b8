// SPDX-License-Identifier: Apache-2.0
// engine/remote_tier.h: the shared tier below NVMe, on a Redis Cluster (docs/remote.md).
//
// Publishing: Publish() queues the chunks of a Put that committed locally, without blocking
// (a full queue drops them, counted). One background thread takes them in batches, reads each
// chunk's records back from the local store (a chunk evicted meanwhile is skipped), encodes
// each as one value (remote/chunk_value.h) and SETs the batch in one pipelined call, in
// parallel across masters. The Put never waits for any of it: its durability is the local
// store's.
//
// Filling: Fill() is called on a local miss by Lookup, and by a Re-Prefill session that reads
// every chunk anyway (budget 1, or a selector that scores records: period-exact, oracle): with
// the chain's keys past the chunks stored locally, it asks the cluster (EXISTS, pipelined) how
// far the chain continues there, fetches those values (GET, pipelined, 32 chunks per call),
// verifies each (DecodeChunkValue: a bad checksum or a foreign model or key is DataLoss,
// counted, logged, and ends the chain there: it is never served) and writes the verified chunks
// into the local store with one Put, so that the caller, and every later request, finds them
// locally. A cluster that is unreachable, slow or has evicted the chunks is a miss: Fill returns
// what is stored locally, or what it fetched before the call that failed. No fetch starts past
// one call deadline since the fill began, so a fill waits on the cluster at most about two call
// deadlines.
//
// Selecting: a session whose selector reads summaries (quest, mean-key) below budget 1 fetches
// only what it selects. FindHeads reads the heads of the chunks that continue its chain (GETRANGE
// of each value's header and summaries, pipelined), verified, ending the chain at the first one
// missing, unreadable or corrupt; the session selects from their summaries and FetchRecords reads
// the records it selected (GETRANGE of each, pipelined on the fetch thread), each verified
// against its head's checksum before its callback sees it as landed. After the session, FillLater
// queues a Fill of the whole chain on the publishing thread, so that the next request is local.
//
// Log lines about the cluster are rate-limited: at most one per 10 s, with a count of the
// lines left out.
//
// Thread-safety: all methods are thread-safe.
#ifndef CKV_ENGINE_REMOTE_TIER_H_
#define CKV_ENGINE_REMOTE_TIER_H_

#include <cstdint>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckv/chunk_key.h"
#include "ckv/log.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "remote/chunk_value.h"
#include "remote/cluster_client.h"
#include "storage/chunk_store.h"

namespace ckv::engine {

// Counters since the engine opened.
struct RemoteTierStats {
  uint64_t publish_queued = 0;  // chunks queued for publishing
  // Chunks turned away by a full queue, or dropped behind a call that failed whole.
  uint64_t publish_dropped = 0;
  uint64_t published_chunks = 0;      // chunks SET in the cluster
  uint64_t published_bytes = 0;       // their value bytes
  uint64_t publish_failures = 0;      // chunks whose SET failed (cluster unreachable, OOM, ...)
  uint64_t publish_skipped = 0;       // chunks gone from the local store before they were read
  uint64_t fills = 0;                 // local misses that asked the cluster
  uint64_t fill_misses = 0;           // of which found nothing to fetch
  uint64_t fetched_chunks = 0;        // chunks fetched, verified and written into the local store
  uint64_t fetched_bytes = 0;         // their value bytes
  uint64_t head_reads = 0;            // local misses of selecting sessions that asked (FindHeads)
  uint64_t head_misses = 0;           // of which found no chunk there
  uint64_t head_chunks = 0;           // chunk heads sessions read (FindHeads), verified
  uint64_t session_records = 0;       // records sessions read (FetchRecords), verified
  uint64_t session_record_bytes = 0;  // their bytes
  uint64_t fills_queued = 0;          // FillLater calls queued
  uint64_t fills_dropped = 0;         // FillLater calls a full fill queue turned away
  uint64_t corrupt_chunks = 0;        // values, heads or records that failed verification
                                      // (DataLoss), never served
  uint64_t errors = 0;                // calls that failed: unreachable, timed out, redirected away
  uint64_t timeouts = 0;              // of which timed out
  uint64_t budget_bytes = 0;          // RemoteTierOptions::budget_bytes (not enforced)
  uint64_t queue_depth = 0;           // chunks waiting to be published now
  remote::ClusterClientStats client;
};

// The heads of the chunks that continue a chain in the cluster (FindHeads).
struct RemoteHeads {
  std::vector<ChunkKey> keys;                   // in chain order, past the local chunks
  std::vector<std::string> bytes;               // each head's bytes
  std::vector<remote::DecodedChunkHead> heads;  // verified, views into `bytes`
  size_t size() const { return keys.size(); }
};

// A record a session wants from the cluster: layer `layer` of chunk `keys[i]` of FindHeads'
// result, read into `dest` (spec.RecordBytes()), verified against `head`. `done` runs on the
// fetch thread with OK once `dest` holds the verified record, or with the error, naming the
// record: Unavailable for a record gone from the cluster (evicted since its head was read) or a
// call that failed, DeadlineExceeded for one that timed out, DataLoss for one that fails
// verification, Cancelled for one taken back (CancelFetches, or the tier closing).
struct RemoteRecordFetch {
  ChunkKey key;
  uint32_t layer = 0;
  const remote::DecodedChunkHead* head = nullptr;  // must outlive `done`'s call
  std::span<std::byte> dest;
  std::function<void(const absl::Status&)> done;
  // A record a layer waits for now: read before every queued read ahead (prefetch, speculation).
  bool demand = true;
  // A read ahead that a layer now waits for: set (by the session) to have it read first.
  std::shared_ptr<std::atomic<bool>> promoted;
  // Whose read it is (CancelFetches takes back an owner's queued reads).
  const void* owner = nullptr;
};

// What Check found for some chunks.
struct RemoteCheckReport {
  uint64_t chunks_checked = 0;
  uint64_t present = 0;               // found in the cluster, verified, equal to the local records
  uint64_t missing = 0;               // not in the cluster (never published, or evicted)
  uint64_t corrupt = 0;               // failed verification (DataLoss)
  uint64_t differing = 0;             // verified, but not equal to the local records
  uint64_t unreachable = 0;           // not checked: the cluster did not answer in time
  std::vector<std::string> problems;  // one line per corrupt or differing chunk (at most 100)
};

// One master of the cluster, as INFO reports it.
struct RemoteNodeReport {
  std::string endpoint;  // host:port
  uint32_t slots = 0;
  uint64_t keys = 0;               // DBSIZE
  uint64_t used_memory_bytes = 0;  // INFO memory used_memory
  uint64_t maxmemory_bytes = 0;    // 0 = none
  std::string maxmemory_policy;
  uint64_t evicted_keys = 0;  // INFO stats
  uint64_t keyspace_hits = 0;
  uint64_t keyspace_misses = 0;
  std::string error;  // non-empty when the node did not answer
};

// The masters of the cluster `options` names (kvctl remote-stats). Errors: InvalidArgument for
// bad options; Unavailable or DeadlineExceeded when no node gives the slot map.
absl::StatusOr<std::vector<RemoteNodeReport>> DescribeCluster(const RemoteTierOptions& options);

class RemoteTier {
 public:
  // Checks `options` (InvalidArgument naming the field) and starts the publishing thread.
  // Connects to nothing yet. `store` and `logger` must outlive the tier.
  // The cluster client options of `options`; InvalidArgument naming the bad field.
  static absl::StatusOr<remote::ClusterOptions> ClientOptions(const RemoteTierOptions& options);

  static absl::StatusOr<std::unique_ptr<RemoteTier>> Create(const RemoteTierOptions& options,
                                                            storage::ChunkStore* store,
                                                            Logger* logger);
  // Stops the publishing and fetch threads (after the batch in flight); chunks and fills still
  // queued are dropped, record fetches still queued fail with Cancelled.
  ~RemoteTier();

  // Queues `keys` (chunks stored under `spec`) for publishing; those already published by
  // this tier, or queued, are left out. Never blocks on the cluster.
  void Publish(const ModelSpec& spec, std::span<const ChunkKey> keys);

  // On a local miss: `local_chunks` of the whole chunks of `tokens` are stored locally; fetches
  // from the cluster the chunks that continue the chain, verifies them, writes them into the
  // local store, and returns how many leading chunks are stored locally now (>= local_chunks).
  // Never fails: anything the cluster could not give is a miss (counted, logged).
  uint64_t Fill(const ModelSpec& spec, std::span<const int32_t> tokens, uint64_t local_chunks);

  // How many chunks continue the chain of `tokens` past `local_chunks` in the cluster (existence
  // only: nothing is fetched or verified). Never fails: an error ends the count there (logged).
  uint64_t ChainLength(const ModelSpec& spec, std::span<const int32_t> tokens,
                       uint64_t local_chunks);

  // For a session on a local miss: the verified heads of the chunks that continue the chain of
  // `tokens` past `local_chunks` in the cluster, at most `max_chunks` of them. Never fails: what
  // the cluster cannot give ends the chain there (counted, logged; empty when nothing is found).
  RemoteHeads FindHeads(const ModelSpec& spec, std::span<const int32_t> tokens,
                        uint64_t local_chunks, uint64_t max_chunks);

  // Queues `fetches` for the fetch thread, which reads them in pipelined calls of up to 64
  // records across the masters: first the reads ahead that were promoted, then demand reads,
  // then the other reads ahead, each kind in the order queued. Each `done` is called exactly
  // once: on the fetch thread, or with Cancelled on the thread that takes the read back
  // (CancelFetches, ~RemoteTier; a read queued after the tier began to close is cancelled at
  // once). Records of `spec` only.
  void FetchRecords(const ModelSpec& spec, std::vector<RemoteRecordFetch> fetches);

  // Takes back the reads of `owner` still queued, calling their `done` with Cancelled on this
  // thread; those in a call already are not waited for here.
  void CancelFetches(const void* owner);

  // Queues a Fill of `tokens` (its whole chunks) for the publishing thread: after a session that
  // read some chunks from the cluster, so that the next request finds the prefix locally. At
  // most 4 wait; more are dropped, counted.
  void FillLater(const ModelSpec& spec, std::span<const int32_t> tokens);

  // Compares the cluster's value of each of `keys` (stored locally under `spec`) with the
  // local records (kvctl verify --remote). Reads in batches of 64.
  RemoteCheckReport Check(const ModelSpec& spec, std::span<const ChunkKey> keys);

  // Waits until nothing is queued or being published or filled (FillLater), up to `timeout`;
  // false on timeout.
  bool WaitUntilPublished(absl::Duration timeout);

  RemoteTierStats stats() const;

 private:
  struct Job {
    std::shared_ptr<const ModelSpec> spec;
    ChunkKey key;
  };
  RemoteTier(const RemoteTierOptions& options, std::unique_ptr<remote::ClusterClient> client,
             storage::ChunkStore* store, Logger* logger);
  struct FillJob {
    std::shared_ptr<const ModelSpec> spec;
    std::vector<int32_t> tokens;
  };
  struct FetchJob {
    std::shared_ptr<const ModelSpec> spec;
    RemoteRecordFetch fetch;
  };
  void PublishLoop();
  void FetchLoop();
  void FetchBatch(std::vector<FetchJob>& batch);
  void PublishBatch(std::vector<Job>& batch);
  // Counts a failed call and logs it, rate-limited.
  void NoteError(const absl::Status& status, std::string_view what);
  // The cluster keys of `keys[from...]` under `fingerprint`.
  std::vector<std::string> ClusterKeys(const ChunkKey& fingerprint, std::span<const ChunkKey> keys,
                                       uint64_t from) const;
  // How many of `cluster_keys`, from the first, exist in the cluster (one MultiExists).
  size_t ExistingPrefix(const std::vector<std::string>& cluster_keys);
  void LogRateLimited(LogLevel level, const std::string& message);

  const RemoteTierOptions options_;
  const std::unique_ptr<remote::ClusterClient> client_;
  storage::ChunkStore* const store_;
  Logger* const logger_;

  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Chunks published or queued: not queued again. Forgotten when it passes a million entries.
  absl::flat_hash_set<ChunkKey> known_ ABSL_GUARDED_BY(mu_);
  std::deque<FillJob> fills_ ABSL_GUARDED_BY(mu_);
  std::deque<FetchJob> demand_fetches_ ABSL_GUARDED_BY(mu_);
  std::deque<FetchJob> ahead_fetches_ ABSL_GUARDED_BY(mu_);  // prefetches and speculation
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RemoteTierStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t logs_suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread publisher_;  // publishes, and runs FillLater's fills
  std::thread fetcher_;    // reads records for sessions
};

}  // namespace ckv::engine

#endif  // CKV_ENGINE_REMOTE_TIER_H_
