// The tiny models' config, weight stream and safetensors weight file (model.h, src/model/
// weights.cc), function by function: tensor lists counted by hand, the SplitMix64 stream against
// its published test vector, the file's layout byte for byte, every refusal of a hostile file
// naming the tensor or field, checked sizes at shapes past 64 bits, and the file on disk.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::TempDir;

TinyConfig Config(const std::string& model) {
  Result<TinyConfig> c = LoadTinyConfig(model);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : TinyConfig{};
}

uint64_t Total(const std::vector<TensorSpec>& specs) {
  uint64_t n = 0;
  for (const TensorSpec& t : specs) n += t.elements();
  return n;
}

// ---- Config ------------------------------------------------------------------------------------

TEST(TinyConfigLoad, ReadsThePresetsFields) {
  EXPECT_EQ(TinyModelNames(), (std::vector<std::string>{"tiny-dsa", "tiny-mla"}));
  // data/models/tiny-mla.json, field by field.
  const TinyConfig m = Config("tiny-mla");
  EXPECT_EQ(m.name, "tiny-mla");
  EXPECT_EQ(m.layers, 4u);
  EXPECT_EQ(m.hidden, 256u);
  EXPECT_EQ(m.heads, 4u);
  EXPECT_EQ(m.q_lora, 128u);
  EXPECT_EQ(m.kv_lora, 512u);
  EXPECT_EQ(m.nope, 64u);
  EXPECT_EQ(m.rope, 64u);
  EXPECT_EQ(m.v, 64u);
  EXPECT_EQ(m.vocab, 256u);
  EXPECT_EQ(m.ffn, 256u);
  EXPECT_EQ(m.rms_eps, 1e-6f);
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_FALSE(m.has_indexer());
  EXPECT_EQ(m.geometry.name, "tiny-mla");
  const TinyConfig d = Config("tiny-dsa");
  EXPECT_TRUE(d.has_indexer());
  EXPECT_EQ(d.index_heads, 4u);
  EXPECT_EQ(d.index_head_dim, 128u);
  EXPECT_EQ(d.index_topk, 64u);
}

TEST(TinyConfigLoad, UnknownModelsAreNamedOnOneShortLine) {
  for (const char* bad : {"", "TINY-MLA", "tiny-mla ", "deepseek-v3", "tiny-v4", "../tiny-mla"}) {
    Result<TinyConfig> r = LoadTinyConfig(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << bad;
    EXPECT_EQ(r.status().field(), "model");
    EXPECT_NE(r.status().message().find("known: tiny-mla, tiny-dsa"), std::string::npos);
  }
  // A hostile name: control characters shown as '?', at most 40 characters echoed.
  Result<TinyConfig> r = LoadTinyConfig("x\ny\x1b" + std::string(5000, 'z'));
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().ToString();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"x?y?" + std::string(36, 'z') + "\""), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 120u) << msg;
}

TEST(TinyConfigLoad, KvFormats) {
  EXPECT_TRUE(CheckTinyKvFormat("mla-bf16").ok());
  EXPECT_TRUE(CheckTinyKvFormat("fp8_ds_mla").ok());
  for (const char* bad : {"", "MLA-BF16", "mla-bf16\n", "fp8", "indexer-fp8"}) {
    Status s = CheckTinyKvFormat(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.field(), "kv-format") << bad;
  }
}

// ---- Tensor list -------------------------------------------------------------------------------

TEST(TensorSpecs, ElementsAreCheckedPastSixtyFourBits) {
  EXPECT_EQ((TensorSpec{"s", {}}).elements(), 1u);  // a scalar
  EXPECT_EQ((TensorSpec{"t", {3, 4, 5}}).elements(), 60u);
  EXPECT_EQ((TensorSpec{"z", {7, 0, 9}}).elements(), 0u);
  EXPECT_EQ((TensorSpec{"h", {uint64_t{1} << 32, uint64_t{1} << 31}}).elements(), uint64_t{1} << 63);
  // 2^64 would wrap to 0 (an empty tensor): it saturates instead.
  EXPECT_EQ((TensorSpec{"w", {uint64_t{1} << 32, uint64_t{1} << 32}}).elements(), UINT64_MAX);
  EXPECT_EQ((TensorSpec{"w", {uint64_t{1} << 32, uint64_t{1} << 32, 0}}).elements(), UINT64_MAX);
}

