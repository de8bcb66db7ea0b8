// SPDX-License-Identifier: Apache-2.0
// index_bench: how the store's index scales with the number of chunks it holds.
//
//   index_bench --store DIR [--chunks 1000000,10000000] [--prefix-chunks 2048]
//               [--cold-chains 32] [--hot-lookups 200] [--puts 50] [--chunks-per-put 4]
//               [--keep] [--json [PATH]] [--plot PNG]
//
// For each N of --chunks it builds a store DIR/index-bench-N holding N chunks of a tiny
// one-layer model (1 KV head of 64, 16-token chunks: 4 KiB records), quickly: one real Put of
// one chunk (the probe) gives the store, its spec, its segment geometry and a real chunk's
// catalog record; then the catalog is written directly (storage::Catalog batches of chunks,
// prefixes of --prefix-chunks chained chunks, and segments) while the segment files are only
// created sparse, at their full size. The chunk keys are the real chain keys of synthetic
// tokens, so Lookup finds them. The fake chunks' records were never written: their checksums
// are zero and reading one is DataLoss. Everything this benchmark times (open, Lookup, Put,
// eviction, pin) reads only the catalog and the index, never those records.
//
// Each measurement runs in a fresh process (this program, re-run with a hidden
// --measure-open): Engine::Open with a cap just over the store's use, so nothing is evicted at
// open; RSS before and after the open (VmRSS) and the peak (VmHWM); Lookup of --cold-chains
// whole prefixes no lookup touched yet (the first lookup of each after open), then
// --hot-lookups repeated lookups of one prefix; pins of as many chains, cold (other prefixes)
// and hot (one prefix again), as a Re-Prefill pins them: a pin reads the chain's catalog records
// for their checksums, which the index does not hold; then --puts Puts of --chunks-per-put new
// chunks, each of which must evict as many chunks to stay under the cap. A second process then
// opens the store again, from the index snapshot the first one's clean close left, and times its
// own close (which writes the snapshot). Memory per chunk is the RSS the first open added, divided
// by N. Catalog bytes: the size of DIR/index-bench-N/catalog on disk. The stores are removed
// afterwards unless --keep.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ckv/chunk_key.h"
#include "ckv/engine.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "engine/internal.h"
#include "storage/catalog.h"
#include "tools/cli.h"
#include "tools/json_writer.h"
#include "tools/synthetic_kv.h"

