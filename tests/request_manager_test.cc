#include "tessera/request_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kv_stream.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

constexpr uint32_t kBlock = 64;  // FlashMLA block span of every MLA preset here

using testing::KvStream;

std::vector<uint32_t> Range(uint32_t first, uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

ManagerOptions V3Fp8(uint32_t capacity) {
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = capacity;
  o.hash_key_seed = 7;
  return o;
}

std::unique_ptr<RequestManager> MustManager(const Geometry& g, const ManagerOptions& o) {
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(g, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

Admission MustAdmit(RequestManager& m, std::span<const uint32_t> prompt, const RequestSpec& spec = {}) {
  Result<Admission> a = m.Admit(prompt, spec);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : Admission{};
}

// `tokens` and one token more: a prompt whose whole blocks can all be cached (admission always
// leaves the last prompt token to compute).
std::vector<uint32_t> AndOneMore(std::span<const uint32_t> tokens) {
  std::vector<uint32_t> v(tokens.begin(), tokens.end());
  v.push_back(0xfffffu);
  return v;
}

// Allocates and writes the tokens of `stream` past what `r` already holds, up to `upto`.
void Fill(RequestManager& m, RequestId r, const KvStream& stream, size_t upto) {
  const size_t have = m.Tokens(r);
  ASSERT_LE(have, upto);
  Status st = m.AllocateSlots(r, upto - have);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = m.Append(r, stream.Slice(have, upto - have), stream.Writer());
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(m.Tokens(r), upto);
}

// Every record of `r` (first, middle and last layer of each group) equals the stream's KV.
::testing::AssertionResult RecordsMatch(const RequestManager& m, RequestId r, const KvStream& stream) {
  std::vector<std::byte> want;
  for (uint64_t pos = 0; pos < m.Tokens(r); ++pos) {
    for (uint32_t g = 0; g < m.pool().groups().size(); ++g) {
      const uint32_t layers = m.pool().groups()[g].layers;
      for (uint32_t l : {0u, layers / 2, layers - 1}) {
        Result<ConstRecordView> v = m.Record(r, g, l, pos);
        if (!v.ok()) return ::testing::AssertionFailure() << "Record: " << v.status().ToString();
        for (uint32_t p = 0; p < v->plane_count; ++p) {
          std::span<const std::byte> got = v->planes[p];
          want.resize(got.size());
          stream.Expected(g, l, pos, p, want);
          if (got.empty() || std::memcmp(got.data(), want.data(), got.size()) != 0) {
            return ::testing::AssertionFailure()
                   << "record of position " << pos << " group " << g << " layer " << l << " plane " << p << " differs";
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<BlockId> Table(const RequestManager& m, RequestId r) {
  std::span<const BlockId> t = m.BlockTable(r);
  return {t.begin(), t.end()};
}

uint64_t PerBlock(const RequestManager& m) { return m.pool().block_bytes() + m.pool().metadata_bytes_per_block(); }

// --- Create ---------------------------------------------------------------------------------

TEST(RequestManagerCreate, PoolMatchesTheLedgerLayout) {
  Geometry g = Preset("deepseek-v3");
  std::unique_ptr<RequestManager> m = MustManager(g, V3Fp8(4));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->pool().block_tokens(), kBlock);
  ASSERT_EQ(m->pool().groups().size(), 1u);
  EXPECT_EQ(m->pool().groups()[0].format.name, "fp8_ds_mla");
  EXPECT_EQ(m->pool().groups()[0].layers, 61u);
  EXPECT_EQ(m->pool().block_bytes(), 61u * 64 * 656);
  EXPECT_EQ(m->pool().capacity(), 4u);
  EXPECT_EQ(m->bytes_held(), 0u);
  EXPECT_EQ(m->live_requests(), 0u);
}

// One manager for every preset: models with sliding windows get a state component, the others
// none.
TEST(RequestManagerCreate, EveryPresetModelIsManaged) {
  for (const std::string& name : PresetNames()) {
    ManagerOptions o;
    o.capacity_blocks = 4;
    o.max_requests = 2;
    o.region_kind = RegionKind::kUnbacked;
    Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(Preset(name), o);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    const Geometry g = Preset(name);
    EXPECT_EQ((*m)->states() != nullptr, g.is_hybrid) << name;
  }
}

// The pools are built from the same layout the ledger prices for engine tessera: every paged
// group of ComputeCacheLayout, in order, with its format, layers and page.
TEST(RequestManagerCreate, PoolGroupsAreTheCacheLayoutsPagedGroups) {
  for (const std::string& name : PresetNames()) {
    const Geometry g = Preset(name);
    ManagerOptions o;
    o.capacity_blocks = 4;
    o.max_requests = 2;
    o.region_kind = RegionKind::kUnbacked;
    std::unique_ptr<RequestManager> m = MustManager(g, o);
    ASSERT_NE(m, nullptr) << name;
    CacheLayout layout = *ComputeCacheLayout(g, CacheLayoutOptions{});
    std::vector<const CacheGroup*> paged;
    for (const CacheGroup& group : layout.groups) {
      if (group.in_pages) paged.push_back(&group);
    }
    ASSERT_EQ(m->pool().groups().size(), paged.size()) << name;
    EXPECT_EQ(m->pool().block_tokens(), layout.block.block_tokens) << name;
    for (size_t i = 0; i < paged.size(); ++i) {
      const PoolGroup& pg = m->pool().groups()[i];
      EXPECT_EQ(pg.name, paged[i]->name) << name;
      EXPECT_EQ(pg.format, paged[i]->format) << name;
      EXPECT_EQ(pg.layers, paged[i]->layers) << name;
      EXPECT_EQ(pg.page.page_bytes, paged[i]->page.page_bytes) << name;
      EXPECT_EQ(pg.page.entries_per_block, paged[i]->page.entries_per_block) << name;
      EXPECT_EQ(pg.page.layers_per_page, paged[i]->page.layers_per_page) << name;
      EXPECT_EQ(pg.page.layer_stride, paged[i]->page.layer_stride) << name;
    }
    // A block id holds every paged group's pages: one packed page (ADR 0020) or a page per layer.
    uint64_t block = 0;
    for (const CacheGroup* group : paged) block += GroupBlockBytes(group->page, group->layers).value();
    EXPECT_EQ(m->pool().block_bytes(), block) << name;
  }
}

// Retain keeps window chunks that end on block boundaries: a window wider than the block span
// is refused when the manager is created, as the ledger refuses it.
TEST(RequestManagerCreate, RetainNeedsBlocksOfWholeWindows) {
  Geometry g = Preset("deepseek-v4-flash");
  g.sliding_window = 512;
  for (LayerSpec& layer : g.layers) {
    for (CacheSpec& c : layer.caches) {
      if (c.role == CacheRole::kWindow) c.slots = 512;
    }
  }
  ManagerOptions o;
  o.capacity_blocks = 4;
  o.max_requests = 2;
  o.region_kind = RegionKind::kUnbacked;
  o.window_strategy = SwaStrategy::kRetain;
  EXPECT_EQ(RequestManager::Create(g, o).status().field(), "swa-strategy");
  LedgerOptions lo = testing::LedgerOptionsFor(o, 1024, 1);
  EXPECT_EQ(ComputeLedger(g, lo).status().field(), "swa-strategy");
  o.window_strategy = SwaStrategy::kSnapshot;
  EXPECT_TRUE(RequestManager::Create(g, o).ok());
}

// No silent cap on requests: by default the table grows on demand, so a trace of 3,000 requests
// runs through admission and a decode step (it failed at the 1,025th Admit when the default was
// 1,024). A ceiling the caller sets is refused at Admit and Fork, naming max-requests.
TEST(RequestManagerCreate, RequestTableGrowsOnDemand) {
  ManagerOptions o = V3Fp8(4096);
  o.region_kind = RegionKind::kUnbacked;
  EXPECT_EQ(o.max_requests, kNoRequestLimit);
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  ASSERT_NE(m, nullptr);
  constexpr uint32_t kRequests = 3000;
  std::vector<RequestId> ids;
  for (uint32_t r = 0; r < kRequests; ++r) {
    const std::vector<uint32_t> prompt = {r + 1, r + 2};
    Result<Admission> a = m->Admit(prompt, RequestSpec{});
    ASSERT_TRUE(a.ok()) << r << ": " << a.status().ToString();
    ASSERT_TRUE(m->Append(a->id, prompt, nullptr).ok());
    ids.push_back(a->id);
  }
  EXPECT_EQ(m->live_requests(), kRequests);
  const std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests, 9);
  StepResult r;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &r).ok());
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(m->Tokens(ids.back()), 3u);
  ASSERT_TRUE(m->Fork(ids.front()).ok());

  o.max_requests = 2;
  std::unique_ptr<RequestManager> capped = MustManager(Preset("deepseek-v3"), o);
  const Admission first = MustAdmit(*capped, std::vector<uint32_t>{1});
  MustAdmit(*capped, std::vector<uint32_t>{2});
  Result<Admission> third = capped->Admit(std::vector<uint32_t>{3}, RequestSpec{});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kOutOfBlocks);
  EXPECT_NE(third.status().message().find("max-requests"), std::string::npos) << third.status().ToString();
  Result<RequestId> fork = capped->Fork(first.id);
  ASSERT_FALSE(fork.ok());
  EXPECT_NE(fork.status().message().find("max-requests"), std::string::npos);
}

TEST(RequestManagerCreate, BadOptionsNameTheirField) {
  Geometry g = Preset("deepseek-v3");
  ManagerOptions o = V3Fp8(4);
  o.kv_format = "no-such-format";
  EXPECT_EQ(RequestManager::Create(g, o).status().field(), "kv-format");
  o = V3Fp8(4);
  o.hash_bits = 0;
  EXPECT_EQ(RequestManager::Create(g, o).status().field(), "hash-bits");
  o = V3Fp8(0);
  EXPECT_EQ(RequestManager::Create(g, o).status().field(), "capacity-blocks");
}

// --- Writing and reading --------------------------------------------------------------------

TEST(RequestManager, AppendWritesRecordsThatReadBack) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(1000, 150));  // two full blocks and 22 tokens
  Admission a = MustAdmit(*m, s.tokens());
  EXPECT_EQ(a.cached_tokens, 0u);
  EXPECT_EQ(a.cached_blocks, 0u);
  Fill(*m, a.id, s, 150);
  std::vector<BlockId> t = Table(*m, a.id);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(m->pool().state(t[0]), BlockState::kSealed);
  EXPECT_EQ(m->pool().state(t[1]), BlockState::kSealed);
  EXPECT_EQ(m->pool().state(t[2]), BlockState::kFilling);
  EXPECT_TRUE(RecordsMatch(*m, a.id, s));
  // Sealed blocks hold their tokens in the index.
  std::span<const uint32_t> stored = m->index().Tokens(t[1]);
  EXPECT_TRUE(std::equal(stored.begin(), stored.end(), s.tokens().begin() + kBlock));
  EXPECT_EQ(m->bytes_held(), 3 * PerBlock(*m));
  EXPECT_EQ(m->live_requests(), 1u);
}

// Issue 27.2: a freed id's slot is reused by another tenant's request; the old id (another
// generation) names nothing — no read, write, fork or free reaches the new request.
TEST(RequestManagerIds, AStaleIdNeverReachesTheRequestThatReusedItsSlot) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(16));
  KvStream alice;
  alice.Add(Range(1, 10));
  RequestSpec spec_a;
  spec_a.tenant = 1;
  const Admission a = MustAdmit(*m, alice.tokens(), spec_a);
  Fill(*m, a.id, alice, 10);
  EXPECT_EQ(m->TenantOf(a.id), 1u);
  ASSERT_TRUE(m->Free(a.id).ok());
  EXPECT_EQ(m->TenantOf(a.id), std::nullopt);

  KvStream bob(500, 5);
  RequestSpec spec_b;
  spec_b.tenant = 2;
  const Admission b = MustAdmit(*m, bob.tokens(), spec_b);
  Fill(*m, b.id, bob, 5);
  ASSERT_EQ(b.id.value, a.id.value);            // the slot is reused ...
  EXPECT_NE(b.id.generation, a.id.generation);  // ... under another generation
  EXPECT_EQ(m->TenantOf(b.id), 2u);
  EXPECT_EQ(m->LiveAt(b.id.value), b.id);

  EXPECT_EQ(m->Free(a.id).field(), "request");
  EXPECT_EQ(m->AllocateSlots(a.id, 1).field(), "request");
  const std::vector<uint32_t> more = {7};
  EXPECT_EQ(m->Append(a.id, more, alice.Writer()).field(), "request");
  EXPECT_EQ(m->Record(a.id, 0, 0, 0).status().field(), "request");
  EXPECT_TRUE(m->BlockTable(a.id).empty());
  EXPECT_EQ(m->Tokens(a.id), 0u);
  EXPECT_FALSE(m->Fork(a.id).ok());
  StepResult out;
  const std::vector<RequestId> ids = {a.id};
  const std::vector<uint32_t> counts = {1};
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, more}, alice.Writer(), &out).ok());
  EXPECT_EQ(m->live_requests(), 1u);
  EXPECT_EQ(m->Tokens(b.id), 5u);  // bob's request is as bob left it
  EXPECT_TRUE(RecordsMatch(*m, b.id, bob));
  EXPECT_TRUE(m->Free(b.id).ok());
}

