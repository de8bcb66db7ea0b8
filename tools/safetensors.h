// SPDX-License-Identifier: Apache-2.0
// tools/safetensors.h: safetensors files, and a prefix's KV imported from and exported to them.
//
// The format (Hugging Face's safetensors, the common way to hand tensors between programs):
//   bytes [0, 8)          N, uint64 little-endian: the length of the header
//   bytes [8, 8 + N)      the header, UTF-8 JSON, possibly padded with trailing spaces:
//                           {"__metadata__": {"KEY": "VALUE", ...},             (optional)
//                            "NAME": {"dtype": "F16", "shape": [16, 2, 64],
//                                     "data_offsets": [BEGIN, END]}, ...}
//   bytes [8 + N, EOF)    the data area: every tensor's elements, row-major and little-endian, at
//                         [BEGIN, END) counted from the start of the data area
//
// Reader treats its input as hostile. It checks, and fails with a message saying what is wrong
// and where (naming the tensor):
//   - the header length: at most kMaxHeaderBytes, and within the file (DataLoss when the file is
//     shorter: it was truncated);
//   - the header: strict JSON (tools/json_reader.h) whose every member is a tensor entry with
//     exactly "dtype", "shape" and "data_offsets", or "__metadata__" mapping strings to strings;
//   - dtypes: F16, BF16, F32, I32, I64 (others are valid safetensors that ckv does not read);
//   - shapes: rank <= kMaxRank, every dimension <= kMaxDimension, element and byte counts
//     computed without overflow, END - BEGIN equal to the tensor's bytes;
//   - the data area: the tensors tile it, as safetensors writers lay it out: sorted by offset they
//     start at 0, each begins where the previous ends (no overlap, no gap), and the last ends at
//     the end of the file. A data area shorter than that is DataLoss (truncated); anything else
//     is InvalidArgument.
// The header is read into memory (at most kMaxHeaderBytes); tensor data is read on demand into
// the caller's buffer, so a file's data is never held twice.
//
// Writing (WriteFile) is deterministic: tensors sorted by name, their data in that order, the
// metadata first, the header padded with spaces to a multiple of 8 bytes (so the data area is
// 8-byte aligned). The file is written as tools/output_file.h says: under a unique temporary name
// in PATH's directory (never through a link planted there), mode 0600, fsync'd and renamed over
// PATH, so PATH is either the old file or the complete new one.
//
// KV files. ExportKv writes a prefix as:
//   token_ids          I32 [tokens]
//   layers.{l}.key     [tokens, kv_heads, head_dim] in the spec's dtype, for every layer l
//   layers.{l}.value   the same
//   __metadata__       {"model_id": ..., "dtype": "fp16" | "bf16" | "fp32", "chunk_tokens": "16"}
// and ImportKv reads such a file back, also accepting token_ids as I64, K/V as
// [kv_heads, tokens, head_dim] (as many inference engines hold them per layer), and token ids
// given apart from the file (ReadTokenIdsFile). Import of an export gives back the same bytes;
// export of an import of a file ExportKv wrote gives back the same file.
//
// This code assumes a little-endian host (as all of ckv does): tensor bytes are copied as they are.
//
// Thread-safety: functions are reentrant. A Reader's const methods may be called from several
// threads at once (file reads are positioned).
#ifndef CKV_TOOLS_SAFETENSORS_H_
#define CKV_TOOLS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckv/engine.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"

namespace ckv::safetensors {

// Limits on what Reader accepts. The header limit is the reference implementation's (100 MB);
// rank and dimension limits are far past any real tensor and keep the arithmetic small.
inline constexpr uint64_t kMaxHeaderBytes = 100u << 20;
inline constexpr size_t kMaxRank = 8;
inline constexpr uint64_t kMaxDimension = uint64_t{1} << 40;

// The element types ckv reads and writes. Safetensors spells them "F16", "BF16", "F32", "I32",
// "I64".
enum class Dtype : uint8_t { kF16, kBF16, kF32, kI32, kI64 };
std::string_view DtypeName(Dtype dtype);
size_t DtypeBytes(Dtype dtype);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF16;
  std::vector<uint64_t> shape;  // empty for a scalar
  uint64_t data_begin = 0;      // offsets in the data area; data_end - data_begin bytes
  uint64_t data_end = 0;
  uint64_t bytes() const { return data_end - data_begin; }
};

