// SPDX-License-Identifier: Apache-2.0
// storage/chunk_store_put.cc: ChunkStore::Put: validation, slot allocation, new segments, the
// unlocked write of the records, and the release of a failed Put's slots.
#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckv/codec.h"
#include "ckv/status.h"
#include "common/assert.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"
#include "storage/chunk_store_internal.h"
#include "storage/record_checksum.h"

namespace ckv::storage {

namespace {

using chunk_store_internal::kSegmentsDir;
using chunk_store_internal::PunchGaveBack;

// Room an ENOSPC retry makes beyond the `bytes` a Put still has to place: the file system's
// metadata for them (extent blocks, 1/256 as DataCapLocked allows), a new segment's first blocks
// and the catalog's WAL growth for the batch that names the chunks.
uint64_t NoSpaceMarginBytes(uint64_t bytes) { return bytes / 256 + (64u << 10); }
// Tries of a Put after the first that found the file system full.
constexpr int kNoSpaceRetries = 3;

}  // namespace

absl::Status ChunkStore::ValidatePut(const ModelSpec& spec, std::span<const int32_t> tokens,
                                     const KvTensors& kv) {
  CKV_RETURN_IF_ERROR(spec.Validate());
  // Validate allows records of up to 2^40 bytes; a segment's geometry keeps sizes in a u32,
  // which would truncate them silently.
  if (spec.RecordBytes() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec ", spec.model_id, ": a record (K and V of ", spec.chunk_tokens,
                     " tokens x ", spec.kv_heads, " kv heads x ", spec.head_dim, " head dim) is ",
                     spec.RecordBytes(), " bytes, over the limit of ", kMaxRecordBytes));
  }
  if (tokens.size() < spec.chunk_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Put of ", tokens.size(), " tokens: fewer than one chunk of ", spec.chunk_tokens));
  }
  if (kv.tokens != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvTensors.tokens = ", kv.tokens, " but the prefix has ", tokens.size(), " tokens"));
  }
  if (kv.k.size() != spec.layers || kv.v.size() != spec.layers) {
    return absl::InvalidArgumentError(absl::StrCat("KvTensors has ", kv.k.size(), " K and ",
                                                   kv.v.size(), " V tensors; ", spec.model_id,
                                                   " has ", spec.layers, " layers"));
  }
  const uint64_t want = uint64_t{kv.tokens} * spec.TokenBytesPerLayer();
  for (uint32_t l = 0; l < spec.layers; ++l) {
    for (const auto* side : {&kv.k, &kv.v}) {
      const auto& t = (*side)[l];
      if (t.size() != want || (t.data() == nullptr && want > 0)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s tensor of layer %u has %u bytes; [%u tokens, %u kv heads, %u head dim] of %s is "
            "%u bytes",
            side == &kv.k ? "K" : "V", l, t.size(), kv.tokens, spec.kv_heads, spec.head_dim,
            DTypeName(spec.dtype), want));
      }
    }
  }
  return absl::OkStatus();
}

// A Put between its steps (chunk_store.h, "Life of a Put").
struct ChunkStore::PendingPut {
  PendingPut(const ModelSpec& spec, std::span<const int32_t> tokens,
             std::vector<uint32_t> aux_bytes)
      : spec(spec), tokens(tokens), aux_bytes(std::move(aux_bytes)) {}
  const ModelSpec& spec;
  std::span<const int32_t> tokens;
  std::vector<uint32_t> aux_bytes;           // of each auxiliary record; empty without
  ChunkKey fp;                               // the spec's fingerprint
  std::vector<ChunkKey> keys;                // of the prefix's whole chunks
  size_t n = 0;                              // keys.size()
  size_t m = 0;                              // leading chunks stored already
  bool new_spec = false;                     // no chunk of this spec was stored when it began
  uint64_t chunk_bytes = 0;                  // one new chunk's bytes in a segment
  std::vector<PlannedRun> plan;              // the slots of the new chunks
  std::optional<io::FileSystemSpace> space;  // the file system's size, where it states one
  PutResult result;
  // Set when the Put failed for a full file system with keys[m - 1] pinned: the pin is not
  // released but handed to RetryOnFullDisk (PutShortfall::pinned), which keeps it across its
  // retries.
  bool pin_handed_over = false;
};

