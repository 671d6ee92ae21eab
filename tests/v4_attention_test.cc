#include "tessera/v4_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <map>
#include <random>
#include <set>

#include "tessera/codec.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::FromJson;

// tiny-v4's attention geometry (ADR 0018): SWA, CSA, HCA, CSA; a 16-token window.
constexpr char kTinyV4[] = R"({"model_type": "deepseek_v4", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 64, "sliding_window": 16,
    "compress_ratios": [0, 4, 128, 4], "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
    "vocab_size": 256, "intermediate_size": 256, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 0, "max_position_embeddings": 131072})";

constexpr uint32_t kD = 512, kNope = 448, kRope = 64, kIdx = 128, kH = 4, kW = 16;
constexpr double kSwaTheta = 10000, kCompressTheta = 160000;

uint32_t RatioOf(uint32_t layer) { return std::array<uint32_t, 4>{0, 4, 128, 4}[layer]; }
uint32_t Coff(uint32_t ratio) { return ratio == 4 ? 2 : 1; }
double ThetaOf(uint32_t layer) { return RatioOf(layer) == 0 ? kSwaTheta : kCompressTheta; }

// Every token's raw inputs, kept whole: the naive side recomputes from these, never from pages.
struct Raw {
  std::map<uint32_t, std::vector<std::vector<float>>> kv;      // layer -> position -> 512
  std::map<uint32_t, std::vector<std::vector<float>>> state;   // layer -> position -> [k | s]
  std::map<uint32_t, std::vector<std::vector<float>>> istate;  // indexer's
  std::map<uint32_t, std::vector<float>> norm, inorm;          // compressor norm weights
};

Raw MakeRaw(uint64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto vec = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * n01(rng);
    return v;
  };
  Raw r;
  for (uint32_t l = 0; l < 4; ++l) {
    const uint32_t ratio = RatioOf(l), coff = Coff(ratio);
    for (uint64_t p = 0; p < tokens; ++p) {
      r.kv[l].push_back(vec(kD, 1.0f));
      if (ratio == 0) continue;
      std::vector<float> row = vec(coff * kD, 1.0f), s = vec(coff * kD, 2.0f);
      row.insert(row.end(), s.begin(), s.end());
      r.state[l].push_back(std::move(row));
      if (ratio == 4) {
        std::vector<float> irow = vec(2 * kIdx, 1.0f), is = vec(2 * kIdx, 2.0f);
        irow.insert(irow.end(), is.begin(), is.end());
        r.istate[l].push_back(std::move(irow));
      }
    }
    if (ratio == 0) continue;
    for (uint32_t i = 0; i < kD; ++i) r.norm[l].push_back(1.0f + 0.1f * u(rng));
    for (uint32_t i = 0; i < kIdx; ++i) r.inorm[l].push_back(1.0f + 0.1f * u(rng));
  }
  return r;
}

V4Compressor CompressorOf(const Raw& raw, uint32_t layer, bool indexer) {
  V4Compressor c;
  c.ratio = RatioOf(layer);
  c.dim = indexer ? kIdx : kD;
  c.rope = kRope;
  c.theta = kCompressTheta;
  c.norm = indexer ? raw.inorm.at(layer) : raw.norm.at(layer);
  c.indexer = indexer;
  return c;
}

struct Fixture {
  Raw raw;
  std::unique_ptr<RequestManager> manager;
  RequestId id;
  const RecordFormat* main_format = nullptr;
  const RecordFormat* indexer_format = nullptr;
  KvWriters writers;
};

