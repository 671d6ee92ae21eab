// SGLang's sizing rules (docs/ENGINES.md): FlashMLA pages of 64 tokens for MLA, a page of one
// token for MHA; for DeepSeek-V4 256-token pages for the compressed caches (padded to the v4-fp8
// alignment), unpadded indexer pages, window pages of `window` tokens, and the compressor state in
// a per-request ring. SGLang sizes one shared pool from free memory; the ledger reports what one
// request consumes from it.

#include "engine_profile.h"

namespace tessera::detail {
namespace {

constexpr uint32_t kSglangMhaPageTokens = 1;

// SGLang's DeepSeek-V4 policies.
std::vector<Policy> V4Policies(const std::vector<CacheLine>& lines, uint32_t full, uint64_t align) {
  std::vector<Policy> policies(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const CacheLine& l = lines[i];
    Policy& p = policies[i];
    switch (l.role) {
      case CacheRole::kCompressed:
      case CacheRole::kIndexer:
        p = Policy{.in_pages = true,
                   .block_tokens = full,
                   .entry_tokens = l.compress_ratio,
                   .alignment = l.role == CacheRole::kCompressed ? align : 1,  // indexer pages: unpadded
                   .by_tokens = true,
                   .window = 0};
        break;
      case CacheRole::kWindow:
        p = Policy{.in_pages = true,
                   .block_tokens = l.slots,
                   .entry_tokens = 1,
                   .alignment = align,
                   .by_tokens = true,
                   .window = l.slots};
        break;
      default:  // compressor states: a per-request ring in its compress-state pool
        break;
    }
  }
  return policies;
}

class SglangProfile final : public EngineProfile {
 public:
  using EngineProfile::EngineProfile;

  Status Plan(Ledger& ledger) override {
    if (!in_.g.is_hybrid) {
      TESSERA_RETURN_IF_ERROR(PageDenseModel(in_, Kernel::kFlashMla, kSglangMhaPageTokens, "SGLang default page size 1",
                                             ledger, policies_));
      return LayPages(ledger);
    }
    TESSERA_ASSIGN_OR_RETURN(uint32_t full, ServedV4BlockTokens(in_, ledger));
    policies_ = V4Policies(ledger.lines, full, ServedV4Alignment(in_.caches.main_format));
    ledger.notes.push_back("SGLang pages the window in window-sized pages; compressor state in a per-request ring");
    return LayPages(ledger);
  }

  RankCost CostPerRank(const Ledger& ledger, uint64_t tokens) const override { return SumLineCosts(ledger, tokens); }
};

}  // namespace

std::unique_ptr<EngineProfile> MakeSglangProfile(const EngineInputs& in) { return std::make_unique<SglangProfile>(in); }

}  // namespace tessera::detail
