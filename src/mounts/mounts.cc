// Kernel arguments over Tessera's pages (mounts.h, ADR 0035).
//
// Every view starts from the address arithmetic the CUDA decode already uses (cuda_plan.h
// LatentPageView: layer offset + block id x block stride + entry x record, ADR 0020) or, for
// DeepSeek-V4's entries, the same arithmetic on the entry group's layer slice; block tables come
// from cuda::PackBlockTables. What this file adds is each kernel's shape, dtype and stride
// conventions and the checks of what that kernel can read.
#include "tessera/mounts.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "tessera/checked.h"
#include "tessera/codec.h"
#include "tessera/cuda_plan.h"

namespace tessera::mounts {

std::string_view TensorDtypeName(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kBf16:
      return "bfloat16";
    case TensorDtype::kUint8:
      return "uint8";
    case TensorDtype::kInt32:
      return "int32";
    case TensorDtype::kFloat32:
      return "float32";
  }
  return "?";
}

uint32_t TensorDtypeBytes(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kBf16:
      return 2;
    case TensorDtype::kUint8:
      return 1;
    case TensorDtype::kInt32:
    case TensorDtype::kFloat32:
      return 4;
  }
  return 1;
}

uint64_t PageTensor::extent() const {
  uint64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) return 0;
    last += static_cast<uint64_t>(shape[i] - 1) * static_cast<uint64_t>(strides[i]);
  }
  return (last + 1) * TensorDtypeBytes(dtype);
}

namespace {

constexpr uint64_t kInt32Max = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
constexpr uint64_t kUint32Max = std::numeric_limits<uint32_t>::max();
// FlashMLA loads 16-byte vectors from each record (dense: TMA tiles; sparse: 128-bit loads of
// the e4m3 latent at record + 64 k): a block's records must start on 16 bytes.
constexpr uint64_t kKernelVectorBytes = 16;

// The pool's bytes must exist somewhere a kernel can read: host or device memory.
Status NeedBytes(const BlockPool& pool, uint32_t region) {
  if (pool.regions().kind(region) == RegionKind::kUnbacked) {
    return FailedPrecondition("backed", "the pool is bookkeeping only (unbacked): it holds no KV bytes to view");
  }
  return Status::Ok();
}

PageTensor View(const cuda::DevicePageView& v, const BlockPool& pool, uint64_t byte_offset, TensorDtype dtype,
                std::vector<int64_t> shape, std::vector<int64_t> strides) {
  PageTensor t;
  t.group = v.group;
  t.region = v.region;
  t.region_kind = pool.regions().kind(v.region);
  t.offset = byte_offset;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  return t;
}

// The block dimension and the token slots of a pool must be nameable by the kernels' int32
// indices (block id x tokens per block + offset), and a block stride by their int32 strides.
Status CheckInt32Slots(const BlockPool& pool, uint64_t tokens_per_block, uint64_t block_stride) {
  const Checked slots = Checked(pool.capacity()) * Checked(tokens_per_block);
  if (slots.overflowed() || slots.value() > kInt32Max) {
    return InvalidArgument("blocks", std::to_string(pool.capacity()) + " blocks of " +
                                         std::to_string(tokens_per_block) +
                                         " token slots exceed the kernel's int32 indices");
  }
  if (block_stride > kInt32Max) {
    return InvalidArgument(
        "blocks", "a block stride of " + std::to_string(block_stride) + " bytes exceeds the kernel's int32 strides");
  }
  return Status::Ok();
}

// selected[i] against request i's readable tokens (or entries); topk from the selections.
Result<uint32_t> SelectionWidth(std::span<const std::span<const uint64_t>> selected, std::span<const int32_t> limits,
                                uint32_t topk, std::string_view what) {
  if (selected.size() != limits.size()) {
    return InvalidArgument(
        "selected", std::to_string(selected.size()) + " selections for a batch of " + std::to_string(limits.size()));
  }
  size_t widest = 0;
  for (size_t i = 0; i < selected.size(); ++i) {
    if (selected[i].empty()) return InvalidArgument("selected", "request " + std::to_string(i) + " selects nothing");
    for (uint64_t p : selected[i]) {
      if (p >= static_cast<uint64_t>(limits[i])) {
        return InvalidArgument("selected", "request " + std::to_string(i) + " selects " + std::string(what) + " " +
                                               std::to_string(p) + " of " + std::to_string(limits[i]));
      }
    }
    widest = std::max(widest, selected[i].size());
  }
  if (topk == 0) topk = static_cast<uint32_t>(std::min<size_t>(widest, kUint32Max));
  if (widest > topk) {
    return InvalidArgument("topk", std::to_string(topk) + " is narrower than a selection of " + std::to_string(widest));
  }
  const Checked cells = Checked(selected.size()) * Checked(topk);
  if (cells.overflowed() || cells.value() > kInt32Max) return InvalidArgument("topk", "the index table overflows");
  return topk;
}

// indices[i][k] = table[i][e / per_block] x per_block + e % per_block for the selection's
// entries e, -1 past them.
void FillIndices(const cuda::PackedBlockTables& t, std::span<const std::span<const uint64_t>> selected,
                 uint32_t per_block, uint32_t topk, FlashMlaSparseArgs* out) {
  out->topk = topk;
  out->indices.assign(selected.size() * size_t{topk}, -1);
  out->topk_length.resize(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    for (size_t k = 0; k < selected[i].size(); ++k) {
      const uint64_t e = selected[i][k];
      const int32_t block = t.table[i * t.stride + e / per_block];
      out->indices[i * topk + k] = block * static_cast<int32_t>(per_block) + static_cast<int32_t>(e % per_block);
    }
    out->topk_length[i] = static_cast<int32_t>(selected[i].size());
  }
}

// The per-token latent group's view of `layer`, with its bytes present.
Result<cuda::DevicePageView> LatentView(const RequestManager& manager, uint32_t layer) {
  TESSERA_ASSIGN_OR_RETURN(cuda::DevicePageView v, cuda::LatentPageView(manager.pool(), layer));
  TESSERA_RETURN_IF_ERROR(NeedBytes(manager.pool(), v.region));
  return v;
}

const StateLayer* FindStateLayer(const RequestManager& manager, uint32_t layer) {
  if (manager.states() == nullptr) return nullptr;
  for (const StateLayer& s : manager.states()->layers()) {
    if (s.layer == layer) return &s;
  }
  return nullptr;
}

}  // namespace

