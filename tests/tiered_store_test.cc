#include "tessera/tiered_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <tuple>

#include "kv_stream.h"
#include "tessera/disk_tier.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tier_key.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::RedisServer;
using testing::TempDir;

using Stream = testing::KvStream;

// Every record of every layer of `r` equals the stream's KV.
::testing::AssertionResult Matches(const RequestManager& m, RequestId r, const Stream& s) {
  std::vector<std::byte> want;
  for (uint64_t pos = 0; pos < m.Tokens(r); ++pos) {
    for (uint32_t g = 0; g < m.pool().groups().size(); ++g) {
      for (uint32_t l = 0; l < m.pool().groups()[g].layers; ++l) {
        Result<ConstRecordView> v = m.Record(r, g, l, pos);
        if (!v.ok()) return ::testing::AssertionFailure() << v.status().ToString();
        for (uint32_t p = 0; p < v->plane_count; ++p) {
          want.resize(v->planes[p].size());
          s.Expected(g, l, pos, p, want);
          if (std::memcmp(v->planes[p].data(), want.data(), want.size()) != 0) {
            return ::testing::AssertionFailure() << "position " << pos << " group " << g << " layer " << l;
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr uint32_t kBlock = 64;

ManagerOptions Options(uint32_t capacity, std::vector<std::byte> key = {}) {
  ManagerOptions o;
  o.capacity_blocks = capacity;
  o.hash_key_seed = 11;
  o.hash_key = std::move(key);
  o.content_dedup = false;
  return o;
}

std::unique_ptr<RequestManager> Manager(uint32_t capacity, std::vector<std::byte> key = {}) {
  auto m = RequestManager::Create(testing::SeedFixture(), Options(capacity, std::move(key)));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Admits `s`, writes what was not cached, and returns the admission.
Admission Serve(RequestManager& m, const Stream& s, bool free_after = true) {
  Result<Admission> a = m.Admit(s.tokens(), {});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return {};
  EXPECT_TRUE(m.AllocateSlots(a->id, s.tokens().size() - a->cached_tokens).ok());
  EXPECT_TRUE(m.Append(a->id, std::span(s.tokens()).subspan(a->cached_tokens), s.Writer()).ok());
  EXPECT_TRUE(Matches(m, a->id, s));
  if (free_after) {
    EXPECT_TRUE(m.Free(a->id).ok());
  }
  return *a;
}

std::unique_ptr<TieredStore> Store(const RequestManager& m, std::vector<std::unique_ptr<Tier>> tiers,
                                   WritePolicy write = WritePolicy::kWriteBack, bool async = false) {
  TieredStoreOptions o;
  o.write = write;
  o.asynchronous = async;
  o.batch_records = 3;
  auto s = TieredStore::Create(m.pool(), o, std::move(tiers));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<Tier> Disk(const std::string& dir, uint64_t capacity = 0, uint64_t max_bytes = 0) {
  DiskTierOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  auto t = MakeDiskTier(o, capacity);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

uint64_t RecordBytes(const RequestManager& m) { return ((104 + kBlock * 4 + 63) / 64 * 64) + m.pool().block_bytes(); }

// What a first process leaves behind: `s` served with a disk tier in `dir`, written through, under
// the directory's prefix key, which it returns.
std::vector<std::byte> WriteThroughInAnotherProcess(const std::string& dir, const Stream& s) {
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir);
  EXPECT_TRUE(key.ok()) << key.status().ToString();
  if (!key.ok()) return {};
  auto m = Manager(8, key->secret);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough);
  m->SetBlockSource(store.get());
  Serve(*m, s);
  m->SetBlockSource(nullptr);
  return key->secret;
}

// The pool holds 6 blocks. A (4 full blocks + a tail) is written and freed; B of the same shape
// takes 5 blocks, evicting A's last three blocks (A3, then A2, A1: the pool frees tails first)
// into a host tier of four records. Admitting A again allocates three blocks for the promotion:
// B's freed tail and two evictions (B3, B2) into host, which pushes its least recent record (A3)
// down to disk. A1 and A2 come back from host, A3 from disk.
class DemoteAndPromote : public ::testing::TestWithParam<bool> {};

// The same with the disk writes done by the store's worker (GetParam(): asynchronous); a block
// still queued for its disk write counts as a hit of the disk tier.
TEST_P(DemoteAndPromote, ThroughHostToDiskWithVerifiedBytes) {
  TempDir dir;
  auto m = Manager(6);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(4 * RecordBytes(*m) + 8192));
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, GetParam());
  m->SetBlockSource(store.get());
  Stream a(1000, 4 * kBlock + 10), b(5000, 4 * kBlock + 10);
  EXPECT_EQ(Serve(*m, a).cached_blocks, 0u);
  EXPECT_EQ(Serve(*m, b).cached_blocks, 0u);
  TieredStoreStats st = store->stats();
  EXPECT_EQ(st.demoted, 3u);
  EXPECT_EQ(store->tier_counters(0).records, 3u);
  EXPECT_EQ(store->tier_counters(1).records, 0u);

  Admission again = Serve(*m, a, /*free_after=*/false);  // Serve checks every byte of every layer
  EXPECT_EQ(again.cached_blocks, 4u);
  st = store->stats();
  EXPECT_EQ(st.tier_hits, 3u);
  EXPECT_EQ(st.hits_per_tier[0], 2u);
  EXPECT_EQ(st.hits_per_tier[1], 1u);
  ASSERT_TRUE(store->Flush().ok());
  // The same figures as Prometheus text, with names unique across the manager and the store.
  std::vector<MetricFamily> families = m->CollectMetrics();
  for (MetricFamily& f : store->CollectMetrics()) families.push_back(std::move(f));
  std::set<std::string> names;
  for (const MetricFamily& f : families) {
    EXPECT_TRUE(ValidMetricName(f.name)) << f.name;
    EXPECT_TRUE(names.insert(f.name).second) << "duplicate family " << f.name;
  }
  const std::string text = PrometheusText(families);
  EXPECT_NE(text.find("tessera_tier_promotions_total{tier=\"host\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_tier_promotions_total{tier=\"disk\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_tier_hits_total{unit=\"blocks\"} 3\n"), std::string::npos) << text;
  // A's tail block evicted B1 into host, which pushed its least recent record down: B3 (A1 and A2
  // were refreshed by their promotion).
  EXPECT_EQ(store->tier_counters(0).records, 4u);
  EXPECT_EQ(store->tier_counters(1).records, 2u);
  EXPECT_EQ(st.verify_failures, 0u);
  EXPECT_EQ(m->metrics().tier_hit_blocks.load(), 3u);
  EXPECT_TRUE(m->pool().CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, DemoteAndPromote, ::testing::Bool());

TEST(TieredStore, WriteThroughLetsASecondProcessFindBlocksOnDisk) {
  TempDir dir;
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  Stream a(7, 5 * kBlock + 3);
  {
    auto m = Manager(16, key->secret);
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(Disk(dir.path()));
    auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough, /*async=*/true);
    m->SetBlockSource(store.get());
    Serve(*m, a);
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(store->stats().written_through, 5u);
    EXPECT_EQ(store->tier_counters(0).records, 5u);  // no eviction happened: write-through did it
    m->SetBlockSource(nullptr);
  }
  // A cold process: the same key from the directory, a fresh pool.
  Result<TierKey> key2 = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key2.ok());
  EXPECT_EQ(key2->secret, key->secret);
  auto m = Manager(16, key2->secret);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough, true);
  m->SetBlockSource(store.get());
  Admission r = Serve(*m, a);
  EXPECT_EQ(r.cached_blocks, 5u);
  EXPECT_EQ(store->stats().tier_hits, 5u);
  EXPECT_EQ(store->stats().verify_failures, 0u);

  // Another key (another fleet's secret) computes other prefix keys: no hits, no errors.
  auto other = Manager(16);
  m->SetBlockSource(nullptr);
  store.reset();  // one writer per directory at a time
  std::vector<std::unique_ptr<Tier>> t2;
  t2.push_back(Disk(dir.path()));
  auto store2 = Store(*other, std::move(t2));
  other->SetBlockSource(store2.get());
  EXPECT_EQ(Serve(*other, a).cached_blocks, 0u);
  EXPECT_EQ(store2->stats().tier_hits, 0u);
}

TEST(TieredStore, WriteBackWritesNothingUntilEvictionOrCheckpoint) {
  TempDir dir;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, true);
  m->SetBlockSource(store.get());
  Stream a(1, 3 * kBlock);
  Serve(*m, a);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->tier_counters(0).records, 0u);
  EXPECT_EQ(store->stats().written_through, 0u);
  // A checkpoint (a graceful shutdown) writes the pool's sealed blocks, each once.
  EXPECT_EQ(*m->Checkpoint(), 3u);
  EXPECT_EQ(*m->Checkpoint(), 3u);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->tier_counters(0).records, 3u);
  EXPECT_EQ(store->stats().written_through, 3u);
  m->SetBlockSource(nullptr);
}

