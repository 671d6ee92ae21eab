// Reconciliation: explain the difference between a ledger's prediction and what an engine
// really allocated, term by term.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/geometry.h"
#include "tessera/ledger.h"
#include "tessera/status.h"

namespace tessera {

struct Attribution {
  std::string term;
  int64_t bytes = 0;  // > 0: the observation holds this and the prediction does not; < 0: the reverse
};

struct Reconciliation {
  std::string scope;  // "per rank" or "all ranks"
  uint64_t predicted_bytes = 0;
  uint64_t observed_bytes = 0;
  int64_t difference_bytes = 0;  // observed - predicted
  std::vector<Attribution> attributed;
  int64_t unexplained_bytes = 0;  // difference - sum(attributed)
};

// Attributes observed - predicted to the smallest set of named terms that explains it exactly
// (terms the prediction holds that the engine may lack, and terms the engine may hold that the
// prediction left out, such as MTP layers); otherwise to the closest set, the rest reported as
// unexplained. `all_ranks` compares against committed_bytes_all_ranks.
Result<Reconciliation> Reconcile(const Geometry& g, const Ledger& ledger, uint64_t observed_bytes, bool all_ranks);

// Reads an allocation trace: one allocation per line, "<bytes> [label...]"; blank lines and
// lines starting with '#' are skipped. Returns the total. Errors name "trace" and the line.
Result<uint64_t> ReadAllocationTrace(const std::string& path);

}  // namespace tessera
