// The longest-context search of `tessera plan` (ADR 0019): the plan's answers equal the same
// search over fresh ledgers (the way it probed before LedgerSweep), and, on a shortened context
// range, the brute-force answer (every context priced).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/context_search.h"
#include "tessera/plan.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;
using testing::PresetShapes;

PlanOptions H200x8(uint64_t context) {
  PlanOptions o;
  o.gpu = *LoadGpu("H200-141G");
  o.tp = 8;
  o.context_tokens = context;
  return o;
}

// The reference: each probe a ledger computed from scratch (memoized, as the plan did).
class FreshLedgers {
 public:
  FreshLedgers(const Geometry& g, LedgerOptions o) : g_(g), o_(std::move(o)) {}
  Result<PhaseTotals> operator()(uint64_t context) {
    auto it = memo_.find(context);
    if (it != memo_.end()) return it->second;
    LedgerOptions o = o_;
    o.context_tokens = context;
    TESSERA_ASSIGN_OR_RETURN(Ledger l, ComputeLedger(g_, o));
    PhaseTotals b{};
    for (const PhaseBytes& p : l.phases) b[static_cast<size_t>(p.phase)] = p.bytes;
    memo_.emplace(context, b);
    ++ledgers_;
    return b;
  }
  size_t ledgers() const { return ledgers_; }

 private:
  const Geometry& g_;
  LedgerOptions o_;
  std::map<uint64_t, PhaseTotals> memo_;
  size_t ledgers_ = 0;
};

LedgerOptions LedgerOptionsOf(const PlanOptions& o, Engine engine) {
  LedgerOptions lo = o.ledger;
  lo.engine = engine;
  lo.tp = o.tp;
  lo.batch = 1;
  return lo;
}

TEST(PlanSearch, EqualsTheSearchOverFreshLedgers) {
  struct Case {
    const char* model;
    uint32_t spec;
    bool mtp;
    uint64_t chunk;
  };
  const Case cases[] = {
      {"deepseek-v3.2", 0, false, 8192},      {"deepseek-v4-pro", 0, false, 8192}, {"deepseek-v4-pro", 2, true, 2048},
      {"deepseek-v4-flash", 0, false, 16384}, {"deepseek-v3", 1, true, 8192},      {"llama-3.1-70b", 0, false, 8192},
  };
  size_t compared = 0, inside = 0, refused = 0;
  for (const Case& c : cases) {
    const Geometry g = Preset(c.model);
    const WeightShapes shapes = PresetShapes(c.model);
    for (uint64_t n : {uint64_t{1}, uint64_t{4}, uint64_t{37}, uint64_t{512}, uint64_t{100000}}) {
      PlanOptions o = H200x8(131072);
      o.concurrency = n;
      o.ledger.spec_tokens = c.spec;
      o.ledger.include_mtp = c.mtp;
      o.ledger.prefill_chunk_tokens = c.chunk;
      Result<Plan> p = ComputePlan(g, shapes, o);
      if (!p.ok()) {
        // Then the reference, run in the plan's order (per engine: the context, then each
        // phase's search), meets the same error first.
        Status first = Status::Ok();
        for (Engine engine : o.engines) {
          FreshLedgers fresh(g, LedgerOptionsOf(o, engine));
          Status s = fresh(o.context_tokens).status();
          for (size_t i = 0; i < 3 && s.ok(); ++i) {
            // The budget does not depend on the concurrency: the plan without it gives it.
            PlanOptions plain = o;
            plain.concurrency.reset();
            Result<Plan> b = ComputePlan(g, shapes, plain);
            ASSERT_TRUE(b.ok()) << b.status().ToString();
            s = detail::LongestContext(fresh, i, n, b->kv_budget_bytes, g.max_position_embeddings).status();
          }
          if (!s.ok()) {
            first = s;
            break;
          }
        }
        EXPECT_EQ(p.status().ToString(), first.ToString()) << c.model << " n=" << n;
        ++refused;
        continue;
      }
      ASSERT_EQ(p->engines.size(), 3u);
      for (const EnginePlan& e : p->engines) {
        FreshLedgers fresh(g, LedgerOptionsOf(o, e.engine));
        for (size_t i = 0; i < 3; ++i) {
          const std::string where = std::string(c.model) + "/" + std::string(EngineName(e.engine)) +
                                    " n=" + std::to_string(n) + " " + std::string(LedgerPhaseName(e.phases[i].phase));
          Result<uint64_t> want = detail::LongestContext(fresh, i, n, p->kv_budget_bytes, g.max_position_embeddings);
          ASSERT_TRUE(want.ok()) << where;
          ASSERT_TRUE(e.phases[i].max_context.has_value()) << where;
          EXPECT_EQ(*e.phases[i].max_context, *want) << where;
          ++compared;
          if (*want > 1 && *want < g.max_position_embeddings) ++inside;
        }
      }
    }
  }
  EXPECT_EQ(compared + refused * 9, std::size(cases) * 5 * 3 * 3);
  EXPECT_LE(refused, 2u);
  // Many answers lie strictly inside the range (a search that ran), not at its ends.
  EXPECT_GT(inside, compared / 3);
}