namespace ckv {
namespace {

constexpr char kProg[] = "index_bench";

struct Flags {
  std::string store;
  std::string chunks = "1000000";
  uint64_t prefix_chunks = 2048;
  uint64_t cold_chains = 32;
  uint64_t hot_lookups = 200;
  uint64_t puts = 50;
  uint64_t chunks_per_put = 4;
  bool keep = false;
  std::string plot;
  cli::JsonOutput json;
  // Hidden: measure the store at --measure-open (in a process of its own) with this cap.
  std::string measure_open;
  bool measure_reopen = false;  // only open (from the snapshot the last close left) and close
  uint64_t measure_chunks = 0;
  uint64_t cap = 0;
};

ModelSpec BenchSpec() {
  ModelSpec spec;
  spec.model_id = "index-bench-model";
  spec.layers = 1;
  spec.q_heads = 1;
  spec.kv_heads = 1;
  spec.head_dim = 64;
  spec.dtype = DType::kFp16;
  spec.chunk_tokens = 16;
  return spec;
}

// Seeds of the prefixes: prefix i of the store has tokens Tokens(kSeedBase + i, ...). The Puts
// of the measurement use seeds from kPutSeedBase, which no stored prefix uses.
constexpr uint64_t kSeedBase = 1000;
constexpr uint64_t kPutSeedBase = uint64_t{1} << 40;
constexpr uint64_t kProbeSeed = 1;

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// VmRSS / VmHWM of this process in bytes (0 when /proc says nothing).
uint64_t ProcStatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoull(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    struct stat st;
    if (e.is_regular_file(ec) && ::stat(e.path().c_str(), &st) == 0) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

// What the building of one store gives the measurement.
struct Built {
  std::string dir;
  uint64_t chunks = 0;  // fake chunks and the probe's
  uint64_t prefixes = 0;
  uint64_t segments = 0;
  uint64_t chunk_bytes = 0;
  uint64_t used_bytes = 0;
  double build_seconds = 0;
};

// Builds DIR holding `n` chunks: the probe's one and n - 1 fake ones (see the banner).
int BuildStore(const Flags& f, uint64_t n, Built* out) {
  const ModelSpec spec = BenchSpec();
  const auto start = std::chrono::steady_clock::now();
  out->dir = absl::StrFormat("%s/index-bench-%u", f.store, n);
  std::error_code ec;
  std::filesystem::remove_all(out->dir, ec);
  {
    auto engine = Engine::Open(EngineOptions{}, out->dir);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s: open %s: %s\n", kProg, out->dir.c_str(),
                   engine.status().ToString().c_str());
      return cli::kExitError;
    }
    const auto tokens = synth::Tokens(kProbeSeed, spec.chunk_tokens);
    synth::SyntheticKv kv(spec, tokens);
    auto put = (*engine)->Put(spec, tokens, kv.tensors());
    if (!put.ok()) {
      std::fprintf(stderr, "%s: probe Put: %s\n", kProg, put.status().ToString().c_str());
      return cli::kExitError;
    }
    out->chunk_bytes = (*engine)->Stats().disk_bytes_used;
  }
  storage::Catalog::Contents contents;
  auto catalog = storage::Catalog::Open(out->dir + "/catalog", /*create_if_missing=*/false,
                                        /*error_if_exists=*/false, &contents);
  if (!catalog.ok()) {
    std::fprintf(stderr, "%s: catalog of %s: %s\n", kProg, out->dir.c_str(),
                 catalog.status().ToString().c_str());
    return cli::kExitError;
  }
  std::vector<storage::ChunkRecord> probes;
  const absl::Status scanned =
      (*catalog)->ScanChunks([&](const ChunkKey& key, const storage::ChunkRecord&) -> absl::Status {
        auto full = (*catalog)->GetChunk(key);  // with its token ids
        if (!full.ok()) return full.status();
        probes.push_back(*std::move(full));
        return absl::OkStatus();
      });
  if (!scanned.ok() || probes.size() != 1 || contents.segments.size() != 1) {
    std::fprintf(stderr, "%s: the probe store holds %zu chunks in %zu segments, not 1 in 1 (%s)\n",
                 kProg, probes.size(), contents.segments.size(), scanned.ToString().c_str());
    return cli::kExitError;
  }
  const storage::ChunkRecord probe = probes[0];
  const storage::SegmentRecord geometry = contents.segments[0].second;
  const uint32_t capacity = geometry.capacity_slots;
  const uint64_t segment_file_bytes = uint64_t{capacity} * out->chunk_bytes;
  uint32_t next_segment = contents.segments[0].first + 1;
  uint32_t segment = 0;
  uint32_t slot = capacity;  // full: the first fake chunk opens a segment
  uint64_t put_seq = probe.put_seq;
  const int64_t now_ms = probe.created_unix_ms;
  uint64_t segments = 1;

