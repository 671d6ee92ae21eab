#include "tessera/record_mac.h"

#include <gtest/gtest.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace tessera {
namespace {

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

RecordMac Make(const std::string& secret, const std::string& label = "disk-record") {
  Result<RecordMac> mac = RecordMac::Create(Bytes(secret), label);
  // A RecordMac has no empty state to return: a failure here ends the program (the failure
  // printed first) rather than dereference an error.
  if (!mac.ok()) {
    ADD_FAILURE() << mac.status().ToString();
    std::abort();
  }
  return *mac;
}

// OpenSSL's EVP_MAC directly (not RecordMac): `algorithm` ("HMAC" with SHA-256, or "POLY1305")
// of `data` under `key`.
std::vector<unsigned char> EvpMac(const char* algorithm, const std::vector<unsigned char>& key,
                                  const std::vector<unsigned char>& data) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, algorithm, nullptr);
  EXPECT_NE(mac, nullptr) << algorithm;
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM hmac_params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                              OSSL_PARAM_construct_end()};
  const bool hmac = std::string(algorithm) == "HMAC";
  std::vector<unsigned char> out(hmac ? 32 : 16);
  size_t len = 0;
  const bool ok = ctx != nullptr && EVP_MAC_init(ctx, key.data(), key.size(), hmac ? hmac_params : nullptr) == 1 &&
                  EVP_MAC_update(ctx, data.data(), data.size()) == 1 &&
                  EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == out.size();
  EXPECT_TRUE(ok) << algorithm;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return out;
}

std::vector<unsigned char> Uchars(const std::string& s) { return {s.begin(), s.end()}; }

// Known answer: the construction of record_mac.h rebuilt from OpenSSL's primitives, and the same
// tag from OpenSSL's command line (OpenSSL 3.0.19):
//   secret=$(printf 0123456789abcdef0123456789abcdef | xxd -p -c 64)
//   mk=$(printf 'tessera disk record v2' | openssl mac -digest SHA256 -macopt hexkey:$secret HMAC)
//   nonce() { printf 000102030405060708090a0b0c0d0e0f | xxd -r -p; }
//   otk=$(nonce | openssl mac -digest SHA256 -macopt hexkey:$mk HMAC)
//   printf 'tessera known-answer record' | openssl mac -macopt hexkey:$otk POLY1305
//   -> 821964CCAC8F24BB60E86DA6D96CA934
TEST(RecordMac, KnownAnswerFromOpenSsl) {
  const std::string secret = "0123456789abcdef0123456789abcdef", label = "tessera disk record v2";
  RecordMac::Nonce nonce{};
  std::vector<unsigned char> nonce_bytes(nonce.size());
  for (size_t i = 0; i < nonce.size(); ++i) {
    nonce[i] = static_cast<std::byte>(i);
    nonce_bytes[i] = static_cast<unsigned char>(i);
  }
  const std::vector<unsigned char> mac_key = EvpMac("HMAC", Uchars(secret), Uchars(label));
  const std::vector<unsigned char> one_time = EvpMac("HMAC", mac_key, nonce_bytes);
  const std::vector<unsigned char> expected = EvpMac("POLY1305", one_time, Uchars("tessera known-answer record"));
  const std::vector<unsigned char> from_cli = {0x82, 0x19, 0x64, 0xCC, 0xAC, 0x8F, 0x24, 0xBB,
                                               0x60, 0xE8, 0x6D, 0xA6, 0xD9, 0x6C, 0xA9, 0x34};
  EXPECT_EQ(expected, from_cli);

  RecordMac mac = Make(secret, label);
  std::vector<std::byte> head = Bytes("tessera "), tail = Bytes("known-answer record");
  const RecordMac::Tag tag = mac.Compute(nonce, {head, tail});  // parts: one message
  EXPECT_EQ(std::vector<unsigned char>(reinterpret_cast<const unsigned char*>(tag.data()),
                                       reinterpret_cast<const unsigned char*>(tag.data()) + tag.size()),
            from_cli);
  EXPECT_TRUE(mac.Verify(nonce, {Bytes("tessera known-answer record")}, tag));
}

