#include "tessera/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tessera {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

// ---------------------------------------------------------------------------------------------
// Independent references, written from the OCP definitions and not from the codec's code.

// OFP8 E4M3: sign · 2^(e-7) · (1 + m/8) for e >= 1, sign · 2^-6 · m/8 for e = 0, NaN at S.1111.111.
double E4M3Formula(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s != 0 ? -magnitude : magnitude;
}

// MX E2M1: sign · 2^(e-1) · (1 + m/2) for e >= 1, sign · m/2 for e = 0.
double E2M1Formula(uint8_t c) {
  const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  const double magnitude = e == 0 ? m / 2.0 : std::pow(2.0, e - 1) * (1.0 + m / 2.0);
  return s != 0 ? -magnitude : magnitude;
}

// The non-negative finite values of a format, ascending, with their codes.
struct Table {
  std::vector<double> values;
  std::vector<uint8_t> codes;
};

Table MakeTable(double (*formula)(uint8_t), uint8_t positive_codes) {
  Table t;
  for (unsigned c = 0; c < positive_codes; ++c) {
    const double v = formula(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    t.values.push_back(v);
    t.codes.push_back(static_cast<uint8_t>(c));
  }
  return t;
}

const Table& E4M3Table() {
  static const Table t = MakeTable(E4M3Formula, 0x80);
  return t;
}
const Table& E2M1Table() {
  static const Table t = MakeTable(E2M1Formula, 0x8);
  return t;
}

// Nearest table value to a >= 0 by search, ties to the even code (mantissa LSB 0); values past
// the largest saturate to it. Comparing against the exact midpoint (representable in double)
// avoids any rounding in the distance computation.
uint8_t NearestEven(const Table& t, double a) {
  if (a >= t.values.back()) return t.codes.back();
  const size_t hi = static_cast<size_t>(std::upper_bound(t.values.begin(), t.values.end(), a) - t.values.begin());
  const size_t lo = hi - 1;
  const double mid = (t.values[lo] + t.values[hi]) / 2;
  if (a < mid) return t.codes[lo];
  if (a > mid) return t.codes[hi];
  return (t.codes[lo] & 1) == 0 ? t.codes[lo] : t.codes[hi];
}

uint8_t RefEncodeE4M3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  return static_cast<uint8_t>(sign | NearestEven(E4M3Table(), std::fabs(static_cast<double>(x))));
}

uint8_t RefEncodeE2M1(float x) {
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  if (std::isnan(x)) return sign;
  return static_cast<uint8_t>(sign | NearestEven(E2M1Table(), std::fabs(static_cast<double>(x))));
}

// ---------------------------------------------------------------------------------------------
// E4M3

TEST(E4M3, DecodesAllCodesByFormula) {
  int nans = 0;
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const double want = E4M3Formula(code);
    const float got = DecodeE4M3(code);
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << std::hex << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << std::hex << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << std::hex << c;  // 0x80 is -0
  }
  EXPECT_EQ(nans, 2);
  EXPECT_TRUE(std::isnan(DecodeE4M3(0x7F)));
  EXPECT_TRUE(std::isnan(DecodeE4M3(0xFF)));
  EXPECT_EQ(DecodeE4M3(kE4M3MaxCode), 448.0f);
  EXPECT_EQ(DecodeE4M3(0xFE), -448.0f);
  EXPECT_EQ(DecodeE4M3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeE4M3(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(DecodeE4M3(0x38), 1.0f);
  // The table is strictly increasing in code order (what NearestEven relies on).
  const Table& t = E4M3Table();
  ASSERT_EQ(t.values.size(), 127u);
  EXPECT_TRUE(std::is_sorted(t.values.begin(), t.values.end()));
  EXPECT_EQ(std::adjacent_find(t.values.begin(), t.values.end()), t.values.end());
}

TEST(E4M3, EncodeInvertsDecodeForEveryCode) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (std::isnan(DecodeE4M3(code))) continue;
    EXPECT_EQ(EncodeE4M3(DecodeE4M3(code)), code) << std::hex << c;
  }
  EXPECT_EQ(EncodeE4M3(-0.0f), 0x80);
  EXPECT_EQ(EncodeE4M3(0.0f), 0x00);
}