// tiny-mla, per layer: attn_norm 256; wq_a 128x256 = 32768; q_norm 128; wq_b (4x128)x128 = 65536;
// wkv_a (512+64)x256 = 147456; kv_norm 512; wkv_b (4x128)x512 = 262144; wo 256x256 = 65536;
// ffn_norm 256; w1, w3 256x256 and w2 256x256 = 3 x 65536 = 196608. 771200 a layer, 3084800 for 4;
// embed 65536, norm 256, head 65536: 3216128 floats. tiny-dsa adds per layer the indexer's
// wq_b (4x128)x128 = 65536, wk 128x256 = 32768, k_norm weight and bias 2 x 128, weights_proj
// 4x256 = 1024: 99584, 398336 for 4.
TEST(TensorSpecs, EveryTensorOfTheTinyModelsCountedByHand) {
  const std::vector<TensorSpec> m = WeightSpecs(Config("tiny-mla"));
  ASSERT_EQ(m.size(), 1 + 4 * 12 + 2u);
  EXPECT_EQ(Total(m), 3216128u);
  EXPECT_EQ(m.front().name, "embed.weight");
  EXPECT_EQ(m.back().name, "head.weight");
  EXPECT_EQ(m[1].name, "layers.0.attn_norm.weight");
  std::set<std::string> names;
  for (const TensorSpec& t : m) {
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    if (t.name == "layers.2.attn.wkv_a.weight") {
      EXPECT_EQ(t.shape, (std::vector<uint64_t>{576, 256}));
    }
    if (t.name == "layers.3.attn.wo.weight") {
      EXPECT_EQ(t.shape, (std::vector<uint64_t>{256, 256}));
    }
  }
  const std::vector<TensorSpec> d = WeightSpecs(Config("tiny-dsa"));
  ASSERT_EQ(d.size(), 1 + 4 * 17 + 2u);
  EXPECT_EQ(Total(d), 3216128u + 398336u);
}

// ---- Weight stream -----------------------------------------------------------------------------

TEST(WeightStream, FollowsSplitMix64sPublishedVector) {
  // SplitMix64 from seed 1234567: 6457827717110365317, 3203168211198807973, 9817491932198370423
  // (the reference implementation's test vector); each draw is ((z >> 40) + 0.5) / 2^24 x 2 - 1.
  uint64_t state = 1234567;
  for (uint64_t z : {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL}) {
    const double want = (static_cast<double>(z >> 40) + 0.5) / 16777216.0 * 2.0 - 1.0;
    EXPECT_EQ(NextWeightDraw(state), want);
  }
  // The state advanced by the golden gamma once per draw.
  EXPECT_EQ(state, 1234567 + 3 * 0x9e3779b97f4a7c15ULL);
  // Each draw is an odd multiple of 2^-24: strictly inside (-1, 1), never 0.
  state = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = NextWeightDraw(state);
    ASSERT_GT(u, -1.0);
    ASSERT_LT(u, 1.0);
    ASSERT_NE(u, 0.0);
    const double k = (u + 1.0) * 8388608.0;  // (u24 + 0.5) exactly
    ASSERT_EQ(k - std::floor(k), 0.5) << i;
  }
}

TEST(WeightStream, EachTensorIsShapedAndScaledByItsKind) {
  const TinyConfig c = Config("tiny-dsa");
  const Weights w = GenerateWeights(c, 7);
  EXPECT_EQ(w.model, "tiny-dsa");
  EXPECT_EQ(w.seed, 7u);
  const std::vector<TensorSpec> specs = WeightSpecs(c);
  ASSERT_EQ(w.tensors.size(), specs.size());
  for (const TensorSpec& t : specs) {
    const std::vector<float>& v = w.at(t.name);
    ASSERT_EQ(v.size(), t.elements()) << t.name;
    const bool bias = t.name.ends_with(".bias");
    float lo = 2, hi = -2;
    for (float x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    if (bias) {  // 0.1 u
      EXPECT_GT(lo, -0.1f) << t.name;
      EXPECT_LT(hi, 0.1f) << t.name;
      EXPECT_LT(lo, 0.0f) << t.name;
    } else if (t.shape.size() == 1) {  // norms: 1 + 0.1 u
      EXPECT_GT(lo, 0.9f) << t.name;
      EXPECT_LT(hi, 1.1f) << t.name;
    } else {  // u / sqrt(in)
      const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(t.shape[1])));
      EXPECT_LE(hi, bound) << t.name;
      EXPECT_GE(lo, -bound) << t.name;
      EXPECT_GT(hi, 0.9f * bound) << t.name;  // the range is used, not a scaled-down copy
    }
  }
  // The first value is the stream's first draw scaled by 1/sqrt(256) = 1/16.
  uint64_t state = 7;
  EXPECT_EQ(w.at("embed.weight")[0], static_cast<float>(NextWeightDraw(state) / 16.0));
}