Result<std::span<std::byte>> PageTensorBytes(const BlockPool& pool, const PageTensor& view) {
  if (view.region >= pool.regions().size()) return InvalidArgument("view", "no region " + std::to_string(view.region));
  if (pool.regions().kind(view.region) != RegionKind::kHost) {
    return FailedPrecondition("backed", "the view's region holds no host bytes (" +
                                            std::string(RegionKindName(pool.regions().kind(view.region))) + ")");
  }
  return pool.regions().ResolveChecked(BlockHandle{view.region, view.offset, view.extent()});
}

Result<uint64_t> PageTensorAddress(const BlockPool& pool, const PageTensor& view) {
  return pool.regions().DeviceAddress(BlockHandle{view.region, view.offset, view.extent()});
}

Result<FlashMlaDenseArgs> BuildFlashMlaDense(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, const MountOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(cuda::DevicePageView v, LatentView(manager, layer));
  if (v.format != cuda::PageFormat::kMlaBf16 || v.latent != 512 || v.rope != 64) {
    return InvalidArgument("kv-format", manager.pool().groups()[v.group].format.name +
                                            ": FlashMLA's dense decode reads mla-bf16 records of 512 + 64 "
                                            "(head_size_k 576, head_size_v 512)");
  }
  if (v.block_tokens != 64) {
    return InvalidArgument("block_tokens", std::to_string(v.block_tokens) +
                                               " tokens per block; FlashMLA's dense decode reads pages of 64 "
                                               "(\"Currently page_block_size must be 64\")");
  }
  TESSERA_ASSIGN_OR_RETURN(cuda::PackedBlockTables t, cuda::PackBlockTables(manager, requests, options.pending));
  FlashMlaDenseArgs a;
  a.k_cache = View(v, manager.pool(), v.layer_offset, TensorDtype::kBf16, {manager.pool().capacity(), 64, 1, 576},
                   {static_cast<int64_t>(v.block_stride / 2), 576, 576, 1});
  a.block_table = std::move(t.table);
  a.max_blocks = t.stride;
  a.cache_seqlens = std::move(t.seq_lens);
  return a;
}

