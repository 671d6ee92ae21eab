// The three window strategies behind one interface (include/tessera/request_state.h).
#include <cassert>
#include <cstring>
#include <unordered_map>

#include "tessera/request_state.h"

namespace tessera {

namespace {

// Recompute: window rows in the slab's ring; nothing is kept at a boundary, so a prefix hit
// re-runs the last `window` tokens.
class RecomputeStrategy final : public WindowStrategy {
 public:
  explicit RecomputeStrategy(RequestStates& states) : states_(states) {}
  std::span<std::byte> WindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const override {
    return states_.SlabWindowRow(q, layer_pos, position);
  }
  void Persist(const SlabState&, uint64_t, BlockId) override {}
  bool Restore(SlabState&, uint64_t, BlockId) override { return false; }
  std::vector<std::byte> TierState(BlockId) const override { return {}; }
  bool Install(BlockId, std::span<const std::byte>) override { return false; }
  void Forget(BlockId) override {}
  uint64_t boundaries_kept() const override { return 0; }
  uint64_t boundary_rows_bytes() const override { return 0; }
  uint64_t boundary_bytes_kept() const override { return 0; }

 private:
  RequestStates& states_;
};

// What snapshot and retain keep per sealed block: copied rows and (retain) a window chunk.
class KeepingStrategy : public WindowStrategy {
 public:
  explicit KeepingStrategy(RequestStates& states) : states_(states) {}
  void Forget(BlockId b) override {
    auto it = kept_.find(b.value);
    if (it == kept_.end()) return;
    rows_bytes_ -= it->second.rows.size();
    if (it->second.chunk != kNoChunk) {
      states_.ReleaseChunk(it->second.chunk);
      --chunks_kept_;
    }
    kept_.erase(it);
  }
  uint64_t boundaries_kept() const override { return kept_.size(); }
  uint64_t boundary_rows_bytes() const override { return rows_bytes_; }
  uint64_t boundary_bytes_kept() const override { return rows_bytes_ + chunks_kept_ * states_.chunk_bytes(); }

 protected:
  static constexpr uint32_t kNoChunk = UINT32_MAX;
  struct Kept {
    std::vector<std::byte> rows;
    uint32_t chunk = kNoChunk;
  };
  // A tier state is the window rows of every layer then the overlapping compressors' rows; it is
  // accepted only of exactly that shape, and only when boundaries fall on chunk edges.
  bool TierShaped(std::span<const std::byte> state) const {
    const StateOptions& o = states_.options();
    return o.block_tokens % o.window == 0 &&
           state.size() == states_.chunk_bytes() + states_.compressor_boundary_bytes();
  }
  std::vector<std::byte> CopyRows(const SlabState& q, uint64_t tokens, bool window_rows) const {
    std::vector<std::byte> rows;
    states_.VisitBoundaryRows(q, tokens, window_rows,
                              [&rows](std::span<std::byte> row) { rows.insert(rows.end(), row.begin(), row.end()); });
    return rows;
  }
  void PasteRows(SlabState& q, uint64_t tokens, bool window_rows, const std::vector<std::byte>& rows) const {
    size_t off = 0;
    states_.VisitBoundaryRows(q, tokens, window_rows, [&](std::span<std::byte> row) {
      std::memcpy(row.data(), rows.data() + off, row.size());
      off += row.size();
    });
  }

  void Keep(BlockId block, Kept k) {
    rows_bytes_ += k.rows.size();
    if (k.chunk != kNoChunk) ++chunks_kept_;
    kept_.emplace(block.value, std::move(k));
  }

