#include "tessera/geometry.h"

#include <gtest/gtest.h>

#include <chrono>

#include "test_support.h"

namespace tessera {
namespace {

using testing::FromJson;
using testing::Preset;

TEST(Geometry, EveryPresetLoads) {
  std::vector<std::string> names = PresetNames();
  for (const char* expected :
       {"deepseek-v2", "deepseek-v2-lite", "deepseek-v3", "deepseek-r1", "deepseek-v3.1", "deepseek-v3.2", "kimi-k2",
        "deepseek-v4-flash", "deepseek-v4-pro", "llama-3.1-8b", "llama-3.1-70b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  for (const std::string& n : names) {
    Result<Geometry> g = LoadPreset(n);
    EXPECT_TRUE(g.ok()) << n << ": " << g.status().ToString();
  }
}

TEST(Geometry, DeepSeekV3IsDenseMla) {
  Geometry g = Preset("deepseek-v3");
  EXPECT_TRUE(g.is_mla);
  EXPECT_FALSE(g.is_hybrid);
  EXPECT_EQ(g.num_layers, 61u);
  EXPECT_EQ(g.num_mtp_layers, 1u);
  EXPECT_EQ(g.latent_dim, 512u);
  EXPECT_EQ(g.qk_rope_head_dim, 64u);
  EXPECT_EQ(g.layers.size(), 62u);
  EXPECT_EQ(g.CountLayers(LayerKind::kMla, false), 61u);
  EXPECT_EQ(g.CountLayers(LayerKind::kMla, true), 62u);
  EXPECT_TRUE(g.layers.back().is_mtp);
  EXPECT_EQ(g.mha_heads() * g.mha_head_dim(), 128u * 128u);
}

TEST(Geometry, DeepSeekV32HasAnIndexerPerLayer) {
  Geometry g = Preset("deepseek-v3.2");
  EXPECT_EQ(g.CountLayers(LayerKind::kMlaSparse, false), 61u);
  EXPECT_EQ(g.index_head_dim, 128u);
  EXPECT_EQ(g.index_topk, 2048u);
  ASSERT_EQ(g.layers[0].caches.size(), 2u);
  EXPECT_EQ(g.layers[0].caches[1].role, CacheRole::kIndexer);
}

TEST(Geometry, DeepSeekV4ProLayerMap) {
  Geometry g = Preset("deepseek-v4-pro");
  EXPECT_TRUE(g.is_hybrid);
  EXPECT_EQ(g.CountLayers(LayerKind::kCsa, false), 30u);
  EXPECT_EQ(g.CountLayers(LayerKind::kHca, false), 31u);
  EXPECT_EQ(g.CountLayers(LayerKind::kSwa, false), 0u);
  EXPECT_EQ(g.CountLayers(LayerKind::kSwa, true), 1u);  // the MTP layer's entry is 0
  EXPECT_EQ(g.latent_dim, 448u);                        // head_dim 512 - rope 64, never 512 + 64
  EXPECT_EQ(g.sliding_window, 128u);
  // Layers 0 and 1 are HCA, then CSA on even layers.
  EXPECT_EQ(g.layers[0].kind, LayerKind::kHca);
  EXPECT_EQ(g.layers[1].kind, LayerKind::kHca);
  EXPECT_EQ(g.layers[2].kind, LayerKind::kCsa);
  EXPECT_EQ(g.layers[3].kind, LayerKind::kHca);
}

TEST(Geometry, DeepSeekV4FlashLayerMap) {
  Geometry g = Preset("deepseek-v4-flash");
  EXPECT_EQ(g.CountLayers(LayerKind::kCsa, false), 21u);
  EXPECT_EQ(g.CountLayers(LayerKind::kHca, false), 20u);
  EXPECT_EQ(g.CountLayers(LayerKind::kSwa, false), 2u);
}

TEST(Geometry, V4LayerCaches) {
  Geometry g = Preset("deepseek-v4-pro");
  const LayerSpec& csa = g.layers[2];
  // window, compressed main, compressor state, indexer, indexer compressor state
  ASSERT_EQ(csa.caches.size(), 5u);
  EXPECT_EQ(csa.caches[0].role, CacheRole::kWindow);
  EXPECT_EQ(csa.caches[0].slots, 128u);
  EXPECT_EQ(csa.caches[1].compress_ratio, 4u);
  EXPECT_EQ(csa.caches[2].slots, 8u);            // overlapping compressor: 2 x 4
  EXPECT_EQ(csa.caches[2].state_floats, 2048u);  // 2 x coff 2 x 512
  EXPECT_EQ(csa.caches[4].state_floats, 512u);   // 2 x 2 x index_head_dim 128
  const LayerSpec& hca = g.layers[0];
  ASSERT_EQ(hca.caches.size(), 3u);
  EXPECT_EQ(hca.caches[2].slots, 128u);
  EXPECT_EQ(hca.caches[2].state_floats, 1024u);  // 2 x coff 1 x 512
}

TEST(Geometry, LlamaIsGqa) {
  Geometry g = Preset("llama-3.1-8b");
  EXPECT_FALSE(g.is_mla);
  EXPECT_EQ(g.num_kv_heads, 8u);
  EXPECT_EQ(g.head_dim, 128u);  // hidden 4096 / 32 heads
  EXPECT_EQ(g.CountLayers(LayerKind::kMha, false), 32u);
}

TEST(Geometry, Sha256OfTheConfigText) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Geometry g = Preset("deepseek-v3");
  EXPECT_EQ(g.config_sha256, Sha256Hex(*PresetConfigText("deepseek-v3")));
}

TEST(Geometry, UnknownPresetIsNotFound) {
  Result<Geometry> g = LoadPreset("deepseek-v9");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(g.status().field(), "model");
}

TEST(Geometry, MissingFileIsIoError) {
  Result<Geometry> g = LoadConfigFile("/nonexistent/config.json");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kIoError);
  EXPECT_EQ(g.status().field(), "config");
}

struct BadConfig {
  const char* name;
  const char* json;
  const char* field;
};

class GeometryBadInput : public ::testing::TestWithParam<BadConfig> {};

TEST_P(GeometryBadInput, NamesTheField) {
  Result<Geometry> g = GeometryFromConfigJson(GetParam().json, "bad.json");
  ASSERT_FALSE(g.ok()) << GetParam().name;
  EXPECT_EQ(g.status().field(), GetParam().field) << g.status().ToString();
  EXPECT_EQ(g.status().ToString().find('\n'), std::string::npos);
}

#define MLA_BASE "\"num_attention_heads\": 8, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"v_head_dim\": 128"
INSTANTIATE_TEST_SUITE_P(
    All, GeometryBadInput,
    ::testing::Values(
        BadConfig{"rope zero", "{\"num_hidden_layers\": 2, " MLA_BASE ", \"qk_rope_head_dim\": 0}", "qk_rope_head_dim"},
        BadConfig{"rope negative", "{\"num_hidden_layers\": 2, " MLA_BASE ", \"qk_rope_head_dim\": -64}",
                  "qk_rope_head_dim"},
        BadConfig{"rope string", "{\"num_hidden_layers\": 2, " MLA_BASE ", \"qk_rope_head_dim\": \"64\"}",
                  "qk_rope_head_dim"},
        BadConfig{"rope fraction", "{\"num_hidden_layers\": 2, " MLA_BASE ", \"qk_rope_head_dim\": 64.5}",
                  "qk_rope_head_dim"},
        BadConfig{"layers zero", "{\"num_hidden_layers\": 0, " MLA_BASE ", \"qk_rope_head_dim\": 64}",
                  "num_hidden_layers"},
        BadConfig{"layers missing", "{" MLA_BASE ", \"qk_rope_head_dim\": 64}", "num_hidden_layers"},
        BadConfig{"layers bool", "{\"num_hidden_layers\": true, " MLA_BASE ", \"qk_rope_head_dim\": 64}",
                  "num_hidden_layers"},
        BadConfig{"latent zero",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"kv_lora_rank\": 0, \"qk_nope_head_dim\": "
                  "128, \"v_head_dim\": 128, \"qk_rope_head_dim\": 64}",
                  "kv_lora_rank"},
        BadConfig{"heads negative", "{\"num_hidden_layers\": 2, \"num_attention_heads\": -8, \"hidden_size\": 4096}",
                  "num_attention_heads"},
        BadConfig{"kv heads do not divide",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 32, \"num_key_value_heads\": 5, "
                  "\"hidden_size\": 4096}",
                  "num_key_value_heads"},
        BadConfig{"hidden not multiple",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 3, \"hidden_size\": 4096}", "hidden_size"},
        BadConfig{
            "mha rope above head dim",
            "{\"num_hidden_layers\": 2, \"num_attention_heads\": 32, \"hidden_size\": 4096, \"qk_rope_head_dim\": 256}",
            "qk_rope_head_dim"},
        BadConfig{"v4 rope above head dim",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "600, \"sliding_window\": 128, \"compress_ratios\": [0, 128]}",
                  "qk_rope_head_dim"},
        BadConfig{"v4 ratios too short",
                  "{\"num_hidden_layers\": 3, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "64, \"sliding_window\": 128, \"compress_ratios\": [0, 128]}",
                  "compress_ratios"},
        BadConfig{"v4 ratio negative",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "64, \"sliding_window\": 128, \"compress_ratios\": [0, -4]}",
                  "compress_ratios"},
        BadConfig{"v4 ratios not a list",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "64, \"sliding_window\": 128, \"compress_ratios\": 4}",
                  "compress_ratios"},
        BadConfig{"v4 window zero",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "64, \"sliding_window\": 0, \"compress_ratios\": [0, 128]}",
                  "sliding_window"},
        BadConfig{"v4 csa without indexer",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": "
                  "64, \"sliding_window\": 128, \"compress_ratios\": [4, 128]}",
                  "index_head_dim"},
        BadConfig{"malformed json", "{\"num_hidden_layers\": 2,, }", "config"},
        BadConfig{"not an object", "[1, 2, 3]", "config"},
        BadConfig{"model_type not a string", "{\"model_type\": 3, \"num_hidden_layers\": 2}", "model_type"},
        // A number beyond double's range: nlohmann throws out_of_range (not parse_error).
        BadConfig{"number beyond double", "{\"num_hidden_layers\": 1e400, " MLA_BASE ", \"qk_rope_head_dim\": 64}",
                  "config"},
        // MTP layers near 2^32: main + MTP wrapped to a handful of layers (32-bit sum).
        BadConfig{"mtp near 2^32",
                  "{\"num_hidden_layers\": 2, " MLA_BASE
                  ", \"qk_rope_head_dim\": 64, \"num_nextn_predict_layers\": 4294967295}",
                  "num_nextn_predict_layers"},
        BadConfig{"mtp past the layer bound",
                  "{\"num_hidden_layers\": 100000, \"num_attention_heads\": 8, \"hidden_size\": 1024, "
                  "\"num_nextn_predict_layers\": 1}",
                  "num_nextn_predict_layers"},
        // qk_nope + qk_rope wrapped to 63 in 32 bits.
        BadConfig{"mla head dims wrap",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"kv_lora_rank\": 512, "
                  "\"qk_nope_head_dim\": 4294967295, \"v_head_dim\": 128, \"qk_rope_head_dim\": 64}",
                  "qk_nope_head_dim"},
        // 2 x coff x head_dim floats per compressor slot: 2^32 for a 2^30-dim CSA head.
        BadConfig{"v4 compressor slot wraps",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 1073741824, "
                  "\"qk_rope_head_dim\": 64, \"sliding_window\": 128, \"compress_ratios\": [4, 128], "
                  "\"index_head_dim\": 128, \"index_n_heads\": 64, \"index_topk\": 512}",
                  "head_dim"},
        BadConfig{"v4 indexer compressor slot wraps",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, "
                  "\"qk_rope_head_dim\": 64, \"sliding_window\": 128, \"compress_ratios\": [4, 128], "
                  "\"index_head_dim\": 1073741824, \"index_n_heads\": 64, \"index_topk\": 512}",
                  "index_head_dim"},
        // Recompute re-runs the last `sliding_window` tokens; a CSA compressor needs the 4 before
        // a boundary. A window of 2 resumed with wrong compressor state.
        BadConfig{"v4 window shorter than a csa group",
                  "{\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"head_dim\": 512, "
                  "\"qk_rope_head_dim\": 64, \"sliding_window\": 3, \"compress_ratios\": [4, 128], "
                  "\"index_head_dim\": 128, \"index_n_heads\": 64, \"index_topk\": 512}",
                  "sliding_window"},
        BadConfig{"nested value in a checked field", "{\"num_hidden_layers\": [[[[[[[[[[1]]]]]]]]]]}",
                  "num_hidden_layers"}),
    [](const ::testing::TestParamInfo<BadConfig>& param_info) {
      std::string n = param_info.param.name;
      for (char& c : n) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

// A value nested far deeper than any config.json, in a field the reader checks: quoting it in
// the error walked it recursively (a stack overflow). Refused before parsing, naming "config".
TEST(Geometry, DeeplyNestedValuesAreRefusedBeforeParsing) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& json :
       {"{\"num_hidden_layers\": " + deep + "}", "{\"compress_ratios\": " + deep + ", \"num_hidden_layers\": 2}", deep,
        "{\"a\": " + std::string(100000, '{') + std::string(100000, '}') + "}"}) {
    Result<Geometry> g = GeometryFromConfigJson(json, "deep.json");
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().field(), "config");
    EXPECT_NE(g.status().message().find("nests deeper than"), std::string::npos) << g.status().message();
  }
  // Brackets inside strings are text, not nesting.
  std::string quoted = "{\"note\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\", " +
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"hidden_size\": 1024}";
  EXPECT_TRUE(GeometryFromConfigJson(quoted, "quoted.json").ok());
  // Real configs nest a few levels (quantization_config): fine.
  std::string nested =
      "{\"quantization_config\": {\"a\": {\"b\": {\"c\": [[1]]}}}, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 8, \"hidden_size\": 1024}";
  EXPECT_TRUE(GeometryFromConfigJson(nested, "nested.json").ok());
}

