#include "tessera/host_tier.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t v) { return std::vector<std::byte>(n, std::byte{v}); }
Hash128 K(uint64_t i) { return Hash128{i, ~i}; }

TEST(HostTier, PutGetAndLruEviction) {
  HostTier t(3000);
  std::vector<Hash128> evicted;
  t.SetEvictionListener([&](const Hash128& k, uint16_t, std::span<const std::byte> p) {
    evicted.push_back(k);
    EXPECT_EQ(p.size(), 1000u);
  });
  ASSERT_TRUE(t.Put(K(1), 3, Bytes(1000, 1)).ok());
  ASSERT_TRUE(t.Put(K(2), 3, Bytes(1000, 2)).ok());
  ASSERT_TRUE(t.Put(K(3), 3, Bytes(1000, 3)).ok());
  uint16_t fmt = 0;
  EXPECT_EQ(*t.Get(K(1), &fmt), Bytes(1000, 1));  // 1 becomes most recent
  EXPECT_EQ(fmt, 3);
  ASSERT_TRUE(t.Put(K(4), 3, Bytes(1000, 4)).ok());  // evicts 2, the least recent
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], K(2));
  EXPECT_FALSE(t.Contains(K(2)));
  EXPECT_EQ(t.Get(K(2)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(t.stats().bytes, 3000u);
  EXPECT_EQ(t.stats().evictions, 1u);
}

TEST(HostTier, ReplacingAKeyKeepsTheByteCount) {
  HostTier t(3000);
  ASSERT_TRUE(t.Put(K(1), 0, Bytes(1000, 1)).ok());
  ASSERT_TRUE(t.Put(K(1), 0, Bytes(500, 9)).ok());
  EXPECT_EQ(t.stats().bytes, 500u);
  EXPECT_EQ(*t.Get(K(1)), Bytes(500, 9));
}

TEST(HostTier, CorruptedRecordIsNeverReturned) {
  HostTier t(3000);
  ASSERT_TRUE(t.Put(K(1), 0, Bytes(1000, 1)).ok());
  t.MutableBytesForTest(K(1))[17] = std::byte{0x42};
  EXPECT_EQ(t.Get(K(1)).status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(t.Contains(K(1)));
  EXPECT_EQ(t.stats().quarantined, 1u);
  EXPECT_EQ(t.stats().bytes, 0u);
}

TEST(HostTier, RecordLargerThanCapacityIsRefused) {
  HostTier t(100);
  Status st = t.Put(K(1), 0, Bytes(101, 1));
  EXPECT_EQ(st.code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(st.field(), "capacity");
  EXPECT_EQ(t.stats().refused, 1u);
}

}  // namespace
}  // namespace tessera
