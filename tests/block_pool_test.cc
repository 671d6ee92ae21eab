#include "tessera/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "test_support.h"

namespace tessera {
namespace {

using Peer = BlockPoolTestPeer;

using testing::Preset;

// A small per-token format: `count` bf16 values per record.
PoolGroup TinyGroup(const std::string& name, uint64_t count, uint32_t layers, uint32_t block_tokens) {
  PoolGroup g;
  g.name = name;
  g.format.name = name;
  g.format.regions = {{"x", ElementType::kBf16, count, 0}};
  Result<PageLayout> page = ComputePageLayout(g.format, 1, block_tokens);
  EXPECT_TRUE(page.ok()) << page.status().ToString();
  if (page.ok()) g.page = *page;
  g.layers = layers;
  return g;
}

std::unique_ptr<BlockPool> MustPool(BlockPoolOptions options) {
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(options));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

std::unique_ptr<BlockPool> TinyPool(uint32_t capacity, RegionKind kind = RegionKind::kHost) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 2, 4), TinyGroup("b", 3, 3, 4)};
  o.capacity_blocks = capacity;
  o.region_kind = kind;
  return MustPool(std::move(o));
}

// Allocates n blocks, marks them sealed and returns them.
std::vector<BlockId> SealedBlocks(BlockPool& pool, uint32_t n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(Peer::Allocate(pool, n, &out).ok());
  for (BlockId b : out) pool.MarkSealed(b);
  return out;
}

#define EXPECT_INVARIANTS(pool)                \
  do {                                         \
    Status inv_ = (pool).CheckInvariants();    \
    EXPECT_TRUE(inv_.ok()) << inv_.ToString(); \
  } while (0)

// --- Create ---------------------------------------------------------------------------------

TEST(BlockPoolCreate, NoGroupsIsRejectedOnGroups) {
  BlockPoolOptions o;
  o.capacity_blocks = 4;
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().field(), "groups");
}

TEST(BlockPoolCreate, ZeroCapacityIsRejectedOnCapacityBlocks) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 2, 4)};
  o.capacity_blocks = 0;
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().field(), "capacity-blocks");
}

TEST(BlockPoolCreate, MixedBlockTokensIsRejectedOnGroups) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 2, 4), TinyGroup("b", 8, 2, 8)};
  o.capacity_blocks = 4;
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().field(), "groups");
  EXPECT_NE(p.status().message().find("b"), std::string::npos);
}

TEST(BlockPoolCreate, EmptyGroupIsRejectedOnGroups) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 0, 4)};
  o.capacity_blocks = 4;
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "groups");
}

TEST(BlockPoolCreate, GeometryOfAFreshPool) {
  std::unique_ptr<BlockPool> pool = TinyPool(6);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->capacity(), 6u);
  EXPECT_EQ(pool->block_tokens(), 4u);
  // a: 4 tokens x 16 B x 2 layers; b: 4 tokens x 6 B x 3 layers.
  EXPECT_EQ(pool->block_bytes(), 4u * 16 * 2 + 4u * 6 * 3);
  EXPECT_EQ(pool->metadata_bytes_per_block(), BlockMetadataBytes(4));
  EXPECT_EQ(pool->free_count(), 6u);
  EXPECT_EQ(pool->cached_count(), 0u);
  EXPECT_EQ(pool->Available(), 6u);
  EXPECT_EQ(pool->bytes_held(), 0u);
  EXPECT_TRUE(pool->backed());
  ASSERT_EQ(pool->regions().size(), 2u);  // one region per group
  EXPECT_EQ(pool->regions().region_bytes(0), 6u * 4 * 16 * 2);
  EXPECT_EQ(pool->regions().region_bytes(1), 6u * 4 * 6 * 3);
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(pool->state(BlockId{i}), BlockState::kFree);
    EXPECT_EQ(pool->refcount(BlockId{i}), 0u);
    EXPECT_EQ(pool->generation(BlockId{i}), 0u);
  }
  EXPECT_EQ(pool->stats().blocks_in_state[static_cast<size_t>(BlockState::kFree)].load(), 6u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolCreate, UnbackedPoolIsNotBacked) {
  std::unique_ptr<BlockPool> pool = TinyPool(4, RegionKind::kUnbacked);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->backed());
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 4, &out).ok());
  EXPECT_EQ(pool->bytes_held(), 4 * (pool->block_bytes() + pool->metadata_bytes_per_block()));
}

// --- Allocation and states ------------------------------------------------------------------

