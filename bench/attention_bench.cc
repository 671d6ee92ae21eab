// Reference MLA decode over pages (attention.h): one generated token's attention over every layer
// of a request, as page bytes read per second, against memcpy of the same bytes measured in the
// same run; absorbed and naive side by side.
//
// Pages: tiny-mla geometry (4 layers, 4 heads, the real 512 + 64 latent), random valid records.
// The reference decode is scalar fp32 by design, so the ratio to memcpy says how far it is from
// being bandwidth-bound, not how fast a kernel can be.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tessera/attention.h"
#include "tessera/codec.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"

#include "bench_support.h"

namespace tessera {
namespace {

struct Pages {
  std::unique_ptr<RequestManager> manager;
  RequestId id;
  Geometry g;
  Status status;  // the first failure of the setup (the benchmark checks it)
};

Pages MakePages(const std::string& kv_format, uint64_t n) {
  Pages p;
  p.g = *LoadPreset("tiny-mla");
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = static_cast<uint32_t>(n / 64 + 2);
  p.manager = std::move(*RequestManager::Create(p.g, o));
  std::vector<uint32_t> prompt(n);
  for (uint64_t i = 0; i < n; ++i) prompt[i] = static_cast<uint32_t>(i);
  p.id = p.manager->Admit(prompt, RequestSpec{})->id;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const bool fp8 = kv_format == "fp8_ds_mla";
  auto writer = [&](uint32_t, uint32_t, uint64_t, const RecordView& view) {
    std::vector<float> lat(512), rope(64);
    for (float& x : lat) x = u(rng);
    for (float& x : rope) x = u(rng);
    if (fp8) {
      Status q = QuantizeFp8DsMla(lat, rope, view.planes[0].first(kFp8DsMlaRecordBytes));
      if (p.status.ok()) p.status = std::move(q);
      return;
    }
    std::byte* b = view.planes[0].data();
    for (float x : lat) {
      const uint16_t v = FloatToBf16(x);
      *b++ = static_cast<std::byte>(v & 0xff);
      *b++ = static_cast<std::byte>(v >> 8);
    }
    for (float x : rope) {
      const uint16_t v = FloatToBf16(x);
      *b++ = static_cast<std::byte>(v & 0xff);
      *b++ = static_cast<std::byte>(v >> 8);
    }
  };
  Status appended = p.manager->Append(p.id, prompt, KvWriters(writer));
  if (p.status.ok()) p.status = std::move(appended);
  return p;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Args: context, form (0 absorbed, 1 naive), format (0 mla-bf16, 1 fp8_ds_mla).
void BM_Decode(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const AttentionForm form = state.range(1) == 0 ? AttentionForm::kAbsorbed : AttentionForm::kNaive;
  const std::string format = state.range(2) == 0 ? "mla-bf16" : "fp8_ds_mla";
  Pages p = MakePages(format, n);
  if (!bench::Check(state, p.status)) return;
  const MlaDims d = *MlaDims::Of(p.g);
  const std::vector<float> q_nope = Random(d.heads * d.nope, 1, 1.0f), q_pe = Random(d.heads * d.rope, 2, 1.0f);
  const std::vector<float> wkv_b = Random(size_t{d.heads} * (d.nope + d.v) * d.latent, 3, 0.05f);
  std::vector<float> out(d.heads * d.v);
  std::vector<uint64_t> positions(n);
  for (uint64_t i = 0; i < n; ++i) positions[i] = i;
  std::vector<PagedLayer> layers;
  for (uint32_t l = 0; l < p.g.num_layers; ++l) layers.push_back(*PagedLayer::Of(*p.manager, p.id, l));
  AttentionCounters c;
  for (auto _ : state) {
    for (const PagedLayer& pages : layers) {
      Status st = MlaDecode(pages, positions, MlaQuery{q_nope, q_pe}, wkv_b, d, form, out, &c);
      if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    }
    benchmark::DoNotOptimize(out.data());
  }
  const uint64_t per_token = c.page_bytes / static_cast<uint64_t>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(c.page_bytes));
  state.counters["page_bytes_per_token"] = static_cast<double>(per_token);
  state.counters["flops"] = benchmark::Counter(static_cast<double>(c.flops), benchmark::Counter::kIsRate);
  state.SetLabel(format + " " + std::string(AttentionFormName(form)));
}

// The same page bytes copied (one memcpy of context x record bytes x layers).
void BM_Memcpy(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const uint64_t record = state.range(2) == 0 ? 1152 : kFp8DsMlaRecordBytes;
  const size_t bytes = n * record * 4;
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void Contexts(benchmark::internal::Benchmark* b, bool with_form) {
  for (int64_t fmt : {0, 1}) {
    for (int64_t n : {256, 1024, 4096}) {
      if (with_form) {
        b->Args({n, 0, fmt});
        b->Args({n, 1, fmt});
      } else {
        b->Args({n, 0, fmt});
      }
    }
  }
}

BENCHMARK(BM_Memcpy)->Apply([](benchmark::internal::Benchmark* b) { Contexts(b, false); });
BENCHMARK(BM_Decode)
    ->Apply([](benchmark::internal::Benchmark* b) { Contexts(b, true); })
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