  RequestStates& states_;
  std::unordered_map<uint32_t, Kept> kept_;  // by block id
  uint64_t rows_bytes_ = 0;                  // sum of the kept rows
  uint64_t chunks_kept_ = 0;                 // kept entries holding a chunk
};

// Snapshot: window rows in the slab's ring; a copy of the window and compressor rows is kept
// beside each sealed block.
class SnapshotStrategy final : public KeepingStrategy {
 public:
  using KeepingStrategy::KeepingStrategy;
  std::span<std::byte> WindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const override {
    return states_.SlabWindowRow(q, layer_pos, position);
  }
  void Persist(const SlabState& q, uint64_t tokens, BlockId block) override {
    if (kept_.count(block.value) > 0) return;
    Keep(block, Kept{CopyRows(q, tokens, /*window_rows=*/true), kNoChunk});
  }
  bool Restore(SlabState& q, uint64_t tokens, BlockId block) override {
    auto it = kept_.find(block.value);
    if (it == kept_.end()) return false;
    PasteRows(q, tokens, true, it->second.rows);
    return true;
  }
  std::vector<std::byte> TierState(BlockId block) const override {
    auto it = kept_.find(block.value);
    return it == kept_.end() ? std::vector<std::byte>() : it->second.rows;
  }
  bool Install(BlockId block, std::span<const std::byte> state) override {
    if (kept_.count(block.value) > 0 || !TierShaped(state)) return false;
    Keep(block, Kept{{state.begin(), state.end()}, kNoChunk});
    return true;
  }
};

// Retain: window rows live in chunks of `window` tokens; the chunk ending at a sealed boundary is
// kept alive by the block, and the overlapping compressors' rows are copied.
class RetainStrategy final : public KeepingStrategy {
 public:
  using KeepingStrategy::KeepingStrategy;
  std::span<std::byte> WindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const override {
    const uint64_t window = states_.window();
    const uint64_t c = position / window;
    assert(c >= q.chunk_base && c - q.chunk_base < q.chunks.size());
    const uint64_t rb = states_.options().window_record_bytes;
    std::span<std::byte> chunk = states_.Chunk(q.chunks[c - q.chunk_base]);
    return chunk.subspan((uint64_t{layer_pos} * window + position % window) * rb, rb);
  }
  // Opens the chunk of `p` and drops those no longer in the window.
  void BeforeToken(SlabState& q, uint64_t p) override {
    const uint64_t window = states_.window();
    const uint64_t c = p / window;
    while (q.chunk_base + q.chunks.size() <= c) q.chunks.push_back(states_.NewChunk());
    const uint64_t first_live = p + 1 > window ? (p + 1 - window) / window : 0;
    while (q.chunk_base < first_live && !q.chunks.empty()) {
      states_.ReleaseChunk(q.chunks.front());
      q.chunks.erase(q.chunks.begin());
      ++q.chunk_base;
    }
  }
  void Persist(const SlabState& q, uint64_t tokens, BlockId block) override {
    if (kept_.count(block.value) > 0) return;
    Kept k;
    k.chunk = q.chunks[(tokens - 1) / states_.window() - q.chunk_base];
    states_.RefChunk(k.chunk);
    k.rows = CopyRows(q, tokens, /*window_rows=*/false);
    Keep(block, std::move(k));
  }
  bool Restore(SlabState& q, uint64_t tokens, BlockId block) override {
    auto it = kept_.find(block.value);
    if (it == kept_.end()) return false;
    for (uint32_t chunk : q.chunks) states_.ReleaseChunk(chunk);
    q.chunk_base = (tokens - 1) / states_.window();
    q.chunks = {it->second.chunk};
    states_.RefChunk(it->second.chunk);
    PasteRows(q, tokens, false, it->second.rows);
    return true;
  }
  void BeginRecompute(SlabState& q, uint64_t from) override {
    // The rings are rebuilt by the recompute into fresh chunks.
    for (uint32_t chunk : q.chunks) states_.ReleaseChunk(chunk);
    q.chunks.clear();
    q.chunk_base = from / states_.window();
  }
  // The kept chunk holds exactly the window rows of the boundary in the snapshot's order
  // ([layer][position]) when boundaries fall on chunk edges.
  std::vector<std::byte> TierState(BlockId block) const override {
    auto it = kept_.find(block.value);
    const StateOptions& o = states_.options();
    if (it == kept_.end() || it->second.chunk == kNoChunk || o.block_tokens % o.window != 0) return {};
    std::span<std::byte> chunk = states_.Chunk(it->second.chunk);
    std::vector<std::byte> state(chunk.begin(), chunk.end());
    state.insert(state.end(), it->second.rows.begin(), it->second.rows.end());
    return state;
  }
  bool Install(BlockId block, std::span<const std::byte> state) override {
    if (kept_.count(block.value) > 0 || !TierShaped(state)) return false;
    Kept k;
    k.chunk = states_.NewChunk();
    std::memcpy(states_.Chunk(k.chunk).data(), state.data(), states_.chunk_bytes());
    k.rows.assign(state.begin() + static_cast<ptrdiff_t>(states_.chunk_bytes()), state.end());
    Keep(block, std::move(k));
    return true;
  }
  void Close(SlabState& q) override {
    for (uint32_t chunk : q.chunks) states_.ReleaseChunk(chunk);
    q.chunks.clear();
  }
  // A fork writes its own window from here on: it gets copies of the parent's live chunks.
  void Fork(const SlabState& parent, SlabState& child) override {
    child.chunk_base = parent.chunk_base;
    child.chunks.clear();
    for (uint32_t chunk : parent.chunks) {
      const uint32_t copy = states_.NewChunk();
      std::memcpy(states_.Chunk(copy).data(), states_.Chunk(chunk).data(), states_.chunk_bytes());
      child.chunks.push_back(copy);
    }
  }
};

}  // namespace

std::unique_ptr<WindowStrategy> MakeWindowStrategy(SwaStrategy strategy, RequestStates& states) {
  switch (strategy) {
    case SwaStrategy::kSnapshot:
      return std::make_unique<SnapshotStrategy>(states);
    case SwaStrategy::kRetain:
      return std::make_unique<RetainStrategy>(states);
    case SwaStrategy::kRecompute:
      break;
  }
  return std::make_unique<RecomputeStrategy>(states);
}

}  // namespace tessera