TEST(BlockPool, FreshPoolHandsOutIdsInOrder) {
  std::unique_ptr<BlockPool> pool = TinyPool(5);
  std::vector<BlockId> out = {BlockId{77}};  // Allocate appends
  ASSERT_TRUE(Peer::Allocate(*pool, 3, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].value, 77u);
  EXPECT_EQ(out[1].value, 0u);
  EXPECT_EQ(out[2].value, 1u);
  EXPECT_EQ(out[3].value, 2u);
  std::vector<BlockId> more;
  ASSERT_TRUE(Peer::Allocate(*pool, 2, &more).ok());
  EXPECT_EQ(more[0].value, 3u);
  EXPECT_EQ(more[1].value, 4u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(pool->state(BlockId{i}), BlockState::kFilling);
    EXPECT_EQ(pool->refcount(BlockId{i}), 1u);
  }
  EXPECT_EQ(pool->stats().allocations.load(), 5u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, FullLifeCycleFreeFillingSealedCachedEvictedFree) {
  std::unique_ptr<BlockPool> pool = TinyPool(1);
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  BlockId b = out[0];
  EXPECT_EQ(pool->state(b), BlockState::kFilling);
  EXPECT_EQ(pool->free_count(), 0u);

  pool->MarkSealed(b);
  EXPECT_EQ(pool->state(b), BlockState::kSealed);
  EXPECT_EQ(pool->refcount(b), 1u);
  EXPECT_EQ(pool->stats().seals.load(), 1u);
  EXPECT_INVARIANTS(*pool);

  Peer::Ref(*pool, b);
  EXPECT_EQ(pool->refcount(b), 2u);
  Peer::Unref(*pool, b);
  EXPECT_EQ(pool->state(b), BlockState::kSealed);  // still referenced
  Peer::Unref(*pool, b);
  EXPECT_EQ(pool->state(b), BlockState::kCached);
  EXPECT_EQ(pool->refcount(b), 0u);
  EXPECT_EQ(pool->cached_count(), 1u);
  EXPECT_EQ(pool->free_count(), 0u);
  EXPECT_EQ(pool->Available(), 1u);
  EXPECT_EQ(pool->generation(b), 0u);  // cached keeps the same life
  EXPECT_INVARIANTS(*pool);

  std::vector<BlockId> again;
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &again).ok());  // evicts
  EXPECT_EQ(again[0], b);
  EXPECT_EQ(pool->state(b), BlockState::kFilling);
  EXPECT_EQ(pool->refcount(b), 1u);
  EXPECT_EQ(pool->generation(b), 1u);
  EXPECT_EQ(pool->cached_count(), 0u);
  EXPECT_EQ(pool->stats().evictions.load(), 1u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, LastUnrefOfFillingBlockFreesIt) {
  std::unique_ptr<BlockPool> pool = TinyPool(3);
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  BlockId b = out[0];
  Peer::Ref(*pool, b);
  Peer::Unref(*pool, b);
  EXPECT_EQ(pool->state(b), BlockState::kFilling);
  Peer::Unref(*pool, b);
  EXPECT_EQ(pool->state(b), BlockState::kFree);
  EXPECT_EQ(pool->refcount(b), 0u);
  EXPECT_EQ(pool->generation(b), 1u);
  EXPECT_EQ(pool->free_count(), 3u);
  EXPECT_EQ(pool->cached_count(), 0u);
  EXPECT_EQ(pool->stats().frees.load(), 1u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, RefOnCachedBlockMakesItSealedAndUnevictable) {
  std::unique_ptr<BlockPool> pool = TinyPool(2);
  std::vector<BlockId> blocks = SealedBlocks(*pool, 2);
  Peer::Unref(*pool, blocks[0]);
  Peer::Unref(*pool, blocks[1]);
  ASSERT_EQ(pool->cached_count(), 2u);
  Peer::Ref(*pool, blocks[0]);
  EXPECT_EQ(pool->state(blocks[0]), BlockState::kSealed);
  EXPECT_EQ(pool->refcount(blocks[0]), 1u);
  EXPECT_EQ(pool->cached_count(), 1u);
  EXPECT_EQ(pool->Available(), 1u);
  EXPECT_INVARIANTS(*pool);
  // Only blocks[1] can be evicted now.
  std::vector<BlockId> out;
  EXPECT_EQ(Peer::Allocate(*pool, 2, &out).code(), StatusCode::kOutOfBlocks);
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  EXPECT_EQ(out[0], blocks[1]);
  EXPECT_EQ(pool->state(blocks[0]), BlockState::kSealed);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, AllocateIsAllOrNothing) {
  std::unique_ptr<BlockPool> pool = TinyPool(8);
  std::vector<BlockId> held = SealedBlocks(*pool, 6);  // 2 free
  Peer::Unref(*pool, held[0]);
  Peer::Unref(*pool, held[1]);  // 2 cached
  ASSERT_EQ(pool->Available(), 4u);
  const uint32_t free_before = pool->free_count(), cached_before = pool->cached_count();
  const uint64_t held_before = pool->bytes_held();
  int evictions_seen = 0;
  pool->AddEvictionListener([&](BlockId) { ++evictions_seen; });

  std::vector<BlockId> out = {BlockId{5}};
  Status st = Peer::Allocate(*pool, 5, &out);
  EXPECT_EQ(st.code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(out.size(), 1u);  // nothing appended
  EXPECT_EQ(pool->free_count(), free_before);
  EXPECT_EQ(pool->cached_count(), cached_before);
  EXPECT_EQ(pool->bytes_held(), held_before);
  EXPECT_EQ(evictions_seen, 0);
  EXPECT_EQ(pool->state(held[0]), BlockState::kCached);
  EXPECT_EQ(pool->state(held[1]), BlockState::kCached);
  EXPECT_EQ(pool->stats().allocations.load(), 6u);
  EXPECT_INVARIANTS(*pool);

  // Exactly Available() succeeds: free blocks first, then the cached ones.
  out.clear();
  ASSERT_TRUE(Peer::Allocate(*pool, 4, &out).ok());
  EXPECT_EQ(evictions_seen, 2);
  EXPECT_EQ(pool->Available(), 0u);
  EXPECT_EQ(pool->bytes_held(), 8 * (pool->block_bytes() + pool->metadata_bytes_per_block()));
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, FreeBlocksAreTakenBeforeCachedOnes) {
  std::unique_ptr<BlockPool> pool = TinyPool(4);
  std::vector<BlockId> sealed = SealedBlocks(*pool, 2);
  Peer::Unref(*pool, sealed[0]);
  Peer::Unref(*pool, sealed[1]);
  std::vector<BlockId> evicted;
  pool->AddEvictionListener([&](BlockId b) { evicted.push_back(b); });
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 2, &out).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(out[0].value, 2u);
  EXPECT_EQ(out[1].value, 3u);
  EXPECT_EQ(pool->cached_count(), 2u);
}

// AllocateFree (a decode step's inline allocation) leaves a pool exactly as Allocate(1) does —
// the same block, state, refcount, priority, free count and counters, every invariant — and
// with no free block (only cached ones) refuses and changes nothing, where Allocate(1) evicts.
TEST(BlockPool, AllocateFreeIsAllocateOneWhileABlockIsFree) {
  std::unique_ptr<BlockPool> a = TinyPool(4), b = TinyPool(4);
  for (BlockPool* pool : {a.get(), b.get()}) {
    std::vector<BlockId> sealed = SealedBlocks(*pool, 2);
    Peer::Unref(*pool, sealed[1]);  // cached
    Peer::Unref(*pool, sealed[0]);  // cached
    pool->SetPriority(sealed[0], 7);
    // A block freed while filling, with a priority of its own: the free list's head.
    std::vector<BlockId> filling;
    ASSERT_TRUE(Peer::Allocate(*pool, 1, &filling).ok());
    pool->SetPriority(filling[0], 9);
    Peer::Unref(*pool, filling[0]);
  }
  PinnedBlocks ta(a.get()), tb(b.get());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ta.Allocate(1).ok());
    ASSERT_TRUE(tb.AllocateFree());
    ASSERT_EQ(ta.size(), tb.size());
    const BlockId x = ta[ta.size() - 1], y = tb[tb.size() - 1];
    EXPECT_EQ(x, y);
    EXPECT_EQ(a->state(x), b->state(y));
    EXPECT_EQ(b->state(y), BlockState::kFilling);
    EXPECT_EQ(a->refcount(x), b->refcount(y));
    EXPECT_EQ(a->priority(x), b->priority(y));
    EXPECT_EQ(a->generation(x), b->generation(y));
    EXPECT_EQ(a->free_count(), b->free_count());
    EXPECT_EQ(a->cached_count(), b->cached_count());
    EXPECT_EQ(a->stats().allocations.load(), b->stats().allocations.load());
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_EQ(a->stats().blocks_in_state[s].load(), b->stats().blocks_in_state[s].load()) << "state " << s;
    }
    EXPECT_INVARIANTS(*a);
    EXPECT_INVARIANTS(*b);
  }
  // No free block: refused, nothing changed; Allocate(1) evicts a cached one.
  ASSERT_EQ(b->free_count(), 0u);
  const uint64_t allocations = b->stats().allocations.load();
  EXPECT_FALSE(tb.AllocateFree());
  EXPECT_EQ(tb.size(), 2u);
  EXPECT_EQ(b->cached_count(), 2u);
  EXPECT_EQ(b->stats().allocations.load(), allocations);
  EXPECT_INVARIANTS(*b);
  ASSERT_TRUE(tb.Allocate(1).ok());
  EXPECT_EQ(b->cached_count(), 1u);
  EXPECT_INVARIANTS(*b);
}

