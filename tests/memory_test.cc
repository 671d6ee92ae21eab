#include "tessera/memory.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

namespace tessera {
namespace {

// --- AddRegion ------------------------------------------------------------------------------

TEST(RegionTable, AddsHostAndUnbackedRegionsWithDenseIds) {
  RegionTable t;
  Result<uint32_t> a = t.AddRegion(RegionKind::kHost, 4096, "host-a");
  Result<uint32_t> b = t.AddRegion(RegionKind::kUnbacked, 1ULL << 40, "device-b");
  Result<uint32_t> c = t.AddRegion(RegionKind::kHost, 100, "host-c");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1u);
  EXPECT_EQ(*c, 2u);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.kind(0), RegionKind::kHost);
  EXPECT_EQ(t.kind(1), RegionKind::kUnbacked);
  EXPECT_EQ(t.region_bytes(0), 4096u);
  EXPECT_EQ(t.region_bytes(1), 1ULL << 40);
  EXPECT_EQ(t.region_bytes(2), 100u);
  EXPECT_EQ(t.name(0), "host-a");
  EXPECT_EQ(t.name(1), "device-b");
}

TEST(RegionTable, ZeroBytesIsRejectedOnRegion) {
  RegionTable t;
  for (RegionKind kind : {RegionKind::kHost, RegionKind::kUnbacked}) {
    Result<uint32_t> r = t.AddRegion(kind, 0, "empty");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().field(), "region");
  }
  EXPECT_EQ(t.size(), 0u);  // a rejected region is not added
}

// --- Resolve --------------------------------------------------------------------------------

TEST(RegionTable, HostBytesAreZeroFilledAndWritable) {
  RegionTable t;
  const uint64_t bytes = 3 * 4096 + 17;  // not a page multiple
  uint32_t id = *t.AddRegion(RegionKind::kHost, bytes, "host");
  std::span<std::byte> all = t.Resolve({id, 0, bytes});
  ASSERT_EQ(all.size(), bytes);
  for (std::byte b : all) ASSERT_EQ(b, std::byte{0});
  for (uint64_t i = 0; i < bytes; ++i) all[i] = static_cast<std::byte>(i * 7 + 3);
  // A sub-range handle sees the same bytes at its offset.
  std::span<std::byte> sub = t.Resolve({id, 4095, 3});
  ASSERT_EQ(sub.size(), 3u);
  EXPECT_EQ(sub.data(), all.data() + 4095);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(sub[i], static_cast<std::byte>((4095 + i) * 7 + 3));
}

TEST(RegionTable, RegionsAreDisjointMemory) {
  RegionTable t;
  uint32_t a = *t.AddRegion(RegionKind::kHost, 4096, "a");
  uint32_t b = *t.AddRegion(RegionKind::kHost, 4096, "b");
  std::span<std::byte> x = t.Resolve({a, 0, 4096});
  std::span<std::byte> y = t.Resolve({b, 0, 4096});
  EXPECT_TRUE(x.data() + x.size() <= y.data() || y.data() + y.size() <= x.data());
  for (std::byte& v : x) v = std::byte{0xAB};
  for (std::byte v : y) ASSERT_EQ(v, std::byte{0});  // writing a does not touch b
}

TEST(RegionTable, ResolveCheckedAcceptsInBoundsRanges) {
  RegionTable t;
  uint32_t id = *t.AddRegion(RegionKind::kHost, 1000, "host");
  Result<std::span<std::byte>> whole = t.ResolveChecked({id, 0, 1000});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->size(), 1000u);
  Result<std::span<std::byte>> tail = t.ResolveChecked({id, 999, 1});
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->data(), whole->data() + 999);
  Result<std::span<std::byte>> empty_at_end = t.ResolveChecked({id, 1000, 0});
  ASSERT_TRUE(empty_at_end.ok());
  EXPECT_EQ(empty_at_end->size(), 0u);
  // Resolve and ResolveChecked agree.
  EXPECT_EQ(t.Resolve({id, 10, 20}).data(), t.ResolveChecked({id, 10, 20})->data());
}