TEST(E4M3, MidpointsRoundToEvenAndNeighboursToNearest) {
  const Table& t = E4M3Table();
  for (size_t i = 0; i + 1 < t.values.size(); ++i) {
    const uint8_t lo = t.codes[i], hi = t.codes[i + 1];
    const uint8_t even = (lo & 1) == 0 ? lo : hi;
    const double mid = (t.values[i] + t.values[i + 1]) / 2;
    const auto midf = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midf), mid);  // every E4M3 midpoint is a float
    for (const float sign : {1.0f, -1.0f}) {
      const uint8_t s = sign < 0 ? 0x80 : 0x00;
      EXPECT_EQ(EncodeE4M3(sign * midf), s | even) << mid;
      EXPECT_EQ(EncodeE4M3(sign * std::nextafter(midf, kInf)), s | hi) << mid;
      EXPECT_EQ(EncodeE4M3(sign * std::nextafter(midf, 0.0f)), s | lo) << mid;
    }
  }
  // Past 448 (0x7E) the would-be next value 480 is NaN's slot (0x7F), so nothing rounds up past
  // 448: the would-be midpoint 464 and everything beyond saturate.
  EXPECT_EQ(EncodeE4M3(464.0f), 0x7E);
  EXPECT_EQ(EncodeE4M3(std::nextafter(464.0f, kInf)), 0x7E);
  EXPECT_EQ(EncodeE4M3(479.0f), 0x7E);
  EXPECT_EQ(EncodeE4M3(480.0f), 0x7E);
  // Half the smallest subnormal ties between 0 and 2^-9: to 0 (even); just above goes up.
  EXPECT_EQ(EncodeE4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(EncodeE4M3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(EncodeE4M3(-std::ldexp(1.0f, -11)), 0x80);  // rounds to -0
  EXPECT_EQ(EncodeE4M3(FLT_TRUE_MIN), 0x00);
  // The subnormal/normal seam: 7.5·2^-9 ties between 0x07 and 0x08 (2^-6): to 0x08 (even).
  EXPECT_EQ(EncodeE4M3(7.5f * std::ldexp(1.0f, -9)), 0x08);
}

TEST(E4M3, Saturates) {
  EXPECT_EQ(EncodeE4M3(448.0f), 0x7E);
  EXPECT_EQ(EncodeE4M3(449.0f), 0x7E);
  EXPECT_EQ(EncodeE4M3(1e6f), 0x7E);
  EXPECT_EQ(EncodeE4M3(FLT_MAX), 0x7E);
  EXPECT_EQ(EncodeE4M3(kInf), 0x7E);
  EXPECT_EQ(EncodeE4M3(-449.0f), 0xFE);
  EXPECT_EQ(EncodeE4M3(-1e6f), 0xFE);
  EXPECT_EQ(EncodeE4M3(-kInf), 0xFE);
}

TEST(E4M3, NaNEncodesToNaNKeepingSign) {
  EXPECT_EQ(EncodeE4M3(kNaN), 0x7F);
  EXPECT_EQ(EncodeE4M3(-kNaN), 0xFF);
  EXPECT_EQ(EncodeE4M3(FromBits(0x7F800001u)), 0x7F);  // signalling NaN
  EXPECT_TRUE(std::isnan(DecodeE4M3(EncodeE4M3(kNaN))));
}

TEST(E4M3, HandCheckedValues) {
  // 0.1 = 1.6·2^-4: mantissa 1.6·8 - 8 = 4.8 → 5, e = -4 + 7 = 3 → 0.0011.101 = 0x1D = 0.1015625.
  EXPECT_EQ(EncodeE4M3(0.1f), 0x1D);
  EXPECT_EQ(RefEncodeE4M3(0.1f), 0x1D);
  EXPECT_EQ(DecodeE4M3(0x1D), 0.1015625f);
  // 240 = 1.875·2^7 → 0.1110.111 = 0x77; 1 → 0x38; -2 → 0xC0; 3.3 = 1.65·2 → m 5.2 → 5 → 0x45.
  EXPECT_EQ(EncodeE4M3(240.0f), 0x77);
  EXPECT_EQ(EncodeE4M3(1.0f), 0x38);
  EXPECT_EQ(EncodeE4M3(-2.0f), 0xC0);
  EXPECT_EQ(EncodeE4M3(3.3f), 0x45);
  EXPECT_EQ(DecodeE4M3(0x45), 3.25f);
  // 2^-7 = 4·2^-9 is subnormal 0.0000.100.
  EXPECT_EQ(EncodeE4M3(std::ldexp(1.0f, -7)), 0x04);
}

TEST(E4M3, EncoderMatchesNearestEvenSearch) {
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<float> uniform(-500.0f, 500.0f);
  std::uniform_real_distribution<float> log2_magnitude(-14.0f, 10.0f);
  std::uniform_int_distribution<uint32_t> any_bits;
  int mismatches = 0;
  auto check = [&](float x) {
    const uint8_t got = EncodeE4M3(x), want = RefEncodeE4M3(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " (bits " << std::hex << Bits(x) << ") got " << unsigned{got} << " want "
                    << unsigned{want};
    }
  };
  for (int i = 0; i < 100000; ++i) check(uniform(rng));
  for (int i = 0; i < 50000; ++i) {
    const float x = std::exp2(log2_magnitude(rng));
    check((i & 1) != 0 ? -x : x);
  }
  for (int i = 0; i < 50000; ++i) check(FromBits(any_bits(rng)));
  // Every midpoint and its float neighbours, both signs.
  const Table& t = E4M3Table();
  for (size_t i = 0; i + 1 < t.values.size(); ++i) {
    const auto mid = static_cast<float>((t.values[i] + t.values[i + 1]) / 2);
    for (const float x : {mid, std::nextafter(mid, kInf), std::nextafter(mid, 0.0f)}) {
      check(x);
      check(-x);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---------------------------------------------------------------------------------------------
// UE8M0

TEST(UE8M0, DecodesAllCodesToPowersOfTwo) {
  for (unsigned c = 0; c < 255; ++c) {
    const float v = DecodeUE8M0(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, static_cast<int>(c) - 127)) << c;
    int exp = 0;
    EXPECT_EQ(std::frexp(v, &exp), 0.5f) << c;  // a power of two
    EXPECT_EQ(exp, static_cast<int>(c) - 126) << c;
    if (c > 0) {
      EXPECT_EQ(v, 2.0f * DecodeUE8M0(static_cast<uint8_t>(c - 1))) << c;
    }
  }
  EXPECT_TRUE(std::isnan(DecodeUE8M0(0xFF)));
  EXPECT_EQ(DecodeUE8M0(127), 1.0f);
  EXPECT_EQ(DecodeUE8M0(0), std::ldexp(1.0f, -127));  // a float subnormal
  EXPECT_EQ(DecodeUE8M0(0xFE), std::ldexp(1.0f, 127));
}

TEST(UE8M0, CeilEncodeMapsPowersToTheirCodeAndRoundsUpBetween) {
  for (unsigned c = 0; c < 255; ++c) {
    EXPECT_EQ(EncodeUE8M0Ceil(DecodeUE8M0(static_cast<uint8_t>(c))), c) << c;
  }
  for (unsigned c = 0; c < 254; ++c) {
    const float lo = DecodeUE8M0(static_cast<uint8_t>(c)), hi = DecodeUE8M0(static_cast<uint8_t>(c + 1));
    EXPECT_EQ(EncodeUE8M0Ceil(std::nextafter(lo, kInf)), c + 1) << c;
    EXPECT_EQ(EncodeUE8M0Ceil(1.5f * lo), c + 1) << c;
    EXPECT_EQ(EncodeUE8M0Ceil(std::nextafter(hi, 0.0f)), c + 1) << c;
  }
  // Below and above the range, and the specials.
  EXPECT_EQ(EncodeUE8M0Ceil(0.0f), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(-0.0f), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(-1.0f), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(-kInf), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(FLT_TRUE_MIN), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(std::ldexp(1.0f, -128)), 0x00);
  EXPECT_EQ(EncodeUE8M0Ceil(std::nextafter(std::ldexp(1.0f, 127), kInf)), 0xFE);
  EXPECT_EQ(EncodeUE8M0Ceil(FLT_MAX), 0xFE);
  EXPECT_EQ(EncodeUE8M0Ceil(kInf), 0xFE);
  EXPECT_EQ(EncodeUE8M0Ceil(kNaN), 0xFF);
  // DeepSeek's use: scale = 2^ceil(log2(amax / 448)).
  EXPECT_EQ(EncodeUE8M0Ceil(448.0f / 448.0f), 127);
  EXPECT_EQ(EncodeUE8M0Ceil(449.0f / 448.0f), 128);
  EXPECT_EQ(EncodeUE8M0Ceil(1.0f / 448.0f), 127 - 8);  // 2^-8.8 → 2^-8
}

TEST(UE8M0, CeilEncodeMatchesLog2CeilingOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits(0, 0x7F7FFFFFu);  // positive finite, incl. subnormal
  for (int i = 0; i < 50000; ++i) {
    const float x = FromBits(any_bits(rng));
    if (x == 0.0f) continue;
    // In double, log2 of a float is far from the next integer unless the float is a power of two,
    // where it is exact.
    const double e = std::ceil(std::log2(static_cast<double>(x)));
    const double want = std::clamp(e + 127.0, 0.0, 254.0);
    ASSERT_EQ(EncodeUE8M0Ceil(x), static_cast<uint8_t>(want)) << x;
  }
}

// ---------------------------------------------------------------------------------------------
// E2M1

TEST(E2M1, DecodesAllSixteenCodes) {
  const std::array<float, 8> magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (unsigned c = 0; c < 16; ++c) {
    const float got = DecodeE2M1(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(got), E2M1Formula(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(got, (c & 8) != 0 ? -magnitudes[c & 7] : magnitudes[c & 7]) << c;
    EXPECT_EQ(std::signbit(got), (c & 8) != 0) << c;
    EXPECT_EQ(DecodeE2M1(static_cast<uint8_t>(c | 0xA0)), got) << c;  // high nibble ignored
    EXPECT_EQ(EncodeE2M1(got), c) << c;
  }
}

TEST(E2M1, EncoderMatchesNearestEvenSearch) {
  int mismatches = 0;
  auto check = [&](float x) {
    const uint8_t got = EncodeE2M1(x), want = RefEncodeE2M1(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " got " << unsigned{got} << " want " << unsigned{want};
    }
  };
  for (int i = -8 * 1024; i <= 8 * 1024; ++i) check(std::ldexp(static_cast<float>(i), -10));
  const Table& t = E2M1Table();
  for (size_t i = 0; i + 1 < t.values.size(); ++i) {
    const auto mid = static_cast<float>((t.values[i] + t.values[i + 1]) / 2);
    for (const float x : {mid, std::nextafter(mid, kInf), std::nextafter(mid, 0.0f)}) {
      check(x);
      check(-x);
    }
  }
  for (const float x : {FLT_TRUE_MIN, FLT_MIN, 1e-20f, 5.999f, 6.0f, 6.001f, 1e30f}) {
    check(x);
    check(-x);
  }
  EXPECT_EQ(mismatches, 0);
  // Ties spelled out: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
  EXPECT_EQ(EncodeE2M1(0.25f), 0x0);
  EXPECT_EQ(EncodeE2M1(0.75f), 0x2);
  EXPECT_EQ(EncodeE2M1(1.25f), 0x2);
  EXPECT_EQ(EncodeE2M1(1.75f), 0x4);
  EXPECT_EQ(EncodeE2M1(2.5f), 0x4);
  EXPECT_EQ(EncodeE2M1(3.5f), 0x6);
  EXPECT_EQ(EncodeE2M1(5.0f), 0x6);
  EXPECT_EQ(EncodeE2M1(-5.0f), 0xE);
}

TEST(E2M1, SaturatesAndHandlesSpecials) {
  EXPECT_EQ(EncodeE2M1(7.0f), 0x7);
  EXPECT_EQ(EncodeE2M1(100.0f), 0x7);
  EXPECT_EQ(EncodeE2M1(kInf), 0x7);
  EXPECT_EQ(EncodeE2M1(-7.0f), 0xF);
  EXPECT_EQ(EncodeE2M1(-kInf), 0xF);
  EXPECT_EQ(EncodeE2M1(kNaN), 0x0);
  EXPECT_EQ(EncodeE2M1(-kNaN), 0x8);
  EXPECT_EQ(EncodeE2M1(-0.0f), 0x8);
  EXPECT_EQ(EncodeE2M1(-0.1f), 0x8);  // rounds to -0
}

TEST(E2M1, PackPutsElementTwoIInTheLowNibble) {
  const std::array<float, 4> values = {1.0f, 6.0f, -0.5f, 0.0f};
  std::array<uint8_t, 2> packed{};
  ASSERT_TRUE(PackE2M1(values, packed).ok());
  EXPECT_EQ(packed[0], 0x72);  // 1.0 = 0x2 low, 6.0 = 0x7 high
  EXPECT_EQ(packed[1], 0x09);  // -0.5 = 0x9 low, 0 high
  std::array<float, 4> back{};
  ASSERT_TRUE(UnpackE2M1(packed, back).ok());
  EXPECT_EQ(back, values);

  // Odd count: the last high nibble is written as 0 and ignored on the way back.
  const std::array<float, 3> odd = {1.0f, 6.0f, 3.0f};
  ASSERT_TRUE(PackE2M1(odd, packed).ok());
  EXPECT_EQ(packed[1], 0x05);
  packed[1] = 0xF5;
  std::array<float, 3> odd_back{};
  ASSERT_TRUE(UnpackE2M1(packed, odd_back).ok());
  EXPECT_EQ(odd_back, odd);
}

TEST(E2M1, UnpackPackRoundTripsEveryByte) {
  std::vector<uint8_t> bytes(256);
  for (unsigned b = 0; b < 256; ++b) bytes[b] = static_cast<uint8_t>(b);
  std::vector<float> values(512);
  ASSERT_TRUE(UnpackE2M1(bytes, values).ok());
  for (unsigned b = 0; b < 256; ++b) {
    EXPECT_EQ(Bits(values[2 * b]), Bits(DecodeE2M1(static_cast<uint8_t>(b & 0xF)))) << b;
    EXPECT_EQ(Bits(values[2 * b + 1]), Bits(DecodeE2M1(static_cast<uint8_t>(b >> 4)))) << b;
  }
  std::vector<uint8_t> again(256);
  ASSERT_TRUE(PackE2M1(values, again).ok());
  EXPECT_EQ(again, bytes);
}

TEST(E2M1, PackSizeErrorsNameTheSpan) {
  std::array<float, 4> values{};
  std::array<uint8_t, 3> packed{};
  Status s = PackE2M1(values, packed);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.field(), "packed");
  s = UnpackE2M1(packed, values);  // 3 bytes need 5 or 6 floats
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.field(), "values");
  EXPECT_TRUE(PackE2M1(std::span<const float>(), std::span<uint8_t>()).ok());
  EXPECT_FALSE(UnpackE2M1(std::span<const uint8_t>(), values).ok());
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16, RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(bits);
    ASSERT_EQ(Bits(f), b << 16);
    if (std::isnan(f)) {
      const uint16_t back = FloatToBf16(f);
      EXPECT_EQ(back & 0x7F80, 0x7F80) << b;
      EXPECT_NE(back & 0x007F, 0) << b;
      EXPECT_EQ(back & 0x8000, b & 0x8000) << b;
    } else {
      ASSERT_EQ(FloatToBf16(f), bits) << b;
    }
  }
}

TEST(Bf16, RoundsToNearestEvenOnCraftedPatterns) {
  EXPECT_EQ(FloatToBf16(FromBits(0x3F800000u)), 0x3F80);  // 1.0 exact
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFFu)), 0x3F80);  // below the midpoint
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000u)), 0x3F80);  // tie, 0x3F80 is even
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001u)), 0x3F81);  // above the midpoint
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000u)), 0x3F82);  // tie, 0x3F81 odd → up
  EXPECT_EQ(FloatToBf16(FromBits(0xBF818000u)), 0xBF82);  // same, negative
  EXPECT_EQ(FloatToBf16(FromBits(0x3FFF8000u)), 0x4000);  // tie carries into the exponent
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to +inf
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F7FFFu)), 0x7F7F);  // largest bf16 stays
  EXPECT_EQ(FloatToBf16(kInf), 0x7F80);
  EXPECT_EQ(FloatToBf16(-kInf), 0xFF80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001u)), 0x0000);  // tiny subnormal → 0
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // subnormal tie → even 0
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // subnormal tie → even 2
  EXPECT_EQ(FloatToBf16(FromBits(0x7FC00000u)), 0x7FC0);  // quiet NaN
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001u)), 0x7FC0);  // signalling NaN, payload in low bits only
  EXPECT_EQ(FloatToBf16(FromBits(0xFFFFFFFFu)), 0xFFFF);  // NaN, all ones, no carry
}

