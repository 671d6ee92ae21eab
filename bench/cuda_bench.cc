// The CUDA path on a GPU (ADR 0025), each figure as a ratio to a baseline measured in the same
// run (scripts/device-check.sh runs it and writes the results for docs/PERFORMANCE.md):
//
//   Decode/<format>/<heads>/<tokens>/<batch>: the paged MLA decode's attention kernels (split +
//     combine) over a device pool laid out by the request manager (DeepSeek-V3 / V3.2 geometry:
//     61 layers a block, one layer read), `batch` requests of `tokens` tokens. bytes_per_second =
//     page bytes read (tokens x record bytes, AttentionCounters' convention) / kernel time;
//     hbm_ratio = that / the device-to-device copy bandwidth (read + write bytes) measured in the
//     same benchmark.
//   Promote/<path>: 64 DeepSeek-V3 blocks (all 61 layers of the latent group, 4.5 MB each) from
//     the host tier (tier: GetInto, its checksum verified, into pinned staging) or from verified
//     host spans (spans) into device pool pages; copy_ratio = its throughput / one plain
//     cudaMemcpyAsync of the same bytes from pinned memory.
//
// Without a GPU every benchmark stops with "no CUDA device: <the runtime's reason>".
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/cuda_device.h"
#include "tessera/cuda_plan.h"
#include "tessera/geometry.h"
#include "tessera/host_tier.h"
#include "tessera/request_manager.h"

namespace tessera::cuda {
namespace {

bool NeedDevice(benchmark::State& state) {
  if (DeviceCount() > 0) return true;
  state.SkipWithError(QueryDevice().status().ToString().c_str());
  return false;
}

// A manager whose pool lives in device memory, holding `batch` requests of `tokens` tokens.
struct DevicePages {
  std::unique_ptr<RequestManager> manager;
  std::vector<RequestId> ids;
};
Result<DevicePages> MakeDevicePages(const std::string& model, const std::string& kv_format, uint64_t tokens,
                                    uint32_t batch) {
  InstallDeviceRegions();
  TESSERA_ASSIGN_OR_RETURN(Geometry g, LoadPreset(model));
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = static_cast<uint32_t>(batch * (tokens / 64 + 1) + 1);
  o.max_requests = batch;
  o.region_kind = RegionKind::kDevice;
  DevicePages p;
  TESSERA_ASSIGN_OR_RETURN(p.manager, RequestManager::Create(g, o));
  uint32_t next = 1;
  for (uint32_t b = 0; b < batch; ++b) {
    std::vector<uint32_t> prompt(tokens);
    for (uint32_t& t : prompt) t = next++;
    TESSERA_ASSIGN_OR_RETURN(Admission a, p.manager->Admit(prompt, RequestSpec{}));
    TESSERA_RETURN_IF_ERROR(p.manager->Append(a.id, prompt, KvWriters()));
    p.ids.push_back(a.id);
  }
  const RegionTable& regions = p.manager->pool().regions();
  for (uint32_t r = 0; r < regions.size(); ++r) {
    TESSERA_RETURN_IF_ERROR(FillDeviceRange(regions, BlockHandle{r, 0, regions.region_bytes(r)}, 0));
  }
  return p;
}

void BM_Decode(benchmark::State& state, const std::string& model, const std::string& kv_format) {
  if (!NeedDevice(state)) return;
  const auto heads = static_cast<uint32_t>(state.range(0));
  const auto tokens = static_cast<uint64_t>(state.range(1));
  const auto batch = static_cast<uint32_t>(state.range(2));
  auto pages = MakeDevicePages(model, kv_format, tokens, batch);
  if (!pages.ok()) return state.SkipWithError(pages.status().ToString().c_str());
  MlaDims d = *MlaDims::Of(*LoadPreset(model));
  d.heads = heads;
  auto view = LatentPageView(pages->manager->pool(), 0);
  auto tables = PackBlockTables(*pages->manager, pages->ids);
  auto decoder = MlaDecoder::Create(d);
  if (!view.ok() || !tables.ok() || !decoder.ok()) return state.SkipWithError("setup failed");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> wkv_b(size_t{d.heads} * (d.nope + d.v) * d.latent), q_nope(size_t{batch} * d.heads * d.nope),
      q_pe(size_t{batch} * d.heads * d.rope), out(size_t{batch} * d.heads * d.v);
  for (float& x : wkv_b) x = 0.05f * u(rng);
  for (float& x : q_nope) x = u(rng);
  for (float& x : q_pe) x = u(rng);
  if (!(*decoder)->SetWeights(wkv_b).ok()) return state.SkipWithError("weights");
  const uint64_t base = *pages->manager->pool().regions().DeviceAddress(BlockHandle{view->region, 0, 1});
  Status st = (*decoder)->Decode(*view, base, *tables, q_nope, q_pe, out);
  if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
  auto hbm = MeasureCopyBandwidth(1ull << 30, 5);
  if (!hbm.ok()) return state.SkipWithError(hbm.status().ToString().c_str());
  const double bytes = static_cast<double>(tokens) * batch * view->record_bytes;
  for (auto _ : state) {
    auto seconds = (*decoder)->TimeAttention(20);
    if (!seconds.ok()) return state.SkipWithError(seconds.status().ToString().c_str());
    state.SetIterationTime(*seconds);
    state.counters["decode_GBps"] = bytes / *seconds / 1e9;
  }
  state.counters["hbm_copy_GBps"] = *hbm / 1e9;
  state.counters["hbm_ratio"] = state.counters["decode_GBps"] / (*hbm / 1e9);
  state.counters["splits"] = static_cast<double>((*decoder)->last_plan().items.size());
  state.counters["bytes_per_token"] = view->record_bytes;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"heads", "tokens", "batch"})->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
  b->Args({16, 32768, 4});   // a tensor-parallel-8 rank of DeepSeek-V3
  b->Args({128, 32768, 4});  // all heads on one GPU
  b->Args({16, 131072, 1});
}
BENCHMARK_CAPTURE(BM_Decode, v3_bf16, std::string("deepseek-v3"), std::string("mla-bf16"))->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_Decode, v32_fp8, std::string("deepseek-v3.2"), std::string("fp8_ds_mla"))->Apply(DecodeArgs);

