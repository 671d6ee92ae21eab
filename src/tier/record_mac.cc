#include "tessera/record_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <bit>
#include <random>

namespace tessera {

struct RecordMac::Algorithms {
  EVP_MAC* hmac = nullptr;
  EVP_MAC* poly1305 = nullptr;
  ~Algorithms() {
    EVP_MAC_free(hmac);
    EVP_MAC_free(poly1305);
  }
};

namespace {

bool HmacSha256(EVP_MAC* hmac, std::span<const std::byte> key, std::span<const std::byte> data,
                std::array<std::byte, 32>* out) {
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
  if (ctx == nullptr) return false;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t len = 0;
  bool ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1 &&
            EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out->data()), &len, out->size()) == 1 &&
            len == out->size();
  EVP_MAC_CTX_free(ctx);
  return ok;
}

// OpenSSL 3.0's Poly1305 (its AVX-512 IFMA code, which the CI machine's CPU takes) runs a whole
// update at about half speed when the update's length is 64..127 bytes past a multiple of 128:
// 5.7 GiB/s against 11.0-11.4 GiB/s for every other residue, measured over ~1.4 MB
// (docs/adr/0047-disk-tier-tags-at-full-speed.md). A DeepSeek-V4-Pro block span (1,430,208 B)
// is such a length. So an update is split into its multiple of 128 bytes and the rest; the tag
// is the same (Poly1305 is defined over the concatenation).
bool UpdateAligned(EVP_MAC_CTX* ctx, std::span<const std::byte> bytes) {
  const size_t bulk = bytes.size() & ~size_t{127};
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  return (bulk == 0 || EVP_MAC_update(ctx, p, bulk) == 1) &&
         (bulk == bytes.size() || EVP_MAC_update(ctx, p + bulk, bytes.size() - bulk) == 1);
}

}  // namespace

RecordMac::~RecordMac() { OPENSSL_cleanse(key_.data(), key_.size()); }

Result<RecordMac> RecordMac::Create(std::span<const std::byte> secret, std::string_view label) {
  if (secret.size() < 16) {
    return InvalidArgument("mac-key", "needs at least 16 bytes (got " + std::to_string(secret.size()) + ")");
  }
  auto algorithms = std::make_shared<Algorithms>();
  algorithms->hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  algorithms->poly1305 = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
  if (algorithms->hmac == nullptr || algorithms->poly1305 == nullptr) {
    return Internal("mac-key", "the crypto library provides no HMAC or Poly1305");
  }
  RecordMac mac;
  if (!HmacSha256(algorithms->hmac, secret, std::as_bytes(std::span(label.data(), label.size())), &mac.key_)) {
    return Internal("mac-key", "cannot derive the record mac key");
  }
  mac.algorithms_ = std::move(algorithms);
  return mac;
}

RecordMac::Nonce RecordMac::RandomNonce() {
  Nonce n{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    // The OS CSPRNG failed (it does not on Linux with getrandom); fall back to random_device,
    // which reads the same source.
    std::random_device rd;
    for (std::byte& b : n) b = static_cast<std::byte>(rd());
  }
  return n;
}

bool RecordMac::ComputeInto(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts,
                            Tag* tag) const {
  std::array<std::byte, 32> one_time{};
  EVP_MAC_CTX* ctx = nullptr;
  size_t len = 0;
  bool ok = HmacSha256(algorithms_->hmac, key_, nonce, &one_time) &&
            (ctx = EVP_MAC_CTX_new(algorithms_->poly1305)) != nullptr &&
            EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(one_time.data()), one_time.size(), nullptr) == 1;
  for (std::span<const std::byte> p : parts) ok = ok && UpdateAligned(ctx, p);
  ok = ok && EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(tag->data()), &len, tag->size()) == 1 &&
       len == tag->size();
  EVP_MAC_CTX_free(ctx);
  OPENSSL_cleanse(one_time.data(), one_time.size());
  return ok;
}

RecordMac::Verifier RecordMac::Begin(const Nonce& nonce) const {
  std::array<std::byte, 32> one_time{};
  EVP_MAC_CTX* ctx = nullptr;
  const bool ok =
      HmacSha256(algorithms_->hmac, key_, nonce, &one_time) &&
      (ctx = EVP_MAC_CTX_new(algorithms_->poly1305)) != nullptr &&
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(one_time.data()), one_time.size(), nullptr) == 1;
  OPENSSL_cleanse(one_time.data(), one_time.size());
  if (!ok) {
    EVP_MAC_CTX_free(ctx);
    ctx = nullptr;
  }
  return Verifier(ctx);
}

RecordMac::Verifier::~Verifier() { EVP_MAC_CTX_free(ctx_); }

void RecordMac::Verifier::Update(std::span<const std::byte> bytes) {
  if (ctx_ != nullptr && !UpdateAligned(ctx_, bytes)) {
    EVP_MAC_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

bool RecordMac::Verifier::Matches(const Tag& tag) {
  Tag got{};
  size_t len = 0;
  const bool ok = ctx_ != nullptr &&
                  EVP_MAC_final(ctx_, reinterpret_cast<unsigned char*>(got.data()), &len, got.size()) == 1 &&
                  len == got.size();
  EVP_MAC_CTX_free(ctx_);
  ctx_ = nullptr;
  return ok && CRYPTO_memcmp(got.data(), tag.data(), tag.size()) == 0;
}

RecordMac::Tag RecordMac::Compute(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts) const {
  Tag tag{};
  // A failure (which the crypto library does not report for these sizes) leaves a random tag
  // that verifies nowhere, so a record written then is a miss, never accepted data.
  if (!ComputeInto(nonce, parts, &tag)) tag = std::bit_cast<Tag>(RandomNonce());
  return tag;
}

bool RecordMac::Verify(const Nonce& nonce, std::initializer_list<std::span<const std::byte>> parts,
                       const Tag& tag) const {
  Tag expected{};
  if (!ComputeInto(nonce, parts, &expected)) return false;
  return CRYPTO_memcmp(expected.data(), tag.data(), tag.size()) == 0;
}

}  // namespace tessera
