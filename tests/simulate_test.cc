#include "tessera_tools/simulate.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

AgentScenario Small() {
  AgentScenario s;
  s.agents = 16;
  s.independent = 6;
  s.shared_tokens = 300;  // not a block multiple: forked agents copy the shared tail block on write
  s.unique_tokens = 40;
  s.preamble_tokens = 20;
  s.block_tokens = 16;
  return s;
}

TEST(Simulate, ForkedAgentsHoldOneCopyOfTheSharedContext) {
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), Small());
  EXPECT_EQ(r.shared_context_copies, 1u);
  EXPECT_EQ(r.cow_copies, 16u);  // each agent's first write into the shared tail block
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_EQ(r.cross_tenant_shares, 0u);
  EXPECT_EQ(r.out_of_blocks, 0u);
  EXPECT_GT(r.records_verified, 0u);
  EXPECT_LT(r.physical_blocks, r.logical_blocks);
  EXPECT_EQ(r.bytes_saved, (r.logical_blocks - r.physical_blocks) * r.block_bytes);
}

TEST(Simulate, IdenticalPromptsInOneStepAreDeduplicatedOnSeal) {
  AgentScenario s = Small();
  s.agents = 0;
  s.independent = 0;
  s.agents = 1;
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  // The pair's prompt: preamble 20 + documents 226 (300 - 2 x 37) + task 40 = 286 tokens:
  // 17 full blocks of 16, each sealed twice.
  EXPECT_EQ(r.dedup_hits, 17u);
  EXPECT_EQ(r.dedup_collisions, 0u);
}

TEST(Simulate, IndependentAgentsShareOnlyAnIdenticalPrefix) {
  AgentScenario s = Small();
  s.agents = 1;
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  // Second wave: every independent prompt is found whole in the cache (full blocks).
  // 20 + 226 + 37 + 40 = 323 tokens: 20 full blocks.
  EXPECT_EQ(r.second_wave_hit_tokens, 6u * 20 * 16);
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_GT(r.records_verified, 0u);
}

TEST(Simulate, ForcedCollisionsNeverServeWrongBytesOrCrossTenants) {
  AgentScenario s = Small();
  s.hash_bits = 2;
  s.tenants = 3;
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  EXPECT_GT(r.dedup_collisions, 100u);
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_GT(r.records_verified, 0u);
  EXPECT_EQ(r.cross_tenant_shares, 0u);
  EXPECT_FALSE(r.security_events.empty());
}

TEST(Simulate, SmallCapacityEvictsAndStillVerifies) {
  AgentScenario s = Small();
  SimulationResult roomy = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  EXPECT_EQ(roomy.evictions, 0u);
  // The first wave fits (its peak, plus the 18 blocks the second member of an identical pair
  // holds until its seals are deduplicated), the cold agents of the second wave do not.
  s.capacity_blocks = static_cast<uint32_t>(roomy.physical_blocks + 18 + 4);
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  EXPECT_EQ(r.out_of_blocks, 0u);
  EXPECT_GT(r.evictions, 0u);
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_GT(r.records_verified, 0u);
}

TEST(Simulate, Sha256ContentKeys) {
  AgentScenario s = Small();
  s.hash = HashAlgorithm::kSha256;
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), s);
  EXPECT_GT(r.dedup_hits, 0u);
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_GT(r.records_verified, 0u);
}

TEST(Simulate, JsonNames) {
  SimulationResult r = *RunAgentScenario(Preset("deepseek-v2-lite"), Small());
  std::string j = RenderSimulation(r, OutputFormat::kJson);
  for (const char* key : {"logical_blocks", "physical_blocks", "prefix_hit_tokens", "dedup_hits", "dedup_collisions",
                          "verify_failures", "cross_tenant_shares", "evictions", "bytes_saved"}) {
    EXPECT_NE(j.find(std::string("\"") + key + "\""), std::string::npos) << key;
  }
}

TEST(Simulate, BadOptionsNameTheField) {
  AgentScenario s = Small();
  s.tenants = 0;
  EXPECT_EQ(RunAgentScenario(Preset("deepseek-v2-lite"), s).status().field(), "tenants");
  s = Small();
  s.hash_bits = 0;
  EXPECT_EQ(RunAgentScenario(Preset("deepseek-v2-lite"), s).status().field(), "hash-bits");
  s = Small();
  s.block_tokens = 0;
  EXPECT_EQ(RunAgentScenario(Preset("deepseek-v2-lite"), s).status().field(), "block-tokens");
}