TEST(Bf16, EncodeIsNearestOnRandomFloats) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 50000; ++i) {
    const float x = FromBits(any_bits(rng));
    if (!std::isfinite(x)) continue;
    const uint16_t got = FloatToBf16(x);
    const auto down = static_cast<uint16_t>(Bits(x) >> 16);  // toward zero
    const auto up = static_cast<uint16_t>(down + 1);         // away from zero (0x7F80: inf)
    ASSERT_TRUE(got == down || got == up) << x;
    auto value = [](uint16_t b) {
      return (b & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0, 128), Bf16ToFloat(b)) : Bf16ToFloat(b);
    };
    const double dx = x, d_down = std::fabs(dx - value(down)), d_up = std::fabs(dx - value(up));
    if (d_down < d_up) {
      ASSERT_EQ(got, down) << x;
    } else if (d_up < d_down) {
      ASSERT_EQ(got, up) << x;
    } else {
      ASSERT_EQ(got & 1, 0) << x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Block records

// Error bound for one value x of a tile quantized with scale s (derivation):
// y = x/s. For |y| in the normal E4M3 range [2^-6, 448], y in [2^k, 2^(k+1)) has spacing 2^(k-3),
// so RNE is off by at most 2^(k-4) <= 2^-4·|y|; for |y| < 2^-6 (subnormal) the spacing is 2^-9,
// so at most 2^-10. Scaled back: |deq - x| <= max(2^-4·|x|, 2^-10·s). That is the whole error
// when s is a power of two (x/s and q·s are exact: V4). With a raw fp32 scale (fp8_ds_mla) the
// division and the product each add a float rounding (2^-24 relative), covered by the extra
// 2^-20·(|x| + s). Saturation never adds error: s >= amax/448 puts |y| <= 448 up to that rounding.
double TileBound(double x, double s, bool exact_scale) {
  const double ax = std::fabs(x);
  const double bound = std::max(std::ldexp(ax, -4), std::ldexp(s, -10));
  return exact_scale ? bound : bound + std::ldexp(ax + s, -20);
}

// Latent-like test data: each tile has its own magnitude, with zeros, an outlier and values deep
// in the E4M3 subnormal range relative to the tile scale.
std::vector<float> TileData(size_t tiles, size_t tile_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::array<float, 7> magnitudes = {1.0f, 1e3f, 1e-3f, 3.7f, 1e-6f, 250.0f, 0.02f};
  std::vector<float> v(tiles * tile_size);
  for (size_t t = 0; t < tiles; ++t) {
    for (size_t i = 0; i < tile_size; ++i) v[t * tile_size + i] = magnitudes[t % magnitudes.size()] * normal(rng);
    v[t * tile_size + 3] = 0.0f;
    v[t * tile_size + 5] = -0.0f;
    v[t * tile_size + 7] = magnitudes[t % magnitudes.size()] * -40.0f;                  // outlier
    v[t * tile_size + 11] = magnitudes[t % magnitudes.size()] * 1e-4f;                  // subnormal in e4m3
    v[t * tile_size + 13] = magnitudes[t % magnitudes.size()] * std::ldexp(1.0f, -12);  // underflows
  }
  return v;
}

std::vector<float> RopeData(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(64);
  for (float& x : v) x = normal(rng);
  return v;
}

float TileAmax(std::span<const float> tile) {
  float amax = 0.0f;
  for (float x : tile) amax = std::max(amax, std::fabs(x));
  return amax;
}

uint32_t LoadLe32(const std::byte* p) {
  return std::to_integer<uint32_t>(p[0]) | std::to_integer<uint32_t>(p[1]) << 8 |
         std::to_integer<uint32_t>(p[2]) << 16 | std::to_integer<uint32_t>(p[3]) << 24;
}
uint16_t LoadLe16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) | std::to_integer<uint16_t>(p[1]) << 8);
}