// Write-back with a host tier: what the pool evicted into host memory reaches the disk at a
// checkpoint (a graceful shutdown), so that a cold process finds every block, not only those
// still in the pool.
TEST(TieredStore, CheckpointWritesTheHostTierDownToDisk) {
  TempDir dir;
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key.ok());
  std::vector<Stream> streams;
  for (uint32_t i = 0; i < 4; ++i) streams.emplace_back(1000 * (i + 1), 3 * kBlock + 1);
  {
    auto m = Manager(6, key->secret);  // 12 blocks served through a pool of 6: most go to host
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(MakeHostTier(64 * RecordBytes(*m)));
    tiers.push_back(Disk(dir.path()));
    auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, /*async=*/true);
    m->SetBlockSource(store.get());
    for (const Stream& s : streams) Serve(*m, s);
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_GT(store->tier_counters(0).records, 0u);
    EXPECT_EQ(store->tier_counters(1).records, 0u);
    Result<uint64_t> checkpointed = m->Checkpoint();
    ASSERT_TRUE(checkpointed.ok()) << checkpointed.status().ToString();
    EXPECT_EQ(store->tier_counters(1).records, 12u);  // pool and host, all of them
    m->SetBlockSource(nullptr);
  }
  auto m = Manager(16, key->secret);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  for (const Stream& s : streams) EXPECT_EQ(Serve(*m, s).cached_blocks, 3u);  // Serve checks every byte
  EXPECT_EQ(store->stats().tier_hits, 12u);
  EXPECT_EQ(store->stats().verify_failures, 0u);
}

// A checkpoint the persistent tier refuses is an error, not a silent loss.
TEST(TieredStore, CheckpointReportsARefusedWrite) {
  TempDir dir;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path(), 0, /*max_bytes=*/8192));  // room for no block record
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, true);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 2 * kBlock));
  Result<uint64_t> r = m->Checkpoint();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "tier");
  EXPECT_NE(r.status().message().find("no space"), std::string::npos) << r.status().ToString();
  m->SetBlockSource(nullptr);
}

