// Tier benchmarks. Baselines measured in the same run on the same file system / memory:
//   disk tier batch put  vs  pwrite of the same bytes + one fdatasync per batch
//   BM_DiskPutVsRaw, BM_DiskGetVsPread, BM_DiskReadIntoVsPread: the comparisons interleaved (raw, tier, tier,
//   raw, ...) in one benchmark, reporting the median and range of the ratios (x_raw, x_pread);
//   the reads also against preads each followed by a tag of the bytes (x_pread_tag, x_tag_floor:
//   the floor authentication sets, ADR 0050)
//   disk tier get        vs  pread of the same bytes (page cache dropped with fadvise first)
//   host tier put/get    vs  memcpy of the same bytes
//   MACs over one 2.5-MB record (OpenSSL EVP_MAC, RecordMac; Poly1305 over a 1.4-MB span in one
//   update or split at a multiple of 128 bytes, BM_Poly1305Split) vs memcpy of the same bytes
//   io_uring (queue depth 8 and 32, buffered and O_DIRECT) vs pread/pwrite of the same
//   4 KiB-aligned records (BM_Io*; each prints its ratio to the pread/pwrite baseline as x_sync)
//
//   cmake --preset release && cmake --build build/release --target tier_bench
//   TESSERA_BENCH_DIR=/path/on/the/disk build/release/bench/tier_bench   (default: $TMPDIR or /tmp)
#include <arpa/inet.h>
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <liburing.h>
#include <netinet/in.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bench_support.h"
#include "redis_launcher.h"

#include <chrono>
#include <ctime>
#include <thread>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/disk_tier.h"
#include "tessera/host_tier.h"
#include "tessera/record_mac.h"
#include "tessera/redis_tier.h"

namespace {

using namespace tessera;

// One DeepSeek-V4-Pro block span over every paged group: 30 x 37,440 + 30 x 8,448 + 31 x 1,728 B.
constexpr size_t kBlock = 30 * 37440 + 30 * 8448 + 31 * 1728;
constexpr int kBlocksPerBatch = 8;
constexpr int kBatches = 16;  // 183 MB a run

using tessera::bench::BenchDir;

std::vector<std::byte> Block(uint64_t seed) {
  std::vector<std::byte> b(kBlock);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t v = (seed + i) * 0x9e3779b97f4a7c15ULL;
    std::memcpy(b.data() + i, &v, std::min<size_t>(8, b.size() - i));
  }
  return b;
}

