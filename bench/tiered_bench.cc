// The tiered store's round trips, beside memcpy of the same block bytes in the same run.
//
//   BM_BlockMemcpy        memcpy of one pool block (the floor: a promotion copies at least this)
//   BM_HostDemotePromote  the pool evicts a block into a host tier (encode + checksum + copy) and
//                         a prefix hit promotes it back (checksum + identity check + copy)
//   BM_HostPromoteVsMemcpy  a promotion from a host tier (checksum + identity check + one copy into
//                         the pool's pages) against memcpy of the same bytes, interleaved; x_memcpy
//   BM_DiskPromote        a prefix hit promotes a block from a disk tier (page cache warm, as for
//                         a block written moments ago; pread + checksum + identity + copy)
//
// Model: DeepSeek-V3 with fp8_ds_mla records, 64-token blocks (61 layers x 64 x 656 B).
//
//   cmake --preset release && cmake --build build/release --target tiered_bench
//   TESSERA_BENCH_DIR=/path/on/the/disk build/release/bench/tiered_bench   (default: $TMPDIR or /tmp)
#include <benchmark/benchmark.h>

#include "bench_support.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/tier_adapters.h"
#include "tessera/tiered_store.h"

namespace {

using namespace tessera;

struct Fixture {
  std::unique_ptr<RequestManager> m;
  BlockId block;   // a sealed block of a live request
  BlockId target;  // a filling block the promotion writes into
  SealedIdentity id;
  std::vector<uint32_t> tokens;
  ChainLink link;
};

Fixture Make() {
  Fixture f;
  Result<Geometry> g = LoadPreset("deepseek-v3");
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = 4;
  o.hash_key_seed = 1;
  o.content_dedup = false;
  f.m = std::move(*RequestManager::Create(*g, o));
  f.tokens.resize(64);
  std::iota(f.tokens.begin(), f.tokens.end(), 1u);
  Admission a = *f.m->Admit(f.tokens, {});
  tessera::bench::OrDie(f.m->AllocateSlots(a.id, 64), "fixture slots");
  tessera::bench::OrDie(f.m->Append(a.id, f.tokens,
                                    [](uint32_t, uint32_t l, uint64_t p, const RecordView& r) {
                                      for (uint32_t i = 0; i < r.plane_count; ++i)
                                        std::memset(r.planes[i].data(), static_cast<int>((l + p) & 0xff),
                                                    r.planes[i].size());
                                    }),
                        "fixture append");
  f.block = f.m->BlockTable(a.id)[0];
  f.id = f.m->index().IdentityOf(f.block);
  f.link = ChainLink{f.id.key, f.id.parent_key, f.id.domain, f.id.salt, f.id.tokens, f.id.cache_identity};
  // A second request's first (filling) block is the page a promotion writes into.
  std::vector<uint32_t> other(64);
  std::iota(other.begin(), other.end(), 1000u);
  f.target = f.m->BlockTable(f.m->Admit(other, {})->id)[0];
  return f;
}

using tessera::bench::BenchDir;

// The promotion benchmarks write a fetched page into a block of the fixture's manager behind the
// manager's back (the manager itself passes its own pool to Fetch): the const_cast says so.
BlockPool& WritablePool(Fixture& f) { return const_cast<BlockPool&>(f.m->pool()); }  // NOLINT

void BM_BlockMemcpy(benchmark::State& state) {
  Fixture f = Make();
  const BlockPool& pool = f.m->pool();
  std::span<const std::byte> from = pool.Bytes(pool.BlockHandleOf(f.block, 0));
  std::span<std::byte> to = WritablePool(f).MutableBytes(pool.BlockHandleOf(f.target, 0));
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pool.block_bytes()));
}
BENCHMARK(BM_BlockMemcpy);

void BM_HostDemotePromote(benchmark::State& state) {
  Fixture f = Make();
  BlockPool& pool = WritablePool(f);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(8 * pool.block_bytes()));
  auto store = std::move(*TieredStore::Create(pool, {}, std::move(tiers)));
  std::vector<BlockId> target = {f.target};
  for (auto _ : state) {
    store->OnEvicted(pool, f.block, f.id);
    if (store->Probe({&f.link, 1}) != 1 || store->Fetch(pool, {&f.link, 1}, target) != 1) {
      state.SkipWithError("promotion failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pool.block_bytes()));
}
BENCHMARK(BM_HostDemotePromote);

// A prefix hit promotes a block held in a host tier (demoted once, before the timing), against a
// memcpy of the same pool bytes, interleaved: each iteration times a batch of memcpys and a batch
// of promotions (the order alternating); x_memcpy is the median (and range) of their ratios.
void BM_HostPromoteVsMemcpy(benchmark::State& state) {
  Fixture f = Make();
  BlockPool& pool = WritablePool(f);
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MakeHostTier(8 * pool.block_bytes()));
  auto store = std::move(*TieredStore::Create(pool, {}, std::move(tiers)));
  store->OnEvicted(pool, f.block, f.id);
  std::vector<BlockId> target = {f.target};
  std::vector<std::span<const std::byte>> from;
  std::vector<std::span<std::byte>> to;
  for (uint32_t g = 0; g < pool.groups().size(); ++g) {
    from.push_back(pool.Bytes(pool.BlockHandleOf(f.block, g)));
    to.push_back(pool.MutableBytes(pool.BlockHandleOf(f.target, g)));
  }
  constexpr int kReps = 32;
  auto copy_pass = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) {
      for (size_t g = 0; g < from.size(); ++g) std::memcpy(to[g].data(), from[g].data(), from[g].size());
      benchmark::ClobberMemory();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto promote_pass = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) {
      if (store->Probe({&f.link, 1}) != 1 || store->Fetch(pool, {&f.link, 1}, target) != 1) std::abort();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ratios;
  for (auto _ : state) {
    double copy = 0, promote = 0;
    if (ratios.size() % 2 == 0) {
      copy = copy_pass();
      promote = promote_pass();
    } else {
      promote = promote_pass();
      copy = copy_pass();
    }
    ratios.push_back(copy / promote);
    state.SetIterationTime(promote / kReps);
  }
  std::sort(ratios.begin(), ratios.end());
  state.counters["x_memcpy"] = ratios[ratios.size() / 2];
  state.counters["x_memcpy_min"] = ratios.front();
  state.counters["x_memcpy_max"] = ratios.back();
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pool.block_bytes()));
}
BENCHMARK(BM_HostPromoteVsMemcpy)->Iterations(201)->UseManualTime();

void BM_DiskPromote(benchmark::State& state) {
  Fixture f = Make();
  BlockPool& pool = WritablePool(f);
  DiskTierOptions d;
  d.dir = BenchDir("tiered");
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::move(*MakeDiskTier(d, 0)));
  TieredStoreOptions so;
  so.write = WritePolicy::kWriteThrough;
  so.asynchronous = false;
  auto store = std::move(*TieredStore::Create(pool, so, std::move(tiers)));
  store->OnSealed(pool, f.block, f.id);
  std::vector<BlockId> target = {f.target};
  for (auto _ : state) {
    if (store->Probe({&f.link, 1}) != 1 || store->Fetch(pool, {&f.link, 1}, target) != 1) {
      state.SkipWithError("promotion failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pool.block_bytes()));
  store.reset();
  std::filesystem::remove_all(d.dir);
}
BENCHMARK(BM_DiskPromote);

}  // namespace

BENCHMARK_MAIN();
