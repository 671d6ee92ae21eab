// Capacity planning: weight shapes against published parameter totals, the sharding rule, the
// dtype rules, the KV budget and the concurrency/context answers checked against the ledger.
#include "tessera/plan.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;
using testing::PresetShapes;

WeightBytes Bytes(const WeightShapes& s, WeightDtype d, uint32_t tp, bool mtp) {
  Result<WeightBytes> w = ComputeWeightBytes(s, d, tp, mtp);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? *w : WeightBytes{};
}

double Billions(uint64_t n) { return static_cast<double>(n) / 1e9; }

// Published totals, each from the model's own card.
TEST(Weights, ParameterCountsMatchPublishedTotals) {
  struct Case {
    const char* model;
    bool mtp;
    double published_b;  // billions
    double tolerance;    // relative
    const char* source;
  };
  const Case cases[] = {
      // HF deepseek-ai/DeepSeek-V3 README: "671B of the Main Model weights and 14B of the
      // Multi-Token Prediction (MTP) Module weights", total 685B.
      {"deepseek-v3", false, 671, 0.001, "DeepSeek-V3 model card, main model"},
      {"deepseek-v3", true, 685, 0.001, "DeepSeek-V3 model card, with MTP"},
      // HF deepseek-ai/DeepSeek-V3.2 model page: 685B params (with MTP).
      {"deepseek-v3.2", true, 685, 0.001, "DeepSeek-V3.2 model page"},
      // HF deepseek-ai/DeepSeek-V2-Lite README: "DeepSeek-V2-Lite has 15.7B parameters".
      {"deepseek-v2-lite", false, 15.7, 0.001, "DeepSeek-V2-Lite model card"},
      // HF deepseek-ai/DeepSeek-V2 README: 236B total parameters.
      {"deepseek-v2", false, 236, 0.002, "DeepSeek-V2 model card"},
      // HF moonshotai/Kimi-K2-Instruct README: "1 trillion total parameters" (rounded; the count
      // here is 1.026T).
      {"kimi-k2", false, 1000, 0.03, "Kimi-K2 model card (1T, rounded)"},
      // HF deepseek-ai/DeepSeek-V4-Pro and -Flash READMEs: 1.6T and 284B total parameters.
      {"deepseek-v4-pro", true, 1600, 0.002, "DeepSeek-V4-Pro model card"},
      {"deepseek-v4-flash", false, 284, 0.002, "DeepSeek-V4-Flash model card"},
  };
  for (const Case& c : cases) {
    WeightShapes s = PresetShapes(c.model);
    uint64_t n = ParameterCount(s, false) + (c.mtp ? ParameterCount(s, true) : 0);
    EXPECT_NEAR(Billions(n), c.published_b, c.published_b * c.tolerance) << c.model << " vs " << c.source;
  }
}

TEST(Weights, ExactCountsWhereTheSourcesAreExact) {
  // Hugging Face's safetensors summary of deepseek-ai/DeepSeek-V3 (the model page's "685B
  // params"): BF16 3,918,786,560, F8_E4M3 680,571,043,840 and F32 41,555,600 elements, total
  // 684,531,386,000. F32 is the float32 weight_scale_inv (one per 128x128 block of each fp8
  // tensor) plus the routers' e_score_correction_bias. The same three counts from the shapes:
  WeightShapes v3 = PresetShapes("deepseek-v3");
  uint64_t bf16 = 0, fp8 = 0, f32 = 0;
  for (const WeightTensor& t : v3.tensors) {
    uint64_t n = t.rows * t.cols * t.copies;
    (t.cls == WeightClass::kBf16 ? bf16 : t.cls == WeightClass::kF32 ? f32 : fp8) += n;
  }
  WeightBytes w = Bytes(v3, WeightDtype::kFp8, 1, true);
  EXPECT_EQ(bf16, 3918786560ULL);
  EXPECT_EQ(fp8, 680571043840ULL);
  EXPECT_EQ(f32 + w.scale_bytes_per_rank / 4, 41555600ULL);
  EXPECT_EQ(ParameterCount(v3, false) + ParameterCount(v3, true) + w.scale_bytes_per_rank / 4, 684531386000ULL);
  // And the checkpoint's bytes: 1 B per fp8 element, 2 per bf16, 4 per float32.
  EXPECT_EQ(w.bytes_per_rank, fp8 + 2 * bf16 + 4 * (f32 + w.scale_bytes_per_rank / 4));
  // meta-llama/Llama-3.1-8B and -70B: model.safetensors.index.json total_size 16,060,522,496 and
  // 141,107,412,992 bytes of bf16, i.e. 8,030,261,248 and 70,553,706,496 parameters.
  EXPECT_EQ(ParameterCount(PresetShapes("llama-3.1-8b"), false), 8030261248ULL);
  EXPECT_EQ(ParameterCount(PresetShapes("llama-3.1-70b"), false), 70553706496ULL);
}

