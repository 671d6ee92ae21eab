#include "tessera/host_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

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

// --- Arena -------------------------------------------------------------------------------------

// A payload whose bytes depend on the key and a version, so that any overlap between records or
// a stale range shows up as a wrong byte.
std::vector<std::byte> Pattern(size_t n, uint64_t key, uint64_t version) {
  std::vector<std::byte> b(n);
  uint64_t x = (key * 0x9e3779b97f4a7c15ULL) ^ (version + 1);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = static_cast<std::byte>(x);
  }
  return b;
}

void ExpectExactAccounting(const HostTier& t) {
  HostTierStats s = t.stats();
  EXPECT_LE(s.bytes, s.capacity_bytes);
  EXPECT_EQ(s.bytes + s.free_bytes, s.capacity_bytes);
  EXPECT_LE(s.largest_free_range, s.free_bytes);
}

TEST(HostTierArena, NothingIsReservedBeforeTheFirstRecord) {
  HostTier t(1ULL << 40);  // 1 TiB of address space is never touched by a tier that holds nothing
  EXPECT_FALSE(t.stats().arena_reserved);
  EXPECT_EQ(t.stats().free_bytes, 1ULL << 40);
  EXPECT_EQ(t.stats().free_ranges, 1u);
}

TEST(HostTierArena, FillsToCapacityExactlyThenEvictsOneForOne) {
  constexpr size_t kRecord = 4096;
  HostTier t(8 * kRecord);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(t.Put(K(i), 1, Pattern(kRecord, i, 0)).ok());
  HostTierStats s = t.stats();
  EXPECT_TRUE(s.arena_reserved);
  EXPECT_EQ(s.records, 8u);
  EXPECT_EQ(s.bytes, 8 * kRecord);
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(s.free_ranges, 0u);
  EXPECT_EQ(s.evictions, 0u);
  for (uint64_t i = 8; i < 20; ++i) {
    ASSERT_TRUE(t.Put(K(i), 1, Pattern(kRecord, i, 0)).ok());
    EXPECT_EQ(t.stats().evictions, i - 7);  // exactly one per record past the capacity
    EXPECT_FALSE(t.Contains(K(i - 8)));     // the least recent
    ExpectExactAccounting(t);
  }
  EXPECT_EQ(t.stats().fragmentation_evictions, 0u);
  for (uint64_t i = 12; i < 20; ++i) EXPECT_EQ(*t.Get(K(i)), Pattern(kRecord, i, 0));
}

TEST(HostTierArena, AnEvictedRecordsRangeIsReused) {
  constexpr size_t kRecord = 1000;
  HostTier t(3 * kRecord);
  ASSERT_TRUE(t.Put(K(1), 0, Pattern(kRecord, 1, 0)).ok());
  ASSERT_TRUE(t.Put(K(2), 0, Pattern(kRecord, 2, 0)).ok());
  ASSERT_TRUE(t.Put(K(3), 0, Pattern(kRecord, 3, 0)).ok());
  const std::byte* slot_of_1 = t.MutableBytesForTest(K(1)).data();
  const std::byte* slot_of_2 = t.MutableBytesForTest(K(2)).data();
  std::vector<std::byte> handed_over;
  t.SetEvictionListener([&](const Hash128& k, uint16_t, std::span<const std::byte> p) {
    EXPECT_EQ(k, K(1));
    handed_over.assign(p.begin(), p.end());  // the listener sees the bytes before they are reused
  });
  ASSERT_TRUE(t.Put(K(4), 0, Pattern(kRecord, 4, 0)).ok());
  EXPECT_EQ(handed_over, Pattern(kRecord, 1, 0));
  EXPECT_EQ(t.MutableBytesForTest(K(4)).data(), slot_of_1);
  // Erasing frees the range for the next record of that size.
  t.Erase(K(2));
  EXPECT_EQ(t.stats().free_bytes, kRecord);
  ASSERT_TRUE(t.Put(K(5), 0, Pattern(kRecord, 5, 0)).ok());
  EXPECT_EQ(t.MutableBytesForTest(K(5)).data(), slot_of_2);
  EXPECT_EQ(t.stats().evictions, 1u);
  // Replacing a key reuses its own range.
  const std::byte* slot_of_5 = t.MutableBytesForTest(K(5)).data();
  ASSERT_TRUE(t.Put(K(5), 0, Pattern(kRecord, 5, 1)).ok());
  EXPECT_EQ(t.MutableBytesForTest(K(5)).data(), slot_of_5);
  EXPECT_EQ(*t.Get(K(5)), Pattern(kRecord, 5, 1));
  EXPECT_EQ(t.stats().evictions, 1u);
  ExpectExactAccounting(t);
}

