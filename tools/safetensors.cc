// SPDX-License-Identifier: Apache-2.0
// safetensors files and KV import/export (see tools/safetensors.h).
#include "tools/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "tools/json_reader.h"
#include "tools/json_writer.h"
#include "tools/output_file.h"
#include "tools/safetensors_internal.h"

namespace ckv::safetensors {
namespace internal {

std::string Quoted(std::string_view name) {
  constexpr size_t kMax = 64;
  return absl::StrCat("'", absl::CHexEscape(Sv(name.substr(0, kMax))),
                      name.size() > kMax ? "...'" : "'");
}

std::string ShapeString(std::span<const uint64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::Status TensorError(std::string_view name, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(name), ": ", Sv(what)));
}

}  // namespace internal

namespace {

using internal::Quoted;
using internal::ShapeString;
using internal::Sv;
using internal::TensorError;

// Tensor bytes are copied as they are, and safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "ckv assumes a little-endian host");

constexpr std::string_view kMetadataKey = "__metadata__";
// Largest single read or write: progress moves, and Linux transfers at most ~2 GiB a call anyway.
constexpr size_t kIoPieceBytes = size_t{64} << 20;

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  size_t bytes;
};
constexpr DtypeEntry kDtypes[] = {
    {Dtype::kF16, "F16", 2}, {Dtype::kBF16, "BF16", 2}, {Dtype::kF32, "F32", 4},
    {Dtype::kI32, "I32", 4}, {Dtype::kI64, "I64", 8},
};

// Elements and bytes of a tensor of `shape` and `dtype`, or nullopt when they overflow 64 bits.
std::optional<uint64_t> TensorBytes(std::span<const uint64_t> shape, Dtype dtype) {
  uint64_t n = DtypeBytes(dtype);
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// A JSON value as a message shows it: "= " and the number, or what it is ("(an array)").
std::string ValueText(const tools::JsonValue& v) {
  if (const int64_t* i = v.AsInt()) return absl::StrCat(*i);
  if (const double* d = v.AsDouble()) return absl::StrCat(*d);
  return absl::StrCat("(", Sv(v.TypeName()), ")");
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& name, const tools::JsonValue& v) {
  const tools::JsonValue::Object* entry = v.AsObject();
  if (entry == nullptr) {
    return TensorError(name, absl::StrCat("entry is ", Sv(v.TypeName()), ", not an object"));
  }
  for (const auto& [key, value] : *entry) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return TensorError(name, absl::StrCat("unknown field ", Quoted(key)));
    }
  }
  TensorInfo t;
  t.name = name;

  const tools::JsonValue* dtype = v.Find("dtype");
  if (dtype == nullptr) return TensorError(name, "no dtype");
  const std::string* dtype_name = dtype->AsString();
  if (dtype_name == nullptr) {
    return TensorError(name, absl::StrCat("dtype is ", Sv(dtype->TypeName()), ", not a string"));
  }
  const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                  [&](const DtypeEntry& e) { return e.name == *dtype_name; });
  if (known == std::end(kDtypes)) {
    return TensorError(name, absl::StrCat("dtype ", Quoted(*dtype_name),
                                          " is not supported (supported: F16, BF16, F32, I32, "
                                          "I64)"));
  }
  t.dtype = known->dtype;

  const tools::JsonValue* shape = v.Find("shape");
  if (shape == nullptr) return TensorError(name, "no shape");
  const tools::JsonValue::Array* dims = shape->AsArray();
  if (dims == nullptr) {
    return TensorError(name, absl::StrCat("shape is ", Sv(shape->TypeName()), ", not an array"));
  }
  if (dims->size() > kMaxRank) {
    return TensorError(name,
                       absl::StrCat("rank ", dims->size(), " is over the limit of ", kMaxRank));
  }
  for (size_t i = 0; i < dims->size(); ++i) {
    const int64_t* d = (*dims)[i].AsInt();
    if (d == nullptr || *d < 0 || static_cast<uint64_t>(*d) > kMaxDimension) {
      return TensorError(name, absl::StrCat("shape[", i, "] ", ValueText((*dims)[i]),
                                            " is not an integer in 0..2^40"));
    }
    t.shape.push_back(static_cast<uint64_t>(*d));
  }
  const std::optional<uint64_t> bytes = TensorBytes(t.shape, t.dtype);
  if (!bytes) {
    return TensorError(name, absl::StrCat("shape ", ShapeString(t.shape), " of ", Sv(known->name),
                                          " has more than 2^64 bytes"));
  }

  const tools::JsonValue* offsets = v.Find("data_offsets");
  if (offsets == nullptr) return TensorError(name, "no data_offsets");
  const tools::JsonValue::Array* pair = offsets->AsArray();
  const int64_t* begin = pair != nullptr && pair->size() == 2 ? (*pair)[0].AsInt() : nullptr;
  const int64_t* end = pair != nullptr && pair->size() == 2 ? (*pair)[1].AsInt() : nullptr;
  if (begin == nullptr || end == nullptr || *begin < 0 || *end < 0) {
    if (pair == nullptr) {
      return TensorError(
          name, absl::StrCat("data_offsets is ", Sv(offsets->TypeName()), ", not [BEGIN, END]"));
    }
    const std::string given = absl::StrJoin(
        *pair, ", ",
        [](std::string* out, const tools::JsonValue& e) { out->append(ValueText(e)); });
    return TensorError(name, absl::StrCat("data_offsets [", given,
                                          "] is not [BEGIN, END] with integers in 0..2^63"));
  }
  t.data_begin = static_cast<uint64_t>(*begin);
  t.data_end = static_cast<uint64_t>(*end);
  if (t.data_end < t.data_begin) {
    return TensorError(name, absl::StrCat("data_offsets [", t.data_begin, ", ", t.data_end,
                                          "] end before they begin"));
  }
  if (t.bytes() != *bytes) {
    return TensorError(
        name, absl::StrCat("data_offsets [", t.data_begin, ", ", t.data_end, "] hold ", t.bytes(),
                           " bytes but shape ", ShapeString(t.shape), " of ", Sv(known->name),
                           " needs ", *bytes));
  }
  return t;
}

}  // namespace

