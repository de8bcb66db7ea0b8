// SPDX-License-Identifier: Apache-2.0
// common/status_macros.h: how ckv's own code makes and passes on the statuses of ckv/status.h:
// the one errno mapping, the full-disk mark, a message replaced with the code kept, and the
// return macros. For the library, tools/, bench/, tests/ and python/; not installed (a program
// that links ckv::ckv needs only ckv/status.h).
//
// Thread-safety: everything here is a pure function or a macro.
#ifndef CKV_COMMON_STATUS_MACROS_H_
#define CKV_COMMON_STATUS_MACROS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/status.h"

namespace ckv {

// Maps an errno value to a Status. The one errno mapping in ckv: ENOSPC/EDQUOT/EFBIG/ENOMEM →
// ResourceExhausted, ENOENT → NotFound, EEXIST → AlreadyExists, EACCES/EPERM/EROFS →
// PermissionDenied, EIO → DataLoss when reading (`context` starts with "read", case-insensitive)
// and Internal otherwise, EINTR/EAGAIN/EBUSY → Unavailable, ENOSYS/EOPNOTSUPP → Unimplemented,
// anything else → Internal. `context` names the thing that failed, e.g. "write segment
// seg-000003.ckv at offset 4096"; the message is "<context>: <strerror text> (errno N)".
absl::Status ErrnoToStatus(int err, std::string_view context);

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

#endif  // CKV_COMMON_STATUS_MACROS_H_
