// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: what a Redis Cluster node (or anyone who can write to it) sends ckv back. The
// cluster client's RESP reader (remote/resp_reader.h) over untrusted bytes cut into reads of
// arbitrary sizes, under the limits the client sets, each reply then read as the client reads
// a slot map and a redirection (remote/slot_map.h), and the chunk value's decoders
// (remote/chunk_value.h) over a valid value that the input changes, truncates or extends. Built and
// run by tests/fuzz/run_fuzz.sh (clang, -fsanitize=fuzzer,address,undefined). Any crash, sanitizer
// report, leak or broken invariant
// (__builtin_trap below) is a finding; a changed value that decodes is one too.
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckv/chunk_key.h"
#include "ckv/model_spec.h"
#include "remote/chunk_value.h"
#include "remote/resp_reader.h"
#include "remote/slot_map.h"

namespace {

using ckv::remote::Reply;
using ckv::remote::RespReader;

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

void CheckReply(const Reply& r, int depth) {
  Check(depth <= RespReader::kMaxDepth + 1);
  Check(r.str.size() <= static_cast<size_t>(RespReader::kMaxBulkBytes));
  for (const Reply& e : r.elements) CheckReply(e, depth + 1);
}

// The input as a reply stream, each read as long as the next input byte says (1..256 bytes),
// into whatever buffers the reader offers; replies taken as they complete, each under a limit
// the input picks among those the cluster client sets (a record's bytes, a chunk value's, the
// default, CLUSTER SLOTS's), some of them into reused storage, and each one read as a CLUSTER
// SLOTS answer and a MOVED/ASK text, as the client reads them. Run with -malloc_limit_mb=64:
// an allocation sized by what the input announces rather than by the bytes it sent is a finding.
void ReadReplies(std::span<const uint8_t> in) {
  static constexpr uint64_t kLimits[] = {64, 1 << 16, RespReader::kDefaultMaxReplyBytes, 16 << 20};
  static const ckv::remote::Endpoint kNode{"127.0.0.1", 7000};
  RespReader reader;
  std::string storage;
  size_t pos = 0;
  size_t cut = 0;
  uint64_t limit = 0;
  auto expect = [&] {
    const uint8_t pick = in.empty() ? 0 : in[cut % in.size()];
    limit = kLimits[pick % 4];
    reader.ExpectNextReply(limit, (pick & 4) != 0 ? &storage : nullptr);
  };
  expect();
  for (int reads = 0; reads < 100000; ++reads) {
    const size_t want = in.empty() ? 1 : size_t{in[cut++ % in.size()]} + 1;
    const ssize_t n = reader.ReadFrom([&](const iovec* iov, int iovcnt) -> ssize_t {
      size_t copied = 0;
      for (int i = 0; i < iovcnt && pos < in.size() && copied < want; ++i) {
        const size_t take = std::min({iov[i].iov_len, in.size() - pos, want - copied});
        std::memcpy(iov[i].iov_base, in.data() + pos, take);
        pos += take;
        copied += take;
      }
      return static_cast<ssize_t>(copied);
    });
    if (n <= 0) return;
    for (;;) {
      auto reply = reader.Next();
      if (!reply.ok()) return;  // a protocol error: the connection is dropped
      if (!reply->has_value()) break;
      const Reply& r = **reply;
      CheckReply(r, 0);
      if (r.type == Reply::Type::kString) Check(r.str.size() <= limit);
      auto map = ckv::remote::ParseSlotMap(r, kNode);
      if (map.ok()) {
        Check(map->slot_master.size() == ckv::remote::kClusterSlots);
        for (int32_t m : map->slot_master) Check(m < static_cast<int32_t>(map->masters.size()));
        for (const auto& e : map->masters) Check(e.port >= 1 && e.port <= 65535);
      }
      if (r.type == Reply::Type::kError) {
        if (auto target = ckv::remote::RedirectTarget(r.str, kNode)) {
          Check(target->port >= 1 && target->port <= 65535 &&
                ckv::remote::IsValidHost(target->host));
        }
      }
      expect();
    }
  }
}

ckv::ModelSpec SmallSpec() {
  ckv::ModelSpec s;
  s.model_id = "fuzz";
  s.layers = 2;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 4;
  s.chunk_tokens = 2;
  return s;
}

// A valid value, changed by the input: its first two bytes give the offset of the change, the
// next two the length to cut or extend the value to (0: keep it), the rest are XORed in.
void DecodeChangedValue(std::span<const uint8_t> in) {
  static const ckv::ModelSpec spec = SmallSpec();
  static const ckv::ChunkKey key{0x1234, 0x5678};
  static const std::string valid = [] {
    const ckv::remote::ChunkValueLayout layout = ckv::remote::LayoutOfChunkValue(spec);
    std::vector<std::vector<std::byte>> records(spec.layers);
    std::vector<std::span<const std::byte>> spans;
    for (uint32_t l = 0; l < spec.layers; ++l) {
      records[l].resize(layout.record_bytes);
      for (size_t i = 0; i < records[l].size(); ++i) records[l][i] = std::byte(i * 7 + l);
      spans.emplace_back(records[l]);
    }
    std::vector<std::byte> minmax(layout.minmax_bytes, std::byte{3});
    std::vector<std::byte> mean(layout.mean_bytes, std::byte{5});
    return ckv::remote::EncodeChunkValue(spec, key, spans, minmax, mean);
  }();
  const ckv::remote::ChunkValueLayout layout = ckv::remote::LayoutOfChunkValue(spec);
  Check(ckv::remote::DecodeChunkValue(spec, key, valid).ok());
  if (in.size() < 4) return;
  std::string value = valid;
  const size_t length = (size_t{in[2]} << 8 | in[3]) % (2 * valid.size());
  if (length != 0) value.resize(length, 'x');
  const size_t offset = (size_t{in[0]} << 8 | in[1]) % std::max<size_t>(1, value.size());
  for (size_t i = 4; i < in.size() && offset + i - 4 < value.size(); ++i) {
    value[offset + i - 4] = static_cast<char>(value[offset + i - 4] ^ in[i]);
  }
  const bool changed = value != valid;
  auto decoded = ckv::remote::DecodeChunkValue(spec, key, value);
  Check(decoded.ok() != changed);  // every change is caught (XXH3: 2^-64 a miss)
  if (decoded.ok()) {
    Check(decoded->records.size() == spec.layers);
    for (const auto& r : decoded->records) Check(r.size() == layout.record_bytes);
  } else {
    Check(decoded.status().code() == absl::StatusCode::kDataLoss);
  }
  // The head alone, as a session reads it, and each record read apart against it.
  const std::string_view head(value.data(), std::min(value.size(), layout.head_bytes));
  auto decoded_head = ckv::remote::DecodeChunkHead(spec, key, head);
  Check(decoded_head.ok() == (head == std::string_view(valid).substr(0, layout.head_bytes)));
  if (!decoded_head.ok()) return;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const size_t at = layout.RecordOffset(l);
    if (at >= value.size()) break;
    const size_t n = std::min(layout.record_bytes, value.size() - at);
    const auto* p = reinterpret_cast<const std::byte*>(value.data() + at);
    const bool same =
        n == layout.record_bytes && std::memcmp(p, valid.data() + at, layout.record_bytes) == 0;
    Check(ckv::remote::VerifyChunkRecord(spec, key, *decoded_head, l, {p, n}).ok() == same);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  ReadReplies(in);
  DecodeChangedValue(in);
  return 0;
}
