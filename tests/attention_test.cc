// The reference MLA decode over pages (attention.h): counters against their closed forms and
// against the ledger's read_bytes_per_token ("ledger meets kernel"), absorbed == naive, the
// lightning indexer's top-k, and the refusals.
#include "tessera/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>

#include "tessera/codec.h"
#include "tessera/ledger.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;
using testing::RandomFloats;

// A manager holding one request of `n` tokens whose records are random but valid for their
// format (fp8 records quantized from random floats, so no NaN codes).
struct RandomPages {
  std::unique_ptr<RequestManager> manager;
  RequestId id;
};

RandomPages MakePages(const Geometry& g, const std::string& kv_format, uint64_t n, uint32_t seed) {
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = static_cast<uint32_t>(n / 64 + 2);
  o.max_requests = 4;
  auto m = RequestManager::Create(g, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  RandomPages p{std::move(*m), {}};
  std::vector<uint32_t> prompt(n);
  for (uint64_t i = 0; i < n; ++i) prompt[i] = static_cast<uint32_t>(i + 1);
  auto a = p.manager->Admit(prompt, RequestSpec{});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return p;
  p.id = a->id;
  std::mt19937 rng(seed);
  const RequestManager& mr = *p.manager;
  auto writer = [&](uint32_t group, uint32_t, uint64_t, const RecordView& view) {
    testing::WriteRandomRecord(mr.pool().groups()[group].format, view, rng);
  };
  EXPECT_TRUE(p.manager->Append(p.id, prompt, KvWriters(writer)).ok());
  return p;
}

std::vector<uint64_t> AllPositions(uint64_t n) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  return p;
}

// The decode of one generated token over every layer: the dense form, or the V3.2 indexer plus
// the form over the selected positions. `dims` may have fewer heads than the model: bytes read do
// not depend on the query heads.
AttentionCounters DecodeAllLayers(const RandomPages& p, const Geometry& g, MlaDims dims, AttentionForm form) {
  AttentionCounters c;
  const uint64_t n = p.manager->Tokens(p.id);
  const std::vector<float> q_nope = RandomFloats(dims.heads * dims.nope, 1),
                           q_pe = RandomFloats(dims.heads * dims.rope, 2);
  const std::vector<float> wkv_b = RandomFloats(size_t{dims.heads} * (dims.nope + dims.v) * dims.latent, 3, 0.05f);
  std::vector<float> out(dims.heads * dims.v);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    auto pages = PagedLayer::Of(*p.manager, p.id, l);
    EXPECT_TRUE(pages.ok()) << pages.status().ToString();
    if (!pages.ok()) return c;
    std::vector<uint64_t> positions = AllPositions(n);
    if (pages->indexer_format() != nullptr) {
      auto idims = IndexerDims::Of(g);
      EXPECT_TRUE(idims.ok());
      if (!idims.ok()) return c;
      const std::vector<float> iq = RandomFloats(idims->heads * idims->head_dim, 4), iw = RandomFloats(idims->heads, 5);
      EXPECT_TRUE(IndexerSelect(*pages, n, IndexerQuery{iq, iw}, *idims, &positions, &c).ok());
    }
    Status st = MlaDecode(*pages, positions, MlaQuery{q_nope, q_pe}, wkv_b, dims, form, out, &c);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return c;
}

// Ledger meets kernel: the page bytes one generated token's decode reads equal the ledger's
// read_bytes_per_token for the same model, format and context.
struct LedgerCase {
  std::string model;
  std::string kv_format;
  uint64_t context;
};
void PrintTo(const LedgerCase& c, std::ostream* os) { *os << c.model << " " << c.kv_format << " @" << c.context; }

class LedgerMeetsKernel : public ::testing::TestWithParam<LedgerCase> {};

