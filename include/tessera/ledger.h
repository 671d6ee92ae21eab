// The ledger: exact bytes requested, committed and read per generated token.
//
//   requested  — persistent logical bytes of the request(s): records x entries, plus the
//                constant per-request state (window ring, compressor state) at its ring size.
//   committed  — what an allocator actually holds on one rank: requested (as that rank sees it)
//                plus named terms: page rounding, page alignment padding, block metadata,
//                speculative-decoding slots and any engine-specific reservation.
//   read       — bytes of cache one rank reads to generate one token of one sequence.
//
// Every figure is an exact integer (or an exact Fraction for amortized per-token figures) and
// every product is checked: a total that would leave 64 bits is an error naming the input that
// drove it there, never a wrapped number.
//
// Thread-safety: pure functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/format.h"
#include "tessera/fraction.h"
#include "tessera/geometry.h"
#include "tessera/layout.h"
#include "tessera/status.h"

namespace tessera {

enum class Engine {
  kTessera,  // Tessera's own pools: derived block span, state in a per-request arena
  kVllm,     // vLLM's page sizing (FlashMLA pages of 64; DeepSeek-V4 hybrid groups)
  kSglang,   // SGLang's token pools (page 64 for FlashMLA)
};
std::string_view EngineName(Engine engine);
Result<Engine> ParseEngine(std::string_view name);

// The layout (record formats, block span, kernel, MTP layers, tensor-parallel ranks, scale
// formats) is the CacheLayoutOptions it derives from.
struct LedgerOptions : CacheLayoutOptions {
  uint64_t context_tokens = 0;  // tokens cached per request
  uint64_t batch = 1;           // requests
  uint32_t dcp = 1;             // decode-context-parallel ranks (shard tokens); must divide tp
  uint32_t spec_tokens = 0;     // speculative draft tokens per step
  Engine engine = Engine::kTessera;
  SwaStrategy swa_strategy = SwaStrategy::kRecompute;
  uint64_t prefill_chunk_tokens = 8192;  // tokens per prefill step (vLLM's max_num_batched_tokens)
  // vLLM's --max-model-len (SGLang's --context-length): the longest context the engine admits, and
  // vLLM's cap on a request's slots. Unset: max(max_position_embeddings, context), as before. The
  // vllm and sglang engines refuse a context past it naming "max-model-len"; engine tessera has no
  // such cap and refuses the option.
  std::optional<uint64_t> max_model_len;
};

// The named terms committed bytes decompose into (ADR 0004), in the order outputs list them.
enum class LedgerTerm {
  kRecords,              // the live records themselves
  kPageRounding,         // unused entries of the last page of a block
  kAlignmentPadding,     // page bytes padded to the format's (or the engine's) alignment
  kRingCapacity,         // arena rings allocated whole, before they fill
  kSpeculativeSlots,     // pages or ring slots for draft tokens (compressor rings double)
  kBlockMetadata,        // Tessera's host bytes per block id (header + token ids)
  kBoundaryState,        // window state kept beside sealed block boundaries (snapshot, retain)
  kUniformBlockPadding,  // vLLM DeepSeek-V4: every block id costs the same bytes
};
// The name outputs print ("records", "page_rounding", ...).
std::string_view LedgerTermName(LedgerTerm term);

// The phases of one request whose per-rank bytes the ledger reports, in order.
enum class LedgerPhase {
  kAdmission,    // what must be free to admit the request
  kPrefillPeak,  // the most held while the prompt is written in chunks
  kDecode,       // held once the context is cached (= committed_bytes)
};
// The name outputs print ("admission", "prefill_peak", "decode").
std::string_view LedgerPhaseName(LedgerPhase phase);

struct Term {
  LedgerTerm term = LedgerTerm::kRecords;
  uint64_t bytes = 0;
};

struct PhaseBytes {
  LedgerPhase phase = LedgerPhase::kAdmission;
  uint64_t bytes = 0;
};

// One cache kind over the layers that hold it (e.g. "csa.compressed" over 30 layers).
struct CacheLine {
  std::string name;
  LayerKind layer_kind = LayerKind::kMla;
  CacheRole role = CacheRole::kLatent;
  bool mtp = false;
  uint32_t layers = 0;
  RecordFormat format;          // as one rank stores it (MHA heads shard over tensor-parallel ranks)
  uint64_t record_bytes = 0;    // one record of the whole model (unsharded)
  bool grows = true;            // grows with the context (false: constant per-request state)
  bool in_pages = true;         // this engine keeps it in pages (false: a per-request arena)
  uint32_t compress_ratio = 1;  // tokens per entry (paged caches)
  uint32_t slots = 0;           // ring slots (per-request state), without speculative extras
  KvDims kv;                    // MHA/GQA and sliding-window lines: the layers' K and V (unsharded)
  // How the line's requested bytes are priced, for people: "tokens x 2,048 B x 12 layers",
  // "min(tokens, 128) x 2,048 B x 12 layers (a 128-token window)", "6,512,640 B x 69 layers,
  // constant per request (linear-attention state: kda)", ...
  std::string formula;
  // Growing caches: record_bytes / compress_ratio. State: record bytes per slot (window: per window token).
  Fraction bytes_per_token_per_layer;
  std::vector<uint64_t> shape;  // [layers, batch, entries, width] (MHA: [..., 2, heads, head_dim])
  std::string shape_unit;       // "elements" or "bytes" (last dim)
  PageLayout page;              // when in_pages
  uint64_t requested_bytes = 0;
  uint64_t committed_bytes = 0;  // one rank
  std::vector<Term> terms;       // committed_bytes decomposed (one rank)
  uint64_t read_bytes_per_token = 0;
};

struct LayerKindSummary {
  LayerKind kind = LayerKind::kMla;
  uint32_t layers = 0;                  // main layers (plus MTP when included)
  Fraction paged_bytes_per_token;       // per layer: sum over its paged caches of record / ratio
  uint64_t window_bytes_per_token = 0;  // per layer, per window token (V4)
  uint64_t state_bytes = 0;             // per layer per request: window ring + compressor state
};

// What each window-persistence strategy costs per cached block boundary.
struct StrategyFigures {
  SwaStrategy strategy = SwaStrategy::kRecompute;
  uint64_t bytes_kept_per_boundary = 0;    // held beside each sealed boundary block
  uint64_t bytes_copied_per_boundary = 0;  // written when the boundary is sealed
  uint64_t tokens_recomputed_per_hit = 0;  // the engine recomputes these after a hit
};

struct Ledger {
  std::string model;
  std::string model_type;
  std::string config_sha256;
  LedgerOptions options;
  std::string kv_format;
  std::string indexer_format;
  uint32_t block_tokens = 0;
  std::vector<std::string> block_reasons;
  std::vector<std::string> notes;
  uint64_t tokens_per_rank = 0;
  uint32_t layers_counted = 0;
  std::vector<CacheLine> lines;
  std::vector<LayerKindSummary> kinds;
  std::vector<Term> terms;  // committed_bytes decomposed, summed over lines
  uint64_t requested_bytes = 0;
  uint64_t committed_bytes = 0;            // per rank (the busiest rank)
  uint64_t committed_bytes_all_ranks = 0;  // summed over tp ranks
  // What the engine must find free to admit the request(s), per rank. Equal to committed_bytes
  // except where an engine reserves for phases it has not reached (vLLM's sliding-window groups).
  uint64_t reserved_at_admission_bytes = 0;
  // vLLM's DeepSeek-V4 pool: the bytes one block id costs whatever group owns it (0 elsewhere).
  uint64_t block_id_bytes = 0;
  // Bytes one rank holds or reserves per phase, in LedgerPhase order.
  std::vector<PhaseBytes> phases;
  // Models with windows: the three persistence strategies, and the boundaries a request of this
  // context has sealed (full block spans).
  std::vector<StrategyFigures> swa_strategies;
  uint64_t cached_boundaries = 0;
  uint64_t read_bytes_per_token = 0;  // per rank, one sequence
  uint64_t read_bytes_per_token_all_ranks = 0;
  uint64_t mha_equivalent_bytes = 0;
  uint64_t mha_bytes_per_token_per_layer = 0;
  Fraction mha_ratio;  // mha_equivalent_bytes / requested_bytes
  // Engine tessera: the cache groups its pools and arena hold (ComputeCacheLayout, the layout the
  // request manager builds its pools from). Empty for other engines.
  std::vector<CacheGroup> groups;

