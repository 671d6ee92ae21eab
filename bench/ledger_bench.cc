// Ledger and plan speed. Target (issue 12): any ledger or plan answers in under 1 ms.
// Baseline measured in the same run: parsing the preset's config.json (the work any tool that
// reads a model card must do). The ratio ledger / parse shows what the ledger adds.
//
//   cmake --preset release && cmake --build build/release --target ledger_bench
//   build/release/bench/ledger_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/plan.h"
#include "tessera/price.h"
#include "tessera_tools/report.h"

namespace {

using namespace tessera;

const char* const kPresets[] = {"deepseek-v2",     "deepseek-v2-lite", "deepseek-v3",  "deepseek-r1",
                                "deepseek-v3.1",   "deepseek-v3.2",    "kimi-k2",      "deepseek-v4-flash",
                                "deepseek-v4-pro", "llama-3.1-8b",     "llama-3.1-70b"};
constexpr Engine kEngines[] = {Engine::kTessera, Engine::kVllm, Engine::kSglang};

// Baseline: parse the preset's config.json into a geometry.
void BM_ParseConfig(benchmark::State& state) {
  const char* name = kPresets[state.range(0)];
  std::string text = *PresetConfigText(name);
  for (auto _ : state) {
    Result<Geometry> g = GeometryFromConfigJson(text, name);
    benchmark::DoNotOptimize(g);
  }
  state.SetLabel(name);
}
BENCHMARK(BM_ParseConfig)->DenseRange(0, std::size(kPresets) - 1);

// The ledger at 1M tokens, from config text to totals (parse included), per engine.
void BM_Ledger1M(benchmark::State& state) {
  const char* name = kPresets[state.range(0)];
  Engine engine = kEngines[state.range(1)];
  std::string text = *PresetConfigText(name);
  LedgerOptions o;
  o.context_tokens = 1 << 20;
  o.engine = engine;
  for (auto _ : state) {
    Result<Geometry> g = GeometryFromConfigJson(text, name);
    Result<Ledger> l = ComputeLedger(*g, o);
    benchmark::DoNotOptimize(l);
  }
  state.SetLabel(std::string(name) + "/" + std::string(EngineName(engine)));
}
BENCHMARK(BM_Ledger1M)->ArgsProduct({benchmark::CreateDenseRange(0, std::size(kPresets) - 1, 1), {0, 1, 2}});

// `tessera plan` without the CLI: config text to weight shapes, geometry and the plan on
// 8 x H200 at 128K for all three engines. Arg 1 = 1 adds the longest-context search at
// concurrency 4 (a search per engine and phase, each probe a context priced by LedgerSweep).
void BM_Plan(benchmark::State& state) {
  const char* name = kPresets[state.range(0)];
  std::string text = *PresetConfigText(name);
  PlanOptions o;
  o.gpu = *LoadGpu("H200-141G");
  o.tp = 8;
  o.context_tokens = 131072;
  if (state.range(1) == 1) o.concurrency = 4;
  for (auto _ : state) {
    Result<Geometry> g = GeometryFromConfigJson(text, name);
    Result<WeightShapes> shapes = WeightShapesFromConfigJson(text, name);
    Result<Plan> p = ComputePlan(*g, *shapes, o);
    if (!p.ok()) {
      state.SkipWithError(p.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(p);
  }
  state.SetLabel(std::string(name) + (state.range(1) == 1 ? "/max-context" : ""));
}
// deepseek-v3.2 (5) and deepseek-v4-pro (8), with and without the context search.
BENCHMARK(BM_Plan)->ArgsProduct({{5, 8}, {0, 1}})->Unit(benchmark::kMicrosecond);

// One probe of the longest-context search: a context's phase bytes on DeepSeek-V4-Pro (tp 8),
// vLLM. Arg 0: a whole ledger per context (how the search probed before LedgerSweep; the
// baseline); arg 1: the context priced over the profile planned once (LedgerSweep::PhasesAt).
// Contexts cycle through 64 values so that nothing is cached.
void BM_PlanProbe(benchmark::State& state) {
  Geometry g = *LoadPreset("deepseek-v4-pro");
  LedgerOptions o;
  o.tp = 8;
  o.engine = Engine::kVllm;
  LedgerSweep sweep(g, o);
  uint64_t i = 0;
  for (auto _ : state) {
    const uint64_t context = 131072 + 4099 * (i++ % 64);
    if (state.range(0) == 0) {
      o.context_tokens = context;
      Result<Ledger> l = ComputeLedger(g, o);
      benchmark::DoNotOptimize(l);
    } else {
      Result<PhaseTotals> b = sweep.PhasesAt(context);
      benchmark::DoNotOptimize(b);
    }
  }
  state.SetLabel(state.range(0) == 0 ? "ComputeLedger" : "LedgerSweep::PhasesAt");
}
BENCHMARK(BM_PlanProbe)->Arg(0)->Arg(1);

// `tessera price` at batch 64, 128K on 8 x H200 (two crossover bisections included).
void BM_Price(benchmark::State& state) {
  const char* name = kPresets[state.range(0)];
  Geometry g = *LoadPreset(name);
  PriceOptions o;
  o.gpu = *LoadGpu("H200-141G");
  o.tp = 8;
  o.batch = 64;
  o.context_tokens = 131072;
  for (auto _ : state) {
    Result<Price> p = ComputePrice(g, o);
    benchmark::DoNotOptimize(p);
  }
  state.SetLabel(name);
}
BENCHMARK(BM_Price)->Arg(2)->Arg(5)->Arg(8)->Unit(benchmark::kMicrosecond);

// The whole main job: 18 ledgers and the 23-claim check.
void BM_Report(benchmark::State& state) {
  for (auto _ : state) {
    Result<std::string> r = RenderReport(OutputFormat::kTable);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_Report)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
