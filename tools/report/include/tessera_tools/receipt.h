// Receipts: a qualification record of one ledger computation — every input, the config file's
// SHA-256, the formats region by region, the terms, the totals and what was checked — as
// Markdown and JSON. Deterministic: the same inputs give byte-identical receipts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/status.h"

namespace tessera {

struct ReceiptCheck {
  std::string name;
  bool passed = false;
  std::string detail;
};

struct Receipt {
  std::string markdown;
  std::string json;
  std::vector<ReceiptCheck> checks;
  bool all_passed() const;
};

struct ReceiptRequest {
  std::string model_source;  // "preset deepseek-v3" or the config path
  LedgerOptions options;
  std::optional<uint64_t> observed_bytes;
  bool observed_all_ranks = false;
};

Result<Receipt> BuildReceipt(const Geometry& g, const ReceiptRequest& request);

}  // namespace tessera
