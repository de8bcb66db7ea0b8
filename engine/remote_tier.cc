// SPDX-License-Identifier: Apache-2.0
// The shared tier on a Redis Cluster (see engine/remote_tier.h).
#include "engine/remote_tier.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckv/status.h"
#include "common/status_macros.h"
#include "engine/summaries.h"
#include "remote/chunk_value.h"

namespace ckv::engine {
namespace {

constexpr size_t kMaxKnownChunks = 1'000'000;
constexpr absl::Duration kLogInterval = absl::Seconds(10);
// Chunks a fill fetches per call (qwen2.5-7b: 32 x 917,784 bytes = 29 MB).
constexpr size_t kFetchBatch = 32;

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// `status` with the record it concerns named first.
absl::Status NameRecord(const absl::Status& status, const ModelSpec& spec,
                        const RemoteRecordFetch& f) {
  return absl::Status(status.code(), absl::StrCat("remote record ", f.key.ToHex(), "/L", f.layer,
                                                  " of ", spec.model_id, ": ", status.message()));
}

}  // namespace

absl::StatusOr<remote::ClusterOptions> RemoteTier::ClientOptions(const RemoteTierOptions& options) {
  remote::ClusterOptions co;
  for (const std::string& seed : options.seeds) {
    auto parsed = remote::ParseEndpoints(seed);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("remote.seeds: ", parsed.status().message()));
    }
    co.seeds.insert(co.seeds.end(), parsed->begin(), parsed->end());
  }
  if (co.seeds.empty()) return absl::InvalidArgumentError("remote.seeds: no endpoint");
  if (options.connect_timeout_ms == 0 || options.call_timeout_ms == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote timeouts must be positive: connect_timeout_ms ",
                     options.connect_timeout_ms, ", call_timeout_ms ", options.call_timeout_ms));
  }
  co.connect_timeout = absl::Milliseconds(options.connect_timeout_ms);
  co.call_timeout = absl::Milliseconds(options.call_timeout_ms);
  return co;
}

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const RemoteTierOptions& options,
                                                               storage::ChunkStore* store,
                                                               Logger* logger) {
  CKV_ASSIGN_OR_RETURN(remote::ClusterOptions co, ClientOptions(options));
  if (options.key_prefix.find('{') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote.key_prefix \"", options.key_prefix,
                     "\" contains '{': a hash tag would put every chunk in one slot"));
  }
  if (options.publish_queue_chunks < 1 || options.publish_queue_chunks > 1'000'000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote.publish_queue_chunks ", options.publish_queue_chunks, " not in 1..1000000"));
  }
  if (options.publish_batch_chunks < 1 || options.publish_batch_chunks > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote.publish_batch_chunks ", options.publish_batch_chunks, " not in 1..1024"));
  }
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<remote::ClusterClient> client,
                       remote::ClusterClient::Create(co));
  return std::unique_ptr<RemoteTier>(new RemoteTier(options, std::move(client), store, logger));
}

RemoteTier::RemoteTier(const RemoteTierOptions& options,
                       std::unique_ptr<remote::ClusterClient> client, storage::ChunkStore* store,
                       Logger* logger)
    : options_(options),
      client_(std::move(client)),
      store_(store),
      logger_(logger != nullptr ? logger : StderrLogger()) {
  {
    absl::MutexLock lock(&mu_);
    stats_.budget_bytes = options.budget_bytes;
  }
  publisher_ = std::thread([this] { PublishLoop(); });
  fetcher_ = std::thread([this] { FetchLoop(); });
}

RemoteTier::~RemoteTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  publisher_.join();
  fetcher_.join();
  std::deque<FetchJob> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(demand_fetches_);
    for (FetchJob& job : ahead_fetches_) left.push_back(std::move(job));
    ahead_fetches_.clear();
  }
  for (FetchJob& job : left) {
    job.fetch.done(NameRecord(absl::CancelledError("the tier closed"), *job.spec, job.fetch));
  }
}

RemoteTierStats RemoteTier::stats() const {
  absl::MutexLock lock(&mu_);
  RemoteTierStats s = stats_;
  s.queue_depth = queue_.size();
  s.client = client_->stats();
  return s;
}

