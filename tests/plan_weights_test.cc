// Weight bytes per rank (weights.h, src/plan/weights.cc) on small configs whose every tensor is
// counted by hand in the comments: the tensor list, the sharding rule (rows, columns, vocab
// ceiling, replicated), bf16/fp8/fp4 bytes with their scales, MTP apart; bad configs refused
// naming the field; checked arithmetic at the largest dimensions.
#include "tessera/weights.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/file_io.h"
#include "test_support.h"

namespace tessera {
namespace {

// Llama-shaped: hidden 8, 2 layers, vocab 10, 2 heads (head_dim 8/2 = 4), 1 KV head, FFN 16.
// Per layer (rows x cols):
//   q_proj 8x8 = 64, k_proj 4x8 = 32, v_proj 4x8 = 32, o_proj 8x8 = 64         attention 192
//   input_post_layernorm 8 x 2 copies = 16                                     norms 16
//   gate_up_proj 32x8 = 256, down_proj 8x16 = 128                              dense_ffn 384
//   = 592 a layer, 1184 for two; embed 10x8 = 80, norm 8, lm_head 10x8 = 80: 1352 in all.
const char* const kLlama = R"({"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10,
  "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16})";

// The same with fp8 blocks of 4x4 (float32 scales: 4 B each).
const char* const kLlamaFp8 = R"({"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10,
  "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16,
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 4]}})";

std::string WithField(const std::string& json, const std::string& field, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(json);
  if (value.empty()) {
    j.erase(field);
  } else {
    j[field] = nlohmann::json::parse(value);
  }
  return j.dump();
}

WeightShapes Parse(const std::string& json) {
  Result<WeightShapes> s = WeightShapesFromConfigJson(json, "test-config");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : WeightShapes{};
}

WeightBytes Bytes(const WeightShapes& s, WeightDtype d, uint32_t tp, bool mtp = false) {
  Result<WeightBytes> w = ComputeWeightBytes(s, d, tp, mtp);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? *w : WeightBytes{};
}

std::map<std::string, uint64_t> GroupBytes(const WeightBytes& w) {
  std::map<std::string, uint64_t> m;
  for (const WeightGroupBytes& g : w.groups) m[g.group] = g.bytes_per_rank;
  return m;
}

void ExpectRefused(const std::string& json, StatusCode code, const std::string& field) {
  Result<WeightShapes> s = WeightShapesFromConfigJson(json, "test-config");
  ASSERT_FALSE(s.ok()) << json;
  EXPECT_EQ(s.status().code(), code) << s.status().ToString();
  EXPECT_EQ(s.status().field(), field) << s.status().ToString();
  EXPECT_EQ(s.status().ToString().find('\n'), std::string::npos);
}

