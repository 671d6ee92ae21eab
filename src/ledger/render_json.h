// JSON builders shared by render.cc and receipt.cc. Internal to the ledger module.
#pragma once

#include <nlohmann/json.hpp>

#include "tessera/claims.h"
#include "tessera/ledger.h"
#include "tessera/reconcile.h"

namespace tessera::detail {

nlohmann::ordered_json ExactJson(const Fraction& f);
nlohmann::ordered_json LedgerToJson(const Ledger& ledger, const Reconciliation* reconciliation);
nlohmann::ordered_json ClaimsToJson(const ClaimCheck& check);

}  // namespace tessera::detail
