// `tessera serve` over HTTP end to end (serve_http.cc): the binary started by the test on free ports,
// scraped over HTTP, events received by a ZeroMQ SUB socket, SIGTERM and a restart from disk.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

TEST(ServeEndToEnd, MetricsEventsApiAndRestartFromDisk) {
  TempDir dir;
  const std::string config = WriteConfig(dir, BaseConfig(dir));
  uint64_t first_request = 0;
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    EXPECT_EQ(Http(s.port(), "GET", "/health").body, "ok\n");

    zmq::context_t ctx;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(s.events());
    // PUB drops what it sends before the subscription arrives: admit throwaway prompts until
    // one's events come through, then start counting.
    Received warm;
    for (uint32_t i = 0; i < 50 && warm.tags.empty(); ++i) {
      HttpReply r = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1000000 + 1000 * i, 65) + "}");
      ASSERT_EQ(r.status, 200) << r.body;
      const uint64_t id = nlohmann::json::parse(r.body)["request"].get<uint64_t>();
      ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + std::to_string(id) + "}").status, 200);
      Drain(sub, 100, &warm);
    }
    ASSERT_FALSE(warm.tags.empty()) << "no event reached the subscriber";
    EXPECT_EQ(warm.rank, 2u);

    // A prompt of three whole blocks and 10 tokens: one BlockStored of three hashes.
    HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + ",\"tenant\":0}");
    ASSERT_EQ(a.status, 200) << a.body;
    nlohmann::json aj = nlohmann::json::parse(a.body);
    EXPECT_EQ(aj["cached_tokens"], 0);
    EXPECT_EQ(aj["block_table"].size(), 4u);
    first_request = aj["request"].get<uint64_t>();
    // Decode: 54 more tokens fill the fourth block.
    HttpReply st = Http(
        s.port(), "POST", "/v1/step",
        "{\"requests\":[" + std::to_string(first_request) + "],\"counts\":[54],\"tokens\":" + Tokens(5000, 54) + "}");
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_EQ(nlohmann::json::parse(st.body)["codes"][0], "ok");
    // Received until the two expected events are in (issue 25.8: no fixed drain time), then the
    // whole of what arrived is compared.
    Received got;
    Drain(sub, 30000, &got, 2);
    ASSERT_EQ(got.tags, (std::vector<std::string>{"BlockStored", "BlockStored"}));
    EXPECT_EQ(got.stored_hashes.size(), 4u);
    EXPECT_GT(got.last_seq, warm.last_seq);

    // Bad input is refused, naming the field; nothing changes.
    HttpReply bad = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":[1,-2]}");
    EXPECT_EQ(bad.status, 400);
    EXPECT_EQ(nlohmann::json::parse(bad.body)["field"], "tokens");
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":[1],\"tenatn\":1}").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", "not json").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", std::string(70000, ' ')).status, 413);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":999}").status, 400);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/step", "{\"requests\":[0],\"counts\":[2],\"tokens\":[1]}").status, 400);
    EXPECT_EQ(Http(s.port(), "GET", "/v1/admit").status, 405);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/reset", "{}").status, 409);  // a request is live

    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_block_seals_total "), std::string::npos);
    EXPECT_NE(metrics.find("# TYPE tessera_serve_step_seconds histogram"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_admit_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_step_seconds_count 1\n"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_promote_seconds_count"), std::string::npos);
    EXPECT_NE(metrics.find("tessera_serve_http_errors_total 8\n"), std::string::npos) << metrics;
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();  // SIGTERM: checkpoint (write-back: nothing on disk before)
  }
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    // A cold pool: the four blocks come back from the disk tier, verified.
    HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}");
    ASSERT_EQ(a.status, 200) << a.body;
    nlohmann::json aj = nlohmann::json::parse(a.body);
    EXPECT_EQ(aj["tier_blocks"], 3);
    EXPECT_EQ(aj["cached_tokens"], 192);
    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_serve_promote_seconds_count 1\n"), std::string::npos) << metrics;
    ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + aj["request"].dump() + "}").status, 200);
    EXPECT_EQ(Http(s.port(), "POST", "/v1/reset", "{}").status, 200);
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();
  }
}

