#include "tessera/cuda_plan.h"

#include <algorithm>
#include <limits>
#include <string>

#include "tessera/checked.h"
#include "tessera/codec.h"

namespace tessera::cuda {
namespace {

// Byte offset of region `name` inside a per-token record, or -1.
int64_t RegionOffset(const RecordFormat& f, std::string_view name) {
  uint64_t bits = 0;
  for (const Region& r : f.regions) {
    if (r.name == name) return bits % 8 == 0 ? static_cast<int64_t>(bits / 8) : -1;
    bits += r.bits();
  }
  return -1;
}

const Region* FindRegion(const RecordFormat& f, std::string_view name) {
  for (const Region& r : f.regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace

Result<DevicePageView> LatentPageView(const BlockPool& pool, uint32_t layer) {
  const std::vector<PoolGroup>& groups = pool.groups();
  int64_t found = -1;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].page.compress_ratio == 1 && groups[i].format.use == FormatUse::kLatent) {
      found = static_cast<int64_t>(i);
      break;
    }
  }
  if (found < 0) return InvalidArgument("kv-format", "the pool holds no per-token latent pages");
  const auto gi = static_cast<uint32_t>(found);
  const PoolGroup& g = groups[gi];
  if (layer >= g.layers) return InvalidArgument("layer", "no layer " + std::to_string(layer));
  const RecordFormat& f = g.format;
  if (f.packing != Packing::kPerToken) return InvalidArgument("kv-format", f.name + " is not a per-token format");
  const Region* lat = FindRegion(f, "latent");
  const Region* rope = FindRegion(f, "rope");
  if (lat == nullptr || rope == nullptr) return InvalidArgument("kv-format", f.name + " has no latent and rope");
  DevicePageView v;
  if (f.family == FormatFamily::kFp8DsMla) {
    if (lat->count != kFp8DsMlaLatentDim || rope->count != kFp8DsMlaRopeDim ||
        f.record_bytes() != kFp8DsMlaRecordBytes) {
      return InvalidArgument("kv-format", "fp8_ds_mla needs a 512 + 64 latent");
    }
    v.format = PageFormat::kFp8DsMla;
  } else if (f.family == FormatFamily::kMlaLatent && f.single_element_type() &&
             f.regions[0].type == ElementType::kBf16 && f.regions.size() == 2 && RegionOffset(f, "latent") == 0 &&
             RegionOffset(f, "rope") == static_cast<int64_t>(2 * lat->count)) {
    v.format = PageFormat::kMlaBf16;
  } else {
    return InvalidArgument("kv-format", f.name + " is not a format the CUDA decode reads (mla-bf16, fp8_ds_mla)");
  }
  if (lat->count == 0 || lat->count > kMaxLatent || rope->count == 0 || rope->count > kMaxRope) {
    return InvalidArgument("kv-format", f.name + ": latent " + std::to_string(lat->count) + " + rope " +
                                            std::to_string(rope->count) + " exceeds the kernel's 512 + 64");
  }
  const BlockHandle b0 = pool.PageHandle(BlockId{0}, gi, layer);
  const BlockHandle b1 = pool.BlockHandleOf(BlockId{0}, gi);
  v.group = gi;
  v.region = b0.region;
  v.layer_offset = b0.offset;
  v.block_stride = b1.len;  // blocks of a group are laid out back to back
  v.record_bytes = static_cast<uint32_t>(f.record_bytes());
  v.block_tokens = g.page.entries_per_block;
  v.latent = static_cast<uint32_t>(lat->count);
  v.rope = static_cast<uint32_t>(rope->count);
  if (v.record_bytes % kRecordVectorBytes != 0 || v.block_stride % kRecordVectorBytes != 0 ||
      v.layer_offset % kRecordVectorBytes != 0) {
    return InvalidArgument("kv-format", f.name + ": records are not 16-byte addressable (record " +
                                            std::to_string(v.record_bytes) + " B, block stride " +
                                            std::to_string(v.block_stride) + " B)");
  }
  return v;
}

Result<PackedBlockTables> PackBlockTables(std::span<const std::span<const BlockId>> tables,
                                          std::span<const uint64_t> tokens, uint32_t block_tokens, uint32_t capacity) {
  if (tables.empty()) return InvalidArgument("requests", "an empty batch");
  if (tables.size() != tokens.size()) {
    return InvalidArgument(
        "requests", std::to_string(tables.size()) + " tables for " + std::to_string(tokens.size()) + " token counts");
  }
  if (block_tokens == 0) return InvalidArgument("block_tokens", "0 tokens per block");
  if (capacity > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("blocks", "a pool of " + std::to_string(capacity) + " blocks exceeds int32 ids");
  }
  size_t stride = 0;
  for (size_t i = 0; i < tables.size(); ++i) {
    const uint64_t n = tokens[i];
    if (n == 0) return InvalidArgument("tokens", "request " + std::to_string(i) + " holds no tokens");
    if (n > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return InvalidArgument(
          "tokens", "request " + std::to_string(i) + ": " + std::to_string(n) + " tokens exceed int32 positions");
    }
    const uint64_t need = (n + block_tokens - 1) / block_tokens;
    if (need > tables[i].size()) {
      return InvalidArgument("tokens", "request " + std::to_string(i) + ": " + std::to_string(n) + " tokens need " +
                                           std::to_string(need) + " blocks, its table holds " +
                                           std::to_string(tables[i].size()));
    }
    for (size_t j = 0; j < need; ++j) {
      const BlockId b = tables[i][j];
      if (!b.valid() || b.value >= capacity) {
        return InvalidArgument("blocks", "request " + std::to_string(i) + " slot " + std::to_string(j) +
                                             " names block " + std::to_string(b.value) + " outside a pool of " +
                                             std::to_string(capacity));
      }
    }
    stride = std::max<size_t>(stride, need);
  }
  const Checked cells = Checked(tables.size()) * Checked(stride);
  if (cells.overflowed() || cells.value() > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("batch", "a block table of " + std::to_string(tables.size()) + " x " +
                                        std::to_string(stride) + " entries exceeds int32 indexing");
  }
  PackedBlockTables out;
  out.stride = static_cast<uint32_t>(stride);
  out.table.assign(cells.value(), -1);
  out.seq_lens.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    const uint64_t need = (tokens[i] + block_tokens - 1) / block_tokens;
    for (size_t j = 0; j < need; ++j) out.table[i * stride + j] = static_cast<int32_t>(tables[i][j].value);
    out.seq_lens[i] = static_cast<int32_t>(tokens[i]);
  }
  return out;
}

