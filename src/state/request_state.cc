#include "tessera/request_state.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "tessera/checked.h"
#include "tessera/slots.h"

namespace tessera {

void ReferenceCompress(uint32_t, bool, uint64_t, std::span<const float> rows, uint32_t row_floats,
                       const RecordView& entry) {
  std::vector<float> mean(row_floats, 0.0f);
  size_t n = row_floats == 0 ? 0 : rows.size() / row_floats;
  for (size_t r = 0; r < n; ++r) {
    for (uint32_t c = 0; c < row_floats; ++c) mean[c] += rows[r * row_floats + c];
  }
  for (float& m : mean) m = n > 0 ? m / static_cast<float>(n) : 0.0f;
  const std::byte* src = reinterpret_cast<const std::byte*>(mean.data());
  const size_t src_bytes = mean.size() * sizeof(float);
  for (uint32_t p = 0; p < entry.plane_count; ++p) {
    std::span<std::byte> out = entry.planes[p];
    for (size_t i = 0; i < out.size(); ++i) out[i] = src_bytes == 0 ? std::byte{0} : src[i % src_bytes];
  }
}

void RequestStates::ArenaDeleter::operator()(std::byte* p) const {
  if (p != nullptr) ::munmap(p, bytes);
}

RequestStates::~RequestStates() = default;

Result<std::unique_ptr<RequestStates>> RequestStates::Create(StateOptions o) {
  if (o.max_requests == 0) return InvalidArgument("max-requests", "must be positive");
  if (o.window == 0) return InvalidArgument("sliding_window", "a state component needs a window");
  if (o.block_tokens == 0) return InvalidArgument("block-tokens", "must be positive");
  // Recompute rebuilds the state at a boundary by re-running the last `window` tokens; an
  // overlapping compressor needs its previous group's `ratio` rows there, so a window shorter
  // than that group cannot rebuild them and resuming would use wrong rows.
  if (o.strategy == SwaStrategy::kRecompute) {
    for (const StateLayer& l : o.layers) {
      if (l.ratio > 0 && l.coff >= 2 && l.ratio > o.window) {
        return InvalidArgument("sliding_window", "a window of " + std::to_string(o.window) +
                                                     " tokens cannot rebuild an overlapping compressor's group of " +
                                                     std::to_string(l.ratio) +
                                                     " tokens under recompute; use snapshot or retain");
      }
    }
  }
  // The ring holds the window and the draft tokens, counted in 32 bits.
  if (uint64_t{o.window} + o.spec_tokens > UINT32_MAX) {
    return OutOfRange("sliding_window", "a window of " + std::to_string(o.window) + " tokens plus " +
                                            std::to_string(o.spec_tokens) + " draft tokens does not fit 32 bits");
  }
  std::unique_ptr<RequestStates> s(new RequestStates());
  s->options_ = std::move(o);
  const StateOptions& opt = s->options_;
  s->ring_slots_ = opt.window + opt.spec_tokens;
  const bool retain = opt.strategy == SwaStrategy::kRetain;
  Checked offset = 0;
  for (const StateLayer& l : opt.layers) {
    s->window_offset_.push_back(offset.value());
    if (!retain) offset += Checked(s->ring_slots_) * opt.window_record_bytes;
    s->state_offset_.push_back(offset.value());
    offset += Checked(l.state_slots) * l.state_floats * sizeof(float);
    s->istate_offset_.push_back(offset.value());
    offset += Checked(l.istate_slots) * l.istate_floats * sizeof(float);
  }
  Checked chunk = Checked(opt.window) * opt.window_record_bytes * opt.layers.size();
  s->segment_slabs_ = std::min(opt.max_requests, kSlabsPerSegment);
  Checked segment = offset * s->segment_slabs_;
  if (offset.overflowed() || chunk.overflowed()) return OutOfRange("sliding_window", "state bytes overflow");
  if (segment.overflowed()) return OutOfRange("max-requests", "arena bytes overflow");
  s->slab_bytes_ = offset.value();
  s->chunk_bytes_ = chunk.value();
  s->segment_bytes_ = std::max<uint64_t>(segment.value(), 1);
  TESSERA_RETURN_IF_ERROR(s->Grow());  // the first segment, so that a bad size fails here
  s->strategy_ = MakeWindowStrategy(opt.strategy, *s);
  return s;
}

Status RequestStates::Grow() {
  const uint64_t first = uint64_t{segment_slabs_} * segments_.size();
  if (first >= options_.max_requests || first + segment_slabs_ > UINT32_MAX) {
    return OutOfBlocks("requests", "the state arena holds at most " + std::to_string(options_.max_requests) +
                                       " requests (max-requests)");
  }
  void* p = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return OutOfBlocks("requests", "cannot map a state arena segment");
  segments_.emplace_back(static_cast<std::byte*>(p), ArenaDeleter{segment_bytes_});
  states_.resize(first + segment_slabs_);
  for (uint64_t i = first + segment_slabs_; i > first; --i) free_slabs_.push_back(static_cast<uint32_t>(i - 1));
  return Status::Ok();
}

Result<uint32_t> RequestStates::Open() {
  if (slabs_live_ >= options_.max_requests) {
    return OutOfBlocks("requests",
                       "all " + std::to_string(options_.max_requests) + " request states are in use (max-requests)");
  }
  if (free_slabs_.empty()) TESSERA_RETURN_IF_ERROR(Grow());
  const uint32_t id = free_slabs_.back();
  free_slabs_.pop_back();
  ++slabs_live_;
  states_[id] = SlabState{};
  states_[id].slab = id;
  return id;
}

void RequestStates::Close(uint32_t id) {
  SlabState& q = states_[id];
  strategy_->Close(q);
  q = SlabState{};
  free_slabs_.push_back(id);
  --slabs_live_;
}

Result<uint32_t> RequestStates::Fork(uint32_t parent) {
  TESSERA_ASSIGN_OR_RETURN(uint32_t child, Open());
  std::memcpy(Slab(child), Slab(parent), slab_bytes_);
  strategy_->Fork(states_[parent], states_[child]);
  return child;
}

std::span<std::byte> RequestStates::SlabWindowRow(const SlabState& q, uint32_t layer_pos, uint64_t position) const {
  const uint64_t rb = options_.window_record_bytes;
  std::byte* slab = Slab(q.slab);
  return {slab + window_offset_[layer_pos] + (position % ring_slots_) * rb, rb};
}

std::span<float> RequestStates::StateRow(const SlabState& q, uint32_t layer_pos, bool indexer,
                                         uint64_t position) const {
  const StateLayer& l = options_.layers[layer_pos];
  std::byte* slab = Slab(q.slab);
  const uint32_t slots = indexer ? l.istate_slots : l.state_slots;
  const uint32_t floats = indexer ? l.istate_floats : l.state_floats;
  const uint64_t off =
      (indexer ? istate_offset_[layer_pos] : state_offset_[layer_pos]) + (position % slots) * floats * sizeof(float);
  return {reinterpret_cast<float*>(slab + off), floats};
}

Status RequestStates::WriteToken(uint32_t id, uint64_t p, const KvWriters& w, const EntrySink* entries) {
  SlabState& q = states_[id];
  strategy_->BeforeToken(q, p);
  if (!w.window && !w.state && (entries == nullptr || !w.compress)) return Status::Ok();  // bookkeeping only
  for (uint32_t i = 0; i < options_.layers.size(); ++i) {
    const StateLayer& l = options_.layers[i];
    if (w.window) w.window(l.layer, p, strategy_->WindowRow(q, i, p));
    if (l.ratio == 0) continue;
    if (w.state) {
      w.state(l.layer, false, p, StateRow(q, i, false, p));
      if (l.istate_slots > 0) w.state(l.layer, true, p, StateRow(q, i, true, p));
    }
    if (entries == nullptr || !w.compress || (p + 1) % l.ratio != 0) continue;
    // Group g is complete: its entry reads the group's rows and, when overlapping, the previous
    // group's.
    const uint64_t g = (p + 1) / l.ratio - 1;
    const uint64_t span = uint64_t{l.coff - 1} * l.ratio;
    const uint64_t first = g * l.ratio >= span ? g * l.ratio - span : 0;
    for (int which = 0; which < (l.igroup >= 0 ? 2 : 1); ++which) {
      const bool indexer = which == 1;
      const int32_t group = indexer ? l.igroup : l.group;
      if (group < 0) continue;
      TESSERA_ASSIGN_OR_RETURN(RecordView entry,
                               (*entries)(static_cast<uint32_t>(group), indexer ? l.igroup_layer : l.group_layer, g));
      const uint32_t floats = indexer ? l.istate_floats : l.state_floats;
      std::vector<float> rows;
      rows.reserve((p + 1 - first) * floats);
      for (uint64_t t = first; t <= p; ++t) {
        std::span<float> row = StateRow(q, i, indexer, t);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      w.compress(l.layer, indexer, g, rows, floats, entry);
    }
  }
  return Status::Ok();
}

void RequestStates::Sealed(uint32_t id, uint64_t tokens, BlockId block) {
  strategy_->Persist(states_[id], tokens, block);
}

RequestStates::Resumption RequestStates::Resume(uint32_t id, uint64_t cached_tokens, BlockId last) {
  Resumption r;
  if (cached_tokens == 0) return r;
  SlabState& q = states_[id];
  r.restored = strategy_->Restore(q, cached_tokens, last);
  if (!r.restored) {
    r.recompute_tokens = std::min<uint64_t>(cached_tokens, options_.window);
    r.recompute_from = cached_tokens - r.recompute_tokens;
    strategy_->BeginRecompute(q, r.recompute_from);
  }
  return r;
}

void RequestStates::VisitBoundaryRows(const SlabState& q, uint64_t n, bool window_rows,
                                      const std::function<void(std::span<std::byte>)>& visit) const {
  const uint64_t window = options_.window;
  if (window_rows) {
    for (uint32_t i = 0; i < options_.layers.size(); ++i) {
      for (uint64_t t = n > window ? n - window : 0; t < n; ++t) visit(strategy_->WindowRow(q, i, t));
    }
  }
  // At a boundary every group is complete: the overlapping compressors keep the previous group.
  for (uint32_t i = 0; i < options_.layers.size(); ++i) {
    const StateLayer& l = options_.layers[i];
    if (l.ratio == 0 || l.coff < 2) continue;
    for (int which = 0; which < (l.istate_slots > 0 ? 2 : 1); ++which) {
      for (uint64_t t = n >= l.ratio ? n - l.ratio : 0; t < n; ++t) {
        visit(std::as_writable_bytes(StateRow(q, i, which == 1, t)));
      }
    }
  }
}

uint64_t RequestStates::compressor_boundary_bytes() const {
  uint64_t bytes = 0;
  for (const StateLayer& l : options_.layers) {
    if (l.ratio == 0 || l.coff < 2) continue;
    bytes += uint64_t{l.ratio} * l.state_floats * sizeof(float);
    if (l.istate_slots > 0) bytes += uint64_t{l.ratio} * l.istate_floats * sizeof(float);
  }
  return bytes;
}

uint32_t RequestStates::NewChunk() {
  const uint32_t chunk = detail::TakeSlot(free_chunks_, chunks_);
  chunk_refs_.resize(chunks_.size(), 0);
  chunks_[chunk].resize(chunk_bytes_);
  chunk_refs_[chunk] = 1;
  ++chunks_live_;
  return chunk;
}

void RequestStates::ReleaseChunk(uint32_t chunk) {
  if (--chunk_refs_[chunk] > 0) return;
  free_chunks_.push_back(chunk);
  chunks_[chunk] = std::vector<std::byte>();
  --chunks_live_;
}

std::vector<std::byte> RequestStates::LiveState(uint32_t id, uint64_t n) const {
  std::vector<std::byte> out;
  const SlabState& q = states_[id];
  const uint64_t window = options_.window;
  for (uint32_t i = 0; i < options_.layers.size(); ++i) {
    for (uint64_t t = n > window ? n - window : 0; t < n; ++t) {
      std::span<std::byte> row = strategy_->WindowRow(q, i, t);
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  for (uint32_t i = 0; i < options_.layers.size(); ++i) {
    const StateLayer& l = options_.layers[i];
    if (l.ratio == 0) continue;
    uint64_t start = (n / l.ratio) * l.ratio;
    const uint64_t span = uint64_t{l.coff - 1} * l.ratio;
    start = start >= span ? start - span : 0;
    for (int which = 0; which < (l.istate_slots > 0 ? 2 : 1); ++which) {
      for (uint64_t t = start; t < n; ++t) {
        std::span<float> row = StateRow(q, i, which == 1, t);
        const std::byte* b = reinterpret_cast<const std::byte*>(row.data());
        out.insert(out.end(), b, b + row.size_bytes());
      }
    }
  }
  return out;
}

uint64_t RequestStates::bytes_held() const {
  return uint64_t{slabs_live_} * slab_bytes_ + strategy_->boundary_rows_bytes() + chunks_live_ * chunk_bytes_;
}

}  // namespace tessera
