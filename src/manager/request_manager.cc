#include "tessera/request_manager.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "tessera/checked.h"
#include "tessera/counter.h"
#include "tessera/layout.h"
#include "tessera/slots.h"

namespace tessera {

// The first cache line holds what every decode step reads of a request (Get, Reserve, the
// append): a step over thousands of requests reads one line of each, and the tokens of its
// unsealed span from span_arena_ (ADR 0040). The rest is read at seals, admission and fork.
struct alignas(64) RequestManager::Request {
  bool live = false;
  uint8_t priority = kDefaultRetentionPriority;
  // Admitted by AdmitKeyed: its blocks are sealed under caller keys (ADR 0045).
  bool caller_keyed = false;
  uint32_t generation = 0;  // of the slot: kept across Free (RequestId)
  uint64_t tokens = 0;      // tokens written; those of the unsealed span are in span_arena_
  PinnedBlocks table;       // one block per block span (allocated slots), each pinned
  uint32_t tenant = 0;
  uint32_t domain = 0;
  uint64_t salt = 0;
  // One per sealed block; read only at its back (the parent of the next seal) and for its size.
  // A caller-keyed request keeps only the last of its hit blocks, then one per block it seals.
  std::vector<PrefixRef> chain;
  uint32_t state = UINT32_MAX;  // the state component's slab (models with windows)
  // The prompt's prefix keys (HashPrompt's) and the tokens of its blocks from slot
  // prompt_first on, until the prompt's last whole block is sealed: a seal of such a block
  // whose tokens and parent match takes its key from here instead of hashing it again.
  std::vector<Hash128> prompt_keys;
  std::vector<uint32_t> prompt_tokens;
  size_t prompt_first = 0;
};
namespace {

// The pool groups and the state layers of a model, from its cache layout (the same layout the
// ledger prices for engine tessera).
struct Plan {
  BlockPoolOptions pool;
  std::optional<StateOptions> state;
};

// Where a model layer's paged caches live: (model layer, role) -> (pool group, layer within it).
using PageSlots = std::map<std::pair<uint32_t, CacheRole>, std::pair<int32_t, uint32_t>>;

// The state component's layers: per model layer, its compressor rings and where its compressed
// entries (and its indexer's) go in the pool.
std::vector<StateLayer> StateLayers(const Geometry& g, const ManagerOptions& o, const BlockPoolOptions& pool,
                                    const PageSlots& slots) {
  std::vector<StateLayer> layers;
  const uint32_t doubling = o.spec_tokens > 0 ? 2 : 1;
  for (const LayerSpec& spec : g.layers) {
    if (spec.is_mtp && !o.include_mtp) continue;
    StateLayer l;
    l.layer = spec.index;
    for (const CacheSpec& c : spec.caches) {
      auto slot = slots.find({spec.index, c.role});
      switch (c.role) {
        case CacheRole::kCompressed:
          l.ratio = c.compress_ratio;
          if (slot != slots.end()) {
            std::tie(l.group, l.group_layer) = slot->second;
            l.entries_per_block = pool.groups[static_cast<size_t>(l.group)].page.entries_per_block;
          }
          break;
        case CacheRole::kIndexer:
          if (slot != slots.end()) std::tie(l.igroup, l.igroup_layer) = slot->second;
          break;
        case CacheRole::kCompressorState:
          l.state_slots = c.slots * doubling;
          l.state_floats = c.state_floats;
          break;
        case CacheRole::kIndexerCompressorState:
          l.istate_slots = c.slots * doubling;
          l.istate_floats = c.state_floats;
          break;
        default:
          break;
      }
    }
    if (l.ratio > 0) l.coff = l.state_slots / doubling / l.ratio;
    layers.push_back(l);
  }
  return layers;
}

Result<Plan> PlanCaches(const Geometry& g, const ManagerOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(CacheLayout layout, ComputeCacheLayout(g, static_cast<const CacheLayoutOptions&>(o)));
  Plan plan;
  plan.pool.capacity_blocks = o.capacity_blocks;
  plan.pool.region_kind = o.region_kind;
  plan.pool.reuse = o.block_reuse;
  PageSlots slots;
  bool compressed = false;
  uint64_t window_record_bytes = 0;
  for (const CacheGroup& group : layout.groups) {
    if (group.role == CacheRole::kWindow) window_record_bytes = group.format.record_bytes();
    if (!group.in_pages) continue;
    compressed = compressed || group.compress_ratio > 1;
    const auto pool_group = static_cast<int32_t>(plan.pool.groups.size());
    for (uint32_t i = 0; i < group.model_layers.size(); ++i)
      slots[{group.model_layers[i], group.role}] = {pool_group, i};
    plan.pool.groups.push_back({group.name, group.format, group.layers, group.page});
  }
  if (plan.pool.groups.empty()) return InvalidArgument("model", g.name + " has no paged cache");
  // Sliding-window MHA and linear-attention layers (ADR 0033) keep per-request state the state
  // component builds for DeepSeek-V4 only: refused rather than held without it.
  for (const CacheGroup& group : layout.groups) {
    if (!group.in_pages && !g.is_hybrid) {
      return InvalidArgument("model", g.name + "'s " + group.name +
                                          " state (sliding-window or linear-attention layers) is not held by the "
                                          "request manager yet");
    }
  }
  const bool windows = g.is_hybrid && g.sliding_window > 0;
  if (compressed && !windows) {
    return InvalidArgument("sliding_window", g.name + " has compressed caches but no sliding window to build them");
  }
  if (!windows) return plan;
  TESSERA_RETURN_IF_ERROR(CheckWindowStrategy(layout, o.window_strategy));

  StateOptions so;
  so.strategy = o.window_strategy;
  so.window = g.sliding_window;
  so.spec_tokens = o.spec_tokens;
  so.block_tokens = layout.block.block_tokens;
  so.max_requests = o.max_requests;
  so.window_record_bytes = window_record_bytes;
  so.layers = StateLayers(g, o, plan.pool, slots);
  plan.state = std::move(so);
  return plan;
}

}  // namespace

RequestManager::RequestManager() = default;
RequestManager::~RequestManager() = default;

Result<std::unique_ptr<RequestManager>> RequestManager::Create(const Geometry& g, const ManagerOptions& options) {
  if (options.capacity_blocks == 0) return InvalidArgument("capacity-blocks", "must be positive");
  if (options.max_requests == 0) return InvalidArgument("max-requests", "must be positive");
  if (options.kv_events && options.kv_events_capacity == 0) {
    return InvalidArgument("kv-events-capacity", "must be positive when events are recorded");
  }
  if (options.spec_tokens > 1024) return InvalidArgument("spec-tokens", "at most 1024 draft tokens per step");
  if (options.caller_keys && options.region_kind != RegionKind::kUnbacked) {
    return InvalidArgument("caller-keys",
                           "a pool that holds KV bytes verifies its blocks by tokens (tiers, content dedup): "
                           "caller keys need an unbacked pool");
  }
  TESSERA_ASSIGN_OR_RETURN(Plan plan, PlanCaches(g, options));
  // Seals may be deferred with an unbacked pool and no windows (ADR 0048): kDeferred is refused
  // elsewhere, and kAuto defers exactly there (ADR 0049).
  const bool holds_bytes = options.region_kind != RegionKind::kUnbacked;
  const bool may_defer = !holds_bytes && !plan.state;
  if (options.seal_timing == SealTiming::kDeferred && !may_defer) {
    return InvalidArgument("defer-seals", holds_bytes
                                              ? "a pool that holds KV bytes makes a sealed block's bytes final "
                                                "at its seal: deferred seals need an unbacked pool"
                                              : g.name + " has sliding windows: their state is kept at the seal");
  }
  if (options.caller_keys && plan.state) {
    return InvalidArgument("caller-keys", g.name + " has sliding windows: caller keys serve one paged group only");
  }
  TESSERA_ASSIGN_OR_RETURN(ContentHasher hasher,
                           options.hash_key.empty()
                               ? ContentHasher::Create(options.hash, options.hash_bits, options.hash_key_seed)
                               : ContentHasher::CreateWithKey(options.hash, options.hash_bits, options.hash_key));
  std::unique_ptr<RequestManager> m(new RequestManager());
  m->options_ = options;
  m->defer_seals_ = may_defer && options.seal_timing != SealTiming::kImmediate;
  TESSERA_ASSIGN_OR_RETURN(m->pool_, BlockPool::Create(std::move(plan.pool)));
  m->block_tokens_ = m->pool_->block_tokens();
  if (std::has_single_bit(m->block_tokens_)) m->span_shift_ = std::countr_zero(m->block_tokens_);
  for (const PoolGroup& pg : m->pool_->groups()) m->token_groups_ = m->token_groups_ || pg.page.compress_ratio == 1;
  const std::string_view variant = plan.state ? SwaStrategyName(options.window_strategy) : std::string_view();
  const Hash128 identity = CacheIdentityKey(g.config_sha256, options.weights_revision, *m->pool_, variant);
  static std::atomic<uint64_t> managers{0};
  m->instance_ = managers.fetch_add(1, std::memory_order_relaxed) + 1;
  m->index_ = std::make_unique<BlockIndex>(m->pool_.get(), hasher, options.content_dedup,
                                           /*bucket_limit=*/8, identity);
  if (options.caller_keys) m->index_->EnableCallerKeys();
  if (plan.state) {
    TESSERA_ASSIGN_OR_RETURN(m->states_, RequestStates::Create(std::move(*plan.state)));
  }
  // The table grows on demand; reserve what a ceiling (or a typical batch) needs up front.
  m->requests_.reserve(std::min<uint32_t>(options.max_requests, 1024));
  m->free_request_ids_.reserve(std::min<uint32_t>(options.max_requests, 1024));
  // The index's hook runs before the pool's listener below drops a block's kept window state,
  // so the state travels with the block.
  RequestManager* self = m.get();
  m->kv_medium_ = options.region_kind == RegionKind::kUnbacked ? KvMedium::kGpu : KvMedium::kCpu;
  m->index_->SetEvictionHook([self](BlockId b, const SealedIdentity& id) {
    if (self->resetting_) return;  // a reset drops the blocks and says so once (AllBlocksCleared)
    if (self->options_.kv_events) self->RecordRemoved(id.key);
    if (self->source_ == nullptr || !self->pool_->backed()) return;
    std::vector<std::byte> state = self->TierState(b);
    SealedIdentity with_state = id;
    with_state.state = state;
    self->source_->OnEvicted(*self->pool_, b, with_state);
  });
  if (m->states_) {
    m->pool_->AddEvictionListener([self](BlockId b) {
      self->states_->Forget(b);
      self->SyncStateBytes();
    });
  }
  return m;
}

uint32_t RequestManager::domain_of(uint32_t tenant) const {
  auto it = options_.tenant_domain.find(tenant);
  return it == options_.tenant_domain.end() ? tenant : it->second;
}

void RequestManager::SetSecurityListener(std::function<void(const SecurityEvent&)> listener) {
  index_->SetSecurityListener(std::move(listener));
}

RequestManager::Request* RequestManager::Get(RequestId r) {
  if (r.value >= requests_.size()) return nullptr;
  Request& q = requests_[r.value];
  if (!q.live || q.generation != r.generation) return nullptr;
  return &q;
}

const RequestManager::Request* RequestManager::GetConst(RequestId r) const {
  if (r.value >= requests_.size()) return nullptr;
  const Request& q = requests_[r.value];
  if (!q.live || q.generation != r.generation) return nullptr;
  return &q;
}

Status RequestManager::NoRequest(RequestId r) {
  return InvalidArgument(
      "request", "no live request " + std::to_string(r.value) + " (generation " + std::to_string(r.generation) + ")");
}

std::optional<uint32_t> RequestManager::TenantOf(RequestId r) const {
  const Request* q = GetConst(r);
  if (q == nullptr) return std::nullopt;
  return q->tenant;
}

std::optional<RequestId> RequestManager::LiveAt(uint32_t slot) const {
  if (slot >= requests_.size() || !requests_[slot].live) return std::nullopt;
  return RequestId{slot, requests_[slot].generation};
}

Status RequestManager::OutOfBlocks(uint64_t needed) {
  Bump(metrics_.out_of_blocks, 1);
  return tessera::OutOfBlocks("blocks", "need " + std::to_string(needed) + " blocks, " +
                                            std::to_string(pool_->Available()) + " free or evictable of " +
                                            std::to_string(pool_->capacity()));
}

// A block id per block span: the group whose entries need the most blocks decides.
uint64_t RequestManager::BlocksNeeded(uint64_t tokens) const {
  if (!states_) return SpanOf(tokens + block_tokens_ - 1);  // per-token groups: a block per span
  uint64_t need = 0;
  for (const PoolGroup& g : pool_->groups()) {
    need = std::max(need, CeilDiv(tokens / g.page.compress_ratio, g.page.entries_per_block));
  }
  return need;
}

PromptKeys RequestManager::HashPrompt(std::span<const uint32_t> prompt, const RequestSpec& spec) const {
  PromptKeys k;
  k.tokens_.assign(prompt.begin(), prompt.end());
  k.domain_ = domain_of(spec.tenant);
  k.salt_ = spec.cache_salt;
  k.owner_ = instance_;
  k.keys_.reserve(prompt.size() / block_tokens_);
  Hash128 parent = index_->root_key();
  for (size_t i = 0; i + block_tokens_ <= prompt.size(); i += block_tokens_) {
    parent = index_->PrefixKey(parent, prompt.subspan(i, block_tokens_), k.domain_, k.salt_);
    k.keys_.push_back(parent);
  }
  return k;
}

Result<Admission> RequestManager::Admit(std::span<const uint32_t> prompt, const RequestSpec& spec) {
  return Admit(HashPrompt(prompt, spec), spec);
}

// Long (~85 lines): admission is one transaction (prefix match, source fetch, slot reservation)
// whose undo on each failure must see what was taken before it.
Result<Admission> RequestManager::Admit(const PromptKeys& keys, const RequestSpec& spec) {
  DrainAll();
  steps_warm_ = false;
  if (keys.owner_ != instance_) return InvalidArgument("prompt", "prompt keys hashed by another manager");
  if (keys.domain_ != domain_of(spec.tenant) || keys.salt_ != spec.cache_salt) {
    return InvalidArgument("prompt", "prompt keys hashed for another tenant or cache salt");
  }
  if (live_ >= options_.max_requests || (states_ && states_->slabs_free() == 0)) {
    return tessera::OutOfBlocks(
        "requests", "all " + std::to_string(options_.max_requests) + " requests allowed by max-requests are live");
  }
  const std::span<const uint32_t> prompt = keys.tokens();
  // The last prompt token is always computed: its logits start generation.
  const size_t max_blocks =
      prompt.empty() || !spec.read_cache ? 0 : std::min((prompt.size() - 1) / block_tokens_, keys.keys_.size());
  Request q;
  q.table = PinnedBlocks(pool_.get());
  q.live = true;
  q.tenant = spec.tenant;
  q.domain = keys.domain_;
  q.salt = keys.salt_;
  q.priority = std::min(spec.priority, kMaxRetentionPriority);
  q.chain = index_->LongestPrefix(prompt, std::span(keys.keys_).first(max_blocks), q.domain, q.salt);
  // Room for the prompt and as much again of generation: tables that grow at a block boundary
  // grow for every request crossing it in the same scheduler step.
  const size_t blocks_ahead = 2 * (CeilDiv(prompt.size() + options_.spec_tokens, block_tokens_) + 1);
  q.table.reserve(blocks_ahead);
  q.chain.reserve(blocks_ahead);
  for (const PrefixRef& hit : q.chain) q.table.Pin(hit.block);
  if (q.chain.size() < keys.keys_.size()) {  // blocks to seal whose keys are known
    q.prompt_first = q.chain.size();
    q.prompt_keys.assign(keys.keys_.begin(), keys.keys_.end());
    q.prompt_tokens.assign(prompt.begin() + static_cast<ptrdiff_t>(q.prompt_first * block_tokens_),
                           prompt.begin() + static_cast<ptrdiff_t>(keys.keys_.size() * block_tokens_));
  }
  Admission a;
  if (source_ != nullptr && q.chain.size() < max_blocks && pool_->backed()) {
    const size_t first = q.table.size();
    std::vector<std::vector<std::byte>> states;
    a.tier_blocks = static_cast<uint32_t>(FetchFromSource(*pool_, *index_, *source_, prompt,
                                                          std::span(keys.keys_).first(max_blocks), first, q.domain,
                                                          q.salt, &q.table, states_ ? &states : nullptr));
    for (size_t i = 0; i < a.tier_blocks; ++i) {
      const size_t slot = first + i;
      SealSlot(q, slot, prompt.subspan(slot * block_tokens_, block_tokens_), Promoted{states_ ? &states[i] : nullptr});
    }
  }
  a.cached_blocks = static_cast<uint32_t>(q.table.size());
  a.cached_tokens = uint64_t{a.cached_blocks} * block_tokens_;
  q.tokens = a.cached_tokens;
  // Slots for the rest of the prompt (or the part the engine asked for): all or nothing.
  const uint64_t rest = prompt.size() - a.cached_tokens;
  const uint64_t reserve = std::min(rest, spec.reserve_tokens.value_or(rest));
  const uint64_t need = BlocksNeeded(a.cached_tokens + reserve + options_.spec_tokens);
  const uint64_t more = need > q.table.size() ? need - q.table.size() : 0;
  // Refused: the request's table releases its references as it goes out of scope (promoted
  // blocks stay cached, with the state they installed).
  if (more > pool_->Available()) {
    SyncStateBytes();
    return OutOfBlocks(more);
  }
  Status allocated = q.table.Allocate(static_cast<uint32_t>(more));
  assert(allocated.ok());
  (void)allocated;
  if (states_) {
    q.state = *states_->Open();  // a slab is free: checked above
    if (a.cached_blocks > 0) {
      const RequestStates::Resumption r = states_->Resume(q.state, a.cached_tokens, q.table[a.cached_blocks - 1]);
      a.state_restored = r.restored;
      a.recompute_from = r.recompute_from;
      a.recompute_tokens = r.recompute_tokens;
      if (r.restored) {
        Bump(metrics_.states_restored);
      } else {
        Bump(metrics_.recompute_tokens, r.recompute_tokens);
      }
    }
  }
  const uint32_t id = TakeRequestSlot();
  q.generation = requests_[id].generation;
  requests_[id] = std::move(q);
  ++live_;
  a.id = RequestId{id, requests_[id].generation};
  const size_t full_blocks = prompt.size() / block_tokens_;
  Bump(metrics_.requests_admitted, 1);
  Bump(metrics_.prefix_hit_tokens, a.cached_tokens);
  Bump(metrics_.prefix_hit_blocks, a.cached_blocks);
  Bump(metrics_.prefix_miss_blocks, full_blocks - a.cached_blocks);
  Bump(metrics_.prefix_miss_tokens, prompt.size() - a.cached_tokens);
  Bump(metrics_.tier_hit_blocks, a.tier_blocks);
  Bump(metrics_.tier_hit_tokens, uint64_t{a.tier_blocks} * block_tokens_);
  SyncStateBytes();
  return a;
}

// Caller-keyed admission (ADR 0045): Admit's transaction without the prompt's tokens — the hit is
// looked up and verified by the caller's hashes, and no block source is asked (refused above).
Result<Admission> RequestManager::AdmitKeyed(std::span<const CallerHash> hashes, uint64_t prompt_tokens,
                                             const RequestSpec& spec) {
  DrainAll();
  steps_warm_ = false;
  if (!index_->caller_keys()) {
    return InvalidArgument("caller-keys", "the manager was created without caller keys (ManagerOptions::caller_keys)");
  }
  if (source_ != nullptr) {
    return InvalidArgument("caller-keys",
                           "a block source is attached: its records are verified by tokens (ADR 0010); "
                           "admit by tokens");
  }
  if (hashes.size() > prompt_tokens / block_tokens_) {
    return InvalidArgument("hashes", std::to_string(hashes.size()) + " hashes for a prompt of " +
                                         std::to_string(prompt_tokens / block_tokens_) + " whole blocks");
  }
  if (live_ >= options_.max_requests) {
    return tessera::OutOfBlocks(
        "requests", "all " + std::to_string(options_.max_requests) + " requests allowed by max-requests are live");
  }
  const uint32_t domain = domain_of(spec.tenant);
  const size_t max_blocks =
      prompt_tokens == 0 || !spec.read_cache ? 0 : std::min<size_t>((prompt_tokens - 1) / block_tokens_, hashes.size());
  Request q;
  q.table = PinnedBlocks(pool_.get());
  q.live = true;
  q.caller_keyed = true;
  q.tenant = spec.tenant;
  q.domain = domain;
  q.salt = spec.cache_salt;
  q.priority = std::min(spec.priority, kMaxRetentionPriority);
  // The prompt's blocks and one more; the chain from the last hit on. (Admit reserves twice the
  // table for Step's decode growth and keeps a chain entry per hit block: a caller-keyed request
  // grows through AppendKeyed, and every reserved byte is host memory that the first admissions
  // fault in — 1.6 KB per request of a 4,224-token hit.)
  const size_t prompt_blocks = CeilDiv(prompt_tokens + options_.spec_tokens, block_tokens_);
  q.table.reserve(prompt_blocks + 1);
  q.chain.reserve(prompt_blocks - std::min(prompt_blocks, max_blocks) + 2);
  PrefixRef parent;
  for (size_t b = 0; b < max_blocks; ++b) {
    const Hash128 key =
        index_->CallerKey(parent.is_root() ? index_->root_key() : parent.key, hashes[b], domain, q.salt);
    const std::optional<PrefixRef> hit = index_->LookupKeyed(parent, key, hashes[b], domain, q.salt);
    if (!hit) break;
    q.table.Pin(hit->block);
    parent = *hit;
  }
  if (!parent.is_root()) q.chain.push_back(parent);
  Admission a;
  a.cached_blocks = static_cast<uint32_t>(q.table.size());
  a.cached_tokens = uint64_t{a.cached_blocks} * block_tokens_;
  q.tokens = a.cached_tokens;
  const uint64_t rest = prompt_tokens - a.cached_tokens;
  const uint64_t reserve = std::min(rest, spec.reserve_tokens.value_or(rest));
  const uint64_t need = BlocksNeeded(a.cached_tokens + reserve + options_.spec_tokens);
  const uint64_t more = need > q.table.size() ? need - q.table.size() : 0;
  if (more > pool_->Available()) return OutOfBlocks(more);  // q's table releases its pins
  Status allocated = q.table.Allocate(static_cast<uint32_t>(more));
  assert(allocated.ok());
  (void)allocated;
  const uint32_t id = TakeRequestSlot();
  q.generation = requests_[id].generation;
  requests_[id] = std::move(q);
  ++live_;
  a.id = RequestId{id, requests_[id].generation};
  const uint64_t full_blocks = prompt_tokens / block_tokens_;
  Bump(metrics_.requests_admitted, 1);
  Bump(metrics_.prefix_hit_tokens, a.cached_tokens);
  Bump(metrics_.prefix_hit_blocks, a.cached_blocks);
  Bump(metrics_.prefix_miss_blocks, full_blocks - a.cached_blocks);
  Bump(metrics_.prefix_miss_tokens, prompt_tokens - a.cached_tokens);
  return a;
}

Status RequestManager::AppendKeyed(RequestId r, std::span<const uint32_t> tokens, std::span<const CallerHash> hashes) {
  DrainAll();
  Request* q = Get(r);
  if (q == nullptr) return NoRequest(r);
  if (!q->caller_keyed) return InvalidArgument("request", "admitted by tokens: append with Append");
  const Checked end = Checked(q->tokens) + tokens.size();
  if (end.overflowed()) return OutOfRange("tokens", "token count overflows");
  const uint64_t completes = SpanOf(end.value()) - SpanOf(q->tokens);
  if (hashes.size() != completes) {
    return InvalidArgument("hashes", std::to_string(hashes.size()) + " hashes for the " + std::to_string(completes) +
                                         " blocks these tokens complete");
  }
  if (BlocksNeeded(end.value()) > q->table.size()) {
    return FailedPrecondition(
        "tokens", "no slots for " + std::to_string(tokens.size()) + " more tokens: call AllocateSlots first");
  }
  if (const uint32_t copies = SharedSlots(*q, tokens.size()); copies > 0) {
    if (copies > pool_->Available()) return OutOfBlocks(copies);
    TESSERA_RETURN_IF_ERROR(UnshareSlots(*q, tokens.size()));
  }
  // An unbacked pool without windows (Create's checks): the tokens go to the span, a completed
  // span is sealed under its caller key.
  uint32_t* const span = span_arena_.data() + static_cast<size_t>(q - requests_.data()) * block_tokens_;
  size_t sealed = 0;
  while (!tokens.empty()) {
    const uint64_t p0 = q->tokens;
    const size_t n = std::min<size_t>(tokens.size(), block_tokens_ - SpanOffset(p0));
    std::copy(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n), span + SpanOffset(p0));
    q->tokens += n;
    if (SpanOffset(q->tokens) == 0) {
      SealKeyedSlot(*q, SpanOf(q->tokens) - 1, {span, block_tokens_}, hashes[sealed++]);
    }
    tokens = tokens.subspan(n);
  }
  return Status::Ok();
}

