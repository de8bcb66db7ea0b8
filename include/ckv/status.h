// SPDX-License-Identifier: Apache-2.0
// ckv/status.h: error helpers shared by every ckv module.
//
// Every fallible ckv call returns absl::Status or absl::StatusOr<T>; no exception crosses the API.
// The status codes have fixed meanings across ckv:
//   DataLoss            corruption: a checksum mismatch, a torn or truncated file
//   ResourceExhausted   a full disk, a full queue, a cap that cannot be met
//   InvalidArgument     bad caller input: wrong shapes, token counts, malformed values
//   FailedPrecondition  a wrong model spec, a closed engine, a store of a newer format
//   NotFound            the named prefix, chunk or file does not exist
//   Unavailable         a retry might work
//
// The helpers ckv's own code uses to make and pass on these statuses (the errno mapping, the
// return macros) are in common/status_macros.h, which is not installed.
//
// Thread-safety: everything here is a pure function.
#ifndef CKV_STATUS_H_
#define CKV_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckv {

// True when `s` says the file system is full: ENOSPC or EDQUOT from ckv's file I/O or RocksDB's
// NoSpace from the catalog (ckv marks each when it makes the status). Such a status is
// ResourceExhausted and carries a payload that says so; a cap that cannot be met is
// ResourceExhausted too, but is not a full file system, whatever its message quotes.
bool IsNoSpace(const absl::Status& s);

}  // namespace ckv

#endif  // CKV_STATUS_H_
