#include "tessera/block_record.h"

#include <cstring>
#include <string>

#include <xxhash.h>

namespace tessera {

namespace {

constexpr uint32_t kRecordMagic = 0x52425354;  // "TSBR"
constexpr uint16_t kRecordVersion = 2;
constexpr size_t kFixedHeader = 104;
constexpr size_t kDataAlign = 64;

size_t DataOffset(uint32_t block_tokens) {
  size_t end = kFixedHeader + size_t{block_tokens} * sizeof(uint32_t);
  return (end + kDataAlign - 1) / kDataAlign * kDataAlign;
}

template <typename T>
void Put(std::vector<std::byte>& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof v);
}
template <typename T>
T Read(std::span<const std::byte> in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof v);
  return v;
}

}  // namespace

BlockRecordInfo BlockRecordInfoOf(const BlockPool& pool) {
  BlockRecordInfo info;
  info.block_tokens = pool.block_tokens();
  info.groups = static_cast<uint32_t>(pool.groups().size());
  info.page_bytes = pool.block_bytes();
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(st, p, n); };
  add(&info.block_tokens, sizeof info.block_tokens);
  for (const PoolGroup& g : pool.groups()) {
    add(g.name.data(), g.name.size() + 1);
    add(g.format.name.data(), g.format.name.size() + 1);
    add(&g.layers, sizeof g.layers);
    add(&g.page.page_bytes, sizeof g.page.page_bytes);
    add(&g.page.record_bytes, sizeof g.page.record_bytes);
    add(&g.page.entries_per_block, sizeof g.page.entries_per_block);
    // Packed pages place slices differently (ADR 0020); unpacked fingerprints stay as they were.
    if (g.page.packed()) add(&g.page.layers_per_page, sizeof g.page.layers_per_page);
  }
  info.fingerprint = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return info;
}

std::vector<std::byte> EncodeBlockRecord(const BlockRecordInfo& info, const BlockPool& pool, BlockId b,
                                         const SealedIdentity& id) {
  const size_t data = DataOffset(info.block_tokens);
  std::vector<std::byte> out(data + info.page_bytes + id.state.size());
  Put(out, 0, kRecordMagic);
  Put(out, 4, kRecordVersion);
  Put(out, 8, info.block_tokens);
  Put(out, 12, info.groups);
  Put(out, 16, info.fingerprint);
  Put(out, 24, id.domain);
  Put(out, 32, id.salt);
  Put(out, 40, id.key);
  Put(out, 56, id.parent_key);
  Put(out, 72, id.cache_identity);
  Put(out, 88, info.page_bytes);
  Put(out, 96, static_cast<uint64_t>(id.state.size()));
  std::memcpy(out.data() + kFixedHeader, id.tokens.data(), id.tokens.size_bytes());
  size_t off = data;
  for (uint32_t g = 0; g < info.groups; ++g) {
    std::span<const std::byte> bytes = pool.Bytes(pool.BlockHandleOf(b, g));
    std::memcpy(out.data() + off, bytes.data(), bytes.size());
    off += bytes.size();
  }
  if (!id.state.empty()) std::memcpy(out.data() + off, id.state.data(), id.state.size());
  return out;
}

size_t BlockRecordDataOffset(const BlockRecordInfo& info) { return DataOffset(info.block_tokens); }

Status CheckBlockRecordHead(const BlockRecordInfo& info, std::span<const std::byte> payload, uint64_t payload_len,
                            const ChainLink& link) {
  const size_t data = DataOffset(info.block_tokens);
  if (payload_len < data + info.page_bytes || payload.size() < data) {
    return DataLoss("record", "length " + std::to_string(payload_len) + ", expected at least " +
                                  std::to_string(data + info.page_bytes));
  }
  const uint64_t state_bytes = Read<uint64_t>(payload, 96);
  if (state_bytes != payload_len - data - info.page_bytes) {
    return DataLoss("record", "length " + std::to_string(payload_len) + " does not match its state length " +
                                  std::to_string(state_bytes));
  }
  if (Read<uint32_t>(payload, 0) != kRecordMagic || Read<uint16_t>(payload, 4) != kRecordVersion) {
    return DataLoss("record", "not a block record of version 2");
  }
  if (Read<uint32_t>(payload, 8) != info.block_tokens || Read<uint32_t>(payload, 12) != info.groups ||
      Read<uint64_t>(payload, 16) != info.fingerprint || Read<uint64_t>(payload, 88) != info.page_bytes) {
    return DataLoss("record", "another block layout (model, format or block size)");
  }
  if (Read<Hash128>(payload, 72) != link.cache_identity) {
    return DataLoss("record", "another cache identity (model config, weights or layout)");
  }
  if (Read<Hash128>(payload, 40) != link.key) return DataLoss("record", "prefix key differs");
  if (Read<Hash128>(payload, 56) != link.parent_key) {
    return DataLoss("record", "parent key differs");
  }
  if (Read<uint32_t>(payload, 24) != link.domain || Read<uint64_t>(payload, 32) != link.salt) {
    return DataLoss("record", "tenant domain or salt differs");
  }
  if (link.tokens.size() != info.block_tokens ||
      std::memcmp(payload.data() + kFixedHeader, link.tokens.data(), link.tokens.size_bytes()) != 0) {
    return DataLoss("record", "stored tokens differ from the prompt's");
  }
  return Status::Ok();
}

Result<BlockRecordView> CheckBlockRecord(const BlockRecordInfo& info, std::span<const std::byte> payload,
                                         const ChainLink& link) {
  TESSERA_RETURN_IF_ERROR(CheckBlockRecordHead(info, payload, payload.size(), link));
  const size_t data = DataOffset(info.block_tokens);
  return BlockRecordView{payload.subspan(data, info.page_bytes), payload.subspan(data + info.page_bytes)};
}

}  // namespace tessera
