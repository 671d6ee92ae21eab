// BlockSource: a second level of sealed blocks behind a block store's pool (the tiered store).
//
// The manager tells the source of every block it seals (write-through) and of every indexed
// block the pool evicts (demotion), and asks it, where a prompt's in-pool prefix ends, for the
// next blocks of the chain (promotion). The source must verify what it returns: the stored
// tokens, parent key, tenant domain and salt must be the ones asked for and must hash to the key.
//
// Thread-safety: called from the manager's single owner thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tessera/block_index.h"
#include "tessera/block_pool.h"

namespace tessera {

// One link of a prompt's prefix chain that the pool does not hold.
struct ChainLink {
  Hash128 key;
  Hash128 parent_key;
  uint32_t domain = 0;
  uint64_t salt = 0;
  std::span<const uint32_t> tokens;
  Hash128 cache_identity;  // what the asking cache's blocks are valid for (BlockIndex::root_key)
};

class BlockSource {
 public:
  virtual ~BlockSource() = default;
  // A block was sealed and indexed (not deduplicated); its bytes are final and readable.
  virtual void OnSealed(const BlockPool& pool, BlockId b, const SealedIdentity& id) = 0;
  // An indexed block is about to be evicted from the pool; its bytes are still readable.
  virtual void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) = 0;
  // A checkpoint (e.g. a graceful shutdown): keep this sealed block persistently, whatever the
  // write policy; the block stays in the pool.
  virtual void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) = 0;
  // Brackets a checkpoint's OnCheckpoint calls. FinishCheckpoint returns once everything the
  // source keeps for a restart is persistent (blocks it took from the pool earlier included),
  // or the error that kept some of it from being so.
  virtual void BeginCheckpoint() {}
  [[nodiscard]] virtual Status FinishCheckpoint() { return Status::Ok(); }
  // How many leading links of `links` the source can probably supply (no bytes moved).
  virtual size_t Probe(std::span<const ChainLink> links) = 0;
  // Copies link i into blocks[i] (kFilling, refcount 1) for a leading run of verified links and
  // returns its length; a link that fails verification ends the run (and is counted by the
  // source), so nothing unverified ever reaches a caller. When `states` is given it receives
  // each fetched block's state (SealedIdentity::state when it was stored).
  virtual size_t Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
                       std::vector<std::vector<std::byte>>* states = nullptr) = 0;
};

// Fetches the blocks of `prompt` from block `first` on from `source` into fresh pool blocks —
// block i has prefix key keys[i], up to keys.size() blocks — taking no more than the pool has
// available. Appends the leading run the source delivered and verified to `blocks` (kFilling,
// bytes in place, not sealed: the caller seals each as the child of the one before), releases
// the rest, and returns how many; `states` (optional) receives their states.
size_t FetchFromSource(BlockPool& pool, const BlockIndex& index, BlockSource& source, std::span<const uint32_t> prompt,
                       std::span<const Hash128> keys, size_t first, uint32_t domain, uint64_t salt,
                       PinnedBlocks* blocks, std::vector<std::vector<std::byte>>* states = nullptr);

// Hands every sealed (or cached) block of `pool` that `index` holds to source.OnCheckpoint, with
// the state `state_of` gives it (none when not given), between BeginCheckpoint and
// FinishCheckpoint; returns how many, or FinishCheckpoint's error.
Result<uint64_t> CheckpointBlocks(const BlockPool& pool, const BlockIndex& index, BlockSource& source,
                                  const std::function<std::vector<std::byte>(BlockId)>& state_of = {});

}  // namespace tessera
