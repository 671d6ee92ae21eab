#include "tessera/ledger.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;
using testing::SeedFixture;

constexpr uint64_t kGiB = 1ULL << 30;

// --- The seed guide's fixture -------------------------------------------------------------

TEST(LedgerFixture, StandardAndLatentBytes) {
  Geometry g = SeedFixture();
  Ledger l = MustLedger(g, Context(4));
  EXPECT_EQ(l.mha_equivalent_bytes, 32768u);
  EXPECT_EQ(l.requested_bytes, 9216u);
  ASSERT_EQ(l.lines.size(), 1u);
  EXPECT_EQ(l.lines[0].shape, (std::vector<uint64_t>{2, 1, 4, 576}));
  EXPECT_EQ(l.lines[0].shape_unit, "elements");
  // The MHA format itself gives the same "standard" figure.
  EXPECT_EQ(MustLedger(g, Context(4, "mha-bf16")).requested_bytes, 32768u);
}

TEST(LedgerFixture, ScalesWithTokensAndBatch) {
  Geometry g = SeedFixture();
  EXPECT_EQ(MustLedger(g, Context(8)).requested_bytes, 18432u);
  LedgerOptions o = Context(4);
  o.batch = 3;
  Ledger l = MustLedger(g, o);
  EXPECT_EQ(l.mha_equivalent_bytes, 98304u);
  EXPECT_EQ(l.requested_bytes, 3u * 9216u);
  EXPECT_EQ(l.lines[0].shape, (std::vector<uint64_t>{2, 3, 4, 576}));
}

TEST(LedgerFixture, LatentIsUnderThirtyPercent) {
  Ledger l = MustLedger(SeedFixture(), Context(4));
  EXPECT_LT(l.requested_bytes * 10, l.mha_equivalent_bytes * 3);
  EXPECT_EQ(l.mha_ratio, Fraction(32768, 9216));
}

TEST(LedgerFixture, LatentRankDeltaIsLayersTimesBatchTimesTokensTimesWidth) {
  Geometry g = SeedFixture();
  Geometry g2 = g;
  g2.latent_dim += 1;
  g2.kv_lora_rank += 1;
  // 2 layers x 1 batch x 4 tokens x 2 B
  EXPECT_EQ(MustLedger(g2, Context(4)).requested_bytes - MustLedger(g, Context(4)).requested_bytes, 16u);
}

TEST(LedgerFixture, RopeZeroNamesTheRopeDimension) {
  Result<Geometry> g = GeometryFromConfigJson(
      R"({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "kv_lora_rank": 512,
          "qk_rope_head_dim": 0, "qk_nope_head_dim": 128, "v_head_dim": 128})",
      "fixture");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "qk_rope_head_dim");
}

TEST(LedgerFixture, RepeatedCallsAreIdentical) {
  Geometry g = SeedFixture();
  Ledger a = MustLedger(g, Context(4));
  Ledger b = MustLedger(g, Context(4));
  EXPECT_EQ(a.requested_bytes, b.requested_bytes);
  EXPECT_EQ(a.committed_bytes, b.committed_bytes);
  EXPECT_EQ(a.lines[0].shape, b.lines[0].shape);
  EXPECT_EQ(a.terms.size(), b.terms.size());
}

// --- DeepSeek-V3 ---------------------------------------------------------------------------

TEST(LedgerV3, BytesPerTokenPerLayer) {
  Geometry g = Preset("deepseek-v3");
  EXPECT_EQ(MustLedger(g, Context(1, "mha-bf16")).lines[0].bytes_per_token_per_layer, Fraction::Integer(65536));
  EXPECT_EQ(MustLedger(g, Context(1, "mla-bf16")).lines[0].bytes_per_token_per_layer, Fraction::Integer(1152));
  EXPECT_EQ(MustLedger(g, Context(1, "fp8_ds_mla")).lines[0].bytes_per_token_per_layer, Fraction::Integer(656));
}

