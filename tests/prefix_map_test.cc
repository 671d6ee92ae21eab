#include "tessera/prefix_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace tessera {
namespace {

// Against std::unordered_map under random inserts, erases and lookups, with keys that crowd
// a few home slots (long probe runs, wrap-around at the end of the table) and keys spread out.
TEST(PrefixMap, AgreesWithAnOrdinaryMapUnderChurn) {
  for (bool crowded : {true, false}) {
    constexpr size_t kMax = 500;
    PrefixMap m(kMax);
    std::unordered_map<Hash128, uint32_t, Hash128Hasher> model;
    std::mt19937_64 g(crowded ? 7 : 8);
    // Crowded: homes in the last 4 slots of the table, so runs wrap around to slot 0, and keys
    // whose fingerprints (low 32 bits) are equal, so the full key decides.
    auto key = [&](uint64_t i) {
      const uint64_t lo = crowded ? (m.slot_count() - 1 - i % 4) | (i << 32) : i * 0x9e3779b97f4a7c15ULL;
      return Hash128{lo, i};
    };
    // Block i carries key(i).
    auto key_of = [&](BlockId b) { return key(b.value); };
    for (int step = 0; step < 20000; ++step) {
      const uint64_t i = g() % 800;
      const Hash128 k = key(i);
      switch (g() % 3) {
        case 0:
          if (model.size() < kMax || model.count(k) > 0) {
            auto [entry, inserted] = m.TryEmplace(k, BlockId{static_cast<uint32_t>(i)}, key_of);
            EXPECT_EQ(inserted, model.count(k) == 0);
            EXPECT_EQ(entry->value, static_cast<uint32_t>(i));
            model.emplace(k, static_cast<uint32_t>(i));
          }
          break;
        case 1:
          m.Erase(k, BlockId{static_cast<uint32_t>(i)});
          model.erase(k);
          break;
        default: {
          BlockId* found = m.Find(k, key_of);
          ASSERT_EQ(found != nullptr, model.count(k) > 0) << step;
          if (found != nullptr) {
            EXPECT_EQ(found->value, model[k]);
          }
        }
      }
      ASSERT_EQ(m.size(), model.size());
    }
    for (const auto& [k, v] : model) {
      ASSERT_NE(m.Find(k, key_of), nullptr);
      EXPECT_EQ(m.Find(k, key_of)->value, v);
    }
  }
}

TEST(PrefixMap, SizedForAtMostHalfFull) {
  EXPECT_EQ(PrefixMap(0).slot_count(), 16u);
  EXPECT_EQ(PrefixMap(1000).slot_count(), 2048u);
  EXPECT_EQ(PrefixMap(1024).slot_count(), 2048u);
}

}  // namespace
}  // namespace tessera
