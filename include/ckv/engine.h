// SPDX-License-Identifier: Apache-2.0
// ckv/engine.h: a ckv store, opened.
//
// An Engine keeps the KV caches of prefixes on disk as ContiguousChunks. Put persists the whole
// chunks of a prefix (skipping those already stored), Lookup tells how many leading chunks of a
// token sequence are stored, ReadRecord reads one record (K then V of one chunk at one layer) with
// its checksum verified, Delete drops a prefix, and Stats / Metrics / ListPrefixes report.
//
// Promises:
//   - Durable before visible: a Put's records are written and fdatasync'd before one synced
//     catalog batch makes them visible. A Put that returned OK survives a crash; one that did not
//     is entirely absent after reopen.
//   - Checksums on read: a record whose bytes do not match its checksum is never returned; the
//     call fails with DataLoss naming the record.
//   - Hard cap: the segment bytes on disk never exceed max_disk_bytes. A Put that would pass it
//     first evicts the least recently used leaf chunks no reader holds (ties: lowest score); when
//     that cannot make room it fails with ResourceExhausted and stores nothing.
//   - Foreign specs: data written under one ModelSpec is never served under another.
//
// Thread-safety: all methods are thread-safe; Puts, reads and deletes may run concurrently.
#ifndef CKV_ENGINE_H_
#define CKV_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/chunk_key.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "ckv/reports.h"
#include "ckv/session.h"
#include "ckv/stats.h"

namespace ckv {

class Engine {
 public:
  // Opens (or creates, per options) the store in directory `path`. Reclaims segment space that no
  // committed chunk references (left by a crash). Errors: NotFound when the store is missing and
  // create_if_missing is false; AlreadyExists per error_if_exists; FailedPrecondition for a store
  // of a newer format version; PermissionDenied for an unwritable directory; DataLoss when a
  // segment the catalog names is missing.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options,
                                                      const std::string& path);

  // Opens the store in `path` read-only, while another process may hold it for writing (a
  // scheduler answering Lookup beside the worker that stores, kvctl inspecting a live store).
  // The engine sees the store as it was when it opened, or when CatchUp last ran; it writes
  // nothing, takes no lock and reclaims nothing. Lookup, Probe, ReadRecord, ListPrefixes,
  // PrefixChunks, DescribePrefix, Verify, Stats and Metrics work; Put, Delete, DeletePrefix,
  // Repair, Gc and BeginReprefill fail with FailedPrecondition. A chunk the writer evicts or
  // deletes after the view was taken may have its slot written over: ReadRecord then finds a
  // checksum that does not match, catches up (through newer views while the writer keeps moving
  // the chunk), and says NotFound (or serves the chunk where it now lives), never the other
  // chunk's bytes; DataLoss only when the chunk fails at the same place in two views (the second
  // opened after the first failure), Unavailable when it moved through 8 views meanwhile. Of
  // `options`, io_backend, io_queue_depth and logger are used (and checked as Open checks them);
  // the cap, layout, tiers and create flags are not. Errors: InvalidArgument when
  // options.remote.seeds is not empty (a view cannot use the remote tier, docs/remote.md);
  // NotFound when no store is at `path`; FailedPrecondition for a newer format; DataLoss for a
  // damaged store (an open that fails over an unchanged store is not retried); Unavailable when the
  // writer kept changing the store under 20 tries of the open.
  static absl::StatusOr<std::unique_ptr<Engine>> OpenReadOnly(const EngineOptions& options,
                                                              const std::string& path);

  // Destroying an engine closes it (Close).
  virtual ~Engine() = default;

  // Closes the store now, even while Re-Prefill sessions or their views live: waits for the
  // calls in progress (the engine's and its sessions'), ends every session (its reads are
  // cancelled and its chunks unpinned; its later calls return FailedPrecondition, and it may be
  // destroyed at any time after), and releases the store's lock, so that the store can be
  // opened again at once, in this process or another. Later calls on the engine return
  // FailedPrecondition (ListPrefixes an empty list, Stats zeros, Metrics ""). LayerViews may
  // outlive Close, not the engine. Idempotent; OK. A read-only engine (OpenReadOnly) holds no
  // lock: there it does nothing.
  virtual absl::Status Close() { return absl::OkStatus(); }

  // A read-only engine (OpenReadOnly) takes a new view of the store: what the writer committed
  // since. It costs a reopen (the catalog's index is read again: about 0.8 s per million chunks
  // here). Views already handed out (pinned reads in flight) finish on the old one. An engine
  // that writes sees its own store: OK, nothing to do.
  virtual absl::Status CatchUp() { return absl::OkStatus(); }

