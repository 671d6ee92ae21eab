// TieredStore: where sealed blocks go when the device pool lets them go, and where a prefix
// hit finds them again (docs/adr/0013-tiered-store.md).
//
//   pool --evict--> tier 0 (host) --LRU evict--> tier 1 (disk) --LRU evict--> tier 2 (Redis)
//   pool <-promote-- any tier, on a prefix hit, after verification
//
// Tiers (tier.h, made by tier_adapters.h) are ordered top to bottom. Each has a byte capacity and
// its own LRU; a record a tier evicts for space is demoted to the next tier (dropped below the
// last). Admission per tier:
//   write-back    a tier admits what the tier above (or the pool, for tier 0) evicts.
//   write-through every sealed block is also written at once to the first persistent tier
//                 (disk or Redis), so that a crash or a cold process finds it; tier 0 still
//                 admits what the pool evicts. A tier never admits a key it already holds.
// A batch a tier refuses (a full disk, Redis down) is counted and its records go one tier lower;
// below the last tier they are dropped, and Flush reports it.
// Promotion is inclusive: a block copied back into the pool stays in its tier.
//
// Records are block records (block_record.h): the tokens, parent key, tenant domain, salt, prefix
// key and cache identity travel with the bytes and a fingerprint of the pool layout. On the way
// back each record is verified by its tier (a keyed MAC for disk and Redis, a checksum in host
// memory) and here (layout, cache identity, key, parent key, domain, salt, every token); a record
// that fails is quarantined in its tier and counted, and never reaches the pool.
//
// Tensor parallelism (docs/adr/0023-single-writer.md): every rank of a TP group holds the same MLA
// latents, so each rank seals byte-identical records under the same keys. A tier the ranks share
// (Tier::shared(): Redis, a Redis Cluster) is written by one rank per block, the block's writer
// SingleWriterRank(key, tp_world); every other rank skips that write (the record goes on to the
// tier below as a refused one would; `left_to_writer` counts it) and only reads. A rank that
// asks for a block its writer has not written yet gets a miss, never other bytes. Private tiers
// (host memory, a disk directory) are written by every rank as before.
//
// Writes to tiers other than memory tiers are asynchronous: the store gathers them into batches
// of `batch_records` and a worker thread writes them; a block waiting in a batch is still found
// by Probe/Fetch. Flush() waits for every batch written so far.
//
// Thread-safety: the BlockSource methods, Flush and stats are called from the manager's owner
// thread; the worker thread is internal. Each tier is used under its own mutex (its Slot's mu).
// Locks are taken in this order, never the reverse (checked by Clang's -Wthread-safety-beta
// wherever one function nests them; see the `clang` preset):
//
//   Slot::mu of tier t  ->  Slot::mu of tier t+1  ->  queue_mu_  ->  stats_mu_
//
// - A tier's mu is held for every call into the tier. A tier evicts inside PutBatch and its
//   eviction listener demotes the record to tier t+1 while tier t's mu is still held: into a
//   memory tier at once (taking tier t+1's mu; so slot mutexes nest only downwards), otherwise
//   into the queue (taking queue_mu_).
// - queue_mu_ guards the open batches, the job queue, the pending map and the worker's state; the
//   worker counts a finished batch under stats_mu_ while holding it.
// - stats_mu_ guards the counters; nothing else is taken while it is held.
// - No tier is called with queue_mu_ or stats_mu_ held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/block_record.h"
#include "tessera/block_source.h"
#include "tessera/hash128.h"
#include "tessera/metrics.h"
#include "tessera/mutex.h"
#include "tessera/status.h"
#include "tessera/thread_annotations.h"
#include "tessera/tier.h"

