#include "tessera/fraction.h"

#include <cassert>
#include <cstdio>

#include "tessera/checked.h"

namespace tessera {

namespace {
__extension__ typedef unsigned __int128 Uint128;
}  // namespace

Fraction::Fraction(uint64_t num, uint64_t den) : num_(num), den_(den) {
  assert(den > 0 && "Fraction denominator must be positive");
  uint64_t g = Gcd(num_, den_);
  if (g > 1) {
    num_ /= g;
    den_ /= g;
  }
  if (num_ == 0) den_ = 1;
}

Fraction operator+(const Fraction& a, const Fraction& b) {
  uint64_t g = Gcd(a.den_, b.den_);
  Checked den = Checked(a.den_ / g) * b.den_;
  Checked num = Checked(a.num_) * (b.den_ / g) + Checked(b.num_) * (a.den_ / g);
  if (den.overflowed() || num.overflowed() || !a.ok_ || !b.ok_) {
    Fraction bad;
    bad.ok_ = false;
    return bad;
  }
  return {num.value(), den.value()};
}

Fraction operator*(const Fraction& a, const Fraction& b) {
  // Cross-reduce first so that products stay small.
  uint64_t g1 = Gcd(a.num_, b.den_);
  uint64_t g2 = Gcd(b.num_, a.den_);
  if (g1 == 0) g1 = 1;
  if (g2 == 0) g2 = 1;
  Checked num = Checked(a.num_ / g1) * (b.num_ / g2);
  Checked den = Checked(a.den_ / g2) * (b.den_ / g1);
  if (den.overflowed() || num.overflowed() || !a.ok_ || !b.ok_) {
    Fraction bad;
    bad.ok_ = false;
    return bad;
  }
  return {num.value(), den.value()};
}

std::string Fraction::ToString() const {
  if (!ok_) return "overflow";
  if (den_ == 1) return std::to_string(num_);
  return std::to_string(num_) + "/" + std::to_string(den_);
}

std::string Fraction::ToDecimal(int max_places) const {
  if (!ok_) return "overflow";
  uint64_t whole = num_ / den_;
  uint64_t rem = num_ % den_;
  std::string out = std::to_string(whole);
  if (rem == 0) return out;
  out += '.';
  for (int i = 0; i < max_places && rem != 0; ++i) {
    // rem < den_ < 2^64, so 10 x rem needs up to 68 bits: a ratio of two byte counts from a
    // hostile config can have any 64-bit denominator.
    const Uint128 wide = static_cast<Uint128>(rem) * 10;
    out += static_cast<char>('0' + static_cast<int>(wide / den_));
    rem = static_cast<uint64_t>(wide % den_);
  }
  if (rem != 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "~%.6f", ToDouble());
    return buf;
  }
  return out;
}

std::string Fraction::ToExactAndDecimal() const {
  if (!ok_) return "overflow";
  if (den_ == 1) return ToString();
  return ToString() + " (" + ToDecimal(12) + ")";
}

}  // namespace tessera
