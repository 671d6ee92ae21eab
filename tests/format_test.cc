#include "tessera/format.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

uint64_t Bytes(const std::string& name, const std::string& model) {
  Result<RecordFormat> f = BuildFormat(name, Preset(model));
  EXPECT_TRUE(f.ok()) << name << ": " << f.status().ToString();
  return f.ok() ? f->record_bytes() : 0;
}

TEST(Format, DeepSeekV3Records) {
  EXPECT_EQ(Bytes("mha-bf16", "deepseek-v3"), 65536u);
  EXPECT_EQ(Bytes("expanded-bf16", "deepseek-v3"), 81920u);
  EXPECT_EQ(Bytes("mla-bf16", "deepseek-v3"), 1152u);
  EXPECT_EQ(Bytes("fp8_ds_mla", "deepseek-v3"), 656u);
}

TEST(Format, IndexerRecords) {
  EXPECT_EQ(Bytes("indexer-fp8", "deepseek-v3.2"), 132u);
  EXPECT_EQ(Bytes("indexer-mxfp4", "deepseek-v3.2"), 68u);
  EXPECT_EQ(Bytes("indexer-fp4-seed", "deepseek-v4-pro"), 64u);
}

TEST(Format, DeepSeekV4Records) {
  EXPECT_EQ(Bytes("v4-fp8", "deepseek-v4-pro"), 584u);
  EXPECT_EQ(Bytes("v41-fp8", "deepseek-v4-pro"), 528u);
  EXPECT_EQ(Bytes("v4-seed", "deepseek-v4-pro"), 576u);
  EXPECT_EQ(CompressorStateFormat(2048).record_bytes(), 8192u);
  EXPECT_EQ(CompressorStateFormat(1024).record_bytes(), 4096u);
}

TEST(Format, V4Fp8IsRegionMajorWithMixedPrecision) {
  RecordFormat f = *BuildFormat("v4-fp8", Preset("deepseek-v4-pro"));
  EXPECT_EQ(f.packing, Packing::kRegionMajor);
  EXPECT_EQ(f.plane_count(), 2u);
  EXPECT_EQ(f.plane_bytes(0), 576u);  // 448 e4m3 + 64 bf16
  EXPECT_EQ(f.plane_bytes(1), 8u);    // 7 ue8m0 + 1 pad
  EXPECT_EQ(f.page_alignment, 576u);
  EXPECT_FALSE(f.single_element_type());
  ASSERT_EQ(f.regions.size(), 4u);
  EXPECT_EQ(f.regions[0].type, ElementType::kFp8E4M3);
  EXPECT_EQ(f.regions[1].type, ElementType::kBf16);
  EXPECT_EQ(f.regions[2].type, ElementType::kUe8m0);
  EXPECT_EQ(f.regions[2].count, 7u);
  EXPECT_EQ(f.regions[3].type, ElementType::kPad8);
}

TEST(Format, Fp8DsMlaRegions) {
  RecordFormat f = *BuildFormat("fp8_ds_mla", Preset("deepseek-v3"));
  EXPECT_EQ(f.RegionSummary(), "latent e4m3 x512 + scales fp32 x4 + rope bf16 x64");
  EXPECT_EQ(f.packing, Packing::kPerToken);
}

TEST(Format, SeedRegionsAndFp4) {
  RecordFormat f = *BuildFormat("indexer-fp4-seed", Preset("deepseek-v4-pro"));
  EXPECT_EQ(f.regions[0].type, ElementType::kFp4E2M1);
  EXPECT_EQ(f.regions[0].bits(), 512u);
}

TEST(Format, MlaFormatOnMhaModelIsRejected) {
  Result<RecordFormat> f = BuildFormat("mla-bf16", Preset("llama-3.1-8b"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().field(), "kv-format");
}

TEST(Format, IndexerFormatNeedsIndexDims) {
  Result<RecordFormat> f = BuildFormat("indexer-fp8", Preset("deepseek-v3"), "indexer-format");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().field(), "indexer-format");
}

TEST(Format, UnknownFormatListsKnownOnes) {
  Result<RecordFormat> f = BuildFormat("fp3", Preset("deepseek-v3"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("fp8_ds_mla"), std::string::npos);
}

TEST(Format, EveryCatalogFormatBuildsForSomePreset) {
  std::vector<Geometry> models = {Preset("deepseek-v3.2"), Preset("deepseek-v4-pro"), Preset("llama-3.1-8b")};
  for (const FormatInfo& info : FormatCatalog()) {
    if (info.use == FormatUse::kState) continue;
    bool built = false;
    for (const Geometry& g : models) built = built || BuildFormat(info.name, g).ok();
    EXPECT_TRUE(built) << info.name;
  }
}

TEST(Format, Fp8DsMlaNeedsWholeScaleGroups) {
  // DeepSeek-V4's 448 content dims are not whole 128-value groups.
  Result<RecordFormat> f = BuildFormat("fp8_ds_mla", Preset("deepseek-v4-pro"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("scale group 128"), std::string::npos);
}

}  // namespace
}  // namespace tessera