// BlockReuse::kReleaseOrder (vLLM's free block queue): never-used blocks first, then every
// released block in release order, free or cached alike; a cached block evicted only at its turn.
TEST(BlockPool, ReleaseOrderReusesBlocksInTheOrderTheyWereReleased) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 2, 4)};
  o.capacity_blocks = 5;
  o.reuse = BlockReuse::kReleaseOrder;
  std::unique_ptr<BlockPool> pool = MustPool(std::move(o));
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> sealed = SealedBlocks(*pool, 2);  // 0, 1
  std::vector<BlockId> filling;
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &filling).ok());  // 2, never sealed
  Peer::Unref(*pool, sealed[1]);                         // cached first
  Peer::Unref(*pool, filling[0]);                        // then free
  Peer::Unref(*pool, sealed[0]);                         // then cached
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(pool->free_count(), 3u);  // 3, 4 never used; 2 released
  EXPECT_EQ(pool->cached_count(), 2u);
  EXPECT_EQ(pool->Available(), 5u);
  EXPECT_EQ(pool->bytes_held(), 2 * (pool->block_bytes() + pool->metadata_bytes_per_block()));
  std::vector<BlockId> evicted;
  pool->AddEvictionListener([&](BlockId b) { evicted.push_back(b); });
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 3, &out).ok());
  // The never-used blocks, then block 1 — cached, released before block 2 — is evicted.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].value, 3u);
  EXPECT_EQ(out[1].value, 4u);
  EXPECT_EQ(out[2].value, 1u);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].value, 1u);
  EXPECT_EQ(pool->stats().evictions.load(), 1u);
  EXPECT_INVARIANTS(*pool);
  out.clear();
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  EXPECT_EQ(out[0].value, 2u);  // the released free block: reused, not an eviction
  EXPECT_EQ(evicted.size(), 1u);
  EXPECT_EQ(pool->cached_count(), 1u);
  EXPECT_INVARIANTS(*pool);
  // A hit on the cached block takes it off the queue; released again, it goes to the back.
  Peer::Ref(*pool, sealed[0]);
  Peer::Unref(*pool, out[0]);
  Peer::Unref(*pool, sealed[0]);
  EXPECT_INVARIANTS(*pool);
  out.clear();
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  EXPECT_EQ(out[0].value, 2u);
  EXPECT_EQ(evicted.size(), 1u);
  EXPECT_INVARIANTS(*pool);
  // EvictAllCached evicts the cached block and only it; the released free block stays free.
  Peer::Unref(*pool, out[0]);
  EXPECT_EQ(pool->EvictAllCached(), 1u);
  EXPECT_EQ(evicted.size(), 2u);
  EXPECT_EQ(pool->free_count(), 2u);
  EXPECT_EQ(pool->cached_count(), 0u);
  EXPECT_INVARIANTS(*pool);
}

