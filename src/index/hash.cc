#include "tessera/hash.h"

#include <openssl/evp.h>

#include <array>
#include <cassert>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

// State layout and XXH3_generateSecret are in the "static linking only" part of the API.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // runtime choice of SSE2/AVX2/AVX-512 kernels
#endif

namespace tessera {

static_assert(sizeof(XXH3_state_t) <= 640, "enlarge ContentHasher::Stream::xxh_state_");

namespace {

// libxxhash 0.8.1's x86 dispatch runs its AVX2 / AVX-512 kernels and returns with the upper
// halves of the vector registers dirty. The code around it is built for SSE2 (legacy-encoded
// SSE), and SSE instructions on a dirty upper state pay a transition each: measured here, the
// 256-byte copy into a prefix key's buffer and a 280-byte xxh3-128 went from ~35 ns to ~300 ns
// (ADR 0044). vzeroupper after each call clears it (a no-op for the hash values).
bool HasAvx() {
#if defined(__x86_64__)
  static const bool avx = __builtin_cpu_supports("avx");
  return avx;
#else
  return false;
#endif
}

inline void CleanUpperState() {
#if defined(__x86_64__)
  if (HasAvx()) __asm__ volatile("vzeroupper");
#endif
}

}  // namespace

// Owns an EVP_MD_CTX.
struct ContentHasher::Stream::ShaState {
  ShaState() : ctx(EVP_MD_CTX_new()) {}
  ~ShaState() { EVP_MD_CTX_free(ctx); }
  ShaState(const ShaState&) = delete;
  ShaState& operator=(const ShaState&) = delete;
  EVP_MD_CTX* ctx;
};

Result<HashAlgorithm> ParseHashAlgorithm(std::string_view name) {
  if (name == "xxh3") return HashAlgorithm::kXxh3;
  if (name == "sha256") return HashAlgorithm::kSha256;
  return InvalidArgument("hash", "unknown hash \"" + std::string(name) + "\" (known: xxh3, sha256)");
}

std::string_view HashAlgorithmName(HashAlgorithm a) { return a == HashAlgorithm::kXxh3 ? "xxh3" : "sha256"; }

Result<ContentHasher> ContentHasher::Create(HashAlgorithm algorithm, uint32_t bits, uint64_t key_seed) {
  std::array<uint64_t, 4> seed{};
  if (key_seed == 0) {
    std::random_device rd;
    for (uint64_t& s : seed) s = (uint64_t{rd()} << 32) ^ rd();
  } else {
    std::mt19937_64 gen(key_seed);
    for (uint64_t& s : seed) s = gen();
  }
  return CreateWithKey(algorithm, bits, std::as_bytes(std::span(seed)));
}

Result<ContentHasher> ContentHasher::CreateWithKey(HashAlgorithm algorithm, uint32_t bits,
                                                   std::span<const std::byte> key) {
  if (bits == 0 || bits > 128)
    return InvalidArgument("hash-bits", "must be in 1..128 (got " + std::to_string(bits) + ")");
  if (key.size() < 16) {
    return InvalidArgument("hash-key", "needs at least 16 bytes (got " + std::to_string(key.size()) + ")");
  }
  ContentHasher h;
  h.algorithm_ = algorithm;
  h.bits_ = bits;
  if (XXH3_generateSecret(h.secret_.data(), h.secret_.size(), key.data(), key.size()) != XXH_OK) {
    return Internal("hash", "cannot derive the xxh3 secret");
  }
  // Caller keys' secret: from the same key with a label of their own (CallerKey).
  constexpr std::string_view kCallerLabel = "tessera caller keys v1";
  std::vector<std::byte> labelled(key.begin(), key.end());
  for (char c : kCallerLabel) labelled.push_back(static_cast<std::byte>(c));
  if (XXH3_generateSecret(h.caller_secret_.data(), h.caller_secret_.size(), labelled.data(), labelled.size()) !=
      XXH_OK) {
    return Internal("hash", "cannot derive the xxh3 secret");
  }
  // The SHA-256 key: the caller's key, or its SHA-256 when longer than 32 bytes.
  if (key.size() <= h.sha_key_.size()) {
    std::memcpy(h.sha_key_.data(), key.data(), key.size());
  } else {
    unsigned int len = 0;
    unsigned char md[EVP_MAX_MD_SIZE];
    EVP_Digest(key.data(), key.size(), md, &len, EVP_sha256(), nullptr);
    std::memcpy(h.sha_key_.data(), md, h.sha_key_.size());
  }
  return h;
}

ContentHasher::Stream::Stream(const ContentHasher* h) : hasher_(h) {
  if (h->algorithm_ == HashAlgorithm::kXxh3) {
    xxh_state_ = std::make_unique<std::array<std::byte, 640>>();
    auto* st = reinterpret_cast<XXH3_state_t*>(xxh_state_->data());
    XXH3_INITSTATE(st);
    XXH3_128bits_reset_withSecret(st, h->secret_.data(), h->secret_.size());
    CleanUpperState();
  } else {
    sha_ = std::make_unique<ShaState>();
    EVP_DigestInit_ex(sha_->ctx, EVP_sha256(), nullptr);
    EVP_DigestUpdate(sha_->ctx, h->sha_key_.data(), h->sha_key_.size());
  }
}

ContentHasher::Stream::Stream(Stream&& o) noexcept = default;

ContentHasher::Stream::~Stream() = default;

void ContentHasher::Stream::Update(std::span<const std::byte> bytes) {
  if (xxh_state_) {
    XXH3_128bits_update(reinterpret_cast<XXH3_state_t*>(xxh_state_->data()), bytes.data(), bytes.size());
    CleanUpperState();
  } else {
    EVP_DigestUpdate(sha_->ctx, bytes.data(), bytes.size());
  }
}

Hash128 ContentHasher::Stream::Digest() {
  Hash128 out;
  if (xxh_state_) {
    XXH128_hash_t d = XXH3_128bits_digest(reinterpret_cast<XXH3_state_t*>(xxh_state_->data()));
    CleanUpperState();
    out = {d.low64, d.high64};
  } else {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(sha_->ctx, md, &len);
    std::memcpy(&out.lo, md, 8);
    std::memcpy(&out.hi, md + 8, 8);
  }
  return hasher_->Truncate(out);
}

Hash128 ContentHasher::Truncate(Hash128 h) const {
  if (bits_ >= 128) return h;
  if (bits_ <= 64) {
    h.hi = 0;
    if (bits_ < 64) h.lo &= (1ULL << bits_) - 1;
  } else {
    h.hi &= (1ULL << (bits_ - 64)) - 1;
  }
  return h;
}

Hash128 ContentHasher::PrefixKey(const Hash128& parent, std::span<const uint32_t> tokens, uint64_t extra) const {
  // One call over (parent, extra, tokens) laid end to end: the same key as streaming the three
  // parts, without the streaming state's setup (a block of up to 256 tokens fits the buffer).
  constexpr size_t kHead = sizeof(Hash128) + sizeof(uint64_t);
  if (tokens.size() <= 256) {
    std::array<std::byte, kHead + 256 * sizeof(uint32_t)> buf;
    std::memcpy(buf.data(), &parent, sizeof parent);
    std::memcpy(buf.data() + sizeof parent, &extra, sizeof extra);
    std::memcpy(buf.data() + kHead, tokens.data(), tokens.size_bytes());
    const XXH128_hash_t d =
        XXH3_128bits_withSecret(buf.data(), kHead + tokens.size_bytes(), secret_.data(), secret_.size());
    CleanUpperState();
    return {d.low64, d.high64};
  }
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_128bits_reset_withSecret(&st, secret_.data(), secret_.size());
  XXH3_128bits_update(&st, &parent, sizeof parent);
  XXH3_128bits_update(&st, &extra, sizeof extra);
  XXH3_128bits_update(&st, tokens.data(), tokens.size_bytes());
  XXH128_hash_t d = XXH3_128bits_digest(&st);
  CleanUpperState();
  return {d.low64, d.high64};
}

Hash128 ContentHasher::PrefixKey(const Hash128& parent, std::span<const uint32_t> head, std::span<const uint32_t> tail,
                                 uint64_t extra) const {
  constexpr size_t kHead = sizeof(Hash128) + sizeof(uint64_t);
  if (head.size() + tail.size() > 256) {
    std::vector<uint32_t> joined(head.begin(), head.end());
    joined.insert(joined.end(), tail.begin(), tail.end());
    return PrefixKey(parent, joined, extra);
  }
  // The buffer PrefixKey(parent, tokens, extra) hashes, byte for byte.
  std::array<std::byte, kHead + 256 * sizeof(uint32_t)> buf;
  std::memcpy(buf.data(), &parent, sizeof parent);
  std::memcpy(buf.data() + sizeof parent, &extra, sizeof extra);
  if (!head.empty()) std::memcpy(buf.data() + kHead, head.data(), head.size_bytes());
  if (!tail.empty()) std::memcpy(buf.data() + kHead + head.size_bytes(), tail.data(), tail.size_bytes());
  const size_t n = kHead + head.size_bytes() + tail.size_bytes();
  const XXH128_hash_t d = XXH3_128bits_withSecret(buf.data(), n, secret_.data(), secret_.size());
  CleanUpperState();
  return {d.low64, d.high64};
}

Hash128 ContentHasher::CallerKey(const Hash128& parent, std::span<const std::byte, 32> caller, uint64_t extra) const {
  constexpr size_t kHead = sizeof(Hash128) + sizeof(uint64_t);
  std::array<std::byte, kHead + 32> buf;
  std::memcpy(buf.data(), &parent, sizeof parent);
  std::memcpy(buf.data() + sizeof parent, &extra, sizeof extra);
  std::memcpy(buf.data() + kHead, caller.data(), caller.size());
  const XXH128_hash_t d = XXH3_128bits_withSecret(buf.data(), buf.size(), caller_secret_.data(), caller_secret_.size());
  CleanUpperState();
  return Truncate({d.low64, d.high64});
}

}  // namespace tessera