std::unique_ptr<Fixture> MakeFixture(const std::string& indexer_format, uint64_t tokens) {
  auto f = std::make_unique<Fixture>();
  f->raw = MakeRaw(tokens, 7);
  ManagerOptions o;
  o.kv_format = "v4-fp8";
  o.indexer_format = indexer_format;
  o.capacity_blocks = 8;
  Result<std::unique_ptr<RequestManager>> m = RequestManager::Create(FromJson(kTinyV4), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  f->manager = std::move(*m);
  for (const StateLayer& l : f->manager->states()->layers()) {
    if (l.group >= 0) f->main_format = &f->manager->pool().groups()[static_cast<size_t>(l.group)].format;
    if (l.igroup >= 0) f->indexer_format = &f->manager->pool().groups()[static_cast<size_t>(l.igroup)].format;
  }
  Fixture* fp = f.get();
  f->writers.window = [fp](uint32_t layer, uint64_t pos, std::span<std::byte> row) {
    ASSERT_TRUE(EncodeV4WindowRow(fp->raw.kv.at(layer)[pos], row).ok());
  };
  f->writers.state = [fp](uint32_t layer, bool indexer, uint64_t pos, std::span<float> row) {
    const std::vector<float>& src = (indexer ? fp->raw.istate : fp->raw.state).at(layer)[pos];
    ASSERT_EQ(row.size(), src.size());
    std::copy(src.begin(), src.end(), row.begin());
  };
  f->writers.compress = [fp](uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows,
                             uint32_t row_floats, const RecordView& entry) {
    std::vector<float> e(indexer ? kIdx : kD);
    ASSERT_TRUE(V4CompressEntry(CompressorOf(fp->raw, layer, indexer), group, rows, row_floats, e).ok());
    ASSERT_TRUE(EncodeV4Entry(e, indexer ? *fp->indexer_format : *fp->main_format, entry).ok());
  };
  f->id = f->manager->Admit(std::span<const uint32_t>(), RequestSpec{})->id;
  return f;
}

Status AppendOne(Fixture& f, uint64_t p) {
  const uint32_t token = static_cast<uint32_t>(p % 251);
  TESSERA_RETURN_IF_ERROR(f.manager->AllocateSlots(f.id, 1));
  return f.manager->Append(f.id, std::span<const uint32_t>(&token, 1), f.writers);
}

// ---- the naive side: from Raw, no pages, no rings ------------------------------------------

// The group's entry before quantization, written out from the definition (ADR 0018 step 3):
// rows gathered by position from the raw state.
std::vector<float> NaiveEntry(const Raw& raw, uint32_t layer, bool indexer, uint64_t g) {
  const uint32_t ratio = RatioOf(layer), coff = Coff(ratio), dim = indexer ? kIdx : kD;
  const auto& st = (indexer ? raw.istate : raw.state).at(layer);
  std::vector<float> e(dim);
  for (uint32_t c = 0; c < dim; ++c) {
    std::vector<std::pair<float, float>> lv;  // (logit, value)
    if (coff == 2 && g > 0) {
      for (uint64_t t = (g - 1) * ratio; t < g * ratio; ++t) lv.push_back({st[t][2 * dim + c], st[t][c]});
    }
    for (uint64_t t = g * ratio; t < (g + 1) * ratio; ++t) {
      const uint32_t col = coff == 2 ? dim + c : c;
      lv.push_back({st[t][coff * dim + col], st[t][col]});
    }
    float m = -INFINITY;
    for (auto& [l, v] : lv) m = std::max(m, l);
    float sum = 0.0f;
    for (auto& [l, v] : lv) sum += std::exp(l - m);
    float acc = 0.0f;
    for (auto& [l, v] : lv) acc += std::exp(l - m) / sum * v;
    e[c] = acc;
  }
  float ms = 0.0f;
  for (float v : e) ms += v * v;
  const float inv = 1.0f / std::sqrt(ms / static_cast<float>(dim) + 1e-6f);
  const std::vector<float>& w = (indexer ? raw.inorm : raw.norm).at(layer);
  for (uint32_t i = 0; i < dim; ++i) e[i] = e[i] * inv * w[i];
  RopeInterleaved(std::span(e).subspan(dim - kRope), g * ratio, kCompressTheta, false);
  if (indexer) {
    EXPECT_TRUE(HadamardTransform(e).ok());
    EXPECT_TRUE(RoundFp4Blocks(e).ok());
  }
  return e;
}

// What a v4-fp8 record holds of a row.
std::vector<float> Fp8RoundTrip(const std::vector<float>& kv) {
  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
  EXPECT_TRUE(QuantizeV4Fp8(std::span(kv).first(kNope), std::span(kv).subspan(kNope), data, scales).ok());
  std::vector<float> out(kD);
  EXPECT_TRUE(DequantizeV4Fp8(data, scales, std::span(out).first(kNope), std::span(out).subspan(kNope)).ok());
  return out;
}

std::vector<float> IndexerRoundTrip(const std::vector<float>& key, const RecordFormat& f) {
  std::vector<std::byte> rec(f.record_bytes());
  std::vector<float> out(key.size());
  if (f.name == "indexer-fp8") {
    EXPECT_TRUE(QuantizeIndexerFp8(key, rec).ok());
    EXPECT_TRUE(DequantizeIndexerFp8(rec, out).ok());
  } else {
    EXPECT_TRUE(QuantizeIndexerMxfp4(key, rec).ok());
    EXPECT_TRUE(DequantizeIndexerMxfp4(rec, out).ok());
  }
  return out;
}

// Attention in double over explicit rows, sink in the denominator, RoPE dims rotated back.
std::vector<float> NaiveAttend(const std::vector<std::vector<float>>& rows, const std::vector<float>& q,
                               const std::vector<float>& sink, uint64_t p, double theta) {
  std::vector<float> out(kH * kD);
  for (uint32_t h = 0; h < kH; ++h) {
    std::vector<double> s(rows.size());
    double m = -INFINITY;
    for (size_t t = 0; t < rows.size(); ++t) {
      double acc = 0;
      for (uint32_t j = 0; j < kD; ++j) acc += double{q[h * kD + j]} * rows[t][j];
      s[t] = acc / std::sqrt(double{kD});
      m = std::max(m, s[t]);
    }
    double denom = std::exp(double{sink[h]} - m);
    for (double& v : s) denom += (v = std::exp(v - m));
    std::vector<double> o(kD, 0.0);
    for (size_t t = 0; t < rows.size(); ++t) {
      for (uint32_t j = 0; j < kD; ++j) o[j] += s[t] / denom * rows[t][j];
    }
    for (uint32_t i = 0; i < kRope / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / kRope);
      const std::complex<double> z(o[kNope + 2 * i], o[kNope + 2 * i + 1]);
      const std::complex<double> r = z * std::polar(1.0, -angle);
      o[kNope + 2 * i] = r.real();
      o[kNope + 2 * i + 1] = r.imag();
    }
    for (uint32_t j = 0; j < kD; ++j) out[h * kD + j] = static_cast<float>(o[j]);
  }
  return out;
}

float MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

struct Check {
  float max_diff = 0.0f;
  bool selected_equal = true;
  AttentionCounters counters;
  uint64_t rows = 0, indexer_entries = 0;
};

// Kernel vs naive for the query at the last written position of one layer.
Check CompareLayer(const Fixture& f, uint32_t layer, std::mt19937& rng) {
  Check c;
  const V4Dims dims = *V4Dims::Of(FromJson(kTinyV4));
  const uint64_t tokens = f.manager->Tokens(f.id), p = tokens - 1;
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> q(kH * kD), sink(kH);
  for (float& x : q) x = n01(rng);
  for (float& x : sink) x = n01(rng);
  Result<V4PagedLayer> pages = V4PagedLayer::Of(*f.manager, f.id, layer);
  EXPECT_TRUE(pages.ok()) << pages.status().ToString();
  if (!pages.ok()) return c;
  const uint32_t ratio = RatioOf(layer);
  const uint64_t n_c = ratio == 0 ? 0 : tokens / ratio;
  EXPECT_EQ(pages->entries(), n_c);

  std::vector<uint64_t> entries;
  if (ratio == 128) {
    for (uint64_t e = 0; e < n_c; ++e) entries.push_back(e);
  } else if (ratio == 4) {
    std::vector<float> iq(dims.indexer.heads * kIdx), w(dims.indexer.heads);
    for (float& x : iq) x = n01(rng);
    for (float& x : w) x = n01(rng);
    EXPECT_TRUE(V4IndexerSelect(*pages, IndexerQuery{iq, w}, dims.indexer, &entries, &c.counters).ok());
    // Naive selection: scores from the raw state, ties to the lower entry.
    std::vector<std::pair<double, uint64_t>> scored;
    for (uint64_t e = 0; e < n_c; ++e) {
      const std::vector<float> key = IndexerRoundTrip(NaiveEntry(f.raw, layer, true, e), *f.indexer_format);
      double s = 0;
      for (uint32_t j = 0; j < dims.indexer.heads; ++j) {
        double d = 0;
        for (uint32_t i = 0; i < kIdx; ++i) d += double{iq[j * kIdx + i]} * key[i];
        s += w[j] * std::max(0.0, d);
      }
      scored.push_back({-s, e});
    }
    std::sort(scored.begin(), scored.end());
    std::vector<uint64_t> want;
    for (size_t i = 0; i < std::min<size_t>(dims.indexer.topk, scored.size()); ++i) want.push_back(scored[i].second);
    std::sort(want.begin(), want.end());
    c.selected_equal = want == entries;
    c.indexer_entries = n_c;
  }
  std::vector<float> out(kH * kD);
  const Status st = V4Attend(*pages, entries, q, sink, dims, ThetaOf(layer), out, &c.counters);
  EXPECT_TRUE(st.ok()) << st.ToString();

  std::vector<std::vector<float>> rows;
  for (uint64_t t = p + 1 > kW ? p + 1 - kW : 0; t <= p; ++t) rows.push_back(Fp8RoundTrip(f.raw.kv.at(layer)[t]));
  for (uint64_t e : entries) rows.push_back(Fp8RoundTrip(NaiveEntry(f.raw, layer, false, e)));
  c.rows = rows.size();
  const std::vector<float> want = NaiveAttend(rows, q, sink, p, ThetaOf(layer));
  c.max_diff = MaxAbsDiff(out, want);
  return c;
}

