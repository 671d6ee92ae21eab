// KV-cache events: what a fleet router needs to know of a manager's prefix cache, in the shape
// vLLM publishes them (vllm/distributed/kv_events.py: BlockStored, BlockRemoved,
// AllBlocksCleared, batched in a KVEventBatch), pulled from the RequestManager.
//
// Recording is off unless ManagerOptions::kv_events is set; when off, nothing is allocated and a
// seal or eviction costs one branch. When on, the manager appends to a KvEventLog (flat records
// over two arenas: a seal costs one record or a merge, a key and a copy of its tokens, and no
// allocation once the log is warm) that the owner drains with RequestManager::TakeKvEventLog (a
// swap: O(1)) or TakeKvEvents (the events as KvEvent values), typically once per scheduler step
// or, as `tessera serve` does, once per millisecond from a publisher thread:
//
//   BlockStored       a block was sealed into (or promoted from a tier into) the prefix index.
//                     Consecutive seals of one chain are merged: block_hashes is a chain in
//                     order (each block the child of the one before), token_ids their tokens
//                     concatenated (block_size per block), parent_block_hash the parent of the
//                     first block, or none for a prompt's first block.
//   BlockRemoved      blocks were evicted from the prefix index (their keys no longer hit).
//                     Consecutive evictions are merged into one event.
//   AllBlocksCleared  the prefix cache was reset (RequestManager::ResetPrefixCache): every block
//                     stored before is gone; no BlockRemoved is sent for them.
//
// Block hashes are Tessera's 128-bit prefix keys (docs/adr/0007): keyed, so only a process with
// the manager's hash key can recompute them; a router only compares them. A block deduplicated
// into an equal one already indexed is not stored again (its key is already announced). The
// cache salt is never part of an event (it separates tenants and is not to leak); the tenant
// domain is.
//
// The buffer is bounded (ManagerOptions::kv_events_capacity events); events past the bound are
// dropped and counted (ManagerMetrics::kv_events_dropped, tessera_kv_events_dropped_total), so a
// consumer that sees the counter move must resynchronise (as after AllBlocksCleared).
//
// Thread-safety: as the RequestManager (single owner); TakeKvEvents is called by the owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "tessera/hash128.h"

namespace tessera {

enum class KvEventKind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };

// Where the blocks live: kGpu for a pool whose KV an engine keeps on a device
// (RegionKind::kUnbacked), kCpu for a pool that holds the bytes in host memory.
enum class KvMedium : uint8_t { kGpu, kCpu };

// "BlockStored", "BlockRemoved", "AllBlocksCleared": the tags vLLM's events carry on the wire.
std::string_view KvEventKindName(KvEventKind k);
// "GPU", "CPU": vLLM's medium strings.
std::string_view KvMediumName(KvMedium m);

struct KvEvent {
  KvEventKind kind = KvEventKind::kBlockStored;
  // Stored, Removed: the prefix keys of the blocks (stored: a chain, first to last).
  std::vector<Hash128> block_hashes;
  // Stored: the prefix key of the first block's parent; none when it is a prompt's first block.
  std::optional<Hash128> parent_block_hash;
  // Stored: block_size tokens per block, concatenated in block order.
  std::vector<uint32_t> token_ids;
  // Stored: tokens per block (the manager's block_tokens).
  uint32_t block_size = 0;
  // Stored: the tenant domain the blocks belong to (RequestManager::domain_of).
  uint32_t domain = 0;
  KvMedium medium = KvMedium::kGpu;
};

// Events as flat records: each names its ranges of two arenas (block keys, token ids), so that
// recording allocates nothing once the log has grown to its working size, and a whole log is
// handed over by a swap. The manager records; a consumer reads events through views and clears
// (or swaps back) the log, keeping its capacity.
class KvEventLog {
 public:
  // One event, viewing the log (valid until the log changes). The fields are KvEvent's.
  struct View {
    KvEventKind kind;
    std::span<const Hash128> block_hashes;
    std::optional<Hash128> parent_block_hash;
    std::span<const uint32_t> token_ids;
    uint32_t block_size;
    uint32_t domain;
    KvMedium medium;
  };

  size_t size() const { return records_.size(); }
  bool empty() const { return records_.empty(); }
  View operator[](size_t i) const;
  // The events as values, into *out (its elements' storage reused).
  void CopyTo(std::vector<KvEvent>* out) const;
  // Forgets every event, keeping the storage.
  void clear();

  // Recording. Each returns false, recording nothing, when the event would be a new record
  // while `max_records` are already held (a merge into the last record is always taken).
  // A stored block merges into the last record when that record is a BlockStored of the same
  // domain whose last block is `parent` (a chain); a removal merges into a last BlockRemoved.
  bool AddStored(const std::optional<Hash128>& parent, const Hash128& key, std::span<const uint32_t> tokens,
                 uint32_t block_size, uint32_t domain, KvMedium medium, size_t max_records);
  bool AddRemoved(const Hash128& key, KvMedium medium, size_t max_records);
  bool AddCleared(KvMedium medium, size_t max_records);

 private:
  struct Record {
    Hash128 parent;
    size_t keys_begin, keys_end, tokens_begin, tokens_end;
    uint32_t block_size, domain;
    KvEventKind kind;
    KvMedium medium;
    bool has_parent;
  };
  std::vector<Record> records_;
  std::vector<Hash128> keys_;
  std::vector<uint32_t> tokens_;
};

}  // namespace tessera