// A RecordMac under a fixed key, as the disk tier computes its tags.
Result<RecordMac> BenchMac() { return RecordMac::Create(std::vector<std::byte>(32, std::byte{0x42}), "bench"); }

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
  std::vector<TierRecord> batch;
  for (int k = 0; k < kBlocksPerBatch; ++k) batch.push_back(TierRecord{Hash128{}, 1, Block(static_cast<uint64_t>(k))});
  for (auto _ : state) {
    state.PauseTiming();
    DiskTierOptions o;
    o.dir = BenchDir("tier");
    o.fsync = policy;
    auto t = std::move(DiskTier::Open(o)).value();
    state.ResumeTiming();
    uint64_t key = 1;
    for (int b = 0; b < kBatches; ++b) {
      for (TierRecord& r : batch) r.key = Hash128{key++, 0};
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
    std::vector<TierRecord> one{
        TierRecord{Hash128{static_cast<uint64_t>(k) + 1, 0}, 1, Block(static_cast<uint64_t>(k))}};
    if (!tessera::bench::Check(state, t->PutBatch(one))) return;
  }
  for (auto _ : state) {
    state.PauseTiming();
    DropCache(o.dir);
    state.ResumeTiming();
    for (int k = 0; k < n; ++k) {
      Result<TierRecord> r = t->Get(Hash128{static_cast<uint64_t>(k) + 1, 0});
      if (!r.ok()) state.SkipWithError("get");
      benchmark::DoNotOptimize(r);
    }
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_DiskTierGet)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

// ---- Interleaved ratios (ADR 0041): A, B, A, B in one benchmark ------------------------------
//
// Each iteration times the raw baseline and the tier on the same bytes back to back (the order
// alternating), so that both see the same machine; the counters are the median, min and max of
// the per-iteration ratios (tier throughput over raw throughput).

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ReportRatios(benchmark::State& state, std::vector<double> r, const char* name) {
  if (r.empty()) return;
  std::sort(r.begin(), r.end());
  state.counters[std::string(name)] = r[r.size() / 2];
  state.counters[std::string(name) + "_min"] = r.front();
  state.counters[std::string(name) + "_max"] = r.back();
}

// The raw writer with the tier's guarantee under `batch`: pwrite of the same payloads into a fresh
// file, one fdatasync per batch (the tier also writes a 4 KiB header slot and padding per record).
double RawWritePass(const std::vector<TierRecord>& batch) {
  const std::string dir = BenchDir("raw-ab");
  const auto t0 = std::chrono::steady_clock::now();
  int fd = ::open((dir + "/raw.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  uint64_t off = 0;
  for (int b = 0; b < kBatches; ++b) {
    for (const TierRecord& r : batch) {
      if (::pwrite(fd, r.payload.data(), r.payload.size(), static_cast<off_t>(off)) < 0) std::abort();
      off += r.payload.size();
    }
    ::fdatasync(fd);
  }
  ::close(fd);
  return Seconds(t0);
}

double TierWritePass(std::vector<TierRecord>& batch) {
  DiskTierOptions o;
  o.dir = BenchDir("tier-ab");
  o.fsync = FsyncPolicy::kEveryBatch;
  auto t = std::move(DiskTier::Open(o)).value();
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t key = 1;
  for (int b = 0; b < kBatches; ++b) {
    for (TierRecord& r : batch) r.key = Hash128{key++, 0};
    tessera::bench::OrDie(t->PutBatch(batch), "put");
  }
  return Seconds(t0);
}

void BM_DiskPutVsRaw(benchmark::State& state) {
  std::vector<TierRecord> batch;
  for (int k = 0; k < kBlocksPerBatch; ++k) batch.push_back(TierRecord{Hash128{}, 1, Block(static_cast<uint64_t>(k))});
  std::vector<double> ratios;
  for (auto _ : state) {
    double raw = 0, tier = 0;
    if (ratios.size() % 2 == 0) {
      raw = RawWritePass(batch);
      tier = TierWritePass(batch);
    } else {
      tier = TierWritePass(batch);
      raw = RawWritePass(batch);
    }
    ratios.push_back(raw / tier);
    state.SetIterationTime(tier);
  }
  ReportRatios(state, ratios, "x_raw");
  state.SetBytesProcessed(state.iterations() * kBatches * kBlocksPerBatch * static_cast<int64_t>(kBlock));
  state.SetLabel("fsync per batch vs pwrite + fdatasync per batch");
}
BENCHMARK(BM_DiskPutVsRaw)->Unit(benchmark::kMillisecond)->Iterations(15)->UseManualTime();

// Reads with the page cache dropped before each pass (cold), or warm (the pages just read):
// DiskTier::Get (a fresh payload vector per record), or DiskTier::ReadInto one reused buffer, as
// the raw pass preads into one (the path a promotion into a pool block takes).
// A third pass, the least any authenticated reader does: the raw preads, each followed by a
// RecordMac tag of the bytes read (the tier's MAC, computed here, not checked). x_pread_tag is
// its speed over pread (what the tag costs a reader with nothing else to do: the ceiling for
// x_pread); x_tag_floor the tier's speed over it (1: the tier adds nothing to the tag's cost).
void DiskReadVsPread(benchmark::State& state, bool into) {
  const bool cold = state.range(0) == 0;
  const int n = kBatches * kBlocksPerBatch;
  std::string raw_dir = BenchDir("rawread-ab");
  int fd = ::open((raw_dir + "/raw.bin").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  DiskTierOptions o;
  o.dir = BenchDir("tierread-ab");
  auto t = std::move(DiskTier::Open(o)).value();
  for (int k = 0; k < n; ++k) {
    std::vector<std::byte> b = Block(static_cast<uint64_t>(k));
    (void)::pwrite(fd, b.data(), b.size(), static_cast<off_t>(static_cast<uint64_t>(k) * kBlock));
    std::vector<TierRecord> one{TierRecord{Hash128{static_cast<uint64_t>(k) + 1, 0}, 1, std::move(b)}};
    tessera::bench::OrDie(t->PutBatch(one), "put");
  }
  Result<RecordMac> tag_mac = BenchMac();
  if (!tag_mac.ok()) {
    state.SkipWithError(tag_mac.status().ToString().c_str());
    return;
  }
  std::vector<std::byte> buf(kBlock);
  // The raw preads; with `tag`, each record's bytes tagged after its read.
  auto pread_pass = [&](bool tag) {
    if (cold) DropCache(raw_dir);
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k) {
      if (::pread(fd, buf.data(), buf.size(), static_cast<off_t>(static_cast<uint64_t>(k) * kBlock)) < 0) std::abort();
      if (tag) {
        RecordMac::Tag mac_tag = tag_mac->Compute(RecordMac::Nonce{}, {buf});
        benchmark::DoNotOptimize(mac_tag);
      }
      benchmark::ClobberMemory();
    }
    return Seconds(t0);
  };
  std::vector<std::byte> into_buf(into ? kBlock : 0);
  const std::span<std::byte> whole(into_buf);
  auto tier_pass = [&] {
    if (cold) DropCache(o.dir);
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k) {
      const Hash128 key{static_cast<uint64_t>(k) + 1, 0};
      if (into) {
        if (!t->ReadInto(key, {&whole, 1}, nullptr).ok()) std::abort();
        benchmark::ClobberMemory();
        continue;
      }
      Result<TierRecord> r = t->Get(key);
      if (!r.ok()) std::abort();
      benchmark::DoNotOptimize(r);
    }
    return Seconds(t0);
  };
  std::vector<double> ratios, tag_ratios, floor_ratios;
  for (auto _ : state) {
    double raw = 0, tier = 0, tag = 0;
    if (ratios.size() % 2 == 0) {
      raw = pread_pass(false);
      tier = tier_pass();
      tag = pread_pass(true);
    } else {
      tag = pread_pass(true);
      tier = tier_pass();
      raw = pread_pass(false);
    }
    ratios.push_back(raw / tier);
    tag_ratios.push_back(raw / tag);
    floor_ratios.push_back(tag / tier);
    state.SetIterationTime(tier);
  }
  ::close(fd);
  ReportRatios(state, ratios, "x_pread");
  ReportRatios(state, tag_ratios, "x_pread_tag");
  ReportRatios(state, floor_ratios, "x_tag_floor");
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(kBlock));
  state.SetLabel(cold ? "page cache dropped" : "page cache warm");
}
void BM_DiskGetVsPread(benchmark::State& state) { DiskReadVsPread(state, false); }
void BM_DiskReadIntoVsPread(benchmark::State& state) { DiskReadVsPread(state, true); }
BENCHMARK(BM_DiskGetVsPread)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(15)->UseManualTime();
BENCHMARK(BM_DiskReadIntoVsPread)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(15)->UseManualTime();

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> src = Block(3), dst(kBlock);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_Memcpy);