// ---- The file ----------------------------------------------------------------------------------

uint64_t HeaderLength(const std::string& f) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(f[static_cast<size_t>(i)])} << (8 * i);
  return n;
}

std::string Le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

std::string Floats(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) {
    const uint32_t b = std::bit_cast<uint32_t>(f);
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((b >> (8 * i)) & 0xff));
  }
  return s;
}

TEST(WeightFile, LayoutIsSafetensorsByteForByte) {
  const TinyConfig c = Config("tiny-mla");
  const Weights w = GenerateWeights(c, UINT64_MAX);
  Result<std::string> f = SerializeWeights(c, w);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const uint64_t n = HeaderLength(*f);
  EXPECT_EQ(n % 8, 0u);  // padded with spaces to 8
  // 3216128 floats (counted above) after the header.
  EXPECT_EQ(f->size(), 8 + n + 4 * 3216128u);
  const nlohmann::json h = nlohmann::json::parse(f->substr(8, n));
  EXPECT_EQ(h["__metadata__"]["seed"], "18446744073709551615");
  EXPECT_EQ(h["__metadata__"]["format"], "tessera-tiny-v1");
  EXPECT_EQ(h["__metadata__"]["model"], "tiny-mla");
  // Tensors in spec order, tiling the data: embed [0, 262144), the first attn_norm next.
  EXPECT_EQ(h["embed.weight"]["data_offsets"], nlohmann::json::array({0, 262144}));
  EXPECT_EQ(h["layers.0.attn_norm.weight"]["data_offsets"], nlohmann::json::array({262144, 262144 + 1024}));
  EXPECT_EQ(h["head.weight"]["data_offsets"][1], 4 * 3216128u);
  // Little-endian F32: the first value's bits, and the last.
  EXPECT_EQ(f->substr(8 + n, 4), Floats({w.at("embed.weight")[0]}));
  EXPECT_EQ(f->substr(f->size() - 4), Floats({w.at("head.weight").back()}));
  // The seed survives at its largest.
  Result<Weights> back = ParseWeights(*f, c);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seed, UINT64_MAX);
}

TEST(WeightFile, SerializeRefusesMissingMisSizedAndOverflowingTensors) {
  const TinyConfig c = Config("tiny-mla");
  Weights w = GenerateWeights(c, 1);
  auto refused = [](const Result<std::string>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().field(), "weights");
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  };
  Weights missing = w;
  missing.tensors.erase("layers.1.ffn.w3.weight");
  refused(SerializeWeights(c, missing), "layers.1.ffn.w3.weight");
  Weights short_one = w;
  short_one.tensors["norm.weight"].pop_back();
  refused(SerializeWeights(c, short_one), "norm.weight");
  // A shape of 2^64 elements with an empty tensor: not a zero-byte tensor.
  const std::vector<TensorSpec> huge{{"huge", {uint64_t{1} << 32, uint64_t{1} << 32}}};
  Weights empty;
  empty.tensors["huge"] = {};
  refused(SerializeWeightFile("m", huge, empty), "huge");
  // 2^62 elements: 2^64 bytes, past 64 bits though the count is not.
  const std::vector<TensorSpec> bytes_over{{"wide", {uint64_t{1} << 31, uint64_t{1} << 31}}};
  empty.tensors["wide"] = {};
  refused(SerializeWeightFile("m", bytes_over, empty), "wide");
}

// A file over two small tensors, a [2, 3] and b [2], written out by hand.
const std::vector<TensorSpec> kSpecs{{"a", {2, 3}}, {"b", {2}}};
const std::string kData = Floats({1, 2, 3, 4, 5, 6, -0.0f, 1e-40f});  // -0 and a subnormal are finite

std::string File(const nlohmann::json& header, const std::string& data = kData) {
  const std::string text = header.dump();
  return Le64(text.size()) + text + data;
}

nlohmann::json Header() {
  return {{"__metadata__", {{"format", "tessera-tiny-v1"}, {"model", "m"}, {"seed", "9"}}},
          {"a", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
          {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {24, 32}}}}};
}

void ExpectRefused(const std::string& file, const std::string& needle, const std::vector<TensorSpec>& specs = kSpecs) {
  Result<Weights> r = ParseWeightFile(file, "m", specs);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().field(), "weights");
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  EXPECT_EQ(r.status().ToString().find('\n'), std::string::npos);
}

