// Engine profiles: how Tessera, vLLM and SGLang keep the caches of a model. A profile decides
// which caches live in pages and with what page layout (its policies), what one request costs
// on one rank, the most it holds during a chunked prefill, and what admission needs free. One
// implementation per engine — tessera_profile.cc, vllm_profile.cc, sglang_profile.cc — over the
// shared cost helpers below; ComputeLedger drives them and turns their per-rank figures into the
// ledger's totals, terms and phases.
//
// The page arithmetic itself is layout's (ComputePageLayout, and ComputeCacheLayout for Tessera,
// shared with the pools). Sources for the vLLM and SGLang rules are in docs/ENGINES.md.
//
// Internal to the ledger module. Thread-safety: a profile is built, planned and used by one
// ComputeLedger call or one LedgerSweep (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/checked.h"
#include "tessera/layout.h"
#include "tessera/ledger.h"

namespace tessera::detail {

// Entries a cache holds after `tokens` tokens at `ratio` tokens per entry (complete groups).
Checked Entries(uint64_t tokens, uint32_t ratio);
// Blocks of `block_tokens` that hold any of the last `window` tokens of a `tokens`-long
// sequence (the blocks a sliding-window group keeps after freeing those wholly behind it).
uint64_t WindowBlocksHeld(uint64_t tokens, uint64_t window, uint64_t block_tokens);

// How an engine keeps one cache line.
struct Policy {
  bool in_pages = false;      // false: a per-request ring (arena)
  uint32_t block_tokens = 0;  // tokens one block spans
  uint32_t entry_tokens = 1;  // tokens per entry inside a page
  uint64_t alignment = 0;     // page alignment; 0: the format's own
  bool by_tokens = false;     // a block per block_tokens tokens, complete entries or not
  uint64_t window = 0;        // > 0: only blocks holding the last `window` tokens are kept
};
// Blocks a paged line holds after `tokens` tokens.
uint64_t Blocks(const Policy& p, const PageLayout& page, uint64_t tokens);

// What one line costs one request on one rank.
struct LineCost {
  Checked committed;                                  // with speculative slots
  std::vector<std::pair<LedgerTerm, Checked>> terms;  // committed, decomposed
};
// A paged line holding `blocks_n` blocks at n tokens and `blocks_nk` with the draft tokens.
LineCost PagedCost(const CacheLine& line, const Policy& p, uint64_t n, uint64_t blocks_n, uint64_t blocks_nk);
// A per-request ring allocated whole: `slots` records, plus `k` slots for draft tokens in a window
// ring; a compressor ring doubles under speculative decoding.
LineCost RingCost(const CacheLine& line, uint64_t n, uint32_t k);

// One request on one rank: per line and summed by term.
struct RankCost {
  Checked committed;
  std::map<LedgerTerm, Checked> terms;  // in LedgerTerm order, the order outputs list them
  std::vector<LineCost> lines;          // one per ledger line
  void AddLine(LineCost cost);
  // A term of the whole request (not of one line), added to committed.
  void AddTerm(LedgerTerm term, Checked bytes);
};

// What a cached block boundary can keep of the window state (models with windows): every
// layer's window ring, and the previous-group rows of the overlapping (CSA) compressors — at a
// boundary every compression group is complete.
struct BoundaryBytes {
  uint64_t window_tokens = 0;  // 0: the model has no window
  uint64_t window = 0;
  uint64_t compressor = 0;
};
// Errors: kOutOfRange on "sliding_window" when the figures overflow 64 bits.
Result<BoundaryBytes> WindowBoundaryBytes(const std::vector<CacheLine>& lines);

// The layout options the ledger's options imply.
CacheLayoutOptions LayoutOptionsOf(const LedgerOptions& options);

// What every profile is given (the profile keeps references). Fixed for the profile's life but
// for options.context_tokens: a LedgerSweep plans a profile once and prices many contexts over
// it, setting the context before each. So Plan must not read the context, and the per-context
// figures (CostPerRank, Admission, PrefillPeak, AllRanks) read it at call time, never a copy
// Plan made (tests/ledger_sweep_test.cc compares every engine against fresh ledgers).
struct EngineInputs {
  const Geometry& g;
  const LedgerOptions& options;
  const CacheMap& caches;
};

class EngineProfile {
 public:
  explicit EngineProfile(const EngineInputs& in) : in_(in) {}
  virtual ~EngineProfile() = default;
  EngineProfile(const EngineProfile&) = delete;
  EngineProfile& operator=(const EngineProfile&) = delete;