// Rope values are rounded to bf16: 8 significant bits, spacing 2^(k-7) in [2^k, 2^(k+1)), so RNE is
// within half of that, 2^-8 relative.
void ExpectRopeRoundTrip(const std::vector<float>& rope, std::span<const float> back) {
  for (size_t i = 0; i < rope.size(); ++i) {
    EXPECT_EQ(back[i], Bf16ToFloat(FloatToBf16(rope[i]))) << i;
    EXPECT_LE(std::fabs(static_cast<double>(back[i]) - rope[i]), std::ldexp(std::fabs(rope[i]), -8)) << i;
  }
}

TEST(Fp8DsMla, LayoutScalesAndBytes) {
  const std::vector<float> latent = TileData(4, 128, 1), rope = RopeData(2);
  std::vector<std::byte> record(kFp8DsMlaRecordBytes);
  ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, record).ok());
  static_assert(kFp8DsMlaRecordBytes == 656 && kFp8DsMlaScaleOffset == 512 && kFp8DsMlaRopeOffset == 528);
  for (size_t t = 0; t < 4; ++t) {
    const float amax = TileAmax(std::span(latent).subspan(t * 128, 128));
    const float scale = FromBits(LoadLe32(record.data() + 512 + 4 * t));
    EXPECT_EQ(scale, amax / 448.0f) << t;
    for (size_t i = t * 128; i < (t + 1) * 128; ++i) {
      ASSERT_EQ(std::to_integer<uint8_t>(record[i]), EncodeE4M3(latent[i] / scale)) << i;
    }
  }
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(LoadLe16(record.data() + 528 + 2 * i), FloatToBf16(rope[i])) << i;
}

