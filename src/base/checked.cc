#include "tessera/checked.h"

namespace tessera {

uint64_t Gcd(uint64_t a, uint64_t b) {
  while (b != 0) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

Checked Lcm(uint64_t a, uint64_t b) {
  if (a == 0 || b == 0) return Checked(0);
  return Checked(a / Gcd(a, b)) * b;
}

}  // namespace tessera
