// Tier benchmarks. Baselines measured in the same run on the same file system / memory:
//   disk tier batch put  vs  pwrite of the same bytes + one fdatasync per batch
//   disk tier get        vs  pread of the same bytes (page cache dropped with fadvise first)
//   host tier put/get    vs  memcpy of the same bytes
//
//   cmake --preset release && cmake --build build/release --target tier_bench
//   TESSERA_BENCH_DIR=/path/on/the/disk build/release/bench/tier_bench   (default: build dir)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/host_tier.h"

namespace {

using namespace tessera;

// One DeepSeek-V4-Pro block span over every paged group: 30 x 37,440 + 30 x 8,448 + 31 x 1,728 B.
constexpr size_t kBlock = 30 * 37440 + 30 * 8448 + 31 * 1728;
constexpr int kBlocksPerBatch = 8;
constexpr int kBatches = 16;  // 183 MB a run

std::string BenchDir(const char* name) {
  const char* base = std::getenv("TESSERA_BENCH_DIR");
  std::string dir = std::string(base != nullptr ? base : ".") + "/tessera-bench-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::byte> Block(uint64_t seed) {
  std::vector<std::byte> b(kBlock);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t v = (seed + i) * 0x9e3779b97f4a7c15ULL;
    std::memcpy(b.data() + i, &v, std::min<size_t>(8, b.size() - i));
  }
  return b;
}

void DropCache(const std::string& dir) {
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

void BM_RawPwrite(benchmark::State& state) {
  std::vector<std::byte> block = Block(1);
  for (auto _ : state) {
    state.PauseTiming();
    std::string dir = BenchDir("raw");  // a fresh file each time, as the tier gets
    state.ResumeTiming();
    int fd = ::open((dir + "/raw.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t off = 0;
    for (int b = 0; b < kBatches; ++b) {
      for (int k = 0; k < kBlocksPerBatch; ++k) {
        if (::pwrite(fd, block.data(), block.size(), static_cast<off_t>(off)) < 0) state.SkipWithError("pwrite");
        off += block.size();
      }
      ::fdatasync(fd);
    }
    ::close(fd);
  }
  state.SetBytesProcessed(state.iterations() * kBatches * kBlocksPerBatch * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_RawPwrite)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_DiskTierPut(benchmark::State& state) {
  FsyncPolicy policy = state.range(0) == 0 ? FsyncPolicy::kEveryBatch : FsyncPolicy::kPeriodic;
  std::vector<DiskRecord> batch;
  for (int k = 0; k < kBlocksPerBatch; ++k) batch.push_back(DiskRecord{Hash128{}, 1, Block(static_cast<uint64_t>(k))});
  for (auto _ : state) {
    state.PauseTiming();
    DiskTierOptions o;
    o.dir = BenchDir("tier");
    o.fsync = policy;
    auto t = std::move(DiskTier::Open(o)).value();
    state.ResumeTiming();
    uint64_t key = 1;
    for (int b = 0; b < kBatches; ++b) {
      for (DiskRecord& r : batch) r.key = Hash128{key++, 0};
      if (!t->PutBatch(batch).ok()) state.SkipWithError("put");
    }
    if (!t->Sync().ok()) state.SkipWithError("sync");
  }
  state.SetBytesProcessed(state.iterations() * kBatches * kBlocksPerBatch * static_cast<int64_t>(kBlock));
  state.SetLabel(policy == FsyncPolicy::kEveryBatch ? "fsync per batch" : "fsync periodic");
}
BENCHMARK(BM_DiskTierPut)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_RawPread(benchmark::State& state) {
  std::string dir = BenchDir("rawread");
  std::vector<std::byte> block = Block(1);
  int fd = ::open((dir + "/raw.bin").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  const int n = kBatches * kBlocksPerBatch;
  for (int k = 0; k < n; ++k) (void)::pwrite(fd, block.data(), block.size(), static_cast<off_t>(k * kBlock));
  std::vector<std::byte> buf(kBlock);
  for (auto _ : state) {
    state.PauseTiming();
    DropCache(dir);
    state.ResumeTiming();
    for (int k = 0; k < n; ++k) {
      if (::pread(fd, buf.data(), buf.size(), static_cast<off_t>(k * kBlock)) < 0) state.SkipWithError("pread");
    }
  }
  ::close(fd);
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_RawPread)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_DiskTierGet(benchmark::State& state) {
  DiskTierOptions o;
  o.dir = BenchDir("tierread");
  auto t = std::move(DiskTier::Open(o)).value();
  const int n = kBatches * kBlocksPerBatch;
  for (int k = 0; k < n; ++k) {
    std::vector<DiskRecord> one{DiskRecord{Hash128{static_cast<uint64_t>(k) + 1, 0}, 1, Block(static_cast<uint64_t>(k))}};
    (void)t->PutBatch(one);
  }
  for (auto _ : state) {
    state.PauseTiming();
    DropCache(o.dir);
    state.ResumeTiming();
    for (int k = 0; k < n; ++k) {
      Result<DiskRecord> r = t->Get(Hash128{static_cast<uint64_t>(k) + 1, 0});
      if (!r.ok()) state.SkipWithError("get");
      benchmark::DoNotOptimize(r);
    }
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_DiskTierGet)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> src = Block(3), dst(kBlock);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_Memcpy);

void BM_HostTierPutGet(benchmark::State& state) {
  HostTier t(64ULL * kBlock);
  std::vector<std::byte> src = Block(4);
  uint64_t k = 0;
  for (auto _ : state) {
    if (!t.Put(Hash128{++k, 0}, 1, src).ok()) state.SkipWithError("put");
    Result<std::vector<std::byte>> r = t.Get(Hash128{k, 0});
    benchmark::DoNotOptimize(r);
  }
  // Each iteration moves the block twice (in and out) and checksums it twice.
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_HostTierPutGet);

}  // namespace

BENCHMARK_MAIN();
