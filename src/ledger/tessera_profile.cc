// Tessera's own pools: the caches that grow with the context in pages of one block span derived
// by layout (ComputeCacheLayout: the same groups and pages the request manager builds its pools
// from), one block id per span for every paged group at once with its host metadata (header and
// token ids), window rings and compressor state in a per-request arena sized once, and the window
// state a sealed block boundary keeps under the snapshot and retain strategies.

#include <algorithm>

#include "engine_profile.h"

namespace tessera::detail {
namespace {

// Window chunks of `window` tokens that hold any of the last `window` tokens.
uint64_t LiveWindowChunks(uint64_t tokens, uint64_t window) {
  if (tokens == 0) return 0;
  uint64_t first = tokens > window ? (tokens - window) / window : 0;
  return (tokens - 1) / window - first + 1;
}

// Retain: a window ring kept as chunks of `window` tokens, each allocated whole.
LineCost ChunkedWindowCost(const CacheLine& line, uint64_t n, uint32_t k) {
  LineCost c;
  const uint64_t record = line.format.record_bytes();
  const Checked layers(line.layers);
  const uint64_t live = std::min<uint64_t>(n, line.slots);
  Checked committed_n = layers * LiveWindowChunks(n, line.slots) * line.slots * record;
  Checked committed_nk = layers * LiveWindowChunks(n + k, line.slots) * line.slots * record;
  c.terms.emplace_back(LedgerTerm::kRecords, layers * live * record);
  c.terms.emplace_back(LedgerTerm::kRingCapacity, committed_n - layers * live * record);
  c.terms.emplace_back(LedgerTerm::kSpeculativeSlots, committed_nk - committed_n);
  c.committed = committed_nk;
  return c;
}

class TesseraProfile final : public EngineProfile {
 public:
  using EngineProfile::EngineProfile;

  Status Plan(Ledger& ledger) override {
    TESSERA_ASSIGN_OR_RETURN(CacheLayout layout, LayoutCaches(in_.g, in_.caches, LayoutOptionsOf(in_.options)));
    ledger.block_tokens = layout.block.block_tokens;
    ledger.block_reasons = layout.block.reasons;
    for (const std::string& n : layout.block.notes) ledger.notes.push_back("block-tokens " + n);
    if (in_.g.is_hybrid) {
      ledger.notes.push_back("window rings and compressor state live in a per-request arena, sized once");
    }
    policies_.assign(ledger.lines.size(), Policy{});
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      CacheLine& line = ledger.lines[i];
      line.in_pages = line.grows;
      if (!line.grows) continue;  // window ring and compressor state: per-request arena
      policies_[i].in_pages = true;
      policies_[i].block_tokens = layout.block.block_tokens;
      policies_[i].entry_tokens = line.compress_ratio;
      line.page = layout.groups[layout.group_of_line[i]].page;
    }
    ledger.groups = layout.groups;
    TESSERA_ASSIGN_OR_RETURN(boundary_, WindowBoundaryBytes(ledger.lines));
    return CheckWindowStrategy(layout, in_.options.swa_strategy);
  }

  RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const override {
    const LedgerOptions& o = in_.options;
    // One block id holds a page in every paged group of the span, so every paged line holds as
    // many blocks as the one that needs the most.
    uint64_t span_n = 0, span_nk = 0;
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      if (!policies_[i].in_pages) continue;
      span_n = std::max(span_n, Blocks(policies_[i], ledger.lines[i].page, tokens));
      span_nk = std::max(span_nk, Blocks(policies_[i], ledger.lines[i].page, tokens + o.spec_tokens));
    }
    const bool retain = o.swa_strategy == SwaStrategy::kRetain;
    RankCost rc;
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      const CacheLine& line = ledger.lines[i];
      if (policies_[i].in_pages) {
        rc.AddLine(PagedCost(line, policies_[i], tokens, span_n, span_nk));
      } else if (retain && line.role == CacheRole::kWindow) {
        rc.AddLine(ChunkedWindowCost(line, tokens, o.spec_tokens));
      } else {
        rc.AddLine(RingCost(line, tokens, o.spec_tokens));
      }
    }
    // A packed page's padding once per page (its lines carry their slices only).
    for (const CacheGroup& group : ledger.groups) {
      if (!group.in_pages) continue;
      const uint64_t padding = PackedPaddingPerBlock(group.page, group.layers);
      if (padding == 0) continue;
      rc.AddTerm(LedgerTerm::kAlignmentPadding, Checked(span_n) * padding);
      rc.AddTerm(LedgerTerm::kSpeculativeSlots, Checked(span_nk - span_n) * padding);
    }
    // Host metadata once per block id.
    rc.AddTerm(LedgerTerm::kBlockMetadata, Checked(span_nk) * BlockMetadataBytes(ledger.block_tokens));
    if (boundary_.window_tokens > 0 && o.swa_strategy != SwaStrategy::kRecompute) {
      rc.AddTerm(LedgerTerm::kBoundaryState, KeptAtBoundaries(ledger, tokens));
    }
    return rc;
  }

  // Decode context parallelism interleaves the tokens over dcp ranks: `extra` of them hold one
  // token more than the others; tensor-parallel ranks beyond dcp replicate.
  Checked AllRanks(const Ledger& ledger, const RankCost& busiest) const override {
    const LedgerOptions& o = in_.options;
    const uint64_t q = o.context_tokens / o.dcp;
    const uint64_t extra = o.context_tokens % o.dcp;
    RankCost lighter = CostPerRank(ledger, q);
    return (Checked(extra) * busiest.committed + Checked(o.dcp - extra) * lighter.committed) * (o.tp / o.dcp);
  }

 private:
  // Window state kept for the boundaries a request of `tokens` tokens has sealed.
  Checked KeptAtBoundaries(const Ledger& ledger, uint64_t tokens) const {
    const uint64_t window_tokens = boundary_.window_tokens;
    uint64_t boundaries = tokens / ledger.block_tokens;
    Checked kept = Checked(boundaries) * boundary_.compressor;
    if (in_.options.swa_strategy == SwaStrategy::kSnapshot) return kept + Checked(boundaries) * boundary_.window;
    // Retain: window chunks that are no longer among the request's live chunks.
    uint64_t first_live = tokens > window_tokens ? (tokens - window_tokens) / window_tokens : 0;
    // (first_live + 1) x window <= tokens, so this product cannot overflow.
    uint64_t below = CeilDiv((first_live + 1) * window_tokens, ledger.block_tokens);
    uint64_t retained = std::min(boundaries, below > 0 ? below - 1 : 0);
    return kept + Checked(retained) * boundary_.window;
  }

  BoundaryBytes boundary_;
};

}  // namespace

std::unique_ptr<EngineProfile> MakeTesseraProfile(const EngineInputs& in) {
  return std::make_unique<TesseraProfile>(in);
}

}  // namespace tessera::detail
