// Needle at long context: a planted key/value whose retrieval is known by construction, placed at
// positions across 4K..128K tokens, must come back through the paged path — dense MLA decode over
// every record, and V3.2 sparse decode whose indexer top-k must select the needle's token — and
// again after the needle's block went to a disk tier and was promoted back into a cold pool.
//
// Construction (one layer of the tiny models' dims: 4 heads, latent 512, rope 64, nope = v = 64).
// wkv_b makes W_UK_h read latent dims [0, 64) and W_UV_h read dims [64, 128). Every query head
// asks q_nope = beta u (u: 64 dims of 1/8, a unit vector), q_pe = 0. Background tokens hold
// uniform(-1, 1) latents: their score is scale beta (u . c) with u . c of standard deviation
// 0.577, so about 5.1 (scale = 1/sqrt(128), beta = 100) and below 30 over 128K tokens; the needle
// holds gamma u in dims [0, 64) (score 8.84 gamma = 70.7 at gamma = 8) and its value in dims
// [64, 128). The softmax then puts all but e^-40 of its weight on the needle: the output of every
// head is the needle's value as its page stores it. For the indexer, every key is uniform(-1, 1)
// except the needle's, delta w (w a unit vector of 128 dims); every indexer head asks w, so the
// needle's score is 4 delta = 40 against background scores below about 15.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "needle.h"
#include "tessera/attention.h"
#include "tessera/codec.h"
#include "tessera/disk_tier.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::NeedleDirection;
using testing::NeedleNoise;
using testing::NeedleValue;

using testing::TempDir;

constexpr uint32_t kBlock = 64;
constexpr float kBeta = 100.0f, kGamma = 8.0f, kDelta = 10.0f;

// One layer of tiny-dsa (and of tiny-mla without the indexer).
Geometry OneLayer(bool indexer) {
  std::string cfg = R"({"architectures": [")" +
                    std::string(indexer ? "DeepseekV32ForCausalLM" : "DeepseekV3ForCausalLM") +
                    R"("], "hidden_size": 256, "intermediate_size": 256, "kv_lora_rank": 512,
      "max_position_embeddings": 131072, "model_type": ")" +
                    std::string(indexer ? "deepseek_v32" : "deepseek_v3") +
                    R"(", "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 4,
      "num_nextn_predict_layers": 0, "q_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
      "rms_norm_eps": 1e-06, "rope_theta": 10000, "v_head_dim": 64, "vocab_size": 256)";
  if (indexer) cfg += R"(, "index_head_dim": 128, "index_n_heads": 4, "index_topk": 64)";
  cfg += "}";
  Result<Geometry> g = GeometryFromConfigJson(cfg, indexer ? "needle-dsa.json" : "needle-mla.json");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

KvWriters NeedleWriters(uint64_t needle) {
  return KvWriters([needle](uint32_t, uint32_t, uint64_t position, const RecordView& record) {
    const bool is_needle = position == needle;
    const std::span<std::byte> bytes = record.planes[0];
    // indexer-fp8 key: region-major pages (the default) hand it as 128 + 4 bytes, per-token as 132.
    const bool split = record.plane_count == 2 && bytes.size() == 128 && record.planes[1].size() == 4;
    if (bytes.size() == 132 || split) {
      std::vector<float> key(128);
      for (uint32_t i = 0; i < 128; ++i) key[i] = is_needle ? kDelta * NeedleDirection(i) : NeedleNoise(position, i, 2);
      std::vector<std::byte> rec(132);
      ASSERT_TRUE(QuantizeIndexerFp8(key, rec).ok());
      std::memcpy(bytes.data(), rec.data(), bytes.size());
      if (split) std::memcpy(record.planes[1].data(), rec.data() + 128, 4);
      return;
    }
    std::vector<float> latent(512), rope(64);
    for (uint32_t i = 0; i < 512; ++i) latent[i] = NeedleNoise(position, i, 0);
    for (uint32_t i = 0; i < 64; ++i) rope[i] = NeedleNoise(position, i, 1);
    if (is_needle) {
      for (uint32_t i = 0; i < 64; ++i) latent[i] = kGamma / 8.0f;
      for (uint32_t j = 0; j < 64; ++j) latent[64 + j] = NeedleValue(j);
    }
    if (bytes.size() == kFp8DsMlaRecordBytes) {
      ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, bytes).ok());
    } else {  // mla-bf16: latent then rope, little-endian bf16
      ASSERT_EQ(bytes.size(), 2u * (512 + 64));
      for (uint32_t i = 0; i < 576; ++i) {
        const uint16_t b = FloatToBf16(i < 512 ? latent[i] : rope[i - 512]);
        bytes[2 * i] = std::byte(b & 0xff);
        bytes[2 * i + 1] = std::byte(b >> 8);
      }
    }
  });
}

