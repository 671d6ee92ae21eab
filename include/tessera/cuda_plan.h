// Host-side planning for the CUDA paged MLA decode and the tier transfers (ADR 0025).
//
// Everything a launch needs that can be computed, and checked, without a GPU: where a layer's
// records sit in a pool group's region (DevicePageView), the manager's block tables packed into
// the kernel's int32 table (PackBlockTables), the split-K work list of a batch of requests of
// different lengths (PlanDecode), and the rounds and coalesced copies of a batched transfer
// through a staging buffer (PlanTransfers). The CUDA library (cuda_device.h) only executes these
// plans; CI runs their tests on machines without a GPU, under the sanitizers too.
//
// Thread-safety: pure functions over values (and a manager the caller does not mutate meanwhile).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/memory.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"

namespace tessera::cuda {

// The record encodings the kernel reads (ADR 0017's decode formats).
enum class PageFormat : uint32_t {
  kMlaBf16 = 0,   // latent then rope, little-endian bf16 (mla-bf16)
  kFp8DsMla = 1,  // 512 e4m3 + 4 fp32 tile scales + 64 bf16 rope: 656 bytes (fp8_ds_mla)
};

// The kernel's largest dims: a CTA keeps a query row and a token row of latent + rope in shared
// memory (DeepSeek-V2/V3/V3.2, Kimi-K2 and the tiny models are all 512 + 64).
constexpr uint32_t kMaxLatent = 512;
constexpr uint32_t kMaxRope = 64;
// The kernel loads records in 16-byte vectors: record bytes, block stride and layer offset must be
// multiples of this (every mla-bf16 record of an 8-multiple width, and fp8_ds_mla, are).
constexpr uint64_t kRecordVectorBytes = 16;

// Where the records of one layer of one pool group sit: the record of token entry `e` of block
// `b` is at region base + layer_offset + b * block_stride + e * record_bytes (ADR 0020's
// in-place addressing; the same for packed and unpacked groups).
struct DevicePageView {
  uint32_t group = 0;
  uint32_t region = 0;        // the pool's region of the group
  uint64_t layer_offset = 0;  // the layer's slice in block 0
  uint64_t block_stride = 0;  // bytes from one block of the group to the next
  uint32_t record_bytes = 0;
  uint32_t block_tokens = 0;  // entries per block (per-token groups: the block span)
  uint32_t latent = 0;
  uint32_t rope = 0;
  PageFormat format = PageFormat::kMlaBf16;
};

// The per-token latent group the decode reads (the first kLatent group of compress ratio 1, as
// PagedLayer::Of picks it). Errors: "kv-format" when there is none or its format is not one the
// kernel reads (mla-bf16, fp8_ds_mla) or exceeds kMaxLatent / kMaxRope or is not 16-byte
// addressable; "layer" when the group has no such layer.
Result<DevicePageView> LatentPageView(const BlockPool& pool, uint32_t layer);

// The manager's block tables as the kernel reads them: table[i * stride + j] is the j-th block id
// of request i (-1 past its blocks), seq_lens[i] its tokens (plus one when `pending` counts a
// token being computed, ADR 0017's SetPending).
struct PackedBlockTables {
  std::vector<int32_t> table;
  std::vector<int32_t> seq_lens;
  uint32_t stride = 0;  // max blocks per request in the batch
};

// From explicit tables (ids of one pool of `capacity` blocks, each table covering its tokens at
// `block_tokens` per block). Errors (kInvalidArgument, nothing returned): "requests" for an empty
// batch or mismatched spans, "tokens" for a request of 0 tokens or more tokens than its blocks
// hold or than int32 can index, "blocks" for an id that is invalid or >= capacity, "batch" when
// the table's size overflows.
Result<PackedBlockTables> PackBlockTables(std::span<const std::span<const BlockId>> tables,
                                          std::span<const uint64_t> tokens, uint32_t block_tokens, uint32_t capacity);
// From a manager: each request's BlockTable and Tokens (+ `pending`). "requests" names a request
// the manager does not hold.
Result<PackedBlockTables> PackBlockTables(const RequestManager& manager, std::span<const RequestId> requests,
                                          uint32_t pending = 0);

// What the launch planner needs of the device (cudaDeviceProp, or fixed values in tests).
struct DeviceLimits {
  uint32_t sm_count = 0;
  uint32_t ctas_per_sm = 2;  // resident decode CTAs per SM the plan aims to fill
};

struct DecodeShape {
  uint32_t heads = 0;
  uint32_t latent = 0;
  uint32_t rope = 0;
  uint32_t block_tokens = 0;
};

// One CTA's share of the decode: tokens [begin, end) of request `request`, written as split
// `split` of that request's partial results, for heads [head_group * heads_per_cta, ...).
struct WorkItem {
  int32_t request = 0;
  int32_t split = 0;
  int32_t begin = 0;
  int32_t end = 0;
};

// Flash-decoding: a request's tokens are cut into chunks of `chunk_tokens` (a multiple of the
// block span, so a chunk starts at a block boundary) sized so that the whole batch makes about
// sm_count x ctas_per_sm CTAs together with the head groups; each chunk is one work item, whose
// partial output and log-sum-exp a combine pass merges. Requests of different lengths get
// different numbers of splits; no CTA is idle for a short request.
struct DecodePlan {
  uint32_t heads_per_cta = 0;
  uint32_t head_groups = 0;  // ceil(heads / heads_per_cta)
  uint32_t chunk_tokens = 0;
  std::vector<WorkItem> items;        // request-major, splits in order
  std::vector<int32_t> split_offset;  // request i's items: [split_offset[i], split_offset[i + 1])
  uint64_t grid_x = 0;                // items.size()
  uint64_t partial_floats = 0;        // items x heads x latent: the split kernel's partial outputs
  uint64_t lse_floats = 0;            // items x heads
  uint64_t shared_bytes = 0;          // dynamic shared memory of one split CTA
  uint64_t tokens = 0;                // sum of the sequence lengths
};
// Heads one CTA handles (the kernel's shared-memory rows): min(heads, 16).
constexpr uint32_t kMaxHeadsPerCta = 16;
// Tokens a CTA stages per step.
constexpr uint32_t kTileTokens = 16;

// Errors (kInvalidArgument): "seq_lens" empty or holding a length <= 0; "heads", "latent", "rope",
// "block_tokens" zero or beyond the kernel's limits; "sm_count" zero.
Result<DecodePlan> PlanDecode(std::span<const int32_t> seq_lens, const DecodeShape& shape, const DeviceLimits& limits);

// ---- Transfers --------------------------------------------------------------------------------

// One block's bytes moved between a staging buffer and device pages: staging
// [staging_offset, +bytes) <-> `device`.
struct TransferCopy {
  uint64_t staging_offset = 0;
  BlockHandle device;
};
// Items go through a staging buffer of `staging_bytes` split in two halves: a round fills one half
// (the host side: verify and copy in, or copy out and verify) while the other half's copies run.
// Within a round, items whose device ranges follow each other in one region (as consecutive
// block ids of one group do) and whose staging ranges follow each other become one copy.
struct TransferRound {
  std::vector<uint32_t> items;        // indices into the batch, in batch order
  std::vector<uint64_t> item_offset;  // each item's offset in the round's half
  std::vector<TransferCopy> copies;   // coalesced; staging offsets relative to the half
  uint64_t bytes = 0;
};
struct TransferPlan {
  uint64_t half_bytes = 0;
  std::vector<TransferRound> rounds;
  uint64_t bytes = 0;
  uint64_t copies = 0;
};
// Errors (kInvalidArgument): "blocks" for an empty batch, a zero-length handle or two handles that
// overlap (the copies of a batch run concurrently); "staging-bytes" when one item does not fit in
// half of the staging buffer.
Result<TransferPlan> PlanTransfers(std::span<const BlockHandle> blocks, uint64_t staging_bytes);

}  // namespace tessera::cuda
