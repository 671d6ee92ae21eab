#include "tessera/tier_adapters.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_support.h"

namespace tessera {
namespace {

using testing::RedisServer;
using testing::TempDir;

TierRecord Rec(uint64_t i, size_t n = 1000) {
  std::vector<std::byte> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = std::byte{static_cast<uint8_t>((i * 31 + k) & 0xff)};
  return TierRecord{Hash128{i + 1, i * 7}, static_cast<uint16_t>(i % 5), p};
}

Status Put(Tier& t, const std::vector<TierRecord>& records) {
  std::vector<const TierRecord*> ptrs;
  for (const TierRecord& r : records) ptrs.push_back(&r);
  return t.PutBatch(ptrs);
}

std::optional<TierRecord> Get(Tier& t, const Hash128& key) { return t.GetBatch(std::span(&key, 1))[0]; }

// Collects what a tier hands its eviction listener.
struct Evicted {
  explicit Evicted(Tier& t) {
    t.SetEvictionListener([this](const TierRecord& r) { records.push_back(r); });
  }
  std::vector<TierRecord> records;
};

std::unique_ptr<Tier> Disk(const std::string& dir, uint64_t capacity) {
  DiskTierOptions o;
  o.dir = dir;
  auto t = MakeDiskTier(o, capacity);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(HostTierAdapter, EvictsLeastRecentToTheListenerWithinCapacity) {
  std::unique_ptr<Tier> host = MakeHostTier(2500);
  EXPECT_EQ(host->name(), "host");
  EXPECT_TRUE(host->in_memory());
  EXPECT_FALSE(host->persistent());
  EXPECT_FALSE(host->shared());  // the process's own memory: every rank writes it
  Evicted evicted(*host);
  ASSERT_TRUE(Put(*host, {Rec(0), Rec(1)}).ok());
  ASSERT_TRUE(Get(*host, Rec(0).key).has_value());  // 0 is now the most recent
  ASSERT_TRUE(Put(*host, {Rec(2)}).ok());
  ASSERT_EQ(evicted.records.size(), 1u);
  EXPECT_EQ(evicted.records[0].key, Rec(1).key);
  EXPECT_EQ(evicted.records[0].format_id, Rec(1).format_id);
  EXPECT_EQ(evicted.records[0].payload, Rec(1).payload);
  EXPECT_EQ(host->Keys(), (std::vector<Hash128>{Rec(0).key, Rec(2).key}));
  std::optional<TierRecord> got = Get(*host, Rec(2).key);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->payload, Rec(2).payload);
  EXPECT_EQ(got->format_id, Rec(2).format_id);
  const TierCounters c = host->counters();
  EXPECT_EQ(c.records, 2u);
  EXPECT_EQ(c.bytes, 2000u);
  EXPECT_EQ(c.capacity_bytes, 2500u);
  EXPECT_EQ(c.evictions, 1u);
}

TEST(HostTierAdapter, RefusesARecordLargerThanItself) {
  std::unique_ptr<Tier> host = MakeHostTier(500);
  Evicted evicted(*host);
  EXPECT_FALSE(Put(*host, {Rec(0)}).ok());
  EXPECT_TRUE(evicted.records.empty());
  EXPECT_EQ(host->counters().records, 0u);
}

TEST(HostTierAdapter, QuarantineAndEraseTakeRecordsOut) {
  std::unique_ptr<Tier> host = MakeHostTier(10000);
  ASSERT_TRUE(Put(*host, {Rec(0), Rec(1), Rec(2)}).ok());
  ASSERT_TRUE(host->Quarantine(Rec(0).key, "test").ok());
  const Hash128 one = Rec(1).key;
  ASSERT_TRUE(host->EraseBatch(std::span(&one, 1)).ok());
  const std::vector<Hash128> keys = {Rec(0).key, Rec(1).key, Rec(2).key};
  EXPECT_EQ(host->ContainsBatch(keys), (std::vector<bool>{false, false, true}));
}

TEST(DiskTierAdapter, EvictsLeastRecentToTheListenerWithinCapacity) {
  TempDir dir;
  std::unique_ptr<Tier> disk = Disk(dir.path(), 2500);
  EXPECT_EQ(disk->name(), "disk");
  EXPECT_FALSE(disk->in_memory());
  EXPECT_TRUE(disk->persistent());
  EXPECT_FALSE(disk->shared());  // one process holds a directory (exclusive flock)
  Evicted evicted(*disk);
  ASSERT_TRUE(Put(*disk, {Rec(0), Rec(1)}).ok());
  ASSERT_TRUE(Get(*disk, Rec(0).key).has_value());  // 0 is now the most recent
  ASSERT_TRUE(Put(*disk, {Rec(2)}).ok());
  ASSERT_EQ(evicted.records.size(), 1u);
  EXPECT_EQ(evicted.records[0].key, Rec(1).key);
  EXPECT_EQ(evicted.records[0].payload, Rec(1).payload);
  EXPECT_EQ(disk->Keys(), (std::vector<Hash128>{Rec(0).key, Rec(2).key}));
  const TierCounters c = disk->counters();
  EXPECT_EQ(c.records, 2u);
  EXPECT_EQ(c.bytes, 2000u);
  EXPECT_EQ(c.evictions, 1u);
  EXPECT_FALSE(Get(*disk, Rec(1).key).has_value());  // erased from the directory, not only the LRU
}

// A batch larger than the room left: its oldest records go on down at once.
TEST(DiskTierAdapter, BatchLargerThanTheRoomLeftPassesItsOldestDown) {
  TempDir dir;
  std::unique_ptr<Tier> disk = Disk(dir.path(), 2500);
  Evicted evicted(*disk);
  ASSERT_TRUE(Put(*disk, {Rec(0), Rec(1), Rec(2)}).ok());
  ASSERT_EQ(evicted.records.size(), 1u);
  EXPECT_EQ(evicted.records[0].key, Rec(0).key);
  EXPECT_LE(disk->counters().bytes, 2500u);
}

TEST(DiskTierAdapter, RecordLargerThanTheTierIsPassedOnNotRefused) {
  TempDir dir;
  std::unique_ptr<Tier> disk = Disk(dir.path(), 500);
  Evicted evicted(*disk);
  EXPECT_TRUE(Put(*disk, {Rec(0)}).ok());
  ASSERT_EQ(evicted.records.size(), 1u);
  EXPECT_EQ(evicted.records[0].key, Rec(0).key);
  EXPECT_EQ(disk->counters().records, 0u);
}

// Evictions leave dead records behind; the directory is compacted as they outgrow what it
// holds, so a tier under steady churn stays bounded on disk.
TEST(DiskTierAdapter, ChurnIsCompactedAway) {
  TempDir dir;
  DiskTierOptions o;
  o.dir = dir.path();
  o.segment_bytes = 64 << 10;
  auto made = MakeDiskTier(o, 10000);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<Tier> disk = std::move(*made);
  for (uint64_t i = 0; i < 500; ++i) ASSERT_TRUE(Put(*disk, {Rec(i)}).ok());
  EXPECT_EQ(disk->counters().records, 10u);
  EXPECT_EQ(disk->counters().evictions, 490u);
  uint64_t on_disk = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().filename().string().rfind("seg-", 0) == 0) on_disk += f.file_size();
  }
  // 500 records of 8 KiB (a header slot and a padded payload) were written: 4 MB without
  // compaction. Bounded by the live records, the dead allowance and one open segment.
  EXPECT_LE(on_disk, 10 * 8192 + 2 * (64 << 10) + 2 * 8192);
  for (uint64_t i = 490; i < 500; ++i) {
    std::optional<TierRecord> r = Get(*disk, Rec(i).key);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->payload, Rec(i).payload);
  }
  disk.reset();
  made = MakeDiskTier(o, 10000);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->counters().records, 10u);
}

