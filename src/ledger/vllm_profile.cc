// vLLM's sizing rules (docs/ENGINES.md): FlashMLA pages of 64 tokens for MLA, blocks of 16
// tokens for MHA; for DeepSeek-V4 its first hybrid allocator — compressed caches in 256-token
// blocks, windows and compressor states as sliding-window groups, every block id costing the same
// bytes; and the phases of one request as vLLM's scheduler allocates them (admission of the whole
// prompt, chunked-prefill peak, first decode step).

#include "vllm_profile.h"

#include <algorithm>
#include <map>
#include <vector>

#include "engine_profile.h"

namespace tessera::detail {
namespace {

constexpr uint32_t kV4WindowBlockTokens = 64;
constexpr uint32_t kVllmMhaBlockTokens = 16;

// vLLM's first DeepSeek-V4 allocator: one block id is backed by a tuple of pages in T layer
// slots, and costs sum(distinct full-group page sizes) x T whatever group owns it. A
// sliding-window page is padded up to the nearest full-group page size in its slot, so the
// allocator refuses a window or compressor-state page larger than every full-group page.
struct VllmHybridGroups {
  uint32_t full_block_tokens = 0;
  uint64_t block_cost = 0;
  uint32_t tuples = 0;  // T
  std::vector<VllmWindowBucket> buckets;
};

// `field` names what set the full block span: "block-tokens" when the user did, else the model's
// "compress_ratios".
Result<VllmHybridGroups> PlanVllmHybrid(const std::vector<CacheLine>& lines, const std::vector<Policy>& policies,
                                        uint32_t full_block_tokens, const char* field) {
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
  const uint64_t largest_full = full_classes.empty() ? 0 : full_classes.rbegin()->first;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!policies[i].in_pages || policies[i].window == 0 || lines[i].page.page_bytes <= largest_full) continue;
    return InvalidArgument(field, "vLLM pads a sliding-window page up to a full-group page; the " + lines[i].name +
                                      " page of " + std::to_string(lines[i].page.page_bytes) +
                                      " B is larger than every full-group page (the largest is " +
                                      std::to_string(largest_full) + " B at " + std::to_string(full_block_tokens) +
                                      "-token blocks), which vLLM refuses");
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
    return OutOfRange(field, "the pages of one vLLM block id (a tuple in every layer slot) overflow 64 bits");
  }
  plan.block_cost = cost.value();
  // What the block ids of a window bucket hold must fit in them: the uniform padding is their
  // difference, never negative. (Holds when every window page fits a full-group page, as
  // checked above, unless a bucket's page classes together outgrow one slot's tuple.)
  size_t b = 0;
  for (const auto& [key, classes] : buckets) {
    Checked bucket_pages(0);
    for (const auto& [page, layers] : classes) bucket_pages += Checked(page) * layers;
    Checked capacity = Checked(plan.buckets[b++].groups) * plan.block_cost;
    if (bucket_pages.overflowed() || capacity.overflowed() || bucket_pages.value() > capacity.value()) {
      return InvalidArgument(field, "the pages of a vLLM sliding-window group of " + std::to_string(key.first) +
                                        "-token blocks do not fit its block ids at " +
                                        std::to_string(full_block_tokens) + "-token full blocks (not modelled)");
    }
  }
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

// The request's figures follow vLLM's scheduler and KVCacheManager.allocate_slots for one request
// (docs/ENGINES.md; pinned in tests/vllm_profile_test.cc against vLLM's own code):
// - admission: a fresh request is scheduled only when the blocks of its whole prompt are free
//   (full_sequence_must_fit), every sliding-window group capped at
//   cdiv(min(W - 1 + M, max_model_len), block) + 1 with M = max_num_batched_tokens, the prefill chunk;
// - prefill peak: the most held after any chunk's allocation, later chunks with lookahead slots;
// - decode (committed): held after the first decode step, the sampled token, its draft tokens
//   and as many lookahead slots (N + 1 + 2k slots), blocks behind each window freed.
// Slots are capped at max_model_len: --max-model-len, else max(max_position_embeddings, context).
class VllmProfile final : public EngineProfile {
 public:
  using EngineProfile::EngineProfile;