void RemoteTier::LogRateLimited(LogLevel level, const std::string& message) {
  uint64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_log_ < kLogInterval) {
      ++logs_suppressed_;
      return;
    }
    last_log_ = now;
    suppressed = logs_suppressed_;
    logs_suppressed_ = 0;
  }
  std::string line = absl::StrCat("remote tier: ", message);
  if (suppressed > 0) absl::StrAppend(&line, " (", suppressed, " similar lines left out)");
  logger_->Log(level, line);
}

void RemoteTier::NoteError(const absl::Status& status, std::string_view what) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.errors;
    if (absl::IsDeadlineExceeded(status)) ++stats_.timeouts;
  }
  LogRateLimited(LogLevel::kWarning, absl::StrCat(Sv(what), ": ", status.ToString()));
}

void RemoteTier::Publish(const ModelSpec& spec, std::span<const ChunkKey> keys) {
  auto shared = std::make_shared<const ModelSpec>(spec);
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    if (known_.size() > kMaxKnownChunks) known_.clear();
    for (const ChunkKey& key : keys) {
      if (known_.contains(key)) continue;
      if (queue_.size() >= options_.publish_queue_chunks) {
        ++dropped;
        continue;
      }
      known_.insert(key);
      queue_.push_back(Job{shared, key});
      ++stats_.publish_queued;
    }
    stats_.publish_dropped += dropped;
  }
  if (dropped > 0) {
    LogRateLimited(LogLevel::kWarning,
                   absl::StrCat("publish queue full (", options_.publish_queue_chunks,
                                " chunks): dropped ", dropped, " chunks of ", spec.model_id));
  }
}

bool RemoteTier::WaitUntilPublished(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && fills_.empty() && in_flight_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RemoteTier::PublishLoop() {
  std::vector<Job> batch;
  while (true) {
    std::optional<FillJob> fill;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty() || !fills_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      batch.clear();
      // Publishing first: what a Put committed is what other machines wait for.
      if (queue_.empty()) {
        fill = std::move(fills_.front());
        fills_.pop_front();
        in_flight_ = 1;
      } else {
        while (!queue_.empty() && batch.size() < options_.publish_batch_chunks) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        in_flight_ = batch.size();
      }
    }
    if (fill.has_value()) {
      absl::StatusOr<uint64_t> local = store_->Lookup(*fill->spec, fill->tokens);
      if (local.ok()) Fill(*fill->spec, fill->tokens, *local);
    } else {
      PublishBatch(batch);
    }
    absl::MutexLock lock(&mu_);
    in_flight_ = 0;
  }
}

void RemoteTier::FillLater(const ModelSpec& spec, std::span<const int32_t> tokens) {
  constexpr size_t kMaxFills = 4;
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    if (fills_.size() >= kMaxFills) {
      ++stats_.fills_dropped;
      dropped = true;
    } else {
      ++stats_.fills_queued;
      fills_.push_back(FillJob{std::make_shared<const ModelSpec>(spec),
                               std::vector<int32_t>(tokens.begin(), tokens.end())});
    }
  }
  if (dropped) {
    LogRateLimited(LogLevel::kWarning,
                   absl::StrCat("fill queue full (", kMaxFills, " prefixes): a prefix of ",
                                spec.model_id, " read from the cluster is not stored locally"));
  }
}

