#include "tessera/redis_tier.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <thread>

#include "test_support.h"

namespace tessera {
namespace {

using testing::RedisServer;

bool HaveRedis() { return testing::HaveRedisServer(); }

DiskRecord Rec(uint64_t i, size_t n = 3000) {
  std::vector<std::byte> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = std::byte{static_cast<uint8_t>((i * 31 + k) & 0xff)};
  return DiskRecord{Hash128{i + 1, i * 7}, static_cast<uint16_t>(i % 5), p};
}

RedisTierOptions Opts(int port, const std::string& ns = "tessera:test:fmt:0") {
  RedisTierOptions o;
  o.port = port;
  o.key_namespace = ns;
  o.reconnect_interval_ms = 20;
  return o;
}

TEST(RedisTier, PipelinedBatchRoundTripAgainstARealServer) {
  ASSERT_TRUE(HaveRedis()) << "redis-server is not installed: run scripts/install-deps.sh";
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTier t(Opts(server.port()));
  std::vector<DiskRecord> batch;
  for (uint64_t i = 0; i < 50; ++i) batch.push_back(Rec(i));
  ASSERT_TRUE(t.PutBatch(batch).ok());
  std::vector<Hash128> keys;
  for (uint64_t i = 0; i < 60; ++i) keys.push_back(Rec(i).key);
  auto got = t.GetBatch(keys);
  for (uint64_t i = 0; i < 60; ++i) {
    if (i < 50) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(got[i]->payload, Rec(i).payload);
      EXPECT_EQ(got[i]->format_id, i % 5);
    } else {
      EXPECT_FALSE(got[i].has_value());
    }
  }
  EXPECT_EQ(t.stats().hits, 50u);
  EXPECT_EQ(t.stats().misses, 10u);
}

TEST(RedisTier, NamespacesIsolateTenants) {
  ASSERT_TRUE(HaveRedis());
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTier a(Opts(server.port(), RedisNamespace("deepseek-v3", "fp8_ds_mla", 1)));
  RedisTier b(Opts(server.port(), RedisNamespace("deepseek-v3", "fp8_ds_mla", 2)));
  ASSERT_TRUE(a.PutBatch(std::vector<DiskRecord>{Rec(1)}).ok());
  std::vector<Hash128> k{Rec(1).key};
  EXPECT_TRUE(a.GetBatch(k)[0].has_value());
  EXPECT_FALSE(b.GetBatch(k)[0].has_value());
}

TEST(RedisTier, ACorruptedValueIsAMissNeverWrongBytes) {
  ASSERT_TRUE(HaveRedis());
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTierOptions o = Opts(server.port());
  RedisTier t(o);
  ASSERT_TRUE(t.PutBatch(std::vector<DiskRecord>{Rec(1), Rec(2)}).ok());
  // Overwrite byte 100 of record 1's value behind the tier's back.
  redisContext* c = redisConnect("127.0.0.1", server.port());
  std::string key = o.key_namespace + ":" + Rec(1).key.Hex();
  freeReplyObject(redisCommand(c, "SETRANGE %s 100 %s", key.c_str(), "Z"));
  std::string key2 = o.key_namespace + ":" + Rec(2).key.Hex();
  freeReplyObject(redisCommand(c, "SET %s %s", key2.c_str(), "short"));
  redisFree(c);
  std::vector<Hash128> keys{Rec(1).key, Rec(2).key};
  auto got = t.GetBatch(keys);
  EXPECT_FALSE(got[0].has_value());
  EXPECT_FALSE(got[1].has_value());
  EXPECT_EQ(t.stats().verify_failures, 2u);
}

TEST(RedisTier, KilledAndRestartedServerDegradesToMissesAndRecovers) {
  ASSERT_TRUE(HaveRedis());
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTier t(Opts(server.port()));
  ASSERT_TRUE(t.PutBatch(std::vector<DiskRecord>{Rec(1)}).ok());
  std::vector<Hash128> k{Rec(1).key};
  ASSERT_TRUE(t.GetBatch(k)[0].has_value());
  server.Stop();
  // Down: misses, not errors, for reads; puts report the outage.
  EXPECT_FALSE(t.GetBatch(k)[0].has_value());
  EXPECT_FALSE(t.PutBatch(std::vector<DiskRecord>{Rec(2)}).ok());
  EXPECT_FALSE(t.stats().connected);
  EXPECT_GT(t.stats().errors, 0u);
  ASSERT_TRUE(server.Start());  // same port, empty (no persistence)
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(t.GetBatch(k)[0].has_value());  // the data died with the server: a miss, not wrong data
  EXPECT_EQ(t.stats().recoveries, 1u);
  ASSERT_TRUE(t.PutBatch(std::vector<DiskRecord>{Rec(3)}).ok());
  std::vector<Hash128> k3{Rec(3).key};
  EXPECT_TRUE(t.GetBatch(k3)[0].has_value());
}

// A large batch to a server killed while the tier still holds its connection: hiredis's second
// write would raise SIGPIPE, which would end the process. The tier reports an error instead.
TEST(RedisTier, LargeBatchToAKilledServerIsAnErrorNotSigpipe) {
  ASSERT_TRUE(HaveRedis());
  RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisTier t(Opts(server.port()));
  std::vector<DiskRecord> batch;
  for (uint64_t i = 0; i < 200; ++i) batch.push_back(Rec(i, 20000));
  ASSERT_TRUE(t.PutBatch(batch).ok());
  server.Stop();
  EXPECT_FALSE(t.PutBatch(batch).ok());  // reaching this line at all is the test
  EXPECT_GT(t.stats().errors, 0u);
}

TEST(RedisTier, UnreachableFromTheStartIsMissOnly) {
  RedisTier t(Opts(RedisServer::FreePort()));
  std::vector<Hash128> k{Rec(1).key};
  EXPECT_FALSE(t.GetBatch(k)[0].has_value());
  Status st = t.PutBatch(std::vector<DiskRecord>{Rec(1)});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.field(), "redis");
  EXPECT_EQ(t.stats().recoveries, 0u);
}

}  // namespace
}  // namespace tessera