TEST_P(LedgerMeetsKernel, PageBytesReadEqualReadBytesPerToken) {
  const LedgerCase& c = GetParam();
  const Geometry g = Preset(c.model);
  RandomPages p = MakePages(g, c.kv_format, c.context, 11);
  ASSERT_NE(p.manager, nullptr);
  auto dims = MlaDims::Of(g);
  ASSERT_TRUE(dims.ok());
  MlaDims small = *dims;
  small.heads = 1;  // bytes do not depend on the query heads; keeps the real presets fast
  const AttentionCounters k = DecodeAllLayers(p, g, small, AttentionForm::kAbsorbed);
  const Ledger l = testing::MustLedger(g, testing::Context(c.context, c.kv_format));
  EXPECT_EQ(k.page_bytes, l.read_bytes_per_token) << c.model << " " << c.kv_format << " @" << c.context;
  // Records: every latent record (or the top-k), plus every indexer record.
  uint64_t records = 0;
  for (const CacheLine& line : l.lines) records += line.read_bytes_per_token / line.format.record_bytes();
  EXPECT_EQ(k.records, records);
}

INSTANTIATE_TEST_SUITE_P(
    TinyAndReal, LedgerMeetsKernel,
    ::testing::Values(LedgerCase{"tiny-mla", "mla-bf16", 100}, LedgerCase{"tiny-mla", "fp8_ds_mla", 100},
                      LedgerCase{"tiny-dsa", "fp8_ds_mla", 100}, LedgerCase{"tiny-dsa", "mla-bf16", 30},
                      LedgerCase{"deepseek-v3", "mla-bf16", 70}, LedgerCase{"deepseek-v3", "fp8_ds_mla", 70},
                      LedgerCase{"deepseek-v3.2", "fp8_ds_mla", 70}),
    [](const ::testing::TestParamInfo<LedgerCase>& i) {
      std::string s = i.param.model + "_" + i.param.kv_format + "_" + std::to_string(i.param.context);
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

// The FLOP counters equal the closed forms, with the model's real heads (one layer, short context).
TEST(AttentionFlops, CountersEqualClosedForms) {
  for (const char* model : {"tiny-mla", "deepseek-v3"}) {
    const Geometry g = Preset(model);
    RandomPages p = MakePages(g, "mla-bf16", 5, 3);
    auto dims = MlaDims::Of(g);
    ASSERT_TRUE(dims.ok());
    const auto pages = PagedLayer::Of(*p.manager, p.id, 0);
    ASSERT_TRUE(pages.ok());
    const std::vector<float> q_nope = RandomFloats(dims->heads * dims->nope, 1),
                             q_pe = RandomFloats(dims->heads * dims->rope, 2);
    const std::vector<float> wkv_b =
        RandomFloats(size_t{dims->heads} * (dims->nope + dims->v) * dims->latent, 3, 0.05f);
    std::vector<float> out(dims->heads * dims->v);
    for (AttentionForm form : {AttentionForm::kAbsorbed, AttentionForm::kNaive}) {
      AttentionCounters c;
      ASSERT_TRUE(MlaDecode(*pages, AllPositions(5), MlaQuery{q_nope, q_pe}, wkv_b, *dims, form, out, &c).ok());
      EXPECT_EQ(c.flops, MlaDecodeFlops(*dims, form, 5)) << model;
      EXPECT_EQ(c.records, 5u);
    }
  }
  // The closed forms themselves, by hand for DeepSeek-V3 (H 128, L 512, R 64, N 128, V 128), n = 1000:
  // absorbed 2*128*(512*256 + 1000*(1024 + 64)); naive 2*128*1000*(512*256 + 128 + 64 + 128).
  const MlaDims v3{128, 512, 64, 128, 128};
  EXPECT_EQ(MlaDecodeFlops(v3, AttentionForm::kAbsorbed, 1000), 2ULL * 128 * (131072 + 1000ULL * 1088));
  EXPECT_EQ(MlaDecodeFlops(v3, AttentionForm::kNaive, 1000), 2ULL * 128 * 1000 * (131072ULL + 320));
  EXPECT_EQ(IndexerFlops(IndexerDims{64, 128, 2048}, 1000), 2ULL * 1000 * 64 * 129);
}

TEST(AttentionFlops, IndexerCounterEqualsClosedForm) {
  const Geometry g = Preset("tiny-dsa");
  RandomPages p = MakePages(g, "fp8_ds_mla", 90, 5);
  auto idims = IndexerDims::Of(g);
  ASSERT_TRUE(idims.ok());
  auto pages = PagedLayer::Of(*p.manager, p.id, 2);
  ASSERT_TRUE(pages.ok());
  const std::vector<float> iq = RandomFloats(idims->heads * idims->head_dim, 4), iw = RandomFloats(idims->heads, 5);
  AttentionCounters c;
  std::vector<uint64_t> sel;
  ASSERT_TRUE(IndexerSelect(*pages, 90, IndexerQuery{iq, iw}, *idims, &sel, &c).ok());
  EXPECT_EQ(c.flops, IndexerFlops(*idims, 90));
  EXPECT_EQ(c.page_bytes, 90u * 132u);
  EXPECT_EQ(sel.size(), 64u);
  EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
}

float MaxAbs(std::span<const float> v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Absorbed and naive compute the same attention in a different order: within ADR 0017's bound.
TEST(MlaDecode, AbsorbedEqualsNaiveOnRandomPages) {
  const Geometry g = Preset("tiny-mla");
  for (const char* format : {"mla-bf16", "fp8_ds_mla"}) {
    RandomPages p = MakePages(g, format, 150, 9);
    auto dims = MlaDims::Of(g);
    ASSERT_TRUE(dims.ok());
    auto pages = PagedLayer::Of(*p.manager, p.id, 1);
    ASSERT_TRUE(pages.ok());
    const std::vector<float> q_nope = RandomFloats(dims->heads * dims->nope, 1, 4.0f),
                             q_pe = RandomFloats(dims->heads * dims->rope, 2, 4.0f);
    const std::vector<float> wkv_b = RandomFloats(size_t{dims->heads} * (dims->nope + dims->v) * dims->latent, 3, 0.1f);
    std::vector<float> a(dims->heads * dims->v), n(dims->heads * dims->v);
    // A subset in scrambled order too (the sparse path's selection).
    std::vector<uint64_t> subset = {149, 3, 77, 0, 64, 65, 120};
    for (const std::vector<uint64_t>& pos : {AllPositions(150), subset}) {
      ASSERT_TRUE(
          MlaDecode(*pages, pos, MlaQuery{q_nope, q_pe}, wkv_b, *dims, AttentionForm::kAbsorbed, a, nullptr).ok());
      ASSERT_TRUE(MlaDecode(*pages, pos, MlaQuery{q_nope, q_pe}, wkv_b, *dims, AttentionForm::kNaive, n, nullptr).ok());
      float err = 0.0f;
      for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::fabs(a[i] - n[i]));
      EXPECT_LE(err, 1e-4f * std::max(1.0f, MaxAbs(n))) << format;
      EXPECT_GT(MaxAbs(n), 0.0f);
    }
  }
}

// The kernels' form is the absorbed form without its two projections: W_UV applied to the
// latent output of q_lat = W_UK^T q_nope equals MlaDecode(kAbsorbed) bit for bit, and lse is the
// log-sum-exp of the scaled scores, recomputed here in double from the decoded records.
TEST(MlaLatentDecode, IsTheAbsorbedFormWithoutItsProjections) {
  const Geometry g = Preset("tiny-mla");
  for (const char* format : {"mla-bf16", "fp8_ds_mla"}) {
    SCOPED_TRACE(format);
    RandomPages p = MakePages(g, format, 150, 11);
    auto dims = MlaDims::Of(g);
    ASSERT_TRUE(dims.ok());
    auto pages = PagedLayer::Of(*p.manager, p.id, 2);
    ASSERT_TRUE(pages.ok());
    const size_t H = dims->heads, L = dims->latent, R = dims->rope, N = dims->nope, V = dims->v;
    const std::vector<float> q_nope = RandomFloats(H * N, 1, 4.0f), q_pe = RandomFloats(H * R, 2, 4.0f);
    const std::vector<float> wkv_b = RandomFloats(H * (N + V) * L, 3, 0.1f);
    std::vector<float> q_lat(H * L, 0.0f);
    for (size_t h = 0; h < H; ++h) {
      for (size_t i = 0; i < N; ++i) {
        for (size_t j = 0; j < L; ++j) q_lat[h * L + j] += q_nope[h * N + i] * wkv_b[(h * (N + V) + i) * L + j];
      }
    }
    const std::vector<uint64_t> subset = {149, 3, 77, 0, 64, 65, 120};
    for (const std::vector<uint64_t>& pos : {AllPositions(150), subset}) {
      std::vector<float> absorbed(H * V), lat(H * L), lse(H), projected(H * V);
      ASSERT_TRUE(
          MlaDecode(*pages, pos, MlaQuery{q_nope, q_pe}, wkv_b, *dims, AttentionForm::kAbsorbed, absorbed, nullptr)
              .ok());
      AttentionCounters c;
      ASSERT_TRUE(
          MlaLatentDecode(*pages, pos, LatentQuery{q_lat, q_pe, dims->heads, dims->scale()}, lat, lse, &c).ok());
      for (size_t h = 0; h < H; ++h) {
        for (size_t i = 0; i < V; ++i) {
          float s = 0.0f;
          for (size_t j = 0; j < L; ++j) s += wkv_b[(h * (N + V) + N + i) * L + j] * lat[h * L + j];
          projected[h * V + i] = s;
        }
      }
      EXPECT_EQ(projected, absorbed);
      EXPECT_EQ(c.records, pos.size());
      EXPECT_EQ(c.page_bytes, pos.size() * p.manager->pool().groups()[0].format.record_bytes());
      EXPECT_EQ(c.flops, MlaLatentDecodeFlops(dims->heads, dims->latent, dims->rope, pos.size()));
      EXPECT_EQ(c.flops, 2 * H * pos.size() * (2 * L + R));
      std::vector<float> c_t(L), kpe(R);
      for (size_t h = 0; h < H; ++h) {
        double m = -INFINITY;
        std::vector<double> s(pos.size());
        for (size_t t = 0; t < pos.size(); ++t) {
          ASSERT_TRUE(pages->ReadLatent(pos[t], c_t, kpe, nullptr).ok());
          double d = 0;
          for (size_t j = 0; j < L; ++j) d += double{q_lat[h * L + j]} * c_t[j];
          for (size_t j = 0; j < R; ++j) d += double{q_pe[h * R + j]} * kpe[j];
          s[t] = d * dims->scale();
          m = std::max(m, s[t]);
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        EXPECT_NEAR(lse[h], m + std::log(sum), 1e-4 * std::max(1.0, std::fabs(m))) << "head " << h;
      }
    }
  }
}

TEST(MlaLatentDecode, Refusals) {
  const Geometry g = Preset("tiny-mla");
  RandomPages p = MakePages(g, "mla-bf16", 10, 1);
  auto pages = PagedLayer::Of(*p.manager, p.id, 0);
  ASSERT_TRUE(pages.ok());
  const std::vector<float> q_lat(2 * 512), q_pe(2 * 64);
  std::vector<float> out(2 * 512), lse(2);
  const std::vector<uint64_t> pos{0, 9};
  auto field = [&](LatentQuery q, std::span<float> o, std::span<float> l, std::span<const uint64_t> ps) {
    return MlaLatentDecode(*pages, ps, q, o, l, nullptr).field();
  };
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.1f}, out, lse, pos), "");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 0, 0.1f}, out, lse, pos), "heads");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.0f}, out, lse, pos), "softmax_scale");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, NAN}, out, lse, pos), "softmax_scale");
  EXPECT_EQ(field(LatentQuery{std::span(q_lat).first(512), q_pe, 2, 0.1f}, out, lse, pos), "q_lat");
  EXPECT_EQ(field(LatentQuery{q_lat, std::span(q_pe).first(64), 2, 0.1f}, out, lse, pos), "q_pe");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.1f}, std::span(out).first(512), lse, pos), "out");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.1f}, out, std::span(lse).first(1), pos), "lse");
  const std::vector<uint64_t> past{10};
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.1f}, out, lse, past), "positions");
  EXPECT_EQ(field(LatentQuery{q_lat, q_pe, 2, 0.1f}, out, lse, {}), "positions");
}

