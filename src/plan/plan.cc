#include "tessera/plan.h"

#include <algorithm>
#include <array>
#include <map>

#include "context_search.h"
#include "tessera/checked.h"
#include "tessera/units.h"

namespace tessera {

Result<Fraction> ParseUtilization(std::string_view text) {
  const char* field = "gpu-memory-utilization";
  if (text.empty() || text.size() > 12) {
    return InvalidArgument(field,
                           "must be a decimal in (0, 1] such as 0.9 (got \"" + std::string(text.substr(0, 20)) + "\")");
  }
  uint64_t num = 0, den = 1;
  bool dot = false, digits = false;
  int places = 0;
  for (char c : text) {
    if (c == '.' && !dot) {
      dot = true;
      continue;
    }
    if (c < '0' || c > '9') {
      return InvalidArgument(field, "must be a decimal in (0, 1] such as 0.9 (got \"" + std::string(text) + "\")");
    }
    digits = true;
    num = num * 10 + static_cast<uint64_t>(c - '0');  // at most 12 digits
    if (dot) {
      den *= 10;
      if (++places > 9) return InvalidArgument(field, "at most 9 decimal places");
    }
  }
  if (!digits || num == 0 || num > den) {
    return InvalidArgument(field, "must be in (0, 1] (got \"" + std::string(text) + "\")");
  }
  return Fraction(num, den);
}

bool Plan::any_rejected() const {
  for (const EnginePlan& e : engines) {
    if (e.rejected) return true;
  }
  return false;
}

namespace {

constexpr LedgerPhase kPhases[] = {LedgerPhase::kAdmission, LedgerPhase::kPrefillPeak, LedgerPhase::kDecode};

// Per-request bytes per phase (one rank) at a context, memoized: the three bisections of an
// engine share their first midpoints. Each probe prices one context over the engine's profile
// planned once (LedgerSweep: the same figures as a ledger at that context).
class PhaseBytesAt {
 public:
  PhaseBytesAt(const Geometry& g, const LedgerOptions& o) : sweep_(g, o) {}
  const std::string& kv_format() const { return sweep_.kv_format(); }
  Result<PhaseTotals> At(uint64_t context) {
    auto it = memo_.find(context);
    if (it != memo_.end()) return it->second;
    TESSERA_ASSIGN_OR_RETURN(PhaseTotals b, sweep_.PhasesAt(context));
    memo_.emplace(context, b);
    return b;
  }

