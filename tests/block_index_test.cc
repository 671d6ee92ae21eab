#include "tessera/block_index.h"

#include <gtest/gtest.h>

#include "test_support.h"

#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace tessera {
namespace {

using Peer = BlockPoolTestPeer;

constexpr uint32_t kBlockTokens = 4;

PoolGroup TinyGroup(const std::string& name, uint64_t count, uint32_t layers) {
  PoolGroup g;
  g.name = name;
  g.format.name = name;
  g.format.regions = {{"x", ElementType::kBf16, count, 0}};
  Result<PageLayout> page = ComputePageLayout(g.format, 1, kBlockTokens);
  EXPECT_TRUE(page.ok()) << page.status().ToString();
  if (page.ok()) g.page = *page;
  g.layers = layers;
  return g;
}

std::unique_ptr<BlockPool> SmallPool(uint32_t capacity, RegionKind kind = RegionKind::kHost) {
  BlockPoolOptions o;
  o.groups = {TinyGroup("latent", 8, 2), TinyGroup("indexer", 2, 2)};
  o.capacity_blocks = capacity;
  o.region_kind = kind;
  Result<std::unique_ptr<BlockPool>> p = BlockPool::Create(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

ContentHasher Hasher(uint32_t bits = 128, uint64_t seed = 99) {
  Result<ContentHasher> h = ContentHasher::Create(HashAlgorithm::kXxh3, bits, seed);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return std::move(h).value();
}

BlockId Alloc(BlockPool& pool) {
  std::vector<BlockId> out;
  Status st = Peer::Allocate(pool, 1, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out.empty() ? BlockId{} : out[0];
}

// Fills every group of `b` with bytes derived from `seed`.
void Fill(BlockPool& pool, BlockId b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint32_t g = 0; g < pool.groups().size(); ++g) {
    for (std::byte& v : pool.MutableBytes(pool.BlockHandleOf(b, g))) v = static_cast<std::byte>(rng() & 0xFF);
  }
}

// All bytes of `b`, every group in order.
std::vector<std::byte> Snapshot(const BlockPool& pool, BlockId b) {
  std::vector<std::byte> out;
  for (uint32_t g = 0; g < pool.groups().size(); ++g) {
    std::span<const std::byte> s = pool.Bytes(pool.BlockHandleOf(b, g));
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

std::vector<uint32_t> Toks(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }

struct Fixture {
  explicit Fixture(uint32_t capacity, bool dedup = true, uint32_t bits = 128)
      : pool(SmallPool(capacity)), index(pool.get(), Hasher(bits), dedup) {}
  // Allocates, fills and seals a block under `parent`.
  BlockIndex::SealResult SealNew(const PrefixRef& parent, const std::vector<uint32_t>& tokens, uint64_t fill,
                                 uint32_t domain = 0, uint64_t salt = 0) {
    BlockId b = Alloc(*pool);
    Fill(*pool, b, fill);
    return index.Seal(b, parent, tokens, domain, salt);
  }
  std::unique_ptr<BlockPool> pool;
  BlockIndex index;
};

// --- Prefix index ---------------------------------------------------------------------------

TEST(BlockIndexPrefix, SealThenLookupFromRootHits) {
  Fixture f(8);
  std::vector<uint32_t> t = Toks(1, 2, 3, 4);
  BlockIndex::SealResult s = f.SealNew(PrefixRef{}, t, 1, 5, 77);
  EXPECT_FALSE(s.deduplicated);
  EXPECT_EQ(f.pool->state(s.ref.block), BlockState::kSealed);
  EXPECT_EQ(f.index.prefix_entries(), 1u);
  EXPECT_EQ(f.index.Domain(s.ref.block), 5u);
  std::span<const uint32_t> stored = f.index.Tokens(s.ref.block);
  EXPECT_EQ(std::vector<uint32_t>(stored.begin(), stored.end()), t);

  std::optional<PrefixRef> hit = f.index.Lookup(PrefixRef{}, t, 5, 77);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block, s.ref.block);
  EXPECT_EQ(hit->generation, f.pool->generation(s.ref.block));
  EXPECT_EQ(hit->key, s.ref.key);
  EXPECT_EQ(f.index.stats().prefix_hits.load(), 1u);
  // Lookup does not take a reference.
  EXPECT_EQ(f.pool->refcount(s.ref.block), 1u);
  // A cached block still hits.
  Peer::Unref(*f.pool, s.ref.block);
  ASSERT_EQ(f.pool->state(s.ref.block), BlockState::kCached);
  EXPECT_TRUE(f.index.Lookup(PrefixRef{}, t, 5, 77).has_value());
}

TEST(BlockIndexPrefix, DifferentTokensDomainSaltOrParentMiss) {
  Fixture f(8);
  BlockIndex::SealResult a = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 1, 5, 77);
  BlockIndex::SealResult b = f.SealNew(a.ref, Toks(5, 6, 7, 8), 2, 5, 77);
  BlockIndex::SealResult other = f.SealNew(PrefixRef{}, Toks(9, 9, 9, 9), 3, 5, 77);
  ASSERT_TRUE(f.index.Lookup(a.ref, Toks(5, 6, 7, 8), 5, 77).has_value());
  EXPECT_EQ(f.index.Lookup(a.ref, Toks(5, 6, 7, 8), 5, 77)->block, b.ref.block);

  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 5), 5, 77).has_value());  // tokens
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(4, 3, 2, 1), 5, 77).has_value());  // order
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 6, 77).has_value());  // domain
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 5, 78).has_value());  // salt
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(5, 6, 7, 8), 5, 77).has_value());  // parent: root
  EXPECT_FALSE(f.index.Lookup(other.ref, Toks(5, 6, 7, 8), 5, 77).has_value());    // parent: a sibling
  EXPECT_GE(f.index.stats().prefix_misses.load(), 6u);
}

