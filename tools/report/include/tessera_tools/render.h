// Rendering ledgers, reconciliations and claim checks as a table, JSON or Markdown.
#pragma once

#include <string>
#include <string_view>

#include "tessera/ledger.h"
#include "tessera/reconcile.h"
#include "tessera/status.h"
#include "tessera_tools/claims.h"

namespace tessera {

enum class OutputFormat { kTable, kJson, kMarkdown };
Result<OutputFormat> ParseOutputFormat(std::string_view name);

// JSON names for the totals: requested_bytes, committed_bytes (per rank),
// committed_bytes_all_ranks, read_bytes_per_token, mha_equivalent_bytes — exact integers.
// Per-token-per-layer figures are exact: an integer, or {"fraction": "9/2", "decimal": "4.5"}.
std::string RenderLedger(const Ledger& ledger, OutputFormat format, const Reconciliation* reconciliation = nullptr);
std::string RenderClaims(const ClaimCheck& check, OutputFormat format);
// `tessera layout`: the block span with its reasons, and per cache group the entries per block,
// page bytes and padding (pages) or ring bytes (arena). JSON names block_tokens and, per group,
// entries_per_block and page_bytes. The groups are the ledger's (engine tessera; see
// Ledger::groups).
std::string RenderLayout(const Ledger& ledger, OutputFormat format);

}  // namespace tessera