// A checkpoint the persistent tier took, but whose evictions for space the tier below refused:
// those blocks are lost, and the checkpoint says so (Flush's error).
TEST(TieredStore, CheckpointReportsRecordsDroppedBelowThePersistentTier) {
  TempDir dir;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path(), RecordBytes(*m)));  // keeps one record, passes the others down
  tiers.push_back(MakeHostTier(100));                  // refuses every block record
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, true);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 3 * kBlock));
  Result<uint64_t> r = m->Checkpoint();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "tier");
  EXPECT_NE(r.status().message().find("2 records were dropped"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(store->stats().through_refused, 0u);
  EXPECT_EQ(store->tier_counters(0).records, 1u);
  m->SetBlockSource(nullptr);
}

// Flush tells whether everything the store took since the previous Flush is in some tier. A disk
// tier with no room for a record and no tier below: every write-through is refused and dropped.
// The same synchronously (GetParam(): asynchronous).
class FlushReportsDrops : public ::testing::TestWithParam<bool> {};

TEST_P(FlushReportsDrops, RefusedRecordsWithNoTierBelow) {
  TempDir dir;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path(), 0, /*max_bytes=*/8192));  // room for no block record
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough, GetParam());
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 2 * kBlock));
  Status flushed = store->Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kIoError);
  EXPECT_EQ(flushed.field(), "tier");
  EXPECT_NE(flushed.message().find("2 records were dropped"), std::string::npos) << flushed.ToString();
  EXPECT_NE(flushed.message().find("no space"), std::string::npos) << flushed.ToString();
  EXPECT_EQ(store->stats().dropped, 2u);
  EXPECT_TRUE(store->Flush().ok());  // each drop is reported once
  Serve(*m, Stream(500, kBlock));
  flushed = store->Flush();
  EXPECT_NE(flushed.message().find("1 records were dropped"), std::string::npos) << flushed.ToString();
  m->SetBlockSource(nullptr);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, FlushReportsDrops, ::testing::Bool());

// A refused batch that a tier below takes is counted, not lost: Flush is OK.
TEST(TieredStore, FlushIsOkWhenATierBelowTookTheRefusedRecords) {
  TempDir full, below;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(full.path(), 0, /*max_bytes=*/8192));
  tiers.push_back(Disk(below.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough, /*async=*/true);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 2 * kBlock));
  Status flushed = store->Flush();
  EXPECT_TRUE(flushed.ok()) << flushed.ToString();
  TieredStoreStats st = store->stats();
  EXPECT_GE(st.write_errors, 1u);
  EXPECT_EQ(st.through_refused, 2u);
  EXPECT_EQ(st.dropped, 0u);
  EXPECT_EQ(store->tier_counters(1).records, 2u);
  m->SetBlockSource(nullptr);
}

// Blocks are valid for one model, weights and layout. A directory written for DeepSeek-V3 serves
// nothing to DeepSeek-R1 (same geometry, other weights), to V3 under another weights revision, or
// to V3 in another record format; and two formats of one model share a directory without
// quarantining each other's records.
TEST(TieredStore, BlocksServeOnlyTheCacheIdentityThatWroteThem) {
  TempDir dir;
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key.ok());
  auto open = [&](const std::string& preset, const std::string& format, const std::string& revision) {
    ManagerOptions o = Options(8, key->secret);
    o.kv_format = format;
    o.weights_revision = revision;
    auto m = RequestManager::Create(testing::Preset(preset), o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : std::unique_ptr<RequestManager>();
  };
  struct Run {
    uint32_t cached_blocks;
    uint64_t verify_failures;
    uint64_t quarantined;
  };
  auto serve = [&](const std::string& preset, const std::string& format, const std::string& revision) {
    auto m = open(preset, format, revision);
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(Disk(dir.path()));
    auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough);
    m->SetBlockSource(store.get());
    Stream s(77, 2 * kBlock + 1);
    Run r{Serve(*m, s).cached_blocks, store->stats().verify_failures, store->tier_counters(0).quarantined};
    m->SetBlockSource(nullptr);
    return r;
  };
  Run first = serve("deepseek-v3", "", "");
  EXPECT_EQ(first.cached_blocks, 0u);
  for (auto [preset, format, revision] : {std::tuple{"deepseek-r1", "", ""}, std::tuple{"deepseek-v3", "", "ft-2"},
                                          std::tuple{"deepseek-v3", "fp8_ds_mla", ""}}) {
    SCOPED_TRACE(std::string(preset) + " " + format + " " + revision);
    Run other = serve(preset, format, revision);
    EXPECT_EQ(other.cached_blocks, 0u);
    EXPECT_EQ(other.verify_failures, 0u);
    EXPECT_EQ(other.quarantined, 0u);
  }
  // Each identity wrote its own blocks through; each finds exactly its own.
  EXPECT_EQ(serve("deepseek-v3", "", "").cached_blocks, 2u);
  EXPECT_EQ(serve("deepseek-v3", "fp8_ds_mla", "").cached_blocks, 2u);
  EXPECT_EQ(serve("deepseek-r1", "", "").cached_blocks, 2u);
  EXPECT_EQ(serve("deepseek-v3", "", "").verify_failures, 0u);
}

