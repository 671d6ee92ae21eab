#include "tessera/block_pool.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "tessera/checked.h"
#include "tessera/counter.h"

namespace tessera {

namespace {
constexpr uint32_t kNil = UINT32_MAX;
}  // namespace

std::string_view BlockStateName(BlockState s) {
  switch (s) {
    case BlockState::kFree:
      return "free";
    case BlockState::kFilling:
      return "filling";
    case BlockState::kSealed:
      return "sealed";
    case BlockState::kCached:
      return "cached";
  }
  return "?";
}

Result<std::unique_ptr<BlockPool>> BlockPool::Create(BlockPoolOptions options) {
  if (options.groups.empty()) return InvalidArgument("groups", "a pool needs at least one cache group");
  if (options.capacity_blocks == 0) return InvalidArgument("capacity-blocks", "must be positive");
  if (options.capacity_blocks >= kNil) return OutOfRange("capacity-blocks", "too many blocks");
  std::unique_ptr<BlockPool> pool(new BlockPool());
  pool->block_tokens_ = options.groups[0].page.block_tokens;
  pool->capacity_ = options.capacity_blocks;
  pool->kind_ = options.region_kind;
  pool->reuse_ = options.reuse;
  Checked block_bytes(0);
  for (const PoolGroup& g : options.groups) {
    if (g.page.block_tokens != pool->block_tokens_) {
      return InvalidArgument("groups", "group " + g.name + " spans " + std::to_string(g.page.block_tokens) +
                                           " tokens per block, the pool " + std::to_string(pool->block_tokens_));
    }
    if (g.layers == 0 || g.page.page_bytes == 0) return InvalidArgument("groups", "group " + g.name + " is empty");
    if (g.page.layers_per_page == 0 ||
        (g.page.packed() && (g.page.layer_stride < g.page.data_bytes ||
                             (Checked(g.page.layer_stride) * g.page.layers_per_page).overflowed() ||
                             g.page.layer_stride * g.page.layers_per_page > g.page.page_bytes))) {
      return InvalidArgument("groups", "group " + g.name + "'s layer slices do not fit its page");
    }
    Checked group_block = GroupBlockBytes(g.page, g.layers);
    Checked region = group_block * options.capacity_blocks;
    if (region.overflowed()) return OutOfRange("capacity-blocks", "region bytes overflow 64 bits");
    TESSERA_ASSIGN_OR_RETURN(uint32_t id, pool->regions_.AddRegion(options.region_kind, region.value(), g.name));
    pool->group_region_.push_back(id);
    pool->group_block_bytes_.push_back(group_block.value());
    block_bytes += group_block;
  }
  pool->block_bytes_ = block_bytes.value();
  pool->groups_ = std::move(options.groups);
  const uint32_t n = pool->capacity_;
  pool->state_.assign(n, BlockState::kFree);
  pool->refcount_.assign(n, 0);
  pool->generation_.assign(n, 0);
  pool->priority_.assign(n, kDefaultRetentionPriority);
  pool->next_.resize(n);
  pool->prev_.assign(n, kNil);
  // Free list in id order, so that a fresh pool hands out 0, 1, 2, ...
  for (uint32_t i = 0; i < n; ++i) pool->next_[i] = i + 1 < n ? i + 1 : kNil;
  pool->free_head_ = 0;
  pool->free_count_ = n;
  pool->lru_head_.fill(kNil);
  pool->lru_tail_.fill(kNil);
  pool->stats_.blocks_in_state[static_cast<size_t>(BlockState::kFree)] = n;
  return pool;
}

void BlockPool::LruPush(BlockId b) {
  uint8_t p = priority_[b.value];
  uint32_t tail = lru_tail_[p];
  prev_[b.value] = tail;
  next_[b.value] = kNil;
  if (tail == kNil) {
    lru_head_[p] = b.value;
  } else {
    next_[tail] = b.value;
  }
  lru_tail_[p] = b.value;
  lru_occupied_[p / 64] |= 1ULL << (p % 64);
  // kReleaseOrder: a released unsealed block waits here too, still free.
  ++(state_[b.value] == BlockState::kFree ? free_count_ : cached_count_);
}

void BlockPool::LruRemove(BlockId b) {
  uint8_t p = priority_[b.value];
  uint32_t prev = prev_[b.value], next = next_[b.value];
  if (prev == kNil) {
    lru_head_[p] = next;
  } else {
    next_[prev] = next;
  }
  if (next == kNil) {
    lru_tail_[p] = prev;
  } else {
    prev_[next] = prev;
  }
  prev_[b.value] = kNil;
  next_[b.value] = kNil;
  if (lru_head_[p] == kNil) lru_occupied_[p / 64] &= ~(1ULL << (p % 64));
  --(state_[b.value] == BlockState::kFree ? free_count_ : cached_count_);
}

BlockId BlockPool::LruPopVictim() {
  for (size_t w = 0; w < lru_occupied_.size(); ++w) {
    if (lru_occupied_[w] != 0) {
      uint32_t p = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(lru_occupied_[w])));
      BlockId victim{lru_head_[p]};
      LruRemove(victim);
      return victim;
    }
  }
  return BlockId{};
}