void RequestManager::SealKeyedSlot(Request& q, size_t slot, std::span<const uint32_t> tokens, const CallerHash& hash) {
  const PrefixRef parent = q.chain.empty() ? PrefixRef{} : q.chain.back();
  const Hash128 key = index_->CallerKey(parent.is_root() ? index_->root_key() : parent.key, hash, q.domain, q.salt);
  const BlockIndex::SealResult sealed = index_->SealKeyed(q.table[slot], parent, key, hash, tokens, q.domain, q.salt);
  if (options_.kv_events) RecordStored(parent, sealed.ref.key, tokens, q.domain);
  pool_->SetPriority(sealed.ref.block, q.priority);
  // As SealSlot: a duplicate (two requests computed the block) stays this request's, and its
  // successors chain under the block that holds the key.
  q.chain.push_back(sealed.holder);
}

uint32_t RequestManager::SharedSlots(const Request& q, uint64_t n) const {
  if (n == 0) return 0;
  if (!forked_) return 0;  // only a fork shares a filling block
  const size_t first = SpanOf(q.tokens);
  const size_t last = std::min<size_t>(q.table.size(), SpanOf(q.tokens + n + block_tokens_ - 1));
  uint32_t shared = 0;
  for (size_t slot = first; slot < last; ++slot) {
    const BlockId b = q.table[slot];
    if (pool_->state(b) == BlockState::kFilling && pool_->refcount(b) > 1) ++shared;
  }
  return shared;
}

