// BlockManager: the calls a scheduler makes each step.
//
//   Admit        create a request; returns its cached prefix (whole blocks, tokens verified)
//   AllocateSlots make room for N more tokens (all-or-nothing)
//   Append       write the KV of new tokens (through a writer callback) and seal full blocks
//   Fork         share the block table with a new request (copy-on-write on the first write
//                into a shared block that is not sealed yet)
//   Free         release the request's references (sealed blocks stay cached for reuse)
//   BlockTable   the request's block ids, in token order
//
// The pools are derived from the model geometry through the same layout code the ledger uses,
// so bytes_held() equals the ledger's committed bytes for the same state.
//
// Thread-safety: single owner — one scheduler thread calls every method. metrics() returns
// atomics that any thread may read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/block_index.h"
#include "tessera/block_pool.h"
#include "tessera/block_source.h"
#include "tessera/geometry.h"
#include "tessera/hash.h"
#include "tessera/ledger.h"
#include "tessera/metrics.h"
#include "tessera/status.h"

namespace tessera {

struct RequestId {
  uint32_t value = UINT32_MAX;
  friend bool operator==(RequestId, RequestId) = default;
};

struct ManagerOptions {
  std::string kv_format;       // empty: the model's default
  std::string indexer_format;  // empty: the default
  std::optional<uint64_t> block_tokens;
  Kernel kernel = Kernel::kFlashMla;
  uint32_t capacity_blocks = 1024;
  RegionKind region_kind = RegionKind::kHost;
  HashAlgorithm hash = HashAlgorithm::kXxh3;
  uint32_t hash_bits = 128;
  uint64_t hash_key_seed = 0;  // 0: a random per-store key
  // Non-empty: the secret the keys are derived from (>= 16 bytes; overrides hash_key_seed). A
  // persistent tier keeps one so that a later process computes the same prefix keys.
  std::vector<std::byte> hash_key;
  // The checkpoint's revision when known (e.g. a commit id); part of the cache identity
  // (CacheIdentityKey), so a fine-tune that keeps its base's config.json must set it to keep
  // their blocks apart.
  std::string weights_revision;
  bool content_dedup = true;
  // Tenants mapped to one shared domain; a tenant not listed is its own domain.
  std::unordered_map<uint32_t, uint32_t> tenant_domain;
};

struct RequestSpec {
  uint32_t tenant = 0;
  uint64_t cache_salt = 0;
  uint8_t priority = kDefaultRetentionPriority;
};

struct AdmitResult {
  RequestId id;
  uint64_t cached_tokens = 0;
  uint32_t cached_blocks = 0;
};

// Fills the record of token `position` (absolute) in layer `layer` of group `group`.
using KvWriter = std::function<void(uint32_t group, uint32_t layer, uint64_t position, const RecordView& record)>;

struct ManagerMetrics {
  std::atomic<uint64_t> requests_admitted{0};
  std::atomic<uint64_t> forks{0};
  std::atomic<uint64_t> cow_copies{0};
  std::atomic<uint64_t> prefix_hit_tokens{0};
  std::atomic<uint64_t> prefix_miss_tokens{0};
  std::atomic<uint64_t> prefix_hit_blocks{0};
  std::atomic<uint64_t> prefix_miss_blocks{0};  // full prompt blocks not served from cache
  std::atomic<uint64_t> out_of_blocks{0};
  std::atomic<uint64_t> tier_hit_blocks{0};  // prompt blocks promoted from the block source
  std::atomic<uint64_t> tier_hit_tokens{0};
};

class BlockManager {
 public:
  // Errors: as ComputeLedger for the format options; kInvalidArgument on "model" for a model
  // whose paged caches are compressed (DeepSeek-V4: the hybrid layer manages those).
  static Result<std::unique_ptr<BlockManager>> Create(const Geometry& g, const ManagerOptions& options);

  // The prompt's longest verified cached prefix: from the pool, then (when a block source is
  // set) promoted from the source into fresh blocks as far as it verifies.
  Result<AdmitResult> Admit(std::span<const uint32_t> prompt, const RequestSpec& spec);
  // Makes the request able to hold `n` more tokens, copying any slot it shares with a fork and
  // has not sealed (so that Append cannot run out of blocks). kOutOfBlocks changes nothing.
  Status AllocateSlots(RequestId r, uint64_t n);
  // REQUIRES: slots for tokens.size() more tokens. Writes, seals full blocks (prefix key,
  // content dedup) and copies a shared unsealed block before its first write.
  Status Append(RequestId r, std::span<const uint32_t> tokens, const KvWriter& writer);
  Result<RequestId> Fork(RequestId parent);
  Status Free(RequestId r);

  std::span<const BlockId> BlockTable(RequestId r) const;
  uint64_t Tokens(RequestId r) const;
  // The record of token `position` of request `r` (read-only).
  Result<RecordView> Record(RequestId r, uint32_t group, uint32_t layer, uint64_t position) const;
  size_t live_requests() const { return live_; }

  // Pages plus block metadata of every block that is not free.
  uint64_t bytes_held() const { return pool_->bytes_held(); }
  const BlockPool& pool() const { return *pool_; }
  BlockPool& mutable_pool() { return *pool_; }
  const BlockIndex& index() const { return *index_; }
  BlockIndex& mutable_index() { return *index_; }
  const ManagerMetrics& metrics() const { return metrics_; }
  // Every counter of the manager, its pool and its index, plus blocks and bytes per state;
  // safe to call from any thread (reads atomics only).
  std::vector<MetricFamily> CollectMetrics() const;
  uint32_t domain_of(uint32_t tenant) const;
  // Attaches a second level of blocks (not owned; nullptr detaches). It is told of seals and
  // evictions and asked for prefix blocks on Admit.
  void SetBlockSource(BlockSource* source) { source_ = source; }
  // Hands every sealed block of the pool (live or cached) to the block source's OnCheckpoint and
  // waits until the source has made it persistent; returns how many (0 without a source), or the
  // source's error (then some blocks are not on persistent storage).
  Result<uint64_t> Checkpoint();

 private:
  struct Request {
    bool live = false;
    uint32_t tenant = 0;
    uint32_t domain = 0;
    uint64_t salt = 0;
    uint8_t priority = kDefaultRetentionPriority;
    uint64_t tokens = 0;                // tokens written
    std::vector<uint32_t> token_ids;    // the tokens of the unsealed tail block
    std::vector<BlockId> table;         // block per block_tokens tokens (allocated slots)
    std::vector<PrefixRef> chain;       // one per sealed block
  };

  BlockManager() = default;
  Request* Get(RequestId r);  // nullptr when not live
  static Status NoRequest(RequestId r);
  const Request* GetConst(RequestId r) const;
  Status CopyOnWrite(Request& req, size_t slot);
  // Slots that the next n tokens land in which are shared with a fork and not sealed.
  uint32_t SharedSlots(const Request& req, uint64_t n) const;
  Status UnshareSlots(Request& req, uint64_t n);
  Status OutOfBlocks(uint64_t needed);
  uint32_t NewRequestSlot();

  ManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockIndex> index_;
  std::vector<Request> requests_;
  std::vector<uint32_t> free_request_ids_;
  size_t live_ = 0;
  uint32_t block_tokens_ = 0;
  BlockSource* source_ = nullptr;
  ManagerMetrics metrics_;
};

// The ledger options that describe the same state as a manager built with `options` holding
// `batch` requests of `context` tokens each.
LedgerOptions LedgerOptionsFor(const ManagerOptions& options, uint64_t context, uint64_t batch);

}  // namespace tessera