TEST(Weights, Bf16IsTwoBytesPerParameterWhenNothingIsFloat32) {
  // DeepSeek-V2-Lite: greedy routing (no float32 router bias), no quantization_config.
  WeightShapes s = PresetShapes("deepseek-v2-lite");
  WeightBytes w = Bytes(s, WeightDtype::kBf16, 1, false);
  EXPECT_EQ(w.bytes_per_rank, 2 * ParameterCount(s, false));
  EXPECT_EQ(w.scale_bytes_per_rank, 0u);
}

TEST(Weights, Fp8ScalesOnePerBlock) {
  // DeepSeek-V3 q_b_proj: [128 x 192, 1536] = 24576 x 1536: 192 x 12 blocks, float32 scales.
  WeightShapes s = PresetShapes("deepseek-v3");
  WeightShapes one = s;
  one.tensors.clear();
  for (const WeightTensor& t : s.tensors) {
    if (t.name == "q_b_proj" && !t.mtp) one.tensors.push_back(t);
  }
  ASSERT_EQ(one.tensors.size(), 61u);
  EXPECT_EQ(one.tensors[0].rows, 24576u);
  EXPECT_EQ(one.tensors[0].cols, 1536u);
  WeightBytes w = Bytes(one, WeightDtype::kFp8, 1, false);
  EXPECT_EQ(w.scale_bytes_per_rank, 61u * 192 * 12 * 4);
  EXPECT_EQ(w.bytes_per_rank, 61u * (24576 * 1536 + 192 * 12 * 4));
  // Split by rows over 8 ranks: 3072 rows, 24 x 12 blocks each.
  WeightBytes w8 = Bytes(one, WeightDtype::kFp8, 8, false);
  EXPECT_EQ(w8.bytes_per_rank, 61u * (3072 * 1536 + 24 * 12 * 4));
}

TEST(Weights, Fp4ExpertsHalfAByteAndAScalePer32) {
  WeightShapes s = PresetShapes("deepseek-v4-flash");
  EXPECT_EQ(s.checkpoint_dtype, WeightDtype::kFp4);
  WeightBytes fp4 = Bytes(s, WeightDtype::kFp4, 1, false);
  WeightBytes fp8 = Bytes(s, WeightDtype::kFp8, 1, false);
  uint64_t experts4 = 0, experts8 = 0, params = 0;
  for (const WeightGroupBytes& g : fp4.groups) {
    if (g.group == "experts") experts4 = g.bytes_per_rank, params = g.params;
  }
  for (const WeightGroupBytes& g : fp8.groups) {
    if (g.group == "experts") experts8 = g.bytes_per_rank;
  }
  // 43 layers x 256 experts x 3 x 4096 x 2048 parameters.
  EXPECT_EQ(params, 43ULL * 256 * 3 * 4096 * 2048);
  EXPECT_EQ(experts4, params / 2 + params / 32);  // every input dim is a multiple of 32
  // fp8: one e8m0 (1 B) scale per 128x128 block.
  EXPECT_EQ(experts8, params + params / (128 * 128));
}

