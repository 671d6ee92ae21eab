// Appending one token to 1,024 running requests: DeepSeek-V4-Pro (window ring + compressor ring
// bookkeeping, entry placement, block allocation and sealing; no model math, no bytes written)
// beside the same step for DeepSeek-V3 (block manager) in the same run.
//
//   cmake --preset release && cmake --build build/release --target hybrid_bench
//   build/release/bench/hybrid_bench
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "tessera/request_manager.h"

#include "bench_support.h"

namespace {

using namespace tessera;
using tessera::bench::Check;

constexpr uint32_t kRequests = 1024;
constexpr uint32_t kPrompt = 1024;

void BM_DecodeStepV3(benchmark::State& state) {
  Geometry g = *LoadPreset("deepseek-v3");
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = kRequests * 40;
  o.region_kind = RegionKind::kUnbacked;
  auto m = *RequestManager::Create(g, o);
  std::vector<RequestId> ids;
  std::vector<uint32_t> prompt(kPrompt);
  for (uint32_t r = 0; r < kRequests; ++r) {
    std::iota(prompt.begin(), prompt.end(), r * kPrompt);
    Admission a = *m->Admit(prompt, RequestSpec{});
    if (!Check(state, m->AllocateSlots(a.id, kPrompt)) || !Check(state, m->Append(a.id, prompt, nullptr))) return;
    ids.push_back(a.id);
  }
  uint32_t token = 1;
  for (auto _ : state) {
    bool ok = true;
    for (RequestId id : ids) {
      if (!Check(state, m->AllocateSlots(id, 1)) ||
          !Check(state, m->Append(id, std::span<const uint32_t>(&token, 1), nullptr))) {
        ok = false;
        break;
      }
    }
    if (!ok) break;
  }
}
BENCHMARK(BM_DecodeStepV3)->Unit(benchmark::kMicrosecond)->Iterations(2000);

void BM_DecodeStepV4Pro(benchmark::State& state) {
  Geometry g = *LoadPreset("deepseek-v4-pro");
  ManagerOptions o;
  o.capacity_blocks = kRequests * 16;
  o.region_kind = RegionKind::kUnbacked;
  o.max_requests = kRequests;
  auto m = *RequestManager::Create(g, o);
  std::vector<RequestId> ids;
  std::vector<uint32_t> prompt(kPrompt);
  KvWriters none;
  for (uint32_t r = 0; r < kRequests; ++r) {
    std::iota(prompt.begin(), prompt.end(), r * kPrompt);
    Admission a = *m->Admit(prompt, RequestSpec{});
    if (!Check(state, m->AllocateSlots(a.id, kPrompt)) || !Check(state, m->Append(a.id, prompt, none))) return;
    ids.push_back(a.id);
  }
  uint32_t token = 1;
  for (auto _ : state) {
    bool ok = true;
    for (RequestId id : ids) {
      if (!Check(state, m->AllocateSlots(id, 1)) ||
          !Check(state, m->Append(id, std::span<const uint32_t>(&token, 1), none))) {
        ok = false;
        break;
      }
    }
    if (!ok) break;
  }
}
BENCHMARK(BM_DecodeStepV4Pro)->Unit(benchmark::kMicrosecond)->Iterations(2000);

}  // namespace

BENCHMARK_MAIN();