  Status Plan(Ledger& ledger) override {
    const Geometry& g = in_.g;
    if (g.is_hybrid && in_.options.kernel != Kernel::kFlashMla && in_.options.kernel != Kernel::kGeneric) {
      return InvalidArgument("kernel", "vLLM serves DeepSeek-V4 with FlashMLA sparse only, not " +
                                           std::string(KernelName(in_.options.kernel)));
    }
    TESSERA_RETURN_IF_ERROR(RefuseUnmodelledLayers(in_, ledger));
    if (!g.is_hybrid) {
      TESSERA_ASSIGN_OR_RETURN(Kernel kernel, DenseKernel());
      TESSERA_RETURN_IF_ERROR(
          PageDenseModel(in_, kernel, kVllmMhaBlockTokens, "vLLM default block of 16 tokens", ledger, policies_));
      TESSERA_RETURN_IF_ERROR(LayPages(ledger));
      // One group whose block id is a page in every layer (UniformTypeKVCacheSpecs for V3.2's
      // two page sizes); DCP multiplies the block size by dcp and counts the global sequence.
      Checked cost(0);
      for (const CacheLine& l : ledger.lines) {
        if (l.in_pages) cost += Checked(l.layers) * l.page.page_bytes;
      }
      if (cost.overflowed()) {
        return OutOfRange(in_.options.block_tokens ? "block-tokens" : "num_hidden_layers",
                          "the pages of one vLLM block id overflow 64 bits");
      }
      full_block_tokens_ = uint64_t{ledger.block_tokens} * in_.options.dcp;
      block_cost_ = cost.value();
      return Status::Ok();
    }
    if (in_.options.dcp > 1) {
      return InvalidArgument("dcp", "vLLM's sliding-window groups (every DeepSeek-V4 layer has one) require dcp = 1");
    }
    TESSERA_ASSIGN_OR_RETURN(uint32_t full, ServedV4BlockTokens(in_, ledger));
    policies_ = V4Policies(ledger.lines, full, ServedV4Alignment(in_.caches.main_format));
    ledger.notes.push_back("vLLM pages the window and the compressor state as sliding-window groups");
    TESSERA_RETURN_IF_ERROR(LayPages(ledger));
    TESSERA_ASSIGN_OR_RETURN(VllmHybridGroups hybrid,
                             PlanVllmHybrid(ledger.lines, policies_, ledger.block_tokens,
                                            in_.options.block_tokens ? "block-tokens" : "compress_ratios"));
    full_block_tokens_ = hybrid.full_block_tokens;
    block_cost_ = hybrid.block_cost;
    buckets_ = hybrid.buckets;
    ledger.block_id_bytes = hybrid.block_cost;
    ledger.notes.push_back("vLLM block id = a tuple of pages in " + std::to_string(hybrid.tuples) + " layer slots, " +
                           std::to_string(hybrid.block_cost) +
                           " B whatever group owns it (first DeepSeek-V4 allocator); admission caps every "
                           "sliding-window group at the blocks of window - 1 + " +
                           std::to_string(Chunk()) + " tokens (max_num_batched_tokens = the prefill chunk) + 1");
    return Status::Ok();
  }

  // Held after the first decode step; page rounding includes the sampled token's slot, the draft
  // and lookahead slots are speculative. DeepSeek-V4: the block ids held times the uniform block
  // cost, the difference from the lines' own pages being uniform_block_padding.
  RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const override {
    const uint64_t n = Global(tokens);
    const uint64_t computed = std::min(n, MaxLen());
    const uint64_t slots_n = Cap(Checked(n) + 1);
    const uint64_t slots_nk = Cap(Checked(n) + 1 + uint64_t{in_.options.spec_tokens} * 2);
    RankCost rc;
    for (size_t i = 0; i < ledger.lines.size(); ++i) {
      const CacheLine& line = ledger.lines[i];
      const Policy& p = policies_[i];
      if (!p.in_pages) {
        rc.AddLine(RingCost(line, tokens, in_.options.spec_tokens));
        continue;
      }
      rc.AddLine(PagedCost(line, p, tokens, LineBlocks(p, computed, slots_n), LineBlocks(p, computed, slots_nk)));
    }
    if (buckets_.empty()) return rc;
    Checked total = VllmHeld(computed, slots_nk, full_block_tokens_, buckets_) * block_cost_;
    rc.terms[LedgerTerm::kUniformBlockPadding] = total - rc.committed;
    rc.committed = total;
    return rc;
  }