TEST(HostTierArena, NonContiguousFreeBytesEvictUntilARangeFits) {
  HostTier t(4000);
  for (uint64_t i = 1; i <= 4; ++i) ASSERT_TRUE(t.Put(K(i), 0, Pattern(1000, i, 0)).ok());
  t.Erase(K(1));
  t.Erase(K(3));  // 2,000 free bytes in two ranges of 1,000
  EXPECT_EQ(t.stats().free_ranges, 2u);
  EXPECT_EQ(t.stats().largest_free_range, 1000u);
  std::vector<Hash128> evicted;
  t.SetEvictionListener([&](const Hash128& k, uint16_t, std::span<const std::byte>) { evicted.push_back(k); });
  ASSERT_TRUE(t.Put(K(5), 0, Pattern(2000, 5, 0)).ok());
  // The byte count allowed it, but no range of 2,000 was free: the least recent record (2) went,
  // which joined [0, 3000).
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], K(2));
  EXPECT_EQ(t.stats().fragmentation_evictions, 1u);
  EXPECT_EQ(t.stats().evictions, 1u);
  EXPECT_EQ(t.stats().bytes, 3000u);
  EXPECT_EQ(*t.Get(K(4)), Pattern(1000, 4, 0));
  EXPECT_EQ(*t.Get(K(5)), Pattern(2000, 5, 0));
  ExpectExactAccounting(t);
}

TEST(HostTierArena, MixedSizesNeverExceedTheCapacityAndNeverOverlap) {
  constexpr uint64_t kCapacity = 256 * 1024;
  HostTier t(kCapacity);
  std::map<uint64_t, std::pair<size_t, uint64_t>> held;  // key -> (size, version)
  uint64_t evictions_seen = 0;
  t.SetEvictionListener([&](const Hash128& k, uint16_t, std::span<const std::byte> p) {
    auto it = held.find(k.lo);
    ASSERT_NE(it, held.end());
    EXPECT_EQ(p.size(), it->second.first);
    EXPECT_TRUE(std::equal(p.begin(), p.end(), Pattern(it->second.first, k.lo, it->second.second).begin()));
    held.erase(it);
    ++evictions_seen;
  });
  std::mt19937_64 rng(12345);
  const size_t sizes[] = {0, 1, 63, 4096, 4097, 65536, 65537, 100000, kCapacity / 3, kCapacity};
  for (int step = 0; step < 3000; ++step) {
    const uint64_t key = rng() % 40;
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      const size_t n = sizes[rng() % std::size(sizes)];
      const uint64_t version = static_cast<uint64_t>(step);
      ASSERT_TRUE(t.Put(K(key), 7, Pattern(n, key, version)).ok());
      held[key] = {n, version};
    } else if (op < 9) {
      Result<std::vector<std::byte>> got = t.Get(K(key));
      auto it = held.find(key);
      if (it == held.end()) {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
      } else {
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(*got, Pattern(it->second.first, key, it->second.second));
      }
    } else {
      t.Erase(K(key));
      held.erase(key);
    }
    HostTierStats s = t.stats();
    uint64_t expected_bytes = 0;
    for (const auto& [k, v] : held) expected_bytes += v.first;
    ASSERT_EQ(s.bytes, expected_bytes);
    ASSERT_EQ(s.records, held.size());
    ASSERT_LE(s.bytes, kCapacity);
    ASSERT_EQ(s.bytes + s.free_bytes, kCapacity);
    ASSERT_EQ(s.evictions, evictions_seen);
  }
  for (const auto& [k, v] : held) EXPECT_EQ(*t.Get(K(k)), Pattern(v.first, k, v.second));
  EXPECT_EQ(t.stats().quarantined, 0u);
  EXPECT_GT(t.stats().fragmentation_evictions, 0u);  // the mix above does fragment
  // Emptied, the arena is one range again.
  for (uint64_t k = 0; k < 40; ++k) t.Erase(K(k));
  EXPECT_EQ(t.stats().free_ranges, 1u);
  EXPECT_EQ(t.stats().largest_free_range, kCapacity);
}

