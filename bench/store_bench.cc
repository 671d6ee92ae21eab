// Block store benchmarks (issue 3). Baselines measured in the same run: memcpy of the same bytes
// for content hashing and dedup; nothing for bookkeeping-only paths (absolute times reported).
//
//   cmake --preset release && cmake --build build/release --target store_bench
//   build/release/bench/store_bench
#include <benchmark/benchmark.h>

#include <algorithm>

#include <chrono>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "tessera/block_index.h"
#include "tessera/block_pool.h"
#include "tessera/hash.h"
#include "tessera/request_manager.h"

#include "bench_support.h"

namespace {

using namespace tessera;
using tessera::bench::Check;

Geometry V3() { return *LoadPreset("deepseek-v3"); }

ManagerOptions Fp8(uint32_t capacity, RegionKind kind) {
  ManagerOptions o;
  o.kv_format = "fp8_ds_mla";
  o.capacity_blocks = capacity;
  o.region_kind = kind;
  o.hash_key_seed = 7;
  return o;
}

// One DeepSeek-V3 fp8 block: 61 layers x 64 tokens x 656 B = 2,561,024 B.
constexpr size_t kV3Fp8BlockBytes = 61 * 64 * 656;

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 g(seed);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t r = g();
    std::memcpy(v.data() + i, &r, 8);
  }
  return v;
}

void BM_MemcpyBlock(benchmark::State& state) {
  std::vector<std::byte> src = RandomBytes(kV3Fp8BlockBytes, 1), dst(kV3Fp8BlockBytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kV3Fp8BlockBytes));
}
BENCHMARK(BM_MemcpyBlock);

void BM_ContentKeyBlock(benchmark::State& state) {
  HashAlgorithm algo = state.range(0) == 0 ? HashAlgorithm::kXxh3 : HashAlgorithm::kSha256;
  ContentHasher h = *ContentHasher::Create(algo, 128, 7);
  std::vector<std::byte> src = RandomBytes(kV3Fp8BlockBytes, 2);
  for (auto _ : state) {
    ContentHasher::Stream s = h.Begin();
    s.Update(src);
    benchmark::DoNotOptimize(s.Digest());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kV3Fp8BlockBytes));
  state.SetLabel(std::string(HashAlgorithmName(algo)));
}
BENCHMARK(BM_ContentKeyBlock)->Arg(0)->Arg(1);

// Seal of a V3 fp8 block whose twin is already sealed: content key + byte comparison + share.
void BM_SealDedupBlock(benchmark::State& state) {
  Geometry g = V3();
  auto m = *RequestManager::Create(g, Fp8(8, RegionKind::kHost));
  std::vector<uint32_t> prompt(64);
  std::iota(prompt.begin(), prompt.end(), 1);
  auto writer = [](uint32_t, uint32_t layer, uint64_t pos, const RecordView& v) {
    std::memset(v.planes[0].data(), static_cast<int>((layer * 31 + pos) & 0xff), v.planes[0].size());
  };
  // The original.
  Admission first = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
  if (!Check(state, m->AllocateSlots(first.id, 64)) || !Check(state, m->Append(first.id, prompt, writer))) return;
  for (auto _ : state) {
    state.PauseTiming();
    Admission twin = *m->Admit(std::span<const uint32_t>(), RequestSpec{});
    if (!Check(state, m->AllocateSlots(twin.id, 64)) ||
        !Check(state, m->Append(twin.id, std::span<const uint32_t>(prompt).first(63), writer))) {
      break;
    }
    state.ResumeTiming();
    const Status sealed = m->Append(twin.id, std::span<const uint32_t>(prompt).last(1), writer);  // fills and seals
    state.PauseTiming();
    if (!Check(state, sealed) || !Check(state, m->Free(twin.id))) break;
    state.ResumeTiming();
  }
  if (m->index().stats().dedup_hits.load() != static_cast<uint64_t>(state.iterations()))
    state.SkipWithError("seal did not deduplicate");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kV3Fp8BlockBytes));
}
BENCHMARK(BM_SealDedupBlock);

