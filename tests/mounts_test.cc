// Kernel arguments over the pages (mounts.h, ADR 0035): every builder's shapes, strides and
// dtypes (pinned for the tiny models and the full DeepSeek-V3 / V3.2 / V4 geometries), that every
// token or entry a kernel would read through the view and the index arrays is the manager's own
// record (the same bytes: zero-copy), a checksum of what the batch addresses (pinned), and the
// refusals.
#include "tessera/mounts.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/codec.h"
#include "tessera/request_manager.h"
#include "test_support.h"

namespace tessera::mounts {
namespace {

using testing::Preset;

// Bytes that depend only on (group, layer, position): a record of the group's format filled by
// testing::WriteRandomRecord (valid records; the addresses and checksums are what is checked).
KvWriters SeededWriters(const BlockPool& pool) {
  std::vector<RecordFormat> formats;
  for (const PoolGroup& g : pool.groups()) formats.push_back(g.format);
  KvWriters w([formats](uint32_t g, uint32_t l, uint64_t p, const RecordView& r) {
    std::mt19937 rng(static_cast<uint32_t>(p * 7919 + l * 104729 + g * 13));
    testing::WriteRandomRecord(formats[g], r, rng);
  });
  // DeepSeek-V4: window rows and compressor rows are not what a mount reads; entries get bytes
  // that name their layer, kind and group.
  w.window = [](uint32_t, uint64_t, std::span<std::byte>) {};
  w.state = [](uint32_t, bool, uint64_t, std::span<float>) {};
  w.compress = [](uint32_t layer, bool indexer, uint64_t group, std::span<const float>, uint32_t, const RecordView& e) {
    for (uint32_t k = 0; k < e.plane_count; ++k) {
      for (size_t i = 0; i < e.planes[k].size(); ++i) {
        e.planes[k][i] = std::byte{static_cast<uint8_t>((group * 31 + layer * 7 + (indexer ? 3 : 0) + k + i) % 253)};
      }
    }
  };
  return w;
}

struct Batch {
  std::unique_ptr<RequestManager> manager;
  std::vector<RequestId> ids;
};

Batch Make(const std::string& model, const std::string& kv_format, const std::vector<uint64_t>& lengths,
           uint32_t capacity = 64, RegionKind kind = RegionKind::kHost, std::optional<uint64_t> block_tokens = {}) {
  ManagerOptions o;
  o.kv_format = kv_format;
  o.capacity_blocks = capacity;
  o.max_requests = 8;
  o.region_kind = kind;
  o.block_tokens = block_tokens;
  auto m = RequestManager::Create(Preset(model), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  Batch b{std::move(*m), {}};
  const KvWriters none;
  b.ids =
      testing::AdmitPrompts(*b.manager, lengths, kind == RegionKind::kHost ? SeededWriters(b.manager->pool()) : none);
  return b;
}

// The address of element [i0, i1, 0, ...] of a view (the bytes a kernel reads there).
const std::byte* At(const BlockPool& pool, const PageTensor& t, int64_t i0, int64_t i1) {
  auto bytes = PageTensorBytes(pool, t);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  if (!bytes.ok()) return nullptr;
  return bytes->data() + (i0 * t.strides[0] + i1 * t.strides[1]) * TensorDtypeBytes(t.dtype);
}

uint64_t Fnv1a(uint64_t h, std::span<const std::byte> bytes) {
  for (std::byte b : bytes) h = (h ^ std::to_integer<uint64_t>(b)) * 0x100000001b3ULL;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ULL;

uint32_t LatentGroup(const RequestManager& m) {
  for (uint32_t g = 0; g < m.pool().groups().size(); ++g) {
    if (m.pool().groups()[g].format.use == FormatUse::kLatent && m.pool().groups()[g].page.compress_ratio == 1)
      return g;
  }
  ADD_FAILURE() << "no latent group";
  return 0;
}

// A test name from a case's model and layer.
template <typename Case>
std::string NameOf(const ::testing::TestParamInfo<Case>& p) {
  std::string n = std::string(p.param.model) + "_layer" + std::to_string(p.param.layer);
  for (char& ch : n) ch = (ch == '-' || ch == '.') ? '_' : ch;
  return n;
}

// ---- FlashMLA dense ---------------------------------------------------------------------------

struct DenseCase {
  const char* model;
  uint32_t layer;
  int64_t block_stride;   // elements: layers x 64 tokens x 576 (one page per layer per block)
  uint64_t layer_offset;  // bytes: layer x 64 x 1,152
  uint64_t checksum;      // FNV-1a of every record the batch addresses, request by request
};

class FlashMlaDense : public ::testing::TestWithParam<DenseCase> {};

TEST_P(FlashMlaDense, ViewsTheManagersRecordsWithTheKernelsShape) {
  const DenseCase c = GetParam();
  Batch b = Make(c.model, "mla-bf16", {1, 64, 65, 200});
  auto a = BuildFlashMlaDense(*b.manager, b.ids, c.layer);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const BlockPool& pool = b.manager->pool();
  EXPECT_EQ(a->k_cache.dtype, TensorDtype::kBf16);
  EXPECT_EQ(a->k_cache.shape, (std::vector<int64_t>{64, 64, 1, 576}));
  EXPECT_EQ(a->k_cache.strides, (std::vector<int64_t>{c.block_stride, 576, 576, 1}));
  EXPECT_EQ(a->k_cache.offset, c.layer_offset);
  EXPECT_EQ(a->k_cache.region_kind, RegionKind::kHost);
  EXPECT_EQ(a->head_dim_v, 512u);
  EXPECT_EQ(a->cache_seqlens, (std::vector<int32_t>{1, 64, 65, 200}));
  ASSERT_EQ(a->max_blocks, 4u);  // 200 tokens: 4 blocks of 64
  const uint32_t g = LatentGroup(*b.manager);
  uint64_t via_view = kFnvBasis, via_manager = kFnvBasis;
  for (size_t i = 0; i < b.ids.size(); ++i) {
    const auto table = b.manager->BlockTable(b.ids[i]);
    for (uint32_t j = 0; j < a->max_blocks; ++j) {
      const int32_t want =
          static_cast<int32_t>(j) < (a->cache_seqlens[i] + 63) / 64 ? static_cast<int32_t>(table[j].value) : -1;
      EXPECT_EQ(a->block_table[i * a->max_blocks + j], want) << "request " << i << " slot " << j;
    }
    for (int32_t p = 0; p < a->cache_seqlens[i]; ++p) {
      const int32_t block = a->block_table[i * a->max_blocks + p / 64];
      const std::byte* kernel = At(pool, a->k_cache, block, p % 64);
      auto rec = b.manager->Record(b.ids[i], g, c.layer, static_cast<uint64_t>(p));
      ASSERT_TRUE(rec.ok());
      ASSERT_EQ(kernel, rec->planes[0].data()) << "request " << i << " token " << p;
      via_view = Fnv1a(via_view, std::span(kernel, 1152));
      via_manager = Fnv1a(via_manager, rec->planes[0].first(1152));
    }
  }
  EXPECT_EQ(via_view, via_manager);
  EXPECT_EQ(via_view, c.checksum);
}

INSTANTIATE_TEST_SUITE_P(Models, FlashMlaDense,
                         ::testing::Values(
                             // tiny-mla: 4 layers; layer 2 of a block starts 2 x 73,728 B in.
                             DenseCase{"tiny-mla", 2, 4 * 64 * 576, 2 * 73728, 0xd20b4a7b70ac7d72ULL},
                             // DeepSeek-V3: 61 layers, a block is 4,497,408 B.
                             DenseCase{"deepseek-v3", 60, 61 * 64 * 576, 60 * 73728, 0x9b769743940c3703ULL}),
                         NameOf<DenseCase>);

// What the view reads is the pool's memory: a write into a record through the manager is seen
// through the kernel's view, and a write through the view is seen by the manager.
TEST(FlashMlaDense, AliasesThePool) {
  Batch b = Make("tiny-mla", "mla-bf16", {70});
  auto a = BuildFlashMlaDense(*b.manager, b.ids, 1);
  ASSERT_TRUE(a.ok());
  auto rec = b.manager->MutableRecord(b.ids[0], LatentGroup(*b.manager), 1, 69);  // block 1 fills
  ASSERT_TRUE(rec.ok());
  const int32_t block = a->block_table[1];
  auto view = PageTensorBytes(b.manager->pool(), a->k_cache);
  ASSERT_TRUE(view.ok());
  std::byte* kernel = view->data() + (block * a->k_cache.strides[0] + 5 * 576) * 2;  // token 69 = slot 5 of block 1
  rec->planes[0][7] = std::byte{0x5a};
  EXPECT_EQ(kernel[7], std::byte{0x5a});
  kernel[9] = std::byte{0xa5};
  EXPECT_EQ(rec->planes[0][9], std::byte{0xa5});
}

// A token being decoded (written after the table is built, before the kernel runs) counts.
TEST(FlashMlaDense, PendingTokenNeedsItsSlot) {
  Batch b = Make("tiny-mla", "mla-bf16", {64});
  EXPECT_EQ(BuildFlashMlaDense(*b.manager, b.ids, 0, MountOptions{.pending = 1}).status().field(), "tokens");
  ASSERT_TRUE(b.manager->AllocateSlots(b.ids[0], 1).ok());
  auto a = BuildFlashMlaDense(*b.manager, b.ids, 0, MountOptions{.pending = 1});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->cache_seqlens[0], 65);
  EXPECT_EQ(a->max_blocks, 2u);
  EXPECT_EQ(a->block_table[1], static_cast<int32_t>(b.manager->BlockTable(b.ids[0])[1].value));
}

TEST(FlashMlaDense, RefusesWhatTheKernelCannotRead) {
  {
    Batch b = Make("tiny-mla", "fp8_ds_mla", {10});
    EXPECT_EQ(BuildFlashMlaDense(*b.manager, b.ids, 0).status().field(), "kv-format");
  }
  {
    Batch b = Make("tiny-mla", "mla-bf16", {10}, 8, RegionKind::kHost, 128);
    auto a = BuildFlashMlaDense(*b.manager, b.ids, 0);
    EXPECT_EQ(a.status().field(), "block_tokens");
    EXPECT_NE(a.status().message().find("64"), std::string::npos) << a.status().message();
  }
  {
    Batch b = Make("tiny-mla", "mla-bf16", {10}, 8, RegionKind::kUnbacked);
    auto a = BuildFlashMlaDense(*b.manager, b.ids, 0);
    EXPECT_EQ(a.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(a.status().field(), "backed");
  }
  Batch b = Make("tiny-mla", "mla-bf16", {10});
  EXPECT_EQ(BuildFlashMlaDense(*b.manager, b.ids, 4).status().field(), "layer");
  EXPECT_EQ(BuildFlashMlaDense(*b.manager, {}, 0).status().field(), "requests");
  const RequestId unknown{77};
  EXPECT_EQ(BuildFlashMlaDense(*b.manager, std::span(&unknown, 1), 0).status().field(), "requests");
  {
    Batch v4 = Make("tiny-v4", "", {10});
    EXPECT_EQ(BuildFlashMlaDense(*v4.manager, v4.ids, 0).status().field(), "kv-format");
  }
}

// ---- FlashMLA sparse (V3.2) ---------------------------------------------------------------------

struct SparseCase {
  const char* model;
  uint32_t layer;
  int64_t block_stride;  // bytes: layers x 64 x 656
  uint64_t layer_offset;
  uint64_t checksum;
};

class FlashMlaSparse : public ::testing::TestWithParam<SparseCase> {};

// indices[i][k] = block x 64 + offset of the k-th selected position; the record there is the
// manager's; topk_length counts each selection; -1 pads.
TEST_P(FlashMlaSparse, IndicesNameTheSelectedRecords) {
  const SparseCase c = GetParam();
  Batch b = Make(c.model, "fp8_ds_mla", {3, 130, 300});
  const std::vector<std::vector<uint64_t>> sel = {{2, 0}, {129, 5, 64, 63}, {299, 0, 128, 200, 17}};
  std::vector<std::span<const uint64_t>> spans(sel.begin(), sel.end());
  auto a = BuildFlashMlaSparse(*b.manager, b.ids, c.layer, spans);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->k_cache.dtype, TensorDtype::kUint8);
  EXPECT_EQ(a->k_cache.shape, (std::vector<int64_t>{64, 64, 1, 656}));
  EXPECT_EQ(a->k_cache.strides, (std::vector<int64_t>{c.block_stride, 656, 656, 1}));
  EXPECT_EQ(a->k_cache.offset, c.layer_offset);
  EXPECT_EQ(a->topk, 5u);
  EXPECT_EQ(a->head_dim_qk, 576u);
  EXPECT_EQ(a->topk_length, (std::vector<int32_t>{2, 4, 5}));
  const uint32_t g = LatentGroup(*b.manager);
  uint64_t sum = kFnvBasis;
  for (size_t i = 0; i < sel.size(); ++i) {
    for (size_t k = 0; k < a->topk; ++k) {
      const int32_t idx = a->indices[i * a->topk + k];
      if (k >= sel[i].size()) {
        EXPECT_EQ(idx, -1);
        continue;
      }
      const uint64_t p = sel[i][k];
      EXPECT_EQ(idx, static_cast<int32_t>(b.manager->BlockTable(b.ids[i])[p / 64].value * 64 + p % 64));
      const std::byte* kernel = At(b.manager->pool(), a->k_cache, idx / 64, idx % 64);
      auto rec = b.manager->Record(b.ids[i], g, c.layer, p);
      ASSERT_TRUE(rec.ok());
      ASSERT_EQ(kernel, rec->planes[0].data());
      sum = Fnv1a(sum, std::span(kernel, 656));
    }
  }
  EXPECT_EQ(sum, c.checksum);
}

INSTANTIATE_TEST_SUITE_P(Models, FlashMlaSparse,
                         ::testing::Values(SparseCase{"tiny-dsa", 3, 4 * 64 * 656, 3 * 41984, 0x7271124861d7ad27ULL},
                                           SparseCase{"deepseek-v3.2", 31, 61 * 64 * 656, 31 * 41984,
                                                      0xf5e95766c9059bbbULL}),
                         NameOf<SparseCase>);

TEST(FlashMlaSparse, RefusesWhatTheKernelCannotRead) {
  Batch bf = Make("tiny-dsa", "mla-bf16", {10});
  const std::vector<uint64_t> one{0};
  const std::span<const uint64_t> s1(one);
  EXPECT_EQ(BuildFlashMlaSparse(*bf.manager, bf.ids, 0, std::span(&s1, 1)).status().field(), "kv-format");
  Batch b = Make("tiny-dsa", "fp8_ds_mla", {10});
  const std::vector<uint64_t> past{10}, none;
  const std::span<const uint64_t> sp(past), sn(none);
  EXPECT_EQ(BuildFlashMlaSparse(*b.manager, b.ids, 0, std::span(&sp, 1)).status().field(), "selected");
  EXPECT_EQ(BuildFlashMlaSparse(*b.manager, b.ids, 0, std::span(&sn, 1)).status().field(), "selected");
  EXPECT_EQ(BuildFlashMlaSparse(*b.manager, b.ids, 0, {}).status().field(), "selected");
  const std::vector<uint64_t> three{0, 1, 2};
  const std::span<const uint64_t> s3(three);
  EXPECT_EQ(BuildFlashMlaSparse(*b.manager, b.ids, 0, std::span(&s3, 1), 2).status().field(), "topk");
  auto wide = BuildFlashMlaSparse(*b.manager, b.ids, 0, std::span(&s3, 1), 8);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->topk, 8u);
  EXPECT_EQ(wide->indices[3], -1);
}

// ---- DeepGEMM paged MQA logits (the V3.2 indexer) ---------------------------------------------

// The kernel reads token t of block b at b x block stride + (t % block_tokens) x 128 (its key) and
// + block_tokens x 128 + (t % block_tokens) x 4 (its scale): those must be the manager's record.
TEST(IndexerKCache, TheKernelsOffsetsReadTheManagersRecords) {
  for (const char* model : {"tiny-dsa", "deepseek-v3.2"}) {
    Batch b = Make(model, "", {100, 70});
    ASSERT_NE(b.manager, nullptr);
    const uint32_t layer = 1;
    auto a = BuildIndexerKCache(*b.manager, b.ids, layer);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const BlockPool& pool = b.manager->pool();
    EXPECT_EQ(a->kv_cache.dtype, TensorDtype::kUint8);
    EXPECT_EQ(a->kv_cache.shape, (std::vector<int64_t>{pool.capacity(), 64, 1, 132}));
    EXPECT_EQ(a->kv_cache.strides[1], 132);
    EXPECT_EQ(a->scales_offset, 64u * 128);
    EXPECT_EQ(a->context_lens, (std::vector<int32_t>{100, 70}));
    uint32_t g = 0;
    while (pool.groups()[g].format.use != FormatUse::kIndexer) ++g;
    const RecordFormat& f = pool.groups()[g].format;
    auto bytes = PageTensorBytes(pool, a->kv_cache);
    ASSERT_TRUE(bytes.ok());
    for (size_t i = 0; i < b.ids.size(); ++i) {
      for (uint64_t p = 0; p < static_cast<uint64_t>(a->context_lens[i]); ++p) {
        const int32_t block = a->block_table[i * a->max_blocks + p / 64];
        const std::byte* base = bytes->data() + block * a->kv_cache.strides[0];
        std::vector<std::byte> read(base + (p % 64) * 128, base + (p % 64) * 128 + 128);
        read.insert(read.end(), base + a->scales_offset + (p % 64) * 4, base + a->scales_offset + (p % 64) * 4 + 4);
        auto rec = b.manager->Record(b.ids[i], g, layer, p);
        ASSERT_TRUE(rec.ok());
        std::vector<std::byte> want(132);
        ASSERT_TRUE(CopyRecordOut(f, *rec, want).ok());
        ASSERT_EQ(read, want) << model << " request " << i << " token " << p;
      }
    }
  }
}

TEST(IndexerKCache, RefusesWhatTheKernelCannotRead) {
  ManagerOptions o;
  o.capacity_blocks = 16;
  o.max_requests = 2;
  o.indexer_packing = Packing::kPerToken;
  auto m = RequestManager::Create(Preset("tiny-dsa"), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(BuildIndexerKCache(**m, {}, 0).status().field(), "indexer-layout");
  Batch b = Make("tiny-dsa", "", {10});
  EXPECT_EQ(BuildIndexerKCache(*b.manager, b.ids, 99).status().field(), "layer");
  Batch mla = Make("tiny-mla", "mla-bf16", {10});
  EXPECT_EQ(BuildIndexerKCache(*mla.manager, mla.ids, 0).status().field(), "indexer-format");
}

// ---- FlashInfer MLA -------------------------------------------------------------------------------

// ckv and kpe are two views of the same records: token t's ckv row is its latent, its kpe row
// the rope 1,024 bytes further; the page table is the manager's.
TEST(FlashInferMla, CkvAndKpeViewTheSameRecords) {
  for (const char* model : {"tiny-mla", "deepseek-v3"}) {
    SCOPED_TRACE(model);
    Batch b = Make(model, "mla-bf16", {1, 64, 65, 200});
    const uint32_t layer = 1;
    auto a = BuildFlashInferMla(*b.manager, b.ids, layer);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const int64_t block = static_cast<int64_t>(b.manager->pool().groups()[0].layers) * 64 * 576;
    EXPECT_EQ(a->ckv_cache.shape, (std::vector<int64_t>{64, 64, 512}));
    EXPECT_EQ(a->kpe_cache.shape, (std::vector<int64_t>{64, 64, 64}));
    EXPECT_EQ(a->ckv_cache.strides, (std::vector<int64_t>{block, 576, 1}));
    EXPECT_EQ(a->kpe_cache.strides, (std::vector<int64_t>{block, 576, 1}));
    EXPECT_EQ(a->kpe_cache.offset, a->ckv_cache.offset + 1024);
    EXPECT_EQ(a->page_size, 64u);
    EXPECT_EQ(a->qo_indptr, (std::vector<int32_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(a->kv_indptr, (std::vector<int32_t>{0, 1, 2, 4, 8}));
    EXPECT_EQ(a->kv_len_arr, (std::vector<int32_t>{1, 64, 65, 200}));
    ASSERT_EQ(a->kv_indices.size(), 8u);
    const uint32_t g = LatentGroup(*b.manager);
    uint64_t sum = kFnvBasis;
    for (size_t i = 0; i < b.ids.size(); ++i) {
      for (int32_t p = 0; p < a->kv_len_arr[i]; ++p) {
        const int32_t page = a->kv_indices[static_cast<size_t>(a->kv_indptr[i] + p / 64)];
        EXPECT_EQ(page, static_cast<int32_t>(b.manager->BlockTable(b.ids[i])[p / 64].value));
        auto rec = b.manager->Record(b.ids[i], g, layer, static_cast<uint64_t>(p));
        ASSERT_TRUE(rec.ok());
        ASSERT_EQ(At(b.manager->pool(), a->ckv_cache, page, p % 64), rec->planes[0].data());
        ASSERT_EQ(At(b.manager->pool(), a->kpe_cache, page, p % 64), rec->planes[0].data() + 1024);
        sum = Fnv1a(Fnv1a(sum, std::span(At(b.manager->pool(), a->ckv_cache, page, p % 64), 1024)),
                    std::span(At(b.manager->pool(), a->kpe_cache, page, p % 64), 128));
      }
    }
    // The same records as FlashMLA's dense view reads (FlashMlaDense.*), ckv rows then kpe rows.
    // Both models' records of layer 1 are drawn from the same seeds (SeededWriters): one value.
    EXPECT_EQ(sum, 0x97fc33725070d79dULL);
  }
}

TEST(FlashInferMla, PrefillQueriesAndRefusals) {
  Batch b = Make("tiny-mla", "mla-bf16", {5, 9});
  auto a = BuildFlashInferMla(*b.manager, b.ids, 0, 3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->qo_indptr, (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(BuildFlashInferMla(*b.manager, b.ids, 0, 0).status().field(), "q_len");
  EXPECT_EQ(BuildFlashInferMla(*b.manager, b.ids, 0, 6).status().field(), "q_len");
  Batch fp8 = Make("tiny-mla", "fp8_ds_mla", {5});
  auto r = BuildFlashInferMla(*fp8.manager, fp8.ids, 0);
  EXPECT_EQ(r.status().field(), "kv-format");
  EXPECT_NE(r.status().message().find("kpe_scale"), std::string::npos);
  Batch fp16 = Make("tiny-mla", "mla-fp16", {5});
  EXPECT_EQ(BuildFlashInferMla(*fp16.manager, fp16.ids, 0).status().field(), "kv-format");
}

// ---- DeepSeek-V4 ---------------------------------------------------------------------------------

struct V4Case {
  const char* model;
  uint32_t layer;
  uint32_t per_block;    // entries per 256-token block: 64 (CSA), 2 (HCA)
  int64_t block_stride;  // the group's packed page (ADR 0020)
  uint64_t offset;       // the layer's slice in block 0
  uint64_t checksum;     // FNV-1a of every entry's data row then scale row, request by request
};

class V4Entries : public ::testing::TestWithParam<V4Case> {};

// Entry e of request i is block table[e / per_block], row e % per_block of the layer's slice:
// its 576-B data row at row x 576 and its scale row at per_block x 576 + row x 8 — where the
// manager's Entry puts its two planes, which is where FlashMLA's MODEL1 decode reads them.
TEST_P(V4Entries, IndicesNameTheEntriesAsModel1Blocks) {
  const V4Case c = GetParam();
  Batch b = Make(c.model, "", {1000, 300}, 16);
  auto a = BuildV4CompressedEntries(*b.manager, b.ids, c.layer, {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->k_cache.dtype, TensorDtype::kUint8);
  EXPECT_EQ(a->k_cache.shape, (std::vector<int64_t>{16, c.per_block, 1, 584}));
  EXPECT_EQ(a->k_cache.strides, (std::vector<int64_t>{c.block_stride, 584, 584, 1}));
  EXPECT_EQ(a->k_cache.offset, c.offset);
  EXPECT_EQ(a->head_dim_qk, 512u);
  const uint32_t ratio = 256 / c.per_block;
  EXPECT_EQ(a->topk_length,
            (std::vector<int32_t>{static_cast<int32_t>(1000 / ratio), static_cast<int32_t>(300 / ratio)}));
  auto bytes = PageTensorBytes(b.manager->pool(), a->k_cache);
  ASSERT_TRUE(bytes.ok());
  uint64_t sum = kFnvBasis;
  for (size_t i = 0; i < b.ids.size(); ++i) {
    for (int32_t e = 0; e < a->topk_length[i]; ++e) {
      const int32_t idx = a->indices[i * a->topk + static_cast<size_t>(e)];
      const int32_t block = idx / static_cast<int32_t>(c.per_block), row = idx % static_cast<int32_t>(c.per_block);
      EXPECT_EQ(static_cast<uint32_t>(block),
                b.manager->BlockTable(b.ids[i])[static_cast<size_t>(e) / c.per_block].value);
      const std::byte* base = bytes->data() + block * a->k_cache.strides[0];
      auto entry = b.manager->Entry(b.ids[i], c.layer, false, static_cast<uint64_t>(e));
      ASSERT_TRUE(entry.ok()) << entry.status().ToString();
      ASSERT_EQ(entry->plane_count, 2u);
      const std::byte* data_row = base + ptrdiff_t{row} * 576;
      const std::byte* scale_row = base + ptrdiff_t{c.per_block} * 576 + ptrdiff_t{row} * 8;
      ASSERT_EQ(data_row, entry->planes[0].data()) << "entry " << e;
      ASSERT_EQ(scale_row, entry->planes[1].data()) << "entry " << e;
      sum = Fnv1a(Fnv1a(sum, std::span(data_row, 576)), std::span(scale_row, 8));
    }
  }
  EXPECT_EQ(sum, c.checksum);
}

INSTANTIATE_TEST_SUITE_P(
    Models, V4Entries,
    ::testing::Values(
        // tiny-v4 [SWA, CSA, HCA, CSA]: two CSA layers packed in a page of 2 x 37,376 B -> 74,752 B
        // padded to 74,880 (130 x 576); the HCA layer alone, 2 x 584 = 1,168 -> 1,728 B.
        V4Case{"tiny-v4", 1, 64, 74880, 0, 0x824c2be921018a41ULL},
        V4Case{"tiny-v4", 3, 64, 74880, 37376, 0xb0f14e0cd0cb1e5eULL},
        V4Case{"tiny-v4", 2, 2, 1728, 0, 0x4819899a98d8a279ULL},
        // DeepSeek-V4-Pro: 30 CSA layers (1,121,472-B pages), 31 HCA layers (36,288-B pages); the
        // last CSA layer (60) is slice 29 of the even layers 2..60, the HCA layer 59 slice 30 of 0, 1, 3, ..., 59.
        V4Case{"deepseek-v4-pro", 60, 64, 1121472, 29 * 37376, 0x8b0367cbfda4928eULL},
        V4Case{"deepseek-v4-pro", 59, 2, 36288, 30 * 1168, 0xc0faa5ce296004c5ULL},
        // DeepSeek-V4-Flash: 21 CSA layers (785,088 B), 20 HCA layers (23,616 B).
        V4Case{"deepseek-v4-flash", 2, 64, 785088, 0, 0xb4d1f0613c11c309ULL},
        V4Case{"deepseek-v4-flash", 41, 2, 23616, 19 * 1168, 0xb164cb346c3d0a25ULL}),
    NameOf<V4Case>);

TEST(V4Entries, SelectedEntriesAndRefusals) {
  Batch b = Make("tiny-v4", "", {300}, 8);
  const std::vector<uint64_t> sel{70, 3, 64};
  const std::span<const uint64_t> s(sel);
  auto a = BuildV4CompressedEntries(*b.manager, b.ids, 1, std::span(&s, 1));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const auto t = b.manager->BlockTable(b.ids[0]);
  EXPECT_EQ(a->indices,
            (std::vector<int32_t>{static_cast<int32_t>(t[1].value * 64 + 6), static_cast<int32_t>(t[0].value * 64 + 3),
                                  static_cast<int32_t>(t[1].value * 64 + 0)}));
  const std::vector<uint64_t> past{75};  // 300 tokens complete 75 CSA entries: 0..74
  const std::span<const uint64_t> sp(past);
  EXPECT_EQ(BuildV4CompressedEntries(*b.manager, b.ids, 1, std::span(&sp, 1)).status().field(), "selected");
  EXPECT_EQ(BuildV4CompressedEntries(*b.manager, b.ids, 0, {}).status().field(), "layer");  // SWA-only
  EXPECT_EQ(BuildV4CompressedEntries(*b.manager, b.ids, 4, {}).status().field(), "layer");
  Batch short_prompt = Make("tiny-v4", "", {100}, 8);  // no complete HCA entry (ratio 128)
  EXPECT_EQ(BuildV4CompressedEntries(*short_prompt.manager, short_prompt.ids, 2, {}).status().field(), "selected");
  Batch v3 = Make("tiny-mla", "mla-bf16", {10});
  EXPECT_EQ(BuildV4CompressedEntries(*v3.manager, v3.ids, 0, {}).status().field(), "layer");
}

TEST(V4Window, IsRefusedWithTheReason) {
  Batch b = Make("tiny-v4", "", {20}, 8);
  const Status s = BuildV4Window(*b.manager, 0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.field(), "window");
  EXPECT_NE(s.message().find("16-byte"), std::string::npos) << s.message();
  EXPECT_EQ(BuildV4Window(*b.manager, 9).field(), "layer");
  Batch v3 = Make("tiny-mla", "mla-bf16", {10});
  EXPECT_EQ(BuildV4Window(*v3.manager, 0).field(), "model");
}

// ---- Views -----------------------------------------------------------------------------------------

TEST(PageTensor, ExtentAndResolution) {
  PageTensor t;
  t.dtype = TensorDtype::kBf16;
  t.shape = {3, 64, 1, 576};
  t.strides = {100000, 576, 576, 1};
  EXPECT_EQ(t.extent(), (2 * 100000 + 63 * 576 + 575 + 1) * 2u);
  Batch b = Make("tiny-mla", "mla-bf16", {10});
  auto a = BuildFlashMlaDense(*b.manager, b.ids, 3);
  ASSERT_TRUE(a.ok());
  auto bytes = PageTensorBytes(b.manager->pool(), a->k_cache);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), a->k_cache.extent());
  // The view ends at the last record of the last block: the region's end minus the layers after it.
  EXPECT_EQ(a->k_cache.offset + a->k_cache.extent(), b.manager->pool().regions().region_bytes(a->k_cache.region));
  EXPECT_EQ(PageTensorAddress(b.manager->pool(), a->k_cache).status().field(), "handle");
  PageTensor outside = a->k_cache;
  outside.offset += 2;
  EXPECT_FALSE(PageTensorBytes(b.manager->pool(), outside).ok());
  EXPECT_EQ(TensorDtypeName(TensorDtype::kBf16), "bfloat16");
  EXPECT_EQ(TensorDtypeBytes(TensorDtype::kInt32), 4u);
}

}  // namespace
}  // namespace tessera::mounts
