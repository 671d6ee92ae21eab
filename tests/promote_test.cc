// PromoteFromSource and CheckpointBlocks against a scripted BlockSource: what they ask, what they
// take from the pool and what they give back.
#include <gtest/gtest.h>

#include <map>

#include "kv_stream.h"
#include "tessera/block_source.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::KvStream;

constexpr uint32_t kBlock = 64;

// Holds blocks by prefix key (pages copied at OnEvicted/OnCheckpoint); supplies a leading run.
class ScriptedSource : public BlockSource {
 public:
  void OnSealed(const BlockPool&, BlockId, const SealedIdentity&) override { ++sealed; }
  void OnEvicted(const BlockPool& pool, BlockId b, const SealedIdentity& id) override { Keep(pool, b, id); }
  void OnCheckpoint(const BlockPool& pool, BlockId b, const SealedIdentity& id) override {
    ++checkpointed;
    Keep(pool, b, id);
  }
  size_t Probe(std::span<const ChainLink> links) override {
    probed = links.size();
    size_t n = 0;
    while (n < links.size() && held.count(links[n].key.lo) > 0) ++n;
    return std::min(n, probe_limit);
  }
  size_t Fetch(BlockPool& pool, std::span<const ChainLink> links, std::span<const BlockId> blocks,
               std::vector<std::vector<std::byte>>* states) override {
    fetch_asked = blocks.size();
    size_t n = 0;
    for (; n < blocks.size() && n < fetch_limit; ++n) {
      auto it = held.find(links[n].key.lo);
      if (it == held.end()) break;
      std::span<std::byte> to = pool.MutableBytes(pool.BlockHandleOf(blocks[n], 0));
      std::memcpy(to.data(), it->second.data(), to.size());
      if (states != nullptr) states->push_back({std::byte{static_cast<uint8_t>(n)}});
    }
    return n;
  }
  void Keep(const BlockPool& pool, BlockId b, const SealedIdentity& id) {
    std::span<const std::byte> bytes = pool.Bytes(pool.BlockHandleOf(b, 0));
    held[id.key.lo] = std::vector<std::byte>(bytes.begin(), bytes.end());
    if (!id.state.empty()) ++with_state;
  }

  std::map<uint64_t, std::vector<std::byte>> held;
  size_t probe_limit = SIZE_MAX, fetch_limit = SIZE_MAX;
  size_t probed = 0, fetch_asked = 0, sealed = 0, checkpointed = 0, with_state = 0;
};

std::unique_ptr<RequestManager> Manager(uint32_t capacity) {
  ManagerOptions o;
  o.capacity_blocks = capacity;
  o.hash_key_seed = 3;
  o.content_dedup = false;
  auto m = RequestManager::Create(testing::SeedFixture(), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

void Write(RequestManager& m, const KvStream& s, bool free_after = true) {
  Admission a = *m.Admit(s.tokens(), {});
  ASSERT_TRUE(m.AllocateSlots(a.id, s.tokens().size() - a.cached_tokens).ok());
  ASSERT_TRUE(m.Append(a.id, s.Slice(a.cached_tokens, s.tokens().size() - a.cached_tokens), s.Writer()).ok());
  if (free_after) {
    ASSERT_TRUE(m.Free(a.id).ok());
  }
}

// A first manager writes `s` and checkpoints every sealed block of it into `src`.
void Hold(ScriptedSource& src, const KvStream& s) {
  auto writer = Manager(16);
  writer->SetBlockSource(&src);
  Write(*writer, s, false);
  EXPECT_EQ(*writer->Checkpoint(), s.tokens().size() / kBlock);
  writer->SetBlockSource(nullptr);
}

// A checkpoint hands over every sealed block (live or cached), once each call.
TEST(CheckpointBlocks, EverySealedBlockLiveOrCached) {
  auto m = Manager(16);
  ScriptedSource src;
  m->SetBlockSource(&src);
  Write(*m, KvStream(1, 3 * kBlock + 5));       // 3 cached blocks (the tail block is freed)
  Write(*m, KvStream(900, 2 * kBlock), false);  // 2 sealed blocks held by a live request
  EXPECT_EQ(src.sealed, 5u);
  EXPECT_EQ(*m->Checkpoint(), 5u);
  EXPECT_EQ(src.checkpointed, 5u);
  EXPECT_EQ(src.held.size(), 5u);
  EXPECT_EQ(src.with_state, 0u);  // MLA blocks carry no state
  // With a state function, each block's state travels along.
  ScriptedSource other;
  EXPECT_EQ(
      *CheckpointBlocks(m->pool(), m->index(), other, [](BlockId) { return std::vector<std::byte>(3, std::byte{1}); }),
      5u);
  EXPECT_EQ(other.with_state, 5u);
  m->SetBlockSource(nullptr);
  EXPECT_EQ(*m->Checkpoint(), 0u);  // no source, nothing to hand over
}

// Admission that reserves no slots past the cached prefix: promotion's own effect on the pool.
RequestSpec NoReserve() {
  RequestSpec spec;
  spec.reserve_tokens = 0;
  return spec;
}

// A cold pool promotes the leading run the source holds: sealed in chain order, verified bytes,
// the pool's unused blocks given back.
TEST(PromoteFromSource, LeadingRunIsSealedAsAChain) {
  KvStream s(5, 4 * kBlock + 7);
  ScriptedSource src;
  Hold(src, s);
  auto m = Manager(16);
  m->SetBlockSource(&src);
  const size_t sealed_before = src.sealed;
  Admission a = *m->Admit(s.tokens(), NoReserve());
  EXPECT_EQ(src.probed, 4u);
  EXPECT_EQ(a.cached_blocks, 4u);
  EXPECT_EQ(src.sealed, sealed_before);  // what came from the source is not written back to it
  EXPECT_EQ(m->metrics().tier_hit_blocks.load(), 4u);
  EXPECT_EQ(m->pool().free_count(), 12u);
  // The promoted blocks are a verified chain: a second request finds them in the pool itself.
  EXPECT_TRUE(m->Free(a.id).ok());
  m->SetBlockSource(nullptr);
  EXPECT_EQ(m->Admit(s.tokens(), {})->cached_blocks, 4u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// The source promises more than it delivers: only the delivered run is kept; the rest of the
// blocks taken for it go back to the free list.
TEST(PromoteFromSource, UndeliveredBlocksAreReleased) {
  KvStream s(5, 4 * kBlock + 1);  // four whole blocks before the last token
  ScriptedSource src;
  Hold(src, s);
  src.fetch_limit = 2;
  auto m = Manager(16);
  m->SetBlockSource(&src);
  Admission a = *m->Admit(s.tokens(), NoReserve());
  EXPECT_EQ(src.fetch_asked, 4u);
  EXPECT_EQ(a.cached_blocks, 2u);
  EXPECT_EQ(m->pool().free_count(), 14u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
  m->SetBlockSource(nullptr);
}

// Never more blocks than the pool can give: a pool of 3 asks the source for at most 3.
TEST(PromoteFromSource, TakesNoMoreThanThePoolHas) {
  KvStream s(5, 6 * kBlock + 1);
  ScriptedSource src;
  Hold(src, s);
  auto m = Manager(3);
  m->SetBlockSource(&src);
  Admission a = *m->Admit(s.tokens(), NoReserve());
  EXPECT_EQ(src.probed, 6u);
  EXPECT_EQ(src.fetch_asked, 3u);
  EXPECT_EQ(a.cached_blocks, 3u);
  EXPECT_EQ(m->pool().free_count(), 0u);
  m->SetBlockSource(nullptr);
}

}  // namespace
}  // namespace tessera