TEST(RegionTable, ResolveCheckedRejectsOutOfRangeHandlesOnHandle) {
  RegionTable t;
  uint32_t id = *t.AddRegion(RegionKind::kHost, 1000, "host");
  const BlockHandle bad[] = {
      {id, 0, 1001},        // one byte past the end
      {id, 999, 2},         // straddles the end
      {id, 1001, 0},        // starts past the end
      {id, UINT64_MAX, 2},  // offset + len wraps 64 bits
      {id, 1, UINT64_MAX},  // len alone wraps
      {id + 1, 0, 1},       // unknown region
      {UINT32_MAX, 0, 1},   // far unknown region
  };
  for (const BlockHandle& h : bad) {
    Result<std::span<std::byte>> r = t.ResolveChecked(h);
    ASSERT_FALSE(r.ok()) << "region " << h.region << " offset " << h.offset << " len " << h.len;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().field(), "handle");
  }
}

TEST(RegionTable, ResolveCheckedRejectsUnbackedRegionOnHandle) {
  RegionTable t;
  uint32_t id = *t.AddRegion(RegionKind::kUnbacked, 1 << 20, "device");
  Result<std::span<std::byte>> r = t.ResolveChecked({id, 0, 16});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "handle");
}

#ifndef NDEBUG
TEST(RegionTableDeathTest, ResolvePastTheRegionAsserts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RegionTable t;
  uint32_t id = *t.AddRegion(RegionKind::kHost, 64, "host");
  EXPECT_DEATH(t.Resolve({id, 60, 8}), "past its region");
  EXPECT_DEATH(t.Resolve({id + 1, 0, 8}), "unknown region");
}
#endif

// --- BlockHandle::Overlaps ------------------------------------------------------------------

TEST(BlockHandle, OverlapsTruthTable) {
  struct Case {
    BlockHandle a, b;
    bool overlaps;
  };
  const Case cases[] = {
      {{0, 0, 10}, {0, 0, 10}, true},    // identical
      {{0, 0, 10}, {0, 9, 10}, true},    // share the last byte of a
      {{0, 0, 10}, {0, 10, 10}, false},  // adjacent: a ends where b starts
      {{0, 10, 10}, {0, 0, 10}, false},  // adjacent, reversed
      {{0, 0, 100}, {0, 40, 10}, true},  // b inside a
      {{0, 40, 10}, {0, 0, 100}, true},  // a inside b
      {{0, 0, 10}, {1, 0, 10}, false},   // same range, other region
      {{0, 5, 0}, {0, 0, 10}, false},    // empty a inside b
      {{0, 0, 10}, {0, 5, 0}, false},    // empty b inside a
      {{0, 5, 0}, {0, 5, 0}, false},     // two empty handles at one offset
      {{0, 0, 1}, {0, 1, 1}, false},     // single bytes side by side
      {{0, 1, 1}, {0, 1, 1}, true},      // the same single byte
      {{2, 1000, 24}, {2, 1023, 1}, true}, {{2, 1000, 24}, {2, 1024, 1}, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.a.Overlaps(c.b), c.overlaps) << "a={" << c.a.region << "," << c.a.offset << "," << c.a.len << "} b={"
                                             << c.b.region << "," << c.b.offset << "," << c.b.len << "}";
    EXPECT_EQ(c.b.Overlaps(c.a), c.overlaps) << "symmetry";
  }
}

TEST(BlockHandle, EqualityComparesAllFields) {
  EXPECT_EQ((BlockHandle{1, 2, 3}), (BlockHandle{1, 2, 3}));
  EXPECT_NE((BlockHandle{1, 2, 3}), (BlockHandle{0, 2, 3}));
  EXPECT_NE((BlockHandle{1, 2, 3}), (BlockHandle{1, 0, 3}));
  EXPECT_NE((BlockHandle{1, 2, 3}), (BlockHandle{1, 2, 0}));
}

}  // namespace
}  // namespace tessera
