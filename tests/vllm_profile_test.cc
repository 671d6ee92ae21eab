// vLLM's sizing rules: FlashMLA pages, DeepSeek-V4 page classes and groups, the uniform block-id
// cost, the admission reservation and the chunked-prefill peak.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "ledger/engine_profile.h"
#include "ledger/vllm_profile.h"
#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(EngineVllm, DeepSeekV3FlashMlaPages) {
  Ledger bf16 = MustLedger(Preset("deepseek-v3"), Context(100, "mla-bf16", Engine::kVllm));
  EXPECT_EQ(bf16.block_tokens, 64u);
  EXPECT_EQ(bf16.lines[0].page.page_bytes, 64u * 1152);
  EXPECT_EQ(bf16.committed_bytes, 61ULL * 2 * 64 * 1152);
  EXPECT_EQ(bf16.TermBytes(LedgerTerm::kBlockMetadata), 0u);
  Ledger fp8 = MustLedger(Preset("deepseek-v3"), Context(100, "fp8_ds_mla", Engine::kVllm));
  EXPECT_EQ(fp8.lines[0].page.page_bytes, 64u * 656);
}

TEST(EngineVllm, DeepSeekV32PagesAreUnpadded) {
  Ledger l = MustLedger(Preset("deepseek-v3.2"), Context(8192, "", Engine::kVllm));
  EXPECT_EQ(l.FindLine("dsa.latent")->page.page_bytes, 41984u);
  EXPECT_EQ(l.FindLine("dsa.indexer")->page.page_bytes, 8448u);
}

TEST(EngineVllm, DeepSeekV4ProPageSizes) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  EXPECT_EQ(l.FindLine("csa.compressed")->page.page_bytes, 37440u);
  EXPECT_EQ(l.FindLine("hca.compressed")->page.page_bytes, 1728u);
  EXPECT_EQ(l.FindLine("csa.indexer")->page.page_bytes, 8640u);
  EXPECT_EQ(l.FindLine("csa.window")->page.page_bytes, 37440u);
  EXPECT_EQ(l.FindLine("csa.window")->page.block_tokens, 64u);
  EXPECT_EQ(l.FindLine("csa.compressor_state")->page.page_bytes, 32832u);
  EXPECT_EQ(l.FindLine("csa.compressor_state")->page.block_tokens, 4u);
  EXPECT_EQ(l.FindLine("hca.compressor_state")->page.page_bytes, 32832u);
  EXPECT_EQ(l.FindLine("hca.compressor_state")->page.block_tokens, 8u);
  EXPECT_EQ(l.FindLine("csa.indexer_compressor_state")->page.page_bytes, 8640u);
}

TEST(EngineVllm, EveryBlockIdCostsTheSame) {
  Ledger pro = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  EXPECT_EQ(pro.block_id_bytes, (37440u + 8640u + 1728u) * 31u);
  EXPECT_EQ(pro.block_id_bytes, 1482048u);
  Ledger flash = MustLedger(Preset("deepseek-v4-flash"), Context(1048576, "", Engine::kVllm));
  EXPECT_EQ(flash.block_id_bytes, 1051776u);  // x 22 layer slots
}

TEST(EngineVllm, AdmissionReservationFor1MTokenV4Pro) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  // full group 4096 + two window groups x 131 + C4-state 2051 + C128-state 1041 block ids
  EXPECT_EQ(l.reserved_at_admission_bytes, 7450ULL * 1482048);
  EXPECT_EQ(l.reserved_at_admission_bytes, 11041257600ULL);  // 11.04 GB
  EXPECT_EQ(l.requested_bytes, 5802431488ULL);               // 5.80 GB structural
  // Held once prefill is done: far less than reserved, more than structural.
  EXPECT_GT(l.committed_bytes, l.requested_bytes);
  EXPECT_LT(l.committed_bytes, l.reserved_at_admission_bytes);
  uint64_t sum = 0;
  for (const Term& t : l.terms) sum += t.bytes;
  EXPECT_EQ(sum, l.committed_bytes);
}

TEST(EngineVllm, HeldBlocksAreBlockIdsTimesBlockCost) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  // full: 4096; windows (2 groups): blocks holding the last 128 tokens = 2 each;
  // C4 state: last 8 tokens in 4-token blocks = 2; C128 state: last 128 in 8-token blocks = 16.
  EXPECT_EQ(l.committed_bytes, (4096ULL + 2 * 2 + 2 + 16) * 1482048);
}

TEST(EngineVllm, PhasesOfA1MTokenV4ProRequest) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  ASSERT_EQ(l.phases.size(), 3u);
  EXPECT_EQ(l.phases[0].bytes, 11041257600ULL);
  // The last 8,192-token chunk: 4,096 full-group ids; windows hold 127 + 8,192 tokens (130 ids of
  // 64 tokens in each of 2 groups, the span being aligned); C4 state 7 + 8,192 (2,050 of 4);
  // C128 state 127 + 8,192 (1,040 of 8). The admission gate assumed one more per window group.
  EXPECT_EQ(l.phases[1].bytes, (4096ULL + 2 * 130 + 2050 + 1040) * 1482048);
  EXPECT_EQ(l.phases[2].bytes, l.committed_bytes);
  // Tessera at every phase: structural bytes plus page rounding (no reservation beyond it).
  Ledger t = MustLedger(Preset("deepseek-v4-pro"), Context(1048576));
  EXPECT_LT(t.phases[1].bytes * 18, l.phases[1].bytes * 10);  // under 1/1.8 of vLLM's peak
  EXPECT_EQ(t.phases[1].bytes, t.committed_bytes);
}