TEST(HostTierArena, ARecordOfExactlyTheCapacityFitsAndOneByteMoreIsRefused) {
  HostTier t(10000);
  ASSERT_TRUE(t.Put(K(1), 0, Pattern(3000, 1, 0)).ok());
  Status st = t.Put(K(2), 0, Pattern(10001, 2, 0));
  EXPECT_EQ(st.code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(st.field(), "capacity");
  EXPECT_TRUE(t.Contains(K(1)));  // a refused record evicts nothing
  EXPECT_EQ(t.stats().evictions, 0u);
  ASSERT_TRUE(t.Put(K(3), 0, Pattern(10000, 3, 0)).ok());
  EXPECT_FALSE(t.Contains(K(1)));
  EXPECT_EQ(t.stats().bytes, 10000u);
  EXPECT_EQ(t.stats().free_bytes, 0u);
  EXPECT_EQ(*t.Get(K(3)), Pattern(10000, 3, 0));
}

TEST(HostTierArena, EmptyRecordsAndAZeroCapacityTier) {
  HostTier t(0);
  ASSERT_TRUE(t.Put(K(1), 2, {}).ok());
  uint16_t fmt = 0;
  Result<std::vector<std::byte>> got = t.Get(K(1), &fmt);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(fmt, 2);
  EXPECT_EQ(t.Put(K(2), 0, Bytes(1, 1)).code(), StatusCode::kOutOfBlocks);
  EXPECT_FALSE(t.stats().arena_reserved);
  EXPECT_EQ(t.stats().bytes, 0u);
}

TEST(HostTierArena, LargeRecordCorruptionInTheLastChunkIsDetected) {
  constexpr size_t kRecord = 1430208;  // one DeepSeek-V4-Pro block span; copied in 64 KiB chunks
  HostTier t(4 * kRecord);
  ASSERT_TRUE(t.Put(K(1), 0, Pattern(kRecord, 1, 0)).ok());
  ASSERT_TRUE(t.Put(K(2), 0, Pattern(kRecord, 2, 0)).ok());
  EXPECT_EQ(*t.Get(K(1)), Pattern(kRecord, 1, 0));
  t.MutableBytesForTest(K(1))[kRecord - 1] ^= std::byte{1};
  std::vector<std::byte> out(kRecord + 16, std::byte{0xee});
  EXPECT_EQ(t.GetInto(K(1), out).code(), StatusCode::kDataLoss);
  // Never left holding unverified bytes; the bytes past the record are untouched.
  EXPECT_TRUE(std::all_of(out.begin(), out.begin() + kRecord, [](std::byte b) { return b == std::byte{0}; }));
  EXPECT_TRUE(std::all_of(out.begin() + kRecord, out.end(), [](std::byte b) { return b == std::byte{0xee}; }));
  EXPECT_FALSE(t.Contains(K(1)));
  EXPECT_EQ(t.stats().quarantined, 1u);
  EXPECT_EQ(t.stats().bytes, kRecord);
  ExpectExactAccounting(t);
  EXPECT_EQ(*t.Get(K(2)), Pattern(kRecord, 2, 0));
}

TEST(HostTierArena, GetIntoCopiesIntoCallerMemory) {
  HostTier t(10000);
  ASSERT_TRUE(t.Put(K(1), 5, Pattern(1000, 1, 0)).ok());
  EXPECT_EQ(t.PayloadSize(K(1)), std::optional<uint64_t>(1000));
  EXPECT_EQ(t.PayloadSize(K(2)), std::nullopt);
  std::vector<std::byte> page(4096, std::byte{0xaa});
  uint16_t fmt = 0;
  ASSERT_TRUE(t.GetInto(K(1), page, &fmt).ok());
  EXPECT_EQ(fmt, 5);
  EXPECT_TRUE(std::equal(page.begin(), page.begin() + 1000, Pattern(1000, 1, 0).begin()));
  EXPECT_TRUE(std::all_of(page.begin() + 1000, page.end(), [](std::byte b) { return b == std::byte{0xaa}; }));
  EXPECT_EQ(t.stats().hits, 1u);
  // Too small: refused, the record kept, nothing counted.
  std::vector<std::byte> small(999);
  Status st = t.GetInto(K(1), small);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "out");
  EXPECT_TRUE(t.Contains(K(1)));
  EXPECT_EQ(t.stats().hits, 1u);
  EXPECT_EQ(t.stats().misses, 0u);
  EXPECT_EQ(t.GetInto(K(2), page).code(), StatusCode::kNotFound);
  EXPECT_EQ(t.stats().misses, 1u);
}