TEST(Weights, ShardingRule) {
  WeightShapes s = PresetShapes("deepseek-v3");
  WeightBytes one = Bytes(s, WeightDtype::kBf16, 1, false);
  WeightBytes eight = Bytes(s, WeightDtype::kBf16, 8, false);
  auto group = [](const WeightBytes& w, const std::string& name) {
    for (const WeightGroupBytes& g : w.groups) {
      if (g.group == name) return g.bytes_per_rank;
    }
    return uint64_t{0};
  };
  // Experts, shared experts, dense FFN, embedding and head split exactly in 8.
  for (const char* split : {"experts", "shared_experts", "dense_ffn", "embedding", "lm_head"}) {
    EXPECT_EQ(group(one, split), 8 * group(eight, split)) << split;
  }
  // Norms and the router are replicated.
  EXPECT_EQ(group(one, "norms"), group(eight, "norms"));
  EXPECT_EQ(group(one, "router"), group(eight, "router"));
  // Attention: q_a and kv_a replicated, the rest split: more than an eighth on each rank.
  EXPECT_GT(8 * group(eight, "attention"), group(one, "attention"));
  // Per layer: q_a [1536, 7168] + kv_a [576, 7168] replicated, q_b/kv_b/o split.
  uint64_t replicated = (1536ULL * 7168 + 576ULL * 7168) * 2;
  uint64_t split = (24576ULL * 1536 + 32768ULL * 512 + 7168ULL * 16384) * 2;
  EXPECT_EQ(group(eight, "attention"), 61 * (replicated + split / 8));
}

TEST(Weights, MtpLayersCountOnlyWhenAsked) {
  WeightShapes s = PresetShapes("deepseek-v3");
  WeightBytes without = Bytes(s, WeightDtype::kBf16, 1, false);
  WeightBytes with = Bytes(s, WeightDtype::kBf16, 1, true);
  EXPECT_EQ(without.params, ParameterCount(s, false));
  EXPECT_EQ(with.params, ParameterCount(s, false) + ParameterCount(s, true));
  uint64_t mtp_bytes = 0;
  for (const WeightGroupBytes& g : with.groups) {
    if (g.group == "mtp") mtp_bytes = g.bytes_per_rank;
  }
  EXPECT_EQ(with.bytes_per_rank, without.bytes_per_rank + mtp_bytes);
  // One MoE decoder layer, eh_proj, three norms, its own embedding and shared head: 13.46B.
  EXPECT_EQ(ParameterCount(s, true), 13463426304ULL);
}

TEST(Weights, RefusesWhatTheConfigCannotHave) {
  // Kimi-K2's preset carries no quantization_config (data/models/README.md).
  Result<WeightBytes> w = ComputeWeightBytes(PresetShapes("kimi-k2"), WeightDtype::kFp8, 8, false);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().field(), "weights-dtype");
  w = ComputeWeightBytes(PresetShapes("deepseek-v3"), WeightDtype::kFp4, 8, false);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().field(), "weights-dtype");
  w = ComputeWeightBytes(PresetShapes("deepseek-v3"), WeightDtype::kFp8, 3, false);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().field(), "tp");
  EXPECT_FALSE(ParseWeightDtype("int4").ok());
  EXPECT_EQ(ParseWeightDtype("int4").status().field(), "weights-dtype");
}

TEST(Weights, MissingShapeFieldsAreNamed) {
  Result<WeightShapes> s = WeightShapesFromConfigJson(R"({"num_hidden_layers": 2, "vocab_size": 10,
      "num_attention_heads": 2, "kv_lora_rank": 4})",
                                                      "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().field(), "hidden_size");
  s = WeightShapesFromConfigJson(R"({"hidden_size": -3})", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().field(), "hidden_size");
  s = WeightShapesFromConfigJson("[1]", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().field(), "config");
}