RemoteHeads RemoteTier::FindHeads(const ModelSpec& spec, std::span<const int32_t> tokens,
                                  uint64_t local_chunks, uint64_t max_chunks) {
  RemoteHeads out;
  const uint32_t c = spec.chunk_tokens;
  const uint64_t total = std::min<uint64_t>(tokens.size() / c, local_chunks + max_chunks);
  if (local_chunks >= total) return out;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.head_reads;
  }
  const ChunkKey fp = spec.Fingerprint();
  const std::vector<ChunkKey> keys = ChainChunkKeys(fp, c, tokens.first(total * c));
  const remote::ChunkValueLayout layout = remote::LayoutOfChunkValue(spec);
  const std::string last = std::to_string(layout.head_bytes - 1);
  const absl::Time start = absl::Now();
  const absl::Duration call_timeout = absl::Milliseconds(options_.call_timeout_ms);
  bool chain_ends = false;
  // The heads' views point into these strings' buffers: no reallocation may move them.
  out.bytes.reserve(total - local_chunks);
  // In batches, one call each; no call starts past one deadline since the first (see Fill).
  for (uint64_t begin = local_chunks; begin < total && !chain_ends; begin += kFetchBatch * 4) {
    if (begin > local_chunks && absl::Now() - start > call_timeout) break;
    const uint64_t end = std::min<uint64_t>(total, begin + kFetchBatch * 4);
    std::vector<remote::Request> requests;
    for (uint64_t i = begin; i < end; ++i) {
      remote::Request& r = requests.emplace_back();
      r.argv = {"GETRANGE", remote::ChunkValueKey(options_.key_prefix, fp, keys[i]), "0", last};
      r.max_reply_bytes = layout.head_bytes;
    }
    std::vector<absl::StatusOr<remote::Reply>> replies = client_->Execute(requests);
    for (size_t j = 0; j < replies.size(); ++j) {
      if (!replies[j].ok()) {
        NoteError(replies[j].status(), "reading chunk heads");
        chain_ends = true;
        break;
      }
      std::string& head = replies[j]->str;
      if (head.empty()) {  // no such key (never published, or evicted)
        chain_ends = true;
        break;
      }
      const ChunkKey& key = keys[begin + j];
      out.bytes.push_back(std::move(head));
      absl::StatusOr<remote::DecodedChunkHead> d =
          remote::DecodeChunkHead(spec, key, out.bytes.back());
      if (!d.ok()) {
        out.bytes.pop_back();
        {
          absl::MutexLock lock(&mu_);
          ++stats_.corrupt_chunks;
        }
        LogRateLimited(LogLevel::kError, absl::StrCat("not served: ", d.status().ToString()));
        chain_ends = true;
        break;
      }
      out.keys.push_back(key);
      out.heads.push_back(std::move(*d));
    }
  }
  absl::MutexLock lock(&mu_);
  if (out.keys.empty()) ++stats_.head_misses;
  stats_.head_chunks += out.keys.size();
  return out;
}

void RemoteTier::FetchRecords(const ModelSpec& spec, std::vector<RemoteRecordFetch> fetches) {
  auto shared = std::make_shared<const ModelSpec>(spec);
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      for (RemoteRecordFetch& f : fetches) {
        (f.demand ? demand_fetches_ : ahead_fetches_).push_back(FetchJob{shared, std::move(f)});
      }
      return;
    }
  }
  for (RemoteRecordFetch& f : fetches) {
    f.done(NameRecord(absl::CancelledError("the tier is closing"), spec, f));
  }
}

void RemoteTier::CancelFetches(const void* owner) {
  std::vector<FetchJob> taken;
  {
    absl::MutexLock lock(&mu_);
    for (std::deque<FetchJob>* queue : {&demand_fetches_, &ahead_fetches_}) {
      std::deque<FetchJob> kept;
      for (FetchJob& job : *queue) {
        (job.fetch.owner == owner ? taken.emplace_back(std::move(job))
                                  : kept.emplace_back(std::move(job)));
      }
      queue->swap(kept);
    }
  }
  for (FetchJob& job : taken) {
    job.fetch.done(NameRecord(absl::CancelledError("taken back"), *job.spec, job.fetch));
  }
}

void RemoteTier::FetchLoop() {
  constexpr size_t kRecordsPerCall = 64;
  std::vector<FetchJob> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !demand_fetches_.empty() || !ahead_fetches_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      // Reads ahead that a layer now waits for go first: they were queued before any demand
      // read now queued, and a flood of demand reads must not hold them back.
      std::deque<FetchJob> ahead;
      for (FetchJob& job : ahead_fetches_) {
        const bool promoted = job.fetch.promoted != nullptr && job.fetch.promoted->load();
        (promoted && batch.size() < kRecordsPerCall ? batch.emplace_back(std::move(job))
                                                    : ahead.emplace_back(std::move(job)));
      }
      ahead_fetches_.swap(ahead);
      for (std::deque<FetchJob>* queue : {&demand_fetches_, &ahead_fetches_}) {
        while (!queue->empty() && batch.size() < kRecordsPerCall) {
          batch.push_back(std::move(queue->front()));
          queue->pop_front();
        }
      }
    }
    FetchBatch(batch);
    batch.clear();  // the callbacks hold their sessions' slots: let them go now
  }
}

