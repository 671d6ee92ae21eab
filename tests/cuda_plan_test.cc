// The CUDA decode's and transfers' host-side planning (cuda_plan.h, ADR 0025) and device regions
// (memory.h RegionKind::kDevice) — everything of the CUDA path that runs without a GPU: where the
// kernel finds a record (against the manager's own Record), the packed block tables, the split-K
// work list, the transfer rounds, and region accounting with an allocator that stands in for
// cudaMalloc.
#include "tessera/cuda_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/memory.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera::cuda {
namespace {

using testing::Preset;

// A manager whose requests hold the given numbers of tokens (records zero-filled: the addresses
// are what these tests check).
struct Held {
  std::unique_ptr<RequestManager> manager;
  std::vector<RequestId> ids;
};

Held Hold(const Geometry& g, const std::string& kv_format, const std::vector<uint64_t>& lengths,
          RegionKind kind = RegionKind::kHost) {
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = 64;
  o.max_requests = 8;
  o.region_kind = kind;
  auto m = RequestManager::Create(g, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  Held h{std::move(*m), {}};
  uint32_t next = 1;
  for (uint64_t n : lengths) {
    std::vector<uint32_t> prompt(n);
    for (uint32_t& t : prompt) t = next++;  // distinct tokens: no prefix sharing
    auto a = h.manager->Admit(prompt, RequestSpec{});
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return h;
    const KvWriters none;
    const KvWriters zero([](uint32_t, uint32_t, uint64_t, const RecordView&) {});
    EXPECT_TRUE(h.manager->Append(a->id, prompt, kind == RegionKind::kHost ? zero : none).ok());
    h.ids.push_back(a->id);
  }
  return h;
}

// ---- Page views ----------------------------------------------------------------------------------

class PageViewAddressing : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

// The kernel's address of every record (base + layer offset + block id x stride + entry x record)
// is the record the manager hands out, for every layer and token of requests of mixed lengths.
TEST_P(PageViewAddressing, MatchesTheManagersRecords) {
  const auto [model, format] = GetParam();
  const Geometry g = Preset(model);
  Held h = Hold(g, format, {1, 64, 65, 200});
  const BlockPool& pool = h.manager->pool();
  auto first = LatentPageView(pool, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const uint32_t layers = pool.groups()[first->group].layers;
  ASSERT_GT(layers, 0u);
  const std::byte* base = pool.Bytes(BlockHandle{first->region, 0, 1}).data();
  uint64_t checked = 0;
  for (uint32_t l = 0; l < layers; l += std::max(1u, layers / 7)) {
    auto v = LatentPageView(pool, l);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->record_bytes, pool.groups()[v->group].format.record_bytes());
    EXPECT_EQ(v->block_tokens, 64u);
    EXPECT_EQ(v->latent, 512u);
    EXPECT_EQ(v->rope, 64u);
    EXPECT_EQ(v->format, std::string(format) == "fp8_ds_mla" ? PageFormat::kFp8DsMla : PageFormat::kMlaBf16);
    for (RequestId r : h.ids) {
      std::span<const BlockId> table = h.manager->BlockTable(r);
      for (uint64_t p = 0; p < h.manager->Tokens(r); ++p) {
        auto rec = h.manager->Record(r, v->group, l, p);
        ASSERT_TRUE(rec.ok()) << rec.status().ToString();
        const std::byte* at =
            base + v->layer_offset + uint64_t{table[p / 64].value} * v->block_stride + (p % 64) * v->record_bytes;
        ASSERT_EQ(at, rec->planes[0].data()) << "layer " << l << " position " << p;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 330u);
}

INSTANTIATE_TEST_SUITE_P(Formats, PageViewAddressing,
                         ::testing::Values(std::pair{"tiny-mla", "mla-bf16"}, std::pair{"tiny-mla", "fp8_ds_mla"},
                                           std::pair{"tiny-dsa", "fp8_ds_mla"}, std::pair{"deepseek-v3", "mla-bf16"},
                                           std::pair{"deepseek-v3.2", "fp8_ds_mla"}));

TEST(PageView, RefusesWhatTheKernelCannotRead) {
  const Geometry g = Preset("tiny-mla");
  Held fp16 = Hold(g, "mla-fp16", {1});
  auto v = LatentPageView(fp16.manager->pool(), 0);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().field(), "kv-format");
  Held bf16 = Hold(g, "mla-bf16", {1});
  auto past = LatentPageView(bf16.manager->pool(), g.num_layers);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().field(), "layer");
}

// ---- Block tables --------------------------------------------------------------------------------

TEST(PackBlockTables, PacksTheManagersTablesWithPadding) {
  const Geometry g = Preset("tiny-mla");
  Held h = Hold(g, "mla-bf16", {1, 64, 200});
  auto t = PackBlockTables(*h.manager, h.ids);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->stride, 4u);  // 200 tokens: 4 blocks
  ASSERT_EQ(t->table.size(), 12u);
  EXPECT_EQ(t->seq_lens, (std::vector<int32_t>{1, 64, 200}));
  for (size_t i = 0; i < h.ids.size(); ++i) {
    std::span<const BlockId> table = h.manager->BlockTable(h.ids[i]);
    const size_t used = (h.manager->Tokens(h.ids[i]) + 63) / 64;
    for (size_t j = 0; j < 4; ++j) {
      const int32_t want = j < used ? static_cast<int32_t>(table[j].value) : -1;
      EXPECT_EQ(t->table[i * 4 + j], want) << i << "," << j;
    }
  }
}

TEST(PackBlockTables, PendingTokenNeedsItsSlot) {
  const Geometry g = Preset("tiny-mla");
  Held h = Hold(g, "mla-bf16", {64});
  // 64 tokens fill one block; the token being computed needs a slot in a second one.
  auto refused = PackBlockTables(*h.manager, h.ids, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().field(), "tokens");
  ASSERT_TRUE(h.manager->AllocateSlots(h.ids[0], 1).ok());
  auto t = PackBlockTables(*h.manager, h.ids, 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->seq_lens[0], 65);
  EXPECT_EQ(t->stride, 2u);
}

TEST(PackBlockTables, RefusesBadInput) {
  const std::vector<BlockId> ok{BlockId{0}, BlockId{3}};
  const std::vector<BlockId> past{BlockId{0}, BlockId{8}};
  const std::vector<BlockId> invalid{BlockId{}};
  auto field = [](const Result<PackedBlockTables>& r) { return r.ok() ? std::string("ok") : r.status().field(); };
  std::vector<std::span<const BlockId>> one{ok};
  std::vector<uint64_t> n100{100};
  EXPECT_EQ(field(PackBlockTables(one, n100, 64, 8)), "ok");
  EXPECT_EQ(field(PackBlockTables({}, {}, 64, 8)), "requests");
  std::vector<uint64_t> two{1, 2};
  EXPECT_EQ(field(PackBlockTables(one, two, 64, 8)), "requests");
  std::vector<uint64_t> zero{0};
  EXPECT_EQ(field(PackBlockTables(one, zero, 64, 8)), "tokens");
  std::vector<uint64_t> n129{129};  // three blocks, the table holds two
  EXPECT_EQ(field(PackBlockTables(one, n129, 64, 8)), "tokens");
  std::vector<uint64_t> huge{uint64_t{1} << 40};
  EXPECT_EQ(field(PackBlockTables(one, huge, 64, 8)), "tokens");
  std::vector<std::span<const BlockId>> bad{past};
  EXPECT_EQ(field(PackBlockTables(bad, n100, 64, 8)), "blocks");
  std::vector<std::span<const BlockId>> inv{invalid};
  std::vector<uint64_t> n1{1};
  EXPECT_EQ(field(PackBlockTables(inv, n1, 64, 8)), "blocks");
  EXPECT_EQ(field(PackBlockTables(one, n100, 0, 8)), "block_tokens");
  // Only the blocks the tokens use are checked: a stale id past them is not read.
  std::vector<uint64_t> n64{64};
  EXPECT_EQ(field(PackBlockTables(bad, n64, 64, 8)), "ok");

  const Geometry g = Preset("tiny-mla");
  Held h = Hold(g, "mla-bf16", {10});
  std::vector<RequestId> unknown{RequestId{7}};
  auto r = PackBlockTables(*h.manager, unknown);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().field(), "requests");
}

