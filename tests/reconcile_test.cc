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

uint64_t CommittedWith(const std::string& model, LedgerOptions o) {
  return MustLedger(Preset(model), o).committed_bytes;
}

Reconciliation Explain(const std::string& model, const LedgerOptions& o, uint64_t observed, bool all_ranks = false) {
  Geometry g = Preset(model);
  Result<Reconciliation> r = Reconcile(g, MustLedger(g, o), observed, all_ranks);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Reconciliation{};
}

// The ledger guide's failure probes are named terms with their sizes, not "unexplained".
TEST(ReconcileProbes, ExpandedKvTensorCachedInsteadOfTheLatent) {
  LedgerOptions o = Context(8192, "mla-bf16", Engine::kVllm);
  LedgerOptions expanded = o;
  expanded.kv_format = "expanded-bf16";
  Reconciliation r = Explain("deepseek-v3", o, CommittedWith("deepseek-v3", expanded));
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "+expanded_kv");
  // 61 layers x 129 blocks x 64 tokens x (128 heads x (192 + 128) x 2 B - 1,152 B).
  EXPECT_EQ(r.attributed[0].bytes, 61LL * 129 * 64 * (128 * 320 * 2 - 1152));
  EXPECT_EQ(r.unexplained_bytes, 0);
}

TEST(ReconcileProbes, MissingQuantizationScales) {
  // V3.2 fp8_ds_mla under vLLM at 8,192 tokens holds 129 blocks of 64 entries in 61 layers; each
  // entry's scales: 4 fp32 in the 656-B latent record, 1 fp32 in the 132-B indexer key.
  LedgerOptions o = Context(8192, "fp8_ds_mla", Engine::kVllm);
  const uint64_t scales = 61ULL * 129 * 64 * (16 + 4);
  Reconciliation r = Explain("deepseek-v3.2", o, CommittedWith("deepseek-v3.2", o) - scales);
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "-quantization_scales");
  EXPECT_EQ(r.attributed[0].bytes, -static_cast<int64_t>(scales));
  EXPECT_EQ(r.unexplained_bytes, 0);
  // A record with no scales offers no such term.
  Reconciliation bf16 = Explain("deepseek-v3", Context(8192, "mla-bf16", Engine::kVllm), 1);
  for (const Attribution& a : bf16.attributed) EXPECT_NE(a.term, "-quantization_scales");
}

TEST(ReconcileProbes, TensorParallelMismatch) {
  // GQA heads shard: an engine at tp 4 holds half of what tp 2 predicts per rank.
  LedgerOptions o = Context(8192, "", Engine::kVllm);
  o.tp = 2;
  LedgerOptions four = o;
  four.tp = 4;
  Reconciliation r = Explain("llama-3.1-8b", o, CommittedWith("llama-3.1-8b", four));
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "-tp_mismatch(tp=4)");
  EXPECT_EQ(r.unexplained_bytes, 0);
  // The MLA latent is replicated: per rank the same at every tp, so only the sum over ranks tells.
  LedgerOptions v3 = Context(8192, "", Engine::kVllm);
  v3.tp = 8;
  LedgerOptions v3_at_4 = v3;
  v3_at_4.tp = 4;
  Reconciliation all =
      Explain("deepseek-v3", v3, MustLedger(Preset("deepseek-v3"), v3_at_4).committed_bytes_all_ranks, true);
  ASSERT_EQ(all.attributed.size(), 1u);
  EXPECT_EQ(all.attributed[0].term, "-tp_mismatch(tp=4)");
  EXPECT_EQ(all.unexplained_bytes, 0);
}

TEST(ReconcileProbes, GenericKernelFallback) {
  // vLLM without FlashMLA falls back to Triton MLA's 16-token blocks: 513 blocks of 16 tokens for
  // 8,193 slots instead of 129 of 64.
  LedgerOptions o = Context(8192, "mla-bf16", Engine::kVllm);
  Reconciliation r = Explain("deepseek-v3", o, 61ULL * 513 * 16 * 1152);
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "-generic_kernel_fallback");
  EXPECT_EQ(r.attributed[0].bytes, -61LL * (129 * 64 - 513 * 16) * 1152);
  EXPECT_EQ(r.unexplained_bytes, 0);
}

// A trace's labels name the terms: a labelled term is attributed even where another would fit.
TEST(ReconcileProbes, TraceLabelsForceTheirTerms) {
  testing::TempDir dir;
  Geometry g = Preset("deepseek-v3");
  LedgerOptions o = Context(8192, "mla-bf16", Engine::kVllm);
  Ledger l = MustLedger(g, o);
  LedgerOptions mtp = o;
  mtp.include_mtp = true;
  const uint64_t extra = MustLedger(g, mtp).committed_bytes - l.committed_bytes;
  std::string path =
      dir.Write("trace.txt", std::to_string(l.committed_bytes) + " kv cache\n" + std::to_string(extra / 2) +
                                 " mtp_layers\n" + std::to_string(extra - extra / 2) + "  mtp_layers \n");
  AllocationTrace t = *ReadLabelledAllocationTrace(path);
  EXPECT_EQ(t.total, l.committed_bytes + extra);
  ASSERT_EQ(t.labels.size(), 2u);
  EXPECT_EQ(t.labels[0].label, "kv cache");
  EXPECT_EQ(t.labels[1].label, "mtp_layers");
  EXPECT_EQ(t.labels[1].bytes, extra);
  Reconciliation r = *Reconcile(g, l, t.total, false, t.labels);
  ASSERT_EQ(r.attributed.size(), 1u);
  EXPECT_EQ(r.attributed[0].term, "+mtp_layers");
  EXPECT_EQ(r.attributed[0].trace_bytes, extra);
  // Labelled expanded_kv where the bytes say MTP: attributed anyway, the rest unexplained.
  Reconciliation forced = *Reconcile(g, l, t.total, false, {{"expanded_kv", 1}});
  bool expanded = false;
  for (const Attribution& a : forced.attributed) {
    if (a.term == "+expanded_kv") expanded = a.trace_bytes == 1u;
  }
  EXPECT_TRUE(expanded);
  EXPECT_NE(forced.unexplained_bytes, 0);
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

// Issue 27 (low): a trace line with terminal escapes is quoted in the error with every control
// byte shown as '?': the error line carries no ESC from the file.
TEST(Reconcile, TraceErrorsNeverEchoControlBytes) {
  testing::TempDir dir;
  std::string bad = dir.Write("esc.txt", "\x1b]0;owned\x07\x1b[2J12 kv\x7f\n");
  Result<uint64_t> r = ReadAllocationTrace(bad);
  ASSERT_FALSE(r.ok());
  const std::string line = r.status().ToString();
  for (char ch : line) EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) << line;
  EXPECT_NE(line.find("?]0;owned??[2J12 kv?"), std::string::npos) << line;
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
