// LedgerSweep: one planned engine profile priced at many contexts gives, at every context, the
// ledger ComputeLedger computes from scratch — figures and errors alike, whatever contexts came
// before (the sweep reuses one ledger between calls).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/ledger.h"
#include "tessera_tools/render.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Preset;

struct Variant {
  const char* name;
  void (*apply)(LedgerOptions&);
};

const Variant kVariants[] = {
    {"default", [](LedgerOptions&) {}},
    {"spec2+mtp",
     [](LedgerOptions& o) {
       o.spec_tokens = 2;
       o.include_mtp = true;
     }},
    {"tp8", [](LedgerOptions& o) { o.tp = 8; }},
    {"tp8-dcp2",
     [](LedgerOptions& o) {  // vLLM refuses dcp on DeepSeek-V4: the error path
       o.tp = 8;
       o.dcp = 2;
     }},
    {"batch3-chunk2048",
     [](LedgerOptions& o) {
       o.batch = 3;
       o.prefill_chunk_tokens = 2048;
     }},
    {"snapshot", [](LedgerOptions& o) { o.swa_strategy = SwaStrategy::kSnapshot; }},
    {"retain-spec1",
     [](LedgerOptions& o) {
       o.swa_strategy = SwaStrategy::kRetain;
       o.spec_tokens = 1;
     }},
    {"block128", [](LedgerOptions& o) { o.block_tokens = 128; }},
};

// Out of order, so that a figure left from an earlier (larger or smaller) context shows; block
// and window boundaries, max_position_embeddings and one past it (vLLM's max_model_len), 1M, and
// the contexts ComputeLedger refuses or cannot price.
std::vector<uint64_t> Contexts(const Geometry& g) {
  return {131072,
          1,
          64,
          63,
          65,
          1048576,
          2,
          127,
          128,
          129,
          255,
          256,
          257,
          8193,
          8192,
          4103,
          1000003,
          g.max_position_embeddings,
          g.max_position_embeddings + 1,
          3145728,
          0,
          (uint64_t{1} << 62) + 1,
          uint64_t{1} << 62,
          300};
}

// Every figure that depends on the context; with `json`, the whole rendered ledger too.
void ExpectSameLedger(const Ledger& a, const Ledger& b, bool json, const std::string& where) {
  if (json) {
    EXPECT_EQ(RenderLedger(a, OutputFormat::kJson), RenderLedger(b, OutputFormat::kJson)) << where;
  }
  EXPECT_EQ(a.options.context_tokens, b.options.context_tokens) << where;
  EXPECT_EQ(a.tokens_per_rank, b.tokens_per_rank) << where;
  EXPECT_EQ(a.committed_bytes, b.committed_bytes) << where;
  EXPECT_EQ(a.committed_bytes_all_ranks, b.committed_bytes_all_ranks) << where;
  EXPECT_EQ(a.reserved_at_admission_bytes, b.reserved_at_admission_bytes) << where;
  EXPECT_EQ(a.requested_bytes, b.requested_bytes) << where;
  EXPECT_EQ(a.read_bytes_per_token_all_ranks, b.read_bytes_per_token_all_ranks) << where;
  EXPECT_EQ(a.mha_equivalent_bytes, b.mha_equivalent_bytes) << where;
  EXPECT_EQ(a.mha_ratio, b.mha_ratio) << where;
  EXPECT_EQ(a.cached_boundaries, b.cached_boundaries) << where;
  EXPECT_EQ(a.block_id_bytes, b.block_id_bytes) << where;
  EXPECT_EQ(a.notes, b.notes) << where;
  ASSERT_EQ(a.phases.size(), b.phases.size()) << where;
  for (size_t i = 0; i < a.phases.size(); ++i) EXPECT_EQ(a.phases[i].bytes, b.phases[i].bytes) << where;
  ASSERT_EQ(a.terms.size(), b.terms.size()) << where;
  for (size_t i = 0; i < a.terms.size(); ++i) {
    EXPECT_EQ(a.terms[i].term, b.terms[i].term) << where;
    EXPECT_EQ(a.terms[i].bytes, b.terms[i].bytes) << where;
  }
  ASSERT_EQ(a.lines.size(), b.lines.size()) << where;
  for (size_t i = 0; i < a.lines.size(); ++i) {
    const CacheLine& x = a.lines[i];
    const CacheLine& y = b.lines[i];
    EXPECT_EQ(x.committed_bytes, y.committed_bytes) << where << " " << x.name;
    EXPECT_EQ(x.requested_bytes, y.requested_bytes) << where << " " << x.name;
    EXPECT_EQ(x.read_bytes_per_token, y.read_bytes_per_token) << where << " " << x.name;
    EXPECT_EQ(x.shape, y.shape) << where << " " << x.name;
    ASSERT_EQ(x.terms.size(), y.terms.size()) << where << " " << x.name;
    for (size_t t = 0; t < x.terms.size(); ++t) EXPECT_EQ(x.terms[t].bytes, y.terms[t].bytes) << where;
  }
}