TEST(LedgerV3, At128kExactly) {
  Geometry g = Preset("deepseek-v3");
  const uint64_t n = 131072;
  Ledger mha = MustLedger(g, Context(n, "mha-bf16"));
  Ledger bf16 = MustLedger(g, Context(n, "mla-bf16"));
  Ledger fp8 = MustLedger(g, Context(n, "fp8_ds_mla"));
  EXPECT_EQ(mha.requested_bytes, 488 * kGiB);
  EXPECT_EQ(mha.requested_bytes, 523986010112ULL);
  EXPECT_EQ(bf16.requested_bytes, 9210691584ULL);  // 8.578125 GiB
  EXPECT_EQ(bf16.requested_bytes * 64, 549 * kGiB);
  EXPECT_EQ(fp8.requested_bytes, 5244977152ULL);  // 4.884765625 GiB
  EXPECT_EQ(fp8.requested_bytes * 1024, 5002 * kGiB);
  EXPECT_EQ(bf16.mha_equivalent_bytes, mha.requested_bytes);
  EXPECT_EQ(bf16.mha_ratio, Fraction(512, 9));
}

TEST(LedgerV3, DefaultFormatAndBlock) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(131072));
  EXPECT_EQ(l.kv_format, "mla-bf16");
  EXPECT_EQ(l.block_tokens, 64u);
  EXPECT_EQ(l.layers_counted, 61u);
  // 131072 is whole pages: the only overhead is Tessera's host block metadata.
  EXPECT_EQ(l.TermBytes(LedgerTerm::kPageRounding), 0u);
  EXPECT_EQ(l.committed_bytes, l.requested_bytes + l.TermBytes(LedgerTerm::kBlockMetadata));
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 2048u * BlockMetadataBytes(64));
}

TEST(LedgerV3, ReadBytesPerTokenIsEveryCachedToken) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(131072));
  EXPECT_EQ(l.read_bytes_per_token, l.requested_bytes);
}

TEST(LedgerV3, MtpIsExplicitAndOffByDefault) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(131072);
  Ledger without = MustLedger(g, o);
  o.include_mtp = true;
  Ledger with = MustLedger(g, o);
  EXPECT_EQ(with.layers_counted, 62u);
  EXPECT_EQ(with.requested_bytes, without.requested_bytes / 61 * 62);
  ASSERT_NE(with.FindLine("mtp.mla.latent"), nullptr);
  EXPECT_EQ(without.FindLine("mtp.mla.latent"), nullptr);
}

// --- DeepSeek-V3.2 --------------------------------------------------------------------------

TEST(LedgerV32, IndexerMakes788BytesPerTokenLayer) {
  Ledger l = MustLedger(Preset("deepseek-v3.2"), Context(8192));
  EXPECT_EQ(l.kv_format, "fp8_ds_mla");
  EXPECT_EQ(l.indexer_format, "indexer-fp8");
  const LayerKindSummary* k = l.FindKind(LayerKind::kMlaSparse);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->paged_bytes_per_token, Fraction::Integer(788));
  EXPECT_EQ(l.requested_bytes, 788ULL * 61 * 8192);
}

TEST(LedgerV32, SparseReadIsTopKPlusIndexerScan) {
  Ledger l = MustLedger(Preset("deepseek-v3.2"), Context(131072));
  // top-k 2048 records + the indexer scans every token
  EXPECT_EQ(l.read_bytes_per_token, 61ULL * (2048 * 656 + 131072 * 132));
}

// --- DeepSeek-V4 ----------------------------------------------------------------------------

TEST(LedgerV4, StructuralSeedFigures) {
  for (const char* model : {"deepseek-v4-pro", "deepseek-v4-flash"}) {
    Ledger l = MustLedger(Preset(model), Context(1048576, "v4-seed"));
    EXPECT_EQ(l.indexer_format, "indexer-fp4-seed");
    EXPECT_EQ(l.FindKind(LayerKind::kCsa)->paged_bytes_per_token, Fraction::Integer(160)) << model;
    EXPECT_EQ(l.FindKind(LayerKind::kHca)->paged_bytes_per_token, Fraction(9, 2)) << model;
    EXPECT_EQ(l.FindKind(LayerKind::kCsa)->window_bytes_per_token, 576u) << model;
  }
  Ledger flash = MustLedger(Preset("deepseek-v4-flash"), Context(1048576, "v4-seed"));
  EXPECT_EQ(flash.FindKind(LayerKind::kSwa)->window_bytes_per_token, 576u);
  EXPECT_EQ(flash.FindKind(LayerKind::kSwa)->paged_bytes_per_token, Fraction());
}