std::vector<float> WkvB() {
  std::vector<float> w(4 * 128 * 512, 0.0f);
  for (uint32_t h = 0; h < 4; ++h) {
    for (uint32_t i = 0; i < 64; ++i) w[(h * 128 + i) * 512 + i] = 1.0f;            // W_UK: dims [0, 64)
    for (uint32_t j = 0; j < 64; ++j) w[(h * 128 + 64 + j) * 512 + 64 + j] = 1.0f;  // W_UV: dims [64, 128)
  }
  return w;
}

std::vector<uint32_t> Prompt(uint64_t n) {
  std::vector<uint32_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>((i * 2654435761u) >> 8) % 256;
  return p;
}

ManagerOptions Options(const std::string& format, uint64_t context, std::vector<std::byte> key = {}) {
  ManagerOptions o;
  o.kv_format = format;
  o.capacity_blocks = static_cast<uint32_t>((context + kBlock - 1) / kBlock + 2);
  o.max_requests = 4;
  o.hash_key_seed = 5;
  o.hash_key = std::move(key);
  return o;
}

struct Retrieval {
  std::vector<float> out;          // heads x v
  std::vector<float> needle;       // the needle's value dims as its page stores them
  std::vector<uint64_t> selected;  // sparse: the indexer's choice
  AttentionCounters counters;
};

// Decodes one query over request r's pages: dense over every record, or sparse over the
// indexer's top-k.
Retrieval Decode(const RequestManager& m, RequestId r, uint64_t needle, bool sparse, uint64_t context) {
  Retrieval got;
  Result<PagedLayer> pages = PagedLayer::Of(m, r, 0);
  EXPECT_TRUE(pages.ok()) << pages.status().ToString();
  if (!pages.ok()) return got;
  const MlaDims dims = *MlaDims::Of(OneLayer(sparse));
  std::vector<uint64_t> positions;
  if (sparse) {
    const IndexerDims idims = *IndexerDims::Of(OneLayer(true));
    std::vector<float> q(4 * 128), weights(4, 1.0f);
    for (uint32_t j = 0; j < 4; ++j) {
      for (uint32_t i = 0; i < 128; ++i) q[j * 128 + i] = NeedleDirection(i);
    }
    EXPECT_TRUE(IndexerSelect(*pages, context, IndexerQuery{q, weights}, idims, &got.selected, &got.counters).ok());
    positions = got.selected;
  } else {
    positions.resize(context);
    for (uint64_t i = 0; i < positions.size(); ++i) positions[i] = i;
  }
  std::vector<float> q_nope(4 * 64, kBeta / 8.0f), q_pe(4 * 64, 0.0f);
  got.out.assign(4 * 64, 0.0f);
  const std::vector<float> wkv_b = WkvB();
  Status st = MlaDecode(*pages, positions, MlaQuery{q_nope, q_pe}, wkv_b, dims, AttentionForm::kAbsorbed, got.out,
                        &got.counters);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<float> latent(512), rope(64);
  EXPECT_TRUE(pages->ReadLatent(needle, latent, rope, nullptr).ok());
  got.needle.assign(latent.begin() + 64, latent.begin() + 128);
  return got;
}

// Every head's output is the needle's value (as stored), to within what e^-40 of weight on the
// rest can move it.
void ExpectRetrieved(const Retrieval& r, const std::string& where) {
  ASSERT_EQ(r.out.size(), 4u * 64);
  float worst = 0.0f;
  for (uint32_t h = 0; h < 4; ++h) {
    for (uint32_t j = 0; j < 64; ++j) worst = std::max(worst, std::fabs(r.out[h * 64 + j] - r.needle[j]));
  }
  EXPECT_LT(worst, 1e-4f) << where;
  // And the stored value is the planted one (bf16 holds it exactly; fp8 within its step).
  // fp8: the tile's amax is 2, its scale 2/448; values in [256, 448) of the e4m3 grid are 32
  // apart, so a stored value is within 16 x 2/448 = 0.0714 of the planted one.
  for (uint32_t j = 0; j < 64; ++j) EXPECT_NEAR(r.needle[j], NeedleValue(j), 0.0715f) << where << " dim " << j;
}

struct NeedleCase {
  const char* format;
  bool sparse;
};

class Needle : public ::testing::TestWithParam<NeedleCase> {};