  const uint64_t fake = n - 1;
  const uint64_t per_prefix = std::max<uint64_t>(1, f.prefix_chunks);
  constexpr uint64_t kChunksPerBatch = 32768;
  storage::Catalog::Batch batch = (*catalog)->NewBatch();
  uint64_t in_batch = 0;
  uint64_t prefixes = 1;  // the probe's
  for (uint64_t done = 0, p = 0; done < fake; ++p) {
    const uint64_t len = std::min(per_prefix, fake - done);
    const auto tokens = synth::Tokens(kSeedBase + p, len * spec.chunk_tokens);
    const std::vector<ChunkKey> keys = ChainChunkKeys(probe.fingerprint, spec.chunk_tokens, tokens);
    for (uint64_t i = 0; i < len; ++i) {
      if (slot == capacity) {
        segment = next_segment++;
        slot = 0;
        ++segments;
        storage::SegmentRecord seg = geometry;
        seg.created_unix_ms = now_ms;
        batch.PutSegment(segment, seg);
        const std::string path = absl::StrFormat("%s/segments/seg-%08u.ckv", out->dir, segment);
        const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
        if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(segment_file_bytes)) != 0) {
          std::fprintf(stderr, "%s: create sparse %s: %s\n", kProg, path.c_str(),
                       std::strerror(errno));
          if (fd >= 0) ::close(fd);
          return cli::kExitError;
        }
        ::close(fd);
      }
      storage::ChunkRecord r;
      r.parent = i == 0 ? ChunkKey{} : keys[i - 1];
      r.fingerprint = probe.fingerprint;
      r.depth = static_cast<uint32_t>(i);
      r.segment = segment;
      r.slot = slot++;
      r.put_seq = ++put_seq;
      r.created_unix_ms = now_ms;
      r.tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(i * spec.chunk_tokens),
                      tokens.begin() + static_cast<ptrdiff_t>((i + 1) * spec.chunk_tokens));
      // Zero: the record was never written (see the banner).
      r.checksums.assign(probe.checksums.size(), 0);
      batch.PutChunk(keys[i], r);
      ++in_batch;
    }
    storage::PrefixRecord prefix;
    prefix.fingerprint = probe.fingerprint;
    prefix.chunks = len;
    prefix.created_unix_ms = now_ms;
    batch.PutPrefix(keys[len - 1], prefix);
    ++prefixes;
    done += len;
    if (in_batch >= kChunksPerBatch || done == fake) {
      // The segment files exist before the catalog names them, as a Put would leave them.
      if (absl::Status s = (*catalog)->Commit(batch); !s.ok()) {
        std::fprintf(stderr, "%s: commit: %s\n", kProg, s.ToString().c_str());
        return cli::kExitError;
      }
      batch = (*catalog)->NewBatch();
      in_batch = 0;
    }
  }
  catalog->reset();
  out->chunks = n;
  out->prefixes = prefixes;
  out->segments = segments;
  out->used_bytes = n * out->chunk_bytes;
  out->build_seconds = Seconds(start, std::chrono::steady_clock::now());
  return cli::kExitOk;
}

// One size's figures.
struct Row {
  uint64_t chunks = 0, prefixes = 0, segments = 0;
  double build_s = 0;
  double open_s = 0;
  uint64_t rss_before = 0, rss_after = 0, hwm = 0;
  double cold_p50_ms = 0, cold_p99_ms = 0, hot_p50_ms = 0, hot_p99_ms = 0;
  double pin_cold_p99_ms = 0, pin_hot_p99_ms = 0;  // pins of the same chains (catalog reads)
  // The open after the measurement's clean close, and that open's own close (which writes it).
  double reopen_s = 0, close_s = 0;
  uint64_t reopen_rss = 0;
  bool reopen_from_snapshot = false;
  uint64_t lookup_chain_chunks = 0, cold_chains = 0, hot_lookups = 0;
  uint64_t puts = 0, put_chunks = 0, evicted = 0;
  double put_s = 0;
  uint64_t catalog_bytes = 0;
  uint64_t index_bytes = 0;  // EngineStats::index_memory_bytes after the open
  double IndexBytesPerChunk() const {
    return chunks == 0 ? 0 : static_cast<double>(index_bytes) / static_cast<double>(chunks);
  }
  double RssBytesPerChunk() const {
    return chunks == 0 ? 0
                       : static_cast<double>(rss_after - std::min(rss_after, rss_before)) /
                             static_cast<double>(chunks);
  }
  double PutsPerSecond() const { return put_s > 0 ? static_cast<double>(puts) / put_s : 0; }
  double EvictedPerSecond() const { return put_s > 0 ? static_cast<double>(evicted) / put_s : 0; }
};