TEST(LedgerV4, RealRecords) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  EXPECT_EQ(l.kv_format, "v4-fp8");
  EXPECT_EQ(l.FindKind(LayerKind::kHca)->paged_bytes_per_token, Fraction(73, 16));
  EXPECT_EQ(l.FindKind(LayerKind::kCsa)->paged_bytes_per_token, Fraction::Integer(179));  // 146 + 33
  LedgerOptions o = Context(1048576);
  o.indexer_format = "indexer-mxfp4";
  EXPECT_EQ(MustLedger(Preset("deepseek-v4-pro"), o).FindKind(LayerKind::kCsa)->paged_bytes_per_token,
            Fraction::Integer(163));
}

TEST(LedgerV4, LayerCountsFromCompressRatios) {
  Ledger pro = MustLedger(Preset("deepseek-v4-pro"), Context(8192));
  EXPECT_EQ(pro.FindKind(LayerKind::kCsa)->layers, 30u);
  EXPECT_EQ(pro.FindKind(LayerKind::kHca)->layers, 31u);
  EXPECT_EQ(pro.FindKind(LayerKind::kSwa), nullptr);
  Ledger flash = MustLedger(Preset("deepseek-v4-flash"), Context(8192));
  EXPECT_EQ(flash.FindKind(LayerKind::kCsa)->layers, 21u);
  EXPECT_EQ(flash.FindKind(LayerKind::kHca)->layers, 20u);
  EXPECT_EQ(flash.FindKind(LayerKind::kSwa)->layers, 2u);
}

TEST(LedgerV4, WindowAndCompressorStateAreConstantPerRequest) {
  Geometry g = Preset("deepseek-v4-pro");
  Ledger a = MustLedger(g, Context(131072));
  Ledger b = MustLedger(g, Context(1048576));
  for (const char* name :
       {"csa.window", "hca.window", "csa.compressor_state", "hca.compressor_state", "csa.indexer_compressor_state"}) {
    ASSERT_NE(a.FindLine(name), nullptr) << name;
    EXPECT_FALSE(a.FindLine(name)->grows) << name;
    EXPECT_EQ(a.FindLine(name)->committed_bytes, b.FindLine(name)->committed_bytes) << name;
  }
  EXPECT_EQ(a.FindLine("hca.window")->committed_bytes, 31u * 128 * 584);
  EXPECT_EQ(a.FindLine("csa.compressor_state")->committed_bytes, 30u * 8 * 8192);
  EXPECT_EQ(a.FindLine("hca.compressor_state")->committed_bytes, 31u * 128 * 4096);
  EXPECT_GT(a.TermBytes(LedgerTerm::kRingCapacity) + a.TermBytes(LedgerTerm::kRecords), 0u);
}

TEST(LedgerV4, StructuralBytesAt1M) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  // compressed 584 B entries + fp8 indexer + 128-token windows + fp32 compressor rings
  uint64_t expect = 30ULL * 262144 * 584 + 30ULL * 262144 * 132 + 31ULL * 8192 * 584 + 61ULL * 128 * 584 +
                    30ULL * 8 * 8192 + 30ULL * 8 * 2048 + 31ULL * 128 * 4096;
  EXPECT_EQ(l.requested_bytes, expect);
  EXPECT_EQ(l.requested_bytes, 5802431488ULL);
}

TEST(LedgerV4, DecodeReadsTopKIndexerScanAndWindow) {
  Geometry g = Preset("deepseek-v4-pro");
  Ledger l = MustLedger(g, Context(1048576));
  uint64_t csa = 30ULL * (1024 * 584 + 262144 * 132 + 128 * 584);
  uint64_t hca = 31ULL * (8192 * 584 + 128 * 584);
  EXPECT_EQ(l.read_bytes_per_token, csa + hca);
}

// --- Page rounding, TP, DCP, speculative slots -------------------------------------------

TEST(LedgerTerms, PageRoundingCommitsWholePages) {
  Geometry g = Preset("deepseek-v3");
  Ledger l = MustLedger(g, Context(100));  // 2 pages of 64 tokens
  EXPECT_EQ(l.requested_bytes, 61ULL * 100 * 1152);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kPageRounding), 61ULL * 28 * 1152);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 2 * BlockMetadataBytes(64));
  EXPECT_EQ(l.committed_bytes, 61ULL * 128 * 1152 + 2 * BlockMetadataBytes(64));
  uint64_t sum = 0;
  for (const Term& t : l.terms) sum += t.bytes;
  EXPECT_EQ(sum, l.committed_bytes);
}

