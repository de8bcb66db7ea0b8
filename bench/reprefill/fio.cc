// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/fio.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/internal.h"
#include "tools/json_reader.h"

namespace ckv::bench {

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string Fio::FioFileName() const {
  // fio splits file names at ':' unless escaped.
  std::string n;
  for (char c : Path()) n += c == ':' ? std::string("\\:") : std::string(1, c);
  return ShellQuote(n);
}

double Fio::MbPerS(const IoSizeMix& mix, uint32_t qd, const std::string& dir) {
  uint64_t total = 0, largest_size = 0;
  for (size_t i = 0; i < mix.size(); ++i) {
    total += mix[i];
    if (mix[i] > 0) largest_size = uint64_t{4096} << i;
  }
  if (total == 0) return 0;
  // bssplit: size/percent pairs by count, percentages summing to 100 (the rounding remainder
  // goes to the most frequent size).
  std::string split;
  int sum = 0;
  size_t top = 0;
  std::array<int, prefetch::kIoSizeBuckets> pct{};
  for (size_t i = 0; i < mix.size(); ++i) {
    pct[i] = static_cast<int>(100 * mix[i] / total);
    sum += pct[i];
    if (mix[i] > mix[top]) top = i;
  }
  pct[top] += 100 - sum;
  for (size_t i = 0; i < mix.size(); ++i) {
    if (pct[i] == 0) continue;
    absl::StrAppend(&split, split.empty() ? "" : ":", (4 << i), "k/", pct[i]);
  }
  qd = std::clamp<uint32_t>(qd, 1, max_qd_);
  uint64_t size = 0;
  auto names = io::PosixFileSystem()->ListDir(dir + "/segments");
  if (names.ok()) {
    for (const std::string& name : *names) {
      struct stat st {};
      const std::string path = dir + "/segments/" + name;
      if (::stat(path.c_str(), &st) == 0)
        size = std::max<uint64_t>(size, uint64_t(st.st_blocks) * 512);
    }
  }
  size = size / (1 << 20) * (1 << 20);
  if (size < largest_size || !EnsureFile(size)) return 0;
  const auto key = std::make_pair(split, qd);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const std::string out = f_.store + "/fio.json";
  const std::string cmd = absl::StrCat(
      "fio --name=randread --ioengine=io_uring --direct=1 --rw=randread --readonly --bssplit=",
      split, " --iodepth=", qd, " --size=", file_bytes_, " --filename=", FioFileName(),
      " --time_based --runtime=", f_.fio_seconds,
      " --output-format=json --output=", ShellQuote(out), " >/dev/null 2>&1");
  double mb = 0;
  if (std::system(cmd.c_str()) == 0) {
    auto json = tools::ReadJsonFile(out);
    if (json.ok()) {
      const tools::JsonValue* jobs = json->Find("jobs");
      if (jobs != nullptr && jobs->AsArray() != nullptr && !jobs->AsArray()->empty()) {
        const tools::JsonValue* read = (*jobs->AsArray())[0].Find("read");
        const tools::JsonValue* bw = read != nullptr ? read->Find("bw_bytes") : nullptr;
        if (bw != nullptr && bw->AsInt() != nullptr) mb = double(*bw->AsInt()) / 1e6;
        if (bw != nullptr && bw->AsDouble() != nullptr) mb = *bw->AsDouble() / 1e6;
      }
    }
    std::remove(out.c_str());
  } else {
    std::fprintf(stderr, "%s: fio failed or is missing; fio_mb_s is 0\n", kProg);
  }
  cache_[key] = mb;
  return mb;
}

// Makes DIR/fio.dat at least `size` bytes and fully allocated (written by fio with O_DIRECT),
// reusing one from an earlier run. Later runs compare against the same file.
bool Fio::EnsureFile(uint64_t size) {
  if (file_bytes_ >= size) return true;
  struct stat st {};
  if (::stat(Path().c_str(), &st) == 0 && uint64_t(st.st_size) >= size &&
      uint64_t(st.st_blocks) * 512 >= uint64_t(st.st_size)) {
    file_bytes_ = uint64_t(st.st_size) / (1 << 20) * (1 << 20);
    return true;
  }
  std::fprintf(stderr, "%s: writing %s (%.2f GB) for fio's reference reads\n", kProg,
               Path().c_str(), size / 1e9);
  std::remove(Path().c_str());
  const std::string cmd = absl::StrCat(
      "fio --name=fill --ioengine=io_uring --direct=1 --rw=write --bs=1M --iodepth=16 --size=",
      size, " --filename=", FioFileName(), " >/dev/null 2>&1 && sync");
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "%s: could not write %s with fio; fio_mb_s is 0\n", kProg, Path().c_str());
    std::remove(Path().c_str());
    cache_.clear();
    return false;
  }
  file_bytes_ = size;
  cache_.clear();  // figures of a smaller file are not comparable
  return true;
}

}  // namespace ckv::bench
