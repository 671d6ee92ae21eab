#include "tessera/layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "tessera/block_pool.h"
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

// The MLA kernels' pages: CUTLASS MLA 128 entries, FlashInfer MLA 32 (vLLM's
// get_supported_kernel_block_sizes: [128], [32, 64]); per entry of the finest paged cache.
TEST(Layout, MlaKernelPages) {
  EXPECT_EQ(ChooseBlockTokens({1}, true, Kernel::kCutlassMla, std::nullopt)->block_tokens, 128u);
  EXPECT_EQ(ChooseBlockTokens({1}, true, Kernel::kFlashInferMla, std::nullopt)->block_tokens, 32u);
  EXPECT_EQ(ChooseBlockTokens({4, 128}, true, Kernel::kCutlassMla, std::nullopt)->block_tokens, 512u);
  EXPECT_EQ(ChooseBlockTokens({4, 128}, true, Kernel::kFlashInferMla, std::nullopt)->block_tokens, 128u);
  BlockTokensChoice c = *ChooseBlockTokens({1}, true, Kernel::kCutlassMla, 64);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("CUTLASS MLA reads pages of 128 entries"), std::string::npos) << c.notes[0];
  for (Kernel k : {Kernel::kFlashMla, Kernel::kCutlassMla, Kernel::kFlashInferMla, Kernel::kGeneric}) {
    EXPECT_EQ(*ParseKernel(KernelName(k)), k);
  }
  EXPECT_EQ(KernelName(Kernel::kCutlassMla), "cutlass-mla");
  EXPECT_EQ(KernelName(Kernel::kFlashInferMla), "flashinfer-mla");
  Result<Kernel> bad = ParseKernel("cutlass");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "kernel");
  EXPECT_NE(bad.status().message().find("cutlass-mla"), std::string::npos);
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

// ADR 0020: the slices of several layers in one page, padded once. 31 HCA slices of 2 entries
// (1,168 B) take 36,208 B, padded to 36,288 = 63 x 576 B (80 B) instead of 31 x 560 B.
TEST(Layout, PackedPagePadsOnce) {
  RecordFormat v4 = *BuildFormat("v4-fp8", Preset("deepseek-v4-pro"));
  PageLayout one = *ComputePageLayout(v4, 128, 256);
  EXPECT_FALSE(one.packed());
  EXPECT_EQ(one.layer_stride, one.page_bytes);
  EXPECT_EQ(GroupBlockBytes(one, 31).value(), 31u * 1728);
  EXPECT_EQ(PackedPaddingPerBlock(one, 31), 0u);  // an unpacked slice carries its own padding
  PageLayout hca = *ComputePageLayout(v4, 128, 256, 0, 31);
  EXPECT_TRUE(hca.packed());
  EXPECT_EQ(hca.data_bytes, 1168u);
  EXPECT_EQ(hca.layer_stride, 1168u);
  EXPECT_EQ(hca.page_bytes, 36288u);
  EXPECT_EQ(hca.page_bytes % 576, 0u);  // the block stride a kernel sees stays a multiple of 576 B
  EXPECT_EQ(hca.padding_bytes, 80u);
  EXPECT_EQ(GroupBlockBytes(hca, 31).value(), 36288u);
  EXPECT_EQ(PackedPaddingPerBlock(hca, 31), 80u);
  PageLayout csa = *ComputePageLayout(v4, 4, 256, 0, 30);
  EXPECT_EQ(csa.layer_stride, 37376u);
  EXPECT_EQ(csa.page_bytes, 1121472u);  // 1,947 x 576
  EXPECT_EQ(csa.padding_bytes, 192u);
  // One entry per slice (584 B) would start every other slice 8-B aligned: slices start 16-B aligned.
  PageLayout odd = *ComputePageLayout(v4, 128, 128, 0, 3);
  EXPECT_EQ(odd.data_bytes, 584u);
  EXPECT_EQ(odd.layer_stride, 592u);
  EXPECT_EQ(odd.page_bytes, 2304u);  // 3 x 592 = 1,776, rounded up to 4 x 576
  EXPECT_EQ(odd.padding_bytes, 2304u - 3 * 584);
  EXPECT_EQ(ComputePageLayout(v4, 128, 256, 0, 0).status().field(), "layers");
}