Status RequestManager::UnshareSlots(Request& q, uint64_t n) {
  if (!forked_) return Status::Ok();
  const size_t first = SpanOf(q.tokens);
  const size_t last = std::min<size_t>(q.table.size(), SpanOf(q.tokens + n + block_tokens_ - 1));
  for (size_t slot = first; slot < last; ++slot) {
    const BlockId b = q.table[slot];
    if (pool_->state(b) == BlockState::kFilling && pool_->refcount(b) > 1) {
      TESSERA_RETURN_IF_ERROR(CopyOnWrite(q, slot));
    }
  }
  return Status::Ok();
}

Status RequestManager::CopyOnWrite(Request& q, size_t slot) {
  const BlockId old = q.table[slot];
  if (pool_->Available() == 0) return OutOfBlocks(1);
  PinnedBlocks fresh(pool_.get());
  TESSERA_RETURN_IF_ERROR(fresh.Allocate(1));
  if (pool_->backed()) {
    for (uint32_t g = 0; g < pool_->groups().size(); ++g) {
      std::span<const std::byte> from = pool_->Bytes(pool_->BlockHandleOf(old, g));
      std::span<std::byte> to = pool_->MutableBytes(pool_->BlockHandleOf(fresh[0], g));
      std::memcpy(to.data(), from.data(), from.size());
    }
  }
  q.table.Replace(slot, std::move(fresh));
  Bump(metrics_.cow_copies, 1);
  return Status::Ok();
}