// Positions checked: the first window, group boundaries of both ratios, and a stride.
bool Checked(uint64_t p) { return p < 20 || (p + 1) % 128 <= 1 || (p + 1) % 128 == 127 || p % 41 == 0; }

class V4AttentionTest : public ::testing::TestWithParam<std::string> {};

// Over 600 tokens (four ratio-128 groups, 150 ratio-4 groups, the window wrapping 37 times):
// the kernel over pages and rings equals the naive recomputation from the raw inputs, the
// indexer selects the same entries, and the counters equal the closed forms.
TEST_P(V4AttentionTest, MatchesNaiveRecomputationOverManyGroups) {
  constexpr uint64_t kTokens = 600;
  std::unique_ptr<Fixture> f = MakeFixture(GetParam(), kTokens);
  ASSERT_NE(f, nullptr);
  const V4Dims dims = *V4Dims::Of(FromJson(kTinyV4));
  std::mt19937 rng(11);
  uint64_t checks = 0;
  float worst = 0.0f;
  for (uint64_t p = 0; p < kTokens; ++p) {
    ASSERT_TRUE(AppendOne(*f, p).ok()) << p;
    if (!Checked(p)) continue;
    for (uint32_t layer = 0; layer < 4; ++layer) {
      const Check c = CompareLayer(*f, layer, rng);
      ++checks;
      EXPECT_LE(c.max_diff, 1e-4f) << "layer " << layer << " position " << p;
      worst = std::max(worst, c.max_diff);
      EXPECT_TRUE(c.selected_equal) << "layer " << layer << " position " << p;
      // Closed forms: every row and entry read once, record bytes each.
      const uint64_t ibytes = f->indexer_format->record_bytes();
      EXPECT_EQ(c.counters.page_bytes, c.rows * 584 + c.indexer_entries * ibytes) << layer << " " << p;
      EXPECT_EQ(c.counters.records, c.rows + c.indexer_entries);
      EXPECT_EQ(c.counters.flops, V4AttendFlops(dims, c.rows) + IndexerFlops(dims.indexer, c.indexer_entries));
      EXPECT_EQ(V4AttendFlops(dims, c.rows), 4ull * kH * c.rows * kD);
      const uint64_t window = std::min<uint64_t>(p + 1, kW);
      const uint64_t n_c = RatioOf(layer) == 0 ? 0 : (p + 1) / RatioOf(layer);
      const uint64_t want_rows = window + (RatioOf(layer) == 4 ? std::min<uint64_t>(8, n_c) : n_c);
      EXPECT_EQ(c.rows, want_rows) << layer << " " << p;
    }
  }
  RecordProperty("max_abs_diff", std::to_string(worst));
  uint64_t positions = 0;
  for (uint64_t p = 0; p < kTokens; ++p) positions += Checked(p) ? 1 : 0;
  EXPECT_EQ(checks, 4 * positions);
  EXPECT_GT(positions, 40u);
}

INSTANTIATE_TEST_SUITE_P(IndexerFormats, V4AttentionTest, ::testing::Values("indexer-mxfp4", "indexer-fp8"));