// The host tier's baseline inside `--benchmark_filter=Host`: the same memcpy as BM_Memcpy.
// x_memcpy (below) is on thread CPU time, as bytes_per_second is for these benchmarks.
double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
double g_host_memcpy_bps = 0;
void BM_HostMemcpyBaseline(benchmark::State& state) {
  std::vector<std::byte> src = Block(3), dst(kBlock);
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  const double s = ThreadCpuSeconds() - t0;
  g_host_memcpy_bps = static_cast<double>(state.iterations()) * static_cast<double>(kBlock) / s;
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_HostMemcpyBaseline);

// What an arena without checksums costs: copy the block into the next of 64 block-sized slots
// (91 MB, past the last-level cache, touched before the timing starts) and back out.
void BM_HostArenaCopyFloor(benchmark::State& state) {
  std::vector<std::byte> src = Block(4), dst(kBlock), arena(64 * kBlock);
  size_t slot = 0;
  for (auto _ : state) {
    std::byte* p = arena.data() + slot * kBlock;
    std::memcpy(p, src.data(), kBlock);
    std::memcpy(dst.data(), p, kBlock);
    benchmark::ClobberMemory();
    slot = (slot + 1) % 64;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
}
BENCHMARK(BM_HostArenaCopyFloor);

// Put one block, then get it back: into caller memory (GetInto, as the tiered store does) or, for
// comparison, as a fresh vector (Get). 64 blocks of capacity, filled before the timing starts (a
// long-lived tier: its arena pages have been touched once), so every timed Put evicts the least
// recent block and reuses its arena range.
void BM_HostTierPutGet(benchmark::State& state) {
  const bool into = state.range(0) == 0;
  HostTier t(64ULL * kBlock);
  std::vector<std::byte> src = Block(4), dst(kBlock);
  uint64_t k = 0;
  for (int i = 0; i < 64; ++i) {
    if (!t.Put(Hash128{++k, 0}, 1, src).ok()) state.SkipWithError("fill");
  }
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    if (!t.Put(Hash128{++k, 0}, 1, src).ok()) state.SkipWithError("put");
    if (into) {
      if (!t.GetInto(Hash128{k, 0}, dst).ok()) state.SkipWithError("get");
      benchmark::ClobberMemory();
    } else {
      Result<std::vector<std::byte>> r = t.Get(Hash128{k, 0});
      benchmark::DoNotOptimize(r);
    }
  }
  const double s = ThreadCpuSeconds() - t0;
  // Each iteration moves the block twice (in and out) and checksums it twice.
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
  if (g_host_memcpy_bps > 0) {
    state.counters["x_memcpy"] =
        static_cast<double>(state.iterations()) * static_cast<double>(kBlock) / s / g_host_memcpy_bps;
  }
  state.SetLabel(into ? "GetInto (caller memory)" : "Get (fresh vector)");
}
BENCHMARK(BM_HostTierPutGet)->Arg(0)->Arg(1);

