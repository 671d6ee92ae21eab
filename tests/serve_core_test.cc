// The core (serve_core.cc, serve_api.cc): ids and tenants, engine KV per model, DeepSeek-V4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// Issue 27.2 over the API: a freed id whose slot another tenant's request reuses, and a live id
// of another tenant, are refused by step, free and block reads, and change nothing.
TEST(ServeIds, StaleAndForeignIdsAreRefusedAndChangeNothing) {
  ServeConfig c;
  c.model = "tiny-mla";
  c.capacity_blocks = 32;
  c.max_requests = 8;
  c.events_enabled = false;
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const uint32_t bt = static_cast<uint32_t>(core.manager().block_tokens());
  bool binary = false;

  std::pair<int, std::string> a = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, bt + 3) + ",\"tenant\":1}");
  ASSERT_EQ(a.first, 200) << a.second;
  const std::string alice = nlohmann::json::parse(a.second)["request"].dump();
  ASSERT_EQ(core.Handle("/v1/free", "{\"request\":" + alice + ",\"tenant\":1}").first, 200);
  std::pair<int, std::string> b = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(900, bt + 3) + ",\"tenant\":2}");
  ASSERT_EQ(b.first, 200) << b.second;
  const std::string bob = nlohmann::json::parse(b.second)["request"].dump();
  ASSERT_NE(alice, bob);  // the same slot, another generation
  const RequestId bob_id = RequestOfHandle(nlohmann::json::parse(b.second)["request"].get<uint64_t>());
  const std::string read0 = "/v1/requests/" + bob + "/blocks/0";
  std::pair<int, std::string> bob_bytes = core.HandleGet(read0 + "?tenant=2", &binary);
  ASSERT_EQ(bob_bytes.first, 200) << bob_bytes.second;
  const std::string before = ManagerState(core);
  const uint64_t bob_tokens = core.manager().Tokens(bob_id);

  // The stale id, even with the tenant that now holds the slot.
  for (const std::string tenant : {"1", "2"}) {
    std::pair<int, std::string> st = core.Handle(
        "/v1/step", "{\"requests\":[" + alice + "],\"counts\":[1],\"tokens\":[5],\"tenant\":" + tenant + "}");
    ASSERT_EQ(st.first, 200) << st.second;
    const nlohmann::json sj = nlohmann::json::parse(st.second);
    EXPECT_EQ(sj["codes"][0], "invalid argument") << st.second;
    EXPECT_TRUE(sj["block_tables"][0].empty());
    EXPECT_EQ(FieldOf(core.Handle("/v1/free", "{\"request\":" + alice + ",\"tenant\":" + tenant + "}")), "request");
    EXPECT_EQ(core.HandleGet("/v1/requests/" + alice + "/blocks/0?tenant=" + tenant, &binary).first, 400);
  }
  // Bob's live id from another tenant (and from the default tenant 0).
  for (const std::string tenant : {"1", "0"}) {
    std::pair<int, std::string> st =
        core.Handle("/v1/step", "{\"requests\":[" + bob + "],\"counts\":[1],\"tokens\":[5],\"tenant\":" + tenant + "}");
    ASSERT_EQ(st.first, 200) << st.second;
    const nlohmann::json sj = nlohmann::json::parse(st.second);
    EXPECT_EQ(sj["codes"][0], "invalid argument") << st.second;
    EXPECT_TRUE(sj["block_tables"][0].empty()) << "another tenant's block table shown";
    EXPECT_EQ(FieldOf(core.Handle("/v1/free", "{\"request\":" + bob + ",\"tenant\":" + tenant + "}")), "request");
    EXPECT_EQ(core.HandleGet(read0 + "?tenant=" + tenant, &binary).first, 400);
  }
  EXPECT_EQ(core.HandleGet(read0, &binary).first, 400);  // no tenant: tenant 0
  EXPECT_EQ(ManagerState(core), before);
  EXPECT_EQ(core.manager().Tokens(bob_id), bob_tokens);
  EXPECT_EQ(core.HandleGet(read0 + "?tenant=2", &binary), bob_bytes);
  EXPECT_EQ(FieldOf(core.HandleGet(read0 + "?tenant=2&tenant=2", &binary)), "query");
  // Bob's own calls work.
  std::pair<int, std::string> st =
      core.Handle("/v1/step", "{\"requests\":[" + bob + "],\"counts\":[1],\"tokens\":[5],\"tenant\":2}");
  EXPECT_EQ(nlohmann::json::parse(st.second)["codes"][0], "ok") << st.second;
  EXPECT_EQ(core.Handle("/v1/free", "{\"request\":" + bob + ",\"tenant\":2}").first, 200);
}