TEST(Layout, PageRejectsBlockInsideAGroup) {
  RecordFormat v4 = *BuildFormat("v4-fp8", Preset("deepseek-v4-pro"));
  Result<PageLayout> p = ComputePageLayout(v4, 128, 100);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "block-tokens");
}

// ---- ComputeCacheLayout ----------------------------------------------------------------------

std::vector<uint32_t> Range(uint32_t first, uint32_t end, uint32_t step = 1) {
  std::vector<uint32_t> v;
  for (uint32_t i = first; i < end; i += step) v.push_back(i);
  return v;
}

CacheLayout MustLayout(const Geometry& g, const CacheLayoutOptions& o = {}) {
  Result<CacheLayout> l = ComputeCacheLayout(g, o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *l : CacheLayout{};
}

TEST(CacheLayout, DeepSeekV3IsOneLatentGroupOverEveryLayer) {
  CacheLayout l = MustLayout(Preset("deepseek-v3"));
  EXPECT_EQ(l.kv_format, "mla-bf16");
  EXPECT_EQ(l.indexer_format, "");
  EXPECT_EQ(l.main_format.record_bytes(), 1152u);
  EXPECT_EQ(l.block.block_tokens, 64u);
  EXPECT_EQ(l.layers_counted, 61u);
  ASSERT_EQ(l.groups.size(), 1u);
  const CacheGroup& latent = l.groups[0];
  EXPECT_EQ(latent.name, "latent/1");
  EXPECT_EQ(latent.role, CacheRole::kLatent);
  EXPECT_TRUE(latent.in_pages);
  EXPECT_EQ(latent.layers, 61u);
  EXPECT_EQ(latent.model_layers, Range(0, 61));
  EXPECT_EQ(latent.lines, (std::vector<std::string>{"mla.latent"}));
  EXPECT_EQ(latent.page.entries_per_block, 64u);
  EXPECT_EQ(latent.page.page_bytes, 64u * 1152);
  EXPECT_EQ(l.group_of_line, (std::vector<uint32_t>{0}));
}

TEST(CacheLayout, MtpLayersJoinTheirGroupAtTheEnd) {
  CacheLayoutOptions o;
  o.include_mtp = true;
  CacheLayout l = MustLayout(Preset("deepseek-v3"), o);
  EXPECT_EQ(l.layers_counted, 62u);
  ASSERT_EQ(l.groups.size(), 1u);
  EXPECT_EQ(l.groups[0].model_layers, Range(0, 62));
  EXPECT_EQ(l.groups[0].lines, (std::vector<std::string>{"mla.latent", "mtp.mla.latent"}));
  ASSERT_EQ(l.lines.size(), 2u);
  EXPECT_EQ(l.lines[1].model_layers, (std::vector<uint32_t>{61}));
}

TEST(CacheLayout, DeepSeekV32PagesTheLatentAndTheIndexer) {
  CacheLayout l = MustLayout(Preset("deepseek-v3.2"));
  EXPECT_EQ(l.kv_format, "fp8_ds_mla");
  EXPECT_EQ(l.indexer_format, "indexer-fp8");
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].name, "latent/1");
  EXPECT_EQ(l.groups[0].format.record_bytes(), 656u);
  EXPECT_EQ(l.groups[1].name, "indexer/1");
  EXPECT_EQ(l.groups[1].format.record_bytes(), 132u);
  for (const CacheGroup& g : l.groups) {
    EXPECT_EQ(g.model_layers, Range(0, 61)) << g.name;
    EXPECT_EQ(g.page.entries_per_block, 64u) << g.name;
  }
  // An expanded per-head format replaces the latent and has no indexer.
  CacheLayoutOptions o;
  o.kv_format = "expanded-bf16";
  CacheLayout expanded = MustLayout(Preset("deepseek-v3.2"), o);
  ASSERT_EQ(expanded.groups.size(), 1u);
  EXPECT_EQ(expanded.groups[0].name, "kv/1");
}