// ---- Launch planning -----------------------------------------------------------------------------

// Every request's tokens are covered once, in order, by chunks that start on a block boundary.
void ExpectCovers(const DecodePlan& p, std::span<const int32_t> lens, uint32_t block_tokens) {
  ASSERT_EQ(p.split_offset.size(), lens.size() + 1);
  EXPECT_EQ(p.grid_x, p.items.size());
  EXPECT_EQ(p.chunk_tokens % block_tokens, 0u);
  for (size_t i = 0; i < lens.size(); ++i) {
    int32_t next = 0;
    for (int32_t k = p.split_offset[i]; k < p.split_offset[i + 1]; ++k) {
      const WorkItem& it = p.items[k];
      EXPECT_EQ(it.request, static_cast<int32_t>(i));
      EXPECT_EQ(it.split, k - p.split_offset[i]);
      EXPECT_EQ(it.begin, next);
      EXPECT_EQ(it.begin % static_cast<int32_t>(block_tokens), 0);
      EXPECT_GT(it.end, it.begin);
      EXPECT_LE(it.end - it.begin, static_cast<int32_t>(p.chunk_tokens));
      next = it.end;
    }
    EXPECT_EQ(next, lens[i]) << "request " << i;
  }
}

TEST(PlanDecode, LongRequestFillsTheDevice) {
  // One 32K-token request on a 132-SM device: split-K gives every SM work.
  const std::vector<int32_t> lens{32768};
  auto p = PlanDecode(lens, DecodeShape{16, 512, 64, 64}, DeviceLimits{132, 2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ExpectCovers(*p, lens, 64);
  EXPECT_EQ(p->heads_per_cta, 16u);
  EXPECT_EQ(p->head_groups, 1u);
  EXPECT_EQ(p->chunk_tokens, 128u);  // ceil(32768 / 264) = 125 -> 128
  EXPECT_EQ(p->items.size(), 256u);
  EXPECT_GE(p->items.size() * p->head_groups, 132u);
  EXPECT_EQ(p->partial_floats, 256u * 16 * 512);
  EXPECT_EQ(p->lse_floats, 256u * 16);
  // Two 16 x 577 float rows, the scores and the softmax state: well under sm_90's 227 KB.
  EXPECT_EQ(p->shared_bytes, 4u * (16 * 577 + 16 * 577 + 16 * 16 + 4 * 16));
  EXPECT_LE(p->shared_bytes, 227u * 1024);

  // 128 heads: eight head groups share the CTAs, so chunks are eight times longer.
  auto full = PlanDecode(lens, DecodeShape{128, 512, 64, 64}, DeviceLimits{132, 2});
  ASSERT_TRUE(full.ok());
  ExpectCovers(*full, lens, 64);
  EXPECT_EQ(full->head_groups, 8u);
  EXPECT_EQ(full->chunk_tokens, 1024u);  // ceil(32768 / 33) = 993 -> 1024
  EXPECT_EQ(full->items.size(), 32u);
  EXPECT_EQ(full->partial_floats, 32u * 128 * 512);
}

TEST(PlanDecode, MixedLengthsGetDifferentSplitCounts) {
  const std::vector<int32_t> lens{1, 64, 65, 5000, 40000, 300};
  auto p = PlanDecode(lens, DecodeShape{4, 512, 64, 64}, DeviceLimits{8, 2});
  ASSERT_TRUE(p.ok());
  ExpectCovers(*p, lens, 64);
  EXPECT_EQ(p->tokens, 45430u);
  // target 16 items: chunk ceil(45430 / 16) = 2840 -> 2880
  EXPECT_EQ(p->chunk_tokens, 2880u);
  EXPECT_EQ(p->split_offset[1] - p->split_offset[0], 1);
  EXPECT_EQ(p->split_offset[5] - p->split_offset[4], 14);  // 40000 / 2880
  // Short requests never cost more than one item each: at most target + batch items.
  EXPECT_LE(p->items.size(), 16u + lens.size());
}

TEST(PlanDecode, RandomBatchesAreCovered) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> lens(1 + rng() % 12);
    for (int32_t& n : lens) n = 1 + static_cast<int32_t>(rng() % 70000);
    const auto heads = static_cast<uint32_t>(1 + rng() % 128), sms = static_cast<uint32_t>(1 + rng() % 160);
    auto p = PlanDecode(lens, DecodeShape{heads, 512, 64, 64}, DeviceLimits{sms, 2});
    ASSERT_TRUE(p.ok());
    ExpectCovers(*p, lens, 64);
    EXPECT_EQ(p->head_groups, (heads + 15) / 16);
  }
}