TEST(Fp8DsMla, RoundTripWithinErrorBound) {
  double worst = 0.0;
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const std::vector<float> latent = TileData(4, 128, 10 + seed), rope = RopeData(20 + seed);
    std::vector<std::byte> record(kFp8DsMlaRecordBytes);
    ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, record).ok());
    std::vector<float> latent_back(512), rope_back(64);
    ASSERT_TRUE(DequantizeFp8DsMla(record, latent_back, rope_back).ok());
    for (size_t i = 0; i < 512; ++i) {
      const double s = FromBits(LoadLe32(record.data() + 512 + 4 * (i / 128)));
      const double err = std::fabs(static_cast<double>(latent_back[i]) - latent[i]);
      const double bound = TileBound(latent[i], s, /*exact_scale=*/false);
      ASSERT_LE(err, bound) << i << " x=" << latent[i] << " s=" << s;
      worst = std::max(worst, err / bound);
    }
    ExpectRopeRoundTrip(rope, rope_back);
  }
  EXPECT_GT(worst, 0.5);  // the bound is tight, not vacuous
}

// Picks `n` random finite E4M3 codes, with code 0x7E or 0xFE (±448) first so the tile's amax is
// 448·scale.
std::vector<uint8_t> RandomCodes(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<unsigned> byte(0, 255);
  std::vector<uint8_t> codes(n);
  for (uint8_t& c : codes) {
    do {
      c = static_cast<uint8_t>(byte(rng));
    } while ((c & 0x7F) == 0x7F);
  }
  codes[0] = (byte(rng) & 1) != 0 ? 0x7E : 0xFE;
  return codes;
}