// kReleaseOrder against a model of vLLM's free block queue: never-used blocks in id order, then
// every block whose last reference went, in that order; an allocation takes the queue's head,
// a hit takes a cached block out of it. Random operations; every allocation's blocks and
// evictions are predicted.
TEST(BlockPoolProperty, ReleaseOrderIsAFifoOfReleasedBlocks) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("a", 8, 2, 4)};
  o.capacity_blocks = 16;
  o.reuse = BlockReuse::kReleaseOrder;
  std::unique_ptr<BlockPool> pool = MustPool(std::move(o));
  ASSERT_NE(pool, nullptr);
  std::deque<uint32_t> queue;
  for (uint32_t i = 0; i < 16; ++i) queue.push_back(i);
  std::vector<uint32_t> refs(16, 0);
  std::vector<bool> sealed(16, false);
  std::vector<uint32_t> evicted;
  pool->AddEvictionListener([&](BlockId b) { evicted.push_back(b.value); });
  std::mt19937 rng(7);
  auto pick = [&](auto pred) {
    std::vector<uint32_t> c;
    for (uint32_t i = 0; i < 16; ++i) {
      if (pred(i)) c.push_back(i);
    }
    return c.empty() ? UINT32_MAX : c[std::uniform_int_distribution<size_t>(0, c.size() - 1)(rng)];
  };
  for (int op = 0; op < 4000; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind <= 2) {
      const uint32_t n = std::uniform_int_distribution<uint32_t>(1, 3)(rng);
      std::vector<BlockId> out;
      evicted.clear();
      Status st = Peer::Allocate(*pool, n, &out);
      if (n > queue.size()) {
        ASSERT_EQ(st.code(), StatusCode::kOutOfBlocks);
        continue;
      }
      ASSERT_TRUE(st.ok());
      std::vector<uint32_t> want_evicted;
      for (uint32_t k = 0; k < n; ++k) {
        const uint32_t b = queue.front();
        queue.pop_front();
        ASSERT_EQ(out[k].value, b) << "op " << op;
        if (sealed[b]) want_evicted.push_back(b);
        sealed[b] = false;
        refs[b] = 1;
      }
      ASSERT_EQ(evicted, want_evicted) << "op " << op;
    } else if (kind <= 4) {  // seal a filling block
      const uint32_t b = pick([&](uint32_t i) { return refs[i] > 0 && !sealed[i]; });
      if (b == UINT32_MAX) continue;
      pool->MarkSealed(BlockId{b});
      sealed[b] = true;
    } else if (kind <= 6) {  // a hit: ref a sealed block (cached ones leave the queue)
      const uint32_t b = pick([&](uint32_t i) { return sealed[i]; });
      if (b == UINT32_MAX) continue;
      if (refs[b] == 0) queue.erase(std::find(queue.begin(), queue.end(), b));
      Peer::Ref(*pool, BlockId{b});
      ++refs[b];
    } else {  // release a reference
      const uint32_t b = pick([&](uint32_t i) { return refs[i] > 0; });
      if (b == UINT32_MAX) continue;
      Peer::Unref(*pool, BlockId{b});
      if (--refs[b] == 0) queue.push_back(b);
    }
    ASSERT_EQ(pool->Available(), queue.size());
    Status inv = pool->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
  }
}

TEST(BlockPool, FreeFirstIsTheDefault) {
  BlockPoolOptions o;
  EXPECT_EQ(o.reuse, BlockReuse::kFreeFirst);
}

TEST(BlockPool, EvictionOrderIsLowestPriorityThenLeastRecentlyCached) {
  std::unique_ptr<BlockPool> pool = TinyPool(8);
  std::vector<BlockId> b = SealedBlocks(*pool, 8);
  const uint8_t prio[8] = {50, 0, 100, 0, 50, 35, 0, 100};
  for (uint32_t i = 0; i < 8; ++i) pool->SetPriority(b[i], prio[i]);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(pool->priority(b[i]), prio[i]);
  const uint32_t unref_order[8] = {7, 6, 5, 4, 3, 2, 1, 0};
  for (uint32_t i : unref_order) Peer::Unref(*pool, b[i]);
  EXPECT_INVARIANTS(*pool);

  std::vector<uint32_t> evicted;
  pool->AddEvictionListener([&](BlockId id) { evicted.push_back(id.value); });
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 8, &out).ok());
  // priority 0 in cache order (6, 3, 1), then 35 (5), 50 (4, 0), 100 (7, 2).
  const std::vector<uint32_t> expected = {6, 3, 1, 5, 4, 0, 7, 2};
  EXPECT_EQ(evicted, expected);
  std::vector<uint32_t> handed;
  for (BlockId id : out) handed.push_back(id.value);
  EXPECT_EQ(handed, expected);  // handed out in eviction order
  // Allocation resets the retention priority.
  for (BlockId id : out) EXPECT_EQ(pool->priority(id), kDefaultRetentionPriority);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPool, RecachingMakesABlockMostRecent) {
  std::unique_ptr<BlockPool> pool = TinyPool(3);
  std::vector<BlockId> b = SealedBlocks(*pool, 3);
  Peer::Unref(*pool, b[0]);
  Peer::Unref(*pool, b[1]);
  Peer::Unref(*pool, b[2]);
  Peer::Ref(*pool, b[0]);    // hit: leaves the LRU list
  Peer::Unref(*pool, b[0]);  // cached again, now the most recent
  std::vector<uint32_t> evicted;
  pool->AddEvictionListener([&](BlockId id) { evicted.push_back(id.value); });
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 3, &out).ok());
  EXPECT_EQ(evicted, (std::vector<uint32_t>{1, 2, 0}));
}