  // The whole prompt's blocks, every sliding-window group at most its admission cap.
  Checked Admission(const Ledger&, uint64_t tokens) const override {
    const uint64_t a = std::min(Global(tokens), MaxLen());
    Checked blocks = Checked(CeilDiv(a, full_block_tokens_));
    for (const VllmWindowBucket& b : buckets_) {
      Checked span = Checked(b.window) - 1 + Chunk();
      const uint64_t cap = CeilDiv(span.overflowed() ? MaxLen() : std::min(span.value(), MaxLen()), b.block_tokens) + 1;
      blocks += Checked(b.groups) * std::min(CeilDiv(a, b.block_tokens), cap);
    }
    return blocks * block_cost_;
  }

  Checked PrefillPeak(const Ledger&, uint64_t tokens) const override {
    const VllmPrefill prefill{.n = std::min(Global(tokens), MaxLen()),
                              .chunk = Chunk(),
                              .spec = in_.options.spec_tokens,
                              .max_len = MaxLen()};
    return VllmPrefillPeakBlocks(prefill, full_block_tokens_, buckets_) * block_cost_;
  }

 private:
  // The MLA backend's block (vllm/v1/attention/backends/mla/*.py get_supported_kernel_block_sizes,
  // picked by AttentionBackend.get_preferred_block_size): FlashMLA 64, CUTLASS MLA 128, FlashInfer
  // MLA 32; a --block-tokens the chosen backend cannot page is refused, as vLLM finds no backend.
  // FlashMLA (the default) under another --block-tokens: vLLM falls back to a backend that takes
  // it (Triton MLA: multiples of 16), so the block is the user's.
  Result<Kernel> DenseKernel() const {
    const Kernel k = in_.options.kernel == Kernel::kGeneric ? Kernel::kFlashMla : in_.options.kernel;
    if (!in_.g.is_mla || k == Kernel::kFlashMla) return k;
    if (k == Kernel::kCutlassMla && in_.g.index_head_dim > 0) {
      return InvalidArgument("kernel", "vLLM has no CUTLASS MLA backend for sparse attention (" + in_.g.name +
                                           "): FlashMLA or FlashInfer MLA");
    }
    const uint32_t page = KernelPageEntries(k);
    if (in_.options.block_tokens && *in_.options.block_tokens % page != 0) {
      return InvalidArgument("block-tokens", "vLLM's " + std::string(KernelName(k)) +
                                                 " backend pages blocks of a multiple of " + std::to_string(page) +
                                                 " tokens");
    }
    return k;
  }
  // max_model_len. Read at each call, not planned: the context is not the profile's (a ledger
  // sweep prices many contexts over one planned profile).
  // --max-model-len when given (the options check refuses a context past it).
  uint64_t MaxLen() const {
    if (in_.options.max_model_len) return *in_.options.max_model_len;
    return std::max<uint64_t>(in_.g.max_position_embeddings, in_.options.context_tokens);
  }
  uint64_t Chunk() const { return std::max<uint64_t>(1, in_.options.prefill_chunk_tokens); }
  // vLLM counts the whole sequence (DCP multiplies the block size instead); the ledger passes the
  // busiest rank's tokens, cdiv(context, dcp).
  uint64_t Global(uint64_t tokens) const { return in_.options.dcp > 1 ? in_.options.context_tokens : tokens; }
  uint64_t Cap(Checked slots) const { return slots.overflowed() ? MaxLen() : std::min(slots.value(), MaxLen()); }
  // One line's blocks after an allocation of `slots` slots with `computed` tokens cached.
  uint64_t LineBlocks(const Policy& p, uint64_t computed, uint64_t slots) const {
    if (p.window == 0) return CeilDiv(slots, p.block_tokens * uint64_t{in_.options.dcp});
    const uint64_t skipped = computed >= p.window ? computed - p.window + 1 : 0;
    return CeilDiv(slots, p.block_tokens) - skipped / p.block_tokens;
  }