class ServeEngineKvModels : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// tiny-mla (mla-bf16, one plane) and DeepSeek-V3 with FlashMLA's fp8_ds_mla record (two planes:
// the region-major format's rows), and V3.2 with its lightning-indexer group in the frame too.
INSTANTIATE_TEST_SUITE_P(Models, ServeEngineKvModels,
                         ::testing::Values(std::make_pair(std::string("tiny-mla"), std::string()),
                                           std::make_pair(std::string("deepseek-v3"), std::string("fp8_ds_mla")),
                                           std::make_pair(std::string("deepseek-v3.2"), std::string())),
                         [](const ::testing::TestParamInfo<std::pair<std::string, std::string>>& param) {
                           std::string name =
                               param.param.first + (param.param.second.empty() ? "" : "_") + param.param.second;
                           for (char& ch : name) {
                             if (std::isalnum(static_cast<unsigned char>(ch)) == 0) ch = '_';
                           }
                           return name;
                         });

TEST_P(ServeEngineKvModels, ReadsGiveBackWhatWasPushedAndAPrefixHitsBytes) {
  std::vector<std::string> warnings;
  ServeConfig config = EngineConfig(GetParam().first);
  config.kv_format = GetParam().second;
  config.http_max_body_bytes = 64u << 20;  // V3: 40,016 bytes a token, a 3-block batch of 5.2 MB
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(config, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const uint64_t rb = core.record_bytes();
  const uint64_t bt = core.manager().block_tokens();
  const uint32_t n = static_cast<uint32_t>(2 * bt + 5);
  const std::string kv = RandomBytes(n * rb, 42);
  std::pair<int, std::string> a = core.Handle("/v1/admit", Frame("{\"tokens\":" + Tokens(1, n) + "}", kv));
  ASSERT_EQ(a.first, 200) << a.second;
  const uint64_t id = nlohmann::json::parse(a.second)["request"].get<uint64_t>();
  bool binary = false;
  for (uint64_t b = 0; b < 3; ++b) {
    std::pair<int, std::string> got =
        core.HandleGet("/v1/requests/" + std::to_string(id) + "/blocks/" + std::to_string(b), &binary);
    ASSERT_EQ(got.first, 200) << got.second;
    EXPECT_TRUE(binary);
    const uint64_t tokens = std::min<uint64_t>(bt, n - b * bt);
    ASSERT_EQ(got.second.size(), tokens * rb);
    EXPECT_TRUE(got.second == kv.substr(b * bt * rb, tokens * rb)) << "block " << b;
  }
  // Past the written tokens, a bad id, a bad index: 400 naming them.
  EXPECT_EQ(FieldOf(core.HandleGet("/v1/requests/" + std::to_string(id) + "/blocks/3", &binary)), "block");
  EXPECT_EQ(FieldOf(core.HandleGet("/v1/requests/7/blocks/0", &binary)), "request");
  EXPECT_EQ(FieldOf(core.HandleGet("/v1/requests/x/blocks/0", &binary)), "request");
  EXPECT_EQ(FieldOf(core.HandleGet("/v1/requests/0/blocks/-1", &binary)), "block");
  EXPECT_EQ(core.HandleGet("/v1/requests/0/tables", &binary).first, 404);
  // A batch: every block in one reply; past the written blocks, a bad count, an unknown query.
  std::pair<int, std::string> all = core.HandleGet("/v1/requests/" + std::to_string(id) + "/blocks/0?count=3", &binary);
  ASSERT_EQ(all.first, 200) << all.second;
  EXPECT_TRUE(all.second == kv);
  std::pair<int, std::string> tail =
      core.HandleGet("/v1/requests/" + std::to_string(id) + "/blocks/1?count=2", &binary);
  ASSERT_EQ(tail.first, 200) << tail.second;
  EXPECT_TRUE(tail.second == kv.substr(bt * rb));
  const std::string base = "/v1/requests/" + std::to_string(id) + "/blocks/";
  EXPECT_EQ(FieldOf(core.HandleGet(base + "1?count=3", &binary)), "count");
  EXPECT_EQ(FieldOf(core.HandleGet(base + "0?count=0", &binary)), "count");
  EXPECT_EQ(FieldOf(core.HandleGet(base + "0?count=99999999999999999999", &binary)), "count");
  EXPECT_EQ(FieldOf(core.HandleGet(base + "0?cnt=1", &binary)), "query");
  EXPECT_EQ(FieldOf(core.HandleGet(base + "4294967296", &binary)), "block");
  std::pair<int, std::string> layout = core.HandleGet("/v1/layout", &binary);
  ASSERT_EQ(layout.first, 200);
  EXPECT_EQ(nlohmann::json::parse(layout.second)["record_bytes"], rb);

  ASSERT_EQ(core.Handle("/v1/free", "{\"request\":" + std::to_string(id) + "}").first, 200);
  // Another request, JSON admit: reserves only; its cached blocks hold the first request's bytes.
  std::pair<int, std::string> b = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
  ASSERT_EQ(b.first, 200) << b.second;
  const nlohmann::json bj = nlohmann::json::parse(b.second);
  EXPECT_EQ(bj["cached_tokens"], 2 * bt);
  const uint64_t id2 = bj["request"].get<uint64_t>();
  EXPECT_EQ(core.manager().Tokens(RequestOfHandle(id2)), 2 * bt);
  for (uint64_t blk = 0; blk < 2; ++blk) {
    std::pair<int, std::string> got =
        core.HandleGet("/v1/requests/" + std::to_string(id2) + "/blocks/" + std::to_string(blk), &binary);
    ASSERT_EQ(got.first, 200);
    EXPECT_TRUE(got.second == kv.substr(blk * bt * rb, bt * rb)) << "block " << blk;
  }
  // The engine pushes the uncached rest with a step.
  const std::string rest = RandomBytes(5 * rb, 43);
  std::pair<int, std::string> st = core.Handle(
      "/v1/step", Frame("{\"requests\":[" + std::to_string(id2) +
                            "],\"counts\":[5],\"tokens\":" + Tokens(1 + static_cast<uint32_t>(2 * bt), 5) + "}",
                        rest));
  ASSERT_EQ(st.first, 200) << st.second;
  std::pair<int, std::string> last = core.HandleGet("/v1/requests/" + std::to_string(id2) + "/blocks/2", &binary);
  ASSERT_EQ(last.first, 200);
  EXPECT_TRUE(last.second == rest);
}

// ---- DeepSeek-V4 (sliding windows) ---------------------------------------------------------

TEST(ServeV4, AdmitStepFreeAndAPrefixHitFromDisk) {
  for (const std::string model : {"tiny-v4", "deepseek-v4-flash", "deepseek-v4-pro"}) {
    SCOPED_TRACE(model);
    TempDir dir;
    ServeConfig c;
    c.model = model;
    c.capacity_blocks = 16;
    c.max_requests = 4;
    c.events_enabled = false;
    c.disk_dir = dir.path() + "/disk";
    if (model != "tiny-v4") c.block_tokens = 128;  // the smallest span (lcm of the ratios): half the tokens
    std::vector<std::string> warnings;
    Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ServeCore& core = **made;
    ASSERT_NE(core.manager().states(), nullptr);
    const uint64_t bt = core.manager().block_tokens();
    const uint32_t n = static_cast<uint32_t>(2 * bt + 3);
    std::pair<int, std::string> a = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
    ASSERT_EQ(a.first, 200) << a.second;
    const uint64_t id = nlohmann::json::parse(a.second)["request"].get<uint64_t>();
    EXPECT_EQ(core.manager().Tokens(RequestOfHandle(id)), n);
    std::pair<int, std::string> st =
        core.Handle("/v1/step", "{\"requests\":[" + std::to_string(id) + "],\"counts\":[4],\"tokens\":[9,9,9,9]}");
    ASSERT_EQ(st.first, 200) << st.second;
    EXPECT_EQ(nlohmann::json::parse(st.second)["codes"][0], "ok");
    EXPECT_GT(core.manager().metrics().state_bytes.load(), 0u);
    ASSERT_EQ(core.Handle("/v1/free", "{\"request\":" + std::to_string(id) + "}").first, 200);
    // The same prompt again: the two whole blocks are a prefix hit; the window rings are
    // recomputed from the tokens before the boundary (window_strategy: recompute).
    std::pair<int, std::string> b = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
    ASSERT_EQ(b.first, 200) << b.second;
    const nlohmann::json bj = nlohmann::json::parse(b.second);
    EXPECT_EQ(bj["cached_tokens"], 2 * bt);
    EXPECT_GT(bj["recompute_tokens"].get<uint64_t>(), 0u);
    EXPECT_EQ(core.manager().Tokens(RequestOfHandle(bj["request"].get<uint64_t>())), n);
    const std::string metrics = core.MetricsText();
    EXPECT_NE(metrics.find("tessera_serve_admit_seconds_count 2\n"), std::string::npos);
    // V4 pages only compressed groups: no per-token records to read.
    EXPECT_EQ(core.record_bytes(), 0u);
    bool binary = false;
    EXPECT_EQ(core.HandleGet("/v1/requests/" + bj["request"].dump() + "/blocks/0", &binary).first, 409);
    ASSERT_TRUE(core.Shutdown().ok());
  }
}

// Bookkeeping only (the engine keeps V4's KV on its device): the same calls, no bytes.
TEST(ServeV4, UnbackedPoolAdmitsStepsAndHits) {
  ServeConfig c;
  c.model = "tiny-v4";
  c.capacity_blocks = 16;
  c.max_requests = 4;
  c.pool_unbacked = true;
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const uint64_t bt = core.manager().block_tokens();
  const uint32_t n = static_cast<uint32_t>(2 * bt + 3);
  std::pair<int, std::string> a = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
  ASSERT_EQ(a.first, 200) << a.second;
  const std::string id = nlohmann::json::parse(a.second)["request"].dump();
  std::pair<int, std::string> st = core.Handle("/v1/step", "{\"requests\":[" + id + "],\"counts\":[1],\"tokens\":[9]}");
  ASSERT_EQ(st.first, 200) << st.second;
  EXPECT_EQ(nlohmann::json::parse(st.second)["codes"][0], "ok");
  ASSERT_EQ(core.Handle("/v1/free", "{\"request\":" + id + "}").first, 200);
  std::pair<int, std::string> b = core.Handle("/v1/admit", "{\"tokens\":" + Tokens(1, n) + "}");
  ASSERT_EQ(b.first, 200) << b.second;
  EXPECT_EQ(nlohmann::json::parse(b.second)["cached_tokens"], 2 * bt);
}

TEST(ServeV4, EngineKvIsRefusedForWindowModels) {
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(EngineConfig("tiny-v4"), &warnings);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().field(), "kv_source");
}

