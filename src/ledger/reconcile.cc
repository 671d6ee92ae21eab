#include "tessera/reconcile.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <sstream>

#include "tessera/checked.h"
#include "tessera/file_io.h"
#include "tessera/format.h"
#include "tessera/layout.h"
#include "tessera/units.h"

namespace tessera {

namespace {

struct Candidate {
  std::string term;
  int64_t bytes;
};

constexpr uint64_t kMaxSigned = static_cast<uint64_t>(INT64_MAX);
// Subsets of at most this many candidates are searched (2^20 sums).
constexpr size_t kMaxCandidates = 20;
// vLLM's and SGLang's fallback MLA path when the chosen kernel is unavailable: Triton MLA, whose
// blocks are multiples of 16 (vllm/v1/attention/backends/mla/triton_mla.py), 16 by default.
constexpr uint64_t kGenericMlaBlockTokens = 16;

uint64_t Committed(const Ledger& l, bool all_ranks) {
  return all_ranks ? l.committed_bytes_all_ranks : l.committed_bytes;
}

// "+name" / "-name" for what an alternative ledger holds beyond / short of the prediction; none
// when the alternative fails, matches, or does not fit a signed difference.
void AddAlternative(const Geometry& g, const LedgerOptions& other, const std::string& name, bool all_ranks,
                    uint64_t predicted, std::vector<Candidate>& out) {
  Result<Ledger> alt = ComputeLedger(g, other);
  if (!alt.ok() || Committed(*alt, all_ranks) > kMaxSigned) return;
  const int64_t delta = static_cast<int64_t>(Committed(*alt, all_ranks)) - static_cast<int64_t>(predicted);
  if (delta != 0) out.push_back({(delta > 0 ? "+" : "-") + name, delta});
}

// The bytes of a record's quantization scales: its scale regions and the pad of their row.
uint64_t ScaleBytes(const RecordFormat& f) {
  uint64_t bits = 0;
  for (const Region& r : f.regions) {
    if (r.name.rfind("scale", 0) == 0 || r.name == "pad") bits += r.bits();
  }
  return bits / 8;
}

// The scale bytes of the entries the ledger's lines commit on one rank (pages or rings).
Checked CommittedScaleBytes(const Ledger& l) {
  Checked total(0);
  for (const CacheLine& line : l.lines) {
    const uint64_t scale = ScaleBytes(line.format);
    if (scale == 0) continue;
    // A line of a packed page (ADR 0020) commits its slices' data; its page padding is the group's.
    const uint64_t per_page = line.page.packed() ? line.page.data_bytes : line.page.page_bytes;
    Checked entries = line.in_pages && per_page > 0
                          ? Checked(line.committed_bytes / per_page) * line.page.entries_per_block
                          : Checked(line.committed_bytes / std::max<uint64_t>(1, line.format.record_bytes()));
    total += entries * scale;
  }
  return total;
}

// A term's name as a trace would label it: without its sign and parenthesis.
std::string BaseName(const std::string& term) {
  std::string base = term.substr(1);
  return base.substr(0, base.find('('));
}

}  // namespace

// Long (~110 lines) on purpose: one candidate term per failure probe, each a few lines over the
// same Reconciliation, then the subset search over them; split, each probe would take all of it.
Result<Reconciliation> Reconcile(const Geometry& g, const Ledger& ledger, uint64_t observed_bytes, bool all_ranks,
                                 const std::vector<TraceLabel>& labels) {
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
    AddAlternative(g, other, "mtp_layers", all_ranks, r.predicted_bytes, candidates);
  }
  // Tensor-parallel replication: an observation summed over ranks, or of one rank.
  if (ledger.options.tp > 1 && ledger.committed_bytes_all_ranks <= kMaxSigned) {
    int64_t per_rank = static_cast<int64_t>(ledger.committed_bytes);
    int64_t all = static_cast<int64_t>(ledger.committed_bytes_all_ranks);
    candidates.push_back({all_ranks ? "-other_ranks" : "+other_ranks", all_ranks ? per_rank - all : all - per_rank});
  }
  // Failure probe: the expanded per-head K/V cached instead of the latent.
  if (g.is_mla) {
    LedgerOptions other = ledger.options;
    other.kv_format = "expanded-bf16";
    other.indexer_format.clear();
    AddAlternative(g, other, "expanded_kv", all_ranks, r.predicted_bytes, candidates);
  }
  // Failure probe: records stored without their quantization scales.
  if (Checked scales = CommittedScaleBytes(ledger) * rank_factor;
      !scales.overflowed() && scales.value() > 0 && scales.value() <= kMaxSigned) {
    candidates.push_back({"-quantization_scales", -static_cast<int64_t>(scales.value())});
  }
  // Failure probe: another tensor-parallel size than predicted.
  for (uint32_t tp : {1u, 2u, 4u, 8u}) {
    if (tp == ledger.options.tp || tp % ledger.options.dcp != 0) continue;
    LedgerOptions other = ledger.options;
    other.tp = tp;
    AddAlternative(g, other, "tp_mismatch(tp=" + std::to_string(tp) + ")", all_ranks, r.predicted_bytes, candidates);
  }
  // Failure probe: a generic attention path's pages instead of the chosen kernel's.
  if (ledger.options.kernel != Kernel::kGeneric || ledger.options.engine != Engine::kTessera) {
    LedgerOptions other = ledger.options;
    other.kernel = Kernel::kGeneric;
    if (ledger.options.engine != Engine::kTessera && g.is_mla && !g.is_hybrid) {
      other.block_tokens = kGenericMlaBlockTokens;
    }
    AddAlternative(g, other, "generic_kernel_fallback", all_ranks, r.predicted_bytes, candidates);
  }

