// The ledger's JSON writer (include/tessera/ledger_json.h): exact figures, totals that are the
// ledger's own, each cache line's storage, the reconciliation only when given, and text that
// never throws on bytes that are not UTF-8.
#include "tessera/ledger_json.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;
using testing::Context;
using testing::MustLedger;
using testing::Preset;
using testing::SeedFixture;

TEST(ExactJson, IntegersAreNumbersAndFractionsCarryTheirDecimal) {
  EXPECT_EQ(ExactJson(Fraction(18, 2)), ordered_json(9));
  const ordered_json half = ExactJson(Fraction(9, 2));
  ASSERT_TRUE(half.is_object());
  EXPECT_EQ(half.at("fraction"), "9/2");
  EXPECT_EQ(half.at("decimal"), "4.5");
  const ordered_json third = ExactJson(Fraction(1, 3));
  EXPECT_EQ(third.at("fraction"), "1/3");
  EXPECT_EQ(third.at("decimal"), "~0.333333");  // no exact expansion in 12 places: rounded to 6, marked
  EXPECT_EQ(ExactJson(Fraction(1, 1024)).at("decimal"), "0.0009765625");  // exact: 10 places
}

TEST(LedgerToJson, TotalsAreTheLedgersOwnExactIntegers) {
  const Ledger l = MustLedger(SeedFixture(), Context(4));
  const ordered_json j = LedgerToJson(l, nullptr);
  EXPECT_EQ(j.at("requested_bytes").get<uint64_t>(), l.requested_bytes);
  EXPECT_EQ(j.at("requested_bytes").get<uint64_t>(), 9216u);
  EXPECT_EQ(j.at("committed_bytes").get<uint64_t>(), l.committed_bytes);
  EXPECT_EQ(j.at("committed_bytes_all_ranks").get<uint64_t>(), l.committed_bytes_all_ranks);
  EXPECT_EQ(j.at("read_bytes_per_token").get<uint64_t>(), l.read_bytes_per_token);
  EXPECT_EQ(j.at("mha_equivalent_bytes").get<uint64_t>(), 32768u);
  EXPECT_EQ(j.at("mha_ratio"), ExactJson(l.mha_ratio));
  EXPECT_EQ(j.at("inputs").at("context_tokens").get<uint64_t>(), 4u);
  EXPECT_FALSE(j.contains("reconciliation"));
  ASSERT_EQ(j.at("caches").size(), l.lines.size());
  // The committed terms add up to the committed total.
  uint64_t terms = 0;
  for (const ordered_json& t : j.at("committed_terms")) terms += t.at("bytes").get<uint64_t>();
  EXPECT_EQ(terms, l.committed_bytes);
}

TEST(LedgerToJson, PagedLinesCarryTheirPageAndArenaLinesTheirSlots) {
  const Ledger l = MustLedger(Preset("deepseek-v4-flash"), Context(65536));
  const ordered_json j = LedgerToJson(l, nullptr);
  ASSERT_EQ(j.at("caches").size(), l.lines.size());
  bool saw_pages = false, saw_arena = false;
  for (size_t i = 0; i < l.lines.size(); ++i) {
    const CacheLine& c = l.lines[i];
    const ordered_json& cj = j.at("caches")[i];
    EXPECT_EQ(cj.at("cache"), c.name);
    EXPECT_EQ(cj.at("requested_bytes").get<uint64_t>(), c.requested_bytes);
    if (c.in_pages) {
      saw_pages = true;
      EXPECT_EQ(cj.at("storage"), "pages");
      EXPECT_EQ(cj.at("page_bytes").get<uint64_t>(), c.page.page_bytes);
      EXPECT_EQ(cj.at("block_tokens").get<uint64_t>(), c.page.block_tokens);
    } else {
      saw_arena = true;
      EXPECT_EQ(cj.at("storage"), "per-request arena");
      EXPECT_FALSE(cj.contains("page_bytes"));
    }
    if (c.grows) {
      EXPECT_EQ(cj.at("bytes_per_token_per_layer"), ExactJson(c.bytes_per_token_per_layer));
      EXPECT_FALSE(cj.contains("slots"));
    } else {
      EXPECT_EQ(cj.at("slots").get<uint64_t>(), c.slots);
      EXPECT_TRUE(cj.at("per_request_constant").get<bool>());
    }
  }
  EXPECT_TRUE(saw_pages);
  EXPECT_TRUE(saw_arena);  // the window ring and compressor state do not page
}

TEST(LedgerToJson, TheReconciliationIsWrittenWhenGiven) {
  const Ledger l = MustLedger(SeedFixture(), Context(4));
  Reconciliation rec;
  rec.scope = "per rank";
  rec.predicted_bytes = 100;
  rec.observed_bytes = 90;
  rec.difference_bytes = -10;
  rec.attributed.push_back({"-block_metadata", -8, std::nullopt});
  rec.unexplained_bytes = -2;
  const ordered_json r = LedgerToJson(l, &rec).at("reconciliation");
  EXPECT_EQ(r.at("scope"), "per rank");
  EXPECT_EQ(r.at("difference_bytes").get<int64_t>(), -10);
  ASSERT_EQ(r.at("attributed").size(), 1u);
  EXPECT_EQ(r.at("attributed")[0].at("term"), "-block_metadata");
  EXPECT_EQ(r.at("attributed")[0].at("bytes").get<int64_t>(), -8);
  EXPECT_FALSE(r.at("attributed")[0].contains("trace_bytes"));
  EXPECT_EQ(r.at("unexplained_bytes").get<int64_t>(), -2);
}

TEST(DumpJson, BytesThatAreNotUtf8AreReplacedNotThrown) {
  ordered_json j;
  j["config"] = std::string("/models/\xff\xfe/config.json");
  std::string text;
  ASSERT_NO_THROW(text = DumpJson(j, -1));
  EXPECT_EQ(text, "{\"config\":\"/models/\xEF\xBF\xBD\xEF\xBF\xBD/config.json\"}");
  // LedgerJsonText is the same text and a newline, and parses back to the document.
  const Ledger l = MustLedger(SeedFixture(), Context(4));
  const std::string ledger_text = LedgerJsonText(l);
  ASSERT_FALSE(ledger_text.empty());
  EXPECT_EQ(ledger_text.back(), '\n');
  EXPECT_EQ(ordered_json::parse(ledger_text), LedgerToJson(l, nullptr));
}

}  // namespace
}  // namespace tessera