// A record that verifies in its tier but is not the block asked for (forged or misfiled: other
// tokens under the right key) is quarantined and counted, never used.
TEST(TieredStore, RecordWhoseTokensDifferIsQuarantinedNotServed) {
  TempDir dir;
  Stream a(100, 2 * kBlock + 1);
  const std::vector<std::byte> key = WriteThroughInAnotherProcess(dir.path(), a);
  ASSERT_FALSE(key.empty());
  // Rewrite the second block's record with one token changed (its checksums are recomputed by
  // the disk tier, so only the store's identity check can catch it).
  Hash128 k1{};
  {
    auto m = Manager(8, key);
    k1 = m->index().PrefixKey(m->index().root_key(), std::span(a.tokens()).first(kBlock), 0, 0);
    Hash128 k2 = m->index().PrefixKey(k1, std::span(a.tokens()).subspan(kBlock, kBlock), 0, 0);
    DiskTierOptions o;
    o.dir = dir.path();
    auto disk = DiskTier::Open(o);
    ASSERT_TRUE(disk.ok());
    Result<TierRecord> rec = (*disk)->Get(k2);
    ASSERT_TRUE(rec.ok());
    TierRecord forged = *rec;
    uint32_t t;
    std::memcpy(&t, forged.payload.data() + 104 + 5 * 4, 4);
    ++t;
    std::memcpy(forged.payload.data() + 104 + 5 * 4, &t, 4);
    ASSERT_TRUE((*disk)->PutBatch(std::span<const TierRecord>(&forged, 1)).ok());
  }
  auto m = Manager(8, key);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  Admission r = Serve(*m, a);  // still correct: the second block is recomputed
  EXPECT_EQ(r.cached_blocks, 1u);
  EXPECT_EQ(store->stats().tier_hits, 1u);
  EXPECT_EQ(store->stats().verify_failures, 1u);
  EXPECT_NE(store->stats().last_error.find("tokens"), std::string::npos) << store->stats().last_error;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/quarantine"));
  EXPECT_EQ(store->tier_counters(0).records, 1u);  // the forged record is out of service
}

// The same from a host tier, where a promotion copies the record straight into the pool's pages
// (Tier::ReadInto): a record that passes the host tier's checksum but is another prefix's block
// ends the run there, is counted, and is taken out of the host tier; the block is recomputed.
TEST(TieredStore, HostRecordWhoseTokensDifferIsQuarantinedNotServed) {
  TempDir dir;
  Stream a(101, 2 * kBlock + 1);
  const std::vector<std::byte> key = WriteThroughInAnotherProcess(dir.path(), a);
  ASSERT_FALSE(key.empty());
  auto m = Manager(8, key);
  const Hash128 k1 = m->index().PrefixKey(m->index().root_key(), std::span(a.tokens()).first(kBlock), 0, 0);
  DiskTierOptions o;
  o.dir = dir.path();
  TierRecord forged;
  {
    auto disk = DiskTier::Open(o);
    ASSERT_TRUE(disk.ok());
    Result<TierRecord> rec = (*disk)->Get(k1);
    ASSERT_TRUE(rec.ok());
    forged = *rec;
  }
  uint32_t t;
  std::memcpy(&t, forged.payload.data() + 104 + 3 * 4, 4);
  ++t;
  std::memcpy(forged.payload.data() + 104 + 3 * 4, &t, 4);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(64ULL << 20));
  const TierRecord* one = &forged;
  ASSERT_TRUE(tiers[0]->PutBatch(std::span<const TierRecord* const>(&one, 1)).ok());
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  Admission r = Serve(*m, a, /*free_after=*/false);  // nothing evicted into the host tier
  EXPECT_EQ(r.cached_blocks, 0u);                    // the run ends at the forged first block
  EXPECT_EQ(store->stats().verify_failures, 1u);
  EXPECT_NE(store->stats().last_error.find("tokens"), std::string::npos) << store->stats().last_error;
  EXPECT_EQ(store->tier_counters(0).records, 0u);  // out of the host tier
  m->SetBlockSource(nullptr);
}

// A tier that cannot take a record out of service says so: the store counts it and names the
// tier's error, and still serves nothing of the record.
TEST(TieredStore, AFailedQuarantineIsCountedAndNamed) {
  TempDir dir;
  Stream a(100, 2 * kBlock + 1);
  const std::vector<std::byte> key = WriteThroughInAnotherProcess(dir.path(), a);
  ASSERT_FALSE(key.empty());
  {
    auto m = Manager(8, key);
    const Hash128 k1 = m->index().PrefixKey(m->index().root_key(), std::span(a.tokens()).first(kBlock), 0, 0);
    const Hash128 k2 = m->index().PrefixKey(k1, std::span(a.tokens()).subspan(kBlock, kBlock), 0, 0);
    DiskTierOptions o;
    o.dir = dir.path();
    auto disk = DiskTier::Open(o);
    ASSERT_TRUE(disk.ok());
    Result<TierRecord> rec = (*disk)->Get(k2);
    ASSERT_TRUE(rec.ok());
    TierRecord forged = *rec;
    uint32_t t;
    std::memcpy(&t, forged.payload.data() + 104 + 5 * 4, 4);
    ++t;
    std::memcpy(forged.payload.data() + 104 + 5 * 4, &t, 4);
    ASSERT_TRUE((*disk)->PutBatch(std::span<const TierRecord>(&forged, 1)).ok());
  }
  struct StuckQuarantine : testing::ForwardingTier {
    using testing::ForwardingTier::ForwardingTier;
    Status Quarantine(const Hash128&, const std::string&) override { return IoError("dir", "quarantine file full"); }
  };
  auto m = Manager(8, key);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<StuckQuarantine>(Disk(dir.path())));
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  Admission r = Serve(*m, a);
  EXPECT_EQ(r.cached_blocks, 1u);
  EXPECT_EQ(store->stats().verify_failures, 1u);
  EXPECT_EQ(store->stats().quarantine_failures, 1u);
  EXPECT_NE(store->stats().last_error.find("quarantine: dir: quarantine file full"), std::string::npos)
      << store->stats().last_error;
}