// The indexer's top-k: the highest scores, ties to the lower position, returned in order. Keys
// are one-hot on dim 0 with exactly representable e4m3 values, one query head looks at dim 0.
TEST(IndexerSelect, TopKByScoreTiesToLowerPosition) {
  const Geometry g = Preset("tiny-dsa");
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = 4;
  auto m = RequestManager::Create(g, o);
  ASSERT_TRUE(m.ok());
  const uint64_t n = 100;
  std::vector<uint32_t> prompt(n);
  for (uint64_t i = 0; i < n; ++i) prompt[i] = static_cast<uint32_t>(i);
  auto a = (*m)->Admit(prompt, RequestSpec{});
  ASSERT_TRUE(a.ok());
  // Score of position t: (t % 10) for t < 90; positions 90..99 score 9 (ties with 9, 19, ...).
  auto score_of = [](uint64_t t) { return t < 90 ? static_cast<float>(t % 10) : 9.0f; };
  const RequestManager& mr = **m;
  auto writer = [&](uint32_t group, uint32_t, uint64_t pos, const RecordView& view) {
    const RecordFormat& f = mr.pool().groups()[group].format;
    if (f.use == FormatUse::kIndexer) {
      std::vector<float> key(128, 0.0f);
      key[0] = score_of(pos);
      ASSERT_TRUE(WriteIndexerFp8(f, key, view).ok());  // either page layout
    } else {
      std::vector<float> lat(512, 0.5f), rope(64, 0.25f);
      ASSERT_TRUE(QuantizeFp8DsMla(lat, rope, view.planes[0].first(656)).ok());
    }
  };
  ASSERT_TRUE((*m)->Append(a->id, prompt, KvWriters(writer)).ok());
  auto pages = PagedLayer::Of(**m, a->id, 0);
  ASSERT_TRUE(pages.ok());
  IndexerDims d{4, 128, 25};
  std::vector<float> q(4 * 128, 0.0f), w = {1.0f, 0.0f, 0.0f, 0.0f};
  q[0] = 1.0f;
  std::vector<uint64_t> sel;
  ASSERT_TRUE(IndexerSelect(*pages, n, IndexerQuery{q, w}, d, &sel, nullptr).ok());
  // 19 positions score 9 (9, 19, ..., 89 and 90..99); then 8 scores 8: 8, 18, ..., 58 take the rest.
  std::vector<uint64_t> want = {9,  19, 29, 39, 49, 59, 69, 79, 89, 90, 91, 92, 93,
                                94, 95, 96, 97, 98, 99, 8,  18, 28, 38, 48, 58};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sel, want);
  // Context below top-k: everything, in order.
  ASSERT_TRUE(IndexerSelect(*pages, 7, IndexerQuery{q, w}, d, &sel, nullptr).ok());
  EXPECT_EQ(sel, AllPositions(7));
  // A negative weight inverts the ranking; relu clamps negative dot products (none here).
  w[0] = -1.0f;
  ASSERT_TRUE(IndexerSelect(*pages, 20, IndexerQuery{q, w}, IndexerDims{4, 128, 2}, &sel, nullptr).ok());
  EXPECT_EQ(sel, (std::vector<uint64_t>{0, 10}));
}

