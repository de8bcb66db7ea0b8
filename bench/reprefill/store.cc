// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckv/engine.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "kernels/half.h"
#include "storage/record_checksum.h"
#include "tools/json_reader.h"

namespace ckv::bench {

KeyFile::KeyFile(const ModelSpec& spec, size_t tokens, uint32_t conversations)
    : layers_(spec.layers),
      kv_heads_(spec.kv_heads),
      conversations_(conversations),
      chunk_tokens_(spec.chunk_tokens),
      chunks_((tokens + spec.chunk_tokens - 1) / spec.chunk_tokens),
      key_bytes_(spec.head_dim * kernels::ElementBytes(spec.dtype)) {
  run_bytes_ = RoundUp(tokens * key_bytes_);
  bytes_ = run_bytes_ * spec.layers * spec.kv_heads * conversations;
}

ImpressFile::ImpressFile(const ModelSpec& spec, size_t tokens, uint32_t conversations)
    : layers_(spec.layers),
      conversations_(conversations),
      blocks_(static_cast<uint32_t>((tokens + kBlockTokens - 1) / kBlockTokens)),
      kv_bytes_(uint64_t{kBlockTokens} * spec.TokenBytesPerLayer()),
      block_bytes_(KeyFile::RoundUp(2 * kv_bytes_)) {}

HalfFile::HalfFile(const ModelSpec& spec, size_t tokens, uint32_t conversations)
    : layers_(spec.layers),
      conversations_(conversations),
      chunks_(static_cast<uint32_t>(tokens / spec.chunk_tokens)),
      half_bytes_(spec.DecodedRecordBytes() / 2),
      slot_bytes_(KeyFile::RoundUp(half_bytes_)) {}

prefetch::ReadRequest HalfFile::Read(prefetch::FileId file, const std::vector<uint64_t>& sums,
                                     const char* name, uint32_t c, uint32_t layer, uint32_t chunk,
                                     prefetch::Priority priority, std::span<std::byte> dest) const {
  prefetch::ReadRequest r;
  r.file = file;
  r.offset = Offset(c, layer, chunk);
  r.length = static_cast<uint32_t>(slot_bytes_);
  r.priority = priority;
  r.verify_checksum = true;
  r.expected_checksum = sums[SumIndex(c, layer, chunk)];
  r.checksum_bytes = static_cast<uint32_t>(half_bytes_);
  r.name = absl::StrCat(name, ": conversation ", c, ", layer ", layer, ", chunk ", chunk);
  r.dest = dest;
  return r;
}

const char* LayoutName(RecordLayout l) {
  return l == RecordLayout::kLayerMajor ? "layer-major" : "period-major";
}

std::string StoreName(StoreId store) {
  std::string name = LayoutName(store.layout);
  if (store.codec != KvCodec::kNone) {
    absl::StrAppend(&name, "-", std::string(KvCodecName(store.codec)));
  }
  return name;
}

std::string StorePath(const Flags& f, StoreId store) { return f.store + "/" + StoreName(store); }

std::string KeyFilePath(const Flags& f) { return f.store + "/keys.bin"; }
std::string ImpressFilePath(const Flags& f) { return f.store + "/impress.bin"; }
std::string ImpressMapPath(const Flags& f) { return f.store + "/impress.map"; }
std::string KeySumPath(const Flags& f) { return f.store + "/keys.sum"; }
std::string ImpressSumPath(const Flags& f) { return f.store + "/impress.sum"; }
std::string ScoringKeyPath(const Flags& f) { return f.store + "/scoring_keys.bin"; }
std::string ScoringKeySumPath(const Flags& f) { return f.store + "/scoring_keys.sum"; }
std::string ValueFilePath(const Flags& f) { return f.store + "/values.bin"; }
std::string ValueSumPath(const Flags& f) { return f.store + "/values.sum"; }

absl::StatusOr<std::vector<uint64_t>> ReadSums(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::DataLossError(absl::StrCat("checksum file ", path, " cannot be opened"));
  std::vector<uint64_t> sums(count);
  in.read(reinterpret_cast<char*>(sums.data()), static_cast<std::streamsize>(count * 8));
  if (static_cast<size_t>(in.gcount()) != count * 8 || in.peek() != EOF) {
    return absl::DataLossError(
        absl::StrCat("checksum file ", path, " does not hold ", count, " checksums of 8 bytes"));
  }
  return sums;
}

absl::Status OwnFile::Open(prefetch::ReadEngine& engine, const std::string& path,
                           const std::string& sum_path, size_t count) {
  CKV_ASSIGN_OR_RETURN(file,
                       io::PosixFileSystem()->Open(path, io::FileSystem::OpenMode::kReadWrite));
  CKV_ASSIGN_OR_RETURN(id, engine.RegisterFile(file.get()));
  reads = &engine;
  CKV_ASSIGN_OR_RETURN(sums, ReadSums(sum_path, count));
  return absl::OkStatus();
}

absl::Status OwnFile::Close() {
  if (reads == nullptr) return absl::OkStatus();
  prefetch::ReadEngine* engine = std::exchange(reads, nullptr);
  return engine->UnregisterFile(id);
}

namespace {

// One conversation's keys, head-major, appended to `out`.
absl::Status AppendKeys(const Workload& w, const KeyFile& kf, const KvTensors& kv,
                        std::ofstream& out, const std::string& path, std::vector<uint64_t>& sums) {
  const ModelSpec& spec = w.spec();
  const size_t kb = kf.key_bytes();
  const size_t tok_bytes = spec.TokenBytesPerLayer();
  std::vector<char> run(KeyFile::RoundUp(w.stored_tokens() * kb), 0);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const std::byte* k = kv.k[l].data();
    for (uint32_t h = 0; h < spec.kv_heads; ++h) {
      for (size_t t = 0; t < w.stored_tokens(); ++t) {
        std::memcpy(run.data() + t * kb, k + t * tok_bytes + h * kb, kb);
      }
      for (size_t t = 0; t < w.stored_tokens(); t += spec.chunk_tokens) {
        const size_t nt = std::min<size_t>(spec.chunk_tokens, w.stored_tokens() - t);
        sums.push_back(storage::RecordChecksum(run.data() + t * kb, nt * kb));
      }
      out.write(run.data(), static_cast<std::streamsize>(run.size()));
    }
  }
  if (!out)
    return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed (disk full?)"));
  return absl::OkStatus();
}

// One conversation's KV in impress.bin's layout, in token order, appended to `out`.
absl::Status AppendImpress(const Workload& w, const ImpressFile& f, const KvTensors& kv,
                           std::ofstream& out, const std::string& path,
                           std::vector<uint64_t>& sums) {
  const ModelSpec& spec = w.spec();
  const size_t tok_bytes = spec.TokenBytesPerLayer();
  const size_t tokens = w.stored_tokens();
  std::vector<char> block(f.block_bytes());
  for (uint32_t l = 0; l < spec.layers; ++l) {
    for (uint32_t b = 0; b < f.blocks(); ++b) {
      std::fill(block.begin(), block.end(), 0);
      const size_t t0 = size_t{b} * ImpressFile::kBlockTokens;
      const size_t nt = std::min<size_t>(ImpressFile::kBlockTokens, tokens - t0);
      std::memcpy(block.data(), kv.k[l].data() + t0 * tok_bytes, nt * tok_bytes);
      std::memcpy(block.data() + f.kv_bytes(), kv.v[l].data() + t0 * tok_bytes, nt * tok_bytes);
      sums.push_back(storage::RecordChecksum(block.data(), block.size()));
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
  }
  if (!out)
    return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed (disk full?)"));
  return absl::OkStatus();
}

// A HalfFile being written (or reused when `ok`): K halves, or V halves with `values`.
struct HalfOut {
  bool values = false;
  std::string path, sum_path;
  bool ok = true;
  std::ofstream out;
  std::vector<uint64_t> sums;

  // One conversation's halves, appended.
  absl::Status Append(const Workload& w, const HalfFile& f, const KvTensors& kv) {
    std::vector<char> slot(f.slot_bytes(), 0);  // the padding stays zero
    for (uint32_t l = 0; l < w.spec().layers; ++l) {
      const std::byte* from = (values ? kv.v[l] : kv.k[l]).data();
      for (uint32_t j = 0; j < f.chunks(); ++j) {
        std::memcpy(slot.data(), from + j * f.half_bytes(), f.half_bytes());
        sums.push_back(storage::RecordChecksum(slot.data(), f.half_bytes()));
        out.write(slot.data(), static_cast<std::streamsize>(slot.size()));
      }
    }
    if (!out)
      return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed (disk full?)"));
    return absl::OkStatus();
  }
};

absl::StatusOr<bool> StoreHolds(const Workload& w, StoreId store) {
  EngineOptions o;
  o.create_if_missing = false;
  auto engine = Engine::Open(o, StorePath(w.flags(), store));
  if (!engine.ok()) return false;
  for (uint32_t c = 0; c < w.flags().conversations; ++c) {
    CKV_ASSIGN_OR_RETURN(uint64_t n,
                         (*engine)->Lookup(WithCodec(w.spec(), store.codec), w.StoredTokens(c)));
    if (n != w.stored_tokens() / w.spec().chunk_tokens) return false;
  }
  return true;
}

// The store's manifest, or "" when it has none or one larger than any this program writes (a
// manifest is a few hundred bytes; the file's size is not trusted: it may be /dev/zero behind a
// symlink), so that the store is rebuilt.
std::string ReadManifest(const std::string& path) {
  constexpr size_t kMaxManifestBytes = 64 << 10;
  absl::StatusOr<std::string> text = tools::ReadFileUpTo(path, kMaxManifestBytes, "manifest");
  return text.ok() ? *std::move(text) : std::string();
}

// Writes `sums` to `path`, durably enough for a benchmark (flushed, checked).
absl::Status WriteSums(const std::string& path, const std::vector<uint64_t>& sums) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(sums.data()),
            static_cast<std::streamsize>(sums.size() * 8));
  out.flush();
  if (!out)
    return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed (disk full?)"));
  return absl::OkStatus();
}

