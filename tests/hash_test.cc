#include "tessera/hash.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <random>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <set>
#include <vector>

namespace tessera {
namespace {

ContentHasher MustHasher(HashAlgorithm a, uint32_t bits, uint64_t seed) {
  Result<ContentHasher> h = ContentHasher::Create(a, bits, seed);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return std::move(h).value();
}

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

Hash128 DigestOf(const ContentHasher& h, std::span<const std::byte> bytes) {
  ContentHasher::Stream s = h.Begin();
  s.Update(bytes);
  return s.Digest();
}

constexpr HashAlgorithm kBoth[] = {HashAlgorithm::kXxh3, HashAlgorithm::kSha256};

// --- Streams --------------------------------------------------------------------------------

TEST(ContentHasher, SameSeedGivesSameDigest) {
  std::vector<std::byte> data = RandomBytes(4096, 1);
  for (HashAlgorithm a : kBoth) {
    ContentHasher h1 = MustHasher(a, 128, 42);
    ContentHasher h2 = MustHasher(a, 128, 42);
    EXPECT_EQ(DigestOf(h1, data), DigestOf(h2, data)) << HashAlgorithmName(a);
    EXPECT_EQ(DigestOf(h1, data), DigestOf(h1, data)) << HashAlgorithmName(a);  // repeatable
    EXPECT_EQ(h1.algorithm(), a);
    EXPECT_EQ(h1.bits(), 128u);
  }
}

TEST(ContentHasher, DifferentSeedsGiveDifferentDigests) {
  std::vector<std::byte> data = RandomBytes(4096, 2);
  for (HashAlgorithm a : kBoth) {
    Hash128 x = DigestOf(MustHasher(a, 128, 42), data);
    Hash128 y = DigestOf(MustHasher(a, 128, 43), data);
    EXPECT_NE(x, y) << HashAlgorithmName(a);
    EXPECT_NE(x.lo, y.lo);
    EXPECT_NE(x.hi, y.hi);
  }
}

TEST(ContentHasher, SeedZeroDrawsARandomKey) {
  std::vector<std::byte> data = RandomBytes(64, 3);
  for (HashAlgorithm a : kBoth) {
    EXPECT_NE(DigestOf(MustHasher(a, 128, 0), data), DigestOf(MustHasher(a, 128, 0), data)) << HashAlgorithmName(a);
  }
}

TEST(ContentHasher, AlgorithmsDiffer) {
  std::vector<std::byte> data = RandomBytes(256, 4);
  EXPECT_NE(DigestOf(MustHasher(HashAlgorithm::kXxh3, 128, 7), data),
            DigestOf(MustHasher(HashAlgorithm::kSha256, 128, 7), data));
}

TEST(ContentHasher, DifferentInputsGiveDifferentDigests) {
  for (HashAlgorithm a : kBoth) {
    ContentHasher h = MustHasher(a, 128, 9);
    std::vector<std::byte> data = RandomBytes(1000, 5);
    Hash128 base = DigestOf(h, data);
    data[500] ^= std::byte{1};  // one bit
    EXPECT_NE(DigestOf(h, data), base) << HashAlgorithmName(a);
    data[500] ^= std::byte{1};
    EXPECT_EQ(DigestOf(h, data), base);
    // A prefix differs from the whole.
    EXPECT_NE(DigestOf(h, std::span<const std::byte>(data).first(999)), base);
  }
}

TEST(ContentHasher, UpdateInPiecesEqualsOneUpdate) {
  std::vector<std::byte> data = RandomBytes(1000, 6);
  for (HashAlgorithm a : kBoth) {
    ContentHasher h = MustHasher(a, 128, 11);
    Hash128 whole = DigestOf(h, data);
    for (size_t cut : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{255}, size_t{256}, size_t{500},
                       size_t{999}, size_t{1000}}) {
      ContentHasher::Stream s = h.Begin();
      s.Update(std::span<const std::byte>(data).first(cut));
      s.Update(std::span<const std::byte>(data).subspan(cut));
      EXPECT_EQ(s.Digest(), whole) << HashAlgorithmName(a) << " cut at " << cut;
    }
    // Byte by byte, through the pointer overload.
    ContentHasher::Stream s = h.Begin();
    for (std::byte b : data) s.Update(&b, 1);
    EXPECT_EQ(s.Digest(), whole) << HashAlgorithmName(a) << " byte by byte";
  }
}

TEST(ContentHasher, MovedStreamKeepsItsState) {
  std::vector<std::byte> data = RandomBytes(300, 7);
  for (HashAlgorithm a : kBoth) {
    ContentHasher h = MustHasher(a, 128, 13);
    ContentHasher::Stream s1 = h.Begin();
    s1.Update(std::span<const std::byte>(data).first(100));
    ContentHasher::Stream s2 = std::move(s1);
    s2.Update(std::span<const std::byte>(data).subspan(100));
    EXPECT_EQ(s2.Digest(), DigestOf(h, data)) << HashAlgorithmName(a);
  }
}

TEST(ContentHasher, Sha256IsKeyed) {
  std::vector<std::byte> data = RandomBytes(128, 8);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ASSERT_EQ(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr), 1);
  Hash128 plain;
  std::memcpy(&plain.lo, md, 8);
  std::memcpy(&plain.hi, md + 8, 8);
  EXPECT_NE(DigestOf(MustHasher(HashAlgorithm::kSha256, 128, 1), data), plain);
}