// Issue 27.7: a writable view taken while a block fills writes nothing once the block is sealed
// (refused naming the block), so the next prefix hit serves the bytes the request wrote; a view of
// a block freed, or shared by a fork, is refused too.
TEST(RequestManagerViews, SealingRevokesAWritableViewAndAHitServesTheOriginalBytes) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(300, 150));  // two full blocks and 22 tokens
  const Admission a = MustAdmit(*m, s.tokens());
  const std::vector<BlockId> t = Table(*m, a.id);
  ASSERT_EQ(t.size(), 3u);
  Result<WritableView> page = m->Writable(t[0], 0, 0);
  Result<WritableView> block = m->Writable(t[1], 0);
  Result<WritableView> tail = m->Writable(t[2], 0);
  ASSERT_TRUE(page.ok() && block.ok() && tail.ok());
  EXPECT_TRUE(page->Check().ok());
  EXPECT_EQ(block->size(), m->pool().BlockHandleOf(t[1], 0).len);
  Fill(*m, a.id, s, 150);  // seals t[0] and t[1]
  ASSERT_EQ(m->pool().state(t[0]), BlockState::kSealed);

  const std::vector<std::byte> junk(64, std::byte{0x5a});
  for (const WritableView* v : {&*page, &*block}) {
    const Status st = v->Write(0, junk);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(st.field(), "block");
    EXPECT_NE(st.message().find("block " + std::to_string(v->block().value) + " is sealed"), std::string::npos)
        << st.ToString();
    EXPECT_EQ(v->Bytes().status().field(), "block");
  }
  EXPECT_EQ(m->Writable(t[0], 0, 0).status().field(), "block");  // and no new one
  EXPECT_TRUE(tail->Write(0, {}).ok());                          // still filling, one table
  EXPECT_EQ(tail->Write(tail->size(), junk).field(), "offset");

  // A fork shares the filling tail: no view writes it until it is copied.
  const Result<RequestId> child = m->Fork(a.id);
  ASSERT_TRUE(child.ok());
  EXPECT_NE(tail->Write(0, {}).message().find("shared"), std::string::npos);
  ASSERT_TRUE(m->Free(*child).ok());
  EXPECT_TRUE(tail->Check().ok());
  ASSERT_TRUE(m->Free(a.id).ok());  // the unsealed tail is freed: its view is stale
  EXPECT_NE(tail->Write(0, {}).message().find("freed"), std::string::npos);

  // The next hit serves the bytes the request wrote, not the junk.
  const Admission b = MustAdmit(*m, s.tokens());
  EXPECT_EQ(b.cached_blocks, 2u);
  EXPECT_EQ(Table(*m, b.id)[0], t[0]);
  EXPECT_TRUE(RecordsMatch(*m, b.id, s));
  EXPECT_EQ(m->Writable(BlockId{99}, 0).status().field(), "block");
  EXPECT_EQ(m->Writable(t[2], 5).status().field(), "group");
  EXPECT_EQ(m->Writable(t[2], 0, 61).status().field(), "layer");
}

// The const accessors hand out read-only records (a sealed block's bytes are final): a write
// through Record, Entry or the pool's Record does not compile (issue 27.7, ADR 0039).
template <typename R>
using PlaneElement = typename std::remove_cvref_t<decltype(std::declval<R>().planes[0])>::element_type;
using ManagerRecord = decltype(*std::declval<const RequestManager&>().Record(RequestId{}, 0, 0, 0));
using ManagerEntry = decltype(*std::declval<const RequestManager&>().Entry(RequestId{}, 0, false, 0));
using PoolRecord = decltype(std::declval<const BlockPool&>().Record(BlockId{}, 0, 0, 0));
static_assert(std::is_const_v<PlaneElement<ManagerRecord>>, "RequestManager::Record is read-only");
static_assert(std::is_const_v<PlaneElement<ManagerEntry>>, "RequestManager::Entry is read-only");
static_assert(std::is_const_v<PlaneElement<PoolRecord>>, "BlockPool::Record is read-only");
static_assert(!std::is_assignable_v<decltype(std::declval<ManagerRecord>().planes[0][0]), std::byte>,
              "no byte of a record read through the const accessor can be assigned");
static_assert(!std::is_convertible_v<ConstRecordView, RecordView>, "a read-only record never becomes writable");
static_assert(
    !std::is_const_v<PlaneElement<decltype(*std::declval<RequestManager&>().MutableRecord(RequestId{}, 0, 0, 0))>>,
    "the checked accessor is the writable one");

TEST(RequestManagerViews, MutableRecordRefusesASealedOrSharedBlockNamingIt) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(300, 150));  // two full blocks and 22 tokens
  const Admission a = MustAdmit(*m, s.tokens());
  Fill(*m, a.id, s, 150);  // seals the first two
  const std::vector<BlockId> t = Table(*m, a.id);
  ASSERT_EQ(m->pool().state(t[0]), BlockState::kSealed);

  const Result<RecordView> sealed = m->MutableRecord(a.id, 0, 0, 10);
  EXPECT_EQ(sealed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(sealed.status().field(), "block");
  EXPECT_NE(sealed.status().message().find("block " + std::to_string(t[0].value) + " is sealed"), std::string::npos)
      << sealed.status().ToString();
  EXPECT_EQ(m->MutableRecord(a.id, 0, 30, 100).status().field(), "block");  // second sealed block
  EXPECT_EQ(m->MutableRecord(a.id, 0, 0, 150).status().field(), "position");
  EXPECT_EQ(m->MutableRecord(a.id, 0, 61, 140).status().field(), "layer");

  // The filling tail is writable, at the bytes Record reads.
  const Result<RecordView> tail = m->MutableRecord(a.id, 0, 0, 140);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(tail->planes[0].data(), m->Record(a.id, 0, 0, 140)->planes[0].data());
  // Shared by a fork: refused until it is copied.
  const Result<RequestId> child = m->Fork(a.id);
  ASSERT_TRUE(child.ok());
  EXPECT_NE(m->MutableRecord(a.id, 0, 0, 140).status().message().find("shared"), std::string::npos);
  ASSERT_TRUE(m->Free(*child).ok());
  EXPECT_TRUE(m->MutableRecord(a.id, 0, 0, 140).ok());
  ASSERT_TRUE(m->Free(a.id).ok());

  // Nothing was written through a refused call: the next hit serves the request's bytes.
  const Admission b = MustAdmit(*m, s.tokens());
  EXPECT_EQ(b.cached_blocks, 2u);
  EXPECT_TRUE(RecordsMatch(*m, b.id, s));
}

TEST(RequestManager, RecordErrorsNameTheirField) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(4));
  KvStream s;
  s.Add(Range(1, 10));
  Admission a = MustAdmit(*m, s.tokens());
  Fill(*m, a.id, s, 10);
  EXPECT_TRUE(m->Record(a.id, 0, 60, 9).ok());
  EXPECT_EQ(m->Record(a.id, 0, 0, 10).status().field(), "position");  // not written yet
  EXPECT_EQ(m->Record(a.id, 0, 61, 0).status().field(), "layer");
  EXPECT_EQ(m->Record(a.id, 1, 0, 0).status().field(), "layer");
  EXPECT_EQ(m->Record(RequestId{99}, 0, 0, 0).status().field(), "request");
  EXPECT_TRUE(m->BlockTable(RequestId{99}).empty());
  EXPECT_EQ(m->Tokens(RequestId{99}), 0u);
  EXPECT_EQ(m->AllocateSlots(RequestId{99}, 1).field(), "request");
  EXPECT_EQ(m->Free(RequestId{99}).field(), "request");
  EXPECT_FALSE(m->Fork(RequestId{99}).ok());
}

TEST(RequestManager, AppendWithoutSlotsIsAFailedPrecondition) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(4));
  KvStream s;
  s.Add(Range(1, 70));
  RequestSpec no_slots;
  no_slots.reserve_tokens = 0;
  Admission a = MustAdmit(*m, s.tokens(), no_slots);
  ASSERT_TRUE(m->AllocateSlots(a.id, 64).ok());
  Status st = m->Append(a.id, s.Slice(0, 65), s.Writer());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.field(), "tokens");
  EXPECT_EQ(m->Tokens(a.id), 0u);  // nothing written
}

TEST(RequestManager, SamePromptHitsItsFullBlocks) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(500, 150));
  Admission first = MustAdmit(*m, s.tokens());
  Fill(*m, first.id, s, 150);

  Admission second = MustAdmit(*m, s.tokens());
  EXPECT_EQ(second.cached_tokens, 2u * kBlock);
  EXPECT_EQ(second.cached_blocks, 2u);
  EXPECT_EQ(m->Tokens(second.id), 2u * kBlock);
  std::vector<BlockId> t1 = Table(*m, first.id), t2 = Table(*m, second.id);
  ASSERT_EQ(t2.size(), 3u);  // the two cached blocks, and one reserved for the other 22 tokens
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_EQ(m->pool().refcount(t1[0]), 2u);
  EXPECT_EQ(m->metrics().prefix_hit_tokens.load(), 2u * kBlock);
  EXPECT_EQ(m->metrics().prefix_miss_tokens.load(), 150u + 22u);
  // The rest is written by the second request and reads back, cached part included.
  Fill(*m, second.id, s, 150);
  EXPECT_TRUE(RecordsMatch(*m, second.id, s));
  EXPECT_NE(Table(*m, second.id)[2], t1[2]);  // the partial tail is private
  // A prompt that diverges inside the second block hits only the first.
  KvStream d;
  std::vector<uint32_t> diverged = s.tokens();
  diverged[100] = 7;
  d.Add(diverged);
  EXPECT_EQ(MustAdmit(*m, d.tokens()).cached_blocks, 1u);
}