// The child: measures the store at f.measure_open and prints one line "MEASURE ..." on stdout.
int MeasureOpen(const Flags& f) {
  const ModelSpec spec = BenchSpec();
  const uint64_t rss_before = ProcStatusBytes("VmRSS");
  EngineOptions options;
  options.create_if_missing = false;
  options.max_disk_bytes = f.cap;
  options.reclaim_margin_bytes = 0;  // every Put evicts inline, inside the timed call
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = Engine::Open(options, f.measure_open);
  const auto t1 = std::chrono::steady_clock::now();
  if (!engine.ok()) {
    std::fprintf(stderr, "%s: open %s: %s\n", kProg, f.measure_open.c_str(),
                 engine.status().ToString().c_str());
    return cli::kExitError;
  }
  const uint64_t rss_after = ProcStatusBytes("VmRSS");
  const uint64_t hwm = ProcStatusBytes("VmHWM");
  const EngineStats opened = (*engine)->Stats();
  if (f.measure_reopen) {
    const auto c0 = std::chrono::steady_clock::now();
    engine->reset();  // writes the index snapshot
    const auto c1 = std::chrono::steady_clock::now();
    std::printf("REOPEN %.9f %llu %d %.9f %llu\n", Seconds(t0, t1),
                static_cast<unsigned long long>(rss_after - std::min(rss_after, rss_before)),
                opened.index_from_snapshot ? 1 : 0, Seconds(c0, c1),
                static_cast<unsigned long long>(opened.chunks));
    return cli::kExitOk;
  }
  if (opened.chunks != f.measure_chunks) {
    std::fprintf(stderr, "%s: the store opened with %llu chunks, not %llu\n", kProg,
                 static_cast<unsigned long long>(opened.chunks),
                 static_cast<unsigned long long>(f.measure_chunks));
    return cli::kExitError;
  }

  // Whole prefixes (the last ones may be shorter, and the probe's is one chunk: skip it).
  const uint64_t per_prefix = std::max<uint64_t>(1, f.prefix_chunks);
  const uint64_t full_prefixes = (f.measure_chunks - 1) / per_prefix;
  const uint64_t chain = full_prefixes > 0 ? per_prefix : (f.measure_chunks - 1);
  const uint64_t available = std::max<uint64_t>(1, full_prefixes);
  auto lookup = [&](uint64_t p, double* ms) -> bool {
    const auto tokens = synth::Tokens(kSeedBase + p, chain * spec.chunk_tokens);
    const auto a = std::chrono::steady_clock::now();
    auto got = (*engine)->Lookup(spec, tokens);
    const auto b = std::chrono::steady_clock::now();
    if (!got.ok() || *got != chain) {
      std::fprintf(stderr, "%s: Lookup of prefix %llu: %s\n", kProg,
                   static_cast<unsigned long long>(p),
                   got.ok() ? absl::StrFormat("%u of %u chunks", *got, chain).c_str()
                            : got.status().ToString().c_str());
      return false;
    }
    *ms = Seconds(a, b) * 1e3;
    return true;
  };
  // Cold: prefixes spread over the store, each looked up once, first after the open.
  const uint64_t cold = std::min(f.cold_chains, available);
  std::vector<double> cold_ms;
  for (uint64_t i = 0; i < cold; ++i) {
    double ms = 0;
    if (!lookup(i * available / cold, &ms)) return cli::kExitError;
    cold_ms.push_back(ms);
  }
  // Hot: one prefix again and again.
  std::vector<double> hot_ms;
  for (uint64_t i = 0; i < f.hot_lookups; ++i) {
    double ms = 0;
    if (!lookup(0, &ms)) return cli::kExitError;
    hot_ms.push_back(ms);
  }
  // Pins of the same chains, as a Re-Prefill pins them: the records' checksums are not in memory,
  // so each pin reads the chain's catalog records (cold: other prefixes than those looked up).
  storage::ChunkStore& store = engine::HostOf(**engine).store();
  auto pin = [&](uint64_t p, double* ms) -> bool {
    const auto tokens = synth::Tokens(kSeedBase + p, chain * spec.chunk_tokens);
    const std::vector<ChunkKey> keys =
        ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, tokens);
    const auto a = std::chrono::steady_clock::now();
    auto pinned = store.PinLeading(spec, keys);
    const auto b = std::chrono::steady_clock::now();
    if (!pinned.ok() || (*pinned)->chunks().size() != chain) {
      std::fprintf(
          stderr, "%s: pin of prefix %llu: %s\n", kProg, static_cast<unsigned long long>(p),
          pinned.ok()
              ? absl::StrFormat("%u of %u chunks", (*pinned)->chunks().size(), chain).c_str()
              : pinned.status().ToString().c_str());
      return false;
    }
    *ms = Seconds(a, b) * 1e3;
    return true;
  };
  std::vector<double> pin_cold_ms, pin_hot_ms;
  for (uint64_t i = 0; i < cold; ++i) {
    double ms = 0;
    if (!pin((i * available / cold + available / (2 * cold)) % available, &ms)) {
      return cli::kExitError;
    }
    pin_cold_ms.push_back(ms);
  }
  for (uint64_t i = 0; i < f.hot_lookups; ++i) {
    double ms = 0;
    if (!pin(0, &ms)) return cli::kExitError;
    pin_hot_ms.push_back(ms);
  }

  const EngineStats before = (*engine)->Stats();
  double put_s = 0;
  for (uint64_t i = 0; i < f.puts; ++i) {
    const auto tokens = synth::Tokens(kPutSeedBase + i, f.chunks_per_put * spec.chunk_tokens);
    synth::SyntheticKv kv(spec, tokens);
    const auto a = std::chrono::steady_clock::now();
    auto put = (*engine)->Put(spec, tokens, kv.tensors());
    const auto b = std::chrono::steady_clock::now();
    if (!put.ok()) {
      std::fprintf(stderr, "%s: Put %llu: %s\n", kProg, static_cast<unsigned long long>(i),
                   put.status().ToString().c_str());
      return cli::kExitError;
    }
    put_s += Seconds(a, b);
  }
  const EngineStats after = (*engine)->Stats();
  std::printf(
      "MEASURE %.9f %llu %llu %llu %.6f %.6f %.6f %.6f %llu %llu %llu %llu %.9f %llu %.6f %.6f\n",
      Seconds(t0, t1), static_cast<unsigned long long>(rss_before),
      static_cast<unsigned long long>(rss_after), static_cast<unsigned long long>(hwm),
      Percentile(cold_ms, 0.5), Percentile(cold_ms, 0.99), Percentile(hot_ms, 0.5),
      Percentile(hot_ms, 0.99), static_cast<unsigned long long>(chain),
      static_cast<unsigned long long>(cold),
      static_cast<unsigned long long>(after.chunks_written - before.chunks_written),
      static_cast<unsigned long long>(after.chunks_evicted - before.chunks_evicted), put_s,
      static_cast<unsigned long long>(opened.index_memory_bytes), Percentile(pin_cold_ms, 0.99),
      Percentile(pin_hot_ms, 0.99));
  return cli::kExitOk;
}

