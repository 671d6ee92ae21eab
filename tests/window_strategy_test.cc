#include "tessera/disk_tier.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "test_support.h"

namespace tessera {
namespace {

using testing::FromJson;
using testing::Preset;

// A small DeepSeek-V4-like model: every layer kind, a 128-token window, 256-token blocks.
Geometry Tiny() {
  return FromJson(R"({"model_type": "deepseek_v4", "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64, "sliding_window": 128,
      "compress_ratios": [0, 4, 128, 4, 0], "num_nextn_predict_layers": 1, "index_head_dim": 32,
      "index_n_heads": 4, "index_topk": 16, "max_position_embeddings": 1048576})");
}

uint8_t WindowByte(uint32_t layer, uint64_t pos, size_t i) {
  return static_cast<uint8_t>((layer * 131 + pos * 7 + i * 3) & 0xff);
}
float StateValue(uint32_t layer, bool indexer, uint64_t pos, size_t col) {
  return static_cast<float>((layer * 17 + pos * 5 + col + (indexer ? 1000 : 0)) % 97);
}

KvWriters Writers() {
  KvWriters w;
  w.window = [](uint32_t layer, uint64_t pos, std::span<std::byte> rec) {
    for (size_t i = 0; i < rec.size(); ++i) rec[i] = std::byte{WindowByte(layer, pos, i)};
  };
  w.state = [](uint32_t layer, bool indexer, uint64_t pos, std::span<float> row) {
    for (size_t c = 0; c < row.size(); ++c) row[c] = StateValue(layer, indexer, pos, c);
  };
  w.compress = ReferenceCompress;
  return w;
}

std::vector<uint32_t> Tokens(uint64_t n, uint32_t first = 1) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::unique_ptr<RequestManager> Make(const Geometry& g, ManagerOptions o) {
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(g, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// The expected entry of group g of a layer: column means of the rows of the group (and of the
// previous group for the overlapping ratio-4 compressor), as bytes.
std::vector<std::byte> ExpectedEntry(uint32_t layer, bool indexer, uint32_t ratio, uint64_t g, uint32_t floats,
                                     const ConstRecordView& shape) {
  uint32_t coff = ratio == 4 ? 2 : 1;
  uint64_t first = g * ratio >= (coff - 1) * ratio ? g * ratio - (coff - 1) * ratio : 0;
  std::vector<float> rows;
  for (uint64_t t = first; t < (g + 1) * ratio; ++t) {
    for (uint32_t c = 0; c < floats; ++c) rows.push_back(StateValue(layer, indexer, t, c));
  }
  std::vector<std::byte> storage;
  size_t total = 0;
  for (uint32_t p = 0; p < shape.plane_count; ++p) total += shape.planes[p].size();
  storage.resize(total);
  RecordView v;
  v.plane_count = shape.plane_count;
  size_t off = 0;
  for (uint32_t p = 0; p < shape.plane_count; ++p) {
    v.planes[p] = std::span<std::byte>(storage.data() + off, shape.planes[p].size());
    off += shape.planes[p].size();
  }
  ReferenceCompress(layer, indexer, g, rows, floats, v);
  return storage;
}

std::vector<std::byte> Flatten(const ConstRecordView& v) {
  std::vector<std::byte> out;
  for (uint32_t p = 0; p < v.plane_count; ++p) out.insert(out.end(), v.planes[p].begin(), v.planes[p].end());
  return out;
}

TEST(Hybrid, LayerMapAndGroups) {
  std::unique_ptr<RequestManager> m = Make(Tiny(), ManagerOptions{});
  EXPECT_EQ(m->block_tokens(), 256u);
  ASSERT_EQ(m->pool().groups().size(), 3u);  // compressed/4, indexer/4, compressed/128
  uint32_t c4 = 0, c128 = 0, idx = 0;
  for (const PoolGroup& g : m->pool().groups()) {
    if (g.name == "compressed/4") c4 = g.layers;
    if (g.name == "compressed/128") c128 = g.layers;
    if (g.name == "indexer/4") idx = g.layers;
  }
  EXPECT_EQ(c4, 2u);
  EXPECT_EQ(c128, 1u);
  EXPECT_EQ(idx, 2u);
  // ADR 0020: the two CSA layers' compressed slices (64 x 200 B, padded to 192-B multiples) share
  // one page, so the entry and ledger tests below run over a packed page; one HCA layer cannot pack.
  for (const PoolGroup& g : m->pool().groups()) {
    EXPECT_EQ(g.page.layers_per_page, g.name == "compressed/4" ? 2u : 1u) << g.name;
  }
}

TEST(Hybrid, EntriesLandAtTheRightBlockAndOffsetForLengthsOneToAThousand) {
  ManagerOptions o;
  o.capacity_blocks = 8;
  std::unique_ptr<RequestManager> m = Make(Tiny(), o);
  KvWriters w = Writers();
  Admission a = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  std::vector<uint32_t> toks = Tokens(1000);
  const uint32_t ratios[] = {0, 4, 128, 4};
  for (uint64_t n = 1; n <= 1000; ++n) {
    ASSERT_TRUE(m->AllocateSlots(a.id, 1).ok());
    ASSERT_TRUE(m->Append(a.id, std::span<const uint32_t>(toks).subspan(n - 1, 1), w).ok()) << n;
    // Pages: as many block ids as the finest cache's complete entries need.
    EXPECT_EQ(m->BlockTable(a.id).size(), (n / 4 + 63) / 64) << n;
    // Every group that just completed has its entry in place, for every layer kind.
    for (uint32_t layer = 0; layer < 4; ++layer) {
      uint32_t r = ratios[layer];
      if (r == 0 || n % r != 0) continue;
      for (bool indexer : {false, true}) {
        if (indexer && r != 4) continue;
        uint64_t g = n / r - 1;
        Result<ConstRecordView> e = m->Entry(a.id, layer, indexer, g);
        ASSERT_TRUE(e.ok()) << e.status().ToString();
        uint32_t floats = indexer ? 2 * 2 * 32 : 2 * (r == 4 ? 2 : 1) * 128;
        EXPECT_EQ(Flatten(*e), ExpectedEntry(layer, indexer, r, g, floats, *e)) << "layer " << layer << " group " << g;
      }
    }
    // The window ring holds exactly the last 128 tokens of every layer.
    std::vector<std::byte> live = m->LiveState(a.id);
    size_t rows = std::min<uint64_t>(n, 128);
    size_t rec = 64 + 64 * 2 + 1 + 7;  // v4-fp8 for head_dim 128: 64 e4m3 + 64 bf16 + 1 scale + 7 pad
    ASSERT_GE(live.size(), 4 * rows * rec);
    for (uint32_t layer = 0; layer < 4; ++layer) {
      uint64_t first = n - rows;
      for (uint64_t t = first; t < n; t += 37) {
        size_t off = (layer * rows + (t - first)) * rec;
        EXPECT_EQ(static_cast<uint8_t>(live[off + 5]), WindowByte(layer, t, 5)) << n << " " << layer << " " << t;
      }
    }
  }
  // Entries written long ago are still in place.
  for (uint64_t g = 0; g < 1000 / 4; g += 17) {
    Result<ConstRecordView> e = m->Entry(a.id, 1, false, g);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(Flatten(*e), ExpectedEntry(1, false, 4, g, 2 * 2 * 128, *e));
  }
}

TEST(Hybrid, AppendWithoutPagesIsAFailedPrecondition) {
  std::unique_ptr<RequestManager> m = Make(Tiny(), ManagerOptions{});
  Admission a = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  std::vector<uint32_t> toks = Tokens(4);
  Status st = m->Append(a.id, toks, Writers());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
}

// Runs `prefix` tokens uninterrupted, returns the live state at the boundary.
std::vector<std::byte> Uninterrupted(const Geometry& g, SwaStrategy s, const std::vector<uint32_t>& toks) {
  ManagerOptions o;
  o.window_strategy = s;
  o.capacity_blocks = 16;
  std::unique_ptr<RequestManager> m = Make(g, o);
  Admission a = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  EXPECT_TRUE(m->AllocateSlots(a.id, toks.size()).ok());
  EXPECT_TRUE(m->Append(a.id, toks, Writers()).ok());
  return m->LiveState(a.id);
}

// `second` was admitted with `toks` and found the first `cached` tokens: resumes it per strategy,
// checks the live state against an uninterrupted run, then continues to the end of `toks` and
// checks again.
void ResumeAndContinue(RequestManager& m, const Admission& second, const Geometry& g, SwaStrategy s,
                       const std::vector<uint32_t>& toks, uint64_t cached) {
  KvWriters w = Writers();
  std::vector<uint32_t> prefix(toks.begin(), toks.begin() + static_cast<ptrdiff_t>(cached));
  std::vector<uint32_t> rest(toks.begin() + static_cast<ptrdiff_t>(cached), toks.end());
  EXPECT_EQ(second.cached_tokens, cached);
  if (s == SwaStrategy::kRecompute) {
    EXPECT_FALSE(second.state_restored);
    EXPECT_EQ(second.recompute_from, cached - 128u);
    EXPECT_EQ(second.recompute_tokens, 128u);
    ASSERT_TRUE(m.Recompute(second.id, std::span<const uint32_t>(prefix).subspan(second.recompute_from), w).ok());
  } else {
    EXPECT_TRUE(second.state_restored);
    EXPECT_EQ(second.recompute_tokens, 0u);
  }
  EXPECT_EQ(m.LiveState(second.id), Uninterrupted(g, s, prefix));
  // And it continues exactly as the uninterrupted run does.
  ASSERT_TRUE(m.AllocateSlots(second.id, rest.size()).ok());
  ASSERT_TRUE(m.Append(second.id, rest, w).ok());
  EXPECT_EQ(m.LiveState(second.id), Uninterrupted(g, s, toks));
}

class HybridResume : public ::testing::TestWithParam<SwaStrategy> {};

TEST_P(HybridResume, ResumedStateIsIdenticalToAnUninterruptedRun) {
  const SwaStrategy s = GetParam();
  Geometry g = Tiny();
  std::vector<uint32_t> toks = Tokens(512 + 40);
  std::vector<uint32_t> prefix(toks.begin(), toks.begin() + 512);
  std::vector<uint32_t> rest(toks.begin() + 512, toks.end());
  ManagerOptions o;
  o.window_strategy = s;
  o.capacity_blocks = 16;
  std::unique_ptr<RequestManager> m = Make(g, o);
  KvWriters w = Writers();
  // A first request seals two boundaries and leaves.
  Admission first = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  ASSERT_TRUE(m->AllocateSlots(first.id, prefix.size()).ok());
  ASSERT_TRUE(m->Append(first.id, prefix, w).ok());
  ASSERT_TRUE(m->Free(first.id).ok());
  // A second request with the same prompt resumes at the 512-token boundary.
  Admission second = *m->Admit(toks, RequestSpec{});
  ResumeAndContinue(*m, second, g, s, toks, 512);
}

// The same resumption from a disk tier by a cold manager (another process): the pages come back
// verified, and under snapshot and retain the window and compressor rows come back with them.
TEST_P(HybridResume, ResumesFromADiskTierInAColdManager) {
  const SwaStrategy s = GetParam();
  Geometry g = Tiny();
  std::vector<uint32_t> toks = Tokens(512 + 40);
  std::vector<uint32_t> prefix(toks.begin(), toks.begin() + 512);
  std::vector<uint32_t> rest(toks.begin() + 512, toks.end());
  testing::TempDir dir;
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key.ok());
  ManagerOptions o;
  o.window_strategy = s;
  o.capacity_blocks = 16;
  o.hash_key = key->secret;
  KvWriters w = Writers();
  auto store_for = [&](const RequestManager& m) {
    DiskTierOptions d;
    d.dir = dir.path();
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::move(*MakeDiskTier(d, 0)));
    TieredStoreOptions so;
    so.write = WritePolicy::kWriteBack;  // the first manager checkpoints at its end
    return std::move(*TieredStore::Create(m.pool(), so, std::move(tiers)));
  };
  {
    std::unique_ptr<RequestManager> m = Make(g, o);
    auto store = store_for(*m);
    m->SetBlockSource(store.get());
    Admission first = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
    ASSERT_TRUE(m->AllocateSlots(first.id, prefix.size()).ok());
    ASSERT_TRUE(m->Append(first.id, prefix, w).ok());
    ASSERT_TRUE(m->Free(first.id).ok());
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(store->tier_counters(0).records, 0u);  // write-back: nothing evicted yet
    EXPECT_EQ(*m->Checkpoint(), 2u);                 // a graceful shutdown, state included
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(store->tier_counters(0).records, 2u);
    m->SetBlockSource(nullptr);
  }
  {
    // A cold pool too small for the prompt: the admission is refused, and what it promoted stays
    // cached, its kept state counted in the metrics.
    ManagerOptions tight = o;
    tight.capacity_blocks = 2;
    std::unique_ptr<RequestManager> t = Make(g, tight);
    auto tight_store = store_for(*t);
    t->SetBlockSource(tight_store.get());
    EXPECT_EQ(t->Admit(toks, RequestSpec{}).status().code(), StatusCode::kOutOfBlocks);
    EXPECT_EQ(t->live_requests(), 0u);
    EXPECT_EQ(t->pool().cached_count(), 2u);
    EXPECT_EQ(t->metrics().state_bytes.load(), t->states()->bytes_held());
    if (s != SwaStrategy::kRecompute) {
      EXPECT_GT(t->states()->bytes_held(), 0u);
    }
    t->SetBlockSource(nullptr);
  }
  std::unique_ptr<RequestManager> m = Make(g, o);
  auto store = store_for(*m);
  m->SetBlockSource(store.get());
  Admission second = *m->Admit(toks, RequestSpec{});
  EXPECT_EQ(second.tier_blocks, 2u);
  EXPECT_EQ(store->stats().verify_failures, 0u);
  ResumeAndContinue(*m, second, g, s, toks, 512);
  // Every compressed entry of every layer (pages promoted from disk and pages written after).
  const uint32_t ratios[] = {0, 4, 128, 4};
  for (uint32_t layer = 0; layer < 4; ++layer) {
    const uint32_t r = ratios[layer];
    if (r == 0) continue;
    for (bool indexer : {false, true}) {
      if (indexer && r != 4) continue;
      for (uint64_t e = 0; e < toks.size() / r; ++e) {
        Result<ConstRecordView> got = m->Entry(second.id, layer, indexer, e);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        uint32_t floats = indexer ? 2 * 2 * 32 : 2 * (r == 4 ? 2 : 1) * 128;
        EXPECT_EQ(Flatten(*got), ExpectedEntry(layer, indexer, r, e, floats, *got))
            << "layer " << layer << " entry " << e;
      }
    }
  }
  m->SetBlockSource(nullptr);
}

INSTANTIATE_TEST_SUITE_P(All, HybridResume,
                         ::testing::Values(SwaStrategy::kRecompute, SwaStrategy::kSnapshot, SwaStrategy::kRetain),
                         [](const ::testing::TestParamInfo<SwaStrategy>& p) {
                           return std::string(SwaStrategyName(p.param));
                         });

// Bytes held by pages + arena == the ledger's committed bytes, at every phase of a chunked
// prefill, for one request.
void ExpectLedgerEquality(const Geometry& g, uint64_t n, SwaStrategy s, uint32_t spec, RegionKind pages) {
  ManagerOptions o;
  o.window_strategy = s;
  o.spec_tokens = spec;
  o.region_kind = pages;
  o.max_requests = 1;
  o.capacity_blocks = static_cast<uint32_t>(n / 256 + 4);
  std::unique_ptr<RequestManager> m = Make(g, o);
  // The compressed groups of several layers are packed here (ADR 0020): the equalities below
  // cover packed pages.
  for (const PoolGroup& group : m->pool().groups()) {
    EXPECT_EQ(group.page.packed(), group.format.page_alignment > 1 && group.layers > 1) << g.name << " " << group.name;
  }
  LedgerOptions lo;
  lo.swa_strategy = s;
  lo.spec_tokens = spec;
  auto ledger_at = [&](uint64_t tokens) {
    lo.context_tokens = tokens;
    Result<Ledger> l = ComputeLedger(g, lo);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? *l : Ledger{};
  };
  std::vector<uint32_t> toks = Tokens(n);
  Admission a = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  const uint64_t chunk = 8192;
  ASSERT_TRUE(m->AllocateSlots(a.id, std::min(n, chunk)).ok());
  // Admission: the arena plus the first chunk's pages, which is the ledger's admission figure.
  Ledger full = ledger_at(n);
  if (s == SwaStrategy::kRecompute && spec == 0) {
    EXPECT_EQ(m->bytes_held(), full.phases[0].bytes) << g.name << " admission at " << n;
  }
  // Bookkeeping only (no bytes) for an unbacked pool; a pool that holds bytes gets them written.
  const KvWriters none = pages == RegionKind::kHost ? Writers() : KvWriters();
  for (uint64_t done = 0; done < n;) {
    uint64_t step = std::min(chunk, n - done);
    ASSERT_TRUE(m->AllocateSlots(a.id, step).ok());
    ASSERT_TRUE(m->Append(a.id, std::span<const uint32_t>(toks).subspan(done, step), none).ok());
    done += step;
    EXPECT_EQ(m->bytes_held(), ledger_at(done).committed_bytes) << g.name << " after " << done << " tokens";
  }
  EXPECT_EQ(m->bytes_held(), full.committed_bytes) << g.name << " at " << n;
  EXPECT_EQ(m->bytes_held(), full.phases[2].bytes);
}

TEST(HybridLedger, V4ProAndFlashAt1K8K128K1M) {
  for (const char* model : {"deepseek-v4-pro", "deepseek-v4-flash"}) {
    Geometry g = Preset(model);
    for (uint64_t n : {1024ULL, 8192ULL, 131072ULL, 1048576ULL}) {
      ExpectLedgerEquality(g, n, SwaStrategy::kRecompute, 0, RegionKind::kUnbacked);
    }
  }
}

TEST(HybridLedger, NonMultiplesStrategiesAndSpeculation) {
  Geometry g = Preset("deepseek-v4-pro");
  for (uint64_t n : {1ULL, 3ULL, 130ULL, 1000ULL, 9000ULL}) {
    for (SwaStrategy s : {SwaStrategy::kRecompute, SwaStrategy::kSnapshot, SwaStrategy::kRetain}) {
      ExpectLedgerEquality(g, n, s, 0, RegionKind::kUnbacked);
    }
    ExpectLedgerEquality(g, n, SwaStrategy::kRecompute, 2, RegionKind::kUnbacked);
  }
  ExpectLedgerEquality(Tiny(), 1000, SwaStrategy::kSnapshot, 0, RegionKind::kHost);
}

TEST(HybridLedger, ArenaIsTheLedgersConstantTerm) {
  Geometry g = Preset("deepseek-v4-pro");
  std::unique_ptr<RequestManager> m = Make(g, ManagerOptions{});
  // window rings + compressor rings: 61 x 128 x 584 + 30 x 8 x 8192 + 30 x 8 x 2048 + 31 x 128 x 4096
  EXPECT_EQ(m->states()->slab_bytes(), 61ULL * 128 * 584 + 30ULL * 8 * 8192 + 30ULL * 8 * 2048 + 31ULL * 128 * 4096);
}

TEST(Hybrid, ContentDedupOfIdenticalConcurrentRequests) {
  ManagerOptions o;
  o.capacity_blocks = 16;
  std::unique_ptr<RequestManager> m = Make(Tiny(), o);
  std::vector<uint32_t> toks = Tokens(512);
  Admission a = *m->Admit(toks, RequestSpec{});
  Admission b = *m->Admit(toks, RequestSpec{});
  ASSERT_TRUE(m->AllocateSlots(a.id, 512).ok());
  ASSERT_TRUE(m->AllocateSlots(b.id, 512).ok());
  ASSERT_TRUE(m->Append(a.id, toks, Writers()).ok());
  ASSERT_TRUE(m->Append(b.id, toks, Writers()).ok());
  EXPECT_EQ(m->index().stats().dedup_hits.load(), 2u);
  EXPECT_EQ(m->BlockTable(a.id)[0], m->BlockTable(b.id)[0]);
  EXPECT_EQ(m->BlockTable(a.id)[1], m->BlockTable(b.id)[1]);
}

// Tiny() with a sliding window of `window` tokens, built by hand (the config reader refuses
// windows shorter than a CSA group).
Geometry TinyWithWindow(uint32_t window) {
  Geometry g = Tiny();
  g.sliding_window = window;
  for (LayerSpec& l : g.layers) {
    for (CacheSpec& c : l.caches) {
      if (c.role == CacheRole::kWindow) c.slots = window;
    }
  }
  return g;
}

// Recompute re-runs the last `window` tokens of a cached prefix, and that is all that rebuilds
// the compressor rows: a CSA compressor still needs the 4 rows before the boundary, so with a
// window of 2 the resumed state was wrong (simulate counted verify failures). Refused, naming
// the window; snapshot and retain copy those rows and resume exactly with any window.
TEST(Hybrid, RecomputeNeedsAWindowCoveringACsaGroup) {
  for (uint32_t window : {1u, 2u, 3u}) {
    ManagerOptions o;
    o.window_strategy = SwaStrategy::kRecompute;
    Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(TinyWithWindow(window), o);
    ASSERT_FALSE(m.ok()) << window;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(m.status().field(), "sliding_window");
  }
  ManagerOptions four;
  EXPECT_TRUE(RequestManager::Create(TinyWithWindow(4), four).ok());

  for (SwaStrategy s : {SwaStrategy::kSnapshot, SwaStrategy::kRetain}) {
    SCOPED_TRACE(std::string(SwaStrategyName(s)));
    Geometry g = TinyWithWindow(2);
    std::vector<uint32_t> toks = Tokens(512 + 40);
    std::vector<uint32_t> prefix(toks.begin(), toks.begin() + 512);
    ManagerOptions o;
    o.window_strategy = s;
    o.capacity_blocks = 16;
    std::unique_ptr<RequestManager> m = Make(g, o);
    Admission first = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
    ASSERT_TRUE(m->AllocateSlots(first.id, prefix.size()).ok());
    ASSERT_TRUE(m->Append(first.id, prefix, Writers()).ok());
    ASSERT_TRUE(m->Free(first.id).ok());
    ResumeAndContinue(*m, *m->Admit(toks, RequestSpec{}), g, s, toks, 512);
  }
}

// The window ring has window + draft slots, counted in 32 bits: a 2^32 - 1 window with a draft
// token wrapped to a ring of 0 slots.
TEST(Hybrid, WindowPlusDraftSlotsAreChecked) {
  ManagerOptions o;
  o.window_strategy = SwaStrategy::kSnapshot;
  o.spec_tokens = 1;
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(TinyWithWindow(UINT32_MAX), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().field(), "sliding_window");
}

TEST(Hybrid, BadInput) {
  // A model without windows has no state to recompute.
  std::unique_ptr<RequestManager> v3 = Make(Preset("deepseek-v3"), ManagerOptions{});
  Admission v3a = *v3->Admit(std::span<const uint32_t>(), RequestSpec{});
  EXPECT_EQ(v3->Recompute(v3a.id, std::span<const uint32_t>(), Writers()).field(), "model");
  ManagerOptions o;
  o.max_requests = 0;
  EXPECT_EQ(RequestManager::Create(Tiny(), o).status().field(), "max-requests");
  o = ManagerOptions{};
  o.block_tokens = 100;
  EXPECT_EQ(RequestManager::Create(Tiny(), o).status().field(), "block-tokens");
  // By default the state arena grows on demand: more requests than one arena segment holds.
  {
    ManagerOptions d;
    d.region_kind = RegionKind::kUnbacked;
    std::unique_ptr<RequestManager> many = Make(Tiny(), d);
    const uint32_t n = RequestStates::kSlabsPerSegment + 100;
    for (uint32_t i = 0; i < n; ++i) {
      Result<Admission> a = many->Admit(std::span<const uint32_t>(), RequestSpec{});
      ASSERT_TRUE(a.ok()) << i << ": " << a.status().ToString();
    }
    EXPECT_EQ(many->live_requests(), n);
    EXPECT_EQ(many->states()->arena_segments(), 2u);
    EXPECT_EQ(many->states()->bytes_held(), uint64_t{n} * many->states()->slab_bytes());
  }
  o = ManagerOptions{};
  o.max_requests = 1;
  std::unique_ptr<RequestManager> m = Make(Tiny(), o);
  ASSERT_TRUE(m->Admit(std::span<const uint32_t>(), RequestSpec{}).ok());
  EXPECT_EQ(m->Admit(std::span<const uint32_t>(), RequestSpec{}).status().code(), StatusCode::kOutOfBlocks);
}

}  // namespace
}  // namespace tessera
