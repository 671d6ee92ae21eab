// Keys for the two indexes.
//
//   Prefix (token-chain) key: H(parent key, the block's tokens, extra keys incl. tenant salt).
//   Content key: H(format ids, tenant domain, the block's bytes across all its layers).
//
// Both are keyed: xxh3-128 with a secret drawn at random per store (so an outsider cannot
// precompute collisions), or SHA-256 (OpenSSL) for content when asked. Neither key is trusted
// on its own: a prefix hit compares tokens and a content hit compares bytes. `bits` truncates
// content keys and caller keys (an adversarial self-test that forces collisions).
//
// Thread-safety: a ContentHasher is immutable after construction; Stream objects are not
// shared.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "tessera/hash128.h"
#include "tessera/status.h"

namespace tessera {

enum class HashAlgorithm { kXxh3, kSha256 };
Result<HashAlgorithm> ParseHashAlgorithm(std::string_view name);
std::string_view HashAlgorithmName(HashAlgorithm a);

class ContentHasher {
 public:
  // `key_seed` 0 draws the secret from std::random_device; any other value makes the keys
  // reproducible (tests, benchmarks). `bits` in [1, 128].
  static Result<ContentHasher> Create(HashAlgorithm algorithm, uint32_t bits = 128, uint64_t key_seed = 0);
  // Keys from a caller's secret (at least 16 bytes), e.g. one persisted beside a tier so that a
  // later process computes the same prefix keys. kInvalidArgument on "hash-key" when too short.
  static Result<ContentHasher> CreateWithKey(HashAlgorithm algorithm, uint32_t bits, std::span<const std::byte> key);

  class Stream {
   public:
    void Update(std::span<const std::byte> bytes);
    void Update(const void* data, size_t len) { Update({static_cast<const std::byte*>(data), len}); }
    Hash128 Digest();
    Stream(Stream&&) noexcept;
    ~Stream();

   private:
    friend class ContentHasher;
    struct ShaState;  // the SHA-256 context (hash.cc): OpenSSL stays out of this header
    explicit Stream(const ContentHasher* h);
    const ContentHasher* hasher_;
    std::unique_ptr<std::array<std::byte, 640>> xxh_state_;  // XXH3_state_t storage
    std::unique_ptr<ShaState> sha_;
  };

  Stream Begin() const { return Stream(this); }
  // The prefix key of a block: H(parent, tokens, extra). Always keyed xxh3-128, full width.
  Hash128 PrefixKey(const Hash128& parent, std::span<const uint32_t> tokens, uint64_t extra) const;
  // The same key for the block's tokens given in two parts, head then tail (a span written so
  // far and the tokens that complete it), without first joining them.
  Hash128 PrefixKey(const Hash128& parent, std::span<const uint32_t> head, std::span<const uint32_t> tail,
                    uint64_t extra) const;

  // The prefix key of a block its caller keyed with its own hash of it (`caller`: e.g. vLLM's
  // 32-byte block hash; ADR 0045): keyed xxh3-128 of (parent, extra, caller) under a secret of its
  // own, derived apart from the token keys' secret, so that a caller key and a token key are two
  // functions even of equal bytes; truncated to `bits` like content keys.
  Hash128 CallerKey(const Hash128& parent, std::span<const std::byte, 32> caller, uint64_t extra) const;

  HashAlgorithm algorithm() const { return algorithm_; }
  uint32_t bits() const { return bits_; }

 private:
  ContentHasher() = default;
  Hash128 Truncate(Hash128 h) const;
  HashAlgorithm algorithm_ = HashAlgorithm::kXxh3;
  uint32_t bits_ = 128;
  std::array<unsigned char, 192> secret_{};         // xxh3 secret (>= XXH3_SECRET_SIZE_MIN)
  std::array<unsigned char, 192> caller_secret_{};  // CallerKey's xxh3 secret
  std::array<unsigned char, 32> sha_key_{};         // prepended to SHA-256 input
};

}  // namespace tessera
