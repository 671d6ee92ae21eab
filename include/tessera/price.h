// Reconstruction pricing: what one decode step of MLA attention costs in FLOPs and HBM bytes,
// absorbed against naive, and where the roofline bound changes.
//
// FLOP convention: a multiply-add is 2 FLOPs; softmax, RoPE, norms and scaling are not counted
// (they are O(entries) per head, not O(entries x dim)). Every closed form below is per layer,
// per attention head, per sequence, for one decode token attending `e` cached entries; the
// reference attention kernels' FLOP and byte counters are meant to equal them term by term.
//
// Absorbed (q_nope absorbs W_UK; attention runs in latent space; W_UV maps the result out):
//   q_absorb = 2·d_n·d_c           q_nope [d_n] · W_UK [d_n x d_c] -> q_latent [d_c]
//   scores   = 2·e·(d_c + d_r)     [q_latent, q_rope] · every entry's [latent, rope]
//   values   = 2·e·d_c             softmax weights · every entry's latent
//   v_up     = 2·d_c·d_v           latent output [d_c] · W_UV [d_c x d_v]
// Naive (every attended entry's per-head K and V reconstructed from its latent):
//   k_up     = 2·e·d_c·d_n         latent · W_UK for each entry
//   v_up     = 2·e·d_c·d_v         latent · W_UV for each entry
//   scores   = 2·e·(d_n + d_r)     [q_nope, q_rope] · [k_nope, k_rope]
//   values   = 2·e·d_v             softmax weights · V
//   materialized bytes = 2·e·(d_n + d_v)·2: the reconstructed bf16 K_nope and V written to HBM
//                        once and read back once (per head, per sequence)
// Both read W_UK and W_UV once per step for the whole batch: (d_n·d_c + d_c·d_v)·2 B per head
// (bf16, as engines keep them after loading), and each attended cache entry once per sequence for
// all heads of a rank (the ledger's read bytes per token; the indexer's keys included).
//
// Entries attended per layer at context L (the ledger's read view, ADR 0004): dense MLA e = L;
// DSA (V3.2) e = min(L, index_topk) plus an indexer scan of L keys; DeepSeek-V4 SWA
// e = min(L, window), CSA e = min(L, window) + min(floor(L/4), index_topk) plus an indexer scan
// of floor(L/4) keys, HCA e = min(L, window) + floor(L/128). Indexer per layer per sequence over
// n keys (every index head on every rank): 2·n·index_heads·index_dim + 2·n·index_heads.
// DeepSeek-V4 attends its stored entries directly (keys = values = the 512-wide entry, MQA): no
// reconstruction exists, so scores = values = 2·e·head_dim and naive equals absorbed.
//
// Roofline on one rank: time = max(FLOPs / dense_bf16_flops, bytes / hbm_bytes_per_s).
// Crossover batch (closed form): FLOPs = B·f and bytes = W + B·c, so the step is compute-bound
// from B* = ceil(peak·W / (f·bw - peak·c)) when f·bw > peak·c (never otherwise).
// Crossover context: the smallest context where the bound differs from the bound at context 1
// (bisection over the closed forms, which assumes a single change).
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/gpu.h"
#include "tessera/status.h"