absl::Status ChunkStore::ValidateAux(const AuxRecords* aux) {
  if (aux == nullptr) return absl::OkStatus();
  const std::vector<uint32_t>& aux_bytes = aux->record_bytes;
  if (aux_bytes.empty() || aux_bytes.size() > 16 || !aux->fill) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Put with ", aux_bytes.size(), " auxiliary records", aux->fill ? "" : " and no fill",
        ": 1..16 records and a fill function are needed"));
  }
  for (uint32_t b : aux_bytes) {
    if (b == 0 || b > (1u << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("auxiliary record of ", b, " bytes: must be 1 B..1 GiB"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PutResult> ChunkStore::Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                          const KvTensors& kv, const AuxRecords* aux,
                                          int64_t* latency_ns) {
  CKV_RETURN_IF_ERROR(RefuseIfReadOnly("Put"));
  const int64_t start_ns = options_.clock->MonotonicNanos();
  absl::StatusOr<PutResult> result = RetryOnFullDisk(
      spec, [&](PutShortfall* shortfall) { return TryPut(spec, tokens, kv, aux, shortfall); });
  if (result.ok()) {
    const int64_t ns = std::max<int64_t>(options_.clock->MonotonicNanos() - start_ns, 0);
    put_latency_.Record(static_cast<uint64_t>(ns) / 1000);
    if (latency_ns != nullptr) *latency_ns = ns;
  }
  return result;
}

absl::StatusOr<PutResult> ChunkStore::RetryOnFullDisk(
    const ModelSpec& spec, absl::FunctionRef<absl::StatusOr<PutResult>(PutShortfall*)> try_put) {
  PutShortfall shortfall;
  // The chains a failed try counted as stored stay pinned until the Put returns: the eviction
  // below, the background reclaimer and other Puts' evictions must not take them, or a retry
  // would find fewer chunks stored and write them from the caller's tensors, which a caller may
  // have left unfilled for the chunks stored already (kvctl replay does, synth::ReplayKv).
  std::vector<ChunkKey> pinned;
  absl::Cleanup unpin = [&] {
    if (pinned.empty()) return;
    absl::MutexLock lock(&mu_);
    for (const ChunkKey& key : pinned) PutUnpinLocked(key);
  };
  auto keep_pin = [&pinned](const PutShortfall& s) {
    if (s.pinned.has_value()) pinned.push_back(*s.pinned);
  };
  absl::StatusOr<PutResult> result = try_put(&shortfall);
  keep_pin(shortfall);
  if (result.ok() || !IsNoSpace(result.status()) || shortfall.need == 0) return result;
  // The file system is full below the cap: the cap was set above what the disk holds, or
  // something else fills the disk. The store is a cache: it gives back blocks (free slots that
  // still hold theirs, then chunks evicted in the store's eviction order, eviction_policy.h) for
  // the bytes the Put still had to place when the disk filled, plus a margin for the file
  // system's and the catalog's own blocks, and tries again (up to kNoSpaceRetries times); it
  // evicts nothing when eviction could not give back that much (ReservePutLocked refused the
  // Puts that could never fit before anything was evicted). The failed Put left nothing behind
  // (its slots were freed, and their blocks are free again for the retry).
  uint64_t evicted = 0;
  std::string what;
  {
    absl::MutexLock lock(&mu_);
    ++no_space_puts_;
  }
  for (int retry = 1;; ++retry) {
    const uint64_t at_least = std::min(shortfall.still_needed, shortfall.need);
    const uint64_t wanted = at_least + NoSpaceMarginBytes(at_least);
    uint64_t evicted_now = 0;
    absl::StatusOr<uint64_t> freed;
    std::string punch_error;
    {
      absl::MutexLock lock(&mu_);
      freed = FreeDiskLocked(wanted, at_least, &evicted_now);
      no_space_evictions_ += evicted_now;
      punch_error = last_punch_error_;
    }
    evicted += evicted_now;
    if (what.empty()) {
      what = absl::StrCat("the file system was full (", result.status().message(), ")");
    }
    if (!freed.ok()) {
      return WithMessage(freed.status(), absl::StrCat("Put of ", spec.model_id, ": ", what,
                                                      retry > 1 ? absl::StrCat(" (", evicted,
                                                                               " chunks evicted "
                                                                               "for it so far)")
                                                                : std::string(),
                                                      "; giving back room for a retry failed: ",
                                                      freed.status().message()));
    }
    if (*freed == 0) {
      return WithMessage(
          result.status(),
          absl::StrCat("Put of ", spec.model_id, ": ", what, "; ",
                       evicted_now == 0
                           ? std::string("nothing could be evicted to make room (every chunk is "
                                         "held by readers or Puts)")
                           : absl::StrCat("evicted ", evicted_now,
                                          " chunks, but their blocks could not be given back (",
                                          punch_error, ")")));
    }
    logger_->Log(LogLevel::kWarning,
                 absl::StrCat("Put of ", spec.model_id, ": ", what, "; it still needed ", at_least,
                              " bytes: evicted ", evicted_now, " chunks and gave back ", *freed,
                              " bytes; trying again (", retry, " of ", kNoSpaceRetries, ")"));
    shortfall = PutShortfall{};
    result = try_put(&shortfall);
    keep_pin(shortfall);
    if (result.ok()) {
      result->chunks_evicted += evicted;
      absl::MutexLock lock(&mu_);
      ++no_space_recovered_;
      return result;
    }
    // A file system may give freed blocks out again later than it said it freed them (ext4
    // hands out blocks punched in a journal transaction once it commits): a retry that finds
    // less room than was made evicts again for what it still needs, a few times at most.
    if (!IsNoSpace(result.status()) || shortfall.need == 0 || retry == kNoSpaceRetries) break;
  }
  return WithMessage(result.status(),
                     absl::StrCat(result.status().message(), " (after ", what, " and ", evicted,
                                  " chunks were evicted to make room)"));
}

absl::StatusOr<PutResult> ChunkStore::TryPut(const ModelSpec& spec, std::span<const int32_t> tokens,
                                             const KvTensors& kv, const AuxRecords* aux,
                                             PutShortfall* shortfall) {
  CKV_RETURN_IF_ERROR(ValidatePut(spec, tokens, kv));
  CKV_RETURN_IF_ERROR(ValidateAux(aux));
  PendingPut put(spec, tokens, aux != nullptr ? aux->record_bytes : std::vector<uint32_t>{});
  // The file system's size, asked before the lock (a statvfs): a Put that could never fit it is
  // refused before anything is evicted for it. Not every file system can say.
  if (absl::StatusOr<io::FileSystemSpace> space = fs_->Space(path_); space.ok()) put.space = *space;
  put.fp = spec.Fingerprint();
  put.keys = ChainChunkKeys(put.fp, spec.chunk_tokens, tokens);
  put.n = put.keys.size();
  put.chunk_bytes = ChunkBytesOf(spec, put.aux_bytes);
  put.result.chunks = put.n;
  put.result.tail_tokens = tokens.size() - put.n * spec.chunk_tokens;
  put.result.prefix_id = put.keys.back();

  // Step 1: find what is stored, reserve room and slots for the rest.
  {
    absl::MutexLock lock(&mu_);
    bool all_stored = false;
    const absl::Status reserved = ReservePutLocked(put, &all_stored);
    shortfall->need = (put.n - put.m) * put.chunk_bytes;
    shortfall->still_needed = shortfall->need;
    if (put.pin_handed_over) shortfall->pinned = put.keys[put.m - 1];
    CKV_RETURN_IF_ERROR(reserved);
    if (all_stored) return put.result;
  }
  // Step 2, unlocked: write the records and make them durable.
  std::vector<std::vector<uint64_t>> checksums(
      put.n - put.m, std::vector<uint64_t>(spec.layers + put.aux_bytes.size()));
  uint64_t bytes_written = 0;
  const absl::Status written =
      WritePut(put, kv, aux, &checksums, &bytes_written, &shortfall->still_needed);
  // Step 3: name them in the catalog, then publish them (or free the slots).
  absl::MutexLock lock(&mu_);
  absl::StatusOr<PutResult> result = CommitPutLocked(put, written, checksums, bytes_written);
  if (put.pin_handed_over) shortfall->pinned = put.keys[put.m - 1];
  return result;
}

absl::Status ChunkStore::ReservePutLocked(PendingPut& put, bool* all_stored) {
  const std::vector<ChunkKey>& keys = put.keys;
  const size_t n = put.n;
  // Wait for a concurrent Put of the same chunks to finish, then take what it stored.
  for (;;) {
    bool conflict = false;
    for (const ChunkKey& k : keys) {
      if (inflight_.contains(k)) {
        conflict = true;
        break;
      }
    }
    if (!conflict) break;
    inflight_cv_.Wait(&mu_);
  }
  size_t m = 0;
  while (m < n && chunks_.contains(keys[m])) ++m;
  for (size_t i = m; i < n; ++i) {
    if (chunks_.contains(keys[i])) {
      // Stored chunks always include their parents; only a catalog damaged before this open
      // (a chunk Load had to drop) breaks that. Writing here would shadow the stored record.
      return absl::DataLossError(
          absl::StrCat("chunk ", keys[i].ToHex(), " (", i, " of this prefix) is stored but chunk ",
                       keys[m].ToHex(), " before it is not; run kvctl verify"));
    }
  }
  put.m = m;
  put.new_spec = !specs_.contains(put.fp);
  // The new chunks' entries will name the spec by an ordinal (given at commit): refuse the Put
  // now when none is left for a spec without one.
  CKV_RETURN_IF_ERROR(CheckFingerprintOrdinalLocked(put.fp));
  const uint32_t tick = UseTickLocked();
  for (size_t i = 0; i < m; ++i) chunks_[keys[i]].last_use = tick;
  put.result.chunks_existing = m;
  if (m == n) {
    *all_stored = true;
    return CommitStoredPrefixLocked(put);
  }

  const uint64_t need = (n - m) * put.chunk_bytes;
  if (max_disk_bytes_ > 0 && need > DataCapLocked()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Put of ", n - m, " new chunks (", need, " bytes) of ", put.spec.model_id,
        " exceeds the store's max_disk_bytes of ", max_disk_bytes_, " (", DataCapLocked(),
        " bytes of data after the file system's metadata allowance)"));
  }
  if (put.space.has_value() && need > put.space->available_bytes + used_bytes_) {
    // More than the file system could ever give the store, even with every chunk evicted: the
    // store is not emptied for a Put that fails anyway.
    const io::FileSystemSpace& fs = *put.space;
    const uint64_t others =
        fs.total_bytes - std::min(fs.total_bytes, fs.available_bytes + used_bytes_);
    return absl::ResourceExhaustedError(
        absl::StrCat("Put of ", n - m, " new chunks (", need, " bytes) of ", put.spec.model_id,
                     " can never fit the file system holding ", path_, ": it is ", fs.total_bytes,
                     " bytes, of which ", others, " are not the store's (", fs.available_bytes,
                     " free, ", used_bytes_, " held by the store); nothing was evicted"));
  }
  for (size_t i = m; i < n; ++i) inflight_.insert(keys[i]);
  if (m > 0) put_pins_[keys[m - 1]]++;
  auto undo = [&](const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = m; i < n; ++i) inflight_.erase(keys[i]);
    if (m > 0) ReleaseOrHandOverPinLocked(put, why);
    inflight_cv_.SignalAll();
  };
  std::vector<PlannedRun>& plan = put.plan;
  // Free slots that still hold their blocks (the reclaimer's) are counted in used_bytes_: the
  // Put writes over those of its model first. They leave used_bytes_ here, to come back below as
  // part of `need`, so the room made is only for the rest.
  SlotOwner owner{put.fp, &put.aux_bytes};
  size_t kept = PlanUnpunchedLocked(owner, n - m, &plan);
  // Inline eviction, when needed, keeps the slots of this model for this Put to write over too,
  // as many as it still needs.
  owner.slots = n - m - kept;
  absl::Status s = MakeRoomLocked(need, &put.result.chunks_evicted, &owner);
  if (s.ok()) kept += PlanUnpunchedLocked(owner, n - m - kept, &plan);
  const size_t segments_before = segments_.size();
  if (s.ok()) s = AllocateLocked(put.spec, put.aux_bytes, n - m - kept, &plan);
  if (s.ok() && max_disk_bytes_ > 0 && segments_.size() > segments_before + 1 &&
      used_bytes_ + need > DataCapLocked()) {
    // The room was made for one new segment's metadata and the Put needed more segments: make
    // room again now that they exist (the slots are taken already and do not count yet).
    s = MakeRoomLocked(need, &put.result.chunks_evicted);
  }
  if (!s.ok()) {
    ReleasePlanLocked(plan, /*counted=*/false);
    plan.clear();
    undo(s);
    return s;
  }
  // Unpunched slots AllocateLocked took (none while PlanUnpunchedLocked drains this model's
  // first; kept for safety) are counted already.
  uint64_t reused = 0;
  uint64_t planned = 0;
  for (const PlannedRun& r : plan) {
    planned += r.run.count;
    if (r.kept) continue;
    for (uint32_t i = 0; i < r.run.count; ++i) {
      reused += TakeUnpunchedLocked(*r.segment, r.run.start + i);
    }
  }
  CKV_DCHECK(planned == n - m);  // one slot for each new chunk
  used_bytes_ += need - reused * put.chunk_bytes;
  // The disk cap holds once room is made: what a new segment's metadata takes is allowed for
  // under max_disk_bytes (DataCapLocked), never over it.
  CKV_DCHECK(max_disk_bytes_ == 0 || used_bytes_ <= max_disk_bytes_);
  // Evict ahead of the next Puts while this one writes (chunk_store_reclaim.cc).
  KickReclaimerLocked();
  return absl::OkStatus();
}