TEST(WeightFile, ParsesAHandWrittenFile) {
  Result<Weights> w = ParseWeightFile(File(Header()), "m", kSpecs);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->model, "m");
  EXPECT_EQ(w->seed, 9u);
  EXPECT_EQ(w->at("a"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(w->at("b").size(), 2u);
  EXPECT_TRUE(std::signbit(w->at("b")[0]));
  EXPECT_EQ(w->at("b")[1], 1e-40f);
  // No tensors at all: a header with only __metadata__ and no data.
  nlohmann::json only = Header();
  only.erase("a");
  only.erase("b");
  Result<Weights> none = ParseWeightFile(File(only, ""), "m", {});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->tensors.empty());
}

TEST(WeightFile, TheHeaderLengthAndNestingAreBounded) {
  ExpectRefused("", "0 B, shorter than the 8-byte");
  ExpectRefused("1234567", "7 B, shorter than the 8-byte");
  ExpectRefused(Le64(UINT64_MAX) + "{}", "runs past the end of the file");
  ExpectRefused(Le64(3) + "{}", "runs past the end of the file");
  // A header over 1 MiB, inside the file: refused before it is parsed.
  ExpectRefused(Le64((1u << 20) + 1) + std::string((1u << 20) + 1, ' '), "exceeds 1 MiB");
  // Nesting: the header object, __metadata__ and 6 lists are 8 levels (read); 7 lists are 9.
  nlohmann::json ok = Header();
  ok["__metadata__"]["n"] = nlohmann::json::parse("[[[[[[1]]]]]]");
  EXPECT_TRUE(ParseWeightFile(File(ok), "m", kSpecs).ok());
  ok["__metadata__"]["n"] = nlohmann::json::parse("[[[[[[[1]]]]]]]");
  ExpectRefused(File(ok), "deeper than 8 levels");
  // Brackets inside strings do not count.
  ok["__metadata__"]["n"] = std::string(100, '[');
  EXPECT_TRUE(ParseWeightFile(File(ok), "m", kSpecs).ok());
  ExpectRefused(Le64(2) + "[]" + kData, "not a JSON object");
  ExpectRefused(Le64(2) + "{]" + kData, "not valid JSON");
}

TEST(WeightFile, MetadataIsCheckedFieldByField) {
  auto with = [](const char* key, const nlohmann::json& v) {
    nlohmann::json h = Header();
    if (v.is_null()) {
      h["__metadata__"].erase(key);
    } else {
      h["__metadata__"][key] = v;
    }
    return File(h);
  };
  ExpectRefused(with("format", nullptr), "__metadata__.format missing");
  ExpectRefused(with("format", "tessera-tiny-v2"), "__metadata__.format is \"tessera-tiny-v2\"");
  ExpectRefused(with("model", "other"), "__metadata__.model is \"other\", expected m");
  ExpectRefused(with("seed", 9), "__metadata__.seed missing");  // a number, not a string
  for (const char* bad : {"", "-1", "+1", "1e3", "0x10", " 9", "9 ", "123456789012345678901"}) {
    ExpectRefused(with("seed", bad), "__metadata__.seed is not a decimal integer");
  }
  ExpectRefused(with("seed", "18446744073709551616"), "__metadata__.seed exceeds 64 bits");  // 2^64
  ExpectRefused(with("seed", "99999999999999999999"), "__metadata__.seed exceeds 64 bits");
  Result<Weights> top = ParseWeightFile(with("seed", "18446744073709551615"), "m", kSpecs);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->seed, UINT64_MAX);
  EXPECT_EQ(ParseWeightFile(with("seed", "007"), "m", kSpecs)->seed, 7u);
  nlohmann::json h = Header();
  h.erase("__metadata__");
  ExpectRefused(File(h), "__metadata__ missing");
  h["__metadata__"] = "tessera-tiny-v1";
  ExpectRefused(File(h), "__metadata__ missing");
}