// The LRU of a reopened directory starts from the records' write order.
TEST(DiskTierAdapter, ReopenSeedsTheLruOldestFirst) {
  TempDir dir;
  {
    std::unique_ptr<Tier> disk = Disk(dir.path(), 0);
    ASSERT_TRUE(Put(*disk, {Rec(0)}).ok());
    ASSERT_TRUE(Put(*disk, {Rec(1)}).ok());
    ASSERT_TRUE(Put(*disk, {Rec(2)}).ok());
  }
  std::unique_ptr<Tier> disk = Disk(dir.path(), 0);
  EXPECT_EQ(disk->Keys(), (std::vector<Hash128>{Rec(0).key, Rec(1).key, Rec(2).key}));
  EXPECT_EQ(disk->counters().records, 3u);
  ASSERT_TRUE(disk->Quarantine(Rec(1).key, "failed a check above the tier").ok());
  EXPECT_EQ(disk->Keys(), (std::vector<Hash128>{Rec(0).key, Rec(2).key}));
  EXPECT_FALSE(Get(*disk, Rec(1).key).has_value());
}

TEST(TierAdapters, BadOptionsNameTheField) {
  DiskTierOptions none;
  Result<std::unique_ptr<Tier>> disk = MakeDiskTier(none, 0);
  ASSERT_FALSE(disk.ok());
  EXPECT_EQ(disk.status().field(), "dir");
  RedisTierOptions no_secret;
  Result<std::unique_ptr<Tier>> redis = MakeRedisTier(no_secret);
  ASSERT_FALSE(redis.ok());
#if TESSERA_HAVE_REDIS
  EXPECT_EQ(redis.status().field(), "secret");
#else
  EXPECT_EQ(redis.status().field(), "redis");  // configured without Redis
#endif
}

