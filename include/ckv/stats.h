// SPDX-License-Identifier: Apache-2.0
// ckv/stats.h: what an Engine has done and holds.
//
// Thread-safety: plain structs, returned by value.
#ifndef CKV_STATS_H_
#define CKV_STATS_H_

#include <cstdint>

namespace ckv {

struct EngineStats {
  // Counters since the store was created (persisted in the catalog with every Put and eviction;
  // read counters are since Open).
  uint64_t puts = 0;                 // Put calls that returned OK
  uint64_t chunks_written = 0;       // chunks whose records a Put wrote
  uint64_t chunks_deduplicated = 0;  // chunks a Put found already stored and did not write
  uint64_t bytes_written = 0;        // segment bytes written by Puts (records incl. padding)
  uint64_t chunks_evicted = 0;       // chunks removed to keep the store under its cap
  uint64_t bytes_evicted = 0;
  uint64_t chunks_deleted = 0;     // chunks removed by Delete
  uint64_t records_read = 0;       // records read from segments (since Open)
  uint64_t bytes_read = 0;         // since Open
  uint64_t checksum_failures = 0;  // records whose checksum did not match (since Open)

  // What the store holds now.
  uint64_t chunks = 0;
  uint64_t prefixes = 0;
  uint64_t segments = 0;
  // Memory the store's in-RAM index holds: the chunk table (an entry per chunk, its hash index),
  // the records' checksums, the set of leaves and the fingerprint table. It grows with the chunk
  // count: about 100 bytes per chunk, plus 8 per record of the chunk (its layers' and its
  // summaries'); the rest of the engine's memory (RocksDB's caches, staging buffers, tiers) does
  // not.
  uint64_t index_memory_bytes = 0;
  // Allocated segment bytes: live chunks, Puts in flight, and free slots that still hold blocks
  // (free_kept_bytes).
  uint64_t disk_bytes_used = 0;
  uint64_t max_disk_bytes = 0;          // 0 = unlimited
  uint64_t orphan_bytes_reclaimed = 0;  // segment space no committed chunk named, freed on Open
  // Open loaded the chunk index from the snapshot the last clean close wrote, instead of reading
  // every chunk's catalog record (it does when the catalog changed since, e.g. after a crash).
  bool index_from_snapshot = false;
  // The background reclaimer (EngineOptions::reclaim_margin_bytes), since Open. Its evictions are
  // also counted in chunks_evicted and bytes_evicted.
  uint64_t reclaim_rounds = 0;  // rounds that evicted: one synced catalog batch each
  uint64_t reclaim_chunks = 0;  // chunks they evicted
  uint64_t reclaim_bytes = 0;   // bytes they freed
  // Free slots that still hold their blocks, counted in disk_bytes_used: the reclaimer frees
  // slots without punching them, for the next Puts of the same model to write over, and a failed
  // punch leaves its slots so. A Put of another model that needs the room, Gc, or the next Open
  // punches them.
  uint64_t free_kept_bytes = 0;
  uint64_t inline_evictions = 0;  // Puts that found too little room and evicted inline
  // Puts that found the file system full (ENOSPC) below the cap, since Open: the store gave back
  // room for each (free slots that still held blocks, then chunks evicted by score, for the bytes
  // the Put still needed and a small margin) and tried it again, up to 3 times. no_space_recovered
  // counts those a retry stored; no_space_evictions the chunks evicted for them (also in
  // chunks_evicted).
  uint64_t no_space_puts = 0;
  uint64_t no_space_recovered = 0;
  uint64_t no_space_evictions = 0;
  uint64_t reclaim_margin_bytes = 0;  // the margin in force; 0 = no reclaimer

  // Put latency since Open: the time Engine::Put took, from call to return, of the Puts that
  // returned OK (waits for staging memory, eviction and fdatasync included). p50 and p99 are
  // nearest-rank percentiles over the latest put_latency_window Puts (at most 4096); max is over
  // all of them. 0 when no Put has returned OK.
  uint64_t put_latency_p50_us = 0;
  uint64_t put_latency_p99_us = 0;
  uint64_t put_latency_max_us = 0;
  uint64_t put_latency_window = 0;
  // Puts that waited for a lane of staging memory (EngineOptions::put_staging_bytes) since Open.
  uint64_t put_staging_waits = 0;
  // Bytes Puts wrote straight from the caller's tensors, without staging
  // (EngineOptions::put_direct_writes), since Open.
  uint64_t put_direct_bytes = 0;

  // Re-Prefill sessions finished since Open, their figures summed (see SessionStats).
  uint64_t sessions = 0;
  uint64_t session_records_served = 0;
  uint64_t session_bytes_needed = 0;
  uint64_t session_bytes_read = 0;
  uint64_t gpu_hits = 0;
  uint64_t cpu_hits = 0;
  uint64_t summary_cache_hits = 0;
  uint64_t prefetched_bytes_used = 0;
  uint64_t prefetched_bytes_wasted = 0;
  double await_blocked_seconds = 0;
  // Seconds the read engine had no read in flight while requests were queued (since Open).
  double read_idle_with_pending_seconds = 0;
  // The tiers now (0 when disabled).
  uint64_t gpu_tier_budget_bytes = 0;
  uint64_t gpu_tier_resident_bytes = 0;
  uint64_t cpu_tier_budget_bytes = 0;
  uint64_t cpu_tier_resident_bytes = 0;
  // The remote tier on a Redis Cluster (EngineOptions::remote; all 0 when it is off), since
  // Open. docs/remote.md says what each counts.
  bool remote_enabled = false;
  uint64_t remote_publish_queued = 0;  // chunks queued for publishing
  // Chunks turned away by a full publish queue, or dropped behind a call the cluster failed whole.
  uint64_t remote_publish_dropped = 0;
  uint64_t remote_published_chunks = 0;  // chunks SET in the cluster
  uint64_t remote_published_bytes = 0;
  uint64_t remote_publish_failures = 0;  // chunks whose SET failed
  uint64_t remote_fills = 0;             // local misses that asked the cluster
  uint64_t remote_fill_misses = 0;       // of which the cluster had nothing to give
  uint64_t remote_fetched_chunks = 0;    // chunks fetched, verified and stored locally
  uint64_t remote_fetched_bytes = 0;
  // Re-Prefill sessions that select (docs/remote.md): chunk heads read, records read.
  uint64_t remote_head_reads = 0;       // their local misses that asked the cluster
  uint64_t remote_head_misses = 0;      // of which the cluster had no chunk to give
  uint64_t remote_head_chunks = 0;      // chunks whose head (header, summaries) was read
  uint64_t remote_session_records = 0;  // records read for sessions, verified
  uint64_t remote_session_record_bytes = 0;
  uint64_t remote_fills_queued = 0;         // whole-prefix fills queued after such sessions
  uint64_t remote_fills_dropped = 0;        // of those, turned away by a full queue
  uint64_t remote_corrupt_chunks = 0;       // values, heads or records that failed verification:
                                            // never served
  uint64_t remote_errors = 0;               // cluster calls that failed (unreachable, timed out)
  uint64_t remote_timeouts = 0;             // of which timed out
  uint64_t remote_publish_queue_depth = 0;  // chunks waiting to be published now
  uint64_t remote_budget_bytes = 0;         // RemoteTierOptions::budget_bytes (not enforced)
};

}  // namespace ckv

#endif  // CKV_STATS_H_