// GetScattered fills buffers in order (a promotion into a block's group pages): the bytes of a
// large record across uneven buffers, a size mismatch refused with the record kept, and damage in
// the last chunk zeroing every buffer and dropping the record.
TEST(HostTierArena, GetScatteredFillsBuffersInOrder) {
  constexpr size_t kRecord = 1430208;
  HostTier t(4 * kRecord);
  ASSERT_TRUE(t.Put(K(1), 3, Pattern(kRecord, 1, 0)).ok());
  std::vector<std::byte> a(360), b(1123456), c(kRecord - 360 - 1123456);
  std::vector<std::span<std::byte>> out{a, b, c};
  uint16_t fmt = 0;
  ASSERT_TRUE(t.GetScattered(K(1), out, &fmt).ok());
  EXPECT_EQ(fmt, 3);
  std::vector<std::byte> joined(a);
  joined.insert(joined.end(), b.begin(), b.end());
  joined.insert(joined.end(), c.begin(), c.end());
  EXPECT_EQ(joined, Pattern(kRecord, 1, 0));
  std::vector<std::byte> short_c(c.size() - 1);
  std::vector<std::span<std::byte>> wrong{a, b, short_c};
  Status st = t.GetScattered(K(1), wrong);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "out");
  EXPECT_TRUE(t.Contains(K(1)));
  EXPECT_EQ(t.GetScattered(K(2), out).code(), StatusCode::kNotFound);
  t.MutableBytesForTest(K(1))[kRecord - 1] ^= std::byte{1};
  EXPECT_EQ(t.GetScattered(K(1), out).code(), StatusCode::kDataLoss);
  for (const std::vector<std::byte>* v : {&a, &b, &c}) {
    EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](std::byte x) { return x == std::byte{0}; }));
  }
  EXPECT_FALSE(t.Contains(K(1)));
  EXPECT_EQ(t.stats().quarantined, 1u);
}

TEST(HostTierArena, GetIntoRefreshesRecency) {
  HostTier t(2000);
  ASSERT_TRUE(t.Put(K(1), 0, Bytes(1000, 1)).ok());
  ASSERT_TRUE(t.Put(K(2), 0, Bytes(1000, 2)).ok());
  std::vector<std::byte> out(1000);
  ASSERT_TRUE(t.GetInto(K(1), out).ok());
  ASSERT_TRUE(t.Put(K(3), 0, Bytes(1000, 3)).ok());
  EXPECT_TRUE(t.Contains(K(1)));
  EXPECT_FALSE(t.Contains(K(2)));
}

TEST(HostTierArena, AMovedTierKeepsItsRecords) {
  HostTier a(4096);
  ASSERT_TRUE(a.Put(K(1), 0, Pattern(2000, 1, 0)).ok());
  HostTier b(std::move(a));
  EXPECT_EQ(*b.Get(K(1)), Pattern(2000, 1, 0));
  HostTier c(100);
  c = std::move(b);
  EXPECT_EQ(*c.Get(K(1)), Pattern(2000, 1, 0));
  EXPECT_EQ(c.stats().capacity_bytes, 4096u);
  ExpectExactAccounting(c);
}

}  // namespace
}  // namespace tessera
