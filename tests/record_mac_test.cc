#include "tessera/record_mac.h"

#include <gtest/gtest.h>

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
  EXPECT_TRUE(mac.ok()) << mac.status().ToString();
  return *mac;
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

TEST(RecordMac, NoncesDiffer) { EXPECT_NE(RecordMac::RandomNonce(), RecordMac::RandomNonce()); }

TEST(RecordMac, ShortSecretIsRefused) {
  Result<RecordMac> mac = RecordMac::Create(Bytes("short"), "x");
  ASSERT_FALSE(mac.ok());
  EXPECT_EQ(mac.status().field(), "mac-key");
}

}  // namespace
}  // namespace tessera