TEST(RequestManager, ConcurrentIdenticalPromptsShareOnePhysicalCopy) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(40, 150));
  Admission a = MustAdmit(*m, s.tokens());
  Admission b = MustAdmit(*m, s.tokens());  // before a sealed anything: a miss
  EXPECT_EQ(b.cached_tokens, 0u);
  Fill(*m, a.id, s, 150);
  Fill(*m, b.id, s, 150);
  std::vector<BlockId> ta = Table(*m, a.id), tb = Table(*m, b.id);
  ASSERT_EQ(tb.size(), 3u);
  EXPECT_EQ(tb[0], ta[0]);  // content dedup: equal bytes, equal identity
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_NE(tb[2], ta[2]);
  EXPECT_EQ(m->index().stats().dedup_hits.load(), 2u);
  EXPECT_EQ(m->bytes_held(), 4 * PerBlock(*m));
  EXPECT_TRUE(RecordsMatch(*m, b.id, s));
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Without content dedup (or bytes that differ: an engine's recompute), a request that computed
// blocks another request sealed first keeps its own copies, and the index keeps one unbroken chain
// for the prefix: a later request hits every whole block. Before: the second request's block 1
// took the key of the first's (its parent a different block), and later prompts hit 1 block of 2.
TEST(RequestManager, DuplicateBlocksKeepTheIndexedChainWhole) {
  for (const bool read_cache : {true, false}) {
    ManagerOptions o = V3Fp8(8);
    o.content_dedup = false;
    std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
    KvStream s;
    s.Add(Range(40, 150));
    Admission a = MustAdmit(*m, s.tokens());
    Fill(*m, a.id, s, 150);
    RequestSpec again;
    again.read_cache = read_cache;
    Admission b = MustAdmit(*m, s.tokens(), again);
    EXPECT_EQ(b.cached_blocks, read_cache ? 2u : 0u) << read_cache;
    if (read_cache) {
      // Admitted together instead: both miss.
      ASSERT_TRUE(m->Free(b.id).ok());
      ASSERT_TRUE(m->Free(a.id).ok());
      m = MustManager(Preset("deepseek-v3"), o);
      a = MustAdmit(*m, s.tokens());
      b = MustAdmit(*m, s.tokens());
      EXPECT_EQ(b.cached_blocks, 0u);
      Fill(*m, a.id, s, 150);
    }
    Fill(*m, b.id, s, 150);
    EXPECT_NE(Table(*m, b.id)[0], Table(*m, a.id)[0]);  // its own copies
    EXPECT_EQ(MustAdmit(*m, s.tokens()).cached_blocks, 2u) << read_cache;
    EXPECT_TRUE(m->pool().CheckInvariants().ok());
  }
}

// --- Fork -----------------------------------------------------------------------------------

TEST(RequestManagerFork, ChildWriteCopiesTheSharedPartialBlock) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream parent;
  parent.Add(Range(1, 100));  // one sealed block, 36 tokens in the second
  Admission p = MustAdmit(*m, parent.tokens());
  Fill(*m, p.id, parent, 100);
  Result<RequestId> c = m->Fork(p.id);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(m->metrics().forks.load(), 1u);
  EXPECT_EQ(m->live_requests(), 2u);
  EXPECT_EQ(m->Tokens(*c), 100u);
  std::vector<BlockId> before = Table(*m, p.id);
  ASSERT_EQ(Table(*m, *c), before);
  EXPECT_EQ(m->pool().refcount(before[1]), 2u);

  KvStream child = parent;
  child.Add(Range(9000, 5));
  Fill(*m, *c, child, 105);  // fits in the partial block: no new slot, one copy
  EXPECT_EQ(m->metrics().cow_copies.load(), 1u);
  std::vector<BlockId> tp = Table(*m, p.id), tc = Table(*m, *c);
  ASSERT_EQ(tp.size(), 2u);
  ASSERT_EQ(tc.size(), 2u);
  EXPECT_EQ(tp, before);    // the parent keeps its blocks
  EXPECT_EQ(tc[0], tp[0]);  // the sealed block is shared
  EXPECT_NE(tc[1], tp[1]);  // the partial block was copied
  EXPECT_EQ(m->pool().refcount(tp[0]), 2u);
  EXPECT_EQ(m->pool().refcount(tp[1]), 1u);
  EXPECT_EQ(m->pool().refcount(tc[1]), 1u);
  EXPECT_TRUE(RecordsMatch(*m, p.id, parent));  // parent bytes unchanged
  EXPECT_TRUE(RecordsMatch(*m, *c, child));     // child: copied prefix + its own tokens

  // The parent now writes its own tokens: no further copy.
  KvStream parent2 = parent;
  parent2.Add(Range(7000, 5));
  Fill(*m, p.id, parent2, 105);
  EXPECT_EQ(m->metrics().cow_copies.load(), 1u);
  EXPECT_TRUE(RecordsMatch(*m, p.id, parent2));
  EXPECT_TRUE(RecordsMatch(*m, *c, child));
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

TEST(RequestManagerFork, SixteenAgentsHoldOneCopyOfTheSharedContext) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(24));
  KvStream ctx;
  ctx.Add(Range(100, 256));
  Admission root = MustAdmit(*m, ctx.tokens());
  Fill(*m, root.id, ctx, 256);
  std::vector<BlockId> shared = Table(*m, root.id);
  ASSERT_EQ(shared.size(), 4u);
  std::vector<RequestId> agents;
  for (int i = 0; i < 16; ++i) {
    Result<RequestId> a = m->Fork(root.id);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    agents.push_back(*a);
  }
  for (BlockId b : shared) {
    EXPECT_EQ(m->pool().refcount(b), 17u);
    EXPECT_EQ(m->pool().state(b), BlockState::kSealed);
  }
  EXPECT_EQ(m->bytes_held(), 4 * PerBlock(*m));  // forks cost no pages

  std::vector<KvStream> streams(16, ctx);
  for (uint32_t i = 0; i < 16; ++i) {
    streams[i].Add(Range(20000 + 100 * i, 8));
    Fill(*m, agents[i], streams[i], 264);
  }
  for (BlockId b : shared) EXPECT_EQ(m->pool().refcount(b), 17u);
  EXPECT_EQ(m->bytes_held(), (4 + 16) * PerBlock(*m));
  EXPECT_EQ(m->metrics().cow_copies.load(), 0u);  // the context ended on a block boundary
  for (uint32_t i = 0; i < 16; ++i) {
    std::vector<BlockId> t = Table(*m, agents[i]);
    ASSERT_EQ(t.size(), 5u);
    EXPECT_TRUE(std::equal(shared.begin(), shared.end(), t.begin()));
    // The shared records are the same physical bytes.
    EXPECT_EQ(m->Record(agents[i], 0, 30, 200)->planes[0].data(), m->Record(root.id, 0, 30, 200)->planes[0].data());
  }
  EXPECT_TRUE(RecordsMatch(*m, agents[0], streams[0]));
  EXPECT_TRUE(RecordsMatch(*m, agents[15], streams[15]));
  for (RequestId a : agents) ASSERT_TRUE(m->Free(a).ok());
  for (BlockId b : shared) EXPECT_EQ(m->pool().refcount(b), 1u);
  EXPECT_EQ(m->bytes_held(), 4 * PerBlock(*m));  // the agents' unsealed tails are freed
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Regression: AllocateSlots promises room for n more tokens, so it must count (and make) the
// copy that copy-on-write needs when the request's next slot is shared with a fork; otherwise
// AllocateSlots(child, 5) succeeds on a full pool and the Append that follows runs out.
TEST(RequestManagerFork, GrantedSlotsCoverTheCopyOnWriteBlock) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(2));
  KvStream parent;
  parent.Add(Range(1, 10));
  Admission p = MustAdmit(*m, parent.tokens());
  Fill(*m, p.id, parent, 10);
  Result<RequestId> c = m->Fork(p.id);
  ASSERT_TRUE(c.ok());
  KvStream other;
  other.Add(Range(500, 10));
  Admission o = MustAdmit(*m, other.tokens());
  Fill(*m, o.id, other, 10);  // the pool is now full
  ASSERT_EQ(m->pool().Available(), 0u);
  KvStream child = parent;
  child.Add(Range(9000, 5));
  Status slots = m->AllocateSlots(*c, 5);
  if (!slots.ok()) {
    EXPECT_EQ(slots.code(), StatusCode::kOutOfBlocks);  // refusing up front is fine
    EXPECT_EQ(m->Tokens(*c), 10u);
    return;
  }
  Status st = m->Append(*c, child.Slice(10, 5), child.Writer());
  EXPECT_TRUE(st.ok()) << "AllocateSlots granted the slots, then Append ran out of blocks: " << st.ToString();
}

// --- Allocation -----------------------------------------------------------------------------

TEST(RequestManager, AllocateSlotsIsAllOrNothing) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(1, 10));
  Admission a = MustAdmit(*m, s.tokens());
  ASSERT_TRUE(m->AllocateSlots(a.id, 5 * kBlock).ok());
  EXPECT_EQ(Table(*m, a.id).size(), 5u);
  Admission b = MustAdmit(*m, s.tokens());
  ASSERT_TRUE(m->AllocateSlots(b.id, 10).ok());  // one block
  const uint32_t free_before = m->pool().free_count();
  ASSERT_EQ(free_before, 2u);
  const std::vector<BlockId> table_before = Table(*m, b.id);

  Status st = m->AllocateSlots(b.id, 4 * kBlock);  // 3 more blocks, 2 free
  EXPECT_EQ(st.code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(m->pool().free_count(), free_before);
  EXPECT_EQ(Table(*m, b.id), table_before);
  EXPECT_EQ(m->metrics().out_of_blocks.load(), 1u);

  st = m->AllocateSlots(b.id, 100 * kBlock);  // more than the whole pool
  EXPECT_EQ(st.code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(m->pool().free_count(), free_before);
  EXPECT_EQ(Table(*m, b.id), table_before);
  EXPECT_EQ(m->metrics().out_of_blocks.load(), 2u);

  // Slots already held are not allocated twice; exactly the free blocks succeed.
  ASSERT_TRUE(m->AllocateSlots(b.id, 64).ok());
  EXPECT_EQ(Table(*m, b.id).size(), 1u);
  ASSERT_TRUE(m->AllocateSlots(b.id, 3 * kBlock).ok());
  EXPECT_EQ(Table(*m, b.id).size(), 3u);
  EXPECT_EQ(m->pool().free_count(), 0u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

TEST(RequestManager, FreeCachesSealedBlocksForALaterAdmit) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(300, 150));
  Admission a = MustAdmit(*m, s.tokens());
  Fill(*m, a.id, s, 150);
  std::vector<BlockId> t = Table(*m, a.id);
  ASSERT_TRUE(m->Free(a.id).ok());
  EXPECT_EQ(m->live_requests(), 0u);
  EXPECT_TRUE(m->BlockTable(a.id).empty());
  EXPECT_EQ(m->pool().state(t[0]), BlockState::kCached);
  EXPECT_EQ(m->pool().state(t[1]), BlockState::kCached);
  EXPECT_EQ(m->pool().state(t[2]), BlockState::kFree);  // the unsealed tail is dropped
  EXPECT_EQ(m->pool().cached_count(), 2u);
  EXPECT_EQ(m->bytes_held(), 2 * PerBlock(*m));
  EXPECT_FALSE(m->Free(a.id).ok());  // double free is an error, not a crash

  Admission again = MustAdmit(*m, s.tokens());
  EXPECT_EQ(again.cached_tokens, 2u * kBlock);
  std::vector<BlockId> t2 = Table(*m, again.id);
  ASSERT_EQ(t2.size(), 3u);  // the two cached blocks, and one reserved for the other 22 tokens
  EXPECT_EQ(t2[0], t[0]);
  EXPECT_EQ(t2[1], t[1]);
  EXPECT_EQ(m->pool().state(t[0]), BlockState::kSealed);
  EXPECT_EQ(m->pool().cached_count(), 0u);
  Fill(*m, again.id, s, 150);
  EXPECT_TRUE(RecordsMatch(*m, again.id, s));
}

TEST(RequestManager, FreeEvictsLeavesBeforeTheirPrefixes) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(3));
  KvStream s;
  s.Add(Range(1, 3 * kBlock));
  Admission a = MustAdmit(*m, s.tokens());
  Fill(*m, a.id, s, 3 * kBlock);
  std::vector<BlockId> t = Table(*m, a.id);
  ASSERT_TRUE(m->Free(a.id).ok());
  KvStream other;
  other.Add(Range(50000, 10));
  Admission b = MustAdmit(*m, other.tokens());
  Fill(*m, b.id, other, 10);  // takes one block: the leaf is evicted
  EXPECT_EQ(Table(*m, b.id)[0], t[2]);
  ASSERT_TRUE(m->Free(b.id).ok());
  EXPECT_EQ(MustAdmit(*m, s.tokens()).cached_blocks, 2u);
}

TEST(RequestManager, HigherPriorityBlocksAreEvictedLast) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(3));
  KvStream keep, drop;
  keep.Add(Range(1, kBlock));
  drop.Add(Range(9000, kBlock));
  RequestSpec high;
  high.priority = 90;
  RequestSpec low;
  low.priority = 10;
  Admission k = MustAdmit(*m, keep.tokens(), high);
  Fill(*m, k.id, keep, kBlock);
  ASSERT_TRUE(m->Free(k.id).ok());
  Admission d = MustAdmit(*m, drop.tokens(), low);  // cached after `keep`: more recent
  Fill(*m, d.id, drop, kBlock);
  ASSERT_TRUE(m->Free(d.id).ok());
  KvStream other;
  other.Add(Range(50000, 2 * kBlock));
  Admission o = MustAdmit(*m, other.tokens());
  ASSERT_TRUE(m->AllocateSlots(o.id, 2 * kBlock).ok());  // one free block + one eviction
  ASSERT_TRUE(m->Free(o.id).ok());
  Admission probe = MustAdmit(*m, AndOneMore(keep.tokens()), high);
  EXPECT_EQ(probe.cached_blocks, 1u);
  ASSERT_TRUE(m->Free(probe.id).ok());
  EXPECT_EQ(MustAdmit(*m, AndOneMore(drop.tokens()), low).cached_blocks, 0u);
}