TEST(TieredStore, DamagedSegmentIsAMissNeverWrongBytes) {
  TempDir dir;
  Stream a(300, 3 * kBlock);
  const std::vector<std::byte> key = WriteThroughInAnotherProcess(dir.path(), a);
  ASSERT_FALSE(key.empty());
  // Flip one payload byte of the last record (block 3) in the segment.
  std::string seg;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() == ".tsr") seg = e.path();
  }
  ASSERT_FALSE(seg.empty());
  {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekp(size - 4096 - 100);  // inside the last record's padded payload
    f.put('\x5a');
  }
  auto m = Manager(8, key);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  Admission r = Serve(*m, a);  // every byte checked against the stream
  EXPECT_LE(r.cached_blocks, 2u);
  EXPECT_EQ(store->tier_counters(0).records, 2u);
}

// LRU per tier: a disk tier of two records keeps the two most recent and hands the older ones
// to the tier below (here none: dropped), counting evictions.
TEST(TieredStore, DiskTierCapacityEvictsLeastRecent) {
  TempDir dir;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path(), 2 * RecordBytes(*m)));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 5 * kBlock));
  TierCounters c = store->tier_counters(0);
  EXPECT_EQ(c.records, 2u);
  EXPECT_EQ(c.evictions, 3u);
  EXPECT_LE(c.bytes, c.capacity_bytes);
  EXPECT_TRUE(store->Flush().ok());  // a cache forgetting its least recent records is no error
}

// A record larger than a whole tier is passed on to the tier below, not dropped.
TEST(TieredStore, RecordLargerThanATierGoesToTheNextOne) {
  TempDir small, big;
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(small.path(), RecordBytes(*m) - 1));
  tiers.push_back(Disk(big.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 3 * kBlock));
  EXPECT_EQ(store->tier_counters(0).records, 0u);
  EXPECT_EQ(store->tier_counters(1).records, 3u);
  m->SetBlockSource(nullptr);
}

// Blocks queued for an asynchronous write are found before the write completes.
TEST(TieredStore, AsynchronousBatchesServeWhatIsStillQueued) {
  TempDir dir;
  auto m = Manager(6);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, /*async=*/true);
  m->SetBlockSource(store.get());
  for (int round = 0; round < 4; ++round) {
    Stream a(static_cast<uint32_t>(round) * 1000, 4 * kBlock + 1),
        b(90000 + static_cast<uint32_t>(round), 4 * kBlock + 1);
    Serve(*m, a);
    Serve(*m, b);
    Admission again = Serve(*m, a);  // Serve verifies every byte
    EXPECT_EQ(again.cached_blocks, 4u);
  }
  ASSERT_TRUE(store->Flush().ok());
  TieredStoreStats st = store->stats();
  EXPECT_EQ(st.pending, 0u);
  EXPECT_GT(st.batches, 0u);
  EXPECT_EQ(st.verify_failures, 0u);
}

// With batches larger than the run, every demotion is still queued when A comes back: the hits
// are served from the queue (counted for the disk tier they are headed to), then Flush writes them.
TEST(TieredStore, BlocksStillQueuedForTheirWriteAreHits) {
  TempDir dir;
  auto m = Manager(6);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(Disk(dir.path()));
  TieredStoreOptions o;
  o.batch_records = 1000;
  auto store = std::move(*TieredStore::Create(m->pool(), o, std::move(tiers)));
  m->SetBlockSource(store.get());
  Stream a(1000, 4 * kBlock + 1), b(5000, 4 * kBlock + 1);
  Serve(*m, a);
  Serve(*m, b);
  EXPECT_EQ(store->stats().pending, 3u);
  EXPECT_EQ(Serve(*m, a).cached_blocks, 4u);  // every byte compared
  TieredStoreStats st = store->stats();
  EXPECT_EQ(st.tier_hits, 3u);
  EXPECT_EQ(st.queued_hits, 3u);
  EXPECT_EQ(st.hits_per_tier[0], 3u);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->stats().pending, 0u);
  EXPECT_GE(store->tier_counters(0).records, 3u);
  m->SetBlockSource(nullptr);
}

#if TESSERA_HAVE_REDIS
TEST(TieredStore, FullDiskKeepsServingFromRedisBelow) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  TempDir dir;
  auto m = Manager(6);
  const uint64_t rec = RecordBytes(*m);
  std::vector<std::unique_ptr<Tier>> tiers;
  // The cap fits one record (header slot + payload padded to 4 KiB) and not two.
  tiers.push_back(Disk(dir.path(), 0, 4096 + (rec + 4095) / 4096 * 4096 + 100));
  RedisTierOptions ro;
  ro.port = server.port();
  ro.secret = std::vector<std::byte>(32, std::byte{0x42});
  ro.key_namespace = RedisNamespace("seed-fixture", "mla-bf16", 0);
  auto redis = MakeRedisTier(ro);
  ASSERT_TRUE(redis.ok()) << redis.status().ToString();
  tiers.push_back(std::move(redis).value());
  auto store = Store(*m, std::move(tiers));
  m->SetBlockSource(store.get());
  Stream a(1000, 4 * kBlock + 10), b(5000, 4 * kBlock + 10);
  Serve(*m, a);
  Serve(*m, b);
  TieredStoreStats st = store->stats();
  EXPECT_EQ(st.demoted, 3u);
  EXPECT_GE(st.write_errors, 1u);
  EXPECT_NE(st.last_error.find("no space"), std::string::npos) << st.last_error;
  EXPECT_TRUE(store->Flush().ok());           // what the disk refused went to Redis
  EXPECT_EQ(Serve(*m, a).cached_blocks, 4u);  // bytes verified by Serve
  st = store->stats();
  EXPECT_EQ(st.hits_per_tier[0] + st.hits_per_tier[1], 3u);
  EXPECT_GE(st.hits_per_tier[1], 2u);
}
#endif  // TESSERA_HAVE_REDIS