void RemoteTier::FetchBatch(std::vector<FetchJob>& batch) {
  std::vector<remote::Request> requests;
  requests.reserve(batch.size());
  for (const FetchJob& job : batch) {
    const remote::ChunkValueLayout layout = remote::LayoutOfChunkValue(*job.spec);
    const size_t offset = layout.RecordOffset(job.fetch.layer);
    remote::Request& r = requests.emplace_back();
    r.argv = {"GETRANGE",
              remote::ChunkValueKey(options_.key_prefix, job.spec->Fingerprint(), job.fetch.key),
              std::to_string(offset), std::to_string(offset + layout.record_bytes - 1)};
    r.max_reply_bytes = layout.record_bytes;
  }
  std::vector<absl::StatusOr<remote::Reply>> replies = client_->Execute(requests);
  uint64_t records = 0, bytes = 0, corrupt = 0;
  absl::Status first_error;
  std::vector<absl::Status> statuses(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const ModelSpec& spec = *batch[i].spec;
    RemoteRecordFetch& f = batch[i].fetch;
    absl::Status status;
    if (!replies[i].ok()) {
      status = NameRecord(replies[i].status(), spec, f);
      if (first_error.ok()) first_error = replies[i].status();
    } else if (replies[i]->str.size() != f.dest.size()) {
      // GETRANGE of a missing key is empty; of a shorter value, short.
      status = absl::UnavailableError(
          absl::StrCat("remote record ", f.key.ToHex(), "/L", f.layer, " of ", spec.model_id, ": ",
                       replies[i]->str.size(), " bytes of ", f.dest.size(),
                       " (gone from the cluster since its head was read)"));
    } else {
      std::memcpy(f.dest.data(), replies[i]->str.data(), f.dest.size());
      status = remote::VerifyChunkRecord(spec, f.key, *f.head, f.layer, f.dest);
      if (status.ok()) {
        ++records;
        bytes += f.dest.size();
      } else {
        ++corrupt;
        LogRateLimited(LogLevel::kError, absl::StrCat("not served: ", status.ToString()));
      }
    }
    statuses[i] = std::move(status);
  }
  // Counted before any caller hears of its record: a session's Finish sees them counted.
  {
    absl::MutexLock lock(&mu_);
    stats_.session_records += records;
    stats_.session_record_bytes += bytes;
    stats_.corrupt_chunks += corrupt;
  }
  if (!first_error.ok()) NoteError(first_error, "reading records for a session");
  for (size_t i = 0; i < batch.size(); ++i) batch[i].fetch.done(statuses[i]);
}

void RemoteTier::PublishBatch(std::vector<Job>& batch) {
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<ChunkKey> item_keys;
  uint64_t skipped = 0;
  std::vector<std::vector<std::byte>> records;
  std::vector<std::span<const std::byte>> spans;
  for (const Job& job : batch) {
    const ModelSpec& spec = *job.spec;
    records.resize(spec.layers);
    spans.clear();
    bool ok = true;
    for (uint32_t l = 0; l < spec.layers && ok; ++l) {
      records[l].resize(spec.RecordBytes());
      absl::Status s = store_->ReadRecord(spec, job.key, l, records[l]);
      if (!s.ok()) {
        // Evicted or deleted since its Put (NotFound), or unreadable here: nothing to publish.
        ok = false;
        if (!absl::IsNotFound(s)) {
          LogRateLimited(LogLevel::kWarning,
                         absl::StrCat("publish chunk ", job.key.ToHex(), ": ", s.ToString()));
        }
      }
      spans.emplace_back(records[l]);
    }
    // Its summaries, which sessions on other machines select from (remote/chunk_value.h).
    absl::StatusOr<ChunkSummaries> minmax, mean;
    if (ok) {
      minmax = LoadSummaries(*store_, spec, std::span(&job.key, 1), SummaryPart::kMinMax);
      mean = LoadSummaries(*store_, spec, std::span(&job.key, 1), SummaryPart::kMean);
      if (!minmax.ok() || !mean.ok()) {
        ok = false;
        const absl::Status& s = !minmax.ok() ? minmax.status() : mean.status();
        if (!absl::IsNotFound(s)) {
          LogRateLimited(LogLevel::kWarning, absl::StrCat("publish chunk ", job.key.ToHex(),
                                                          " (summaries): ", s.ToString()));
        }
      }
    }
    if (!ok) {
      ++skipped;
      continue;
    }
    items.emplace_back(remote::ChunkValueKey(options_.key_prefix, spec.Fingerprint(), job.key),
                       remote::EncodeChunkValue(spec, job.key, spans, minmax->data, mean->data));
    item_keys.push_back(job.key);
  }
  std::vector<absl::Status> results;
  if (!items.empty()) results = client_->MultiSet(items);
  uint64_t published = 0, bytes = 0, failed = 0;
  absl::Status first_error;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) {
      ++published;
      bytes += items[i].second.size();
    } else {
      ++failed;
      if (first_error.ok()) first_error = results[i];
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.published_chunks += published;
    stats_.published_bytes += bytes;
    stats_.publish_failures += failed;
    stats_.publish_skipped += skipped;
    // A chunk that failed may be queued again by a later Put.
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) known_.erase(item_keys[i]);
    }
    if (published == 0 && failed > 0) {
      // The cluster failed a whole call. The chunks queued behind it would most likely fail the
      // same way, one call deadline each, and hold a closing engine (kvctl put waits for its
      // publishing) for minutes: they are dropped, counted, and a later Put queues them again.
      stats_.publish_dropped += queue_.size();
      for (const Job& job : queue_) known_.erase(job.key);
      queue_.clear();
    }
  }
  if (!first_error.ok()) {
    NoteError(first_error, absl::StrCat("publish of ", failed, " chunks failed"));
  }
}