// --- MACs over one record (ADR 0010: why RecordMac is Poly1305) -------------------------------
//
// One DeepSeek-V3 fp8_ds_mla block (61 layers x 64 tokens x 656 B = 2,561,024 B) through each
// OpenSSL EVP_MAC the disk tier could have used (the key set for every record, as a one-time key
// must be) and through RecordMac itself (HMAC-SHA256 of the nonce, then Poly1305), against memcpy
// of the same bytes first in the same run. x_memcpy is on thread CPU time, as bytes_per_second is.
//   build/release/bench/tier_bench --benchmark_filter=Mac
constexpr size_t kMacRecord = size_t{61} * 64 * 656;

double g_mac_memcpy_bps = 0;
void BM_MacMemcpyBaseline(benchmark::State& state) {
  std::vector<std::byte> src(kMacRecord, std::byte{7}), dst(kMacRecord);
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  const double s = ThreadCpuSeconds() - t0;
  g_mac_memcpy_bps = static_cast<double>(state.iterations()) * static_cast<double>(kMacRecord) / s;
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kMacRecord));
}
BENCHMARK(BM_MacMemcpyBaseline);

void ReportMacRatio(benchmark::State& state, double cpu_seconds) {
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kMacRecord));
  if (g_mac_memcpy_bps > 0) {
    state.counters["x_memcpy"] =
        static_cast<double>(state.iterations()) * static_cast<double>(kMacRecord) / cpu_seconds / g_mac_memcpy_bps;
  }
}

struct MacCase {
  const char* label;
  const char* algorithm;
  const char* param;  // the digest or cipher parameter's name, or null
  const char* value;
  size_t key_bytes;
};
constexpr MacCase kMacs[] = {
    {"POLY1305", "POLY1305", nullptr, nullptr, 32},
    {"GMAC AES-256-GCM", "GMAC", OSSL_MAC_PARAM_CIPHER, "AES-256-GCM", 32},
    {"SIPHASH-2-4", "SIPHASH", nullptr, nullptr, 16},
    {"HMAC-SHA256", "HMAC", OSSL_MAC_PARAM_DIGEST, "SHA256", 32},
    {"BLAKE2BMAC", "BLAKE2BMAC", nullptr, nullptr, 32},
};