TEST(Geometry, ConfigTextIsBounded) {
  std::string big = "{\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"hidden_size\": 1024, \"pad\": \"" +
                    std::string(16 << 20, 'x') + "\"}";
  Result<Geometry> g = GeometryFromConfigJson(big, "big.json");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(g.status().field(), "config");
}

// --config reads regular files only: a FIFO blocked forever, /dev/zero read until out of memory.
TEST(Geometry, ConfigMustBeARegularFile) {
  for (const char* path : {"/dev/zero", "/dev/null", "/"}) {
    Result<Geometry> g = LoadConfigFile(path);
    ASSERT_FALSE(g.ok()) << path;
    EXPECT_EQ(g.status().field(), "config") << path;
    EXPECT_NE(g.status().message().find("not a regular file"), std::string::npos) << g.status().message();
  }
}

// The MTP layer count flowed into a loop over main + MTP layers: 2^32 - 1 of them.
// (A loop over them would show as the test's timeout.)
TEST(Geometry, HybridMtpNear2To32IsRefusedQuickly) {
  Result<Geometry> g = GeometryFromConfigJson(R"({"num_hidden_layers": 2, "num_attention_heads": 64,
      "head_dim": 512, "qk_rope_head_dim": 64, "sliding_window": 128, "compress_ratios": [0, 128],
      "num_nextn_predict_layers": 4294967295})",
                                              "mtp.json");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "num_nextn_predict_layers");
}

