// Kernel arguments over Tessera's pages, zero-copy (ADR 0035): for a batch of a request manager's
// running requests, the tensors and index arrays an upstream attention kernel takes, with the KV
// tensors as strided views of the pool's own bytes (nothing is copied or repacked).
//
// Each builder follows one kernel's signature at one pinned version (named in its comment; the
// table in docs/ATTENTION.md says how each was checked against the kernel's own reference) and
// refuses, naming the argument, a layout that kernel cannot read. What is mounted:
//   FlashMLA dense decode      k_cache bf16 [blocks, 64, 1, 576] of mla-bf16 pages
//   FlashMLA sparse decode     k_cache uint8 [blocks, block_tokens, 1, 656] of fp8_ds_mla pages,
//                              indices from a top-k (the V3.2 indexer's)
//   FlashInfer MLA (paged)     ckv_cache bf16 [blocks, block_tokens, 512] and kpe_cache
//                              [blocks, block_tokens, 64]: two views of the same mla-bf16 records
//   FlashMLA sparse, MODEL1    DeepSeek-V4's compressed entries (CSA, HCA): k_cache uint8
//                              [blocks, entries per block, 1, 584] of a v4-fp8 layer's slices
// and what is refused, with why: DeepSeek-V4's window rows (they live in the request's state
// arena, 584 B apart, not in pages) and DeepSeek's V4 reference kernel's dense bf16 `kv`.
//
// A view (PageTensor) names a pool region, the byte offset of its element [0, ..., 0] and its
// shape and strides in elements; PageTensorBytes resolves it to host bytes, PageTensorAddress to
// a device address (a pool in device memory, ADR 0025). The block dimension spans the whole pool
// (every block id is addressable); the index arrays name only the blocks the batch's requests
// hold. Views stay valid while the manager lives; what they address changes as requests write,
// and bytes of sealed blocks must not be written through them (the content index and the tiers
// take sealed bytes as final).
//
// Thread-safety: pure functions over a manager the caller does not mutate meanwhile.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/memory.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"

