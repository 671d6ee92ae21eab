// Tier: one level of the hierarchy below the device pool (host DRAM, a disk directory, Redis),
// as the tiered store sees it (tiered_store.h, docs/adr/0013-tiered-store.md); and TierRecord,
// the unit every tier stores.
//
// Admission: a tier stores every record PutBatch hands it, within its capacity; it decides
// nothing about what to admit (the store does: a tier is never handed a key it holds).
// Eviction: a tier with a capacity evicts its least recently used records for space and hands
// each to the eviction listener before it is gone (the store demotes it to the next tier).
// Promotion: none inside a tier; GetBatch returns verified copies and the tier keeps its own
// (promotion is inclusive).
// Verification: a tier checks its own checksum or MAC on every read and reports a damaged record
// as a miss (and counts it in `quarantined`), never as data.
//
// Thread-safety: implementations are not thread-safe. The store calls one tier from one thread
// at a time, under that tier's mutex; the eviction listener runs inside PutBatch, under it too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/hash128.h"
#include "tessera/status.h"

namespace tessera {

// What a tier stores under a key: a payload in a record format the caller names (the tiered store
// stores block records, block_record.h); the tier treats the payload as opaque bytes.
struct TierRecord {
  Hash128 key;
  uint16_t format_id = 0;
  std::vector<std::byte> payload;
};

struct TierCounters {
  uint64_t records = 0;         // records held (as far as this process knows)
  uint64_t bytes = 0;           // payload bytes held
  uint64_t capacity_bytes = 0;  // 0: unlimited here (e.g. Redis, bounded by its maxmemory policy)
  uint64_t evictions = 0;       // records evicted for space
  uint64_t quarantined = 0;     // records that failed the tier's own checksum (never served)
};

class Tier {
 public:
  using EvictionListener = std::function<void(const TierRecord&)>;
  virtual ~Tier() = default;
  // "host", "disk", "redis" or "redis-cluster" (a metrics label). Constant for the tier's life.
  virtual std::string_view name() const = 0;
  // A memory tier is written synchronously, by whoever demotes into it; the store batches the
  // writes to the others through its worker thread. Constant for the tier's life.
  virtual bool in_memory() const = 0;
  // Whether a record survives the process (the target of write-through and checkpoints).
  virtual bool persistent() const = 0;
  // Whether the ranks of a tensor-parallel group share this tier (a Redis server or cluster):
  // the tiered store then lets one rank per block write it (TieredStoreOptions::tp_world,
  // docs/adr/0023-single-writer.md). A private tier (host memory, a disk directory, which one
  // process holds locked) is written by every rank. Constant for the tier's life.
  virtual bool shared() const { return false; }
  // Stores the records; may first evict older ones for space (each handed to the listener).
  // A record larger than the whole tier is refused or passed on to the listener, as the tier's
  // header says. Errors: the tier's own (a full disk, an unreachable server): then the caller
  // treats every record of the batch as not stored.
  virtual Status PutBatch(std::span<const TierRecord* const> records) = 0;
  // One entry per key: the verified record or nullopt (a miss or a damaged record).
  virtual std::vector<std::optional<TierRecord>> GetBatch(std::span<const Hash128> keys) = 0;
  virtual std::vector<bool> ContainsBatch(std::span<const Hash128> keys) = 0;
  // The keys this process knows the tier holds, least recently used first (a Redis tier: none).
  virtual std::vector<Hash128> Keys() const = 0;
  virtual Status EraseBatch(std::span<const Hash128> keys) = 0;
  // Takes a record out of service that failed a check above the tier's checksum. Errors: the
  // tier's own (a disk tier that cannot write its quarantine file, an unreachable server); the
  // record may then still be held, and the caller must not count on its absence.
  virtual Status Quarantine(const Hash128& key, const std::string& why) = 0;
  virtual TierCounters counters() const = 0;
  // A tier that can hand a record straight into caller memory (host memory, a disk directory) says its payload
  // size here; nullopt: absent, or a tier that cannot (then only GetBatch reads it).
  virtual std::optional<uint64_t> PayloadSize(const Hash128& /*key*/) const { return std::nullopt; }
  // Copies the verified payload into `out`, buffers filled in order whose sizes add up to
  // PayloadSize(key). Errors: kNotFound (a miss), kDataLoss (failed the tier's check: the buffers
  // are zeroed, the record is dropped and counted), kInvalidArgument on "out" (the sizes), or
  // kFailedPrecondition for a tier without PayloadSize.
  virtual Status ReadInto(const Hash128& /*key*/, std::span<const std::span<std::byte>> /*out*/,
                          uint16_t* /*format_id*/) {
    return FailedPrecondition("tier", "this tier cannot read into caller memory");
  }
  // REQUIRES: before the tier is shared (the store sets it once, at creation).
  void SetEvictionListener(EvictionListener f) { on_evict_ = std::move(f); }

 protected:
  EvictionListener on_evict_;
};

}  // namespace tessera
