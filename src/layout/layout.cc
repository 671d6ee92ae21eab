#include "tessera/layout.h"

#include <algorithm>

#include "tessera/checked.h"

namespace tessera {

std::string_view KernelName(Kernel kernel) { return kernel == Kernel::kFlashMla ? "flashmla" : "generic"; }

Result<Kernel> ParseKernel(std::string_view name) {
  if (name == "flashmla") return Kernel::kFlashMla;
  if (name == "generic") return Kernel::kGeneric;
  return InvalidArgument("kernel", "unknown kernel \"" + std::string(name) + "\" (known: flashmla, generic)");
}

namespace {
constexpr uint32_t kFlashMlaEntriesPerPage = 64;
constexpr uint32_t kGenericMhaBlockTokens = 16;
constexpr uint64_t kMaxBlockTokens = 1u << 20;
}  // namespace

Result<BlockTokensChoice> ChooseBlockTokens(const std::vector<uint32_t>& ratios, bool mla, Kernel kernel,
                                            std::optional<uint64_t> requested) {
  BlockTokensChoice choice;
  Checked lcm(1);
  uint32_t finest = 0;
  for (uint32_t r : ratios) {
    if (r == 0) continue;
    lcm = Lcm(lcm.value(), r);
    finest = finest == 0 ? r : std::min(finest, r);
  }
  if (lcm.overflowed() || lcm.value() > kMaxBlockTokens) {
    return OutOfRange("compress_ratios",
                      "their least common multiple exceeds " + std::to_string(kMaxBlockTokens) + " tokens");
  }
  if (finest == 0) finest = 1;
  uint64_t hard = lcm.value();

  uint64_t preferred = 0;
  std::string preference;
  if (mla && kernel == Kernel::kFlashMla) {
    preferred = static_cast<uint64_t>(kFlashMlaEntriesPerPage) * finest;
    preference = "FlashMLA reads pages of " + std::to_string(kFlashMlaEntriesPerPage) + " entries; at " +
                 std::to_string(finest) + " token(s) per entry that is " + std::to_string(preferred) + " tokens";
  } else if (!mla) {
    preferred = kGenericMhaBlockTokens;
    preference = "MHA pages of 16 tokens (the PagedAttention default)";
  } else {
    preferred = hard;
    preference = "no kernel preference beyond the compress ratios";
  }

  if (requested.has_value()) {
    uint64_t bt = *requested;
    if (bt == 0) return InvalidArgument("block-tokens", "must be positive");
    if (bt > kMaxBlockTokens)
      return OutOfRange("block-tokens", std::to_string(bt) + " exceeds " + std::to_string(kMaxBlockTokens));
    for (uint32_t r : ratios) {
      if (r != 0 && bt % r != 0) {
        return InvalidArgument(
            "block-tokens",
            std::to_string(bt) + " is not a multiple of compress ratio " + std::to_string(r) +
                " (a block must hold whole compression groups; lcm of ratios in use = " + std::to_string(hard) + ")");
      }
    }
    choice.block_tokens = static_cast<uint32_t>(bt);
    choice.reasons.push_back("set explicitly (--block-tokens " + std::to_string(bt) + ")");
    if (bt % preferred != 0) {
      choice.notes.push_back("misses a preference: " + preference);
    }
    return choice;
  }

  Checked bt = Lcm(hard, preferred);
  if (bt.overflowed() || bt.value() > kMaxBlockTokens)
    return OutOfRange("block-tokens", "derived block span is too large");
  choice.block_tokens = static_cast<uint32_t>(bt.value());
  if (hard > 1)
    choice.reasons.push_back("multiple of every compress ratio in use (lcm = " + std::to_string(hard) + ")");
  choice.reasons.push_back(preference);
  return choice;
}

Result<PageLayout> ComputePageLayout(const RecordFormat& format, uint32_t compress_ratio, uint32_t block_tokens,
                                     uint64_t alignment) {
  if (compress_ratio == 0) return InvalidArgument("compress_ratios", "a paged cache needs a positive compress ratio");
  if (block_tokens == 0 || block_tokens % compress_ratio != 0) {
    return InvalidArgument("block-tokens", std::to_string(block_tokens) + " is not a multiple of compress ratio " +
                                               std::to_string(compress_ratio));
  }
  PageLayout p;
  p.block_tokens = block_tokens;
  p.compress_ratio = compress_ratio;
  p.entries_per_block = block_tokens / compress_ratio;
  p.record_bytes = format.record_bytes();
  p.alignment = alignment == 0 ? std::max<uint64_t>(format.page_alignment, 1) : alignment;
  Checked data = Checked(p.entries_per_block) * p.record_bytes;
  Checked page = RoundUp(data.value(), p.alignment);
  if (data.overflowed() || page.overflowed()) return OutOfRange("block-tokens", "page bytes overflow 64 bits");
  p.data_bytes = data.value();
  p.page_bytes = page.value();
  p.padding_bytes = p.page_bytes - p.data_bytes;
  return p;
}

std::string_view SwaStrategyName(SwaStrategy s) {
  switch (s) {
    case SwaStrategy::kRecompute: return "recompute";
    case SwaStrategy::kSnapshot: return "snapshot";
    case SwaStrategy::kRetain: return "retain";
  }
  return "?";
}

Result<SwaStrategy> ParseSwaStrategy(std::string_view name) {
  if (name == "recompute") return SwaStrategy::kRecompute;
  if (name == "snapshot") return SwaStrategy::kSnapshot;
  if (name == "retain") return SwaStrategy::kRetain;
  return InvalidArgument("swa-strategy", "unknown strategy \"" + std::string(name) + "\" (known: recompute, snapshot, retain)");
}

}  // namespace tessera