TEST(BlockIndexPrefix, ForgedParentWithTheRightKeyButWrongBlockMisses) {
  Fixture f(8);
  BlockIndex::SealResult a = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 1);
  BlockIndex::SealResult b = f.SealNew(a.ref, Toks(5, 6, 7, 8), 2);
  BlockIndex::SealResult other = f.SealNew(PrefixRef{}, Toks(9, 9, 9, 9), 3);
  // The key of `a` with another block id: the key matches, the identity does not.
  PrefixRef forged{other.ref.block, other.ref.generation, a.ref.key};
  EXPECT_FALSE(f.index.Lookup(forged, Toks(5, 6, 7, 8), 0, 0).has_value());
  EXPECT_EQ(f.index.stats().prefix_key_mismatches.load(), 1u);
  // The same block but a stale generation.
  PrefixRef stale{a.ref.block, a.ref.generation + 1, a.ref.key};
  EXPECT_FALSE(f.index.Lookup(stale, Toks(5, 6, 7, 8), 0, 0).has_value());
  EXPECT_EQ(f.index.stats().prefix_key_mismatches.load(), 2u);
  (void)b;
}

// --- Caller keys (ADR 0045) ----------------------------------------------------------------

CallerHash Caller(uint8_t seed) {
  CallerHash h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::byte>(seed + i);
  return h;
}

TEST(BlockIndexCallerKeys, AHitIsTheWholeHashNotTheKey) {
  std::unique_ptr<BlockPool> pool = SmallPool(8, RegionKind::kUnbacked);
  BlockIndex index(pool.get(), Hasher(), /*content_dedup=*/false);
  index.EnableCallerKeys();
  const CallerHash mine = Caller(1);
  CallerHash other = mine;
  other[31] ^= std::byte{1};  // one bit of 256
  const Hash128 key = index.CallerKey(index.root_key(), mine, 5, 77);
  const BlockIndex::SealResult s = index.SealKeyed(Alloc(*pool), PrefixRef{}, key, mine, Toks(1, 2, 3, 4), 5, 77);
  EXPECT_TRUE(index.CallerKeyed(s.ref.block));
  ASSERT_TRUE(index.LookupKeyed(PrefixRef{}, key, mine, 5, 77).has_value());
  // A forced collision: the same key with another caller hash is refused, and counted.
  EXPECT_FALSE(index.LookupKeyed(PrefixRef{}, key, other, 5, 77).has_value());
  EXPECT_EQ(index.stats().prefix_key_mismatches.load(), 1u);
  // Domain, salt and parent are checked as for token keys.
  EXPECT_FALSE(index.LookupKeyed(PrefixRef{}, key, mine, 6, 77).has_value());
  EXPECT_FALSE(index.LookupKeyed(PrefixRef{}, key, mine, 5, 78).has_value());
  EXPECT_FALSE(index.LookupKeyed(s.ref, key, mine, 5, 77).has_value());
  // Keys of other hashes, domains and salts differ; a caller key is not the token key.
  EXPECT_NE(index.CallerKey(index.root_key(), other, 5, 77), key);
  EXPECT_NE(index.CallerKey(index.root_key(), mine, 6, 77), key);
  EXPECT_NE(index.PrefixKey(index.root_key(), Toks(1, 2, 3, 4), 5, 77), key);
}