TEST(CacheLayout, DeepSeekV4ProGroupsAndTheirLayers) {
  CacheLayout l = MustLayout(Preset("deepseek-v4-pro"));
  EXPECT_EQ(l.kv_format, "v4-fp8");
  EXPECT_EQ(l.indexer_format, "indexer-fp8");
  EXPECT_EQ(l.block.block_tokens, 256u);
  // Layers 0 and 1 are HCA, then CSA and HCA alternate: CSA on 2, 4, ..., 60.
  std::vector<uint32_t> hca = Range(1, 61, 2);
  hca.insert(hca.begin(), 0);
  const std::vector<uint32_t> csa = Range(2, 61, 2);
  struct Expect {
    const char* name;
    bool in_pages;
    std::vector<uint32_t> layers;
    uint64_t page_or_ring;
  };
  const Expect expect[] = {
      {"window", false, Range(0, 61), 61ULL * 128 * 584},           {"compressed/128", true, hca, 36288},
      {"compressor_state/128", false, hca, 31ULL * 128 * 4096},     {"compressed/4", true, csa, 1121472},
      {"compressor_state/8", false, csa, 30ULL * 8 * 8192},         {"indexer/4", true, csa, 8448},
      {"indexer_compressor_state/8", false, csa, 30ULL * 8 * 2048},
  };
  ASSERT_EQ(l.groups.size(), std::size(expect));
  for (size_t i = 0; i < l.groups.size(); ++i) {
    const CacheGroup& g = l.groups[i];
    EXPECT_EQ(g.name, expect[i].name);
    EXPECT_EQ(g.in_pages, expect[i].in_pages) << g.name;
    EXPECT_EQ(g.model_layers, expect[i].layers) << g.name;
    EXPECT_EQ(g.layers, expect[i].layers.size()) << g.name;
    EXPECT_EQ(g.in_pages ? g.page.page_bytes : g.bytes_per_request, expect[i].page_or_ring) << g.name;
  }
  EXPECT_EQ(l.groups[2].state_floats, 1024u);
  EXPECT_EQ(l.groups[4].state_floats, 2048u);
  // Both kinds' window lines are one ring group.
  EXPECT_EQ(l.groups[0].lines, (std::vector<std::string>{"hca.window", "csa.window"}));
  for (size_t i = 0; i < l.lines.size(); ++i) {
    const CacheGroup& g = l.groups[l.group_of_line[i]];
    EXPECT_EQ(g.role, l.lines[i].role) << l.lines[i].name;
    EXPECT_EQ(g.format, l.lines[i].format) << l.lines[i].name;
  }
}

// ADR 0020: a group whose one-layer page would be padded holds all its layers in one page per
// block; a group without padding (the indexer, every unaligned format) keeps a page per layer,
// and pack_layers = false gives back the layout before ADR 0020.
TEST(CacheLayout, PaddedGroupsPackTheirLayers) {
  for (const char* model : {"deepseek-v4-pro", "deepseek-v4-flash"}) {
    CacheLayout packed = MustLayout(Preset(model));
    CacheLayoutOptions o;
    o.pack_layers = false;
    CacheLayout unpacked = MustLayout(Preset(model), o);
    ASSERT_EQ(packed.groups.size(), unpacked.groups.size());
    for (size_t i = 0; i < packed.groups.size(); ++i) {
      const CacheGroup& p = packed.groups[i];
      const CacheGroup& u = unpacked.groups[i];
      if (!p.in_pages) continue;
      EXPECT_FALSE(u.page.packed()) << model << " " << u.name;
      EXPECT_EQ(p.page.packed(), u.page.padding_bytes > 0) << model << " " << p.name;
      if (!p.page.packed()) {
        EXPECT_EQ(p.page.page_bytes, u.page.page_bytes) << model << " " << p.name;
        continue;
      }
      EXPECT_EQ(p.page.layers_per_page, p.layers) << model << " " << p.name;
      EXPECT_EQ(p.page.data_bytes, u.page.data_bytes) << model << " " << p.name;
      EXPECT_EQ(p.page.page_bytes % 576, 0u) << model << " " << p.name;
      EXPECT_LT(p.page.padding_bytes, 576u) << model << " " << p.name;
      EXPECT_LT(GroupBlockBytes(p.page, p.layers).value(), GroupBlockBytes(u.page, u.layers).value());
    }
  }
  // V3's latent pages have no padding: nothing changes.
  CacheLayout v3 = MustLayout(Preset("deepseek-v3"));
  EXPECT_FALSE(v3.groups[0].page.packed());
  EXPECT_EQ(v3.groups[0].page.page_bytes, 64u * 1152);
}