// With max_position_embeddings cut to 4,096 every context can be priced: the plan's answer is
// the longest fitting context wherever the bytes are monotone over the range, and otherwise
// still fits with one more token not fitting (the documented guarantee).
TEST(PlanSearch, MatchesBruteForceOnAShortRange) {
  constexpr uint64_t kRange = 4096;
  size_t exact = 0, checked = 0;
  for (const char* model : {"deepseek-v4-flash", "deepseek-v3.2", "llama-3.1-8b"}) {
    Geometry g = Preset(model);
    g.max_position_embeddings = kRange;
    const WeightShapes shapes = PresetShapes(model);
    Result<Plan> base = ComputePlan(g, shapes, H200x8(1024));
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    const uint64_t budget = base->kv_budget_bytes;
    for (Engine engine : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
      PlanOptions o = H200x8(1024);
      o.engines = {engine};
      // Every context's bytes, by brute force (contexts 1..kRange; index 0 unused).
      LedgerSweep sweep(g, LedgerOptionsOf(o, engine));
      std::vector<PhaseTotals> bytes(kRange + 1);
      for (uint64_t c = 1; c <= kRange; ++c) {
        Result<PhaseTotals> b = sweep.PhasesAt(c);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        bytes[c] = *b;
      }
      for (size_t i = 0; i < 3; ++i) {
        bool monotone = true;
        for (uint64_t c = 2; c <= kRange; ++c) monotone = monotone && bytes[c][i] >= bytes[c - 1][i];
        // Concurrencies that put the limit at several places in the range, on a boundary and
        // between.
        for (uint64_t target : {uint64_t{1}, uint64_t{63}, uint64_t{700}, uint64_t{2049}, uint64_t{4000}}) {
          const uint64_t n = std::max<uint64_t>(1, budget / bytes[target][i]);
          o.concurrency = n;
          Result<Plan> p = ComputePlan(g, shapes, o);
          ASSERT_TRUE(p.ok()) << p.status().ToString();
          const uint64_t got = *p->engines[0].phases[i].max_context;
          const uint64_t limit = budget / n;
          uint64_t longest = 0;
          for (uint64_t c = 1; c <= kRange; ++c) {
            if (bytes[c][i] <= limit) longest = c;
          }
          const std::string where = std::string(model) + "/" + std::string(EngineName(engine)) + " phase " +
                                    std::to_string(i) + " target " + std::to_string(target);
          ++checked;
          EXPECT_LE(bytes[got][i], limit) << where;
          if (got < kRange) {
            EXPECT_GT(bytes[got + 1][i], limit) << where;
          }
          if (monotone) {
            EXPECT_GE(got, target) << where;  // n x bytes(target) fits
            EXPECT_EQ(got, longest) << where;
            ++exact;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3u * 3 * 3 * 5);
  EXPECT_GT(exact, checked / 2);  // most engines' bytes are monotone in the context
}

}  // namespace
}  // namespace tessera