#if TESSERA_HAVE_REDIS
// The whole chain: a host tier of one record, a disk tier of one record, Redis below. The pool
// evicts A3, A2, A1 in that order: A3 ends in Redis, A2 on disk, A1 in host. Coming back, every
// block is verified, wherever it was by then.
TEST(TieredStore, DemotionCascadesPoolHostDiskRedis) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  TempDir dir;
  auto m = Manager(6);
  const uint64_t rec = RecordBytes(*m);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(rec + 4096));
  tiers.push_back(Disk(dir.path(), rec + 4096));
  RedisTierOptions ro;
  ro.port = server.port();
  ro.secret = std::vector<std::byte>(32, std::byte{0x42});
  auto redis = MakeRedisTier(ro);
  ASSERT_TRUE(redis.ok()) << redis.status().ToString();
  tiers.push_back(std::move(redis).value());
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteBack, /*async=*/true);
  m->SetBlockSource(store.get());
  Stream a(1000, 4 * kBlock + 10), b(5000, 4 * kBlock + 10);
  Serve(*m, a);
  Serve(*m, b);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->tier_counters(0).records, 1u);  // A1
  EXPECT_EQ(store->tier_counters(1).records, 1u);  // A2
  EXPECT_EQ(store->tier_counters(2).records, 1u);  // A3 (records this process wrote there)
  EXPECT_EQ(store->tier_counters(0).evictions, 2u);
  EXPECT_EQ(store->tier_counters(1).evictions, 1u);
  EXPECT_EQ(store->stats().demoted, 3u + 2u + 1u);  // pool->host 3, host->disk 2, disk->Redis 1
  EXPECT_EQ(Serve(*m, a).cached_blocks, 4u);        // every byte compared
  TieredStoreStats st = store->stats();
  EXPECT_EQ(st.tier_hits, 3u);
  EXPECT_EQ(st.verify_failures, 0u);
  m->SetBlockSource(nullptr);
}
#endif  // TESSERA_HAVE_REDIS

#if TESSERA_HAVE_REDIS
TEST(TieredStore, RedisDownIsAMissAndRecoveryIsServed) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  auto m = Manager(6);
  RedisTierOptions ro;
  ro.port = server.port();
  ro.secret = std::vector<std::byte>(32, std::byte{0x42});
  ro.reconnect_interval_ms = 0;
  std::vector<std::unique_ptr<Tier>> tiers;
  auto redis = MakeRedisTier(ro);
  ASSERT_TRUE(redis.ok()) << redis.status().ToString();
  tiers.push_back(std::move(redis).value());
  auto store = Store(*m, std::move(tiers), WritePolicy::kWriteThrough);
  m->SetBlockSource(store.get());
  Stream a(1, 3 * kBlock), b(9000, 6 * kBlock);
  Serve(*m, a);
  server.Stop();
  Serve(*m, b);                               // evicts all of a from the pool
  EXPECT_EQ(Serve(*m, a).cached_blocks, 0u);  // a miss, not an error
  ASSERT_TRUE(server.Start());                // restarted empty (no persistence)
  Serve(*m, b);
  Stream c(20000, 3 * kBlock + 1);
  Serve(*m, c);
  Serve(*m, b);  // c evicted from the pool, still in Redis
  EXPECT_EQ(Serve(*m, c).cached_blocks, 3u);
  EXPECT_EQ(store->stats().verify_failures, 0u);
}
#endif  // TESSERA_HAVE_REDIS

// ---- One writer per block of a shared tier (ADR 0023) --------------------------------------

// A tier the ranks of a tensor-parallel group share, in one thread: a host tier seen through a
// shared, persistent face, so the store writes it as it writes Redis (one batch per record here,
// the stores being synchronous). Records the keys written, in order, and every payload.
class SharedTier final : public testing::ForwardingTier {
 public:
  explicit SharedTier(Tier* under) : ForwardingTier(under) {}
  std::string_view name() const override { return "shared"; }
  bool in_memory() const override { return false; }
  bool persistent() const override { return true; }
  bool shared() const override { return true; }
  Status PutBatch(std::span<const TierRecord* const> records) override {
    for (const TierRecord* r : records) written.push_back(r->key);
    return ForwardingTier::PutBatch(records);
  }
  std::vector<Hash128> written;
};

std::unique_ptr<TieredStore> RankStore(const RequestManager& m, std::vector<std::unique_ptr<Tier>> tiers, uint32_t rank,
                                       uint32_t world, WritePolicy write = WritePolicy::kWriteThrough) {
  TieredStoreOptions o;
  o.write = write;
  o.asynchronous = false;
  o.tp_rank = rank;
  o.tp_world = world;
  auto s = TieredStore::Create(m.pool(), o, std::move(tiers));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(SingleWriter, RejectsABadRankOrWorldNamingTheField) {
  auto m = Manager(4);
  for (auto [rank, world, field] : std::vector<std::tuple<uint32_t, uint32_t, std::string>>{
           {0, 0, "tp-world"}, {0, kMaxTpWorld + 1, "tp-world"}, {2, 2, "tp-rank"}, {9, 8, "tp-rank"}}) {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(MakeHostTier(1 << 20));
    TieredStoreOptions o;
    o.tp_rank = rank;
    o.tp_world = world;
    auto s = TieredStore::Create(m->pool(), o, std::move(tiers));
    ASSERT_FALSE(s.ok()) << rank << "/" << world;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().field(), field);
  }
}

