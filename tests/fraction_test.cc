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

}  // namespace
}  // namespace tessera