// Regression: a request's retention priority below the default (35) must hold for the blocks it
// seals itself (the pool resets new blocks to the default; only shared blocks keep the max).
TEST(RequestManager, LowPriorityRequestIsEvictedBeforeADefaultOne) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(3));
  KvStream normal, batch;
  normal.Add(Range(1, kBlock));
  batch.Add(Range(9000, kBlock));
  RequestSpec low;
  low.priority = 0;
  Admission n = MustAdmit(*m, normal.tokens());  // default priority, cached first
  Fill(*m, n.id, normal, kBlock);
  ASSERT_TRUE(m->Free(n.id).ok());
  Admission b = MustAdmit(*m, batch.tokens(), low);
  Fill(*m, b.id, batch, kBlock);
  const BlockId batch_block = Table(*m, b.id)[0];
  EXPECT_EQ(static_cast<unsigned>(m->pool().priority(batch_block)), 0u)
      << "the request's priority 0 became the default 35";
  ASSERT_TRUE(m->Free(b.id).ok());
  KvStream other;
  other.Add(Range(50000, 2 * kBlock));
  Admission o = MustAdmit(*m, other.tokens());
  ASSERT_TRUE(m->AllocateSlots(o.id, 2 * kBlock).ok());  // one free block + one eviction
  ASSERT_TRUE(m->Free(o.id).ok());
  Admission probe = MustAdmit(*m, AndOneMore(normal.tokens()));
  EXPECT_EQ(probe.cached_blocks, 1u) << "the default-priority block was evicted";
  ASSERT_TRUE(m->Free(probe.id).ok());
  EXPECT_EQ(MustAdmit(*m, AndOneMore(batch.tokens()), low).cached_blocks, 0u);
}

// Regression, through the manager (see BlockIndexPrefix.ResealedChildIsFoundAfterItsParentWasEvicted):
// a request with a higher retention priority extends a shared prefix; the prefix is evicted
// first and its child is orphaned in the prefix map; a recomputed child must replace the orphan.
TEST(RequestManager, ChildKeptLongerThanItsParentDoesNotBlockReuse) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(4));
  KvStream conv;
  conv.Add(Range(1, 2 * kBlock));
  RequestSpec low;
  low.priority = 10;
  RequestSpec high;
  high.priority = 90;
  Admission sys = MustAdmit(*m, conv.Slice(0, kBlock), low);  // the shared system prompt
  Fill(*m, sys.id, conv, kBlock);
  ASSERT_TRUE(m->Free(sys.id).ok());
  Admission user = MustAdmit(*m, conv.tokens(), high);  // hits it, extends it
  ASSERT_EQ(user.cached_blocks, 1u);
  Fill(*m, user.id, conv, 2 * kBlock);
  ASSERT_TRUE(m->Free(user.id).ok());
  // Pressure evicts the low-priority prefix; the high-priority extension stays cached.
  KvStream other;
  other.Add(Range(50000, 3 * kBlock));
  Admission o = MustAdmit(*m, other.tokens());
  ASSERT_TRUE(m->AllocateSlots(o.id, 3 * kBlock).ok());
  ASSERT_TRUE(m->Free(o.id).ok());
  ASSERT_EQ(m->pool().stats().evictions.load(), 1u);
  // The conversation is computed again in full.
  Admission redo = MustAdmit(*m, conv.tokens(), high);
  ASSERT_EQ(redo.cached_blocks, 0u);
  Fill(*m, redo.id, conv, 2 * kBlock);
  ASSERT_TRUE(m->Free(redo.id).ok());
  // Both blocks are sealed and cached, so the next request should hit both.
  EXPECT_EQ(MustAdmit(*m, AndOneMore(conv.tokens()), high).cached_blocks, 2u)
      << "the orphaned child of the evicted prefix shadows the re-sealed child";
}

// --- Tenants --------------------------------------------------------------------------------

TEST(RequestManagerTenants, OtherTenantDoesNotHitButASharedDomainDoes) {
  KvStream s;
  s.Add(Range(77, 2 * kBlock + 5));
  RequestSpec t1, t2, t3;
  t1.tenant = 1;
  t2.tenant = 2;
  t3.tenant = 3;
  {
    std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(16));
    EXPECT_EQ(m->domain_of(2), 2u);
    Admission a = MustAdmit(*m, s.tokens(), t1);
    Fill(*m, a.id, s, s.tokens().size());
    Admission b = MustAdmit(*m, s.tokens(), t2);
    EXPECT_EQ(b.cached_tokens, 0u);
    // Same bytes, other domain: not deduplicated either.
    Fill(*m, b.id, s, s.tokens().size());
    std::vector<BlockId> ta = Table(*m, a.id), tb = Table(*m, b.id);
    for (size_t i = 0; i < ta.size(); ++i) EXPECT_NE(ta[i], tb[i]);
    EXPECT_EQ(m->index().stats().dedup_hits.load(), 0u);
    EXPECT_EQ(m->index().Domain(tb[0]), 2u);
    // The same tenant with another cache salt does not hit either.
    RequestSpec salted = t1;
    salted.cache_salt = 1234;
    EXPECT_EQ(MustAdmit(*m, s.tokens(), salted).cached_tokens, 0u);
    EXPECT_EQ(MustAdmit(*m, s.tokens(), t1).cached_tokens, 2u * kBlock);
  }
  {
    ManagerOptions o = V3Fp8(16);
    o.tenant_domain = {{1, 100}, {2, 100}};
    std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
    EXPECT_EQ(m->domain_of(1), 100u);
    EXPECT_EQ(m->domain_of(2), 100u);
    EXPECT_EQ(m->domain_of(3), 3u);
    Admission a = MustAdmit(*m, s.tokens(), t1);
    Fill(*m, a.id, s, s.tokens().size());
    Admission b = MustAdmit(*m, s.tokens(), t2);
    EXPECT_EQ(b.cached_tokens, 2u * kBlock);
    EXPECT_EQ(Table(*m, b.id)[0], Table(*m, a.id)[0]);
    EXPECT_EQ(MustAdmit(*m, s.tokens(), t3).cached_tokens, 0u);
  }
}

// --- Caller keys (ADR 0045) ---------------------------------------------------------------------

ManagerOptions CallerKeyed(uint32_t capacity, uint32_t hash_bits = 128) {
  ManagerOptions o = V3Fp8(capacity);
  o.region_kind = RegionKind::kUnbacked;
  o.caller_keys = true;
  o.hash_bits = hash_bits;
  return o;
}

// A caller's chained hash of each whole block of `tokens` (a stand-in for vLLM's SHA-256 chain),
// with `extra` folded into every block: two calls with other extras give other hashes throughout.
std::vector<CallerHash> ChainHashes(std::span<const uint32_t> tokens, uint32_t extra) {
  std::vector<CallerHash> out;
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ extra;
  for (size_t b = 0; b + kBlock <= tokens.size(); b += kBlock) {
    for (size_t i = b; i < b + kBlock; ++i) h = (h ^ tokens[i]) * 0x100000001b3ULL;
    CallerHash c{};
    for (size_t k = 0; k < c.size(); ++k) c[k] = static_cast<std::byte>(h >> (8 * (k % 8)) ^ k);
    out.push_back(c);
  }
  return out;
}

// Admits `prompt` keyed by `hashes` and appends it whole, sealing its blocks under them.
Admission AdmitAndFillKeyed(RequestManager& m, std::span<const uint32_t> prompt, std::span<const CallerHash> hashes,
                            const RequestSpec& spec = {}) {
  Result<Admission> a = m.AdmitKeyed(hashes, prompt.size(), spec);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return {};
  const uint64_t have = a->cached_tokens;
  EXPECT_TRUE(m.AllocateSlots(a->id, prompt.size() - have).ok());
  const size_t first = have / kBlock, last = prompt.size() / kBlock;
  Status st = m.AppendKeyed(a->id, prompt.subspan(have), hashes.subspan(first, last - first));
  EXPECT_TRUE(st.ok()) << st.ToString();
  return *a;
}

TEST(RequestManagerCallerKeys, HitsWhereTheHashesAgreeAndNowhereElse) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), CallerKeyed(32));
  const std::vector<uint32_t> prompt = AndOneMore(Range(500, 3 * kBlock));
  const std::vector<CallerHash> mine = ChainHashes(prompt, 1), other = ChainHashes(prompt, 2);
  Admission a = AdmitAndFillKeyed(*m, prompt, mine);
  EXPECT_EQ(a.cached_tokens, 0u);
  ASSERT_TRUE(m->Free(a.id).ok());
  // The same hashes: every whole block (3; the last token is computed). No token is read: the
  // prompt's tokens could be anything.
  Result<Admission> same = m->AdmitKeyed(mine, prompt.size(), {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->cached_tokens, 3u * kBlock);
  for (size_t b = 0; b < 3; ++b) EXPECT_TRUE(m->index().CallerKeyed(Table(*m, same->id)[b]));
  // Other hashes for the same tokens (another image, salt, adapter in the caller's hash): none.
  Result<Admission> diff = m->AdmitKeyed(other, prompt.size(), {});
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(diff->cached_tokens, 0u);
  // Only the last block's hash differs: the two before it hit (a per-block identity).
  std::vector<CallerHash> tail = mine;
  tail[2][0] ^= std::byte{1};
  EXPECT_EQ(m->AdmitKeyed(tail, prompt.size(), {})->cached_tokens, 2u * kBlock);
  // Another tenant or salt with the same hashes: none (they stay in Tessera's key and check).
  RequestSpec t2, salted;
  t2.tenant = 2;
  salted.cache_salt = 99;
  EXPECT_EQ(m->AdmitKeyed(mine, prompt.size(), t2)->cached_tokens, 0u);
  EXPECT_EQ(m->AdmitKeyed(mine, prompt.size(), salted)->cached_tokens, 0u);
  // read_cache false: no hit, the blocks are sealed under the hashes all the same.
  RequestSpec no_read;
  no_read.read_cache = false;
  EXPECT_EQ(m->AdmitKeyed(mine, prompt.size(), no_read)->cached_tokens, 0u);
}

TEST(RequestManagerCallerKeys, CallerKeyedAndTokenKeyedBlocksNeverShare) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), CallerKeyed(64));
  const std::vector<uint32_t> prompt = AndOneMore(Range(900, 2 * kBlock));
  const std::vector<CallerHash> hashes = ChainHashes(prompt, 0);
  Admission tokens = MustAdmit(*m, prompt);
  ASSERT_TRUE(m->Append(tokens.id, prompt, {}).ok());
  const std::vector<BlockId> token_blocks = Table(*m, tokens.id);
  ASSERT_TRUE(m->Free(tokens.id).ok());
  EXPECT_EQ(m->AdmitKeyed(hashes, prompt.size(), {})->cached_tokens, 0u);
  Admission keyed = AdmitAndFillKeyed(*m, prompt, hashes);
  ASSERT_TRUE(m->Free(keyed.id).ok());
  EXPECT_EQ(MustAdmit(*m, prompt).cached_tokens, 2u * kBlock);  // the token-keyed blocks
  Result<Admission> again = m->AdmitKeyed(hashes, prompt.size(), {});
  EXPECT_EQ(again->cached_tokens, 2u * kBlock);  // the caller-keyed ones
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_NE(Table(*m, again->id)[b], token_blocks[b]);
    EXPECT_TRUE(m->index().CallerKeyed(Table(*m, again->id)[b]));
    EXPECT_FALSE(m->index().CallerKeyed(token_blocks[b]));
  }
  // Each kind's appends are refused on the other's requests (nothing changes).
  const uint64_t held = m->Tokens(again->id);
  EXPECT_EQ(m->Append(again->id, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->AppendKeyed(MustAdmit(*m, prompt).id, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Tokens(again->id), held);
}

// Tessera's caller keys cut to 4 bits (hash_bits): other hashes collide with cached blocks by key
// and the whole 32-byte hash refuses each. Fails if SameKeyedIdentity's compare is removed.
TEST(RequestManagerCallerKeys, AKeyCollisionIsRefusedByTheWholeHash) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), CallerKeyed(64, 4));
  const std::vector<uint32_t> prompt = AndOneMore(Range(1, kBlock));
  const std::vector<CallerHash> mine = ChainHashes(prompt, 0);
  Admission a = AdmitAndFillKeyed(*m, prompt, mine);
  ASSERT_TRUE(m->Free(a.id).ok());
  EXPECT_EQ(m->AdmitKeyed(mine, prompt.size(), {})->cached_tokens, uint64_t{kBlock});
  uint64_t collided = 0;
  for (uint32_t j = 1; j <= 64; ++j) {
    const uint64_t before = m->index().stats().prefix_key_mismatches.load();
    Result<Admission> other = m->AdmitKeyed(ChainHashes(prompt, j), prompt.size(), {});
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(other->cached_tokens, 0u) << "hash " << j;
    collided += m->index().stats().prefix_key_mismatches.load() - before;
    ASSERT_TRUE(m->Free(other->id).ok());
  }
  EXPECT_GT(collided, 0u);  // the keys did collide: the hash refused them
}