bool FileHasSize(const std::string& path, uint64_t bytes) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && uint64_t(st.st_size) == bytes;
}

}  // namespace

absl::Status Populate(const Workload& w, const std::set<StoreId>& stores, const StoreFiles& files) {
  const bool need_keys = files.keys, need_impress = files.impress;
  const Flags& f = w.flags();
  ::mkdir(f.store.c_str(), 0700);
  const std::string manifest_path = f.store + "/manifest.json";
  const std::string manifest = w.Manifest();
  if (ReadManifest(manifest_path) != manifest) {
    // Another workload's store: start over.
    std::fprintf(stderr, "%s: making a new store in %s\n", kProg, f.store.c_str());
    // Only what this harness makes, never the rest of DIR.
    std::vector<std::string> names = {
        "keys.bin",         "keys.sum",         "impress.bin", "impress.sum", "impress.map",
        "scoring_keys.bin", "scoring_keys.sum", "values.bin",  "values.sum",  "fio.dat"};
    for (RecordLayout layout : {RecordLayout::kLayerMajor, RecordLayout::kPeriodMajor}) {
      for (KvCodec codec : {KvCodec::kNone, KvCodec::kFp8E4M3, KvCodec::kInt8, KvCodec::kInt4}) {
        names.push_back(StoreName({layout, codec}));
      }
    }
    for (const std::string& name : names) {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(f.store) / name, ec);
      if (ec)
        return absl::InternalError(
            absl::StrCat("could not remove ", f.store, "/", name, ": ", ec.message()));
    }
    std::remove(manifest_path.c_str());
  }
  std::vector<StoreId> todo;
  for (StoreId store : stores) {
    CKV_ASSIGN_OR_RETURN(bool holds, StoreHolds(w, store));
    if (!holds) todo.push_back(store);
  }
  const KeyFile kf(w.spec(), w.stored_tokens(), f.conversations);
  const std::string key_path = KeyFilePath(f);
  struct stat st {};
  const bool keys_ok = !need_keys || (FileHasSize(key_path, kf.bytes()) &&
                                      FileHasSize(KeySumPath(f), kf.sums() * 8));
  const ImpressFile imf(w.spec(), w.stored_tokens(), f.conversations);
  const std::string impress_path = ImpressFilePath(f);
  // impress.map says impress.bin's slots are not in token order (a run that did not restore
  // them): rewriting is as cheap as restoring here.
  const bool impress_ok = !need_impress || (FileHasSize(impress_path, imf.bytes()) &&
                                            FileHasSize(ImpressSumPath(f), imf.sums() * 8) &&
                                            ::stat(ImpressMapPath(f).c_str(), &st) != 0);
  const HalfFile hf(w.spec(), w.stored_tokens(), f.conversations);
  HalfOut halves[2];
  halves[0].path = ScoringKeyPath(f);
  halves[0].sum_path = ScoringKeySumPath(f);
  halves[0].ok = !files.scoring_keys;
  halves[1].values = true;
  halves[1].path = ValueFilePath(f);
  halves[1].sum_path = ValueSumPath(f);
  halves[1].ok = !files.values;
  for (HalfOut& h : halves) {
    h.ok = h.ok || (FileHasSize(h.path, hf.bytes()) && FileHasSize(h.sum_path, hf.sums() * 8));
  }
  const bool halves_ok = halves[0].ok && halves[1].ok;
  if (todo.empty() && keys_ok && impress_ok && halves_ok) {
    std::fprintf(stderr, "%s: reusing the store in %s\n", kProg, f.store.c_str());
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<Engine>> engines;
  for (StoreId store : todo) {
    EngineOptions o;
    o.layout = store.layout;
    CKV_ASSIGN_OR_RETURN(auto engine, Engine::Open(o, StorePath(f, store)));
    engines.push_back(std::move(engine));
  }
  std::ofstream keys;
  if (!keys_ok) {
    keys.open(key_path, std::ios::binary | std::ios::trunc);
    if (!keys) return absl::PermissionDeniedError(absl::StrCat("cannot create ", key_path));
  }
  std::ofstream impress;
  if (!impress_ok) {
    std::remove(ImpressMapPath(f).c_str());
    impress.open(impress_path, std::ios::binary | std::ios::trunc);
    if (!impress) return absl::PermissionDeniedError(absl::StrCat("cannot create ", impress_path));
  }
  for (HalfOut& h : halves) {
    if (h.ok) continue;
    h.out.open(h.path, std::ios::binary | std::ios::trunc);
    if (!h.out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", h.path));
  }
  std::vector<uint64_t> key_sums, impress_sums;
  for (uint32_t c = 0; c < f.conversations; ++c) {
    std::fprintf(stderr, "%s: conversation %u/%u: %s the KV of %zu tokens (%s)\n", kProg, c + 1,
                 f.conversations, w.file() ? "reading" : "generating", w.stored_tokens(),
                 w.spec().DebugString().c_str());
    CKV_RETURN_IF_ERROR(w.WithStoredKv(c, [&](const KvTensors& kv) -> absl::Status {
      for (size_t i = 0; i < engines.size(); ++i) {
        CKV_ASSIGN_OR_RETURN(PutResult r, engines[i]->Put(WithCodec(w.spec(), todo[i].codec),
                                                          w.StoredTokens(c), kv));
        std::fprintf(stderr, "%s: %s store: conversation %u/%u: %llu chunks written\n", kProg,
                     StoreName(todo[i]).c_str(), c + 1, f.conversations,
                     static_cast<unsigned long long>(r.chunks_written));
      }
      if (!keys_ok) CKV_RETURN_IF_ERROR(AppendKeys(w, kf, kv, keys, key_path, key_sums));
      if (!impress_ok)
        CKV_RETURN_IF_ERROR(AppendImpress(w, imf, kv, impress, impress_path, impress_sums));
      for (HalfOut& h : halves) {
        if (!h.ok) CKV_RETURN_IF_ERROR(h.Append(w, hf, kv));
      }
      return absl::OkStatus();
    }));
  }
  if (!impress_ok) {
    impress.flush();
    if (!impress)
      return absl::ResourceExhaustedError(
          absl::StrCat("writing ", impress_path, " failed (disk full?)"));
    CKV_RETURN_IF_ERROR(WriteSums(ImpressSumPath(f), impress_sums));
  }
  if (!keys_ok) {
    keys.flush();
    if (!keys)
      return absl::ResourceExhaustedError(
          absl::StrCat("writing ", key_path, " failed (disk full?)"));
    CKV_RETURN_IF_ERROR(WriteSums(KeySumPath(f), key_sums));
  }
  for (HalfOut& h : halves) {
    if (h.ok) continue;
    h.out.flush();
    if (!h.out)
      return absl::ResourceExhaustedError(absl::StrCat("writing ", h.path, " failed (disk full?)"));
    CKV_RETURN_IF_ERROR(WriteSums(h.sum_path, h.sums));
  }
  std::ofstream(manifest_path, std::ios::trunc) << manifest;
  std::fprintf(stderr, "%s: store ready in %.1f s\n", kProg,
               absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace ckv::bench
