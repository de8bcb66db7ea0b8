// SPDX-License-Identifier: Apache-2.0
// ckv/options.h: how an Engine is opened.
//
// Thread-safety: plain structs.
#ifndef CKV_OPTIONS_H_
#define CKV_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckv/io_backend.h"
#include "ckv/record_layout.h"

namespace ckv {

class Logger;

// The shared tier below NVMe, on a Redis Cluster that the operator runs (docs/remote.md). A Put
// that commits locally also publishes its chunks to the cluster, in the background; a Lookup or
// a Re-Prefill that finds fewer chunks locally than its tokens have asks the cluster how far the
// chain continues there, fetches those chunks, verifies them and writes them into the local
// store before it answers.
struct RemoteTierOptions {
  // Nodes of the cluster, "host:port" each; any node will do, the rest are learnt from the
  // cluster's slot map. Empty: no remote tier. Default: empty.
  std::vector<std::string> seeds;
  // Longest one connection attempt may take, milliseconds. Default: 200.
  uint32_t connect_timeout_ms = 200;
  // Deadline of one call to the cluster (all its requests, redirections and retries),
  // milliseconds. A Lookup (or a Re-Prefill that reads every chunk) that goes to the cluster
  // asks how far the chain continues there (one call), then fetches it, 32 chunks per call,
  // starting no call past this since it began; a call that fails or passes its deadline ends
  // the fill there, and the chunks not fetched are a miss. So the cluster delays a Lookup by at
  // most about twice this. A Re-Prefill that selects (quest, mean-key below budget 1 or with a
  // target mass) reads the chunks' heads the same way, and then its selected records, 64 per call:
  // a layer whose records a call could not bring fails with that call's error (docs/remote.md).
  // Default: 500.
  uint32_t call_timeout_ms = 500;
  // First part of every key ckv writes: "<key_prefix>:<model fingerprint>:<chunk key>". Must
  // not contain '{' (a hash tag would put every chunk in one slot). Default: "ckv".
  std::string key_prefix = "ckv";
  // The bytes this store is meant to occupy in the cluster, for the operator's capacity
  // planning (reported by metrics). ckv does not enforce it: the cluster's maxmemory with
  // allkeys-lru does, and an evicted chunk is a miss. 0 = not stated. Default: 0.
  uint64_t budget_bytes = 0;
  // Chunks waiting to be published, at most; a Put whose chunks do not fit drops them (counted
  // in EngineStats::remote_publish_dropped) rather than wait. 1..1,000,000. Default: 4096.
  uint32_t publish_queue_chunks = 4096;
  // Chunks published per pipelined call. 1..1024. Default: 16.
  uint32_t publish_batch_chunks = 16;
};

struct EngineOptions {
  // Create the store when `path` holds none. Default: true.
  bool create_if_missing = true;
  // Fail with AlreadyExists when `path` holds a store already. Default: false.
  bool error_if_exists = false;

  // Hard cap on the bytes of segment data on disk (the record data that the store holds, measured
  // as allocated bytes of its segment files). 0 = unlimited. Unset = keep the store's persisted
  // cap (0 for a new store); set = persist this value as the store's cap.
  // Default: unset. The catalog (RocksDB) is outside the cap: about 100 bytes + 8 bytes per layer
  // per chunk (see docs/format.md).
  std::optional<uint64_t> max_disk_bytes;

  // Free space, in bytes, kept under max_disk_bytes by the store's background reclaimer, which
  // evicts leaves ahead of need in eviction order (least recently used first; one synced catalog
  // batch per round) so that a Put rarely evicts inline. It frees their slots without punching
  // them: the next Puts of the same model write over those blocks (EngineStats::free_kept_bytes).
  // The reclaimer wakes when less than half of it is free. Unset = max(64 MiB, 5% of the cap),
  // at most 1/8 of the cap; 0 = no reclaimer: a Put that needs room evicts inline. Ignored
  // without a cap. Not persisted. Default: unset.
  std::optional<uint64_t> reclaim_margin_bytes;

  // Layout of records in segments created from now on. Unset = the store's persisted layout
  // (layer-major for a new store). Default: unset.
  std::optional<RecordLayout> layout;

  // Layers per period p, used by the period-major layout (a band is p layers). 1..1024.
  // Persisted with each segment. Default: 8.
  uint32_t period_layers = 8;

  // Logical size of one segment file; a segment holds floor(segment_bytes / chunk bytes) chunks
  // (at least one). Segment files are sparse: only live chunks occupy disk. Default: 16 GiB.
  uint64_t segment_bytes = 16ull << 30;

  // I/O backend for segment data. Default: kAuto.
  IoBackend io_backend = IoBackend::kAuto;
  // I/Os in flight per Put. 1..1024. Default: 16.
  uint32_t io_queue_depth = 16;
  // Largest single write a Put issues, bytes (a multiple of 4096). Default: 2 MiB.
  uint32_t max_write_bytes = 2u << 20;
  // Staging memory that all Puts together copy records into before writing them, bytes,
  // allocated on the first Put, pre-faulted and reused (registered with io_uring where it is
  // used). It is split into buffers of max_write_bytes and those into lanes (at least 2 buffers
  // each, at most io_queue_depth); a Put holds one lane while it writes, larger Puts stream
  // through it, and Puts wait for a lane when all are busy. 1 MiB..64 GiB. Default: 32 MiB
  // (2 lanes of 8 x 2 MiB).
  uint64_t put_staging_bytes = 32ull << 20;
  // Write a layer's records straight from the caller's K and V tensors, with gathered writes
  // (io_uring WRITEV, pwritev), without copying them into staging, where that is possible: each
  // tensor starts on a 4 KiB boundary (and the file's direct-I/O alignment) and the K (or V) of
  // one chunk at one layer is a whole number of such blocks (qwen2.5 presets in fp16/bf16 at
  // 16-token chunks are). The caller's tensors must not change until Put returns (as always).
  // Auxiliary records, and tensors that do not qualify, are staged. Default: false: on the
  // machine of docs/results.md ("Put at steady state") copying into the registered staging
  // buffers was as fast or faster (qwen2.5-0.5b: 1.78 GB/s staged, 1.57 direct; the gathered
  // writes' 4-16 KiB pieces cost more in the kernel than the copy does in user space).
  bool put_direct_writes = false;

  // Byte budgets of the tiers that Re-Prefill sessions load records into (ckv/session.h): the
  // GPU tier (device memory where ckv is built with CUDA and a device is present, host memory
  // otherwise) and the CPU tier (host memory). Records are ranked by their chunk's S = I x F;
  // see docs/tiers.md. 0 disables a tier. Default: 0 and 0 (records land in session memory).
  uint64_t gpu_tier_bytes = 0;
  uint64_t cpu_tier_bytes = 0;

  // The shared tier on a Redis Cluster; off unless remote.seeds names a node. Used by Open;
  // OpenReadOnly refuses seeds with InvalidArgument (a read-only view can neither publish nor
  // store the chunks it would fetch). Default: off.
  RemoteTierOptions remote;

  // Where log lines go. nullptr = stderr. Not owned; must outlive the Engine.
  Logger* logger = nullptr;
};

}  // namespace ckv

#endif  // CKV_OPTIONS_H_