TEST(RequestManagerCallerKeys, RefusedWhereBlocksAreVerifiedByTokens) {
  ManagerOptions backed = CallerKeyed(16);
  backed.region_kind = RegionKind::kHost;
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(Preset("deepseek-v3"), backed);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().field(), "caller-keys");
  ManagerOptions v4;
  v4.region_kind = RegionKind::kUnbacked;
  v4.caller_keys = true;
  m = RequestManager::Create(Preset("deepseek-v4-flash"), v4);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().field(), "caller-keys");
  // Without the option, and with a block source attached: refused, naming it.
  std::unique_ptr<RequestManager> plain = MustManager(Preset("deepseek-v3"), V3Fp8(16));
  const std::vector<CallerHash> one(1);
  EXPECT_EQ(plain->AdmitKeyed(one, kBlock + 1, {}).status().field(), "caller-keys");
  std::unique_ptr<RequestManager> keyed = MustManager(Preset("deepseek-v3"), CallerKeyed(16));
  struct NoSource : BlockSource {
    void OnSealed(const BlockPool&, BlockId, const SealedIdentity&) override {}
    void OnEvicted(const BlockPool&, BlockId, const SealedIdentity&) override {}
    void OnCheckpoint(const BlockPool&, BlockId, const SealedIdentity&) override {}
    size_t Probe(std::span<const ChainLink>) override { return 0; }
    size_t Fetch(BlockPool&, std::span<const ChainLink>, std::span<const BlockId>,
                 std::vector<std::vector<std::byte>>*) override {
      return 0;
    }
  } source;
  keyed->SetBlockSource(&source);
  EXPECT_EQ(keyed->AdmitKeyed(one, kBlock + 1, {}).status().field(), "caller-keys");
  keyed->SetBlockSource(nullptr);
  // More hashes than whole blocks; the wrong number of hashes for an append: refused, unchanged.
  EXPECT_EQ(keyed->AdmitKeyed(std::vector<CallerHash>(2), kBlock + 1, {}).status().field(), "hashes");
  Result<Admission> a = keyed->AdmitKeyed(one, kBlock + 1, {});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(keyed->AllocateSlots(a->id, kBlock + 1).ok());
  const std::vector<uint32_t> t = Range(0, kBlock + 1);
  EXPECT_EQ(keyed->AppendKeyed(a->id, t, {}).field(), "hashes");
  EXPECT_EQ(keyed->AppendKeyed(a->id, t, std::vector<CallerHash>(2)).field(), "hashes");
  EXPECT_EQ(keyed->Tokens(a->id), 0u);
  EXPECT_TRUE(keyed->AppendKeyed(a->id, t, one).ok());
  EXPECT_EQ(keyed->Tokens(a->id), kBlock + 1u);
  // Append and Step refuse a caller-keyed request (its blocks are sealed only under the caller's
  // hashes) and leave it unchanged; Step still serves the rest of the batch.
  const std::vector<uint32_t> more = Range(kBlock + 1, 1);
  EXPECT_EQ(keyed->Append(a->id, more, {}).field(), "request");
  Result<Admission> plain_req = keyed->Admit(Range(5000, 3), {});
  ASSERT_TRUE(plain_req.ok());
  const std::vector<RequestId> ids = {a->id, plain_req->id};
  const std::vector<uint32_t> counts = {1, 1};
  const std::vector<uint32_t> toks = {7, 8};
  StepResult out;
  ASSERT_TRUE(keyed->Step({ids, counts, toks}, {}, &out).ok());
  EXPECT_EQ(out.codes[0], StatusCode::kInvalidArgument);
  EXPECT_EQ(out.codes[1], StatusCode::kOk);
  EXPECT_EQ(out.failed, 1u);
  EXPECT_EQ(keyed->Tokens(a->id), kBlock + 1u);
  EXPECT_EQ(keyed->Tokens(plain_req->id), 1u);  // Admit reserves; the step appended one
}

// --- Scheduler: hashed prompts, the cache-hit cap, Step --------------------------------------

// The last prompt token is always computed (its logits start generation): a prompt of whole
// blocks hits one block fewer than it has cached, one token more hits them all.
TEST(RequestManagerScheduler, AdmissionLeavesTheLastPromptTokenToCompute) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(2000, 2 * kBlock));
  Admission first = MustAdmit(*m, s.tokens());
  Fill(*m, first.id, s, 2 * kBlock);
  Admission whole = MustAdmit(*m, s.tokens());
  EXPECT_EQ(whole.cached_blocks, 1u);
  EXPECT_EQ(whole.cached_tokens, uint64_t{kBlock});
  EXPECT_EQ(m->Tokens(whole.id), uint64_t{kBlock});
  Admission more = MustAdmit(*m, AndOneMore(s.tokens()));
  EXPECT_EQ(more.cached_blocks, 2u);
  EXPECT_EQ(more.cached_tokens, 2u * kBlock);
  // A one-token prompt has nothing to hit.
  EXPECT_EQ(MustAdmit(*m, s.Slice(0, 1)).cached_blocks, 0u);
}

