// Reconstruction pricing: the closed forms by hand, their sums over layers and heads, the
// ledger's read bytes, and the crossovers checked on both sides.
#include "tessera/price.h"

#include <gtest/gtest.h>

#include "tessera/attention.h"
#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

constexpr PriceDims kV3{512, 64, 128, 128};

TEST(PriceClosedForms, PerHeadByHand) {
  // q_nope [128] x W_UK [128 x 512]: 65,536 multiply-adds.
  EXPECT_EQ(AbsorbQFlops(kV3), 131072u);
  // 1,000 entries x (512 + 64) multiply-adds for the scores, x 512 for the values.
  EXPECT_EQ(AbsorbedScoreFlops(kV3, 1000), 1152000u);
  EXPECT_EQ(AbsorbedValueFlops(kV3, 1000), 1024000u);
  EXPECT_EQ(AbsorbVUpFlops(kV3), 131072u);
  // Naive: every entry's latent through W_UK and W_UV.
  EXPECT_EQ(NaiveKUpFlops(kV3, 1000), 131072000u);
  EXPECT_EQ(NaiveVUpFlops(kV3, 1000), 131072000u);
  EXPECT_EQ(NaiveScoreFlops(kV3, 1000), 384000u);
  EXPECT_EQ(NaiveValueFlops(kV3, 1000), 256000u);
  EXPECT_EQ(NaiveMaterializedBytes(kV3, 1000), 1000u * 256 * 2 * 2);
  EXPECT_EQ(UpProjectionWeightBytes(kV3), 2u * 65536 * 2);
  EXPECT_EQ(IndexerFlops(10, 64, 128), 2u * 10 * 64 * 128 + 2 * 10 * 64);
}

PriceOptions On(const char* gpu, uint64_t batch, uint64_t context, uint32_t tp) {
  PriceOptions o;
  o.gpu = *LoadGpu(gpu);
  o.batch = batch;
  o.context_tokens = context;
  o.tp = tp;
  return o;
}

Price MustPrice(const Geometry& g, const PriceOptions& o) {
  Result<Price> p = ComputePrice(g, o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Price{};
}

TEST(Price, DenseMlaSumsOverLayersHeadsAndBatch) {
  Geometry g = Preset("deepseek-v3");
  const uint64_t n = 4096, b = 3;
  Price p = MustPrice(g, On("H200-141G", b, n, 8));
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].layers, 61u);
  EXPECT_EQ(p.layers[0].entries, n);
  const uint64_t heads = 16, layers = 61;
  const uint64_t absorbed_head = 2 * 128 * 512 + 2 * n * 576 + 2 * n * 512 + 2 * 512 * 128;
  const uint64_t naive_head = 2 * n * 512 * 128 * 2 + 2 * n * 192 + 2 * n * 128;
  EXPECT_EQ(p.absorbed.flops, b * layers * heads * absorbed_head);
  EXPECT_EQ(p.naive.flops, b * layers * heads * naive_head);
  // Cache: the ledger's read bytes per token (mla-bf16: 1,152 B per token per layer).
  LedgerOptions lo;
  lo.context_tokens = n;
  lo.tp = 8;
  EXPECT_EQ(p.read_bytes_per_token, testing::MustLedger(g, lo).read_bytes_per_token);
  EXPECT_EQ(p.read_bytes_per_token, n * 1152 * layers);
  EXPECT_EQ(p.absorbed.cache_bytes, b * n * 1152 * layers);
  EXPECT_EQ(p.absorbed.weight_bytes, layers * heads * (128 * 512 + 512 * 128) * 2);
  EXPECT_EQ(p.absorbed.bytes, p.absorbed.cache_bytes + p.absorbed.weight_bytes);
  EXPECT_EQ(p.naive.materialized_bytes, b * layers * heads * n * 256 * 4);
  EXPECT_EQ(p.naive.bytes, p.naive.cache_bytes + p.naive.weight_bytes + p.naive.materialized_bytes);
  EXPECT_GT(p.naive.flops, 100 * p.absorbed.flops);
}