TEST(CacheLayout, MhaHeadsShardOverTensorParallelRanks) {
  CacheLayout one = MustLayout(Preset("llama-3.1-8b"));
  EXPECT_EQ(one.kv_format, "mha-bf16");
  EXPECT_EQ(one.block.block_tokens, 16u);  // MHA pages of 16 tokens
  ASSERT_EQ(one.groups.size(), 1u);
  EXPECT_EQ(one.groups[0].name, "kv/1");
  EXPECT_EQ(one.groups[0].model_layers, Range(0, 32));
  EXPECT_EQ(one.groups[0].format.record_bytes(), 2u * 8 * 128 * 2);
  CacheLayoutOptions o;
  o.tp = 2;
  CacheLayout two = MustLayout(Preset("llama-3.1-8b"), o);
  EXPECT_EQ(two.groups[0].format.record_bytes(), 2u * 4 * 128 * 2);  // a rank's heads
  EXPECT_EQ(two.lines[0].record_bytes, 2u * 8 * 128 * 2);            // the whole model's record
  EXPECT_EQ(two.main_format.record_bytes(), 2u * 8 * 128 * 2);
}

TEST(CacheLayout, SeedRecordPairsWithTheSeedIndexer) {
  CacheLayoutOptions o;
  o.kv_format = "v4-seed";
  EXPECT_EQ(MustLayout(Preset("deepseek-v4-pro"), o).indexer_format, "indexer-fp4-seed");
  EXPECT_EQ(DefaultIndexerFormat(Preset("deepseek-v3"), *BuildFormat("mla-bf16", Preset("deepseek-v3"))), "");
}

TEST(CacheLayout, BadOptionsNameTheirField) {
  struct Case {
    const char* model;
    CacheLayoutOptions o;
    const char* field;
  };
  // (Designated initializers would trip GCC's -Wmissing-field-initializers.)
  auto with = [](auto set) {
    CacheLayoutOptions o;
    set(o);
    return o;
  };
  std::vector<Case> cases;
  cases.push_back({"deepseek-v3", with([](CacheLayoutOptions& o) { o.kv_format = "nope"; }), "kv-format"});
  cases.push_back({"deepseek-v3", with([](CacheLayoutOptions& o) { o.kv_format = "indexer-fp8"; }), "kv-format"});
  cases.push_back({"llama-3.1-8b", with([](CacheLayoutOptions& o) { o.kv_format = "mla-bf16"; }), "kv-format"});
  cases.push_back({"deepseek-v4-pro", with([](CacheLayoutOptions& o) { o.kv_format = "expanded-bf16"; }), "kv-format"});
  cases.push_back(
      {"deepseek-v3", with([](CacheLayoutOptions& o) { o.indexer_format = "indexer-fp8"; }), "indexer-format"});
  cases.push_back(
      {"deepseek-v3.2", with([](CacheLayoutOptions& o) { o.indexer_format = "mla-bf16"; }), "indexer-format"});
  cases.push_back({"deepseek-v4-pro", with([](CacheLayoutOptions& o) { o.block_tokens = 100; }), "block-tokens"});
  cases.push_back(
      {"deepseek-v3", with([](CacheLayoutOptions& o) { o.indexer_packing = Packing::kPerToken; }), "indexer-layout"});
  cases.push_back({"deepseek-v4-pro", with([](CacheLayoutOptions& o) {
                     o.indexer_format = "indexer-mxfp4";
                     o.indexer_packing = Packing::kPerToken;
                   }),
                   "indexer-layout"});  // indexer-mxfp4 has one layout
  cases.push_back({"deepseek-v3", with([](CacheLayoutOptions& o) { o.tp = 0; }), "tp"});
  cases.push_back({"llama-3.1-8b", with([](CacheLayoutOptions& o) { o.tp = 3; }), "tp"});
  cases.push_back({"llama-3.1-8b", with([](CacheLayoutOptions& o) { o.tp = 12; }), "tp"});
  for (const Case& c : cases) {
    Result<CacheLayout> l = ComputeCacheLayout(Preset(c.model), c.o);
    ASSERT_FALSE(l.ok()) << c.model << " " << c.field;
    EXPECT_EQ(l.status().field(), c.field) << l.status().ToString();
  }
}

