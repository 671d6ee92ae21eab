// Checked unsigned 64-bit arithmetic for byte counts.
//
// Byte totals at 1M-token contexts times large batches leave 64 bits easily; every product and
// sum in the ledger goes through Checked, which remembers that an overflow happened (sticky)
// instead of wrapping. Callers test overflowed() once at the end of a computation and turn it
// into a Status naming the input that drove it out of range.
#pragma once

#include <cstdint>

namespace tessera {

// 128-bit signed integer for intermediate products that must not overflow (GCC/Clang).
__extension__ typedef __int128 Int128;

class Checked {
 public:
  constexpr Checked() = default;
  constexpr Checked(uint64_t v) : value_(v) {}  // NOLINT(google-explicit-constructor)

  constexpr uint64_t value() const { return value_; }
  constexpr bool overflowed() const { return overflowed_; }

  friend constexpr Checked operator+(Checked a, Checked b) {
    Checked r;
    r.overflowed_ = a.overflowed_ || b.overflowed_ || __builtin_add_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  friend constexpr Checked operator*(Checked a, Checked b) {
    Checked r;
    r.overflowed_ = a.overflowed_ || b.overflowed_ || __builtin_mul_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  // Subtraction below zero is an overflow too: byte terms are never negative.
  friend constexpr Checked operator-(Checked a, Checked b) {
    Checked r;
    r.overflowed_ = a.overflowed_ || b.overflowed_ || __builtin_sub_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  Checked& operator+=(Checked o) { return *this = *this + o; }
  Checked& operator*=(Checked o) { return *this = *this * o; }

 private:
  uint64_t value_ = 0;
  bool overflowed_ = false;
};

// ceil(a / b); REQUIRES: b > 0.
constexpr uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
// The smallest multiple of `m` that is >= a; REQUIRES: m > 0. Checked, since it can overflow.
constexpr Checked RoundUp(uint64_t a, uint64_t m) { return Checked(CeilDiv(a, m)) * m; }

uint64_t Gcd(uint64_t a, uint64_t b);
// lcm; returns 0 and sets *overflow on overflow.
Checked Lcm(uint64_t a, uint64_t b);

}  // namespace tessera