TEST(ServeEndToEnd, WithoutACheckpointWriteBackLosesTheBlocks) {
  // The control for the restart above: killed without SIGTERM, a write-back server had written
  // nothing to disk, so a restart finds nothing.
  TempDir dir;
  const std::string config = WriteConfig(dir, BaseConfig(dir));
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    ASSERT_EQ(Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}").status, 200);
  }  // the destructor: SIGKILL
  Server s(config);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, 202) + "}");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(nlohmann::json::parse(a.body)["tier_blocks"], 0);
  EXPECT_EQ(s.Stop(), 0);
}

TEST(ServeEndToEnd, BadConfigurationExitsTwoNamingIt) {
  TempDir dir;
  {
    Server s(WriteConfig(dir, "model: deepseek-v3\nhttp:\n  listen: [1\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
    EXPECT_NE(s.Stderr().find("config: malformed YAML"), std::string::npos);
  }
  {
    Server s(WriteConfig(dir, "model: deepseek-v3\ncapacity_blockz: 3\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
    EXPECT_NE(s.Stderr().find("capacity_blockz: unknown key"), std::string::npos);
  }
  {
    Server s(WriteConfig(dir, "model: no-such-model\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2);
  }
}

// Over real HTTP: bytes pushed by one server come back from a prefix hit, and from the disk tier
// after SIGTERM and a restart (the blocks promoted, verified, and read back byte for byte).
TEST(ServeEndToEnd, EngineKvComesBackFromDiskAfterARestart) {
  TempDir dir;
  const std::string config = WriteConfig(dir,
                                         "model: tiny-mla\nkv_source: engine\ncapacity_blocks: 32\n"
                                         "http:\n  listen: 127.0.0.1:0\n  max_body_bytes: 4MiB\n"
                                         "events:\n  enabled: false\ntiers:\n  disk_dir: " +
                                             dir.path() + "/disk\n  write: write-back\n");
  std::string kv;
  uint64_t rb = 0, bt = 0;
  const uint32_t n = 3 * 64 + 10;
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    const nlohmann::json layout = nlohmann::json::parse(Http(s.port(), "GET", "/v1/layout").body);
    rb = layout["record_bytes"].get<uint64_t>();
    bt = layout["block_tokens"].get<uint64_t>();
    ASSERT_EQ(bt, 64u);
    kv = RandomBytes(n * rb, 7);
    HttpReply a = Http(s.port(), "POST", "/v1/admit", Frame("{\"tokens\":" + Tokens(1, n) + "}", kv));
    ASSERT_EQ(a.status, 200) << a.body;
    const uint64_t id = nlohmann::json::parse(a.body)["request"].get<uint64_t>();
    HttpReply bad = Http(s.port(), "POST", "/v1/admit", Frame("{\"tokens\":" + Tokens(1, n) + "}", kv + "x"));
    EXPECT_EQ(bad.status, 400);
    EXPECT_EQ(nlohmann::json::parse(bad.body)["field"], "records");
    ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + std::to_string(id) + "}").status, 200);
    HttpReply b = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
    ASSERT_EQ(b.status, 200) << b.body;
    const nlohmann::json bj = nlohmann::json::parse(b.body);
    EXPECT_EQ(bj["cached_tokens"], 3 * bt);
    for (uint64_t blk = 0; blk < 3; ++blk) {
      HttpReply got = Http(s.port(), "GET", "/v1/requests/" + bj["request"].dump() + "/blocks/" + std::to_string(blk));
      ASSERT_EQ(got.status, 200) << got.body;
      EXPECT_TRUE(got.body == kv.substr(blk * bt * rb, bt * rb)) << "block " << blk;
    }
    // The engine's bytes in and out: one framed admit written whole, three blocks read.
    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_serve_kv_bytes_written_total " + std::to_string(n * rb) + "\n"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("tessera_serve_kv_bytes_read_total " + std::to_string(3 * bt * rb) + "\n"),
              std::string::npos)
        << metrics;
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();  // SIGTERM: the checkpoint writes the blocks to disk
  }
  Server s(config);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
  ASSERT_EQ(a.status, 200) << a.body;
  const nlohmann::json aj = nlohmann::json::parse(a.body);
  EXPECT_EQ(aj["tier_blocks"], 3);
  HttpReply batch = Http(s.port(), "GET", "/v1/requests/" + aj["request"].dump() + "/blocks/0?count=3");
  ASSERT_EQ(batch.status, 200) << batch.body;
  EXPECT_TRUE(batch.body == kv.substr(0, 3 * bt * rb));
  for (uint64_t blk = 0; blk < 3; ++blk) {
    HttpReply got = Http(s.port(), "GET", "/v1/requests/" + aj["request"].dump() + "/blocks/" + std::to_string(blk));
    ASSERT_EQ(got.status, 200) << got.body;
    ASSERT_EQ(got.body.size(), bt * rb);
    EXPECT_TRUE(got.body == kv.substr(blk * bt * rb, bt * rb)) << "block " << blk << " after the restart";
  }
  EXPECT_EQ(s.Stop(), 0) << s.Stderr();
}

// Over HTTP, with events: a V4 server admits, steps, frees and publishes BlockStored.
TEST(ServeEndToEnd, DeepSeekV4ServesWithEvents) {
  TempDir dir;
  const std::string config =
      WriteConfig(dir,
                  "model: tiny-v4\ncapacity_blocks: 32\nmax_requests: 8\nwindow_strategy: snapshot\n"
                  "http:\n  listen: 127.0.0.1:0\nevents:\n  endpoint: tcp://127.0.0.1:*\n  topic: kv\n"
                  "tiers:\n  disk_dir: " +
                      dir.path() + "/disk\n");
  {
    Server s(config);
    ASSERT_TRUE(s.Ready()) << s.Stderr();
    zmq::context_t ctx;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(s.events());
    Received got;
    for (uint32_t i = 0; i < 50 && got.tags.empty(); ++i) {
      HttpReply r = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1000000 + 1000 * i, 300) + "}");
      ASSERT_EQ(r.status, 200) << r.body;
      const nlohmann::json j = nlohmann::json::parse(r.body);
      HttpReply st = Http(s.port(), "POST", "/v1/step",
                          "{\"requests\":[" + j["request"].dump() + "],\"counts\":[1],\"tokens\":[5]}");
      ASSERT_EQ(st.status, 200) << st.body;
      EXPECT_EQ(nlohmann::json::parse(st.body)["codes"][0], "ok");
      ASSERT_EQ(Http(s.port(), "POST", "/v1/free", "{\"request\":" + j["request"].dump() + "}").status, 200);
      Drain(sub, 100, &got);
    }
    ASSERT_FALSE(got.tags.empty()) << "no event reached the subscriber";
    EXPECT_EQ(got.tags[0], "BlockStored");
    const std::string metrics = Http(s.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("tessera_block_seals_total "), std::string::npos);
    EXPECT_EQ(s.Stop(), 0) << s.Stderr();
  }
  // Restarted: the first prompt's blocks come back from disk with their window state.
  Server s(config);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  HttpReply a = Http(s.port(), "POST", "/v1/admit", "{\"tokens\":" + Tokens(1000000, 300) + "}");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_GT(nlohmann::json::parse(a.body)["tier_blocks"].get<uint64_t>(), 0u) << a.body;
  EXPECT_EQ(s.Stop(), 0) << s.Stderr();
}

}  // namespace
}  // namespace tessera
