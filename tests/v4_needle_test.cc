// The needle at long context for DeepSeek-V4 (ADR 0018): a planted compressed entry, at groups
// across 4K..128K tokens, must come back through the paged path — CSA (ratio 4), whose indexer
// top-k over the fp4 indexer keys must select it, and HCA (ratio 128), which attends every entry.
// One layer of tiny-v4's dims (4 heads, head_dim 448 + 64, window 16, 4 indexer heads of 128,
// top-k 8). Entries are written by the Compressor callback (what a model's compressor would
// produce is beside the point here): background entries and window rows are uniform(-1, 1); the
// needle entry holds gamma u in dims [0, 64) (u: 64 dims of 1/8) and its value in dims [64, 128).
// Every head asks q = beta u in dims [0, 64): its score is scale beta gamma = 70.7 (scale =
// 1/sqrt(512), beta = 200, gamma = 8) against background scores of standard deviation 5.1; the
// sinks are -100. So the output's dims [64, 128) are the needle's value as its page stores it.
// The indexer key of the needle's group is delta w (w: +-1/sqrt(128)), every indexer head asks
// w: score 4 delta = 40 against background scores below about 12.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "needle.h"
#include "tessera/codec.h"
#include "tessera/request_manager.h"
#include "tessera/v4_attention.h"

