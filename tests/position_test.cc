// Position-independence, measured on the tiny model (ADR 0017): the same 64-token chunk placed
// after different prefixes and at different offsets. Past layer 0 an MLA latent depends on every
// preceding token, and the RoPE slice on the position; so only an exact token prefix lets an
// engine skip compute. This test measures both parts per layer, shows that content dedup never
// merges such blocks while exact-prefix reuse hits, and what a cache that did reuse them would do
// to the logits. The figures print as "[ position ]" lines (docs/ATTENTION.md quotes them):
//   ctest --test-dir build/dev -R PositionIndependence -V
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tessera/attention.h"
#include "tessera/model.h"

namespace tessera {
namespace {

constexpr uint32_t kChunk = 64;

std::vector<uint32_t> Tokens(uint32_t n, uint32_t salt) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = ((i + 1) * 2654435761u + salt * 40503u) >> 9 & 0xff;
  return t;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<TinyRunner> Runner(const std::string& kv_format) {
  Result<TinyConfig> c = LoadTinyConfig("tiny-mla");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  RunOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = 64;
  Weights w = GenerateWeights(*c, 7);
  auto r = TinyRunner::Create(*c, std::move(w), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

// The chunk's decoded records per layer: latent and rope of each of its tokens.
struct ChunkRecords {
  std::vector<std::vector<float>> latent, rope;  // [layer][token * dim + i]
};

ChunkRecords Read(TinyRunner& runner, uint64_t offset) {
  ChunkRecords out;
  const RequestId r = *runner.request();
  for (uint32_t l = 0; l < runner.config().layers; ++l) {
    Result<PagedLayer> pages = PagedLayer::Of(runner.manager(), r, l);
    EXPECT_TRUE(pages.ok()) << pages.status().ToString();
    std::vector<float> latent(kChunk * 512), rope(kChunk * 64);
    for (uint32_t t = 0; t < kChunk; ++t) {
      EXPECT_TRUE(pages
                      ->ReadLatent(offset + t, std::span(latent).subspan(t * 512, 512),
                                   std::span(rope).subspan(t * 64, 64), nullptr)
                      .ok());
    }
    out.latent.push_back(std::move(latent));
    out.rope.push_back(std::move(rope));
  }
  return out;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

uint32_t LatentGroup(const RequestManager& m) {
  for (uint32_t g = 0; g < m.pool().groups().size(); ++g) {
    if (m.pool().groups()[g].format.use == FormatUse::kLatent) return g;
  }
  ADD_FAILURE() << "no latent group";
  return 0;
}

TEST(PositionIndependence, SameChunkAfterOtherPrefixesIsOtherBytes) {
  auto runner = Runner("mla-bf16");
  ASSERT_NE(runner, nullptr);
  const std::vector<uint32_t> chunk = Tokens(kChunk, 1), a = Tokens(kChunk, 2), b = Tokens(kChunk, 3),
                              d = Tokens(2 * kChunk, 4), tail = {5};
  // One extra token after the chunk, so that the chunk's block is sealed and its records stay.
  ASSERT_TRUE(runner->Generate(Concat(Concat(a, chunk), tail), 1).ok());
  const BlockId a_block = runner->manager().BlockTable(*runner->request())[1];
  const ChunkRecords after_a = Read(*runner, kChunk);
  const uint64_t dedup_before = runner->manager().index().stats().dedup_hits.load();
  ASSERT_TRUE(runner->Generate(Concat(Concat(b, chunk), tail), 1).ok());
  const BlockId b_block = runner->manager().BlockTable(*runner->request())[1];
  const ChunkRecords after_b = Read(*runner, kChunk);
  ASSERT_TRUE(runner->Generate(Concat(Concat(d, chunk), tail), 1).ok());
  const ChunkRecords after_d = Read(*runner, 2 * kChunk);

  for (uint32_t l = 0; l < runner->config().layers; ++l) {
    const float nope_ab = MaxDiff(after_a.latent[l], after_b.latent[l]);
    const float rope_ab = MaxDiff(after_a.rope[l], after_b.rope[l]);
    const float nope_ad = MaxDiff(after_a.latent[l], after_d.latent[l]);
    const float rope_ad = MaxDiff(after_a.rope[l], after_d.rope[l]);
    std::printf(
        "[ position ] layer %u: other prefix, same offset: latent %.4g rope %.4g | other offset (64 -> 128): "
        "latent %.4g rope %.4g\n",
        l, nope_ab, rope_ab, nope_ad, rope_ad);
    if (l == 0) {
      // Layer 0 sees only the token's embedding: its latent is the same wherever the token is; its
      // RoPE slice is the same at the same offset and rotated elsewhere.
      EXPECT_EQ(nope_ab, 0.0f);
      EXPECT_EQ(nope_ad, 0.0f);
      EXPECT_EQ(rope_ab, 0.0f);
      EXPECT_GT(rope_ad, 0.1f);
    } else {
      // Past layer 0 the latent carries its context: other prefix, other bytes (and the RoPE slice,
      // a projection of the layer's input, too).
      EXPECT_GT(nope_ab, 0.01f) << l;
      EXPECT_GT(nope_ad, 0.01f) << l;
      EXPECT_GT(rope_ab, 0.01f) << l;
    }
  }
  // So content dedup never merges the chunk's blocks (their bytes differ), and no dedup happened.
  EXPECT_NE(a_block, b_block);
  EXPECT_EQ(runner->manager().index().stats().dedup_hits.load(), dedup_before);
  // Exact-prefix reuse does hit: the same prefix and chunk again are served from the pool, and
  // the logits are the first run's bit for bit.
  Result<Generation> first = runner->Generate(Concat(Concat(a, chunk), tail), 4);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->cached_tokens, 2u * kChunk);
  auto fresh = Runner("mla-bf16");
  Result<Generation> uncached = fresh->Generate(Concat(Concat(a, chunk), tail), 4);
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(uncached->cached_tokens, 0u);
  EXPECT_EQ(first->logits, uncached->logits);
}

// What a cache that reused the chunk's records across prefixes would do: the chunk computed
// after prefix A is put in place of the chunk computed after prefix B, then generation goes on
// (teacher-forced to the correct run's tokens, so the two compare position by position). The
// correct run is the one the oracle matches within 1e-4 of the logits' scale (ADR 0017).
TEST(PositionIndependence, ReusingAChunkAcrossPrefixesCorruptsTheLogits) {
  const std::vector<uint32_t> chunk = Tokens(kChunk, 1), a = Tokens(kChunk, 2), b = Tokens(kChunk, 3), tail = {5};
  constexpr uint32_t kSteps = 16;
  // The chunk's records as computed after A, every layer.
  std::vector<std::vector<std::byte>> reused;
  {
    auto runner = Runner("mla-bf16");
    ASSERT_TRUE(runner->Generate(Concat(Concat(a, chunk), tail), 1).ok());
    const RequestManager& m = runner->manager();
    const uint32_t g = LatentGroup(m);
    for (uint32_t l = 0; l < runner->config().layers; ++l) {
      for (uint32_t t = 0; t < kChunk; ++t) {
        Result<ConstRecordView> v = m.Record(*runner->request(), g, l, kChunk + t);
        ASSERT_TRUE(v.ok());
        reused.emplace_back(v->planes[0].begin(), v->planes[0].end());
      }
    }
  }
  const std::vector<uint32_t> prompt = Concat(Concat(b, chunk), tail);
  auto correct = Runner("mla-bf16");
  Result<Generation> ok = correct->Generate(prompt, kSteps);
  ASSERT_TRUE(ok.ok());
  const std::vector<uint32_t> forced(ok->tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), ok->tokens.end());
  auto wrong = Runner("mla-bf16");
  // The prompt's last token was computed over the right chunk; every decode step after it reads
  // the reused one.
  auto swap_in = [&](RequestId r) -> Status {
    RequestManager& m = wrong->manager();
    const uint32_t g = LatentGroup(m);
    size_t i = 0;
    for (uint32_t l = 0; l < wrong->config().layers; ++l) {
      for (uint32_t t = 0; t < kChunk; ++t, ++i) {
        TESSERA_ASSIGN_OR_RETURN(RecordView v, m.FaultInjectionRecord(r, g, l, kChunk + t));
        std::memcpy(v.planes[0].data(), reused[i].data(), reused[i].size());
      }
    }
    return Status::Ok();
  };
  Result<Generation> bad = wrong->Generate(prompt, kSteps, swap_in, forced);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  float worst = 0.0f, scale = 0.0f;
  uint32_t argmax_changed = 0;
  for (uint32_t s = 1; s < kSteps; ++s) {
    const std::vector<float>& x = bad->logits[s];
    const std::vector<float>& y = ok->logits[s];
    worst = std::max(worst, MaxDiff(x, y));
    for (float v : y) scale = std::max(scale, std::fabs(v));
    if (std::max_element(x.begin(), x.end()) - x.begin() != std::max_element(y.begin(), y.end()) - y.begin()) {
      ++argmax_changed;
    }
  }
  std::printf(
      "[ position ] chunk reused across prefixes: max logit error %.4g over %u steps (logits up to %.4g, %.3g of "
      "their scale; the oracle's tolerance is 1e-4), argmax changed at %u of %u steps\n",
      worst, kSteps - 1, scale, worst / scale, argmax_changed, kSteps - 1);
  EXPECT_GT(worst, 100 * 1e-4f * std::max(1.0f, scale));
  EXPECT_EQ(bad->logits[0], ok->logits[0]);  // computed before the swap
}

}  // namespace
}  // namespace tessera
