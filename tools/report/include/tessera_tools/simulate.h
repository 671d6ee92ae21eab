// `tessera simulate --scenario agents`: a multi-agent workload replayed through the manager.
//
// An orchestrator builds a shared context (system prompt, documents, tool schemas) and forks
// the agents, which append their own tokens. Other agents arrive independently with their own
// preamble before the same documents; two identical prompts arrive in the same step, before
// either is sealed (per tenant, up to two tenants). A second wave re-admits the independent
// prompts after everything was freed (prefix hits from cache), then cold agents with new prompts
// of the same length arrive (evictions when capacity is short).
//
// KV bytes are synthetic but honest: the record of a token in a layer is a deterministic
// function of the layer, the position and every token up to it, so equal bytes arise exactly
// where a real MLA model would produce them (same prefix), and nowhere else. Every record of
// every request is read back and compared with that function before the request is freed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/hash.h"
#include "tessera/ledger.h"
#include "tessera/metrics.h"
#include "tessera/status.h"
#include "tessera/tiered_store.h"
#include "tessera_tools/render.h"

namespace tessera {

struct AgentScenario {
  std::string kv_format;          // empty: the model's default
  uint32_t agents = 16;           // forked from the orchestrator
  uint32_t independent = 8;       // arriving on their own
  uint64_t shared_tokens = 1024;  // system prompt + documents + tool schemas
  uint64_t unique_tokens = 128;   // each agent's own task
  uint64_t preamble_tokens = 96;  // an independent agent's own preamble
  std::optional<uint64_t> block_tokens;
  uint32_t capacity_blocks = 0;  // 0: enough for the whole first wave
  uint32_t tenants = 1;
  HashAlgorithm hash = HashAlgorithm::kXxh3;
  uint32_t hash_bits = 128;
  uint64_t seed = 1;
  // DeepSeek-V4 (models with windows): the strategy to run; unset runs all three.
  std::optional<SwaStrategy> swa_strategy;
  // Non-empty: a disk tier in this directory behind the pool (its prefix.key keys the prefix
  // hashes, so a second run over the same directory with a cold pool hits from disk).
  std::string disk_dir;
  WritePolicy tier_write = WritePolicy::kWriteThrough;
  uint64_t host_tier_bytes = 0;  // > 0: a host tier of this many bytes above the disk
  // A Redis tier (redis://host:port) or a Redis Cluster tier (host:port seeds) below the others,
  // checked to answer at start; keys derived from redis_secret (the fleet's), which then also
  // keys the prefix hashes.
  std::string redis;
  std::vector<std::string> redis_cluster;
  std::vector<std::byte> redis_secret;
  // Called at each step of a run with what it is doing ("snapshot: 7/8 second wave"); may be
  // empty. The CLI shows it on a terminal (ADR 0034).
  std::function<void(const std::string&)> progress;
};

// What the tiers did in a run with a disk directory.
struct TierRun {
  uint64_t tier_hits = 0;  // blocks promoted from the tiers (every byte verified after)
  uint64_t tier_hit_tokens = 0;
  uint64_t tier_verify_failures = 0;  // records refused by the store's checks (quarantined)
  uint64_t disk_quarantined = 0;      // records the disk tier quarantined (checksums)
  uint64_t written = 0;               // blocks written through or demoted
  uint64_t write_errors = 0;
  uint64_t disk_records = 0;  // live records in the directory after the run
  std::string last_error;
};

// One run of the scenario through one manager (a model with windows: one per window strategy).
struct StrategyRun {
  SwaStrategy strategy = SwaStrategy::kRecompute;
  uint64_t prefix_hits = 0;  // admissions that resumed from a cached boundary
  uint64_t prefix_hit_tokens = 0;
  uint64_t tokens_recomputed = 0;        // recompute: tokens the engine re-ran after hits
  uint64_t states_restored = 0;          // snapshot/retain: boundary states restored
  uint64_t boundaries_kept = 0;          // at the peak
  uint64_t bytes_kept_per_boundary = 0;  // measured: bytes kept / boundaries kept
  uint64_t bytes_held_peak = 0;          // pages + arena + boundary state, at the peak
  uint64_t dedup_hits = 0;
  uint64_t verify_failures = 0;
  uint64_t records_verified = 0;
  uint64_t tier_blocks = 0;      // prompt blocks promoted from the tiers
  std::optional<TierRun> tiers;  // with a disk directory (DIR/<strategy>)
};

struct SimulationResult {
  std::string model;
  std::string kv_format;
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;  // pages of one block over every layer
  uint32_t capacity_blocks = 0;
  uint64_t requests = 0;
  // At the peak of the first wave (every request live):
  uint64_t logical_blocks = 0;   // sum of block-table lengths
  uint64_t physical_blocks = 0;  // distinct blocks those tables name
  uint64_t bytes_saved = 0;      // (logical - physical) x block_bytes
  uint64_t shared_context_copies =
      0;                             // physical copies of each shared-context block among forked agents (1 = one copy)
  uint64_t cross_tenant_shares = 0;  // blocks named by requests of two tenant domains (must be 0)
  // Over the whole run:
  uint64_t prefix_hit_tokens = 0;
  uint64_t dedup_hits = 0;
  uint64_t dedup_collisions = 0;
  uint64_t evictions = 0;
  uint64_t cow_copies = 0;
  uint64_t out_of_blocks = 0;
  uint64_t records_verified = 0;
  uint64_t bytes_verified = 0;
  uint64_t verify_failures = 0;
  uint64_t second_wave_hit_tokens = 0;
  std::vector<MetricFamily> metrics;
  std::vector<std::string> security_events;  // the first few, for the operator
  std::vector<std::string> warnings;         // e.g. a tier directory's key readable by others
  std::vector<StrategyRun> strategies;       // models with windows
  std::optional<TierRun> tiers;              // runs with a disk directory
};

// Errors name the option ("agents", "capacity-blocks", ...) or come from the model and formats.
Result<SimulationResult> RunAgentScenario(const Geometry& g, const AgentScenario& scenario);
std::string RenderSimulation(const SimulationResult& result, OutputFormat format);

}  // namespace tessera
