// KV-cache events recorded by the request manager (kv_events.h): stored on seal, removed on
// eviction, cleared on reset, nothing when disabled.
#include "tessera/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kv_stream.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::KvStream;
using testing::Preset;

constexpr uint32_t kBlock = 64;  // FlashMLA block span of DeepSeek-V3

std::vector<uint32_t> Range(uint32_t first, uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

ManagerOptions Options(uint32_t capacity, bool events) {
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = capacity;
  o.hash_key_seed = 7;
  o.kv_events = events;
  return o;
}

std::unique_ptr<RequestManager> MustManager(const ManagerOptions& o) {
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(Preset("deepseek-v3"), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Admits the stream's tokens and writes all of them; returns the request.
RequestId RunPrompt(RequestManager& m, const KvStream& s) {
  Result<Admission> a = m.Admit(s.tokens(), {});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return {};
  const uint64_t have = m.Tokens(a->id);
  const uint64_t rest = s.tokens().size() - have;
  Status st = m.AllocateSlots(a->id, rest);
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = m.Append(a->id, s.Slice(have, rest), s.Writer());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return a->id;
}

std::vector<Hash128> Keys(const RequestManager& m, std::span<const uint32_t> tokens) {
  PromptKeys k = m.HashPrompt(tokens, {});
  return {k.keys().begin(), k.keys().end()};
}

TEST(KvEvents, NamesAreVllmTags) {
  EXPECT_EQ(KvEventKindName(KvEventKind::kBlockStored), "BlockStored");
  EXPECT_EQ(KvEventKindName(KvEventKind::kBlockRemoved), "BlockRemoved");
  EXPECT_EQ(KvEventKindName(KvEventKind::kAllBlocksCleared), "AllBlocksCleared");
  EXPECT_EQ(KvMediumName(KvMedium::kGpu), "GPU");
  EXPECT_EQ(KvMediumName(KvMedium::kCpu), "CPU");
}

TEST(KvEvents, SealsOfOneChainAreOneBlockStored) {
  std::unique_ptr<RequestManager> m = MustManager(Options(16, true));
  KvStream s;
  s.Add(Range(100, 3 * kBlock + 10));  // three whole blocks and a partial one
  const RequestId r = RunPrompt(*m, s);
  const std::vector<Hash128> keys = Keys(*m, s.tokens());
  ASSERT_EQ(keys.size(), 3u);

  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  const KvEvent& e = events[0];
  EXPECT_EQ(e.kind, KvEventKind::kBlockStored);
  EXPECT_EQ(e.block_hashes, keys);
  EXPECT_FALSE(e.parent_block_hash.has_value());  // a prompt's first block
  EXPECT_EQ(e.token_ids, std::vector<uint32_t>(s.tokens().begin(), s.tokens().begin() + 3 * kBlock));
  EXPECT_EQ(e.block_size, kBlock);
  EXPECT_EQ(e.domain, 0u);
  EXPECT_EQ(e.medium, KvMedium::kCpu);     // the pool holds the bytes in host memory
  EXPECT_TRUE(m->TakeKvEvents().empty());  // taken once

  // The partial block fills up: its seal names the third block as parent.
  Status st = m->AllocateSlots(r, kBlock - 10);
  ASSERT_TRUE(st.ok()) << st.ToString();
  KvStream more = s;
  more.Add(Range(9000, kBlock - 10));
  st = m->Append(r, more.Slice(3 * kBlock + 10, kBlock - 10), more.Writer());
  ASSERT_TRUE(st.ok()) << st.ToString();
  events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEventKind::kBlockStored);
  ASSERT_TRUE(events[0].parent_block_hash.has_value());
  EXPECT_EQ(*events[0].parent_block_hash, keys[2]);
  EXPECT_EQ(events[0].block_hashes, std::vector<Hash128>{Keys(*m, more.tokens())[3]});
  EXPECT_EQ(events[0].token_ids.size(), kBlock);
}

TEST(KvEvents, APrefixHitAndADeduplicatedSealStoreNothingNew) {
  std::unique_ptr<RequestManager> m = MustManager(Options(16, true));
  KvStream s;
  s.Add(Range(40, 2 * kBlock + 5));
  RunPrompt(*m, s);
  ASSERT_EQ(m->TakeKvEvents().size(), 1u);
  // The same prompt again: its two blocks hit, nothing is sealed anew.
  RunPrompt(*m, s);
  EXPECT_TRUE(m->TakeKvEvents().empty());

  // Two concurrent identical prompts: the second's seals are deduplicated into the first's.
  KvStream t;
  t.Add(Range(7000, 2 * kBlock + 5));
  Result<Admission> a = m->Admit(t.tokens(), {});
  Result<Admission> b = m->Admit(t.tokens(), {});
  ASSERT_TRUE(a.ok() && b.ok());
  for (RequestId r : {a->id, b->id}) {
    ASSERT_TRUE(m->AllocateSlots(r, t.tokens().size()).ok());
    ASSERT_TRUE(m->Append(r, t.tokens(), t.Writer()).ok());
  }
  EXPECT_EQ(m->index().stats().dedup_hits.load(), 2u);
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].block_hashes, Keys(*m, t.tokens()));
}

