#include "tessera/reconcile.h"

#include <cstdlib>
#include <sstream>

#include "tessera/checked.h"
#include "tessera/file_io.h"
#include "tessera/units.h"

namespace tessera {

namespace {

struct Candidate {
  std::string term;
  int64_t bytes;
};

constexpr uint64_t kMaxSigned = static_cast<uint64_t>(INT64_MAX);

}  // namespace

Result<Reconciliation> Reconcile(const Geometry& g, const Ledger& ledger, uint64_t observed_bytes, bool all_ranks) {
  Reconciliation r;
  r.scope = all_ranks ? "all ranks" : "per rank";
  r.predicted_bytes = all_ranks ? ledger.committed_bytes_all_ranks : ledger.committed_bytes;
  r.observed_bytes = observed_bytes;
  if (r.predicted_bytes > kMaxSigned || observed_bytes > kMaxSigned) {
    return OutOfRange("observed", "byte counts above 2^63 cannot be reconciled");
  }
  r.difference_bytes = static_cast<int64_t>(observed_bytes) - static_cast<int64_t>(r.predicted_bytes);

  const uint64_t rank_factor = all_ranks && ledger.committed_bytes > 0 ? ledger.options.tp : 1;
  std::vector<Candidate> candidates;
  for (const Term& t : ledger.terms) {
    if (t.term == LedgerTerm::kRecords || t.bytes == 0) continue;
    // Terms are per rank; over all ranks each appears on every rank (a close approximation
    // under DCP, exact otherwise).
    Checked b = Checked(t.bytes) * rank_factor;
    if (!b.overflowed() && b.value() <= kMaxSigned)
      candidates.push_back({"-" + std::string(LedgerTermName(t.term)), -static_cast<int64_t>(b.value())});
  }
  // The MTP layer(s): held by an engine that runs MTP speculative decoding.
  if (g.num_mtp_layers > 0) {
    LedgerOptions other = ledger.options;
    other.include_mtp = !other.include_mtp;
    Result<Ledger> alt = ComputeLedger(g, other);
    // Differences are signed 64-bit: a figure above 2^63 is not a candidate (it would wrap).
    if (alt.ok() && (all_ranks ? alt->committed_bytes_all_ranks : alt->committed_bytes) <= kMaxSigned) {
      uint64_t a = all_ranks ? alt->committed_bytes_all_ranks : alt->committed_bytes;
      int64_t delta = static_cast<int64_t>(a) - static_cast<int64_t>(r.predicted_bytes);
      candidates.push_back({other.include_mtp ? "+mtp_layers" : "-mtp_layers", delta});
    }
  }
  // Tensor-parallel replication: an observation summed over ranks, or of one rank.
  if (ledger.options.tp > 1 && ledger.committed_bytes_all_ranks <= kMaxSigned) {
    int64_t per_rank = static_cast<int64_t>(ledger.committed_bytes);
    int64_t all = static_cast<int64_t>(ledger.committed_bytes_all_ranks);
    candidates.push_back({all_ranks ? "-other_ranks" : "+other_ranks", all_ranks ? per_rank - all : all - per_rank});
  }

  // Smallest subset that explains the difference exactly; else the closest subset.
  const size_t n = std::min<size_t>(candidates.size(), 16);
  uint32_t best_mask = 0;
  Int128 best_residual = static_cast<Int128>(r.difference_bytes);
  int best_size = 0;
  auto abs128 = [](Int128 v) { return v < 0 ? -v : v; };
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    Int128 sum = 0;
    int size = 0;
    for (size_t i = 0; i < n; ++i) {
      if (mask & (1u << i)) {
        sum += candidates[i].bytes;
        ++size;
      }
    }
    Int128 residual = static_cast<Int128>(r.difference_bytes) - sum;
    bool better =
        abs128(residual) < abs128(best_residual) || (abs128(residual) == abs128(best_residual) && size < best_size);
    if (better) {
      best_residual = residual;
      best_mask = mask;
      best_size = size;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (best_mask & (1u << i)) r.attributed.push_back({candidates[i].term, candidates[i].bytes});
  }
  r.unexplained_bytes = static_cast<int64_t>(best_residual);
  return r;
}

Result<uint64_t> ReadAllocationTrace(const std::string& path) {
  // A regular file of bounded size (not a FIFO, not /dev/zero), read whole.
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "trace"));
  std::istringstream in(text);
  std::string line;
  Checked total(0);
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    // The number ends at whitespace only: "7,027,200 kv" is grouped digits, and "1,2" is refused
    // by the parser rather than read as 1.
    size_t end = line.find_first_of(" \t\r", start);
    std::string number = line.substr(start, end == std::string::npos ? std::string::npos : end - start);
    Result<uint64_t> v = ParseUnsigned(number, "trace");
    if (!v.ok()) {
      return InvalidArgument("trace", path + " line " + std::to_string(lineno) +
                                          ": expected \"<bytes> [label]\", got \"" + line.substr(0, 60) + "\"");
    }
    total += *v;
  }
  if (total.overflowed()) return OutOfRange("trace", "total of " + path + " overflows 64 bits");
  return total.value();
}

}  // namespace tessera