// Room for n more tokens and the draft tokens: new blocks, and copies of the blocks those
// tokens land in that a fork shares unsealed (so that Append cannot run out later).
Status RequestManager::Reserve(Request& q, uint64_t n) {
  const Checked total = Checked(q.tokens) + n + options_.spec_tokens;
  if (total.overflowed()) return OutOfRange("tokens", "token count overflows");
  const uint64_t need = BlocksNeeded(total.value());
  const uint64_t more = need > q.table.size() ? need - q.table.size() : 0;
  const uint64_t copies = SharedSlots(q, n);
  if (more + copies == 0) return Status::Ok();
  if (more + copies > pool_->Available()) return OutOfBlocks(more + copies);
  TESSERA_RETURN_IF_ERROR(UnshareSlots(q, n));
  return q.table.Allocate(static_cast<uint32_t>(more));
}

Status RequestManager::AllocateSlots(RequestId r, uint64_t n) {
  DrainAll();
  Request* q = Get(r);
  if (q == nullptr) return NoRequest(r);
  return Reserve(*q, n);
}

// Writes `tokens` (REQUIRES: their slots are reserved and unshared), one block span at a time:
// per-token records only where writers fill them, the state component token by token, and a
// seal where a span completes. Without writers and windows the cost is per span, not per token.
Status RequestManager::AppendReserved(Request& q, std::span<const uint32_t> tokens, const KvWriters& w) {
  const bool pages = w.page && pool_->backed() && token_groups_;
  uint32_t* const span = span_arena_.data() + static_cast<size_t>(&q - requests_.data()) * block_tokens_;
  while (!tokens.empty()) {
    const uint64_t p0 = q.tokens;
    const size_t n = std::min<size_t>(tokens.size(), block_tokens_ - SpanOffset(p0));
    if (pages) {
      // Per-token groups have a block from the span's first token on (compressed groups only
      // once an entry completes).
      const BlockId b = q.table[SpanOf(p0)];
      assert(pool_->state(b) == BlockState::kFilling && pool_->refcount(b) == 1 &&
             "writing into a shared or sealed block");
      for (uint64_t p = p0; p < p0 + n; ++p) {
        for (uint32_t g = 0; g < pool_->groups().size(); ++g) {
          if (pool_->groups()[g].page.compress_ratio != 1) continue;
          for (uint32_t l = 0; l < pool_->groups()[g].layers; ++l) {
            w.page(g, l, p, pool_->MutableRecord(b, g, l, p % block_tokens_));
          }
        }
      }
    }
    if (states_) {
      const EntrySink sink = [this, &q](uint32_t group, uint32_t layer, uint64_t entry) -> Result<RecordView> {
        const uint64_t epb = pool_->groups()[group].page.entries_per_block;
        if (entry / epb >= q.table.size()) {
          return FailedPrecondition("tokens",
                                    "no page for entry " + std::to_string(entry) + ": call AllocateSlots first");
        }
        return pool_->MutableRecord(q.table[entry / epb], group, layer, entry % epb);
      };
      std::copy(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n), span + SpanOffset(p0));
      for (uint64_t p = p0; p < p0 + n; ++p) {
        Status st = states_->WriteToken(q.state, p, w, pool_->backed() ? &sink : nullptr);
        if (!st.ok()) {  // tokens before p are written and stay
          q.tokens = p;
          return st;
        }
      }
    }
    if (n == 1) {
      span[SpanOffset(p0)] = tokens[0];  // a decode step's token: no call into memmove
    } else {
      std::copy(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n), span + SpanOffset(p0));
    }
    q.tokens += n;
    if (SpanOffset(q.tokens) == 0) SealSlot(q, SpanOf(q.tokens) - 1, {span, block_tokens_}, std::nullopt);
    tokens = tokens.subspan(n);
  }
  return Status::Ok();
}

// The one seal path, for a span the request wrote and for a block promoted from the block
// source (its state, if any, came with it; nothing is written back to the source).
void RequestManager::SealSlot(Request& q, size_t slot, std::span<const uint32_t> tokens,
                              std::optional<Promoted> promoted) {
  step_sealed_ = true;
  const PrefixRef parent = q.chain.empty() ? PrefixRef{} : q.chain.back();
  const Hash128* key = PromptKey(q, slot, parent, tokens);
  if (key == nullptr) key = StepSealKey(q, slot);
  const BlockIndex::SealResult sealed = key != nullptr
                                            ? index_->Seal(q.table[slot], parent, *key, tokens, q.domain, q.salt)
                                            : index_->Seal(q.table[slot], parent, tokens, q.domain, q.salt);
  if (slot + 1 >= q.prompt_keys.size() && !q.prompt_keys.empty()) {  // the prompt's last block: drop its keys
    std::vector<Hash128>().swap(q.prompt_keys);
    std::vector<uint32_t>().swap(q.prompt_tokens);
  }
  const BlockId kept = sealed.ref.block;
  if (options_.kv_events && !sealed.deduplicated) RecordStored(parent, sealed.ref.key, tokens, q.domain);
  // A block this request sealed takes its priority; a shared one keeps the highest.
  pool_->SetPriority(kept, sealed.deduplicated ? std::max(pool_->priority(kept), q.priority) : q.priority);
  q.table.Rename(slot, kept);
  // A block equal to one another request sealed first (both computed it: admitted together, or
  // this one did not read the cache) stays this request's, but its successors chain under the
  // indexed one, so the index keeps one unbroken chain for the prefix.
  q.chain.push_back(sealed.holder);
  if (promoted) {
    if (promoted->state != nullptr) states_->Install(kept, *promoted->state);
    return;
  }
  if (states_) states_->Sealed(q.state, uint64_t{slot + 1} * block_tokens_, kept);
  if (source_ != nullptr && !sealed.deduplicated && pool_->backed()) {
    std::vector<std::byte> state = TierState(kept);
    SealedIdentity id = index_->IdentityOf(kept);
    id.state = state;
    source_->OnSealed(*pool_, kept, id);
  }
}