TEST(KvEvents, EvictionIsBlockRemoved) {
  std::unique_ptr<RequestManager> m = MustManager(Options(4, true));
  KvStream s;
  s.Add(Range(1, 3 * kBlock));
  const std::vector<Hash128> keys = Keys(*m, s.tokens());
  ASSERT_TRUE(m->Free(RunPrompt(*m, s)).ok());  // three blocks cached
  ASSERT_EQ(m->pool().cached_count(), 3u);
  (void)m->TakeKvEvents();

  // Another prompt needs all four blocks: the three cached ones are evicted.
  KvStream other;
  other.Add(Range(50000, 4 * kBlock - 1));
  Result<Admission> a = m->Admit(other.tokens(), {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);  // consecutive evictions merge
  EXPECT_EQ(events[0].kind, KvEventKind::kBlockRemoved);
  EXPECT_EQ(events[0].medium, KvMedium::kCpu);
  std::vector<Hash128> removed = events[0].block_hashes;
  auto by_value = [](const Hash128& x, const Hash128& y) { return std::tie(x.hi, x.lo) < std::tie(y.hi, y.lo); };
  std::vector<Hash128> want = keys;
  std::sort(removed.begin(), removed.end(), by_value);
  std::sort(want.begin(), want.end(), by_value);
  EXPECT_EQ(removed, want);
  // The evicted prompt no longer hits.
  EXPECT_EQ(m->pool().cached_count(), 0u);
}

TEST(KvEvents, ResetIsAllBlocksClearedAndDropsTheCache) {
  std::unique_ptr<RequestManager> m = MustManager(Options(8, true));
  KvStream s;
  s.Add(Range(300, 2 * kBlock + 1));
  const RequestId r = RunPrompt(*m, s);
  // A live request holds blocks: refused, nothing recorded.
  Status st = m->ResetPrefixCache();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.field(), "requests");
  ASSERT_TRUE(m->Free(r).ok());
  ASSERT_EQ(m->pool().cached_count(), 2u);

  ASSERT_TRUE(m->ResetPrefixCache().ok());
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);  // the untaken BlockStored is superseded; no BlockRemoved
  EXPECT_EQ(events[0].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(m->pool().cached_count(), 0u);
  EXPECT_EQ(m->pool().free_count(), 8u);
  EXPECT_EQ(m->index().prefix_entries(), 0u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
  Result<Admission> again = m->Admit(s.tokens(), {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cached_blocks, 0u);
}

TEST(KvEvents, DisabledRecordsNothing) {
  std::unique_ptr<RequestManager> m = MustManager(Options(4, false));
  KvStream s;
  s.Add(Range(1, 3 * kBlock));
  ASSERT_TRUE(m->Free(RunPrompt(*m, s)).ok());
  KvStream other;
  other.Add(Range(50000, 4 * kBlock - 1));
  ASSERT_TRUE(m->Free(RunPrompt(*m, other)).ok());  // evicts the first prompt's blocks
  EXPECT_GE(m->pool().stats().evictions.load(), 3u);
  ASSERT_TRUE(m->ResetPrefixCache().ok());
  std::vector<KvEvent> events = m->TakeKvEvents();
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(events.capacity(), 0u);  // nothing was ever allocated for events
  EXPECT_EQ(m->metrics().kv_events_dropped.load(), 0u);
}

TEST(KvEvents, UnbackedPoolIsGpuMedium) {
  ManagerOptions o = Options(8, true);
  o.region_kind = RegionKind::kUnbacked;
  o.content_dedup = false;
  std::unique_ptr<RequestManager> m = MustManager(o);
  std::vector<uint32_t> prompt = Range(5, kBlock + 1);
  Result<Admission> a = m->Admit(prompt, {});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(m->AllocateSlots(a->id, prompt.size()).ok());
  ASSERT_TRUE(m->Append(a->id, prompt, {}).ok());
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].medium, KvMedium::kGpu);
}

TEST(KvEvents, TenantDomainTravelsWithTheEvent) {
  std::unique_ptr<RequestManager> m = MustManager(Options(8, true));
  KvStream s;
  s.Add(Range(11, kBlock + 1));
  RequestSpec spec;
  spec.tenant = 9;
  spec.cache_salt = 1234;
  Result<Admission> a = m->Admit(s.tokens(), spec);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(m->AllocateSlots(a->id, s.tokens().size()).ok());
  ASSERT_TRUE(m->Append(a->id, s.tokens(), s.Writer()).ok());
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].domain, 9u);
  // The key is the tenant's (salted) key, not the default tenant's.
  EXPECT_EQ(events[0].block_hashes[0], m->HashPrompt(s.tokens(), spec).keys()[0]);
  EXPECT_NE(events[0].block_hashes[0], Keys(*m, s.tokens())[0]);
}

TEST(KvEvents, PastTheCapacityEventsAreDroppedAndCounted) {
  ManagerOptions o = Options(16, true);
  o.kv_events_capacity = 1;
  std::unique_ptr<RequestManager> m = MustManager(o);
  KvStream a, b;
  a.Add(Range(1, kBlock + 1));
  b.Add(Range(90000, kBlock + 1));
  RunPrompt(*m, a);
  RunPrompt(*m, b);  // another chain: a second event, past the bound
  std::vector<KvEvent> events = m->TakeKvEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].block_hashes, Keys(*m, a.tokens()));
  EXPECT_EQ(m->metrics().kv_events_dropped.load(), 1u);
  bool counted = false;
  for (const MetricFamily& f : m->CollectMetrics()) {
    if (f.name == "tessera_kv_events_dropped_total") counted = f.samples.at(0).second == 1;
  }
  EXPECT_TRUE(counted);
  o.kv_events_capacity = 0;
  Result<std::unique_ptr<RequestManager>> bad = RequestManager::Create(Preset("deepseek-v3"), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "kv-events-capacity");
}

}  // namespace
}  // namespace tessera