TEST(BlockPool, PriorityIsClampedTo100) {
  std::unique_ptr<BlockPool> pool = TinyPool(2);
  std::vector<BlockId> b = SealedBlocks(*pool, 2);
  pool->SetPriority(b[0], 255);
  EXPECT_EQ(pool->priority(b[0]), kMaxRetentionPriority);
  pool->SetPriority(b[1], 99);
  Peer::Unref(*pool, b[0]);
  Peer::Unref(*pool, b[1]);
  EXPECT_INVARIANTS(*pool);
  std::vector<uint32_t> evicted;
  pool->AddEvictionListener([&](BlockId id) { evicted.push_back(id.value); });
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 2, &out).ok());
  EXPECT_EQ(evicted, (std::vector<uint32_t>{b[1].value, b[0].value}));
}

TEST(BlockPool, EvictionListenersSeeTheBlockIntactBeforeReuse) {
  std::unique_ptr<BlockPool> pool = TinyPool(1);
  std::vector<BlockId> b = SealedBlocks(*pool, 1);
  BlockHandle h = pool->BlockHandleOf(b[0], 0);
  std::span<std::byte> bytes = pool->MutableBytes(h);
  std::memset(bytes.data(), 0x5A, bytes.size());
  Peer::Unref(*pool, b[0]);

  std::vector<int> calls;
  auto check = [&](int which) {
    return [&, which](BlockId id) {
      calls.push_back(which);
      EXPECT_EQ(id, b[0]);
      EXPECT_EQ(pool->state(id), BlockState::kCached);  // not reused yet
      EXPECT_EQ(pool->refcount(id), 0u);
      EXPECT_EQ(pool->generation(id), 0u);  // the life being ended
      std::span<const std::byte> seen = pool->Bytes(pool->BlockHandleOf(id, 0));
      for (std::byte v : seen) ASSERT_EQ(v, std::byte{0x5A});
    };
  };
  pool->AddEvictionListener(check(1));
  pool->AddEvictionListener(check(2));
  std::vector<BlockId> out;
  ASSERT_TRUE(Peer::Allocate(*pool, 1, &out).ok());
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));  // in order
  EXPECT_EQ(pool->generation(b[0]), 1u);
  EXPECT_EQ(pool->state(b[0]), BlockState::kFilling);
}

TEST(BlockPool, BytesHeldCountsEveryNonFreeBlock) {
  std::unique_ptr<BlockPool> pool = TinyPool(10);
  const uint64_t per_block = pool->block_bytes() + pool->metadata_bytes_per_block();
  std::vector<BlockId> b;
  ASSERT_TRUE(Peer::Allocate(*pool, 7, &b).ok());
  EXPECT_EQ(pool->bytes_held(), 7 * per_block);
  pool->MarkSealed(b[0]);
  pool->MarkSealed(b[1]);
  Peer::Unref(*pool, b[0]);  // cached: still held
  EXPECT_EQ(pool->bytes_held(), 7 * per_block);
  Peer::Unref(*pool, b[2]);  // filling -> free
  EXPECT_EQ(pool->bytes_held(), 6 * per_block);
  EXPECT_EQ(pool->bytes_held(), (pool->capacity() - pool->free_count()) * per_block);
}

TEST(BlockPool, PageAndBlockHandlesAreBlockMajor) {
  std::unique_ptr<BlockPool> pool = TinyPool(5);
  const uint64_t page_a = 4 * 16, page_b = 4 * 6;
  for (uint32_t i = 0; i < 5; ++i) {
    BlockId id{i};
    BlockHandle ba = pool->BlockHandleOf(id, 0);
    EXPECT_EQ(ba.region, 0u);
    EXPECT_EQ(ba.offset, i * 2 * page_a);
    EXPECT_EQ(ba.len, 2 * page_a);
    BlockHandle bb = pool->BlockHandleOf(id, 1);
    EXPECT_EQ(bb.region, 1u);
    EXPECT_EQ(bb.offset, i * 3 * page_b);
    EXPECT_EQ(bb.len, 3 * page_b);
    for (uint32_t l = 0; l < 2; ++l) {
      BlockHandle p = pool->PageHandle(id, 0, l);
      EXPECT_EQ(p, (BlockHandle{0, i * 2 * page_a + l * page_a, page_a}));
    }
    for (uint32_t l = 0; l < 3; ++l) {
      BlockHandle p = pool->PageHandle(id, 1, l);
      EXPECT_EQ(p, (BlockHandle{1, i * 3 * page_b + l * page_b, page_b}));
    }
    // Every handle resolves inside its region.
    EXPECT_TRUE(pool->regions().ResolveChecked(pool->PageHandle(id, 1, 2)).ok());
  }
}

