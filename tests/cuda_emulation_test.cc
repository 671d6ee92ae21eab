// The CUDA decode kernel emulated on the host (ADR 0025): the split kernel's phases (src/cuda/
// phases.h, the functions the kernel calls between its barriers) run for every thread of every
// CTA of a PlanDecode plan, in order, over the pool's host pages addressed as the kernel addresses
// them (LatentPageView, PackBlockTables); then the combine and the weight products. Against the
// CPU reference (MlaDecode, absorbed) within ADR 0017's bound. Shared memory is poisoned with NaN
// before each CTA, so a read of a value no phase wrote shows in the output; under ASan an index
// out of its buffer fails the test. This checks the kernel's indexing and math on machines
// without a GPU; scripts/device-check.sh runs the real kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cuda/phases.h"
#include "tessera/attention.h"
#include "tessera/codec.h"
#include "tessera/cuda_plan.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera::cuda {
namespace {

using testing::Preset;
using testing::RandomFloats;
namespace k = kernels;

TEST(KernelDecode, E4M3MatchesTheCodecForEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float want = DecodeE4M3(static_cast<uint8_t>(c)), got = k::E4M3(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(got, want) << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << c;
    }
  }
}

TEST(KernelDecode, RecordsMatchTheCodecs) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int round = 0; round < 50; ++round) {
    std::vector<float> lat(512), rope(64), got(577), want_lat(512), want_rope(64);
    for (float& x : lat) x = u(rng) * (round % 5 == 0 ? 1e-3f : 1.0f);
    for (float& x : rope) x = u(rng);
    std::vector<std::byte> rec(656);
    ASSERT_TRUE(QuantizeFp8DsMla(lat, rope, rec).ok());
    ASSERT_TRUE(DequantizeFp8DsMla(rec, want_lat, want_rope).ok());
    for (uint32_t v = 0; v < 41; ++v) k::DecodeVector(reinterpret_cast<const uint8_t*>(rec.data()), v, 1, got.data());
    for (int i = 0; i < 512; ++i) ASSERT_EQ(got[i], want_lat[i]) << i;
    for (int i = 0; i < 64; ++i) ASSERT_EQ(got[512 + i], want_rope[i]) << i;

    std::vector<std::byte> bf(1152);
    for (int i = 0; i < 576; ++i) {
      const uint16_t b = FloatToBf16(i < 512 ? lat[i] : rope[i - 512]);
      bf[2 * i] = static_cast<std::byte>(b & 0xff);
      bf[2 * i + 1] = static_cast<std::byte>(b >> 8);
    }
    for (uint32_t v = 0; v < 72; ++v) k::DecodeVector(reinterpret_cast<const uint8_t*>(bf.data()), v, 0, got.data());
    for (int i = 0; i < 576; ++i) {
      ASSERT_EQ(got[i], Bf16ToFloat(FloatToBf16(i < 512 ? lat[i] : rope[i - 512]))) << i;
    }
  }
}

