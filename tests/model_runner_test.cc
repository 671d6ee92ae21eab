// The tiny models' runner (TinyRunner, src/model/runner.cc) on its own: Create's refusals, every
// argument of Generate and Step checked before the manager is touched, a run past the pool's
// capacity failing cleanly, Release, and the forward itself on weights chosen so that its
// logits follow by hand (identity embedding and head, every other weight zero).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "test_support.h"

namespace tessera {
namespace {

TinyConfig Config(const std::string& model) {
  Result<TinyConfig> c = LoadTinyConfig(model);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : TinyConfig{};
}

std::unique_ptr<TinyRunner> Make(const TinyConfig& c, Weights w, const RunOptions& o = {}) {
  auto r = TinyRunner::Create(c, std::move(w), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

std::unique_ptr<TinyRunner> Seeded(const std::string& model, uint32_t capacity = 64) {
  const TinyConfig c = Config(model);
  RunOptions o;
  o.capacity_blocks = capacity;
  return Make(c, GenerateWeights(c, 1), o);
}

// Every weight zero but the embedding and the head (identity, vocab = hidden = 256) and the final
// norm (ones). Each layer then adds nothing: its norms' weights are zero, so its queries, keys,
// records, attention output and FFN are all zero, and h stays the token's embedding e_t. The
// final RMSNorm gives x = e_t / sqrt(1/256 + eps) (the sum of squares is 1), and the head
// (identity) gives logits[t] = 1 / sqrt(1/256 + 1e-6) = 15.998..., every other logit 0. Greedy
// decoding repeats the last token.
Weights IdentityWeights(const TinyConfig& c, float head_scale = 1.0f) {
  Weights w;
  w.model = c.name;
  w.seed = 0;
  for (const TensorSpec& t : WeightSpecs(c)) w.tensors[t.name].assign(t.elements(), 0.0f);
  for (uint32_t i = 0; i < c.vocab; ++i) {
    w.tensors["embed.weight"][size_t{i} * c.hidden + i] = 1.0f;
    w.tensors["head.weight"][size_t{i} * c.hidden + i] = head_scale;
  }
  std::fill(w.tensors["norm.weight"].begin(), w.tensors["norm.weight"].end(), 1.0f);
  return w;
}

std::vector<uint32_t> Prompt(size_t n) {
  std::vector<uint32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>((i * 37 + 11) % 256);
  return p;
}

TEST(TinyRunnerCreate, RefusesWhatTheForwardCannotRun) {
  const TinyConfig m = Config("tiny-mla");
  const Weights w = GenerateWeights(m, 1);
  auto field = [](const Result<std::unique_ptr<TinyRunner>>& r) {
    return r.ok() ? std::string("(ok)") : r.status().field();
  };
  RunOptions o;
  o.kv_format = "mha-bf16";
  EXPECT_EQ(field(TinyRunner::Create(m, w, o)), "kv-format");
  o.kv_format = "mla-bf16";
  o.capacity_blocks = 0;
  EXPECT_EQ(field(TinyRunner::Create(m, w, o)), "capacity-blocks");
  o.capacity_blocks = 4;
  // Weights of the other model, weights lacking one tensor, one tensor a float short.
  EXPECT_EQ(field(TinyRunner::Create(m, GenerateWeights(Config("tiny-dsa"), 1), o)), "weights");
  Weights missing = w;
  missing.tensors.erase("layers.3.ffn.w2.weight");
  Result<std::unique_ptr<TinyRunner>> r = TinyRunner::Create(m, missing, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "weights");
  EXPECT_NE(r.status().message().find("layers.3.ffn.w2.weight"), std::string::npos) << r.status().ToString();
  Weights short_one = w;
  short_one.tensors["layers.0.attn.wkv_b.weight"].pop_back();
  r = TinyRunner::Create(m, short_one, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layers.0.attn.wkv_b.weight"), std::string::npos) << r.status().ToString();
  // Extra tensors are ignored; a valid set gives a runner over a manager of that capacity.
  Weights extra = w;
  extra.tensors["unused"] = {1.0f};
  auto ok = Make(m, extra, o);
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ok->manager().pool().capacity(), 4u);
  EXPECT_EQ(ok->config().name, "tiny-mla");
  EXPECT_FALSE(ok->request().has_value());
}

TEST(TinyRunnerGenerate, EveryArgumentIsCheckedBeforeTheManagerIsTouched) {
  auto r = Seeded("tiny-mla");
  ASSERT_NE(r, nullptr);
  const uint32_t free_before = r->manager().pool().free_count();
  const std::vector<uint32_t> p = Prompt(10);
  auto field = [](const Result<Generation>& g) { return g.ok() ? std::string("(ok)") : g.status().field(); };
  EXPECT_EQ(field(r->Generate({}, 2)), "prompt-tokens");
  EXPECT_EQ(field(r->Generate(p, 0)), "steps");
  std::vector<uint32_t> bad = p;
  bad[2] = 256;  // vocab 256
  Result<Generation> g = r->Generate(bad, 2);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "prompt-tokens");
  EXPECT_NE(g.status().message().find("token 2 is 256, not below vocab 256"), std::string::npos)
      << g.status().ToString();
  bad[2] = UINT32_MAX;
  EXPECT_EQ(field(r->Generate(bad, 2)), "prompt-tokens");
  const std::vector<uint32_t> two{1, 2}, three{1, 2, 3}, high{1, 256};
  EXPECT_EQ(field(r->Generate(p, 3, {}, two)), "force");  // not `steps` tokens
  EXPECT_EQ(field(r->Generate(p, 2, {}, three)), "force");
  EXPECT_EQ(field(r->Generate(p, 2, {}, high)), "force");
  EXPECT_FALSE(r->request().has_value());
  EXPECT_EQ(r->manager().pool().free_count(), free_before);
}

TEST(TinyRunnerStep, ArgumentsAreCheckedAndAnUnknownRequestIsAnError) {
  auto r = Seeded("tiny-mla");
  ASSERT_NE(r, nullptr);
  Result<Generation> g = r->Generate(Prompt(5), 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const RequestId id = *r->request();
  // Prompt 5 + 2 steps: the first generated token was fed, the last not: 6 tokens held.
  EXPECT_EQ(r->manager().Tokens(id), 6u);
  std::vector<float> logits(256);
  ASSERT_TRUE(r->manager().AllocateSlots(id, 1).ok());
  Status s = r->Step(id, 256, logits, nullptr);
  EXPECT_EQ(s.field(), "token");
  std::vector<float> short_logits(255);
  EXPECT_EQ(r->Step(id, 1, short_logits, nullptr).field(), "logits");
  EXPECT_EQ(r->manager().Tokens(id), 6u);  // nothing appended
  // The next position, fed directly: the token is appended and the logits are written.
  std::fill(logits.begin(), logits.end(), NAN);
  ASSERT_TRUE(r->Step(id, g->tokens.back(), logits, nullptr).ok());
  EXPECT_EQ(r->manager().Tokens(id), 7u);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  // A request the manager does not hold: an error, not a crash.
  EXPECT_FALSE(r->Step(RequestId{12345}, 1, logits, nullptr).ok());
  EXPECT_FALSE(r->Step(RequestId{}, 1, logits, nullptr).ok());
}

TEST(TinyRunnerGenerate, PastThePoolsCapacityFailsCleanlyAndTheRunnerRecovers) {
  auto r = Seeded("tiny-mla", 1);  // 1 block of 64 tokens
  ASSERT_NE(r, nullptr);
  // 40 prompt tokens, then decoding: token 64 needs a second block.
  Result<Generation> g = r->Generate(Prompt(40), 40);
  ASSERT_FALSE(g.ok());
  EXPECT_FALSE(g.status().message().empty());
  EXPECT_EQ(r->manager().Tokens(*r->request()), 64u);  // the block filled, no more
  ASSERT_TRUE(r->Release().ok());
  EXPECT_FALSE(r->request().has_value());
  ASSERT_TRUE(r->Release().ok());  // twice: nothing to release
  // A prompt longer than the pool: refused at admission.
  EXPECT_FALSE(r->Generate(Prompt(65), 1).ok());
  // The runner is usable again, and a new Generate releases the last request itself.
  g = r->Generate(Prompt(20), 3);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  g = r->Generate(Prompt(20), 3);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tokens.size(), 23u);
}

class IdentityForward : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(IdentityForward, LogitsFollowByHandAndGreedyRepeatsTheLastToken) {
  const auto [model, kv_format] = GetParam();
  const TinyConfig c = Config(model);
  ASSERT_EQ(c.vocab, c.hidden);
  RunOptions o;
  o.kv_format = kv_format;
  auto r = Make(c, IdentityWeights(c), o);
  ASSERT_NE(r, nullptr);
  const std::vector<uint32_t> p = Prompt(70);  // past tiny-dsa's top-k (64)
  Result<Generation> g = r->Generate(p, 4);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const float want = 1.0f / std::sqrt(1.0f / 256.0f + 1e-6f);  // RmsNorm's arithmetic, in float
  EXPECT_NEAR(want, 15.998, 1e-3);
  ASSERT_EQ(g->logits.size(), 4u);
  ASSERT_EQ(g->tokens.size(), 74u);
  EXPECT_EQ(g->prompt_len, 70u);
  for (size_t i = 0; i < 4; ++i) {
    const uint32_t t = i == 0 ? p.back() : g->tokens[70 + i - 1];
    EXPECT_EQ(g->tokens[70 + i], p.back()) << i;
    for (uint32_t k = 0; k < 256; ++k) ASSERT_EQ(g->logits[i][k], k == t ? want : 0.0f) << i << " " << k;
  }
  if (c.has_indexer()) {
    // One selection per computed position and layer: every position up to the top-k, then 64.
    ASSERT_EQ(g->selected.size(), 70u + 3u);
    for (size_t pos = 0; pos < g->selected.size(); ++pos) {
      ASSERT_EQ(g->selected[pos].size(), c.layers);
      for (const auto& layer : g->selected[pos]) ASSERT_EQ(layer.size(), std::min<size_t>(pos + 1, 64)) << pos;
    }
  } else {
    EXPECT_TRUE(g->selected.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, IdentityForward,
                         ::testing::Values(std::make_tuple("tiny-mla", "mla-bf16"),
                                           std::make_tuple("tiny-mla", "fp8_ds_mla"),
                                           std::make_tuple("tiny-dsa", "mla-bf16")),
                         [](const ::testing::TestParamInfo<IdentityForward::ParamType>& param_info) {
                           std::string name = std::get<0>(param_info.param) + "_" + std::get<1>(param_info.param);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// A head of zeros: every logit ties at 0 and greedy takes the lowest id, 0, each step.
TEST(TinyRunnerGenerate, TiesGoToTheLowestIdAndForcedTokensAreFed) {
  const TinyConfig c = Config("tiny-mla");
  auto r = Make(c, IdentityWeights(c, 0.0f));
  ASSERT_NE(r, nullptr);
  Result<Generation> g = r->Generate(Prompt(3), 3);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(std::vector<uint32_t>(g->tokens.begin() + 3, g->tokens.end()), (std::vector<uint32_t>{0, 0, 0}));
  // Identity head with forced tokens: each row's 1/sqrt(1/256 + eps) sits at the token fed before it.
  auto f = Make(c, IdentityWeights(c));
  const std::vector<uint32_t> force{200, 17, 99};
  g = f->Generate(Prompt(3), 3, {}, force);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(std::vector<uint32_t>(g->tokens.begin() + 3, g->tokens.end()), force);
  const std::vector<uint32_t> fed{Prompt(3).back(), 200, 17};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::max_element(g->logits[i].begin(), g->logits[i].end()) - g->logits[i].begin(), fed[i]) << i;
  }
}

// after_prefill runs once, with the prompt in pages, and its error ends the run.
TEST(TinyRunnerGenerate, AfterPrefillSeesThePromptAndItsErrorIsReturned) {
  auto r = Seeded("tiny-mla");
  ASSERT_NE(r, nullptr);
  int calls = 0;
  uint64_t seen = 0;
  Result<Generation> g = r->Generate(Prompt(9), 2, [&](RequestId id) {
    ++calls;
    seen = r->manager().Tokens(id);
    return Status::Ok();
  });
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 9u);
  g = r->Generate(Prompt(9), 2, [](RequestId) { return InvalidArgument("probe", "stop here"); });
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "probe");
}

}  // namespace
}  // namespace tessera
