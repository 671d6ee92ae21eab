#include "tessera/units.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Units, TokenCountsAsModelCardsWriteThem) {
  EXPECT_EQ(*ParseTokenCount("8192", "context"), 8192u);
  EXPECT_EQ(*ParseTokenCount("8k", "context"), 8192u);
  EXPECT_EQ(*ParseTokenCount("128k", "context"), 131072u);
  EXPECT_EQ(*ParseTokenCount("128K", "context"), 131072u);
  EXPECT_EQ(*ParseTokenCount("1m", "context"), 1048576u);
  EXPECT_EQ(*ParseTokenCount("1M", "context"), 1048576u);
}

TEST(Units, BadTokenCountsNameTheField) {
  for (const char* bad : {"", "abc", "-5", "12x", "k", "1.5k"}) {
    Result<uint64_t> r = ParseTokenCount(bad, "context");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().field(), "context") << bad;
  }
  Result<uint64_t> huge = ParseTokenCount("99999999999999999999", "context");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(huge.status().field(), "context");
  Result<uint64_t> huge_m = ParseTokenCount("99999999999999m", "context");
  ASSERT_FALSE(huge_m.ok());
  EXPECT_EQ(huge_m.status().code(), StatusCode::kOutOfRange);
}

TEST(Units, ParseUnsigned) {
  EXPECT_EQ(*ParseUnsigned("65536", "batch"), 65536u);
  EXPECT_EQ(*ParseUnsigned("9_210_691_584", "observed"), 9210691584u);
  EXPECT_FALSE(ParseUnsigned("-1", "batch").ok());
  EXPECT_EQ(ParseUnsigned("-1", "batch").status().field(), "batch");
  EXPECT_FALSE(ParseUnsigned("18446744073709551616", "batch").ok());
  EXPECT_EQ(*ParseUnsigned("18446744073709551615", "batch"), UINT64_MAX);
  EXPECT_EQ(*ParseUnsigned("9,210,691,584", "observed"), 9210691584u);
  EXPECT_EQ(*ParseUnsigned("999,999", "observed"), 999999u);
  EXPECT_EQ(*ParseUnsigned("007", "batch"), 7u);
}

// Anything but plain digits (or digits grouped in threes) is refused, naming the field: a
// separator dropped or a prefix skipped would read another number than the one written.
TEST(Units, OnlyDigitsOrThousandsGroupsParse) {
  for (const char* bad : {"1,2", "12,34", "1,2345", ",123", "123,", "1,,234", "1,234_567", "1_2", "1234,567", "+3",
                          " 4", "4 ", "0x10", "1e3", "1.0", "\t5", "5\n", "\xef\xbc\x95"}) {
    Result<uint64_t> r = ParseUnsigned(bad, "observed");
    ASSERT_FALSE(r.ok()) << bad << " parsed as " << r.value();
    EXPECT_EQ(r.status().field(), "observed") << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(ParseTokenCount(bad, "context").ok()) << bad;
    EXPECT_FALSE(ParseByteSize(bad, "host-tier-bytes").ok()) << bad;
  }
  for (const char* bad : {"1,2k", "+8k", " 1m", "0x10k", "1e3k"}) {
    Result<uint64_t> r = ParseTokenCount(bad, "context");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().field(), "context") << bad;
  }
  Result<uint64_t> over = ParseUnsigned("18,446,744,073,709,551,616", "observed");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(over.status().field(), "observed");
}

TEST(Units, BinaryAndDecimalAreBothLabeled) {
  // 488 GiB exactly: the seed printed this as "488.0 GB".
  std::string s = FormatBytes(523986010112ULL);
  EXPECT_NE(s.find("523,986,010,112 B"), std::string::npos) << s;
  EXPECT_NE(s.find("488 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("GB"), std::string::npos) << s;
  EXPECT_EQ(FormatBinary(9210691584ULL), "8.578125 GiB");
  EXPECT_EQ(FormatBinary(5244977152ULL), "4.884765625 GiB");
  EXPECT_EQ(FormatDecimal(2000000000ULL), "2 GB");
  EXPECT_EQ(FormatBytes(576), "576 B");
}

TEST(Units, Thousands) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1000), "1,000");
  EXPECT_EQ(WithThousands(1482048), "1,482,048");
}

}  // namespace

TEST(ParseByteSize, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteSize("4096", "x"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB", "x"), 64ULL << 20);
  EXPECT_EQ(*ParseByteSize("2GB", "x"), 2000000000ULL);
  EXPECT_EQ(*ParseByteSize("3KiB", "x"), 3072u);
  EXPECT_EQ(*ParseByteSize("7B", "x"), 7u);
  Result<uint64_t> bad = ParseByteSize("1.5GiB", "host-tier-bytes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "host-tier-bytes");
  EXPECT_FALSE(ParseByteSize("MiB", "x").ok());
  EXPECT_FALSE(ParseByteSize("", "x").ok());
  EXPECT_FALSE(ParseByteSize("99999999999TiB", "x").ok());  // overflows 64 bits
}

}  // namespace tessera
