// SPDX-License-Identifier: Apache-2.0
// tests/reliability/crash_workload.h: the seeded mix of operations that crash tests interrupt.
//
// A Workload drives an Engine one operation at a time and reports every operation through `say`
// (one line, crash_spec.h's Format) as soon as the call returned OK, before the next begins; the
// crash child writes the lines to its stdout, the in-process crash test keeps them. A reported
// line is acknowledged: a crash after it must not undo it. Every operation is announced before
// it begins, so that the parent knows what a crash may have cut short (and counts the crashes
// that landed inside an operation).
//
//   putting <seed> <chunks> <shared> 0       before a Put begins
//   put     <seed> <chunks> <shared> 0       the Put returned OK
//   deleting <seed> <chunks> <shared> 0      before a Delete begins
//   del     <seed> <chunks> <shared> 0       the Delete returned OK
//   delmissed <seed> <chunks> <shared> 0     (capped) the Delete found no such prefix: eviction
//                                            (the background reclaimer's) cut it meanwhile
//   reprefilling <seed> <chunks> <shared> 0  before a Re-Prefill session begins
//   reprefill <seed> <chunks> <shared> <F>   a Re-Prefill session over the prefix finished (I and
//                                            F persisted); F is the sum of loads over its chunks
//                                            when it is whole, else 0
//   gcing   0 0 0 0                          before Engine::Gc
//   gc      0 0 0 <bytes reclaimed>          Engine::Gc returned OK
//   removing <key hex> <key hex> ...         the store is about to commit the removal of these
//                                            chunks (eviction, or a Delete): the eviction ledger
//   removed                                  that removal is committed
//
// The removal lines come from the store itself (ChunkStore::SetRemovalObserver), written from
// inside the operation, before and after its catalog commit, or from the store's background
// reclaimer at any moment (under the store's lock, so one batch at a time): the parent never
// takes the child's own Lookup as the truth about what is stored. `say` must therefore be
// thread-safe.
//
// Every record a session serves is compared with the generator; a mismatch is a failed Step
// (DataLoss), which makes the child exit and the test fail.
//
// Thread-safety: one thread drives a Workload.
#ifndef CKV_TESTS_CRASH_WORKLOAD_H_
#define CKV_TESTS_CRASH_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckv/chunk_key.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/internal.h"
#include "storage/chunk_store.h"
#include "tests/reliability/crash_spec.h"
#include "tests/served_bytes.h"
#include "tools/synthetic_kv.h"

namespace ckv::crash {

// A prefix the workload may delete or run a session over, and its leading chunks last seen.
struct Known {
  Prefix prefix;
  uint64_t matched = 0;
};

class Workload {
 public:
  using Say = std::function<void(const std::string& line)>;

  // `seed` seeds the mix and names this workload's prefixes (seed * 100000 + i). `capped`: the
  // store has a cap, so Puts may evict and are followed by match lines. `known`: prefixes an
  // earlier process stored (the parent's view), usable by Deletes and sessions.
  Workload(Engine& engine, Mode mode, uint64_t seed, bool capped, std::vector<Known> known, Say say)
      : engine_(engine),
        spec_(Spec()),
        mode_(mode),
        seed_(seed),
        capped_(capped),
        known_(std::move(known)),
        say_(std::move(say)),
        rng_(seed * 0x9e3779b97f4a7c15ull + 1) {
    engine::HostOf(engine_).store().SetRemovalObserver(
        [say = say_](const storage::ChunkStore::RemovalEvent& e) {
          if (e.phase == storage::ChunkStore::RemovalEvent::Phase::kCommitted) {
            say("removed");
            return;
          }
          std::string line = "removing";
          for (const ChunkKey& k : e.keys) absl::StrAppend(&line, " ", k.ToHex());
          say(line);
        });
  }
  ~Workload() { engine::HostOf(engine_).store().SetRemovalObserver(nullptr); }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  // Runs one operation. An error is the operation's (the workload stops there).
  absl::Status Step() {
    const uint64_t r = Next() % 100;
    if (mode_ == Mode::kPuts) {
      if (!known_.empty() && r < 20) return DeleteOne();
      return PutOne();
    }
    if (known_.empty() || r < 45) return PutOne();
    if (r < 60) return DeleteOne();
    if (r < 92) return SessionOne();
    return GcOnce();
  }

 private:
  uint64_t Next() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  }

