// The tiers (serve_tiers.cc): Redis unreachable at start, shared between servers, on a civetweb stack.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// The Redis call budget of the tests that count blocks coming back from Redis. The default (200
// ms a call) is missed by a 2.5-MB DeepSeek-V3 block under TSan with both cores busy — two busy
// loops beside these tests failed them three runs of three, "tier_blocks" 1 of 2 — and a call
// past its budget is a miss, which these tests would read as a lost block.
constexpr uint32_t kRedisTestTimeoutMs = 10000;

// ---- civetweb's worker stacks (ADR 0027) ---------------------------------------------------

// civetweb (Debian 1.15) runs handlers on threads of 102400-byte stacks, of which its own frames
// (and the thread's TLS) take 23,217 bytes by the time a handler runs: both measured with
// pthread_getattr_np and a local's address inside a handler (ADR 0027); the size is fixed when
// the library is built, no option changes it. The API's whole path — admission with
// write-through to Redis, promotion from Redis — must fit in what is left. Before the Redis
// client's 64 KiB receive buffer moved off the stack this crashed (dev and asan builds).
constexpr size_t kCivetwebStackBytes = 102400;

constexpr size_t kCivetwebOwnFrames = 24 * 1024;

void RunOnStack(size_t bytes, const std::function<void()>& f) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, bytes), 0);
  pthread_t t;
  auto* job = new std::function<void()>(f);
  ASSERT_EQ(pthread_create(
                &t, &attr,
                [](void* p) -> void* {
                  auto* fn = static_cast<std::function<void()>*>(p);
                  (*fn)();
                  delete fn;
                  return nullptr;
                },
                job),
            0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(ServeEndToEnd, UnreachableRedisIsAnErrorAtStart) {
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const int port = testing::FreePorts(1)[0];  // nothing listens there
  Server s(WriteConfig(dir,
                       "model: deepseek-v3\nhttp:\n  listen: 127.0.0.1:0\nevents:\n  enabled: false\n"
                       "tiers:\n  redis_secret_file: " +
                           secret + "\n"),
           {"--redis", "redis://127.0.0.1:" + std::to_string(port)});
  EXPECT_FALSE(s.Ready());
  EXPECT_EQ(s.Stop(false), 2);
  EXPECT_NE(s.Stderr().find("redis: cannot reach redis://127.0.0.1:"), std::string::npos);
}

TEST(ServeEndToEnd, RedisTierServesARestartedServer) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const std::string config =
      WriteConfig(dir,
                  "model: deepseek-v3\nkv_format: fp8_ds_mla\ncapacity_blocks: 64\n"
                  "http:\n  listen: 127.0.0.1:0\nevents:\n  enabled: false\n"
                  "tiers:\n  redis_timeout_ms: " +
                      std::to_string(kRedisTestTimeoutMs) + "\n  redis_secret_file: " + secret + "\n");
  const std::vector<std::string> flag = {"--redis", "redis://127.0.0.1:" + std::to_string(redis.port())};
  {
    Server s(config, flag);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    ASSERT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 130) + "}").status, 200);
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();
  }
  Server s(config, flag);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 130) + "}");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(nlohmann::json::parse(a.body)["tier_blocks"], 2);
  EXPECT_EQ(s.Stop(), 0);
}