void BM_EvpMac(benchmark::State& state) {
  const MacCase& c = kMacs[state.range(0)];
  std::vector<unsigned char> record(kMacRecord, 7), key(c.key_bytes, 0x42), iv(12, 0x24);
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, c.algorithm, nullptr);
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  if (ctx == nullptr) {
    state.SkipWithError("the crypto library lacks this MAC");
    EVP_MAC_free(mac);
    return;
  }
  std::string value = c.value != nullptr ? c.value : "";
  std::vector<OSSL_PARAM> params;
  if (c.param != nullptr) params.push_back(OSSL_PARAM_construct_utf8_string(c.param, value.data(), 0));
  if (std::string_view(c.algorithm) == "GMAC") {
    params.push_back(OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv.data(), iv.size()));
  }
  params.push_back(OSSL_PARAM_construct_end());
  unsigned char out[64];
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    size_t len = 0;
    if (EVP_MAC_init(ctx, key.data(), key.size(), params.data()) != 1 ||
        EVP_MAC_update(ctx, record.data(), record.size()) != 1 || EVP_MAC_final(ctx, out, &len, sizeof out) != 1) {
      state.SkipWithError("EVP_MAC failed");
      break;
    }
    benchmark::DoNotOptimize(out);
  }
  ReportMacRatio(state, ThreadCpuSeconds() - t0);
  state.SetLabel(c.label);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
}
BENCHMARK(BM_EvpMac)->DenseRange(0, std::size(kMacs) - 1);

// Poly1305 through EVP_MAC over one DeepSeek-V4-Pro block span (kBlock, 1,430,208 B: 64 bytes
// past a multiple of 128), (0) in one update, as RecordMac did before ADR 0047, or (1) in two: the
// multiple of 128 bytes, then the rest, as RecordMac does now. OpenSSL 3.0's AVX-512 IFMA code
// runs a whole update at about half speed when its length is 64..127 bytes past a multiple of 128.
// The tag is the same either way. x_memcpy: against BM_MacMemcpyBaseline's bytes per CPU second.
void BM_Poly1305Split(benchmark::State& state) {
  const bool split = state.range(0) == 1;
  std::vector<unsigned char> record(kBlock, 7), key(32, 0x42);
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  if (ctx == nullptr) {
    state.SkipWithError("the crypto library lacks Poly1305");
    EVP_MAC_free(mac);
    return;
  }
  const size_t bulk = split ? record.size() & ~size_t{127} : record.size();
  unsigned char out[16];
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    size_t len = 0;
    if (EVP_MAC_init(ctx, key.data(), key.size(), nullptr) != 1 || EVP_MAC_update(ctx, record.data(), bulk) != 1 ||
        (bulk < record.size() && EVP_MAC_update(ctx, record.data() + bulk, record.size() - bulk) != 1) ||
        EVP_MAC_final(ctx, out, &len, sizeof out) != 1) {
      state.SkipWithError("EVP_MAC failed");
      break;
    }
    benchmark::DoNotOptimize(out);
  }
  const double s = ThreadCpuSeconds() - t0;
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlock));
  if (g_mac_memcpy_bps > 0) {
    state.counters["x_memcpy"] = static_cast<double>(state.iterations()) * kBlock / s / g_mac_memcpy_bps;
  }
  state.SetLabel(split ? "two updates: 128-byte multiple + rest" : "one update");
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
}
BENCHMARK(BM_Poly1305Split)->Arg(0)->Arg(1);