std::string_view DtypeName(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].name; }
size_t DtypeBytes(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].bytes; }

// ---------------------------------------------------------------------------------------------
// Reader

absl::StatusOr<std::unique_ptr<Reader>> Reader::OpenFile(const std::string& path) {
  std::unique_ptr<Reader> r(new Reader());
  r->path_ = path;
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(r->fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  CKV_RETURN_IF_ERROR(r->Init(static_cast<uint64_t>(st.st_size)));
  return r;
}

absl::StatusOr<std::unique_ptr<Reader>> Reader::FromBuffer(std::span<const std::byte> bytes) {
  std::unique_ptr<Reader> r(new Reader());
  r->path_ = "<memory>";
  r->buffer_ = bytes;
  CKV_RETURN_IF_ERROR(r->Init(bytes.size()));
  return r;
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Reader::Init(uint64_t size) {
  if (size < 8) {
    return absl::DataLossError(
        absl::StrCat("file of ", size, " bytes, shorter than the 8-byte header length: truncated"));
  }
  uint64_t header_bytes = 0;
  CKV_RETURN_IF_ERROR(ReadAt(0, std::as_writable_bytes(std::span(&header_bytes, 1))));
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", header_bytes,
                                                   " is over the limit of ", kMaxHeaderBytes,
                                                   " bytes (not a safetensors file?)"));
  }
  if (header_bytes > size - 8) {
    return absl::DataLossError(absl::StrCat("header length ", header_bytes, " but only ", size - 8,
                                            " bytes follow it: truncated"));
  }
  std::string header(header_bytes, '\0');
  CKV_RETURN_IF_ERROR(ReadAt(8, std::as_writable_bytes(std::span(header))));
  data_start_ = 8 + header_bytes;
  return ParseHeader(header, size - data_start_);
}

absl::Status Reader::ParseHeader(std::string_view header, uint64_t data_bytes) {
  tools::JsonLimits limits;
  limits.max_bytes = kMaxHeaderBytes;
  limits.max_depth = 8;  // a valid header nests 3 deep; the checks below name what is wrong
  absl::StatusOr<tools::JsonValue> json = tools::ParseJson(header, limits);
  if (!json.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("header: ", json.status().message()));
  }
  const tools::JsonValue::Object* root = json->AsObject();
  if (root == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is ", Sv(json->TypeName()), ", not a JSON object"));
  }
  for (const auto& [name, value] : *root) {
    if (name == kMetadataKey) {
      const tools::JsonValue::Object* entries = value.AsObject();
      if (entries == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("__metadata__ is ", Sv(value.TypeName()), ", not an object"));
      }
      for (const auto& [key, text] : *entries) {
        if (text.AsString() == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("__metadata__ ", Quoted(key), " is ",
                                                         Sv(text.TypeName()), ", not a string"));
        }
        metadata_.emplace(key, *text.AsString());
      }
      continue;
    }
    if (name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    CKV_ASSIGN_OR_RETURN(TensorInfo t, ParseTensorEntry(name, value));
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data area: sorted by offset, each begins where the previous ends.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->data_begin, a->data_end) < std::pair(b->data_begin, b->data_end);
  });
  uint64_t end = 0;
  const TensorInfo* previous = nullptr;
  const TensorInfo* first_past_end = nullptr;
  for (const TensorInfo* t : by_offset) {
    const std::string range = absl::StrCat("data_offsets [", t->data_begin, ", ", t->data_end, "]");
    if (t->data_begin < end) {
      return TensorError(t->name,
                         absl::StrCat(range, " overlap tensor ", Quoted(previous->name), " at [",
                                      previous->data_begin, ", ", previous->data_end, "]"));
    }
    if (t->data_begin > end) {
      if (t->data_begin > data_bytes) {
        return TensorError(t->name, absl::StrCat(range, " start past the end of the data area (",
                                                 data_bytes, " bytes)"));
      }
      return TensorError(t->name, absl::StrCat(range, " leave bytes [", end, ", ", t->data_begin,
                                               ") of the data area unused (tensors must be "
                                               "contiguous)"));
    }
    if (first_past_end == nullptr && t->data_end > data_bytes) first_past_end = t;
    end = t->data_end;
    previous = t;
  }
  if (first_past_end != nullptr) {
    return absl::DataLossError(absl::StrCat(
        "the tensors need ", end, " bytes of data but the file holds ", data_bytes, " (tensor ",
        Quoted(first_past_end->name), " ends at ", first_past_end->data_end, "): truncated"));
  }
  if (end < data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(data_bytes - end,
                                                   " bytes after the last tensor's data (the "
                                                   "tensors end at ",
                                                   end, " of ", data_bytes, ")"));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return absl::OkStatus();
}

