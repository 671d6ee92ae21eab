// The cost helpers every engine profile shares, the profiles' defaults, and the page rules vLLM
// and SGLang have in common.

#include "engine_profile.h"

#include <algorithm>

namespace tessera::detail {
namespace {

constexpr uint32_t kFlashMlaBlockTokens = 64;
constexpr uint32_t kV4FullBlockTokens = 256;

// The compress ratios of the caches that grow with the context (1 for per-token caches).
std::vector<uint32_t> PagedRatios(const Ledger& ledger) {
  std::vector<uint32_t> ratios;
  for (const CacheLine& l : ledger.lines) {
    if (l.grows) ratios.push_back(l.compress_ratio);
  }
  return ratios;
}

}  // namespace

Checked Entries(uint64_t tokens, uint32_t ratio) { return Checked(ratio <= 1 ? tokens : tokens / ratio); }

uint64_t WindowBlocksHeld(uint64_t tokens, uint64_t window, uint64_t block_tokens) {
  if (tokens == 0) return 0;
  uint64_t first = tokens > window ? tokens - window : 0;
  return CeilDiv(tokens, block_tokens) - first / block_tokens;
}

uint64_t Blocks(const Policy& p, const PageLayout& page, uint64_t tokens) {
  if (p.window > 0) return WindowBlocksHeld(tokens, p.window, p.block_tokens);
  if (p.by_tokens) return CeilDiv(tokens, p.block_tokens);
  return CeilDiv(Entries(tokens, p.entry_tokens).value(), page.entries_per_block);
}

LineCost PagedCost(const CacheLine& line, const Policy& p, uint64_t n, uint64_t blocks_n, uint64_t blocks_nk) {
  LineCost c;
  const uint64_t record = line.format.record_bytes();
  const Checked layers(line.layers);
  const PageLayout& page = line.page;
  uint64_t live = p.window > 0 ? std::min<uint64_t>(n, p.window) : Entries(n, p.entry_tokens).value();
  // A layer's share of a block: its page, or the data of its slice of a packed page (whose
  // padding the profile charges once per page: PackedPaddingPerBlock).
  const uint64_t per_layer = page.packed() ? page.data_bytes : page.page_bytes;
  Checked committed_n = layers * blocks_n * per_layer;
  Checked committed_nk = layers * blocks_nk * per_layer;
  c.terms.emplace_back(LedgerTerm::kRecords, layers * live * record);
  c.terms.emplace_back(LedgerTerm::kPageRounding,
                       layers * (Checked(blocks_n) * page.entries_per_block - live) * record);
  c.terms.emplace_back(LedgerTerm::kAlignmentPadding, layers * blocks_n * (page.packed() ? 0 : page.padding_bytes));
  c.terms.emplace_back(LedgerTerm::kSpeculativeSlots, committed_nk - committed_n);
  c.committed = committed_nk;
  return c;
}

LineCost RingCost(const CacheLine& line, uint64_t n, uint32_t k) {
  LineCost c;
  const uint64_t record = line.format.record_bytes();
  const Checked layers(line.layers);
  uint64_t live = std::min<uint64_t>(n, line.slots);
  uint64_t spec_slots = 0;
  if (k > 0) spec_slots = line.role == CacheRole::kWindow ? k : line.slots;  // compressor rings double
  c.terms.emplace_back(LedgerTerm::kRecords, layers * live * record);
  c.terms.emplace_back(LedgerTerm::kRingCapacity, layers * (line.slots - live) * record);
  c.terms.emplace_back(LedgerTerm::kSpeculativeSlots, layers * spec_slots * record);
  c.committed = layers * (Checked(line.slots) + spec_slots) * record;
  return c;
}

void RankCost::AddLine(LineCost cost) {
  committed += cost.committed;
  for (const auto& [term, bytes] : cost.terms) terms[term] += bytes;
  lines.push_back(std::move(cost));
}

void RankCost::AddTerm(LedgerTerm term, Checked bytes) {
  terms[term] += bytes;
  committed += bytes;
}

Result<BoundaryBytes> WindowBoundaryBytes(const std::vector<CacheLine>& lines) {
  Checked window(0), compressor(0);
  BoundaryBytes b;
  for (const CacheLine& l : lines) {
    if (l.role == CacheRole::kWindow) {
      window += Checked(l.layers) * l.slots * l.format.record_bytes();
      b.window_tokens = std::max<uint64_t>(b.window_tokens, l.slots);
    } else if ((l.role == CacheRole::kCompressorState || l.role == CacheRole::kIndexerCompressorState) &&
               l.layer_kind == LayerKind::kCsa) {
      // The overlapping compressor's ring holds two groups: the previous one is what a boundary keeps.
      compressor += Checked(l.layers) * (l.slots / 2) * l.format.record_bytes();
    }
  }
  // Sizes from the config alone (window x record x layers): checked, whatever the engine pages.
  if ((window + compressor).overflowed()) {
    return OutOfRange("sliding_window", "window state per cached boundary overflows 64 bits");
  }
  b.window = window.value();
  b.compressor = compressor.value();
  return b;
}

CacheLayoutOptions LayoutOptionsOf(const LedgerOptions& o) { return static_cast<const CacheLayoutOptions&>(o); }

Checked EngineProfile::Admission(const Ledger& ledger, uint64_t tokens) const {
  const uint64_t first_chunk = std::min(tokens, std::max<uint64_t>(1, in_.options.prefill_chunk_tokens));
  return CostPerRank(ledger, first_chunk).committed;
}

Checked EngineProfile::PrefillPeak(const Ledger& ledger, uint64_t tokens) const {
  return CostPerRank(ledger, tokens).committed;
}

Checked EngineProfile::AllRanks(const Ledger&, const RankCost& busiest) const {
  return busiest.committed * in_.options.tp;
}

Status EngineProfile::LayPages(Ledger& ledger) const {
  for (size_t i = 0; i < ledger.lines.size(); ++i) {
    CacheLine& line = ledger.lines[i];
    const Policy& p = policies_[i];
    line.in_pages = p.in_pages;
    if (!p.in_pages) continue;
    TESSERA_ASSIGN_OR_RETURN(line.page, ComputePageLayout(line.format, p.entry_tokens, p.block_tokens, p.alignment));
  }
  return Status::Ok();
}

RankCost EngineProfile::SumLineCosts(const Ledger& ledger, uint64_t tokens) const {
  RankCost rc;
  const uint32_t k = in_.options.spec_tokens;
  for (size_t i = 0; i < ledger.lines.size(); ++i) {
    const CacheLine& line = ledger.lines[i];
    const Policy& p = policies_[i];
    if (p.in_pages) {
      rc.AddLine(PagedCost(line, p, tokens, Blocks(p, line.page, tokens), Blocks(p, line.page, tokens + k)));
    } else {
      rc.AddLine(RingCost(line, tokens, k));
    }
  }
  return rc;
}

std::unique_ptr<EngineProfile> MakeEngineProfile(Engine engine, const EngineInputs& in) {
  switch (engine) {
    case Engine::kVllm:
      return MakeVllmProfile(in);
    case Engine::kSglang:
      return MakeSglangProfile(in);
    case Engine::kTessera:
      break;
  }
  return MakeTesseraProfile(in);
}

Status RefuseUnmodelledLayers(const EngineInputs& in, const Ledger& ledger) {
  if (in.g.is_hybrid) return Status::Ok();
  for (const CacheLine& l : ledger.lines) {
    if (l.role != CacheRole::kWindow && l.role != CacheRole::kLinearState) continue;
    const std::string engine = in.options.engine == Engine::kVllm ? "vLLM" : "SGLang";
    return InvalidArgument("engine", engine + "'s allocator for " + in.g.name + "'s " +
                                         std::string(LayerKindName(l.layer_kind)) + " layers (" + l.name +
                                         ") is not modelled; price it with --engine tessera");
  }
  return Status::Ok();
}

Result<uint32_t> ServedV4BlockTokens(const EngineInputs& in, Ledger& ledger) {
  const std::string engine(EngineName(in.options.engine));
  uint32_t full = kV4FullBlockTokens;
  if (in.options.block_tokens) {
    TESSERA_ASSIGN_OR_RETURN(BlockTokensChoice c,
                             ChooseBlockTokens(PagedRatios(ledger), true, Kernel::kGeneric, in.options.block_tokens));
    full = c.block_tokens;
  }
  ledger.block_tokens = full;
  ledger.block_reasons.push_back(engine + " DeepSeek-V4: compressed caches in " + std::to_string(full) +
                                 "-token blocks");
  const RecordFormat& main = in.caches.main_format;
  if (main.family != FormatFamily::kV4Fp8) {
    ledger.notes.push_back(engine + " serves DeepSeek-V4 with the v4-fp8 record; " + main.name +
                           " is priced with the same page rules, without the 576-B padding");
  }
  return full;
}

uint64_t ServedV4Alignment(const RecordFormat& main_format) {
  return main_format.family == FormatFamily::kV4Fp8 ? main_format.page_alignment : 1;
}

Status PageDenseModel(const EngineInputs& in, Kernel mla_kernel, uint32_t mha_block_tokens, std::string mha_reason,
                      Ledger& ledger, std::vector<Policy>& policies) {
  const bool mla = in.g.is_mla;
  const uint32_t mla_page = KernelPageEntries(mla_kernel) > 0 ? KernelPageEntries(mla_kernel) : kFlashMlaBlockTokens;
  uint32_t bt = mla ? mla_page : mha_block_tokens;
  if (in.options.block_tokens) {
    TESSERA_ASSIGN_OR_RETURN(BlockTokensChoice c,
                             ChooseBlockTokens(PagedRatios(ledger), mla, Kernel::kGeneric, in.options.block_tokens));
    bt = c.block_tokens;
  }
  ledger.block_tokens = bt;
  ledger.block_reasons.push_back(mla ? std::string(EngineName(in.options.engine)) + " with " +
                                           std::string(KernelName(mla_kernel)) + ": " + std::to_string(mla_page) +
                                           "-token pages"
                                     : std::move(mha_reason));
  policies.assign(
      ledger.lines.size(),
      Policy{.in_pages = true, .block_tokens = bt, .entry_tokens = 1, .alignment = 1, .by_tokens = true, .window = 0});
  return Status::Ok();
}

}  // namespace tessera::detail
