#include "tessera_tools/receipt.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::Preset;

TEST(Receipt, AllChecksPassOnPresets) {
  for (const char* model : {"deepseek-v3", "deepseek-v3.2", "deepseek-v4-pro", "deepseek-v4-flash", "llama-3.1-8b"}) {
    for (Engine e : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
      ReceiptRequest req{std::string("preset ") + model, Context(131072, "", e), std::nullopt, false};
      Result<Receipt> r = BuildReceipt(Preset(model), req);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (const ReceiptCheck& c : r->checks)
        EXPECT_TRUE(c.passed) << model << " " << EngineName(e) << ": " << c.name << " " << c.detail;
    }
  }
}

TEST(Receipt, RecordsInputsFormatsAndSha) {
  Geometry g = Preset("deepseek-v4-pro");
  ReceiptRequest req{"preset deepseek-v4-pro", Context(8192), std::nullopt, false};
  Receipt r = *BuildReceipt(g, req);
  nlohmann::json j = nlohmann::json::parse(r.json);
  EXPECT_EQ(j["inputs"]["config_sha256"], Sha256Hex(*PresetConfigText("deepseek-v4-pro")));
  EXPECT_EQ(j["ledger"]["inputs"]["context_tokens"], 8192);
  bool v4 = false;
  for (const auto& f : j["formats"]) {
    if (f["name"] == "v4-fp8") {
      v4 = true;
      EXPECT_EQ(f["record_bytes"], 584);
      EXPECT_EQ(f["packing"], "region-major");
    }
  }
  EXPECT_TRUE(v4);
  EXPECT_NE(r.markdown.find("## Checks"), std::string::npos);
  EXPECT_GE(j["checks"].size(), 5u);
}

TEST(Receipt, NonUtf8SourcePathDoesNotThrow) {
  Result<Geometry> g = GeometryFromConfigJson(*PresetConfigText("deepseek-v3"), "cfg-\xff.json");
  ASSERT_TRUE(g.ok());
  ReceiptRequest req{"cfg-\xff.json", Context(4096), std::nullopt, false};
  Result<Receipt> r = Result<Receipt>(Internal("", "not run"));
  ASSERT_NO_THROW(r = BuildReceipt(*g, req));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  nlohmann::json j = nlohmann::json::parse(r->json);
  EXPECT_EQ(j["inputs"]["model_source"], "cfg-\xef\xbf\xbd.json");
}

TEST(Receipt, Deterministic) {
  Geometry g = Preset("deepseek-v3");
  ReceiptRequest req{"preset deepseek-v3", Context(4096), std::nullopt, false};
  EXPECT_EQ(BuildReceipt(g, req)->json, BuildReceipt(g, req)->json);
  EXPECT_EQ(BuildReceipt(g, req)->markdown, BuildReceipt(g, req)->markdown);
}

TEST(Receipt, ObservationIsReconciled) {
  Geometry g = Preset("deepseek-v3");
  ReceiptRequest req{"preset deepseek-v3", Context(100), std::nullopt, false};
  Receipt base = *BuildReceipt(g, req);
  nlohmann::json j = nlohmann::json::parse(base.json);
  uint64_t committed = j["ledger"]["committed_bytes"];
  req.observed_bytes = committed + 1;
  Receipt off = *BuildReceipt(g, req);
  EXPECT_FALSE(off.all_passed());
  EXPECT_NE(off.json.find("\"unexplained_bytes\": 1"), std::string::npos);
}

}  // namespace
}  // namespace tessera