// What the disk tier computes per payload: RecordMac::Compute (a fixed nonce: the MAC alone).
void BM_RecordMac(benchmark::State& state) {
  Result<RecordMac> mac = BenchMac();
  if (!mac.ok()) {
    state.SkipWithError(mac.status().ToString().c_str());
    return;
  }
  std::vector<std::byte> record(kMacRecord, std::byte{7});
  const RecordMac::Nonce nonce{};
  const double t0 = ThreadCpuSeconds();
  for (auto _ : state) {
    RecordMac::Tag tag = mac->Compute(nonce, {record});
    benchmark::DoNotOptimize(tag);
  }
  ReportMacRatio(state, ThreadCpuSeconds() - t0);
}
BENCHMARK(BM_RecordMac);

// --- io_uring vs pread/pwrite ------------------------------------------------------------------
//
// The same bytes as the disk benchmarks above (16 batches of 8 V4-Pro block spans), laid out as
// the disk tier lays them out: each record starts on a 4 KiB boundary and is padded to 4 KiB
// (1,433,600 B), so that O_DIRECT can move it as it is. Every variant moves the padded records.
//   engine: 0 pread/pwrite, one record per call; 1 io_uring, up to `qd` records in flight,
//           submitted in batches (io_uring_submit once per refill), completions reaped as they come
//   direct: O_DIRECT (skipped, with the reason, where the file system refuses it)
// Writes: a fresh file per iteration; `per_batch` 1: fdatasync after every 8 records (the disk
// tier's default policy; in flight never exceeds 8 then), 0: one fdatasync at the end.
// Reads: the page cache is dropped before every iteration (fdatasync + POSIX_FADV_DONTNEED).
// Every benchmark reports x_sync: its throughput over the buffered pread/pwrite variant of the
// same pattern measured earlier in the same run.

constexpr size_t kRec = (kBlock + 4095) / 4096 * 4096;
constexpr int kRecs = kBatches * kBlocksPerBatch;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<std::byte, FreeDeleter>;
AlignedBuf Aligned(size_t n, uint64_t seed) {
  AlignedBuf b(static_cast<std::byte*>(std::aligned_alloc(4096, n)));
  std::vector<std::byte> content = Block(seed);
  std::memcpy(b.get(), content.data(), content.size());
  std::memset(b.get() + content.size(), 0, n - content.size());
  return b;
}

std::string FsName(const std::string& dir) {
  struct statfs f {};
  if (::statfs(dir.c_str(), &f) != 0) return "unknown fs";
  switch (static_cast<unsigned long>(f.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794c7630:
      return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "fs 0x%lx", static_cast<unsigned long>(f.f_type));
      return buf;
    }
  }
}

std::map<std::string, double>& Baselines() {
  static std::map<std::string, double> b;
  return b;
}

struct IoCase {
  bool uring;
  unsigned qd;
  bool direct;
};

std::string Describe(const IoCase& c, const std::string& fs) {
  std::string s = c.uring ? "io_uring qd " + std::to_string(c.qd) : "pread/pwrite";
  return s + (c.direct ? " O_DIRECT" : " buffered") + " (" + fs + ")";
}

// Writes or reads `kRecs` records through the ring, at most `qd` in flight. For writes, a
// non-zero `sync_every` fdatasyncs after each group of that many records completes (and holds
// back the next group until then). Returns an empty string or what failed.
std::string UringRun(io_uring& ring, int fd, bool write, unsigned qd, int sync_every, std::vector<std::byte*>& bufs) {
  int submitted = 0, completed = 0;
  int group_end = sync_every > 0 ? sync_every : kRecs;
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < qd; ++i) free_slots.push_back(i);
  while (completed < kRecs) {
    int queued = 0;
    while (submitted < std::min(group_end, kRecs) && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      unsigned slot = free_slots.back();
      free_slots.pop_back();
      const uint64_t off = static_cast<uint64_t>(submitted) * kRec;
      if (write) {
        io_uring_prep_write(sqe, fd, bufs[0], static_cast<unsigned>(kRec), off);
      } else {
        io_uring_prep_read(sqe, fd, bufs[slot], static_cast<unsigned>(kRec), off);
      }
      io_uring_sqe_set_data64(sqe, slot);
      ++submitted;
      ++queued;
    }
    if (queued > 0 && io_uring_submit(&ring) < 0) return "io_uring_submit failed";
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc < 0) return std::string("io_uring_wait_cqe: ") + std::strerror(-rc);
    unsigned head = 0, seen = 0;
    std::string err;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      if (cqe->res != static_cast<int>(kRec)) {
        err = cqe->res < 0 ? std::string(std::strerror(-cqe->res)) : "short transfer";
      }
      free_slots.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
      ++completed;
    }
    io_uring_cq_advance(&ring, seen);
    if (!err.empty()) return err;
    if (sync_every > 0 && completed == group_end) {
      if (::fdatasync(fd) != 0) return "fdatasync failed";
      group_end += sync_every;
    }
  }
  if (write && sync_every == 0 && ::fdatasync(fd) != 0) return "fdatasync failed";
  return "";
}

