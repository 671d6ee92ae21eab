// The ledger as JSON: what `tessera ledger --format json` prints, what receipts embed and what
// Python's tessera.ledger_json returns (one writer, in the ledger library: the Python module links
// no tools for it).
//
// JSON names for the totals: requested_bytes, committed_bytes (per rank),
// committed_bytes_all_ranks, read_bytes_per_token, mha_equivalent_bytes — exact integers.
// Per-token-per-layer figures are exact: an integer, or {"fraction": "9/2", "decimal": "4.5"}.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessera/fraction.h"
#include "tessera/ledger.h"
#include "tessera/reconcile.h"

namespace tessera {

// An exact figure: the integer, or {"fraction", "decimal"} (the decimal exact when it ends within
// 12 places, else rounded to 6 and marked "~": Fraction::ToDecimal).
nlohmann::ordered_json ExactJson(const Fraction& f);
// The ledger, and the reconciliation when given (under "reconciliation").
nlohmann::ordered_json LedgerToJson(const Ledger& ledger, const Reconciliation* reconciliation);

// j as text. Strings that are not UTF-8 (a config path is whatever bytes the file system holds)
// have their invalid bytes replaced by U+FFFD instead of making dump() throw.
inline std::string DumpJson(const nlohmann::ordered_json& j, int indent = 2) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// DumpJson(LedgerToJson(...)) and a newline.
inline std::string LedgerJsonText(const Ledger& ledger, const Reconciliation* reconciliation = nullptr) {
  return DumpJson(LedgerToJson(ledger, reconciliation)) + "\n";
}

}  // namespace tessera
