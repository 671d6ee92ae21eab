#include "tessera/format.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tessera/codec.h"
#include "tessera/layout.h"
#include "tessera/ledger.h"
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
  EXPECT_EQ(Bytes("mla-fp8", "deepseek-v3"), 576u);
}

// vLLM's DeepSeek-V3 cache under --kv-cache-dtype fp8 with a dense MLA backend: MLAAttentionSpec
// with head_size 576 (kv_lora_rank + rope) and an fp8 dtype, no scales in the record
// (vllm/v1/kv_cache_interface.py, MLAAttentionSpec.real_page_size_bytes; a 64-token page is
// 36,864 B, as tests/vllm_profile_test.cc pins from vLLM's own allocator).
TEST(Format, MlaFp8IsTheWholeRecordInE4m3) {
  Result<RecordFormat> f = BuildFormat("mla-fp8", Preset("deepseek-v3"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->regions.size(), 2u);
  EXPECT_EQ(f->regions[0], (Region{"latent", ElementType::kFp8E4M3, 512, 0}));
  EXPECT_EQ(f->regions[1], (Region{"rope", ElementType::kFp8E4M3, 64, 0}));
  EXPECT_EQ(f->page_alignment, 1u);
  EXPECT_EQ(f->packing, Packing::kPerToken);
  EXPECT_FALSE(BuildFormat("mla-fp8", Preset("llama-3.1-8b")).ok());
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

// heads x head_dim within 64 bits, but x 16 bits per element past them: the record of an MHA
// model with 2^30 KV heads of 2^30 dims wrapped to 0 B.
TEST(Format, RecordsThatDoNotFitIn64BitsAreRefused) {
  Geometry mha = testing::FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 1073741824,
      "num_key_value_heads": 1073741824, "head_dim": 1073741824})");
  for (const char* name : {"mha-bf16", "mha-fp8"}) {
    Result<RecordFormat> f = BuildFormat(name, mha);
    ASSERT_FALSE(f.ok()) << name << " record " << f->record_bytes() << " B";
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_EQ(f.status().field(), "head_dim");
  }
  Result<Ledger> l = ComputeLedger(mha, testing::Context(1));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().field(), "head_dim");
  // Expanded MLA: 2^32 - 1 query heads of 2^32 - 1 dims.
  Geometry mla = testing::FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 4294967295,
      "kv_lora_rank": 512, "qk_nope_head_dim": 4294967231, "qk_rope_head_dim": 64, "v_head_dim": 4294967295})");
  Result<RecordFormat> e = BuildFormat("expanded-bf16", mla);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(e.status().field(), "head_dim");
  // The largest that fits still builds, exactly.
  Geometry wide = testing::FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 65536,
      "num_key_value_heads": 65536, "head_dim": 65536})");
  EXPECT_EQ(BuildFormat("mha-bf16", wide)->record_bytes(), 2ULL * 65536 * 65536 * 2);
}

// Code that treats formats differently asks the family, never the name.
TEST(Format, EveryFormatHasItsFamily) {
  const Geometry v4 = Preset("deepseek-v4-pro"), v3 = Preset("deepseek-v3"), mha = Preset("llama-3.1-8b");
  EXPECT_EQ(BuildFormat("mha-bf16", mha)->family, FormatFamily::kMha);
  EXPECT_EQ(BuildFormat("mha-fp8", mha)->family, FormatFamily::kMha);
  EXPECT_EQ(BuildFormat("expanded-bf16", v3)->family, FormatFamily::kExpanded);
  EXPECT_EQ(BuildFormat("mla-bf16", v3)->family, FormatFamily::kMlaLatent);
  EXPECT_EQ(BuildFormat("mla-fp16", v3)->family, FormatFamily::kMlaLatent);
  EXPECT_EQ(BuildFormat("mla-fp8", v3)->family, FormatFamily::kMlaLatent);
  EXPECT_EQ(BuildFormat("fp8_ds_mla", v3)->family, FormatFamily::kFp8DsMla);
  EXPECT_EQ(BuildFormat("v4-fp8", v4)->family, FormatFamily::kV4Fp8);
  EXPECT_EQ(BuildFormat("v41-fp8", v4)->family, FormatFamily::kV41Fp8);
  EXPECT_EQ(BuildFormat("v4-seed", v4)->family, FormatFamily::kSeed);
  EXPECT_EQ(BuildFormat("indexer-fp8", v4)->family, FormatFamily::kIndexer);
  EXPECT_EQ(BuildFormat("indexer-mxfp4", v4)->family, FormatFamily::kIndexer);
  EXPECT_EQ(BuildFormat("indexer-fp4-seed", v4)->family, FormatFamily::kSeed);
  EXPECT_EQ(CompressorStateFormat(2048).family, FormatFamily::kCompressorState);
}

