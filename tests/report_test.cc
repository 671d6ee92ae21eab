#include "tessera_tools/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tessera {
namespace {

TEST(Report, CoversBothModelsAtThreeContextsAndTheClaims) {
  Result<std::string> text = RenderReport(OutputFormat::kJson);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  nlohmann::json j = nlohmann::json::parse(*text);
  ASSERT_EQ(j["ledgers"].size(), 6u);
  EXPECT_EQ(j["ledgers"][0]["model"], "deepseek-v3");
  EXPECT_EQ(j["ledgers"][1]["context_tokens"], 131072);
  EXPECT_EQ(j["ledgers"][1]["requested_bytes"], 9210691584ULL);
  EXPECT_EQ(j["ledgers"][5]["model"], "deepseek-v4-pro");
  EXPECT_EQ(j["ledgers"][5]["engines"]["vllm"]["reserved_at_admission_bytes"], 11041257600ULL);
  EXPECT_EQ(j["claim_check"]["claims"].size(), 23u);
}

TEST(Report, TableAndMarkdown) {
  std::string table = *RenderReport(OutputFormat::kTable);
  EXPECT_NE(table.find("deepseek-v4-pro"), std::string::npos);
  EXPECT_NE(table.find("claim check"), std::string::npos);
  std::string md = *RenderReport(OutputFormat::kMarkdown);
  EXPECT_NE(md.find("| model |"), std::string::npos);
}

}  // namespace
}  // namespace tessera
