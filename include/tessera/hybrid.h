// HybridManager: DeepSeek-V4 requests — pages plus a per-request state arena.
//
// Per request, an arena slab holds, per layer, the sliding-window ring of the last `window`
// (+ draft) token records and, per compressed layer, the fp32 compressor ring (8 slots for the
// overlapping ratio-4 compressor and its indexer, `ratio` slots otherwise; doubled under
// speculative decoding). Compressed entries (and CSA indexer entries) go into pages: one block
// id per `block_tokens` span, with a page in every paged group (C4 main, indexer, C128 main).
//
// Appending token p: the engine's writers fill the token's window record and compressor rows;
// when a layer's group completes ((p+1) % ratio == 0) the compressor callback writes the entry
// into its page slot (entry e = group index: block e / entries_per_block, slot e % entries);
// when the block span completes it is sealed through the block store (prefix key, content
// dedup), and the window state of that boundary is persisted per the strategy:
//   recompute — nothing; a prefix hit names the last `window` tokens the engine recomputes;
//   snapshot  — the live window rows and compressor rows are copied beside the sealed block;
//   retain    — window rows live in chunks of `window` tokens; the chunk ending at the boundary
//               is kept alive by the sealed block; compressor rows are copied.
// Resuming under snapshot or retain restores state bytes identical to an uninterrupted run.
//
// bytes_held() == the ledger's committed bytes (engine tessera, same strategy) for the same
// state, at every phase.
//
// Thread-safety: single owner; statistics via the pool and index are atomics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "tessera/block_index.h"
#include "tessera/block_source.h"
#include "tessera/block_pool.h"
#include "tessera/geometry.h"
#include "tessera/hash.h"
#include "tessera/ledger.h"
#include "tessera/manager.h"
#include "tessera/status.h"

namespace tessera {

struct HybridOptions {
  std::string kv_format;
  std::string indexer_format;
  std::optional<uint64_t> block_tokens;
  Kernel kernel = Kernel::kFlashMla;
  uint32_t capacity_blocks = 1024;
  RegionKind page_region = RegionKind::kHost;
  uint32_t max_requests = 16;  // arena slabs
  uint32_t spec_tokens = 0;
  SwaStrategy strategy = SwaStrategy::kRecompute;
  HashAlgorithm hash = HashAlgorithm::kXxh3;
  uint32_t hash_bits = 128;
  uint64_t hash_key_seed = 0;
  std::vector<std::byte> hash_key;  // non-empty: the keys' secret (a tier's prefix.key)
  // The checkpoint's revision when known (e.g. a commit id); part of the cache identity, so a
  // fine-tune that keeps its base's config.json must set it to keep their blocks apart.
  std::string weights_revision;
  bool content_dedup = true;
  bool include_mtp = false;
  std::unordered_map<uint32_t, uint32_t> tenant_domain;
};

// Fills the window record of token `position` in model layer `layer`.
using WindowWriter = std::function<void(uint32_t layer, uint64_t position, std::span<std::byte> record)>;
// Fills the compressor row (main, or the indexer's when `indexer`) of token `position`.
using StateWriter = std::function<void(uint32_t layer, bool indexer, uint64_t position, std::span<float> row)>;
// Writes the compressed entry of group `group` from its rows (oldest first: the previous group's
// rows for an overlapping compressor, then the group's own).
using Compressor = std::function<void(uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows,
                                      uint32_t row_floats, const RecordView& entry)>;

struct HybridWriters {
  WindowWriter window;
  StateWriter state;
  Compressor compress;
};

// A reference compressor for tests and simulation: the column means of the rows, as float
// bytes, repeated to fill each plane of the entry. No model math.
void ReferenceCompress(uint32_t layer, bool indexer, uint64_t group, std::span<const float> rows, uint32_t row_floats,
                       const RecordView& entry);

struct HybridAdmit {
  RequestId id;
  uint64_t cached_tokens = 0;
  uint32_t cached_blocks = 0;
  bool state_restored = false;  // snapshot/retain: the boundary state was restored
  uint32_t tier_blocks = 0;     // of cached_blocks, promoted from the block source
  uint64_t recompute_from = 0;  // recompute: the engine must recompute [recompute_from, cached_tokens)
  uint64_t recompute_tokens = 0;
};

class HybridManager {
 public:
  // Errors: as ComputeLedger; kInvalidArgument on "model" for a model without windows.
  static Result<std::unique_ptr<HybridManager>> Create(const Geometry& g, const HybridOptions& options);
  ~HybridManager();