Result<FlashMlaSparseArgs> BuildFlashMlaSparse(const RequestManager& manager, std::span<const RequestId> requests,
                                               uint32_t layer, std::span<const std::span<const uint64_t>> selected,
                                               uint32_t topk, const MountOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(cuda::DevicePageView v, LatentView(manager, layer));
  if (v.format != cuda::PageFormat::kFp8DsMla) {
    return InvalidArgument("kv-format", manager.pool().groups()[v.group].format.name +
                                            ": FlashMLA's sparse decode reads fp8_ds_mla records (656 B: 512 e4m3, "
                                            "4 fp32 scales, 64 bf16 rope)");
  }
  TESSERA_RETURN_IF_ERROR(CheckInt32Slots(manager.pool(), v.block_tokens, v.block_stride));
  TESSERA_ASSIGN_OR_RETURN(cuda::PackedBlockTables t, cuda::PackBlockTables(manager, requests, options.pending));
  TESSERA_ASSIGN_OR_RETURN(uint32_t width, SelectionWidth(selected, t.seq_lens, topk, "position"));
  FlashMlaSparseArgs a;
  a.k_cache = View(v, manager.pool(), v.layer_offset, TensorDtype::kUint8,
                   {manager.pool().capacity(), v.block_tokens, 1, kFp8DsMlaRecordBytes},
                   {static_cast<int64_t>(v.block_stride), kFp8DsMlaRecordBytes, kFp8DsMlaRecordBytes, 1});
  FillIndices(t, selected, v.block_tokens, width, &a);
  a.head_dim_qk = 576;
  return a;
}

Result<FlashMlaSparseArgs> BuildV4CompressedEntries(const RequestManager& manager, std::span<const RequestId> requests,
                                                    uint32_t layer, std::span<const std::span<const uint64_t>> selected,
                                                    uint32_t topk, const MountOptions& options) {
  const StateLayer* s = FindStateLayer(manager, layer);
  if (s == nullptr) return InvalidArgument("layer", "no DeepSeek-V4 layer " + std::to_string(layer));
  if (s->ratio == 0 || s->group < 0) {
    return InvalidArgument("layer", "layer " + std::to_string(layer) + " is window-only: it has no compressed entries");
  }
  const BlockPool& pool = manager.pool();
  const auto g = static_cast<uint32_t>(s->group);
  const PoolGroup& group = pool.groups()[g];
  const RecordFormat& f = group.format;
  if (f.family != FormatFamily::kV4Fp8 || f.plane_count() != 2 || f.plane_bytes(0) != kV4DataRowBytes ||
      f.plane_bytes(1) != kV4ScaleRowBytes) {
    return InvalidArgument("kv-format", f.name +
                                            ": FlashMLA's MODEL1 decode reads v4-fp8 entries (576-B rows of "
                                            "448 e4m3 + 64 bf16, then 8-B scale rows)");
  }
  const uint32_t per_block = s->entries_per_block;
  const BlockHandle slice = pool.PageHandle(BlockId{0}, g, s->group_layer);
  const uint64_t block_stride = pool.BlockHandleOf(BlockId{0}, g).len;
  if (slice.len < uint64_t{per_block} * f.record_bytes() || slice.offset % kKernelVectorBytes != 0 ||
      block_stride % kKernelVectorBytes != 0) {
    return InvalidArgument("kv-format", f.name + ": a layer slice at offset " + std::to_string(slice.offset) +
                                            " with block stride " + std::to_string(block_stride) +
                                            " is not 16-byte addressable");
  }
  TESSERA_RETURN_IF_ERROR(NeedBytes(pool, slice.region));
  TESSERA_RETURN_IF_ERROR(CheckInt32Slots(pool, per_block, block_stride));
  TESSERA_ASSIGN_OR_RETURN(cuda::PackedBlockTables t, cuda::PackBlockTables(manager, requests, options.pending));
  // Complete entries per request, and (HCA) every one of them when no selection is given.
  std::vector<int32_t> entries(t.seq_lens.size());
  for (size_t i = 0; i < entries.size(); ++i) entries[i] = t.seq_lens[i] / static_cast<int32_t>(s->ratio);
  std::vector<std::vector<uint64_t>> all;
  std::vector<std::span<const uint64_t>> spans;
  if (selected.empty()) {
    for (int32_t n : entries) {
      std::vector<uint64_t>& e = all.emplace_back(static_cast<size_t>(n));
      for (size_t k = 0; k < e.size(); ++k) e[k] = k;
    }
    for (const auto& e : all) spans.emplace_back(e);
    selected = spans;
  }
  TESSERA_ASSIGN_OR_RETURN(uint32_t width, SelectionWidth(selected, entries, topk, "entry"));
  FlashMlaSparseArgs a;
  cuda::DevicePageView v;
  v.group = g;
  v.region = slice.region;
  constexpr int64_t kRow = kV4DataRowBytes + kV4ScaleRowBytes;
  a.k_cache = View(v, pool, slice.offset, TensorDtype::kUint8, {pool.capacity(), per_block, 1, kRow},
                   {static_cast<int64_t>(block_stride), kRow, kRow, 1});
  FillIndices(t, selected, per_block, width, &a);
  a.head_dim_qk = 512;
  return a;
}