// ADR 0020: the HCA group of DeepSeek-V4-Pro packed, 31 layers' slices of 2 v4-fp8 entries in
// one 36,288-B page per block. A kernel addresses entry e of layer l of block b in place:
// rows at b x 36,288 + l x 1,168 + e x 576, scales after the slice's rows at + 2 x 576 + e x 8.
// Record (what RequestManager::Entry returns) keeps its meaning: entry index -> those bytes.
TEST(BlockPool, PackedPagesPlaceEveryLayersSliceAtItsStride) {
  Geometry g = Preset("deepseek-v4-pro");
  RecordFormat v4 = *BuildFormat("v4-fp8", g);
  PoolGroup hca{"compressed/128", v4, 31, *ComputePageLayout(v4, 128, 256, 0, 31)};
  BlockPoolOptions o;
  o.groups = {hca};
  o.capacity_blocks = 3;
  std::unique_ptr<BlockPool> pool = MustPool(std::move(o));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->block_bytes(), 36288u);
  std::vector<BlockId> blocks;
  ASSERT_TRUE(Peer::Allocate(*pool, 3, &blocks).ok());
  const std::byte* base = pool->Bytes(pool->BlockHandleOf(BlockId{0}, 0)).data();
  // Every entry's planes sit where the stride arithmetic says, and are written without
  // touching any other entry.
  for (BlockId b : blocks) {
    EXPECT_EQ(pool->BlockHandleOf(b, 0).len, 36288u);
    for (uint32_t l = 0; l < 31; ++l) {
      BlockHandle page = pool->PageHandle(b, 0, l);
      EXPECT_EQ(page.offset, b.value * 36288ULL + l * 1168ULL);
      EXPECT_EQ(page.len, 1168u);
      for (uint64_t e = 0; e < 2; ++e) {
        RecordView r = pool->MutableRecord(b, 0, l, e);
        ASSERT_EQ(r.plane_count, 2u);
        const uint64_t slice = b.value * 36288ULL + l * 1168ULL;
        EXPECT_EQ(r.planes[0].data() - base, static_cast<std::ptrdiff_t>(slice + e * 576));
        EXPECT_EQ(r.planes[0].size(), 576u);
        EXPECT_EQ(r.planes[1].data() - base, static_cast<std::ptrdiff_t>(slice + 2 * 576 + e * 8));
        EXPECT_EQ(r.planes[1].size(), 8u);
        const auto mark = static_cast<std::byte>(1 + (b.value * 62 + l * 2 + e) % 251);
        std::fill(r.planes[0].begin(), r.planes[0].end(), mark);
        std::fill(r.planes[1].begin(), r.planes[1].end(), mark);
      }
    }
  }
  // Every byte of every slice was written once, with its entry's mark; the pages' 80 B of
  // padding were not.
  for (BlockId b : blocks) {
    std::span<const std::byte> bytes = pool->Bytes(pool->BlockHandleOf(b, 0));
    for (uint32_t l = 0; l < 31; ++l) {
      for (uint64_t e = 0; e < 2; ++e) {
        const auto mark = static_cast<std::byte>(1 + (b.value * 62 + l * 2 + e) % 251);
        const uint64_t slice = l * 1168ULL;
        EXPECT_EQ(bytes[slice + e * 576 + 575], mark);
        EXPECT_EQ(bytes[slice + 2 * 576 + e * 8], mark);
      }
    }
    for (uint64_t i = 31 * 1168; i < 36288; ++i) ASSERT_EQ(bytes[i], std::byte{0}) << i;
  }
}

// A packed page that cannot hold its slices is refused.
TEST(BlockPoolCreate, PackedSlicesLargerThanThePageAreRejected) {
  RecordFormat v4 = *BuildFormat("v4-fp8", Preset("deepseek-v4-pro"));
  PoolGroup bad{"compressed/128", v4, 31, *ComputePageLayout(v4, 128, 256, 0, 31)};
  bad.page.page_bytes = 1728;
  PoolGroup overlapping{"compressed/128", v4, 31, *ComputePageLayout(v4, 128, 256, 0, 31)};
  overlapping.page.layer_stride = 584;  // slices of 1,168 B would overlap
  for (const PoolGroup& g : {bad, overlapping}) {
    BlockPoolOptions o;
    o.groups = {g};
    o.capacity_blocks = 1;
    Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().field(), "groups");
  }
}

// --- Property test --------------------------------------------------------------------------

// The deepseek-v3.2 groups (fp8_ds_mla latent and indexer-fp8 keys), 3 layers each.
std::vector<PoolGroup> V32Groups() {
  Geometry g = Preset("deepseek-v3.2");
  std::vector<PoolGroup> groups;
  for (const char* name : {"fp8_ds_mla", "indexer-fp8"}) {
    Result<RecordFormat> f = BuildFormat(name, g);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return {};
    Result<PageLayout> page = ComputePageLayout(*f, 1, 64);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    if (!page.ok()) return {};
    groups.push_back({name, *f, 3, *page});
  }
  return groups;
}

// A shadow model of the documented contract, checked against the pool after every operation.
struct Shadow {
  BlockState state = BlockState::kFree;
  uint32_t refcount = 0;
  uint32_t generation = 0;
  uint8_t priority = kDefaultRetentionPriority;
  uint64_t cached_at = 0;  // clock when last cached
  uint64_t stamp = 0;      // written into the block's pages at allocation
};