// Runs `cmd` (this program with --measure-open) and calls `parse` on each line it prints; true
// when `parse` accepted one and the child succeeded.
bool RunChild(const std::string& cmd, const std::string& dir,
              const std::function<bool(const char* line)>& parse) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    std::fprintf(stderr, "%s: cannot run %s\n", kProg, cmd.c_str());
    return false;
  }
  char line[1024];
  bool got = false;
  while (std::fgets(line, sizeof line, p) != nullptr) got = parse(line) || got;
  const int status = pclose(p);
  if (!got || status != 0) {
    std::fprintf(stderr, "%s: the measurement of %s failed (status %d)\n", kProg, dir.c_str(),
                 status);
    return false;
  }
  return true;
}

// Runs this program again with --measure-open on `b`, so that the open is fresh and its RSS
// its own; fills `row` from the child's line. Then once more with --measure-reopen: the open from
// the index snapshot the first child's clean close left, and the close that writes it again.
int MeasureInChild(const Flags& f, const char* self, const Built& b, Row* row) {
  // The cap: the store's use exactly (ChunkStore::DataCapLocked keeps (segments + 1) blocks and
  // 1/257 of the cap for file-system overhead), so the open evicts nothing and every Put does.
  const uint64_t cap = (b.used_bytes + 255) / 256 * 257 + (b.segments + 1) * 4096;
  const std::string cmd = absl::StrFormat(
      "'%s' --store '%s' --measure-open '%s' --measure-chunks %u --cap %u --prefix-chunks %u "
      "--cold-chains %u --hot-lookups %u --puts %u --chunks-per-put %u",
      self, f.store, b.dir, b.chunks, cap, f.prefix_chunks, f.cold_chains, f.hot_lookups, f.puts,
      f.chunks_per_put);
  const bool measured = RunChild(cmd, b.dir, [&](const char* line) {
    unsigned long long rb, ra, hwm, chain, cold, written, evicted, index;
    if (std::sscanf(
            line, "MEASURE %lf %llu %llu %llu %lf %lf %lf %lf %llu %llu %llu %llu %lf %llu %lf %lf",
            &row->open_s, &rb, &ra, &hwm, &row->cold_p50_ms, &row->cold_p99_ms, &row->hot_p50_ms,
            &row->hot_p99_ms, &chain, &cold, &written, &evicted, &row->put_s, &index,
            &row->pin_cold_p99_ms, &row->pin_hot_p99_ms) != 16) {
      return false;
    }
    row->index_bytes = index;
    row->rss_before = rb;
    row->rss_after = ra;
    row->hwm = hwm;
    row->lookup_chain_chunks = chain;
    row->cold_chains = cold;
    row->put_chunks = written;
    row->evicted = evicted;
    return true;
  });
  if (!measured) return cli::kExitError;
  const bool reopened = RunChild(cmd + " --measure-reopen", b.dir, [&](const char* line) {
    unsigned long long rss, chunks;
    int from_snapshot;
    if (std::sscanf(line, "REOPEN %lf %llu %d %lf %llu", &row->reopen_s, &rss, &from_snapshot,
                    &row->close_s, &chunks) != 5) {
      return false;
    }
    row->reopen_rss = rss;
    row->reopen_from_snapshot = from_snapshot != 0;
    return true;
  });
  if (!reopened) return cli::kExitError;
  row->hot_lookups = f.hot_lookups;
  row->puts = f.puts;
  return cli::kExitOk;
}

