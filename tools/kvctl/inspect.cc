// SPDX-License-Identifier: Apache-2.0
// kvctl ls and show: what a store holds, and where one prefix's chunks live.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "ckv/log.h"
#include "tools/kvctl/command.h"
#include "tools/kvctl/format.h"

namespace ckv::kvctl {
namespace {

struct LsOptions {
  std::string store;
  cli::JsonOutput json;
};

int RunLs(const LsOptions& o) {
  const std::string& store = o.store;
  auto engine = OpenToRead(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  const std::vector<PrefixInfo> prefixes = (*engine)->ListPrefixes();
  const EngineStats stats = (*engine)->Stats();
  uint64_t total_tokens = 0, total_chunks = 0, total_bytes = 0;
  for (const PrefixInfo& p : prefixes) {
    total_tokens += p.tokens;
    total_chunks += p.chunks;
    total_bytes += p.bytes;
  }

  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject().Key("store").String(store).Key("prefixes").BeginArray();
    for (const PrefixInfo& p : prefixes) {
      w.BeginObject()
          .Key("id")
          .String(p.id.ToHex())
          .Key("model_id")
          .String(p.model_id)
          .Key("model_fingerprint")
          .String(p.model_fingerprint.ToHex())
          .Key("tokens")
          .Uint(p.tokens)
          .Key("chunks")
          .Uint(p.chunks)
          .Key("bytes")
          .Uint(p.bytes)
          .Key("created_unix_ms")
          .Int(p.created_unix_ms)
          .Key("created")
          .String(FormatIsoUtc(p.created_unix_ms))
          .EndObject();
    }
    w.EndArray()
        .Key("totals")
        .BeginObject()
        .Key("prefixes")
        .Uint(prefixes.size())
        .Key("tokens")
        .Uint(total_tokens)
        .Key("chunks")
        .Uint(total_chunks)
        .Key("bytes")
        .Uint(total_bytes)
        .Key("stored_chunks")
        .Uint(stats.chunks)
        .Key("disk_bytes_used")
        .Uint(stats.disk_bytes_used)
        .Key("max_disk_bytes")
        .Uint(stats.max_disk_bytes)
        .EndObject()
        .Key("stats");
    WriteStatsJson(w, stats);
    w.EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }

  std::printf("%-16s  %-24s  %10s  %8s  %11s  %s\n", "PREFIX", "MODEL", "TOKENS", "CHUNKS", "BYTES",
              "CREATED");
  for (const PrefixInfo& p : prefixes) {
    std::string model = Printable(p.model_id);  // the store's bytes, shown not obeyed
    if (model.size() > 24) model = model.substr(0, 23) + "~";
    std::printf("%-16s  %-24s  %10llu  %8llu  %11s  %s\n", p.id.ToHex().substr(0, 16).c_str(),
                model.c_str(), static_cast<unsigned long long>(p.tokens),
                static_cast<unsigned long long>(p.chunks), FormatBytes(p.bytes).c_str(),
                FormatLocalTime(p.created_unix_ms).c_str());
  }
  std::printf("%zu prefix%s, %llu tokens, %llu chunks, %s (shared chunks counted per prefix)\n",
              prefixes.size(), prefixes.size() == 1 ? "" : "es",
              static_cast<unsigned long long>(total_tokens),
              static_cast<unsigned long long>(total_chunks), FormatBytes(total_bytes).c_str());
  std::string cap = "unlimited";
  if (stats.max_disk_bytes > 0) {
    char pct[32];
    std::snprintf(pct, sizeof(pct), " (%.1f%% used)",
                  100.0 * static_cast<double>(stats.disk_bytes_used) /
                      static_cast<double>(stats.max_disk_bytes));
    cap = FormatBytes(stats.max_disk_bytes) + pct;
  }
  std::printf("stored: %llu chunks in %llu segment%s; disk used %s, cap %s\n",
              static_cast<unsigned long long>(stats.chunks),
              static_cast<unsigned long long>(stats.segments), stats.segments == 1 ? "" : "s",
              FormatBytes(stats.disk_bytes_used).c_str(), cap.c_str());
  return kExitOk;
}

struct ShowOptions {
  std::string store;
  std::string prefix;
  cli::JsonOutput json;
};

// Columns for the heat strip: the terminal's width when stdout is one, else 64.
size_t StripColumns() {
  struct winsize ws;
  if (isatty(STDOUT_FILENO) == 1 && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    return ws.ws_col;
  }
  return 64;
}

// One character per value: ' ' for 0, else one of .:-=+*#%@ in proportion to `max`.
std::string HeatStrip(const std::vector<double>& values, double max) {
  static constexpr std::string_view kLevels = " .:-=+*#%@";
  std::string strip;
  strip.reserve(values.size());
  for (double v : values) {
    if (!(v > 0) || !(max > 0)) {
      strip += ' ';
      continue;
    }
    const double f = std::min(1.0, v / max);
    const size_t level = 1 + static_cast<size_t>(f * static_cast<double>(kLevels.size() - 2) + 0.5);
    strip += kLevels[std::min(level, kLevels.size() - 1)];
  }
  return strip;
}

// "segments/seg-00000001.ckv": where docs/format.md puts segment `id` in a store.
std::string SegmentFile(uint32_t id) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "segments/seg-%08u.ckv", id);
  return buf;
}

