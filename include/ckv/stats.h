// SPDX-License-Identifier: Apache-2.0
// ckv/stats.h: what an Engine has done and holds.
//
// Thread-safety: plain structs, returned by value.
#ifndef CKV_STATS_H_
#define CKV_STATS_H_

#include <cstdint>

namespace ckv {

// CKV_STORE_STATS_FIELDS(X): the store's counters and gauges, each listed once. Every place
// that names them all expands it: the fields of StoreStats below, the engine's Prometheus
// families (engine/metrics.cc), kvctl's JSON (tools/kvctl/common.cc) and the Python dict
// (python/ckv_module.cc). Adding a figure means adding its line here and counting it in storage/.
//
// X(type, name, kind, scope, metric, help):
//   type    the field's type: uint64_t, or bool (written as 1/0 to Prometheus)
//   name    the field of StoreStats; also its key in kvctl's JSON and in the Python dict
//   kind    kCounter or kGauge (ckv::StatKind): its Prometheus type
//   scope   kAtRest: what a store at rest has (what it holds, counters persisted since it was
//           created), written by Engine::Metrics() and `kvctl stats --format prom`;
//           kSinceOpen: what a process that opened the store counted, by Engine::Metrics() only;
//           kNone: no Prometheus family (ckv::StatScope)
//   metric  the Prometheus family name, as docs/metrics.md lists it ("" for kNone)
//   help    its # HELP text ("" for kNone)
// The order is that of the families in the Prometheus text, and of the keys in kvctl's JSON and
// the Python dict.
#define CKV_STORE_STATS_FIELDS(X)                                                               \
  /* ---- What the store holds now. */                                                          \
  X(uint64_t, chunks, kGauge, kAtRest, "ckv_chunks", "Chunks the store holds.")                 \
  X(uint64_t, prefixes, kGauge, kAtRest, "ckv_prefixes", "Prefixes the store holds.")           \
  X(uint64_t, segments, kGauge, kAtRest, "ckv_segments", "Segment files of the store.")         \
  /* Allocated segment bytes: live chunks, Puts in flight, and free slots that still hold       \
     blocks (free_kept_bytes). */                                                               \
  X(uint64_t, disk_bytes_used, kGauge, kAtRest, "ckv_disk_used_bytes",                          \
    "Allocated segment bytes: live chunks, Puts in flight and free slots that still hold "      \
    "blocks (ckv_free_kept_bytes).")                                                            \
  /* 0 = unlimited. */                                                                          \
  X(uint64_t, max_disk_bytes, kGauge, kAtRest, "ckv_disk_cap_bytes",                            \
    "The cap on segment bytes (max_disk_bytes); 0 = unlimited.")                                \
  /* Free slots that still hold their blocks, counted in disk_bytes_used: the reclaimer frees   \
     slots without punching them, for the next Puts of the same model to write over, and a      \
     failed punch leaves its slots so. A Put of another model that needs the room, Gc, or the   \
     next Open punches them. */                                                                 \
  X(uint64_t, free_kept_bytes, kGauge, kAtRest, "ckv_free_kept_bytes",                          \
    "Free segment slots that still hold their blocks, kept for Puts to write over.")            \
  /* Memory the store's in-RAM index holds: the chunk table (an entry per chunk, its hash       \
     index), the records' checksums, the set of leaves and the fingerprint table. It grows with \
     the chunk count: about 100 bytes per chunk, plus 8 per record of the chunk (its layers'    \
     and its summaries'); the rest of the engine's memory (RocksDB's caches, staging buffers,   \
     tiers) does not. */                                                                        \
  X(uint64_t, index_memory_bytes, kGauge, kAtRest, "ckv_index_memory_bytes",                    \
    "Memory of the in-RAM chunk index (chunk table, checksums, leaves, fingerprints).")         \
  /* ---- Counters since the store was created (persisted in the catalog with every Put and     \
     eviction). */                                                                              \
  X(uint64_t, puts, kCounter, kAtRest, "ckv_puts_total",                                        \
    "Put calls that returned OK, since the store was created.")                                 \
  X(uint64_t, chunks_written, kCounter, kAtRest, "ckv_chunks_written_total",                    \
    "Chunks whose records a Put wrote, since the store was created.")                           \
  X(uint64_t, chunks_deduplicated, kCounter, kAtRest, "ckv_chunks_deduplicated_total",          \
    "Chunks a Put found already stored and did not write, since the store was created.")        \
  /* Segment bytes written by Puts (records incl. padding). */                                  \
  X(uint64_t, bytes_written, kCounter, kAtRest, "ckv_written_bytes_total",                      \
    "Segment bytes Puts wrote (records with padding), since the store was created.")            \
  X(uint64_t, chunks_evicted, kCounter, kAtRest, "ckv_chunks_evicted_total",                    \
    "Chunks removed to keep the store under its cap, since the store was created.")             \
  X(uint64_t, bytes_evicted, kCounter, kAtRest, "ckv_evicted_bytes_total",                      \
    "Segment bytes evictions freed, since the store was created.")                              \
  X(uint64_t, chunks_deleted, kCounter, kAtRest, "ckv_chunks_deleted_total",                    \
    "Chunks removed by Delete, since the store was created.")                                   \
  /* ---- Since Open. */                                                                        \
  X(uint64_t, records_read, kCounter, kSinceOpen, "ckv_records_read_total",                     \
    "Records read from segments, since Open.")                                                  \
  X(uint64_t, bytes_read, kCounter, kSinceOpen, "ckv_record_read_bytes_total",                  \
    "Segment bytes of the records read, since Open.")                                           \
  X(uint64_t, checksum_failures, kCounter, kSinceOpen, "ckv_checksum_failures_total",           \
    "Records whose checksum did not match when read, since Open.")                              \
  X(uint64_t, orphan_bytes_reclaimed, kGauge, kSinceOpen, "ckv_orphan_reclaimed_bytes",         \
    "Segment space no committed chunk named, freed by Open.")                                   \
  /* Open loaded the chunk index from the snapshot the last clean close wrote, instead of       \
     reading every chunk's catalog record (it does when the catalog changed since, e.g. after a \
     crash). */                                                                                 \
  X(bool, index_from_snapshot, kGauge, kSinceOpen, "ckv_index_from_snapshot",                   \
    "1 when Open loaded the chunk index from the snapshot of the last clean close.")            \
  /* The background reclaimer (EngineOptions::reclaim_margin_bytes). Its evictions are also     \
     counted in chunks_evicted and bytes_evicted. */                                            \
  X(uint64_t, reclaim_margin_bytes, kGauge, kSinceOpen, "ckv_reclaim_margin_bytes",             \
    "The margin the background reclaimer keeps free under the cap; 0 = no reclaimer.")          \
  X(uint64_t, reclaim_rounds, kCounter, kSinceOpen, "ckv_reclaim_rounds_total",                 \
    "Background reclaimer rounds that evicted (one synced catalog batch each), since Open.")    \
  X(uint64_t, reclaim_chunks, kCounter, kSinceOpen, "ckv_reclaimed_chunks_total",               \
    "Chunks the background reclaimer evicted, since Open.")                                     \
  X(uint64_t, reclaim_bytes, kCounter, kSinceOpen, "ckv_reclaimed_bytes_total",                 \
    "Bytes the background reclaimer freed, since Open.")                                        \
  X(uint64_t, inline_evictions, kCounter, kSinceOpen, "ckv_inline_evictions_total",             \
    "Puts that found too little room and evicted inline, since Open.")                          \
  /* Puts that found the file system full (ENOSPC) below the cap: the store gave back room for  \
     each (free slots that still held blocks, then chunks evicted by score, for the bytes the   \
     Put still needed and a small margin) and tried it again, up to 3 times. no_space_recovered \
     counts those a retry stored; no_space_evictions the chunks evicted for them (also in       \
     chunks_evicted). */                                                                        \
  X(uint64_t, no_space_puts, kCounter, kSinceOpen, "ckv_no_space_puts_total",                   \
    "Puts that found the file system full (ENOSPC) below the cap, evicted to make room "        \
    "and tried once more, since Open.")                                                         \
  X(uint64_t, no_space_recovered, kCounter, kSinceOpen, "ckv_no_space_recovered_total",         \
    "Of those Puts, the ones the retry stored, since Open.")                                    \
  X(uint64_t, no_space_evictions, kCounter, kSinceOpen, "ckv_no_space_evictions_total",         \
    "Chunks evicted because the file system was full, since Open.")                             \
  /* Puts that waited for a lane of staging memory (EngineOptions::put_staging_bytes). */       \
  X(uint64_t, put_staging_waits, kCounter, kSinceOpen, "ckv_put_staging_waits_total",           \
    "Puts that waited for a lane of staging memory, since Open.")                               \
  /* Bytes Puts wrote straight from the caller's tensors, without staging                       \
     (EngineOptions::put_direct_writes). */                                                     \
  X(uint64_t, put_direct_bytes, kCounter, kSinceOpen, "ckv_put_direct_bytes_total",             \
    "Bytes Puts wrote straight from the caller's tensors, without staging, since Open.")        \
  /* Put latency since Open: the time Engine::Put took, from call to return, of the Puts that   \
     returned OK (waits for staging memory, eviction and fdatasync included). p50 and p99 are   \
     nearest-rank percentiles over the latest put_latency_window Puts (at most 4096); max is    \
     over all of them. 0 when no Put has returned OK. Prometheus has them as the histogram      \
     ckv_put_latency_seconds instead. */                                                        \
  X(uint64_t, put_latency_p50_us, kGauge, kNone, "", "")                                        \
  X(uint64_t, put_latency_p99_us, kGauge, kNone, "", "")                                        \
  X(uint64_t, put_latency_max_us, kGauge, kNone, "", "")                                        \
  X(uint64_t, put_latency_window, kGauge, kNone, "", "")

// The Prometheus type of a CKV_STORE_STATS_FIELDS entry.
enum class StatKind { kCounter, kGauge };
// Which Prometheus text has a CKV_STORE_STATS_FIELDS entry (see there).
enum class StatScope { kAtRest, kSinceOpen, kNone };

// What the store has done and holds: one field per CKV_STORE_STATS_FIELDS entry, which documents
// each. Read counters and the reclaimer's are since Open; the others are since the store was
// created.
struct StoreStats {
#define CKV_STORE_STATS_MEMBER_(type, name, kind, scope, metric, help) type name{};
  CKV_STORE_STATS_FIELDS(CKV_STORE_STATS_MEMBER_)
#undef CKV_STORE_STATS_MEMBER_
};

// The store's figures (the StoreStats it derives from: stats.chunks, stats.puts, ...) and the
// engine's own.
struct EngineStats : StoreStats {
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
