// RequestStates: what a request holds that does not page — the state component of the request
// manager, for models with sliding windows (DeepSeek-V4). Models without windows have none.
//
// Per request, an arena slab holds, per layer, the sliding-window ring of the last `window`
// (+ draft) token records and, per compressed layer, the fp32 compressor ring (8 slots for the
// overlapping ratio-4 compressor and its indexer, `ratio` slots otherwise; doubled under
// speculative decoding). Compressed entries go into pages, which the manager owns: when a layer's
// group completes ((p+1) % ratio == 0) the compressor writes the entry into the page record the
// manager's EntrySink names.
//
// At a sealed block boundary the window state is kept, or not, by a WindowStrategy — one
// implementation each of recompute, snapshot and retain:
//   recompute — nothing; a prefix hit names the last `window` tokens the engine recomputes;
//   snapshot  — the live window rows and compressor rows are copied beside the sealed block;
//   retain    — window rows live in chunks of `window` tokens; the chunk ending at the boundary
//               is kept alive by the sealed block; compressor rows are copied.
// Resuming under snapshot or retain restores state bytes identical to an uninterrupted run. Kept
// state travels with a block to the tiers (TierState) and comes back with it (Install).
//
// bytes_held() counts slabs in use, kept rows and live window chunks: with the pages, exactly
// the ledger's committed bytes for the same state (tests).
//
// Thread-safety: single owner (the manager's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/kv_writers.h"
#include "tessera/layout.h"
#include "tessera/status.h"

namespace tessera {

// One model layer with a window, and its compressor when it has one.
struct StateLayer {
  uint32_t layer = 0;                            // model layer index
  uint32_t ratio = 0;                            // tokens per compressed entry; 0: window only
  uint32_t coff = 1;                             // groups one entry reads (2: an overlapping compressor)
  uint32_t state_slots = 0, state_floats = 0;    // main compressor ring (doubled under speculation)
  uint32_t istate_slots = 0, istate_floats = 0;  // the indexer's compressor ring
  // Where the layer's entries go: pool group and layer within it (-1: none).
  int32_t group = -1, igroup = -1;
  uint32_t group_layer = 0, igroup_layer = 0;
  uint32_t entries_per_block = 0;  // of `group`
};

struct StateOptions {
  SwaStrategy strategy = SwaStrategy::kRecompute;
  uint32_t window = 0;  // tokens of the sliding window
  uint32_t spec_tokens = 0;
  uint64_t window_record_bytes = 0;
  uint32_t block_tokens = 0;
  // At most this many slabs in use at once. The arena grows on demand, a segment of
  // min(max_requests, kSlabsPerSegment) slabs at a time (segments never move, so a row handed out
  // stays valid); UINT32_MAX sets no limit.
  uint32_t max_requests = 0;
  std::vector<StateLayer> layers;
};

// Resolves the page record of a compressed entry for the request being written:
// (pool group, layer within the group, entry index) -> the record, or kFailedPrecondition when
// the request has no page for it yet.
using EntrySink = std::function<Result<RecordView>(uint32_t group, uint32_t group_layer, uint64_t entry)>;

class RequestStates;

// The state of one request in the arena.
struct SlabState {
  uint32_t slab = UINT32_MAX;
  std::vector<uint32_t> chunks;  // retain: window chunk ids from chunk index chunk_base on
  uint64_t chunk_base = 0;
};

// One window strategy: where window rows live, and what is kept at a sealed boundary.
class WindowStrategy {
 public:
  virtual ~WindowStrategy() = default;
  // The window row of `position` of layer `layer_pos` (index into the layers).
  virtual std::span<std::byte> WindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const = 0;
  // Before token `position` is written (retain opens and drops window chunks).
  virtual void BeforeToken(SlabState& /*q*/, uint64_t /*position*/) {}
  // A block was sealed at `tokens`: keep what resuming there needs (once per block).
  virtual void Persist(const SlabState& q, uint64_t tokens, BlockId block) = 0;
  // Restores the state at `tokens` from what `block` kept; false when it kept nothing.
  virtual bool Restore(SlabState& q, uint64_t tokens, BlockId block) = 0;
  // A recompute from `from` will rebuild the window (retain: into fresh chunks).
  virtual void BeginRecompute(SlabState& /*q*/, uint64_t /*from*/) {}
  // The kept state of `block` as it travels to a tier (empty: none), and its installation back.
  virtual std::vector<std::byte> TierState(BlockId block) const = 0;
  virtual bool Install(BlockId block, std::span<const std::byte> state) = 0;
  virtual void Forget(BlockId block) = 0;  // the pool evicted it
  virtual void Close(SlabState& /*q*/) {}
  virtual void Fork(const SlabState& /*parent*/, SlabState& /*child*/) {}
  virtual uint64_t boundaries_kept() const = 0;
  virtual uint64_t boundary_rows_bytes() const = 0;  // copied rows kept
  virtual uint64_t boundary_bytes_kept() const = 0;  // rows plus the chunks kept alive
};

class RequestStates {
 public:
  // Errors: kInvalidArgument on "max-requests" (zero) or "sliding_window" (recompute cannot
  // rebuild a compressor group longer than the window); kOutOfRange when the arena overflows.
  static Result<std::unique_ptr<RequestStates>> Create(StateOptions options);
  ~RequestStates();
  RequestStates(const RequestStates&) = delete;
  RequestStates& operator=(const RequestStates&) = delete;