TEST(WeightFile, EachTensorEntryIsCheckedNamingTheTensor) {
  auto edit = [](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json h = Header();
    f(h);
    return File(h);
  };
  ExpectRefused(edit([](nlohmann::json& h) { h.erase("b"); }), "b: missing");
  ExpectRefused(edit([](nlohmann::json& h) { h["c"] = h["b"]; }), "c: not a tensor of m");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"] = 5; }), "a: dtype missing");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["dtype"] = 1; }), "a: dtype missing");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["dtype"] = "F16"; }), "a: dtype F16, expected F32");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"].erase("shape"); }), "a: shape missing");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["shape"] = {2, -3}; }), "a: shape is not a list");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["shape"] = {2, 3.0}; }), "a: shape is not a list");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["shape"] = {3, 2}; }), "a: shape [3,2], expected [2,3]");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["shape"] = nlohmann::json::array({6}); }),
                "a: shape [6], expected [2,3]");
  for (const nlohmann::json& bad : {nlohmann::json::array({0}), nlohmann::json{0, 24, 32}, nlohmann::json{-1, 24},
                                    nlohmann::json{0.0, 24}, nlohmann::json("0,24")}) {
    ExpectRefused(edit([&](nlohmann::json& h) { h["a"]["data_offsets"] = bad; }),
                  "a: data_offsets is not [begin, end]");
  }
  // Offsets that do not tile the data in spec order: a gap, an overlap, a reversed range, a
  // wrong size.
  ExpectRefused(edit([](nlohmann::json& h) {
                  h["b"]["data_offsets"] = {28, 36};
                }),
                "b: data_offsets [28, 36], expected [24, 32]");
  ExpectRefused(edit([](nlohmann::json& h) { h["b"]["data_offsets"] = {20, 28}; }), "b: data_offsets [20, 28]");
  ExpectRefused(edit([](nlohmann::json& h) { h["b"]["data_offsets"] = {24, 16}; }), "b: data_offsets [24, 16]");
  ExpectRefused(edit([](nlohmann::json& h) { h["a"]["data_offsets"] = {0, 28}; }), "a: data_offsets [0, 28]");
  ExpectRefused(edit([](nlohmann::json& h) {
                  h["b"]["data_offsets"] = {24, UINT64_MAX};
                }),
                "b: data_offsets [24, 18446744073709551615]");
}

TEST(WeightFile, TheDataMustBeExactlyTheTensorsAndFinite) {
  ExpectRefused(File(Header(), kData.substr(0, 28)), "b: data runs past the end of the file");
  ExpectRefused(File(Header(), kData + std::string(1, '\0')), "file size: 33 data bytes, the tensors cover 32");
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::string data = kData;
    std::memcpy(data.data() + 4 * 7, &bad, 4);
    ExpectRefused(File(Header(), data), "b: value 1 is not finite");
  }
  // A shape of 2^64 elements claimed with no data: refused, not read as an empty tensor.
  const std::vector<TensorSpec> huge{{"a", {2, 3}}, {"b", {2}}, {"h", {uint64_t{1} << 32, uint64_t{1} << 32}}};
  nlohmann::json h = Header();
  h["h"] = {{"dtype", "F32"}, {"shape", {uint64_t{1} << 32, uint64_t{1} << 32}}, {"data_offsets", {32, 32}}};
  ExpectRefused(File(h), "h: shape's bytes overflow 64 bits", huge);
}

TEST(WeightFile, OnDiskRegularFilesOnlyAndWritesAreAtomic) {
  TempDir dir;
  const TinyConfig c = Config("tiny-mla");
  const Weights w = GenerateWeights(c, 3);
  const std::string path = dir.path() + "/w.safetensors";
  ASSERT_TRUE(WriteWeightsFile(path, c, w).ok());
  Result<Weights> back = ReadWeightsFile(path, c);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tensors, w.tensors);
  // No temporary left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
  // A link is followed to a regular file.
  const std::string link = dir.path() + "/link.safetensors";
  std::filesystem::create_symlink(path, link);
  EXPECT_TRUE(ReadWeightsFile(link, c).ok());
  // ... but never replaced by a write, and its target is left as it was.
  Status s = WriteWeightsFile(link, c, GenerateWeights(c, 4));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.field(), "out");
  EXPECT_EQ(ReadWeightsFile(path, c)->seed, 3u);
  // Missing folders are created (file_io); a parent that is a regular file is refused.
  EXPECT_EQ(WriteWeightsFile(path + "/w", c, w).field(), "out");
  // Refused before reading: a directory, a FIFO (must not block), a 257 MiB (sparse) file.
  EXPECT_EQ(ReadWeightsFile(dir.path(), c).status().field(), "weights");
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Result<Weights> f = ReadWeightsFile(fifo, c);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.status().field(), "weights");
  const std::string big = dir.Write("big.safetensors", "");
  ASSERT_EQ(truncate(big.c_str(), (off_t{257}) << 20), 0);
  Result<Weights> b = ReadWeightsFile(big, c);
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.status().field(), "weights");
  EXPECT_EQ(ReadWeightsFile(dir.path() + "/missing", c).status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace tessera
