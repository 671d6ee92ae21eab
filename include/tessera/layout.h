// Layout: the block token span and the bytes of one page, derived from geometry + format +
// kernel rules, each factor with its reason.
//
// This is the one piece of page arithmetic that the ledger and the pools share, so that the
// bytes the ledger predicts and the bytes the pools hold cannot drift apart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/format.h"
#include "tessera/geometry.h"
#include "tessera/status.h"

namespace tessera {

enum class Kernel {
  kFlashMla,  // FlashMLA: 64 entries per page
  kGeneric,   // no kernel preference beyond the hard constraints
};
std::string_view KernelName(Kernel kernel);
Result<Kernel> ParseKernel(std::string_view name);

// How a cached prefix that ends at a block boundary gets the sliding-window ring and the
// compressor state it needs to resume (models with windows: DeepSeek-V4).
enum class SwaStrategy {
  kRecompute,  // persist nothing; a hit names the last `window` tokens for the engine to recompute
  kSnapshot,   // copy the live ring and compressor rows beside each sealed boundary block
  kRetain,     // keep the raw window rows of each boundary alive (window kept in chunks of `window`
               // tokens); the overlapping compressor's previous-group rows are copied
};
std::string_view SwaStrategyName(SwaStrategy s);
Result<SwaStrategy> ParseSwaStrategy(std::string_view name);

struct BlockTokensChoice {
  uint32_t block_tokens = 0;
  std::vector<std::string> reasons;  // why each factor is there
  std::vector<std::string> notes;    // preferences an explicit choice misses
};

// Chooses the tokens one block spans for paged caches with the given compress ratios (1 for
// per-token caches). Hard constraint: a multiple of every ratio (a block boundary inside a
// compression group cannot be expressed). Preference: the kernel's entries per page for the
// finest paged cache (FlashMLA: 64), 16 tokens for MHA with a generic kernel.
// `requested` (from --block-tokens) must meet the hard constraints or the result is
// kInvalidArgument on "block-tokens" naming the constraint; missing a preference adds a note.
Result<BlockTokensChoice> ChooseBlockTokens(const std::vector<uint32_t>& ratios, bool mla, Kernel kernel,
                                            std::optional<uint64_t> requested);

struct PageLayout {
  uint32_t block_tokens = 0;
  uint32_t compress_ratio = 1;
  uint32_t entries_per_block = 0;
  uint64_t record_bytes = 0;
  uint64_t data_bytes = 0;     // entries_per_block x record_bytes
  uint64_t page_bytes = 0;     // data_bytes rounded up to `alignment`
  uint64_t padding_bytes = 0;  // page_bytes - data_bytes
  uint64_t alignment = 1;
};

// One page of `format` holding a block of `block_tokens` tokens at `compress_ratio` tokens
// per entry. `alignment` 0 means the format's own page alignment.
// Errors: kInvalidArgument on "block-tokens" when block_tokens is not a multiple of the ratio.
Result<PageLayout> ComputePageLayout(const RecordFormat& format, uint32_t compress_ratio, uint32_t block_tokens,
                                     uint64_t alignment = 0);

// Host bytes Tessera's pool keeps per block id, as the ledger counts them: a model of a fixed
// header (state, refcount, generation, LRU links, prefix key, content key) plus the block's token
// ids, stored so that a prefix hit is verified token by token. A model, not a measurement: the
// structures that hold the header today (the pool's per-block arrays and the index's identity)
// take BlockPool::kHeaderBytes + BlockIndex::kIdentityBytes = 98 B, not 64 (pinned by
// BlockMetadata.LedgerModelAgainstTheStructures); the token ids are exactly 4 B each.
constexpr uint64_t kBlockHeaderBytes = 64;
constexpr uint64_t BlockMetadataBytes(uint32_t block_tokens) { return kBlockHeaderBytes + 4ULL * block_tokens; }

}  // namespace tessera