TEST(Geometry, V4WindowOfOneCsaGroupIsEnough) {
  Geometry g = FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 64, "head_dim": 512,
      "qk_rope_head_dim": 64, "sliding_window": 4, "compress_ratios": [4, 128],
      "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512})");
  EXPECT_EQ(g.sliding_window, 4u);
  // Without CSA layers nothing overlaps a boundary: any window will do.
  Geometry hca = FromJson(R"({"num_hidden_layers": 2, "num_attention_heads": 64, "head_dim": 512,
      "qk_rope_head_dim": 64, "sliding_window": 1, "compress_ratios": [0, 128]})");
  EXPECT_EQ(hca.sliding_window, 1u);
}

TEST(Geometry, GenericHybridModelWorks) {
  // A V4-like model the presets do not ship: every compress ratio kind, MTP entry listed.
  Geometry g = FromJson(R"({"num_hidden_layers": 4, "num_attention_heads": 16, "head_dim": 256,
      "qk_rope_head_dim": 32, "sliding_window": 64, "compress_ratios": [0, 4, 16, 4, 0],
      "num_nextn_predict_layers": 1, "index_head_dim": 64, "index_n_heads": 8, "index_topk": 128})");
  EXPECT_EQ(g.CountLayers(LayerKind::kCsa, false), 2u);
  EXPECT_EQ(g.CountLayers(LayerKind::kHca, false), 1u);
  EXPECT_EQ(g.CountLayers(LayerKind::kSwa, false), 1u);
  EXPECT_EQ(g.CountLayers(LayerKind::kSwa, true), 2u);
  EXPECT_EQ(g.latent_dim, 224u);
}

}  // namespace
}  // namespace tessera
