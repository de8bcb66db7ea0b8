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
// Thread-safety: everything here is a pure function or a macro.
#ifndef CKV_STATUS_H_
#define CKV_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckv {

// Maps an errno value to a Status. The one errno mapping in ckv: ENOSPC/EDQUOT/EFBIG/ENOMEM →
// ResourceExhausted, ENOENT → NotFound, EEXIST → AlreadyExists, EACCES/EPERM/EROFS →
// PermissionDenied, EIO → DataLoss when reading (`context` starts with "read", case-insensitive)
// and Internal otherwise, EINTR/EAGAIN/EBUSY → Unavailable, ENOSYS/EOPNOTSUPP → Unimplemented,
// anything else → Internal. `context` names the thing that failed, e.g. "write segment
// seg-000003.ckv at offset 4096"; the message is "<context>: <strerror text> (errno N)".
absl::Status ErrnoToStatus(int err, std::string_view context);

// True when `s` says the file system is full: ENOSPC or EDQUOT from ckv's file I/O
// (ErrnoToStatus marks them) or RocksDB's NoSpace from the catalog (NoSpaceError). Such a
// status is ResourceExhausted and carries a payload that says so; a cap that cannot be met is
// ResourceExhausted too, but is not a full file system, whatever its message quotes.
bool IsNoSpace(const absl::Status& s);
// ResourceExhausted with `message`, marked as a full file system (IsNoSpace).
absl::Status NoSpaceError(std::string_view message);
// `s` with its message replaced by `message`, its code and payloads (IsNoSpace's mark) kept.
absl::Status WithMessage(const absl::Status& s, std::string_view message);

}  // namespace ckv

#define CKV_STATUS_CONCAT_INNER_(a, b) a##b
#define CKV_STATUS_CONCAT_(a, b) CKV_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define CKV_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status ckv_status_ = (expr);       \
    if (!ckv_status_.ok()) return ckv_status_; \
  } while (false)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its error.
#define CKV_ASSIGN_OR_RETURN(lhs, rexpr) \
  CKV_ASSIGN_OR_RETURN_IMPL_(CKV_STATUS_CONCAT_(ckv_statusor_, __LINE__), lhs, rexpr)
#define CKV_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)   \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // CKV_STATUS_H_