TEST(PagedLayer, PendingRecordIsReadAndCounted) {
  const Geometry g = Preset("tiny-mla");
  RandomPages p = MakePages(g, "mla-bf16", 3, 1);
  auto pages = PagedLayer::Of(*p.manager, p.id, 0);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->tokens(), 3u);
  std::vector<std::byte> rec(1152);
  const uint16_t two = FloatToBf16(2.0f);
  for (size_t i = 0; i < rec.size(); i += 2) {
    rec[i] = static_cast<std::byte>(two & 0xff);
    rec[i + 1] = static_cast<std::byte>(two >> 8);
  }
  pages->SetPending(rec, {});
  EXPECT_EQ(pages->tokens(), 4u);
  std::vector<float> lat(512), rope(64);
  AttentionCounters c;
  ASSERT_TRUE(pages->ReadLatent(3, lat, rope, &c).ok());
  EXPECT_EQ(lat[511], 2.0f);
  EXPECT_EQ(rope[0], 2.0f);
  EXPECT_EQ(c.page_bytes, 1152u);
  EXPECT_FALSE(pages->ReadLatent(4, lat, rope, &c).ok());
}

TEST(Attention, Refusals) {
  EXPECT_EQ(MlaDims::Of(Preset("llama-3.1-8b")).status().field(), "model");
  EXPECT_EQ(MlaDims::Of(Preset("deepseek-v4-flash")).status().field(), "model");
  EXPECT_EQ(IndexerDims::Of(Preset("deepseek-v3")).status().field(), "index_n_heads");
  EXPECT_EQ(ParseAttentionForm("flash").status().field(), "attention");
  EXPECT_EQ(*ParseAttentionForm("naive"), AttentionForm::kNaive);
  // A manager of an MHA model has no latent pages.
  {
    ManagerOptions o;
    o.capacity_blocks = 2;
    auto m = RequestManager::Create(Preset("llama-3.1-8b"), o);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(PagedLayer::Of(**m, RequestId{0}, 0).status().field(), "kv-format");
  }
  const Geometry g = Preset("tiny-mla");
  RandomPages p = MakePages(g, "mla-bf16", 4, 1);
  EXPECT_EQ(PagedLayer::Of(*p.manager, p.id, 4).status().field(), "layer");
  auto pages = PagedLayer::Of(*p.manager, p.id, 0);
  ASSERT_TRUE(pages.ok());
  auto dims = MlaDims::Of(g);
  std::vector<float> q_nope(dims->heads * dims->nope), q_pe(dims->heads * dims->rope), out(dims->heads * dims->v);
  std::vector<float> wkv_b(size_t{dims->heads} * (dims->nope + dims->v) * dims->latent);
  const MlaQuery q{q_nope, q_pe};
  auto field = [&](std::span<const uint64_t> pos, const MlaQuery& qq, std::span<const float> w, std::span<float> o) {
    return MlaDecode(*pages, pos, qq, w, *dims, AttentionForm::kAbsorbed, o, nullptr).field();
  };
  const std::vector<uint64_t> ok_pos = {0, 1}, bad_pos = {0, 4};
  EXPECT_EQ(field(bad_pos, q, wkv_b, out), "positions");
  EXPECT_EQ(field({}, q, wkv_b, out), "positions");
  EXPECT_EQ(field(ok_pos, MlaQuery{std::span(q_nope).first(3), q_pe}, wkv_b, out), "q_nope");
  EXPECT_EQ(field(ok_pos, MlaQuery{q_nope, std::span(q_pe).first(3)}, wkv_b, out), "q_pe");
  EXPECT_EQ(field(ok_pos, q, std::span(wkv_b).first(5), out), "wkv_b");
  EXPECT_EQ(field(ok_pos, q, wkv_b, std::span(out).first(5)), "out");
  EXPECT_EQ(field(ok_pos, q, wkv_b, out), "");
  std::vector<uint64_t> sel;
  std::vector<float> iq(512), iw(4);
  EXPECT_EQ(IndexerSelect(*pages, 2, IndexerQuery{iq, iw}, IndexerDims{4, 128, 64}, &sel, nullptr).field(),
            "indexer-format");
}