void ChunkStore::ReleaseOrHandOverPinLocked(PendingPut& put, const absl::Status& s) {
  if (!s.ok() && IsNoSpace(s)) {
    // RetryOnFullDisk may retry after evicting: it keeps the chain pinned until the Put returns.
    put.pin_handed_over = true;
    return;
  }
  PutUnpinLocked(put.keys[put.m - 1]);
}

absl::Status ChunkStore::CommitStoredPrefixLocked(PendingPut& put) {
  // Everything is stored; record the prefix end if this is a new one.
  const size_t n = put.n;
  ChunkEntry& last = chunks_[put.keys[n - 1]];
  if (!last.prefix_end) {
    Catalog::Batch batch = catalog_->NewBatch();
    PrefixEntry p{put.fp, n, NowMs()};
    batch.PutPrefix(put.keys[n - 1], PrefixRecord{p.fingerprint, p.chunks, p.created_unix_ms});
    StoredCounters next = counters_;
    next.puts++;
    next.chunks_deduplicated += n;
    batch.PutCounters(next);
    CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
    counters_ = next;
    last.prefix_end = true;
    prefixes_[put.keys[n - 1]] = p;
  } else {
    counters_.puts++;
    counters_.chunks_deduplicated += n;
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::WritePut(const PendingPut& put, const KvTensors& kv, const AuxRecords* aux,
                                  std::vector<std::vector<uint64_t>>* checksums,
                                  uint64_t* bytes_written, uint64_t* still_needed) {
  const std::vector<uint32_t>& aux_bytes = put.aux_bytes;
  const size_t m = put.m;
  const size_t new_chunks = put.n - put.m;
  // Compute the auxiliary records on a second thread while the layers' records are written.
  // The future's destructor waits, so nothing it uses goes away under it on any return path.
  std::vector<std::vector<std::byte>> aux_data(aux_bytes.size());
  for (size_t a = 0; a < aux_bytes.size(); ++a) aux_data[a].resize(new_chunks * aux_bytes[a]);
  std::future<void> aux_future;
  if (aux != nullptr) {
    aux_future = std::async(std::launch::async, [&] {
      std::vector<std::span<std::byte>> out(aux_bytes.size());
      for (size_t i = 0; i < new_chunks; ++i) {
        for (size_t a = 0; a < aux_bytes.size(); ++a) {
          out[a] = std::span<std::byte>(aux_data[a].data() + i * aux_bytes[a], aux_bytes[a]);
        }
        aux->fill(m + i, out);
      }
    });
  }
  auto aux_ready = [&] {
    if (aux_future.valid()) aux_future.wait();
  };

  // Write the records, then make them durable.
  absl::Status s = WriteChunks(put.spec, kv, m, put.plan, aux_data, aux_ready, checksums,
                               bytes_written, still_needed);
  if (s.ok()) {
    std::vector<Segment*> synced;
    for (const PlannedRun& r : put.plan) {
      if (std::find(synced.begin(), synced.end(), r.segment) != synced.end()) continue;
      s = r.segment->file()->Sync();
      if (!s.ok()) break;
      synced.push_back(r.segment);
    }
  }
  if (s.ok()) s = fs_->CrashSeam(io::kSeamPutDataSynced);
  return s;
}

absl::StatusOr<PutResult> ChunkStore::CommitPutLocked(PendingPut& put, absl::Status s,
                                                      std::vector<std::vector<uint64_t>>& checksums,
                                                      uint64_t bytes_written) {
  const std::vector<ChunkKey>& keys = put.keys;
  const size_t n = put.n;
  const size_t m = put.m;
  const uint32_t c = put.spec.chunk_tokens;
  const int64_t now = NowMs();
  const uint64_t seq = ++put_seq_;
  StoredCounters next = counters_;
  std::vector<std::pair<size_t, ChunkRecord>> records;  // (index in keys, what the batch names)
  // The new entries name the spec by its ordinal, given here, once the Put's data is written, so
  // that a Put that fails earlier takes none (ReservePutLocked checked that one is left).
  if (s.ok()) s = FingerprintOrdinalLocked(put.fp).status();
  if (s.ok()) {
    Catalog::Batch batch = catalog_->NewBatch();
    if (put.new_spec && !specs_.contains(put.fp)) batch.PutSpec(put.spec);
    records.reserve(n - m);
    for (const PlannedRun& r : put.plan) {
      for (uint32_t i = 0; i < r.run.count; ++i) {
        const size_t idx = m + r.first + i;
        ChunkRecord& rec = records.emplace_back(idx, ChunkRecord{}).second;
        rec.parent = idx == 0 ? ChunkKey{} : keys[idx - 1];
        rec.fingerprint = put.fp;
        rec.depth = static_cast<uint32_t>(idx);
        rec.segment = r.segment->id();
        rec.slot = r.run.start + i;
        rec.put_seq = seq;
        rec.created_unix_ms = now;
        rec.tokens.assign(put.tokens.begin() + idx * c, put.tokens.begin() + (idx + 1) * c);
        rec.checksums = std::move(checksums[r.first + i]);
        // A committed chunk sits inside its segment, with one checksum per record.
        CKV_DCHECK(rec.slot < r.segment->geometry().capacity_slots &&
                   rec.checksums.size() == r.segment->records());
        batch.PutChunk(keys[idx], rec);
      }
    }
    batch.PutPrefix(keys[n - 1], PrefixRecord{put.fp, n, now});
    next.puts++;
    next.chunks_written += n - m;
    next.chunks_deduplicated += m;
    next.bytes_written += bytes_written;
    batch.PutCounters(next);
    s = catalog_->Commit(batch);
  }
  for (size_t i = m; i < n; ++i) inflight_.erase(keys[i]);
  if (m > 0) ReleaseOrHandOverPinLocked(put, s);
  inflight_cv_.SignalAll();
  if (!s.ok()) {
    // Nothing names the slots: free them and give their blocks back.
    ReleasePlanLocked(put.plan, /*counted=*/true);
    return s;
  }
  counters_ = next;
  if (put.new_spec) specs_.emplace(put.fp, put.spec);
  const uint32_t tick = UseTickLocked();
  for (const auto& [idx, rec] : records) {
    chunks_.emplace(keys[idx], EntryFromRecordLocked(rec, tick));
  }
  for (size_t idx = m; idx < n; ++idx) {
    chunks_[keys[idx]].parent = idx == 0 ? ChunkEntry::kRoot : chunks_.find(keys[idx - 1]).id();
  }
  for (size_t idx = std::max<size_t>(m, 1); idx < n; ++idx) chunks_[keys[idx - 1]].children++;
  if (m > 0) leaves_.erase(keys[m - 1]);  // the stored chunk the new ones extend
  leaves_.insert(keys[n - 1]);
  chunks_[keys[n - 1]].prefix_end = true;
  prefixes_[keys[n - 1]] = PrefixEntry{put.fp, n, now};
  put.result.chunks_written = n - m;
  put.result.bytes_written = bytes_written;
  CKV_DCHECK(max_disk_bytes_ == 0 || used_bytes_ <= max_disk_bytes_);  // the disk cap
  CKV_RETURN_IF_ERROR(fs_->CrashSeam(io::kSeamPutCommitted));
  return put.result;
}

size_t ChunkStore::PlanUnpunchedLocked(const SlotOwner& owner, size_t count,
                                       std::vector<PlannedRun>* plan) {
  if (unpunched_.empty() || count == 0) return 0;
  std::vector<SlotId> mine;
  for (const SlotId& slot : unpunched_) {
    if (OwnsLocked(owner, *segments_.at(slot.first))) mine.push_back(slot);
  }
  // Longest runs first, so the Put is written in as few runs as possible.
  std::vector<SegmentRun> runs = RunsOfLocked(std::move(mine));
  std::stable_sort(runs.begin(), runs.end(), [](const SegmentRun& a, const SegmentRun& b) {
    return a.run.count > b.run.count;
  });
  size_t first = 0;  // the Put's chunks planned already
  for (const PlannedRun& r : *plan) first += r.run.count;
  size_t taken = 0;
  for (const auto& [seg, whole] : runs) {
    if (taken == count) break;
    const SlotRun run{whole.start,
                      static_cast<uint32_t>(std::min<size_t>(whole.count, count - taken))};
    const bool free = seg->AllocateRun(run);
    CKV_CHECK(free);  // an unpunched slot is free in its segment
    TakeUnpunchedLocked(*seg, run);
    CKV_DCHECK(used_bytes_ >= run.count * seg->chunk_bytes());
    used_bytes_ -= run.count * seg->chunk_bytes();
    plan->push_back(PlannedRun{seg, run, first + taken, /*kept=*/true});
    taken += run.count;
  }
  return taken;
}

void ChunkStore::ReleasePlanLocked(const std::vector<PlannedRun>& plan, bool counted) {
  for (const PlannedRun& r : plan) {
    if (!counted && r.kept) {
      // Written over by nothing yet: back to the unpunched slots, counted again.
      r.segment->Free(r.run);
      KeepUnpunchedLocked(*r.segment, r.run);
      used_bytes_ += r.run.count * r.segment->chunk_bytes();
      continue;
    }
    absl::Status s = r.segment->PunchSlots(r.run);
    const bool punched = PunchGaveBack(s);
    if (!punched) {
      // The slots are free either way; their blocks stay counted until a retry (the next Put
      // that needs room, Gc) or the next open gives them back.
      last_punch_error_ = std::string(s.message());
      logger_->Log(LogLevel::kWarning, absl::StrCat("could not free blocks of segment ",
                                                    r.segment->id(), ": ", s.message()));
    }
    r.segment->Free(r.run);
    for (uint32_t i = 0; i < r.run.count; ++i) {
      const SlotId slot{r.segment->id(), r.run.start + i};
      // A planned slot was free (or unpunched) when taken; no reader can hold it.
      CKV_DCHECK(!read_pins_.contains(slot) && !deferred_free_.contains(slot));
      if (!counted) {
        // Not reserved by this Put; a reused unpunched slot is counted as such.
        if (punched && TakeUnpunchedLocked(*r.segment, slot.second)) {
          used_bytes_ -= r.segment->chunk_bytes();
        }
      } else if (punched) {
        CKV_DCHECK(used_bytes_ >= r.segment->chunk_bytes());  // the reservation is counted
        used_bytes_ -= r.segment->chunk_bytes();
      }
    }
    if (counted && !punched) KeepUnpunchedLocked(*r.segment, r.run);
  }
}

absl::StatusOr<uint64_t> ChunkStore::RetryPunchesLocked(uint64_t enough) {
  uint64_t given_back = 0;
  absl::Status first_error;
  std::vector<SlotId> slots(unpunched_.begin(), unpunched_.end());
  for (const auto& [seg, run] : RunsOfLocked(std::move(slots))) {
    if (given_back >= enough) break;
    absl::Status s = seg->PunchSlots(run);
    if (!PunchGaveBack(s)) {
      if (first_error.ok()) first_error = s;
      continue;
    }
    TakeUnpunchedLocked(*seg, run);
    const uint64_t bytes = run.count * seg->chunk_bytes();
    CKV_DCHECK(used_bytes_ >= bytes);  // an unpunched slot is counted
    used_bytes_ -= bytes;
    given_back += bytes;
  }
  if (!first_error.ok()) {
    last_punch_error_ = std::string(first_error.message());
    return first_error;
  }
  return given_back;
}

absl::Status ChunkStore::AllocateLocked(const ModelSpec& spec,
                                        const std::vector<uint32_t>& aux_bytes, size_t count,
                                        std::vector<PlannedRun>* plan) {
  const SlotOwner owner{spec.Fingerprint(), &aux_bytes};
  size_t done = 0;
  for (const PlannedRun& r : *plan) done += r.run.count;  // planned already (unpunched slots)
  count += done;
  // Segments of this spec in the current layout, oldest first, so space is reused before growth.
  std::vector<Segment*> candidates;
  for (auto& [id, seg] : segments_) {
    if (OwnsLocked(owner, *seg) && seg->free_slots() > 0) candidates.push_back(seg.get());
  }
  std::sort(candidates.begin(), candidates.end(),
            [](Segment* a, Segment* b) { return a->id() < b->id(); });
  size_t next_candidate = 0;
  while (done < count) {
    Segment* seg = nullptr;
    if (next_candidate < candidates.size()) {
      seg = candidates[next_candidate];
    } else {
      auto created = NewSegmentLocked(spec, aux_bytes);
      if (!created.ok()) {
        ReleasePlanLocked(*plan, /*counted=*/false);
        plan->clear();
        return created.status();
      }
      seg = *created;
      candidates.push_back(seg);
    }
    SlotRun run = seg->Allocate(static_cast<uint32_t>(std::min<size_t>(count - done, UINT32_MAX)));
    if (run.count == 0) {
      ++next_candidate;
      continue;
    }
    plan->push_back(PlannedRun{seg, run, done});
    done += run.count;
  }
  return absl::OkStatus();
}

absl::StatusOr<Segment*> ChunkStore::NewSegmentLocked(const ModelSpec& spec,
                                                      const std::vector<uint32_t>& aux_bytes) {
  const uint32_t id = next_segment_id_++;
  const SegmentRecord g = Segment::GeometryFor(spec, layout_, options_.period_layers,
                                               options_.segment_bytes, NowMs(), aux_bytes);
  const std::string file_path = SegmentPath(id);
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<io::File> file,
                       fs_->Open(file_path, io::FileSystem::OpenMode::kCreateReadWrite));
  CKV_RETURN_IF_ERROR(fs_->SyncDir(absl::StrCat(path_, "/", kSegmentsDir)));
  // The segment is committed empty before any chunk is written into it, so a crash can leave an
  // empty segment but never a chunk in an unnamed file.
  Catalog::Batch batch = catalog_->NewBatch();
  batch.PutSegment(id, g);
  CKV_RETURN_IF_ERROR(catalog_->Commit(batch));
  auto seg = std::make_unique<Segment>(id, g, std::move(file));
  Segment* raw = seg.get();
  segments_.emplace(id, std::move(seg));
  return raw;
}

namespace {

// Copies the records of `count` consecutive new chunks (from new chunk `first_new`; new chunk i
// is chunk first_chunk + i of the prefix) in band `band` into `dst`, laid out as their slots are
// in the segment, padding zeroed, and sets their checksums: over exactly the bytes written.
void StageBand(const Segment& seg, uint32_t band, const ModelSpec& spec, const KvTensors& kv,
               const std::vector<std::vector<std::byte>>& aux_data, size_t first_new,
               size_t first_chunk, uint32_t count, std::byte* dst,
               std::vector<std::vector<uint64_t>>* checksums) {
  const uint32_t c = spec.chunk_tokens;
  const size_t token_bytes = spec.TokenBytesPerLayer();
  const size_t half = size_t{c} * token_bytes;  // K (or V) bytes of one chunk at one layer
  const bool aux_band = band >= seg.layer_bands();
  const uint64_t slot_stride = seg.record_stride(band);
  const uint64_t band_slot = seg.band_slot_bytes(band);
  const uint32_t first_record = seg.first_record_of_band(band);
  const uint32_t records = seg.records_in_band(band);
  for (uint32_t i = 0; i < count; ++i) {
    const size_t new_index = first_new + i;
    const size_t token_offset = (first_chunk + new_index) * c;
    for (uint32_t j = 0; j < records; ++j) {
      const uint32_t record = first_record + j;
      const size_t bytes = seg.record_bytes(record);
      std::byte* out = dst + i * band_slot + j * slot_stride;
      if (aux_band) {
        const size_t a = record - spec.layers;
        std::memcpy(out, aux_data[a].data() + new_index * bytes, bytes);
      } else if (spec.codec != KvCodec::kNone) {
        // Quantised here, so the checksum covers the stored bytes. Cannot fail: ValidatePut
        // checked the spec and the tensors' sizes.
        const absl::Status encoded =
            EncodeRecord(spec, {kv.k[record].data() + token_offset * token_bytes, half},
                         {kv.v[record].data() + token_offset * token_bytes, half}, {out, bytes});
        CKV_CHECK(encoded.ok());
      } else {
        std::memcpy(out, kv.k[record].data() + token_offset * token_bytes, half);
        std::memcpy(out + half, kv.v[record].data() + token_offset * token_bytes, half);
      }
      if (slot_stride > bytes) std::memset(out + bytes, 0, slot_stride - bytes);
      (*checksums)[new_index][record] = RecordChecksum(out, bytes);
    }
  }
}

// True when the records of band `band` can be written straight from the caller's tensors: a layer
// band whose K and V halves are whole blocks of the file (slots need no padding) at addresses
// aligned to a block. The block is at least 4 KiB whatever the file allows: ext4 serialises
// direct writes from memory aligned below its block size.
bool DirectBand(const Segment& seg, uint32_t band, const ModelSpec& spec, const KvTensors& kv,
                size_t alignment) {
  if (band >= seg.layer_bands() || spec.codec != KvCodec::kNone) return false;  // encoded: staged
  const size_t half = size_t{spec.chunk_tokens} * spec.TokenBytesPerLayer();
  const size_t block = std::max(alignment, io::kDirectIoAlignment);
  if (half % block != 0 || seg.record_stride(band) != 2 * half) return false;
  const uint32_t first = seg.first_record_of_band(band);
  for (uint32_t l = first; l < first + seg.records_in_band(band); ++l) {
    if (reinterpret_cast<uintptr_t>(kv.k[l].data()) % block != 0 ||
        reinterpret_cast<uintptr_t>(kv.v[l].data()) % block != 0) {
      return false;
    }
  }
  return true;
}

// The pieces of a gathered write of `count` consecutive new chunks in a DirectBand: each record's
// K then V half, straight from the caller's tensors, in slot order. Sets their checksums (over
// the same bytes the kernel will read).
void GatherBand(const Segment& seg, uint32_t band, const ModelSpec& spec, const KvTensors& kv,
                size_t first_new, size_t first_chunk, uint32_t count, XXH3_state_t* hash,
                std::vector<io::IoPiece>* pieces, std::vector<std::vector<uint64_t>>* checksums) {
  const size_t token_bytes = spec.TokenBytesPerLayer();
  const size_t half = size_t{spec.chunk_tokens} * token_bytes;
  const uint32_t first_record = seg.first_record_of_band(band);
  const uint32_t records = seg.records_in_band(band);
  pieces->clear();
  for (uint32_t i = 0; i < count; ++i) {
    const size_t new_index = first_new + i;
    const size_t at = (first_chunk + new_index) * spec.chunk_tokens * token_bytes;
    for (uint32_t l = first_record; l < first_record + records; ++l) {
      const std::byte* k = kv.k[l].data() + at;
      const std::byte* v = kv.v[l].data() + at;
      pieces->push_back(io::IoPiece{k, half});
      pieces->push_back(io::IoPiece{v, half});
      (*checksums)[new_index][l] = RecordChecksum2(hash, k, half, v, half);
    }
  }
}

}  // namespace

absl::Status ChunkStore::WriteChunks(const ModelSpec& spec, const KvTensors& kv, size_t first_chunk,
                                     const std::vector<PlannedRun>& plan,
                                     const std::vector<std::vector<std::byte>>& aux_data,
                                     const std::function<void()>& aux_ready,
                                     std::vector<std::vector<uint64_t>>* checksums,
                                     uint64_t* bytes_written, uint64_t* still_needed) {
  // Reserve the blocks first: one fallocate per band run instead of block-by-block allocation
  // under each direct write, and a full disk is found before any data moves. When it is full,
  // the blocks not yet reserved are what the Put still needs (RetryOnFullDisk makes that much
  // room).
  uint64_t new_bytes = 0;
  for (const PlannedRun& r : plan) {
    if (!r.kept) new_bytes += r.run.count * r.segment->chunk_bytes();
  }
  uint64_t allocated = 0;
  for (const PlannedRun& r : plan) {
    if (r.kept) continue;  // written over: its blocks are allocated already
    for (uint32_t band = 0; band < r.segment->bands(); ++band) {
      const uint64_t length = r.run.count * r.segment->band_slot_bytes(band);
      absl::Status s =
          r.segment->file()->Allocate(r.segment->BandOffset(band, r.run.start), length);
      if (absl::IsUnimplemented(s)) break;  // the writes allocate instead
      if (!s.ok() && IsNoSpace(s)) *still_needed = new_bytes - std::min(new_bytes, allocated);
      CKV_RETURN_IF_ERROR(s);
      allocated += length;
    }
  }
  // The staging buffers and the queue are the lane's: this Put streams through them, whatever
  // its size, refilling each buffer once its write completes.
  CKV_ASSIGN_OR_RETURN(io::StagingPool::Lease lease, staging_->LeaseLane());
  io::IoQueue* const queue = lease.queue();
  const std::span<std::byte* const> buffers = lease.buffers();
  std::vector<size_t> free_buffers;
  for (size_t i = buffers.size(); i > 0; --i) free_buffers.push_back(i - 1);
  // The pieces of gathered writes (records written straight from the caller's tensors, see
  // DirectBand), one set per buffer: a gathered write holds a buffer's turn, not its memory, so
  // the lane bounds those in flight too.
  std::vector<std::vector<io::IoPiece>> piece_sets(buffers.size());
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash(XXH3_createState(),
                                                                       &XXH3_freeState);
  if (hash == nullptr) {
    return absl::ResourceExhaustedError("Put: no memory for the checksum state (XXH3_createState)");
  }
  // A band of one chunk larger than a staging buffer (or a file aligned beyond the pool's
  // alignment) is staged in a buffer of its own, written alone: rare, and still bounded.
  io::AlignedBuffer own;
  absl::Status first_error;
  uint64_t written = 0;
  auto on_done = [&](size_t bi, size_t io_bytes, bool direct) {
    return [&, bi, io_bytes, direct](const absl::Status& st) {
      if (!st.ok() && first_error.ok()) first_error = st;
      if (st.ok()) written += io_bytes;
      if (st.ok() && direct) put_direct_bytes_.fetch_add(io_bytes, std::memory_order_relaxed);
      // Each write completes once, so its buffer comes back once.
      CKV_DCHECK(std::find(free_buffers.begin(), free_buffers.end(), bi) == free_buffers.end());
      if (bi != SIZE_MAX) free_buffers.push_back(bi);
    };
  };
  // On any return, nothing may stay in flight from the lane's buffers; a queue that failed
  // itself is dropped, so the next Put of the lane makes a new one.
  auto fail_queue = [&](absl::Status s) {
    lease.DiscardQueue();
    return s;
  };
  bool aux_waited = false;
  for (const PlannedRun& r : plan) {
    Segment* seg = r.segment;
    const size_t alignment = seg->file()->alignment();
    for (uint32_t band = 0; band < seg->bands() && first_error.ok(); ++band) {
      if (band >= seg->layer_bands() && !aux_waited) {
        aux_ready();
        aux_waited = true;
      }
      const uint64_t band_slot = seg->band_slot_bytes(band);
      const bool direct = options_.put_direct_writes && DirectBand(*seg, band, spec, kv, alignment);
      uint32_t per_io = static_cast<uint32_t>(std::max<uint64_t>(
          1, std::min<uint64_t>(options_.max_write_bytes, staging_->buffer_bytes()) / band_slot));
      if (direct) {
        per_io = static_cast<uint32_t>(std::max<uint64_t>(
            1, std::min<uint64_t>(options_.max_write_bytes / band_slot,
                                  io::kMaxIoPieces / (2 * seg->records_in_band(band)))));
      }
      for (uint32_t s0 = 0; s0 < r.run.count && first_error.ok(); s0 += per_io) {
        const uint32_t count = std::min(per_io, r.run.count - s0);
        const size_t io_bytes = count * band_slot;
        const bool pooled = direct || (io_bytes <= staging_->buffer_bytes() &&
                                       io::StagingPool::kBufferAlignment % alignment == 0);
        size_t bi = SIZE_MAX;
        std::byte* buf = nullptr;
        if (pooled) {
          // Wait for a buffer: a write of this Put completes and gives its buffer back.
          for (int waits = 0; free_buffers.empty(); ++waits) {
            CKV_DCHECK(waits < (1 << 20));  // each Reap(true) completes at least one write
            if (absl::Status s = queue->Reap(/*wait=*/true); !s.ok()) return fail_queue(s);
          }
          bi = free_buffers.back();
          free_buffers.pop_back();
          buf = buffers[bi];
        } else {
          if (absl::Status s = queue->Drain(); !s.ok()) return fail_queue(s);
          if (own.size() < io_bytes) {
            absl::StatusOr<io::AlignedBuffer> bigger =
                io::AlignedBuffer::Allocate(io_bytes, alignment);
            if (!bigger.ok()) return fail_queue(bigger.status());
            own = std::move(*bigger);
          }
          buf = own.data();
        }
        io::IoOp op;
        op.kind = io::IoOp::Kind::kWrite;
        op.file = seg->file();
        op.offset = seg->BandOffset(band, r.run.start + s0);
        op.length = io_bytes;
        if (direct) {
          GatherBand(*seg, band, spec, kv, r.first + s0, first_chunk, count, hash.get(),
                     &piece_sets[bi], checksums);
          op.gather = piece_sets[bi];
        } else {
          StageBand(*seg, band, spec, kv, aux_data, r.first + s0, first_chunk, count, buf,
                    checksums);
          op.buffer = buf;
          op.buffer_index = pooled ? lease.buffer_index(bi) : io::kNoIoSlot;
        }
        if (absl::Status s = queue->Submit(op, on_done(bi, io_bytes, direct)); !s.ok()) {
          return fail_queue(s);
        }
      }
    }
    if (!first_error.ok()) break;
  }
  if (absl::Status s = queue->Drain(); !s.ok()) return fail_queue(s);
  CKV_RETURN_IF_ERROR(first_error);
  *bytes_written = written;
  return absl::OkStatus();
}

}  // namespace ckv::storage
