// Tessera's own pools: the block span and pages of ComputeCacheLayout, block metadata per block
// id, the per-request arena, and the window state kept per boundary under each strategy.
#include <gtest/gtest.h>

#include "tessera/layout.h"
#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(EngineTessera, SwaStrategiesPerBoundary) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  ASSERT_EQ(l.swa_strategies.size(), 3u);
  const uint64_t window = 61ULL * 128 * 584;                     // every layer's ring
  const uint64_t overlap = 30ULL * 4 * 8192 + 30ULL * 4 * 2048;  // CSA previous-group rows
  EXPECT_EQ(l.swa_strategies[0].strategy, SwaStrategy::kRecompute);
  EXPECT_EQ(l.swa_strategies[0].bytes_kept_per_boundary, 0u);
  EXPECT_EQ(l.swa_strategies[0].tokens_recomputed_per_hit, 128u);
  EXPECT_EQ(l.swa_strategies[1].bytes_kept_per_boundary, window + overlap);
  EXPECT_EQ(l.swa_strategies[1].bytes_copied_per_boundary, window + overlap);
  EXPECT_EQ(l.swa_strategies[2].bytes_kept_per_boundary, window + overlap);
  EXPECT_EQ(l.swa_strategies[2].bytes_copied_per_boundary, overlap);
  EXPECT_EQ(l.cached_boundaries, 4096u);
  LedgerOptions o = Context(1048576);
  o.swa_strategy = SwaStrategy::kSnapshot;
  Ledger snap = MustLedger(Preset("deepseek-v4-pro"), o);
  EXPECT_EQ(snap.TermBytes(LedgerTerm::kBoundaryState), 4096ULL * (window + overlap));
  o.swa_strategy = SwaStrategy::kRetain;
  Ledger keep = MustLedger(Preset("deepseek-v4-pro"), o);
  // 1M is a multiple of 128: one live chunk (the last boundary's) and 4,095 retained ones.
  EXPECT_EQ(keep.TermBytes(LedgerTerm::kBoundaryState), 4096ULL * overlap + 4095ULL * window);
  EXPECT_EQ(keep.FindLine("csa.window")->committed_bytes, 30ULL * 128 * 584);
}

TEST(EngineTessera, V4StateLivesInTheArena) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  EXPECT_EQ(l.block_tokens, 256u);
  EXPECT_TRUE(l.FindLine("csa.compressed")->in_pages);
  EXPECT_FALSE(l.FindLine("csa.window")->in_pages);
  EXPECT_FALSE(l.FindLine("hca.compressor_state")->in_pages);
  // Tessera holds structural bytes plus page rounding, padding and block metadata only.
  EXPECT_EQ(l.committed_bytes, l.requested_bytes + l.TermBytes(LedgerTerm::kPageRounding) +
                                   l.TermBytes(LedgerTerm::kAlignmentPadding) +
                                   l.TermBytes(LedgerTerm::kBlockMetadata));
  // At admission it needs the arena and the first 8,192-token prefill chunk's pages; the peak
  // of a chunked prefill is the final holding.
  Ledger first = MustLedger(Preset("deepseek-v4-pro"), Context(8192));
  ASSERT_EQ(l.phases.size(), 3u);
  EXPECT_EQ(l.phases[0].phase, LedgerPhase::kAdmission);
  EXPECT_EQ(l.phases[0].bytes, first.committed_bytes);
  EXPECT_EQ(l.reserved_at_admission_bytes, first.committed_bytes);
  EXPECT_EQ(l.phases[1].bytes, l.committed_bytes);
  EXPECT_EQ(l.phases[2].bytes, l.committed_bytes);
}

// The ledger's Tessera pages are the pools' pages: both come from ComputeCacheLayout.
TEST(EngineTessera, PagesAndGroupsAreTheCacheLayouts) {
  for (const std::string& name : PresetNames()) {
    const Geometry g = Preset(name);
    Ledger l = MustLedger(g, Context(8192));
    CacheLayout layout = *ComputeCacheLayout(g, CacheLayoutOptions{});
    EXPECT_EQ(l.block_tokens, layout.block.block_tokens) << name;
    ASSERT_EQ(l.lines.size(), layout.lines.size()) << name;
    ASSERT_EQ(l.groups.size(), layout.groups.size()) << name;
    for (size_t i = 0; i < l.lines.size(); ++i) {
      const CacheGroup& group = layout.groups[layout.group_of_line[i]];
      EXPECT_EQ(l.lines[i].in_pages, group.in_pages) << l.lines[i].name;
      if (group.in_pages) {
        EXPECT_EQ(l.lines[i].page.page_bytes, group.page.page_bytes) << l.lines[i].name;
        EXPECT_EQ(l.lines[i].page.layers_per_page, group.page.layers_per_page) << l.lines[i].name;
      }
    }
  }
}