TEST(CacheLayout, RetainNeedsBlocksOfWholeWindows) {
  Geometry g = Preset("deepseek-v4-pro");
  CacheLayout l = MustLayout(g);
  for (SwaStrategy s : {SwaStrategy::kRecompute, SwaStrategy::kSnapshot, SwaStrategy::kRetain}) {
    EXPECT_TRUE(CheckWindowStrategy(l, s).ok()) << SwaStrategyName(s);
  }
  for (LayerSpec& layer : g.layers) {
    for (CacheSpec& c : layer.caches) {
      if (c.role == CacheRole::kWindow) c.slots = 512;  // 256-token blocks end inside a window chunk
    }
  }
  CacheLayout wide = MustLayout(g);
  EXPECT_TRUE(CheckWindowStrategy(wide, SwaStrategy::kSnapshot).ok());
  Status s = CheckWindowStrategy(wide, SwaStrategy::kRetain);
  EXPECT_EQ(s.field(), "swa-strategy");
  EXPECT_TRUE(CheckWindowStrategy(MustLayout(Preset("deepseek-v3")), SwaStrategy::kRetain).ok());  // no window
}

TEST(Layout, BlockMetadataCountsTokenIds) { EXPECT_EQ(BlockMetadataBytes(64), kBlockHeaderBytes + 256); }

// ---- indexer-fp8 pages against vLLM's writer (ADR 0043) -----------------------------------------
// tests/data/golden/indexer_fp8_v32.txt: 8 bf16 keys written at 8 slots of two 16-token blocks by
// vLLM's references (tests/data/golden/PROVENANCE.md): the records of _ue8m0_reference, placed as
// indexer_k_quant_and_cache_kernel places them (a block's keys, then its scales).
struct IndexerGolden {
  uint32_t block_tokens = 0;
  std::vector<uint64_t> slots;
  std::vector<std::vector<float>> keys;
  std::vector<std::vector<std::byte>> records;
  std::vector<std::byte> region_major_pages;
};

std::vector<std::byte> Unhex(const std::string& h) {
  std::vector<std::byte> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = std::byte{static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16))};
  return out;
}

IndexerGolden ReadIndexerGolden() {
  IndexerGolden g;
  std::ifstream f(std::string(TESSERA_TEST_DATA) + "/golden/indexer_fp8_v32.txt");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string word, v;
    in >> word;
    if (word == "block_tokens") in >> g.block_tokens;
    if (word == "region_major_pages") {
      in >> v;
      g.region_major_pages = Unhex(v);
    }
    if (word != "token") continue;
    uint64_t t = 0, slot = 0;
    std::string key, rec, w1, w2, w3;
    in >> t >> w1 >> slot >> w2 >> key >> w3 >> rec;
    g.slots.push_back(slot);
    std::vector<float> k;
    const std::vector<std::byte> kb = Unhex(key);
    for (size_t i = 0; i + 1 < kb.size(); i += 2) {
      k.push_back(
          Bf16ToFloat(static_cast<uint16_t>(static_cast<uint8_t>(kb[i]) | (static_cast<uint8_t>(kb[i + 1]) << 8))));
    }
    g.keys.push_back(std::move(k));
    g.records.push_back(Unhex(rec));
  }
  return g;
}