// The comparison can fail: one flipped byte of a compressed entry in the pages moves the output.
TEST(V4Attention, ACorruptedEntryByteIsSeen) {
  std::unique_ptr<Fixture> f = MakeFixture("indexer-mxfp4", 300);
  ASSERT_NE(f, nullptr);
  for (uint64_t p = 0; p < 300; ++p) ASSERT_TRUE(AppendOne(*f, p).ok());
  std::mt19937 rng(3), rng2(3);
  EXPECT_LE(CompareLayer(*f, 2, rng).max_diff, 1e-4f);
  Result<RecordView> e = f->manager->FaultInjectionEntry(f->id, 2, false, 1);
  ASSERT_TRUE(e.ok());
  e->planes[0][kNope + 1] ^= std::byte{0x40};  // a bf16 RoPE byte's exponent bit
  EXPECT_GT(CompareLayer(*f, 2, rng2).max_diff, 1e-3f);
}

// A token attended to before it is appended (its rows pending, its entries built from the live
// compressor rows) sees exactly what it sees once the manager holds it.
TEST(V4Attention, PendingTokenEqualsAppendedToken) {
  constexpr uint64_t kTokens = 270;
  std::unique_ptr<Fixture> f = MakeFixture("indexer-mxfp4", kTokens);
  ASSERT_NE(f, nullptr);
  const V4Dims dims = *V4Dims::Of(FromJson(kTinyV4));
  std::mt19937 rng(4);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  uint64_t compared = 0;
  for (uint64_t p = 0; p < kTokens; ++p) {
    const bool check = p < 20 || (p + 1) % 128 == 0 || p % 29 == 0;
    std::vector<std::vector<float>> before(4);
    std::vector<std::vector<uint64_t>> selected_before(4);
    std::vector<float> q(kH * kD), sink(kH), iq(4 * kIdx, 0.5f), iw(4, 1.0f);
    for (float& x : iq) x = n01(rng);
    for (float& x : q) x = n01(rng);
    for (float& x : sink) x = n01(rng);
    for (uint32_t layer = 0; check && layer < 4; ++layer) {
      V4PagedLayer pages = *V4PagedLayer::Of(*f->manager, f->id, layer);
      std::vector<std::byte> row(584), entry, ientry;
      ASSERT_TRUE(EncodeV4WindowRow(f->raw.kv.at(layer)[p], row).ok());
      const uint32_t ratio = RatioOf(layer);
      if (ratio != 0 && (p + 1) % ratio == 0) {
        for (bool indexer : {false, true}) {
          if (indexer && ratio != 4) continue;
          // The live rows, then the token's own.
          const auto& own = (indexer ? f->raw.istate : f->raw.state).at(layer)[p];
          std::vector<float> rows(pages.state_rows(indexer).begin(), pages.state_rows(indexer).end());
          ASSERT_EQ(rows.size(), (p - pages.state_begin()) * own.size());
          rows.insert(rows.end(), own.begin(), own.end());
          std::vector<float> e(indexer ? kIdx : kD);
          ASSERT_TRUE(V4CompressEntry(CompressorOf(f->raw, layer, indexer), (p + 1) / ratio - 1, rows,
                                      static_cast<uint32_t>(own.size()), e)
                          .ok());
          const RecordFormat& fmt = indexer ? *f->indexer_format : *f->main_format;
          std::vector<std::byte>& bytes = indexer ? ientry : entry;
          bytes.resize(fmt.record_bytes());
          RecordView v;
          v.plane_count = fmt.plane_count();
          v.planes[0] = std::span(bytes).first(fmt.plane_bytes(0));
          if (v.plane_count == 2) v.planes[1] = std::span(bytes).subspan(fmt.plane_bytes(0));
          ASSERT_TRUE(EncodeV4Entry(e, fmt, v).ok());
        }
      }
      ASSERT_TRUE(pages.SetPending(V4Pending{row, entry, ientry}).ok()) << layer << " " << p;
      if (ratio == 4) {
        ASSERT_TRUE(V4IndexerSelect(pages, IndexerQuery{iq, iw}, dims.indexer, &selected_before[layer], nullptr).ok());
      }
      std::vector<uint64_t> entries;
      for (uint64_t e = 0; ratio != 0 && e < pages.entries(); ++e) entries.push_back(e);
      before[layer].resize(kH * kD);
      const Status st = V4Attend(pages, entries, q, sink, dims, ThetaOf(layer), before[layer], nullptr);
      ASSERT_TRUE(st.ok()) << st.ToString() << " " << layer << " " << p;
    }
    ASSERT_TRUE(AppendOne(*f, p).ok());
    for (uint32_t layer = 0; check && layer < 4; ++layer) {
      const V4PagedLayer pages = *V4PagedLayer::Of(*f->manager, f->id, layer);
      std::vector<uint64_t> entries;
      for (uint64_t e = 0; RatioOf(layer) != 0 && e < pages.entries(); ++e) entries.push_back(e);
      std::vector<float> after(kH * kD);
      ASSERT_TRUE(V4Attend(pages, entries, q, sink, dims, ThetaOf(layer), after, nullptr).ok());
      EXPECT_EQ(before[layer], after) << "layer " << layer << " position " << p;
      if (RatioOf(layer) == 4) {
        std::vector<uint64_t> selected;
        ASSERT_TRUE(V4IndexerSelect(pages, IndexerQuery{iq, iw}, dims.indexer, &selected, nullptr).ok());
        EXPECT_EQ(selected_before[layer], selected) << "layer " << layer << " position " << p;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 100u);
  // A pending entry is refused when the token completes no group, and needed when it does.
  const V4PagedLayer hca = *V4PagedLayer::Of(*f->manager, f->id, 2);
  std::vector<std::byte> row(584), entry(584);
  V4PagedLayer copy = hca;
  EXPECT_EQ(copy.SetPending(V4Pending{row, entry, {}}).field(), "entry");
  EXPECT_EQ(copy.SetPending(V4Pending{std::span(row).first(10), {}, {}}).field(), "window_row");
}

// The compressor's pooled entry, before quantization, against the definition in double.
TEST(V4Attention, CompressEntryMatchesDefinitionInDouble) {
  const Raw raw = MakeRaw(256, 5);
  for (uint32_t layer : {1u, 2u}) {
    const uint32_t ratio = RatioOf(layer), coff = Coff(ratio);
    for (uint64_t g : {uint64_t{0}, uint64_t{1}}) {
      const uint64_t first = (coff == 2 && g > 0) ? (g - 1) * ratio : g * ratio;
      std::vector<float> rows;
      for (uint64_t t = first; t < (g + 1) * ratio; ++t)
        rows.insert(rows.end(), raw.state.at(layer)[t].begin(), raw.state.at(layer)[t].end());
      std::vector<float> got(kD);
      ASSERT_TRUE(V4CompressEntry(CompressorOf(raw, layer, false), g, rows, 2 * coff * kD, got).ok());
      std::vector<double> e(kD);
      for (uint32_t c = 0; c < kD; ++c) {
        double num = 0, den = 0;
        for (uint64_t t = first; t < (g + 1) * ratio; ++t) {
          const bool prev = t < g * ratio;
          const uint32_t col = (coff == 2 && !prev) ? kD + c : c;
          const double w = std::exp(double{raw.state.at(layer)[t][coff * kD + col]});
          num += w * raw.state.at(layer)[t][col];
          den += w;
        }
        e[c] = num / den;
      }
      double ms = 0;
      for (double v : e) ms += v * v;
      for (uint32_t i = 0; i < kD; ++i) e[i] = e[i] / std::sqrt(ms / kD + 1e-6) * raw.norm.at(layer)[i];
      for (uint32_t i = 0; i < kRope / 2; ++i) {
        const double angle = static_cast<double>(g * ratio) * std::pow(kCompressTheta, -2.0 * i / kRope);
        const std::complex<double> z =
            std::complex<double>(e[kNope + 2 * i], e[kNope + 2 * i + 1]) * std::polar(1.0, angle);
        e[kNope + 2 * i] = z.real();
        e[kNope + 2 * i + 1] = z.imag();
      }
      for (uint32_t i = 0; i < kD; ++i) EXPECT_NEAR(got[i], e[i], 1e-4 * std::max(1.0, std::fabs(e[i]))) << i;
    }
  }
}

TEST(V4Attention, HadamardIsTheSylvesterMatrix) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(128);
  for (float& v : x) v = n01(rng);
  std::vector<float> y = x;
  ASSERT_TRUE(HadamardTransform(y).ok());
  for (uint32_t j = 0; j < 128; ++j) {
    double s = 0;
    for (uint32_t i = 0; i < 128; ++i) s += (std::popcount(i & j) % 2 == 0 ? 1.0 : -1.0) * x[i];
    EXPECT_NEAR(y[j], s / std::sqrt(128.0), 1e-5);
  }
  std::vector<float> odd(96);
  EXPECT_EQ(HadamardTransform(odd).field(), "x");
}

TEST(V4Attention, Fp4RoundingAndMxfp4RecordAgree) {
  std::mt19937 rng(2);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(128);
  for (float& v : x) v = 3.0f * n01(rng);
  x[40] = 0.0f;
  std::vector<float> rounded = x;
  ASSERT_TRUE(RoundFp4Blocks(rounded).ok());
  std::vector<std::byte> rec(68);
  ASSERT_TRUE(QuantizeIndexerMxfp4(x, rec).ok());
  std::vector<float> back(128);
  ASSERT_TRUE(DequantizeIndexerMxfp4(rec, back).ok());
  EXPECT_EQ(back, rounded);
  // Each block's scale is a power of two >= amax/6, so values land on e2m1 x scale within half a
  // step of the largest (2 x scale / 2) and nothing saturates.
  for (size_t b = 0; b < 128; b += 32) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = DecodeUE8M0(std::to_integer<uint8_t>(rec[64 + b / 32]));
    EXPECT_GE(s * 6.0f, amax);
    EXPECT_LT(s * 3.0f, amax);
    for (size_t i = b; i < b + 32; ++i) EXPECT_LE(std::fabs(rounded[i] - x[i]), s) << i;
  }
  EXPECT_EQ(rounded[40], 0.0f);
  std::vector<float> bad(100);
  EXPECT_EQ(RoundFp4Blocks(bad).field(), "x");
  EXPECT_EQ(QuantizeIndexerMxfp4(x, std::span(rec).first(60)).field(), "record");
}