// The writer of a key spreads keys evenly over the ranks, and is a fixed function: ranks of one
// group, and versions of one fleet, must agree on it, so a change to it must fail here.
TEST(SingleWriter, WriterRankSpreadsKeysEvenlyAndIsFixed) {
  for (uint32_t world : {2u, 3u, 4u, 8u, 16u}) {
    std::vector<uint64_t> per_rank(world, 0);
    const uint64_t n = 64000;
    for (uint64_t i = 0; i < n; ++i) {
      // Keys as a keyed hash gives them, and keys with structure (small, sequential halves).
      ++per_rank[SingleWriterRank(Hash128{testing::Mix(i), testing::Mix(~i)}, world)];
      ++per_rank[SingleWriterRank(Hash128{i, 0}, world)];
    }
    for (uint32_t r = 0; r < world; ++r) {
      const double share = static_cast<double>(per_rank[r]) * world / (2.0 * n);
      EXPECT_GT(share, 0.95) << "world " << world << " rank " << r;
      EXPECT_LT(share, 1.05) << "world " << world << " rank " << r;
    }
  }
  EXPECT_EQ(SingleWriterRank(Hash128{0x0123456789abcdefULL, 0xfedcba9876543210ULL}, 1), 0u);
  EXPECT_EQ(SingleWriterRank(Hash128{0x0123456789abcdefULL, 0xfedcba9876543210ULL}, 0), 0u);  // no group
  // Pinned outputs of the function as shipped (ADR 0023), computed by an independent Python
  // transcription of it (splitmix64's finalizer over lo ^ hi * 0x9e3779b97f4a7c15, mod world).
  EXPECT_EQ(SingleWriterRank(Hash128{0x0123456789abcdefULL, 0xfedcba9876543210ULL}, 8), 7u);
  EXPECT_EQ(SingleWriterRank(Hash128{0, 1}, 1000), 535u);
  EXPECT_EQ(SingleWriterRank(Hash128{1, 2}, 1000), 519u);
  EXPECT_EQ(SingleWriterRank(Hash128{2, 1}, 1000), 110u);
}

// Two ranks, one shared tier: each block is written once, by its writer; the other rank counts it
// as left to the writer. A rank whose writer has not written a block yet misses it (its prefix
// stops there, the bytes it got all verified); once the writer has written, every rank finds
// every block.
TEST(SingleWriter, ANonWriterMissesWhatItsWriterHasNotWrittenYet) {
  Stream s(1, 12 * kBlock + 7);
  auto under = MakeHostTier(64ull << 20);
  // One rank's run: a fresh manager and store serve `s`; the admission, the store's counters and
  // the keys the rank wrote to the shared tier, in order.
  struct RankRun {
    Admission admission;
    TieredStoreStats stats;
    std::vector<Hash128> written;
  };
  auto rank_run = [&](uint32_t rank, uint32_t world, WritePolicy write) {
    auto m = Manager(16);
    auto t = std::make_unique<SharedTier>(under.get());
    SharedTier* face = t.get();
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::move(t));
    auto store = RankStore(*m, std::move(tiers), rank, world, write);
    m->SetBlockSource(store.get());
    RankRun run{Serve(*m, s), store->stats(), face->written};  // Serve checks every byte
    m->SetBlockSource(nullptr);
    return run;
  };
  // The blocks' keys in chain order, from a rank of a group of one (it writes them all), whose
  // records are then taken out again.
  const std::vector<Hash128> keys = rank_run(0, 1, WritePolicy::kWriteThrough).written;
  ASSERT_EQ(keys.size(), 12u);
  ASSERT_TRUE(under->EraseBatch(keys).ok());
  ASSERT_EQ(under->counters().records, 0u);
  std::vector<uint32_t> writer;
  for (const Hash128& k : keys) writer.push_back(SingleWriterRank(k, 2));
  const uint64_t by_one = static_cast<uint64_t>(std::count(writer.begin(), writer.end(), 1u));
  ASSERT_GT(by_one, 0u);
  ASSERT_LT(by_one, 12u);  // both ranks write some of this prompt's blocks

  // Rank 1 alone: it writes its own blocks and leaves the others to rank 0.
  const RankRun a1 = rank_run(1, 2, WritePolicy::kWriteThrough);
  EXPECT_EQ(a1.admission.cached_blocks, 0u);
  EXPECT_EQ(a1.stats.written_through, by_one);
  EXPECT_EQ(a1.stats.left_to_writer, 12 - by_one);
  for (const Hash128& k : a1.written) EXPECT_EQ(SingleWriterRank(k, 2), 1u);
  // A cold rank 1 finds the leading blocks rank 1 wrote, and misses from rank 0's first block on.
  size_t lead = 0;
  while (lead < writer.size() && writer[lead] == 1) ++lead;
  ASSERT_LT(lead, 12u);
  const RankRun b1 = rank_run(1, 2, WritePolicy::kWriteBack);
  EXPECT_EQ(b1.admission.cached_blocks, lead);
  EXPECT_EQ(b1.stats.tier_hits, lead);
  EXPECT_EQ(b1.stats.verify_failures, 0u);
  EXPECT_TRUE(b1.written.empty());

  // Rank 0 writes its blocks (and not rank 1's, which the shared tier holds already).
  const RankRun a0 = rank_run(0, 2, WritePolicy::kWriteThrough);
  EXPECT_EQ(a0.admission.cached_blocks, lead);
  EXPECT_EQ(a0.stats.written_through, 12 - by_one);
  for (const Hash128& k : a0.written) EXPECT_EQ(SingleWriterRank(k, 2), 0u);
  EXPECT_EQ(under->counters().records, 12u);
  // Now each rank, cold, promotes all twelve blocks and verifies every byte.
  for (uint32_t rank : {0u, 1u}) {
    const RankRun b = rank_run(rank, 2, WritePolicy::kWriteBack);
    EXPECT_EQ(b.admission.cached_blocks, 12u) << rank;
    EXPECT_EQ(b.stats.tier_hits, 12u) << rank;
    EXPECT_EQ(b.stats.verify_failures, 0u) << rank;
  }
}

