// BlockPool: the pages of one or more cache groups that share a block token span.
//
// A block id names the same token span in every layer of every group of the pool: block b
// owns, in each group g, one page per layer, laid out block-major in g's region
// ([block][layer][page]) so that a block's bytes in one group are one contiguous range. A packed
// group (PageLayout::packed, ADR 0020) holds its layers' slices back to back in one page per
// block ([block][layer][slice] + the page's padding); a layer's "page" is then its slice.
// Each group has its own region and its own page size (no padding to a common size).
//
// Block states and their invariants (held in parallel arrays indexed by block id):
//
//   kFree     refcount 0; on the free list; no index entry names it.
//   kFilling  refcount >= 1; owned by requests that are writing it; never shared by an index.
//   kSealed   refcount >= 1; its bytes are final; it may be named by the prefix/content index.
//   kCached   refcount 0, sealed bytes kept for reuse; on exactly one LRU list (its priority).
//
//   free -> filling (Allocate) -> sealed (MarkSealed) -> cached (last Unref) -> free (evicted)
//   filling -> free (last Unref of an unsealed block); cached -> sealed (Ref on a hit).
//
// Eviction takes the least recently cached block of the lowest non-empty retention priority
// (0..100, higher is kept longer), O(1): 101 intrusive lists and an occupancy bitmap.
//
// Reuse order (BlockReuse): by default an allocation takes a free block while there is one and
// evicts a cached block only when none is left (kFreeFirst). kReleaseOrder reuses blocks in the
// order they were released, free or cached alike, after the blocks never used — vLLM's free
// block queue (vllm/v1/core/block_pool.py, FreeKVCacheBlockQueue), for an engine adapter that
// must evict what vLLM evicts: a released unsealed block then waits on the LRU list of its
// priority (still kFree, counted free) behind the cached blocks released before it.
// Eviction listeners run before the block's pages can be reused (the tier layer demotes there).
//
// Allocation is all-or-nothing: Allocate(n) either returns n blocks or kOutOfBlocks with the
// pool unchanged.
//
// Thread-safety: single owner (the request manager). The statistics returned by stats() are
// atomics and safe to read from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/counter.h"
#include "tessera/format.h"
#include "tessera/layout.h"
#include "tessera/memory.h"
#include "tessera/status.h"

namespace tessera {

struct BlockId {
  uint32_t value = UINT32_MAX;
  bool valid() const { return value != UINT32_MAX; }
  friend bool operator==(BlockId, BlockId) = default;
  friend auto operator<=>(BlockId, BlockId) = default;
};

enum class BlockState : uint8_t { kFree, kFilling, kSealed, kCached };
std::string_view BlockStateName(BlockState s);

constexpr uint8_t kMaxRetentionPriority = 100;
constexpr uint8_t kDefaultRetentionPriority = 35;

struct PoolGroup {
  std::string name;  // e.g. "mla.latent"
  RecordFormat format;
  uint32_t layers = 0;
  PageLayout page;  // from layout::ComputePageLayout
};

enum class BlockReuse : uint8_t { kFreeFirst, kReleaseOrder };

struct BlockPoolOptions {
  std::vector<PoolGroup> groups;  // all with the same page.block_tokens
  uint32_t capacity_blocks = 0;
  RegionKind region_kind = RegionKind::kHost;
  BlockReuse reuse = BlockReuse::kFreeFirst;
};

struct PoolStats {
  std::atomic<uint64_t> allocations{0};  // blocks handed out by Allocate
  std::atomic<uint64_t> frees{0};        // blocks returned to the free list
  std::atomic<uint64_t> evictions{0};    // cached blocks evicted to make room
  std::atomic<uint64_t> seals{0};
  std::array<std::atomic<uint64_t>, 4> blocks_in_state{};  // indexed by BlockState
};

class PinnedBlocks;
class BlockPool;

// A writable view of a page or block of a block being filled (issue 27.7, ADR 0039). It names the
// block and the life (generation) it was taken in, and hands out its bytes only while that block
// is still filling in that life and held by one table: once the block is sealed (its bytes are
// final: the index, the tiers and later prefix hits serve them), freed, or shared by a fork,
// every access is refused with kFailedPrecondition on "block", naming it, and nothing is written.
// Checked on every access (two loads and compares; nothing on the decode step). Take the span
// per write, as Write does: a raw span kept across a manager call is what this handle replaces.
// Valid while its pool lives. Thread-safety: as the pool (single owner).
class WritableView {
 public:
  BlockId block() const { return block_; }
  uint64_t size() const { return handle_.len; }
  // OK while the block is filling in the life the view was taken in, by one table.
  Status Check() const;
  // The bytes, checked now.
  Result<std::span<std::byte>> Bytes() const;
  // Copies `bytes` to [offset, offset + size) of the view, checked now; kInvalidArgument on
  // "offset" past the view. Nothing is written on an error.
  Status Write(uint64_t offset, std::span<const std::byte> bytes) const;