// --- Truncation -----------------------------------------------------------------------------

TEST(ContentHasher, TruncatesToBits) {
  for (HashAlgorithm a : kBoth) {
    ContentHasher full = MustHasher(a, 128, 21);
    ContentHasher b8 = MustHasher(a, 8, 21);
    ContentHasher b64 = MustHasher(a, 64, 21);
    ContentHasher b100 = MustHasher(a, 100, 21);
    ContentHasher b1 = MustHasher(a, 1, 21);
    std::set<uint64_t> one_bit_values;
    bool hi_above_36_bits_seen = false;
    for (uint32_t i = 0; i < 200; ++i) {
      std::vector<std::byte> data = RandomBytes(40 + i, 100 + i);
      Hash128 f = DigestOf(full, data);
      Hash128 h8 = DigestOf(b8, data);
      EXPECT_EQ(h8.hi, 0u);
      EXPECT_LT(h8.lo, 256u);
      EXPECT_EQ(h8.lo, f.lo & 0xFF);  // truncation of the same keyed hash
      Hash128 h64 = DigestOf(b64, data);
      EXPECT_EQ(h64.hi, 0u);
      EXPECT_EQ(h64.lo, f.lo);
      Hash128 h100 = DigestOf(b100, data);
      EXPECT_LT(h100.hi, 1ULL << 36);
      EXPECT_EQ(h100.lo, f.lo);
      EXPECT_EQ(h100.hi, f.hi & ((1ULL << 36) - 1));
      hi_above_36_bits_seen |= f.hi >= (1ULL << 36);
      Hash128 h1 = DigestOf(b1, data);
      EXPECT_EQ(h1.hi, 0u);
      EXPECT_LT(h1.lo, 2u);
      one_bit_values.insert(h1.lo);
    }
    EXPECT_TRUE(hi_above_36_bits_seen);  // the 100-bit check was not vacuous
    EXPECT_EQ(one_bit_values.size(), 2u) << HashAlgorithmName(a);
  }
}

TEST(ContentHasher, BitsOutsideOneTo128AreRejectedOnHashBits) {
  for (HashAlgorithm a : kBoth) {
    for (uint32_t bits : {0u, 129u, 256u}) {
      Result<ContentHasher> h = ContentHasher::Create(a, bits, 1);
      ASSERT_FALSE(h.ok()) << bits;
      EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(h.status().field(), "hash-bits");
    }
    EXPECT_TRUE(ContentHasher::Create(a, 1, 1).ok());
    EXPECT_TRUE(ContentHasher::Create(a, 128, 1).ok());
  }
}

// --- Prefix keys ----------------------------------------------------------------------------

#if defined(__x86_64__)
// XGETBV with ECX = 1 (XINUSE): the state components not in their initial configuration. Bit 2:
// the upper halves of ymm0-15; bit 6: the upper halves of zmm0-15 — what legacy SSE code pays a
// transition for (ADR 0044). zmm16-31 (bit 7) are not SSE's and are left out.
constexpr uint64_t kUpperState = (uint64_t{1} << 2) | (uint64_t{1} << 6);
bool HasXinuse() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(0xD, 1, &a, &b, &c, &d) && (a & (1u << 2)) != 0 && __builtin_cpu_supports("avx");
}
uint64_t Xinuse() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (uint64_t{hi} << 32) | lo;
}

// libxxhash's x86 dispatch returns from its AVX2 / AVX-512 kernels with the vector registers'
// upper halves dirty; the hasher clears them, so the SSE code after a hash does not pay for it.
TEST(ContentHasher, LeavesTheUpperVectorStateClean) {
  if (!HasXinuse()) GTEST_SKIP() << "no AVX or no XGETBV(1) here";
  __asm__ volatile("vzeroupper");
  if ((Xinuse() & kUpperState) != 0) GTEST_SKIP() << "this CPU does not report a cleared upper state";
  ContentHasher h = MustHasher(HashAlgorithm::kXxh3, 128, 7);
  std::vector<uint32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7919);
  const Hash128 parent{3, 4};
  (void)h.PrefixKey(parent, tokens, 1);
  EXPECT_EQ(Xinuse() & kUpperState, 0u) << "after PrefixKey";
  const std::span<const uint32_t> all(tokens);
  (void)h.PrefixKey(parent, all.first(63), all.subspan(63), 1);
  EXPECT_EQ(Xinuse() & kUpperState, 0u) << "after the two-part PrefixKey";
  std::vector<std::byte> bytes(1 << 14, std::byte{5});
  ContentHasher::Stream s = h.Begin();
  s.Update(bytes);
  EXPECT_EQ(Xinuse() & kUpperState, 0u) << "after Stream::Update";
  (void)s.Digest();
  EXPECT_EQ(Xinuse() & kUpperState, 0u) << "after Stream::Digest";
}
#endif

