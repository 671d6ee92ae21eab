// TieredStore: where sealed blocks go when the device pool lets them go, and where a prefix
// hit finds them again (docs/adr/0013-tiered-store.md).
//
//   pool --evict--> tier 0 (host) --LRU evict--> tier 1 (disk) --LRU evict--> tier 2 (Redis)
//   pool <-promote-- any tier, on a prefix hit, after verification
//
// Tiers are ordered top to bottom. Each has a byte capacity and its own LRU; a record a tier
// evicts for space is demoted to the next tier (dropped below the last). Admission per tier:
//   write-back    a tier admits what the tier above (or the pool, for tier 0) evicts.
//   write-through every sealed block is also written at once to the first persistent tier
//                 (disk or Redis), so that a crash or a cold process finds it; tier 0 still
//                 admits what the pool evicts. A tier never admits a key it already holds.
// Promotion is inclusive: a block copied back into the pool stays in its tier.
//
// Records are block records (see BlockRecord below): the tokens, parent key, tenant domain,
// salt, prefix key and cache identity (model config, weights revision, layout) travel with the
// bytes and a fingerprint of the pool layout. On the way back each record is verified by its
// tier (a keyed MAC for disk and Redis, a checksum in host memory) and here (layout, cache
// identity, key, parent key, domain, salt, every token); a record that fails is quarantined in
// its tier and counted, and never reaches the pool.
//
// Writes to tiers other than a memory tier at the top are asynchronous: the store gathers them
// into batches of `batch_records` and a worker thread writes them; a block waiting in a batch is
// still found by Probe/Fetch. Flush() waits for every batch written so far.
//
// Thread-safety: the BlockSource methods, Flush and stats are called from the manager's owner
// thread; the worker thread is internal. Each tier is used under its own mutex.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tessera/block_source.h"
#include "tessera/disk_tier.h"
#include "tessera/hash.h"
#include "tessera/host_tier.h"
#include "tessera/metrics.h"
#include "tessera/redis_cluster.h"
#include "tessera/redis_tier.h"
#include "tessera/status.h"
#include "tessera/tier_key.h"

namespace tessera {

struct TierCounters {
  uint64_t records = 0;         // records held (as far as this process knows)
  uint64_t bytes = 0;           // payload bytes held
  uint64_t capacity_bytes = 0;  // 0: unlimited here (e.g. Redis, bounded by its maxmemory policy)
  uint64_t evictions = 0;       // records evicted for space
  uint64_t quarantined = 0;     // records that failed the tier's own checksum (never served)
};

// One level of the hierarchy. Implementations verify their own checksums on every read and
// report a damaged record as a miss (and count it), never as data.
class Tier {
 public:
  using EvictionListener = std::function<void(const DiskRecord&)>;
  virtual ~Tier() = default;
  virtual std::string_view name() const = 0;
  // Memory tiers are written in the owner thread; the others by the store's worker.
  virtual bool in_memory() const = 0;
  virtual bool persistent() const = 0;
  // May evict older records for space (each handed to the listener first).
  virtual Status PutBatch(std::span<const DiskRecord* const> records) = 0;
  // One entry per key: the verified record or nullopt.
  virtual std::vector<std::optional<DiskRecord>> GetBatch(std::span<const Hash128> keys) = 0;
  virtual std::vector<bool> ContainsBatch(std::span<const Hash128> keys) = 0;
  // The keys this process knows the tier holds, least recently used first (a Redis tier: none).
  virtual std::vector<Hash128> Keys() const = 0;
  virtual Status EraseBatch(std::span<const Hash128> keys) = 0;
  // Takes a record out of service that failed a check above the tier's checksum.
  virtual void Quarantine(const Hash128& key, const std::string& why) = 0;
  virtual TierCounters counters() const = 0;
  void SetEvictionListener(EvictionListener f) { on_evict_ = std::move(f); }