TEST(PlanDecode, RefusesBadInput) {
  auto field = [](const Result<DecodePlan>& r) { return r.ok() ? std::string("ok") : r.status().field(); };
  const std::vector<int32_t> lens{10};
  const std::vector<int32_t> zero{10, 0};
  const DeviceLimits d{4, 2};
  EXPECT_EQ(field(PlanDecode({}, DecodeShape{1, 512, 64, 64}, d)), "seq_lens");
  EXPECT_EQ(field(PlanDecode(zero, DecodeShape{1, 512, 64, 64}, d)), "seq_lens");
  EXPECT_EQ(field(PlanDecode(lens, DecodeShape{0, 512, 64, 64}, d)), "heads");
  EXPECT_EQ(field(PlanDecode(lens, DecodeShape{1, 513, 64, 64}, d)), "latent");
  EXPECT_EQ(field(PlanDecode(lens, DecodeShape{1, 512, 65, 64}, d)), "rope");
  EXPECT_EQ(field(PlanDecode(lens, DecodeShape{1, 512, 64, 0}, d)), "block_tokens");
  EXPECT_EQ(field(PlanDecode(lens, DecodeShape{1, 512, 64, 64}, DeviceLimits{0, 2})), "sm_count");
}

// ---- Transfers -----------------------------------------------------------------------------------

