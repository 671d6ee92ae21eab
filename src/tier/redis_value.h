// The value format shared by RedisTier and RedisClusterTier (docs/adr/0014-redis-hardening.md):
// a 64-byte header — magic, version 2, record-format id, the key, payload length, a random nonce
// and a RecordMac tag — followed by the payload. Internal to src/tier.
//
// A Redis server, and anyone who can write to it, is outside the fleet's trust: the tag, under a
// key derived from the fleet's secret with the label "tessera redis value v2", covers the
// namespace (length-prefixed), the first 32 header bytes (magic, version, format id, key,
// payload length) and the payload. A value forged without the secret, edited, truncated, moved
// under another key or copied from another namespace (another model, format or tenant domain)
// fails, and is served as a miss. Integers are little-endian.
//
// Thread-safety: a Codec is immutable after Create; Encode/Decode may run concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/hash128.h"
#include "tessera/record_mac.h"
#include "tessera/status.h"
#include "tessera/tier.h"

namespace tessera::redis_value {

inline constexpr uint32_t kMagic = 0x44525354;  // "TSRD"
inline constexpr uint16_t kVersion = 2;         // 1: xxh3 checksum, no authentication
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kMacedHeaderBytes = 32;  // magic, version, format id, key, payload length
inline constexpr size_t kNonceOffset = 32;
inline constexpr size_t kTagOffset = 48;
inline constexpr std::string_view kMacLabel = "tessera redis value v2";
inline constexpr size_t kMinSecretBytes = 16;
// A Redis string holds at most 512 MiB (proto-max-bulk-len), header included.
inline constexpr uint64_t kMaxPayloadLimit = (512ull << 20) - kHeaderBytes;
inline constexpr uint64_t kDefaultMaxPayloadBytes = 64ull << 20;

namespace detail {

inline void Put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint64_t Get(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace detail

// Checks the options both tiers share; errors name the field.
inline Status ValidateOptions(std::span<const std::byte> secret, uint64_t max_value_bytes) {
  if (secret.size() < kMinSecretBytes) {
    return InvalidArgument("secret", "the fleet secret needs at least " + std::to_string(kMinSecretBytes) +
                                         " bytes (got " + std::to_string(secret.size()) + ")");
  }
  if (max_value_bytes == 0 || max_value_bytes > kMaxPayloadLimit) {
    return InvalidArgument("max_value_bytes", "must be in [1, " + std::to_string(kMaxPayloadLimit) +
                                                  "] (a Redis string holds at most 512 MiB), got " +
                                                  std::to_string(max_value_bytes));
  }
  return Status::Ok();
}

class Codec {
 public:
  // Errors: as ValidateOptions; kInternal on "secret" when the crypto library lacks the MAC.
  static Result<Codec> Create(std::span<const std::byte> secret, std::string_view key_namespace,
                              uint64_t max_payload_bytes) {
    TESSERA_RETURN_IF_ERROR(ValidateOptions(secret, max_payload_bytes));
    Result<RecordMac> mac = RecordMac::Create(secret, kMacLabel);
    if (!mac.ok()) return Status(mac.status().code(), "secret", mac.status().message());
    std::vector<std::byte> context(8 + key_namespace.size());
    detail::Put64(context.data(), key_namespace.size());
    if (!key_namespace.empty()) std::memcpy(context.data() + 8, key_namespace.data(), key_namespace.size());
    return Codec(std::move(mac).value(), std::move(context), max_payload_bytes);
  }

  uint64_t max_payload_bytes() const { return max_payload_; }
  // The longest value a server may send back: what the reply bound is derived from.
  uint64_t max_value_bytes() const { return kHeaderBytes + max_payload_; }

  // The stored value of `r`; nullopt when its payload is over max_payload_bytes().
  std::optional<std::string> Encode(const TierRecord& r) const {
    if (r.payload.size() > max_payload_) return std::nullopt;
    std::string v(kHeaderBytes + r.payload.size(), '\0');
    std::byte* h = reinterpret_cast<std::byte*>(v.data());
    detail::Put32(h, kMagic);
    detail::Put16(h + 4, kVersion);
    detail::Put16(h + 6, r.format_id);
    detail::Put64(h + 8, r.key.lo);
    detail::Put64(h + 16, r.key.hi);
    detail::Put64(h + 24, r.payload.size());
    const RecordMac::Nonce nonce = RecordMac::RandomNonce();
    std::memcpy(h + kNonceOffset, nonce.data(), nonce.size());
    if (!r.payload.empty()) std::memcpy(h + kHeaderBytes, r.payload.data(), r.payload.size());
    const RecordMac::Tag tag = mac_.Compute(
        nonce, {context_, std::span<const std::byte>(h, kMacedHeaderBytes), std::span<const std::byte>(r.payload)});
    std::memcpy(h + kTagOffset, tag.data(), tag.size());
    return v;
  }

  // The record stored under `key` if `value` verifies (magic, version, key, length, bound and
  // tag); nullopt otherwise. Never returns bytes that did not verify.
  std::optional<TierRecord> Decode(const Hash128& key, std::string_view value) const {
    if (value.size() < kHeaderBytes) return std::nullopt;
    const std::byte* h = reinterpret_cast<const std::byte*>(value.data());
    const uint64_t payload_len = value.size() - kHeaderBytes;
    bool ok = detail::Get(h, 4) == kMagic && detail::Get(h + 4, 2) == kVersion && detail::Get(h + 8, 8) == key.lo &&
              detail::Get(h + 16, 8) == key.hi && detail::Get(h + 24, 8) == payload_len && payload_len <= max_payload_;
    if (!ok) return std::nullopt;
    RecordMac::Nonce nonce;
    RecordMac::Tag tag;
    std::memcpy(nonce.data(), h + kNonceOffset, nonce.size());
    std::memcpy(tag.data(), h + kTagOffset, tag.size());
    std::span<const std::byte> payload(h + kHeaderBytes, payload_len);
    if (!mac_.Verify(nonce, {context_, std::span<const std::byte>(h, kMacedHeaderBytes), payload}, tag)) {
      return std::nullopt;
    }
    return TierRecord{key, static_cast<uint16_t>(detail::Get(h + 6, 2)),
                      std::vector<std::byte>(payload.begin(), payload.end())};
  }

 private:
  Codec(RecordMac mac, std::vector<std::byte> context, uint64_t max_payload)
      : mac_(std::move(mac)), context_(std::move(context)), max_payload_(max_payload) {}

  RecordMac mac_;
  std::vector<std::byte> context_;  // the namespace, length-prefixed: bound into every tag
  uint64_t max_payload_;
};

}  // namespace tessera::redis_value
