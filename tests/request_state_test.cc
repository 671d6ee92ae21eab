// RequestStates on its own (the manager's tests drive it through whole requests): slabs, the
// arena's accounting, forks, the order of LiveState, and the options it refuses.
#include "tessera/request_state.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tessera {
namespace {

// Two layers: a window-only layer and an overlapping ratio-4 compressor (coff 2: 8 slots).
StateOptions Options(SwaStrategy strategy, uint32_t max_requests = 2) {
  StateOptions o;
  o.strategy = strategy;
  o.window = 8;
  o.window_record_bytes = 16;
  o.block_tokens = 16;
  o.max_requests = max_requests;
  StateLayer window_only;
  window_only.layer = 0;
  StateLayer csa;
  csa.layer = 1;
  csa.ratio = 4;
  csa.coff = 2;
  csa.state_slots = 8;
  csa.state_floats = 3;
  o.layers = {window_only, csa};
  return o;
}

KvWriters Writers() {
  KvWriters w;
  w.window = [](uint32_t layer, uint64_t pos, std::span<std::byte> row) {
    std::memset(row.data(), static_cast<int>(layer * 100 + pos), row.size());
  };
  w.state = [](uint32_t layer, bool, uint64_t pos, std::span<float> row) {
    for (size_t c = 0; c < row.size(); ++c) row[c] = static_cast<float>(layer * 1000 + pos * 10 + c);
  };
  return w;
}

TEST(RequestStates, SlabsAreCountedAndReused) {
  auto s = std::move(RequestStates::Create(Options(SwaStrategy::kRecompute))).value();
  // Per slab: 2 windows of 8 x 16 B and one compressor ring of 8 x 3 floats.
  EXPECT_EQ(s->slab_bytes(), 2u * 8 * 16 + 8u * 3 * 4);
  EXPECT_EQ(s->bytes_held(), 0u);
  const uint32_t a = *s->Open(), b = *s->Open();
  EXPECT_NE(a, b);
  EXPECT_EQ(s->bytes_held(), 2 * s->slab_bytes());
  Result<uint32_t> full = s->Open();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(full.status().field(), "requests");
  s->Close(a);
  EXPECT_EQ(s->bytes_held(), s->slab_bytes());
  EXPECT_EQ(*s->Open(), a);
}

// The arena grows a segment at a time when every slab is in use; rows already handed out stay
// where they are (segments never move) and keep their bytes; max_requests is the ceiling.
TEST(RequestStates, ArenaGrowsOnDemandAndRowsStayPut) {
  const uint32_t seg = RequestStates::kSlabsPerSegment;
  auto s = std::move(RequestStates::Create(Options(SwaStrategy::kSnapshot, 2 * seg + 5))).value();
  EXPECT_EQ(s->arena_segments(), 1u);
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < seg; ++i) ids.push_back(*s->Open());
  const KvWriters w = Writers();
  ASSERT_TRUE(s->WriteToken(ids[0], 0, w, nullptr).ok());
  const std::vector<std::byte> before = s->LiveState(ids[0], 1);
  SlabState probe;
  probe.slab = ids[0];
  const std::byte* row = s->SlabWindowRow(probe, 0, 0).data();
  EXPECT_EQ(s->arena_segments(), 1u);
  for (uint32_t i = seg; i < 2 * seg + 5; ++i) {
    Result<uint32_t> id = s->Open();
    ASSERT_TRUE(id.ok()) << i << ": " << id.status().ToString();
    ids.push_back(*id);
  }
  EXPECT_EQ(s->arena_segments(), 3u);
  EXPECT_EQ(s->SlabWindowRow(probe, 0, 0).data(), row);
  EXPECT_EQ(s->LiveState(ids[0], 1), before);
  EXPECT_EQ(s->bytes_held(), uint64_t{2 * seg + 5} * s->slab_bytes());
  // A slab of a later segment is written and forked like the first.
  ASSERT_TRUE(s->WriteToken(ids.back(), 0, w, nullptr).ok());
  EXPECT_EQ(s->LiveState(ids.back(), 1), before);
  Result<uint32_t> over = s->Open();
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfBlocks);
  EXPECT_EQ(over.status().field(), "requests");
  EXPECT_NE(over.status().message().find("max-requests"), std::string::npos) << over.status().ToString();
  s->Close(ids.back());
  Result<uint32_t> forked = s->Fork(ids[0]);
  ASSERT_TRUE(forked.ok());
  EXPECT_EQ(s->LiveState(*forked, 1), before);
}

// LiveState: the last `window` rows of every layer in position order, then the compressor rows
// still needed (the incomplete group and the previous one); a fork holds the same bytes.
TEST(RequestStates, LiveStateOrderAndForks) {
  auto s = std::move(RequestStates::Create(Options(SwaStrategy::kSnapshot))).value();
  const uint32_t id = *s->Open();
  const KvWriters w = Writers();
  for (uint64_t p = 0; p < 11; ++p) ASSERT_TRUE(s->WriteToken(id, p, w, nullptr).ok());
  const std::vector<std::byte> live = s->LiveState(id, 11);
  // Windows: positions 3..10 of layer 0, then of layer 1; compressor: group start 8 - 4 = 4 .. 10.
  ASSERT_EQ(live.size(), 2u * 8 * 16 + 7u * 3 * 4);
  EXPECT_EQ(live[0], std::byte{3});             // layer 0, position 3
  EXPECT_EQ(live[8 * 16], std::byte{100 + 3});  // layer 1, position 3
  float first = 0;
  std::memcpy(&first, live.data() + 2 * 8 * 16, sizeof first);
  EXPECT_EQ(first, 1000.0f + 4 * 10);  // layer 1, position 4, column 0
  const uint32_t child = *s->Fork(id);
  EXPECT_EQ(s->LiveState(child, 11), live);
}

TEST(RequestStates, RefusesWhatItCannotHold) {
  StateOptions o = Options(SwaStrategy::kRecompute);
  o.window = 3;  // shorter than the overlapping compressor's group of 4: recompute cannot rebuild it
  Result<std::unique_ptr<RequestStates>> r = RequestStates::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "sliding_window");
  o.strategy = SwaStrategy::kSnapshot;  // snapshot keeps the rows instead
  EXPECT_TRUE(RequestStates::Create(o).ok());
  o = Options(SwaStrategy::kSnapshot);
  o.window = UINT32_MAX;
  o.spec_tokens = 1;  // the ring's slots overflow 32 bits
  EXPECT_EQ(RequestStates::Create(o).status().field(), "sliding_window");
  o = Options(SwaStrategy::kSnapshot, /*max_requests=*/0);
  EXPECT_EQ(RequestStates::Create(o).status().field(), "max-requests");
}

}  // namespace
}  // namespace tessera