TEST(BlockPoolProperty, RandomOperationsKeepInvariantsAndDisjointPages) {
  std::vector<PoolGroup> groups = V32Groups();
  ASSERT_EQ(groups.size(), 2u);
  BlockPoolOptions o;
  o.groups = groups;
  o.capacity_blocks = 24;
  std::unique_ptr<BlockPool> pool = MustPool(std::move(o));
  ASSERT_NE(pool, nullptr);
  const uint32_t cap = pool->capacity();
  std::vector<Shadow> shadow(cap);
  uint64_t clock = 0, next_stamp = 1;
  const uint64_t per_block = pool->block_bytes() + pool->metadata_bytes_per_block();

  auto write_stamp = [&](BlockId b, uint64_t stamp) {
    for (uint32_t g = 0; g < 2; ++g) {
      for (uint32_t l = 0; l < 3; ++l) {
        std::span<std::byte> page = pool->MutableBytes(pool->PageHandle(b, g, l));
        uint64_t v = stamp * 8 + g * 4 + l;
        std::memcpy(page.data(), &v, sizeof v);
        std::memcpy(page.data() + page.size() - sizeof v, &v, sizeof v);
      }
    }
  };
  auto stamp_ok = [&](BlockId b, uint64_t stamp) {
    for (uint32_t g = 0; g < 2; ++g) {
      for (uint32_t l = 0; l < 3; ++l) {
        std::span<const std::byte> page = pool->Bytes(pool->PageHandle(b, g, l));
        uint64_t v = stamp * 8 + g * 4 + l, head = 0, tail = 0;
        std::memcpy(&head, page.data(), sizeof head);
        std::memcpy(&tail, page.data() + page.size() - sizeof tail, sizeof tail);
        if (head != v || tail != v) return false;
      }
    }
    return true;
  };

  // The victim the contract names: lowest priority, then least recently cached.
  auto expected_victim = [&]() {
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < cap; ++i) {
      if (shadow[i].state != BlockState::kCached) continue;
      if (best == UINT32_MAX || shadow[i].priority < shadow[best].priority ||
          (shadow[i].priority == shadow[best].priority && shadow[i].cached_at < shadow[best].cached_at)) {
        best = i;
      }
    }
    return best;
  };

  std::vector<uint32_t> evicted;
  pool->AddEvictionListener([&](BlockId b) {
    evicted.push_back(b.value);
    EXPECT_EQ(pool->state(b), BlockState::kCached);
    EXPECT_TRUE(stamp_ok(b, shadow[b.value].stamp)) << "evicted block " << b.value << " was overwritten";
  });

  std::mt19937 rng(20240601);
  auto pick = [&](auto pred) {
    std::vector<uint32_t> c;
    for (uint32_t i = 0; i < cap; ++i) {
      if (pred(shadow[i])) c.push_back(i);
    }
    if (c.empty()) return UINT32_MAX;
    return c[std::uniform_int_distribution<size_t>(0, c.size() - 1)(rng)];
  };

  int failures_out_of_blocks = 0, allocations = 0;
  for (int op = 0; op < 3000; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind <= 2) {  // allocate 1..4
      const uint32_t n = std::uniform_int_distribution<uint32_t>(1, 4)(rng);
      uint32_t free_before = 0, cached_before = 0;
      for (const Shadow& s : shadow) {
        free_before += s.state == BlockState::kFree;
        cached_before += s.state == BlockState::kCached;
      }
      ASSERT_EQ(pool->Available(), free_before + cached_before);
      std::vector<BlockId> out;
      evicted.clear();
      // Predict the evictions from the model before the pool runs.
      std::vector<uint32_t> predicted;
      if (n <= free_before + cached_before && n > free_before) {
        std::vector<Shadow> saved = shadow;
        for (uint32_t k = 0; k < n - free_before; ++k) {
          uint32_t v = expected_victim();
          predicted.push_back(v);
          shadow[v].state = BlockState::kFilling;  // temporarily off the cache
        }
        shadow = saved;
      }
      Status st = Peer::Allocate(*pool, n, &out);
      if (n > free_before + cached_before) {
        ASSERT_EQ(st.code(), StatusCode::kOutOfBlocks);
        ASSERT_TRUE(out.empty());
        ASSERT_TRUE(evicted.empty());
        ++failures_out_of_blocks;
      } else {
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(out.size(), n);
        ASSERT_EQ(evicted, predicted) << "op " << op;
        ++allocations;
        for (BlockId b : out) {
          Shadow& s = shadow[b.value];
          ASSERT_TRUE(s.state == BlockState::kFree || s.state == BlockState::kCached) << "op " << op;
          const bool was_cached = s.state == BlockState::kCached;
          if (was_cached) ++s.generation;
          s.state = BlockState::kFilling;
          s.refcount = 1;
          s.priority = kDefaultRetentionPriority;
          s.stamp = next_stamp++;
          write_stamp(b, s.stamp);
        }
      }
    } else if (kind == 3) {  // ref a live or cached block
      uint32_t i = pick([](const Shadow& s) { return s.state != BlockState::kFree; });
      if (i == UINT32_MAX) continue;
      Peer::Ref(*pool, BlockId{i});
      if (shadow[i].state == BlockState::kCached) shadow[i].state = BlockState::kSealed;
      ++shadow[i].refcount;
    } else if (kind <= 6) {  // unref
      uint32_t i = pick([](const Shadow& s) { return s.refcount > 0; });
      if (i == UINT32_MAX) continue;
      Peer::Unref(*pool, BlockId{i});
      Shadow& s = shadow[i];
      if (--s.refcount == 0) {
        if (s.state == BlockState::kSealed) {
          s.state = BlockState::kCached;
          s.cached_at = ++clock;
        } else {
          s.state = BlockState::kFree;
          ++s.generation;
        }
      }
    } else if (kind <= 8) {  // seal
      uint32_t i = pick([](const Shadow& s) { return s.state == BlockState::kFilling; });
      if (i == UINT32_MAX) continue;
      pool->MarkSealed(BlockId{i});
      shadow[i].state = BlockState::kSealed;
    } else {  // set priority on a referenced block (takes effect when it is next cached)
      uint32_t i = pick([](const Shadow& s) { return s.refcount > 0; });
      if (i == UINT32_MAX) continue;
      uint32_t p = std::uniform_int_distribution<uint32_t>(0, 110)(rng);
      pool->SetPriority(BlockId{i}, static_cast<uint8_t>(p));
      shadow[i].priority = static_cast<uint8_t>(std::min<uint32_t>(p, kMaxRetentionPriority));
    }

    Status inv = pool->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "op " << op << ": " << inv.ToString();
    uint32_t free_n = 0, cached_n = 0;
    std::vector<BlockHandle> handles;
    for (uint32_t i = 0; i < cap; ++i) {
      const Shadow& s = shadow[i];
      BlockId b{i};
      ASSERT_EQ(pool->state(b), s.state) << "op " << op << " block " << i;
      ASSERT_EQ(pool->refcount(b), s.refcount) << "op " << op << " block " << i;
      ASSERT_EQ(pool->generation(b), s.generation) << "op " << op << " block " << i;
      ASSERT_EQ(pool->priority(b), s.priority) << "op " << op << " block " << i;
      free_n += s.state == BlockState::kFree;
      cached_n += s.state == BlockState::kCached;
      if (s.state == BlockState::kFree) continue;
      ASSERT_TRUE(stamp_ok(b, s.stamp)) << "op " << op << ": block " << i << " pages were overwritten";
      for (uint32_t g = 0; g < 2; ++g) {
        for (uint32_t l = 0; l < 3; ++l) handles.push_back(pool->PageHandle(b, g, l));
      }
    }
    ASSERT_EQ(pool->free_count(), free_n);
    ASSERT_EQ(pool->cached_count(), cached_n);
    ASSERT_EQ(pool->bytes_held(), (cap - free_n) * per_block);
    for (size_t x = 0; x < handles.size(); ++x) {
      ASSERT_TRUE(pool->regions().ResolveChecked(handles[x]).ok());
      for (size_t y = x + 1; y < handles.size(); ++y) {
        ASSERT_FALSE(handles[x].Overlaps(handles[y])) << "op " << op << ": handles " << x << " and " << y << " overlap";
      }
    }
  }
  // The sequence exercised every path.
  EXPECT_GT(failures_out_of_blocks, 0);
  EXPECT_GT(allocations, 100);
  EXPECT_GT(pool->stats().evictions.load(), 0u);
  EXPECT_GT(pool->stats().frees.load(), 0u);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// PinnedBlocks owns its references: released when it goes, last block first; a clone adds one