// Two blocks of one indexer-fp8 layer in `packing`, each golden key written through the format.
std::vector<std::byte> WriteIndexerPages(const IndexerGolden& g, std::optional<Packing> packing) {
  FormatDims d;
  d.model = "deepseek-v3.2";
  d.index_head_dim = 128;
  RecordFormat f = *BuildFormat("indexer-fp8", d, "indexer-format");
  if (packing.has_value()) {
    EXPECT_TRUE(SetIndexerPacking(f, *packing).ok());
  }
  BlockPoolOptions o;
  o.groups.push_back({"indexer", f, 1, *ComputePageLayout(f, 1, g.block_tokens)});
  o.capacity_blocks = 2;
  std::unique_ptr<BlockPool> pool = std::move(*BlockPool::Create(std::move(o)));
  std::vector<std::byte> out;
  for (uint32_t b = 0; b < 2; ++b) {
    std::span<std::byte> page = pool->MutableBytes(pool->BlockHandleOf(BlockId{b}, 0));
    std::memset(page.data(), 0, page.size());
  }
  for (size_t t = 0; t < g.slots.size(); ++t) {
    const RecordView v = pool->MutableRecord(BlockId{static_cast<uint32_t>(g.slots[t] / g.block_tokens)}, 0, 0,
                                             g.slots[t] % g.block_tokens);
    EXPECT_TRUE(WriteIndexerFp8(f, g.keys[t], v).ok());
    std::vector<std::byte> back(f.record_bytes());
    EXPECT_TRUE(CopyRecordOut(f, v, back).ok());
    EXPECT_EQ(back, g.records[t]) << "token " << t;  // the record, whatever the layout
  }
  for (uint32_t b = 0; b < 2; ++b) {
    std::span<const std::byte> page = pool->Bytes(pool->BlockHandleOf(BlockId{b}, 0));
    out.insert(out.end(), page.begin(), page.end());
  }
  return out;
}

TEST(IndexerPages, DefaultPagesAreByteIdenticalToVllms) {
  const IndexerGolden g = ReadIndexerGolden();
  ASSERT_EQ(g.slots.size(), 8u);
  ASSERT_EQ(g.region_major_pages.size(), 2u * 16 * 132);
  const std::vector<std::byte> pages = WriteIndexerPages(g, std::nullopt);
  ASSERT_EQ(pages.size(), g.region_major_pages.size());
  size_t first_diff = pages.size();
  for (size_t i = 0; i < pages.size() && first_diff == pages.size(); ++i) {
    if (pages[i] != g.region_major_pages[i]) first_diff = i;
  }
  EXPECT_EQ(first_diff, pages.size()) << "pages differ from vLLM's first at byte " << first_diff;
}

TEST(IndexerPages, PerTokenPagesKeepEachKeyBesideItsScale) {
  const IndexerGolden g = ReadIndexerGolden();
  const std::vector<std::byte> pages = WriteIndexerPages(g, Packing::kPerToken);
  ASSERT_EQ(pages.size(), g.region_major_pages.size());  // the same bytes per page, placed per token
  for (size_t t = 0; t < g.slots.size(); ++t) {
    const std::vector<std::byte> at(pages.begin() + static_cast<std::ptrdiff_t>(g.slots[t] * 132),
                                    pages.begin() + static_cast<std::ptrdiff_t>((g.slots[t] + 1) * 132));
    EXPECT_EQ(at, g.records[t]) << "token " << t;
  }
  EXPECT_NE(pages, g.region_major_pages);
}

TEST(IndexerPages, TheLayoutIsANamedOptionAndLedgerBytesDoNotChange) {
  CacheLayout rm = MustLayout(Preset("deepseek-v3.2"));
  CacheLayoutOptions o;
  o.indexer_packing = Packing::kPerToken;
  CacheLayout pt = MustLayout(Preset("deepseek-v3.2"), o);
  ASSERT_EQ(rm.groups.size(), 2u);
  ASSERT_EQ(pt.groups.size(), 2u);
  EXPECT_EQ(rm.groups[1].format.packing, Packing::kRegionMajor);
  EXPECT_EQ(rm.groups[1].format.plane_bytes(0), 128u);
  EXPECT_EQ(rm.groups[1].format.plane_bytes(1), 4u);
  EXPECT_EQ(pt.groups[1].format.packing, Packing::kPerToken);
  EXPECT_EQ(pt.groups[1].format.plane_count(), 1u);
  EXPECT_EQ(rm.groups[1].page.page_bytes, 64u * 132);  // vLLM's page: 64 x (128 + 4), unpadded
  EXPECT_EQ(pt.groups[1].page.page_bytes, rm.groups[1].page.page_bytes);
  EXPECT_EQ(*ParsePacking("region-major"), Packing::kRegionMajor);
  EXPECT_EQ(*ParsePacking("per-token"), Packing::kPerToken);
  EXPECT_EQ(ParsePacking("planar").status().field(), "indexer-layout");
}

}  // namespace
}  // namespace tessera
