// RecordMac: authenticates what a tier gives back.
//
// A tier that another party can write (a disk directory, a Redis server) stores with each record
// a random 16-byte nonce and a 16-byte tag. The tag is Poly1305 over the record's bytes under a
// one-time key HMAC-SHA256(mac key, nonce); the mac key is HMAC-SHA256(secret, label), so one
// secret (a directory's `prefix.key`, a fleet's key) serves several purposes without reuse.
// Only a holder of the secret can produce a tag that verifies; a record copied from another
// directory or fleet, edited, or replayed with another header fails. Tags are compared in
// constant time. Random nonces make a one-time key repeat with probability ~n^2/2^129 for n
// records (docs/SECURITY.md).
//
// Thread-safety: immutable after Create; Compute/Verify may run concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "tessera/status.h"

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX

namespace tessera {

class RecordMac {
 public:
  static constexpr size_t kNonceBytes = 16;
  static constexpr size_t kTagBytes = 16;
  using Nonce = std::array<std::byte, kNonceBytes>;
  using Tag = std::array<std::byte, kTagBytes>;

  // Derives the mac key from `secret` (at least 16 bytes) and a label naming the use.
  // Errors: kInvalidArgument on "mac-key" when the secret is too short; kInternal when the
  // crypto library lacks Poly1305 or HMAC.
  static Result<RecordMac> Create(std::span<const std::byte> secret, std::string_view label);

  // A fresh nonce from the operating system's CSPRNG.
  static Nonce RandomNonce();

  // The tag over the concatenation of `parts`.
  Tag Compute(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts) const;
  // True when `tag` is the tag of `parts` (constant-time comparison).
  bool Verify(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts, const Tag& tag) const;

  // A tag checked over bytes handed in pieces as they arrive (a payload read chunk by chunk).
  class Verifier {
   public:
    Verifier(Verifier&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}
    Verifier& operator=(Verifier&&) = delete;
    Verifier(const Verifier&) = delete;
    Verifier& operator=(const Verifier&) = delete;
    ~Verifier();
    void Update(std::span<const std::byte> bytes);
    // True when the bytes so far have `tag` (constant-time comparison); call once.
    bool Matches(const Tag& tag);

   private:
    friend class RecordMac;
    explicit Verifier(::evp_mac_ctx_st* ctx) : ctx_(ctx) {}
    ::evp_mac_ctx_st* ctx_;  // null: the crypto library failed; then nothing matches
  };
  Verifier Begin(const Nonce& nonce) const;

  RecordMac(const RecordMac&) = default;
  RecordMac& operator=(const RecordMac&) = default;
  RecordMac(RecordMac&&) noexcept = default;
  RecordMac& operator=(RecordMac&&) noexcept = default;
  ~RecordMac();

 private:
  struct Algorithms;
  RecordMac() = default;
  bool ComputeInto(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts, Tag* tag) const;
  std::array<std::byte, 32> key_{};
  std::shared_ptr<const Algorithms> algorithms_;  // fetched once, shared by copies
};

}  // namespace tessera
