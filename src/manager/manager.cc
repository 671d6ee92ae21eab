#include "tessera/manager.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "base/slots.h"
#include "tessera/checked.h"

namespace tessera {

LedgerOptions LedgerOptionsFor(const ManagerOptions& options, uint64_t context, uint64_t batch) {
  LedgerOptions o;
  o.context_tokens = context;
  o.batch = batch;
  o.kv_format = options.kv_format;
  o.indexer_format = options.indexer_format;
  o.block_tokens = options.block_tokens;
  o.kernel = options.kernel;
  o.engine = Engine::kTessera;
  return o;
}

Result<std::unique_ptr<BlockManager>> BlockManager::Create(const Geometry& g, const ManagerOptions& options) {
  // The pools take their groups and page layouts from the ledger's own computation.
  TESSERA_ASSIGN_OR_RETURN(Ledger ledger, ComputeLedger(g, LedgerOptionsFor(options, 1, 1)));
  BlockPoolOptions pool_options;
  pool_options.capacity_blocks = options.capacity_blocks;
  pool_options.region_kind = options.region_kind;
  for (const CacheLine& line : ledger.lines) {
    if (!line.in_pages) continue;
    if (line.compress_ratio != 1) {
      return InvalidArgument("model", g.name + " has compressed caches (" + line.name +
                                          "); they are managed by the hybrid-attention layer");
    }
    pool_options.groups.push_back({line.name, line.format, line.layers, line.page});
  }
  if (pool_options.groups.empty()) {
    return InvalidArgument("model", g.name + " has no paged cache under the tessera engine");
  }
  TESSERA_ASSIGN_OR_RETURN(ContentHasher hasher,
                           options.hash_key.empty()
                               ? ContentHasher::Create(options.hash, options.hash_bits, options.hash_key_seed)
                               : ContentHasher::CreateWithKey(options.hash, options.hash_bits, options.hash_key));
  std::unique_ptr<BlockManager> m(new BlockManager());
  m->options_ = options;
  TESSERA_ASSIGN_OR_RETURN(m->pool_, BlockPool::Create(std::move(pool_options)));
  m->index_ = std::make_unique<BlockIndex>(
      m->pool_.get(), std::move(hasher), options.content_dedup, /*bucket_limit=*/8,
      CacheIdentityKey(g.config_sha256, options.weights_revision, *m->pool_));
  m->block_tokens_ = m->pool_->block_tokens();
  BlockManager* self = m.get();
  m->index_->SetEvictionHook([self](BlockId b, const SealedIdentity& id) {
    if (self->source_ != nullptr) self->source_->OnEvicted(*self->pool_, b, id);
  });
  return m;
}

uint32_t BlockManager::domain_of(uint32_t tenant) const {
  auto it = options_.tenant_domain.find(tenant);
  return it == options_.tenant_domain.end() ? tenant : it->second;
}

BlockManager::Request* BlockManager::Get(RequestId r) {
  if (r.value >= requests_.size() || !requests_[r.value].live) return nullptr;
  return &requests_[r.value];
}

Status BlockManager::NoRequest(RequestId r) {
  return InvalidArgument("request", "no live request " + std::to_string(r.value));
}

const BlockManager::Request* BlockManager::GetConst(RequestId r) const {
  if (r.value >= requests_.size() || !requests_[r.value].live) return nullptr;
  return &requests_[r.value];
}

uint32_t BlockManager::NewRequestSlot() { return detail::TakeSlot(free_request_ids_, requests_); }

Result<AdmitResult> BlockManager::Admit(std::span<const uint32_t> prompt, const RequestSpec& spec) {
  const uint32_t id = NewRequestSlot();
  Request& req = requests_[id];
  req = Request{};
  req.live = true;
  req.tenant = spec.tenant;
  req.domain = domain_of(spec.tenant);
  req.salt = spec.cache_salt;
  req.priority = std::min(spec.priority, kMaxRetentionPriority);
  ++live_;
  metrics_.requests_admitted.fetch_add(1, std::memory_order_relaxed);

  const size_t full_blocks = prompt.size() / block_tokens_;
  req.chain = index_->LongestPrefix(prompt, req.domain, req.salt);
  for (const PrefixRef& hit : req.chain) {
    pool_->Ref(hit.block);
    req.table.push_back(hit.block);
  }
  const uint32_t promoted =
      req.chain.size() < full_blocks && source_ != nullptr && pool_->backed()
          ? PromoteFromSource(*pool_, *index_, *source_, prompt, req.domain, req.salt, req.priority, req.chain, req.table)
          : 0;
  AdmitResult result;
  result.id = RequestId{id};
  result.cached_blocks = static_cast<uint32_t>(req.table.size());
  result.cached_tokens = uint64_t{result.cached_blocks} * block_tokens_;
  req.tokens = result.cached_tokens;
  metrics_.prefix_hit_tokens.fetch_add(result.cached_tokens, std::memory_order_relaxed);
  metrics_.prefix_hit_blocks.fetch_add(result.cached_blocks, std::memory_order_relaxed);
  metrics_.prefix_miss_blocks.fetch_add(full_blocks - result.cached_blocks, std::memory_order_relaxed);
  metrics_.prefix_miss_tokens.fetch_add(prompt.size() - result.cached_tokens, std::memory_order_relaxed);
  metrics_.tier_hit_blocks.fetch_add(promoted, std::memory_order_relaxed);
  metrics_.tier_hit_tokens.fetch_add(uint64_t{promoted} * block_tokens_, std::memory_order_relaxed);
  return result;
}

Result<uint64_t> BlockManager::Checkpoint() {
  if (source_ == nullptr) return uint64_t{0};
  return CheckpointBlocks(*pool_, *index_, *source_);
}

uint32_t BlockManager::SharedSlots(const Request& req, uint64_t n) const {
  if (n == 0) return 0;
  size_t first = req.tokens / block_tokens_;
  size_t last = std::min<size_t>(req.table.size(), CeilDiv(req.tokens + n, block_tokens_));
  uint32_t shared = 0;
  for (size_t slot = first; slot < last; ++slot) {
    BlockId b = req.table[slot];
    if (pool_->state(b) == BlockState::kFilling && pool_->refcount(b) > 1) ++shared;
  }
  return shared;
}

Status BlockManager::UnshareSlots(Request& req, uint64_t n) {
  size_t first = req.tokens / block_tokens_;
  size_t last = std::min<size_t>(req.table.size(), CeilDiv(req.tokens + n, block_tokens_));
  for (size_t slot = first; slot < last; ++slot) {
    BlockId b = req.table[slot];
    if (pool_->state(b) == BlockState::kFilling && pool_->refcount(b) > 1) {
      TESSERA_RETURN_IF_ERROR(CopyOnWrite(req, slot));
    }
  }
  return Status::Ok();
}

Status BlockManager::OutOfBlocks(uint64_t needed) {
  metrics_.out_of_blocks.fetch_add(1, std::memory_order_relaxed);
  return Status(StatusCode::kOutOfBlocks, "blocks",
                "need " + std::to_string(needed) + " blocks, " + std::to_string(pool_->Available()) +
                    " free or evictable of " + std::to_string(pool_->capacity()));
}

Status BlockManager::AllocateSlots(RequestId r, uint64_t n) {
  Request* req = Get(r);
  if (req == nullptr) return NoRequest(r);
  Checked needed_tokens = Checked(req->tokens) + n;
  if (needed_tokens.overflowed()) return OutOfRange("tokens", "token count overflows");
  uint64_t needed_blocks = CeilDiv(needed_tokens.value(), block_tokens_);
  uint64_t more = needed_blocks > req->table.size() ? needed_blocks - req->table.size() : 0;
  // Slots the request shares with a fork and has not sealed must be copied before they are
  // written: they count against the pool now, so that Append cannot run out later.
  uint64_t copies = SharedSlots(*req, n);
  if (more + copies == 0) return Status::Ok();
  if (more + copies > pool_->Available()) return OutOfBlocks(more + copies);
  TESSERA_RETURN_IF_ERROR(UnshareSlots(*req, n));
  return pool_->Allocate(static_cast<uint32_t>(more), &req->table);
}

Status BlockManager::CopyOnWrite(Request& req, size_t slot) {
  BlockId old = req.table[slot];
  std::vector<BlockId> fresh;
  if (pool_->Available() == 0) return OutOfBlocks(1);
  TESSERA_RETURN_IF_ERROR(pool_->Allocate(1, &fresh));
  if (pool_->backed()) {
    for (uint32_t g = 0; g < pool_->groups().size(); ++g) {
      std::span<std::byte> from = pool_->Bytes(pool_->BlockHandleOf(old, g));
      std::span<std::byte> to = pool_->Bytes(pool_->BlockHandleOf(fresh[0], g));
      std::memcpy(to.data(), from.data(), from.size());
    }
  }
  pool_->Unref(old);
  req.table[slot] = fresh[0];
  metrics_.cow_copies.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

Status BlockManager::Append(RequestId r, std::span<const uint32_t> tokens, const KvWriter& writer) {
  Request* req = Get(r);
  if (req == nullptr) return NoRequest(r);
  if (CeilDiv(req->tokens + tokens.size(), block_tokens_) > req->table.size()) {
    return Status(StatusCode::kFailedPrecondition, "tokens",
                  "no slots for " + std::to_string(tokens.size()) + " more tokens: call AllocateSlots first");
  }
  // A fork after AllocateSlots may have shared a slot again: copy before writing anything.
  if (uint32_t copies = SharedSlots(*req, tokens.size()); copies > 0) {
    if (copies > pool_->Available()) return OutOfBlocks(copies);
    TESSERA_RETURN_IF_ERROR(UnshareSlots(*req, tokens.size()));
  }
  const uint32_t groups = static_cast<uint32_t>(pool_->groups().size());
  for (uint32_t token : tokens) {
    const uint64_t pos = req->tokens;
    const size_t slot = pos / block_tokens_;
    const uint64_t in_block = pos % block_tokens_;
    BlockId b = req->table[slot];
    assert(pool_->state(b) == BlockState::kFilling && pool_->refcount(b) == 1 &&
           "writing into a shared or sealed block");
    if (pool_->backed() && writer) {
      for (uint32_t g = 0; g < groups; ++g) {
        for (uint32_t l = 0; l < pool_->groups()[g].layers; ++l) writer(g, l, pos, pool_->Record(b, g, l, in_block));
      }
    }
    req->token_ids.push_back(token);
    ++req->tokens;
    if (in_block + 1 == block_tokens_) {
      PrefixRef parent = req->chain.empty() ? PrefixRef{} : req->chain.back();
      BlockIndex::SealResult sealed = index_->Seal(b, parent, req->token_ids, req->domain, req->salt);
      BlockId kept = sealed.ref.block;
      // A block this request sealed takes its priority; a shared one keeps the highest.
      pool_->SetPriority(kept, sealed.deduplicated ? std::max(pool_->priority(kept), req->priority) : req->priority);
      req->table[slot] = kept;
      req->chain.push_back(sealed.ref);
      req->token_ids.clear();
      if (source_ != nullptr && !sealed.deduplicated && pool_->backed()) {
        source_->OnSealed(*pool_, kept, index_->IdentityOf(kept));
      }
    }
  }
  return Status::Ok();
}

Result<RequestId> BlockManager::Fork(RequestId parent) {
  Request* p = Get(parent);
  if (p == nullptr) return NoRequest(parent);
  Request copy = *p;  // before NewRequestSlot may move requests_
  const uint32_t id = NewRequestSlot();
  for (BlockId b : copy.table) pool_->Ref(b);
  requests_[id] = std::move(copy);
  ++live_;
  metrics_.forks.fetch_add(1, std::memory_order_relaxed);
  return RequestId{id};
}

Status BlockManager::Free(RequestId r) {
  Request* req = Get(r);
  if (req == nullptr) return NoRequest(r);
  // Release tail first so that a prefix's blocks are cached after (more recently than) its
  // extensions are — LRU then evicts the longest chains' leaves first.
  for (auto it = req->table.rbegin(); it != req->table.rend(); ++it) pool_->Unref(*it);
  *req = Request{};
  free_request_ids_.push_back(r.value);
  --live_;
  return Status::Ok();
}

std::span<const BlockId> BlockManager::BlockTable(RequestId r) const {
  const Request* req = GetConst(r);
  if (req == nullptr) return {};
  return req->table;
}

uint64_t BlockManager::Tokens(RequestId r) const {
  const Request* req = GetConst(r);
  return req == nullptr ? 0 : req->tokens;
}

Result<RecordView> BlockManager::Record(RequestId r, uint32_t group, uint32_t layer, uint64_t position) const {
  const Request* req = GetConst(r);
  if (req == nullptr) return InvalidArgument("request", "no live request " + std::to_string(r.value));
  if (position >= req->tokens) return InvalidArgument("position", "token " + std::to_string(position) + " not written");
  if (!pool_->backed()) return InvalidArgument("pool", "an unbacked pool has no bytes to read");
  if (group >= pool_->groups().size() || layer >= pool_->groups()[group].layers) {
    return InvalidArgument("layer", "no such group/layer");
  }
  return pool_->Record(req->table[position / block_tokens_], group, layer, position % block_tokens_);
}

std::vector<MetricFamily> BlockManager::CollectMetrics() const {
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
  };
  MetricFamily blocks{"tessera_blocks", "Blocks per state.", "gauge", {}};
  MetricFamily bytes{"tessera_block_bytes", "Bytes (pages and metadata) per block state.", "gauge", {}};
  const uint64_t per_block = pool_->block_bytes() + pool_->metadata_bytes_per_block();
  for (BlockState s : {BlockState::kFree, BlockState::kFilling, BlockState::kSealed, BlockState::kCached}) {
    uint64_t n = v(ps.blocks_in_state[static_cast<size_t>(s)]);
    std::string label = "state=\"" + std::string(BlockStateName(s)) + "\"";
    blocks.samples.emplace_back(label, n);
    bytes.samples.emplace_back(label, n * per_block);
  }
  f.push_back(std::move(blocks));
  f.push_back(std::move(bytes));
  return f;
}

}  // namespace tessera
