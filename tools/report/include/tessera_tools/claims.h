// The claim check: published KV-cache figures evaluated claim by claim against the ledger.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

enum class Verdict {
  kCorrect,     // matches at the claimed precision, in the unit it names
  kMislabeled,  // matches only in another unit (GiB printed as "GB", GiB/1000 as "TB")
  kWrong,       // matches in no unit
};
std::string_view VerdictName(Verdict v);

struct ClaimResult {
  std::string id;
  std::string column;
  std::string subject;  // "deepseek-v3 mla-bf16 @ 32k"
  std::string claimed;  // "2.17 GB"
  std::string exact;    // the exact figure, labeled
  Verdict verdict = Verdict::kWrong;
  std::string reading;       // the unit reading that matched, or the closest one
  double error_percent = 0;  // claimed vs exact under `reading`, signed (claimed high > 0)
  std::string detail;
};

struct ClaimCheck {
  std::string source;
  std::vector<ClaimResult> results;
  std::vector<std::string> findings;  // per-column conclusions
};

// Evaluates a claim table (the JSON shape of data/claims/seed-000.json).
Result<ClaimCheck> CheckClaims(std::string_view claims_json);
// The shipped table of the seed note.
Result<ClaimCheck> CheckSeedClaims();

}  // namespace tessera