  static constexpr uint32_t kSlabsPerSegment = 1024;

  // A slab for a new request (the arena grows by a segment when every slab is in use).
  // kOutOfBlocks on "requests" when max_requests slabs are in use or a segment cannot be
  // mapped.
  Result<uint32_t> Open();
  void Close(uint32_t id);
  // A new slab holding a copy of `parent`'s rows. kOutOfBlocks as Open.
  Result<uint32_t> Fork(uint32_t parent);

  // Writes token `position`'s window and compressor rows; when `entries` is given, each group the
  // token completes is compressed into the record it names.
  Status WriteToken(uint32_t id, uint64_t position, const KvWriters& writers, const EntrySink* entries);
  // A block was sealed when the request reached `tokens`.
  void Sealed(uint32_t id, uint64_t tokens, BlockId block);

  struct Resumption {
    bool restored = false;        // snapshot/retain: the boundary state was restored
    uint64_t recompute_from = 0;  // otherwise: tokens [recompute_from, cached) to recompute
    uint64_t recompute_tokens = 0;
  };
  // A request resumes at `cached_tokens` (a block boundary) whose last block is `last`.
  Resumption Resume(uint32_t id, uint64_t cached_tokens, BlockId last);

  std::vector<std::byte> TierState(BlockId block) const { return strategy_->TierState(block); }
  bool Install(BlockId block, std::span<const std::byte> state) { return strategy_->Install(block, state); }
  void Forget(BlockId block) { strategy_->Forget(block); }

  // The live state at `tokens`, serialized in position order: per layer the window rows of the
  // last min(tokens, window) tokens, then per compressed layer the rows still needed (the current
  // incomplete group and, when overlapping, the previous group).
  std::vector<std::byte> LiveState(uint32_t id, uint64_t tokens) const;

  // Slabs in use, kept rows and live window chunks.
  uint64_t bytes_held() const;
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t boundaries_kept() const { return strategy_->boundaries_kept(); }
  uint64_t boundary_bytes_kept() const { return strategy_->boundary_bytes_kept(); }
  uint32_t window() const { return options_.window; }
  // Slabs that can still be opened (growing the arena), up to max_requests.
  uint32_t slabs_free() const { return options_.max_requests - slabs_live_; }
  uint32_t slabs_live() const { return slabs_live_; }
  uint64_t arena_segments() const { return segments_.size(); }
  const StateOptions& options() const { return options_; }

  // For the strategies: storage and the fixed order of boundary rows.
  std::span<std::byte> SlabWindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const;
  std::span<float> StateRow(const SlabState& q, uint32_t layer_pos, bool indexer, uint64_t position) const;
  // Visits, in a fixed order, the rows resuming at `tokens` (a block boundary) needs: the window
  // rows of the last `window` tokens when `window_rows`, then the overlapping compressors'
  // previous-group rows. Persist and restore walk the same order.
  void VisitBoundaryRows(const SlabState& q, uint64_t tokens, bool window_rows,
                         const std::function<void(std::span<std::byte>)>& visit) const;
  // Bytes of the overlapping compressors' previous-group rows at a boundary.
  uint64_t compressor_boundary_bytes() const;
  // Retain: window chunks of `window` tokens x every layer's record, refcounted.
  uint32_t NewChunk();
  void RefChunk(uint32_t chunk) { ++chunk_refs_[chunk]; }
  void ReleaseChunk(uint32_t chunk);
  std::span<std::byte> Chunk(uint32_t chunk) const { return chunks_[chunk]; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  const std::vector<StateLayer>& layers() const { return options_.layers; }

 private:
  struct ArenaDeleter {
    uint64_t bytes;
    void operator()(std::byte* p) const;
  };
  RequestStates() = default;

  StateOptions options_;
  std::unique_ptr<WindowStrategy> strategy_;
  uint32_t ring_slots_ = 0;  // window + spec tokens
  uint64_t slab_bytes_ = 0;
  std::vector<uint64_t> window_offset_, state_offset_, istate_offset_;  // per layer, in the slab
  std::byte* Slab(uint32_t slab) const {
    return segments_[slab / segment_slabs_].get() + uint64_t{slab % segment_slabs_} * slab_bytes_;
  }
  Status Grow();  // maps one more segment of slabs

  uint32_t segment_slabs_ = 0;
  uint64_t segment_bytes_ = 0;
  std::vector<std::unique_ptr<std::byte, ArenaDeleter>> segments_;
  std::vector<uint32_t> free_slabs_;
  uint32_t slabs_live_ = 0;
  std::vector<SlabState> states_;  // by slab
  // Chunks are handed out as writable spans from const accessors, like the arena's rows.
  mutable std::vector<std::vector<std::byte>> chunks_;
  std::vector<uint32_t> chunk_refs_;
  std::vector<uint32_t> free_chunks_;
  uint64_t chunk_bytes_ = 0;
  uint64_t chunks_live_ = 0;
};

// The three strategies (src/state/window_strategy.cc).
std::unique_ptr<WindowStrategy> MakeWindowStrategy(SwaStrategy strategy, RequestStates& states);

}  // namespace tessera