const TensorInfo* Reader::Find(std::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

absl::Status Reader::Read(const TensorInfo& tensor, std::span<std::byte> out) const {
  return ReadAt(data_start_ + tensor.data_begin, out);
}

absl::Status Reader::ReadRange(const TensorInfo& tensor, uint64_t offset,
                               std::span<std::byte> out) const {
  if (offset > tensor.bytes() || out.size() > tensor.bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("read ", path_, ": bytes [", offset, ", +",
                                                   out.size(), ") are not within tensor ",
                                                   tensor.name, " of ", tensor.bytes(), " bytes"));
  }
  return ReadAt(data_start_ + tensor.data_begin + offset, out);
}

absl::Status Reader::ReadAt(uint64_t offset, std::span<std::byte> out) const {
  if (fd_ < 0) {
    if (offset > buffer_.size() || out.size() > buffer_.size() - offset) {
      return absl::DataLossError(
          absl::StrCat("read ", path_, " at offset ", offset, ": past the end of the buffer"));
    }
    // memcpy with a null pointer is undefined even for 0 bytes, and empty spans may hold one.
    if (!out.empty()) std::memcpy(out.data(), buffer_.data() + offset, out.size());
    return absl::OkStatus();
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, std::min(out.size() - done, kIoPieceBytes),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoToStatus(errno, absl::StrCat("read ", path_, " at offset ", offset + done));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("read ", path_, ": the file ends at byte ",
                                              offset + done, ", before ", offset + out.size(),
                                              " (it shrank since it was opened)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Writer

absl::Status WriteFile(const std::string& path, std::vector<TensorData> tensors,
                       const std::map<std::string, std::string>& metadata,
                       const ProgressFn& progress) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorData& a, const TensorData& b) { return a.name < b.name; });
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorData& t = tensors[i];
    if (t.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (t.name == kMetadataKey || !tools::IsValidUtf8(t.name)) {
      return TensorError(t.name, "not a valid tensor name (UTF-8, not __metadata__)");
    }
    if (i > 0 && t.name == tensors[i - 1].name) return TensorError(t.name, "given twice");
    const std::optional<uint64_t> bytes = TensorBytes(t.shape, t.dtype);
    if (!bytes || *bytes != t.data.size()) {
      return TensorError(
          t.name, absl::StrCat(t.data.size(), " bytes of data for shape ", ShapeString(t.shape),
                               " of ", Sv(DtypeName(t.dtype))));
    }
    total += *bytes;
  }
  for (const auto& [key, value] : metadata) {
    if (!tools::IsValidUtf8(key) || !tools::IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("__metadata__ ", Quoted(key), ": key or value is not UTF-8"));
    }
  }

  tools::JsonWriter w;
  w.BeginObject();
  if (!metadata.empty()) {
    w.Key(kMetadataKey).BeginObject();
    for (const auto& [key, value] : metadata) w.Key(key).String(value);
    w.EndObject();
  }
  uint64_t offset = 0;
  for (const TensorData& t : tensors) {
    w.Key(t.name).BeginObject().Key("dtype").String(DtypeName(t.dtype)).Key("shape").BeginArray();
    for (uint64_t d : t.shape) w.Uint(d);
    w.EndArray().Key("data_offsets").BeginArray().Uint(offset).Uint(offset + t.data.size());
    w.EndArray().EndObject();
    offset += t.data.size();
  }
  w.EndObject();
  std::string header = w.str();
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", header.size(), " bytes: over the limit of ", kMaxHeaderBytes));
  }
  const uint64_t header_bytes = header.size();

  return tools::WriteOutputFile(path, [&](const tools::OutputWriteFn& write) -> absl::Status {
    CKV_RETURN_IF_ERROR(write(std::as_bytes(std::span(&header_bytes, 1))));
    CKV_RETURN_IF_ERROR(write(std::as_bytes(std::span(header))));
    uint64_t done = 0;
    for (const TensorData& t : tensors) {
      for (size_t at = 0; at < t.data.size(); at += kIoPieceBytes) {
        const std::span<const std::byte> piece =
            t.data.subspan(at, std::min(kIoPieceBytes, t.data.size() - at));
        CKV_RETURN_IF_ERROR(write(piece));
        done += piece.size();
        if (progress) progress(done, total);
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace ckv::safetensors