void BM_Promote(benchmark::State& state, bool from_tier) {
  if (!NeedDevice(state)) return;
  constexpr uint32_t kBlocks = 64;
  auto pages = MakeDevicePages("deepseek-v3", "mla-bf16", 64 * kBlocks - 1, 1);
  if (!pages.ok()) return state.SkipWithError(pages.status().ToString().c_str());
  const BlockPool& pool = pages->manager->pool();
  auto view = LatentPageView(pool, 0);
  if (!view.ok()) return state.SkipWithError(view.status().ToString().c_str());
  std::vector<BlockHandle> dst;
  for (BlockId b : pages->manager->BlockTable(pages->ids[0])) dst.push_back(pool.BlockHandleOf(b, view->group));
  const uint64_t block = dst[0].len, total = block * dst.size();
  std::mt19937_64 rng(3);
  std::vector<std::vector<std::byte>> src(dst.size(), std::vector<std::byte>(block));
  std::vector<uint64_t> sums;
  HostTier tier(total + block);
  std::vector<Hash128> keys;
  for (size_t i = 0; i < src.size(); ++i) {
    for (std::byte& x : src[i]) x = static_cast<std::byte>(rng());
    sums.push_back(XXH3_64bits(src[i].data(), src[i].size()));
    keys.push_back(Hash128{i + 1, 7});
    if (!tier.Put(keys.back(), 1, src[i]).ok()) return state.SkipWithError("tier put");
  }
  std::vector<std::span<const std::byte>> spans(src.begin(), src.end());
  auto transfer = DeviceTransfer::Create(16 * block);
  auto plain = DeviceTransfer::Create(total);
  if (!transfer.ok() || !plain.ok()) return state.SkipWithError("staging");
  const uint64_t first = *pool.regions().DeviceAddress(dst[0]);
  double plain_best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = from_tier ? (*transfer)->PromoteFromHostTier(tier, keys, pool.regions(), dst)
                          : (*transfer)->Promote(spans, sums, pool.regions(), dst);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
    state.SetIterationTime(seconds);
    state.counters["promote_GBps"] = static_cast<double>(total) / seconds / 1e9;
    // The baseline: the same bytes in one copy from pinned memory (the pool's blocks of one
    // request are consecutive here, so one range).
    auto p = (*plain)->TimePlainCopy(first, total, true);
    if (!p.ok()) return state.SkipWithError(p.status().ToString().c_str());
    plain_best = std::min(plain_best, *p);
  }
  state.counters["plain_copy_GBps"] = static_cast<double>(total) / plain_best / 1e9;
  state.counters["copy_ratio"] = state.counters["promote_GBps"] / state.counters["plain_copy_GBps"];
  state.SetBytesProcessed(static_cast<int64_t>(total) * state.iterations());
}
BENCHMARK_CAPTURE(BM_Promote, tier, true)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Promote, spans, false)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::cuda

BENCHMARK_MAIN();