void BM_AllocateFree(benchmark::State& state) {
  auto m = *RequestManager::Create(V3(), Fp8(1024, RegionKind::kUnbacked));
  BlockPoolOptions po;
  po.groups = m->pool().groups();
  po.capacity_blocks = 1024;
  po.region_kind = RegionKind::kUnbacked;
  auto owned = *BlockPool::Create(po);
  PinnedBlocks ids(owned.get());
  ids.reserve(64);
  for (auto _ : state) {
    if (!Check(state, ids.Allocate(64))) break;
    ids.Clear();
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_AllocateFree);

// Admission of a 128K-token prompt that is cached whole: 2,048 verified prefix hits.
void BM_PrefixLookup128K(benchmark::State& state) {
  auto m = *RequestManager::Create(V3(), Fp8(4096, RegionKind::kUnbacked));
  std::vector<uint32_t> prompt(131072 + 1);  // 2,048 whole blocks and the token to compute
  std::iota(prompt.begin(), prompt.end(), 0);
  Admission r = *m->Admit(prompt, RequestSpec{});
  if (!Check(state, m->AllocateSlots(r.id, prompt.size())) || !Check(state, m->Append(r.id, prompt, nullptr)) ||
      !Check(state, m->Free(r.id))) {
    return;
  }
  for (auto _ : state) {
    Admission hit = *m->Admit(prompt, RequestSpec{});
    if (hit.cached_blocks != 2048) state.SkipWithError("prompt not cached whole");
    if (!Check(state, m->Free(hit.id))) break;
  }
  state.SetItemsProcessed(state.iterations() * 2048);
}
BENCHMARK(BM_PrefixLookup128K)->Unit(benchmark::kMicrosecond);

// The scheduler trace: 1,024 requests with 2,048-token prompts in groups of 16 sharing their
// first 1,024 tokens; 64-token blocks; admit all (each admission reserves its prompt's slots),
// 256 decode steps — one batched Step for all 1,024 requests each — free all. Bookkeeping only
// (an unbacked pool: no KV bytes, so no content hashing). Reports the median, p99 and worst
// step over every step of every iteration (a fresh manager each iteration: its first block
// boundary and first index growth are in the figures).
std::vector<std::vector<uint32_t>> TracePrompts(uint32_t requests) {
  constexpr uint32_t kPrompt = 2048, kShared = 1024, kGroup = 16;
  std::vector<std::vector<uint32_t>> prompts(requests);
  for (uint32_t r = 0; r < requests; ++r) {
    prompts[r].resize(kPrompt);
    for (uint32_t t = 0; t < kPrompt; ++t) {
      prompts[r][t] = t < kShared ? (r / kGroup) * 100000 + t : 50000000 + r * kPrompt + t;
    }
  }
  return prompts;
}

double ThreadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// A fixed job of about a median 1,024-request step's length on this machine (4,096 dependent
// xorshift rounds, registers only: no memory, no branches that vary), in this thread's CPU
// time: the scheduler trace times one after every step, as the noise floor of its worst step.
double NoiseJobCpuNs(uint64_t seed) {
  constexpr int kRounds = 4096;
  const double c0 = ThreadCpuNs();
  uint64_t x = 0x9E3779B97F4A7C15ULL ^ seed;
  for (int k = 0; k < kRounds; ++k) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  benchmark::DoNotOptimize(x);
  return ThreadCpuNs() - c0;
}

// An unbacked DeepSeek-V3 fp8 manager for `requests` decoding requests (the decode benchmarks).
std::unique_ptr<RequestManager> DecodeManager(uint32_t requests, SealTiming seals = SealTiming::kAuto) {
  // The trace holds about 22 blocks a request (its own 16 prompt blocks, 4 decode blocks, its
  // share of its group's 16): room for that, at least the 40,000 blocks of the 1,024 trace.
  ManagerOptions o = Fp8(std::max<uint32_t>(40000, requests * 24), RegionKind::kUnbacked);
  o.max_requests = requests;
  o.seal_timing = seals;
  return *RequestManager::Create(V3(), o);
}

// Admits `prompt` and appends what it did not hit (its slots were reserved by Admit); a failed
// append fails the benchmark.
RequestId Prefill(benchmark::State& state, RequestManager& m, std::span<const uint32_t> prompt) {
  Admission a = *m.Admit(prompt, RequestSpec{});
  Check(state, m.Append(a.id, prompt.subspan(a.cached_tokens), nullptr));
  return a.id;
}

void SchedulerTrace(benchmark::State& state, SealTiming seals) {
  const uint32_t kRequests = static_cast<uint32_t>(state.range(0));
  constexpr uint32_t kSteps = 256;
  const std::vector<std::vector<uint32_t>> prompts = TracePrompts(kRequests);
  double admit_ns = 0, free_ns = 0;
  std::vector<double> steps, cpu_steps, noise_cpu;
  steps.reserve(size_t{kSteps} * static_cast<size_t>(state.max_iterations));
  cpu_steps.reserve(steps.capacity());
  noise_cpu.reserve(steps.capacity());
  const std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests, 7);
  // The caller's result, reused by every step as a scheduler would: its storage is touched
  // here, so that the first step does not count the page faults of the benchmark's own buffers.
  StepResult result;
  result.codes.resize(kRequests);
  result.offsets.resize(kRequests + 1);
  result.new_blocks.resize(kRequests);
  for (auto _ : state) {
    state.PauseTiming();
    auto m = DecodeManager(kRequests, seals);
    std::vector<RequestId> ids(kRequests);
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    for (uint32_t r = 0; r < kRequests; ++r) ids[r] = Prefill(state, *m, prompts[r]);
    auto t1 = std::chrono::steady_clock::now();
    for (uint32_t step = 0; step < kSteps; ++step) {
      const double c0 = ThreadCpuNs();
      auto s0 = std::chrono::steady_clock::now();
      Check(state, m->Step(StepBatch{ids, counts, tokens}, nullptr, &result));
      const auto s1 = std::chrono::steady_clock::now();
      const double c1 = ThreadCpuNs();
      // Recorded outside the timed span (a growing vector's fresh pages were counted in the step
      // that grew it: step 0 of the fifth iteration).
      steps.push_back(std::chrono::duration<double, std::nano>(s1 - s0).count());
      cpu_steps.push_back(c1 - c0);
      if (result.failed != 0) state.SkipWithError("a decode step failed");
      noise_cpu.push_back(NoiseJobCpuNs(step));
    }
    auto t2 = std::chrono::steady_clock::now();
    for (RequestId id : ids) {
      if (!Check(state, m->Free(id))) break;
    }
    auto t3 = std::chrono::steady_clock::now();
    admit_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    free_ns += std::chrono::duration<double, std::nano>(t3 - t2).count();
    // 15 of every group of 16 hit the 1,024 shared tokens (16 whole blocks).
    if (m->metrics().prefix_hit_tokens.load() != uint64_t{kRequests - (kRequests / 16)} * 1024) {
      state.SkipWithError("unexpected prefix hits");
    }
    state.PauseTiming();
    m.reset();
    state.ResumeTiming();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["admit_all_us"] = admit_ns / n / 1e3;
  state.counters["step_median_us"] = Percentile(steps, 0.5) / 1e3;
  // The mean step, under the name and definition of the code before issue 26 (327f616: decode
  // time / steps), so that bench/step_guard.sh can compare against it.
  state.counters["decode_step_us"] =
      std::accumulate(steps.begin(), steps.end(), 0.0) / static_cast<double>(steps.size()) / 1e3;
  state.counters["step_p99_us"] = Percentile(steps, 0.99) / 1e3;
  state.counters["step_max_us"] = Percentile(steps, 1.0) / 1e3;
  state.counters["step_max_over_median"] = Percentile(steps, 1.0) / Percentile(steps, 0.5);
  // The same per step in this thread's CPU time: on a shared machine a step's wall time also
  // counts the time it was preempted, which says nothing of the step (the CPU clock's reads,
  // about a microsecond, are outside the wall interval and inside this one).
  state.counters["step_cpu_median_us"] = Percentile(cpu_steps, 0.5) / 1e3;
  state.counters["step_cpu_max_us"] = Percentile(cpu_steps, 1.0) / 1e3;
  state.counters["step_cpu_max_over_median"] = Percentile(cpu_steps, 1.0) / Percentile(cpu_steps, 0.5);
  // The same without the first iteration's steps: a process's first trace also pays one-time
  // costs (its code's and data's first touches), which a serving process pays once.
  if (cpu_steps.size() > kSteps) {
    const std::vector<double> later(cpu_steps.begin() + kSteps, cpu_steps.end());
    state.counters["step_cpu_max_over_median_after_first"] = Percentile(later, 1.0) / Percentile(later, 0.5);
  }
  // The machine's floor for a worst-of-all-steps figure: the same statistic over a fixed job
  // timed after every step (NoiseJobCpuNs). Its max / median is what interrupts, preemption
  // and frequency changes alone give a constant piece of work in this run; a step's worst
  // against its median cannot be told from the code below it.
  state.counters["noise_cpu_median_us"] = Percentile(noise_cpu, 0.5) / 1e3;
  state.counters["noise_cpu_max_over_median"] = Percentile(noise_cpu, 1.0) / Percentile(noise_cpu, 0.5);
  // The worst step the trace repeats: each step's CPU time taken as its median over the
  // iterations (the same step of the same trace, in a fresh manager each time), the worst of
  // those against the median step. An interruption lands on one iteration's step and leaves
  // this; a step the code makes slow (a seal step, the first after the admissions) is slow in
  // every iteration and sets it. The same over the fixed job says what the machine leaves in it.
  // Returns {worst / median, the worst one's step}.
  const auto worst_repeated = [&](const std::vector<double>& v) {
    const size_t runs = v.size() / kSteps;
    std::vector<double> per_step(kSteps), same(runs);
    for (size_t i = 0; i < kSteps; ++i) {
      for (size_t k = 0; k < runs; ++k) same[k] = v[k * kSteps + i];
      per_step[i] = Percentile(same, 0.5);
    }
    const auto worst = std::max_element(per_step.begin(), per_step.end());
    return std::pair{*worst / Percentile(v, 0.5), static_cast<double>(worst - per_step.begin())};
  };
  const auto [step_repeated, step_repeated_at] = worst_repeated(cpu_steps);
  state.counters["step_cpu_repeated_max_over_median"] = step_repeated;
  state.counters["step_cpu_repeated_max_at"] = step_repeated_at;
  state.counters["noise_cpu_repeated_max_over_median"] = worst_repeated(noise_cpu).first;
  state.counters["free_all_us"] = free_ns / n / 1e3;
  // Where the worst step falls (step index within its iteration): 0, 64, 128, 192 are the
  // trace's block boundaries, where every request seals a block in the same step.
  state.counters["step_max_at"] =
      static_cast<double>((std::max_element(steps.begin(), steps.end()) - steps.begin()) % kSteps);
  // The steps where every request seals a block (decode token 64k + 63): the trace's worst by
  // construction, a thousand seals in one step.
  double seal_sum = 0;
  size_t seal_steps = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i % kSteps % 64 == 63) {
      seal_sum += steps[i];
      ++seal_steps;
    }
  }
  state.counters["seal_step_mean_us"] = seal_sum / static_cast<double>(seal_steps) / 1e3;
  // In CPU time (ADR 0044): the seal steps, and the steps right after them (decode token 64k),
  // where every request takes a fresh block from the pool; and where the worst CPU step falls.
  double seal_cpu = 0, block_cpu = 0;
  size_t block_steps = 0;
  for (size_t i = 0; i < cpu_steps.size(); ++i) {
    if (i % kSteps % 64 == 63) seal_cpu += cpu_steps[i];
    if (i % kSteps % 64 == 0) {
      block_cpu += cpu_steps[i];
      ++block_steps;
    }
  }
  state.counters["seal_step_cpu_mean_us"] = seal_cpu / static_cast<double>(seal_steps) / 1e3;
  state.counters["block_step_cpu_mean_us"] = block_cpu / static_cast<double>(block_steps) / 1e3;
  state.counters["step_cpu_max_at"] =
      static_cast<double>((std::max_element(cpu_steps.begin(), cpu_steps.end()) - cpu_steps.begin()) % kSteps);
}
// The manager's defaults: an unbacked pool without windows defers its seals (ADR 0049). Before
// ADR 0049 (commits up to f5bf61e) this was the immediate variant below.
void BM_SchedulerTrace(benchmark::State& state) { SchedulerTrace(state, SealTiming::kAuto); }
// Deferred seals named (ADR 0048): a seal step queues its seals and the next steps perform them,
// at most max(64, batch / 16) each. The free loop at the end performs the last seal step's queue
// (free_all_us counts it). The same as the default since ADR 0049; kept so that a baseline
// built before it runs the same variant.
void BM_SchedulerTraceDeferredSeals(benchmark::State& state) { SchedulerTrace(state, SealTiming::kDeferred); }
// Seals in the step their last token arrives in (the default before ADR 0049).
void BM_SchedulerTraceImmediateSeals(benchmark::State& state) { SchedulerTrace(state, SealTiming::kImmediate); }
// 1,024 requests (the guarded figure, bench/step_guard.sh), 4,096 and 16,384 (linearity, and the
// worst step against the median as the prefix index outgrows the cache).
BENCHMARK(BM_SchedulerTraceDeferredSeals)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK(BM_SchedulerTrace)->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_SchedulerTraceImmediateSeals)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

