#include "tessera_tools/render.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(Render, JsonTotalsAreExactIntegers) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(131072, "fp8_ds_mla"));
  nlohmann::json j = nlohmann::json::parse(RenderLedger(l, OutputFormat::kJson));
  for (const char* key : {"requested_bytes", "committed_bytes", "committed_bytes_all_ranks", "read_bytes_per_token",
                          "mha_equivalent_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j[key].is_number_unsigned()) << key;
  }
  EXPECT_EQ(j["requested_bytes"].get<uint64_t>(), 5244977152ULL);
  EXPECT_EQ(j["mha_equivalent_bytes"].get<uint64_t>(), 523986010112ULL);
}

// A config path is whatever bytes the file system holds; the model name is that path. dump()
// threw type_error 316 on the invalid UTF-8 and the exception left the library.
TEST(Render, JsonOfANonUtf8ModelNameIsValidJson) {
  Result<Geometry> g = GeometryFromConfigJson(*PresetConfigText("deepseek-v4-flash"), "/tmp/\xff\xfe-\xc3(.json");
  ASSERT_TRUE(g.ok());
  Ledger l = MustLedger(*g, Context(8192));
  std::string text;
  ASSERT_NO_THROW(text = RenderLedger(l, OutputFormat::kJson));
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model"], "/tmp/\xef\xbf\xbd\xef\xbf\xbd-\xef\xbf\xbd(.json");  // U+FFFD for each bad byte
  ASSERT_NO_THROW(text = RenderLayout(l, OutputFormat::kJson));
  EXPECT_NO_THROW(nlohmann::json::parse(text));
}

TEST(Render, JsonFractionsAreExact) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "v4-seed"));
  nlohmann::json j = nlohmann::json::parse(RenderLedger(l, OutputFormat::kJson));
  bool found = false;
  for (const auto& k : j["layer_kinds"]) {
    if (k["kind"] == "hca") {
      EXPECT_EQ(k["bytes_per_token_per_layer"]["fraction"], "9/2");
      EXPECT_EQ(k["bytes_per_token_per_layer"]["decimal"], "4.5");
      found = true;
    }
    if (k["kind"] == "csa") {
      EXPECT_EQ(k["bytes_per_token_per_layer"].get<uint64_t>(), 160u);
    }
  }
  EXPECT_TRUE(found);
  for (const auto& c : j["caches"]) {
    EXPECT_TRUE(c.contains("shape"));
    EXPECT_TRUE(c.contains("committed_terms"));
  }
}

TEST(Render, TableLabelsBinaryAndDecimalUnits) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(131072));
  std::string t = RenderLedger(l, OutputFormat::kTable);
  EXPECT_NE(t.find("8.578125 GiB"), std::string::npos) << t;
  EXPECT_NE(t.find("GB)"), std::string::npos);
  EXPECT_NE(t.find("MTP layers: not included"), std::string::npos);
  EXPECT_NE(t.find("page_rounding"), std::string::npos);
}

TEST(Render, MarkdownHasTables) {
  Ledger l = MustLedger(Preset("deepseek-v4-flash"), Context(8192));
  std::string md = RenderLedger(l, OutputFormat::kMarkdown);
  EXPECT_NE(md.find("| cache |"), std::string::npos);
  EXPECT_NE(md.find("swa.window"), std::string::npos);
}

TEST(Render, UnknownFormatNamesTheField) { EXPECT_EQ(ParseOutputFormat("yaml").status().field(), "format"); }

TEST(Render, ClaimsAsJson) {
  ClaimCheck c = *CheckSeedClaims();
  nlohmann::json j = nlohmann::json::parse(RenderClaims(c, OutputFormat::kJson));
  EXPECT_EQ(j["claims"].size(), c.results.size());
  EXPECT_FALSE(j["findings"].empty());
}

}  // namespace
}  // namespace tessera
