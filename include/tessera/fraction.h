// Exact non-negative fractions for amortized per-token figures.
//
// An HCA layer stores one 576-B entry per 128 tokens: 9/2 B per token, not 4 and not 4.5 as a
// double that might print as 4.49999. Fractions are kept reduced; arithmetic is checked and
// reports overflow through ok().
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

class Fraction {
 public:
  constexpr Fraction() = default;
  // REQUIRES: den > 0. Reduced on construction.
  Fraction(uint64_t num, uint64_t den);
  static Fraction Integer(uint64_t v) { return {v, 1}; }

  uint64_t num() const { return num_; }
  uint64_t den() const { return den_; }
  bool ok() const { return ok_; }
  bool is_integer() const { return den_ == 1; }
  double ToDouble() const { return static_cast<double>(num_) / static_cast<double>(den_); }

  // "9/2"; an integer prints bare ("160").
  std::string ToString() const;
  // "9/2 (4.5)"; integers print bare. Decimal is exact when the denominator has only factors
  // 2 and 5, else it is rounded to 6 places and marked with "~".
  std::string ToExactAndDecimal() const;
  // Exact decimal expansion when one exists (denominator 2^a 5^b), else rounded with "~".
  std::string ToDecimal(int max_places = 12) const;

  friend Fraction operator+(const Fraction& a, const Fraction& b);
  friend Fraction operator*(const Fraction& a, const Fraction& b);
  friend bool operator==(const Fraction& a, const Fraction& b) {
    return a.num_ == b.num_ && a.den_ == b.den_ && a.ok_ == b.ok_;
  }

 private:
  uint64_t num_ = 0;
  uint64_t den_ = 1;
  bool ok_ = true;
};

}  // namespace tessera