TEST(PlanTransfers, CoalescesConsecutiveBlocksAndFillsHalves) {
  // Blocks 3, 4, 5 and 9 of a group with 1,000-byte blocks; a second region's block.
  const std::vector<BlockHandle> blocks{
      {0, 3000, 1000}, {0, 4000, 1000}, {0, 5000, 1000}, {0, 9000, 1000}, {1, 0, 1000}};
  auto p = PlanTransfers(blocks, 6000);  // halves of 3,000 bytes: three blocks a round
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->half_bytes, 3000u);
  EXPECT_EQ(p->bytes, 5000u);
  ASSERT_EQ(p->rounds.size(), 2u);
  EXPECT_EQ(p->rounds[0].items, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(p->rounds[0].item_offset, (std::vector<uint64_t>{0, 1000, 2000}));
  ASSERT_EQ(p->rounds[0].copies.size(), 1u);  // 3, 4, 5: one copy
  EXPECT_EQ(p->rounds[0].copies[0].device, (BlockHandle{0, 3000, 3000}));
  EXPECT_EQ(p->rounds[0].copies[0].staging_offset, 0u);
  EXPECT_EQ(p->rounds[1].items, (std::vector<uint32_t>{3, 4}));
  ASSERT_EQ(p->rounds[1].copies.size(), 2u);  // block 9, then another region
  EXPECT_EQ(p->rounds[1].copies[1].device, (BlockHandle{1, 0, 1000}));
  EXPECT_EQ(p->rounds[1].copies[1].staging_offset, 1000u);
  EXPECT_EQ(p->copies, 3u);
}