// ADR 0020 (issue 12 section 6): with the padded groups' layers packed into one page per block,
// DeepSeek-V4 commits within 0.5% of its structural bytes at prefill peak and decode. Before
// the packing: V4-Pro +1.399% (128K) and +1.438% (1M), V4-Flash +1.342% and +1.378%.
TEST(EngineTessera, V4CommitsWithinHalfAPercentOfStructural) {
  struct Case {
    const char* model;
    uint64_t tokens;
    uint64_t padding_per_block;  // the packed pages' padding: compressed/128 + compressed/4
    uint64_t committed;
  };
  // Pro: 80 B (31 x 1,168 -> 63 x 576) + 192 B (30 x 37,376 -> 1,947 x 576); Flash: 256 B
  // (20 x 1,168 -> 41 x 576) + 192 B (21 x 37,376 -> 1,363 x 576).
  const Case cases[] = {{"deepseek-v4-pro", 131072, 80 + 192, 746361856},
                        {"deepseek-v4-pro", 1048576, 80 + 192, 5808002048},
                        {"deepseek-v4-flash", 131072, 256 + 192, 520866816},
                        {"deepseek-v4-flash", 1048576, 256 + 192, 4058991616}};
  for (const Case& c : cases) {
    Ledger l = MustLedger(Preset(c.model), Context(c.tokens));
    const uint64_t blocks = c.tokens / 256;
    EXPECT_EQ(l.TermBytes(LedgerTerm::kAlignmentPadding), blocks * c.padding_per_block) << c.model << " " << c.tokens;
    EXPECT_EQ(l.TermBytes(LedgerTerm::kPageRounding), 0u) << c.model;
    EXPECT_EQ(l.committed_bytes, l.requested_bytes + blocks * c.padding_per_block + blocks * BlockMetadataBytes(256));
    EXPECT_EQ(l.committed_bytes, c.committed) << c.model << " " << c.tokens;
    ASSERT_EQ(l.phases.size(), 3u);
    for (size_t p : {1, 2}) {  // prefill peak, decode: (committed - structural) / structural <= 1/200
      EXPECT_LE((l.phases[p].bytes - l.requested_bytes) * 200, l.requested_bytes) << c.model << " " << c.tokens;
    }
  }
}

// A fresh 1M-token request is admitted with its first chunk's pages (and their blocks' host
// metadata) plus the arena, computed here from the layout alone.
TEST(EngineTessera, V4AdmissionIsTheFirstChunksPagesPlusTheArena) {
  for (const char* model : {"deepseek-v4-pro", "deepseek-v4-flash"}) {
    const Geometry g = Preset(model);
    CacheLayout layout = *ComputeCacheLayout(g, CacheLayoutOptions{});
    uint64_t block = 0, arena = 0;
    for (const CacheGroup& group : layout.groups) {
      if (group.in_pages) block += GroupBlockBytes(group.page, group.layers).value();
      if (!group.in_pages) arena += group.bytes_per_request;
    }
    const uint64_t chunk_blocks = 8192 / 256;
    Ledger l = MustLedger(g, Context(1048576));
    EXPECT_EQ(l.phases[0].bytes, chunk_blocks * (block + BlockMetadataBytes(256)) + arena) << model;
  }
  // V4-Pro: 32 x (36,288 + 1,121,472 + 30 x 8,448 + 1,088) + 23,270,400.
  EXPECT_EQ(MustLedger(Preset("deepseek-v4-pro"), Context(1048576)).phases[0].bytes, 68463616u);
}

// Decode context parallelism: the ranks holding one token more are the busiest; the others hold
// fewer blocks, and the sum over ranks counts each at its own holding.
TEST(EngineTessera, AllRanksWeighsTheDcpRanks) {
  LedgerOptions o = Context(64 * 8 + 1);  // one rank holds a second block
  o.tp = 8;
  o.dcp = 8;
  Ledger l = MustLedger(Preset("deepseek-v3"), o);
  EXPECT_EQ(l.tokens_per_rank, 65u);
  Ledger one = MustLedger(Preset("deepseek-v3"), Context(64));
  EXPECT_EQ(l.committed_bytes_all_ranks, l.committed_bytes + 7 * one.committed_bytes);
}

TEST(EngineTessera, RetainNeedsBlocksOfWholeWindows) {
  Geometry g = Preset("deepseek-v4-pro");
  for (LayerSpec& layer : g.layers) {
    for (CacheSpec& c : layer.caches) {
      if (c.role == CacheRole::kWindow) c.slots = 512;
    }
  }
  LedgerOptions o = Context(8192);
  o.swa_strategy = SwaStrategy::kRetain;
  EXPECT_EQ(ComputeLedger(g, o).status().field(), "swa-strategy");
  o.engine = Engine::kVllm;  // only Tessera keeps window chunks
  EXPECT_TRUE(ComputeLedger(g, o).ok());
}

}  // namespace
}  // namespace tessera
