#include "tessera/hash128.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace tessera {
namespace {

TEST(Hash128, HexIsHighWordFirst) {
  EXPECT_EQ((Hash128{0x1, 0x2}).Hex(), "00000000000000020000000000000001");
  EXPECT_EQ((Hash128{0xfedcba9876543210ULL, 0x0123456789abcdefULL}).Hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(Hash128{}.Hex().size(), 32u);
}

TEST(Hash128, EqualOnlyWhenBothWordsAre) {
  EXPECT_EQ((Hash128{1, 2}), (Hash128{1, 2}));
  EXPECT_NE((Hash128{1, 2}), (Hash128{2, 1}));
  EXPECT_NE((Hash128{1, 2}), (Hash128{1, 3}));
}

TEST(Hash128, HasherSeparatesWords) {
  Hash128Hasher h;
  EXPECT_NE(h({1, 0}), h({0, 1}));
  EXPECT_EQ(h({3, 4}), h({3, 4}));
}

TEST(Hash128, KeysAnUnorderedSet) {
  std::unordered_set<Hash128, Hash128Hasher> keys;
  for (uint64_t i = 0; i < 100; ++i) keys.insert(Hash128{i, i * 7});
  keys.insert(Hash128{5, 35});  // already there
  EXPECT_EQ(keys.size(), 100u);
  EXPECT_EQ(keys.count(Hash128{7, 49}), 1u);
  EXPECT_EQ(keys.count(Hash128{49, 7}), 0u);
}

}  // namespace
}  // namespace tessera