  // The longest verified cached prefix, from the pool and then (with a block source) from the
  // tiers; the boundary state comes back with a promoted block under snapshot and retain.
  Result<HybridAdmit> Admit(std::span<const uint32_t> prompt, const RequestSpec& spec);
  // Attaches a second level (not owned; nullptr detaches). Sealed and evicted blocks carry their
  // boundary state: snapshot and retain both send the window rows and the overlapping
  // compressors' rows (retain's kept chunk is copied out — a chunk cannot stay alive off the
  // pool); recompute sends none, and a block promoted under it is resumed by recomputing.
  void SetBlockSource(BlockSource* source) { source_ = source; }
  // Hands every sealed block (with its boundary state) to the source's OnCheckpoint and waits
  // until the source has made it persistent; returns how many (0 without a source), or the
  // source's error.
  Result<uint64_t> Checkpoint();
  // Pages for the entries the next n tokens (and spec_tokens draft tokens) complete;
  // all-or-nothing.
  Status AllocateSlots(RequestId r, uint64_t n);
  Status Append(RequestId r, std::span<const uint32_t> tokens, const HybridWriters& writers);
  // Recompute strategy: refills the rings for tokens [recompute_from, cached_tokens) of a hit
  // (no entries are written: the pages already hold them).
  Status Recompute(RequestId r, std::span<const uint32_t> tokens, const HybridWriters& writers);
  Status Free(RequestId r);

  // The live state, serialized in position order: per layer the window rows of the last
  // min(tokens, window) tokens, then per compressed layer the rows still needed (the current
  // incomplete group and, when overlapping, the previous group).
  std::vector<std::byte> LiveState(RequestId r) const;
  std::span<const BlockId> BlockTable(RequestId r) const;
  uint64_t Tokens(RequestId r) const;
  // A compressed entry of request r: model layer, indexer or main, entry index.
  Result<RecordView> Entry(RequestId r, uint32_t layer, bool indexer, uint64_t entry) const;

  // Pages + metadata + arena slabs in use + boundary state kept.
  uint64_t bytes_held() const;
  uint64_t arena_bytes_per_request() const { return slab_bytes_; }
  uint64_t boundary_state_bytes() const;
  // Boundaries with persisted window state, and the bytes kept for them (copied rows plus, under
  // retain, the window chunk each keeps alive).
  uint64_t boundaries_kept() const { return boundaries_.size(); }
  uint64_t boundary_bytes_kept() const;
  const BlockPool& pool() const { return *pool_; }
  const BlockIndex& index() const { return *index_; }
  BlockIndex& mutable_index() { return *index_; }
  const Ledger& layout() const { return layout_; }
  uint32_t block_tokens() const { return block_tokens_; }

 private:
  struct LayerState;
  struct Request;
  HybridManager() = default;
  Request* Get(RequestId r);
  const Request* GetConst(RequestId r) const;
  uint64_t BlocksNeeded(uint64_t tokens) const;
  std::span<std::byte> WindowRow(const Request& q, uint32_t layer, uint64_t position) const;
  std::span<float> StateRow(const Request& q, uint32_t layer, bool indexer, uint64_t position) const;
  Status WriteToken(Request& q, uint32_t token, const HybridWriters& w, bool entries);
  void SealBoundary(Request& q);
  void PersistBoundary(Request& q, BlockId block);
  bool RestoreBoundary(Request& q, BlockId block);
  // Visits, in a fixed order, the rows resuming at q.tokens (a block boundary) needs: the window
  // rows of the last `window` tokens when `window_rows`, then the overlapping compressors'
  // previous-group rows. Persist and restore walk the same order.
  void VisitBoundaryRows(const Request& q, bool window_rows,
                         const std::function<void(std::span<std::byte>)>& visit) const;
  void OnEvict(BlockId b);
  void ReleaseChunk(uint32_t chunk);
  uint32_t NewChunk();
  // The boundary state of a sealed block as it travels to a tier (empty under recompute).
  std::vector<std::byte> TierState(BlockId block) const;
  // Installs a promoted block's boundary from its tier state; false when the state is absent or
  // not of this manager's shape.
  bool InstallBoundary(BlockId block, std::span<const std::byte> state);

  HybridOptions options_;
  Ledger layout_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockIndex> index_;
  BlockSource* source_ = nullptr;
  std::vector<LayerState> layers_;
  uint32_t block_tokens_ = 0;
  uint32_t window_ = 0;
  uint32_t ring_slots_ = 0;  // window + spec tokens
  uint64_t window_record_bytes_ = 0;
  uint64_t slab_bytes_ = 0;
  std::byte* arena_ = nullptr;
  uint64_t arena_bytes_ = 0;
  std::vector<uint32_t> free_slabs_;
  std::vector<Request> requests_;
  std::vector<uint32_t> free_request_ids_;
  // Boundary state beside sealed blocks (snapshot: window + compressor rows; retain: compressor
  // rows, and the window chunk id kept alive).
  struct Boundary {
    std::vector<std::byte> rows;
    uint32_t chunk = UINT32_MAX;
  };
  std::unordered_map<uint32_t, Boundary> boundaries_;
  // Retain: window chunks of `window` tokens x every layer's record, refcounted.
  // Window rows are handed out as writable spans from const accessors, like the arena's.
  mutable std::vector<std::vector<std::byte>> chunks_;
  std::vector<uint32_t> chunk_refs_;
  std::vector<uint32_t> free_chunks_;
  uint64_t chunk_bytes_ = 0;
  uint64_t chunks_live_ = 0;
};

}  // namespace tessera
