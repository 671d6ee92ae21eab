// vLLM's sizing rules (docs/ENGINES.md): FlashMLA pages of 64 tokens for MLA, blocks of 16
// tokens for MHA; for DeepSeek-V4 its first hybrid allocator — compressed caches in 256-token
// blocks, windows and compressor states as sliding-window groups, every block id costing the same
// bytes — and the admission gate that reserves a prefill chunk for every sliding-window group.

#include "vllm_profile.h"

#include <algorithm>
#include <map>
#include <optional>

#include "engine_profile.h"

namespace tessera::detail {
namespace {

// vLLM's default max_num_batched_tokens: the prefill chunk a sliding-window group reserves for.
constexpr uint64_t kVllmMaxBatchedTokens = 8192;
constexpr uint32_t kV4WindowBlockTokens = 64;
constexpr uint32_t kVllmMhaBlockTokens = 16;

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

// vLLM's DeepSeek-V4 policies: compressed caches and the indexer in blocks of the full span;
// the window in 64-token sliding-window blocks; compressor states as sliding-window groups of 4
// (C4, overlapping) or 8 (C128) one-slot tokens; every page padded to the v4-fp8 alignment.
std::vector<Policy> V4Policies(const std::vector<CacheLine>& lines, uint32_t full, uint64_t align) {
  std::vector<Policy> policies(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const CacheLine& l = lines[i];
    Policy& p = policies[i];
    p.in_pages = true;
    p.by_tokens = true;
    p.alignment = align;
    switch (l.role) {
      case CacheRole::kCompressed:
      case CacheRole::kIndexer:
        p.block_tokens = full;
        p.entry_tokens = l.compress_ratio;
        break;
      case CacheRole::kWindow:
        p.block_tokens = kV4WindowBlockTokens;
        p.window = l.slots;
        break;
      default:  // compressor states
        p.block_tokens = l.slots <= 8 ? 4 : 8;
        p.window = l.slots;
        break;
    }
  }
  return policies;
}

class VllmProfile final : public EngineProfile {
 public:
  using EngineProfile::EngineProfile;

  Status Plan(Ledger& ledger) override {
    const Geometry& g = in_.g;
    if (!g.is_hybrid) {
      TESSERA_RETURN_IF_ERROR(
          PageDenseModel(in_, kVllmMhaBlockTokens, "vLLM default block of 16 tokens", ledger, policies_));
      return LayPages(ledger);
    }
    if (in_.options.dcp > 1) {
      return InvalidArgument("dcp", "vLLM's sliding-window groups (every DeepSeek-V4 layer has one) require dcp = 1");
    }
    TESSERA_ASSIGN_OR_RETURN(uint32_t full, ServedV4BlockTokens(in_, ledger));
    policies_ = V4Policies(ledger.lines, full, ServedV4Alignment(in_.caches.main_format));
    ledger.notes.push_back("vLLM pages the window and the compressor state as sliding-window groups");
    TESSERA_RETURN_IF_ERROR(LayPages(ledger));
    TESSERA_ASSIGN_OR_RETURN(hybrid_, PlanVllmHybrid(ledger.lines, policies_, ledger.block_tokens));
    ledger.block_id_bytes = hybrid_->block_cost;
    ledger.notes.push_back("vLLM block id = a tuple of pages in " + std::to_string(hybrid_->tuples) + " layer slots, " +
                           std::to_string(hybrid_->block_cost) +
                           " B whatever group owns it (first DeepSeek-V4 allocator); admission reserves " +
                           std::to_string(kVllmMaxBatchedTokens) +
                           "-token prefill chunks for every sliding-window group");
    return Status::Ok();
  }

  // DeepSeek-V4: the block ids held (the full group's, and per window group those holding its
  // last tokens) times the uniform block cost; the difference from the lines' own pages is
  // uniform_block_padding.
  RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const override {
    RankCost rc = SumLineCosts(ledger, tokens);
    if (!hybrid_) return rc;
    const uint64_t nk = tokens + in_.options.spec_tokens;
    Checked held = Checked(CeilDiv(nk, hybrid_->full_block_tokens));
    for (const VllmWindowBucket& b : hybrid_->buckets) {
      held += Checked(b.groups) * WindowBlocksHeld(nk, b.window, b.block_tokens);
    }
    Checked total = held * hybrid_->block_cost;
    rc.terms[LedgerTerm::kUniformBlockPadding] = total - rc.committed;
    rc.committed = total;
    return rc;
  }

  // DeepSeek-V4: the full group reserves every block of the request; every sliding-window group
  // reserves cdiv(min(W - 1 + M, max_model_len), block) + 1 with M = max_num_batched_tokens.
  Checked Admission(const Ledger& ledger, uint64_t tokens) const override {
    if (!hybrid_) return EngineProfile::Admission(ledger, tokens);
    const uint64_t nk = tokens + in_.options.spec_tokens;
    const uint64_t max_len = std::max<uint64_t>(in_.g.max_position_embeddings, in_.options.context_tokens);
    Checked reserve = Checked(CeilDiv(std::min(nk, max_len), hybrid_->full_block_tokens));
    for (const VllmWindowBucket& b : hybrid_->buckets) {
      reserve += Checked(b.groups) *
                 (CeilDiv(std::min<uint64_t>(b.window - 1 + kVllmMaxBatchedTokens, max_len), b.block_tokens) + 1);
    }
    return reserve * hybrid_->block_cost;
  }

  // DeepSeek-V4: a sliding-window group allocates the chunk's blocks and frees those wholly
  // behind the window only after the step, so during the step it holds window - 1 + chunk tokens.
  Checked PrefillPeak(const Ledger& ledger, uint64_t tokens) const override {
    if (!hybrid_) return EngineProfile::PrefillPeak(ledger, tokens);
    const uint64_t chunk = std::max<uint64_t>(1, in_.options.prefill_chunk_tokens);
    return VllmPrefillPeakBlocks(tokens, chunk, hybrid_->full_block_tokens, hybrid_->buckets) * hybrid_->block_cost;
  }

 private:
  std::optional<VllmHybridGroups> hybrid_;  // DeepSeek-V4 only
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

std::unique_ptr<EngineProfile> MakeVllmProfile(const EngineInputs& in) { return std::make_unique<VllmProfile>(in); }

}  // namespace tessera::detail