// `tessera simulate --redis`: a second run with a cold pool hits the first run's blocks in Redis;
// an unreachable server is an error at start.
TEST(SimulateRedis, SecondRunHitsFromRedis) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  const std::string args =
      "simulate --model tiny-mla --agents 2 --independent 2 --shared-tokens 256 --unique-tokens 64 "
      "--redis redis://127.0.0.1:" +
      std::to_string(redis.port()) + " --redis-secret-file " + secret + " --format json";
  testing::CommandResult first = testing::RunTessera(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["tier_hits"], 0);
  EXPECT_GT(nlohmann::json::parse(first.out)["tier_written"].get<uint64_t>(), 0u);
  testing::CommandResult second = testing::RunTessera(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json j = nlohmann::json::parse(second.out);
  EXPECT_GT(j["tier_hits"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["tier_verify_failures"], 0);

  const int nobody = testing::FreePorts(1)[0];
  testing::CommandResult down = testing::RunTessera("simulate --redis redis://127.0.0.1:" + std::to_string(nobody) +
                                                    " --redis-secret-file " + secret);
  EXPECT_EQ(down.exit_code, 2);
  EXPECT_NE(down.err.find("redis: cannot reach"), std::string::npos);
  testing::CommandResult no_secret = testing::RunTessera("simulate --redis redis://127.0.0.1:1");
  EXPECT_EQ(no_secret.exit_code, 2);
  EXPECT_NE(no_secret.err.find("redis-secret-file"), std::string::npos);
}

// Engine bytes written through to Redis come back, byte for byte, to another server's cold pool.
TEST(ServeEngineKv, BytesComeBackFromRedisToAnotherServer) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  ServeConfig c = EngineConfig();
  c.redis = "redis://127.0.0.1:" + std::to_string(redis.port());
  c.redis_secret_file = dir.Write("secret", "0123456789abcdef0123456789abcdef\n");
  c.redis_timeout_ms = kRedisTestTimeoutMs;
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> first = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const uint64_t rb = (*first)->record_bytes();
  const uint64_t bt = (*first)->manager().block_tokens();
  const uint32_t n = static_cast<uint32_t>(2 * bt + 1);
  const std::string kv = RandomBytes(n * rb, 99);
  ASSERT_EQ((*first)->Handle("/v1/admit", Frame("{\"tokens\":" + Tokens(1, n) + "}", kv)).first, 200);
  ASSERT_TRUE((*first)->Shutdown().ok());  // write-through: already in Redis; flushed

  Result<std::unique_ptr<ServeCore>> second = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  std::pair<int, std::string> a = (*second)->Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
  ASSERT_EQ(a.first, 200) << a.second;
  const nlohmann::json aj = nlohmann::json::parse(a.second);
  EXPECT_EQ(aj["tier_blocks"], 2);
  bool binary = false;
  for (uint64_t blk = 0; blk < 2; ++blk) {
    std::pair<int, std::string> got =
        (*second)->HandleGet("/v1/requests/" + aj["request"].dump() + "/blocks/" + std::to_string(blk), &binary);
    ASSERT_EQ(got.first, 200) << got.second;
    EXPECT_TRUE(got.second == kv.substr(blk * bt * rb, bt * rb)) << "block " << blk;
  }
}

TEST(ServeStack, RedisWriteAndPromoteFitOnACivetwebWorkerStack) {
  TESSERA_REQUIRE_REDIS_SERVER();
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  TempDir dir;
  ServeConfig c;
  c.model = "deepseek-v3";
  c.kv_format = "fp8_ds_mla";
  c.capacity_blocks = 16;
  c.events_enabled = false;
  c.redis = "redis://127.0.0.1:" + std::to_string(redis.port());
  c.redis_secret_file = dir.Write("secret", "0123456789abcdef0123456789abcdef\n");
  c.redis_timeout_ms = kRedisTestTimeoutMs;
  const std::string prompt = "{\"tokens\":" + Tokens(1, 130) + "}";
  std::vector<std::string> warnings;
  for (int round = 0; round < 2; ++round) {  // 0: written through to Redis; 1: a cold pool promotes
    Result<std::unique_ptr<ServeCore>> core = ServeCore::Create(c, &warnings);
    ASSERT_TRUE(core.ok()) << core.status().ToString();
    std::pair<int, std::string> r;
    RunOnStack(kCivetwebStackBytes - kCivetwebOwnFrames, [&] { r = (*core)->Handle("/v1/admit", prompt); });
    ASSERT_EQ(r.first, 200) << r.second;
    EXPECT_EQ(nlohmann::json::parse(r.second)["tier_blocks"], round == 0 ? 0 : 2) << r.second;
    RunOnStack(kCivetwebStackBytes - kCivetwebOwnFrames, [&] { ASSERT_TRUE((*core)->Shutdown().ok()); });
  }
}

}  // namespace
}  // namespace tessera