TEST(Format, EqualityIsEveryField) {
  const Geometry v4 = Preset("deepseek-v4-pro");
  EXPECT_EQ(*BuildFormat("v4-fp8", v4), *BuildFormat("v4-fp8", v4));
  EXPECT_FALSE(*BuildFormat("v4-fp8", v4) == *BuildFormat("v41-fp8", v4));
  EXPECT_FALSE(CompressorStateFormat(2048) == CompressorStateFormat(1024));  // same name, other regions
}

TEST(Format, Fp8DsMlaNeedsWholeScaleGroups) {
  // DeepSeek-V4's 448 content dims are not whole 128-value groups.
  Result<RecordFormat> f = BuildFormat("fp8_ds_mla", Preset("deepseek-v4-pro"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("scale group 128"), std::string::npos);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(FormatRegions, TypedViewsOfAV4RecordInARegionMajorPage) {
  Geometry g = testing::Preset("deepseek-v4-pro");
  RecordFormat f = *BuildFormat("v4-fp8", g);
  PageLayout page = *ComputePageLayout(f, 4, 256);
  std::vector<std::byte> bytes(page.page_bytes);
  // Entry 5 of the page: its 576-B data row and its 8-B scale row.
  RecordView v;
  v.plane_count = 2;
  v.planes[0] = std::span<std::byte>(bytes).subspan(5 * 576, 576);
  v.planes[1] = std::span<std::byte>(bytes).subspan(64 * 576 + 5 * 8, 8);
  std::vector<float> nope(448), rope(64);
  for (size_t i = 0; i < nope.size(); ++i) nope[i] = static_cast<float>(i % 13) - 6.0f;
  for (size_t i = 0; i < rope.size(); ++i) rope[i] = 0.5f * static_cast<float>(i);
  ASSERT_TRUE(QuantizeV4Fp8(nope, rope, v.planes[0], v.planes[1]).ok());
  RegionView n = *RegionOf(f, v, "nope");
  RegionView r = *RegionOf(f, v, "rope");
  RegionView s = *RegionOf(f, v, "scales");
  EXPECT_EQ(n.count(), 448u);
  EXPECT_EQ(r.count(), 64u);
  EXPECT_EQ(s.count(), 7u);
  EXPECT_EQ(r.Get(10), 5.0f);  // bf16 holds 5.0 exactly
  // nope = e4m3 code x the tile's power-of-two scale: small integers are exact.
  for (size_t i = 0; i < 448; ++i) EXPECT_EQ(n.Get(i) * s.Get(i / 64), nope[i]) << i;
  EXPECT_EQ(RegionOf(f, v, "latent").status().field(), "region");
}

TEST(FormatRegions, PerTokenRecordsAndFp4) {
  Geometry g = testing::Preset("deepseek-v4-pro");
  RecordFormat seed = *BuildFormat("indexer-fp4-seed", g);
  std::vector<std::byte> rec(seed.record_bytes());
  std::vector<float> vals(128);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = (i % 2 == 0) ? 1.5f : -3.0f;
  std::vector<uint8_t> packed(64);
  ASSERT_TRUE(PackE2M1(vals, packed).ok());
  std::memcpy(rec.data(), packed.data(), packed.size());
  RecordView v;
  v.planes[0] = rec;
  RegionView k = *RegionOf(seed, v, "key");
  EXPECT_EQ(k.Get(0), 1.5f);
  EXPECT_EQ(k.Get(1), -3.0f);
  EXPECT_EQ(k.Get(127), -3.0f);
}

}  // namespace
}  // namespace tessera
