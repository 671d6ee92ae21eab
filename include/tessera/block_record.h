// Block records: the payload a tier stores for one sealed block of a pool, and the check that a
// record read back is exactly the block a prompt asks for (docs/adr/0013-tiered-store.md).
//
// A record carries, besides the block's bytes, everything needed to prove it is the block of one
// prefix: the tokens, parent key, tenant domain, salt, prefix key, cache identity (model config,
// weights revision, layout) and a fingerprint of the pool layout. A tier's checksum or MAC only
// says the bytes are the ones it stored; CheckBlockRecord says they belong here.
//
// Layout (little-endian):
//   0  magic "TSBR", u16 version, u16 reserved
//   8  u32 block_tokens, u32 groups
//  16  u64 layout fingerprint (groups' names, formats, layers, page bytes, block tokens)
//  24  u32 domain, u32 reserved
//  32  u64 salt
//  40  prefix key (16), parent key (16)
//  72  cache identity (16): model config, weights revision, layout (CacheIdentityKey)
//  88  u64 page bytes (every layer of every group)
//  96  u64 state bytes (a hybrid model's boundary state; 0 for none)
// 104  u32 tokens[block_tokens], then zero padding to 64 bytes, then each group's block bytes,
//      then the state.
//
// Thread-safety: pure functions of their arguments (the pool is only read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/block_source.h"
#include "tessera/status.h"

namespace tessera {

// What every record of one pool layout shares.
struct BlockRecordInfo {
  uint64_t fingerprint = 0;
  uint32_t block_tokens = 0;
  uint32_t groups = 0;
  uint64_t page_bytes = 0;
};
BlockRecordInfo BlockRecordInfoOf(const BlockPool& pool);

// REQUIRES: info == BlockRecordInfoOf(pool) (computed once per pool by the caller); `b` sealed,
// with `id` its identity.
std::vector<std::byte> EncodeBlockRecord(const BlockRecordInfo& info, const BlockPool& pool, BlockId b,
                                         const SealedIdentity& id);

// Views into a checked record's payload (valid as long as the payload is).
struct BlockRecordView {
  std::span<const std::byte> pages;  // each group's block bytes, in group order
  std::span<const std::byte> state;
};
// The record's page bytes and state if it is a well-formed record of this layout for exactly
// `link`; otherwise the reason it is not (kDataLoss on "record").
Result<BlockRecordView> CheckBlockRecord(const BlockRecordInfo& info, std::span<const std::byte> payload,
                                         const ChainLink& link);
// Where a record's page bytes start: the header (`head`, below) is the payload's bytes before it.
size_t BlockRecordDataOffset(const BlockRecordInfo& info);
// CheckBlockRecord's checks on a record read piecewise (a promotion that copies the pages straight
// into the pool): `head` is its first BlockRecordDataOffset(info) bytes, `payload_len` its length.
Status CheckBlockRecordHead(const BlockRecordInfo& info, std::span<const std::byte> head, uint64_t payload_len,
                            const ChainLink& link);

}  // namespace tessera