namespace tessera::mounts {

// The pinned upstream versions the builders follow.
inline constexpr std::string_view kFlashMlaVersion = "deepseek-ai/FlashMLA 9241ae3ef9bac614dd25e45e507e089f888280e0";
inline constexpr std::string_view kFlashInferVersion =
    "flashinfer-ai/flashinfer 0.6.18 (fb28d7242b3506a2348265962041acc1fb56cca4)";

enum class TensorDtype : uint8_t { kBf16, kUint8, kInt32, kFloat32 };
std::string_view TensorDtypeName(TensorDtype dtype);  // "bfloat16", "uint8", "int32", "float32"
uint32_t TensorDtypeBytes(TensorDtype dtype);

// A strided view of a pool group's bytes, as a kernel's tensor argument. Element [i0, i1, ...]
// is at byte offset + (i0 strides[0] + i1 strides[1] + ...) x dtype bytes of `region`.
struct PageTensor {
  uint32_t group = 0;
  uint32_t region = 0;
  RegionKind region_kind = RegionKind::kHost;
  uint64_t offset = 0;  // bytes from the region's start to element [0, ..., 0]
  TensorDtype dtype = TensorDtype::kUint8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  // Bytes from `offset` to one past the last byte any element occupies.
  uint64_t extent() const;
};

// Host bytes [offset, offset + extent()) of a view of a backed pool. kFailedPrecondition on
// "backed" for a pool whose region holds no host bytes; kInvalidArgument on "view" for a view
// outside its region.
Result<std::span<std::byte>> PageTensorBytes(const BlockPool& pool, const PageTensor& view);
// The device address of element [0, ..., 0] of a view of a device pool; the region's error
// otherwise (kInvalidArgument on "handle" for a host or unbacked region).
Result<uint64_t> PageTensorAddress(const BlockPool& pool, const PageTensor& view);

// What every builder takes besides the batch and the layer.
struct MountOptions {
  // Tokens each request holds beyond manager.Tokens(): a decode token whose record the engine
  // writes into its slot before the kernel runs (the slot must be allocated).
  uint32_t pending = 0;
};

// ---- FlashMLA dense decode --------------------------------------------------------------------
// flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata)
// at kFlashMlaVersion (flash_mla/flash_mla_interface.py; checks in csrc/api/dense_decode.h).
// get_mla_metadata() takes no arguments at that version: the first call plans from
// cache_seqlens (and, for the sparse path, indices and topk_length).
struct FlashMlaDenseArgs {
  PageTensor k_cache;                // bf16 [capacity, 64, 1, 576], strides [block stride, 576, 576, 1]
  std::vector<int32_t> block_table;  // [batch, max_blocks] row-major, -1 past a request's blocks
  uint32_t max_blocks = 0;
  std::vector<int32_t> cache_seqlens;  // [batch]
  uint32_t head_dim_v = 512;           // V is the first 512 dims of K (the latent)
};
// Errors (kInvalidArgument unless said): "kv-format" (not mla-bf16 of a 512 + 64 latent: the
// kernel reads head_size_k 576 with head_size_v 512), "block_tokens" (not 64: "Currently
// page_block_size must be 64"), "layer", "backed" (kFailedPrecondition: an unbacked pool holds
// no KV bytes to view), and PackBlockTables' "requests", "tokens", "blocks", "batch".
Result<FlashMlaDenseArgs> BuildFlashMlaDense(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, const MountOptions& options = {});

// ---- FlashMLA sparse decode (DeepSeek-V3.2, and V4's MODEL1 entries) ------------------------
// flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=...,
// topk_length=...) at kFlashMlaVersion (checks in csrc/api/sparse_decode.h). The same three
// arguments serve as extra_k_cache / extra_indices_in_kvcache / extra_topk_length.
struct FlashMlaSparseArgs {
  PageTensor k_cache;  // uint8 [capacity, tokens per block, 1, record] (656 V3.2, 584 MODEL1)
  // [batch, 1, topk] row-major: block id x tokens per block + offset in the block (the layout
  // FlashMLA's tests/quant.py abs_indices2indices_in_kvcache builds), -1 past a request's selection.
  std::vector<int32_t> indices;
  uint32_t topk = 0;
  std::vector<int32_t> topk_length;  // [batch]: how many of a request's indices are valid
  uint32_t head_dim_qk = 0;          // the q the kernel expects: 576 (V3.2) or 512 (MODEL1)
  uint32_t head_dim_v = 512;
};

// DeepSeek-V3.2: `selected[i]` are the positions request i attends (its indexer's top-k; any
// order, kept), each below its tokens (+ pending). topk = `topk` when non-zero (every selection
// must fit), else the longest selection. Errors: "kv-format" (the per-token latent group is not
// fp8_ds_mla), "selected" (a batch/selection count mismatch, an empty selection, a position not
// written), "topk", "layer", "backed", and the block-table errors above; "blocks" when a pool's
// token slots exceed int32 indices or its block stride the kernel's int32 stride.
Result<FlashMlaSparseArgs> BuildFlashMlaSparse(const RequestManager& manager, std::span<const RequestId> requests,
                                               uint32_t layer, std::span<const std::span<const uint64_t>> selected,
                                               uint32_t topk = 0, const MountOptions& options = {});

// DeepSeek-V4: the compressed entries of model layer `layer` (a CSA layer, ratio 4, or an HCA
// layer, ratio 128) as MODEL1 records: each v4-fp8 slice of a block is entries x 576-B rows then
// entries x 8-B scale rows, which is how the kernel reads a block (data at row x 576, scales at
// entries x 576 + row x 8). `selected[i]`: the entries request i attends (CSA: its indexer's
// top-k), or, when `selected` is empty, every complete entry of every request (HCA). Errors:
// "layer" (no such layer, or a window-only layer: it has no entries), "kv-format" (the entries
// are not v4-fp8 of 448 + 64), "selected" (an entry not complete), "topk", "backed", "requests".
Result<FlashMlaSparseArgs> BuildV4CompressedEntries(const RequestManager& manager, std::span<const RequestId> requests,
                                                    uint32_t layer, std::span<const std::span<const uint64_t>> selected,
                                                    uint32_t topk = 0, const MountOptions& options = {});

// DeepSeek-V4's window rows, for FlashMLA's MODEL1 (extra) cache or DeepSeek's reference
// sparse_attn: always kFailedPrecondition on "window", with the reason (the rows live in the
// request's state arena, 584 B apart, not 16-B aligned, and the manager exposes them only as a
// copy; the reference kernel's `kv` is a dense bf16 tensor per request). Kept as a function so
// that an engine asking gets the reason, and a test pins it.
Status BuildV4Window(const RequestManager& manager, uint32_t layer);

// ---- DeepGEMM paged MQA logits (DeepSeek-V3.2's lightning indexer) --------------------------
// fp8_paged_mqa_logits(q_fp8, kv_cache, weights, context_lens, block_table, schedule_metadata,
// max_model_len) as vLLM calls it (local-inference-lab/vllm 28be48fa9,
// vllm/model_executor/layers/sparse_attn_indexer.py blob e2fd09ed: its [blocks, block_size, 132]
// indexer cache unsqueezed to [blocks, block_size, 1, 132]). The kernel reads each block
// region-major, as vLLM's indexer_k_quant_and_cache_kernel writes it: block_size x 128 e4m3 keys,
// then block_size fp32 scales (ADR 0043) — Tessera's default indexer-fp8 layout, the same bytes
// at the same offsets.
struct IndexerKCacheArgs {
  PageTensor kv_cache;               // uint8 [capacity, block_tokens, 1, 132], strides [block stride, 132, 132, 1]
  uint64_t scales_offset = 0;        // bytes from a block's start to its first scale: block_tokens x 128
  std::vector<int32_t> block_table;  // [batch, max_blocks] row-major, -1 past a request's blocks
  uint32_t max_blocks = 0;
  std::vector<int32_t> context_lens;  // [batch]
};
// Errors: "indexer-format" (no per-token indexer pages, or not indexer-fp8 of 128 dims),
// "indexer-layout" (per-token pages: each key beside its scale is not what the kernel reads),
// "layer", "backed", "blocks" (int32 slots or strides), and the block-table errors.
Result<IndexerKCacheArgs> BuildIndexerKCache(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, const MountOptions& options = {});

// ---- FlashInfer MLA ---------------------------------------------------------------------------
// BatchMLAPagedAttentionWrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads,
// head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type) and
// .run(q_nope, q_pe, ckv_cache, kpe_cache) at kFlashInferVersion (flashinfer/mla/_core.py;
// csrc/batch_mla_run.cu reads the caches' page and token strides, 32-bit, in elements).
struct FlashInferMlaArgs {
  PageTensor ckv_cache;             // bf16 [capacity, page_size, 512], strides [block stride, 576, 1]
  PageTensor kpe_cache;             // bf16 [capacity, page_size, 64], the same records from byte 1,024
  std::vector<int32_t> qo_indptr;   // [batch + 1]: query q_len tokens per request
  std::vector<int32_t> kv_indptr;   // [batch + 1]
  std::vector<int32_t> kv_indices;  // [kv_indptr[batch]]: the requests' block ids in order
  std::vector<int32_t> kv_len_arr;  // [batch]
  uint32_t head_dim_ckv = 512;
  uint32_t head_dim_kpe = 64;
  uint32_t page_size = 0;
};
// q_len: query tokens per request (1 for decode). Errors: "kv-format" (not mla-bf16: fp8_ds_mla
// keeps bf16 rope and per-token fp32 scales inside the record, while FlashInfer's fp8 MLA reads
// fp8 rope with one kpe_scale and a contiguous ckv_scale_arr), "block_stride" (a page stride past
// the kernel's 32-bit element strides), "q_len" (0, or more than a request's tokens), "batch"
// (more tokens than its 32-bit token positions), "layer", "backed", and the block-table errors.
Result<FlashInferMlaArgs> BuildFlashInferMla(const RequestManager& manager, std::span<const RequestId> requests,
                                             uint32_t layer, uint32_t q_len = 1, const MountOptions& options = {});

}  // namespace tessera::mounts