TEST(LedgerSweep, EqualsAFreshLedgerAtEveryContext) {
  size_t priced = 0, refused = 0;
  for (const char* model :
       {"deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro", "llama-3.1-8b", "deepseek-v2-lite"}) {
    const Geometry g = Preset(model);
    for (Engine engine : {Engine::kTessera, Engine::kVllm, Engine::kSglang}) {
      for (const Variant& v : kVariants) {
        LedgerOptions o;
        o.engine = engine;
        v.apply(o);
        LedgerSweep sweep(g, o);
        for (uint64_t c : Contexts(g)) {
          const std::string where =
              std::string(model) + "/" + std::string(EngineName(engine)) + "/" + v.name + " @" + std::to_string(c);
          LedgerOptions fresh = o;
          fresh.context_tokens = c;
          Result<Ledger> want = ComputeLedger(g, fresh);
          Result<Ledger> got = sweep.LedgerAt(c);
          Result<PhaseTotals> phases = sweep.PhasesAt(c);
          ASSERT_EQ(got.ok(), want.ok()) << where << ": " << (want.ok() ? got : want).status().ToString();
          ASSERT_EQ(phases.ok(), want.ok()) << where;
          if (!want.ok()) {
            ++refused;
            EXPECT_EQ(got.status().code(), want.status().code()) << where;
            EXPECT_EQ(got.status().ToString(), want.status().ToString()) << where;
            EXPECT_EQ(phases.status().ToString(), want.status().ToString()) << where;
            continue;
          }
          ++priced;
          // The rendering (slow in sanitizer builds) for the first variant of each engine.
          ExpectSameLedger(*got, *want, &v == &kVariants[0], where);
          ASSERT_EQ(want->phases.size(), 3u);
          for (const PhaseBytes& p : want->phases) {
            EXPECT_EQ((*phases)[static_cast<size_t>(p.phase)], p.bytes) << where << " " << LedgerPhaseName(p.phase);
          }
          if (sweep.kv_format() != want->kv_format) ADD_FAILURE() << where << ": kv_format";
        }
      }
    }
  }
  // Both paths were taken, many times.
  EXPECT_GT(priced, 1500u);
  EXPECT_GT(refused, 300u);
}

// An option refused before any context is priced is returned by every call, as ComputeLedger
// returns it; a context refused (0) is named even then, as ComputeLedger checks it first.
TEST(LedgerSweep, RefusedOptionsAreEveryCallsError) {
  const Geometry g = Preset("deepseek-v3");
  LedgerOptions o;
  o.kv_format = "no-such-format";
  LedgerSweep sweep(g, o);
  EXPECT_TRUE(sweep.kv_format().empty());
  for (uint64_t c : {uint64_t{1}, uint64_t{4096}, uint64_t{0}}) {
    LedgerOptions fresh = o;
    fresh.context_tokens = c;
    Result<Ledger> want = ComputeLedger(g, fresh);
    ASSERT_FALSE(want.ok());
    Result<PhaseTotals> got = sweep.PhasesAt(c);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().ToString(), want.status().ToString());
  }
  EXPECT_EQ(sweep.PhasesAt(0).status().ToString().rfind("context", 0), 0u);
}

// A sweep moved from keeps working under its new owner (its state is held by pointer: the
// profile's references stay valid).
TEST(LedgerSweep, MovedSweepPricesTheSame) {
  const Geometry g = Preset("deepseek-v4-flash");
  LedgerOptions o;
  o.engine = Engine::kVllm;
  LedgerSweep a(g, o);
  Result<PhaseTotals> before = a.PhasesAt(70000);
  ASSERT_TRUE(before.ok());
  LedgerSweep b = std::move(a);
  Result<PhaseTotals> after = b.PhasesAt(70000);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*before, *after);
  o.context_tokens = 70000;
  EXPECT_EQ((*after)[2], testing::MustLedger(g, o).committed_bytes);
}

}  // namespace
}  // namespace tessera