// The prompt key HashPrompt computed for the block in `slot`, when the request writes the prompt's
// own tokens there after the prompt's own parent (else nullptr: the seal hashes the key).
const Hash128* RequestManager::PromptKey(const Request& q, size_t slot, const PrefixRef& parent,
                                         std::span<const uint32_t> tokens) const {
  if (slot >= q.prompt_keys.size() || slot < q.prompt_first) return nullptr;
  const Hash128& parent_key = slot == 0 ? index_->root_key() : q.prompt_keys[slot - 1];
  if (parent.is_root() != (slot == 0) || (slot > 0 && parent.key != parent_key)) return nullptr;
  const uint32_t* own = q.prompt_tokens.data() + (slot - q.prompt_first) * block_tokens_;
  if (tokens.size() != block_tokens_ || !std::equal(tokens.begin(), tokens.end(), own)) return nullptr;
  return &q.prompt_keys[slot];
}

// Consecutive seals of one chain extend one BlockStored (vLLM's shape: a chain per event).
void RequestManager::RecordStored(const PrefixRef& parent, const Hash128& key, std::span<const uint32_t> tokens,
                                  uint32_t domain) {
  const std::optional<Hash128> p = parent.is_root() ? std::nullopt : std::optional<Hash128>(parent.key);
  if (!kv_log_.AddStored(p, key, tokens, block_tokens_, domain, kv_medium_, options_.kv_events_capacity)) {
    Bump(metrics_.kv_events_dropped, 1);
  }
}

void RequestManager::RecordRemoved(const Hash128& key) {
  if (!kv_log_.AddRemoved(key, kv_medium_, options_.kv_events_capacity)) Bump(metrics_.kv_events_dropped, 1);
}

std::vector<KvEvent> RequestManager::TakeKvEvents() {
  std::vector<KvEvent> out;
  TakeKvEvents(&out);
  return out;
}

void RequestManager::TakeKvEvents(std::vector<KvEvent>* out) {
  DrainAll();
  kv_log_.CopyTo(out);
  kv_log_.clear();
}

void RequestManager::TakeKvEventLog(KvEventLog* out) {
  DrainAll();
  out->clear();
  std::swap(*out, kv_log_);
}

Status RequestManager::ResetPrefixCache() {
  DrainAll();
  if (live_ > 0) {
    return FailedPrecondition("requests",
                              std::to_string(live_) + " live requests hold blocks: free them before a reset");
  }
  resetting_ = true;
  pool_->EvictAllCached();
  resetting_ = false;
  SyncStateBytes();
  if (options_.kv_events) {
    kv_log_.clear();  // superseded: every block they name is gone
    (void)kv_log_.AddCleared(kv_medium_, options_.kv_events_capacity);
  }
  return Status::Ok();
}

void RequestManager::SyncStateBytes() {
  if (states_) metrics_.state_bytes.store(states_->bytes_held(), std::memory_order_relaxed);
}

std::vector<std::byte> RequestManager::TierState(BlockId b) const {
  return states_ ? states_->TierState(b) : std::vector<std::byte>();
}

Status RequestManager::Append(RequestId r, std::span<const uint32_t> tokens, const KvWriters& writers) {
  DrainAll();
  Request* q = Get(r);
  if (q == nullptr) return NoRequest(r);
  if (q->caller_keyed) return InvalidArgument("request", "admitted with caller keys: append with AppendKeyed");
  if (pool_->backed() && writers.empty() && !tokens.empty()) {
    return InvalidArgument("writers", "the pool holds KV bytes: give writers for them (or manage an unbacked pool)");
  }
  if (BlocksNeeded(q->tokens + tokens.size()) > q->table.size()) {
    return FailedPrecondition(
        "tokens", "no slots for " + std::to_string(tokens.size()) + " more tokens: call AllocateSlots first");
  }
  // A fork after AllocateSlots may have shared a slot again: copy before writing anything.
  if (const uint32_t copies = SharedSlots(*q, tokens.size()); copies > 0) {
    if (copies > pool_->Available()) return OutOfBlocks(copies);
    TESSERA_RETURN_IF_ERROR(UnshareSlots(*q, tokens.size()));
  }
  Status st = AppendReserved(*q, tokens, writers);
  SyncStateBytes();
  return st;
}

Status RequestManager::Step(const StepBatch& batch, const KvWriters& writers, StepResult* out) {
  if (batch.counts.size() != batch.requests.size()) {
    return InvalidArgument("batch", std::to_string(batch.counts.size()) + " counts for " +
                                        std::to_string(batch.requests.size()) + " requests");
  }
  uint64_t total = 0;
  for (uint32_t c : batch.counts) total += c;
  if (total != batch.tokens.size()) {
    return InvalidArgument("batch", "counts add up to " + std::to_string(total) + " tokens, " +
                                        std::to_string(batch.tokens.size()) + " given");
  }
  if (pool_->backed() && writers.empty() && total > 0) {
    return InvalidArgument("writers", "the pool holds KV bytes: give writers for them (or manage an unbacked pool)");
  }
  // Deferred seals (ADR 0048): a bounded share of the queue per step, before the step's own.
  ++steps_;
  if (pending_head_ != pending_end_) Drain(std::max<size_t>(kDrainMin, batch.requests.size() / kDrainSteps), true);
  step_result_ = out;
  out->codes.assign(batch.requests.size(), StatusCode::kOk);
  out->failed = 0;
  out->offsets.assign(1, 0);
  out->offsets.reserve(batch.requests.size() + 1);
  out->new_blocks.clear();
  out->replaced.clear();
  const size_t n = batch.requests.size();
  size_t next = 0, ahead_next = 0;  // the tokens of request i, of request i + kStepAhead
  for (size_t i = 0; i < std::min(n, kStepAhead); ++i) ahead_next += batch.counts[i];
  for (StepSeal& s : step_seals_) s.index = SIZE_MAX;
  // Prefetching the request lines pays once they outgrow the core's caches; below, it only costs.
  const bool prefetch = requests_.size() > kPrefetchFrom || !steps_warm_;
  steps_warm_ = true;
  // Looks ahead for request a (its span's line; its seal's key and index lines if it seals).
  auto look = [&](size_t a, size_t offset) {
    const RequestId ra = batch.requests[a];
    const uint32_t count = batch.counts[a];
    if (ra.value >= requests_.size()) return;
    const Request& qa = requests_[ra.value];
    const uint64_t filled = SpanOffset(qa.tokens);
    __builtin_prefetch(span_arena_.data() + size_t{ra.value} * block_tokens_ + filled, 1);
    // A token that starts a block: the table slot its new block goes to.
    if (filled == 0) __builtin_prefetch(qa.table.ids().data() + qa.table.size(), 1);
    if (count >= block_tokens_ - filled && !defer_seals_) LookAhead(a, ra, batch.tokens.subspan(offset, count));
  };
  size_t i = 0;
  if (!prefetch) {
    // Below kPrefetchFrom the seals' look-ahead starts at the step's first seal (ADR 0044): a
    // step where one request seals is usually one where many do (a batch admitted together
    // crosses its block boundaries together), and until then the loop is the plain one.
    step_sealed_ = false;
    for (; i < n; ++i) {
      const std::span<const uint32_t> tokens = batch.tokens.subspan(next, batch.counts[i]);
      next += batch.counts[i];
      out->codes[i] = StepOne(static_cast<uint32_t>(i), batch.requests[i], tokens, writers, out);
      if (out->codes[i] != StatusCode::kOk) ++out->failed;
      out->offsets.push_back(static_cast<uint32_t>(out->new_blocks.size()));
      if (step_sealed_) [[unlikely]] {
        // Look at the requests the look-ahead loop starts past (i + 1 .. i + kStepAhead).
        ahead_next = next;
        for (size_t a = ++i; a < i + kStepAhead && a < n; ++a) {
          look(a, ahead_next);
          ahead_next += batch.counts[a];
        }
        break;
      }
    }
  }
  for (; i < n; ++i) {
    if (prefetch && i + kStepLines < n) PrefetchRequest(batch.requests[i + kStepLines]);
    if (const size_t a = i + kStepAhead; a < n) {
      look(a, ahead_next);
      ahead_next += batch.counts[a];
    }
    const StepSeal& seal = step_seals_[i % step_seals_.size()];
    step_seal_ = seal.index == i ? &seal : nullptr;
    const std::span<const uint32_t> tokens = batch.tokens.subspan(next, batch.counts[i]);
    next += batch.counts[i];
    out->codes[i] = StepOne(static_cast<uint32_t>(i), batch.requests[i], tokens, writers, out);
    step_seal_ = nullptr;
    if (out->codes[i] != StatusCode::kOk) ++out->failed;
    out->offsets.push_back(static_cast<uint32_t>(out->new_blocks.size()));
  }
  if (defer_seals_) metrics_.seals_pending.store(pending_end_ - pending_head_, std::memory_order_relaxed);
  SyncStateBytes();
  return Status::Ok();
}