std::vector<std::string> RemoteTier::ClusterKeys(const ChunkKey& fingerprint,
                                                 std::span<const ChunkKey> keys,
                                                 uint64_t from) const {
  std::vector<std::string> out;
  for (uint64_t i = from; i < keys.size(); ++i) {
    out.push_back(remote::ChunkValueKey(options_.key_prefix, fingerprint, keys[i]));
  }
  return out;
}

size_t RemoteTier::ExistingPrefix(const std::vector<std::string>& cluster_keys) {
  if (cluster_keys.empty()) return 0;
  std::vector<absl::StatusOr<bool>> exists = client_->MultiExists(cluster_keys);
  size_t found = 0;
  while (found < exists.size() && exists[found].ok() && *exists[found]) ++found;
  if (found < exists.size() && !exists[found].ok()) {
    NoteError(exists[found].status(), "how far the chain continues");
  }
  return found;
}

uint64_t RemoteTier::ChainLength(const ModelSpec& spec, std::span<const int32_t> tokens,
                                 uint64_t local_chunks) {
  const uint64_t total = tokens.size() / spec.chunk_tokens;
  if (local_chunks >= total) return 0;
  const ChunkKey fp = spec.Fingerprint();
  const std::vector<ChunkKey> keys = ChainChunkKeys(fp, spec.chunk_tokens, tokens);
  return ExistingPrefix(ClusterKeys(fp, keys, local_chunks));
}

