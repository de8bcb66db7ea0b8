// The Engine facade: today a thin layer over storage::ChunkStore that adds the key summaries
// to every Put. Re-Prefill sessions, tiers and
// the prefetch planner join it here.
#include "ckv/engine.h"

#include "engine/summaries.h"
#include "storage/chunk_store.h"

namespace ckv {
namespace {

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(std::unique_ptr<storage::ChunkStore> store) : store_(std::move(store)) {}

  absl::StatusOr<PutResult> Put(const ModelSpec& spec, std::span<const int32_t> tokens,
                                const KvTensors& kv) override {
    const storage::AuxRecords summaries = engine::SummaryRecords(spec, kv);
    return store_->Put(spec, tokens, kv, &summaries);
  }
  absl::StatusOr<uint64_t> Lookup(const ModelSpec& spec,
                                  std::span<const int32_t> tokens) override {
    return store_->Lookup(spec, tokens);
  }
  absl::Status ReadRecord(const ModelSpec& spec, const ChunkKey& key, uint32_t layer,
                          std::span<std::byte> out) override {
    return store_->ReadRecord(spec, key, layer, out);
  }
  absl::Status Delete(const ModelSpec& spec, std::span<const int32_t> tokens) override {
    return store_->Delete(spec, tokens);
  }
  absl::Status DeletePrefix(const ChunkKey& prefix_id) override {
    return store_->DeletePrefix(prefix_id);
  }
  std::vector<PrefixInfo> ListPrefixes() override { return store_->ListPrefixes(); }
  absl::StatusOr<std::vector<ChunkKey>> PrefixChunks(const ChunkKey& prefix_id,
                                                     ModelSpec* spec) override {
    return store_->PrefixChunks(prefix_id, spec);
  }
  absl::StatusOr<VerifyReport> Verify(const ProgressFn& progress) override {
    return store_->Verify(progress);
  }
  EngineStats Stats() override { return store_->Stats(); }

 private:
  std::unique_ptr<storage::ChunkStore> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     const std::string& path) {
  auto store = storage::ChunkStore::Open(options, path);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Engine>(new EngineImpl(std::move(*store)));
}

}  // namespace ckv