std::string ToJson(const Flags& f, const std::vector<Row>& rows) {
  tools::JsonWriter j;
  j.BeginObject();
  j.Key("benchmark").String("index_bench");
  j.Key("model").String("one layer, 1 KV head of 64, fp16, 16-token chunks");
  j.Key("prefix_chunks").Uint(f.prefix_chunks);
  j.Key("chunks_per_put").Uint(f.chunks_per_put);
  j.Key("fake_records_readable").Bool(false);
  j.Key("sizes").BeginArray();
  for (const Row& r : rows) {
    j.BeginObject();
    j.Key("chunks").Uint(r.chunks);
    j.Key("prefixes").Uint(r.prefixes);
    j.Key("segments").Uint(r.segments);
    j.Key("build_seconds").Double(r.build_s);
    j.Key("open_seconds").Double(r.open_s);
    j.Key("rss_before_open_bytes").Uint(r.rss_before);
    j.Key("rss_after_open_bytes").Uint(r.rss_after);
    j.Key("rss_peak_bytes").Uint(r.hwm);
    j.Key("rss_bytes_per_chunk").Double(r.RssBytesPerChunk());
    j.Key("index_memory_bytes").Uint(r.index_bytes);
    j.Key("index_bytes_per_chunk").Double(r.IndexBytesPerChunk());
    j.Key("lookup_chain_chunks").Uint(r.lookup_chain_chunks);
    j.Key("cold_chains").Uint(r.cold_chains);
    j.Key("lookup_cold_p50_ms").Double(r.cold_p50_ms);
    j.Key("lookup_cold_p99_ms").Double(r.cold_p99_ms);
    j.Key("hot_lookups").Uint(r.hot_lookups);
    j.Key("lookup_hot_p50_ms").Double(r.hot_p50_ms);
    j.Key("lookup_hot_p99_ms").Double(r.hot_p99_ms);
    j.Key("pin_cold_p99_ms").Double(r.pin_cold_p99_ms);
    j.Key("pin_hot_p99_ms").Double(r.pin_hot_p99_ms);
    j.Key("reopen_seconds").Double(r.reopen_s);
    j.Key("reopen_from_snapshot").Bool(r.reopen_from_snapshot);
    j.Key("reopen_rss_added_bytes").Uint(r.reopen_rss);
    j.Key("close_seconds").Double(r.close_s);
    j.Key("puts").Uint(r.puts);
    j.Key("put_chunks_written").Uint(r.put_chunks);
    j.Key("put_chunks_evicted").Uint(r.evicted);
    j.Key("put_seconds").Double(r.put_s);
    j.Key("puts_per_second").Double(r.PutsPerSecond());
    j.Key("evicted_chunks_per_second").Double(r.EvictedPerSecond());
    j.Key("catalog_bytes").Uint(r.catalog_bytes);
    j.EndObject();
  }
  j.EndArray().EndObject();
  return j.str();
}

