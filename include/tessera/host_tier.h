// HostTier: sealed blocks in host DRAM, with a byte capacity and LRU eviction.
//
// Admission: every Put is stored; when the capacity would be exceeded the least recently used
// records are evicted first (and handed to the listener, so the tiered store can demote them to
// disk). A record larger than the whole capacity is refused. Promotion: none inside the tier —
// Get/GetInto return a verified copy and refresh recency; the caller promotes.
//
// Storage: one arena of exactly `capacity_bytes`, reserved (virtual memory, touched only as it is
// used) on the first non-empty Put. A record occupies exactly its payload bytes in one contiguous
// range of the arena, placed best-fit from a free list that coalesces neighbouring free ranges. A
// tier's records are almost always one block each, all of one size: then an evicted record's range
// is reused as it is, and the arena never fragments. With mixed sizes the free bytes may be
// enough but not contiguous: the tier then evicts further LRU records until a range fits (counted
// in `fragmentation_evictions`); an empty arena is one free range, so any record that fits the
// capacity is always placed. Accounting is exact: `bytes` (payload bytes of the records held)
// plus `free_bytes` equals `capacity_bytes`, and `bytes` never exceeds it.
//
// Each record carries an xxh3-64 checksum of its payload taken at Put and verified at Get; a
// mismatch (memory corruption) is quarantined (dropped and counted), never returned.
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/hash128.h"
#include "tessera/status.h"

namespace tessera {

struct HostTierStats {
  uint64_t records = 0, bytes = 0, capacity_bytes = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, quarantined = 0, refused = 0;
  // Arena: bytes not holding a record (bytes + free_bytes == capacity_bytes), the number of free
  // ranges and the largest one, whether the arena has been reserved yet, and how many of the
  // evictions were made because the free bytes were not contiguous (mixed record sizes).
  uint64_t free_bytes = 0, free_ranges = 0, largest_free_range = 0;
  bool arena_reserved = false;
  uint64_t fragmentation_evictions = 0;
};

class HostTier {
 public:
  explicit HostTier(uint64_t capacity_bytes);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;
  HostTier(HostTier&&) noexcept;
  HostTier& operator=(HostTier&&) noexcept;

  // Stores a copy (replacing an older record under the key). kOutOfBlocks on "capacity" when the
  // record alone exceeds the capacity (or the arena cannot be reserved).
  Status Put(const Hash128& key, uint16_t format_id, std::span<const std::byte> payload);
  // The verified payload; kNotFound on a miss; kDataLoss when verification fails (the record is
  // dropped).
  Result<std::vector<std::byte>> Get(const Hash128& key, uint16_t* format_id = nullptr);
  // As Get, but copies the verified payload into the first PayloadSize(key) bytes of `out`
  // without allocating (the rest of `out` is left as it was). kInvalidArgument on "out" when
  // `out` is smaller than the record (the record is kept, recency and counters untouched);
  // kNotFound on a miss; kDataLoss when verification fails: the record is dropped and the bytes
  // of `out` it would have filled are zeroed (never left holding unverified bytes).
  Status GetInto(const Hash128& key, std::span<std::byte> out, uint16_t* format_id = nullptr);
  // As GetInto, into buffers filled in order (a promotion copies a record's pages straight into
  // the pool's pages): their sizes must add up to PayloadSize(key) exactly, else kInvalidArgument
  // on "out" with the record kept. One pass over the record: each chunk is checksummed, then
  // copied. On kDataLoss every buffer is zeroed and the record dropped.
  Status GetScattered(const Hash128& key, std::span<const std::span<std::byte>> out, uint16_t* format_id = nullptr);
  // The payload size of the record under `key`, or nullopt when there is none.
  std::optional<uint64_t> PayloadSize(const Hash128& key) const;
  bool Contains(const Hash128& key) const { return map_.count(key) > 0; }
  // The keys held, least recently used first.
  std::vector<Hash128> Keys() const;
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
    uint64_t offset;  // into the arena
    uint64_t len;
  };
  struct ArenaDeleter {
    uint64_t bytes;  // no default member initializer: value-initialized by unique_ptr()
    void operator()(std::byte* p) const;
  };
  Status ReserveArena();
  std::optional<uint64_t> Allocate(uint64_t len);
  void Free(uint64_t offset, uint64_t len);
  void RemoveFree(uint64_t offset, uint64_t len);
  void InsertFree(uint64_t offset, uint64_t len);
  void EvictOne();
  void Drop(std::list<Entry>::iterator it);
  // Copies the entry's bytes into out (sizes summing to its length, checked by the caller) in one
  // checksummed pass; a mismatch zeroes out, drops the entry and counts it quarantined.
  Status CopyOut(std::list<Entry>::iterator entry, std::span<const std::span<std::byte>> out, uint16_t* format_id);

  uint64_t capacity_;
  uint64_t bytes_ = 0;
  std::unique_ptr<std::byte, ArenaDeleter> arena_;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset), for best fit
  std::list<Entry> lru_;                                  // front: most recent
  std::unordered_map<Hash128, std::list<Entry>::iterator, Hash128Hasher> map_;
  std::function<void(const Hash128&, uint16_t, std::span<const std::byte>)> on_evict_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, quarantined_ = 0, refused_ = 0;
  uint64_t fragmentation_evictions_ = 0;
};

}  // namespace tessera