uint64_t RemoteTier::Fill(const ModelSpec& spec, std::span<const int32_t> tokens,
                          uint64_t local_chunks) {
  const uint32_t c = spec.chunk_tokens;
  const uint64_t total = tokens.size() / c;
  if (local_chunks >= total) return local_chunks;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.fills;
  }
  const ChunkKey fp = spec.Fingerprint();
  const std::vector<ChunkKey> keys = ChainChunkKeys(fp, c, tokens);
  std::vector<std::string> cluster_keys = ClusterKeys(fp, keys, local_chunks);
  auto miss = [&]() {
    absl::MutexLock lock(&mu_);
    ++stats_.fill_misses;
    return local_chunks;
  };
  if (spec.codec != KvCodec::kNone) {
    // A Put takes K and V in the dtype and encodes them: records fetched already encoded would
    // be decoded and encoded again, not bit-exact (docs/remote.md). Sessions still read their
    // selected records from the cluster; the chain is not copied here.
    LogRateLimited(LogLevel::kInfo,
                   absl::StrCat("fill: ", spec.DebugString(),
                                ": chains of a spec with a codec are not copied locally"));
    return miss();
  }
  const absl::Time fill_start = absl::Now();
  const absl::Duration call_timeout = absl::Milliseconds(options_.call_timeout_ms);
  const size_t found = ExistingPrefix(cluster_keys);
  if (found == 0) return miss();
  cluster_keys.resize(found);
  // Fetched in batches, one call each, so that a long chain is not one call that must finish
  // within one deadline; a batch that fails ends the chain there (what came before is kept).
  // Verified in order: the chain ends at the first chunk that cannot be served.
  std::vector<std::unique_ptr<std::string>> kept;  // the values `decoded` points into
  std::vector<remote::DecodedChunkValue> decoded;
  uint64_t value_bytes = 0;
  bool chain_ends = false;
  for (size_t begin = 0; begin < cluster_keys.size() && !chain_ends; begin += kFetchBatch) {
    // No fetch starts past one call deadline since the fill began: a slow cluster delays the
    // caller by at most two deadlines, and the chunks not fetched are a miss.
    if (begin > 0 && absl::Now() - fill_start > call_timeout) break;
    const size_t end = std::min(cluster_keys.size(), begin + kFetchBatch);
    std::vector<absl::StatusOr<std::optional<std::string>>> values = client_->MultiGet(
        std::vector<std::string>(cluster_keys.begin() + begin, cluster_keys.begin() + end),
        remote::ChunkValueBytes(spec));
    for (size_t j = 0; j < values.size(); ++j) {
      if (!values[j].ok()) {
        NoteError(values[j].status(), "fetch");
        chain_ends = true;
        break;
      }
      if (!values[j]->has_value()) {  // evicted since the EXISTS
        chain_ends = true;
        break;
      }
      const ChunkKey& key = keys[local_chunks + begin + j];
      kept.push_back(std::make_unique<std::string>(std::move(**values[j])));
      absl::StatusOr<remote::DecodedChunkValue> d =
          remote::DecodeChunkValue(spec, key, *kept.back());
      if (!d.ok()) {
        {
          absl::MutexLock lock(&mu_);
          ++stats_.corrupt_chunks;
        }
        LogRateLimited(LogLevel::kError, absl::StrCat("not served: ", d.status().ToString()));
        chain_ends = true;
        break;
      }
      value_bytes += kept.back()->size();
      decoded.push_back(std::move(*d));
    }
  }
  if (decoded.empty()) return miss();

  // The Put of the whole chain up to the last fetched chunk: the locally stored chunks' records
  // are read back (the Put skips writing them), the fetched ones come from the values.
  const uint64_t chunks = local_chunks + decoded.size();
  const size_t chunk_half = size_t{c} * spec.TokenBytesPerLayer();  // K (or V) of one chunk
  std::vector<std::vector<std::byte>> k(spec.layers), v(spec.layers);
  for (uint32_t l = 0; l < spec.layers; ++l) {
    k[l].resize(chunks * chunk_half);
    v[l].resize(chunks * chunk_half);
  }
  std::vector<std::byte> record(spec.RecordBytes());
  for (uint64_t i = 0; i < chunks; ++i) {
    for (uint32_t l = 0; l < spec.layers; ++l) {
      const std::byte* src;
      if (i < local_chunks) {
        absl::Status s = store_->ReadRecord(spec, keys[i], l, record);
        if (!s.ok()) {
          // Evicted locally since the Lookup: a miss now; the next request tries again.
          LogRateLimited(LogLevel::kWarning,
                         absl::StrCat("fill: local chunk ", keys[i].ToHex(), ": ", s.ToString()));
          return miss();
        }
        src = record.data();
      } else {
        src = decoded[i - local_chunks].records[l].data();
      }
      std::memcpy(k[l].data() + i * chunk_half, src, chunk_half);
      std::memcpy(v[l].data() + i * chunk_half, src + chunk_half, chunk_half);
    }
  }
  KvTensors kv;
  kv.tokens = chunks * c;
  for (uint32_t l = 0; l < spec.layers; ++l) {
    kv.k.emplace_back(k[l]);
    kv.v.emplace_back(v[l]);
  }
  const storage::AuxRecords summaries = SummaryRecords(spec, kv);
  absl::StatusOr<PutResult> put = store_->Put(spec, tokens.first(kv.tokens), kv, &summaries);
  if (!put.ok()) {
    LogRateLimited(LogLevel::kWarning,
                   absl::StrCat("fill: storing ", decoded.size(),
                                " fetched chunks locally: ", put.status().ToString()));
    return miss();
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.fetched_chunks += decoded.size();
    stats_.fetched_bytes += value_bytes;
    // Fetched from the cluster: no need to publish them again.
    for (uint64_t i = local_chunks; i < chunks; ++i) known_.insert(keys[i]);
  }
  return chunks;
}