// Open time, RSS after open, and Lookup and pin p99 by N (log-log), drawn by gnuplot into f.plot.
void Plot(const Flags& f, const std::vector<Row>& rows) {
  std::string s = "set terminal png size 1200,420\nset output '" + f.plot + "'\n";
  s += "set multiplot layout 1,3 title 'ckv index at scale (index\\_bench, one-layer model)'\n";
  s += "set logscale xy\nset xlabel 'chunks'\nset format x '10^{%L}'\n"
       "set key top left Left reverse\nset grid\n";
  auto data = [&](auto value) {
    std::string d;
    for (const Row& r : rows) d += absl::StrFormat("%u %g\n", r.chunks, value(r));
    return d + "e\n";
  };
  s += "set title 'open time'\nset ylabel 'seconds'\n";
  s += "plot '-' with linespoints title 'Engine::Open (catalog scan)', '-' with linespoints "
       "title 'Engine::Open (index snapshot)', '-' with linespoints title 'close (writes it)'\n";
  s += data([](const Row& r) { return r.open_s; });
  s += data([](const Row& r) { return r.reopen_s; });
  s += data([](const Row& r) { return r.close_s; });
  s += "set title 'memory'\nset ylabel 'MiB'\n";
  s += "plot '-' with linespoints title 'RSS after open', '-' with linespoints title 'peak RSS', "
       "'-' with linespoints title 'index'\n";
  s += data([](const Row& r) { return static_cast<double>(r.rss_after) / (1 << 20); });
  s += data([](const Row& r) { return static_cast<double>(r.hwm) / (1 << 20); });
  s += data([](const Row& r) { return static_cast<double>(r.index_bytes) / (1 << 20); });
  s += "set title 'Lookup and pin of one prefix'\nset ylabel 'ms'\n";
  s +=
      "plot '-' with linespoints title 'Lookup cold p99', '-' with linespoints title 'Lookup hot "
      "p99', '-' with linespoints title 'pin cold p99', '-' with linespoints title 'pin hot p99'\n";
  s += data([](const Row& r) { return r.cold_p99_ms; });
  s += data([](const Row& r) { return r.hot_p99_ms; });
  s += data([](const Row& r) { return r.pin_cold_p99_ms; });
  s += data([](const Row& r) { return r.pin_hot_p99_ms; });
  s += "unset multiplot\n";
  FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr || std::fwrite(s.data(), 1, s.size(), gp) != s.size() || pclose(gp) != 0) {
    std::fprintf(stderr, "%s: gnuplot failed; no plot drawn\n", kProg);
    return;
  }
  // On stderr: stdout holds the table, or the JSON with --json.
  std::fprintf(stderr, "%s: plot: %s\n", kProg, f.plot.c_str());
}

void PrintRow(const Row& r) {
  std::printf(
      "%11llu %8.2f %8.3f %8.3f%s %8.3f %9.1f %9.1f %8.1f %8.1f %9.3f %9.3f %9.3f %9.3f "
      "%9.3f %9.3f %8.1f %10.0f %10.1f\n",
      static_cast<unsigned long long>(r.chunks), r.build_s, r.open_s, r.reopen_s,
      r.reopen_from_snapshot ? " " : "!", r.close_s, static_cast<double>(r.rss_after) / (1 << 20),
      static_cast<double>(r.hwm) / (1 << 20), r.RssBytesPerChunk(), r.IndexBytesPerChunk(),
      r.cold_p50_ms, r.cold_p99_ms, r.hot_p50_ms, r.hot_p99_ms, r.pin_cold_p99_ms, r.pin_hot_p99_ms,
      r.PutsPerSecond(), r.EvictedPerSecond(), static_cast<double>(r.catalog_bytes) / (1 << 20));
}