// A free request slot, and room for its span in span_arena_ (grown with the table, at admission).
uint32_t RequestManager::TakeRequestSlot() {
  const uint32_t id = detail::TakeSlot(free_request_ids_, requests_);
  if (span_arena_.size() < requests_.size() * block_tokens_) {
    span_arena_.resize(std::max(requests_.size(), 2 * span_arena_.size() / block_tokens_) * block_tokens_);
  }
  if (defer_seals_ && pending_.size() * block_tokens_ < span_arena_.size()) {  // the queue's room, filled now
    pending_.resize(span_arena_.size() / block_tokens_);
    pending_tokens_.resize(span_arena_.size());
  }
  return id;
}

void RequestManager::PrefetchRequest(RequestId r) const {
  if (r.value >= requests_.size()) return;
  const char* p = reinterpret_cast<const char*>(&requests_[r.value]);
  for (size_t off = 0; off < sizeof(Request); off += 64) __builtin_prefetch(p + off);
  __builtin_prefetch(p + sizeof(Request) - 1);
}

// For request `r` (batch position `index`), whose `tokens` complete its unsealed block: hashes the
// block's key now and fetches the index lines its seal will touch. Changes nothing but step_seals_.
void RequestManager::LookAhead(size_t index, RequestId r, std::span<const uint32_t> tokens) {
  if (r.value >= requests_.size()) return;
  const Request& q = requests_[r.value];
  if (!q.live || q.generation != r.generation) return;
  const uint32_t* span = span_arena_.data() + size_t{r.value} * block_tokens_;
  const size_t filled = SpanOffset(q.tokens);
  const size_t slot = SpanOf(q.tokens);
  const size_t room = block_tokens_ - filled;
  // No seal in this step, or one whose key the prompt's keys give (PromptKey).
  if (tokens.size() < room || slot >= q.table.size() || slot < q.prompt_keys.size()) return;
  // The key of the span's tokens and the ones completing it, hashed without joining them first.
  HashSealAhead(step_seals_[index % step_seals_.size()], q, slot, index, {span, filled}, tokens.first(room));
}

// The key of q's seal of `slot` (its tokens given as head then tail, as PrefixKey takes them),
// hashed ahead into `s` as position `index`, and the index lines that seal will touch fetched.
void RequestManager::HashSealAhead(StepSeal& s, const Request& q, size_t slot, size_t index,
                                   std::span<const uint32_t> head, std::span<const uint32_t> tail) {
  const Hash128& parent_key = q.chain.empty() ? index_->root_key() : q.chain.back().key;
  s = StepSeal{&q, q.tokens, q.chain.size(), slot, index, index_->PrefixKey(parent_key, head, tail, q.domain, q.salt)};
  index_->PrefetchKey(s.key);
  index_->PrefetchSeal(q.table[slot]);
  __builtin_prefetch(q.chain.data() + q.chain.size(), 1);
}

// The key LookAhead hashed for the seal of `slot`, when it is still that block's: the same
// request, nothing appended or sealed by it since (a request twice in one batch).
const Hash128* RequestManager::StepSealKey(const Request& q, size_t slot) const {
  const StepSeal* s = step_seal_;
  if (s == nullptr || s->request != &q || s->slot != slot || s->chain != q.chain.size()) return nullptr;
  return &s->key;
}

// The seal of the span the request's last token completed (StepOne's fast path; out of line, so
// that the path's other calls keep their registers).
__attribute__((noinline)) void RequestManager::SealSpan(Request& q) {
  if (defer_seals_) {
    DeferSeal(q);
    return;
  }
  const uint32_t* span = span_arena_.data() + static_cast<size_t>(&q - requests_.data()) * block_tokens_;
  SealSlot(q, SpanOf(q.tokens) - 1, {span, block_tokens_}, std::nullopt);
}

// Queues the seal of the span the request's last token completed (ADR 0048): the request, its
// slot and a copy of the span's tokens (the span is the request's next block's from the next
// token on). A request may have several seals queued (blocks of a few tokens): the queue keeps
// the order they were made in, so each is performed after its parent.
void RequestManager::DeferSeal(Request& q) {
  // The queue's room is one entry per request slot, filled at admission (TakeRequestSlot), so
  // a seal step writes no fresh page; it is full only when requests seal again before the
  // queue drained (blocks of a few tokens), and is then performed whole.
  if (pending_end_ == pending_.size()) Drain(SIZE_MAX);
  const auto r = static_cast<uint32_t>(&q - requests_.data());
  const uint32_t* span = span_arena_.data() + size_t{r} * block_tokens_;
  pending_[pending_end_] = PendingSeal{r, static_cast<uint32_t>(SpanOf(q.tokens) - 1), steps_};
  std::copy_n(span, block_tokens_, pending_tokens_.data() + pending_end_ * block_tokens_);
  ++pending_end_;
  // The request's next token starts a block, in the next step: its table slot's line (last
  // written when this block was taken, a block of steps ago) is fetched now, as the seal
  // performed here would have touched it. Below kPrefetchFrom only: above, that step's
  // look-ahead fetches it (there these fetches made the 4,096-request seal step 2.4x slower).
  if (requests_.size() <= kPrefetchFrom) __builtin_prefetch(q.table.ids().data() + q.table.size(), 1);
}

// Performs up to `max` queued seals, oldest first, through SealSlot (as a step would have), with
// the key of the seal kStepAhead places on hashed ahead and its index lines fetched (LookAhead's
// pipeline). Every queued request is live: Free, Fork and every other call drain the queue first.
// A key hashed ahead for a request queued twice in the window is stale by its turn (its parent
// sealed since): StepSealKey refuses it and the seal hashes its own.
void RequestManager::Drain(size_t max, bool older_only) {
  size_t end = pending_head_ + std::min(max, pending_end_ - pending_head_);
  // Step's share: only the seals made before the previous step (the queue is in step order).
  while (older_only && end > pending_head_ && steps_ - pending_[end - 1].step < 2) --end;
  const StepSeal* const outer = step_seal_;  // a drain inside Step's loop: keep the step's key
  auto tokens_of = [&](size_t i) {
    return std::span<const uint32_t>(pending_tokens_).subspan(i * block_tokens_, block_tokens_);
  };
  auto ahead = [&](size_t i) {
    const PendingSeal& p = pending_[i];
    HashSealAhead(drain_seals_[i % drain_seals_.size()], requests_[p.request], p.slot, i, tokens_of(i), {});
  };
  for (size_t i = pending_head_; i < std::min(end, pending_head_ + kStepAhead); ++i) ahead(i);
  for (size_t i = pending_head_; i < end; ++i) {
    if (i + kStepAhead < end) ahead(i + kStepAhead);
    const PendingSeal& p = pending_[i];
    const StepSeal& s = drain_seals_[i % drain_seals_.size()];
    step_seal_ = s.index == i ? &s : nullptr;
    SealSlot(requests_[p.request], p.slot, tokens_of(i), std::nullopt);
  }
  step_seal_ = outer;
  pending_head_ = end;
  if (pending_head_ == pending_end_) pending_head_ = pending_end_ = 0;
  metrics_.seals_pending.store(pending_end_ - pending_head_, std::memory_order_relaxed);
}