RemoteCheckReport RemoteTier::Check(const ModelSpec& spec, std::span<const ChunkKey> keys) {
  RemoteCheckReport report;
  const ChunkKey fp = spec.Fingerprint();
  std::vector<std::byte> local(spec.RecordBytes());
  constexpr size_t kBatch = 64;
  auto problem = [&](std::string line) {
    if (report.problems.size() < 100) report.problems.push_back(std::move(line));
  };
  for (size_t begin = 0; begin < keys.size(); begin += kBatch) {
    const size_t end = std::min(keys.size(), begin + kBatch);
    std::vector<std::string> cluster_keys;
    for (size_t i = begin; i < end; ++i) {
      cluster_keys.push_back(remote::ChunkValueKey(options_.key_prefix, fp, keys[i]));
    }
    std::vector<absl::StatusOr<std::optional<std::string>>> values =
        client_->MultiGet(cluster_keys, remote::ChunkValueBytes(spec));
    for (size_t j = 0; j < values.size(); ++j) {
      const ChunkKey& key = keys[begin + j];
      ++report.chunks_checked;
      if (!values[j].ok()) {
        ++report.unreachable;
        continue;
      }
      if (!values[j]->has_value()) {
        ++report.missing;
        continue;
      }
      absl::StatusOr<remote::DecodedChunkValue> d =
          remote::DecodeChunkValue(spec, key, **values[j]);
      if (!d.ok()) {
        ++report.corrupt;
        problem(std::string(d.status().message()));
        continue;
      }
      bool same = true;
      for (uint32_t l = 0; l < spec.layers && same; ++l) {
        absl::Status s = store_->ReadRecord(spec, key, l, local);
        same = s.ok() && std::memcmp(local.data(), d->records[l].data(), local.size()) == 0;
      }
      if (same) {
        ++report.present;
      } else {
        ++report.differing;
        problem(absl::StrCat("remote chunk ", key.ToHex(), " of ", spec.model_id,
                             ": verified, but its records differ from the local store's"));
      }
    }
  }
  return report;
}

absl::StatusOr<std::vector<RemoteNodeReport>> DescribeCluster(const RemoteTierOptions& options) {
  CKV_ASSIGN_OR_RETURN(remote::ClusterOptions co, RemoteTier::ClientOptions(options));
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<remote::ClusterClient> client,
                       remote::ClusterClient::Create(co));
  CKV_ASSIGN_OR_RETURN(auto masters, client->Masters());
  // "field:value" lines of an INFO reply.
  auto info_field = [](const std::string& info, std::string_view field) -> std::string {
    for (absl::string_view line : absl::StrSplit(info, '\n')) {
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const absl::string_view f(field.data(), field.size());
      if (line.size() > f.size() && line.substr(0, f.size()) == f && line[f.size()] == ':') {
        return std::string(line.substr(f.size() + 1));
      }
    }
    return "";
  };
  auto as_uint = [](const std::string& text) {
    uint64_t v = 0;
    return absl::SimpleAtoi(text, &v) ? v : 0;
  };
  std::vector<RemoteNodeReport> out;
  for (const auto& [endpoint, slots] : masters) {
    RemoteNodeReport r;
    r.endpoint = endpoint.ToString();
    r.slots = slots;
    absl::StatusOr<remote::Reply> dbsize = client->ExecuteOn(endpoint, {"DBSIZE"});
    absl::StatusOr<remote::Reply> memory = client->ExecuteOn(endpoint, {"INFO", "memory"});
    absl::StatusOr<remote::Reply> stats = client->ExecuteOn(endpoint, {"INFO", "stats"});
    if (!dbsize.ok() || !memory.ok() || !stats.ok()) {
      r.error = std::string((!dbsize.ok()   ? dbsize.status()
                             : !memory.ok() ? memory.status()
                                            : stats.status())
                                .message());
      out.push_back(std::move(r));
      continue;
    }
    r.keys = static_cast<uint64_t>(dbsize->integer);
    r.used_memory_bytes = as_uint(info_field(memory->str, "used_memory"));
    r.maxmemory_bytes = as_uint(info_field(memory->str, "maxmemory"));
    r.maxmemory_policy = info_field(memory->str, "maxmemory_policy");
    r.evicted_keys = as_uint(info_field(stats->str, "evicted_keys"));
    r.keyspace_hits = as_uint(info_field(stats->str, "keyspace_hits"));
    r.keyspace_misses = as_uint(info_field(stats->str, "keyspace_misses"));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ckv::engine