// A host manager with random records in `layer`.
struct Pages {
  std::unique_ptr<RequestManager> manager;
  std::vector<RequestId> ids;
};
Pages MakePages(const Geometry& g, const std::string& kv_format, const std::vector<uint64_t>& lengths, uint32_t layer) {
  uint64_t blocks = 0;
  for (uint64_t n : lengths) blocks += n / 64 + 1;
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = static_cast<uint32_t>(2 * blocks + 2);
  o.max_requests = static_cast<uint32_t>(lengths.size() + 1);
  auto m = RequestManager::Create(g, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  Pages p{std::move(*m), {}};
  std::mt19937 rng(23);
  const RequestManager& mr = *p.manager;
  auto writer = [&](uint32_t group, uint32_t l, uint64_t, const RecordView& view) {
    const RecordFormat& f = mr.pool().groups()[group].format;
    if (l == layer && f.use == FormatUse::kLatent) testing::WriteRandomRecord(f, view.planes[0], rng);
  };
  // A throwaway request first, freed: the batch's blocks are not 0, 1, 2, ... in order.
  std::vector<uint32_t> junk(130, 999999);
  auto j = p.manager->Admit(junk, RequestSpec{});
  EXPECT_TRUE(j.ok()) << j.status().ToString();
  if (!j.ok()) return p;
  p.ids = testing::AdmitPrompts(*p.manager, lengths, KvWriters(writer));
  EXPECT_TRUE(p.manager->Free(j->id).ok());
  return p;
}

struct EmulationCase {
  const char* model;
  const char* kv_format;
  std::vector<uint64_t> lengths;
  uint32_t heads;     // 0: the model's
  uint32_t sm_count;  // small: many splits per request
  double tol;
};
void PrintTo(const EmulationCase& c, std::ostream* os) {
  *os << c.model << " " << c.kv_format << " heads " << (c.heads == 0 ? std::string("all") : std::to_string(c.heads));
}

class KernelEmulation : public ::testing::TestWithParam<EmulationCase> {};

TEST_P(KernelEmulation, MatchesTheCpuReference) {
  const EmulationCase& c = GetParam();
  const Geometry g = Preset(c.model);
  MlaDims d = *MlaDims::Of(g);
  if (c.heads != 0) d.heads = c.heads;
  const uint32_t layer = g.num_layers - 1;
  Pages p = MakePages(g, c.kv_format, c.lengths, layer);
  const BlockPool& pool = p.manager->pool();
  auto view = LatentPageView(pool, layer);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto tables = PackBlockTables(*p.manager, p.ids);
  ASSERT_TRUE(tables.ok()) << tables.status().ToString();
  auto plan = PlanDecode(tables->seq_lens, DecodeShape{d.heads, d.latent, d.rope, view->block_tokens},
                         DeviceLimits{c.sm_count, 2});
  ASSERT_TRUE(plan.ok());
  const size_t B = c.lengths.size(), H = d.heads, L = d.latent;
  const std::vector<float> q_nope = RandomFloats(B * H * d.nope, 1), q_pe = RandomFloats(B * H * d.rope, 2);
  const std::vector<float> wkv_b = RandomFloats(H * (d.nope + d.v) * L, 3, 0.05f);

  // Absorb.
  std::vector<float> q_lat(B * H * L);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t j = 0; j < L; ++j) {
        q_lat[(b * H + h) * L + j] = k::AbsorbOne(q_nope.data(), wkv_b.data(), static_cast<int>(H),
                                                  static_cast<int>(d.nope), static_cast<int>(d.v), static_cast<int>(L),
                                                  static_cast<int>(b), static_cast<int>(h), static_cast<int>(j));
      }
    }
  }
  // Split kernel: every CTA, every phase, every thread.
  std::vector<float> partial(plan->partial_floats, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse(plan->lse_floats, std::numeric_limits<float>::quiet_NaN());
  k::SplitArgs a;
  auto host = pool.regions().ResolveChecked(BlockHandle{view->region, 0, pool.regions().region_bytes(view->region)});
  ASSERT_TRUE(host.ok());
  a.pages = reinterpret_cast<const uint8_t*>(host->data()) + view->layer_offset;
  a.block_stride = view->block_stride;
  a.record_bytes = view->record_bytes;
  a.block_tokens = view->block_tokens;
  a.format = static_cast<uint32_t>(view->format);
  a.table = tables->table.data();
  a.table_stride = tables->stride;
  a.q_lat = q_lat.data();
  a.q_pe = q_pe.data();
  static_assert(sizeof(k::Item) == sizeof(WorkItem));
  std::vector<k::Item> items(plan->items.size());
  std::memcpy(items.data(), plan->items.data(), items.size() * sizeof(k::Item));
  a.items = items.data();
  a.item_count = static_cast<uint32_t>(items.size());
  a.partial = partial.data();
  a.lse = lse.data();
  a.heads = d.heads;
  a.latent = d.latent;
  a.rope = d.rope;
  a.heads_per_cta = plan->heads_per_cta;
  a.head_groups = plan->head_groups;
  a.scale = d.scale();
  a.shared_bytes = plan->shared_bytes;
  std::vector<float> smem(plan->shared_bytes / 4);
  std::vector<float> acc(size_t{k::kThreads} * k::kAccPerThread);
  for (int x = 0; x < static_cast<int>(items.size()); ++x) {
    for (int y = 0; y < static_cast<int>(plan->head_groups); ++y) {
      std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(acc.begin(), acc.end(), 0.0f);
      const k::Smem sm = k::Carve(smem.data(), a);
      ASSERT_LE(sm.alpha + a.heads_per_cta, smem.data() + smem.size()) << "shared memory overrun";
      const k::Cta cta = k::CtaOf(a, x, y);
      for (int t = 0; t < k::kThreads; ++t) k::LoadQuery(a, cta, sm, t);
      for (int t0 = cta.it.begin; t0 < cta.it.end; t0 += k::kTile) {
        const int nt = std::min(k::kTile, cta.it.end - t0);
        for (int t = 0; t < k::kThreads; ++t) k::LoadTile(a, cta, t0, nt, sm, t);
        for (int t = 0; t < k::kThreads; ++t) k::Scores(a, cta, nt, sm, t);
        for (int t = 0; t < k::kThreads; ++t) k::Softmax(cta, nt, sm, t);
        for (int t = 0; t < k::kThreads; ++t) k::Accumulate(a, cta, nt, sm, t, acc.data() + t * k::kAccPerThread);
      }
      for (int t = 0; t < k::kThreads; ++t) k::WritePartial(a, cta, x, sm, t, acc.data() + t * k::kAccPerThread);
    }
  }
  for (float v : partial) ASSERT_FALSE(std::isnan(v)) << "a partial output no CTA wrote";
  // Combine and project.
  std::vector<float> out(B * H * d.v);
  std::vector<float> o(L);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t j = 0; j < L; ++j) {
        o[j] = k::CombineOne(partial.data(), lse.data(), plan->split_offset.data(), static_cast<int>(H),
                             static_cast<int>(L), static_cast<int>(b), static_cast<int>(h), static_cast<int>(j));
      }
      for (size_t i = 0; i < d.v; ++i) {
        const float* w = wkv_b.data() + (h * (d.nope + d.v) + d.nope + i) * L;
        float x = 0.0f;
        for (size_t j = 0; j < L; ++j) x += w[j] * o[j];
        out[(b * H + h) * d.v + i] = x;
      }
    }
  }
  for (size_t b = 0; b < B; ++b) {
    auto pages = PagedLayer::Of(*p.manager, p.ids[b], layer);
    ASSERT_TRUE(pages.ok());
    std::vector<uint64_t> positions(c.lengths[b]);
    for (uint64_t i = 0; i < positions.size(); ++i) positions[i] = i;
    const size_t qn = H * d.nope, qr = H * d.rope, ov = H * d.v;
    std::vector<float> ref(ov);
    const MlaQuery q{std::span(q_nope).subspan(b * qn, qn), std::span(q_pe).subspan(b * qr, qr)};
    ASSERT_TRUE(MlaDecode(*pages, positions, q, wkv_b, d, AttentionForm::kAbsorbed, ref, nullptr).ok());
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < ov; ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(out[b * ov + i]) - ref[i]));
    }
    const int splits = plan->split_offset[b + 1] - plan->split_offset[b];
    std::cout << c.model << " " << c.kv_format << " request " << b << " (" << c.lengths[b] << " tokens, " << splits
              << " splits): max |emulated - cpu| " << max_diff << " (bound " << c.tol * std::max(1.0, max_ref) << ")\n";
    EXPECT_LE(max_diff, c.tol * std::max(1.0, max_ref)) << "request " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KernelEmulation,
                         ::testing::Values(EmulationCase{"tiny-mla", "mla-bf16", {1, 17, 64, 65, 700}, 0, 4, 1e-3},
                                           EmulationCase{"tiny-mla", "fp8_ds_mla", {1, 17, 64, 65, 700}, 0, 4, 5e-3},
                                           EmulationCase{"deepseek-v3", "mla-bf16", {130, 3}, 24, 2, 1e-3},
                                           EmulationCase{"deepseek-v3", "mla-bf16", {129}, 0, 4, 1e-3},
                                           EmulationCase{"deepseek-v3.2", "fp8_ds_mla", {200}, 20, 3, 5e-3}));

}  // namespace
}  // namespace tessera::cuda
