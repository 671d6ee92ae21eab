// SGLang's sizing rules (docs/ENGINES.md), checked against SGLang's own pool, allocator and
// scheduler code run for one request per case (tests/sglang_profile_test.cc):
// - dense models: one page pool (MLATokenToKVPool, DSATokenToKVPool with its indexer pages,
//   MHATokenToKVPool) in pages of the kernel's page size (FlashMLA 64, --block-tokens, MHA 1);
// - DeepSeek-V4: compressed and indexer caches addressed by the request's 256-token "full" pages,
//   the window in 256-token SWA pages (padded to the v4-fp8 alignment) that SGLang frees only
//   behind the window and late, each SWA page carrying its C4 compressor-state ring rows, and the
//   C128 compressor state in a per-request ring;
// - admission: PrefillAdder.add_one_req's gate, which reserves the prompt, SGLang's default
//   max_new_tokens and a page;
// - decode: held after the first decode step (the sampled token's page).
// SGLang sizes one shared pool from free memory; the ledger reports what one request takes from it.

#include <algorithm>

#include "engine_profile.h"

namespace tessera::detail {
namespace {

constexpr uint32_t kSglangMhaPageTokens = 1;
// SamplingParams.max_new_tokens's default; PrefillAdder.add_one_req reserves
// min(max_new_tokens, CLIP_MAX_NEW_TOKENS = 4096) of them.
constexpr uint64_t kSglangDefaultMaxNewTokens = 128;

// Pages that must be free for PrefillAdder.add_one_req to admit an n-token prompt: the full pool
// must hold more than n + max_new_tokens + a page (the gate is `total_tokens >= rem_total_tokens`).
Checked AdmissionPages(uint64_t n, uint64_t page) {
  Checked need = Checked(n) + kSglangDefaultMaxNewTokens + page;
  if (need.overflowed()) return need;
  return Checked(need.value() / page) + 1;
}

// How SGLang keeps DeepSeek-V4's window (SWATokenToKVPoolAllocator with a chunk cache, the
// overlap scheduler on, its defaults): every token written gets an SWA slot in `page`-token
// pages; before prefill chunk k >= 2 ScheduleBatch.maybe_evict_swa frees the pages wholly before
// (k step - C) - W (free_swa_out_of_window_slots at prefix - C: the overlap scheduler evicts one
// chunk late);
// the first decode step evicts nothing (decode_batch_idx 0).
struct SglangSwa {
  uint64_t page = 0;    // SWA page tokens (= the full page)
  uint64_t window = 0;  // the model's sliding window W
  uint64_t chunk = 0;   // chunked_prefill_size C
  uint64_t step = 0;    // tokens per prefill chunk: C floored to a page (PrefillAdder's trunc_len)

  // Tokens freed before chunk k.
  uint64_t Evicted(uint64_t k) const {
    if (k < 2) return 0;
    Checked pre = Checked(k) * step;
    Checked behind = Checked(chunk) + window;
    if (pre.overflowed() || pre.value() <= behind.value()) return 0;
    return (pre.value() - behind.value()) / page * page;
  }
  uint64_t Chunks(uint64_t n) const { return CeilDiv(n, step); }
  // Tokens written after chunk k.
  uint64_t Written(uint64_t n, uint64_t k) const {
    Checked end = (Checked(k) + 1) * step;
    return end.overflowed() ? n : std::min(n, end.value());
  }
};

class SglangProfile final : public EngineProfile {
 public:
  using EngineProfile::EngineProfile;