  const CacheLine* FindLine(std::string_view name) const;
  const LayerKindSummary* FindKind(LayerKind kind) const;
  uint64_t TermBytes(LedgerTerm term) const;  // 0 when absent
};

// Computes the ledger. Errors name the offending option or config field ("context", "batch",
// "kv-format", "block-tokens", "tp", "dcp", ...). Same as LedgerSweep(g, options).LedgerAt(
// options.context_tokens).
Result<Ledger> ComputeLedger(const Geometry& g, const LedgerOptions& options);

// Bytes one rank holds or reserves per phase, indexed by LedgerPhase.
using PhaseTotals = std::array<uint64_t, 3>;

// The ledger of one model and engine at many contexts (capacity planning searches contexts).
// Mapping the caches and planning the engine's pages do not depend on the context: they are done
// once, here; each context then prices only what does (blocks, phases, terms, totals, checks).
// For every context c, LedgerAt(c) is ComputeLedger(g, options with context_tokens = c), figures
// and errors alike; PhasesAt(c) is its phases, without copying the ledger out.
//
// `g` must outlive the sweep. Thread-safety: a sweep reuses one ledger between calls; use it
// from one thread at a time (distinct sweeps are independent).
class LedgerSweep {
 public:
  // options.context_tokens is not used: each call gives its context. Never fails; an option
  // error is returned by every call, as ComputeLedger would return it.
  LedgerSweep(const Geometry& g, const LedgerOptions& options);
  ~LedgerSweep();
  // A moved-from sweep may only be destroyed or assigned to.
  LedgerSweep(LedgerSweep&&) noexcept;
  LedgerSweep& operator=(LedgerSweep&&) noexcept;

  Result<Ledger> LedgerAt(uint64_t context);
  Result<PhaseTotals> PhasesAt(uint64_t context);
  // The main record format as the ledger resolves it (empty when the options are refused).
  const std::string& kv_format() const;

 private:
  struct State;
  Status Price(uint64_t context);
  std::unique_ptr<State> s_;
};

}  // namespace tessera