 private:
  friend class BlockPool;
  WritableView(BlockPool* pool, const BlockHandle& h, BlockId b, uint32_t generation)
      : pool_(pool), handle_(h), block_(b), generation_(generation) {}
  BlockPool* pool_ = nullptr;
  BlockHandle handle_;
  BlockId block_;
  uint32_t generation_ = 0;
};

class BlockPool {
 public:
  // Errors: kInvalidArgument naming the option (no groups, mixed block spans, zero capacity),
  // kOutOfBlocks when a region cannot be mapped.
  static Result<std::unique_ptr<BlockPool>> Create(BlockPoolOptions options);

  // Blocks an allocation could hand out now (free + evictable). References are taken and
  // released through a PinnedBlocks (a request's blocks) or by the index.
  uint32_t Available() const { return free_count_ + cached_count_; }

  // REQUIRES: kFilling.
  void MarkSealed(BlockId b);
  // Retention priority 0..100 (clamped). A cached block moves to its new LRU list at once (as
  // the most recent there); any other block uses it when it is next cached.
  void SetPriority(BlockId b, uint8_t priority);

  // Called with a block about to be evicted (still readable); listeners run in order.
  void AddEvictionListener(std::function<void(BlockId)> listener);
  // Evicts every cached block (listeners run for each, as for an eviction by Allocate) and
  // frees it; returns how many. Blocks with references are untouched.
  uint32_t EvictAllCached();

  BlockState state(BlockId b) const { return state_[b.value]; }
  uint32_t refcount(BlockId b) const { return refcount_[b.value]; }
  // Incremented each time the block is freed, so (id, generation) names one life of a block.
  uint32_t generation(BlockId b) const { return generation_[b.value]; }
  uint8_t priority(BlockId b) const { return priority_[b.value]; }

  // The page of one layer of one group (its slice of a packed page), and the whole block of one
  // group (all its layers, with the padding).
  BlockHandle PageHandle(BlockId b, uint32_t group, uint32_t layer) const;
  BlockHandle BlockHandleOf(BlockId b, uint32_t group) const;
  // Entry `slot` of the page of (b, group, layer), one span per plane of the group's format
  // (region-major formats keep each plane's rows together in the page), read-only: the block may
  // be sealed (issue 27.7, ADR 0039). REQUIRES: backed().
  ConstRecordView Record(BlockId b, uint32_t group, uint32_t layer, uint64_t slot) const;
  // The same record writable, only through a pool the caller may change (as MutableBytes): for
  // the manager's writers while the block fills. Unchecked; a caller outside the manager takes a
  // checked WritableView (Writable) or RequestManager::MutableRecord. REQUIRES: backed().
  RecordView MutableRecord(BlockId b, uint32_t group, uint32_t layer, uint64_t slot);
  const RegionTable& regions() const { return regions_; }
  bool backed() const { return kind_ == RegionKind::kHost; }
  // The bytes of a page or block, read-only; MutableBytes, the same bytes writable, only through
  // a pool the caller may change. REQUIRES: backed().
  std::span<const std::byte> Bytes(const BlockHandle& h) const { return regions_.Resolve(h); }
  std::span<std::byte> MutableBytes(const BlockHandle& h) { return regions_.Resolve(h); }
  // A checked writable view (WritableView) of the page of (b, group, layer), or of the whole
  // block of one group (layer unset), for a caller that fills a block it was handed. Errors:
  // kInvalidArgument on "block", "group", "layer"; kFailedPrecondition on "backed" (no bytes),
  // on "block" unless b is filling and held by one table (a sealed block's bytes are final).
  Result<WritableView> Writable(BlockId b, uint32_t group, std::optional<uint32_t> layer = std::nullopt);
  // Why a view of b taken in life `generation` may not write now (OK when it may).
  Status CheckWritable(BlockId b, uint32_t generation) const;