  Status Plan(Ledger& ledger) override {
    TESSERA_RETURN_IF_ERROR(RefuseUnmodelledLayers(in_, ledger));
    if (!in_.g.is_hybrid) {
      TESSERA_RETURN_IF_ERROR(PageDenseModel(in_, Kernel::kFlashMla, kSglangMhaPageTokens, "SGLang default page size 1",
                                             ledger, policies_));
      return LayPages(ledger);
    }
    TESSERA_ASSIGN_OR_RETURN(uint32_t full, ServedV4BlockTokens(in_, ledger));
    const uint64_t align = ServedV4Alignment(in_.caches.main_format);
    policies_.assign(ledger.lines.size(), Policy{});
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      const CacheLine& l = ledger.lines[i];
      Policy& p = policies_[i];
      switch (l.role) {
        case CacheRole::kCompressed:
        case CacheRole::kIndexer:  // addressed by the full page: its 256 / ratio entries, indexer pages unpadded
          p = Policy{.in_pages = true,
                     .block_tokens = full,
                     .entry_tokens = l.compress_ratio,
                     .alignment = l.role == CacheRole::kCompressed ? align : 1,
                     .by_tokens = true,
                     .window = 0};
          break;
        case CacheRole::kWindow:  // the SWA pool: pages of the full page's tokens
          p = Policy{.in_pages = true,
                     .block_tokens = full,
                     .entry_tokens = 1,
                     .alignment = align,
                     .by_tokens = true,
                     .window = 0};
          swa_.window = std::max<uint64_t>(swa_.window, l.slots);
          break;
        default:  // compressor states: C4 rows ride on the SWA pages, C128 in a per-request ring
          break;
      }
    }
    swa_.page = full;
    swa_.chunk = std::max<uint64_t>(1, in_.options.prefill_chunk_tokens);
    swa_.step = std::max<uint64_t>(full, swa_.chunk / full * full);
    if (swa_.chunk < full) {
      ledger.notes.push_back("SGLang cannot schedule a prefill chunk under one " + std::to_string(full) +
                             "-token page; priced with one-page chunks");
    }
    ledger.notes.push_back(
        "SGLang keeps the window in " + std::to_string(full) +
        "-token SWA pages freed one chunk late behind the window (chunk cache, overlap scheduler), each with "
        "its C4 compressor-state ring; the C128 state in a per-request ring");
    return LayPages(ledger);
  }

  // Held after the first decode step: n + 1 tokens (the sampled token's slot is page rounding).
  RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const override {
    const uint32_t k = in_.options.spec_tokens;
    if (!in_.g.is_hybrid) {
      RankCost rc;
      for (size_t i = 0; i < ledger.lines.size(); ++i) {
        const CacheLine& line = ledger.lines[i];
        const Policy& p = policies_[i];
        rc.AddLine(PagedCost(line, p, tokens, Blocks(p, line.page, tokens + 1), Blocks(p, line.page, tokens + 1 + k)));
      }
      return rc;
    }
    const uint64_t evicted = tokens == 0 ? 0 : swa_.Evicted(swa_.Chunks(tokens) - 1);
    return V4Cost(ledger, tokens, tokens + 1, evicted);
  }

  Checked Admission(const Ledger& ledger, uint64_t tokens) const override {
    if (!in_.g.is_hybrid) return PagesCost(ledger, AdmissionPages(tokens, ledger.block_tokens), Checked(0));
    // Full pool as for a dense model; the SWA pool must fit the first chunk beyond the window plus
    // the window and a page (PrefillAdder._swa_budget_for_req) or, failing that, one page more
    // than the window and a page, the chunk then shrunk to fit (_swa_chunk_cap).
    const uint64_t page = swa_.page;
    const uint64_t first = std::min<uint64_t>(CeilDiv(tokens, page) * page, swa_.chunk);
    const uint64_t budget = (first > swa_.window ? first - swa_.window : 0) + swa_.window + page;
    const uint64_t swa_pages = std::min(budget / page + 1, CeilDiv(swa_.window + 2 * page, page));
    return PagesCost(ledger, AdmissionPages(tokens, page), Checked(swa_pages));
  }

  // Dense: the prompt's pages. DeepSeek-V4: the most full and SWA pages held after any prefill
  // chunk; after chunk k >= 2 (a whole chunk) the SWA pages held are the same, so chunks 0, 1, 2
  // and the last two are the candidates.
  Checked PrefillPeak(const Ledger& ledger, uint64_t tokens) const override {
    if (!in_.g.is_hybrid) return PagesCost(ledger, Checked(CeilDiv(tokens, ledger.block_tokens)), Checked(0));
    if (tokens == 0) return V4Cost(ledger, 0, 0, 0).committed;
    const uint64_t chunks = swa_.Chunks(tokens);
    Checked peak(0);
    for (uint64_t c : {uint64_t{0}, uint64_t{1}, uint64_t{2}, chunks - std::min<uint64_t>(chunks, 2), chunks - 1}) {
      if (c >= chunks) continue;
      const uint64_t written = swa_.Written(tokens, c);
      Checked bytes = V4Cost(ledger, written, written, swa_.Evicted(c)).committed;
      if (bytes.overflowed()) return bytes;
      peak = std::max(peak.value(), bytes.value());
    }
    return peak;
  }