// Write-back with a private host tier above the shared one: the host tier takes every rank's
// evicted blocks; what it evicts in turn reaches the shared tier from the block's writer only.
TEST(SingleWriter, PrivateTiersTakeEveryRanksBlocksTheSharedTierOneCopy) {
  auto under = MakeHostTier(64ull << 20);
  const uint32_t world = 3;
  uint64_t shared_writes = 0, left = 0;
  Stream a(1, 8 * kBlock), b(5000, 8 * kBlock);
  for (uint32_t rank = 0; rank < world; ++rank) {
    auto m = Manager(8);
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(MakeHostTier(4 * RecordBytes(*m)));  // four records
    auto face = std::make_unique<SharedTier>(under.get());
    SharedTier* seen = face.get();
    tiers.push_back(std::move(face));
    auto store = RankStore(*m, std::move(tiers), rank, world, WritePolicy::kWriteBack);
    m->SetBlockSource(store.get());
    Serve(*m, a);
    Serve(*m, b);  // evicts a's 8 blocks: 4 stay in the host tier, 4 go on down
    ASSERT_TRUE(store->Flush().ok());
    const TieredStoreStats st = store->stats();
    EXPECT_EQ(st.demoted - seen->written.size(), 8u) << rank;  // the host tier took all eight
    for (const Hash128& k : seen->written) EXPECT_EQ(SingleWriterRank(k, world), rank);
    EXPECT_EQ(seen->written.size() + st.left_to_writer, 4u) << rank;
    const std::string text = PrometheusText(store->CollectMetrics());
    EXPECT_NE(text.find("tessera_tier_left_to_writer_total " + std::to_string(st.left_to_writer) + "\n"),
              std::string::npos)
        << text;
    shared_writes += seen->written.size();
    left += st.left_to_writer;
    m->SetBlockSource(nullptr);
  }
  EXPECT_EQ(shared_writes, 4u);  // one copy of each of the four blocks
  EXPECT_EQ(left, 4u * (world - 1));
  EXPECT_EQ(under->counters().records, 4u);
}

// Write-through with a private disk tier below the shared one: a block this rank does not write
// to the shared tier goes on to its own disk tier instead, as a refused record would; nothing is
// dropped.
TEST(SingleWriter, ASkippedBlockGoesOnToAPrivateTierBelow) {
  TempDir dir;
  auto under = MakeHostTier(64ull << 20);
  auto m = Manager(16);
  std::vector<std::unique_ptr<Tier>> tiers;
  auto face = std::make_unique<SharedTier>(under.get());
  SharedTier* seen = face.get();
  tiers.push_back(std::move(face));
  tiers.push_back(Disk(dir.path()));
  auto store = RankStore(*m, std::move(tiers), 0, 2, WritePolicy::kWriteThrough);
  m->SetBlockSource(store.get());
  Serve(*m, Stream(1, 10 * kBlock));
  ASSERT_TRUE(store->Flush().ok());
  const TieredStoreStats st = store->stats();
  const uint64_t mine = seen->written.size();
  ASSERT_GT(mine, 0u);
  ASSERT_LT(mine, 10u);  // both paths taken
  for (const Hash128& k : seen->written) EXPECT_EQ(SingleWriterRank(k, 2), 0u);
  EXPECT_EQ(st.written_through, mine);
  EXPECT_EQ(st.left_to_writer, 10 - mine);
  EXPECT_EQ(st.demoted, 10 - mine);
  EXPECT_EQ(store->tier_counters(1).records, 10 - mine);
  EXPECT_EQ(st.dropped, 0u);
  m->SetBlockSource(nullptr);
}

// A disk directory is private: DiskTier holds it under an exclusive lock, so a second rank cannot
// share it (it fails at open, naming the directory), and each rank's own directory gets every
// block whatever the group size.
TEST(SingleWriter, DiskDirectoriesArePrivateAndWrittenByEveryRank) {
  TempDir d0, d1;
  const std::vector<std::byte> key(32, std::byte{0x77});
  Stream s(1, 6 * kBlock);
  std::vector<std::unique_ptr<RequestManager>> managers;
  std::vector<std::unique_ptr<TieredStore>> stores;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    managers.push_back(Manager(8, key));
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(Disk(rank == 0 ? d0.path() : d1.path()));
    EXPECT_FALSE(tiers.back()->shared());
    stores.push_back(RankStore(*managers.back(), std::move(tiers), rank, 2));
    managers.back()->SetBlockSource(stores.back().get());
    Serve(*managers.back(), s);
    ASSERT_TRUE(stores.back()->Flush().ok());
    EXPECT_EQ(stores.back()->stats().written_through, 6u) << rank;
    EXPECT_EQ(stores.back()->stats().left_to_writer, 0u) << rank;
  }
  DiskTierOptions o;
  o.dir = d0.path();
  auto second = MakeDiskTier(o, 0);  // rank 1 on rank 0's directory
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  for (auto& m : managers) m->SetBlockSource(nullptr);
}

TEST(TieredStore, RejectsNoTiersAndUnknownPolicy) {
  auto m = Manager(4);
  auto s = TieredStore::Create(m->pool(), {}, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().field(), "tiers");
  EXPECT_FALSE(ParseWritePolicy("sometimes").ok());
  EXPECT_EQ(*ParseWritePolicy("write-through"), WritePolicy::kWriteThrough);
}

}  // namespace
}  // namespace tessera