  // The policies: per ledger line whether it lives in pages and with what page layout. Fills the
  // ledger's block_tokens, block_reasons and notes (and block_id_bytes, groups where the engine
  // has them) and each line's in_pages and page. Errors name the option ("block-tokens", "dcp",
  // "swa-strategy", ...).
  virtual Status Plan(Ledger& ledger) = 0;
  // What one request holds on one rank with `tokens` tokens cached, draft slots included.
  // REQUIRES: Plan succeeded on `ledger`.
  virtual RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const = 0;
  // What must be free on one rank to admit a request of `tokens` tokens there. By default what
  // its first prefill chunk holds.
  virtual Checked Admission(const Ledger& ledger, uint64_t tokens) const;
  // The most one rank holds while `tokens` tokens are written in prefill chunks. By default the
  // final holding: holdings only grow with the tokens written.
  virtual Checked PrefillPeak(const Ledger& ledger, uint64_t tokens) const;
  // Committed bytes of one request over all tensor-parallel ranks, given the busiest rank's. By
  // default every rank allocates the busiest rank's blocks.
  virtual Checked AllRanks(const Ledger& ledger, const RankCost& busiest) const;

 protected:
  // Sets every line's in_pages from its policy and lays out the pages of the paged ones.
  Status LayPages(Ledger& ledger) const;
  // Each line at its policy, summed (no cost shared between lines).
  RankCost SumLineCosts(const Ledger& ledger, uint64_t tokens) const;

  const EngineInputs in_;
  std::vector<Policy> policies_;  // one per ledger line, set by Plan
};

std::unique_ptr<EngineProfile> MakeTesseraProfile(const EngineInputs& in);
std::unique_ptr<EngineProfile> MakeVllmProfile(const EngineInputs& in);
std::unique_ptr<EngineProfile> MakeSglangProfile(const EngineInputs& in);
std::unique_ptr<EngineProfile> MakeEngineProfile(Engine engine, const EngineInputs& in);

// The page rules vLLM and SGLang share.
//
// Models with sliding-window MHA/GQA layers or linear-attention layers (gpt-oss, MiMo, Step,
// Qwen3-Next/3.5, Kimi-Linear/K3): the engines' hybrid allocators for them (vLLM's
// SlidingWindowSpec/MambaSpec groups with a shared page size, SGLang's SWA and Mamba pools) are
// not modelled, so their profile refuses the model naming "engine" rather than price it as
// dense (ADR 0033). OK for every other model.
Status RefuseUnmodelledLayers(const EngineInputs& in, const Ledger& ledger);
//
// DeepSeek-V4: compressed caches (and the indexer) in 256-token blocks, or --block-tokens checked
// against the ratios. Sets the ledger's block span and its reason, and notes a main record other
// than the one both engines serve V4 with.
Result<uint32_t> ServedV4BlockTokens(const EngineInputs& in, Ledger& ledger);
// The page alignment both engines apply to DeepSeek-V4 pages: the v4-fp8 record's (576 B); none
// for another record.
uint64_t ServedV4Alignment(const RecordFormat& main_format);
// Models without DeepSeek-V4's hybrid layers: every line in unpadded pages, a block per block
// span of tokens — `mla_kernel`'s pages for MLA (KernelPageEntries; FlashMLA's 64 for kGeneric),
// `mha_block_tokens` (the engine's default, given as `mha_reason`) for MHA/GQA, --block-tokens
// over either. Sets the ledger's block span.
Status PageDenseModel(const EngineInputs& in, Kernel mla_kernel, uint32_t mha_block_tokens, std::string mha_reason,
                      Ledger& ledger, std::vector<Policy>& policies);

}  // namespace tessera::detail