TEST(IndexerFp8Codec, ScaleRuleAndRoundTrip) {
  std::vector<float> key(128, 0.0f), back(128);
  std::vector<std::byte> rec(132);
  ASSERT_TRUE(QuantizeIndexerFp8(key, rec).ok());
  ASSERT_TRUE(DequantizeIndexerFp8(rec, back).ok());
  float scale;
  std::memcpy(&scale, rec.data() + 128, 4);  // little-endian host (x86/arm64)
  // An all-zero key: vLLM floors amax at 1e-4, then (ue8m0, what it writes for V3.2) rounds
  // 1e-4 / 448 up to a power of two.
  EXPECT_EQ(scale, std::ldexp(1.0f, -22));
  key[5] = 896.0f;  // amax 896: scale 2, code 448
  key[6] = -3.0f;
  ASSERT_TRUE(QuantizeIndexerFp8(key, rec).ok());
  ASSERT_TRUE(DequantizeIndexerFp8(rec, back).ok());
  EXPECT_EQ(back[5], 896.0f);
  EXPECT_EQ(back[6], -3.0f);
  EXPECT_EQ(std::to_integer<uint8_t>(rec[5]), kE4M3MaxCode);
  key[7] = NAN;
  EXPECT_EQ(QuantizeIndexerFp8(key, rec).field(), "key");
  EXPECT_EQ(QuantizeIndexerFp8(key, std::span(rec).first(100)).field(), "record");
}

}  // namespace
}  // namespace tessera