  // Stores the whole chunks of the prefix `tokens` with their KV `kv` (kv.tokens ==
  // tokens.size(), one K and one V tensor per layer, see ckv/kv.h). Chunks already stored are not
  // written again. A tail shorter than chunk_tokens is not stored (PutResult::tail_tokens).
  // Errors: InvalidArgument for a bad spec, fewer tokens than one chunk or tensors of the wrong
  // shape; ResourceExhausted when the cap cannot be met or the disk is full; any I/O error. On
  // error nothing of this Put is visible.
  virtual absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                        const KvTensors& kv) = 0;

  // The number of leading whole chunks of `tokens` that are stored under `spec` (0..size/c).
  // With a remote tier, a local miss fetches the rest of the chain from the cluster and stores it
  // here first (EngineOptions::remote), so the count includes it; Probe does not fetch.
  virtual absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec,
                                          std::span<const int32_t> tokens) = 0;

  // How much of `tokens` could be served, changing nothing: the leading whole chunks stored here,
  // and how far the chain continues in the remote tier (existence checks only, within one call
  // timeout; nothing is fetched or stored). What a scheduler asks before it admits a request
  // (vLLM's get_num_new_matched_tokens): a Re-Prefill session that follows can then read only the
  // records it selects from the cluster. An unreachable cluster counts 0 remote chunks.
  // Errors: InvalidArgument for a bad spec.
  virtual absl::StatusOr<PrefixExtent> Probe(const ModelSpec& spec,
                                             std::span<const int32_t> tokens) = 0;

  // Reads the record of chunk `key` at `layer` into `out` (spec.RecordBytes() bytes: K
  // [c, kv_heads, head_dim] then V, as in ckv/kv.h) and verifies its checksum.
  // Errors: NotFound when the chunk is not stored; FailedPrecondition when it is stored under
  // another spec; InvalidArgument for a bad layer or buffer size; DataLoss on a checksum mismatch.
  virtual absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                                  std::span<std::byte> out) = 0;

  // Drops the prefix `tokens` (a whole number of chunks that a Put stored as a prefix). Its chunks
  // that no other stored prefix uses are freed. Errors: InvalidArgument when tokens is not a whole
  // number of chunks; NotFound when no such prefix is stored.
  virtual absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens) = 0;
  // The same, naming the prefix by the id ListPrefixes reports.
  virtual absl::Status DeletePrefix(const ChunkKey& prefix_id) = 0;

  // The stored prefixes, newest first.
  virtual std::vector<PrefixInfo> ListPrefixes() = 0;
  // The chunk keys of a stored prefix, first to last, and its spec.
  virtual absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id,
                                                             ModelSpec* spec) = 0;

  // The same chunks with where each lives and its I and F, read from memory (no I/O). A
  // snapshot: a Put, Delete or session may change them right after. Errors as PrefixChunks.
  virtual absl::StatusOr<PrefixDescription> DescribePrefix(const ChunkKey& prefix_id) = 0;

  // Reads every record of every stored chunk and checks its checksum, and checks the catalog's
  // chains (every chunk's parent stored, child counts, prefix ends). Problems are reported, not
  // repaired. Returns an error only when the check itself could not run.
  virtual absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress = nullptr) = 0;

  // Verifies the store (as Verify) and removes what is corrupt: each chunk that failed a check,
  // with the chunks after it in its prefixes; a prefix that ran through a removed chunk ends at
  // the last good chunk before it. Everything else is left as it was. Returns what it removed.
  virtual absl::StatusOr<RepairReport> Repair(const ProgressFn& progress = nullptr) = 0;

  // Gives back segment space no chunk uses (freed slots whose blocks are still allocated: those
  // the reclaimer keeps for Puts to write over, EngineStats::free_kept_bytes, and those a failed
  // punch left) and deletes segment files that hold no chunk. Does not move chunks.
  virtual absl::StatusOr<GcReport> Gc() = 0;

  // Starts a Re-Prefill of the stored leading chunks of `tokens` (see ckv/session.h). The
  // session pins those chunks: a Delete or an eviction meanwhile does not take them from it.
  // With a remote tier (EngineOptions::remote), the chunks that continue the prefix in the
  // cluster are matched too: filled into the local store first for a session that reads every
  // chunk, or, for one that selects (quest, mean-key below budget 1 or with a target mass), read
  // from the cluster record by record as it selects them (docs/remote.md); a record the cluster can
  // no longer give fails the layers that need it (AwaitLayer), never serves other bytes. Errors:
  // InvalidArgument for bad options or spec; the summaries' read error (DataLoss for a corrupt one;
  // NotFound for chunks stored by a ckv that wrote none) for quest and mean-key.
  virtual absl::StatusOr<std::unique_ptr<ReprefillSession>> BeginReprefill(
      const ModelSpec& spec, std::span<const int32_t> tokens,
      const ReprefillOptions& options = {}) = 0;

  virtual EngineStats Stats() = 0;

  // The engine's figures in the Prometheus text exposition format (version 0.0.4), for a serving
  // process to expose on its /metrics endpoint: the store (Stats(): what it holds, counters
  // since creation and since Open), the GPU and CPU tiers (label tier="gpu"|"cpu"), the read
  // engine, Re-Prefill sessions, latency histograms in seconds of Put, Lookup, AwaitLayer and a
  // whole Re-Prefill (BeginReprefill to Finish) over the calls that returned OK, failures of
  // the public calls by operation and status code (ckv_failures_total{op="put",
  // code="RESOURCE_EXHAUSTED"}), the I/O backend in use (ckv_io_backend_info{backend="io_uring"}
  // 1) and whether the GPU tier is device memory (ckv_gpu_tier_on_device). Names start with
  // ckv_; docs/metrics.md lists them. Counters since Open restart at 0 with the process (the
  // store's persisted counters do not). Cheap: no disk I/O (the first call before any session
  // sets up one I/O queue to learn the backend); the histograms and failure counters are updated
  // with relaxed atomics on the calls' paths.
  virtual std::string Metrics() = 0;
};

}  // namespace ckv

#endif  // CKV_ENGINE_H_