Result<PackedBlockTables> PackBlockTables(const RequestManager& manager, std::span<const RequestId> requests,
                                          uint32_t pending) {
  std::vector<std::span<const BlockId>> tables;
  std::vector<uint64_t> tokens;
  tables.reserve(requests.size());
  tokens.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    std::span<const BlockId> t = manager.BlockTable(requests[i]);
    const uint64_t n = manager.Tokens(requests[i]);
    if (t.empty() && n == 0) {
      return InvalidArgument("requests", "request " + std::to_string(requests[i].value) + " (batch index " +
                                             std::to_string(i) + ") is not held by the manager");
    }
    tables.push_back(t);
    const Checked total = Checked(n) + Checked(pending);
    if (total.overflowed()) return InvalidArgument("tokens", "request " + std::to_string(i) + " overflows");
    tokens.push_back(total.value());
  }
  return PackBlockTables(tables, tokens, manager.block_tokens(), manager.pool().capacity());
}

Result<DecodePlan> PlanDecode(std::span<const int32_t> seq_lens, const DecodeShape& shape, const DeviceLimits& limits) {
  if (seq_lens.empty()) return InvalidArgument("seq_lens", "an empty batch");
  if (shape.heads == 0) return InvalidArgument("heads", "0 heads");
  if (shape.latent == 0 || shape.latent > kMaxLatent) {
    return InvalidArgument("latent", std::to_string(shape.latent) + " (1.." + std::to_string(kMaxLatent) + ")");
  }
  if (shape.rope == 0 || shape.rope > kMaxRope) {
    return InvalidArgument("rope", std::to_string(shape.rope) + " (1.." + std::to_string(kMaxRope) + ")");
  }
  if (shape.block_tokens == 0) return InvalidArgument("block_tokens", "0 tokens per block");
  if (limits.sm_count == 0 || limits.ctas_per_sm == 0) return InvalidArgument("sm_count", "no multiprocessors");
  uint64_t total = 0;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    if (seq_lens[i] <= 0) {
      return InvalidArgument("seq_lens",
                             "request " + std::to_string(i) + " has " + std::to_string(seq_lens[i]) + " tokens");
    }
    total += static_cast<uint64_t>(seq_lens[i]);
  }
  DecodePlan p;
  p.tokens = total;
  p.heads_per_cta = std::min(shape.heads, kMaxHeadsPerCta);
  p.head_groups = (shape.heads + p.heads_per_cta - 1) / p.heads_per_cta;
  // CTAs wanted over the whole batch, shared between the head groups of each item.
  const uint64_t target = uint64_t{limits.sm_count} * limits.ctas_per_sm;
  const uint64_t want_items = std::max<uint64_t>(1, (target + p.head_groups - 1) / p.head_groups);
  uint64_t chunk = (total + want_items - 1) / want_items;
  chunk = std::max<uint64_t>(chunk, shape.block_tokens);
  chunk = (chunk + shape.block_tokens - 1) / shape.block_tokens * shape.block_tokens;
  chunk = std::min<uint64_t>(chunk, static_cast<uint64_t>(std::numeric_limits<int32_t>::max()));
  p.chunk_tokens = static_cast<uint32_t>(chunk);
  p.split_offset.reserve(seq_lens.size() + 1);
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    p.split_offset.push_back(static_cast<int32_t>(p.items.size()));
    const uint64_t n = static_cast<uint64_t>(seq_lens[i]);
    int32_t split = 0;
    for (uint64_t b = 0; b < n; b += chunk, ++split) {
      p.items.push_back(WorkItem{static_cast<int32_t>(i), split, static_cast<int32_t>(b),
                                 static_cast<int32_t>(std::min(n, b + chunk))});
    }
  }
  p.split_offset.push_back(static_cast<int32_t>(p.items.size()));
  p.grid_x = p.items.size();
  p.partial_floats = p.items.size() * uint64_t{shape.heads} * shape.latent;
  p.lse_floats = p.items.size() * uint64_t{shape.heads};
  const uint64_t row = uint64_t{shape.latent} + shape.rope + 1;  // +1: shared-memory bank padding
  p.shared_bytes = 4 * (uint64_t{p.heads_per_cta} * row + uint64_t{kTileTokens} * row +
                        uint64_t{p.heads_per_cta} * kTileTokens + 4 * uint64_t{p.heads_per_cta});
  return p;
}

