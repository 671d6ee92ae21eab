// Engine profiles: how Tessera, vLLM and SGLang turn cache lines into pages and bytes.
// Internal to the ledger module.
#pragma once

#include "tessera/checked.h"
#include "tessera/ledger.h"

namespace tessera::detail {

// Entries a cache holds after `tokens` tokens at `ratio` tokens per entry (complete groups).
Checked Entries(uint64_t tokens, uint32_t ratio);
// Blocks of `block_tokens` that hold any of the last `window` tokens of a `tokens`-long
// sequence (the blocks a sliding-window group keeps after freeing those wholly behind it).
uint64_t WindowBlocksHeld(uint64_t tokens, uint64_t window, uint64_t block_tokens);

// Fills, per line: in_pages, page, committed_bytes, terms, read_bytes_per_token; and on the
// ledger: block_tokens and its reasons, tokens_per_rank, terms, committed totals, the
// admission reservation and read totals.
Status ApplyEngine(const Geometry& g, const LedgerOptions& options, const RecordFormat& main_format, Ledger& ledger);

}  // namespace tessera::detail