  const std::vector<PoolGroup>& groups() const { return groups_; }
  uint32_t capacity() const { return capacity_; }
  uint32_t block_tokens() const { return block_tokens_; }
  // Page bytes of one block over every layer of every group.
  uint64_t block_bytes() const { return block_bytes_; }
  // Host bytes of metadata per block (header + token ids), as the ledger counts them.
  uint64_t metadata_bytes_per_block() const { return BlockMetadataBytes(block_tokens_); }
  // Bytes held: every block that is not free, pages plus metadata.
  uint64_t bytes_held() const;
  uint32_t free_count() const { return free_count_; }
  uint32_t cached_count() const { return cached_count_; }
  const PoolStats& stats() const { return stats_; }

  // Checks every invariant above (free list, LRU lists, states, refcounts); for tests.
  Status CheckInvariants() const;

  // Host bytes of the per-block arrays below (state, refcount, generation, priority, links).
  static constexpr uint64_t kHeaderBytes =
      sizeof(BlockState) + 3 * sizeof(uint32_t) + sizeof(uint8_t) + sizeof(uint32_t);

 private:
  // The holders of references: a table's ids each hold one; the index moves a sealing
  // candidate's reference to an equal block; the pool's tests probe the counting directly.
  friend class PinnedBlocks;
  friend class BlockIndex;
  friend struct BlockPoolTestPeer;

  BlockPool() = default;
  // Allocates n blocks into `out` (appended), taking free blocks first, then evicting cached
  // ones. Each returned block is kFilling with refcount 1. kOutOfBlocks leaves the pool as it was.
  Status Allocate(uint32_t n, std::vector<BlockId>* out);
  // Allocate(1, out) when a block is free (the head of the free list, as Allocate takes it),
  // inline for a decode step's new block; false, and nothing changed, when none is. The id is
  // appended last, as Allocate does: stored first (a table line the step has not touched since
  // its last block), it made the 4,096-request trace's block step 0.56-0.62x as fast.
  bool AllocateFree(std::vector<BlockId>* out) {
    if (free_head_ == UINT32_MAX) return false;
    // Room first, as Allocate makes it (geometric growth): the append below cannot throw.
    if (out->size() == out->capacity()) out->reserve(std::max<size_t>(4, 2 * out->capacity()));
    const BlockId b = PopFree();
    Fill(b);
    Bump(stats_.allocations, 1);
    out->push_back(b);
    return true;
  }
  // The free list's head, taken off it. REQUIRES: a block is free.
  BlockId PopFree() {
    const BlockId b{free_head_};
    free_head_ = next_[b.value];
    --free_count_;
    return b;
  }
  // A block taken for a new owner (off the free list, or evicted): kFilling, one reference, the
  // default priority, linked in no list.
  void Fill(BlockId b) {
    next_[b.value] = UINT32_MAX;
    refcount_[b.value] = 1;
    priority_[b.value] = kDefaultRetentionPriority;
    SetState(b, BlockState::kFilling);
  }
  // REQUIRES: state != kFree. A cached block becomes sealed and leaves its LRU list.
  void Ref(BlockId b);
  // REQUIRES: refcount > 0. At zero a filling block is freed and a sealed one is cached.
  void Unref(BlockId b);
  void SetState(BlockId b, BlockState s) {
    Drop(stats_.blocks_in_state[static_cast<size_t>(state_[b.value])], 1);
    Bump(stats_.blocks_in_state[static_cast<size_t>(s)], 1);
    state_[b.value] = s;
  }
  void LruPush(BlockId b);
  void LruRemove(BlockId b);
  BlockId LruPopVictim();