TEST(BlockIndexCallerKeys, TokenAndCallerKeyedBlocksNeverVerifyForEachOther) {
  std::unique_ptr<BlockPool> pool = SmallPool(8, RegionKind::kUnbacked);
  BlockIndex index(pool.get(), Hasher(), /*content_dedup=*/false);
  index.EnableCallerKeys();
  const std::vector<uint32_t> t = Toks(1, 2, 3, 4);
  const BlockIndex::SealResult by_tokens = index.Seal(Alloc(*pool), PrefixRef{}, t, 0, 0);
  const CallerHash h = Caller(9);
  const Hash128 ck = index.CallerKey(index.root_key(), h, 0, 0);
  const BlockIndex::SealResult by_hash = index.SealKeyed(Alloc(*pool), PrefixRef{}, ck, h, t, 0, 0);
  // Even handed the other kind's key, neither look-up accepts the other kind's block.
  EXPECT_FALSE(index.Lookup(PrefixRef{}, ck, t, 0, 0).has_value());
  EXPECT_FALSE(index.LookupKeyed(PrefixRef{}, by_tokens.ref.key, h, 0, 0).has_value());
  EXPECT_EQ(index.Lookup(PrefixRef{}, t, 0, 0)->block, by_tokens.ref.block);
  EXPECT_EQ(index.LookupKeyed(PrefixRef{}, ck, h, 0, 0)->block, by_hash.ref.block);
}

TEST(BlockIndexPrefix, EvictionRemovesEntries) {
  Fixture f(4);
  BlockIndex::SealResult a = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 1);
  BlockIndex::SealResult b = f.SealNew(a.ref, Toks(5, 6, 7, 8), 2);
  EXPECT_EQ(f.index.prefix_entries(), 2u);
  Peer::Unref(*f.pool, b.ref.block);
  Peer::Unref(*f.pool, a.ref.block);
  ASSERT_TRUE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).has_value());
  // Allocate the whole pool: both cached blocks are evicted.
  std::vector<BlockId> all;
  ASSERT_TRUE(Peer::Allocate(*f.pool, 4, &all).ok());
  EXPECT_EQ(f.pool->stats().evictions.load(), 2u);
  EXPECT_EQ(f.index.prefix_entries(), 0u);
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).has_value());
  EXPECT_FALSE(f.index.Lookup(a.ref, Toks(5, 6, 7, 8), 0, 0).has_value());
}

TEST(BlockIndexPrefix, ReusedBlockIdDoesNotServeTheOldPrefix) {
  Fixture f(1);
  BlockIndex::SealResult a = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 1);
  Peer::Unref(*f.pool, a.ref.block);
  // The only block is evicted and resealed with other tokens.
  BlockIndex::SealResult b = f.SealNew(PrefixRef{}, Toks(7, 7, 7, 7), 2);
  ASSERT_EQ(b.ref.block, a.ref.block);
  EXPECT_EQ(b.ref.generation, a.ref.generation + 1);
  EXPECT_FALSE(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).has_value());
  EXPECT_TRUE(f.index.Lookup(PrefixRef{}, Toks(7, 7, 7, 7), 0, 0).has_value());
  EXPECT_EQ(f.index.prefix_entries(), 1u);
}