TEST(V4Attention, RefusesWhatItCannotRead) {
  std::unique_ptr<Fixture> f = MakeFixture("indexer-mxfp4", 40);
  ASSERT_NE(f, nullptr);
  for (uint64_t p = 0; p < 40; ++p) ASSERT_TRUE(AppendOne(*f, p).ok());
  const V4Dims dims = *V4Dims::Of(FromJson(kTinyV4));
  EXPECT_EQ(V4PagedLayer::Of(*f->manager, f->id, 9).status().field(), "layer");
  const V4PagedLayer swa = *V4PagedLayer::Of(*f->manager, f->id, 0);
  const V4PagedLayer hca = *V4PagedLayer::Of(*f->manager, f->id, 2);
  std::vector<float> q(kH * kD), sink(kH), out(kH * kD), row(kD);
  const std::vector<uint64_t> one{0};
  EXPECT_EQ(V4Attend(swa, one, q, sink, dims, kSwaTheta, out, nullptr).field(), "entries");
  EXPECT_EQ(V4Attend(swa, {}, std::span(q).first(10), sink, dims, kSwaTheta, out, nullptr).field(), "q");
  EXPECT_EQ(V4Attend(swa, {}, q, std::span(sink).first(1), dims, kSwaTheta, out, nullptr).field(), "sink");
  EXPECT_EQ(hca.ReadEntry(0, row, nullptr).field(), "entry");      // 40 tokens: no 128-group complete
  EXPECT_EQ(swa.ReadWindow(3, row, nullptr).field(), "position");  // left the 16-token window
  std::vector<uint64_t> sel;
  std::vector<float> iq(4 * kIdx), w(4);
  EXPECT_EQ(V4IndexerSelect(hca, IndexerQuery{iq, w}, dims.indexer, &sel, nullptr).field(), "indexer-format");
  EXPECT_EQ(V4Dims::Of(testing::Preset("deepseek-v3")).status().field(), "model");
  // AsOf: within the request's tokens, whole rows, no more than the window.
  std::vector<std::byte> rows(584 * 2);
  EXPECT_EQ(V4PagedLayer::AsOf(*f->manager, f->id, 2, 41, rows).status().field(), "tokens");
  EXPECT_EQ(V4PagedLayer::AsOf(*f->manager, f->id, 2, 20, std::span(rows).first(100)).status().field(), "window_rows");
  std::vector<std::byte> too_many(584 * 17);
  EXPECT_EQ(V4PagedLayer::AsOf(*f->manager, f->id, 2, 20, too_many).status().field(), "window_rows");
  Result<V4PagedLayer> as_of = V4PagedLayer::AsOf(*f->manager, f->id, 1, 20, rows);
  ASSERT_TRUE(as_of.ok());
  EXPECT_EQ(as_of->entries(), 5u);  // 20 tokens at ratio 4, though the request holds 40
  EXPECT_EQ(as_of->window_begin(), 18u);
}

}  // namespace
}  // namespace tessera
