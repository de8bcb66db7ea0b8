// SPDX-License-Identifier: Apache-2.0
#include "bench/reprefill/fidelity.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "ckv/codec.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "kernels/estimate.h"
#include "kernels/fidelity.h"
#include "tools/synthetic_attention.h"

namespace ckv::bench {

absl::StatusOr<const std::vector<std::byte>*> Fidelity::Records(uint32_t conversation,
                                                                uint32_t layer) {
  const auto key = std::make_pair(conversation, layer);
  auto it = records_.find(key);
  if (it == records_.end()) {
    CKV_ASSIGN_OR_RETURN(std::vector<std::byte> records, w_.Records(conversation, layer));
    it = records_.emplace(key, std::move(records)).first;
  }
  return &it->second;
}

absl::StatusOr<const std::vector<std::byte>*> Fidelity::Served(KvCodec codec, uint32_t conversation,
                                                               uint32_t layer) {
  CKV_ASSIGN_OR_RETURN(const std::vector<std::byte>* original, Records(conversation, layer));
  if (codec == KvCodec::kNone) return original;
  const ModelSpec spec = WithCodec(w_.spec(), codec);
  const auto key = std::make_tuple(codec, conversation, layer);
  auto it = served_.find(key);
  if (it == served_.end()) {
    const size_t decoded = spec.DecodedRecordBytes();
    const size_t half = decoded / 2;
    std::vector<std::byte> out(original->size());
    std::vector<std::byte> stored(spec.RecordBytes());
    for (size_t at = 0; at + decoded <= original->size(); at += decoded) {
      const std::span<const std::byte> rec(original->data() + at, decoded);
      CKV_RETURN_IF_ERROR(EncodeRecord(spec, rec.first(half), rec.subspan(half), stored));
      CKV_RETURN_IF_ERROR(DecodeRecord(spec, stored, {out.data() + at, decoded}));
    }
    it = served_.emplace(key, std::move(out)).first;
  }
  return &it->second;
}

namespace {

// The session's virtual tokens against the fidelity's rebuild: keys, values and biases within
// float rounding (both decode the same 8-bit entries), the first difference named.
absl::Status SameTokens(const VirtualTokens& served, const VirtualTokens& rebuilt, uint32_t layer) {
  const std::pair<const char*, const std::vector<float>*> parts[] = {
      {"keys", &served.keys}, {"values", &served.values}, {"bias", &served.bias}};
  const std::vector<float>* want[] = {&rebuilt.keys, &rebuilt.values, &rebuilt.bias};
  for (size_t p = 0; p < 3; ++p) {
    const std::vector<float>& a = *parts[p].second;
    const std::vector<float>& b = *want[p];
    if (a.size() != b.size()) {
      return absl::InternalError(absl::StrCat("layer ", layer, ": the session served ", a.size(),
                                              " floats of virtual-token ", parts[p].first,
                                              "; the records' statistics give ", b.size()));
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(std::abs(a[i] - b[i]) <= 1e-4f * std::max(1.0f, std::abs(b[i])))) {
        return absl::InternalError(absl::StrCat("layer ", layer, ": virtual-token ", parts[p].first,
                                                "[", i, "] is ", a[i], " as served and ", b[i],
                                                " from the records' statistics"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Fidelity::Quality> Fidelity::Measure(
    KvCodec codec, const Request& r, const std::vector<std::vector<float>>& queries,
    const std::vector<std::vector<uint32_t>>& loaded,
    const std::vector<std::vector<uint32_t>>& attended,
    const std::vector<std::vector<uint32_t>>& estimated, const std::vector<VirtualTokens>& served) {
  const ModelSpec& spec = w_.spec();
  const kernels::KvShape shape = kernels::KvShape::Of(spec);
  const uint32_t c = spec.chunk_tokens;
  const size_t n = w_.Prefix(r).size() / c;
  const uint32_t window = w_.flags().window;
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  double rs = 0, rl = 0, es = 0;
  Quality q;
  q.layer_error.reserve(spec.layers);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    CKV_ASSIGN_OR_RETURN(const std::vector<std::byte>* records, Records(r.conversation, l));
    CKV_ASSIGN_OR_RETURN(const std::vector<std::byte>* served_records,
                         Served(codec, r.conversation, l));
    std::vector<const std::byte*> ptr(n), served_ptr(n);
    for (size_t j = 0; j < n; ++j) {
      ptr[j] = records->data() + j * spec.DecodedRecordBytes();
      served_ptr[j] = served_records->data() + j * spec.DecodedRecordBytes();
    }
    const auto key = std::make_tuple(r.conversation, r.turn, l);
    auto it = truth_.find(key);
    if (it == truth_.end()) {
      Truth t;
      CKV_ASSIGN_OR_RETURN(t.token_mass, kernels::TokenAttention(shape, queries[l], window, ptr));
      CKV_ASSIGN_OR_RETURN(kernels::GatheredKv kv, kernels::Gather(shape, ptr, all));
      CKV_ASSIGN_OR_RETURN(t.output, kernels::ReferenceAttention(shape, queries[l], window, kv));
      it = truth_.emplace(key, std::move(t)).first;
    }
    const std::vector<float>& mass = it->second.token_mass;
    CKV_ASSIGN_OR_RETURN(kernels::GatheredKv kv, kernels::Gather(shape, served_ptr, loaded[l]));
    double got_loaded = 0;
    for (uint32_t j : loaded[l]) {
      for (uint32_t t = j * c; t < (j + 1) * c; ++t) got_loaded += mass[t];
    }
    double got = got_loaded;
    if (!attended[l].empty()) {
      got = 0;
      // Keep only the attended tokens of the gathered chunks.
      const size_t row = size_t{spec.kv_heads} * spec.head_dim;
      kernels::GatheredKv kept;
      for (uint32_t i = 0; i < kv.tokens; ++i) {
        const uint32_t pos = kv.positions[i];
        if (!std::binary_search(attended[l].begin(), attended[l].end(), pos)) continue;
        kept.k.insert(kept.k.end(), kv.k.begin() + i * row, kv.k.begin() + (i + 1) * row);
        kept.v.insert(kept.v.end(), kv.v.begin() + i * row, kv.v.begin() + (i + 1) * row);
        kept.positions.push_back(pos);
        kept.tokens++;
      }
      for (uint32_t t : attended[l]) {
        if (t < mass.size()) got += mass[t];
      }
      kv = std::move(kept);
    }
    rs += got;
    rl += got_loaded;
    std::vector<float> out;
    if (l < estimated.size()) {
      // What the session estimated must be every chunk it did not load (the harness's store
      // gives every chunk its estimate part).
      std::vector<uint32_t> rest;
      for (uint32_t j = 0; j < n; ++j) {
        if (!std::binary_search(loaded[l].begin(), loaded[l].end(), j)) rest.push_back(j);
      }
      if (estimated[l] != rest) {
        return absl::InternalError(
            absl::StrCat("layer ", l, ": the session estimated ", estimated[l].size(),
                         " chunks; it loaded ", loaded[l].size(), " of ", n, ", so ", rest.size(),
                         " were to be estimated (a store "
                         "written before the estimate part? remove it to rebuild)"));
      }
    }
    if (l < estimated.size() && !estimated[l].empty()) {
      CKV_ASSIGN_OR_RETURN(kernels::ChunkStats stats,
                           kernels::ChunkStats::Of(shape, ptr, estimated[l]));
      stats.RoundTripInt8(shape.kv_heads, shape.head_dim);  // as the estimate parts store them
      CKV_ASSIGN_OR_RETURN(
          VirtualTokens vt,
          kernels::VirtualTokensOf(shape, queries[l], window, stats, kernels::EstimateKind::kMean));
      vt.chunks = estimated[l];  // the statistics' order is theirs
      if (l < served.size()) CKV_RETURN_IF_ERROR(SameTokens(served[l], vt, l));
      CKV_ASSIGN_OR_RETURN(out,
                           kernels::AttentionWithVirtualTokens(shape, queries[l], window, kv, vt));
    } else {
      CKV_ASSIGN_OR_RETURN(out, kernels::ReferenceAttention(shape, queries[l], window, kv));
    }
    const double e = kernels::RelativeL2Error(out, it->second.output);
    q.layer_error.push_back(e);
    es += e;
  }
  q.recall = rs / spec.layers;
  q.recall_loaded = rl / spec.layers;
  q.error = es / spec.layers;
  return q;
}

absl::Status Fidelity::MeasureRow(KvCodec codec, const std::vector<Request>& measured,
                                  const std::vector<RequestResult>& results, uint32_t limit,
                                  Row* row) {
  double rs = 0, rl = 0;
  std::vector<double> errors, layer_sum;
  for (size_t q = 0; q < measured.size(); ++q) {
    if (limit > 0 && q >= limit) break;
    const Request& req = measured[q];
    const RequestResult& res = results[q];
    CKV_ASSIGN_OR_RETURN(Quality got, Measure(codec, req, w_.Queries(req), res.loaded, res.attended,
                                              res.estimated, res.virtual_tokens));
    rs += got.recall;
    rl += got.recall_loaded;
    errors.push_back(got.error);
    layer_sum.resize(std::max(layer_sum.size(), got.layer_error.size()), 0.0);
    for (size_t l = 0; l < got.layer_error.size(); ++l) layer_sum[l] += got.layer_error[l];
  }
  if (errors.empty()) return absl::OkStatus();
  const double k = static_cast<double>(errors.size());
  row->quality_requests = errors.size();
  row->recall = rs / k;
  row->recall_loaded = rl / k;
  row->rel_error = std::accumulate(errors.begin(), errors.end(), 0.0) / k;
  row->rel_error_p95 = Percentile(errors, 0.95);
  const auto worst = std::max_element(layer_sum.begin(), layer_sum.end());
  if (worst != layer_sum.end()) {
    row->worst_layer = static_cast<int>(worst - layer_sum.begin());
    row->worst_layer_error = *worst / k;
  }
  return absl::OkStatus();
}

}  // namespace ckv::bench
