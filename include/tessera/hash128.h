// Hash128: a 128-bit key (a prefix key, a content key, a record's key in a tier), and the hasher
// that lets it key an unordered container. A plain value; how keys are computed is hash.h's
// business.
//
// Thread-safety: a value type; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const Hash128&, const Hash128&) = default;
  // 32 lowercase hex digits, high word first.
  std::string Hex() const;
};

// The keys are already uniformly distributed (keyed hashes): folding the two words is enough.
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL)); }
};

}  // namespace tessera