 protected:
  EvictionListener on_evict_;
};

// Host DRAM (HostTier), LRU within `capacity_bytes`.
std::unique_ptr<Tier> MakeHostTier(uint64_t capacity_bytes);
// A disk directory (DiskTier); LRU within `capacity_bytes` of payload (0: unlimited) on top of
// the segment files, seeded from the records found on open (oldest first).
Result<std::unique_ptr<Tier>> MakeDiskTier(const DiskTierOptions& options, uint64_t capacity_bytes);
// A Redis server (RedisTier). Capacity and LRU are the server's (maxmemory, allkeys-lru).
// Errors: as RedisTier::Open (options naming the field, e.g. a missing "secret").
Result<std::unique_ptr<Tier>> MakeRedisTier(const RedisTierOptions& options);
// A Redis Cluster (RedisClusterTier): keys spread over the nodes' slots. Errors: as
// RedisClusterTier::Open (options naming the field).
Result<std::unique_ptr<Tier>> MakeRedisClusterTier(const RedisClusterOptions& options);

enum class WritePolicy { kWriteBack, kWriteThrough };
Result<WritePolicy> ParseWritePolicy(std::string_view name);

struct TieredStoreOptions {
  WritePolicy write = WritePolicy::kWriteBack;
  uint32_t batch_records = 16;  // records per asynchronous batch
  bool asynchronous = true;     // false: lower-tier writes happen in the caller (tests, tools)
};

struct TieredStoreStats {
  uint64_t demoted = 0;                 // records a tier admitted from the level above (pool or tier)
  uint64_t written_through = 0;         // sealed blocks the persistent tier admitted at once (or at a checkpoint)
  uint64_t tier_hits = 0;               // blocks promoted into the pool
  uint64_t queued_hits = 0;             // of which were still queued for their tier's write
  uint64_t verify_failures = 0;         // records that failed the checks here (quarantined)
  uint64_t write_errors = 0;            // failed batch writes (e.g. a full disk); the records go lower
  uint64_t through_refused = 0;         // write-through or checkpoint records the persistent tier refused
  uint64_t batches = 0;                 // asynchronous batches completed
  uint64_t pending = 0;                 // records waiting to be written
  std::vector<uint64_t> hits_per_tier;  // by the tier holding the record (or writing it)
  std::string last_error;
};

// The layout of a block record (little-endian), the payload a tier stores for one block:
//   0  magic "TSBR", u16 version, u16 reserved
//   8  u32 block_tokens, u32 groups
//  16  u64 layout fingerprint (groups' names, formats, layers, page bytes, block tokens)
//  24  u32 domain, u32 reserved
//  32  u64 salt
//  40  prefix key (16), parent key (16)
//  72  cache identity (16): model config, weights revision, layout (CacheIdentityKey)
//  88  u64 page bytes (every layer of every group)
//  96  u64 state bytes (a hybrid model's boundary state; 0 for none)
// 104  u32 tokens[block_tokens], then zero padding to 64 bytes, then each group's block bytes,
//      then the state.
struct BlockRecordInfo {
  uint64_t fingerprint = 0;
  uint32_t block_tokens = 0;
  uint32_t groups = 0;
  uint64_t page_bytes = 0;
};
BlockRecordInfo BlockRecordInfoOf(const BlockPool& pool);
// REQUIRES: info == BlockRecordInfoOf(pool) (computed once per pool by the caller).
std::vector<std::byte> EncodeBlockRecord(const BlockRecordInfo& info, const BlockPool& pool, BlockId b,
                                         const SealedIdentity& id);
struct BlockRecordView {
  std::span<const std::byte> pages;  // each group's block bytes, in group order
  std::span<const std::byte> state;
};
// The record's page bytes and state if it is a well-formed record of this layout for exactly
// `link`; otherwise the reason it is not (kDataLoss on "record").
Result<BlockRecordView> CheckBlockRecord(const BlockRecordInfo& info, std::span<const std::byte> payload,
                                         const ChainLink& link);

class TieredStore final : public BlockSource {
 public:
  // `pool` gives the layout the records must match (the store does not keep it).
  // Errors: kInvalidArgument on "tiers" (none given).
  static Result<std::unique_ptr<TieredStore>> Create(const BlockPool& pool, TieredStoreOptions options,
                                                     std::vector<std::unique_ptr<Tier>> tiers);
  ~TieredStore() override;
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  void OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) override;
  void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) override;
  // Writes the block to the first persistent tier (skipped there when it holds the key already).
  void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) override;
  void BeginCheckpoint() override;
  // Writes every record of the memory tiers above the first persistent tier down to it (what the
  // pool evicted into host memory would otherwise die with the process), then Flush()es. Errors:
  // kIoError on "tier" when the persistent tier refused any record of this checkpoint, or there
  // is no persistent tier.
  Status FinishCheckpoint() override;
  size_t Probe(std::span<const ChainLink> links) override;
  size_t Fetch(const BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
               std::vector<std::vector<std::byte>>* states = nullptr) override;

  // Submits the partial batch and waits until every batch submitted so far is written.
  void Flush();
  TieredStoreStats stats() const;
  // The store's counters and each tier's (label tier="host|disk|redis|redis-cluster"), for
  // Prometheus. REQUIRES: as tier_counters.
  std::vector<MetricFamily> CollectMetrics() const;
  size_t tiers() const { return tiers_.size(); }
  // REQUIRES: Flush() first when asynchronous, or no concurrent writes.
  TierCounters tier_counters(size_t i) const;
  std::string_view tier_name(size_t i) const { return tiers_[i]->tier->name(); }

 private:
  struct Slot {
    std::unique_ptr<Tier> tier;
    mutable std::mutex mu;
  };
  struct Job {
    size_t tier;
    std::vector<std::shared_ptr<const DiskRecord>> records;
    bool through = false;  // a write-through (else a demotion)
  };
  TieredStore() = default;
  // Queues `r` for tier `t` (or writes it now when tier t is in memory); drops it past the last.
  void Demote(size_t t, std::shared_ptr<const DiskRecord> r, bool through = false);
  void SubmitLocked(size_t t);
  void WriteJob(Job& job);
  void Worker();
  std::optional<size_t> WriteThroughTier() const;
  std::shared_ptr<const DiskRecord> RecordOf(const BlockPool& pool, BlockId b, const SealedIdentity& id) const;
  // Asks tier after tier, top down and each under its mutex, about the links not resolved yet.
  void SearchTopDown(
      std::span<const ChainLink> links, const std::function<bool(size_t)>& resolved,
      const std::function<void(Tier&, size_t, std::span<const Hash128>, std::span<const size_t>)>& ask) const;

  TieredStoreOptions options_;
  BlockRecordInfo info_;
  uint16_t format_id_ = 0;
  std::vector<std::unique_ptr<Slot>> tiers_;

  // Asynchronous writes. pending_ holds every record queued and not yet written.
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> jobs_;
  std::vector<std::vector<std::shared_ptr<const DiskRecord>>> open_batch_;    // per tier
  std::vector<std::vector<std::shared_ptr<const DiskRecord>>> open_through_;  // per tier
  struct Pending {
    std::shared_ptr<const DiskRecord> record;
    size_t tier;  // where it is being written
  };
  std::unordered_map<Hash128, Pending, Hash128Hasher> pending_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
  uint64_t refused_at_checkpoint_ = 0;  // through_refused when the running checkpoint began

  mutable std::mutex stats_mu_;
  TieredStoreStats stats_;
};

}  // namespace tessera