Status BlockPool::Allocate(uint32_t n, std::vector<BlockId>* out) {
  if (n > Available()) {
    return OutOfBlocks("blocks", "need " + std::to_string(n) + " blocks, " + std::to_string(Available()) +
                                     " free or evictable of " + std::to_string(capacity_));
  }
  // Grow geometrically: reserving exactly size() + n would copy a request's whole block table on
  // every new block (quadratic over a 1M-token context).
  if (out->capacity() < out->size() + n) out->reserve(std::max(out->size() + n, 2 * out->capacity()));
  for (uint32_t i = 0; i < n; ++i) {
    BlockId b;
    if (free_head_ != kNil) {
      b = PopFree();
    } else {
      b = LruPopVictim();
      assert(b.valid());
      if (state_[b.value] == BlockState::kCached) {
        // Listeners see the block while its bytes are intact (tier demotion, index removal).
        for (const auto& listener : eviction_listeners_) listener(b);
        ++generation_[b.value];
        Bump(stats_.evictions, 1);
      }  // else kReleaseOrder: a released free block's turn came (its generation moved on release)
    }
    Fill(b);
    out->push_back(b);
  }
  Bump(stats_.allocations, n);
  return Status::Ok();
}

void BlockPool::Ref(BlockId b) {
  assert(state_[b.value] != BlockState::kFree && "Ref on a free block");
  if (state_[b.value] == BlockState::kCached) {
    LruRemove(b);
    SetState(b, BlockState::kSealed);
  }
  ++refcount_[b.value];
}

void BlockPool::Unref(BlockId b) {
  assert(refcount_[b.value] > 0 && "Unref below zero");
  if (--refcount_[b.value] > 0) return;
  if (state_[b.value] == BlockState::kSealed) {
    SetState(b, BlockState::kCached);
    LruPush(b);
    return;
  }
  assert(state_[b.value] == BlockState::kFilling);
  SetState(b, BlockState::kFree);
  ++generation_[b.value];
  Bump(stats_.frees, 1);
  if (reuse_ == BlockReuse::kReleaseOrder) {
    priority_[b.value] = kDefaultRetentionPriority;
    LruPush(b);  // behind the blocks released before it
    return;
  }
  next_[b.value] = free_head_;
  free_head_ = b.value;
  ++free_count_;
}

void BlockPool::MarkSealed(BlockId b) {
  assert(state_[b.value] == BlockState::kFilling && "MarkSealed on a block that is not filling");
  SetState(b, BlockState::kSealed);
  Bump(stats_.seals, 1);
}

void BlockPool::SetPriority(BlockId b, uint8_t priority) {
  priority = std::min(priority, kMaxRetentionPriority);
  if (state_[b.value] == BlockState::kCached) {
    LruRemove(b);
    priority_[b.value] = priority;
    LruPush(b);
  } else {
    priority_[b.value] = priority;
  }
}

void BlockPool::AddEvictionListener(std::function<void(BlockId)> listener) {
  eviction_listeners_.push_back(std::move(listener));
}

uint32_t BlockPool::EvictAllCached() {
  uint32_t n = 0;
  for (BlockId b = LruPopVictim(); b.valid(); b = LruPopVictim()) {
    // kReleaseOrder: a released free block on the LRU lists just moves to the free list.
    const bool cached = state_[b.value] == BlockState::kCached;
    if (cached) {
      for (const auto& listener : eviction_listeners_) listener(b);
      ++generation_[b.value];
      Bump(stats_.evictions, 1);
      SetState(b, BlockState::kFree);
      ++n;
    }
    next_[b.value] = free_head_;
    free_head_ = b.value;
    ++free_count_;
  }
  return n;
}

