// JSON builders shared by render.cc and receipt.cc. Internal to the ledger module.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessera/claims.h"
#include "tessera/ledger.h"
#include "tessera/reconcile.h"

namespace tessera::detail {

// j as text. Strings that are not UTF-8 (a config path is whatever bytes the file system holds)
// have their invalid bytes replaced by U+FFFD instead of making dump() throw.
inline std::string DumpJson(const nlohmann::ordered_json& j, int indent = 2) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

nlohmann::ordered_json ExactJson(const Fraction& f);
nlohmann::ordered_json LedgerToJson(const Ledger& ledger, const Reconciliation* reconciliation);
nlohmann::ordered_json ClaimsToJson(const ClaimCheck& check);

}  // namespace tessera::detail