Status BuildV4Window(const RequestManager& manager, uint32_t layer) {
  if (manager.states() == nullptr) return InvalidArgument("model", "the model has no sliding window");
  if (FindStateLayer(manager, layer) == nullptr) {
    return InvalidArgument("layer", "no DeepSeek-V4 layer " + std::to_string(layer));
  }
  return FailedPrecondition(
      "window",
      "DeepSeek-V4's window rows live in each request's state arena (a ring of 584-B rows: data row then scale "
      "row), not in pages, and the manager hands them out only as a copy (LiveState); FlashMLA's MODEL1 "
      "extra cache reads blocks at 16-byte aligned addresses (rows 584 B apart are not), and DeepSeek's reference "
      "sparse_attn reads a dense bf16 kv per request. Mounting them needs a window in pages (ADR 0035)");
}

Result<IndexerKCacheArgs> BuildIndexerKCache(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, const MountOptions& options) {
  const BlockPool& pool = manager.pool();
  int32_t g = -1;
  for (size_t i = 0; i < pool.groups().size() && g < 0; ++i) {
    const PoolGroup& pg = pool.groups()[i];
    if (pg.format.use == FormatUse::kIndexer && pg.page.compress_ratio == 1) g = static_cast<int32_t>(i);
  }
  if (g < 0) return InvalidArgument("indexer-format", "the manager holds no per-token indexer pages");
  const PoolGroup& group = pool.groups()[static_cast<uint32_t>(g)];
  const RecordFormat& f = group.format;
  constexpr uint64_t kKey = 128, kRecord = kKey + 4;
  if (f.family != FormatFamily::kIndexer || f.record_bytes() != kRecord || f.regions.size() != 2 ||
      f.regions[0].type != ElementType::kFp8E4M3) {
    return InvalidArgument("indexer-format", f.name +
                                                 ": DeepGEMM's paged MQA logits read indexer-fp8 keys of 128 "
                                                 "e4m3 with one fp32 scale (132 B)");
  }
  if (f.packing != Packing::kRegionMajor) {
    return InvalidArgument("indexer-layout", f.name +
                                                 " pages are per-token; the kernel reads a block's keys, then its "
                                                 "scales (region-major, the default)");
  }
  if (layer >= group.layers) return InvalidArgument("layer", "no layer " + std::to_string(layer));
  const BlockHandle slice = pool.PageHandle(BlockId{0}, static_cast<uint32_t>(g), layer);
  const uint64_t block_stride = pool.BlockHandleOf(BlockId{0}, static_cast<uint32_t>(g)).len;
  TESSERA_RETURN_IF_ERROR(NeedBytes(pool, slice.region));
  TESSERA_RETURN_IF_ERROR(CheckInt32Slots(pool, group.page.block_tokens, block_stride));
  TESSERA_ASSIGN_OR_RETURN(cuda::PackedBlockTables t, cuda::PackBlockTables(manager, requests, options.pending));
  IndexerKCacheArgs a;
  cuda::DevicePageView v;
  v.group = static_cast<uint32_t>(g);
  v.region = slice.region;
  a.kv_cache = View(v, pool, slice.offset, TensorDtype::kUint8, {pool.capacity(), group.page.block_tokens, 1, kRecord},
                    {static_cast<int64_t>(block_stride), kRecord, kRecord, 1});
  a.scales_offset = uint64_t{group.page.block_tokens} * kKey;
  a.block_table = std::move(t.table);
  a.max_blocks = t.stride;
  a.context_lens = std::move(t.seq_lens);
  return a;
}

