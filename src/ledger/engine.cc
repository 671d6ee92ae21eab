// Engine profiles. Each engine decides, per cache line, whether the cache lives in pages or in
// a per-request arena, the tokens per block, the page alignment, and how blocks are counted.
// The page arithmetic itself is layout's (ComputePageLayout), shared with the pools.
//
// Sources for the vLLM and SGLang rules are listed in docs/ENGINES.md.

#include "engine.h"

#include <algorithm>
#include <map>

namespace tessera::detail {
namespace {

// vLLM's default max_num_batched_tokens: the prefill chunk a sliding-window group reserves for.
constexpr uint64_t kVllmMaxBatchedTokens = 8192;
constexpr uint32_t kFlashMlaBlockTokens = 64;
constexpr uint32_t kV4FullBlockTokens = 256;
constexpr uint32_t kV4WindowBlockTokens = 64;

struct Policy {
  bool in_pages = false;
  uint32_t block_tokens = 0;
  uint32_t entry_tokens = 1;  // tokens per entry inside a page
  uint64_t alignment = 0;     // 0: the format's own
  bool by_tokens = false;     // engine allocates a block per block_tokens tokens, complete entries or not
  uint64_t window = 0;        // > 0: only blocks holding the last `window` tokens are kept
};

uint64_t Blocks(const Policy& p, const PageLayout& page, uint64_t tokens) {
  if (p.window > 0) return WindowBlocksHeld(tokens, p.window, p.block_tokens);
  if (p.by_tokens) return CeilDiv(tokens, p.block_tokens);
  return CeilDiv(Entries(tokens, p.entry_tokens).value(), page.entries_per_block);
}

struct LineCost {
  Checked committed;  // with speculative slots
  std::vector<std::pair<std::string, Checked>> terms;
  uint64_t blocks_with_spec = 0;
};

// Window chunks of `window` tokens that hold any of the last `window` (+ k draft) tokens.
uint64_t LiveWindowChunks(uint64_t tokens, uint64_t window) {
  if (tokens == 0) return 0;
  uint64_t first = tokens > window ? (tokens - window) / window : 0;
  return (tokens - 1) / window - first + 1;
}

struct SpanBlocks {
  uint64_t at_n = 0;
  uint64_t at_nk = 0;
};

// `span`: Tessera allocates one block id for every group of a block span at once, so a paged
// line holds as many blocks as the group that needs the most. `retain`: window rows live in
// chunks of `window` tokens instead of a ring.
LineCost Cost(const CacheLine& line, const Policy& p, uint64_t n, uint32_t k, const SpanBlocks* span, bool retain) {
  LineCost c;
  const uint64_t record = line.format.record_bytes();
  const Checked layers(line.layers);
  if (p.in_pages) {
    const PageLayout& page = line.page;
    uint64_t b_n = span != nullptr ? span->at_n : Blocks(p, page, n);
    uint64_t b_nk = span != nullptr ? span->at_nk : Blocks(p, page, n + k);
    uint64_t live = p.window > 0 ? std::min<uint64_t>(n, p.window) : Entries(n, p.entry_tokens).value();
    Checked committed_n = layers * b_n * page.page_bytes;
    Checked committed_nk = layers * b_nk * page.page_bytes;
    c.terms.emplace_back("records", layers * live * record);
    c.terms.emplace_back("page_rounding", layers * (Checked(b_n) * page.entries_per_block - live) * record);
    c.terms.emplace_back("alignment_padding", layers * b_n * page.padding_bytes);
    c.terms.emplace_back("speculative_slots", committed_nk - committed_n);
    c.committed = committed_nk;
    c.blocks_with_spec = b_nk;
    return c;
  }
  uint64_t live = std::min<uint64_t>(n, line.slots);
  if (retain && line.role == CacheRole::kWindow) {
    Checked committed_n = layers * LiveWindowChunks(n, line.slots) * line.slots * record;
    Checked committed_nk = layers * LiveWindowChunks(n + k, line.slots) * line.slots * record;
    c.terms.emplace_back("records", layers * live * record);
    c.terms.emplace_back("ring_capacity", committed_n - layers * live * record);
    c.terms.emplace_back("speculative_slots", committed_nk - committed_n);
    c.committed = committed_nk;
    return c;
  }
  uint64_t spec_slots = 0;
  if (k > 0) spec_slots = line.role == CacheRole::kWindow ? k : line.slots;  // compressor rings double
  c.terms.emplace_back("records", layers * live * record);
  c.terms.emplace_back("ring_capacity", layers * (line.slots - live) * record);
  c.terms.emplace_back("speculative_slots", layers * spec_slots * record);
  c.committed = layers * (Checked(line.slots) + spec_slots) * record;
  return c;
}

uint64_t ReadEntries(const CacheLine& line, const Geometry& g, uint64_t n) {
  switch (line.role) {
    case CacheRole::kKv:
      return n;
    case CacheRole::kLatent:
      return line.layer_kind == LayerKind::kMlaSparse ? std::min<uint64_t>(n, g.index_topk) : n;
    case CacheRole::kCompressed: {
      uint64_t e = Entries(n, line.compress_ratio).value();
      return line.layer_kind == LayerKind::kCsa ? std::min<uint64_t>(e, g.index_topk) : e;
    }
    case CacheRole::kIndexer:
      return Entries(n, line.compress_ratio).value();
    case CacheRole::kWindow:
      return std::min<uint64_t>(n, line.slots);
    case CacheRole::kCompressorState:
    case CacheRole::kIndexerCompressorState:
      return 0;
  }
  return 0;
}

// vLLM's first DeepSeek-V4 allocator: one block id is backed by a tuple of pages in T layer
// slots, and costs sum(distinct full-group page sizes) x T whatever group owns it.
struct VllmHybridGroups {
  uint32_t full_block_tokens = 0;
  uint64_t block_cost = 0;
  uint32_t tuples = 0;  // T
  std::vector<VllmWindowBucket> buckets;
};

Result<VllmHybridGroups> PlanVllmHybrid(const std::vector<CacheLine>& lines, const std::vector<Policy>& policies,
                                        uint32_t full_block_tokens) {
  VllmHybridGroups plan;
  plan.full_block_tokens = full_block_tokens;
  std::map<uint64_t, uint64_t> full_classes;  // page bytes -> layers
  std::map<std::pair<uint32_t, uint64_t>, std::map<uint64_t, uint64_t>> buckets;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Policy& p = policies[i];
    if (!p.in_pages) continue;
    if (p.window == 0) {
      full_classes[lines[i].page.page_bytes] += lines[i].layers;
    } else {
      buckets[{p.block_tokens, p.window}][lines[i].page.page_bytes] += lines[i].layers;
    }
  }
  Checked sum_pages(0);
  uint64_t lower = 1;
  for (const auto& [page, layers] : full_classes) {
    sum_pages += page;
    lower = std::max(lower, layers);
  }
  uint64_t upper = lower;
  std::vector<uint64_t> bucket_tuples;
  for (const auto& [key, classes] : buckets) {
    uint64_t tuples = 0;
    for (const auto& [page, layers] : classes) tuples = std::max(tuples, layers);
    plan.buckets.push_back({key.first, key.second, 0});
    bucket_tuples.push_back(tuples);
    upper = std::max(upper, tuples);
  }
  // T: the tuple count >= the full group's that wastes the fewest layer slots across buckets.
  // (Layer counts: at most the model's layers, so this loop and its sums stay small.)
  uint64_t best_t = lower;
  uint64_t best_waste = UINT64_MAX;
  for (uint64_t t = lower; t <= upper; ++t) {
    uint64_t waste = 0;
    for (uint64_t tuples : bucket_tuples) waste += CeilDiv(tuples, t) * t - tuples;
    if (waste < best_waste) {
      best_waste = waste;
      best_t = t;
    }
  }
  for (size_t i = 0; i < plan.buckets.size(); ++i) plan.buckets[i].groups = CeilDiv(bucket_tuples[i], best_t);
  plan.tuples = static_cast<uint32_t>(best_t);
  Checked cost = sum_pages * best_t;
  if (cost.overflowed()) {
    return OutOfRange("block-tokens", "the pages of one vLLM block id (a tuple in every layer slot) overflow 64 bits");
  }
  plan.block_cost = cost.value();
  return plan;
}

struct RankCost {
  Checked committed;  // one request on one rank
  std::map<std::string, Checked> terms;
  std::vector<LineCost> lines;
  Checked reserved;
};

}  // namespace