TEST(PlanTransfers, RandomBatchesCoverEveryByteOnce) {
  std::mt19937 rng(5);
  for (int round = 0; round < 100; ++round) {
    const uint64_t block = 64 * (1 + rng() % 20);
    std::vector<uint32_t> ids(1 + rng() % 60);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(1 + rng() % ids.size());
    std::sort(ids.begin(), ids.end());  // a promotion's blocks, mostly runs
    std::vector<BlockHandle> blocks;
    for (uint32_t id : ids) blocks.push_back(BlockHandle{0, id * block, block});
    const uint64_t staging = 2 * block * (1 + rng() % 8);
    auto p = PlanTransfers(blocks, staging);
    ASSERT_TRUE(p.ok());
    std::map<uint64_t, uint64_t> device;  // offset -> len, from the copies
    uint64_t items = 0;
    for (const TransferRound& r : p->rounds) {
      EXPECT_LE(r.bytes, staging / 2);
      uint64_t staged = 0;
      for (const TransferCopy& c : r.copies) {
        EXPECT_EQ(c.staging_offset, staged);  // copies tile the half in order
        staged += c.device.len;
        device[c.device.offset] = c.device.len;
      }
      EXPECT_EQ(staged, r.bytes);
      items += r.items.size();
    }
    EXPECT_EQ(items, blocks.size());
    uint64_t covered = 0;
    for (const BlockHandle& b : blocks) {
      // Each block lies inside exactly one copy.
      auto it = device.upper_bound(b.offset);
      ASSERT_NE(it, device.begin());
      --it;
      EXPECT_LE(b.offset + b.len, it->first + it->second);
      covered += b.len;
    }
    EXPECT_EQ(covered, p->bytes);
  }
}

TEST(PlanTransfers, RefusesBadInput) {
  auto field = [](const Result<TransferPlan>& r) { return r.ok() ? std::string("ok") : r.status().field(); };
  EXPECT_EQ(field(PlanTransfers({}, 100)), "blocks");
  const std::vector<BlockHandle> empty{{0, 0, 0}};
  EXPECT_EQ(field(PlanTransfers(empty, 100)), "blocks");
  const std::vector<BlockHandle> overlap{{0, 0, 10}, {1, 0, 10}, {0, 5, 10}};
  EXPECT_EQ(field(PlanTransfers(overlap, 100)), "blocks");
  const std::vector<BlockHandle> big{{0, 0, 51}};
  EXPECT_EQ(field(PlanTransfers(big, 100)), "staging-bytes");
  const std::vector<BlockHandle> wrap{{0, UINT64_MAX - 5, 10}};
  EXPECT_EQ(field(PlanTransfers(wrap, 100)), "blocks");
}

// ---- Device regions ------------------------------------------------------------------------------

// Stands in for cudaMalloc: host memory, with every live allocation tracked.
std::map<uint64_t, uint64_t>& Live() {
  static std::map<uint64_t, uint64_t> live;
  return live;
}
uint64_t g_fail_above = UINT64_MAX;
Result<uint64_t> FakeAllocate(uint64_t bytes) {
  if (bytes > g_fail_above) return OutOfBlocks("device", "fake device is full");
  void* p = std::malloc(bytes);
  const auto a = reinterpret_cast<uint64_t>(p);
  Live()[a] = bytes;
  return a;
}
void FakeRelease(uint64_t address) {
  ASSERT_EQ(Live().count(address), 1u) << "released twice or never allocated";
  Live().erase(address);
  std::free(reinterpret_cast<void*>(address));
}
const DeviceAllocator kFake{&FakeAllocate, &FakeRelease};

struct InstallFake {
  const DeviceAllocator* previous;
  InstallFake() : previous(InstallDeviceAllocator(&kFake)) {}
  ~InstallFake() {
    InstallDeviceAllocator(previous);
    g_fail_above = UINT64_MAX;
  }
};

