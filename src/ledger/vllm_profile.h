// vLLM's per-request block arithmetic, exposed for its tests. Internal to the ledger module.
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

// Block ids one request holds right after KVCacheManager.allocate_slots for a step that starts
// with `computed` tokens cached and needs `slots` slots: the full group's cdiv(slots, full), and
// per window bucket the blocks from the first token not skipped (computed - window + 1, freed by
// remove_skipped_blocks before the allocation) to slot `slots`. REQUIRES: computed <= slots.
Checked VllmHeld(uint64_t computed, uint64_t slots, uint64_t full_block_tokens,
                 std::span<const VllmWindowBucket> buckets);

// A prefill of `n` tokens in steps of `chunk` (REQUIRES: chunk > 0, n <= max_len) as vLLM's
// scheduler runs it: the first step with no lookahead (a fresh request), later steps with
// `spec` lookahead slots, every step's slots capped at max_model_len `max_len`.
struct VllmPrefill {
  uint64_t n = 0;
  uint64_t chunk = 1;
  uint32_t spec = 0;
  uint64_t max_len = 0;
};
// The most block ids held after any step's allocation: the maximum of VllmHeld over every step,
// in a closed form that evaluates O(lcm(block sizes) + spec / chunk) steps whatever n is.
Checked VllmPrefillPeakBlocks(const VllmPrefill& prefill, uint64_t full_block_tokens,
                              std::span<const VllmWindowBucket> buckets);

}  // namespace tessera::detail
