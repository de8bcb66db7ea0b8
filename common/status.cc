// SPDX-License-Identifier: Apache-2.0
// The one errno-to-Status mapping in ckv (see include/ckv/status.h).
#include "ckv/status.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckv {
namespace {

// The installed Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which std::string_view does not convert to implicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// strerror() may return a static buffer that another thread overwrites; use a reentrant variant.
// Overloads pick whichever strerror_r the C library declares (GNU: returns char*, XSI: int).
[[maybe_unused]] const char* StrerrorResult(const char* result, const char* /*buf*/) {
  return result;
}
[[maybe_unused]] const char* StrerrorResult(int result, const char* buf) {
  return result == 0 ? buf : "unknown error";
}

std::string ErrnoText(int err) {
  char buf[128];
  buf[0] = '\0';
  return StrerrorResult(strerror_r(err, buf, sizeof(buf)), buf);
}

// EIO from a read means the medium could not return the data (DataLoss); from a write, a sync or
// anything else it says nothing about the bytes already stored (Internal). Callers name a read by
// starting their context with "read", as in "read segment seg-000003.ckv at offset 4096".
bool IsReadContext(std::string_view context) {
  return absl::StartsWithIgnoreCase(Sv(context), "read");
}

absl::StatusCode CodeFor(int err, std::string_view context) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
      return absl::StatusCode::kResourceExhausted;
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EIO:
      return IsReadContext(context) ? absl::StatusCode::kDataLoss : absl::StatusCode::kInternal;
    case EINTR:
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EBUSY:
      return absl::StatusCode::kUnavailable;
    case ENOSYS:
    case EOPNOTSUPP:
#if ENOTSUP != EOPNOTSUPP
    case ENOTSUP:
#endif
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

// The payload that marks a full file system (IsNoSpace).
constexpr char kNoSpaceUrl[] = "type.googleapis.com/ckv.NoSpace";

absl::Status ErrnoToStatus(int err, std::string_view context) {
  absl::Status s(CodeFor(err, context),
                 absl::StrCat(Sv(context), ": ", ErrnoText(err), " (errno ", err, ")"));
  if (err == ENOSPC || err == EDQUOT) s.SetPayload(kNoSpaceUrl, absl::Cord(ErrnoText(err)));
  return s;
}

absl::Status NoSpaceError(std::string_view message) {
  absl::Status s = absl::ResourceExhaustedError(Sv(message));
  s.SetPayload(kNoSpaceUrl, absl::Cord("NoSpace"));
  return s;
}

absl::Status WithMessage(const absl::Status& s, std::string_view message) {
  absl::Status out(s.code(), Sv(message));
  s.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

bool IsNoSpace(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted && s.GetPayload(kNoSpaceUrl).has_value();
}

}  // namespace ckv