namespace tessera {

struct PriceDims {
  uint64_t latent = 0;  // d_c: kv_lora_rank
  uint64_t rope = 0;    // d_r: qk_rope_head_dim
  uint64_t nope = 0;    // d_n: qk_nope_head_dim
  uint64_t v = 0;       // d_v: v_head_dim
};

// Absorbed, per layer, head and sequence, attending e entries.
constexpr uint64_t AbsorbQFlops(const PriceDims& d) { return 2 * d.nope * d.latent; }
constexpr uint64_t AbsorbedScoreFlops(const PriceDims& d, uint64_t e) { return 2 * e * (d.latent + d.rope); }
constexpr uint64_t AbsorbedValueFlops(const PriceDims& d, uint64_t e) { return 2 * e * d.latent; }
constexpr uint64_t AbsorbVUpFlops(const PriceDims& d) { return 2 * d.latent * d.v; }
// Naive, per layer, head and sequence.
constexpr uint64_t NaiveKUpFlops(const PriceDims& d, uint64_t e) { return 2 * e * d.latent * d.nope; }
constexpr uint64_t NaiveVUpFlops(const PriceDims& d, uint64_t e) { return 2 * e * d.latent * d.v; }
constexpr uint64_t NaiveScoreFlops(const PriceDims& d, uint64_t e) { return 2 * e * (d.nope + d.rope); }
constexpr uint64_t NaiveValueFlops(const PriceDims& d, uint64_t e) { return 2 * e * d.v; }
constexpr uint64_t NaiveMaterializedBytes(const PriceDims& d, uint64_t e) { return 2 * e * (d.nope + d.v) * 2; }
// W_UK and W_UV of one head, bf16: read once per step, per layer.
constexpr uint64_t UpProjectionWeightBytes(const PriceDims& d) { return (d.nope * d.latent + d.latent * d.v) * 2; }
// The lightning indexer of one layer, one sequence, over n keys.
constexpr uint64_t IndexerFlops(uint64_t n, uint64_t heads, uint64_t dim) {
  return 2 * n * heads * dim + 2 * n * heads;
}

struct PriceOptions {
  GpuSpec gpu;
  uint64_t batch = 1;
  uint64_t context_tokens = 0;
  uint32_t tp = 1;        // heads per rank = heads / tp; the latent cache is replicated
  std::string kv_format;  // the cache record read (empty: the model's default)
};

// One head's terms (per layer, per sequence), as above. Unused terms are 0.
struct HeadTerms {
  uint64_t q_absorb = 0, k_up = 0, v_up = 0, scores = 0, values = 0;
  uint64_t materialized_bytes = 0;
  uint64_t flops() const { return q_absorb + k_up + v_up + scores + values; }
};

// Layers of one kind and what one of them costs at the priced context.
struct LayerPrice {
  LayerKind kind = LayerKind::kMla;
  uint32_t layers = 0;
  uint64_t entries = 0;       // attended per head
  uint64_t indexer_keys = 0;  // scanned by the indexer (0: none)
  HeadTerms absorbed;
  HeadTerms naive;
  uint64_t indexer_flops = 0;  // per layer per sequence
};

// One decode step on one rank.
struct PathPrice {
  std::string path;  // "absorbed" or "naive"
  uint64_t attention_flops = 0;
  uint64_t indexer_flops = 0;
  uint64_t flops = 0;
  uint64_t cache_bytes = 0;         // batch x the ledger's read bytes per token (one rank)
  uint64_t weight_bytes = 0;        // W_UK and W_UV, once per step
  uint64_t materialized_bytes = 0;  // naive only
  uint64_t bytes = 0;
  double intensity = 0;  // FLOPs per byte
  double compute_s = 0;
  double memory_s = 0;
  double time_s = 0;
  bool compute_bound = false;
  std::optional<uint64_t> crossover_batch;    // at the context
  std::optional<uint64_t> crossover_context;  // at the batch
};

struct Price {
  std::string model;
  GpuSpec gpu;
  uint64_t batch = 0;
  uint64_t context_tokens = 0;
  uint32_t tp = 1;
  uint32_t heads_per_rank = 0;
  std::string kv_format;
  PriceDims dims;
  bool reconstructs = true;  // false for DeepSeek-V4 (naive = absorbed)
  uint64_t read_bytes_per_token = 0;
  std::vector<LayerPrice> layers;
  PathPrice absorbed;
  PathPrice naive;
  double ridge = 0;  // dense_bf16_flops / hbm_bytes_per_s
  std::vector<std::string> notes;
};

// Errors: "model" (not an MLA model), "batch", "context", "tp" (not dividing the heads), and the
// ledger's ("kv-format", ...).
Result<Price> ComputePrice(const Geometry& g, const PriceOptions& options);

}  // namespace tessera
