// SPDX-License-Identifier: Apache-2.0
// tools/safetensors_internal.h: what the safetensors format (safetensors.cc) and the KV files
// (safetensors_kv.cc) share: how their messages name tensors. Not for use outside them.
#ifndef CKV_TOOLS_SAFETENSORS_INTERNAL_H_
#define CKV_TOOLS_SAFETENSORS_INTERNAL_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckv::safetensors::internal {

// The installed Abseil has its own absl::string_view, which std::string_view does not convert to.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A name for messages: escaped, and cut (a hostile header may hold megabyte names).
std::string Quoted(std::string_view name);
// "[4,2,64]".
std::string ShapeString(std::span<const uint64_t> shape);
// InvalidArgument "tensor 'NAME': WHAT".
absl::Status TensorError(std::string_view name, std::string_view what);

}  // namespace ckv::safetensors::internal

#endif  // CKV_TOOLS_SAFETENSORS_INTERNAL_H_