// StepOne's fast path when the token needs one block more: Reserve and AppendReserved would take
// it from the pool and store the token just so (ADR 0046), without their Status and checks.
// REQUIRES: a block is free or evictable; no fork, dedup, state rows or page writers.
__attribute__((noinline)) StatusCode RequestManager::StepNewBlock(Request& q, uint32_t token) {
  // An allocation with no free block evicts a cached one: the queued seals first, as they came.
  if (pool_->free_count() == 0) DrainAll();
  const size_t before = q.table.size();
  if (!q.table.AllocateFree()) {
    const Status allocated = q.table.Allocate(1);
    assert(allocated.ok());
    (void)allocated;
  }
  const uint64_t filled = SpanOffset(q.tokens);
  span_arena_[static_cast<size_t>(&q - requests_.data()) * block_tokens_ + filled] = token;
  ++q.tokens;
  if (filled + 1 == block_tokens_) [[unlikely]]
    SealSpan(q);
  step_result_->new_blocks.push_back(q.table[before]);
  return StatusCode::kOk;
}

// One request of a Step: Reserve (which also unshares what the tokens land in), then the
// append; the request is left unchanged when the reservation is refused.
StatusCode RequestManager::StepOne(uint32_t index, RequestId r, std::span<const uint32_t> tokens,
                                   const KvWriters& writers, StepResult* out) {
  Request* q = Get(r);
  // A caller-keyed request appends with AppendKeyed only: its blocks are sealed under the
  // caller's hashes, which a step does not have (ADR 0045). Left unchanged, as any refusal.
  if (q == nullptr || q->caller_keyed) [[unlikely]]
    return StatusCode::kInvalidArgument;
  if (step_seal_ != nullptr && (step_seal_->request != q || step_seal_->tokens != q->tokens)) step_seal_ = nullptr;
  const size_t before = q->table.size();
  // Only slots from the unsealed one on can change: unshared (after a fork), or renamed when a
  // seal finds an equal block (content dedup, backed pools). Without either nothing is replaced
  // and the step skips the copy and the comparison.
  const bool may_replace = forked_ || index_->dedups();
  // A decode step's usual case: one token into a block reserved already (sealing it when the
  // token completes it), with nothing to write into pages or state rows. Reserve and
  // AppendReserved would do just this.
  if (tokens.size() == 1 && !may_replace && !states_ && !(writers.page && pool_->backed() && token_groups_)) {
    const uint64_t filled = SpanOffset(q->tokens);
    if (q->tokens < (UINT64_MAX >> 1)) {
      // BlocksNeeded without windows (states_ is null here): a block per span.
      const uint64_t need = SpanOf(q->tokens + options_.spec_tokens + block_tokens_);
      if (need <= before) {
        span_arena_[size_t{r.value} * block_tokens_ + filled] = tokens[0];
        ++q->tokens;
        // The token completes the block: its seal, as AppendReserved would (ADR 0044).
        if (filled + 1 == block_tokens_) [[unlikely]]
          SealSpan(*q);
        return StatusCode::kOk;
      }
      // One block more (the step after a seal: the token starts a new block, or the draft slots
      // cross into one), out of line (ADR 0046). Without a free or evictable block the general
      // path refuses the request.
      if (need == before + 1 && pool_->Available() > 0) [[unlikely]]
        return StepNewBlock(*q, tokens[0]);
    }
  }
  // Any other path may seal, evict or copy: the queued seals first, as they came (ADR 0048).
  DrainAll();
  const size_t first = std::min<size_t>(SpanOf(q->tokens), before);
  if (may_replace) step_slots_.assign(q->table.ids().begin() + static_cast<ptrdiff_t>(first), q->table.ids().end());
  if (Status st = Reserve(*q, tokens.size()); !st.ok()) return st.code();
  if (Status st = AppendReserved(*q, tokens, writers); !st.ok()) return st.code();
  if (may_replace) {
    for (size_t slot = first; slot < before; ++slot) {
      const BlockId was = step_slots_[slot - first];
      if (q->table[slot] != was) {
        out->replaced.push_back({index, static_cast<uint32_t>(slot), was, q->table[slot]});
      }
    }
  }
  if (q->table.size() > before) {
    const std::span<const BlockId> added = q->table.ids().subspan(before);
    out->new_blocks.insert(out->new_blocks.end(), added.begin(), added.end());
  }
  return StatusCode::kOk;
}

Status RequestManager::Recompute(RequestId r, std::span<const uint32_t> tokens, const KvWriters& writers) {
  Request* q = Get(r);
  if (q == nullptr) return NoRequest(r);
  if (!states_) return InvalidArgument("model", "a model without windows has nothing to recompute");
  if (tokens.size() > q->tokens || tokens.size() > states_->window()) {
    return InvalidArgument("tokens", "recompute at most the last window tokens of the cached prefix");
  }
  const uint64_t end = q->tokens;
  Status st = Status::Ok();
  for (uint64_t p = end - tokens.size(); p < end && st.ok(); ++p)
    st = states_->WriteToken(q->state, p, writers, nullptr);
  SyncStateBytes();
  return st;
}

Result<RequestId> RequestManager::Fork(RequestId parent) {
  DrainAll();
  const Request* p = Get(parent);
  if (p == nullptr) return NoRequest(parent);
  if (live_ >= options_.max_requests) {
    return tessera::OutOfBlocks(
        "requests", "all " + std::to_string(options_.max_requests) + " requests allowed by max-requests are live");
  }
  Request copy;  // filled before TakeSlot may move requests_
  if (states_) {
    TESSERA_ASSIGN_OR_RETURN(copy.state, states_->Fork(p->state));
  }
  copy.live = true;
  copy.caller_keyed = p->caller_keyed;
  copy.tenant = p->tenant;
  copy.domain = p->domain;
  copy.salt = p->salt;
  copy.priority = p->priority;
  copy.tokens = p->tokens;
  copy.table = p->table.Clone();
  forked_ = true;  // filling blocks may be shared from now on
  copy.chain = p->chain;
  const uint32_t id = TakeRequestSlot();
  copy.generation = requests_[id].generation;
  requests_[id] = std::move(copy);
  std::copy_n(span_arena_.begin() + static_cast<ptrdiff_t>(size_t{parent.value} * block_tokens_), block_tokens_,
              span_arena_.begin() + static_cast<ptrdiff_t>(size_t{id} * block_tokens_));
  ++live_;
  Bump(metrics_.forks, 1);
  SyncStateBytes();
  return RequestId{id, requests_[id].generation};
}

Status RequestManager::Free(RequestId r) {
  DrainAll();
  Request* q = Get(r);
  if (q == nullptr) return NoRequest(r);
  q->table.Clear();  // the tail first (BlockTable)
  if (states_) states_->Close(q->state);
  const uint32_t next_generation = q->generation + 1;  // every id of this slot so far goes stale
  *q = Request{};
  q->generation = next_generation;
  free_request_ids_.push_back(r.value);
  --live_;
  SyncStateBytes();
  return Status::Ok();
}

std::span<const BlockId> RequestManager::BlockTable(RequestId r) const {
  const Request* q = GetConst(r);
  return q == nullptr ? std::span<const BlockId>() : q->table.ids();
}

uint64_t RequestManager::Tokens(RequestId r) const {
  const Request* q = GetConst(r);
  return q == nullptr ? 0 : q->tokens;
}

Result<ConstRecordView> RequestManager::Record(RequestId r, uint32_t group, uint32_t layer, uint64_t position) const {
  const Request* q = GetConst(r);
  if (q == nullptr) return NoRequest(r);
  if (position >= q->tokens) return InvalidArgument("position", "token " + std::to_string(position) + " not written");
  if (!pool_->backed()) return InvalidArgument("pool", "an unbacked pool has no bytes to read");
  if (group >= pool_->groups().size() || layer >= pool_->groups()[group].layers ||
      pool_->groups()[group].page.compress_ratio != 1) {
    return InvalidArgument("layer", "no such per-token group/layer");
  }
  return pool_->Record(q->table[position / block_tokens_], group, layer, position % block_tokens_);
}

