#include "tessera/layout.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

TEST(Layout, DeepSeekV3FlashMlaBlockIs64) {
  BlockTokensChoice c = *ChooseBlockTokens({1}, true, Kernel::kFlashMla, std::nullopt);
  EXPECT_EQ(c.block_tokens, 64u);
}

TEST(Layout, DeepSeekV4BlockIs256) {
  BlockTokensChoice c = *ChooseBlockTokens({4, 128, 4}, true, Kernel::kFlashMla, std::nullopt);
  EXPECT_EQ(c.block_tokens, 256u);
  ASSERT_GE(c.reasons.size(), 2u);
  EXPECT_NE(c.reasons[0].find("lcm = 128"), std::string::npos);
}

TEST(Layout, GenericKernelFallsBackToLcm) {
  EXPECT_EQ(ChooseBlockTokens({4, 128}, true, Kernel::kGeneric, std::nullopt)->block_tokens, 128u);
  EXPECT_EQ(ChooseBlockTokens({1}, false, Kernel::kGeneric, std::nullopt)->block_tokens, 16u);
}

TEST(Layout, ExplicitBlockBreakingARatioIsRejected) {
  Result<BlockTokensChoice> c = ChooseBlockTokens({4, 128}, true, Kernel::kFlashMla, 100);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().field(), "block-tokens");
  EXPECT_NE(c.status().message().find("not a multiple of compress ratio"), std::string::npos);
  EXPECT_FALSE(ChooseBlockTokens({1}, true, Kernel::kFlashMla, 0).ok());
}

TEST(Layout, ExplicitBlockMissingAPreferenceIsANote) {
  BlockTokensChoice c = *ChooseBlockTokens({4, 128}, true, Kernel::kFlashMla, 128);
  EXPECT_EQ(c.block_tokens, 128u);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("FlashMLA"), std::string::npos);
}

TEST(Layout, V4PagesPadTo576) {
  Geometry g = Preset("deepseek-v4-pro");
  RecordFormat v4 = *BuildFormat("v4-fp8", g);
  PageLayout c4 = *ComputePageLayout(v4, 4, 256);
  EXPECT_EQ(c4.entries_per_block, 64u);
  EXPECT_EQ(c4.data_bytes, 37376u);
  EXPECT_EQ(c4.page_bytes, 37440u);
  EXPECT_EQ(c4.padding_bytes, 64u);
  PageLayout c128 = *ComputePageLayout(v4, 128, 256);
  EXPECT_EQ(c128.entries_per_block, 2u);
  EXPECT_EQ(c128.page_bytes, 1728u);
  RecordFormat idx = *BuildFormat("indexer-fp8", g);
  EXPECT_EQ(ComputePageLayout(idx, 4, 256)->page_bytes, 8448u);       // its own alignment: none
  EXPECT_EQ(ComputePageLayout(idx, 4, 256, 576)->page_bytes, 8640u);  // vLLM pads V4 pages to 576
}

TEST(Layout, PageRejectsBlockInsideAGroup) {
  RecordFormat v4 = *BuildFormat("v4-fp8", Preset("deepseek-v4-pro"));
  Result<PageLayout> p = ComputePageLayout(v4, 128, 100);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "block-tokens");
}

TEST(Layout, BlockMetadataCountsTokenIds) { EXPECT_EQ(BlockMetadataBytes(64), kBlockHeaderBytes + 256); }

}  // namespace
}  // namespace tessera