TEST(Fp8DsMla, ExactForRepresentableValues) {
  // x = code·S with S = amax/448 exactly: x/S recovers the code and code·S is exact in float,
  // for power-of-two and other short scales alike.
  std::mt19937 rng(5);
  const std::array<float, 4> scales = {1.0f, std::ldexp(1.0f, -5), 3.0f, 0.75f};
  std::vector<float> latent(512);
  std::vector<uint8_t> codes;
  for (size_t t = 0; t < 4; ++t) {
    const std::vector<uint8_t> tile_codes = RandomCodes(128, rng);
    codes.insert(codes.end(), tile_codes.begin(), tile_codes.end());
    for (size_t i = 0; i < 128; ++i) latent[t * 128 + i] = DecodeE4M3(tile_codes[i]) * scales[t];
  }
  std::vector<float> rope(64);
  std::uniform_int_distribution<unsigned> bf16_bits(0, 0x7F7F);
  for (float& r : rope) r = Bf16ToFloat(static_cast<uint16_t>(bf16_bits(rng) | (rng() & 0x8000u)));

  std::vector<std::byte> record(kFp8DsMlaRecordBytes);
  ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, record).ok());
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(FromBits(LoadLe32(record.data() + 512 + 4 * t)), scales[t]);
  for (size_t i = 0; i < 512; ++i) ASSERT_EQ(std::to_integer<uint8_t>(record[i]), codes[i]) << i;
  std::vector<float> latent_back(512), rope_back(64);
  ASSERT_TRUE(DequantizeFp8DsMla(record, latent_back, rope_back).ok());
  for (size_t i = 0; i < 512; ++i) ASSERT_EQ(Bits(latent_back[i]), Bits(latent[i])) << i;
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(Bits(rope_back[i]), Bits(rope[i])) << i;
}

// vLLM's concat_and_cache_ds_mla writes fmaxf(0 / 448, FLT_MIN) for an all-zero tile.
TEST(Fp8DsMla, AllZeroTileHasScaleFltMin) {
  std::vector<float> latent = TileData(4, 128, 3);
  std::fill(latent.begin() + 256, latent.begin() + 384, 0.0f);  // tile 2
  const std::vector<float> zeros(512, 0.0f), rope(64, 0.0f);
  std::vector<std::byte> record(kFp8DsMlaRecordBytes);
  std::vector<float> latent_back(512), rope_back(64);

  ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, record).ok());
  EXPECT_EQ(LoadLe32(record.data() + 512 + 8), 0x00800000u);  // FLT_MIN
  for (size_t i = 256; i < 384; ++i) ASSERT_EQ(record[i], std::byte{0}) << i;

  ASSERT_TRUE(QuantizeFp8DsMla(zeros, rope, record).ok());
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(FromBits(LoadLe32(record.data() + 512 + 4 * t)), FLT_MIN);
  for (size_t i = 0; i < 512; ++i) ASSERT_EQ(record[i], std::byte{0}) << i;
  ASSERT_TRUE(DequantizeFp8DsMla(record, latent_back, rope_back).ok());
  for (float x : latent_back) ASSERT_EQ(Bits(x), 0u);
}