TEST(Price, SparseAttendsTopKAndScansWithTheIndexer) {
  Geometry g = Preset("deepseek-v3.2");
  Price p = MustPrice(g, On("H200-141G", 1, 131072, 8));
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].entries, 2048u);  // index_topk
  EXPECT_EQ(p.layers[0].indexer_keys, 131072u);
  EXPECT_EQ(p.absorbed.indexer_flops, 61 * IndexerFlops(131072, 64, 128));
  EXPECT_EQ(p.absorbed.attention_flops, 61u * 16 *
                                            (AbsorbQFlops(kV3) + AbsorbedScoreFlops(kV3, 2048) +
                                             AbsorbedValueFlops(kV3, 2048) + AbsorbVUpFlops(kV3)));
  // Below top-k every token is attended.
  Price short_ctx = MustPrice(g, On("H200-141G", 1, 1000, 8));
  EXPECT_EQ(short_ctx.layers[0].entries, 1000u);
}

TEST(Price, DeepSeekV4HasNoReconstruction) {
  Geometry g = Preset("deepseek-v4-pro");
  Price p = MustPrice(g, On("H200-141G", 2, 1048576, 8));
  EXPECT_FALSE(p.reconstructs);
  EXPECT_EQ(p.absorbed.flops, p.naive.flops);
  EXPECT_EQ(p.absorbed.bytes, p.naive.bytes);
  for (const LayerPrice& l : p.layers) {
    if (l.kind == LayerKind::kCsa) {
      EXPECT_EQ(l.entries, 128u + 1024);  // window + top-k of 262,144 compressed entries
      EXPECT_EQ(l.indexer_keys, 262144u);
    } else {
      ASSERT_EQ(l.kind, LayerKind::kHca);
      EXPECT_EQ(l.entries, 128u + 8192);
      EXPECT_EQ(l.absorbed.flops(), 2 * 2 * l.entries * 512);
    }
  }
}

bool Bound(const Geometry& g, const PriceOptions& o, bool naive) {
  Price p = MustPrice(g, o);
  return naive ? p.naive.compute_bound : p.absorbed.compute_bound;
}

TEST(Price, CrossoverBatchChangesTheBound) {
  // V3.2 naive at 128K: memory-bound at small batches, compute-bound from the crossover on.
  Geometry g = Preset("deepseek-v3.2");
  Price p = MustPrice(g, On("H200-141G", 1, 131072, 8));
  ASSERT_TRUE(p.naive.crossover_batch.has_value());
  const uint64_t b = *p.naive.crossover_batch;
  ASSERT_GT(b, 1u);
  EXPECT_FALSE(Bound(g, On("H200-141G", b - 1, 131072, 8), true));
  EXPECT_TRUE(Bound(g, On("H200-141G", b, 131072, 8), true));
  // Absorbed stays memory-bound at any batch on 16 heads per rank: no crossover.
  EXPECT_FALSE(p.absorbed.crossover_batch.has_value());
  EXPECT_FALSE(Bound(g, On("H200-141G", 4096, 131072, 8), false));
}

TEST(Price, CrossoverContextChangesTheBound) {
  Geometry g = Preset("deepseek-v3");
  Price p = MustPrice(g, On("H200-141G", 64, 131072, 8));
  ASSERT_TRUE(p.naive.crossover_context.has_value());
  const uint64_t c = *p.naive.crossover_context;
  ASSERT_GT(c, 1u);
  EXPECT_NE(Bound(g, On("H200-141G", 64, c - 1, 8), true), Bound(g, On("H200-141G", 64, c, 8), true));
  // The bound at the crossover is the one at the longest context.
  EXPECT_EQ(Bound(g, On("H200-141G", 64, c, 8), true), Bound(g, On("H200-141G", 64, 163840, 8), true));
}

