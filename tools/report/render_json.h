// JSON builders shared by render.cc and receipt.cc (private to tools/report).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessera/ledger.h"
#include "tessera/ledger_json.h"
#include "tessera/reconcile.h"
#include "tessera_tools/claims.h"

namespace tessera::detail {

// The ledger's own JSON (ExactJson, LedgerToJson, DumpJson) is the ledger library's:
// tessera/ledger_json.h.
using tessera::DumpJson;
using tessera::ExactJson;
using tessera::LedgerToJson;

nlohmann::ordered_json ClaimsToJson(const ClaimCheck& check);

}  // namespace tessera::detail
