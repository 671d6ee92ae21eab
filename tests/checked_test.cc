#include "tessera/checked.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Checked, ExactWithinRange) {
  Checked v = Checked(1152) * 61 * 131072;
  EXPECT_FALSE(v.overflowed());
  EXPECT_EQ(v.value(), 9210691584ULL);
}

TEST(Checked, MultiplicationOverflowIsSticky) {
  Checked v = Checked(1ULL << 40) * (1ULL << 30);
  EXPECT_TRUE(v.overflowed());
  Checked w = v + 1;
  EXPECT_TRUE(w.overflowed());
  EXPECT_TRUE((w * 0).overflowed());  // zero does not launder an earlier overflow
}

TEST(Checked, AdditionOverflow) {
  EXPECT_TRUE((Checked(UINT64_MAX) + 1).overflowed());
  EXPECT_FALSE((Checked(UINT64_MAX - 1) + 1).overflowed());
}

TEST(Checked, SubtractionBelowZeroIsOverflow) {
  EXPECT_TRUE((Checked(1) - 2).overflowed());
  EXPECT_EQ((Checked(5) - 2).value(), 3u);
}

TEST(Checked, CeilDivAndRoundUp) {
  EXPECT_EQ(CeilDiv(0, 64), 0u);
  EXPECT_EQ(CeilDiv(1, 64), 1u);
  EXPECT_EQ(CeilDiv(64, 64), 1u);
  EXPECT_EQ(CeilDiv(65, 64), 2u);
  EXPECT_EQ(RoundUp(37376, 576).value(), 37440u);
  EXPECT_EQ(RoundUp(1168, 576).value(), 1728u);
  EXPECT_TRUE(RoundUp(UINT64_MAX, 576).overflowed());
}

TEST(Checked, GcdLcm) {
  EXPECT_EQ(Gcd(576, 128), 64u);
  EXPECT_EQ(Lcm(4, 128).value(), 128u);
  EXPECT_EQ(Lcm(128, 256).value(), 256u);
  EXPECT_TRUE(Lcm(UINT64_MAX, UINT64_MAX - 1).overflowed());
}

}  // namespace
}  // namespace tessera