// Issue 26.4 in serve: with no max_requests set the request table grows on demand (the 1,025th
// admission was refused when the key defaulted to 1,024); a set ceiling refuses the admission
// past it with a 503 on "requests" naming the key, and changes nothing.
TEST(ServeRequests, TheTableGrowsOnDemandAndASetCeilingIsRefusedNamingTheKey) {
  ServeConfig c;
  c.model = "tiny-mla";
  c.pool_unbacked = true;
  c.capacity_blocks = 4096;
  c.events_enabled = false;
  std::unique_ptr<ServeCore> grows = MakeCore(c);
  ASSERT_NE(grows, nullptr);
  for (uint32_t i = 0; i < 1500; ++i) {
    const uint32_t token = i + 1;
    Result<Admission> a = grows->Admit({&token, 1}, {});
    ASSERT_TRUE(a.ok()) << "admission " << i + 1 << ": " << a.status().ToString();
  }
  EXPECT_EQ(grows->manager().live_requests(), 1500u);

  c.max_requests = 2;
  std::unique_ptr<ServeCore> capped = MakeCore(c);
  ASSERT_NE(capped, nullptr);
  for (int i = 0; i < 2; ++i) {
    std::pair<int, std::string> r = capped->Handle("/v1/admit", "{\"tokens\":[1,2,3]}");
    ASSERT_EQ(r.first, 200) << r.second;
  }
  const std::string before = ManagerState(*capped);
  std::pair<int, std::string> r = capped->Handle("/v1/admit", "{\"tokens\":[4,5,6]}");
  EXPECT_EQ(r.first, 503) << r.second;
  EXPECT_EQ(FieldOf(r), "requests");
  EXPECT_NE(r.second.find("max_requests"), std::string::npos) << r.second;
  EXPECT_EQ(ManagerState(*capped), before);
}
}  // namespace
}  // namespace tessera
