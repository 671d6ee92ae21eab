// Capacity planning: how many requests of a context fit on a GPU configuration, per engine, and
// the longest context at a concurrency — from the weight bytes per rank (weights.h), the GPU's
// memory (gpu.h) and the ledger's per-request bytes at each phase (ledger.h).
//
//   usable      = floor(memory_bytes x utilization)          (vLLM's --gpu-memory-utilization)
//   kv_budget   = usable - weights_per_rank - reserve        (per rank; 0 when negative)
//   concurrency = floor(kv_budget / phase_bytes(context))    per phase, per engine
//   max context = the longest context c <= max_position_embeddings with
//                 concurrency x phase_bytes(c) <= kv_budget  (a search over c, each probe the
//                 ledger at c priced over the engine profile planned once: LedgerSweep)
//
// Left out of the budget unless given as --reserve-bytes: activations, CUDA graphs, NCCL and
// allocator workspaces (ADR 0019). The ledger's per-request bytes scale linearly with the batch
// (ComputeLedger multiplies per-request figures), so one ledger per context is enough.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/fraction.h"
#include "tessera/gpu.h"
#include "tessera/ledger.h"
#include "tessera/weights.h"

namespace tessera {

// "0.9" -> 9/10: a decimal in (0, 1] with at most 9 places. Errors on "gpu-memory-utilization".
Result<Fraction> ParseUtilization(std::string_view text);

struct PlanOptions {
  GpuSpec gpu;
  uint32_t tp = 1;
  Fraction utilization{9, 10};
  std::optional<WeightDtype> weights_dtype;  // empty: the checkpoint's own
  uint64_t reserve_bytes = 0;                // activations, CUDA graphs, ... per rank
  uint64_t context_tokens = 0;
  std::optional<uint64_t> concurrency;  // also search the longest context at this concurrency
  std::vector<Engine> engines = {Engine::kTessera, Engine::kVllm, Engine::kSglang};
  // Gates: a configuration that fails one is rejected (the CLI exits 1).
  std::optional<uint64_t> max_committed_bytes;  // per rank: concurrency x the largest phase bytes
  std::optional<uint64_t> min_concurrency;      // the sustained concurrency must reach this
  // The ledger options besides context, batch, tp and engine (kv format, block tokens, MTP, ...).
  LedgerOptions ledger;
};

struct PhasePlan {
  LedgerPhase phase = LedgerPhase::kAdmission;
  uint64_t bytes_per_request = 0;  // per rank, at the context
  uint64_t max_concurrency = 0;    // floor(kv_budget / bytes_per_request)
  // At PlanOptions::concurrency: the longest context that fits (0: not even one token; equal to
  // max_position_embeddings when the whole range fits). Found by bisection: the answer fits and
  // one more token does not. Where an engine's bytes are not monotone in the context (vLLM's and
  // SGLang's DeepSeek-V4 pages dip by a block or two past some boundaries) the longest fitting
  // context can lie a few blocks away from the one found.
  std::optional<uint64_t> max_context;
};

struct EnginePlan {
  Engine engine = Engine::kTessera;
  std::vector<PhasePlan> phases;  // LedgerPhase order
  // min over phases: every request passes admission, the prefill peak and decode.
  uint64_t sustained_concurrency = 0;
  // Per rank: the planned concurrency (PlanOptions::concurrency, else 1) x the largest phase bytes.
  uint64_t committed_bytes = 0;
  std::optional<uint64_t> max_context;  // min over phases, when searched
  bool rejected = false;
  std::vector<std::string> reasons;  // why rejected
};

struct Plan {
  std::string model;
  std::string config_sha256;
  GpuSpec gpu;
  uint32_t tp = 1;
  Fraction utilization;
  WeightBytes weights;
  uint64_t usable_bytes = 0;     // per rank
  uint64_t reserve_bytes = 0;    // per rank
  bool weights_fit = true;       // weights + reserve <= usable
  uint64_t kv_budget_bytes = 0;  // per rank
  uint64_t context_tokens = 0;
  std::optional<uint64_t> concurrency;
  uint64_t max_position_embeddings = 0;
  std::optional<uint64_t> max_committed_bytes;
  std::optional<uint64_t> min_concurrency;
  std::string kv_format;  // as the ledger resolved it
  bool include_mtp = false;
  std::vector<EnginePlan> engines;
  std::vector<std::string> notes;
  bool any_rejected() const;
};

// Errors name the option: "tp", "weights-dtype", "context", "concurrency", ... (and the ledger's).
Result<Plan> ComputePlan(const Geometry& g, const WeightShapes& shapes, const PlanOptions& options);

}  // namespace tessera