// Admission of a 2,048-token prompt whose first 1,024 tokens are cached, including appending
// (and sealing) its 16 new blocks, then freeing it: the per-request cost of the trace's
// admissions. The prompts differ after the shared part, so every iteration seals new blocks.
void BM_AdmitCachedPrefix(benchmark::State& state) {
  ManagerOptions o = Fp8(1 << 16, RegionKind::kUnbacked);
  auto m = *RequestManager::Create(V3(), o);
  std::vector<uint32_t> prompt(2048);
  std::iota(prompt.begin(), prompt.end(), 1u);
  Admission first = *m->Admit(prompt, RequestSpec{});
  if (!Check(state, m->Append(first.id, prompt, nullptr)) || !Check(state, m->Free(first.id))) return;
  uint32_t round = 0;
  for (auto _ : state) {
    for (uint32_t t = 1024; t < 2048; ++t) prompt[t] = 10000000 + round * 2048 + t;
    ++round;
    Admission a = *m->Admit(prompt, RequestSpec{});
    if (!Check(state, m->Append(a.id, std::span<const uint32_t>(prompt).subspan(a.cached_tokens), nullptr)) ||
        !Check(state, m->Free(a.id))) {
      break;
    }
    if (a.cached_tokens != 1024) state.SkipWithError("the shared half was not cached");
  }
}
BENCHMARK(BM_AdmitCachedPrefix)->Unit(benchmark::kMicrosecond);