TEST(Plan, ParseUtilization) {
  EXPECT_EQ(*ParseUtilization("0.9"), Fraction(9, 10));
  EXPECT_EQ(*ParseUtilization("1"), Fraction(1, 1));
  EXPECT_EQ(*ParseUtilization("1.0"), Fraction(1, 1));
  EXPECT_EQ(*ParseUtilization(".95"), Fraction(19, 20));
  for (const char* bad : {"0", "0.0", "1.01", "1.5", "-0.1", "", "abc", "0.9.1", "0.1234567891"}) {
    Result<Fraction> f = ParseUtilization(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().field(), "gpu-memory-utilization");
  }
}

PlanOptions H200x8(uint64_t context) {
  PlanOptions o;
  o.gpu = *LoadGpu("H200-141G");
  o.tp = 8;
  o.context_tokens = context;
  return o;
}

Plan MustPlan(const std::string& model, const PlanOptions& o) {
  Result<Plan> p = ComputePlan(Preset(model), PresetShapes(model), o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Plan{};
}

TEST(Plan, BudgetArithmetic) {
  Plan p = MustPlan("deepseek-v3.2", H200x8(131072));
  // floor(141e9 x 9 / 10).
  EXPECT_EQ(p.usable_bytes, 126900000000ULL);
  EXPECT_EQ(p.weights.dtype, WeightDtype::kFp8);  // the checkpoint's
  EXPECT_EQ(p.kv_budget_bytes, p.usable_bytes - p.weights.bytes_per_rank);
  PlanOptions o = H200x8(131072);
  o.reserve_bytes = 1000000000;
  Plan r = MustPlan("deepseek-v3.2", o);
  EXPECT_EQ(r.kv_budget_bytes, p.kv_budget_bytes - 1000000000);
}

TEST(Plan, ConcurrencyIsTheLedgersPhaseBytesIntoTheBudget) {
  for (const char* model : {"deepseek-v3.2", "deepseek-v4-pro"}) {
    Geometry g = Preset(model);
    Plan p = MustPlan(model, H200x8(131072));
    ASSERT_EQ(p.engines.size(), 3u);
    for (const EnginePlan& e : p.engines) {
      LedgerOptions lo;
      lo.context_tokens = 131072;
      lo.tp = 8;
      lo.engine = e.engine;
      Ledger l = testing::MustLedger(g, lo);
      ASSERT_EQ(e.phases.size(), 3u);
      uint64_t least = UINT64_MAX;
      for (size_t i = 0; i < 3; ++i) {
        const PhasePlan& ph = e.phases[i];
        EXPECT_EQ(ph.bytes_per_request, l.phases[i].bytes) << model << " " << EngineName(e.engine);
        // n requests fit, n + 1 do not.
        EXPECT_LE(ph.max_concurrency * ph.bytes_per_request, p.kv_budget_bytes);
        EXPECT_GT((ph.max_concurrency + 1) * ph.bytes_per_request, p.kv_budget_bytes);
        least = std::min(least, ph.max_concurrency);
      }
      EXPECT_EQ(e.sustained_concurrency, least);
      EXPECT_GT(e.sustained_concurrency, 0u) << model;
    }
  }
}

TEST(Plan, LongestContextFitsAndOneMoreTokenDoesNot) {
  for (const char* model : {"deepseek-v3.2", "deepseek-v4-pro"}) {
    Geometry g = Preset(model);
    PlanOptions o = H200x8(131072);
    o.concurrency = 4;
    o.engines = {Engine::kTessera, Engine::kSglang};
    Plan p = MustPlan(model, o);
    for (const EnginePlan& e : p.engines) {
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(e.phases[i].max_context.has_value());
        const uint64_t c = *e.phases[i].max_context;
        ASSERT_GT(c, 0u) << model;
        LedgerOptions lo;
        lo.tp = 8;
        lo.engine = e.engine;
        lo.batch = 4;
        lo.context_tokens = c;
        EXPECT_LE(testing::MustLedger(g, lo).phases[i].bytes, p.kv_budget_bytes) << model;
        if (c < g.max_position_embeddings) {
          lo.context_tokens = c + 1;
          EXPECT_GT(testing::MustLedger(g, lo).phases[i].bytes, p.kv_budget_bytes) << model;
        }
      }
    }
  }
}