// Regression: a child whose parent was evicted stays in the prefix map under its key (the key
// hashes the parent's key, not its block id or generation). When the same prefix is sealed
// again, the re-sealed child has the same key and must replace the orphan, which no longer
// carries that identity; otherwise Lookup finds the orphan, fails its identity check and misses.
TEST(BlockIndexPrefix, ResealedChildIsFoundAfterItsParentWasEvicted) {
  Fixture f(4, /*dedup=*/false);
  BlockIndex::SealResult p = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 1);
  BlockIndex::SealResult c = f.SealNew(p.ref, Toks(5, 6, 7, 8), 2);
  f.pool->SetPriority(c.ref.block, 100);  // the extension is kept longer than its parent
  Peer::Unref(*f.pool, c.ref.block);
  Peer::Unref(*f.pool, p.ref.block);
  // Three blocks: two free ones, then the parent (priority 35) is evicted; the child stays cached.
  std::vector<BlockId> fresh;
  ASSERT_TRUE(Peer::Allocate(*f.pool, 3, &fresh).ok());
  ASSERT_EQ(f.pool->state(c.ref.block), BlockState::kCached);
  ASSERT_EQ(f.pool->stats().evictions.load(), 1u);
  // The same two blocks are computed again and sealed.
  Fill(*f.pool, fresh[0], 1);
  BlockIndex::SealResult p2 = f.index.Seal(fresh[0], PrefixRef{}, Toks(1, 2, 3, 4), 0, 0);
  Fill(*f.pool, fresh[1], 2);
  BlockIndex::SealResult c2 = f.index.Seal(fresh[1], p2.ref, Toks(5, 6, 7, 8), 0, 0);
  std::optional<PrefixRef> hp = f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0);
  ASSERT_TRUE(hp.has_value());
  EXPECT_EQ(hp->block, p2.ref.block);
  std::optional<PrefixRef> hc = f.index.Lookup(*hp, Toks(5, 6, 7, 8), 0, 0);
  ASSERT_TRUE(hc.has_value()) << "the stale orphan child shadows the re-sealed one";
  EXPECT_EQ(hc->block, c2.ref.block);
}

// --- Content index --------------------------------------------------------------------------

TEST(BlockIndexDedup, IdenticalBytesAndIdentityAreShared) {
  Fixture f(8);
  BlockIndex::SealResult first = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42, 3, 9);
  BlockId candidate = Alloc(*f.pool);
  Fill(*f.pool, candidate, 42);
  const uint32_t gen_before = f.pool->generation(candidate);
  BlockIndex::SealResult second = f.index.Seal(candidate, PrefixRef{}, Toks(1, 2, 3, 4), 3, 9);
  EXPECT_TRUE(second.deduplicated);
  EXPECT_EQ(second.ref.block, first.ref.block);
  EXPECT_EQ(second.ref.key, first.ref.key);
  EXPECT_EQ(second.ref.generation, first.ref.generation);
  EXPECT_EQ(f.pool->refcount(first.ref.block), 2u);
  EXPECT_EQ(f.pool->state(candidate), BlockState::kFree);
  EXPECT_EQ(f.pool->generation(candidate), gen_before + 1);
  EXPECT_EQ(f.index.stats().dedup_hits.load(), 1u);
  EXPECT_EQ(f.index.stats().dedup_collisions.load(), 0u);
  EXPECT_GT(f.index.stats().bytes_compared.load(), 0u);
  EXPECT_EQ(f.index.prefix_entries(), 1u);
  EXPECT_TRUE(f.pool->CheckInvariants().ok());
}

TEST(BlockIndexDedup, CachedBlockIsRevivedByDedup) {
  Fixture f(8);
  BlockIndex::SealResult first = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42);
  Peer::Unref(*f.pool, first.ref.block);
  ASSERT_EQ(f.pool->state(first.ref.block), BlockState::kCached);
  BlockIndex::SealResult second = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42);
  EXPECT_TRUE(second.deduplicated);
  EXPECT_EQ(second.ref.block, first.ref.block);
  EXPECT_EQ(f.pool->state(first.ref.block), BlockState::kSealed);
  EXPECT_EQ(f.pool->refcount(first.ref.block), 1u);
  EXPECT_EQ(f.pool->cached_count(), 0u);
  EXPECT_TRUE(f.pool->CheckInvariants().ok());
}