TEST(Fp8DsMla, TinyTileUsesFltMinScale) {
  std::vector<float> latent(512, 0.0f);
  const std::vector<float> rope(64, 1.0f);
  for (size_t i = 0; i < 128; ++i) latent[i] = static_cast<float>(i) * 1e-41f;  // float subnormals
  std::vector<std::byte> record(kFp8DsMlaRecordBytes);
  ASSERT_TRUE(QuantizeFp8DsMla(latent, rope, record).ok());
  EXPECT_EQ(FromBits(LoadLe32(record.data() + 512)), FLT_MIN);
  std::vector<float> latent_back(512), rope_back(64);
  ASSERT_TRUE(DequantizeFp8DsMla(record, latent_back, rope_back).ok());
  for (size_t i = 0; i < 128; ++i) {
    EXPECT_LE(std::fabs(static_cast<double>(latent_back[i]) - latent[i]), TileBound(latent[i], FLT_MIN, false)) << i;
  }
}

TEST(Fp8DsMla, ErrorsNameTheField) {
  const std::vector<float> latent(512, 1.0f), rope(64, 1.0f);
  std::vector<std::byte> record(kFp8DsMlaRecordBytes);
  std::vector<float> latent_out(512), rope_out(64);
  auto field = [](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.field();
  };
  EXPECT_EQ(field(QuantizeFp8DsMla(std::span(latent).first(511), rope, record)), "latent");
  EXPECT_EQ(field(QuantizeFp8DsMla(latent, std::span(rope).first(63), record)), "rope");
  EXPECT_EQ(field(QuantizeFp8DsMla(latent, rope, std::span(record).first(655))), "record");
  EXPECT_EQ(field(DequantizeFp8DsMla(std::span(record).first(655), latent_out, rope_out)), "record");
  EXPECT_EQ(field(DequantizeFp8DsMla(record, std::span(latent_out).first(500), rope_out)), "latent");
  EXPECT_EQ(field(DequantizeFp8DsMla(record, latent_out, std::span(rope_out).first(1))), "rope");

  std::vector<float> bad = latent;
  bad[300] = kNaN;
  const Status s = QuantizeFp8DsMla(bad, rope, record);
  EXPECT_EQ(field(s), "latent");
  EXPECT_NE(s.message().find("300"), std::string::npos) << s.message();
  bad[300] = -kInf;
  EXPECT_EQ(field(QuantizeFp8DsMla(bad, rope, record)), "latent");
  // Rope is a bf16 copy: non-finite values pass through.
  std::vector<float> odd_rope = rope;
  odd_rope[0] = kInf;
  ASSERT_TRUE(QuantizeFp8DsMla(latent, odd_rope, record).ok());
  EXPECT_EQ(LoadLe16(record.data() + 528), 0x7F80);
}

// ----- V4 -----

// 2^ceil(log2(max(amax/448, 1e-4))), computed independently in double.
double V4Scale(float amax) {
  const float s = std::max(amax / 448.0f, 1e-4f);
  return std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<double>(s)))));
}

TEST(V4Fp8, LayoutScalesAndBytes) {
  const std::vector<float> nope = TileData(7, 64, 31), rope = RopeData(32);
  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes, std::byte{0xCD});
  ASSERT_TRUE(QuantizeV4Fp8(nope, rope, data, scales).ok());
  static_assert(kV4DataRowBytes == 576 && kV4ScaleRowBytes == 8 && kV4RopeOffset == 448);
  for (size_t t = 0; t < 7; ++t) {
    const float amax = TileAmax(std::span(nope).subspan(t * 64, 64));
    const float scale = DecodeUE8M0(std::to_integer<uint8_t>(scales[t]));
    EXPECT_EQ(static_cast<double>(scale), V4Scale(amax)) << t;
    EXPECT_LE(amax / scale, 448.0f) << t;
    for (size_t i = t * 64; i < (t + 1) * 64; ++i) {
      ASSERT_EQ(std::to_integer<uint8_t>(data[i]), EncodeE4M3(nope[i] / scale)) << i;
    }
  }
  EXPECT_EQ(scales[7], std::byte{0});  // pad
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(LoadLe16(data.data() + 448 + 2 * i), FloatToBf16(rope[i])) << i;
}

TEST(V4Fp8, RoundTripWithinErrorBound) {
  double worst = 0.0;
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const std::vector<float> nope = TileData(7, 64, 40 + seed), rope = RopeData(50 + seed);
    std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
    ASSERT_TRUE(QuantizeV4Fp8(nope, rope, data, scales).ok());
    std::vector<float> nope_back(448), rope_back(64);
    ASSERT_TRUE(DequantizeV4Fp8(data, scales, nope_back, rope_back).ok());
    for (size_t i = 0; i < 448; ++i) {
      const double s = DecodeUE8M0(std::to_integer<uint8_t>(scales[i / 64]));
      const double err = std::fabs(static_cast<double>(nope_back[i]) - nope[i]);
      const double bound = TileBound(nope[i], s, /*exact_scale=*/true);
      ASSERT_LE(err, bound) << i << " x=" << nope[i] << " s=" << s;
      worst = std::max(worst, err / bound);
    }
    ExpectRopeRoundTrip(rope, rope_back);
  }
  EXPECT_GT(worst, 0.5);
}