// A scheduler hashes a prompt once and retries its admission when blocks free up: a refusal
// creates no request, takes no block and pins nothing.
TEST(RequestManagerScheduler, PromptKeysAreReusedAcrossARefusedAdmission) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(4));
  KvStream a;
  a.Add(Range(1, 150));  // three blocks, two sealed
  Admission ra = MustAdmit(*m, a.tokens());
  Fill(*m, ra.id, a, 150);
  Admission rc = MustAdmit(*m, Range(5000, 10));  // the fourth block
  ASSERT_EQ(m->pool().free_count(), 0u);
  const std::vector<BlockId> ta = Table(*m, ra.id);

  std::vector<uint32_t> b(a.tokens().begin(), a.tokens().begin() + 2 * kBlock);
  b.push_back(9);
  b.push_back(10);  // the two sealed blocks and two tokens more: one new block
  const PromptKeys keys = m->HashPrompt(b, {});
  EXPECT_EQ(keys.keys().size(), 2u);
  Result<Admission> refused = m->Admit(keys, {});
  ASSERT_EQ(refused.status().code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(refused.status().field(), "blocks");
  EXPECT_EQ(m->live_requests(), 2u);
  EXPECT_EQ(m->pool().free_count(), 0u);
  EXPECT_EQ(m->pool().refcount(ta[0]), 1u);  // the hit was released
  EXPECT_EQ(m->pool().refcount(ta[1]), 1u);
  EXPECT_EQ(m->metrics().requests_admitted.load(), 2u);
  EXPECT_EQ(m->metrics().out_of_blocks.load(), 1u);

  ASSERT_TRUE(m->Free(rc.id).ok());
  Result<Admission> retried = m->Admit(keys, {});
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  EXPECT_EQ(retried->cached_blocks, 2u);
  const std::vector<BlockId> tb = Table(*m, retried->id);
  ASSERT_EQ(tb.size(), 3u);
  EXPECT_EQ(tb[0], ta[0]);
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_EQ(m->pool().refcount(ta[0]), 2u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Keys look blocks up in the domain and salt they were hashed for: another manager's keys, or
// keys used for another tenant or salt, are refused rather than reading another tenant's blocks.
TEST(RequestManagerScheduler, KeysHashedElsewhereAreRefused) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  std::unique_ptr<RequestManager> other = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  const std::vector<uint32_t> prompt = Range(1, 130);
  RequestSpec t1, t2, salted;
  t1.tenant = 1;
  t2.tenant = 2;
  salted.tenant = 1;
  salted.cache_salt = 99;
  const PromptKeys keys = m->HashPrompt(prompt, t1);
  EXPECT_EQ(other->Admit(keys, t1).status().field(), "prompt");
  EXPECT_EQ(m->Admit(keys, t2).status().field(), "prompt");
  EXPECT_EQ(m->Admit(keys, salted).status().field(), "prompt");
  EXPECT_EQ(m->Admit(keys, t2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->live_requests(), 0u);
  EXPECT_EQ(other->live_requests(), 0u);
  EXPECT_TRUE(m->Admit(keys, t1).ok());
}

// A prompt's prefix keys are hashed once, by HashPrompt: the seals of its blocks take them from
// there (issue 26). Before, BlockIndex::Seal hashed every prompt block again (6 keys for 3
// blocks). A decode block, and a block whose tokens are not the prompt's, are hashed at their
// seal; the index holds the same keys either way (a later prompt hits every block).
TEST(RequestManagerScheduler, PromptKeysAreHashedOnce) {
  ManagerOptions o = V3Fp8(16);
  o.region_kind = RegionKind::kUnbacked;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  const std::atomic<uint64_t>& hashed = m->index().stats().prefix_keys_hashed;
  const std::vector<uint32_t> prompt = Range(1, 3 * kBlock + 5);
  const Admission a = MustAdmit(*m, prompt);
  EXPECT_EQ(hashed.load(), 3u);  // HashPrompt's
  ASSERT_TRUE(m->Append(a.id, prompt, nullptr).ok());
  EXPECT_EQ(hashed.load(), 3u);  // three seals, no key hashed again
  const std::vector<uint32_t> decoded = Range(900, kBlock - 5);
  ASSERT_TRUE(m->AllocateSlots(a.id, decoded.size()).ok());
  ASSERT_TRUE(m->Append(a.id, decoded, nullptr).ok());
  EXPECT_EQ(hashed.load(), 4u);  // the decode block's key, at its seal

  std::vector<uint32_t> again = prompt;
  again.insert(again.end(), decoded.begin(), decoded.end());
  const Admission b = MustAdmit(*m, AndOneMore(again));  // four keys hashed
  EXPECT_EQ(b.cached_blocks, 4u);

  // Other tokens than the prompt's in the first block: hashed at the seal, under their own key.
  const Admission c = MustAdmit(*m, Range(5000, kBlock + 1));  // one key hashed
  const std::vector<uint32_t> other = Range(6000, kBlock + 1);
  ASSERT_TRUE(m->Append(c.id, other, nullptr).ok());
  EXPECT_EQ(hashed.load(), 4u + 4u + 1u + 1u);
  EXPECT_EQ(MustAdmit(*m, other).cached_blocks, 1u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Past 2,048 request slots Step looks ahead: it hashes the key of a block a request's tokens will
// complete before the request's turn (ADR 0040). Every request here seals its first block in one
// step (one request twice in the batch, two apart: its second turn finds the key hashed ahead for
// it stale and appends into a new block); the dev build's Seal asserts each key it is given against a fresh hash, and
// the sealed blocks are found again by their prompts.
TEST(RequestManagerScheduler, LookAheadKeysAreTheBlocksOwn) {
  constexpr uint32_t kRequests = 2100;
  ManagerOptions o = V3Fp8(2 * kRequests + 8);
  o.region_kind = RegionKind::kUnbacked;
  o.seal_timing = SealTiming::kImmediate;  // the step's own seals and their look-ahead
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  std::vector<RequestId> ids;
  for (uint32_t r = 0; r < kRequests; ++r) ids.push_back(MustAdmit(*m, Range(r * 1000, kBlock - 1)).id);
  for (RequestId id : ids) ASSERT_TRUE(m->Append(id, Range(id.value * 1000, kBlock - 1), nullptr).ok());
  ids.insert(ids.begin() + 102, ids[100]);  // looked ahead at before its first turn
  ASSERT_TRUE(m->AllocateSlots(ids[100], 2).ok());
  const std::vector<uint32_t> counts(ids.size(), 1), tokens(ids.size(), 7);
  StepResult result;
  const std::atomic<uint64_t>& hashed = m->index().stats().prefix_keys_hashed;
  const uint64_t hashed_before = hashed.load();
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());
  EXPECT_EQ(result.failed, 0u);
  EXPECT_EQ(m->Tokens(ids[100]), kBlock + 1);
  // One key per seal, and one more: hashed ahead for the repeated request's second turn, stale by
  // then (a key per seal only, 2,100, without the look-ahead).
  EXPECT_EQ(hashed.load() - hashed_before, kRequests + 1u);
  for (uint32_t r = 0; r < kRequests; r += 97) {
    std::vector<uint32_t> prompt = Range(r * 1000, kBlock - 1);
    prompt.push_back(7);
    EXPECT_EQ(MustAdmit(*m, AndOneMore(prompt)).cached_blocks, 1u) << r;
  }
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Below the prefetch threshold (2,048 request slots) the look-ahead starts at a step's first seal
// (ADR 0044): the requests the loop has passed by then are looked at once (a repeated request in
// that window is hashed ahead and stale at its second turn), and every later one as the loop goes
// (another repeat, further on). Without it: a key per seal, 300. The keys are the blocks' own
// (the debug build's Seal asserts each key given), and the blocks are found again.
TEST(RequestManagerScheduler, SealLookAheadStartsAtTheFirstSeal) {
  constexpr uint32_t kRequests = 300;
  ManagerOptions o = V3Fp8(3 * kRequests + 64);
  o.region_kind = RegionKind::kUnbacked;
  o.seal_timing = SealTiming::kImmediate;  // the step's own seals and their look-ahead
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  std::vector<RequestId> ids;
  for (uint32_t r = 0; r < kRequests; ++r) ids.push_back(MustAdmit(*m, Range(r * 1000, kBlock - 1)).id);
  for (RequestId id : ids) ASSERT_TRUE(m->Append(id, Range(id.value * 1000, kBlock - 1), nullptr).ok());
  std::vector<RequestId> batch = ids;
  batch.insert(batch.begin() + 152, ids[150]);  // looked ahead at by the loop
  batch.insert(batch.begin() + 3, ids[1]);      // looked ahead at when the first seal (batch[0]'s) turns it on
  ASSERT_TRUE(m->AllocateSlots(ids[1], 2).ok());
  ASSERT_TRUE(m->AllocateSlots(ids[150], 2).ok());
  const std::vector<uint32_t> counts(batch.size(), 1), tokens(batch.size(), 7);
  StepResult result;
  // The first step after an admission prefetches (and looks ahead at) every request, as above
  // the threshold (its prompts' traffic has evicted the request lines): an empty step first.
  ASSERT_TRUE(m->Step(StepBatch{}, nullptr, &result).ok());
  const std::atomic<uint64_t>& hashed = m->index().stats().prefix_keys_hashed;
  const uint64_t hashed_before = hashed.load();
  ASSERT_TRUE(m->Step(StepBatch{batch, counts, tokens}, nullptr, &result).ok());
  EXPECT_EQ(result.failed, 0u);
  EXPECT_EQ(m->Tokens(ids[1]), kBlock + 1);
  EXPECT_EQ(m->Tokens(ids[150]), kBlock + 1);
  EXPECT_EQ(hashed.load() - hashed_before, kRequests + 2u);
  for (uint32_t r = 0; r < kRequests; r += 13) {
    std::vector<uint32_t> prompt = Range(r * 1000, kBlock - 1);
    prompt.push_back(7);
    EXPECT_EQ(MustAdmit(*m, AndOneMore(prompt)).cached_blocks, 1u) << r;
  }
  // A step without a seal looks ahead at nothing: no key hashed.
  const uint64_t hashed_after = hashed.load();
  ASSERT_TRUE(m->Step(StepBatch{ids, std::vector<uint32_t>(ids.size(), 1), std::vector<uint32_t>(ids.size(), 8)},
                      nullptr, &result)
                  .ok());
  EXPECT_EQ(hashed.load(), hashed_after);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// The step after a block boundary: every request's token starts a new block, which the step
// takes from the pool in batch order (the decode path's one-block case, ADR 0046: the blocks,
// the result and the counters are the ones Reserve and AppendReserved give). A request the pool
// cannot serve is refused and left unchanged; the others go on.
TEST(RequestManagerScheduler, StepTakesEachRequestsNextBlockInBatchOrder) {
  ManagerOptions o = V3Fp8(3 * 2);  // room for 3 prompt blocks, then 3 more
  o.region_kind = RegionKind::kUnbacked;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  std::vector<RequestId> ids;
  for (uint32_t r = 0; r < 3; ++r) {
    const std::vector<uint32_t> prompt = Range(1000 * (r + 1), kBlock);
    ids.push_back(MustAdmit(*m, prompt).id);
    ASSERT_TRUE(m->Append(ids.back(), prompt, nullptr).ok());
  }
  // Taken in batch order: c, a (b is not in this step).
  const std::vector<RequestId> batch = {ids[2], ids[0]};
  const uint64_t allocations = m->pool().stats().allocations.load();
  StepResult r;
  ASSERT_TRUE(m->Step(StepBatch{batch, std::vector<uint32_t>{1, 1}, std::vector<uint32_t>{7, 8}}, nullptr, &r).ok());
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(r.offsets, (std::vector<uint32_t>{0, 1, 2}));
  ASSERT_EQ(r.new_blocks.size(), 2u);
  EXPECT_EQ(r.new_blocks[0], Table(*m, ids[2])[1]);
  EXPECT_EQ(r.new_blocks[1], Table(*m, ids[0])[1]);
  EXPECT_EQ(r.new_blocks[0], BlockId{3});  // a fresh pool hands out its blocks in id order
  EXPECT_EQ(r.new_blocks[1], BlockId{4});
  EXPECT_EQ(m->pool().state(r.new_blocks[0]), BlockState::kFilling);
  EXPECT_EQ(m->pool().stats().allocations.load(), allocations + 2);
  EXPECT_EQ(m->Tokens(ids[0]), kBlock + 1);
  EXPECT_EQ(m->Tokens(ids[1]), kBlock);
  EXPECT_EQ(m->Tokens(ids[2]), kBlock + 1);
  EXPECT_TRUE(r.replaced.empty());

  // One block left for two requests: the first in the batch takes it, the second is refused
  // (kOutOfBlocks, counted) and unchanged.
  const uint64_t refused = m->metrics().out_of_blocks.load();
  const std::vector<RequestId> last = {ids[1], ids[0]};
  ASSERT_TRUE(m->Step(StepBatch{last, std::vector<uint32_t>{1, 1}, std::vector<uint32_t>{9, 10}}, nullptr, &r).ok());
  EXPECT_EQ(r.codes, (std::vector<StatusCode>{StatusCode::kOk, StatusCode::kOk}));
  EXPECT_EQ(r.new_blocks, (std::vector<BlockId>{BlockId{5}}));
  EXPECT_EQ(m->pool().free_count(), 0u);
  const std::vector<RequestId> more = {ids[2], ids[1]};
  // c fills its second block up to its last token, then both ask for one more token: c fits,
  // b (already past its first block) fits; a third block for c is refused.
  ASSERT_TRUE(m->AllocateSlots(ids[2], kBlock - 2).ok());
  ASSERT_TRUE(m->Append(ids[2], Range(50000, kBlock - 2), nullptr).ok());
  ASSERT_TRUE(m->Step(StepBatch{more, std::vector<uint32_t>{1, 1}, std::vector<uint32_t>{11, 12}}, nullptr, &r).ok());
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(m->Tokens(ids[2]), 2u * kBlock);  // sealed its second block
  EXPECT_TRUE(m->index().Indexed(Table(*m, ids[2])[1]));
  ASSERT_TRUE(m->Step(StepBatch{std::vector<RequestId>{ids[2]}, std::vector<uint32_t>{1}, std::vector<uint32_t>{13}},
                      nullptr, &r)
                  .ok());
  EXPECT_EQ(r.codes, (std::vector<StatusCode>{StatusCode::kOutOfBlocks}));
  EXPECT_EQ(r.failed, 1u);
  EXPECT_TRUE(r.new_blocks.empty());
  EXPECT_EQ(m->Tokens(ids[2]), 2u * kBlock);
  EXPECT_EQ(Table(*m, ids[2]).size(), 2u);
  EXPECT_EQ(m->metrics().out_of_blocks.load(), refused + 1);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// With draft slots (spec_tokens) the block is taken one token earlier: the token that completes a
// block both seals it and takes the next, and the sealed block is found again.
TEST(RequestManagerScheduler, StepSealsAndTakesTheNextBlockWithDraftSlots) {
  ManagerOptions o = V3Fp8(8);
  o.region_kind = RegionKind::kUnbacked;
  o.spec_tokens = 1;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  const std::vector<uint32_t> prompt = Range(100, kBlock - 1);
  const RequestId a = MustAdmit(*m, prompt).id;
  ASSERT_TRUE(m->Append(a, prompt, nullptr).ok());
  ASSERT_EQ(Table(*m, a).size(), 1u);
  StepResult r;
  ASSERT_TRUE(
      m->Step(StepBatch{std::vector<RequestId>{a}, std::vector<uint32_t>{1}, std::vector<uint32_t>{5}}, nullptr, &r)
          .ok());
  EXPECT_EQ(r.failed, 0u);
  ASSERT_EQ(Table(*m, a).size(), 2u);
  EXPECT_EQ(r.new_blocks, (std::vector<BlockId>{Table(*m, a)[1]}));
  EXPECT_EQ(m->pool().state(Table(*m, a)[0]), BlockState::kSealed);
  std::vector<uint32_t> again = prompt;
  again.push_back(5);
  EXPECT_EQ(MustAdmit(*m, AndOneMore(again)).cached_blocks, 1u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// Two requests in one step: each reserves its tokens and appends them; the result names the
// blocks each took, and the records read back.
TEST(RequestManagerScheduler, StepAppendsForEveryRequest) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(700, 150));
  RequestSpec chunked;
  chunked.reserve_tokens = 0;
  Admission a = MustAdmit(*m, s.tokens(), chunked);
  Admission b = MustAdmit(*m, s.tokens(), chunked);
  ASSERT_EQ(Table(*m, a.id).size(), 0u);
  const std::vector<RequestId> ids = {a.id, b.id};
  const std::vector<uint32_t> counts = {100, 70};
  std::vector<uint32_t> tokens(s.tokens().begin(), s.tokens().begin() + 100);
  tokens.insert(tokens.end(), s.tokens().begin(), s.tokens().begin() + 70);
  StepResult r;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, s.Writer(), &r).ok());
  EXPECT_TRUE(r.replaced.empty());
  EXPECT_EQ(r.codes, (std::vector<StatusCode>{StatusCode::kOk, StatusCode::kOk}));
  EXPECT_EQ(r.failed, 0u);
  ASSERT_EQ(r.offsets, (std::vector<uint32_t>{0, 2, 4}));
  EXPECT_EQ(std::vector<BlockId>(r.new_blocks.begin(), r.new_blocks.begin() + 2), Table(*m, a.id));
  EXPECT_EQ(std::vector<BlockId>(r.new_blocks.begin() + 2, r.new_blocks.end()), Table(*m, b.id));
  EXPECT_EQ(m->Tokens(a.id), 100u);
  EXPECT_EQ(m->Tokens(b.id), 70u);
  EXPECT_TRUE(RecordsMatch(*m, a.id, s));
  EXPECT_TRUE(RecordsMatch(*m, b.id, s));
  // The next step: a crosses no boundary (no block), b fills its second block.
  const BlockId b_second = Table(*m, b.id)[1];
  const std::vector<uint32_t> more = {28, 58};
  std::vector<uint32_t> next(s.tokens().begin() + 100, s.tokens().begin() + 128);
  next.insert(next.end(), s.tokens().begin() + 70, s.tokens().begin() + 128);
  ASSERT_TRUE(m->Step(StepBatch{ids, more, next}, s.Writer(), &r).ok());
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(r.offsets, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_TRUE(r.new_blocks.empty());
  EXPECT_EQ(Table(*m, a.id)[1], Table(*m, b.id)[1]);  // sealed with equal bytes: deduplicated
  // ... which the step reports, so that an engine's copy of b's table follows.
  ASSERT_EQ(r.replaced.size(), 1u);
  EXPECT_EQ(r.replaced[0].request, 1u);
  EXPECT_EQ(r.replaced[0].slot, 1u);
  EXPECT_EQ(r.replaced[0].from, b_second);
  EXPECT_EQ(r.replaced[0].to, Table(*m, a.id)[1]);
  EXPECT_TRUE(RecordsMatch(*m, b.id, s));
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// A fork shares its parent's unsealed block until it writes: the step that writes reports the
// copy it made.
TEST(RequestManagerScheduler, StepReportsACopyOnWrite) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(8));
  KvStream s;
  s.Add(Range(40, kBlock + 10));
  Admission a = MustAdmit(*m, s.Slice(0, kBlock + 5), RequestSpec{});
  ASSERT_TRUE(m->Append(a.id, s.Slice(0, kBlock + 5), s.Writer()).ok());
  RequestId child = *m->Fork(a.id);
  const BlockId shared = Table(*m, child)[1];
  ASSERT_EQ(shared, Table(*m, a.id)[1]);
  const std::vector<RequestId> ids = {a.id, child};
  const std::vector<uint32_t> counts = {0, 1};
  const std::vector<uint32_t> tokens(s.tokens().begin() + kBlock + 5, s.tokens().begin() + kBlock + 6);
  StepResult r;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, s.Writer(), &r).ok());
  ASSERT_EQ(r.failed, 0u);
  ASSERT_EQ(r.replaced.size(), 1u);
  EXPECT_EQ(r.replaced[0].request, 1u);
  EXPECT_EQ(r.replaced[0].slot, 1u);
  EXPECT_EQ(r.replaced[0].from, shared);
  EXPECT_EQ(r.replaced[0].to, Table(*m, child)[1]);
  EXPECT_NE(Table(*m, child)[1], shared);
  EXPECT_EQ(Table(*m, a.id)[1], shared);  // the parent keeps its block
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// A request the pool cannot serve is left unchanged and reported; the others go on.
TEST(RequestManagerScheduler, StepLeavesARefusedRequestUnchanged) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(3));
  KvStream s;
  s.Add(Range(10, 3 * kBlock));
  RequestSpec chunked;
  chunked.reserve_tokens = 0;
  Admission a = MustAdmit(*m, s.tokens(), chunked);
  Admission b = MustAdmit(*m, s.tokens(), chunked);
  const RequestId gone{77};
  const std::vector<RequestId> ids = {a.id, b.id, gone};
  const std::vector<uint32_t> counts = {2 * kBlock, 2 * kBlock, 1};
  std::vector<uint32_t> tokens(s.tokens().begin(), s.tokens().begin() + 2 * kBlock);
  tokens.insert(tokens.end(), s.tokens().begin(), s.tokens().begin() + 2 * kBlock);
  tokens.push_back(1);
  StepResult r;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, s.Writer(), &r).ok());
  EXPECT_EQ(r.codes,
            (std::vector<StatusCode>{StatusCode::kOk, StatusCode::kOutOfBlocks, StatusCode::kInvalidArgument}));
  EXPECT_EQ(r.failed, 2u);
  EXPECT_EQ(r.offsets, (std::vector<uint32_t>{0, 2, 2, 2}));
  EXPECT_EQ(m->Tokens(a.id), 2u * kBlock);
  EXPECT_EQ(m->Tokens(b.id), 0u);
  EXPECT_TRUE(Table(*m, b.id).empty());
  EXPECT_EQ(m->pool().free_count(), 1u);
  EXPECT_TRUE(RecordsMatch(*m, a.id, s));
}