  uint64_t full_block_tokens_ = 1;         // the full group's block span (x dcp)
  uint64_t block_cost_ = 0;                // bytes of one block id
  std::vector<VllmWindowBucket> buckets_;  // DeepSeek-V4 only
};

}  // namespace

Checked VllmHeld(uint64_t computed, uint64_t slots, uint64_t full_block_tokens,
                 std::span<const VllmWindowBucket> buckets) {
  Checked held = Checked(CeilDiv(slots, full_block_tokens));
  for (const VllmWindowBucket& b : buckets) {
    // window >= 1: a bucket exists only for windowed groups.
    const uint64_t skipped = computed >= b.window ? computed - b.window + 1 : 0;
    held += Checked(b.groups) * (CeilDiv(slots, b.block_tokens) - skipped / b.block_tokens);
  }
  return held;
}

// Step i (1-based) of a prefill starts with c = (i - 1) chunk tokens cached and needs
// min(c + size + lookahead, max_len) slots; the first step has no lookahead, the last may be
// partial (n % chunk tokens).
//
// Among the full steps i >= 2 whose slots are not capped, held(i) = ceil(t / F) + sum_b groups_b
// (ceil(t / B_b) - floor(max(0, c - W_b + 1) / B_b)) with t = i chunk + spec. Let P be a
// multiple of every B_b: moving i to i + P adds P chunk (a multiple of every B_b) to t and to c,
// so each window term grows by P chunk / B_b less what it frees, which is at most that; the
// full term never decreases. So every such step is matched by one in the last P uncapped full
// steps holding at least as much. The rest — the first step, the capped full steps (at most
// spec / chunk + 1 of them) and the partial step — are evaluated one by one. vLLM's window
// groups use blocks of 64 (window) and 4 or 8 (compressor state) tokens: P = lcm(B_b) <= 64.
Checked VllmPrefillPeakBlocks(const VllmPrefill& pf, uint64_t full_block_tokens,
                              std::span<const VllmWindowBucket> buckets) {
  if (pf.n == 0) return Checked(0);
  auto held_at = [&](uint64_t i) {
    const uint64_t c = (i - 1) * pf.chunk;
    const uint64_t size = std::min(pf.chunk, pf.n - c);
    Checked slots = Checked(c) + size + (i == 1 ? 0 : pf.spec);
    const uint64_t capped = slots.overflowed() ? pf.max_len : std::min(slots.value(), pf.max_len);
    return VllmHeld(c, capped, full_block_tokens, buckets);
  };
  Checked peak(0);
  auto consider = [&peak](Checked held) {
    if (held.overflowed() || held.value() > peak.value()) peak = held;
  };
  const uint64_t steps = CeilDiv(pf.n, pf.chunk);
  const uint64_t full_steps = pf.n / pf.chunk;
  // Full steps i >= 2 with i chunk + spec <= max_len are uncapped.
  const uint64_t uncapped = pf.max_len >= pf.spec ? std::min(full_steps, (pf.max_len - pf.spec) / pf.chunk) : 0;
  Checked period(1);
  for (const VllmWindowBucket& b : buckets) {
    if (!period.overflowed()) period = Lcm(period.value(), b.block_tokens);
  }
  const uint64_t first = period.overflowed() || period.value() + 2 > uncapped ? 2 : uncapped - period.value() + 1;
  consider(held_at(1));
  for (uint64_t i = first; i <= full_steps && !peak.overflowed(); ++i) consider(held_at(i));
  if (steps > full_steps) consider(held_at(steps));
  return peak;
}

std::unique_ptr<EngineProfile> MakeVllmProfile(const EngineInputs& in) { return std::make_unique<VllmProfile>(in); }

}  // namespace tessera::detail