TEST_P(Needle, IsRetrievedThroughThePagesAt4KTo128K) {
  const NeedleCase c = GetParam();
  const Geometry g = OneLayer(c.sparse);
  for (uint64_t context : {4096ULL, 32768ULL, 131072ULL}) {
    // Early, middle and late at 4K and 32K; the middle at 128K.
    std::vector<uint64_t> needles = {context / 2 + 17};
    if (context < 131072) needles = {3, context / 2 + 17, context - 70};
    for (uint64_t needle : needles) {
      const std::string where = std::string(c.format) + (c.sparse ? " sparse" : " dense") + " context " +
                                std::to_string(context) + " needle at " + std::to_string(needle);
      auto m = RequestManager::Create(g, Options(c.format, context));
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      const std::vector<uint32_t> prompt = Prompt(context);
      Result<Admission> a = (*m)->Admit(prompt, RequestSpec{});
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ASSERT_TRUE((*m)->Append(a->id, prompt, NeedleWriters(needle)).ok());
      const Retrieval r = Decode(**m, a->id, needle, c.sparse, context);
      if (c.sparse) {
        ASSERT_EQ(r.selected.size(), 64u) << where;
        EXPECT_TRUE(std::binary_search(r.selected.begin(), r.selected.end(), needle)) << where;
        EXPECT_EQ(r.counters.records, context + 64) << where;  // every indexer key, 64 latents
      } else {
        EXPECT_EQ(r.counters.records, context) << where;
      }
      ExpectRetrieved(r, where);
    }
  }
}

// The needle's block goes to a disk tier with the rest of the prompt; a cold manager (a new
// process: the directory's key, an empty pool) promotes it back and retrieves the same bytes:
// the output is bit-identical.
TEST_P(Needle, IsRetrievedAfterItsBlockWentToDiskAndCameBack) {
  const NeedleCase c = GetParam();
  const Geometry g = OneLayer(c.sparse);
  const uint64_t context = 16384, needle = 9000;
  const std::vector<uint32_t> prompt = Prompt(context);
  TempDir dir;
  Result<TierKey> key = DiskTier::LoadOrCreateKey(dir.path());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto disk_store = [&](const RequestManager& m) {
    DiskTierOptions o;
    o.dir = dir.path();
    auto disk = MakeDiskTier(o, 0);
    EXPECT_TRUE(disk.ok()) << disk.status().ToString();
    std::vector<std::unique_ptr<Tier>> tiers;
    if (!disk.ok()) return std::unique_ptr<TieredStore>();
    tiers.push_back(std::move(*disk));
    TieredStoreOptions so;
    so.write = WritePolicy::kWriteThrough;
    so.asynchronous = false;
    auto s = TieredStore::Create(m.pool(), so, std::move(tiers));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : std::unique_ptr<TieredStore>();
  };
  Retrieval first;
  {
    auto m = RequestManager::Create(g, Options(c.format, context, key->secret));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto store = disk_store(**m);
    (*m)->SetBlockSource(store.get());
    Result<Admission> a = (*m)->Admit(prompt, RequestSpec{});
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE((*m)->Append(a->id, prompt, NeedleWriters(needle)).ok());
    first = Decode(**m, a->id, needle, c.sparse, context);
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(store->stats().written_through, context / kBlock);
    (*m)->SetBlockSource(nullptr);
  }
  ExpectRetrieved(first, "before the disk");
  auto m = RequestManager::Create(g, Options(c.format, context, key->secret));
  ASSERT_TRUE(m.ok());
  auto store = disk_store(**m);
  (*m)->SetBlockSource(store.get());
  // The whole prompt plus one token: every block of it is a cached prefix (the last prompt token
  // is always computed).
  std::vector<uint32_t> longer = prompt;
  longer.push_back(7);
  Result<Admission> a = (*m)->Admit(longer, RequestSpec{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->cached_tokens, context);
  EXPECT_EQ(a->tier_blocks, context / kBlock);
  EXPECT_EQ(store->stats().verify_failures, 0u);
  // No writer touches the promoted tokens: what is read is what came back from the disk. (The
  // extra token is written by the same writers, as a decode step would.)
  ASSERT_TRUE((*m)->Append(a->id, std::span(longer).subspan(context), NeedleWriters(needle)).ok());
  const Retrieval second = Decode(**m, a->id, needle, c.sparse, context);
  ExpectRetrieved(second, "after the disk");
  EXPECT_EQ(second.needle, first.needle);
  EXPECT_EQ(second.selected, first.selected);
  EXPECT_EQ(second.out, first.out);  // the same bytes, read in the same order: bit for bit
  (*m)->SetBlockSource(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Formats, Needle,
                         ::testing::Values(NeedleCase{"mla-bf16", false}, NeedleCase{"fp8_ds_mla", false},
                                           NeedleCase{"fp8_ds_mla", true}, NeedleCase{"mla-bf16", true}),
                         [](const ::testing::TestParamInfo<NeedleCase>& i) {
                           std::string name = std::string(i.param.format) + (i.param.sparse ? "_sparse" : "_dense");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace tessera