TEST(WeightDtype, NamesRoundTripAndUnknownNamesAreRefused) {
  for (WeightDtype d : {WeightDtype::kBf16, WeightDtype::kFp8, WeightDtype::kFp4}) {
    Result<WeightDtype> back = ParseWeightDtype(WeightDtypeName(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(WeightDtypeName(WeightDtype::kFp4), "fp4");
  for (const char* bad : {"", "FP8", "fp16", "bf16 ", "int4"}) {
    Result<WeightDtype> r = ParseWeightDtype(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().field(), "weights-dtype");
    EXPECT_NE(r.status().message().find("known: bf16, fp8, fp4"), std::string::npos);
  }
  // A long name is echoed cut to 40 characters.
  Result<WeightDtype> r = ParseWeightDtype(std::string(5000, 'x'));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().ToString().size(), 150u) << r.status().ToString();
}

TEST(WeightShapes, ListsEveryTensorOfAnMhaModel) {
  const WeightShapes s = Parse(kLlama);
  EXPECT_EQ(s.model, "test-config");
  EXPECT_EQ(s.num_attention_heads, 2u);
  EXPECT_FALSE(s.has_fp8);
  EXPECT_EQ(s.checkpoint_dtype, WeightDtype::kBf16);
  // 7 tensors a layer, then embedding, norm and head.
  ASSERT_EQ(s.tensors.size(), 1 + 2 * 7 + 2u);
  const WeightTensor& embed = s.tensors.front();
  EXPECT_EQ(embed.name, "embed_tokens");
  EXPECT_EQ(embed.split, Split::kRows);
  EXPECT_EQ(s.tensors.back().name, "lm_head");
  const WeightTensor& k = s.tensors[2];
  EXPECT_EQ(k.name, "k_proj");
  EXPECT_EQ(k.rows, 4u);  // 1 KV head x head_dim 4
  EXPECT_EQ(k.cols, 8u);
  EXPECT_EQ(ParameterCount(s, false), 1352u);
  EXPECT_EQ(ParameterCount(s, true), 0u);
  // Tied embeddings: no lm_head, 80 fewer.
  const WeightShapes tied = Parse(WithField(kLlama, "tie_word_embeddings", "true"));
  EXPECT_EQ(ParameterCount(tied, false), 1352u - 80u);
  // head_dim given: q 2x6 rows, k/v 6 rows, o 8x12: 96 + 48 + 48 + 96 = 288 attention a layer.
  const WeightShapes hd = Parse(WithField(kLlama, "head_dim", "6"));
  EXPECT_EQ(ParameterCount(hd, false), 1352u + 2 * (288 - 192));
}

TEST(WeightBytes, Bf16ShardsByRowsColumnsAndVocabCeiling) {
  const WeightShapes s = Parse(kLlama);
  WeightBytes one = Bytes(s, WeightDtype::kBf16, 1);
  EXPECT_EQ(one.params, 1352u);
  EXPECT_EQ(one.bytes_per_rank, 2 * 1352u);
  EXPECT_EQ(one.scale_bytes_per_rank, 0u);
  // tp 2, per layer: q 4x8 = 32, k 2x8 = 16, v 16, o 8x4 = 32 (96); norms 16 (replicated);
  // gate_up 16x8 = 128, down 8x8 = 64 (192): 304, 608 for two. Embedding and head ceil(10/2) = 5
  // rows: 40 each; norm 8. 696 elements, 1392 B.
  WeightBytes two = Bytes(s, WeightDtype::kBf16, 2);
  EXPECT_EQ(two.params, 1352u);  // the whole model's, whatever tp
  EXPECT_EQ(two.bytes_per_rank, 1392u);
  std::map<std::string, uint64_t> g = GroupBytes(two);
  EXPECT_EQ(g["attention"], 2 * 2 * 96u);
  EXPECT_EQ(g["norms"], 2 * (2 * 16u + 8u));
  EXPECT_EQ(g["dense_ffn"], 2 * 2 * 192u);
  EXPECT_EQ(g["embedding"], 80u);
  EXPECT_EQ(g["lm_head"], 80u);
  // An odd vocabulary leaves the busiest rank the ceiling: 11 rows over 2 ranks, 6 on one.
  const WeightShapes odd = Parse(WithField(kLlama, "vocab_size", "11"));
  EXPECT_EQ(GroupBytes(Bytes(odd, WeightDtype::kBf16, 2))["embedding"], 2 * 6 * 8u);
}

TEST(WeightBytes, Fp8CountsOneScalePerBlock) {
  const WeightShapes s = Parse(kLlamaFp8);
  EXPECT_TRUE(s.has_fp8);
  EXPECT_EQ(s.fp8_block, 4u);
  EXPECT_EQ(s.fp8_scale_bytes, 4u);
  EXPECT_EQ(s.checkpoint_dtype, WeightDtype::kFp8);
  // tp 1, linear layers 1 B an element plus ceil(r/4) x ceil(c/4) scales of 4 B:
  //   q 8x8: 64 + 2x2x4 = 16; k 4x8: 32 + 1x2x4 = 8; v the same; o 8x8: 64 + 16;
  //   gate_up 32x8: 256 + 8x2x4 = 64; down 8x16: 128 + 2x4x4 = 32
  //   = 576 + 144 a layer; norms 16 bf16 = 32 B: 752 a layer, 1504 for two, scales 288.
  // Embedding, head (bf16): 160 B each; norm 16 B. 1840 B in all.
  WeightBytes one = Bytes(s, WeightDtype::kFp8, 1);
  EXPECT_EQ(one.bytes_per_rank, 1840u);
  EXPECT_EQ(one.scale_bytes_per_rank, 288u);
  // tp 2: q 4x8: 32 + 1x2x4 = 8; k 2x8: 16 + 8; v the same; o 8x4: 32 + 2x1x4 = 8;
  //   gate_up 16x8: 128 + 4x2x4 = 32; down 8x8: 64 + 2x2x4 = 16
  //   = 288 + 80 a layer, norms 32 B: 400, 800 for two, scales 160.
  // Embedding, head 5x8 bf16 = 80 B each; norm 16 B. 976 B in all.
  WeightBytes two = Bytes(s, WeightDtype::kFp8, 2);
  EXPECT_EQ(two.bytes_per_rank, 976u);
  EXPECT_EQ(two.scale_bytes_per_rank, 160u);
  // bf16 of an fp8 checkpoint is allowed (dequantized): the bf16 figure.
  EXPECT_EQ(Bytes(s, WeightDtype::kBf16, 1).bytes_per_rank, 2 * 1352u);
}

// MoE with fp4 experts. Layer 0 dense, layer 1 MoE: 4 routed experts of FFN 6, 1 shared.
TEST(WeightBytes, Fp4ExpertsPackTwoPerBytePlusOneScalePer32Inputs) {
  std::string cfg = WithField(kLlamaFp8, "n_routed_experts", "4");
  cfg = WithField(cfg, "moe_intermediate_size", "6");
  cfg = WithField(cfg, "first_k_dense_replace", "1");
  cfg = WithField(cfg, "n_shared_experts", "1");
  cfg = WithField(cfg, "topk_method", "\"noaux_tc\"");
  const WeightShapes s = Parse(WithField(cfg, "expert_dtype", "\"fp4\""));
  EXPECT_TRUE(s.has_fp4_experts);
  EXPECT_EQ(s.checkpoint_dtype, WeightDtype::kFp4);
  // Experts, tp 1: gate_up 12x8 = 96 e2m1 in 48 B + 12 rows x ceil(8/32) = 12 scales: 60;
  // down 8x6 = 48 in 24 B + 8 x 1 scales: 32. 92 an expert, 4 experts: 368 B, scales 80.
  WeightBytes one = Bytes(s, WeightDtype::kFp4, 1);
  std::map<std::string, uint64_t> g = GroupBytes(one);
  EXPECT_EQ(g["experts"], 368u);
  // Router: gate 4x8 bf16 = 64 B; noaux_tc's correction bias 4 float32 = 16 B.
  EXPECT_EQ(g["router"], 80u);
  // Shared expert (1 x 6): gate_up 12x8 fp8 = 96 + 3x2x4 = 24; down 8x6 = 48 + 2x2x4 = 16: 184.
  EXPECT_EQ(g["shared_experts"], 184u);
  // tp 2: gate_up 6x8 = 48 in 24 B + 6 scales: 30; down 8x3 = 24 in 12 B + 8 scales: 20. x4 = 200.
  EXPECT_EQ(GroupBytes(Bytes(s, WeightDtype::kFp4, 2))["experts"], 200u);
  // Under fp8 the experts take fp8 blocks: gate_up 96 + 3x2x4 = 120; down 48 + 2x2x4 = 64. x4 = 736.
  EXPECT_EQ(GroupBytes(Bytes(s, WeightDtype::kFp8, 1))["experts"], 736u);
  // fp4 experts need fp8 blocks: expert_dtype alone is not enough.
  const WeightShapes no_fp8 = Parse(WithField(WithField(cfg, "quantization_config", ""), "expert_dtype", "\"fp4\""));
  EXPECT_FALSE(no_fp8.has_fp4_experts);
  EXPECT_EQ(ComputeWeightBytes(no_fp8, WeightDtype::kFp4, 1, false).status().field(), "weights-dtype");
}

// MLA with an MTP layer. hidden 8, 1 layer, vocab 10, 2 heads, kv_lora 4, nope 2, rope 2, v 2,
// no q_lora:
//   q_proj 2x(2+2) x 8 = 64; kv_a_proj_with_mqa (4+2) x 8 = 48; kv_b_proj 2x(2+2) x 4 = 32;
//   o_proj 8 x (2x2) = 32; kv_a_layernorm 4; input_post_layernorm 16; FFN 256 + 128 = 384
//   = 580 a layer. Main: 580 + embed 80 + norm 8 + head 80 = 748.
//   MTP: 580 + enorm/hnorm/norm 3x8 = 24 + eh_proj 8x16 = 128 + its embed 80 + shared head 80 = 892.
TEST(WeightShapes, MlaAndItsMtpLayerApart) {
  const std::string cfg = R"({"hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 10,
    "num_attention_heads": 2, "intermediate_size": 16, "kv_lora_rank": 4, "qk_nope_head_dim": 2,
    "qk_rope_head_dim": 2, "v_head_dim": 2, "num_nextn_predict_layers": 1})";
  const WeightShapes s = Parse(cfg);
  EXPECT_EQ(ParameterCount(s, false), 748u);
  EXPECT_EQ(ParameterCount(s, true), 892u);
  EXPECT_EQ(Bytes(s, WeightDtype::kBf16, 1).bytes_per_rank, 2 * 748u);
  WeightBytes with = Bytes(s, WeightDtype::kBf16, 1, true);
  EXPECT_TRUE(with.include_mtp);
  EXPECT_EQ(with.params, 748u + 892u);
  EXPECT_EQ(with.bytes_per_rank, 2 * (748u + 892u));
  EXPECT_EQ(GroupBytes(with)["mtp"], 2 * 892u);  // every MTP tensor in one group
  // A q_lora_rank of 3 swaps q_proj (64) for q_a 3x8 = 24, its norm 3 and q_b 8x3 = 24: 51.
  EXPECT_EQ(ParameterCount(Parse(WithField(cfg, "q_lora_rank", "3")), false), 748u - 64u + 51u);
}

