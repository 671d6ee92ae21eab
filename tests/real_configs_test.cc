// Real public config.json files of hybrid and nested models (tests/data/configs, provenance in
// tests/data/configs/PROVENANCE.md): the per-layer kinds the reader finds, and the ledger's
// requested bytes at 128K tokens (131,072), each figure derived by hand below (ADR 0033).
#include <gtest/gtest.h>

#include <string>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::FromJson;

constexpr uint64_t k128K = 131072;

Geometry Config(const std::string& name) {
  Result<Geometry> g = LoadConfigFile(std::string(TESSERA_TEST_DATA) + "/configs/" + name);
  EXPECT_TRUE(g.ok()) << name << ": " << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Ledger At128K(const Geometry& g, Engine engine = Engine::kTessera) {
  LedgerOptions o;
  o.context_tokens = k128K;
  o.engine = engine;
  Result<Ledger> l = ComputeLedger(g, o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *l : Ledger{};
}

const CacheLine& Line(const Ledger& l, const std::string& name) {
  const CacheLine* line = l.FindLine(name);
  EXPECT_NE(line, nullptr) << name;
  static const CacheLine kNone;
  return line != nullptr ? *line : kNone;
}

// vLLM's and SGLang's allocators for sliding-window and linear-attention layers are not
// modelled: their profiles refuse naming "engine", never price the model as dense.
void ExpectEnginesRefuse(const Geometry& g) {
  for (Engine e : {Engine::kVllm, Engine::kSglang}) {
    LedgerOptions o;
    o.context_tokens = k128K;
    o.engine = e;
    Result<Ledger> l = ComputeLedger(g, o);
    ASSERT_FALSE(l.ok()) << EngineName(e);
    EXPECT_EQ(l.status().field(), "engine");
    EXPECT_NE(l.status().message().find("--engine tessera"), std::string::npos) << l.status().message();
  }
}

// gpt-oss-20b: layer_types alternates sliding_attention / full_attention over 24 layers, a
// 128-token window, 8 KV heads of 64, bf16.
//   record = 2 (K, V) x 8 x 64 x 2 B = 2,048 B per token per layer
//   full:    12 layers x 131,072 x 2,048 = 3,221,225,472 B
//   sliding: 12 layers x 128 x 2,048     =     3,145,728 B
//   total                                = 3,224,371,200 B  (dense over 24 layers: 6,442,450,944)
// (gpt-oss-120b has 36 such layers: 18 x 131,072 x 2,048 = 4,831,838,208 B, the issue's ~4.8 GB.)
TEST(RealConfigs, GptOss20bSlidesHalfItsLayers) {
  Geometry g = Config("gpt-oss-20b.json");
  EXPECT_EQ(g.layer_kinds_field, "layer_types");
  EXPECT_EQ(g.CountLayers(LayerKind::kSliding, false), 12u);
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 12u);
  EXPECT_EQ(g.layers[0].kind, LayerKind::kSliding);
  EXPECT_EQ(g.layers[0].window, 128u);
  EXPECT_EQ(g.layers[1].kind, LayerKind::kMha);
  Ledger l = At128K(g);
  EXPECT_EQ(l.requested_bytes, 3'224'371'200u);
  EXPECT_EQ(Line(l, "mha.kv").requested_bytes, 3'221'225'472u);
  EXPECT_EQ(Line(l, "sliding.window").requested_bytes, 3'145'728u);
  EXPECT_EQ(Line(l, "sliding.window").record_bytes, 2048u);
  EXPECT_EQ(Line(l, "mha.kv").formula, "tokens x 2,048 B x 12 layers");
  EXPECT_EQ(Line(l, "sliding.window").formula, "min(tokens, 128) x 2,048 B x 12 layers (a 128-token window)");
  // The window is held whole from the first token (a ring in the per-request arena).
  EXPECT_EQ(l.TermBytes(LedgerTerm::kRingCapacity), 0u);
  ExpectEnginesRefuse(g);
}

// MiMo-V2.5: hybrid_layer_pattern, 1 = sliding: 39 of 48 layers (0, 5, 11, ..., 47 are full),
// window 128; full layers 4 KV heads, sliding layers 8 (swa_num_key_value_heads); K 192 wide,
// V 128 (v_head_dim, swa_v_head_dim), bf16.
//   full record    = 4 x (192 + 128) x 2 B = 2,560 B;  9 x 131,072 x 2,560 = 3,019,898,880 B
//   sliding record = 8 x (192 + 128) x 2 B = 5,120 B; 39 x 128 x 5,120     =    25,559,040 B
//   total                                                               = 3,045,457,920 B
TEST(RealConfigs, MiMoV25SlidesWithItsOwnHeadsAndVWidth) {
  Geometry g = Config("mimo-v2.5.json");
  EXPECT_EQ(g.layer_kinds_field, "hybrid_layer_pattern");
  EXPECT_EQ(g.CountLayers(LayerKind::kSliding, false), 39u);
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 9u);
  EXPECT_EQ(g.v_head_dim, 128u);
  EXPECT_EQ(g.layers[0].kv, (KvDims{4, 192, 128}));
  EXPECT_EQ(g.layers[1].kv, (KvDims{8, 192, 128}));
  Ledger l = At128K(g);
  EXPECT_EQ(Line(l, "mha.kv").record_bytes, 2560u);
  EXPECT_EQ(Line(l, "sliding.window").record_bytes, 5120u);
  EXPECT_EQ(Line(l, "mha.kv").requested_bytes, 3'019'898'880u);
  EXPECT_EQ(Line(l, "sliding.window").requested_bytes, 25'559'040u);
  EXPECT_EQ(l.requested_bytes, 3'045'457'920u);
  // K and V differ in width: the shape is in elements of the whole record.
  EXPECT_EQ(Line(l, "mha.kv").shape, (std::vector<uint64_t>{9, 1, k128K, 4 * (192 + 128)}));
  ExpectEnginesRefuse(g);
}

// Kimi-K3: text_config (model_type kimi_linear inside kimi_k3) with linear_attn_config listing
// layers from 1: full_attn_layers 4, 8, ..., 92, 93 (24 MLA layers), kda_layers the other 69.
//   MLA:   24 x 131,072 x (512 + 64) x 2 B = 3,623,878,656 B
//   KDA state per layer (vLLM kda_state_shape / kda_state_dtype): conv 3 x 96 x 128 x (4 - 1)
//          = 110,592 bf16 = 221,184 B; recurrent 96 x 128 x 128 = 1,572,864 fp32 = 6,291,456 B;
//          6,512,640 B per layer x 69 = 449,372,160 B
//   total                              = 4,073,250,816 B  (as 93 MLA layers: 14,042,529,792)
TEST(RealConfigs, KimiK3IsTwentyFourMlaLayersAndConstantLinearState) {
  Geometry g = Config("kimi-k3.json");
  EXPECT_EQ(g.model_type, "kimi_linear");
  EXPECT_EQ(g.layer_kinds_field, "linear_attn_config");
  EXPECT_EQ(g.CountLayers(LayerKind::kMla, false), 24u);
  EXPECT_EQ(g.CountLayers(LayerKind::kLinear, false), 69u);
  EXPECT_EQ(g.layers[2].kind, LayerKind::kLinear);  // layer number 3
  EXPECT_EQ(g.layers[3].kind, LayerKind::kMla);     // layer number 4
  EXPECT_EQ(g.layers[92].kind, LayerKind::kMla);    // layer number 93
  EXPECT_EQ(g.layers[0].linear.rule, "kda");
  EXPECT_EQ(g.layers[0].linear.recurrent_dtype, StateDtype::kFp32);
  EXPECT_EQ(g.max_position_embeddings, 1048576u);
  Ledger l = At128K(g);
  EXPECT_EQ(Line(l, "mla.latent").requested_bytes, 3'623'878'656u);
  EXPECT_EQ(Line(l, "linear.linear_state").record_bytes, 6'512'640u);
  EXPECT_EQ(Line(l, "linear.linear_state").requested_bytes, 449'372'160u);
  EXPECT_EQ(l.requested_bytes, 4'073'250'816u);
  EXPECT_EQ(Line(l, "linear.linear_state").formula,
            "6,512,640 B x 69 layers, constant per request (linear-attention state: kda)");
  // A state is the same at any context.
  LedgerOptions one;
  one.context_tokens = 1;
  EXPECT_EQ(ComputeLedger(g, one)->FindLine("linear.linear_state")->requested_bytes, 449'372'160u);
  bool wrapper_noted = false;
  for (const std::string& n : g.notes) wrapper_noted = wrapper_noted || n.find("read text_config") != std::string::npos;
  EXPECT_TRUE(wrapper_noted);
  ExpectEnginesRefuse(g);
}

// Qwen3-Coder-Next: layer_types, every 4th layer full_attention, the others linear_attention
// (Gated DeltaNet), dtype bfloat16; full: 2 KV heads of 256.
//   full:   12 x 131,072 x 2 x 2 x 256 x 2 B = 3,221,225,472 B
//   GDN state per layer: conv (2 x 16 x 128 + 32 x 128) x (4 - 1) = 24,576; recurrent
//           32 x 128 x 128 = 524,288; 548,864 bf16 = 1,097,728 B; x 36 = 39,518,208 B
//   total                                     = 3,260,743,680 B
TEST(RealConfigs, Qwen3CoderNextIsAQuarterFullAttention) {
  Geometry g = Config("qwen3-coder-next-nvfp4.json");
  EXPECT_EQ(g.layer_kinds_field, "layer_types");
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 12u);
  EXPECT_EQ(g.CountLayers(LayerKind::kLinear, false), 36u);
  Ledger l = At128K(g);
  EXPECT_EQ(Line(l, "linear.linear_state").record_bytes, 1'097'728u);
  EXPECT_EQ(Line(l, "mha.kv").requested_bytes, 3'221'225'472u);
  EXPECT_EQ(l.requested_bytes, 3'260'743'680u);
  ExpectEnginesRefuse(g);
}

// Qwen3.5-397B-A17B (text_config, no layer_types): full_attention_interval 4 over 60 layers.
//   full:  15 x 131,072 x 2 x 2 x 256 x 2 B = 4,026,531,840 B
//   GDN state: conv (2 x 16 x 128 + 64 x 128) x 3 = 36,864; recurrent 64 x 128 x 128 =
//          1,048,576; 1,085,440 bf16 = 2,170,880 B; x 45 = 97,689,600 B
//   total                                    = 4,124,221,440 B
TEST(RealConfigs, Qwen35FullAttentionIntervalInsideTextConfig) {
  Geometry g = Config("qwen3.5-397b-a17b.json");
  EXPECT_EQ(g.layer_kinds_field, "full_attention_interval");
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 15u);
  EXPECT_EQ(g.CountLayers(LayerKind::kLinear, false), 45u);
  EXPECT_EQ(g.layers[3].kind, LayerKind::kMha);
  Ledger l = At128K(g);
  EXPECT_EQ(Line(l, "linear.linear_state").record_bytes, 2'170'880u);
  EXPECT_EQ(l.requested_bytes, 4'124'221'440u);
}

// Qwen2-0.5B: sliding_window 131072 but use_sliding_window false: every layer full.
//   24 x 131,072 x 2 x 2 x 64 x 2 B = 1,610,612,736 B
TEST(RealConfigs, Qwen2WithoutSlidingWindowIsDense) {
  Geometry g = Config("qwen2-0.5b.json");
  EXPECT_EQ(g.layer_kinds_field, "use_sliding_window");
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 24u);
  Ledger l = At128K(g);
  EXPECT_EQ(l.requested_bytes, 1'610'612'736u);
  // Dense: the engines price it as before.
  LedgerOptions vllm;
  vllm.context_tokens = k128K;
  vllm.engine = Engine::kVllm;
  EXPECT_TRUE(ComputeLedger(g, vllm).ok());
}

// A Qwen3.5-27B fixture without head_dim: 5,120 / 24 heads is no head width. Refused naming the
// field rather than guessed.
TEST(RealConfigs, Qwen35WithoutHeadDimIsRefused) {
  Result<Geometry> g = LoadConfigFile(std::string(TESSERA_TEST_DATA) + "/configs/qwen3.5-27b.json");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "hidden_size");
}

TEST(RealConfigs, TensorParallelShardsEveryLayersHeads) {
  Geometry mimo = Config("mimo-v2.5.json");
  LedgerOptions o;
  o.context_tokens = k128K;
  o.tp = 8;
  Result<Ledger> l = ComputeLedger(mimo, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  // Sliding layers: 8 heads over 8 ranks, one each; full layers: 4 heads replicate to one per rank.
  EXPECT_EQ(l->FindLine("sliding.window")->format.record_bytes(), 1u * (192 + 128) * 2);
  EXPECT_EQ(l->FindLine("mha.kv")->format.record_bytes(), 1u * (192 + 128) * 2);
  Geometry k3 = Config("kimi-k3.json");
  Result<Ledger> k = ComputeLedger(k3, o);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->FindLine("linear.linear_state")->format.record_bytes(), 6'512'640u / 8);
  o.tp = 5;
  EXPECT_EQ(ComputeLedger(k3, o).status().field(), "tp");
  EXPECT_EQ(ComputeLedger(mimo, o).status().field(), "tp");
}

struct Refused {
  const char* name;
  const char* json;
  const char* field;
};

class RealConfigRefusal : public ::testing::TestWithParam<Refused> {};

TEST_P(RealConfigRefusal, NamesTheField) {
  Result<Geometry> g = GeometryFromConfigJson(GetParam().json, "bad.json");
  ASSERT_FALSE(g.ok()) << GetParam().name;
  EXPECT_EQ(g.status().field(), GetParam().field) << g.status().ToString();
}

#define GQA "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 64"
INSTANTIATE_TEST_SUITE_P(
    All, RealConfigRefusal,
    ::testing::Values(
        Refused{"window without pattern", "{\"num_hidden_layers\": 2, " GQA ", \"sliding_window\": 4096}",
                "sliding_window"},
        Refused{"unknown layer type",
                "{\"num_hidden_layers\": 2, " GQA ", \"layer_types\": [\"full_attention\", \"chunked_attention\"]}",
                "layer_types"},
        Refused{"layer types too short", "{\"num_hidden_layers\": 3, " GQA ", \"layer_types\": [\"full_attention\"]}",
                "layer_types"},
        Refused{"sliding without window",
                "{\"num_hidden_layers\": 2, " GQA ", \"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
                "sliding_window"},
        Refused{"pattern not 0 or 1", "{\"num_hidden_layers\": 2, " GQA ", \"hybrid_layer_pattern\": [0, 2]}",
                "hybrid_layer_pattern"},
        Refused{"linear without dims",
                "{\"num_hidden_layers\": 2, " GQA ", \"layer_types\": [\"linear_attention\", \"full_attention\"]}",
                "linear_attn_config"},
        Refused{"kda layer listed twice",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"linear_attn_config\": {\"kda_layers\": [1, 2], \"full_attn_layers\": [2], \"num_heads\": 2, "
                "\"head_dim\": 8, \"short_conv_kernel_size\": 4}}",
                "linear_attn_config.full_attn_layers"},
        Refused{"kda layer numbered from 0",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"linear_attn_config\": {\"kda_layers\": [0], \"num_heads\": 2, \"head_dim\": 8, "
                "\"short_conv_kernel_size\": 4}}",
                "linear_attn_config.kda_layers"},
        Refused{"layer in neither list",
                "{\"num_hidden_layers\": 3, " GQA
                ", \"linear_attn_config\": {\"kda_layers\": [1], \"full_attn_layers\": [3], \"num_heads\": 2, "
                "\"head_dim\": 8, \"short_conv_kernel_size\": 4}}",
                "linear_attn_config.full_attn_layers"},
        Refused{"kernel of one",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"linear_attn_config\": {\"kda_layers\": [1], \"num_heads\": 2, \"head_dim\": 8, "
                "\"short_conv_kernel_size\": 1}}",
                "linear_attn_config.short_conv_kernel_size"},
        Refused{"state past 2^56",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"linear_attn_config\": {\"kda_layers\": [1], \"num_heads\": 4294967295, \"head_dim\": "
                "4294967295, \"short_conv_kernel_size\": 4}}",
                "linear_attn_config"},
        Refused{"unknown dtype",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"dtype\": \"int8\", \"full_attention_interval\": 2, \"linear_num_key_heads\": 2, "
                "\"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8, "
                "\"linear_conv_kernel_dim\": 4}",
                "dtype"},
        Refused{"max_window_layers missing",
                "{\"num_hidden_layers\": 2, " GQA ", \"use_sliding_window\": true, \"sliding_window\": 64}",
                "max_window_layers"},
        Refused{"mla sliding",
                "{\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"kv_lora_rank\": 512, "
                "\"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"sliding_window\": 64, "
                "\"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
                "layer_types"},
        Refused{"gemma4 k equals v",
                "{\"model_type\": \"gemma4\", \"text_config\": {\"num_hidden_layers\": 2, " GQA
                ", \"sliding_window\": 512, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                "\"attention_k_eq_v\": true}}",
                "text_config.attention_k_eq_v"},
        Refused{"gemma kv shared layers",
                "{\"num_hidden_layers\": 2, " GQA
                ", \"sliding_window\": 512, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                "\"num_kv_shared_layers\": 1}",
                "num_kv_shared_layers"},
        Refused{"llama4 chunked", "{\"num_hidden_layers\": 2, " GQA ", \"no_rope_layers\": [1, 0]}", "no_rope_layers"},
        Refused{"wrapped field named with its wrapper",
                "{\"model_type\": \"kimi_k25\", \"text_config\": {\"num_hidden_layers\": 2, \"num_attention_heads\": "
                "8, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 0, \"v_head_dim\": 128}}",
                "text_config.qk_rope_head_dim"},
        Refused{"wrapped layer types named with the wrapper",
                "{\"text_config\": {\"num_hidden_layers\": 2, " GQA ", \"layer_types\": [\"full_attention\"]}}",
                "text_config.layer_types"}),
    [](const ::testing::TestParamInfo<Refused>& param_info) {
      std::string n = param_info.param.name;
      for (char& c : n) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

// Shapes of configs the shipped set does not cover, with their figures.
TEST(RealConfigs, PatternsAndWrappers) {
  // Gemma-3: sliding_window_pattern 6 -> layers 5, 11 full, the others slide.
  Geometry gemma3 = FromJson(R"({"model_type": "gemma3", "text_config": {"num_hidden_layers": 12,
      "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 1024,
      "sliding_window_pattern": 6}})");
  EXPECT_EQ(gemma3.CountLayers(LayerKind::kSliding, false), 10u);
  EXPECT_EQ(gemma3.layers[5].kind, LayerKind::kMha);
  EXPECT_EQ(gemma3.layers[11].kind, LayerKind::kMha);
  // Gemma-4 global layers: their own heads and width.
  Geometry gemma4 = FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8,
      "head_dim": 256, "num_global_key_value_heads": 2, "global_head_dim": 512, "sliding_window": 1024,
      "layer_types": ["sliding_attention", "full_attention"]})");
  EXPECT_EQ(gemma4.layers[0].kv, (KvDims{8, 256, 256}));
  EXPECT_EQ(gemma4.layers[1].kv, (KvDims{2, 512, 512}));
  // Step-3.5: KV heads are num_attention_groups; sliding layers' heads in attention_other_setting;
  // layer_types lists the MTP layers too.
  Geometry step = FromJson(R"({"num_hidden_layers": 2, "num_nextn_predict_layers": 1, "num_attention_heads": 64,
      "num_attention_groups": 8, "head_dim": 128, "sliding_window": 512,
      "attention_other_setting": {"num_attention_heads": 96, "num_attention_groups": 4, "head_dim": 64},
      "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})");
  EXPECT_EQ(step.num_kv_heads, 8u);
  EXPECT_EQ(step.layers[0].kv, (KvDims{8, 128, 128}));
  EXPECT_EQ(step.layers[1].kv, (KvDims{4, 64, 64}));
  EXPECT_TRUE(step.layers[2].is_mtp);
  EXPECT_EQ(step.layers[2].kind, LayerKind::kSliding);
  // Qwen2 with use_sliding_window: layers from max_window_layers slide.
  Geometry qwen2 = FromJson(R"({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512,
      "use_sliding_window": true, "max_window_layers": 3, "sliding_window": 64})");
  EXPECT_EQ(qwen2.CountLayers(LayerKind::kSliding, false), 1u);
  EXPECT_EQ(qwen2.layers[3].kind, LayerKind::kSliding);
  // thinker_config.text_config (Qwen-Omni).
  Geometry omni = FromJson(R"({"thinker_config": {"text_config": {"num_hidden_layers": 2,
      "num_attention_heads": 8, "hidden_size": 512}}})");
  EXPECT_EQ(omni.num_layers, 2u);
  // A config with num_hidden_layers of its own is read as itself even beside a text_config.
  Geometry own = FromJson(R"({"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 512,
      "text_config": {"num_hidden_layers": 9}})");
  EXPECT_EQ(own.num_layers, 3u);
}

// The request manager holds DeepSeek-V4's window state only: a model whose sliding-window or
// linear-attention state it would not hold is refused, never held as if it had none.
TEST(RealConfigs, RequestManagerRefusesStateItDoesNotHold) {
  for (const char* name : {"gpt-oss-20b.json", "kimi-k3.json"}) {
    ManagerOptions o;
    o.capacity_blocks = 16;
    Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(Config(name), o);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().field(), "model");
  }
  ManagerOptions o;
  o.capacity_blocks = 16;
  EXPECT_TRUE(RequestManager::Create(Config("qwen2-0.5b.json"), o).ok());
}

}  // namespace
}  // namespace tessera
