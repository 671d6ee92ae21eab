// The V4 reference decode (v4_attention.h) per token and layer, as page bytes read per second,
// beside memcpy of the same number of bytes in the same run (the bandwidth baseline). tiny-v4's
// attention geometry (ADR 0018) at a 4,096-token context: SWA (16 window rows), HCA (16 rows +
// 32 entries), CSA (indexer scan of 1,024 entries + 16 rows + the top 8).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/v4_attention.h"

#include "bench_support.h"

namespace tessera {
namespace {

constexpr uint64_t kContext = 4096;
constexpr char kTinyV4[] = R"({"model_type": "deepseek_v4", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "sliding_window": 16, "compress_ratios": [0, 4, 128, 4], "index_n_heads": 4, "index_head_dim": 128,
    "index_topk": 8, "num_nextn_predict_layers": 0, "max_position_embeddings": 131072})";

struct Setup {
  std::unique_ptr<RequestManager> manager;
  RequestId id;
  V4Dims dims;
  std::vector<float> q, sink, iq, iw;
};

// One request of kContext tokens with random rows; entries built by the reference compressor.
Setup& Shared() {
  static Setup* shared = [] {
    auto* s = new Setup();
    Geometry g = *GeometryFromConfigJson(kTinyV4, "bench");
    s->dims = *V4Dims::Of(g);
    ManagerOptions o;
    o.kv_format = "v4-fp8";
    o.indexer_format = "indexer-mxfp4";
    o.capacity_blocks = kContext / 256 + 2;
    s->manager = *RequestManager::Create(g, o);
    std::mt19937 rng(1);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> norm(512, 1.0f), inorm(128, 1.0f);
    KvWriters w;
    w.window = [&](uint32_t, uint64_t, std::span<std::byte> row) {
      std::vector<float> kv(512);
      for (float& x : kv) x = n01(rng);
      bench::OrDie(EncodeV4WindowRow(kv, row), "window row");
    };
    w.state = [&](uint32_t, bool, uint64_t, std::span<float> row) {
      for (float& x : row) x = n01(rng);
    };
    const RequestManager* m = s->manager.get();
    w.compress = [&, m](uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                        const RecordView& rec) {
      const uint32_t ratio = layer == 2 ? 128 : 4;
      V4Compressor c{ratio, indexer ? 128u : 512u, 64, 160000.0, 1e-6f, indexer ? inorm : norm, indexer};
      std::vector<float> e(c.dim);
      bench::OrDie(V4CompressEntry(c, group, rows, row_floats, e), "compress entry");
      for (const StateLayer& l : m->states()->layers()) {
        if (l.layer == layer) {
          bench::OrDie(
              EncodeV4Entry(e, m->pool().groups()[static_cast<size_t>(indexer ? l.igroup : l.group)].format, rec),
              "encode entry");
        }
      }
    };
    s->id = s->manager->Admit(std::span<const uint32_t>(), RequestSpec{})->id;
    std::vector<uint32_t> tokens(kContext, 1);
    bench::OrDie(s->manager->AllocateSlots(s->id, kContext), "slots");
    bench::OrDie(s->manager->Append(s->id, tokens, w), "append");
    for (size_t n : {size_t{4 * 512}, size_t{4}, size_t{4 * 128}, size_t{4}}) {
      std::vector<float> v(n);
      for (float& x : v) x = n01(rng);
      if (s->q.empty()) {
        s->q = v;
      } else if (s->sink.empty()) {
        s->sink = v;
      } else if (s->iq.empty()) {
        s->iq = v;
      } else {
        s->iw = v;
      }
    }
    return s;
  }();
  return *shared;
}

void RunLayer(benchmark::State& state, uint32_t layer) {
  Setup& s = Shared();
  std::vector<float> out(4 * 512);
  AttentionCounters c;
  for (auto _ : state) {
    V4PagedLayer pages = *V4PagedLayer::Of(*s.manager, s.id, layer);
    std::vector<uint64_t> entries;
    if (pages.ratio() == 4) {
      if (!bench::Check(state, V4IndexerSelect(pages, IndexerQuery{s.iq, s.iw}, s.dims.indexer, &entries, &c))) break;
    } else {
      for (uint64_t e = 0; e < pages.entries(); ++e) entries.push_back(e);
    }
    if (!bench::Check(state, V4Attend(pages, entries, s.q, s.sink, s.dims, 160000.0, out, &c))) break;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(c.page_bytes));
  state.counters["page_bytes_per_token"] = static_cast<double>(c.page_bytes) / static_cast<double>(state.iterations());
}

void BM_V4Swa(benchmark::State& state) { RunLayer(state, 0); }
void BM_V4Csa(benchmark::State& state) { RunLayer(state, 1); }
void BM_V4Hca(benchmark::State& state) { RunLayer(state, 2); }

// The baseline: memcpy of 1 MiB, bytes per second.
void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> a(1 << 20, std::byte{1}), b(1 << 20);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(a.size()));
}

BENCHMARK(BM_Memcpy);
BENCHMARK(BM_V4Swa)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_V4Hca)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_V4Csa)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