BlockHandle BlockPool::PageHandle(BlockId b, uint32_t group, uint32_t layer) const {
  const PoolGroup& g = groups_[group];
  assert(layer < g.layers);
  // Packed pages (ADR 0020) hold layers_per_page slices back to back; the handle is the layer's slice.
  const uint64_t page = layer / g.page.layers_per_page;
  const uint64_t slice = layer % g.page.layers_per_page;
  return {group_region_[group],
          b.value * group_block_bytes_[group] + page * g.page.page_bytes + slice * g.page.layer_stride,
          g.page.packed() ? g.page.data_bytes : g.page.page_bytes};
}

BlockHandle BlockPool::BlockHandleOf(BlockId b, uint32_t group) const {
  return {group_region_[group], b.value * group_block_bytes_[group], group_block_bytes_[group]};
}

ConstRecordView BlockPool::Record(BlockId b, uint32_t group, uint32_t layer, uint64_t slot) const {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): MutableRecord only computes spans
  return const_cast<BlockPool*>(this)->MutableRecord(b, group, layer, slot);
}

// Out of line, as Record was: the writers' call on the decode step costs what it did.
RecordView BlockPool::MutableRecord(BlockId b, uint32_t group, uint32_t layer, uint64_t slot) {
  RecordView v;
  const PoolGroup& g = groups_[group];
  std::span<std::byte> page = regions_.Resolve(PageHandle(b, group, layer));
  if (g.format.packing == Packing::kPerToken) {
    const uint64_t rb = g.format.record_bytes();
    v.planes[0] = page.subspan(slot * rb, rb);
    return v;
  }
  uint64_t offset = 0;
  v.plane_count = std::min<uint32_t>(g.format.plane_count(), static_cast<uint32_t>(v.planes.size()));
  for (uint32_t p = 0; p < v.plane_count; ++p) {
    const uint64_t pb = g.format.plane_bytes(p);
    v.planes[p] = page.subspan(offset + slot * pb, pb);
    offset += uint64_t{g.page.entries_per_block} * pb;
  }
  return v;
}

Status BlockPool::CheckWritable(BlockId b, uint32_t generation) const {
  if (b.value >= capacity_) return InvalidArgument("block", std::to_string(b.value) + " is not a block of the pool");
  const std::string name = "block " + std::to_string(b.value);
  if (generation_[b.value] != generation) {
    return FailedPrecondition("block", name + " was freed since the view was taken: the view writes nothing");
  }
  if (state_[b.value] != BlockState::kFilling) {
    return FailedPrecondition("block", name + " is " + std::string(BlockStateName(state_[b.value])) +
                                           ": its bytes are final, a view taken while it filled writes nothing");
  }
  if (refcount_[b.value] != 1) {
    return FailedPrecondition("block", name + " is shared by " + std::to_string(refcount_[b.value]) +
                                           " tables (a fork): a view writes nothing until it is copied");
  }
  return Status::Ok();
}

Result<WritableView> BlockPool::Writable(BlockId b, uint32_t group, std::optional<uint32_t> layer) {
  if (!backed()) return FailedPrecondition("backed", "an unbacked pool holds no KV bytes to write");
  if (group >= groups_.size()) {
    return InvalidArgument("group", std::to_string(group) + " is not below " + std::to_string(groups_.size()));
  }
  if (layer && *layer >= groups_[group].layers) {
    return InvalidArgument("layer", std::to_string(*layer) + " is not below " + std::to_string(groups_[group].layers));
  }
  if (b.value >= capacity_) return InvalidArgument("block", std::to_string(b.value) + " is not a block of the pool");
  if (Status st = CheckWritable(b, generation_[b.value]); !st.ok()) return st;
  return WritableView(this, layer ? PageHandle(b, group, *layer) : BlockHandleOf(b, group), b, generation_[b.value]);
}

Status WritableView::Check() const {
  if (pool_ == nullptr) return FailedPrecondition("block", "the view names no block");
  return pool_->CheckWritable(block_, generation_);
}

Result<std::span<std::byte>> WritableView::Bytes() const {
  if (Status st = Check(); !st.ok()) return st;
  return pool_->MutableBytes(handle_);
}

