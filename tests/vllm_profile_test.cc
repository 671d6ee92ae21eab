// vLLM's sizing rules: FlashMLA pages, DeepSeek-V4 page classes and groups, the uniform block-id
// cost, the admission reservation and the chunked-prefill peak.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

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

// Ground truth from vLLM's own v1 KV-cache code, run for one request per case (not read): the
// modules vllm/v1/core/{kv_cache_manager,kv_cache_coordinator,single_type_kv_cache_manager,
// block_pool,kv_cache_utils}.py and vllm/v1/kv_cache_interface.py of github.com/local-inference-lab/vllm
// at 28be48fa944d8c58aeffd1ab1b56e27828c6b268 (2026-05-24; these files equal upstream
// vllm-project/vllm's as merged at 9aaf83ef502fc37bc647f6e474314d48ba36cd1c, #43119, but for an
// unused log argument and merge() asserts; the figures are the same from both), under stubs for
// torch and logging, prefix caching off (it changes which free blocks are evictable, not how
// many a request holds). Per case:
// - the layer specs the model's get_kv_cache_spec builds (V3/V3.2: MLAAttentionSpec per layer —
//   mla-fp8 is V3 under --kv-cache-dtype fp8: head_size 576, dtype float8_e4m3fn —
//   V3.2's DeepseekV32IndexerCache 132 B; V4: vllm/models/deepseek_v4/{attention,compressor}.py,
//   v1/attention/backends/mla/sparse_swa.py — SWA 64-token blocks, window 128, C4/C128 state
//   blocks of 4/8, alignment 576), the MTP layer included when spec > 0 (method "mtp", an eagle
//   group); get_kv_cache_groups -> get_kv_cache_config_from_groups (first DeepSeek-V4 allocator,
//   _get_kv_cache_config_deepseek_v4) -> generate_scheduler_kv_cache_config -> KVCacheManager
//   (max_model_len = max(max_position_embeddings, n), max_num_batched_tokens = chunk);
// - admission: coordinator.get_num_blocks_to_allocate(num_tokens = n, apply_admission_cap=True),
//   what allocate_slots(full_sequence_must_fit=True) — SchedulerConfig.scheduler_reserve_full_isl,
//   default True — requires free; for n <= 8192 also checked by the gate itself on pools of
//   exactly that many free blocks (admits) and one fewer (refuses);
// - prefill peak: the most non-null block ids after allocate_slots of each chunk, lookahead 0 for
//   the first chunk and spec after it (Scheduler.schedule's effective_lookahead_tokens);
// - decode: after allocate_slots(1 + spec new tokens, lookahead spec) once the prompt is cached.
// Block ids per group, in vLLM's group order — V3/V3.2: {the one group}; V4-Pro: {full (C4, C4
// indexer, C128 pages), SWA, SWA, C128 state (8-token blocks), C4 + indexer states (4)}; V4-Flash:
// {full, SWA, SWA, C4 + indexer states, C128 state}. block_cost: _pool_bytes_per_block.
struct VllmTruth {
  const char* model;
  const char* format;
  uint64_t n;
  uint64_t chunk;
  uint32_t spec;          // > 0: MTP with spec draft tokens (the MTP layer's caches counted)
  uint64_t block_tokens;  // 0: vLLM's default (64 dense, 256 DeepSeek-V4)
  uint64_t block_cost;
  std::vector<uint64_t> admission, peak, decode;
};

