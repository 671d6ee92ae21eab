#include "tessera/fraction.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Fraction, ReducesOnConstruction) {
  Fraction hca(576, 128);
  EXPECT_EQ(hca.num(), 9u);
  EXPECT_EQ(hca.den(), 2u);
  EXPECT_EQ(hca.ToString(), "9/2");
  EXPECT_EQ(hca.ToExactAndDecimal(), "9/2 (4.5)");
}

TEST(Fraction, RealRecordHca) {
  Fraction f(584, 128);
  EXPECT_EQ(f.ToString(), "73/16");
  EXPECT_EQ(f.ToDecimal(), "4.5625");
}

TEST(Fraction, IntegersPrintBare) {
  EXPECT_EQ(Fraction(640, 4).ToExactAndDecimal(), "160");
  EXPECT_TRUE(Fraction(640, 4).is_integer());
  EXPECT_EQ(Fraction(0, 7).ToString(), "0");
}

TEST(Fraction, NonTerminatingDecimalIsMarked) {
  Fraction r(65536, 1152);
  EXPECT_EQ(r.ToString(), "512/9");
  EXPECT_EQ(r.ToDecimal(4), "~56.888889");
}

TEST(Fraction, AddAndMultiplyExactly) {
  Fraction csa = Fraction(576, 4) + Fraction(64, 4);
  EXPECT_EQ(csa, Fraction::Integer(160));
  EXPECT_EQ(Fraction(9, 2) * Fraction(128, 1), Fraction::Integer(576));
  EXPECT_EQ(Fraction(1, 3) + Fraction(1, 6), Fraction(1, 2));
}

TEST(Fraction, OverflowIsReported) {
  Fraction big(UINT64_MAX, 1);
  Fraction sum = big + big;
  EXPECT_FALSE(sum.ok());
  EXPECT_EQ(sum.ToString(), "overflow");
}

// A denominator above 2^60 (a ratio of two byte counts from a hostile config): ten times the
// remainder needs more than 64 bits. Wrapped, 2^62 / (2^63 + 1) printed as "0.00".
TEST(Fraction, DecimalDigitsOfAHugeDenominator) {
  Fraction almost_half(uint64_t{1} << 62, (uint64_t{1} << 63) + 1);
  EXPECT_EQ(almost_half.ToDecimal(12), "~0.500000");
  EXPECT_EQ(Fraction(uint64_t{3} << 62, uint64_t{1} << 63).ToDecimal(4), "1.5");
  EXPECT_EQ(Fraction(UINT64_MAX - 1, UINT64_MAX).ToDecimal(4), "~1.000000");
}

}  // namespace
}  // namespace tessera
