// Golden bytes the engines' own writers produced for the same inputs (tests/data/engine_bytes,
// provenance in its PROVENANCE.md and ADR 0033): Tessera's codecs must write them byte for byte,
// each record format in its default scale format (what the engine writes) and its option.
#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/codec.h"
#include "tessera/format.h"
#include "test_support.h"

namespace tessera {
namespace {

constexpr size_t kTokens = 8;

std::vector<std::byte> ReadBytes(const std::string& name) {
  std::ifstream f(std::string(TESSERA_TEST_DATA) + "/engine_bytes/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<std::byte>(raw[i]);
  return out;
}

// Inputs: kTokens rows of float32, little-endian (bf16-exact values).
std::vector<float> ReadFloats(const std::string& name, size_t per_token) {
  const std::vector<std::byte> b = ReadBytes(name);
  EXPECT_EQ(b.size(), kTokens * per_token * 4) << name;
  std::vector<float> out(b.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= std::to_integer<uint32_t>(b[4 * i + k]) << (8 * k);
    out[i] = std::bit_cast<float>(v);
  }
  return out;
}

void ExpectSameBytes(std::span<const std::byte> got, std::span<const std::byte> want, size_t token) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::to_integer<int>(got[i]), std::to_integer<int>(want[i])) << "token " << token << " byte " << i;
  }
}

void CheckDsMla(ScaleFormat scales, const std::string& golden) {
  const std::vector<float> in = ReadFloats("v32.f32", 576);
  const std::vector<std::byte> want = ReadBytes(golden);
  ASSERT_EQ(want.size(), kTokens * kFp8DsMlaRecordBytes);
  for (size_t t = 0; t < kTokens; ++t) {
    std::vector<std::byte> rec(kFp8DsMlaRecordBytes);
    const std::span<const float> tok = std::span(in).subspan(t * 576, 576);
    ASSERT_TRUE(QuantizeFp8DsMla(tok.first(512), tok.subspan(512), rec, scales).ok());
    ExpectSameBytes(rec, std::span(want).subspan(t * kFp8DsMlaRecordBytes, kFp8DsMlaRecordBytes), t);
  }
}

// vLLM concat_and_cache_ds_mla_kernel (local-inference-lab/vllm 28be48fa, csrc/cache_kernels.cu
// blob 9130dd2c): the default, amax scales.
TEST(EngineBytes, Fp8DsMlaIsWhatVllmWrites) { CheckDsMla(ScaleFormat::kAmax, "vllm_ds_mla.bin"); }

// FlashMLA tests/quant.py quantize_k_cache, V32_FP8Sparse (deepseek-ai/FlashMLA 9241ae3e, blob
// b92b5399): power-of-two scales, the ue8m0 option.
TEST(EngineBytes, Fp8DsMlaUe8m0IsWhatFlashMlasReferenceWrites) {
  CheckDsMla(ScaleFormat::kUe8m0, "flashmla_ds_mla_ue8m0.bin");
}

// FlashMLA quantize_k_cache, MODEL1_FP8Sparse: the 576-B data row and the 7 scale bytes of each
// token (its pad byte is what torch.empty left there, so not compared).
TEST(EngineBytes, V4Fp8IsWhatFlashMlaWrites) {
  const std::vector<float> in = ReadFloats("v4.f32", 512);
  const std::vector<std::byte> want = ReadBytes("flashmla_v4.bin");
  ASSERT_EQ(want.size(), kTokens * (kV4DataRowBytes + kV4ScaleRowBytes));
  for (size_t t = 0; t < kTokens; ++t) {
    std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
    const std::span<const float> tok = std::span(in).subspan(t * 512, 512);
    ASSERT_TRUE(QuantizeV4Fp8(tok.first(448), tok.subspan(448), data, scales).ok());
    const std::span<const std::byte> w = std::span(want).subspan(t * 584, 584);
    ExpectSameBytes(data, w.first(576), t);
    ExpectSameBytes(std::span(scales).first(7), w.subspan(576, 7), t);
  }
}

void CheckIndexer(ScaleFormat scales, const std::string& golden) {
  const std::vector<float> in = ReadFloats("idx.f32", 128);
  const std::vector<std::byte> want = ReadBytes(golden);
  ASSERT_EQ(want.size(), kTokens * 132);
  for (size_t t = 0; t < kTokens; ++t) {
    std::vector<std::byte> rec(132);
    ASSERT_TRUE(QuantizeIndexerFp8(std::span(in).subspan(t * 128, 128), rec, scales).ok());
    ExpectSameBytes(rec, std::span(want).subspan(t * 132, 132), t);
  }
}

// vLLM indexer_k_quant_and_cache_kernel with scale_fmt "ue8m0" (what vLLM's DeepSeek-V3.2 passes,
// vllm/model_executor/models/deepseek_v2.py:647): the default.
TEST(EngineBytes, IndexerFp8IsWhatVllmWritesForV32) { CheckIndexer(ScaleFormat::kUe8m0, "vllm_idx_ue8m0.bin"); }
// The same kernel without a scale format: the amax option.
TEST(EngineBytes, IndexerFp8AmaxIsVllmsPlainScale) { CheckIndexer(ScaleFormat::kAmax, "vllm_idx_plain.bin"); }

TEST(EngineBytes, RecordFormatsCarryTheEnginesScaleFormat) {
  const Geometry v32 = testing::Preset("deepseek-v3.2");
  EXPECT_EQ(BuildFormat("fp8_ds_mla", v32)->scale_format, ScaleFormat::kAmax);
  EXPECT_EQ(BuildFormat("indexer-fp8", v32)->scale_format, ScaleFormat::kUe8m0);
  EXPECT_FALSE(BuildFormat("mla-bf16", v32)->scale_format.has_value());
  EXPECT_EQ(*ParseScaleFormat("ue8m0"), ScaleFormat::kUe8m0);
  EXPECT_EQ(ParseScaleFormat("e8m0", "kv-scale-format").status().field(), "kv-scale-format");
  CacheLayoutOptions o;
  o.kv_scale_format = ScaleFormat::kUe8m0;
  o.indexer_scale_format = ScaleFormat::kAmax;
  Result<CacheMap> m = MapCaches(v32, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->main_format.scale_format, ScaleFormat::kUe8m0);
  EXPECT_EQ(m->lines[0].format.scale_format, ScaleFormat::kUe8m0);
  EXPECT_EQ(m->lines[1].format.scale_format, ScaleFormat::kAmax);
  // Sizes do not depend on the scale format.
  EXPECT_EQ(m->lines[0].format.record_bytes(), 656u);
  EXPECT_EQ(m->lines[1].format.record_bytes(), 132u);
  CacheLayoutOptions bf16;
  bf16.kv_format = "mla-bf16";
  bf16.kv_scale_format = ScaleFormat::kAmax;
  EXPECT_EQ(MapCaches(v32, bf16).status().field(), "kv-scale-format");
  CacheLayoutOptions none;
  none.indexer_scale_format = ScaleFormat::kAmax;
  EXPECT_EQ(MapCaches(testing::Preset("deepseek-v3"), none).status().field(), "indexer-scale-format");
}

}  // namespace
}  // namespace tessera
