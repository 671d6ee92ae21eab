#include "tessera/v4_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "tessera/codec.h"
#include "tessera/disk_tier.h"
#include "tessera/ledger.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"
#include "test_support.h"

namespace tessera {
namespace {

TinyV4Config Config() {
  Result<TinyV4Config> c = LoadTinyV4Config("tiny-v4");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : TinyV4Config{};
}

std::vector<uint32_t> Prompt(uint64_t n) {
  std::vector<uint32_t> t(n);
  for (uint64_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((i * 37 + 11) % 256);
  return t;
}

std::unique_ptr<TinyV4Runner> Runner(SwaStrategy s, const std::string& indexer_format = "indexer-mxfp4") {
  TinyV4Config c = Config();
  TinyV4Weights w = GenerateTinyV4Weights(c, 42);
  TinyV4Options o;
  o.window_strategy = s;
  o.indexer_format = indexer_format;
  Result<std::unique_ptr<TinyV4Runner>> r = TinyV4Runner::Create(std::move(c), std::move(w), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

TEST(TinyV4, ConfigIsTheAdrsPreset) {
  const TinyV4Config c = Config();
  EXPECT_EQ(c.layers, 4u);
  EXPECT_EQ(c.ratios, (std::vector<uint32_t>{0, 4, 128, 4}));
  EXPECT_EQ(c.dims.heads, 4u);
  EXPECT_EQ(c.dims.head_dim, 512u);
  EXPECT_EQ(c.dims.window, 16u);
  EXPECT_EQ(c.dims.indexer.topk, 8u);
  EXPECT_EQ(c.o_groups, 2u);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(LoadTinyV4Config("tiny-mla").status().field(), "model");
}

TEST(TinyV4, WeightFileRoundTripsAndRefusesWhatIsNotIt) {
  const TinyV4Config c = Config();
  const TinyV4Weights w = GenerateTinyV4Weights(c, 7);
  EXPECT_EQ(w.at("layers.0.attn_norm.weight").size(), 256u);
  EXPECT_EQ(w.at("layers.2.attn.compressor.ape").size(), 128u * 512u);
  EXPECT_EQ(w.tensors.count("layers.2.attn.indexer.wq_b.weight"), 0u);  // HCA: no indexer
  Result<std::string> bytes = SerializeTinyV4Weights(c, w);
  ASSERT_TRUE(bytes.ok());
  Result<TinyV4Weights> back = ParseTinyV4Weights(*bytes, c);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seed, 7u);
  EXPECT_EQ(back->tensors, w.tensors);
  // Truncated, a byte too many, a wrong dtype and shape, a non-finite value: "weights".
  EXPECT_EQ(ParseTinyV4Weights(std::string_view(*bytes).substr(0, bytes->size() - 4), c).status().field(), "weights");
  EXPECT_EQ(ParseTinyV4Weights(*bytes + "x", c).status().field(), "weights");
  std::string dtype = *bytes;
  dtype.replace(dtype.find("\"F32\""), 5, "\"F16\"");
  EXPECT_EQ(ParseTinyV4Weights(dtype, c).status().field(), "weights");
  std::string shape = *bytes;
  shape.replace(shape.find("[256,256]"), 9, "[256,255]");
  Result<TinyV4Weights> bad_shape = ParseTinyV4Weights(shape, c);
  EXPECT_EQ(bad_shape.status().field(), "weights");
  EXPECT_NE(bad_shape.status().message().find("shape"), std::string::npos) << bad_shape.status().message();
  std::string nan = *bytes;
  const uint64_t header = 8 + static_cast<uint8_t>(nan[0]) + (uint64_t{static_cast<uint8_t>(nan[1])} << 8) +
                          (uint64_t{static_cast<uint8_t>(nan[2])} << 16);
  nan[header + 3] = static_cast<char>(0x7f);
  nan[header + 2] = static_cast<char>(0xc0);
  EXPECT_EQ(ParseTinyV4Weights(nan, c).status().field(), "weights");
}

// Bytes and FLOPs of one token at position p, from the closed forms (ADR 0018): every layer's
// window, HCA's entries, CSA's top-k entries and its indexer entries.
AttentionCounters Expected(const TinyV4Config& c, uint64_t p, uint64_t indexer_bytes) {
  AttentionCounters a;
  for (uint32_t l = 0; l < c.layers; ++l) {
    const uint32_t r = c.ratios[l];
    const uint64_t n_c = r == 0 ? 0 : (p + 1) / r;
    uint64_t rows = std::min<uint64_t>(p + 1, c.dims.window);
    if (r == 4) {
      rows += std::min<uint64_t>(c.dims.indexer.topk, n_c);
      a.page_bytes += n_c * indexer_bytes;
      a.records += n_c;
      a.flops += IndexerFlops(c.dims.indexer, n_c);
    } else {
      rows += n_c;
    }
    a.page_bytes += rows * 584;
    a.records += rows;
    a.flops += V4AttendFlops(c.dims, rows);
  }
  return a;
}

TEST(TinyV4, GeneratesDeterministicallyWithCountersOfTheClosedForms) {
  std::unique_ptr<TinyV4Runner> a = Runner(SwaStrategy::kSnapshot);
  std::unique_ptr<TinyV4Runner> b = Runner(SwaStrategy::kRetain);
  ASSERT_TRUE(a && b);
  const std::vector<uint32_t> prompt = Prompt(140);
  Result<TinyV4Generation> ga = a->Generate(prompt, 8);
  ASSERT_TRUE(ga.ok()) << ga.status().ToString();
  Result<TinyV4Generation> gb = b->Generate(prompt, 8);
  ASSERT_TRUE(gb.ok());
  EXPECT_EQ(ga->tokens, gb->tokens);
  EXPECT_EQ(ga->logits, gb->logits);
  ASSERT_EQ(ga->logits.size(), 8u);
  for (const auto& l : ga->logits) {
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
  }
  // The last computed token is at position 140 + 8 - 2.
  const AttentionCounters want = Expected(a->config(), 146, 68);
  EXPECT_EQ(ga->last_token.page_bytes, want.page_bytes);
  EXPECT_EQ(ga->last_token.records, want.records);
  EXPECT_EQ(ga->last_token.flops, want.flops);
  // Ledger meets kernel: the ledger's read_bytes_per_token for tiny-v4 at the same context
  // (147 tokens, v4-fp8 and indexer-mxfp4) is what the decode read.
  LedgerOptions lo;
  lo.context_tokens = 147;
  lo.kv_format = "v4-fp8";
  lo.indexer_format = "indexer-mxfp4";
  EXPECT_EQ(testing::MustLedger(a->config().geometry, lo).read_bytes_per_token, ga->last_token.page_bytes);
  EXPECT_EQ(ga->last_token.page_bytes, 52200u);  // ADR 0018's derived figure
  // Greedy: each generated token is the argmax of the logits before it.
  for (size_t i = 0; i < 8; ++i) {
    const auto& l = ga->logits[i];
    EXPECT_EQ(ga->tokens[140 + i], static_cast<uint32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
  }
}

// A prompt resumed from cached blocks gives logits bit-identical to the uninterrupted run under
// every window strategy: snapshot and retain restore the kept state; recompute rebuilds the
// rings from the forward over the last W + (L-1)(W-1) = 61 tokens (ADR 0018).
TEST(TinyV4, ResumedPrefixGivesBitIdenticalLogits) {
  for (SwaStrategy s : {SwaStrategy::kSnapshot, SwaStrategy::kRetain, SwaStrategy::kRecompute}) {
    std::unique_ptr<TinyV4Runner> r = Runner(s);
    ASSERT_NE(r, nullptr);
    const std::vector<uint32_t> prompt = Prompt(300);
    Result<TinyV4Generation> first = r->Generate(prompt, 6);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_EQ(first->cached_tokens, 0u);
    Result<TinyV4Generation> again = r->Generate(prompt, 6);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->cached_tokens, 256u);
    EXPECT_EQ(again->state_restored, s != SwaStrategy::kRecompute);
    EXPECT_EQ(again->logits, first->logits) << SwaStrategyName(s);
    EXPECT_EQ(again->tokens, first->tokens);
  }
}

// The same after the prefix block went to a disk tier and came back: a pool of 3 blocks, run A
// (300 tokens: one sealed 256-token block), then run X (600 other tokens) which evicts A's block
// into the disk tier (with its window state under snapshot and retain); A again promotes it and
// resumes bit-identically under every window strategy.
TEST(TinyV4, ResumedFromADiskTierGivesBitIdenticalLogits) {
  for (SwaStrategy s : {SwaStrategy::kSnapshot, SwaStrategy::kRetain, SwaStrategy::kRecompute}) {
    TinyV4Config c = Config();
    TinyV4Weights w = GenerateTinyV4Weights(c, 42);
    TinyV4Options o;
    o.window_strategy = s;
    o.capacity_blocks = 3;
    Result<std::unique_ptr<TinyV4Runner>> made = TinyV4Runner::Create(std::move(c), std::move(w), o);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    TinyV4Runner& r = **made;
    testing::TempDir dir;
    DiskTierOptions disk;
    disk.dir = dir.path();
    auto d = MakeDiskTier(disk, 0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::move(*d));
    TieredStoreOptions so;
    so.asynchronous = false;
    auto store = TieredStore::Create(r.manager().pool(), so, std::move(tiers));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    r.manager().SetBlockSource(store->get());
    const std::vector<uint32_t> a = Prompt(300);
    std::vector<uint32_t> x = Prompt(600);
    for (uint32_t& t : x) t = (t + 101) % 256;
    Result<TinyV4Generation> first = r.Generate(a, 6);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    Result<TinyV4Generation> other = r.Generate(x, 6);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    EXPECT_EQ(other->cached_tokens, 0u);
    Result<TinyV4Generation> again = r.Generate(a, 6);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->cached_tokens, 256u) << SwaStrategyName(s);
    EXPECT_EQ((*store)->stats().tier_hits, 1u) << SwaStrategyName(s);
    EXPECT_EQ((*store)->stats().verify_failures, 0u);
    EXPECT_EQ(again->state_restored, s != SwaStrategy::kRecompute) << SwaStrategyName(s);
    EXPECT_EQ(again->logits, first->logits) << SwaStrategyName(s);
    EXPECT_EQ(again->tokens, first->tokens);
    ASSERT_TRUE(r.Release().ok());
    r.manager().SetBlockSource(nullptr);
  }
}

// The resumption comparison can fail: a flipped byte of a cached HCA entry changes the logits.
TEST(TinyV4, ACorruptedCachedEntryChangesTheResumedLogits) {
  std::unique_ptr<TinyV4Runner> r = Runner(SwaStrategy::kSnapshot);
  ASSERT_NE(r, nullptr);
  const std::vector<uint32_t> prompt = Prompt(300);
  Result<TinyV4Generation> first = r->Generate(prompt, 4);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(r->request().has_value());
  Result<RecordView> e = r->manager().FaultInjectionEntry(*r->request(), 2, false, 0);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  e->planes[0][448 + 1] ^= std::byte{0x40};  // a RoPE bf16's exponent bit, in a sealed block
  Result<TinyV4Generation> again = r->Generate(prompt, 4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cached_tokens, 256u);
  EXPECT_NE(again->logits, first->logits);
}

// The CLI's entry point: --init-weights writes the file it then runs from; reading it back gives
// the same generation.
TEST(TinyV4, RunWritesThenReadsItsWeightFile) {
  const std::string path = ::testing::TempDir() + "tiny-v4-weights.safetensors";
  TinyV4Run run;
  run.weights_path = path;
  run.init_weights = true;
  run.seed = 9;
  run.prompt = Prompt(20);
  run.steps = 3;
  Result<TinyV4Generation> a = RunTinyV4(run);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  run.init_weights = false;
  Result<TinyV4Generation> b = RunTinyV4(run);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->logits, b->logits);
  EXPECT_EQ(a->tokens.size(), 23u);
  run.steps = 0;
  EXPECT_EQ(RunTinyV4(run).status().field(), "steps");
  run.steps = 1;
  run.weights_path = ::testing::TempDir() + "no-such-weights.safetensors";
  EXPECT_EQ(RunTinyV4(run).status().field(), "weights");
  std::remove(path.c_str());
}

TEST(TinyV4, RefusesBadInput) {
  std::unique_ptr<TinyV4Runner> r = Runner(SwaStrategy::kSnapshot);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->Generate(std::vector<uint32_t>{}, 2).status().field(), "prompt");
  EXPECT_EQ(r->Generate(std::vector<uint32_t>{1, 999}, 2).status().field(), "prompt");
  TinyV4Config c = Config();
  TinyV4Weights w = GenerateTinyV4Weights(c, 1);
  w.tensors.erase("layers.1.attn.indexer.wq_b.weight");
  EXPECT_EQ(TinyV4Runner::Create(c, w, TinyV4Options{}).status().field(), "weights");
  TinyV4Options bad;
  bad.indexer_format = "indexer-fp4-seed";
  EXPECT_EQ(TinyV4Runner::Create(c, GenerateTinyV4Weights(c, 1), bad).status().field(), "indexer-format");
}

}  // namespace
}  // namespace tessera