class Reader {
 public:
  // Opens the file at `path` and reads and checks its header. Errors: the mapped open/read error,
  // InvalidArgument for a file that is not a regular file or not valid as described above,
  // DataLoss for a truncated one.
  static absl::StatusOr<std::unique_ptr<Reader>> OpenFile(const std::string& path);
  // Reads from `bytes`, which must outlive the Reader. Same checks.
  static absl::StatusOr<std::unique_ptr<Reader>> FromBuffer(std::span<const std::byte> bytes);

  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr.
  const TensorInfo* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads the data of `tensor` (one of tensors()) into `out`. REQUIRES: out.size() ==
  // tensor.bytes(). Errors: the mapped read error; DataLoss when the file shrank since it was
  // opened.
  absl::Status Read(const TensorInfo& tensor, std::span<std::byte> out) const;
  // Reads out.size() bytes of `tensor`'s data from byte `offset` of it (a slice of a large
  // tensor, e.g. one conversation's K of a profile file). Errors: InvalidArgument when
  // [offset, offset + out.size()) is not within the tensor; Read's otherwise.
  absl::Status ReadRange(const TensorInfo& tensor, uint64_t offset, std::span<std::byte> out) const;

 private:
  Reader() = default;
  // Reads and checks the length and the header of a source of `size` bytes.
  absl::Status Init(uint64_t size);
  absl::Status ParseHeader(std::string_view header, uint64_t data_bytes);
  absl::Status ReadAt(uint64_t offset, std::span<std::byte> out) const;