TEST(BlockIndexDedup, IdenticalBytesDifferentTokensAreNotShared) {
  Fixture f(8);
  BlockIndex::SealResult first = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42);
  BlockIndex::SealResult second = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 5), 42);
  EXPECT_FALSE(second.deduplicated);
  EXPECT_NE(second.ref.block, first.ref.block);
  EXPECT_EQ(f.pool->state(second.ref.block), BlockState::kSealed);
  EXPECT_EQ(f.pool->refcount(first.ref.block), 1u);
  EXPECT_EQ(f.index.stats().dedup_identity_mismatches.load(), 1u);
  EXPECT_EQ(f.index.stats().dedup_hits.load(), 0u);
  EXPECT_EQ(f.index.stats().dedup_collisions.load(), 0u);
  // Both are findable by their own prefix.
  EXPECT_EQ(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 5), 0, 0)->block, second.ref.block);
  EXPECT_EQ(f.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0)->block, first.ref.block);
}

TEST(BlockIndexDedup, IdenticalBytesDifferentSaltOrParentAreNotShared) {
  Fixture f(8);
  BlockIndex::SealResult root = f.SealNew(PrefixRef{}, Toks(1, 1, 1, 1), 1);
  BlockIndex::SealResult first = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42, 0, 5);
  BlockIndex::SealResult salted = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42, 0, 6);
  BlockIndex::SealResult parented = f.SealNew(root.ref, Toks(1, 2, 3, 4), 42, 0, 5);
  EXPECT_FALSE(salted.deduplicated);
  EXPECT_FALSE(parented.deduplicated);
  EXPECT_NE(salted.ref.block, first.ref.block);
  EXPECT_NE(parented.ref.block, first.ref.block);
  EXPECT_EQ(f.index.stats().dedup_hits.load(), 0u);
}

TEST(BlockIndexDedup, IdenticalBytesAndTokensInAnotherDomainAreNotShared) {
  Fixture f(8);
  SecurityEvent last;
  int events = 0;
  f.index.SetSecurityListener([&](const SecurityEvent& e) {
    last = e;
    ++events;
  });
  BlockIndex::SealResult first = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42, 1, 0);
  BlockIndex::SealResult second = f.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42, 2, 0);
  EXPECT_FALSE(second.deduplicated);
  EXPECT_NE(second.ref.block, first.ref.block);
  EXPECT_EQ(f.index.Domain(second.ref.block), 2u);
  EXPECT_EQ(f.index.stats().dedup_hits.load(), 0u);
  EXPECT_EQ(f.index.stats().dedup_collisions.load(), 0u);  // the full key separates domains
  EXPECT_EQ(events, 0);
  (void)last;
}

TEST(BlockIndexDedup, DifferentBytesUnderOneKeyAreACollisionNotAShare) {
  // 1-bit content keys: two blocks land in one bucket with certainty after three seals.
  Fixture f(8, true, 1);
  std::vector<SecurityEvent> events;
  f.index.SetSecurityListener([&](const SecurityEvent& e) { events.push_back(e); });
  std::vector<BlockIndex::SealResult> sealed;
  for (uint32_t i = 0; i < 3; ++i) sealed.push_back(f.SealNew(PrefixRef{}, Toks(i, i, i, i), 100 + i));
  for (const BlockIndex::SealResult& s : sealed) EXPECT_FALSE(s.deduplicated);
  EXPECT_NE(sealed[0].ref.block, sealed[1].ref.block);
  EXPECT_NE(sealed[1].ref.block, sealed[2].ref.block);
  EXPECT_GE(f.index.stats().dedup_collisions.load(), 1u);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, "dedup_collision");
  EXPECT_LT(events[0].content_key.lo, 2u);
  EXPECT_EQ(events[0].content_key.hi, 0u);
  EXPECT_NE(events[0].existing, events[0].candidate);
}