// mla-fp8 (576-B e4m3 records, the scale outside the cache) under every engine: half of mla-bf16's
// bytes, the same pages of 64 tokens, nothing else changed.
TEST(LedgerFormats, MlaFp8HalvesTheDenseLatentEverywhere) {
  Geometry g = Preset("deepseek-v3");
  for (Engine e : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
    Ledger fp8 = MustLedger(g, Context(100, "mla-fp8", e));
    Ledger bf16 = MustLedger(g, Context(100, "mla-bf16", e));
    SCOPED_TRACE(std::string(EngineName(e)));
    EXPECT_EQ(fp8.lines[0].format.record_bytes(), 576u);
    EXPECT_EQ(fp8.requested_bytes, 61ULL * 100 * 576);
    EXPECT_EQ(fp8.requested_bytes * 2, bf16.requested_bytes);
    EXPECT_EQ(fp8.TermBytes(LedgerTerm::kRecords) * 2, bf16.TermBytes(LedgerTerm::kRecords));
    EXPECT_EQ(fp8.TermBytes(LedgerTerm::kPageRounding) * 2, bf16.TermBytes(LedgerTerm::kPageRounding));
    EXPECT_EQ(fp8.TermBytes(LedgerTerm::kAlignmentPadding), 0u);
  }
  // vLLM: 2 blocks of 64 tokens x 576 B x 61 layers.
  EXPECT_EQ(MustLedger(g, Context(100, "mla-fp8", Engine::kVllm)).committed_bytes, 61ULL * 128 * 576);
}

TEST(LedgerTerms, CompressedPagesRoundByCompleteEntries) {
  // 300 tokens of V4-Pro: 75 complete C4 entries need 2 pages of 64, so 2 block ids; a block id
  // has a page in every group of its span, so the 2 C128 entries also sit in 2 pages of 2. The
  // groups' layers share packed pages (ADR 0020): a line commits its slices (64 x 584 and 2 x
  // 584 B per layer and block), the pages' padding is a term of the request.
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(300));
  const CacheLine* c4 = l.FindLine("csa.compressed");
  ASSERT_NE(c4, nullptr);
  EXPECT_EQ(c4->committed_bytes, 30ULL * 2 * 37376);
  const CacheLine* c128 = l.FindLine("hca.compressed");
  EXPECT_EQ(c128->committed_bytes, 31ULL * 2 * 1168);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kAlignmentPadding), 2ULL * (192 + 80));
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 2 * BlockMetadataBytes(256));
  // 259 tokens: 64 complete C4 entries fill block 0; the second span has none yet.
  Ledger at259 = MustLedger(Preset("deepseek-v4-pro"), Context(259));
  EXPECT_EQ(at259.FindLine("csa.compressed")->committed_bytes, 30ULL * 1 * 37376);
  Ledger at260 = MustLedger(Preset("deepseek-v4-pro"), Context(260));
  EXPECT_EQ(at260.FindLine("csa.compressed")->committed_bytes, 30ULL * 2 * 37376);
}

TEST(LedgerTerms, AlignmentPaddingIsNamed) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  // 4096 blocks: one packed C4 page pads 192 B (30 x 37,376 -> 1,947 x 576), one packed C128
  // page 80 B (31 x 1,168 -> 63 x 576); the indexer is not padded (ADR 0020). Unpacked, every
  // layer's page is padded: C4 64 B, C128 560 B.
  EXPECT_EQ(l.TermBytes(LedgerTerm::kAlignmentPadding), 4096ULL * (192 + 80));
}

TEST(LedgerTerms, TensorParallelReplicatesTheLatent) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(131072);
  Ledger one = MustLedger(g, o);
  o.tp = 8;
  Ledger eight = MustLedger(g, o);
  EXPECT_EQ(eight.committed_bytes, one.committed_bytes);
  EXPECT_EQ(eight.committed_bytes_all_ranks, 8 * one.committed_bytes);
  EXPECT_EQ(eight.requested_bytes, one.requested_bytes);
}

TEST(LedgerTerms, TensorParallelShardsGqaHeads) {
  Geometry g = Preset("llama-3.1-70b");
  LedgerOptions o = Context(131072);
  Ledger one = MustLedger(g, o);
  EXPECT_EQ(one.lines[0].bytes_per_token_per_layer, Fraction::Integer(4096));
  o.tp = 8;
  Ledger eight = MustLedger(g, o);
  EXPECT_EQ(eight.committed_bytes * 8, eight.committed_bytes_all_ranks);
  EXPECT_EQ(eight.lines[0].format.record_bytes(), 512u);  // one KV head per rank
  o.tp = 16;                                              // 8 KV heads over 16 ranks: each head on two ranks
  Ledger sixteen = MustLedger(g, o);
  EXPECT_EQ(sixteen.committed_bytes, eight.committed_bytes);
}