  int fd_ = -1;       // the file, or -1 when reading from buffer_
  std::string path_;  // for messages
  std::span<const std::byte> buffer_;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: `data` holds product(shape) elements of `dtype`, little-endian, row-major.
struct TensorData {
  std::string name;
  Dtype dtype = Dtype::kF16;
  std::vector<uint64_t> shape;
  std::span<const std::byte> data;
};

// Writes `tensors` and `metadata` (omitted when empty) to `path` as described above. `progress`,
// if set, is called with data bytes written and their total. Errors: InvalidArgument for a
// tensor whose data does not match its shape, duplicate or empty names, the name "__metadata__",
// or names and metadata that are not UTF-8; tools::WriteOutputFile's errors (the temporary file
// is removed then).
absl::Status WriteFile(const std::string& path, std::vector<TensorData> tensors,
                       const std::map<std::string, std::string>& metadata,
                       const ProgressFn& progress = nullptr);

// Tensor and metadata names of KV files.
inline constexpr std::string_view kTokenIdsTensor = "token_ids";
inline constexpr std::string_view kMetaModelId = "model_id";
inline constexpr std::string_view kMetaDtype = "dtype";
inline constexpr std::string_view kMetaChunkTokens = "chunk_tokens";
std::string KeyTensorName(uint32_t layer);    // "layers.{layer}.key"
std::string ValueTensorName(uint32_t layer);  // "layers.{layer}.value"

struct ImportOptions {
  // Take the dtype from the file's K/V tensors. When false, a file whose dtype differs from
  // spec.dtype is FailedPrecondition. Default: false.
  bool dtype_from_file = false;
  // Take the model id / chunk size from the file's __metadata__ ("model_id", "chunk_tokens", as
  // ExportKv writes them) when it has them; the spec's otherwise. Default: false.
  bool model_id_from_file = false;
  bool chunk_tokens_from_file = false;
  // Token ids given apart from the file (see ReadTokenIdsFile); the file must then hold no
  // token_ids tensor. Default: none, the file's token_ids tensor.
  std::optional<std::vector<int32_t>> token_ids;
  // Called with K/V bytes read and their total.
  ProgressFn progress;
  // Most K and V bytes (all layers) an import reads into memory, checked from the shapes before
  // anything is allocated: a sparse file can claim terabytes that its size check lets through.
  // Default: 8 GiB (kvctl replay's bound on one request's KV).
  uint64_t max_kv_bytes = uint64_t{8} << 30;
  // How the error for a file over max_kv_bytes names the limit (kvctl: its flag).
  // Default: "ImportOptions::max_kv_bytes".
  std::string max_kv_bytes_name = "ImportOptions::max_kv_bytes";
};

// Most token ids an import takes (from the token_ids tensor or a JSON file), checked before they
// are read. 2^24, as ReadTokenIdsFile.
inline constexpr uint64_t kMaxImportTokens = uint64_t{1} << 24;

// How the file held K and V.
enum class KvLayout {
  kTokensFirst,
  kHeadsFirst
};  // [tokens, kv_heads, head_dim] / [kv_heads, ...]

// A prefix's token ids and KV, read from a file.
struct ImportedKv {
  ModelSpec spec;  // the spec given, with the fields taken from the file
  std::vector<int32_t> token_ids;
  KvTensors kv;  // [tokens, kv_heads, head_dim] per layer; views into buffers
  KvLayout file_layout = KvLayout::kTokensFirst;
  // tokens == kv_heads, so both layouts fit the shapes; read as tokens-first.
  bool layout_ambiguous = false;
  std::vector<std::unique_ptr<std::byte[]>> buffers;  // owns kv's memory (moves keep it valid)
};

// Reads the KV of a prefix from `file` for `spec` (layers, kv_heads, head_dim; see ImportOptions
// for the rest). The file must hold exactly: token_ids (I32 or I64, [tokens], every id in
// [0, 2^31)) unless options.token_ids is set, and layers.{l}.key and layers.{l}.value for every
// layer of the spec, all of one dtype among F16, BF16, F32, each shaped [tokens, kv_heads,
// head_dim] or each shaped [kv_heads, tokens, head_dim] (the layout is detected from the shapes;
// when tokens == kv_heads both fit and tokens-first is taken, which the result says).
// Errors: InvalidArgument naming the tensor for anything missing, extra, misshaped or out of
// range (and for an invalid spec); FailedPrecondition for a dtype that differs from the spec's;
// the file's read errors. Bounds: more than kMaxImportTokens token ids, or K and V of more than
// options.max_kv_bytes, is InvalidArgument, found before either is allocated. Every K and V
// buffer is allocated before any is read; a failed allocation is ResourceExhausted.
absl::StatusOr<ImportedKv> ImportKv(const Reader& file, const ModelSpec& spec,
                                    const ImportOptions& options = {});

// Writes the prefix `token_ids` with its KV `kv` (laid out as ckv/kv.h says) to `path` as a KV
// file (see the top of this header). Errors: InvalidArgument for an invalid spec or tensors that
// do not match it and token_ids; WriteFile's errors.
absl::Status ExportKv(const std::string& path, const ModelSpec& spec,
                      std::span<const int32_t> token_ids, const KvTensors& kv,
                      const ProgressFn& progress = nullptr);

// Reads token ids from a JSON file holding one array of integers in [0, 2^31), e.g.
// [151644, 8948, 198], as a tokenizer's encode() output dumps with json.dump. (JSON rather than raw
// int32: it is what tokenizers print, and a wrong file fails loudly instead of reading as ids.)
// At most 2^24 ids. Errors: the mapped I/O error; InvalidArgument naming the path and the entry.
absl::StatusOr<std::vector<int32_t>> ReadTokenIdsFile(const std::string& path);

}  // namespace ckv::safetensors

#endif  // CKV_TOOLS_SAFETENSORS_H_