TEST(BlockIndexDedup, DisabledOrUnbackedIndexNeverDeduplicates) {
  Fixture off(8, /*dedup=*/false);
  BlockIndex::SealResult a = off.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42);
  BlockIndex::SealResult b = off.SealNew(PrefixRef{}, Toks(1, 2, 3, 4), 42);
  EXPECT_FALSE(b.deduplicated);
  EXPECT_NE(a.ref.block, b.ref.block);
  EXPECT_EQ(off.index.stats().bytes_compared.load(), 0u);
  // First sealed block under a key wins the prefix entry.
  EXPECT_EQ(off.index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0)->block, a.ref.block);

  std::unique_ptr<BlockPool> unbacked = SmallPool(4, RegionKind::kUnbacked);
  BlockIndex index(unbacked.get(), Hasher(), /*content_dedup=*/true);
  BlockId x = Alloc(*unbacked), y = Alloc(*unbacked);
  EXPECT_FALSE(index.Seal(x, PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).deduplicated);
  EXPECT_FALSE(index.Seal(y, PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).deduplicated);
  EXPECT_EQ(index.stats().bytes_compared.load(), 0u);
  EXPECT_TRUE(index.Lookup(PrefixRef{}, Toks(1, 2, 3, 4), 0, 0).has_value());
}

// --- Adversarial: forced content-key collisions ---------------------------------------------