TEST(WeightBytes, TpAndDtypeAreCheckedNamingTheField) {
  const WeightShapes s = Parse(kLlama);
  for (uint32_t tp : {0u, 3u, 4u}) {  // 2 heads: 1 and 2 divide them
    Result<WeightBytes> w = ComputeWeightBytes(s, WeightDtype::kBf16, tp, false);
    ASSERT_FALSE(w.ok()) << tp;
    EXPECT_EQ(w.status().field(), "tp");
  }
  Result<WeightBytes> w = ComputeWeightBytes(s, WeightDtype::kFp8, 1, false);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().field(), "weights-dtype");
  EXPECT_NE(w.status().message().find("checkpoint dtype is bf16"), std::string::npos) << w.status().ToString();
  EXPECT_EQ(ComputeWeightBytes(Parse(kLlamaFp8), WeightDtype::kFp4, 1, false).status().field(), "weights-dtype");
  // Shapes built by hand with a zero block side: refused, not a division by zero.
  WeightShapes zero = Parse(kLlamaFp8);
  zero.fp8_block = 0;
  EXPECT_EQ(ComputeWeightBytes(zero, WeightDtype::kFp8, 1, false).status().field(), "weight_block_size");
  EXPECT_TRUE(ComputeWeightBytes(zero, WeightDtype::kBf16, 1, false).ok());  // no blocks in bf16
}

