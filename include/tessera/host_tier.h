// HostTier: sealed blocks in host DRAM, with a byte capacity and LRU eviction.
//
// Admission: every Put is stored; when the capacity would be exceeded the least recently used
// records are evicted first (and handed to the listener, so the tiered store can demote them to
// disk). A record larger than the whole capacity is refused. Promotion: none inside the tier —
// Get returns a verified copy and refreshes recency; the caller promotes.
//
// Each record carries an xxh3-64 checksum of its payload taken at Put and verified at Get; a
// mismatch (memory corruption) is quarantined (dropped and counted), never returned.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "tessera/hash.h"
#include "tessera/status.h"

namespace tessera {

struct HostTierStats {
  uint64_t records = 0, bytes = 0, capacity_bytes = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, quarantined = 0, refused = 0;
};

class HostTier {
 public:
  explicit HostTier(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Stores a copy (replacing an older record under the key). kOutOfBlocks on "capacity" when the
  // record alone exceeds the capacity.
  Status Put(const Hash128& key, uint16_t format_id, std::span<const std::byte> payload);
  // The verified payload; kNotFound on a miss; kDataLoss when verification fails (the record is
  // dropped).
  Result<std::vector<std::byte>> Get(const Hash128& key, uint16_t* format_id = nullptr);
  bool Contains(const Hash128& key) const { return map_.count(key) > 0; }
  void Erase(const Hash128& key);
  // Called with each record evicted for space (key, format id, payload), before it is freed.
  void SetEvictionListener(std::function<void(const Hash128&, uint16_t, std::span<const std::byte>)> f) {
    on_evict_ = std::move(f);
  }
  HostTierStats stats() const;
  // For fault-injection tests: the stored bytes of a record.
  std::span<std::byte> MutableBytesForTest(const Hash128& key);

 private:
  struct Entry {
    Hash128 key;
    uint16_t format_id;
    uint64_t checksum;
    std::vector<std::byte> payload;
  };
  void EvictOne();
  uint64_t capacity_;
  uint64_t bytes_ = 0;
  std::list<Entry> lru_;  // front: most recent
  std::unordered_map<Hash128, std::list<Entry>::iterator, Hash128Hasher> map_;
  std::function<void(const Hash128&, uint16_t, std::span<const std::byte>)> on_evict_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, quarantined_ = 0, refused_ = 0;
};

}  // namespace tessera