TEST(DeviceRegion, RefusedWithoutAnAllocator) {
  const DeviceAllocator* previous = InstallDeviceAllocator(nullptr);
  RegionTable t;
  auto r = t.AddRegion(RegionKind::kDevice, 4096, "gpu");
  InstallDeviceAllocator(previous);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().field(), "device");
  EXPECT_EQ(t.size(), 0u);
}

TEST(DeviceRegion, AccountsAllocatesAndReleases) {
  InstallFake fake;
  {
    RegionTable t;
    ASSERT_TRUE(t.AddRegion(RegionKind::kHost, 4096, "host").ok());
    auto d0 = t.AddRegion(RegionKind::kDevice, 1000, "gpu-a");
    auto d1 = t.AddRegion(RegionKind::kDevice, 3000, "gpu-b");
    ASSERT_TRUE(d0.ok() && d1.ok());
    ASSERT_TRUE(t.AddRegion(RegionKind::kUnbacked, 1 << 20, "elsewhere").ok());
    EXPECT_EQ(Live().size(), 2u);
    EXPECT_EQ(t.bytes_of(RegionKind::kDevice), 4000u);
    EXPECT_EQ(t.bytes_of(RegionKind::kHost), 4096u);
    EXPECT_EQ(t.bytes_of(RegionKind::kUnbacked), 1u << 20);
    EXPECT_EQ(t.kind(*d1), RegionKind::kDevice);
    auto a = t.DeviceAddress(BlockHandle{*d1, 100, 2900});
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(Live().count(*a - 100), 1u);
    EXPECT_EQ(Live()[*a - 100], 3000u);
    // Device bytes are not host bytes; ranges are checked; host regions have no device address.
    EXPECT_FALSE(t.ResolveChecked(BlockHandle{*d0, 0, 10}).ok());
    EXPECT_EQ(t.DeviceAddress(BlockHandle{*d1, 100, 2901}).status().field(), "handle");
    EXPECT_EQ(t.DeviceAddress(BlockHandle{0, 0, 1}).status().field(), "handle");
    EXPECT_EQ(t.DeviceAddress(BlockHandle{9, 0, 1}).status().field(), "handle");
    // A failing allocation adds nothing.
    g_fail_above = 10;
    auto full = t.AddRegion(RegionKind::kDevice, 11, "gpu-c");
    ASSERT_FALSE(full.ok());
    EXPECT_EQ(full.status().code(), StatusCode::kOutOfBlocks);
    EXPECT_EQ(t.size(), 4u);
    EXPECT_EQ(Live().size(), 2u);
  }
  EXPECT_TRUE(Live().empty()) << "the table released every device region once";
}

TEST(DeviceRegion, ManagerOwnsDevicePages) {
  InstallFake fake;
  const Geometry g = Preset("tiny-mla");
  {
    Held h = Hold(g, "fp8_ds_mla", {100, 7}, RegionKind::kDevice);
    const BlockPool& pool = h.manager->pool();
    EXPECT_FALSE(pool.backed());
    EXPECT_EQ(pool.regions().bytes_of(RegionKind::kDevice), uint64_t{pool.capacity()} * pool.block_bytes());
    EXPECT_EQ(pool.regions().bytes_of(RegionKind::kHost), 0u);
    // The kernel's view: device addresses inside the allocation.
    auto v = LatentPageView(pool, 3);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    auto base = pool.regions().DeviceAddress(BlockHandle{v->region, 0, 1});
    ASSERT_TRUE(base.ok());
    EXPECT_EQ(Live().count(*base), 1u);
    auto t = PackBlockTables(*h.manager, h.ids);
    ASSERT_TRUE(t.ok());
    for (int32_t id : t->table) {
      if (id < 0) continue;
      const uint64_t end = v->layer_offset + uint64_t(id) * v->block_stride + 64 * v->record_bytes;
      EXPECT_LE(end, pool.regions().region_bytes(v->region));
    }
    // No host bytes to read.
    EXPECT_FALSE(h.manager->Record(h.ids[0], v->group, 0, 0).ok());
  }
  EXPECT_TRUE(Live().empty());
}

}  // namespace
}  // namespace tessera::cuda