Checked VllmPrefillHeld(uint64_t end, uint64_t size, uint32_t full_block_tokens,
                        std::span<const VllmWindowBucket> buckets) {
  Checked held = Checked(CeilDiv(end, full_block_tokens));
  for (const VllmWindowBucket& b : buckets) {
    // window >= 1 (a bucket exists only for windowed groups). Saturating is exact: a window of at
    // least `end` tokens holds every block so far.
    Checked window = Checked(b.window) - 1 + size;
    held +=
        Checked(b.groups) * WindowBlocksHeld(end, window.overflowed() ? UINT64_MAX : window.value(), b.block_tokens);
  }
  return held;
}

// The steps of a prefill of n tokens end at chunk, 2 chunk, ..., k chunk (k = n / chunk, each
// step `chunk` tokens) and, when chunk does not divide n, at n (n % chunk tokens).
//
// Over the full steps, held(i) = ceil(i chunk / F) + sum_b groups_b WBH(i chunk, w_b, B_b) with
// w_b = window_b - 1 + chunk fixed. Let P be a multiple of every bucket's block size B_b. Then
// i chunk and (i + P) chunk leave the same remainder modulo every B_b, and WBH(t + j B, w, B) >=
// WBH(t, w, B) for j >= 0 (equal once t > w: the window [t - w, t) shifted by whole blocks;
// before that [0, t) grows to a longer interval ending at the same offset in its block), while
// ceil(t / F) never decreases. So every full step i is matched by a step in the last P steps,
// i + mP, holding at least as much: the maximum is among steps max(1, k - P + 1) .. k, plus the
// last partial step. vLLM's window groups use blocks of 64 (window) and 4 or 8 (compressor
// state) tokens, so P = lcm(B_b) is at most 64.
Checked VllmPrefillPeakBlocks(uint64_t n, uint64_t chunk, uint32_t full_block_tokens,
                              std::span<const VllmWindowBucket> buckets) {
  Checked period(1);
  for (const VllmWindowBucket& b : buckets) {
    if (!period.overflowed()) period = Lcm(period.value(), b.block_tokens);
  }
  const uint64_t k = n / chunk;
  const uint64_t first = period.overflowed() || period.value() >= k ? 1 : k - period.value() + 1;
  Checked peak(0);
  auto consider = [&peak](Checked held) {
    if (held.overflowed() || held.value() > peak.value()) peak = held;
  };
  for (uint64_t i = first; i <= k && !peak.overflowed(); ++i) {
    consider(VllmPrefillHeld(i * chunk, chunk, full_block_tokens, buckets));
  }
  if (n % chunk != 0) consider(VllmPrefillHeld(n, n % chunk, full_block_tokens, buckets));
  return peak;
}