  // Terms a trace's labels name are always attributed (a label naming several is not used).
  const size_t n = std::min(candidates.size(), kMaxCandidates);
  uint32_t forced = 0;
  std::vector<std::optional<uint64_t>> trace_bytes(n);
  for (const TraceLabel& label : labels) {
    size_t match = n, count = 0;
    for (size_t i = 0; i < n; ++i) {
      if (BaseName(candidates[i].term) == label.label) {
        match = i;
        ++count;
      }
    }
    if (count == 1) {
      forced |= 1u << match;
      trace_bytes[match] = label.bytes;
    }
  }

  // Smallest subset that explains the difference exactly; else the closest subset.
  uint32_t best_mask = forced;
  Int128 best_residual = static_cast<Int128>(r.difference_bytes);
  for (size_t i = 0; i < n; ++i) {
    if (forced & (1u << i)) best_residual -= candidates[i].bytes;
  }
  int best_size = std::popcount(forced);
  auto abs128 = [](Int128 v) { return v < 0 ? -v : v; };
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    if ((mask & forced) != forced) continue;
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
    if (best_mask & (1u << i)) r.attributed.push_back({candidates[i].term, candidates[i].bytes, trace_bytes[i]});
  }
  r.unexplained_bytes = static_cast<int64_t>(best_residual);
  return r;
}

Result<AllocationTrace> ReadLabelledAllocationTrace(const std::string& path) {
  // A regular file of bounded size (not a FIFO, not /dev/zero), read whole.
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "trace"));
  std::istringstream in(text);
  std::string line;
  Checked total(0);
  size_t lineno = 0;
  AllocationTrace trace;
  std::map<std::string, size_t> index;  // label -> position in trace.labels
  std::vector<Checked> sums;
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
      // The file's bytes are shown with every control byte (ESC, NUL, DEL...) as '?': an error line
      // never carries a terminal escape from a file.
      std::string shown = line.substr(0, 60);
      for (char& ch : shown) {
        const auto u = static_cast<unsigned char>(ch);
        if (u < 0x20 || u == 0x7f) ch = '?';
      }
      return InvalidArgument(
          "trace", path + " line " + std::to_string(lineno) + ": expected \"<bytes> [label]\", got \"" + shown + "\"");
    }
    total += *v;
    std::string label;
    if (end != std::string::npos) {
      const size_t first = line.find_first_not_of(" \t\r", end);
      if (first != std::string::npos) label = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    }
    auto [it, fresh] = index.emplace(label, trace.labels.size());
    if (fresh) {
      trace.labels.push_back({label, 0});
      sums.emplace_back(0);
    }
    sums[it->second] += *v;
  }
  // Every label's sum is at most the total: checking the total checks them all.
  if (total.overflowed()) return OutOfRange("trace", "total of " + path + " overflows 64 bits");
  trace.total = total.value();
  for (size_t i = 0; i < sums.size(); ++i) trace.labels[i].bytes = sums[i].value();
  return trace;
}

Result<uint64_t> ReadAllocationTrace(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(AllocationTrace trace, ReadLabelledAllocationTrace(path));
  return trace.total;
}

}  // namespace tessera
