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

// CKV_ENGINE_STATS_FIELDS(X): what the engine counts beside its store, each listed once, as
// CKV_STORE_STATS_FIELDS lists the store's (the same X arguments; a type may also be double).
// It makes EngineStats's own fields below, Engine::Metrics()'s families of them (engine/
// engine.cc), the Python dict, and kvctl's "remote" JSON object (its remote_* fields, without
// the prefix). Families a field has no line of its own in (kNone) are said where they are.
#define CKV_ENGINE_STATS_FIELDS(X)                                                                \
  /* ---- Re-Prefill sessions finished since Open, their figures summed (see SessionStats). */    \
  X(uint64_t, sessions, kCounter, kSinceOpen, "ckv_sessions_total",                               \
    "Re-Prefill sessions finished, since Open.")                                                  \
  X(uint64_t, session_records_served, kCounter, kSinceOpen, "ckv_session_records_served_total",   \
    "Records finished sessions served in their views, since Open.")                               \
  X(uint64_t, session_bytes_needed, kCounter, kSinceOpen, "ckv_session_needed_bytes_total",       \
    "Record bytes finished sessions served (what they needed), since Open.")                      \
  X(uint64_t, session_bytes_read, kCounter, kSinceOpen, "ckv_session_read_bytes_total",           \
    "Bytes finished sessions read from NVMe (data and summaries), since Open.")                   \
  /* Records found in the GPU and the CPU tier: the family ckv_session_tier_hits_total,           \
     labelled by tier. */                                                                         \
  X(uint64_t, gpu_hits, kCounter, kNone, "", "")                                                  \
  X(uint64_t, cpu_hits, kCounter, kNone, "", "")                                                  \
  X(uint64_t, summary_cache_hits, kCounter, kSinceOpen, "ckv_session_summary_cache_hits_total",   \
    "Summary parts (per chunk) finished sessions found in the CPU tier, since Open.")             \
  X(uint64_t, prefetched_bytes_used, kCounter, kSinceOpen, "ckv_prefetched_used_bytes_total",     \
    "Prefetched (or speculated) bytes that a view then served, since Open.")                      \
  X(uint64_t, prefetched_bytes_wasted, kCounter, kSinceOpen, "ckv_prefetched_wasted_bytes_total", \
    "Prefetched (or speculated) bytes that no view served, since Open.")                          \
  X(double, await_blocked_seconds, kCounter, kSinceOpen, "ckv_await_blocked_seconds_total",       \
    "Time finished sessions' AwaitLayer calls waited for I/O, since Open.")                       \
  /* Seconds the read engine had no read in flight while requests were queued (since Open);       \
     Prometheus has the read engine's own figures (ckv_read_*). */                                \
  X(double, read_idle_with_pending_seconds, kCounter, kNone, "", "")                              \
  /* ---- The tiers now (0 when disabled); Prometheus has them as ckv_tier_*{tier=...}. */        \
  X(uint64_t, gpu_tier_budget_bytes, kGauge, kNone, "", "")                                       \
  X(uint64_t, gpu_tier_resident_bytes, kGauge, kNone, "", "")                                     \
  X(uint64_t, cpu_tier_budget_bytes, kGauge, kNone, "", "")                                       \
  X(uint64_t, cpu_tier_resident_bytes, kGauge, kNone, "", "")                                     \
  /* ---- The remote tier on a Redis Cluster (EngineOptions::remote; all 0 when it is off),       \
     since Open. docs/remote.md says what each counts. */                                         \
  X(bool, remote_enabled, kGauge, kSinceOpen, "ckv_remote_enabled",                               \
    "1 when the engine has a remote tier (EngineOptions::remote).")                               \
  X(uint64_t, remote_publish_queued, kCounter, kSinceOpen, "ckv_remote_publish_queued_total",     \
    "Chunks queued for publishing, since Open.")                                                  \
  X(uint64_t, remote_publish_dropped, kCounter, kSinceOpen, "ckv_remote_publish_dropped_total",   \
    "Chunks not published: turned away by a full queue, or queued behind a call the cluster "     \
    "failed whole, since Open.")                                                                  \
  X(uint64_t, remote_published_chunks, kCounter, kSinceOpen, "ckv_remote_published_chunks_total", \
    "Chunks SET in the cluster, since Open.")                                                     \
  X(uint64_t, remote_published_bytes, kCounter, kSinceOpen, "ckv_remote_published_bytes_total",   \
    "Value bytes SET in the cluster, since Open.")                                                \
  X(uint64_t, remote_publish_failures, kCounter, kSinceOpen, "ckv_remote_publish_failures_total", \
    "Chunks whose SET failed (unreachable cluster, OOM, ...), since Open.")                       \
  X(uint64_t, remote_fills, kCounter, kSinceOpen, "ckv_remote_fills_total",                       \
    "Fills from the cluster (a Lookup's local miss, a BeginReprefill's that reads every chunk, "  \
    "a selecting session's after its Finish), since Open.")                                       \
  X(uint64_t, remote_fill_misses, kCounter, kSinceOpen, "ckv_remote_fill_misses_total",           \
    "Of those, the ones the cluster had nothing to give for, since Open.")                        \
  X(uint64_t, remote_fetched_chunks, kCounter, kSinceOpen, "ckv_remote_fetched_chunks_total",     \
    "Chunks fetched from the cluster, verified and stored locally, since Open.")                  \
  X(uint64_t, remote_fetched_bytes, kCounter, kSinceOpen, "ckv_remote_fetched_bytes_total",       \
    "Value bytes of those chunks, since Open.")                                                   \
  X(uint64_t, remote_head_reads, kCounter, kSinceOpen, "ckv_remote_head_reads_total",             \
    "Local misses of selecting Re-Prefill sessions that asked the cluster for chunk heads, "      \
    "since Open.")                                                                                \
  X(uint64_t, remote_head_misses, kCounter, kSinceOpen, "ckv_remote_head_misses_total",           \
    "Of those, the ones the cluster had no chunk for, since Open.")                               \
  X(uint64_t, remote_head_chunks, kCounter, kSinceOpen, "ckv_remote_head_chunks_total",           \
    "Chunk heads (header and summaries) Re-Prefill sessions read from the cluster, verified, "    \
    "since Open.")                                                                                \
  X(uint64_t, remote_session_records, kCounter, kSinceOpen, "ckv_remote_session_records_total",   \
    "Records Re-Prefill sessions read from the cluster (those they selected), verified, since "   \
    "Open.")                                                                                      \
  X(uint64_t, remote_session_record_bytes, kCounter, kSinceOpen,                                  \
    "ckv_remote_session_record_bytes_total", "Bytes of those records, since Open.")               \
  X(uint64_t, remote_fills_queued, kCounter, kSinceOpen, "ckv_remote_fills_queued_total",         \
    "Whole-prefix fills queued after sessions that read from the cluster, since Open.")           \
  X(uint64_t, remote_fills_dropped, kCounter, kSinceOpen, "ckv_remote_fills_dropped_total",       \
    "Of those, the ones a full fill queue turned away, since Open.")                              \
  X(uint64_t, remote_corrupt_chunks, kCounter, kSinceOpen, "ckv_remote_corrupt_chunks_total",     \
    "Values that failed verification (checksum, model or key): never served, since Open.")        \
  X(uint64_t, remote_errors, kCounter, kSinceOpen, "ckv_remote_errors_total",                     \
    "Calls to the cluster that failed (unreachable, timed out, redirected too often), since "     \
    "Open.")                                                                                      \
  X(uint64_t, remote_timeouts, kCounter, kSinceOpen, "ckv_remote_timeouts_total",                 \
    "Of those, the ones that timed out, since Open.")                                             \
  X(uint64_t, remote_publish_queue_depth, kGauge, kSinceOpen, "ckv_remote_publish_queue_chunks",  \
    "Chunks waiting to be published now.")                                                        \
  X(uint64_t, remote_budget_bytes, kGauge, kSinceOpen, "ckv_remote_budget_bytes",                 \
    "The bytes this store is meant to occupy in the cluster (not enforced by ckv).")

// The store's figures (the StoreStats it derives from: stats.chunks, stats.puts, ...) and the
// engine's own: one field per CKV_ENGINE_STATS_FIELDS entry.
struct EngineStats : StoreStats {
#define CKV_ENGINE_STATS_MEMBER_(type, name, kind, scope, metric, help) type name{};
  CKV_ENGINE_STATS_FIELDS(CKV_ENGINE_STATS_MEMBER_)
#undef CKV_ENGINE_STATS_MEMBER_
};

}  // namespace ckv

#endif  // CKV_STATS_H_