// The two-part form (a span written so far, the tokens completing it) is the key of the joined
// tokens, byte for byte: at every split of a 64-token block, and past the 256-token buffer.
TEST(PrefixKey, TwoPartsGiveTheJoinedKey) {
  ContentHasher h = MustHasher(HashAlgorithm::kXxh3, 128, 7);
  const Hash128 parent{0x1234, 0x5678};
  for (size_t n : {size_t{64}, size_t{256}, size_t{300}}) {
    std::vector<uint32_t> tokens(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
    const Hash128 joined = h.PrefixKey(parent, tokens, 9);
    for (size_t split = 0; split <= n; ++split) {
      const std::span<const uint32_t> all(tokens);
      EXPECT_EQ(h.PrefixKey(parent, all.first(split), all.subspan(split), 9), joined) << n << " split " << split;
    }
    EXPECT_NE(h.PrefixKey(parent, std::span<const uint32_t>(tokens).first(n - 1), {}, 9), joined) << n;
  }
}

TEST(PrefixKey, DependsOnParentTokensAndExtra) {
  ContentHasher h = MustHasher(HashAlgorithm::kXxh3, 128, 5);
  const std::vector<uint32_t> tokens = {1, 2, 3, 4};
  const Hash128 root{};
  const Hash128 parent{0x1234, 0x5678};
  Hash128 base = h.PrefixKey(parent, tokens, 7);
  EXPECT_EQ(h.PrefixKey(parent, tokens, 7), base);                             // deterministic
  EXPECT_NE(h.PrefixKey(root, tokens, 7), base);                               // parent
  EXPECT_NE(h.PrefixKey({0x1234, 0x5679}, tokens, 7), base);                   // parent hi
  EXPECT_NE(h.PrefixKey(parent, std::vector<uint32_t>{1, 2, 3, 5}, 7), base);  // last token
  EXPECT_NE(h.PrefixKey(parent, std::vector<uint32_t>{2, 1, 3, 4}, 7), base);  // order
  EXPECT_NE(h.PrefixKey(parent, std::vector<uint32_t>{1, 2, 3}, 7), base);     // length
  EXPECT_NE(h.PrefixKey(parent, tokens, 8), base);                             // extra
  EXPECT_NE(h.PrefixKey(parent, tokens, uint64_t{7} << 32), base);             // extra high half
  // Keyed: another seed gives another key.
  EXPECT_NE(MustHasher(HashAlgorithm::kXxh3, 128, 6).PrefixKey(parent, tokens, 7), base);
}

TEST(PrefixKey, IsFullWidthXxh3WhateverTheContentSettings) {
  const std::vector<uint32_t> tokens = {10, 20, 30};
  const Hash128 parent{1, 2};
  Hash128 base = MustHasher(HashAlgorithm::kXxh3, 128, 77).PrefixKey(parent, tokens, 3);
  EXPECT_EQ(MustHasher(HashAlgorithm::kXxh3, 8, 77).PrefixKey(parent, tokens, 3), base);
  EXPECT_EQ(MustHasher(HashAlgorithm::kSha256, 1, 77).PrefixKey(parent, tokens, 3), base);
  // Full width: over many keys the high word is not truncated away.
  ContentHasher narrow = MustHasher(HashAlgorithm::kXxh3, 1, 77);
  std::set<uint64_t> his;
  for (uint32_t t = 0; t < 50; ++t) his.insert(narrow.PrefixKey(parent, std::vector<uint32_t>{t}, 0).hi);
  EXPECT_EQ(his.size(), 50u);
}

// --- Names ----------------------------------------------------------------------------------

TEST(HashAlgorithm, ParseAndName) {
  EXPECT_EQ(*ParseHashAlgorithm("xxh3"), HashAlgorithm::kXxh3);
  EXPECT_EQ(*ParseHashAlgorithm("sha256"), HashAlgorithm::kSha256);
  for (HashAlgorithm a : kBoth) EXPECT_EQ(*ParseHashAlgorithm(HashAlgorithmName(a)), a);
  for (const char* bad : {"md5", "", "XXH3", "sha-256"}) {
    Result<HashAlgorithm> r = ParseHashAlgorithm(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().field(), "hash");
  }
}

}  // namespace
}  // namespace tessera