TEST(WeightShapes, QuantizationConfigMustBeSquareFp8Blocks) {
  auto fp8 = [](const std::string& q) { return Parse(WithField(kLlama, "quantization_config", q)).has_fp8; };
  EXPECT_TRUE(fp8(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_TRUE(fp8(R"({"quant_method": "fp8", "weight_block_size": [4096, 4096]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8", "weight_block_size": [4097, 4097]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8", "weight_block_size": [0, 0]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8", "weight_block_size": [128, 64]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8", "weight_block_size": [128]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8", "weight_block_size": [-128, -128]})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "fp8"})"));
  EXPECT_FALSE(fp8(R"({"quant_method": "awq", "weight_block_size": [128, 128]})"));
  EXPECT_FALSE(fp8(R"("fp8")"));
}

TEST(WeightShapes, BadConfigsAreRefusedNamingTheField) {
  for (const char* f : {"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"}) {
    ExpectRefused(WithField(kLlama, f, ""), StatusCode::kInvalidArgument, f);
    for (const char* bad : {"-1", "1.5", "\"8\"", "[8]", "true"}) {
      ExpectRefused(WithField(kLlama, f, bad), StatusCode::kInvalidArgument, f);
    }
    ExpectRefused(WithField(kLlama, f, "16777217"), StatusCode::kOutOfRange, f);  // 2^24 + 1
    ExpectRefused(WithField(kLlama, f, "18446744073709551615"), StatusCode::kOutOfRange, f);
  }
  // Zero in any of the four is named on hidden_size (one message for all four).
  ExpectRefused(WithField(kLlama, "vocab_size", "0"), StatusCode::kInvalidArgument, "hidden_size");
  ExpectRefused(WithField(kLlama, "hidden_size", "9"), StatusCode::kInvalidArgument, "hidden_size");  // 9 % 2
  ExpectRefused(WithField(kLlama, "intermediate_size", ""), StatusCode::kInvalidArgument, "intermediate_size");
  ExpectRefused(WithField(kLlama, "n_routed_experts", "4"), StatusCode::kInvalidArgument, "moe_intermediate_size");
  const std::string mla = WithField(
      WithField(WithField(WithField(kLlama, "kv_lora_rank", "4"), "qk_nope_head_dim", "2"), "qk_rope_head_dim", "2"),
      "v_head_dim", "2");
  EXPECT_TRUE(WeightShapesFromConfigJson(mla, "x").ok());
  for (const char* f : {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}) {
    ExpectRefused(WithField(mla, f, ""), StatusCode::kInvalidArgument, f);
  }
  ExpectRefused(WithField(mla, "index_topk", "2"), StatusCode::kInvalidArgument, "index_n_heads");
  // DeepSeek-V4 (compress_ratios present) needs its own fields.
  const std::string v4 = WithField(mla, "compress_ratios", "[0, 4]");
  ExpectRefused(v4, StatusCode::kInvalidArgument, "head_dim");
  std::string v4ok = WithField(
      WithField(WithField(WithField(v4, "head_dim", "4"), "o_groups", "2"), "o_lora_rank", "2"), "hc_mult", "2");
  ExpectRefused(v4ok, StatusCode::kInvalidArgument, "q_lora_rank");
  v4ok = WithField(v4ok, "q_lora_rank", "4");
  EXPECT_TRUE(WeightShapesFromConfigJson(v4ok, "x").ok()) << WeightShapesFromConfigJson(v4ok, "x").status().ToString();
  EXPECT_EQ(Parse(v4ok).fp8_scale_bytes, 1u);  // e8m0 scales
  ExpectRefused(WithField(v4ok, "o_groups", "3"), StatusCode::kInvalidArgument, "o_groups");
  ExpectRefused(WithField(v4ok, "compress_ratios", "[0, 4, 4]"), StatusCode::kInvalidArgument, "compress_ratios");
  ExpectRefused(WithField(v4ok, "compress_ratios", "[0, -4]"), StatusCode::kInvalidArgument, "compress_ratios");
  ExpectRefused(WithField(v4ok, "compress_ratios", "{\"0\": 4}"), StatusCode::kInvalidArgument, "compress_ratios");
  // The text itself.
  for (const char* bad : {"", "[]", "{", "7"}) ExpectRefused(bad, StatusCode::kInvalidArgument, "config");
  std::string big = kLlama;
  big.append(kMaxInputFileBytes + 1 - big.size(), ' ');
  ExpectRefused(big, StatusCode::kOutOfRange, "config");
}

