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
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
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