const std::vector<VllmTruth>& VllmTruths() {
  static const std::vector<VllmTruth> truths = {
      {"deepseek-v3", "mla-bf16", 1024, 2048, 0, 0, 4497408, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 2048, 1, 0, 4571136, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 2048, 0, 16, 1124352, {64}, {64}, {65}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 2048, 0, 0, 3076352, {16}, {16}, {17}},
      {"deepseek-v3.2", "mla-bf16", 1024, 2048, 0, 0, 5012736, {16}, {16}, {17}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 2048, 1, 0, 3126784, {16}, {16}, {17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       2048,
       0,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       2048,
       1,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       2048,
       0,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       2048,
       1,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 1024, 8192, 0, 0, 4497408, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 8192, 1, 0, 4571136, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 8192, 0, 16, 1124352, {64}, {64}, {65}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 8192, 0, 0, 3076352, {16}, {16}, {17}},
      {"deepseek-v3.2", "mla-bf16", 1024, 8192, 0, 0, 5012736, {16}, {16}, {17}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 8192, 1, 0, 3126784, {16}, {16}, {17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       8192,
       0,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       8192,
       1,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       8192,
       0,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       8192,
       1,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 1024, 16384, 0, 0, 4497408, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 16384, 1, 0, 4571136, {16}, {16}, {17}},
      {"deepseek-v3", "mla-bf16", 1024, 16384, 0, 16, 1124352, {64}, {64}, {65}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 16384, 0, 0, 3076352, {16}, {16}, {17}},
      {"deepseek-v3.2", "mla-bf16", 1024, 16384, 0, 0, 5012736, {16}, {16}, {17}},
      {"deepseek-v3.2", "fp8_ds_mla", 1024, 16384, 1, 0, 3126784, {16}, {16}, {17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       16384,
       0,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1024,
       16384,
       1,
       0,
       1482048,
       {4, 16, 16, 128, 256},
       {4, 16, 16, 128, 256},
       {5, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       16384,
       0,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1024,
       16384,
       1,
       0,
       1051776,
       {4, 16, 16, 256, 128},
       {4, 16, 16, 256, 128},
       {5, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 8192, 2048, 0, 0, 4497408, {128}, {128}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 2048, 1, 0, 4571136, {128}, {129}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 2048, 0, 16, 1124352, {512}, {512}, {513}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 2048, 0, 0, 3076352, {128}, {128}, {129}},
      {"deepseek-v3.2", "mla-bf16", 8192, 2048, 0, 0, 5012736, {128}, {128}, {129}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 2048, 1, 0, 3126784, {128}, {129}, {129}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       2048,
       0,
       0,
       1482048,
       {32, 35, 35, 273, 515},
       {32, 34, 34, 272, 514},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       2048,
       1,
       0,
       1482048,
       {32, 35, 35, 273, 515},
       {33, 35, 35, 273, 515},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       2048,
       0,
       0,
       1051776,
       {32, 35, 35, 515, 273},
       {32, 34, 34, 514, 272},
       {33, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       2048,
       1,
       0,
       1051776,
       {32, 35, 35, 515, 273},
       {33, 35, 35, 515, 273},
       {33, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 8192, 8192, 0, 0, 4497408, {128}, {128}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 8192, 1, 0, 4571136, {128}, {128}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 8192, 0, 16, 1124352, {512}, {512}, {513}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 8192, 0, 0, 3076352, {128}, {128}, {129}},
      {"deepseek-v3.2", "mla-bf16", 8192, 8192, 0, 0, 5012736, {128}, {128}, {129}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 8192, 1, 0, 3126784, {128}, {128}, {129}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       8192,
       0,
       0,
       1482048,
       {32, 128, 128, 1024, 2048},
       {32, 128, 128, 1024, 2048},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       8192,
       1,
       0,
       1482048,
       {32, 128, 128, 1024, 2048},
       {32, 128, 128, 1024, 2048},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       8192,
       0,
       0,
       1051776,
       {32, 128, 128, 2048, 1024},
       {32, 128, 128, 2048, 1024},
       {33, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       8192,
       1,
       0,
       1051776,
       {32, 128, 128, 2048, 1024},
       {32, 128, 128, 2048, 1024},
       {33, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 8192, 16384, 0, 0, 4497408, {128}, {128}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 16384, 1, 0, 4571136, {128}, {128}, {129}},
      {"deepseek-v3", "mla-bf16", 8192, 16384, 0, 16, 1124352, {512}, {512}, {513}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 16384, 0, 0, 3076352, {128}, {128}, {129}},
      {"deepseek-v3.2", "mla-bf16", 8192, 16384, 0, 0, 5012736, {128}, {128}, {129}},
      {"deepseek-v3.2", "fp8_ds_mla", 8192, 16384, 1, 0, 3126784, {128}, {128}, {129}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       16384,
       0,
       0,
       1482048,
       {32, 128, 128, 1024, 2048},
       {32, 128, 128, 1024, 2048},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       16384,
       1,
       0,
       1482048,
       {32, 128, 128, 1024, 2048},
       {32, 128, 128, 1024, 2048},
       {33, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       16384,
       0,
       0,
       1051776,
       {32, 128, 128, 2048, 1024},
       {32, 128, 128, 2048, 1024},
       {33, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       16384,
       1,
       0,
       1051776,
       {32, 128, 128, 2048, 1024},
       {32, 128, 128, 2048, 1024},
       {33, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 131072, 2048, 0, 0, 4497408, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 2048, 1, 0, 4571136, {2048}, {2049}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 2048, 0, 16, 1124352, {8192}, {8192}, {8193}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 2048, 0, 0, 3076352, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "mla-bf16", 131072, 2048, 0, 0, 5012736, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 2048, 1, 0, 3126784, {2048}, {2049}, {2049}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       2048,
       0,
       0,
       1482048,
       {512, 35, 35, 273, 515},
       {512, 34, 34, 272, 514},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       2048,
       1,
       0,
       1482048,
       {512, 35, 35, 273, 515},
       {513, 35, 35, 273, 515},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       2048,
       0,
       0,
       1051776,
       {512, 35, 35, 515, 273},
       {512, 34, 34, 514, 272},
       {513, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       2048,
       1,
       0,
       1051776,
       {512, 35, 35, 515, 273},
       {513, 35, 35, 515, 273},
       {513, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 131072, 8192, 0, 0, 4497408, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 8192, 1, 0, 4571136, {2048}, {2049}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 8192, 0, 16, 1124352, {8192}, {8192}, {8193}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 8192, 0, 0, 3076352, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "mla-bf16", 131072, 8192, 0, 0, 5012736, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 8192, 1, 0, 3126784, {2048}, {2049}, {2049}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       8192,
       0,
       0,
       1482048,
       {512, 131, 131, 1041, 2051},
       {512, 130, 130, 1040, 2050},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       8192,
       1,
       0,
       1482048,
       {512, 131, 131, 1041, 2051},
       {513, 131, 131, 1041, 2051},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       8192,
       0,
       0,
       1051776,
       {512, 131, 131, 2051, 1041},
       {512, 130, 130, 2050, 1040},
       {513, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       8192,
       1,
       0,
       1051776,
       {512, 131, 131, 2051, 1041},
       {513, 131, 131, 2051, 1041},
       {513, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 131072, 16384, 0, 0, 4497408, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 16384, 1, 0, 4571136, {2048}, {2049}, {2049}},
      {"deepseek-v3", "mla-bf16", 131072, 16384, 0, 16, 1124352, {8192}, {8192}, {8193}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 16384, 0, 0, 3076352, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "mla-bf16", 131072, 16384, 0, 0, 5012736, {2048}, {2048}, {2049}},
      {"deepseek-v3.2", "fp8_ds_mla", 131072, 16384, 1, 0, 3126784, {2048}, {2049}, {2049}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       16384,
       0,
       0,
       1482048,
       {512, 259, 259, 2065, 4099},
       {512, 258, 258, 2064, 4098},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       16384,
       1,
       0,
       1482048,
       {512, 259, 259, 2065, 4099},
       {513, 259, 259, 2065, 4099},
       {513, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       16384,
       0,
       0,
       1051776,
       {512, 259, 259, 4099, 2065},
       {512, 258, 258, 4098, 2064},
       {513, 3, 3, 3, 17}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       16384,
       1,
       0,
       1051776,
       {512, 259, 259, 4099, 2065},
       {513, 259, 259, 4099, 2065},
       {513, 3, 3, 3, 17}},
      {"deepseek-v3", "mla-bf16", 1048576, 2048, 0, 0, 4497408, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 2048, 1, 0, 4571136, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 2048, 0, 16, 1124352, {65536}, {65536}, {65536}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 2048, 0, 0, 3076352, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "mla-bf16", 1048576, 2048, 0, 0, 5012736, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 2048, 1, 0, 3126784, {16384}, {16384}, {16384}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       2048,
       0,
       0,
       1482048,
       {4096, 35, 35, 273, 515},
       {4096, 34, 34, 272, 514},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       2048,
       1,
       0,
       1482048,
       {4096, 35, 35, 273, 515},
       {4096, 34, 34, 272, 514},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       2048,
       0,
       0,
       1051776,
       {4096, 35, 35, 515, 273},
       {4096, 34, 34, 514, 272},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       2048,
       1,
       0,
       1051776,
       {4096, 35, 35, 515, 273},
       {4096, 34, 34, 514, 272},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v3", "mla-bf16", 1048576, 8192, 0, 0, 4497408, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 8192, 1, 0, 4571136, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 8192, 0, 16, 1124352, {65536}, {65536}, {65536}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 8192, 0, 0, 3076352, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "mla-bf16", 1048576, 8192, 0, 0, 5012736, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 8192, 1, 0, 3126784, {16384}, {16384}, {16384}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       8192,
       0,
       0,
       1482048,
       {4096, 131, 131, 1041, 2051},
       {4096, 130, 130, 1040, 2050},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       8192,
       1,
       0,
       1482048,
       {4096, 131, 131, 1041, 2051},
       {4096, 130, 130, 1040, 2050},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       8192,
       0,
       0,
       1051776,
       {4096, 131, 131, 2051, 1041},
       {4096, 130, 130, 2050, 1040},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       8192,
       1,
       0,
       1051776,
       {4096, 131, 131, 2051, 1041},
       {4096, 130, 130, 2050, 1040},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v3", "mla-bf16", 1048576, 16384, 0, 0, 4497408, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 16384, 1, 0, 4571136, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-bf16", 1048576, 16384, 0, 16, 1124352, {65536}, {65536}, {65536}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 16384, 0, 0, 3076352, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "mla-bf16", 1048576, 16384, 0, 0, 5012736, {16384}, {16384}, {16384}},
      {"deepseek-v3.2", "fp8_ds_mla", 1048576, 16384, 1, 0, 3126784, {16384}, {16384}, {16384}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       16384,
       0,
       0,
       1482048,
       {4096, 259, 259, 2065, 4099},
       {4096, 258, 258, 2064, 4098},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1048576,
       16384,
       1,
       0,
       1482048,
       {4096, 259, 259, 2065, 4099},
       {4096, 258, 258, 2064, 4098},
       {4096, 2, 2, 16, 2}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       16384,
       0,
       0,
       1051776,
       {4096, 259, 259, 4099, 2065},
       {4096, 258, 258, 4098, 2064},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1048576,
       16384,
       1,
       0,
       1051776,
       {4096, 259, 259, 4099, 2065},
       {4096, 258, 258, 4098, 2064},
       {4096, 2, 2, 2, 16}},
      {"deepseek-v3", "mla-fp8", 1024, 2048, 0, 0, 2248704, {16}, {16}, {17}},
      {"deepseek-v3", "mla-fp8", 1024, 8192, 0, 0, 2248704, {16}, {16}, {17}},
      {"deepseek-v3", "mla-fp8", 1024, 16384, 0, 0, 2248704, {16}, {16}, {17}},
      {"deepseek-v3", "mla-fp8", 8192, 2048, 0, 0, 2248704, {128}, {128}, {129}},
      {"deepseek-v3", "mla-fp8", 8192, 8192, 0, 0, 2248704, {128}, {128}, {129}},
      {"deepseek-v3", "mla-fp8", 8192, 16384, 0, 0, 2248704, {128}, {128}, {129}},
      {"deepseek-v3", "mla-fp8", 131072, 2048, 0, 0, 2248704, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-fp8", 131072, 8192, 0, 0, 2248704, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-fp8", 131072, 16384, 0, 0, 2248704, {2048}, {2048}, {2049}},
      {"deepseek-v3", "mla-fp8", 1048576, 2048, 0, 0, 2248704, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-fp8", 1048576, 8192, 0, 0, 2248704, {16384}, {16384}, {16384}},
      {"deepseek-v3", "mla-fp8", 1048576, 16384, 0, 0, 2248704, {16384}, {16384}, {16384}},
      // --block-tokens 512 (cache_config.block_size 512 for every full-group spec).
      {"deepseek-v4-pro",
       "v4-fp8",
       1000,
       8192,
       0,
       512,
       2946240,
       {2, 16, 16, 125, 250},
       {2, 16, 16, 125, 250},
       {2, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1000,
       4096,
       0,
       512,
       2090880,
       {2, 16, 16, 250, 125},
       {2, 16, 16, 250, 125},
       {2, 3, 3, 3, 17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       1000,
       8192,
       1,
       512,
       2946240,
       {2, 16, 16, 125, 250},
       {2, 16, 16, 125, 250},
       {2, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       1000,
       4096,
       1,
       512,
       2090880,
       {2, 16, 16, 250, 125},
       {2, 16, 16, 250, 125},
       {2, 3, 3, 3, 17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       8192,
       0,
       512,
       2946240,
       {16, 128, 128, 1024, 2048},
       {16, 128, 128, 1024, 2048},
       {17, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       4096,
       0,
       512,
       2090880,
       {16, 67, 67, 1027, 529},
       {16, 66, 66, 1026, 528},
       {17, 3, 3, 3, 17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       8192,
       8192,
       1,
       512,
       2946240,
       {16, 128, 128, 1024, 2048},
       {16, 128, 128, 1024, 2048},
       {17, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       8192,
       4096,
       1,
       512,
       2090880,
       {16, 67, 67, 1027, 529},
       {17, 67, 67, 1027, 529},
       {17, 3, 3, 3, 17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       8192,
       0,
       512,
       2946240,
       {256, 131, 131, 1041, 2051},
       {256, 130, 130, 1040, 2050},
       {257, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       4096,
       0,
       512,
       2090880,
       {256, 67, 67, 1027, 529},
       {256, 66, 66, 1026, 528},
       {257, 3, 3, 3, 17}},
      {"deepseek-v4-pro",
       "v4-fp8",
       131072,
       8192,
       1,
       512,
       2946240,
       {256, 131, 131, 1041, 2051},
       {257, 131, 131, 1041, 2051},
       {257, 3, 3, 17, 3}},
      {"deepseek-v4-flash",
       "v4-fp8",
       131072,
       4096,
       1,
       512,
       2090880,
       {256, 67, 67, 1027, 529},
       {257, 67, 67, 1027, 529},
       {257, 3, 3, 3, 17}},
  };
  return truths;
}

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

LedgerOptions TruthOptions(const VllmTruth& t) {
  LedgerOptions o = Context(t.n, t.format, Engine::kVllm);
  o.prefill_chunk_tokens = t.chunk;
  o.spec_tokens = t.spec;
  o.include_mtp = t.spec > 0;
  if (t.block_tokens) o.block_tokens = t.block_tokens;
  return o;
}

TEST(EngineVllm, PhasesEqualVllmsOwnAllocator) {
  size_t checked = 0;
  for (const VllmTruth& t : VllmTruths()) {
    SCOPED_TRACE(std::string(t.model) + " " + t.format + " n " + std::to_string(t.n) + " chunk " +
                 std::to_string(t.chunk) + " spec " + std::to_string(t.spec));
    Ledger l = MustLedger(Preset(t.model), TruthOptions(t));
    ASSERT_EQ(l.phases.size(), 3u);
    EXPECT_EQ(l.phases[0].bytes, Sum(t.admission) * t.block_cost);
    EXPECT_EQ(l.reserved_at_admission_bytes, l.phases[0].bytes);
    EXPECT_EQ(l.phases[1].bytes, Sum(t.peak) * t.block_cost);
    EXPECT_EQ(l.phases[2].bytes, Sum(t.decode) * t.block_cost);
    EXPECT_EQ(l.committed_bytes, l.phases[2].bytes);
    if (t.decode.size() > 1) {
      EXPECT_EQ(l.block_id_bytes, t.block_cost);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 144u);
}

// The three disagreements the truth table settled, spelled out.
TEST(EngineVllm, AdmissionNeedsTheWholePromptDecodeHoldsTheSampledToken) {
  // V3 at 128K: every block of the prompt must be free, not one chunk's 128.
  Ledger v3 = MustLedger(Preset("deepseek-v3"), Context(131072, "mla-bf16", Engine::kVllm));
  EXPECT_EQ(v3.phases[0].bytes, 2048ULL * 61 * 64 * 1152);
  // 1,024 tokens (16 blocks): the first decode step's token opens a 17th.
  Ledger d = MustLedger(Preset("deepseek-v3"), Context(1024, "mla-bf16", Engine::kVllm));
  EXPECT_EQ(d.phases[2].bytes, 17ULL * 61 * 64 * 1152);
  // V4-Pro, 1,024 tokens: the window groups hold the prompt's 16 blocks, not a chunk's 131.
  Ledger v4 = MustLedger(Preset("deepseek-v4-pro"), Context(1024, "", Engine::kVllm));
  EXPECT_EQ(v4.phases[0].bytes, (4ULL + 16 + 16 + 128 + 256) * 1482048);
}

// --kernel picks vLLM's MLA backend and with it the block: CUTLASS MLA 128, FlashInfer MLA 32
// (get_supported_kernel_block_sizes [128] and [32, 64]; AttentionBackend.get_preferred_block_size
// takes the smallest when the default 16 does not fit; vllm/v1/attention/backends/mla/, commit as
// above). Block ids from vLLM's allocator run at those blocks (chunk 8,192, no spec): DeepSeek-V3
// bf16 at 128: 8 / 64 / 1,024 ids admitted and at peak for 1,000 / 8,192 / 131,072 tokens, 8 /
// 65 / 1,025 after the first decode step, 8,994,816 B each; at 32: 32 / 256 / 4,096 and 32 / 257
// / 4,097, 2,248,704 B each; V3.2 fp8_ds_mla at 32, 8,192 tokens: 256, 256, 257 of 1,538,176 B.
TEST(EngineVllm, KernelBlocksEqualVllmsOwnAllocator) {
  struct Case {
    const char* model;
    const char* format;
    Kernel kernel;
    uint64_t n, cost, admission, peak, decode;
  };
  const Case cases[] = {
      {"deepseek-v3", "mla-bf16", Kernel::kCutlassMla, 1000, 8994816, 8, 8, 8},
      {"deepseek-v3", "mla-bf16", Kernel::kCutlassMla, 8192, 8994816, 64, 64, 65},
      {"deepseek-v3", "mla-bf16", Kernel::kCutlassMla, 131072, 8994816, 1024, 1024, 1025},
      {"deepseek-v3", "mla-bf16", Kernel::kFlashInferMla, 1000, 2248704, 32, 32, 32},
      {"deepseek-v3", "mla-bf16", Kernel::kFlashInferMla, 8192, 2248704, 256, 256, 257},
      {"deepseek-v3", "mla-bf16", Kernel::kFlashInferMla, 131072, 2248704, 4096, 4096, 4097},
      {"deepseek-v3.2", "fp8_ds_mla", Kernel::kFlashInferMla, 8192, 1538176, 256, 256, 257},
  };
  for (const Case& c : cases) {
    LedgerOptions o = Context(c.n, c.format, Engine::kVllm);
    o.kernel = c.kernel;
    Ledger l = MustLedger(Preset(c.model), o);
    SCOPED_TRACE(std::string(c.model) + " " + std::string(KernelName(c.kernel)) + " " + std::to_string(c.n));
    EXPECT_EQ(l.block_tokens, KernelPageEntries(c.kernel));
    EXPECT_EQ(l.phases[0].bytes, c.admission * c.cost);
    EXPECT_EQ(l.phases[1].bytes, c.peak * c.cost);
    EXPECT_EQ(l.phases[2].bytes, c.decode * c.cost);
  }
}

// What vLLM cannot serve is refused, naming the option.
TEST(EngineVllm, KernelsVllmHasNoBackendForAreRefused) {
  auto field = [](const std::string& model, Kernel k, std::optional<uint64_t> block) {
    LedgerOptions o = Context(8192, "", Engine::kVllm);
    o.kernel = k;
    o.block_tokens = block;
    Result<Ledger> l = ComputeLedger(Preset(model), o);
    return l.ok() ? std::string("ok") : l.status().field();
  };
  EXPECT_EQ(field("deepseek-v3.2", Kernel::kCutlassMla, std::nullopt), "kernel");  // no sparse CUTLASS
  EXPECT_EQ(field("deepseek-v4-pro", Kernel::kFlashInferMla, std::nullopt), "kernel");
  EXPECT_EQ(field("deepseek-v4-pro", Kernel::kCutlassMla, std::nullopt), "kernel");
  EXPECT_EQ(field("deepseek-v3", Kernel::kCutlassMla, 64), "block-tokens");
  EXPECT_EQ(field("deepseek-v3", Kernel::kFlashInferMla, 48), "block-tokens");
  EXPECT_EQ(field("deepseek-v3", Kernel::kFlashInferMla, 64), "ok");  // FlashInfer MLA also pages 64
  EXPECT_EQ(field("deepseek-v3", Kernel::kCutlassMla, 256), "ok");
}

// max_num_batched_tokens sets the window groups' admission cap: --prefill-chunk moves it.
TEST(EngineVllm, AdmissionCapFollowsThePrefillChunk) {
  uint64_t last = 0;
  for (uint64_t chunk : {2048, 8192, 16384}) {
    LedgerOptions o = Context(1048576, "", Engine::kVllm);
    o.prefill_chunk_tokens = chunk;
    Ledger l = MustLedger(Preset("deepseek-v4-pro"), o);
    // full 4096; SWA 2 x (cdiv(127 + chunk, 64) + 1); C128 state cdiv(127 + chunk, 8) + 1;
    // C4 states cdiv(7 + chunk, 4) + 1.
    const uint64_t ids =
        4096 + 2 * (CeilDiv(127 + chunk, 64) + 1) + CeilDiv(127 + chunk, 8) + 1 + CeilDiv(7 + chunk, 4) + 1;
    EXPECT_EQ(l.phases[0].bytes, ids * 1482048) << chunk;
    EXPECT_GT(l.phases[0].bytes, last);
    last = l.phases[0].bytes;
  }
}

// --block-tokens 128 makes the full group's largest page (C4: 32 entries, 19,008 B) smaller than
// the 64-token window page (37,440 B): vLLM refuses it (the page-size assert of
// _get_kv_cache_groups_uniform_groups); so does the ledger, naming the option, not an overflow.
TEST(EngineVllm, V4BlockTokens128IsRefusedAsVllmDoes) {
  LedgerOptions o = Context(8192, "", Engine::kVllm);
  o.block_tokens = 128;
  Result<Ledger> l = ComputeLedger(Preset("deepseek-v4-pro"), o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status().ToString();
  EXPECT_EQ(l.status().field(), "block-tokens");
  EXPECT_NE(l.status().ToString().find("larger than every full-group page"), std::string::npos);
  // 512-token blocks fit, as in vLLM (same group structure, 2,946,240 B per block id).
  o.block_tokens = 512;
  EXPECT_EQ(MustLedger(Preset("deepseek-v4-pro"), o).block_id_bytes, 2946240u);
}

// The same refusal from the model alone (only C128 layers: a 1,728-B full page) names the
// config field, since the user passed no --block-tokens.
TEST(EngineVllm, V4RefusalWithoutBlockTokensNamesCompressRatios) {
  std::ifstream in(std::string(TESSERA_TEST_DATA) + "/../../data/models/deepseek-v4-flash.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = cfg.find("\"compress_ratios\"");
  ASSERT_NE(at, std::string::npos);
  const size_t open = cfg.find('[', at), close = cfg.find(']', at);
  std::string ratios = "[0, 0";
  for (int i = 2; i < 43; ++i) ratios += ", 128";
  cfg.replace(open, close - open + 1, ratios + ", 0]");
  Result<Ledger> l = ComputeLedger(testing::FromJson(cfg), Context(8192, "", Engine::kVllm));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().field(), "compress_ratios") << l.status().ToString();
}

// One request step by step as vLLM's managers keep it (the oracle for the closed form): per group
// a block list where remove_skipped_blocks nulls the blocks wholly before computed - window + 1
// and allocate_new_blocks appends up to cdiv(slots, block); held = appended - nulled.
uint64_t PrefillPeakByLoop(const detail::VllmPrefill& pf, uint64_t full,
                           const std::vector<detail::VllmWindowBucket>& bs) {
  std::vector<uint64_t> appended(bs.size() + 1, 0), nulled(bs.size() + 1, 0);
  uint64_t peak = 0;
  for (uint64_t c = 0; c < pf.n; c += pf.chunk) {
    const uint64_t size = std::min(pf.chunk, pf.n - c);
    const uint64_t slots = std::min(c + size + (c == 0 ? 0 : pf.spec), pf.max_len);
    uint64_t held = 0;
    for (size_t g = 0; g <= bs.size(); ++g) {
      const uint64_t block = g == 0 ? full : bs[g - 1].block_tokens;
      if (g > 0 && c + 1 > bs[g - 1].window) nulled[g] = std::max(nulled[g], (c + 1 - bs[g - 1].window) / block);
      appended[g] = std::max(appended[g], CeilDiv(slots, block));
      held += (appended[g] - nulled[g]) * (g == 0 ? 1 : bs[g - 1].groups);
    }
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(EngineVllm, PrefillPeakClosedFormEqualsTheStepByStepLoop) {
  std::mt19937_64 rng(20240611);
  auto pick = [&rng](std::initializer_list<uint64_t> v) { return *(v.begin() + rng() % v.size()); };
  int cases = 0, capped = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const uint64_t full = pick({64, 128, 256, 512, 100});
    std::vector<detail::VllmWindowBucket> bs;
    const uint64_t nb = rng() % 4;
    for (uint64_t i = 0; i < nb; ++i) {
      bs.push_back({static_cast<uint32_t>(pick({64, 4, 8, 16})), pick({1, 2, 3, 4, 8, 63, 64, 65, 127, 128, 1000}),
                    1 + rng() % 6});
    }
    detail::VllmPrefill pf;
    pf.chunk = pick({1, 2, 3, 5, 7, 63, 64, 65, 100, 256, 1000, 8192});
    pf.n = trial % 5 == 0 ? pick({1, 2, 63, 64, 65, 127, 128, 129, 8191, 8192, 8193}) : 1 + rng() % 6000;
    pf.spec = static_cast<uint32_t>(pick({0, 0, 1, 2, 3, 7, 100}));
    // max_model_len: at the prompt (the last steps' lookahead capped) or beyond it.
    pf.max_len = pf.n + pick({0, 0, 1, 2, 5, 100000});
    if (pf.n / pf.chunk > 20000) continue;
    ++cases;
    capped += pf.n + pf.spec > pf.max_len ? 1 : 0;
    Checked closed = detail::VllmPrefillPeakBlocks(pf, full, bs);
    ASSERT_FALSE(closed.overflowed());
    ASSERT_EQ(closed.value(), PrefillPeakByLoop(pf, full, bs))
        << "n " << pf.n << " chunk " << pf.chunk << " spec " << pf.spec << " max_len " << pf.max_len << " full " << full
        << " buckets " << bs.size();
  }
  EXPECT_GT(cases, 4500);
  EXPECT_GT(capped, 500);
}

// A 2^50-token context ran 2^37 prefill steps (2^50 with --prefill-chunk 1): minutes. The
// closed form evaluates a few dozen, or says which input overflowed (speed: ledger_bench).
TEST(EngineVllm, PrefillPeakOfAHugeContextIsImmediate) {
  for (uint64_t chunk : {uint64_t{1}, uint64_t{8192}}) {
    LedgerOptions o = Context(uint64_t{1} << 50, "", Engine::kVllm);
    o.prefill_chunk_tokens = chunk;
    Result<Ledger> l = ComputeLedger(Preset("deepseek-v4-pro"), o);
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