TEST(BlockIndexAdversarial, OneBitKeysNeverShareUnequalBytesOrCrossDomains) {
  Fixture f(16, true, 1);
  std::vector<SecurityEvent> events;
  f.index.SetSecurityListener([&](const SecurityEvent& e) { events.push_back(e); });
  std::mt19937 rng(12345);
  std::deque<BlockId> held;  // references this test keeps, so some blocks stay sealed
  struct Recent {
    std::vector<std::byte> bytes;
    std::vector<uint32_t> tokens;
    uint32_t domain;
    uint64_t salt;
  };
  std::vector<Recent> recent;
  uint32_t own = 0, shared = 0, cross_domain_dupes = 0;

  for (uint32_t i = 0; i < 3000; ++i) {
    auto draw = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
    const uint32_t domain = draw(4);
    const uint64_t salt = draw(2);
    std::vector<uint32_t> tokens = {draw(64), draw(64), draw(64), draw(64)};
    BlockId candidate = Alloc(*f.pool);
    ASSERT_TRUE(candidate.valid());
    const uint32_t mode = draw(8);
    uint32_t expected_domain = domain;
    if (mode == 0 && !recent.empty()) {
      // An exact duplicate of a recent block (bytes and identity): sharing it is allowed.
      const Recent& r = recent[rng() % recent.size()];
      for (uint32_t g = 0, off = 0; g < f.pool->groups().size(); ++g) {
        std::span<std::byte> s = f.pool->MutableBytes(f.pool->BlockHandleOf(candidate, g));
        std::memcpy(s.data(), r.bytes.data() + off, s.size());
        off += static_cast<uint32_t>(s.size());
      }
      tokens = r.tokens;
      expected_domain = r.domain;
      BlockIndex::SealResult res = f.index.Seal(candidate, PrefixRef{}, tokens, r.domain, r.salt);
      if (res.deduplicated) {
        ++shared;
        EXPECT_NE(res.ref.block, candidate);
        EXPECT_EQ(Snapshot(*f.pool, res.ref.block), r.bytes);
      } else {
        EXPECT_EQ(res.ref.block, candidate);
      }
      EXPECT_EQ(f.index.Domain(res.ref.block), expected_domain);
      held.push_back(res.ref.block);
    } else {
      if (mode == 1 && !recent.empty()) {
        // The same bytes and tokens as a recent block, in another domain: never shared.
        const Recent& r = recent[rng() % recent.size()];
        for (uint32_t g = 0, off = 0; g < f.pool->groups().size(); ++g) {
          std::span<std::byte> s = f.pool->MutableBytes(f.pool->BlockHandleOf(candidate, g));
          std::memcpy(s.data(), r.bytes.data() + off, s.size());
          off += static_cast<uint32_t>(s.size());
        }
        tokens = r.tokens;
        expected_domain = (r.domain + 1) % 4;
        ++cross_domain_dupes;
      } else {
        Fill(*f.pool, candidate, (uint64_t{i} << 8) ^ 0xC0FFEE);
      }
      std::vector<std::byte> snapshot = Snapshot(*f.pool, candidate);
      BlockIndex::SealResult res = f.index.Seal(candidate, PrefixRef{}, tokens, expected_domain, salt);
      if (res.ref.block == candidate) {
        ++own;
        EXPECT_FALSE(res.deduplicated);
      } else {
        ++shared;
        EXPECT_TRUE(res.deduplicated);
        EXPECT_EQ(Snapshot(*f.pool, res.ref.block), snapshot) << "seal " << i << " shared unequal bytes";
      }
      EXPECT_EQ(f.index.Domain(res.ref.block), expected_domain) << "seal " << i << " crossed domains";
      EXPECT_EQ(f.pool->state(res.ref.block), BlockState::kSealed);
      held.push_back(res.ref.block);
      if (mode != 1 && recent.size() < 32) recent.push_back({snapshot, tokens, expected_domain, salt});
    }
    // Keep at most 6 references; release the oldest (the block becomes cached, then churns out).
    while (held.size() > 6) {
      Peer::Unref(*f.pool, held.front());
      held.pop_front();
    }
    if (i % 97 == 0) {
      Status inv = f.pool->CheckInvariants();
      ASSERT_TRUE(inv.ok()) << inv.ToString();
    }
  }
  const IndexStats& s = f.index.stats();
  EXPECT_GT(s.dedup_collisions.load(), 0u);
  EXPECT_EQ(s.dedup_hits.load(), shared);
  EXPECT_GT(own, 2000u);
  EXPECT_GT(shared, 0u);  // the dedup path was taken too
  EXPECT_GT(cross_domain_dupes, 0u);
  EXPECT_GT(f.pool->stats().evictions.load(), 2000u);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.size(), s.dedup_collisions.load());
  for (const SecurityEvent& e : events) {
    EXPECT_EQ(e.kind, "dedup_collision");
    EXPECT_EQ(e.content_key.hi, 0u);
    EXPECT_LT(e.content_key.lo, 2u);
    EXPECT_LT(e.domain, 4u);
    EXPECT_NE(e.existing, e.candidate);
  }
  EXPECT_TRUE(f.pool->CheckInvariants().ok());
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The ledger counts 64 B of host metadata per block plus 4 B per token id, as a model (layout.h).
// What the code computes from it, against figures derived by hand: the pool's per-block charge
// and bytes held, and the ledger's block_metadata term. The structures that hold the header take
// more than the model; their sizes are pinned, so a change to either must update the model's
// comment (and, when the ledger adopts the real figure, the ledger).
TEST(BlockMetadata, LedgerModelAgainstTheStructures) {
  // 64-token blocks: 64 B + 64 x 4 B = 320 B per block id.
  BlockPoolOptions o;
  PoolGroup g = TinyGroup("latent", 8, 2);
  g.page = *ComputePageLayout(g.format, 1, 64);
  o.groups = {g};
  o.capacity_blocks = 4;
  std::unique_ptr<BlockPool> pool = *BlockPool::Create(std::move(o));
  EXPECT_EQ(pool->metadata_bytes_per_block(), 320u);
  PinnedBlocks held(pool.get());
  ASSERT_TRUE(held.Allocate(3).ok());
  // Pages: 64 tokens x 8 bf16 values x 2 layers = 2,048 B per block.
  EXPECT_EQ(pool->bytes_held(), 3u * (2048 + 320));
  // DeepSeek-V3 at 1,000 tokens in 64-token blocks: 16 block ids, 16 x 320 = 5,120 B.
  Ledger l = testing::MustLedger(testing::Preset("deepseek-v3"), testing::Context(1000));
  ASSERT_EQ(l.block_tokens, 64u);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 5120u);
  // The structures: the pool's per-block arrays, state 1 + refcount 4 + generation 4 +
  // priority 1 + LRU/free links 2 x 4 = 18 B; the index's identity, three 16-B keys (48) +
  // parent id, parent generation and domain (12) = 60, the 8-B salt aligned at 64 = 72, three
  // flags (indexed, in the content index, caller-keyed) = 75, padded to a multiple of 8 = 80 B.
  // 98 B in all, not the model's 64. (An index with caller keys keeps 32 B more per block in a
  // side array, ADR 0045.)
  EXPECT_EQ(BlockPool::kHeaderBytes, 18u);
  EXPECT_EQ(BlockIndex::kIdentityBytes, 80u);
}

}  // namespace
}  // namespace tessera