  std::vector<PoolGroup> groups_;
  std::vector<uint32_t> group_region_;
  std::vector<uint64_t> group_block_bytes_;
  RegionTable regions_;
  RegionKind kind_ = RegionKind::kHost;
  BlockReuse reuse_ = BlockReuse::kFreeFirst;
  uint32_t capacity_ = 0;
  uint32_t block_tokens_ = 0;
  uint64_t block_bytes_ = 0;

  // Parallel per-block arrays.
  std::vector<BlockState> state_;
  std::vector<uint32_t> refcount_;
  std::vector<uint32_t> generation_;
  std::vector<uint8_t> priority_;
  std::vector<uint32_t> next_;  // free list or LRU list link
  std::vector<uint32_t> prev_;  // LRU list link

  uint32_t free_head_ = UINT32_MAX;
  uint32_t free_count_ = 0;
  uint32_t cached_count_ = 0;
  std::array<uint32_t, kMaxRetentionPriority + 1> lru_head_{};  // least recently cached
  std::array<uint32_t, kMaxRetentionPriority + 1> lru_tail_{};  // most recently cached
  std::array<uint64_t, 2> lru_occupied_{};                      // bit p: list p is non-empty

  std::vector<std::function<void(BlockId)>> eviction_listeners_;
  PoolStats stats_;
};

// The blocks one owner holds (a request's block table, blocks fetched for a promotion), in
// order: each id holds one reference, released when the table is truncated, cleared or
// destroyed — the last block first, so that a prefix is cached after (more recently than) its
// extensions and LRU evicts the longest chains' leaves first. Move-only: one owner; no manual
// reference counting outside it.
//
// Thread-safety: as the pool (single owner).
class PinnedBlocks {
 public:
  PinnedBlocks() = default;
  explicit PinnedBlocks(BlockPool* pool) : pool_(pool) {}
  PinnedBlocks(PinnedBlocks&& o) noexcept : pool_(o.pool_), ids_(std::move(o.ids_)) { o.ids_.clear(); }
  PinnedBlocks& operator=(PinnedBlocks&& o) noexcept;
  PinnedBlocks(const PinnedBlocks&) = delete;
  PinnedBlocks& operator=(const PinnedBlocks&) = delete;
  ~PinnedBlocks() { Clear(); }

  std::span<const BlockId> ids() const { return ids_; }
  size_t size() const { return ids_.size(); }
  bool empty() const { return ids_.empty(); }
  BlockId operator[](size_t i) const { return ids_[i]; }
  void reserve(size_t n) { ids_.reserve(n); }

  // Appends a new reference to `b` (a sealed or cached block: a prefix hit).
  void Pin(BlockId b);
  // Appends n fresh blocks (kFilling, taking free blocks first, then evicting cached ones);
  // kOutOfBlocks on "blocks" changes nothing.
  Status Allocate(uint32_t n);
  // Allocate(1) inline when a block is free (a decode step's new block); false, and nothing
  // changed, when none is (Allocate(1) may then evict one).
  bool AllocateFree() { return pool_->AllocateFree(&ids_); }
  // The reference at `slot` is released and replaced by `fresh`'s only reference (a
  // copy-on-write). REQUIRES: fresh.size() == 1.
  void Replace(size_t slot, PinnedBlocks&& fresh);
  // The reference at `slot` now names `b`: BlockIndex::Seal moved it to an equal sealed block.
  void Rename(size_t slot, BlockId b) { ids_[slot] = b; }
  // A second table with one more reference to every block (a fork).
  PinnedBlocks Clone() const;
  // Releases the references past the first `n`, last first.
  void Truncate(size_t n);
  void Clear() { Truncate(0); }

 private:
  BlockPool* pool_ = nullptr;
  std::vector<BlockId> ids_;
};

}  // namespace tessera