TEST(RequestManagerScheduler, MalformedBatchesChangeNothing) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), V3Fp8(4));
  Admission a = MustAdmit(*m, Range(1, 10));
  const std::vector<RequestId> ids = {a.id};
  const std::vector<uint32_t> one = {1}, two = {1, 1}, token = {5};
  const KvStream s(1, 10);
  StepResult r;
  Status st = m->Step(StepBatch{ids, two, token}, s.Writer(), &r);
  EXPECT_EQ(st.field(), "batch");
  st = m->Step(StepBatch{ids, two, std::span<const uint32_t>(two)}, s.Writer(), &r);  // 2 counts for 1 request
  EXPECT_EQ(st.field(), "batch");
  st = m->Step(StepBatch{ids, one, {}}, s.Writer(), &r);  // 1 token counted, none given
  EXPECT_EQ(st.field(), "batch");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  st = m->Step(StepBatch{ids, one, token}, nullptr, &r);  // a pool that holds bytes needs writers
  EXPECT_EQ(st.field(), "writers");
  EXPECT_EQ(m->Tokens(a.id), 0u);
  EXPECT_EQ(Table(*m, a.id).size(), 1u);  // the block Admit reserved, nothing more
}

// --- The ledger and the pools agree ---------------------------------------------------------

struct LedgerCase {
  const char* model;
  const char* kv_format;  // "" = the model's default
  RegionKind kind;
};

void ExpectLedgerEquality(const LedgerCase& c, uint64_t n_blocks_times, uint64_t extra) {
  Geometry g = Preset(c.model);
  ManagerOptions o;
  o.kv_format = c.kv_format;
  o.capacity_blocks = 16;
  o.region_kind = c.kind;
  o.hash_key_seed = 3;
  std::unique_ptr<RequestManager> m = MustManager(g, o);
  ASSERT_NE(m, nullptr);
  const uint64_t n = n_blocks_times * m->pool().block_tokens() + extra;
  const uint64_t batch = 3;
  std::vector<KvStream> streams(batch);
  for (uint32_t r = 0; r < batch; ++r) {
    streams[r].Add(Range(100000 * (r + 1), static_cast<uint32_t>(n)));
    Admission a = MustAdmit(*m, streams[r].tokens());
    ASSERT_EQ(a.cached_tokens, 0u);
    Fill(*m, a.id, streams[r], n);
  }
  Result<Ledger> l = ComputeLedger(g, testing::LedgerOptionsFor(o, n, batch));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->block_tokens, m->pool().block_tokens());
  EXPECT_EQ(m->bytes_held(), l->committed_bytes)
      << c.model << " " << (*c.kv_format ? c.kv_format : "(default)") << " N=" << n;
  EXPECT_GT(m->bytes_held(), 0u);
}

TEST(RequestManagerLedger, BytesHeldEqualsCommittedBytes) {
  const LedgerCase cases[] = {
      {"deepseek-v3", "fp8_ds_mla", RegionKind::kHost},
      {"deepseek-v3", "fp8_ds_mla", RegionKind::kUnbacked},
      {"deepseek-v3", "mla-bf16", RegionKind::kUnbacked},
      {"deepseek-v3.2", "", RegionKind::kUnbacked},
      {"kimi-k2", "", RegionKind::kUnbacked},
      {"llama-3.1-8b", "", RegionKind::kUnbacked},
  };
  for (const LedgerCase& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + c.kv_format);
    ExpectLedgerEquality(c, 2, 5);  // N = 2 x block_tokens + 5
    ExpectLedgerEquality(c, 4, 0);  // N = 4 x block_tokens
  }
}

TEST(RequestManagerLedger, DeepSeekV32PoolHoldsLatentAndIndexer) {
  ManagerOptions o;
  o.capacity_blocks = 2;
  o.region_kind = RegionKind::kUnbacked;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3.2"), o);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->pool().groups().size(), 2u);
  EXPECT_EQ(m->pool().groups()[0].format.name, "fp8_ds_mla");
  EXPECT_EQ(m->pool().groups()[1].format.name, "indexer-fp8");
  EXPECT_EQ(m->pool().block_bytes(), 61u * 64 * 788);
}

// The manager is single-owner, but its statistics may be read from any thread while it runs
// (this test is what TSan checks).
// --- Deferred seals (ManagerOptions::seal_timing, ADR 0048, ADR 0049) ---------------------------------

ManagerOptions Deferrable(uint32_t capacity, uint32_t block_tokens, bool defer) {
  ManagerOptions o = V3Fp8(capacity);
  o.region_kind = RegionKind::kUnbacked;
  if (block_tokens != 0) o.block_tokens = block_tokens;  // 0: the model's (64)
  o.kv_events = true;
  o.seal_timing = defer ? SealTiming::kDeferred : SealTiming::kImmediate;
  return o;
}

::testing::AssertionResult SameEvents(const std::vector<KvEvent>& a, const std::vector<KvEvent>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " events against " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].kind != b[i].kind || a[i].block_hashes != b[i].block_hashes ||
        a[i].parent_block_hash != b[i].parent_block_hash || a[i].token_ids != b[i].token_ids ||
        a[i].block_size != b[i].block_size || a[i].domain != b[i].domain) {
      return ::testing::AssertionFailure() << "event " << i << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(RequestManagerDeferredSeals, RefusedWhereASealMustHappenAtOnce) {
  ManagerOptions o = V3Fp8(64);
  o.seal_timing = SealTiming::kDeferred;  // a pool that holds bytes
  EXPECT_EQ(RequestManager::Create(Preset("deepseek-v3"), o).status().field(), "defer-seals");
  o.region_kind = RegionKind::kUnbacked;
  EXPECT_TRUE(RequestManager::Create(Preset("deepseek-v3"), o).ok());
  ManagerOptions v4;
  v4.capacity_blocks = 64;
  v4.region_kind = RegionKind::kUnbacked;
  v4.seal_timing = SealTiming::kDeferred;  // windows: their state is kept at the seal
  EXPECT_EQ(RequestManager::Create(Preset("deepseek-v4-flash"), v4).status().field(), "defer-seals");
}

// The default (SealTiming::kAuto, ADR 0049) defers where deferring is allowed and seals at once
// where it is refused; kImmediate seals at once anywhere.
TEST(RequestManagerDeferredSeals, TheDefaultDefersWhereAllowed) {
  ManagerOptions o = V3Fp8(64);
  ASSERT_EQ(o.seal_timing, SealTiming::kAuto);
  EXPECT_FALSE(MustManager(Preset("deepseek-v3"), o)->defers_seals());  // a pool that holds bytes
  o.region_kind = RegionKind::kUnbacked;
  EXPECT_TRUE(MustManager(Preset("deepseek-v3"), o)->defers_seals());
  o.seal_timing = SealTiming::kImmediate;
  EXPECT_FALSE(MustManager(Preset("deepseek-v3"), o)->defers_seals());
  o.seal_timing = SealTiming::kDeferred;
  EXPECT_TRUE(MustManager(Preset("deepseek-v3"), o)->defers_seals());
  ManagerOptions v4;
  v4.capacity_blocks = 64;
  v4.region_kind = RegionKind::kUnbacked;
  EXPECT_FALSE(MustManager(Preset("deepseek-v4-flash"), v4)->defers_seals());  // windows
}

// `n` requests admitted with distinct prompts one token short of a block, their tokens appended:
// the next step's token completes a block for each.
std::vector<RequestId> OneTokenShortOfABlock(RequestManager& m, uint32_t n) {
  std::vector<RequestId> ids;
  for (uint32_t r = 0; r < n; ++r) {
    ids.push_back(MustAdmit(m, Range(r * 1000, kBlock - 1)).id);
    EXPECT_TRUE(m.Append(ids.back(), Range(r * 1000, kBlock - 1), nullptr).ok());
  }
  return ids;
}

uint64_t MetricValue(const RequestManager& m, std::string_view name) {
  for (const MetricFamily& f : m.CollectMetrics()) {
    if (f.name == name) return f.samples.at(0).second;
  }
  ADD_FAILURE() << name << " not collected";
  return 0;
}

// CollectMetrics (any thread; it performs nothing) counts a seal when it is performed, and says
// how many are queued.
TEST(RequestManagerDeferredSeals, MetricsCountQueuedSealsApart) {
  constexpr uint32_t kRequests = 300;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), Deferrable(3 * kRequests, 0, true));
  const std::vector<RequestId> ids = OneTokenShortOfABlock(*m, kRequests);
  const uint64_t seals = MetricValue(*m, "tessera_block_seals_total");
  EXPECT_EQ(MetricValue(*m, "tessera_seals_pending"), 0u);
  const std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests, 7);
  StepResult result;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());
  EXPECT_EQ(MetricValue(*m, "tessera_seals_pending"), kRequests);
  EXPECT_EQ(MetricValue(*m, "tessera_block_seals_total"), seals);
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());  // performs none
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());  // performs 64
  EXPECT_EQ(MetricValue(*m, "tessera_seals_pending"), kRequests - 64);
  EXPECT_EQ(MetricValue(*m, "tessera_block_seals_total"), seals + 64);
  m->DrainSeals();
  EXPECT_EQ(MetricValue(*m, "tessera_seals_pending"), 0u);
  EXPECT_EQ(MetricValue(*m, "tessera_block_seals_total"), seals + kRequests);
}