namespace tessera {

enum class WritePolicy { kWriteBack, kWriteThrough };
Result<WritePolicy> ParseWritePolicy(std::string_view name);

struct TieredStoreOptions {
  WritePolicy write = WritePolicy::kWriteBack;
  uint32_t batch_records = 16;  // records per asynchronous batch
  bool asynchronous = true;     // false: lower-tier writes happen in the caller (tests, tools)
  // This process's rank in its tensor-parallel group and the group's size (1 .. kMaxTpWorld;
  // tp_rank < tp_world): a shared tier is written by one rank per block (above). 1: no group,
  // this process writes every block. Every rank of a group must give the same tp_world.
  uint32_t tp_rank = 0;
  uint32_t tp_world = 1;
};

// The largest tensor-parallel group a store accepts.
inline constexpr uint32_t kMaxTpWorld = 1024;

// The rank (0 .. world-1) that writes the block keyed `key` to a shared tier: the key's two
// halves mixed (splitmix64's finalizer) and reduced mod `world`, so the blocks, their bytes and
// their MAC work spread evenly over the ranks. Fixed: every rank of a group (and every version
// in one fleet) must compute the same writer. 0 when world <= 1.
uint32_t SingleWriterRank(const Hash128& key, uint32_t world);

struct TieredStoreStats {
  uint64_t demoted = 0;                 // records a tier admitted from the level above (pool or tier)
  uint64_t written_through = 0;         // sealed blocks the persistent tier admitted at once (or at a checkpoint)
  uint64_t tier_hits = 0;               // blocks promoted into the pool
  uint64_t queued_hits = 0;             // of which were still queued for their tier's write
  uint64_t verify_failures = 0;         // records that failed the checks here (quarantined)
  uint64_t quarantine_failures = 0;     // of which the tier could not take out (last_error says why)
  uint64_t write_errors = 0;            // failed batch writes (e.g. a full disk); the records go lower
  uint64_t through_refused = 0;         // write-through or checkpoint records the persistent tier refused
  uint64_t dropped = 0;                 // refused records no tier below could take (lost; Flush reports them)
  uint64_t batches = 0;                 // asynchronous batches completed
  uint64_t pending = 0;                 // records waiting to be written
  uint64_t left_to_writer = 0;          // shared-tier writes skipped: another rank is the block's writer
  std::vector<uint64_t> hits_per_tier;  // by the tier holding the record (or writing it)
  std::string last_error;
};

class TieredStore final : public BlockSource {
 public:
  // `pool` gives the layout the records must match (the store does not keep it).
  // Errors: kInvalidArgument on "tiers" (none given), "batch-records" (0), "tp-world" (0 or over
  // kMaxTpWorld) or "tp-rank" (not below tp_world).
  static Result<std::unique_ptr<TieredStore>> Create(const BlockPool& pool, TieredStoreOptions options,
                                                     std::vector<std::unique_ptr<Tier>> tiers);
  // Flushes (a drop is then reported to no one: call Flush first to know) and stops the worker.
  ~TieredStore() override;
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  void OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) override EXCLUDES(queue_mu_, stats_mu_);
  void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) override EXCLUDES(queue_mu_, stats_mu_);
  // Writes the block to the first persistent tier (skipped there when it holds the key already).
  void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) override EXCLUDES(queue_mu_, stats_mu_);
  void BeginCheckpoint() override EXCLUDES(stats_mu_);
  // Writes every record of the memory tiers above the first persistent tier down to it (what the
  // pool evicted into host memory would otherwise die with the process), then Flush()es. OK means
  // every block of this checkpoint is in the first persistent tier and nothing was dropped since
  // the previous Flush. Errors: kIoError on "tier" when there is no persistent tier, when the
  // persistent tier refused any record of this checkpoint (even one a tier below then took), or
  // as Flush (records dropped).
  [[nodiscard]] Status FinishCheckpoint() override EXCLUDES(queue_mu_, stats_mu_);
  size_t Probe(std::span<const ChainLink> links) override EXCLUDES(queue_mu_, stats_mu_);
  size_t Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
               std::vector<std::vector<std::byte>>* states = nullptr) override EXCLUDES(queue_mu_, stats_mu_);

  // Submits the open batches and waits until every batch submitted so far is written, with the
  // demotions those writes caused. Returns OK unless records were dropped since the previous
  // Flush (or since Create): a tier refused a write (a full disk, the disk's max_bytes, Redis
  // down) and no tier below it took the refused records, so no tier holds them. Then kIoError on
  // "tier", counting them and giving the last refusal; the next Flush reports only new drops.
  // Not errors: a refused write whose records a lower tier took (write_errors counts it), and a
  // record a tier evicted for space past the last tier (a cache forgets; that is its policy).
  // The same in synchronous mode, where there is nothing to wait for.
  [[nodiscard]] Status Flush() EXCLUDES(queue_mu_, stats_mu_);
  TieredStoreStats stats() const EXCLUDES(queue_mu_, stats_mu_);
  // The store's counters and each tier's (label tier="host|disk|redis|redis-cluster"), for
  // Prometheus. REQUIRES: as tier_counters.
  std::vector<MetricFamily> CollectMetrics() const EXCLUDES(queue_mu_, stats_mu_);
  size_t tiers() const { return tiers_.size(); }
  // REQUIRES: Flush() first when asynchronous, or no concurrent writes (else a snapshot).
  TierCounters tier_counters(size_t i) const EXCLUDES(queue_mu_, stats_mu_);
  std::string_view tier_name(size_t i) const { return tiers_[i]->name; }

 private:
  // One tier and the mutex it is used under. The tier's constants are copied out so that they
  // can be read without the mutex.
  struct Slot {
    explicit Slot(std::unique_ptr<Tier> t)
        : name(t->name()),
          in_memory(t->in_memory()),
          persistent(t->persistent()),
          shared(t->shared()),
          tier(std::move(t)) {}
    const std::string_view name;
    const bool in_memory;
    const bool persistent;
    const bool shared;
    mutable Mutex mu;
    const std::unique_ptr<Tier> tier PT_GUARDED_BY(mu);
  };
  struct Job {
    size_t tier = 0;
    std::vector<std::shared_ptr<const TierRecord>> records;
    bool through = false;  // a write-through (else a demotion)
  };
  struct Pending {
    std::shared_ptr<const TierRecord> record;
    size_t tier;  // where it is being written
  };

  TieredStore(const BlockPool& pool, TieredStoreOptions options, std::vector<std::unique_ptr<Tier>> tiers);
  // Queues `r` for tier `t` (or writes it now when tier t is in memory or the store synchronous);
  // drops it past the last. At a shared tier whose writer for `r` is another rank, passes it on
  // to tier t+1 instead (the single-writer rule). Called with no lock held, or from tier t-1's
  // eviction listener (tier t-1's mu held).
  void Demote(size_t t, std::shared_ptr<const TierRecord> r, bool through = false) EXCLUDES(queue_mu_, stats_mu_);
  void SubmitLocked(size_t t) REQUIRES(queue_mu_);
  // Writes the job under its tier's mu; what the tier refuses goes to the tier below.
  void WriteJob(Job& job) EXCLUDES(queue_mu_, stats_mu_);
  void Worker() EXCLUDES(queue_mu_, stats_mu_);
  std::optional<size_t> WriteThroughTier() const;
  // Whether this rank writes `key` to tier t (always, unless t is shared and tp_world > 1).
  bool WritesTo(size_t t, const Hash128& key) const;
  std::shared_ptr<const TierRecord> RecordOf(const BlockPool& pool, BlockId b, const SealedIdentity& id) const;
  // Reads the record of `link` from the memory tier t straight into block b's pages, with no copy
  // in between (docs/adr/0041-one-sync-per-batch.md). kNotFound: not there, or a tier that
  // cannot; kDataLoss: it failed a check (counted, taken out of service; b's pages may hold
  // zeros or the unverified bytes and are not promoted); OK: b holds it and `state` its state.
  Status ReadIntoBlock(size_t t, BlockPool& pool, const ChainLink& link, BlockId b, std::vector<std::byte>* state)
      EXCLUDES(queue_mu_, stats_mu_);
  // Fetch's first step: the leading run of links that the memory tiers at the top hold (or that
  // are `queued`) read in place (ReadIntoBlock); marks `direct`, sets `from` and `states`. Returns
  // the index of a record that failed its identity check (the run ends there), else links.size().
  size_t FetchInPlace(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
                      std::span<const std::shared_ptr<const TierRecord>> queued, std::vector<size_t>& from,
                      std::vector<bool>& direct, std::vector<std::vector<std::byte>>& states)
      EXCLUDES(queue_mu_, stats_mu_);
  // Asks tier after tier, top down and each under its mutex, about the links not resolved yet.
  void SearchTopDown(std::span<const ChainLink> links, const std::function<bool(size_t)>& resolved,
                     const std::function<void(Tier&, size_t, std::span<const Hash128>, std::span<const size_t>)>& ask)
      const EXCLUDES(queue_mu_, stats_mu_);

  // Set in the constructor, then only read.
  const TieredStoreOptions options_;
  const BlockRecordInfo info_;
  const uint16_t format_id_;
  std::vector<std::unique_ptr<Slot>> tiers_;

  // Asynchronous writes. pending_ holds every record queued and not yet written.
  mutable Mutex queue_mu_ ACQUIRED_AFTER(Slot::mu);
  CondVar queue_cv_;  // a job was queued, or stop_ set
  CondVar idle_cv_;   // the worker finished a job
  std::deque<Job> jobs_ GUARDED_BY(queue_mu_);
  std::vector<std::vector<std::shared_ptr<const TierRecord>>> open_batch_ GUARDED_BY(queue_mu_);    // per tier
  std::vector<std::vector<std::shared_ptr<const TierRecord>>> open_through_ GUARDED_BY(queue_mu_);  // per tier
  std::unordered_map<Hash128, Pending, Hash128Hasher> pending_ GUARDED_BY(queue_mu_);
  bool busy_ GUARDED_BY(queue_mu_) = false;  // the worker is writing a job it took off jobs_
  bool stop_ GUARDED_BY(queue_mu_) = false;
  std::thread worker_;  // started by the constructor when asynchronous, joined by the destructor

  mutable Mutex stats_mu_ ACQUIRED_AFTER(Slot::mu, queue_mu_);
  TieredStoreStats stats_ GUARDED_BY(stats_mu_);
  uint64_t refused_at_checkpoint_ GUARDED_BY(stats_mu_) = 0;  // through_refused when the checkpoint began
  uint64_t dropped_at_flush_ GUARDED_BY(stats_mu_) = 0;       // stats_.dropped the last Flush reported
  std::string drop_error_ GUARDED_BY(stats_mu_);              // the refusal behind the last drop
};

}  // namespace tessera
