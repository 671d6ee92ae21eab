// Tier benchmarks. Baselines measured in the same run on the same file system / memory:
//   disk tier batch put  vs  pwrite of the same bytes + one fdatasync per batch
//   disk tier get        vs  pread of the same bytes (page cache dropped with fadvise first)
//   host tier put/get    vs  memcpy of the same bytes
//
//   cmake --preset release && cmake --build build/release --target tier_bench
//   TESSERA_BENCH_DIR=/path/on/the/disk build/release/bench/tier_bench   (default: build dir)
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/host_tier.h"
#include "tessera/redis_tier.h"

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

// A local redis-server on a free loopback port for the Redis benchmarks, stopped at exit.
class LocalRedis {
 public:
  static LocalRedis& Get() {
    static LocalRedis r;
    return r;
  }
  int port() const { return up_ ? port_ : -1; }
  ~LocalRedis() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

 private:
  LocalRedis() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    port_ = ntohs(a.sin_port);
    std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 300 && !up_; ++i) {
      redisContext* c = redisConnect("127.0.0.1", port_);
      up_ = c != nullptr && c->err == 0;
      if (c != nullptr) redisFree(c);
      if (!up_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  int port_ = 0;
  pid_t pid_ = -1;
  bool up_ = false;
};

// Baseline: the same bytes SET and GET with hiredis, pipelined, without Tessera's header and checks.
void BM_RawRedisPipeline(benchmark::State& state) {
  int port = LocalRedis::Get().port();
  if (port < 0) {
    state.SkipWithError("redis-server did not start");
    return;
  }
  redisContext* c = redisConnect("127.0.0.1", port);
  std::vector<std::byte> block = Block(5);
  for (auto _ : state) {
    for (int k = 0; k < kBlocksPerBatch; ++k) {
      std::string key = "raw:" + std::to_string(k);
      redisAppendCommand(c, "SET %b %b", key.data(), key.size(), block.data(), block.size());
    }
    for (int k = 0; k < kBlocksPerBatch; ++k) {
      void* r = nullptr;
      redisGetReply(c, &r);
      freeReplyObject(r);
    }
    for (int k = 0; k < kBlocksPerBatch; ++k) {
      std::string key = "raw:" + std::to_string(k);
      redisAppendCommand(c, "GET %b", key.data(), key.size());
    }
    for (int k = 0; k < kBlocksPerBatch; ++k) {
      void* r = nullptr;
      redisGetReply(c, &r);
      benchmark::DoNotOptimize(r);
      freeReplyObject(r);
    }
  }
  redisFree(c);
  state.SetBytesProcessed(state.iterations() * 2 * kBlocksPerBatch * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_RawRedisPipeline)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RedisTierBatch(benchmark::State& state) {
  int port = LocalRedis::Get().port();
  if (port < 0) {
    state.SkipWithError("redis-server did not start");
    return;
  }
  RedisTierOptions o;
  o.port = port;
  o.timeout_ms = 5000;
  RedisTier t(o);
  std::vector<DiskRecord> batch;
  std::vector<Hash128> keys;
  for (int k = 0; k < kBlocksPerBatch; ++k) {
    batch.push_back(DiskRecord{Hash128{static_cast<uint64_t>(k) + 1, 9}, 1, Block(5)});
    keys.push_back(batch.back().key);
  }
  for (auto _ : state) {
    if (!t.PutBatch(batch).ok()) state.SkipWithError("put");
    auto got = t.GetBatch(keys);
    if (!got.back().has_value()) state.SkipWithError("get");
    benchmark::DoNotOptimize(got);
  }
  state.SetBytesProcessed(state.iterations() * 2 * kBlocksPerBatch * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_RedisTierBatch)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