// A step where every request completes a block queues the seals; the next step (where the same
// requests take their next blocks) performs none, and each one after it max(64, batch / 16) of
// them, oldest first, with the keys hashed ahead (the debug build's Seal asserts each); anything
// that reads the index performs the rest first.
TEST(RequestManagerDeferredSeals, ASealStepQueuesAndLaterStepsPerformABoundedShare) {
  constexpr uint32_t kRequests = 2000;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), Deferrable(3 * kRequests, 0, true));
  const std::vector<RequestId> ids = OneTokenShortOfABlock(*m, kRequests);
  const std::atomic<uint64_t>& hashed = m->index().stats().prefix_keys_hashed;
  const uint64_t hashed_before = hashed.load();
  const size_t entries_before = m->index().prefix_entries();
  const std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests, 7);
  StepResult result;
  ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());
  EXPECT_EQ(result.failed, 0u);
  EXPECT_EQ(m->pending_seals(), kRequests);
  EXPECT_EQ(hashed.load(), hashed_before);  // nothing hashed in the seal step
  size_t pending = kRequests;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(m->Step(StepBatch{ids, counts, tokens}, nullptr, &result).ok());
    EXPECT_EQ(result.failed, 0u);
    if (step > 0) pending -= std::max<size_t>(64, kRequests / 16);
    EXPECT_EQ(m->pending_seals(), pending) << step;
    EXPECT_EQ(result.new_blocks.size(), step == 0 ? kRequests : 0u);  // the next blocks, taken at once
  }
  // index() performs the rest: one key per seal, each block found again.
  EXPECT_EQ(m->index().prefix_entries(), entries_before + kRequests);
  EXPECT_EQ(m->pending_seals(), 0u);
  EXPECT_EQ(hashed.load() - hashed_before, kRequests);
  for (uint32_t r = 0; r < kRequests; r += 37) {
    std::vector<uint32_t> prompt = Range(r * 1000, kBlock - 1);
    prompt.push_back(7);
    EXPECT_TRUE(m->index().Indexed(Table(*m, ids[r])[0])) << r;
    EXPECT_EQ(MustAdmit(*m, AndOneMore(prompt)).cached_blocks, 1u) << r;
  }
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

// The same schedule through a manager that seals at once and one that defers: requests in
// groups that write the same tokens (duplicate blocks, sealed in batch order), steps of one token
// and of several (the general path), blocks of 4 tokens (a request seals again while its last
// seal is queued), a pool small enough to evict, frees and admissions that hit. Every step's
// result, table and token count is the same without draining anything; the events, admissions,
// pool and index are the same when read.
void DeferredMatchesImmediate(uint32_t block_tokens) {
  constexpr uint32_t kRequests = 200, kGroups = 8, kSteps = 120;
  // Room for about 85% of what the requests would hold at the end: late steps evict and refuse.
  const uint32_t capacity = kRequests * (kSteps + 12) / block_tokens * 85 / 100;
  std::unique_ptr<RequestManager> now = MustManager(Preset("deepseek-v3"), Deferrable(capacity, block_tokens, false));
  std::unique_ptr<RequestManager> later = MustManager(Preset("deepseek-v3"), Deferrable(capacity, block_tokens, true));
  ASSERT_TRUE(now && later);
  std::mt19937 engine(block_tokens);
  auto rng = [&engine] { return static_cast<uint32_t>(engine()); };
  std::vector<std::vector<uint32_t>> written(kRequests);  // what each request slot holds
  std::vector<RequestId> a(kRequests), b(kRequests);
  auto admit = [&](uint32_t r, std::vector<uint32_t> prompt) {
    Result<Admission> x = now->Admit(prompt, RequestSpec{});
    Result<Admission> y = later->Admit(prompt, RequestSpec{});
    ASSERT_TRUE(x.ok() && y.ok()) << x.status().ToString() << y.status().ToString();
    EXPECT_EQ(x->cached_tokens, y->cached_tokens);
    a[r] = x->id;
    b[r] = y->id;
    const auto rest = std::span<const uint32_t>(prompt).subspan(x->cached_tokens);
    ASSERT_TRUE(now->Append(a[r], rest, nullptr).ok());
    ASSERT_TRUE(later->Append(b[r], rest, nullptr).ok());
    written[r] = std::move(prompt);
  };
  for (uint32_t r = 0; r < kRequests; ++r) admit(r, Range(1000 * (r % kGroups), 2 * block_tokens + r % 3));
  size_t most_pending = 0;
  StepResult x, y;
  for (uint32_t step = 0; step < kSteps; ++step) {
    std::vector<uint32_t> counts(kRequests, 1), tokens;
    for (uint32_t r = 0; r < kRequests; ++r) {
      if (step % 11 == 10 && rng() % 7 == 0) counts[r] = 2 + rng() % 5;  // the general path
      for (uint32_t t = 0; t < counts[r]; ++t) tokens.push_back((r % kGroups) * 7 + step % 5 + t);
    }
    ASSERT_TRUE(now->Step(StepBatch{a, counts, tokens}, nullptr, &x).ok());
    ASSERT_TRUE(later->Step(StepBatch{b, counts, tokens}, nullptr, &y).ok());
    most_pending = std::max(most_pending, later->pending_seals());
    ASSERT_EQ(x.codes, y.codes) << step;
    ASSERT_EQ(x.offsets, y.offsets) << step;
    ASSERT_EQ(x.new_blocks, y.new_blocks) << step;
    ASSERT_TRUE(x.replaced.empty() && y.replaced.empty()) << step;
    for (uint32_t r = 0; r < kRequests; ++r) {
      ASSERT_EQ(Table(*now, a[r]), Table(*later, b[r])) << step << " " << r;
      ASSERT_EQ(now->Tokens(a[r]), later->Tokens(b[r])) << step << " " << r;
    }
    size_t offset = 0;
    for (uint32_t r = 0; r < kRequests; ++r) {
      if (x.codes[r] == StatusCode::kOk) {
        written[r].insert(written[r].end(), tokens.begin() + static_cast<ptrdiff_t>(offset),
                          tokens.begin() + static_cast<ptrdiff_t>(offset + counts[r]));
      }
      offset += counts[r];
    }
    if (step % 9 == 8) {  // a request ends; a new one starts from a prefix of another's tokens
      const uint32_t r = rng() % kRequests, from = rng() % kRequests;
      std::vector<uint32_t> prompt(written[from].begin(),
                                   written[from].begin() + static_cast<ptrdiff_t>(written[from].size() / 2));
      prompt.push_back(90000 + step);
      ASSERT_TRUE(now->Free(a[r]).ok());
      ASSERT_TRUE(later->Free(b[r]).ok());
      admit(r, std::move(prompt));
    }
    if (step % 16 == 15) {
      ASSERT_TRUE(SameEvents(now->TakeKvEvents(), later->TakeKvEvents())) << step;
      EXPECT_EQ(later->pending_seals(), 0u);
      EXPECT_EQ(now->pool().free_count(), later->pool().free_count()) << step;
      EXPECT_EQ(now->pool().stats().evictions.load(), later->pool().stats().evictions.load()) << step;
      EXPECT_EQ(now->index().prefix_entries(), later->index().prefix_entries()) << step;
      for (uint32_t r = 0; r < kRequests; ++r) {
        for (BlockId blk : Table(*now, a[r])) {
          ASSERT_EQ(now->pool().state(blk), later->pool().state(blk)) << step << " " << r;
          ASSERT_EQ(now->index().Indexed(blk), later->index().Indexed(blk)) << step << " " << r;
        }
      }
    }
  }
  EXPECT_GT(now->pool().stats().evictions.load(), 0u);  // the pool was small enough to evict
  EXPECT_GT(now->metrics().out_of_blocks.load(), 0u);   // and to refuse
  EXPECT_GT(most_pending, 64u);                         // more seals queued than a step performs
  EXPECT_TRUE(SameEvents(now->TakeKvEvents(), later->TakeKvEvents()));
  EXPECT_TRUE(later->pool().CheckInvariants().ok());
}

TEST(RequestManagerDeferredSeals, EveryObservationIsWhatImmediateSealsGive) { DeferredMatchesImmediate(4); }
// A span that is not a power of two (the division path) and one token per block (a seal in
// every step, each one queued behind the last).
TEST(RequestManagerDeferredSeals, EveryObservationIsWhatImmediateSealsGiveForOtherSpans) {
  DeferredMatchesImmediate(3);
  DeferredMatchesImmediate(1);
}

// Fork and Free perform the queue first: a fork's child shares its parent's block sealed, and a
// freed request's queued block is cached and hit.
TEST(RequestManagerDeferredSeals, FreeForkAndAdmitSeeEveryQueuedSeal) {
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), Deferrable(64, 0, true));
  const std::vector<uint32_t> prompt = Range(500, kBlock - 1);
  const RequestId r = MustAdmit(*m, prompt).id;
  ASSERT_TRUE(m->Append(r, prompt, nullptr).ok());
  StepResult out;
  ASSERT_TRUE(
      m->Step(StepBatch{std::vector<RequestId>{r}, std::vector<uint32_t>{1}, std::vector<uint32_t>{9}}, nullptr, &out)
          .ok());
  ASSERT_EQ(m->pending_seals(), 1u);
  Result<RequestId> child = m->Fork(r);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(m->pending_seals(), 0u);
  EXPECT_EQ(Table(*m, *child)[0], Table(*m, r)[0]);
  EXPECT_TRUE(m->index().Indexed(Table(*m, r)[0]));
  EXPECT_EQ(m->pool().state(Table(*m, r)[0]), BlockState::kSealed);

  // Without a fork the step's one-token path queues again; Free performs it.
  std::unique_ptr<RequestManager> n = MustManager(Preset("deepseek-v3"), Deferrable(64, 0, true));
  const RequestId s = MustAdmit(*n, prompt).id;
  ASSERT_TRUE(n->Append(s, prompt, nullptr).ok());
  ASSERT_TRUE(
      n->Step(StepBatch{std::vector<RequestId>{s}, std::vector<uint32_t>{1}, std::vector<uint32_t>{9}}, nullptr, &out)
          .ok());
  ASSERT_EQ(n->pending_seals(), 1u);
  ASSERT_TRUE(n->Free(s).ok());
  EXPECT_EQ(n->pending_seals(), 0u);
  std::vector<uint32_t> hit = prompt;
  hit.push_back(9);
  EXPECT_EQ(MustAdmit(*n, AndOneMore(hit)).cached_blocks, 1u);
  EXPECT_TRUE(n->pool().CheckInvariants().ok());
}

TEST(RequestManagerMetrics, ReadableFromAnotherThreadWhileTheOwnerWorks) {
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = 64;
  o.region_kind = RegionKind::kUnbacked;
  std::unique_ptr<RequestManager> m = MustManager(Preset("deepseek-v3"), o);
  std::atomic<bool> done{false};
  uint64_t last_allocations = 0;
  bool monotonic = true;
  std::thread reader([&] {
    while (!done.load()) {
      for (const MetricFamily& f : m->CollectMetrics()) {
        if (f.name == "tessera_block_allocations_total") {
          monotonic = monotonic && f.samples[0].second >= last_allocations;
          last_allocations = f.samples[0].second;
        }
      }
    }
  });
  std::vector<uint32_t> prompt(256);
  std::iota(prompt.begin(), prompt.end(), 0u);
  for (int round = 0; round < 200; ++round) {
    prompt[0] = static_cast<uint32_t>(round % 7);
    Result<Admission> a = m->Admit(prompt, RequestSpec{});
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(m->AllocateSlots(a->id, prompt.size() - a->cached_tokens).ok());
    ASSERT_TRUE(m->Append(a->id, std::span<const uint32_t>(prompt).subspan(a->cached_tokens), nullptr).ok());
    ASSERT_TRUE(m->Free(a->id).ok());
  }
  done = true;
  reader.join();
  EXPECT_TRUE(monotonic);
  EXPECT_GT(m->metrics().prefix_hit_tokens.load(), 0u);
}

}  // namespace
}  // namespace tessera
