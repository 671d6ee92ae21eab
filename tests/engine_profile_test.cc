// What every engine profile shares: the cost helpers, the engine names, and the ledger's totals
// as each profile's per-rank figures add up.
#include "ledger/engine_profile.h"

#include <gtest/gtest.h>

#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(EngineHelpers, WindowBlocksHeld) {
  EXPECT_EQ(detail::WindowBlocksHeld(0, 128, 64), 0u);
  EXPECT_EQ(detail::WindowBlocksHeld(100, 128, 64), 2u);
  EXPECT_EQ(detail::WindowBlocksHeld(128, 128, 64), 2u);
  EXPECT_EQ(detail::WindowBlocksHeld(129, 128, 64), 3u);  // tokens 1..128 span blocks 0..2
  EXPECT_EQ(detail::WindowBlocksHeld(192, 128, 64), 2u);
  EXPECT_EQ(detail::Entries(1000, 128).value(), 7u);
  EXPECT_EQ(detail::Entries(1000, 1).value(), 1000u);
}

TEST(EngineHelpers, BlocksByEntriesTokensOrWindow) {
  const PageLayout page = *ComputePageLayout(*BuildFormat("v4-fp8", Preset("deepseek-v4-pro")), 4, 256);
  detail::Policy by_entries{
      .in_pages = true, .block_tokens = 256, .entry_tokens = 4, .alignment = 0, .by_tokens = false, .window = 0};
  EXPECT_EQ(detail::Blocks(by_entries, page, 259), 1u);  // 64 complete entries fill one page
  EXPECT_EQ(detail::Blocks(by_entries, page, 260), 2u);
  detail::Policy by_tokens = by_entries;
  by_tokens.by_tokens = true;
  EXPECT_EQ(detail::Blocks(by_tokens, page, 257), 2u);
  detail::Policy window = by_tokens;
  window.block_tokens = 64;
  window.window = 128;
  EXPECT_EQ(detail::Blocks(window, page, 1000), 3u);
}

TEST(EngineHelpers, RingCostDoublesCompressorRingsUnderSpeculation) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(8192));
  const CacheLine& window = *l.FindLine("csa.window");
  const CacheLine& state = *l.FindLine("csa.compressor_state");
  detail::LineCost w = detail::RingCost(window, 100, 2);
  EXPECT_EQ(w.committed.value(), 30ULL * (128 + 2) * 584);
  detail::LineCost s = detail::RingCost(state, 100, 2);
  EXPECT_EQ(s.committed.value(), 30ULL * 16 * 8192);
  ASSERT_EQ(s.terms.size(), 3u);
  EXPECT_EQ(s.terms[0].first, LedgerTerm::kRecords);
  EXPECT_EQ(s.terms[1].first, LedgerTerm::kRingCapacity);
  EXPECT_EQ(s.terms[1].second.value(), 0u);  // 100 tokens fill an 8-slot ring
  EXPECT_EQ(s.terms[2].first, LedgerTerm::kSpeculativeSlots);
}

TEST(EngineHelpers, BoundaryBytesOfDeepSeekV4Pro) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(8192));
  detail::BoundaryBytes b = *detail::WindowBoundaryBytes(l.lines);
  EXPECT_EQ(b.window_tokens, 128u);
  EXPECT_EQ(b.window, 61ULL * 128 * 584);
  EXPECT_EQ(b.compressor, 30ULL * 4 * 8192 + 30ULL * 4 * 2048);
  EXPECT_EQ(detail::WindowBoundaryBytes(MustLedger(Preset("deepseek-v3"), Context(8)).lines)->window_tokens, 0u);
}

// Every engine's terms add up to its committed bytes, on every preset, and it reports the three
// phases in order.
TEST(EngineProfiles, TermsAddUpAndPhasesAreInOrder) {
  for (const std::string& name : PresetNames()) {
    for (Engine e : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
      for (uint64_t n : {uint64_t{1}, uint64_t{1000}, uint64_t{131072}}) {
        Ledger l = MustLedger(Preset(name), Context(n, "", e));
        uint64_t sum = 0;
        for (const Term& t : l.terms) sum += t.bytes;
        EXPECT_EQ(sum, l.committed_bytes) << name << " " << EngineName(e) << " " << n;
        ASSERT_EQ(l.phases.size(), 3u);
        EXPECT_EQ(l.phases[0].phase, LedgerPhase::kAdmission);
        EXPECT_EQ(l.phases[1].phase, LedgerPhase::kPrefillPeak);
        EXPECT_EQ(l.phases[2].phase, LedgerPhase::kDecode);
      }
    }
  }
}

// The phases against figures derived by hand. DeepSeek-V3 (bf16 latent: 576 x 2 = 1,152 B a
// token and layer, 61 layers) at 1,000 tokens in 64-token pages: 16 pages, 1,024 token slots,
// 61 x 1,024 x 1,152 = 71,958,528 B at the prefill peak and after the first decode step (1,001
// tokens) for every engine; Tessera adds its host metadata, 16 x (64 + 64 x 4) = 5,120 B.
// Tessera (the first chunk is the whole prompt) and vLLM admit on those pages; SGLang admits when more than the prompt,
// its default 128 new tokens and a page are free: 1,000 + 128 + 64 = 1,192 tokens, so 19 pages (1,216 tokens), 19 x 61
// x 64 x 1,152 = 85,450,752 B (sglang_profile_test pins it to SGLang's own gate).
TEST(EngineProfiles, PhasesOfDeepSeekV3ByHand) {
  for (Engine e : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
    SCOPED_TRACE(std::string(EngineName(e)));
    Ledger l = MustLedger(Preset("deepseek-v3"), Context(1000, "", e));
    const uint64_t expected = 71958528u + (e == Engine::kTessera ? 5120u : 0u);
    const uint64_t admission = e == Engine::kSglang ? 85450752u : expected;
    ASSERT_EQ(l.phases.size(), 3u);
    EXPECT_EQ(l.committed_bytes, expected);
    EXPECT_EQ(l.reserved_at_admission_bytes, admission);
    EXPECT_EQ(l.phases[0].bytes, admission);
    EXPECT_EQ(l.phases[1].bytes, expected);
    EXPECT_EQ(l.phases[2].bytes, expected);
  }
}

TEST(EngineProfiles, TermAndPhaseNames) {
  EXPECT_EQ(LedgerTermName(LedgerTerm::kRecords), "records");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kPageRounding), "page_rounding");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kAlignmentPadding), "alignment_padding");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kRingCapacity), "ring_capacity");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kSpeculativeSlots), "speculative_slots");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kBlockMetadata), "block_metadata");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kBoundaryState), "boundary_state");
  EXPECT_EQ(LedgerTermName(LedgerTerm::kUniformBlockPadding), "uniform_block_padding");
  EXPECT_EQ(LedgerPhaseName(LedgerPhase::kAdmission), "admission");
  EXPECT_EQ(LedgerPhaseName(LedgerPhase::kPrefillPeak), "prefill_peak");
  EXPECT_EQ(LedgerPhaseName(LedgerPhase::kDecode), "decode");
}

TEST(EngineErrors, UnknownEngineNamesTheField) {
  Result<Engine> e = ParseEngine("trt");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().field(), "engine");
}

}  // namespace
}  // namespace tessera
