// KV of a token stream for block-store tests: like an MLA latent past layer 0, the record of a
// position depends on every token up to it (a rolling hash), on the layer, group and plane.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "tessera/request_manager.h"

namespace tessera::testing {

inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The token stream of one request and the KV it implies.
class KvStream {
 public:
  KvStream() = default;
  // The tokens first, first + 1, ..., first + n - 1.
  KvStream(uint32_t first, uint32_t n) {
    std::vector<uint32_t> t(n);
    for (uint32_t i = 0; i < n; ++i) t[i] = first + i;
    Add(t);
  }
  void Add(std::span<const uint32_t> tokens) {
    for (uint32_t t : tokens) {
      uint64_t prev = hash_.empty() ? 0x5eedULL : hash_.back();
      tokens_.push_back(t);
      hash_.push_back(Mix(prev ^ (uint64_t{t} * 0x100000001b3ULL)));
    }
  }
  const std::vector<uint32_t>& tokens() const { return tokens_; }
  std::span<const uint32_t> Slice(size_t from, size_t n) const { return std::span(tokens_).subspan(from, n); }

  // The bytes of plane `plane` of the record at `position`.
  void Expected(uint32_t group, uint32_t layer, uint64_t position, uint32_t plane, std::span<std::byte> out) const {
    uint64_t seed =
        Mix(hash_.at(position) ^ (uint64_t{group} << 56) ^ (uint64_t{layer} << 40) ^ (uint64_t{plane} << 32));
    for (size_t off = 0; off < out.size(); off += 8) {
      uint64_t v = Mix(seed + off);
      std::memcpy(out.data() + off, &v, std::min<size_t>(8, out.size() - off));
    }
  }

  KvWriter Writer() const {
    return [this](uint32_t group, uint32_t layer, uint64_t position, const RecordView& record) {
      for (uint32_t p = 0; p < record.plane_count; ++p) Expected(group, layer, position, p, record.planes[p]);
    };
  }

 private:
  std::vector<uint32_t> tokens_;
  std::vector<uint64_t> hash_;
};

}  // namespace tessera::testing