Result<TransferPlan> PlanTransfers(std::span<const BlockHandle> blocks, uint64_t staging_bytes) {
  if (blocks.empty()) return InvalidArgument("blocks", "an empty batch");
  const uint64_t half = staging_bytes / 2;
  std::vector<uint32_t> order(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockHandle& h = blocks[i];
    if (h.len == 0) return InvalidArgument("blocks", "block " + std::to_string(i) + " has no bytes");
    if (h.offset > std::numeric_limits<uint64_t>::max() - h.len) {
      return InvalidArgument("blocks", "block " + std::to_string(i) + " overflows its region");
    }
    if (h.len > half) {
      return InvalidArgument("staging-bytes", "block " + std::to_string(i) + " of " + std::to_string(h.len) +
                                                  " bytes does not fit half of a " + std::to_string(staging_bytes) +
                                                  "-byte staging buffer");
    }
    order[i] = static_cast<uint32_t>(i);
  }
  // Overlap: sort by (region, offset) and compare neighbours.
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return blocks[a].region != blocks[b].region ? blocks[a].region < blocks[b].region
                                                : blocks[a].offset < blocks[b].offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    if (blocks[order[k - 1]].Overlaps(blocks[order[k]])) {
      return InvalidArgument("blocks", "blocks " + std::to_string(order[k - 1]) + " and " + std::to_string(order[k]) +
                                           " overlap in region " + std::to_string(blocks[order[k]].region));
    }
  }
  TransferPlan plan;
  plan.half_bytes = half;
  TransferRound round;
  auto flush = [&] {
    if (round.items.empty()) return;
    plan.bytes += round.bytes;
    plan.copies += round.copies.size();
    plan.rounds.push_back(std::move(round));
    round = TransferRound{};
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockHandle& h = blocks[i];
    if (round.bytes + h.len > half) flush();
    round.items.push_back(static_cast<uint32_t>(i));
    round.item_offset.push_back(round.bytes);
    TransferCopy* last = round.copies.empty() ? nullptr : &round.copies.back();
    if (last != nullptr && last->device.region == h.region && last->device.offset + last->device.len == h.offset &&
        last->staging_offset + last->device.len == round.bytes) {
      last->device.len += h.len;
    } else {
      round.copies.push_back(TransferCopy{round.bytes, h});
    }
    round.bytes += h.len;
  }
  flush();
  return plan;
}

}  // namespace tessera::cuda
