// SGLang's sizing rules: FlashMLA pages of 64, a page of one token for MHA, DeepSeek-V4 pages with
// an unpadded indexer and the compressor state in a per-request ring.
#include <gtest/gtest.h>

#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(EngineSglang, V4Pages) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kSglang));
  EXPECT_EQ(l.FindLine("csa.compressed")->page.page_bytes, 37440u);
  EXPECT_EQ(l.FindLine("hca.compressed")->page.page_bytes, 1728u);
  EXPECT_EQ(l.FindLine("csa.indexer")->page.page_bytes, 8448u);  // not padded
  EXPECT_EQ(l.FindLine("csa.window")->page.page_bytes, 74880u);  // 128-token pages padded to 576
  EXPECT_FALSE(l.FindLine("csa.compressor_state")->in_pages);
}

TEST(EngineSglang, MhaPageOfOneToken) {
  Ledger l = MustLedger(Preset("llama-3.1-8b"), Context(100, "", Engine::kSglang));
  EXPECT_EQ(l.block_tokens, 1u);
  EXPECT_EQ(l.committed_bytes, l.requested_bytes);
}

TEST(EngineSglang, DeepSeekV3FlashMlaPages) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(100, "fp8_ds_mla", Engine::kSglang));
  EXPECT_EQ(l.block_tokens, 64u);
  EXPECT_EQ(l.lines[0].page.page_bytes, 64u * 656);
  EXPECT_EQ(l.committed_bytes, 61ULL * 2 * 64 * 656);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 0u);
}

// SGLang holds what it pages: nothing is reserved beyond the holding. By hand, DeepSeek-V4-Pro at
// 2^20 tokens in 256-token blocks (4,096 of them), pages as in V4Pages:
//   csa.compressed 30 x 4,096 x 37,440 + csa.indexer 30 x 4,096 x 8,448
//   + hca.compressed 31 x 4,096 x 1,728 + windows (one 128-token page a layer) 61 x 74,880
//   + compressor state 31 x 128 x 4,096 + 30 x 8 x 8,192 + indexer compressor state 30 x 8 x 2,048
//   = 5,881,410,176 B, which the prompt reaches by its end (the prefill peak) and decode keeps.
// Admission: the first 8,192-token prefill chunk, 32 blocks of the three paged caches, plus the
// windows and the states: 30 x 32 x (37,440 + 8,448) + 31 x 32 x 1,728 + 61 x 74,880
//   + 16,252,928 + 1,966,080 + 491,520 = 69,044,864 B.
TEST(EngineSglang, PhasesAreTheHolding) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kSglang));
  ASSERT_EQ(l.phases.size(), 3u);
  EXPECT_EQ(l.committed_bytes, 5881410176u);
  EXPECT_EQ(l.phases[0].bytes, 69044864u);
  EXPECT_EQ(l.phases[1].bytes, 5881410176u);
  EXPECT_EQ(l.phases[2].bytes, 5881410176u);
  EXPECT_EQ(l.block_id_bytes, 0u);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kUniformBlockPadding), 0u);
}

}  // namespace
}  // namespace tessera