TEST(Price, TimeIsTheRooflineMax) {
  Price p = MustPrice(Preset("deepseek-v3"), On("B200", 8, 32768, 8));
  for (const PathPrice* pp : {&p.absorbed, &p.naive}) {
    EXPECT_DOUBLE_EQ(pp->compute_s, static_cast<double>(pp->flops) / 2.25e15);
    EXPECT_DOUBLE_EQ(pp->memory_s, static_cast<double>(pp->bytes) / 8e12);
    EXPECT_DOUBLE_EQ(pp->time_s, std::max(pp->compute_s, pp->memory_s));
    EXPECT_EQ(pp->compute_bound, pp->compute_s >= pp->memory_s);
  }
}

TEST(Price, Fp8CacheShrinksTheCacheBytesNotTheFlops) {
  Geometry g = Preset("deepseek-v3");
  PriceOptions bf16 = On("H200-141G", 4, 65536, 8);
  PriceOptions fp8 = bf16;
  fp8.kv_format = "fp8_ds_mla";  // 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE = 656 B
  Price a = MustPrice(g, bf16);
  Price b = MustPrice(g, fp8);
  EXPECT_EQ(a.absorbed.flops, b.absorbed.flops);
  EXPECT_EQ(a.absorbed.cache_bytes, uint64_t{4} * 65536 * 1152 * 61);
  EXPECT_EQ(b.absorbed.cache_bytes, uint64_t{4} * 65536 * 656 * 61);
  EXPECT_GT(b.absorbed.intensity, a.absorbed.intensity);
}

TEST(Price, InputErrorsNameTheField) {
  Result<Price> p = ComputePrice(Preset("llama-3.1-8b"), On("H200-141G", 1, 1024, 1));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "model");
  p = ComputePrice(Preset("deepseek-v3"), On("H200-141G", 1, 1024, 3));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "tp");
  p = ComputePrice(Preset("deepseek-v3"), On("H200-141G", 0, 1024, 8));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "batch");
  p = ComputePrice(Preset("deepseek-v3"), On("H200-141G", 1, 0, 8));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "context");
  PriceOptions o = On("H200-141G", 1, 1024, 8);
  o.kv_format = "nope";
  p = ComputePrice(Preset("deepseek-v3"), o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "kv-format");
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Issue 12 §4: the closed forms price uses equal what the reference kernels count when they run
// (include/tessera/attention.h: MlaDecodeFlops is asserted equal to the kernels' counters in
// attention_test), term by term summed, for V3's and the tiny models' dims.
TEST(Price, ClosedFormsEqualTheReferenceKernelsCounters) {
  for (const PriceDims& d : {PriceDims{512, 64, 128, 128}, PriceDims{512, 64, 64, 64}}) {
    for (uint32_t heads : {1u, 4u, 16u}) {
      MlaDims k;
      k.heads = heads;
      k.latent = static_cast<uint32_t>(d.latent);
      k.rope = static_cast<uint32_t>(d.rope);
      k.nope = static_cast<uint32_t>(d.nope);
      k.v = static_cast<uint32_t>(d.v);
      for (uint64_t n : {uint64_t{1}, uint64_t{100}, uint64_t{4096}, uint64_t{131072}}) {
        const uint64_t absorbed =
            AbsorbQFlops(d) + AbsorbedScoreFlops(d, n) + AbsorbedValueFlops(d, n) + AbsorbVUpFlops(d);
        const uint64_t naive =
            NaiveKUpFlops(d, n) + NaiveVUpFlops(d, n) + NaiveScoreFlops(d, n) + NaiveValueFlops(d, n);
        EXPECT_EQ(heads * absorbed, MlaDecodeFlops(k, AttentionForm::kAbsorbed, n)) << n;
        EXPECT_EQ(heads * naive, MlaDecodeFlops(k, AttentionForm::kNaive, n)) << n;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