namespace tessera {
namespace {

using testing::NeedleDirection;
using testing::NeedleNoise;
using testing::NeedleValue;

constexpr float kBeta = 200.0f, kGamma = 8.0f, kDelta = 10.0f;

Geometry OneV4Layer(uint32_t ratio) {
  const std::string cfg = R"({"architectures": ["DeepseekV4ForCausalLM"], "compress_ratios": [)" +
                          std::to_string(ratio) + R"(], "compress_rope_theta": 160000, "head_dim": 512,
      "hidden_size": 256, "index_head_dim": 128, "index_n_heads": 4, "index_topk": 8, "intermediate_size": 256,
      "max_position_embeddings": 131072, "model_type": "deepseek_v4", "num_attention_heads": 4,
      "num_hidden_layers": 1, "num_key_value_heads": 1, "num_nextn_predict_layers": 0, "o_groups": 2,
      "o_lora_rank": 64, "q_lora_rank": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
      "sliding_window": 16, "vocab_size": 256})";
  Result<Geometry> g = GeometryFromConfigJson(cfg, "needle-v4.json");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

KvWriters NeedleWriters(uint64_t needle_group) {
  WindowWriter window = [](uint32_t, uint64_t position, std::span<std::byte> row) {
    std::vector<float> kv(512);
    for (uint32_t i = 0; i < 512; ++i) kv[i] = NeedleNoise(position, i, 7);
    ASSERT_TRUE(EncodeV4WindowRow(kv, row).ok());
  };
  StateWriter state = [](uint32_t, bool, uint64_t, std::span<float> row) { std::fill(row.begin(), row.end(), 0.0f); };
  Compressor compress = [needle_group](uint32_t, bool indexer, uint64_t group, std::span<const float>, uint32_t,
                                       const RecordView& entry) {
    const bool is_needle = group == needle_group;
    if (indexer) {
      std::vector<float> key(128);
      for (uint32_t i = 0; i < 128; ++i) key[i] = is_needle ? kDelta * NeedleDirection(i) : NeedleNoise(group, i, 8);
      ASSERT_TRUE(QuantizeIndexerMxfp4(key, entry.planes[0]).ok());
      return;
    }
    std::vector<float> nope(448), rope(64);
    for (uint32_t i = 0; i < 448; ++i) nope[i] = NeedleNoise(group, i, 9);
    for (uint32_t i = 0; i < 64; ++i) rope[i] = NeedleNoise(group, i, 10);
    if (is_needle) {
      for (uint32_t i = 0; i < 64; ++i) nope[i] = kGamma / 8.0f;
      for (uint32_t j = 0; j < 64; ++j) nope[64 + j] = NeedleValue(j);
    }
    ASSERT_EQ(entry.plane_count, 2u);
    ASSERT_TRUE(QuantizeV4Fp8(nope, rope, entry.planes[0], entry.planes[1]).ok());
  };
  // Moved, not copied: GCC 12 at -O3 warns (maybe-uninitialized) inside std::function's copy.
  return KvWriters(std::move(window), std::move(state), std::move(compress));
}

std::vector<uint32_t> Prompt(uint64_t n) {
  std::vector<uint32_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>((i * 2654435761u) >> 8) % 256;
  return p;
}

TEST(V4Needle, CsaSelectsItAndHcaAttendsItAt4KTo128K) {
  for (uint32_t ratio : {4u, 128u}) {
    const Geometry g = OneV4Layer(ratio);
    const V4Dims dims = *V4Dims::Of(g);
    for (uint64_t context : {4096ULL, 32768ULL, 131072ULL}) {
      const uint64_t entries = context / ratio;
      // Early, middle and late at 4K and 32K; the middle at 128K.
      std::vector<uint64_t> needles = {entries / 2 + 3};
      if (context < 131072) needles = {1, entries / 2 + 3, entries - 2};
      for (uint64_t needle : needles) {
        const std::string where = "ratio " + std::to_string(ratio) + " context " + std::to_string(context) +
                                  " needle entry " + std::to_string(needle);
        ManagerOptions o;
        o.kv_format = "v4-fp8";
        if (ratio == 4) o.indexer_format = "indexer-mxfp4";
        o.capacity_blocks = static_cast<uint32_t>(context / 256 + 2);
        o.max_requests = 2;
        auto m = RequestManager::Create(g, o);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        const std::vector<uint32_t> prompt = Prompt(context);
        Result<Admission> a = (*m)->Admit(prompt, RequestSpec{});
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        ASSERT_TRUE((*m)->Append(a->id, prompt, NeedleWriters(needle)).ok()) << where;
        Result<V4PagedLayer> pages = V4PagedLayer::Of(**m, a->id, 0);
        ASSERT_TRUE(pages.ok()) << pages.status().ToString();
        ASSERT_EQ(pages->entries(), entries) << where;
        AttentionCounters counters;
        std::vector<uint64_t> selected;
        if (ratio == 4) {
          std::vector<float> q(4 * 128), weights(4, 1.0f);
          for (uint32_t j = 0; j < 4; ++j) {
            for (uint32_t i = 0; i < 128; ++i) q[j * 128 + i] = NeedleDirection(i);
          }
          ASSERT_TRUE(V4IndexerSelect(*pages, IndexerQuery{q, weights}, dims.indexer, &selected, &counters).ok());
          ASSERT_EQ(selected.size(), 8u) << where;
          EXPECT_TRUE(std::binary_search(selected.begin(), selected.end(), needle)) << where;
        } else {
          selected.resize(entries);
          for (uint64_t e = 0; e < entries; ++e) selected[e] = e;
        }
        std::vector<float> q(4 * 512, 0.0f), sink(4, -100.0f), out(4 * 512);
        for (uint32_t h = 0; h < 4; ++h) {
          for (uint32_t i = 0; i < 64; ++i) q[h * 512 + i] = kBeta / 8.0f;
        }
        ASSERT_TRUE(V4Attend(*pages, selected, q, sink, dims, 160000.0, out, &counters).ok()) << where;
        std::vector<float> stored(512);
        ASSERT_TRUE(pages->ReadEntry(needle, stored, nullptr).ok());
        float worst = 0.0f;
        for (uint32_t h = 0; h < 4; ++h) {
          for (uint32_t j = 0; j < 64; ++j) worst = std::max(worst, std::fabs(out[h * 512 + 64 + j] - stored[64 + j]));
        }
        EXPECT_LT(worst, 1e-4f) << where;
        // The stored value is the planted one: a power-of-two tile scale (2^-7) makes it exact.
        for (uint32_t j = 0; j < 64; ++j) EXPECT_EQ(stored[64 + j], NeedleValue(j)) << where << " dim " << j;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
