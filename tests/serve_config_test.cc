// `tessera serve` configuration (serve_config.cc): keys, environment overrides, bad input named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// ---- Configuration -------------------------------------------------------------------------

TEST(ServeConfig, KeysAndEnvironmentOverrides) {
  Result<ServeConfig> c = ParseServeConfig(
      "model: deepseek-v3\ncapacity_blocks: 64\nhttp:\n  listen: 127.0.0.1:0\n  threads: 2\n"
      "events:\n  enabled: false\ntiers:\n  disk_dir: /tmp/x\n  write: write-back\n"
      "  redis_cluster: [a:1, b:2]\n  redis_secret_file: /s\n",
      {{"TESSERA_SERVE_CAPACITY_BLOCKS", "128"}, {"TESSERA_SERVE_HTTP_THREADS", "3"}, {"PATH", "/bin"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->capacity_blocks, 128u);  // the environment wins
  EXPECT_EQ(c->http_threads, 3u);
  EXPECT_EQ(c->http_listen, "127.0.0.1:0");
  EXPECT_FALSE(c->events_enabled);
  EXPECT_EQ(c->tier_write, WritePolicy::kWriteBack);
  EXPECT_EQ(c->redis_cluster, (std::vector<std::string>{"a:1", "b:2"}));
}

TEST(ServeConfig, BadInputNamesTheKey) {
  auto field = [](std::string_view yaml, std::map<std::string, std::string> env = {}) {
    Result<ServeConfig> c = ParseServeConfig(yaml, env);
    return c.ok() ? std::string("ok") : c.status().field();
  };
  EXPECT_EQ(field("modle: deepseek-v3\n"), "modle");
  EXPECT_EQ(field("http:\n  lisen: 1\n"), "http.lisen");
  EXPECT_EQ(field("bogus:\n  a: 1\n"), "bogus");
  EXPECT_EQ(field("model: [unclosed\n"), "config");
  EXPECT_EQ(field("- a\n- b\n"), "config");
  EXPECT_EQ(field("capacity_blocks: -3\n"), "capacity_blocks");
  EXPECT_EQ(field("capacity_blocks: 99999999999\n"), "capacity_blocks");
  EXPECT_EQ(field("events:\n  enabled: maybe\n"), "events.enabled");
  EXPECT_EQ(field("http:\n  max_body_bytes: 0\n"), "http.max_body_bytes");
  EXPECT_EQ(field("tiers:\n  redis: redis://h:1\n"), "tiers.redis_secret_file");
  EXPECT_EQ(field("model: a\nmodel: b\n"), "model");  // given twice
  EXPECT_EQ(field("", {{"TESSERA_SERVE_HTTP_LISEN", "1"}}), "http.lisen");
  Result<ServeConfig> c = ParseServeConfig("", {{"TESSERA_SERVE_MAX_REQUESTS", "x"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("TESSERA_SERVE_MAX_REQUESTS"), std::string::npos);
}

// Issue 27.6: a second YAML document is refused naming the config, never dropped unread (it
// could hold the token file); issue 27's low items on addresses: a bare port, a port past 65535.
TEST(ServeConfig, OneDocumentAndExplicitAddresses) {
  auto field = [](std::string_view yaml) {
    Result<ServeConfig> c = ParseServeConfig(yaml, {});
    return c.ok() ? std::string("ok") : c.status().field();
  };
  Result<ServeConfig> two = ParseServeConfig("model: tiny-mla\n---\nhttp:\n  token_file: /etc/t\n", {});
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().field(), "config");
  EXPECT_NE(two.status().message().find("second YAML document at line 3"), std::string::npos)
      << two.status().ToString();
  EXPECT_EQ(field("model: tiny-mla\n---\n"), "config");  // even an empty second document
  EXPECT_EQ(field("---\nmodel: tiny-mla\n"), "ok");      // one document, its marker first
  EXPECT_EQ(field("http:\n  listen: 0\n"), "http.listen");
  EXPECT_EQ(field("http:\n  listen: 8080\n"), "http.listen");
  EXPECT_EQ(field("http:\n  listen: 127.0.0.1:65536\n"), "http.listen");
  EXPECT_EQ(field("http:\n  listen: 0.0.0.0:8080\n"), "ok");
  EXPECT_EQ(field("http:\n  listen: \"[::1]:0\"\n"), "ok");
  EXPECT_EQ(field("events:\n  endpoint: tcp://127.0.0.1:99999\n"), "events.endpoint");
  EXPECT_EQ(field("events:\n  endpoint: tcp://127.0.0.1:*\n"), "ok");
  EXPECT_EQ(field("http:\n  header_timeout_ms: 5\n"), "http.header_timeout_ms");
  EXPECT_EQ(field("http:\n  max_connections_per_client: 0\n"), "http.max_connections_per_client");
  Result<ServeConfig> env = ParseServeConfig("", {{"TESSERA_SERVE_HTTP_LISTEN", "0"}});
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().field(), "http.listen");
}

TEST(ServeConfig, RedisAddresses) {
  Result<std::pair<std::string, int>> a = ParseRedisAddress("redis://10.0.0.1:6380", "redis");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "10.0.0.1");
  EXPECT_EQ(a->second, 6380);
  EXPECT_FALSE(ParseRedisAddress("redis://h", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h:0", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h:70000", "redis").ok());
  EXPECT_FALSE(ParseRedisAddress("h;rm -rf:1", "redis").ok());
}

TEST(ServeConfig, EngineWindowAndTokenKeys) {
  Result<ServeConfig> c =
      ParseServeConfig("kv_source: engine\nwindow_strategy: snapshot\nhttp:\n  token_file: /t\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->kv_engine);
  EXPECT_EQ(c->window_strategy, SwaStrategy::kSnapshot);
  EXPECT_EQ(c->http_token_file, "/t");
  c = ParseServeConfig("", {{"TESSERA_SERVE_KV_SOURCE", "engine"}, {"TESSERA_SERVE_HTTP_TOKEN_FILE", "/u"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->kv_engine);
  EXPECT_EQ(c->http_token_file, "/u");
  EXPECT_FALSE(ParseServeConfig("", {}).value().kv_engine);  // synthetic by default
  auto field = [](std::string_view yaml) {
    Result<ServeConfig> r = ParseServeConfig(yaml, {});
    return r.ok() ? std::string("ok") : r.status().field();
  };
  EXPECT_EQ(field("kv_source: gpu\n"), "kv_source");
  EXPECT_EQ(field("window_strategy: keep\n"), "window_strategy");
  EXPECT_EQ(field("kv_source: engine\npool: unbacked\n"), "kv_source");
}

// tiers.redis_namespace replaces "tessera" in RedisNamespace's "tessera:<model>:<format>:0": a
// ':' would make two configurations' namespaces meet, a brace would split Redis Cluster's hash
// tag; both, an empty prefix and one past 64 bytes are refused naming the key (all were taken).
TEST(ServeConfig, RedisNamespaceIsPlain) {
  Result<ServeConfig> c = ParseServeConfig("tiers:\n  redis_namespace: fleet-1.a_b\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->redis_namespace, "fleet-1.a_b");
  for (const char* bad : {"tiers:\n  redis_namespace: \"a:b\"\n", "tiers:\n  redis_namespace: \"{a}\"\n",
                          "tiers:\n  redis_namespace: \"\"\n", "tiers:\n  redis_namespace: \"a b\"\n"}) {
    c = ParseServeConfig(bad, {});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().field(), "tiers.redis_namespace") << bad;
  }
  c = ParseServeConfig("", {{"TESSERA_SERVE_TIERS_REDIS_NAMESPACE", std::string(65, 'x')}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().field(), "tiers.redis_namespace");
}
}  // namespace
}  // namespace tessera