// A pool smaller than the shared context: the orchestrator cannot be written, and its forks
// used to index its (short) block table past the end (SIGSEGV). Every capacity runs to the end
// without a wrong byte; what did not fit is counted, and once the shared context fits (16 blocks
// of 64 tokens for DeepSeek-V3, 64 blocks of 16 for Llama: 1,024 tokens) it is written once,
// forked and read back (records verified, so "no verify failures" is not vacuous).
TEST(Simulate, PoolSmallerThanTheSharedContextRunsToTheEnd) {
  for (const char* model : {"deepseek-v3", "llama-3.1-8b"}) {
    std::vector<uint32_t> capacities(17);
    std::iota(capacities.begin(), capacities.end(), 1u);
    capacities.insert(capacities.end(), {63, 64, 65});
    for (uint32_t capacity : capacities) {
      SCOPED_TRACE(std::string(model) + " capacity " + std::to_string(capacity));
      AgentScenario s;  // defaults: 1,024 shared tokens
      s.agents = 4;
      s.independent = 2;
      s.capacity_blocks = capacity;
      Result<SimulationResult> r = RunAgentScenario(Preset(model), s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const uint32_t shared_blocks = std::string(model) == "deepseek-v3" ? 16 : 64;
      ASSERT_EQ(r->block_tokens * shared_blocks, 1024u);
      EXPECT_EQ(r->verify_failures, 0u);
      EXPECT_EQ(r->cross_tenant_shares, 0u);
      if (capacity < shared_blocks) {
        EXPECT_GT(r->out_of_blocks, 0u);
        EXPECT_EQ(r->shared_context_copies, 0u);
      } else {
        EXPECT_GT(r->records_verified, 0u);
        EXPECT_EQ(r->shared_context_copies, 1u);
      }
    }
  }
}

// What the options multiply into mapped pages is bounded: a 2^20-token block span took 32 GiB a
// block, and copy-on-write touched all of it.
TEST(Simulate, PoolBytesAreBounded) {
  AgentScenario s = Small();
  s.block_tokens = 1 << 20;
  Result<SimulationResult> r = RunAgentScenario(Preset("deepseek-v3"), s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().field(), "block-tokens");
  s = Small();
  s.capacity_blocks = 4000000000u;
  r = RunAgentScenario(Preset("deepseek-v3"), s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "capacity-blocks");
  s = Small();
  s.agents = 4096;
  s.independent = 4096;
  s.block_tokens = std::nullopt;
  r = RunAgentScenario(Preset("deepseek-v3"), s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(),
            "agents");  // 4,096 forks of a 1m-token context: 48 GB of token copies, whatever the pool.
  s = Small();
  s.agents = 4096;
  s.shared_tokens = 1 << 20;
  s.capacity_blocks = 16;
  r = RunAgentScenario(Preset("deepseek-v2-lite"), s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "agents");
  s = Small();
  s.unique_tokens = (1 << 20) + 1;
  EXPECT_EQ(RunAgentScenario(Preset("deepseek-v2-lite"), s).status().field(), "unique-tokens");
}

Geometry TinyV4() {
  return testing::FromJson(R"({"model_type": "deepseek_v4", "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64, "sliding_window": 128,
      "compress_ratios": [0, 4, 128, 4, 0], "num_nextn_predict_layers": 1, "index_head_dim": 32,
      "index_n_heads": 4, "index_topk": 16, "max_position_embeddings": 1048576})");
}

TEST(SimulateHybrid, EveryStrategyResumesAndVerifies) {
  AgentScenario s;
  s.agents = 3;  // forks of the orchestrator: its window state and partial span copied
  s.independent = 2;
  s.shared_tokens = 600;  // two full 256-token spans, then a tail
  s.unique_tokens = 30;
  s.preamble_tokens = 20;
  s.tenants = 2;
  SimulationResult r = *RunAgentScenario(TinyV4(), s);
  ASSERT_EQ(r.strategies.size(), 3u);
  // Issue 27 (low): a model paged only in compressed groups verifies its bytes through the
  // window rows and entries; the total is not 0 B beside the verified records.
  EXPECT_GT(r.bytes_verified, 0u);
  LedgerOptions lo;
  lo.context_tokens = 512;
  Ledger l = *ComputeLedger(TinyV4(), lo);
  for (const StrategyRun& run : r.strategies) {
    SCOPED_TRACE(std::string(SwaStrategyName(run.strategy)));
    EXPECT_EQ(run.verify_failures, 0u);
    EXPECT_GT(run.records_verified, 0u);
    // The second wave re-admits the two independent prompts (575 tokens; tenants 0 and 1, each
    // with its own preamble): each hits its own two sealed spans, resumed per strategy.
    EXPECT_EQ(run.prefix_hits, 2u);
    EXPECT_EQ(run.prefix_hit_tokens, 2u * 512);
    EXPECT_GT(run.dedup_hits, 0u);  // the identical pair
    if (run.strategy == SwaStrategy::kRecompute) {
      EXPECT_EQ(run.tokens_recomputed, 2u * 128);
      EXPECT_EQ(run.boundaries_kept, 0u);
    } else {
      EXPECT_EQ(run.states_restored, 2u);
      EXPECT_EQ(run.tokens_recomputed, 0u);
      EXPECT_GT(run.boundaries_kept, 0u);
      // Measured bytes kept per boundary equal the ledger's figure for the strategy.
      EXPECT_EQ(run.bytes_kept_per_boundary,
                l.swa_strategies[static_cast<size_t>(run.strategy)].bytes_kept_per_boundary);
    }
  }
  EXPECT_EQ(r.cross_tenant_shares, 0u);
}

// 256-token spans: the 600 shared tokens take 3 blocks. Below that nothing is written (every
// admission is counted out of blocks); at 3 the shared context is written and read back, and the
// rest still does not fit.
TEST(SimulateHybrid, TinyPoolRunsToTheEnd) {
  for (uint32_t capacity : {1u, 2u, 3u}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    AgentScenario s;
    s.agents = 2;
    s.independent = 1;
    s.shared_tokens = 600;
    s.unique_tokens = 30;
    s.capacity_blocks = capacity;
    Result<SimulationResult> r = RunAgentScenario(TinyV4(), s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->block_tokens, 256u);
    EXPECT_EQ(r->verify_failures, 0u);
    EXPECT_GT(r->out_of_blocks, 0u);
    if (capacity == 3) {
      EXPECT_GT(r->records_verified, 0u);
    }
  }
}

}  // namespace
}  // namespace tessera