// reference to each; a replacement releases the old block; a refused allocation changes nothing.
TEST(PinnedBlocks, OwnsItsReferencesAndReleasesTheTailFirst) {
  std::unique_ptr<BlockPool> pool = TinyPool(4);
  {
    PinnedBlocks t(pool.get());
    ASSERT_TRUE(t.Allocate(3).ok());
    EXPECT_EQ(pool->free_count(), 1u);
    for (BlockId b : t.ids()) pool->MarkSealed(b);
    {
      PinnedBlocks fork = t.Clone();
      EXPECT_EQ(pool->refcount(t[0]), 2u);
      PinnedBlocks moved = std::move(fork);
      EXPECT_TRUE(fork.empty());
      EXPECT_EQ(pool->refcount(t[2]), 2u);
    }
    EXPECT_EQ(pool->refcount(t[0]), 1u);
    EXPECT_EQ(t.Allocate(2).code(), StatusCode::kOutOfBlocks);
    EXPECT_EQ(t.size(), 3u);
    PinnedBlocks fresh(pool.get());
    ASSERT_TRUE(fresh.Allocate(1).ok());
    const BlockId old = t[1], replacement = fresh[0];
    t.Replace(1, std::move(fresh));
    EXPECT_EQ(t[1], replacement);
    EXPECT_EQ(pool->state(old), BlockState::kCached);  // its last reference went
    t.Truncate(1);
    EXPECT_EQ(pool->free_count(), 1u);  // the unsealed replacement was freed
    EXPECT_EQ(pool->cached_count(), 2u);
  }
  // The table went: every block cached (sealed) or free.
  EXPECT_EQ(pool->cached_count(), 3u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Released last block first, a chain's prefix is cached after its extensions, so LRU evicts the
// leaves first and the prefix last (block_pool.h). Destruction, Truncate and move-assignment
// release in that order; eviction order shows it.
TEST(PinnedBlocks, ReleaseOrderMakesLruEvictTheTailFirst) {
  for (int release = 0; release < 3; ++release) {
    SCOPED_TRACE("release " + std::to_string(release));
    std::unique_ptr<BlockPool> pool = TinyPool(4);
    std::vector<uint32_t> evicted;
    pool->AddEvictionListener([&](BlockId b) { evicted.push_back(b.value); });
    std::vector<uint32_t> chain;
    {
      PinnedBlocks t(pool.get());
      ASSERT_TRUE(t.Allocate(4).ok());
      for (BlockId b : t.ids()) pool->MarkSealed(b);
      for (BlockId b : t.ids()) chain.push_back(b.value);
      if (release == 1) t.Truncate(0);
      if (release == 2) t = PinnedBlocks(pool.get());
    }  // release == 0: the destructor
    ASSERT_EQ(pool->cached_count(), 4u);
    // Each allocation evicts the least recently cached block: the chain from its tail back.
    PinnedBlocks fresh(pool.get());
    for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(fresh.Allocate(1).ok());
    EXPECT_EQ(evicted, (std::vector<uint32_t>{chain[3], chain[2], chain[1], chain[0]}));
  }
}

}  // namespace
}  // namespace tessera
