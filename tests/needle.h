// The needle tests' shared construction (needle_test.cc, v4_needle_test.cc): reproducible
// background values, the needle's value and the indexer's direction.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera::testing {

// A uniform(-1, 1) value from (a, i, salt), the same on every run.
inline float NeedleNoise(uint64_t a, uint64_t i, uint64_t salt) {
  uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (i + 1) * 0xbf58476d1ce4e5b9ULL ^ salt * 0x94d049bb133111ebULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// The needle's value in dims [64, 128): multiples of 1/8 in [-2, 2].
inline float NeedleValue(uint32_t j) { return static_cast<float>(static_cast<int>((j * 37) % 33) - 16) / 8.0f; }

// The indexer's unit direction: +-1/sqrt(128) by a fixed sign pattern.
inline float NeedleDirection(uint32_t i) { return ((i * 2654435761u) >> 7 & 1 ? 1.0f : -1.0f) / std::sqrt(128.0f); }

}  // namespace tessera::testing