TEST(LedgerTerms, DecodeContextParallelShardsTokens) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(131072);
  o.tp = 8;
  o.dcp = 8;
  Ledger l = MustLedger(g, o);
  EXPECT_EQ(l.tokens_per_rank, 16384u);
  EXPECT_EQ(l.committed_bytes, 61ULL * 16384 * 1152 + 256 * BlockMetadataBytes(64));
  EXPECT_EQ(l.committed_bytes_all_ranks, 8 * l.committed_bytes);
  EXPECT_EQ(l.read_bytes_per_token, 61ULL * 16384 * 1152);
}

TEST(LedgerTerms, SpeculativeSlots) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(128);
  o.spec_tokens = 3;
  Ledger l = MustLedger(g, o);
  // 131 tokens need a third page of 64.
  EXPECT_EQ(l.TermBytes(LedgerTerm::kSpeculativeSlots), 61ULL * 64 * 1152);
  LedgerOptions v4 = Context(1048576);
  v4.spec_tokens = 2;
  Ledger p = MustLedger(Preset("deepseek-v4-pro"), v4);
  // window rings grow by 2 slots, compressor rings double
  uint64_t ring = 61ULL * 2 * 584;
  uint64_t comp = 30ULL * 8 * 8192 + 30ULL * 8 * 2048 + 31ULL * 128 * 4096;
  EXPECT_EQ(p.TermBytes(LedgerTerm::kSpeculativeSlots), ring + comp);
}

// --- Bad options --------------------------------------------------------------------------

// --- Limits stated (issue 22 point 2; ADR 0034) ---------------------------------------------

int CountNotesWith(const Ledger& l, const std::string& text) {
  int n = 0;
  for (const std::string& note : l.notes) n += note.find(text) != std::string::npos ? 1 : 0;
  return n;
}

TEST(LedgerLimits, NoteWhenTheContextExceedsMaxPositionEmbeddings) {
  Geometry g = Preset("deepseek-v3");
  ASSERT_EQ(g.max_position_embeddings, 163840u);
  for (Engine e : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
    Ledger at_max = MustLedger(g, Context(163840, "", e));
    EXPECT_EQ(CountNotesWith(at_max, "max_position_embeddings"), 0) << EngineName(e);
    Ledger past = MustLedger(g, Context(1 << 20, "", e));
    EXPECT_EQ(CountNotesWith(past, "context 1,048,576 tokens exceeds the model's max_position_embeddings 163,840"), 1)
        << EngineName(e);
  }
  EXPECT_EQ(CountNotesWith(MustLedger(g, Context(1 << 20, "", Engine::kVllm)), "--max-model-len"), 1);
  EXPECT_EQ(CountNotesWith(MustLedger(g, Context(1 << 20, "", Engine::kSglang)), "--context-length"), 1);
}

TEST(LedgerLimits, TheNoteFollowsEachContextOfASweep) {
  Geometry g = Preset("deepseek-v3");
  LedgerSweep sweep(g, Context(1, "", Engine::kVllm));
  Result<Ledger> past = sweep.LedgerAt(1 << 20);
  ASSERT_TRUE(past.ok()) << past.status().ToString();
  EXPECT_EQ(CountNotesWith(*past, "max_position_embeddings"), 1);
  Result<Ledger> within = sweep.LedgerAt(8192);
  ASSERT_TRUE(within.ok()) << within.status().ToString();
  EXPECT_EQ(CountNotesWith(*within, "max_position_embeddings"), 0);
  EXPECT_EQ(within->notes, MustLedger(g, Context(8192, "", Engine::kVllm)).notes);
}