TEST(EngineVllm, DcpWithSlidingWindowIsRejected) {
  LedgerOptions o = Context(8192, "", Engine::kVllm);
  o.tp = 8;
  o.dcp = 2;
  Result<Ledger> l = ComputeLedger(Preset("deepseek-v4-pro"), o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().field(), "dcp");
}

// The loop the prefill peak used to run, one step per chunk: the oracle for the closed form.
uint64_t PrefillPeakByLoop(uint64_t n, uint64_t chunk, uint32_t full, const std::vector<detail::VllmWindowBucket>& bs) {
  uint64_t peak = 0;
  for (uint64_t end = std::min(chunk, n); end > 0; end = end == n ? 0 : std::min(end + chunk, n)) {
    uint64_t size = end % chunk == 0 ? chunk : end % chunk;
    uint64_t held = CeilDiv(end, full);
    for (const auto& b : bs) held += b.groups * detail::WindowBlocksHeld(end, b.window - 1 + size, b.block_tokens);
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(EngineVllm, PrefillPeakClosedFormEqualsTheStepByStepLoop) {
  std::mt19937_64 rng(20240611);
  auto pick = [&rng](std::initializer_list<uint64_t> v) { return *(v.begin() + rng() % v.size()); };
  int cases = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const uint32_t full = static_cast<uint32_t>(pick({64, 128, 256, 512, 100}));
    std::vector<detail::VllmWindowBucket> bs;
    const uint64_t nb = rng() % 4;
    for (uint64_t i = 0; i < nb; ++i) {
      bs.push_back({static_cast<uint32_t>(pick({64, 4, 8, 16})), pick({1, 2, 3, 4, 8, 63, 64, 65, 127, 128, 1000}),
                    1 + rng() % 6});
    }
    const uint64_t chunk = pick({1, 2, 3, 5, 7, 63, 64, 65, 100, 256, 1000, 8192});
    const uint64_t n = trial % 5 == 0 ? pick({1, 2, 63, 64, 65, 127, 128, 129, 8191, 8192, 8193}) : 1 + rng() % 6000;
    if (n / chunk > 20000) continue;
    ++cases;
    Checked closed = detail::VllmPrefillPeakBlocks(n, chunk, full, bs);
    ASSERT_FALSE(closed.overflowed());
    ASSERT_EQ(closed.value(), PrefillPeakByLoop(n, chunk, full, bs))
        << "n " << n << " chunk " << chunk << " full " << full << " buckets " << bs.size();
  }
  EXPECT_GT(cases, 3000);
}

// A 2^50-token context ran 2^37 prefill steps (2^50 with --prefill-chunk 1): minutes. The
// closed form answers at once, or says which input overflowed.
TEST(EngineVllm, PrefillPeakOfAHugeContextIsImmediate) {
  for (uint64_t chunk : {uint64_t{1}, uint64_t{8192}}) {
    LedgerOptions o = Context(uint64_t{1} << 50, "", Engine::kVllm);
    o.prefill_chunk_tokens = chunk;
    auto start = std::chrono::steady_clock::now();
    Result<Ledger> l = ComputeLedger(Preset("deepseek-v4-pro"), o);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << chunk;
    if (l.ok()) {
      EXPECT_GE(l->phases[1].bytes, l->phases[2].bytes);
    } else {
      EXPECT_EQ(l.status().code(), StatusCode::kOutOfRange) << l.status().ToString();
    }
  }
  // At 1M tokens the closed form reproduces what the loop computed (PhasesOfA1MTokenV4ProRequest).
  Ledger m = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kVllm));
  EXPECT_EQ(m.phases[1].bytes, 11035329408ULL);
}

// A vLLM DeepSeek-V4 ledger with another main record keeps the page rules without the v4-fp8
// padding, and says so (the record is told by its family, not its name).
TEST(EngineVllm, OtherV4RecordIsPricedUnpadded) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(8192, "v41-fp8", Engine::kVllm));
  EXPECT_EQ(l.FindLine("csa.compressed")->page.page_bytes, 64u * 528);
  EXPECT_EQ(l.FindLine("csa.compressed")->page.padding_bytes, 0u);
  bool noted = false;
  for (const std::string& n : l.notes) noted = noted || n.find("without the 576-B padding") != std::string::npos;
  EXPECT_TRUE(noted);
  Ledger fp8 = MustLedger(Preset("deepseek-v4-pro"), Context(8192, "", Engine::kVllm));
  for (const std::string& n : fp8.notes) EXPECT_EQ(n.find("without the 576-B padding"), std::string::npos) << n;
}

TEST(EngineVllm, MhaBlocksOf16Tokens) {
  Ledger l = MustLedger(Preset("llama-3.1-8b"), Context(100, "", Engine::kVllm));
  EXPECT_EQ(l.block_tokens, 16u);
  EXPECT_EQ(l.committed_bytes, 32ULL * 7 * 16 * 4096);  // 7 blocks of 16 tokens, 32 layers
  EXPECT_EQ(l.TermBytes(LedgerTerm::kPageRounding), 32ULL * 12 * 4096);
}

}  // namespace
}  // namespace tessera