Status ApplyEngine(const Geometry& g, const LedgerOptions& o, const CacheMap& caches, Ledger& ledger) {
  const RecordFormat& main_format = caches.main_format;
  std::vector<CacheLine>& lines = ledger.lines;
  std::vector<Policy> policies(lines.size());

  std::vector<uint32_t> ratios;
  for (const CacheLine& l : lines) {
    if (l.grows) ratios.push_back(l.compress_ratio);
  }
  const bool v4_fp8 = main_format.name == "v4-fp8";
  const uint64_t v4_align = v4_fp8 ? main_format.page_alignment : 1;

  switch (o.engine) {
    case Engine::kTessera: {
      TESSERA_ASSIGN_OR_RETURN(CacheLayout layout, LayoutCaches(g, caches, LayoutOptionsOf(o)));
      const BlockTokensChoice& choice = layout.block;
      ledger.block_tokens = choice.block_tokens;
      ledger.block_reasons = choice.reasons;
      for (const std::string& n : choice.notes) ledger.notes.push_back("block-tokens " + n);
      for (size_t i = 0; i < lines.size(); ++i) {
        Policy& p = policies[i];
        if (!lines[i].grows) continue;  // window ring and compressor state: per-request arena
        p.in_pages = true;
        p.block_tokens = choice.block_tokens;
        p.entry_tokens = lines[i].compress_ratio;
        lines[i].page = layout.groups[layout.group_of_line[i]].page;
      }
      ledger.groups = layout.groups;
      if (g.is_hybrid)
        ledger.notes.push_back("window rings and compressor state live in a per-request arena, sized once");
      break;
    }
    case Engine::kVllm:
    case Engine::kSglang: {
      const bool vllm = o.engine == Engine::kVllm;
      if (g.is_hybrid) {
        if (vllm && o.dcp > 1) {
          return InvalidArgument("dcp",
                                 "vLLM's sliding-window groups (every DeepSeek-V4 layer has one) require dcp = 1");
        }
        uint32_t full = kV4FullBlockTokens;
        if (o.block_tokens) {
          TESSERA_ASSIGN_OR_RETURN(BlockTokensChoice c,
                                   ChooseBlockTokens(ratios, true, Kernel::kGeneric, o.block_tokens));
          full = c.block_tokens;
        }
        ledger.block_tokens = full;
        ledger.block_reasons.push_back(std::string(EngineName(o.engine)) + " DeepSeek-V4: compressed caches in " +
                                       std::to_string(full) + "-token blocks");
        if (!v4_fp8) {
          ledger.notes.push_back(std::string(EngineName(o.engine)) + " serves DeepSeek-V4 with the v4-fp8 record; " +
                                 main_format.name + " is priced with the same page rules, without the 576-B padding");
        }
        for (size_t i = 0; i < lines.size(); ++i) {
          const CacheLine& l = lines[i];
          Policy& p = policies[i];
          p.in_pages = true;
          p.by_tokens = true;
          switch (l.role) {
            case CacheRole::kCompressed:
            case CacheRole::kIndexer:
              p.block_tokens = full;
              p.entry_tokens = l.compress_ratio;
              // SGLang leaves its indexer pages unpadded; vLLM pads every V4 page.
              p.alignment = (vllm || l.role == CacheRole::kCompressed) ? v4_align : 1;
              break;
            case CacheRole::kWindow:
              p.block_tokens = vllm ? kV4WindowBlockTokens : l.slots;
              p.alignment = v4_align;
              p.window = l.slots;
              break;
            default:  // compressor states
              if (!vllm) {
                p = Policy{};  // SGLang: a per-request ring in its compress-state pool
                break;
              }
              // vLLM: sliding-window groups of 4 (C4, overlapping) or 8 (C128) one-slot tokens.
              p.block_tokens = l.slots <= 8 ? 4 : 8;
              p.alignment = v4_align;
              p.window = l.slots;
              break;
          }
        }
        ledger.notes.push_back(
            vllm ? "vLLM pages the window and the compressor state as sliding-window groups"
                 : "SGLang pages the window in window-sized pages; compressor state in a per-request ring");
      } else {
        uint32_t bt = g.is_mla ? kFlashMlaBlockTokens : (vllm ? 16 : 1);
        if (o.block_tokens) {
          TESSERA_ASSIGN_OR_RETURN(BlockTokensChoice c,
                                   ChooseBlockTokens(ratios, g.is_mla, Kernel::kGeneric, o.block_tokens));
          bt = c.block_tokens;
        }
        ledger.block_tokens = bt;
        ledger.block_reasons.push_back(g.is_mla ? std::string(EngineName(o.engine)) + " with FlashMLA: 64-token pages"
                                       : vllm   ? "vLLM default block of 16 tokens"
                                                : "SGLang default page size 1");
        for (size_t i = 0; i < lines.size(); ++i) {
          Policy& p = policies[i];
          p.in_pages = true;
          p.by_tokens = true;
          p.block_tokens = bt;
          p.entry_tokens = 1;
          p.alignment = 1;
        }
      }
      break;
    }
  }

  // Page layouts.
  for (size_t i = 0; i < lines.size(); ++i) {
    lines[i].in_pages = policies[i].in_pages;
    if (!policies[i].in_pages || o.engine == Engine::kTessera) continue;  // Tessera's: from the layout
    TESSERA_ASSIGN_OR_RETURN(lines[i].page, ComputePageLayout(lines[i].format, policies[i].entry_tokens,
                                                              policies[i].block_tokens, policies[i].alignment));
  }

  std::optional<VllmHybridGroups> vllm_groups;
  if (o.engine == Engine::kVllm && g.is_hybrid) {
    TESSERA_ASSIGN_OR_RETURN(vllm_groups, PlanVllmHybrid(lines, policies, ledger.block_tokens));
    ledger.block_id_bytes = vllm_groups->block_cost;
    ledger.notes.push_back("vLLM block id = a tuple of pages in " + std::to_string(vllm_groups->tuples) +
                           " layer slots, " + std::to_string(vllm_groups->block_cost) +
                           " B whatever group owns it (first DeepSeek-V4 allocator); admission reserves " +
                           std::to_string(kVllmMaxBatchedTokens) +
                           "-token prefill chunks for every sliding-window group");
  }

  const uint64_t max_len = std::max<uint64_t>(g.max_position_embeddings, o.context_tokens);
  const bool tessera = o.engine == Engine::kTessera;
  const bool retain = tessera && o.swa_strategy == SwaStrategy::kRetain;

  // Window persistence per cached block boundary (Tessera; models with windows). At a boundary
  // every compression group is complete, so the live compressor rows are the previous group of
  // the overlapping (CSA) compressors; the window ring holds its last `window` tokens.
  Checked window_sum(0), compressor_sum(0);
  uint64_t window_tokens = 0;
  for (const CacheLine& l : lines) {
    if (l.role == CacheRole::kWindow) {
      window_sum += Checked(l.layers) * l.slots * l.format.record_bytes();
      window_tokens = std::max<uint64_t>(window_tokens, l.slots);
    } else if ((l.role == CacheRole::kCompressorState || l.role == CacheRole::kIndexerCompressorState) &&
               l.layer_kind == LayerKind::kCsa) {
      compressor_sum += Checked(l.layers) * (l.slots / 2) * l.format.record_bytes();
    }
  }
  // Sizes from the config alone (window x record x layers): checked, whatever the engine pages.
  if ((window_sum + compressor_sum).overflowed()) {
    return OutOfRange("sliding_window", "window state per cached boundary overflows 64 bits");
  }
  const uint64_t window_boundary = window_sum.value(), compressor_boundary = compressor_sum.value();
  if (window_tokens > 0) {
    ledger.swa_strategies = {
        {SwaStrategy::kRecompute, 0, 0, window_tokens},
        {SwaStrategy::kSnapshot, window_boundary + compressor_boundary, window_boundary + compressor_boundary, 0},
        {SwaStrategy::kRetain, window_boundary + compressor_boundary, compressor_boundary, 0},
    };
    if (retain && ledger.block_tokens % window_tokens != 0) {
      return InvalidArgument("swa-strategy", "retain keeps window chunks of " + std::to_string(window_tokens) +
                                                 " tokens; the block span " + std::to_string(ledger.block_tokens) +
                                                 " is not a multiple of it");
    }
  }

  auto rank_cost = [&](uint64_t n) {
    RankCost rc;
    Checked natural(0);
    // Tessera: one block id for every paged group of a block span, as many as the group that
    // needs the most.
    std::map<uint32_t, SpanBlocks> spans;
    if (tessera) {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (!policies[i].in_pages) continue;
        SpanBlocks& sb = spans[policies[i].block_tokens];
        sb.at_n = std::max(sb.at_n, Blocks(policies[i], lines[i].page, n));
        sb.at_nk = std::max(sb.at_nk, Blocks(policies[i], lines[i].page, n + o.spec_tokens));
      }
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      const SpanBlocks* span = tessera && policies[i].in_pages ? &spans[policies[i].block_tokens] : nullptr;
      LineCost c = Cost(lines[i], policies[i], n, o.spec_tokens, span, retain);
      natural += c.committed;
      for (const auto& [name, bytes] : c.terms) {
        auto [it, inserted] = rc.terms.try_emplace(name, Checked(0));
        it->second += bytes;
      }
      rc.lines.push_back(std::move(c));
    }
    rc.committed = natural;
    if (tessera) {
      // Metadata once per block id.
      Checked meta(0);
      for (const auto& [block_tokens, sb] : spans) meta += Checked(sb.at_nk) * BlockMetadataBytes(block_tokens);
      rc.terms["block_metadata"] = meta;
      rc.committed += meta;
      // Window state kept for the boundaries this request has sealed.
      if (window_tokens > 0 && o.swa_strategy != SwaStrategy::kRecompute) {
        uint64_t boundaries = n / ledger.block_tokens;
        Checked kept = Checked(boundaries) * compressor_boundary;
        if (o.swa_strategy == SwaStrategy::kSnapshot) {
          kept += Checked(boundaries) * window_boundary;
        } else {
          // Retained window chunks that are no longer among the request's live chunks.
          uint64_t first_live = n > window_tokens ? (n - window_tokens) / window_tokens : 0;
          // (first_live + 1) x window <= n, so this product cannot overflow.
          uint64_t below = CeilDiv((first_live + 1) * window_tokens, ledger.block_tokens);
          uint64_t retained = std::min(boundaries, below > 0 ? below - 1 : 0);
          kept += Checked(retained) * window_boundary;
        }
        rc.terms["boundary_state"] = kept;
        rc.committed += kept;
      }
    }
    rc.reserved = rc.committed;
    if (vllm_groups) {
      const VllmHybridGroups& vg = *vllm_groups;
      uint64_t nk = n + o.spec_tokens;
      Checked held = Checked(CeilDiv(nk, vg.full_block_tokens));
      Checked reserve = Checked(CeilDiv(std::min(nk, max_len), vg.full_block_tokens));
      for (const VllmWindowBucket& b : vg.buckets) {
        held += Checked(b.groups) * WindowBlocksHeld(nk, b.window, b.block_tokens);
        reserve += Checked(b.groups) *
                   (CeilDiv(std::min<uint64_t>(b.window - 1 + kVllmMaxBatchedTokens, max_len), b.block_tokens) + 1);
      }
      Checked total = held * vg.block_cost;
      rc.terms["uniform_block_padding"] = total - natural;
      rc.committed = total;
      rc.reserved = reserve * vg.block_cost;
    }
    return rc;
  };

  // The most a request holds during a chunked prefill of its tokens.
  auto prefill_peak = [&](uint64_t n) -> Checked {
    const uint64_t chunk = std::max<uint64_t>(1, o.prefill_chunk_tokens);
    if (!vllm_groups) return rank_cost(n).committed;  // holdings only grow with the tokens written
    // vLLM: a sliding-window group allocates the chunk's blocks and frees those wholly behind
    // the window only after the step, so during the step it holds window - 1 + chunk tokens.
    const VllmHybridGroups& vg = *vllm_groups;
    return VllmPrefillPeakBlocks(n, chunk, vg.full_block_tokens, vg.buckets) * vg.block_cost;
  };

  // Tokens per rank: decode context parallelism interleaves tokens over dcp ranks.
  const uint64_t n = o.context_tokens;
  const uint64_t q = n / o.dcp;
  const uint64_t extra = n % o.dcp;  // ranks holding q + 1 tokens
  ledger.tokens_per_rank = q + (extra > 0 ? 1 : 0);
  RankCost busiest = rank_cost(ledger.tokens_per_rank);
  Checked all_ranks;
  if (o.engine == Engine::kTessera) {
    RankCost lighter = rank_cost(q);
    all_ranks = (Checked(extra) * busiest.committed + Checked(o.dcp - extra) * lighter.committed) * (o.tp / o.dcp);
  } else {
    all_ranks = busiest.committed * o.tp;  // engines allocate the same block count on every rank
  }

  auto scale = [&](Checked per_request, const char* what) -> Result<uint64_t> {
    if (per_request.overflowed()) return OutOfRange("context", std::string(what) + " overflows 64 bits");
    Checked total = per_request * o.batch;
    if (total.overflowed()) return OutOfRange("batch", std::string(what) + " overflows 64 bits at this batch");
    return total.value();
  };
  TESSERA_ASSIGN_OR_RETURN(ledger.committed_bytes, scale(busiest.committed, "committed bytes"));
  TESSERA_ASSIGN_OR_RETURN(ledger.reserved_at_admission_bytes, scale(busiest.reserved, "reserved bytes"));
  if (all_ranks.overflowed()) return OutOfRange("tp", "committed bytes over all ranks overflow 64 bits");
  TESSERA_ASSIGN_OR_RETURN(ledger.committed_bytes_all_ranks, scale(all_ranks, "committed bytes over all ranks"));

  // Phases. Admission: what must be free to admit (vLLM's DeepSeek-V4 gate; otherwise the
  // first prefill chunk). Prefill peak: the most held while the prompt is written in chunks.
  {
    const uint64_t first_chunk = std::min(ledger.tokens_per_rank, std::max<uint64_t>(1, o.prefill_chunk_tokens));
    Checked admission = vllm_groups ? busiest.reserved : rank_cost(first_chunk).committed;
    TESSERA_ASSIGN_OR_RETURN(uint64_t a, scale(admission, "admission bytes"));
    TESSERA_ASSIGN_OR_RETURN(uint64_t p, scale(prefill_peak(ledger.tokens_per_rank), "prefill bytes"));
    ledger.phases = {{"admission", a, ""}, {"prefill_peak", p, ""}, {"decode", ledger.committed_bytes, ""}};
    if (!vllm_groups) ledger.reserved_at_admission_bytes = a;
  }
  if (window_tokens > 0) ledger.cached_boundaries = ledger.tokens_per_rank / ledger.block_tokens;

  static const char* kTermOrder[] = {"records",        "page_rounding",        "alignment_padding",
                                     "ring_capacity",  "speculative_slots",    "block_metadata",
                                     "boundary_state", "uniform_block_padding"};
  for (const char* name : kTermOrder) {
    auto it = busiest.terms.find(name);
    if (it == busiest.terms.end()) continue;
    TESSERA_ASSIGN_OR_RETURN(uint64_t bytes, scale(it->second, name));
    ledger.terms.push_back({name, bytes, ""});
  }
  Checked read(0);
  for (size_t i = 0; i < lines.size(); ++i) {
    CacheLine& line = lines[i];
    TESSERA_ASSIGN_OR_RETURN(line.committed_bytes, scale(busiest.lines[i].committed, "committed bytes"));
    for (const auto& [name, bytes] : busiest.lines[i].terms) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t b, scale(bytes, name.c_str()));
      if (b > 0 || name == "records") line.terms.push_back({name, b, ""});
    }
    Checked r = Checked(ReadEntries(line, g, ledger.tokens_per_rank)) * line.format.record_bytes() * line.layers;
    line.read_bytes_per_token = r.value();
    read += r;
  }
  if (read.overflowed()) return OutOfRange("context", "read bytes overflow 64 bits");
  ledger.read_bytes_per_token = read.value();
  Checked read_all = read * o.tp;
  if (read_all.overflowed()) return OutOfRange("tp", "read bytes over all ranks overflow 64 bits");
  ledger.read_bytes_per_token_all_ranks = read_all.value();
  return Status::Ok();
}

}  // namespace tessera::detail