TEST(LedgerLimits, MaxModelLenRefusesLongerContextsNamingTheField) {
  Geometry g = Preset("deepseek-v3");
  for (Engine e : {Engine::kVllm, Engine::kSglang}) {
    LedgerOptions o = Context(131073, "", e);
    o.max_model_len = 131072;
    Result<Ledger> l = ComputeLedger(g, o);
    ASSERT_FALSE(l.ok()) << EngineName(e);
    EXPECT_EQ(l.status().field(), "max-model-len") << l.status().ToString();
    o.context_tokens = 131072;
    EXPECT_TRUE(ComputeLedger(g, o).ok()) << EngineName(e);
    o.max_model_len = 0;
    EXPECT_EQ(ComputeLedger(g, o).status().field(), "max-model-len");
  }
  // Tessera's pools have no such cap: the option is refused, not ignored.
  LedgerOptions o = Context(8192);
  o.max_model_len = 131072;
  EXPECT_EQ(ComputeLedger(g, o).status().field(), "max-model-len");
}

// vLLM caps a request's slots at max_model_len: at a context of exactly max_position_embeddings
// (2,560 pages of 64 tokens) the decode step's sampled token and draft tokens fall past the cap by
// default, and take one more page once --max-model-len leaves room for them.
TEST(LedgerLimits, MaxModelLenIsVllmsSlotCap) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(163840, "", Engine::kVllm);
  o.spec_tokens = 2;
  const Ledger capped = MustLedger(g, o);
  o.max_model_len = 163840;
  EXPECT_EQ(MustLedger(g, o).committed_bytes, capped.committed_bytes);
  o.max_model_len = 200000;
  const Ledger roomy = MustLedger(g, o);
  const CacheLine* line = capped.FindLine(capped.lines[0].name);
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(roomy.committed_bytes - capped.committed_bytes, uint64_t{line->page.page_bytes} * line->layers);
}

TEST(LedgerErrors, OptionsNameTheField) {
  Geometry g = Preset("deepseek-v3");
  struct Case {
    LedgerOptions o;
    const char* field;
  };
  std::vector<Case> cases;
  LedgerOptions o = Context(0);
  cases.push_back({o, "context"});
  o = Context(8);
  o.batch = 0;
  cases.push_back({o, "batch"});
  o = Context(8);
  o.tp = 0;
  cases.push_back({o, "tp"});
  o = Context(8);
  o.tp = 4;
  o.dcp = 3;
  cases.push_back({o, "dcp"});
  o = Context(8, "nope");
  cases.push_back({o, "kv-format"});
  o = Context(8, "indexer-fp8");
  cases.push_back({o, "kv-format"});
  o = Context(8);
  o.indexer_format = "indexer-fp8";
  cases.push_back({o, "indexer-format"});
  o = Context(8);
  o.block_tokens = 0;
  cases.push_back({o, "block-tokens"});
  for (const Case& c : cases) {
    Result<Ledger> l = ComputeLedger(g, c.o);
    ASSERT_FALSE(l.ok()) << c.field;
    EXPECT_EQ(l.status().field(), c.field) << l.status().ToString();
  }
}

TEST(LedgerErrors, V4BlockNotAMultipleOf128) {
  LedgerOptions o = Context(8192);
  o.block_tokens = 100;
  Result<Ledger> l = ComputeLedger(Preset("deepseek-v4-pro"), o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().field(), "block-tokens");
  EXPECT_NE(l.status().message().find("compress ratio 128"), std::string::npos);
}

TEST(LedgerErrors, OverflowIsCheckedNotWrapped) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(1048576);
  o.batch = 1ULL << 40;
  Result<Ledger> l = ComputeLedger(g, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(l.status().field(), "batch");
  o.batch = 1;
  o.context_tokens = 1ULL << 60;
  Result<Ledger> c = ComputeLedger(g, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().field(), "context");
}

// The MHA-equivalent baseline, 2 x heads x head_dim x 2 B, from two 32-bit config numbers:
// it wrapped, and the ledger printed a ratio against a wrapped figure.
TEST(LedgerErrors, MhaBaselineOverflowIsChecked) {
  Geometry g = testing::FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 4294967295,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 4294967295})");
  Result<Ledger> l = ComputeLedger(g, Context(8));
  ASSERT_FALSE(l.ok()) << l->mha_bytes_per_token_per_layer;
  EXPECT_EQ(l.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(l.status().field(), "head_dim");
}

TEST(LedgerErrors, LargestBatchThatFitsStillComputes) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(1048576);
  o.batch = 100000;  // 7.4 PB of latents: large, but exact
  Ledger l = MustLedger(g, o);
  EXPECT_EQ(l.requested_bytes, 1152ULL * 61 * 1048576 * 100000);
}

}  // namespace
}  // namespace tessera