 private:
  LedgerSweep sweep_;
  std::map<uint64_t, PhaseTotals> memo_;
};

// "~626.920361 GiB (673,150,611,808 B)": people read the unit, the exact count stays beside it.
std::string Human(uint64_t bytes) {
  if (bytes < 1024) return WithThousands(bytes) + " B";
  return FormatBinary(bytes) + " (" + WithThousands(bytes) + " B)";
}

}  // namespace

// Long (~90 lines): the plan's option checks, then one pass per engine that fills its row; the
// rows share the budget computed at the top, which a split would pass in pieces.
Result<Plan> ComputePlan(const Geometry& g, const WeightShapes& shapes, const PlanOptions& o) {
  if (o.context_tokens == 0) return InvalidArgument("context", "must be a positive token count");
  if (o.concurrency && *o.concurrency == 0) return InvalidArgument("concurrency", "must be positive");
  if (o.engines.empty()) return InvalidArgument("engine", "give at least one engine");
  if (o.utilization.num() == 0 || o.utilization.num() > o.utilization.den()) {
    return InvalidArgument("gpu-memory-utilization", "must be in (0, 1]");
  }
  Plan p;
  p.model = g.name;
  p.config_sha256 = g.config_sha256;
  p.gpu = o.gpu;
  p.tp = o.tp;
  p.utilization = o.utilization;
  p.context_tokens = o.context_tokens;
  p.concurrency = o.concurrency;
  p.max_committed_bytes = o.max_committed_bytes;
  p.min_concurrency = o.min_concurrency;
  p.include_mtp = o.ledger.include_mtp;
  p.max_position_embeddings = g.max_position_embeddings;
  const WeightDtype dtype = o.weights_dtype.value_or(shapes.checkpoint_dtype);
  TESSERA_ASSIGN_OR_RETURN(p.weights, ComputeWeightBytes(shapes, dtype, o.tp, o.ledger.include_mtp));

  p.usable_bytes =
      static_cast<uint64_t>(static_cast<Int128>(o.gpu.memory_bytes) * o.utilization.num() / o.utilization.den());
  p.reserve_bytes = o.reserve_bytes;
  Checked held = Checked(p.weights.bytes_per_rank) + o.reserve_bytes;
  p.weights_fit = !held.overflowed() && held.value() <= p.usable_bytes;
  p.kv_budget_bytes = p.weights_fit ? p.usable_bytes - held.value() : 0;

  uint64_t hi = g.max_position_embeddings;
  if (hi == 0) {
    hi = uint64_t{1} << 20;
    p.notes.push_back("the config has no max_position_embeddings: the longest context is searched up to 1048576");
  }
  if (o.context_tokens > hi) {
    p.notes.push_back("context " + std::to_string(o.context_tokens) + " is beyond max_position_embeddings " +
                      std::to_string(hi));
  }
  const uint64_t planned = o.concurrency.value_or(1);
  for (Engine engine : o.engines) {
    LedgerOptions lo = o.ledger;
    lo.engine = engine;
    // --max-model-len caps vLLM's and SGLang's contexts; Tessera's pools have no such cap.
    if (engine == Engine::kTessera) lo.max_model_len.reset();
    const uint64_t engine_hi = lo.max_model_len ? std::min(hi, *lo.max_model_len) : hi;
    lo.tp = o.tp;
    lo.batch = 1;
    PhaseBytesAt at(g, lo);
    TESSERA_ASSIGN_OR_RETURN(auto bytes, at.At(o.context_tokens));
    if (p.kv_format.empty()) p.kv_format = at.kv_format();
    EnginePlan e;
    e.engine = engine;
    e.sustained_concurrency = UINT64_MAX;
    uint64_t largest = 0;
    for (LedgerPhase phase : kPhases) {
      const size_t i = static_cast<size_t>(phase);
      PhasePlan pp;
      pp.phase = phase;
      pp.bytes_per_request = bytes[i];
      pp.max_concurrency = bytes[i] == 0 ? UINT64_MAX : p.kv_budget_bytes / bytes[i];
      if (o.concurrency) {
        TESSERA_ASSIGN_OR_RETURN(uint64_t c, detail::LongestContext([&at](uint64_t context) { return at.At(context); },
                                                                    i, *o.concurrency, p.kv_budget_bytes, engine_hi));
        pp.max_context = c;
        e.max_context = std::min(e.max_context.value_or(UINT64_MAX), c);
      }
      e.sustained_concurrency = std::min(e.sustained_concurrency, pp.max_concurrency);
      largest = std::max(largest, bytes[i]);
      e.phases.push_back(pp);
    }
    Checked committed = Checked(largest) * planned;
    if (committed.overflowed()) return OutOfRange("concurrency", "committed bytes overflow 64 bits");
    e.committed_bytes = committed.value();
    if (!p.weights_fit) {
      e.reasons.push_back("weights " + Human(p.weights.bytes_per_rank) + " per rank plus reserve " +
                          Human(p.reserve_bytes) + " exceed the usable " + Human(p.usable_bytes));
    }
    if (o.max_committed_bytes && e.committed_bytes > *o.max_committed_bytes) {
      e.reasons.push_back("committed " + Human(e.committed_bytes) + " per rank > --max-committed-bytes " +
                          Human(*o.max_committed_bytes));
    }
    if (o.min_concurrency && e.sustained_concurrency < *o.min_concurrency) {
      e.reasons.push_back("sustained concurrency " + std::to_string(e.sustained_concurrency) + " < --min-concurrency " +
                          std::to_string(*o.min_concurrency));
    }
    e.rejected = !e.reasons.empty();
    p.engines.push_back(std::move(e));
  }
  return p;
}

}  // namespace tessera