// One more block (64 tokens, slots and append) for a request that already holds `range(0)`
// tokens: the cost per block must not grow with the context (1K against 1M in the same run).
void BM_AppendBlockAt(benchmark::State& state) {
  const uint64_t held = static_cast<uint64_t>(state.range(0));
  ManagerOptions o = Fp8(static_cast<uint32_t>(held / 64 + 4096), RegionKind::kUnbacked);
  o.content_dedup = false;
  auto m = *RequestManager::Create(V3(), o);
  std::vector<uint32_t> context(held);
  std::iota(context.begin(), context.end(), 1u);
  RequestSpec spec;
  spec.reserve_tokens = 0;
  Admission a = *m->Admit(std::span<const uint32_t>(), spec);
  if (!Check(state, m->AllocateSlots(a.id, held)) || !Check(state, m->Append(a.id, context, nullptr))) return;
  std::vector<uint32_t> block(64);
  uint32_t next = 1u << 30;
  uint64_t blocks = 0;
  for (auto _ : state) {
    for (uint32_t& t : block) t = next++;
    if (!Check(state, m->AllocateSlots(a.id, 64)) || !Check(state, m->Append(a.id, block, nullptr))) break;
    if (++blocks == 4000) {  // stay within the pool: drop back to the held context
      state.PauseTiming();
      if (!Check(state, m->Free(a.id))) break;
      a = *m->Admit(std::span<const uint32_t>(), spec);
      if (!Check(state, m->AllocateSlots(a.id, held)) || !Check(state, m->Append(a.id, context, nullptr))) break;
      blocks = 0;
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AppendBlockAt)->Arg(1024)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// The trace's worst step alone: 1,024 requests each one token short of a block boundary append
// that token, so every request seals a block in the same Step (a fresh manager per iteration).
void BM_SealStep(benchmark::State& state) {
  constexpr uint32_t kRequests = 1024;
  const std::vector<uint32_t> counts(kRequests, 1), tokens(kRequests, 7);
  StepResult result;
  for (auto _ : state) {
    state.PauseTiming();
    auto m = DecodeManager(kRequests);
    std::vector<RequestId> ids(kRequests);
    std::vector<uint32_t> prompt(2048 + 63);
    for (uint32_t r = 0; r < kRequests; ++r) {
      std::iota(prompt.begin(), prompt.end(), r * 100000u);
      ids[r] = Prefill(state, *m, prompt);
    }
    state.ResumeTiming();
    const Status stepped = m->Step(StepBatch{ids, counts, tokens}, nullptr, &result);
    state.PauseTiming();
    if (!Check(state, stepped)) break;
    if (result.failed != 0) state.SkipWithError("a step failed");
    m.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kRequests);
}
BENCHMARK(BM_SealStep)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