// Each part is fed to Poly1305 as its multiple of 128 bytes, then the rest
// (docs/adr/0047-disk-tier-tags-at-full-speed.md): the tag stays the construction's tag over the
// whole message, computed here by OpenSSL in one update, for lengths of every kind of remainder
// (none, under 64, 64..127) and whole blocks, in parts split as the disk tier splits them (48
// identity bytes, then the payload); Verify and a Verifier fed odd-sized pieces agree. (So tags
// written by earlier versions, which fed each part in one update, still verify.)
TEST(RecordMac, LongInputsGiveTheTagOfTheWholeMessage) {
  const std::string secret = "0123456789abcdef0123456789abcdef", label = "tessera disk record v2";
  RecordMac mac = Make(secret, label);
  const RecordMac::Nonce nonce = RecordMac::RandomNonce();
  const std::vector<unsigned char> nonce_bytes(reinterpret_cast<const unsigned char*>(nonce.data()),
                                               reinterpret_cast<const unsigned char*>(nonce.data()) + nonce.size());
  const std::vector<unsigned char> one_time =
      EvpMac("HMAC", EvpMac("HMAC", Uchars(secret), Uchars(label)), nonce_bytes);
  for (size_t n : {size_t{49}, size_t{176}, size_t{191}, size_t{65535}, size_t{65536}, size_t{3} * 65536 + 17,
                   size_t{1430208}, size_t{2561024}}) {
    SCOPED_TRACE(n);
    std::vector<unsigned char> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
    const std::vector<unsigned char> expected = EvpMac("POLY1305", one_time, data);
    const std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data.data()), n);
    const size_t cut = std::min<size_t>(n, 48);  // a header-sized first part, as the disk tier's
    const RecordMac::Tag tag = mac.Compute(nonce, {all.first(cut), all.subspan(cut)});
    EXPECT_EQ(std::vector<unsigned char>(reinterpret_cast<const unsigned char*>(tag.data()),
                                         reinterpret_cast<const unsigned char*>(tag.data()) + tag.size()),
              expected);
    EXPECT_TRUE(mac.Verify(nonce, {all}, tag));
    RecordMac::Verifier v = mac.Begin(nonce);
    for (size_t off = 0; off < n; off += 100'003) v.Update(all.subspan(off, std::min<size_t>(100'003, n - off)));
    EXPECT_TRUE(v.Matches(tag));
    std::vector<unsigned char> changed = data;
    changed[n - 1] ^= 1;  // the last byte counts, in the rest or in the multiple of 128
    EXPECT_FALSE(mac.Verify(nonce, {std::as_bytes(std::span(changed))}, tag));
  }
}

TEST(RecordMac, TagVerifiesAndAnyChangeFails) {
  RecordMac mac = Make("0123456789abcdef0123456789abcdef");
  const RecordMac::Nonce nonce = RecordMac::RandomNonce();
  std::vector<std::byte> header = Bytes("header"), payload = Bytes(std::string(10000, 'x'));
  const RecordMac::Tag tag = mac.Compute(nonce, {header, payload});
  EXPECT_TRUE(mac.Verify(nonce, {header, payload}, tag));
  payload[4321] ^= std::byte{1};
  EXPECT_FALSE(mac.Verify(nonce, {header, payload}, tag));
  payload[4321] ^= std::byte{1};
  RecordMac::Nonce other = nonce;
  other[0] ^= std::byte{1};
  EXPECT_FALSE(mac.Verify(other, {header, payload}, tag));
  RecordMac::Tag bad = tag;
  bad[15] ^= std::byte{0x80};
  EXPECT_FALSE(mac.Verify(nonce, {header, payload}, bad));
}

TEST(RecordMac, KeyAndLabelSeparateTags) {
  const RecordMac::Nonce nonce = RecordMac::RandomNonce();
  std::vector<std::byte> data = Bytes("the same record");
  const RecordMac::Tag tag = Make("0123456789abcdef0123456789abcdef").Compute(nonce, {data});
  EXPECT_FALSE(Make("0123456789abcdef0123456789abcdeF").Verify(nonce, {data}, tag));
  EXPECT_FALSE(Make("0123456789abcdef0123456789abcdef", "redis-value").Verify(nonce, {data}, tag));
  EXPECT_TRUE(Make("0123456789abcdef0123456789abcdef").Verify(nonce, {data}, tag));
}

TEST(RecordMac, PartsAreConcatenated) {
  RecordMac mac = Make("0123456789abcdef");
  const RecordMac::Nonce nonce = RecordMac::RandomNonce();
  std::vector<std::byte> ab = Bytes("ab"), a = Bytes("a"), b = Bytes("b");
  EXPECT_TRUE(mac.Verify(nonce, {a, b}, mac.Compute(nonce, {ab})));
}

// A Verifier fed the bytes in pieces (a disk payload read chunk by chunk) matches the tag of the
// whole, and fails for one changed byte, another nonce or a piece left out.
TEST(RecordMac, VerifierOverPiecesMatchesTheWholeTag) {
  RecordMac mac = Make("0123456789abcdef");
  const RecordMac::Nonce nonce = RecordMac::RandomNonce();
  std::vector<std::byte> data(1000003);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 % 251);
  const RecordMac::Tag tag = mac.Compute(nonce, {data});
  auto check = [&](const std::vector<std::byte>& bytes, const RecordMac::Nonce& n, size_t skip_piece) {
    RecordMac::Verifier v = mac.Begin(n);
    size_t piece = 0;
    for (size_t off = 0; off < bytes.size(); off += 262144, ++piece) {
      if (piece != skip_piece) v.Update(std::span(bytes).subspan(off, std::min<size_t>(262144, bytes.size() - off)));
    }
    return v.Matches(tag);
  };
  EXPECT_TRUE(check(data, nonce, SIZE_MAX));
  std::vector<std::byte> flipped = data;
  flipped[999999] ^= std::byte{4};
  EXPECT_FALSE(check(flipped, nonce, SIZE_MAX));
  EXPECT_FALSE(check(data, RecordMac::RandomNonce(), SIZE_MAX));
  EXPECT_FALSE(check(data, nonce, 2));
}

TEST(RecordMac, NoncesDiffer) { EXPECT_NE(RecordMac::RandomNonce(), RecordMac::RandomNonce()); }

TEST(RecordMac, ShortSecretIsRefused) {
  Result<RecordMac> mac = RecordMac::Create(Bytes("short"), "x");
  ASSERT_FALSE(mac.ok());
  EXPECT_EQ(mac.status().field(), "mac-key");
}

}  // namespace
}  // namespace tessera