TEST(V4Fp8, ExactForRepresentableValues) {
  std::mt19937 rng(6);
  const std::array<int, 7> exponents = {0, -13, 5, -3, 10, -7, 1};  // 2^-13 is the 1e-4 floor's power
  std::vector<float> nope(448);
  std::vector<uint8_t> codes;
  for (size_t t = 0; t < 7; ++t) {
    const std::vector<uint8_t> tile_codes = RandomCodes(64, rng);
    codes.insert(codes.end(), tile_codes.begin(), tile_codes.end());
    for (size_t i = 0; i < 64; ++i) nope[t * 64 + i] = std::ldexp(DecodeE4M3(tile_codes[i]), exponents[t]);
  }
  std::vector<float> rope(64);
  for (size_t i = 0; i < 64; ++i) rope[i] = std::ldexp(static_cast<float>(i) - 31.0f, static_cast<int>(i % 9) - 4);

  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
  ASSERT_TRUE(QuantizeV4Fp8(nope, rope, data, scales).ok());
  for (size_t t = 0; t < 7; ++t) EXPECT_EQ(std::to_integer<int>(scales[t]), 127 + exponents[t]) << t;
  for (size_t i = 0; i < 448; ++i) ASSERT_EQ(std::to_integer<uint8_t>(data[i]), codes[i]) << i;
  std::vector<float> nope_back(448), rope_back(64);
  ASSERT_TRUE(DequantizeV4Fp8(data, scales, nope_back, rope_back).ok());
  for (size_t i = 0; i < 448; ++i) ASSERT_EQ(Bits(nope_back[i]), Bits(nope[i])) << i;
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(Bits(rope_back[i]), Bits(rope[i])) << i;
}

TEST(V4Fp8, AllZeroAndTinyTilesUseTheFloorScale) {
  std::vector<float> nope(448, 0.0f);
  for (size_t i = 64; i < 128; ++i) nope[i] = 1e-3f * static_cast<float>(i % 7);  // amax/448 < 1e-4
  const std::vector<float> rope(64, 0.0f);
  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
  ASSERT_TRUE(QuantizeV4Fp8(nope, rope, data, scales).ok());
  for (size_t t = 0; t < 7; ++t) EXPECT_EQ(std::to_integer<int>(scales[t]), 127 - 13) << t;  // 2^-13 >= 1e-4
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(data[i], std::byte{0}) << i;
  std::vector<float> nope_back(448), rope_back(64);
  ASSERT_TRUE(DequantizeV4Fp8(data, scales, nope_back, rope_back).ok());
  for (size_t i = 0; i < 448; ++i) {
    ASSERT_LE(std::fabs(static_cast<double>(nope_back[i]) - nope[i]), TileBound(nope[i], std::ldexp(1.0, -13), true));
  }
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(nope_back[i], 0.0f);
}

TEST(V4Fp8, PadByteIsIgnoredOnDequantize) {
  const std::vector<float> nope = TileData(7, 64, 60), rope = RopeData(61);
  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
  ASSERT_TRUE(QuantizeV4Fp8(nope, rope, data, scales).ok());
  std::vector<float> a(448), b(448), rope_back(64);
  ASSERT_TRUE(DequantizeV4Fp8(data, scales, a, rope_back).ok());
  scales[7] = std::byte{0xAB};
  ASSERT_TRUE(DequantizeV4Fp8(data, scales, b, rope_back).ok());
  EXPECT_EQ(a, b);
}

TEST(V4Fp8, ErrorsNameTheField) {
  const std::vector<float> nope(448, 1.0f), rope(64, 1.0f);
  std::vector<std::byte> data(kV4DataRowBytes), scales(kV4ScaleRowBytes);
  std::vector<float> nope_out(448), rope_out(64);
  auto field = [](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.field();
  };
  EXPECT_EQ(field(QuantizeV4Fp8(std::span(nope).first(447), rope, data, scales)), "nope");
  EXPECT_EQ(field(QuantizeV4Fp8(nope, std::span(rope).first(32), data, scales)), "rope");
  EXPECT_EQ(field(QuantizeV4Fp8(nope, rope, std::span(data).first(575), scales)), "data_row");
  EXPECT_EQ(field(QuantizeV4Fp8(nope, rope, data, std::span(scales).first(7))), "scale_row");
  EXPECT_EQ(field(DequantizeV4Fp8(std::span(data).first(512), scales, nope_out, rope_out)), "data_row");
  EXPECT_EQ(field(DequantizeV4Fp8(data, std::span(scales).first(0), nope_out, rope_out)), "scale_row");
  EXPECT_EQ(field(DequantizeV4Fp8(data, scales, std::span(nope_out).first(1), rope_out)), "nope");
  EXPECT_EQ(field(DequantizeV4Fp8(data, scales, nope_out, std::span(rope_out).first(63))), "rope");
  std::vector<float> bad = nope;
  bad[447] = kInf;
  EXPECT_EQ(field(QuantizeV4Fp8(bad, rope, data, scales)), "nope");
}

}  // namespace
}  // namespace tessera
