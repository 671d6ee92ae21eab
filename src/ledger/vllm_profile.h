// vLLM's DeepSeek-V4 prefill arithmetic, exposed for its tests. Internal to the ledger module.
#pragma once

#include <cstdint>
#include <span>

#include "tessera/checked.h"

namespace tessera::detail {

// vLLM's DeepSeek-V4 sliding-window groups that share a block size and a window: `groups`
// block-id groups, each keeping the blocks that hold its last `window` tokens.
struct VllmWindowBucket {
  uint32_t block_tokens = 0;
  uint64_t window = 0;
  uint64_t groups = 0;
};
// Block ids vLLM holds during the prefill step that ends at `end` tokens, having written `size`
// tokens in that step: the full group's blocks of `full_block_tokens` plus, per window bucket,
// the blocks of the last window - 1 + size tokens (blocks wholly behind the window are freed
// only after the step).
Checked VllmPrefillHeld(uint64_t end, uint64_t size, uint32_t full_block_tokens,
                        std::span<const VllmWindowBucket> buckets);
// The most block ids held at the end of any step of a prefill of `n` tokens in chunks of
// `chunk` (REQUIRES: chunk > 0): the maximum of VllmPrefillHeld over every step, in a closed
// form that evaluates at most lcm(block sizes) + 1 steps whatever n is.
Checked VllmPrefillPeakBlocks(uint64_t n, uint64_t chunk, uint32_t full_block_tokens,
                              std::span<const VllmWindowBucket> buckets);

}  // namespace tessera::detail