TEST(WeightShapes, LayerCountsAreBoundedBeforeTheyAreListed) {
  // As many layers as a Geometry allows (100000), main plus MTP; one more is refused before a
  // tensor is listed (each layer is listed one by one).
  ExpectRefused(WithField(kLlama, "num_hidden_layers", "100001"), StatusCode::kOutOfRange, "num_hidden_layers");
  ExpectRefused(WithField(WithField(kLlama, "num_hidden_layers", "99999"), "num_nextn_predict_layers", "2"),
                StatusCode::kOutOfRange, "num_nextn_predict_layers");
  ExpectRefused(WithField(kLlama, "num_hidden_layers", "16777216"), StatusCode::kOutOfRange, "num_hidden_layers");
}

// Checked arithmetic at the largest dimensions (2^24 each).
TEST(WeightBytes, HugeDimensionsAreCheckedNotWrapped) {
  // hidden 2^24, 2 heads of 2^23, 1 KV head, FFN 2^24: the largest tensor, gate_up, is 2^25 x 2^24
  // = 2^49 elements; per layer q 2^48 + k 2^47 + v 2^47 + o 2^48 + gate_up 2^49 + down 2^48 +
  // norms 2^25 = 6 x 2^48 + 2^25; embed and head 10 x 2^24 each, norm 2^24: inside 64 bits.
  const std::string big = WithField(WithField(kLlama, "hidden_size", "16777216"), "intermediate_size", "16777216");
  const WeightShapes s = Parse(big);
  const uint64_t layer = 6 * (uint64_t{1} << 48) + (uint64_t{1} << 25);
  const uint64_t want = 2 * layer + 21 * (uint64_t{1} << 24);
  EXPECT_EQ(ParameterCount(s, false), want);
  WeightBytes w = Bytes(s, WeightDtype::kBf16, 1);
  EXPECT_EQ(w.bytes_per_rank, 2 * want);
  // 2^24 routed experts of 2^24 x 2^24 (x2 for gate_up): 2^73 elements, past 64 bits: refused.
  std::string moe = WithField(big, "n_routed_experts", "16777216");
  moe = WithField(moe, "moe_intermediate_size", "16777216");
  Result<WeightShapes> r = WeightShapesFromConfigJson(moe, "moe");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().field(), "config");
  // Shapes built by hand: a count past 64 bits saturates; bytes past 64 bits are an error.
  WeightShapes hand;
  hand.model = "hand";
  hand.num_attention_heads = 1;
  hand.tensors.push_back({"g", "t", uint64_t{1} << 40, uint64_t{1} << 30, 1, WeightClass::kBf16, Split::kReplicated});
  EXPECT_EQ(ParameterCount(hand, false), UINT64_MAX);
  Result<WeightBytes> b = ComputeWeightBytes(hand, WeightDtype::kBf16, 1, false);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.status().field(), "config");
  // Two tensors of 2^62 bf16 elements: 2^63 B each fits, their sum does not.
  hand.tensors.assign(
      2, WeightTensor{"g", "t", uint64_t{1} << 31, uint64_t{1} << 31, 1, WeightClass::kBf16, Split::kReplicated});
  EXPECT_EQ(ParameterCount(hand, false), uint64_t{1} << 63);
  b = ComputeWeightBytes(hand, WeightDtype::kBf16, 1, false);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().field(), "config");
  hand.tensors.pop_back();
  b = ComputeWeightBytes(hand, WeightDtype::kBf16, 1, false);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->bytes_per_rank, uint64_t{1} << 63);
}

}  // namespace
}  // namespace tessera