std::string SyncRun(int fd, bool write, int sync_every, std::byte* buf) {
  for (int k = 0; k < kRecs; ++k) {
    const off_t off = static_cast<off_t>(static_cast<uint64_t>(k) * kRec);
    size_t done = 0;
    while (done < kRec) {
      ssize_t n = write ? ::pwrite(fd, buf + done, kRec - done, off + static_cast<off_t>(done))
                        : ::pread(fd, buf + done, kRec - done, off + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::string(write ? "pwrite: " : "pread: ") + (n < 0 ? std::strerror(errno) : "eof");
      done += static_cast<size_t>(n);
    }
    if (write && sync_every > 0 && (k + 1) % sync_every == 0 && ::fdatasync(fd) != 0) return "fdatasync failed";
  }
  if (write && sync_every == 0 && ::fdatasync(fd) != 0) return "fdatasync failed";
  return "";
}

void Report(benchmark::State& state, const IoCase& c, const std::string& pattern, const std::string& fs,
            double seconds) {
  const int64_t bytes = state.iterations() * kRecs * static_cast<int64_t>(kRec);
  state.SetBytesProcessed(bytes);
  const double bps = static_cast<double>(bytes) / seconds;
  if (!c.uring && !c.direct) Baselines()[pattern] = bps;
  auto it = Baselines().find(pattern);
  if (it != Baselines().end()) state.counters["x_sync"] = bps / it->second;
  state.SetLabel(pattern + ", " + Describe(c, fs));
}

// range: engine (0 sync, 1 io_uring), queue depth, O_DIRECT, fdatasync per batch of 8
void BM_IoWrite(benchmark::State& state) {
  const IoCase c{state.range(0) == 1, static_cast<unsigned>(state.range(1)), state.range(2) == 1};
  const int sync_every = state.range(3) == 1 ? kBlocksPerBatch : 0;
  const std::string pattern = sync_every > 0 ? "write, fdatasync per 8" : "write, fdatasync at end";
  AlignedBuf src = Aligned(kRec, 1);
  std::vector<std::byte*> bufs{src.get()};
  io_uring ring{};
  if (c.uring) {
    int rc = io_uring_queue_init(c.qd, &ring, 0);
    if (rc < 0) {
      state.SkipWithError(("skipped: io_uring unavailable: " + std::string(std::strerror(-rc))).c_str());
      return;
    }
  }
  std::string fs;
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::string dir = BenchDir("io");
    fs = FsName(dir);
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    int fd = ::open((dir + "/io.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC | (c.direct ? O_DIRECT : 0), 0644);
    if (fd < 0) {
      state.SkipWithError(("skipped: cannot open " + Describe(c, FsName(dir)) + ": " + std::strerror(errno)).c_str());
      break;
    }
    std::string err =
        c.uring ? UringRun(ring, fd, true, c.qd, sync_every, bufs) : SyncRun(fd, true, sync_every, src.get());
    ::close(fd);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!err.empty()) {
      state.SkipWithError(((c.direct ? "skipped: " : "") + Describe(c, fs) + ": " + err).c_str());
      break;
    }
  }
  if (c.uring) io_uring_queue_exit(&ring);
  if (seconds > 0) Report(state, c, pattern, fs, seconds);
}
// The fdatasync-per-8 pattern holds at most 8 in flight, so it runs at queue depth 8 only.
BENCHMARK(BM_IoWrite)
    ->ArgNames({"uring", "qd", "direct", "per8"})
    ->Args({0, 1, 0, 1})
    ->Args({1, 8, 0, 1})
    ->Args({0, 1, 1, 1})
    ->Args({1, 8, 1, 1})
    ->Args({0, 1, 0, 0})
    ->Args({1, 8, 0, 0})
    ->Args({1, 32, 0, 0})
    ->Args({0, 1, 1, 0})
    ->Args({1, 8, 1, 0})
    ->Args({1, 32, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->UseRealTime();

void BM_IoRead(benchmark::State& state) {
  const IoCase c{state.range(0) == 1, static_cast<unsigned>(state.range(1)), state.range(2) == 1};
  const std::string pattern = "read, cache dropped";
  std::string dir = BenchDir("ioread");
  const std::string fs = FsName(dir);
  const std::string path = dir + "/io.bin";
  {
    AlignedBuf src = Aligned(kRec, 1);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::string err = fd < 0 ? std::string("cannot create the file") : SyncRun(fd, true, 0, src.get());
    if (fd >= 0) ::close(fd);
    if (!err.empty()) {
      state.SkipWithError(err.c_str());
      return;
    }
  }
  std::vector<AlignedBuf> owned;
  std::vector<std::byte*> bufs;
  for (unsigned i = 0; i < std::max(1u, c.qd); ++i) {
    owned.push_back(Aligned(kRec, 0));
    bufs.push_back(owned.back().get());
  }
  int fd = ::open(path.c_str(), O_RDONLY | (c.direct ? O_DIRECT : 0));
  if (fd < 0) {
    state.SkipWithError(("skipped: cannot open " + Describe(c, fs) + ": " + std::strerror(errno)).c_str());
    return;
  }
  io_uring ring{};
  if (c.uring) {
    int rc = io_uring_queue_init(c.qd, &ring, 0);
    if (rc < 0) {
      ::close(fd);
      state.SkipWithError(("skipped: io_uring unavailable: " + std::string(std::strerror(-rc))).c_str());
      return;
    }
  }
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    DropCache(dir);
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    std::string err = c.uring ? UringRun(ring, fd, false, c.qd, 0, bufs) : SyncRun(fd, false, 0, bufs[0]);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!err.empty()) {
      state.SkipWithError(((c.direct ? "skipped: " : "") + Describe(c, fs) + ": " + err).c_str());
      break;
    }
  }
  if (c.uring) io_uring_queue_exit(&ring);
  ::close(fd);
  if (seconds > 0) Report(state, c, pattern, fs, seconds);
}
BENCHMARK(BM_IoRead)
    ->ArgNames({"uring", "qd", "direct"})
    ->Args({0, 1, 0})
    ->Args({1, 8, 0})
    ->Args({1, 32, 0})
    ->Args({0, 1, 1})
    ->Args({1, 8, 1})
    ->Args({1, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->UseRealTime();

// A local redis-server on a free loopback port for the Redis benchmarks, stopped at exit.
class LocalRedis {
 public:
  static LocalRedis& Get() {
    static LocalRedis r;
    return r;
  }
  int port() const { return up_ ? port_ : -1; }
  ~LocalRedis() { testing::StopRedisServer(&pid_); }

 private:
  LocalRedis() {
    port_ = testing::FreeLoopbackPort();
    up_ = port_ != 0 &&
          testing::LaunchRedisServer(port_, bench::BenchDir("redis"), {}, &pid_) == testing::RedisLaunch::kUp;
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
  o.secret = std::vector<std::byte>(32, std::byte{0x42});
  auto opened = RedisTier::Open(o);
  if (!opened.ok()) {
    state.SkipWithError(opened.status().ToString().c_str());
    return;
  }
  RedisTier& t = **opened;
  std::vector<TierRecord> batch;
  std::vector<Hash128> keys;
  for (int k = 0; k < kBlocksPerBatch; ++k) {
    batch.push_back(TierRecord{Hash128{static_cast<uint64_t>(k) + 1, 9}, 1, Block(5)});
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