  absl::Status PutOne() {
    Prefix p;
    p.seed = seed_ * 100000 + i_++;
    p.chunks = 2 + Next() % 6;
    p.shared_chunks = (Next() % 2 == 0) ? std::min<uint64_t>(p.chunks - 1, 1 + Next() % 3) : 0;
    const auto tokens = TokensOf(spec_, p);
    synth::SyntheticKv kv(spec_, tokens);
    say_(Format("putting", p));
    auto put = engine_.Put(spec_, tokens, kv.tensors());
    if (!put.ok()) return put.status();
    say_(Format("put", p));
    known_.push_back({p, p.chunks});
    return ReportMatches();
  }

  // With a cap, after a Put or a Delete: notes (for this workload's choices only) how many
  // leading chunks of each prefix are still stored. A Put's eviction shortens prefixes; and once
  // eviction has cut a prefix back to chunks that only another prefix holds (a shared system
  // prompt, say), a Delete of that other prefix takes them too. The parent learns of both from
  // the removal lines, not from here.
  absl::Status ReportMatches() {
    if (!capped_) return absl::OkStatus();
    for (Known& k : known_) {
      auto n = engine_.Lookup(spec_, TokensOf(spec_, k.prefix));
      if (!n.ok()) return n.status();
      k.matched = *n;
    }
    return absl::OkStatus();
  }

  absl::Status DeleteOne() {
    const size_t victim = Next() % known_.size();
    const Known k = known_[victim];
    if (k.matched != k.prefix.chunks) return SessionOne();  // evicted in part: no such prefix
    // Announced first: a kill between the Delete's commit and its acknowledgement leaves the
    // parent unsure whether it happened.
    say_(Format("deleting", k.prefix));
    absl::Status deleted = engine_.Delete(spec_, TokensOf(spec_, k.prefix));
    if (capped_ && absl::IsNotFound(deleted)) {
      // The reclaimer evicted part of it since ReportMatches looked: no such prefix any more.
      say_(Format("delmissed", k.prefix));
      return ReportMatches();
    }
    CKV_RETURN_IF_ERROR(deleted);
    known_.erase(known_.begin() + victim);
    say_(Format("del", k.prefix));
    return ReportMatches();
  }

  absl::Status SessionOne() {
    const Known& k = known_[Next() % known_.size()];
    const ReprefillOptions options = SessionOptions();
    const auto tokens = TokensOf(spec_, k.prefix);
    const auto keys = ChainChunkKeys(spec_.Fingerprint(), spec_.chunk_tokens, tokens);
    say_(Format("reprefilling", k.prefix));
    auto session = engine_.BeginReprefill(spec_, tokens, options);
    if (!session.ok()) return session.status();
    std::vector<std::byte> want(spec_.RecordBytes());
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      const std::vector<float> q = Queries(spec_, options, seed_ + i_, layer);
      CKV_RETURN_IF_ERROR((*session)->SubmitQueries(layer, q));
      auto view = (*session)->AwaitLayer(layer);
      if (!view.ok()) return view.status();
      for (const LayerView::Record& rec : view->records()) {
        synth::FillRecord(spec_, keys[rec.chunk], layer, want);
        if (!::ckv::testing::ServedEquals(rec, want.data(), want.size())) {
          return absl::DataLossError(absl::StrCat("session over prefix ", k.prefix.seed,
                                                  " served chunk ", rec.chunk, " layer ", layer,
                                                  " with bytes the generator did not make"));
        }
      }
    }
    auto stats = (*session)->Finish();
    if (!stats.ok()) return stats.status();
    uint64_t loads = 0;
    auto matched = engine_.Lookup(spec_, tokens);
    if (!matched.ok()) return matched.status();
    if (*matched == k.prefix.chunks) {
      auto described = engine_.DescribePrefix(keys[k.prefix.chunks - 1]);
      if (capped_ && absl::IsNotFound(described.status())) {
        // Evicted in part by the reclaimer since the Lookup: F is not reported (0).
      } else if (!described.ok()) {
        return described.status();
      } else {
        for (const ChunkPlacement& c : described->chunks) loads += c.loads;
      }
    }
    ++i_;  // a new query seed for the next session
    say_(Format("reprefill", k.prefix, loads));
    return absl::OkStatus();
  }

  absl::Status GcOnce() {
    say_(Format("gcing", Prefix{}));
    auto gc = engine_.Gc();
    if (!gc.ok()) return gc.status();
    say_(Format("gc", Prefix{}, gc->bytes_reclaimed));
    return absl::OkStatus();
  }

  Engine& engine_;
  const ModelSpec spec_;
  const Mode mode_;
  const uint64_t seed_;
  const bool capped_;
  std::vector<Known> known_;
  Say say_;
  uint64_t rng_;
  uint64_t i_ = 0;
};

}  // namespace ckv::crash

#endif  // CKV_TESTS_CRASH_WORKLOAD_H_