#if TESSERA_HAVE_REDIS
// ContainsBatch fetches the values in one round trip; the GetBatch that follows is served from
// them, and a key not asked about goes to the server.
TEST(RedisAdapter, ContainsThenGetServesVerifiedRecords) {
  TESSERA_REQUIRE_REDIS_SERVER();
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTierOptions o;
  o.port = server.port();
  o.secret = std::vector<std::byte>(32, std::byte{0x42});
  Result<std::unique_ptr<Tier>> made = MakeRedisTier(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Tier& redis = **made;
  EXPECT_EQ(redis.name(), "redis");
  EXPECT_FALSE(redis.in_memory());
  EXPECT_TRUE(redis.persistent());
  EXPECT_TRUE(redis.shared());  // one writer per block in a tensor-parallel group (ADR 0023)
  ASSERT_TRUE(Put(redis, {Rec(0), Rec(1)}).ok());
  const std::vector<Hash128> keys = {Rec(0).key, Rec(1).key, Rec(2).key};
  EXPECT_EQ(redis.ContainsBatch(keys), (std::vector<bool>{true, true, false}));
  std::vector<std::optional<TierRecord>> got = redis.GetBatch(keys);
  ASSERT_TRUE(got[0].has_value() && got[1].has_value());
  EXPECT_EQ(got[0]->payload, Rec(0).payload);
  EXPECT_EQ(got[1]->format_id, Rec(1).format_id);
  EXPECT_FALSE(got[2].has_value());
  ASSERT_TRUE(redis.Quarantine(Rec(0).key, "failed a check above the tier").ok());
  EXPECT_FALSE(Get(redis, Rec(0).key).has_value());
  EXPECT_TRUE(Get(redis, Rec(1).key).has_value());
  EXPECT_TRUE(redis.Keys().empty());  // the server's keys are not tracked here
  EXPECT_EQ(redis.counters().records, 2u);
  EXPECT_EQ(redis.counters().bytes, Rec(0).payload.size() + Rec(1).payload.size());  // written here
}
#endif  // TESSERA_HAVE_REDIS

}  // namespace
}  // namespace tessera