int Run(const Flags& f, const char* self) {
  std::vector<uint64_t> sizes;
  for (absl::string_view part : absl::StrSplit(f.chunks, ',')) {
    uint64_t n = 0;
    if (!cli::ParseUint(std::string_view(part.data(), part.size()), &n) || n < 2) {
      return cli::UsageError(kProg, absl::StrFormat("--chunks: '%s' is not a count >= 2", part));
    }
    sizes.push_back(n);
  }
  if (f.chunks_per_put == 0 || f.puts == 0 || f.hot_lookups == 0 || f.cold_chains == 0) {
    return cli::UsageError(kProg,
                           "--chunks-per-put, --puts, --hot-lookups and --cold-chains must be > 0");
  }
  std::filesystem::create_directories(f.store);
  const bool table = !f.json.ToStdout();
  if (table) {
    std::printf(
        "one-layer model, prefixes of %llu chunks; the fake chunks' records are not "
        "readable (sparse segments)\n",
        static_cast<unsigned long long>(f.prefix_chunks));
    std::printf("%11s %8s %8s %9s %8s %9s %9s %8s %8s %9s %9s %9s %9s %9s %9s %8s %10s %10s\n",
                "chunks", "build s", "open s", "reopen s", "close s", "RSS MiB", "peak MiB",
                "B/chunk", "index B", "cold p50", "cold p99", "hot p50", "hot p99", "pin cold",
                "pin hot", "Puts/s", "evicted/s", "catalog MiB");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  for (uint64_t n : sizes) {
    Built b;
    if (int code = BuildStore(f, n, &b); code != cli::kExitOk) return code;
    Row row;
    row.chunks = b.chunks;
    row.prefixes = b.prefixes;
    row.segments = b.segments;
    row.build_s = b.build_seconds;
    if (int code = MeasureInChild(f, self, b, &row); code != cli::kExitOk) return code;
    row.catalog_bytes = DirBytes(b.dir + "/catalog");
    if (table) {
      PrintRow(row);
      std::fflush(stdout);
    }
    rows.push_back(row);
    if (!f.keep) {
      std::error_code ec;
      std::filesystem::remove_all(b.dir, ec);
    }
  }
  if (table) {
    // A store smaller than one prefix looks up its one shorter prefix: say the longest chain.
    uint64_t chain = 0;
    for (const Row& r : rows) chain = std::max(chain, r.lookup_chain_chunks);
    std::printf(
        "Lookup: ms per whole-prefix Lookup (%llu-chunk chains, or the store's one prefix "
        "where it holds less); cold = first Lookup of a prefix after open. reopen: the open "
        "after that measurement's clean close, from the index snapshot it wrote (! where it "
        "was not used); close: that open's own close, which writes it again. pin: ms per "
        "pin of such a chain, which reads its catalog records (p99; cold: prefixes not "
        "looked up). Puts of %llu new chunks, each evicting as many under the cap. index "
        "B: the index's own memory per chunk (EngineStats::index_memory_bytes).\n",
        static_cast<unsigned long long>(chain), static_cast<unsigned long long>(f.chunks_per_put));
  }
  if (f.json.enabled) {
    if (absl::Status s = f.json.Write(ToJson(f, rows)); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, s.ToString().c_str());
      return cli::kExitError;
    }
  }
  if (!f.plot.empty()) Plot(f, rows);
  return cli::kExitOk;
}

}  // namespace
}  // namespace ckv

int main(int argc, char** argv) {
  using namespace ckv;
  Flags f;
  CLI::App app{
      "Measures how the store's index scales with its chunk count: open time, RSS, "
      "Lookup latency, Put and eviction throughput, catalog size.",
      kProg};
  cli::Configure(app);
  app.add_option("--store", f.store, "directory for the stores (created if missing)")
      ->type_name("DIR")
      ->required();
  app.add_option("--chunks", f.chunks, "comma-separated chunk counts N (default 1000000)")
      ->type_name("N,...");
  cli::AddUint(app, "--prefix-chunks", &f.prefix_chunks,
               "chunks per stored prefix, the chain a Lookup walks (default 2048)");
  cli::AddUint(app, "--cold-chains", &f.cold_chains,
               "prefixes looked up once each, first after open (default 32)");
  cli::AddUint(app, "--hot-lookups", &f.hot_lookups,
               "repeated Lookups of one prefix (default 200)");
  cli::AddUint(app, "--puts", &f.puts, "timed Puts, each evicting (default 50)");
  cli::AddUint(app, "--chunks-per-put", &f.chunks_per_put, "new chunks per Put (default 4)");
  app.add_flag("--keep", f.keep, "keep the stores");
  app.add_option("--plot", f.plot, "draw open time, RSS and Lookup latency by N into PNG")
      ->type_name("PNG");
  cli::AddJson(app, &f.json);
  app.add_option("--measure-open", f.measure_open)->group("");
  app.add_flag("--measure-reopen", f.measure_reopen)->group("");
  cli::AddUint(app, "--measure-chunks", &f.measure_chunks, "")->group("");
  cli::AddUint(app, "--cap", &f.cap, "")->group("");
  if (auto code = cli::Parse(app, argc, argv)) return *code;
  if (!f.measure_open.empty()) return MeasureOpen(f);
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "%s: cannot find this program (/proc/self/exe)\n", kProg);
    return cli::kExitError;
  }
  self[len] = '\0';
  return Run(f, self);
}
