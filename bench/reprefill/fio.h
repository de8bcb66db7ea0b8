// SPDX-License-Identifier: Apache-2.0
// bench/reprefill/fio.h: fio on the store's file system replaying a system's own mix of read
// sizes at its queue depth: the physical limit for that mix.
#ifndef CKV_BENCH_REPREFILL_FIO_H_
#define CKV_BENCH_REPREFILL_FIO_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "bench/reprefill/flags.h"
#include "engine/internal.h"

namespace ckv::bench {

using IoSizeMix = std::array<uint64_t, prefetch::kIoSizeBuckets>;

class Fio {
 public:
  Fio(const Flags& f, uint32_t max_qd) : f_(f), max_qd_(max_qd) {}
  // MB/s of fio's random reads with the sizes of `mix` (fio's bssplit, by count) at queue depth
  // `qd` (at most the read engine's), right after a system ran. fio reads DIR/fio.dat, a dense
  // file on the store's file system as large as the allocated bytes of the largest segment file
  // of the store in `dir`. Not the segment itself: segments are sparse (a band's unused slots
  // are holes), and a read of a hole returns zeros without touching the device. 0 when fio is
  // missing or failed.
  double MbPerS(const IoSizeMix& mix, uint32_t qd, const std::string& dir);

 private:
  std::string Path() const { return f_.store + "/fio.dat"; }
  std::string FioFileName() const;
  bool EnsureFile(uint64_t size);

  const Flags& f_;
  const uint32_t max_qd_;
  uint64_t file_bytes_ = 0;
  std::map<std::pair<std::string, uint32_t>, double> cache_;
};

// `s` as one word for /bin/sh: in single quotes, each ' written as '\''.
std::string ShellQuote(const std::string& s);

}  // namespace ckv::bench

#endif  // CKV_BENCH_REPREFILL_FIO_H_