Result<FlashInferMlaArgs> BuildFlashInferMla(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, uint32_t q_len, const MountOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(cuda::DevicePageView v, LatentView(manager, layer));
  if (v.format != cuda::PageFormat::kMlaBf16) {
    return InvalidArgument("kv-format", manager.pool().groups()[v.group].format.name +
                                            ": FlashInfer's MLA reads bf16 ckv/kpe caches; its fp8 path needs fp8 "
                                            "rope with one kpe_scale and a contiguous ckv_scale_arr, while "
                                            "fp8_ds_mla keeps bf16 rope and per-token fp32 scales in the record");
  }
  if (v.block_stride / 2 > kUint32Max) {
    return InvalidArgument("block_stride", std::to_string(v.block_stride) +
                                               " bytes between blocks exceed the kernel's 32-bit element strides");
  }
  if (q_len == 0) return InvalidArgument("q_len", "0 query tokens");
  TESSERA_ASSIGN_OR_RETURN(cuda::PackedBlockTables t, cuda::PackBlockTables(manager, requests, options.pending));
  FlashInferMlaArgs a;
  a.page_size = v.block_tokens;
  a.head_dim_ckv = v.latent;
  a.head_dim_kpe = v.rope;
  const auto record = static_cast<int64_t>(v.record_bytes / 2);
  const std::vector<int64_t> strides{static_cast<int64_t>(v.block_stride / 2), record, 1};
  a.ckv_cache = View(v, manager.pool(), v.layer_offset, TensorDtype::kBf16,
                     {manager.pool().capacity(), v.block_tokens, v.latent}, strides);
  a.kpe_cache = View(v, manager.pool(), v.layer_offset + 2 * uint64_t{v.latent}, TensorDtype::kBf16,
                     {manager.pool().capacity(), v.block_tokens, v.rope}, strides);
  a.qo_indptr.push_back(0);
  a.kv_indptr.push_back(0);
  uint64_t pages = 0;
  for (size_t i = 0; i < t.seq_lens.size(); ++i) {
    const auto n = static_cast<uint32_t>(t.seq_lens[i]);
    if (q_len > n) {
      return InvalidArgument("q_len", std::to_string(q_len) + " query tokens for request " + std::to_string(i) +
                                          " of " + std::to_string(n) + " tokens");
    }
    const uint32_t need = (n + v.block_tokens - 1) / v.block_tokens;
    pages += need;
    if (pages * v.block_tokens > kUint32Max || (i + 1) * uint64_t{q_len} > kInt32Max) {
      return InvalidArgument("batch", "the batch's tokens exceed the kernel's 32-bit token positions");
    }
    for (uint32_t j = 0; j < need; ++j) a.kv_indices.push_back(t.table[i * t.stride + j]);
    a.kv_indptr.push_back(static_cast<int32_t>(pages));
    a.qo_indptr.push_back(static_cast<int32_t>((i + 1) * q_len));
    a.kv_len_arr.push_back(t.seq_lens[i]);
  }
  return a;
}

}  // namespace tessera::mounts