Status WritableView::Write(uint64_t offset, std::span<const std::byte> bytes) const {
  if (Status st = Check(); !st.ok()) return st;
  if (offset > handle_.len || bytes.size() > handle_.len - offset) {
    return InvalidArgument("offset", std::to_string(offset) + " + " + std::to_string(bytes.size()) +
                                         " bytes is past the view's " + std::to_string(handle_.len));
  }
  std::span<std::byte> to = pool_->MutableBytes(handle_);
  std::copy(bytes.begin(), bytes.end(), to.begin() + static_cast<std::ptrdiff_t>(offset));
  return Status::Ok();
}

uint64_t BlockPool::bytes_held() const {
  uint64_t held = capacity_ - free_count_;
  return held * (block_bytes_ + metadata_bytes_per_block());
}

Status BlockPool::CheckInvariants() const {
  auto fail = [](const std::string& what) { return Internal("pool", what); };
  std::vector<uint8_t> seen(capacity_, 0);
  uint32_t n = 0;
  for (uint32_t i = free_head_; i != kNil; i = next_[i]) {
    if (i >= capacity_ || seen[i]) return fail("free list is corrupt at " + std::to_string(i));
    seen[i] = 1;
    if (state_[i] != BlockState::kFree || refcount_[i] != 0) return fail("block on free list is not free");
    ++n;
  }
  uint32_t cached = 0;
  for (uint32_t p = 0; p <= kMaxRetentionPriority; ++p) {
    uint32_t prev = kNil;
    for (uint32_t i = lru_head_[p]; i != kNil; i = next_[i]) {
      if (i >= capacity_ || seen[i]) return fail("LRU list is corrupt");
      seen[i] = 1;
      // kReleaseOrder keeps released free blocks on the LRU lists as well.
      const bool released_free = reuse_ == BlockReuse::kReleaseOrder && state_[i] == BlockState::kFree;
      if ((state_[i] != BlockState::kCached && !released_free) || refcount_[i] != 0 || priority_[i] != p ||
          prev_[i] != prev) {
        return fail("block on LRU list " + std::to_string(p) + " is inconsistent");
      }
      prev = i;
      ++(released_free ? n : cached);
    }
    if (lru_tail_[p] != prev) return fail("LRU tail mismatch");
    bool occupied = (lru_occupied_[p / 64] >> (p % 64)) & 1;
    if (occupied != (lru_head_[p] != kNil)) return fail("LRU occupancy bit mismatch");
  }
  if (n != free_count_) return fail("free count mismatch");
  if (cached != cached_count_) return fail("cached count mismatch");
  std::array<uint64_t, 4> counts{};
  for (uint32_t i = 0; i < capacity_; ++i) {
    ++counts[static_cast<size_t>(state_[i])];
    if (!seen[i] && (state_[i] == BlockState::kFree || state_[i] == BlockState::kCached)) {
      return fail("free or cached block " + std::to_string(i) + " is on no list");
    }
    if ((state_[i] == BlockState::kFilling || state_[i] == BlockState::kSealed) && refcount_[i] == 0) {
      return fail("live block " + std::to_string(i) + " has refcount 0");
    }
  }
  for (size_t s = 0; s < 4; ++s) {
    if (counts[s] != stats_.blocks_in_state[s].load()) return fail("state counters mismatch");
  }
  return Status::Ok();
}

PinnedBlocks& PinnedBlocks::operator=(PinnedBlocks&& o) noexcept {
  if (this != &o) {
    Clear();
    pool_ = o.pool_;
    ids_ = std::move(o.ids_);
    o.ids_.clear();
  }
  return *this;
}

void PinnedBlocks::Pin(BlockId b) {
  pool_->Ref(b);
  ids_.push_back(b);
}

Status PinnedBlocks::Allocate(uint32_t n) { return pool_->Allocate(n, &ids_); }

void PinnedBlocks::Replace(size_t slot, PinnedBlocks&& fresh) {
  assert(fresh.ids_.size() == 1 && fresh.pool_ == pool_);
  pool_->Unref(ids_[slot]);
  ids_[slot] = fresh.ids_[0];
  fresh.ids_.clear();
}

PinnedBlocks PinnedBlocks::Clone() const {
  PinnedBlocks copy(pool_);
  copy.ids_ = ids_;
  for (BlockId b : ids_) pool_->Ref(b);
  return copy;
}

void PinnedBlocks::Truncate(size_t n) {
  while (ids_.size() > n) {
    pool_->Unref(ids_.back());
    ids_.pop_back();
  }
}

}  // namespace tessera