TEST(Plan, GatesRejectWithReasons) {
  PlanOptions o = H200x8(131072);
  o.min_concurrency = 1000000;
  Plan p = MustPlan("deepseek-v3.2", o);
  EXPECT_TRUE(p.any_rejected());
  for (const EnginePlan& e : p.engines) {
    ASSERT_TRUE(e.rejected);
    EXPECT_NE(e.reasons[0].find("--min-concurrency"), std::string::npos) << e.reasons[0];
  }
  o = H200x8(131072);
  o.concurrency = 2;
  Plan ok = MustPlan("deepseek-v3.2", o);
  EXPECT_FALSE(ok.any_rejected());
  // A ceiling between the engines' committed bytes rejects only those above it.
  uint64_t lowest = UINT64_MAX, highest = 0;
  for (const EnginePlan& e : ok.engines) {
    lowest = std::min(lowest, e.committed_bytes);
    highest = std::max(highest, e.committed_bytes);
    EXPECT_EQ(e.committed_bytes, 2 * std::max({e.phases[0].bytes_per_request, e.phases[1].bytes_per_request,
                                               e.phases[2].bytes_per_request}));
  }
  ASSERT_LT(lowest, highest);
  o.max_committed_bytes = lowest;
  Plan gated = MustPlan("deepseek-v3.2", o);
  for (const EnginePlan& e : gated.engines) {
    EXPECT_EQ(e.rejected, e.committed_bytes > lowest) << EngineName(e.engine);
  }
}

TEST(Plan, WeightsThatDoNotFitRejectEveryEngine) {
  // DeepSeek-V4-Pro in bf16 is ~3.2 TB: not on 8 x 80 GB.
  PlanOptions o = H200x8(131072);
  o.gpu = *LoadGpu("h100-80g");
  o.weights_dtype = WeightDtype::kBf16;
  Plan p = MustPlan("deepseek-v4-pro", o);
  EXPECT_FALSE(p.weights_fit);
  EXPECT_EQ(p.kv_budget_bytes, 0u);
  for (const EnginePlan& e : p.engines) {
    EXPECT_TRUE(e.rejected);
    EXPECT_EQ(e.sustained_concurrency, 0u);
  }
}

TEST(Plan, InputErrorsNameTheField) {
  PlanOptions o = H200x8(131072);
  o.tp = 3;
  Result<Plan> p = ComputePlan(Preset("deepseek-v3"), PresetShapes("deepseek-v3"), o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "tp");
  o = H200x8(0);
  p = ComputePlan(Preset("deepseek-v3"), PresetShapes("deepseek-v3"), o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "context");
  o = H200x8(1024);
  o.concurrency = 0;
  p = ComputePlan(Preset("deepseek-v3"), PresetShapes("deepseek-v3"), o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().field(), "concurrency");
  Result<GpuSpec> gpu = LoadGpu("A100");
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().field(), "gpu");
}

TEST(Gpu, ShippedSpecs) {
  std::vector<std::string> names = GpuNames();
  EXPECT_EQ(names.size(), 4u);
  GpuSpec h200 = *LoadGpu("h200-141g");
  EXPECT_EQ(h200.name, "H200-141G");
  EXPECT_EQ(h200.memory_bytes, 141000000000ULL);
  EXPECT_EQ(h200.hbm_bytes_per_s, 4800000000000ULL);
  EXPECT_EQ(LoadGpu("MI300X")->memory_bytes, 192000000000ULL);
  Result<GpuSpec> bad = GpuSpecFromJson(R"({"name": "x", "memory_bytes": 0, "hbm_bytes_per_s": 1,
      "dense_bf16_flops": 1, "dense_fp8_flops": 1})",
                                        "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "memory_bytes");
  bad = GpuSpecFromJson(R"({"name": "x", "memory_bytes": 1, "hbm_bytes_per_s": 1.5,
      "dense_bf16_flops": 1, "dense_fp8_flops": 1})",
                        "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "hbm_bytes_per_s");
}

}  // namespace
}  // namespace tessera
