#include "tessera/hybrid.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "base/slots.h"
#include "tessera/checked.h"

namespace tessera {

struct HybridManager::LayerState {
  uint32_t layer = 0;  // model layer index
  LayerKind kind = LayerKind::kSwa;
  uint64_t window_offset = 0;  // in the slab (not used under retain)
  uint32_t ratio = 0;          // 0: window only
  uint32_t coff = 1;
  uint64_t state_offset = 0, istate_offset = 0;
  uint32_t state_slots = 0, istate_slots = 0;  // ring slots (doubled under speculation)
  uint32_t state_floats = 0, istate_floats = 0;
  int32_t group = -1, igroup = -1;  // pool groups of the compressed / indexer pages
  uint32_t group_layer = 0, igroup_layer = 0;
};

struct HybridManager::Request {
  bool live = false;
  uint32_t tenant = 0, domain = 0;
  uint64_t salt = 0;
  uint8_t priority = kDefaultRetentionPriority;
  uint64_t tokens = 0;
  std::vector<uint32_t> span_tokens;  // tokens of the span not yet sealed
  std::vector<BlockId> table;
  std::vector<PrefixRef> chain;
  uint32_t slab = UINT32_MAX;
  std::vector<uint32_t> chunks;  // retain: chunk ids from chunk index chunk_base on
  uint64_t chunk_base = 0;
};

namespace {}  // namespace

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

HybridManager::~HybridManager() {
  if (arena_ != nullptr) ::munmap(arena_, arena_bytes_);
}

Result<std::unique_ptr<HybridManager>> HybridManager::Create(const Geometry& g, const HybridOptions& o) {
  if (!g.is_hybrid || g.sliding_window == 0) {
    return InvalidArgument("model", g.name + " has no sliding-window layers; use the block manager");
  }
  if (o.max_requests == 0) return InvalidArgument("max-requests", "must be positive");
  LedgerOptions lo;
  lo.context_tokens = 1;
  lo.kv_format = o.kv_format;
  lo.indexer_format = o.indexer_format;
  lo.block_tokens = o.block_tokens;
  lo.kernel = o.kernel;
  lo.spec_tokens = o.spec_tokens;
  lo.include_mtp = o.include_mtp;
  lo.swa_strategy = o.strategy;
  TESSERA_ASSIGN_OR_RETURN(Ledger layout, ComputeLedger(g, lo));

  // Recompute rebuilds a resumed request's compressor rows from the `window` tokens it re-runs:
  // the window must cover the previous group an overlapping compressor still reads (the config
  // reader refuses such models; a Geometry built by hand is checked here).
  if (o.strategy == SwaStrategy::kRecompute) {
    for (const LayerSpec& l : g.layers) {
      for (const CacheSpec& c : l.caches) {
        if (c.role == CacheRole::kCompressorState && c.slots > l.compress_ratio &&
            g.sliding_window < c.slots - l.compress_ratio) {
          return InvalidArgument("sliding_window", std::to_string(g.sliding_window) + " is shorter than the " +
                                                       std::to_string(c.slots - l.compress_ratio) +
                                                       "-token compressor group recompute must rebuild");
        }
      }
    }
  }
  if (uint64_t{g.sliding_window} + o.spec_tokens > UINT32_MAX) {
    return OutOfRange("sliding_window", "window plus draft tokens does not fit in 32 bits");
  }

  std::unique_ptr<HybridManager> m(new HybridManager());
  m->options_ = o;
  m->layout_ = layout;
  m->block_tokens_ = layout.block_tokens;
  m->window_ = g.sliding_window;
  m->ring_slots_ = g.sliding_window + o.spec_tokens;

  // Pool groups: the paged groups of the cache map, in order.
  std::vector<CacheGroup> map = BuildCacheMap(layout);
  BlockPoolOptions po;
  po.capacity_blocks = o.capacity_blocks;
  po.region_kind = o.page_region;
  std::vector<int32_t> map_to_pool(map.size(), -1);
  for (size_t i = 0; i < map.size(); ++i) {
    if (!map[i].in_pages) continue;
    map_to_pool[i] = static_cast<int32_t>(po.groups.size());
    po.groups.push_back({map[i].name, map[i].format, map[i].layers, map[i].page});
  }
  TESSERA_ASSIGN_OR_RETURN(m->pool_, BlockPool::Create(std::move(po)));
  TESSERA_ASSIGN_OR_RETURN(ContentHasher hasher, o.hash_key.empty()
                                                     ? ContentHasher::Create(o.hash, o.hash_bits, o.hash_key_seed)
                                                     : ContentHasher::CreateWithKey(o.hash, o.hash_bits, o.hash_key));
  m->index_ = std::make_unique<BlockIndex>(
      m->pool_.get(), std::move(hasher), o.content_dedup, /*bucket_limit=*/8,
      CacheIdentityKey(g.config_sha256, o.weights_revision, *m->pool_, SwaStrategyName(o.strategy)));
  // The index's hook runs before OnEvict drops the boundary, so the state travels with the block.
  m->index_->SetEvictionHook([p = m.get()](BlockId b, const SealedIdentity& id) {
    if (p->source_ == nullptr || !p->pool_->backed()) return;
    std::vector<std::byte> state = p->TierState(b);
    SealedIdentity with_state = id;
    with_state.state = state;
    p->source_->OnEvicted(*p->pool_, b, with_state);
  });
  m->pool_->AddEvictionListener([p = m.get()](BlockId b) { p->OnEvict(b); });

  // Per-layer state: slab offsets and page coordinates.
  auto find_group = [&](CacheRole role, uint32_t ratio) -> int32_t {
    for (size_t i = 0; i < map.size(); ++i) {
      if (map[i].in_pages && map[i].role == role && map[i].compress_ratio == ratio) return map_to_pool[i];
    }
    return -1;
  };
  std::vector<uint32_t> next_layer(m->pool_->groups().size(), 0);
  const bool retain = o.strategy == SwaStrategy::kRetain;
  const uint32_t doubling = o.spec_tokens > 0 ? 2 : 1;
  for (const LayerSpec& spec : g.layers) {
    if (spec.is_mtp && !o.include_mtp) continue;
    LayerState ls;
    ls.layer = spec.index;
    ls.kind = spec.kind;
    for (const CacheSpec& c : spec.caches) {
      switch (c.role) {
        case CacheRole::kCompressed:
          ls.ratio = c.compress_ratio;
          ls.group = find_group(CacheRole::kCompressed, c.compress_ratio);
          if (ls.group >= 0) ls.group_layer = next_layer[static_cast<size_t>(ls.group)]++;
          break;
        case CacheRole::kIndexer:
          ls.igroup = find_group(CacheRole::kIndexer, c.compress_ratio);
          if (ls.igroup >= 0) ls.igroup_layer = next_layer[static_cast<size_t>(ls.igroup)]++;
          break;
        case CacheRole::kCompressorState:
          ls.state_slots = c.slots * doubling;
          ls.state_floats = c.state_floats;
          break;
        case CacheRole::kIndexerCompressorState:
          ls.istate_slots = c.slots * doubling;
          ls.istate_floats = c.state_floats;
          break;
        default:
          break;
      }
    }
    if (ls.ratio > 0) ls.coff = ls.state_slots / doubling / ls.ratio;
    m->layers_.push_back(ls);
  }
  // The window record is the main format's record.
  for (const CacheLine& line : layout.lines) {
    if (line.role == CacheRole::kWindow) m->window_record_bytes_ = line.format.record_bytes();
  }
  // Slab offsets: the ledger checked the arena's total, but the window ring here has draft slots
  // too and retain's chunk is sized apart, so the sums are checked again.
  Checked slab(0);
  for (LayerState& ls : m->layers_) {
    if (!retain) {
      ls.window_offset = slab.value();
      slab += Checked(m->ring_slots_) * m->window_record_bytes_;
    }
    if (ls.state_slots > 0) {
      ls.state_offset = slab.value();
      slab += Checked(ls.state_slots) * ls.state_floats * sizeof(float);
    }
    if (ls.istate_slots > 0) {
      ls.istate_offset = slab.value();
      slab += Checked(ls.istate_slots) * ls.istate_floats * sizeof(float);
    }
  }
  Checked chunk = Checked(m->window_) * m->window_record_bytes_ * m->layers_.size();
  if (slab.overflowed() || chunk.overflowed()) {
    return OutOfRange("sliding_window", "per-request window state overflows 64 bits");
  }
  const uint64_t offset = slab.value();
  m->slab_bytes_ = offset;
  m->chunk_bytes_ = chunk.value();
  Checked arena = Checked(offset) * o.max_requests;
  if (arena.overflowed()) return OutOfRange("max-requests", "arena bytes overflow");
  m->arena_bytes_ = std::max<uint64_t>(arena.value(), 1);
  void* p =
      ::mmap(nullptr, m->arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Status(StatusCode::kOutOfBlocks, "max-requests", "cannot map the state arena");
  m->arena_ = static_cast<std::byte*>(p);
  for (uint32_t i = o.max_requests; i > 0; --i) m->free_slabs_.push_back(i - 1);
  return m;
}

HybridManager::Request* HybridManager::Get(RequestId r) {
  if (r.value >= requests_.size() || !requests_[r.value].live) return nullptr;
  return &requests_[r.value];
}

const HybridManager::Request* HybridManager::GetConst(RequestId r) const {
  if (r.value >= requests_.size() || !requests_[r.value].live) return nullptr;
  return &requests_[r.value];
}

uint64_t HybridManager::BlocksNeeded(uint64_t tokens) const {
  uint64_t need = 0;
  for (const PoolGroup& g : pool_->groups()) {
    need = std::max(need, CeilDiv(tokens / g.page.compress_ratio, g.page.entries_per_block));
  }
  return need;
}

std::span<std::byte> HybridManager::WindowRow(const Request& q, uint32_t layer_pos, uint64_t position) const {
  const uint64_t rb = window_record_bytes_;
  if (options_.strategy == SwaStrategy::kRetain) {
    uint64_t c = position / window_;
    assert(c >= q.chunk_base && c - q.chunk_base < q.chunks.size());
    std::vector<std::byte>& chunk = chunks_[q.chunks[c - q.chunk_base]];
    return {chunk.data() + (uint64_t{layer_pos} * window_ + position % window_) * rb, rb};
  }
  std::byte* slab = arena_ + uint64_t{q.slab} * slab_bytes_;
  return {slab + layers_[layer_pos].window_offset + (position % ring_slots_) * rb, rb};
}

std::span<float> HybridManager::StateRow(const Request& q, uint32_t layer_pos, bool indexer, uint64_t position) const {
  const LayerState& ls = layers_[layer_pos];
  std::byte* slab = arena_ + uint64_t{q.slab} * slab_bytes_;
  uint32_t slots = indexer ? ls.istate_slots : ls.state_slots;
  uint32_t floats = indexer ? ls.istate_floats : ls.state_floats;
  uint64_t off = (indexer ? ls.istate_offset : ls.state_offset) + (position % slots) * floats * sizeof(float);
  return {reinterpret_cast<float*>(slab + off), floats};
}

Result<HybridAdmit> HybridManager::Admit(std::span<const uint32_t> prompt, const RequestSpec& spec) {
  if (free_slabs_.empty()) {
    return Status(StatusCode::kOutOfBlocks, "requests",
                  "the state arena holds " + std::to_string(options_.max_requests) + " requests");
  }
  const uint32_t id = detail::TakeSlot(free_request_ids_, requests_);
  Request& q = requests_[id];
  q = Request{};
  q.live = true;
  q.tenant = spec.tenant;
  auto it = options_.tenant_domain.find(spec.tenant);
  q.domain = it == options_.tenant_domain.end() ? spec.tenant : it->second;
  q.salt = spec.cache_salt;
  q.priority = std::min(spec.priority, kMaxRetentionPriority);
  q.slab = free_slabs_.back();
  free_slabs_.pop_back();

  q.chain = index_->LongestPrefix(prompt, q.domain, q.salt);
  for (const PrefixRef& hit : q.chain) {
    pool_->Ref(hit.block);
    q.table.push_back(hit.block);
  }
  HybridAdmit a;
  if (source_ != nullptr) {
    const size_t before = q.table.size();
    std::vector<std::vector<std::byte>> states;
    a.tier_blocks = PromoteFromSource(*pool_, *index_, *source_, prompt, q.domain, q.salt, q.priority, q.chain,
                                      q.table, &states);
    for (size_t i = 0; i < a.tier_blocks; ++i) InstallBoundary(q.table[before + i], states[i]);
  }
  a.id = RequestId{id};
  a.cached_blocks = static_cast<uint32_t>(q.table.size());
  a.cached_tokens = uint64_t{a.cached_blocks} * block_tokens_;
  q.tokens = a.cached_tokens;
  if (a.cached_tokens > 0) {
    a.state_restored = options_.strategy != SwaStrategy::kRecompute && RestoreBoundary(q, q.table.back());
    if (!a.state_restored) {
      a.recompute_tokens = std::min<uint64_t>(a.cached_tokens, window_);
      a.recompute_from = a.cached_tokens - a.recompute_tokens;
      if (options_.strategy == SwaStrategy::kRetain) {
        // The rings are rebuilt by Recompute into fresh chunks.
        q.chunk_base = a.recompute_from / window_;
      }
    }
  }
  return a;
}

Status HybridManager::AllocateSlots(RequestId r, uint64_t n) {
  Request* q = Get(r);
  if (q == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  // Room for the draft tokens of speculative decoding too (their slots are committed).
  Checked total = Checked(q->tokens) + n + options_.spec_tokens;
  if (total.overflowed()) return OutOfRange("tokens", "token count overflows");
  uint64_t need = BlocksNeeded(total.value());
  if (need <= q->table.size()) return Status::Ok();
  uint64_t more = need - q->table.size();
  if (more > pool_->Available()) {
    return Status(
        StatusCode::kOutOfBlocks, "blocks",
        "need " + std::to_string(more) + " blocks, " + std::to_string(pool_->Available()) + " free or evictable");
  }
  return pool_->Allocate(static_cast<uint32_t>(more), &q->table);
}

Status HybridManager::WriteToken(Request& q, uint32_t token, const HybridWriters& w, bool entries) {
  (void)token;
  const uint64_t p = q.tokens;
  const bool retain = options_.strategy == SwaStrategy::kRetain;
  if (retain) {
    // Window rows live in chunks of `window` tokens: open the chunk of p, drop those behind.
    uint64_t c = p / window_;
    while (q.chunk_base + q.chunks.size() <= c) q.chunks.push_back(NewChunk());
    uint64_t first_live = p + 1 > window_ ? (p + 1 - window_) / window_ : 0;
    while (q.chunk_base < first_live && !q.chunks.empty()) {
      ReleaseChunk(q.chunks.front());
      q.chunks.erase(q.chunks.begin());
      ++q.chunk_base;
    }
  }
  // Bookkeeping only (no rows or entries to write): one page check per token, not per layer.
  if (!w.window && !w.state && (!entries || !w.compress || !pool_->backed())) {
    if (entries && BlocksNeeded(p + 1) > q.table.size()) {
      return Status(StatusCode::kFailedPrecondition, "tokens",
                    "no page for token " + std::to_string(p) + ": call AllocateSlots first");
    }
    ++q.tokens;
    return Status::Ok();
  }
  for (uint32_t i = 0; i < layers_.size(); ++i) {
    const LayerState& ls = layers_[i];
    if (w.window) w.window(ls.layer, p, WindowRow(q, i, p));
    if (ls.ratio == 0) continue;
    if (w.state) {
      w.state(ls.layer, false, p, StateRow(q, i, false, p));
      if (ls.istate_slots > 0) w.state(ls.layer, true, p, StateRow(q, i, true, p));
    }
    if (!entries || (p + 1) % ls.ratio != 0) continue;
    // Group g complete: its entry goes to block g / entries_per_block, slot g % entries.
    const uint64_t g = (p + 1) / ls.ratio - 1;
    const uint64_t epb = pool_->groups()[static_cast<size_t>(ls.group)].page.entries_per_block;
    const uint64_t block = g / epb;
    if (block >= q.table.size()) {
      return Status(StatusCode::kFailedPrecondition, "tokens",
                    "no page for entry " + std::to_string(g) + ": call AllocateSlots first");
    }
    if (!pool_->backed() || !w.compress) continue;
    const uint64_t first = g * ls.ratio >= (ls.coff - 1) * ls.ratio ? g * ls.ratio - (ls.coff - 1) * ls.ratio : 0;
    for (int which = 0; which < (ls.igroup >= 0 ? 2 : 1); ++which) {
      const bool indexer = which == 1;
      const uint32_t floats = indexer ? ls.istate_floats : ls.state_floats;
      std::vector<float> rows;
      rows.reserve((p + 1 - first) * floats);
      for (uint64_t t = first; t <= p; ++t) {
        std::span<float> row = StateRow(q, i, indexer, t);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      int32_t group = indexer ? ls.igroup : ls.group;
      uint32_t layer = indexer ? ls.igroup_layer : ls.group_layer;
      w.compress(ls.layer, indexer, g, rows, floats,
                 pool_->Record(q.table[block], static_cast<uint32_t>(group), layer, g % epb));
    }
  }
  ++q.tokens;
  return Status::Ok();
}

Status HybridManager::Append(RequestId r, std::span<const uint32_t> tokens, const HybridWriters& writers) {
  Request* q = Get(r);
  if (q == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  if (BlocksNeeded(q->tokens + tokens.size()) > q->table.size()) {
    return Status(StatusCode::kFailedPrecondition, "tokens",
                  "no pages for " + std::to_string(tokens.size()) + " more tokens: call AllocateSlots first");
  }
  for (uint32_t t : tokens) {
    TESSERA_RETURN_IF_ERROR(WriteToken(*q, t, writers, true));
    q->span_tokens.push_back(t);
    if (q->tokens % block_tokens_ == 0) SealBoundary(*q);
  }
  return Status::Ok();
}

Status HybridManager::Recompute(RequestId r, std::span<const uint32_t> tokens, const HybridWriters& writers) {
  Request* q = Get(r);
  if (q == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  if (tokens.size() > q->tokens || tokens.size() > window_) {
    return InvalidArgument("tokens", "recompute at most the last window tokens of the cached prefix");
  }
  const uint64_t end = q->tokens;
  q->tokens = end - tokens.size();
  for (uint32_t t : tokens) TESSERA_RETURN_IF_ERROR(WriteToken(*q, t, writers, false));
  assert(q->tokens == end);
  return Status::Ok();
}

void HybridManager::VisitBoundaryRows(const Request& q, bool window_rows,
                                      const std::function<void(std::span<std::byte>)>& visit) const {
  const uint64_t n = q.tokens;
  if (window_rows) {
    for (uint32_t i = 0; i < layers_.size(); ++i) {
      for (uint64_t t = n > window_ ? n - window_ : 0; t < n; ++t) visit(WindowRow(q, i, t));
    }
  }
  // At a boundary every group is complete: the overlapping compressors keep the previous group.
  for (uint32_t i = 0; i < layers_.size(); ++i) {
    const LayerState& ls = layers_[i];
    if (ls.ratio == 0 || ls.coff < 2) continue;
    for (int which = 0; which < (ls.istate_slots > 0 ? 2 : 1); ++which) {
      for (uint64_t t = n >= ls.ratio ? n - ls.ratio : 0; t < n; ++t) {
        visit(std::as_writable_bytes(StateRow(q, i, which == 1, t)));
      }
    }
  }
}

void HybridManager::SealBoundary(Request& q) {
  const size_t s = q.tokens / block_tokens_ - 1;
  PrefixRef parent = q.chain.empty() ? PrefixRef{} : q.chain.back();
  BlockIndex::SealResult sealed = index_->Seal(q.table[s], parent, q.span_tokens, q.domain, q.salt);
  BlockId kept = sealed.ref.block;
  pool_->SetPriority(kept, sealed.deduplicated ? std::max(pool_->priority(kept), q.priority) : q.priority);
  q.table[s] = kept;
  q.chain.push_back(sealed.ref);
  q.span_tokens.clear();
  if (!boundaries_.count(kept.value)) PersistBoundary(q, kept);
  if (source_ != nullptr && !sealed.deduplicated && pool_->backed()) {
    std::vector<std::byte> state = TierState(kept);
    SealedIdentity id = index_->IdentityOf(kept);
    id.state = state;
    source_->OnSealed(*pool_, kept, id);
  }
}

void HybridManager::PersistBoundary(Request& q, BlockId block) {
  if (options_.strategy == SwaStrategy::kRecompute) return;
  Boundary b;
  const bool snapshot = options_.strategy == SwaStrategy::kSnapshot;
  if (!snapshot) {
    // Retain: the chunk ending at this boundary stays alive with the block.
    b.chunk = q.chunks[(q.tokens - 1) / window_ - q.chunk_base];
    ++chunk_refs_[b.chunk];
  }
  VisitBoundaryRows(q, snapshot,
                    [&b](std::span<std::byte> row) { b.rows.insert(b.rows.end(), row.begin(), row.end()); });
  boundaries_.emplace(block.value, std::move(b));
}

bool HybridManager::RestoreBoundary(Request& q, BlockId block) {
  auto it = boundaries_.find(block.value);
  if (it == boundaries_.end()) return false;
  const Boundary& b = it->second;
  const bool snapshot = options_.strategy == SwaStrategy::kSnapshot;
  if (!snapshot) {
    q.chunk_base = (q.tokens - 1) / window_;
    q.chunks = {b.chunk};
    ++chunk_refs_[b.chunk];
  }
  size_t off = 0;
  VisitBoundaryRows(q, snapshot, [&](std::span<std::byte> row) {
    std::memcpy(row.data(), b.rows.data() + off, row.size());
    off += row.size();
  });
  return true;
}

Result<uint64_t> HybridManager::Checkpoint() {
  if (source_ == nullptr) return uint64_t{0};
  return CheckpointBlocks(*pool_, *index_, *source_, [this](BlockId b) { return TierState(b); });
}

uint32_t HybridManager::NewChunk() {
  const uint32_t chunk = detail::TakeSlot(free_chunks_, chunks_);
  chunk_refs_.resize(chunks_.size(), 0);
  chunks_[chunk].resize(chunk_bytes_);
  chunk_refs_[chunk] = 1;
  ++chunks_live_;
  return chunk;
}

std::vector<std::byte> HybridManager::TierState(BlockId block) const {
  auto it = boundaries_.find(block.value);
  if (it == boundaries_.end() || options_.strategy == SwaStrategy::kRecompute) return {};
  const Boundary& b = it->second;
  if (options_.strategy == SwaStrategy::kSnapshot) return b.rows;
  // Retain: the kept chunk holds exactly the window rows of the boundary in the snapshot's order
  // ([layer][position]) when boundaries fall on chunk edges.
  if (b.chunk == UINT32_MAX || block_tokens_ % window_ != 0) return {};
  std::vector<std::byte> state(chunks_[b.chunk]);
  state.insert(state.end(), b.rows.begin(), b.rows.end());
  return state;
}

bool HybridManager::InstallBoundary(BlockId block, std::span<const std::byte> state) {
  if (options_.strategy == SwaStrategy::kRecompute || boundaries_.count(block.value) > 0) return false;
  if (block_tokens_ % window_ != 0) return false;
  // Window rows of every layer, then the overlapping compressors' previous-group rows.
  uint64_t compressor = 0;
  for (const LayerState& ls : layers_) {
    if (ls.ratio == 0 || ls.coff < 2) continue;
    compressor += uint64_t{ls.ratio} * ls.state_floats * sizeof(float);
    if (ls.istate_slots > 0) compressor += uint64_t{ls.ratio} * ls.istate_floats * sizeof(float);
  }
  if (state.size() != chunk_bytes_ + compressor) return false;
  Boundary b;
  if (options_.strategy == SwaStrategy::kSnapshot) {
    b.rows.assign(state.begin(), state.end());
  } else {
    b.chunk = NewChunk();
    std::memcpy(chunks_[b.chunk].data(), state.data(), chunk_bytes_);
    b.rows.assign(state.begin() + static_cast<ptrdiff_t>(chunk_bytes_), state.end());
  }
  boundaries_.emplace(block.value, std::move(b));
  return true;
}

void HybridManager::ReleaseChunk(uint32_t chunk) {
  if (--chunk_refs_[chunk] > 0) return;
  free_chunks_.push_back(chunk);
  chunks_[chunk] = std::vector<std::byte>();
  --chunks_live_;
}

void HybridManager::OnEvict(BlockId b) {
  auto it = boundaries_.find(b.value);
  if (it == boundaries_.end()) return;
  if (it->second.chunk != UINT32_MAX) ReleaseChunk(it->second.chunk);
  boundaries_.erase(it);
}

Status HybridManager::Free(RequestId r) {
  Request* q = Get(r);
  if (q == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  for (auto it = q->table.rbegin(); it != q->table.rend(); ++it) pool_->Unref(*it);
  for (uint32_t chunk : q->chunks) ReleaseChunk(chunk);
  free_slabs_.push_back(q->slab);
  *q = Request{};
  free_request_ids_.push_back(r.value);
  return Status::Ok();
}

std::vector<std::byte> HybridManager::LiveState(RequestId r) const {
  std::vector<std::byte> out;
  const Request* q = GetConst(r);
  if (q == nullptr) return out;
  const uint64_t n = q->tokens;
  for (uint32_t i = 0; i < layers_.size(); ++i) {
    for (uint64_t t = n > window_ ? n - window_ : 0; t < n; ++t) {
      std::span<std::byte> row = WindowRow(*q, i, t);
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  for (uint32_t i = 0; i < layers_.size(); ++i) {
    const LayerState& ls = layers_[i];
    if (ls.ratio == 0) continue;
    uint64_t start = (n / ls.ratio) * ls.ratio;
    start = start >= (ls.coff - 1) * ls.ratio ? start - (ls.coff - 1) * ls.ratio : 0;
    for (int which = 0; which < (ls.istate_slots > 0 ? 2 : 1); ++which) {
      for (uint64_t t = start; t < n; ++t) {
        std::span<float> row = StateRow(*q, i, which == 1, t);
        const std::byte* b = reinterpret_cast<const std::byte*>(row.data());
        out.insert(out.end(), b, b + row.size_bytes());
      }
    }
  }
  return out;
}

std::span<const BlockId> HybridManager::BlockTable(RequestId r) const {
  const Request* q = GetConst(r);
  return q == nullptr ? std::span<const BlockId>() : std::span<const BlockId>(q->table);
}

uint64_t HybridManager::Tokens(RequestId r) const {
  const Request* q = GetConst(r);
  return q == nullptr ? 0 : q->tokens;
}

Result<RecordView> HybridManager::Entry(RequestId r, uint32_t layer, bool indexer, uint64_t entry) const {
  const Request* q = GetConst(r);
  if (q == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  if (!pool_->backed()) return InvalidArgument("pool", "an unbacked pool has no bytes to read");
  for (const LayerState& ls : layers_) {
    if (ls.layer != layer) continue;
    int32_t group = indexer ? ls.igroup : ls.group;
    if (group < 0) return InvalidArgument("layer", "layer " + std::to_string(layer) + " has no such cache");
    uint64_t epb = pool_->groups()[static_cast<size_t>(group)].page.entries_per_block;
    if (entry >= q->tokens / ls.ratio)
      return InvalidArgument("entry", "entry " + std::to_string(entry) + " not complete");
    return pool_->Record(q->table[entry / epb], static_cast<uint32_t>(group),
                         indexer ? ls.igroup_layer : ls.group_layer, entry % epb);
  }
  return InvalidArgument("layer", "no layer " + std::to_string(layer));
}

uint64_t HybridManager::boundary_state_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [block, b] : boundaries_) bytes += b.rows.size();
  return bytes;
}

uint64_t HybridManager::boundary_bytes_kept() const {
  uint64_t bytes = 0;
  for (const auto& [block, b] : boundaries_) bytes += b.rows.size() + (b.chunk != UINT32_MAX ? chunk_bytes_ : 0);
  return bytes;
}

uint64_t HybridManager::bytes_held() const {
  uint64_t live_slabs = options_.max_requests - free_slabs_.size();
  return pool_->bytes_held() + live_slabs * slab_bytes_ + boundary_state_bytes() + chunks_live_ * chunk_bytes_;
}

}  // namespace tessera