Result<RecordView> RequestManager::MutableRecord(RequestId r, uint32_t group, uint32_t layer, uint64_t position) {
  TESSERA_RETURN_IF_ERROR(Record(r, group, layer, position).status());  // the reader's checks
  const BlockId b = GetConst(r)->table[position / block_tokens_];
  // A sealed block's bytes are final (the index, the tiers and prefix hits serve them), a shared
  // one is another table's too: neither is handed out writable (issue 27.7, ADR 0039).
  TESSERA_RETURN_IF_ERROR(pool_->CheckWritable(b, pool_->generation(b)));
  return pool_->MutableRecord(b, group, layer, position % block_tokens_);
}

Result<ConstRecordView> RequestManager::Entry(RequestId r, uint32_t layer, bool indexer, uint64_t entry) const {
  const Request* q = GetConst(r);
  if (q == nullptr) return NoRequest(r);
  if (!pool_->backed()) return InvalidArgument("pool", "an unbacked pool has no bytes to read");
  if (!states_) return InvalidArgument("layer", "a model without windows has no compressed entries");
  for (const StateLayer& l : states_->layers()) {
    if (l.layer != layer) continue;
    const int32_t group = indexer ? l.igroup : l.group;
    if (group < 0) return InvalidArgument("layer", "layer " + std::to_string(layer) + " has no such cache");
    const uint64_t epb = pool_->groups()[static_cast<size_t>(group)].page.entries_per_block;
    if (entry >= q->tokens / l.ratio)
      return InvalidArgument("entry", "entry " + std::to_string(entry) + " not complete");
    return pool_->Record(q->table[entry / epb], static_cast<uint32_t>(group), indexer ? l.igroup_layer : l.group_layer,
                         entry % epb);
  }
  return InvalidArgument("layer", "no layer " + std::to_string(layer));
}

namespace {

// The pool's bytes (writable memory) of a read-only record, for fault injection only.
RecordView FaultInjectionView(const ConstRecordView& v) {
  RecordView w;
  w.plane_count = v.plane_count;
  for (size_t k = 0; k < w.planes.size(); ++k) {
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): pool memory, damaged on purpose
    w.planes[k] = std::span<std::byte>(const_cast<std::byte*>(v.planes[k].data()), v.planes[k].size());
  }
  return w;
}

}  // namespace

Result<RecordView> RequestManager::FaultInjectionRecord(RequestId r, uint32_t group, uint32_t layer,
                                                        uint64_t position) {
  TESSERA_ASSIGN_OR_RETURN(ConstRecordView v, Record(r, group, layer, position));
  return FaultInjectionView(v);
}

Result<RecordView> RequestManager::FaultInjectionEntry(RequestId r, uint32_t layer, bool indexer, uint64_t entry) {
  TESSERA_ASSIGN_OR_RETURN(ConstRecordView v, Entry(r, layer, indexer, entry));
  return FaultInjectionView(v);
}

std::vector<std::byte> RequestManager::LiveState(RequestId r) const {
  const Request* q = GetConst(r);
  if (q == nullptr || !states_) return {};
  return states_->LiveState(q->state, q->tokens);
}

uint64_t RequestManager::bytes_held() const { return pool_->bytes_held() + (states_ ? states_->bytes_held() : 0); }

Result<uint64_t> RequestManager::Checkpoint() {
  DrainAll();
  if (source_ == nullptr) return uint64_t{0};
  return CheckpointBlocks(*pool_, *index_, *source_, [this](BlockId b) { return TierState(b); });
}

// Long (~80 lines): a table of metric families, one entry each.
std::vector<MetricFamily> RequestManager::CollectMetrics() const {
  auto v = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const PoolStats& ps = pool_->stats();
  const IndexStats& is = index_->stats();
  std::vector<MetricFamily> f = {
      {"tessera_block_allocations_total", "Blocks handed out by the pool.", "counter", {{"", v(ps.allocations)}}},
      {"tessera_block_frees_total", "Unsealed blocks returned to the free list.", "counter", {{"", v(ps.frees)}}},
      {"tessera_block_seals_total", "Blocks sealed (bytes final, keys computed).", "counter", {{"", v(ps.seals)}}},
      {"tessera_block_evictions_total", "Cached blocks evicted to make room.", "counter", {{"", v(ps.evictions)}}},
      {"tessera_prefix_hits_total",
       "Prompt blocks and tokens served from the prefix index (tokens verified).",
       "counter",
       {{"unit=\"blocks\"", v(metrics_.prefix_hit_blocks)}, {"unit=\"tokens\"", v(metrics_.prefix_hit_tokens)}}},
      {"tessera_prefix_misses_total",
       "Prompt blocks and tokens not found in the prefix index.",
       "counter",
       {{"unit=\"blocks\"", v(metrics_.prefix_miss_blocks)}, {"unit=\"tokens\"", v(metrics_.prefix_miss_tokens)}}},
      {"tessera_tier_hits_total",
       "Prompt blocks and tokens promoted from the tiers (verified; counted in prefix hits too).",
       "counter",
       {{"unit=\"blocks\"", v(metrics_.tier_hit_blocks)}, {"unit=\"tokens\"", v(metrics_.tier_hit_tokens)}}},
      {"tessera_prefix_key_mismatches_total",
       "Prefix keys that matched while tokens or parent did not.",
       "counter",
       {{"", v(is.prefix_key_mismatches)}}},
      {"tessera_dedup_hits_total",
       "Sealed blocks shared with a byte-identical block.",
       "counter",
       {{"", v(is.dedup_hits)}}},
      {"tessera_dedup_collisions_total",
       "Content-key matches whose bytes differed (security events; never shared).",
       "counter",
       {{"", v(is.dedup_collisions)}}},
      {"tessera_dedup_identity_mismatches_total",
       "Byte-identical blocks not shared because their tokens differed.",
       "counter",
       {{"", v(is.dedup_identity_mismatches)}}},
      {"tessera_dedup_bytes_compared_total",
       "Bytes compared to verify content-key matches.",
       "counter",
       {{"", v(is.bytes_compared)}}},
      {"tessera_cow_copies_total",
       "Shared unsealed blocks copied before a write.",
       "counter",
       {{"", v(metrics_.cow_copies)}}},
      {"tessera_forks_total", "Requests forked.", "counter", {{"", v(metrics_.forks)}}},
      {"tessera_requests_admitted_total", "Requests admitted.", "counter", {{"", v(metrics_.requests_admitted)}}},
      {"tessera_out_of_blocks_total",
       "Allocations refused for lack of blocks.",
       "counter",
       {{"", v(metrics_.out_of_blocks)}}},
      {"tessera_window_states_restored_total",
       "Resumptions that restored kept window state (snapshot, retain).",
       "counter",
       {{"", v(metrics_.states_restored)}}},
      {"tessera_window_recompute_tokens_total",
       "Tokens named for recomputation to rebuild window state on a prefix hit.",
       "counter",
       {{"", v(metrics_.recompute_tokens)}}},
      {"tessera_seals_pending",
       "Seals a step queued and not yet performed (deferred seals; not yet in the seal and block counts).",
       "gauge",
       {{"", v(metrics_.seals_pending)}}},
      {"tessera_kv_events_dropped_total",
       "KV-cache events not recorded: the buffer was full (a consumer must resynchronise).",
       "counter",
       {{"", v(metrics_.kv_events_dropped)}}},
  };
  MetricFamily blocks{"tessera_blocks", "Blocks per state.", "gauge", {}};
  MetricFamily bytes{"tessera_block_bytes", "Bytes (pages and metadata) per block state.", "gauge", {}};
  const uint64_t per_block = pool_->block_bytes() + pool_->metadata_bytes_per_block();
  for (BlockState s : {BlockState::kFree, BlockState::kFilling, BlockState::kSealed, BlockState::kCached}) {
    const uint64_t n = v(ps.blocks_in_state[static_cast<size_t>(s)]);
    const std::string label = "state=\"" + std::string(BlockStateName(s)) + "\"";
    blocks.samples.emplace_back(label, n);
    bytes.samples.emplace_back(label, n * per_block);
  }
  f.push_back(std::move(blocks));
  f.push_back(std::move(bytes));
  f.push_back({"tessera_state_bytes",
               "Bytes of the per-request state: arena slabs in use and window state kept at block boundaries.",
               "gauge",
               {{"", v(metrics_.state_bytes)}}});
  return f;
}

}  // namespace tessera