int RunShow(const ShowOptions& o) {
  const std::string& store = o.store;
  std::string wanted = o.prefix;
  if (std::string error; !NormalizePrefixArg(&wanted, &error)) return UsageError("show", error);
  auto engine = OpenToRead(store);
  if (!engine.ok()) return StoreError("open " + store, engine.status());
  ChunkKey prefix_id;
  if (const int code = FindPrefix(**engine, "show", store, wanted, &prefix_id); code != kExitOk) {
    return code;
  }
  auto d = (*engine)->DescribePrefix(prefix_id);
  if (!d.ok()) return StoreError("show " + prefix_id.ToHex(), d.status());
  const ModelSpec& spec = d->spec;
  std::vector<double> importance;
  double max_i = 0;
  uint64_t bytes = 0;
  for (const ChunkPlacement& c : d->chunks) {
    importance.push_back(c.importance);
    max_i = std::max(max_i, c.importance);
    bytes += c.bytes;
  }
  const std::string strip = HeatStrip(importance, max_i);

  if (o.json.enabled) {
    tools::JsonWriter w;
    w.BeginObject().Key("store").String(store).Key("prefix_id").String(prefix_id.ToHex());
    WriteSpecJson(w, spec);
    w.Key("layers")
        .Uint(spec.layers)
        .Key("tokens")
        .Uint(d->chunks.size() * spec.chunk_tokens)
        .Key("bytes")
        .Uint(bytes)
        .Key("max_importance")
        .Double(max_i)
        .Key("heat")
        .String(strip)
        .Key("chunks")
        .BeginArray();
    for (size_t i = 0; i < d->chunks.size(); ++i) {
      const ChunkPlacement& c = d->chunks[i];
      w.BeginObject()
          .Key("index")
          .Uint(i)
          .Key("key")
          .String(c.key.ToHex())
          .Key("tier")
          .String("nvme")
          .Key("segment")
          .Uint(c.segment)
          .Key("segment_file")
          .String(SegmentFile(c.segment))
          .Key("slot")
          .Uint(c.slot)
          .Key("offset")
          .Uint(c.offset)
          .Key("bytes")
          .Uint(c.bytes)
          .Key("importance")
          .Double(c.importance)
          .Key("loads")
          .Uint(c.loads)
          .Key("score")
          .Double(c.score())
          .EndObject();
    }
    w.EndArray().EndObject();
    if (const int rc = EmitJson(o.json, w); rc != kExitOk || o.json.ToStdout()) return rc;
  }
  std::printf("prefix %s: %s, %zu tokens (%zu chunks), %s\n", prefix_id.ToHex().c_str(),
              Printable(spec.DebugString()).c_str(), d->chunks.size() * spec.chunk_tokens,
              d->chunks.size(), FormatBytes(bytes).c_str());
  std::printf("tier: all on NVMe (GPU and CPU tiers exist only in a serving process)\n\n");
  std::printf("importance I along the prefix, one character per chunk (max I %.4g%s):\n", max_i,
              max_i > 0 ? "" : "; no session has read this prefix");
  const size_t margin = 9;  // "%6zu |" before the strip and "|" after it
  const size_t width = StripColumns();
  const size_t columns = width > margin + 8 ? width - margin : 8;
  for (size_t at = 0; at < strip.size(); at += columns) {
    std::printf("%6zu |%s|\n", at, strip.substr(at, columns).c_str());
  }
  std::printf("\n%6s  %-16s  %-26s  %6s  %14s  %10s  %10s  %8s\n", "CHUNK", "KEY", "SEGMENT",
              "SLOT", "OFFSET", "S", "I", "F");
  for (size_t i = 0; i < d->chunks.size(); ++i) {
    const ChunkPlacement& c = d->chunks[i];
    std::printf("%6zu  %-16s  %-26s  %6u  %14llu  %10.4g  %10.4g  %8llu\n", i,
                c.key.ToHex().substr(0, 16).c_str(), SegmentFile(c.segment).c_str(), c.slot,
                static_cast<unsigned long long>(c.offset), c.score(), c.importance,
                static_cast<unsigned long long>(c.loads));
  }
  return kExitOk;
}

}  // namespace

Command AddLs(CLI::App& kvctl) {
  auto o = std::make_shared<LsOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "ls", "List the stored prefixes, newest first, with totals and disk use.");
  cmd->footer(
      "BYTES counts every chunk of a prefix, so chunks shared by several prefixes are counted in\n"
      "each; the footer's disk figure counts them once.");
  AddStoreArg(*cmd, &o->store);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunLs(*o); }};
}

Command AddShow(CLI::App& kvctl) {
  auto o = std::make_shared<ShowOptions>();
  CLI::App* cmd = kvctl.add_subcommand(
      "show", "Show a prefix's chunks: where each lives, its S = I x F, and a heat strip of I.");
  cmd->footer(
      "PREFIX as for 'kvctl export'. Per chunk: its key, segment file and slot, the byte offset "
      "of\n"
      "its layer-0 record in that file, and its score S = I x F (I: attention importance, F:\n"
      "loads, both added by Re-Prefill sessions; 0 in a store no session has read). The heat "
      "strip\n"
      "draws I along the prefix, one character per chunk from ' ' (0) through .:-=+*#%@ (the\n"
      "prefix's largest I), wrapped to the terminal's width (64 columns when not a terminal).\n"
      "Tier: at rest every chunk lives on NVMe (its segment). The GPU and CPU tiers exist only in\n"
      "a serving process, so show has no tier column; 'kvctl stats --gpu-tier-bytes' shows which\n"
      "chunks the ranking would keep in them.\n"
      "Example: kvctl show ./store 9f3c0a17b2d4e6f8");
  AddStoreArg(*cmd, &o->store);
  AddPrefixArg(*cmd, &o->prefix);
  cli::AddJson(*cmd, &o->json);
  return {cmd, [o] { return RunShow(*o); }};
}

}  // namespace ckv::kvctl
