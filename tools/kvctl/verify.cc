// SPDX-License-Identifier: Apache-2.0
// kvctl verify: read back every record, check its checksum and the catalog; --synthetic compares
// with the generator, --repair removes what is corrupt.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/internal.h"
#include "ckv/log.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"
#include "tools/kvctl/progress.h"
#include "tools/synthetic_kv.h"

namespace ckv::kvctl {
namespace {

struct VerifyOptions {
  std::string store;
  bool synthetic = false;
  bool repair = false;
  std::string remote;  // --remote: also check the cluster's copy of every chunk
  cli::JsonOutput json;
};

// One problem verify reports: the store's (Engine::Verify's kinds: "checksum", "unreadable",
// "damaged", "inconsistent"), the comparison with the generator's ("generator"), or the
// cluster's ("remote").
struct Problem {
  std::string kind;
  std::optional<ChunkKey> chunk;
  std::optional<uint32_t> layer;
  std::string message;
};

Problem FromStore(const VerifyProblem& p) {
  Problem out{VerifyProblemKindName(p.kind), std::nullopt, std::nullopt, p.message};
  if (!p.chunk.IsZero()) out.chunk = p.chunk;
  if (p.layer != VerifyProblem::kNoLayer) out.layer = p.layer;
  return out;
}

struct ContentReport {
  uint64_t records_compared = 0;
  uint64_t bytes_compared = 0;
  std::vector<Problem> problems;
};

// Reads every record of every stored prefix once and compares it with synth::FillRecord.
absl::StatusOr<ContentReport> CompareWithGenerator(Engine& engine) {
  ContentReport report;
  struct Work {
    ChunkKey prefix;
    ModelSpec spec;
    std::vector<ChunkKey> chunks;
  };
  std::vector<Work> work;
  uint64_t total_bytes = 0;
  std::set<std::pair<ChunkKey, ChunkKey>> seen;  // (fingerprint, chunk): shared chunks once
  for (const PrefixInfo& p : engine.ListPrefixes()) {
    Work w;
    w.prefix = p.id;
    auto chunks = engine.PrefixChunks(p.id, &w.spec);
    if (absl::IsNotFound(chunks.status())) continue;  // evicted or deleted meanwhile
    if (!chunks.ok()) return chunks.status();
    const ChunkKey fingerprint = w.spec.Fingerprint();
    for (const ChunkKey& key : *chunks) {
      if (seen.insert({fingerprint, key}).second) w.chunks.push_back(key);
    }
    total_bytes += static_cast<uint64_t>(w.chunks.size()) * w.spec.layers * w.spec.RecordBytes();
    work.push_back(std::move(w));
  }

  ProgressBar bar("compare", total_bytes);
  uint64_t done = 0;
  for (const Work& w : work) {
    std::vector<std::byte> stored(w.spec.RecordBytes()), expected(w.spec.RecordBytes());
    for (size_t i = 0; i < w.chunks.size(); ++i) {
      for (uint32_t layer = 0; layer < w.spec.layers; ++layer) {
        const absl::Status read = engine.ReadRecord(w.spec, w.chunks[i], layer, stored);
        done += stored.size();
        bar.Update(done);
        if (absl::IsNotFound(read)) continue;  // evicted meanwhile
        // A checksum mismatch is already among Verify's problems: do not list it twice.
        if (absl::IsDataLoss(read)) continue;
        if (!read.ok()) {
          report.problems.push_back(
              Problem{"unreadable", w.chunks[i], layer,
                      absl::StrCat("record ", w.chunks[i].ToHex(), "/L", layer, " of prefix ",
                                   w.prefix.ToHex(), ": ", read.ToString())});
          continue;
        }
        synth::FillStoredRecord(w.spec, w.chunks[i], layer, expected);
        ++report.records_compared;
        report.bytes_compared += stored.size();
        if (stored != expected) {
          const auto mismatch = std::mismatch(stored.begin(), stored.end(), expected.begin());
          report.problems.push_back(
              Problem{"generator", w.chunks[i], layer,
                      absl::StrCat("record ", w.chunks[i].ToHex(), "/L", layer, " of prefix ",
                                   w.prefix.ToHex(), " (chunk ", i,
                                   "): differs from the generator at byte ",
                                   mismatch.first - stored.begin())});
        }
      }
    }
  }
  bar.Finish();
  return report;
}

// What verify found: Engine::Verify's (or Repair's) report, and the comparison's.
struct VerifyFigures {
  VerifyReport report;
  std::optional<RepairReport> repaired;
  ContentReport content;
  std::optional<engine::RemoteCheckReport> remote;  // with --remote
  std::vector<Problem> problems;                    // all of them
  double seconds = 0;
};

// Engine::Verify, or Engine::Repair with --repair, with a progress bar.
absl::Status CheckStore(Engine& engine, bool repair, VerifyFigures* f) {
  ProgressFnBar bar(repair ? "repair" : "verify");
  if (repair) {
    absl::StatusOr<RepairReport> r = engine.Repair(bar.fn());
    bar.Finish();
    if (!r.ok()) return r.status();
    f->repaired = *std::move(r);
    f->report = f->repaired->verify;
    return absl::OkStatus();
  }
  absl::StatusOr<VerifyReport> r = engine.Verify(bar.fn());
  bar.Finish();
  if (!r.ok()) return r.status();
  f->report = *std::move(r);
  return absl::OkStatus();
}

int PrintVerifyJson(const VerifyOptions& o, const VerifyFigures& f) {
  const VerifyReport& report = f.report;
  tools::JsonWriter w;
  w.BeginObject()
      .Key("store")
      .String(o.store)
      .Key("ok")
      .Bool(f.problems.empty())
      .Key("chunks_checked")
      .Uint(report.chunks_checked)
      .Key("records_checked")
      .Uint(report.records_checked)
      .Key("bytes_checked")
      .Uint(report.bytes_checked)
      .Key("checksum_failures")
      .Uint(report.checksum_failures);
  if (o.synthetic) {
    w.Key("records_compared")
        .Uint(f.content.records_compared)
        .Key("bytes_compared")
        .Uint(f.content.bytes_compared);
  }
  if (f.remote) {
    w.Key("remote")
        .BeginObject()
        .Key("chunks_checked")
        .Uint(f.remote->chunks_checked)
        .Key("present")
        .Uint(f.remote->present)
        .Key("missing")
        .Uint(f.remote->missing)
        .Key("corrupt")
        .Uint(f.remote->corrupt)
        .Key("differing")
        .Uint(f.remote->differing)
        .Key("unreachable")
        .Uint(f.remote->unreachable)
        .EndObject();
  }
  w.Key("seconds").Double(f.seconds).Key("problems").BeginArray();
  for (const Problem& p : f.problems) {
    w.BeginObject().Key("kind").String(p.kind).Key("chunk");
    if (p.chunk) {
      w.String(p.chunk->ToHex());
    } else {
      w.Null();
    }
    w.Key("layer");
    if (p.layer) {
      w.Uint(*p.layer);
    } else {
      w.Null();
    }
    w.Key("message").String(p.message).EndObject();
  }
  w.EndArray();
  if (f.repaired) {
    w.Key("repair").BeginObject().Key("chunks_removed").Uint(f.repaired->chunks_removed);
    w.Key("removed").BeginArray();
    for (const std::string& r : f.repaired->removed) w.String(r);
    w.EndArray().Key("remaining").BeginArray();
    for (const std::string& r : f.repaired->remaining) w.String(r);
    w.EndArray().EndObject();
  }
  w.EndObject();
  return EmitJson(o.json, w);
}

void PrintVerifyText(const VerifyOptions& o, const VerifyFigures& f) {
  const VerifyReport& report = f.report;
  const std::vector<Problem>& problems = f.problems;
  std::printf("verified %s: %llu chunks, %llu records, %s in %.2fs; %llu checksum failure%s\n",
              o.store.c_str(), static_cast<unsigned long long>(report.chunks_checked),
              static_cast<unsigned long long>(report.records_checked),
              FormatBytes(report.bytes_checked).c_str(), f.seconds,
              static_cast<unsigned long long>(report.checksum_failures),
              report.checksum_failures == 1 ? "" : "s");
  if (o.synthetic) {
    std::printf("compared %llu records (%s) with the synthetic generator\n",
                static_cast<unsigned long long>(f.content.records_compared),
                FormatBytes(f.content.bytes_compared).c_str());
  }
  if (f.remote) {
    std::printf(
        "remote: %llu chunks checked in the cluster: %llu present and equal, %llu missing, "
        "%llu corrupt, %llu differing, %llu unreachable\n",
        static_cast<unsigned long long>(f.remote->chunks_checked),
        static_cast<unsigned long long>(f.remote->present),
        static_cast<unsigned long long>(f.remote->missing),
        static_cast<unsigned long long>(f.remote->corrupt),
        static_cast<unsigned long long>(f.remote->differing),
        static_cast<unsigned long long>(f.remote->unreachable));
  }
  if (problems.empty()) {
    std::printf("clean\n");
  } else {
    std::printf("%zu problem%s:\n", problems.size(), problems.size() == 1 ? "" : "s");
    for (const Problem& p : problems) std::printf("  %s\n", Printable(p.message).c_str());
  }
  if (f.repaired && !problems.empty()) {
    const RepairReport& repaired = *f.repaired;
    std::printf("repair removed %llu chunk%s:\n",
                static_cast<unsigned long long>(repaired.chunks_removed),
                repaired.chunks_removed == 1 ? "" : "s");
    for (const std::string& r : repaired.removed) std::printf("  %s\n", Printable(r).c_str());
    if (repaired.remaining.empty()) {
      std::printf("nothing left to repair\n");
    } else {
      std::printf("left as it was (%zu):\n", repaired.remaining.size());
      for (const std::string& r : repaired.remaining) {
        std::printf("  %s\n", Printable(r).c_str());
      }
    }
  }
}

int RunVerify(const VerifyOptions& o) {
  // Verify alone reads: it works while a serving process holds the store. Repair writes.
  // So does --remote, which needs the engine's remote tier (a read-only engine has none).
  auto engine =
      o.repair || !o.remote.empty() ? OpenExisting(o.store, o.remote) : OpenToRead(o.store);
  if (!engine.ok()) return StoreError("open " + o.store, engine.status());
  const auto start = Clock::now();
  VerifyFigures f;
  if (absl::Status s = CheckStore(**engine, o.repair, &f); !s.ok()) {
    return StoreError((o.repair ? "repair " : "verify ") + o.store, s);
  }
  for (const VerifyProblem& p : f.report.problems) f.problems.push_back(FromStore(p));
  if (o.synthetic) {
    auto compared = CompareWithGenerator(**engine);
    if (!compared.ok()) return StoreError("verify " + o.store, compared.status());
    f.content = *std::move(compared);
    f.problems.insert(f.problems.end(), f.content.problems.begin(), f.content.problems.end());
  }
  if (!o.remote.empty()) {
    // A chunk missing from the cluster is not a problem (never published, or evicted: a miss);
    // one that is there and fails verification, or differs from the local one, is.
    auto checked = engine::VerifyRemote(**engine);
    if (!checked.ok()) return StoreError("verify --remote " + o.remote, checked.status());
    f.remote = *std::move(checked);
    for (const std::string& p : f.remote->problems) {
      f.problems.push_back(Problem{"remote", std::nullopt, std::nullopt, p});
    }
    if (f.remote->unreachable > 0) {
      f.problems.push_back(
          Problem{"remote", std::nullopt, std::nullopt,
                  absl::StrCat(f.remote->unreachable,
                               " chunks could not be checked: the cluster did not answer")});
    }
  }
  f.seconds = SecondsSince(start);
  const int problems_exit = f.problems.empty() ? kExitOk : kExitProblems;
  if (o.json.enabled) {
    if (const int rc = PrintVerifyJson(o, f); rc != kExitOk) return rc;
    if (o.json.ToStdout()) return problems_exit;
  }
  PrintVerifyText(o, f);
  return problems_exit;
}

}  // namespace

Command AddVerify(CLI::App& kvctl) {
  auto o = std::make_shared<VerifyOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "verify", "Read back every record, check its checksum, and check the catalog.");
  cmd->footer(
      "Exit 0 when clean, 1 when a problem was found (each is listed), 3 when the check could not\n"
      "run. With --synthetic, also compare every record byte for byte with what the synthetic\n"
      "generator makes for its chunk key (for stores that kvctl put populated).\n"
      "With --repair, also remove what is corrupt (Engine::Repair): each chunk that failed a "
      "check\n"
      "and every chunk after it in its prefixes (a chunk's KV depends on all before it); a prefix\n"
      "that ran through one then ends at the last good chunk, under a new id. It lists what it\n"
      "removed and what it left (read errors may pass, so they are not repaired). The exit code\n"
      "is still 1 when a problem was found, repaired or not; run verify again to see it clean.\n"
      "With --remote, also fetch every chunk's value from that Redis Cluster and check it\n"
      "(docs/remote.md): a value that fails verification, or differs from the local records, is a\n"
      "problem; a chunk the cluster does not hold is counted as missing (a miss, not a problem).\n"
      "Example: kvctl verify ./store --repair");
  AddStoreArg(*cmd, &o->store);
  CLI::Option* synthetic = cmd->add_flag("--synthetic", o->synthetic,
                                         "also compare every record with the synthetic generator");
  cmd->add_flag("--repair", o->repair,
                "remove the corrupt chunks (and those after them) from the store")
      ->excludes(synthetic);
  AddRemoteOption(*cmd, &o->remote);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunVerify(*o); }};
}

}  // namespace ckv::kvctl