 private:
  // DeepSeek-V4 with `written` tokens cached, `slots` token slots allocated (written + 1 after a
  // decode step) and `evicted` window tokens freed: full pages for the compressed caches, SWA
  // pages from the first unfreed token, their C4 state rows, the C128 ring.
  RankCost V4Cost(const Ledger& ledger, uint64_t written, uint64_t slots, uint64_t evicted) const {
    const uint32_t k = in_.options.spec_tokens;
    const uint64_t full_pages = CeilDiv(slots, swa_.page);
    const uint64_t swa_pages = full_pages - evicted / swa_.page;
    const uint64_t held = written - evicted;  // window records still held
    RankCost rc;
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      const CacheLine& line = ledger.lines[i];
      const Policy& p = policies_[i];
      if (line.role == CacheRole::kWindow) {
        rc.AddLine(WindowCost(line, held, swa_pages));
      } else if (p.in_pages) {
        rc.AddLine(PagedCost(line, p, written, full_pages, CeilDiv(slots + k, swa_.page)));
      } else if (line.layer_kind == LayerKind::kCsa) {
        rc.AddLine(C4StateCost(line, written, swa_pages, k));
      } else {
        rc.AddLine(RingCost(line, written, k));
      }
    }
    return rc;
  }

  // The SWA pages a request holds: records for the tokens not yet freed, the rest of the last page
  // rounding, the pages' alignment padding.
  static LineCost WindowCost(const CacheLine& line, uint64_t held, uint64_t pages) {
    LineCost c;
    const uint64_t record = line.format.record_bytes();
    const Checked layers(line.layers);
    c.terms.emplace_back(LedgerTerm::kRecords, layers * held * record);
    c.terms.emplace_back(LedgerTerm::kPageRounding,
                         layers * (Checked(pages) * line.page.entries_per_block - held) * record);
    c.terms.emplace_back(LedgerTerm::kAlignmentPadding, layers * pages * line.page.padding_bytes);
    c.committed = layers * pages * line.page.page_bytes;
    return c;
  }

  // C4 compressor state (attention and indexer): the ring rows of every SWA page held
  // (CompressStatePool.translate_from_swa_loc_to_state_loc), the rows beyond the live ring being
  // ring capacity; the ring doubles under speculative decoding.
  static LineCost C4StateCost(const CacheLine& line, uint64_t written, uint64_t pages, uint32_t k) {
    LineCost c;
    const uint64_t record = line.format.record_bytes();
    const Checked layers(line.layers);
    const uint64_t live = std::min<uint64_t>(written, line.slots);
    Checked rows = Checked(pages) * line.slots;
    c.terms.emplace_back(LedgerTerm::kRecords, layers * live * record);
    c.terms.emplace_back(LedgerTerm::kRingCapacity, layers * (rows - live) * record);
    c.terms.emplace_back(LedgerTerm::kSpeculativeSlots, k > 0 ? layers * rows * record : Checked(0));
    c.committed = layers * rows * (k > 0 ? 2 : 1) * record;
    return c;
  }

  // Bytes of `pages` pages of every paged line — for DeepSeek-V4 `pages` full pages of the
  // compressed caches and `swa_pages` SWA pages with their C4 state rows — plus the rings.
  Checked PagesCost(const Ledger& ledger, Checked pages, Checked swa_pages) const {
    const uint32_t k = in_.options.spec_tokens;
    Checked bytes(0);
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      const CacheLine& line = ledger.lines[i];
      const Checked layers(line.layers);
      if (line.role == CacheRole::kWindow) {
        bytes += layers * swa_pages * line.page.page_bytes;
      } else if (policies_[i].in_pages) {
        bytes += layers * pages * line.page.page_bytes;
      } else if (line.layer_kind == LayerKind::kCsa) {
        bytes += layers * swa_pages * line.slots * (k > 0 ? 2 : 1) * line.format.record_bytes();
      } else {
        bytes += RingCost(line, 0, k).committed;
      }
    }
    return bytes;
  }

  SglangSwa swa_;
};

}  // namespace

std::unique_ptr<EngineProfile> MakeSglangProfile(const EngineInputs& in) { return std::make_unique<SglangProfile>(in); }

}  // namespace tessera::detail
