#include "tessera/reconcile.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

TEST(Reconcile, ExactMatchHasNothingToExplain) {
  Geometry g = Preset("deepseek-v3");
  Ledger l = MustLedger(g, Context(100));
  Reconciliation r = *Reconcile(g, l, l.committed_bytes, false);
  EXPECT_EQ(r.difference_bytes, 0);
  EXPECT_TRUE(r.attributed.empty());
  EXPECT_EQ(r.unexplained_bytes, 0);
}

TEST(Reconcile, EngineWithoutHostMetadata) {
  // An engine's device allocation lacks Tessera's host block metadata.
  Geometry g = Preset("deepseek-v3");
  Ledger l = MustLedger(g, Context(100));
  Reconciliation r = *Reconcile(g, l, l.committed_bytes - l.TermBytes(LedgerTerm::kBlockMetadata), false);
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "-block_metadata");
  EXPECT_EQ(r.unexplained_bytes, 0);
}

TEST(Reconcile, EngineHoldingTheMtpLayer) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(4096, "", Engine::kVllm);
  Ledger l = MustLedger(g, o);
  o.include_mtp = true;
  Ledger with = MustLedger(g, o);
  Reconciliation r = *Reconcile(g, l, with.committed_bytes, false);
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "+mtp_layers");
  EXPECT_EQ(r.attributed[0].bytes, static_cast<int64_t>(with.committed_bytes - l.committed_bytes));
  EXPECT_EQ(r.unexplained_bytes, 0);
}

TEST(Reconcile, TwoTermsTogether) {
  Geometry g = Preset("deepseek-v3");
  Ledger l = MustLedger(g, Context(100));
  uint64_t observed =
      l.committed_bytes - l.TermBytes(LedgerTerm::kBlockMetadata) - l.TermBytes(LedgerTerm::kPageRounding);
  Reconciliation r = *Reconcile(g, l, observed, false);
  EXPECT_EQ(r.attributed.size(), 2u);
  EXPECT_EQ(r.unexplained_bytes, 0);
}

TEST(Reconcile, ResidueIsUnexplained) {
  Geometry g = Preset("deepseek-v3");
  Ledger l = MustLedger(g, Context(131072, "", Engine::kVllm));
  Reconciliation r = *Reconcile(g, l, l.committed_bytes + 12345, false);
  EXPECT_EQ(r.difference_bytes, 12345);
  EXPECT_EQ(r.unexplained_bytes, 12345);
}

TEST(Reconcile, AllRanksScope) {
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(4096, "", Engine::kVllm);
  o.tp = 4;
  Ledger l = MustLedger(g, o);
  Reconciliation all = *Reconcile(g, l, l.committed_bytes_all_ranks, true);
  EXPECT_EQ(all.unexplained_bytes, 0);
  EXPECT_TRUE(all.attributed.empty());
  // Comparing one rank's prediction with a sum over ranks: the other ranks explain it.
  Reconciliation rank = *Reconcile(g, l, l.committed_bytes_all_ranks, false);
  ASSERT_EQ(rank.attributed.size(), 1u);
  EXPECT_EQ(rank.attributed[0].term, "+other_ranks");
}

TEST(Reconcile, TraceFileIsSummed) {
  testing::TempDir dir;
  std::string p = dir.Write("trace.txt", "# kv cache tensors\n1000 layer0\n2000 layer1\n\n  500\n");
  EXPECT_EQ(*ReadAllocationTrace(p), 3500u);
  std::string bad = dir.Write("bad.txt", "1000\nlots of bytes\n");
  Result<uint64_t> r = ReadAllocationTrace(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "trace");
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos);
  EXPECT_EQ(ReadAllocationTrace(dir.path() + "/missing").status().code(), StatusCode::kIoError);
}

// The number ended at a comma: "7,027,200 kv" summed as 7, and "1,2" as 1. Grouped digits are
// read whole; anything else is refused with the line.
TEST(Reconcile, TraceNumbersAreReadWholeOrRefused) {
  testing::TempDir dir;
  std::string grouped = dir.Write("grouped.txt", "7,027,200 kv\n1_000\n");
  EXPECT_EQ(*ReadAllocationTrace(grouped), 7028200u);
  for (const char* line : {"1,2 kv\n", "12,34\n", "+5\n", "0x10\n", "1e3\n"}) {
    std::string bad = dir.Write("bad.txt", line);
    Result<uint64_t> r = ReadAllocationTrace(bad);
    ASSERT_FALSE(r.ok()) << line << " read as " << r.value();
    EXPECT_EQ(r.status().field(), "trace");
    EXPECT_NE(r.status().message().find("line 1"), std::string::npos);
  }
}

// A trace is a regular file of bounded size: a FIFO blocked forever, /dev/zero never ended.
TEST(Reconcile, TraceMustBeARegularFile) {
  for (const char* path : {"/dev/zero", "/dev/null", "/"}) {
    Result<uint64_t> r = ReadAllocationTrace(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().field(), "trace") << path;
  }
}

}  // namespace
}  // namespace tessera
