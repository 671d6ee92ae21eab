#include "tessera/block_index.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <openssl/evp.h>

#include "tessera/counter.h"

namespace tessera {

Hash128 CacheIdentityKey(std::string_view config_sha256, std::string_view weights_revision, const BlockPool& pool,
                         std::string_view variant) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  // Every field length-prefixed, so that no two different inputs give the same byte stream.
  auto add = [ctx](const void* p, uint64_t n) {
    EVP_DigestUpdate(ctx, &n, sizeof n);
    EVP_DigestUpdate(ctx, p, n);
  };
  auto add_str = [&](std::string_view s) { add(s.data(), s.size()); };
  auto add_u64 = [&](uint64_t v) { add(&v, sizeof v); };
  add_str("tessera cache identity v1");
  add_str(config_sha256);
  add_str(weights_revision);
  add_str(variant);
  add_u64(pool.block_tokens());
  for (const PoolGroup& g : pool.groups()) {
    add_str(g.name);
    add_str(g.format.name);
    add_u64(g.layers);
    add_u64(g.page.page_bytes);
    add_u64(g.page.record_bytes);
    add_u64(g.page.entries_per_block);
    // Packed pages place slices differently (ADR 0020); unpacked identities stay as they were.
    if (g.page.packed()) add_u64(g.page.layers_per_page);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  Hash128 out;
  std::memcpy(&out.lo, md, sizeof out.lo);
  std::memcpy(&out.hi, md + sizeof out.lo, sizeof out.hi);
  return out;
}

const uint64_t BlockIndex::kIdentityBytes = sizeof(BlockIndex::Identity);

BlockIndex::BlockIndex(BlockPool* pool, ContentHasher hasher, bool content_dedup, uint32_t bucket_limit,
                       Hash128 root_key)
    : pool_(pool),
      hasher_(hasher),
      root_key_(root_key),
      content_dedup_(content_dedup && pool->backed()),
      bucket_limit_(bucket_limit),
      block_tokens_(pool->block_tokens()),
      identity_(pool->capacity()),
      tokens_(static_cast<size_t>(pool->capacity()) * pool->block_tokens()),
      prefix_(pool->capacity()) {
  pool_->AddEvictionListener([this](BlockId b) { OnEvict(b); });
  // Sized once for the pool: a map that grows rehashes every key in one call, a multi-millisecond
  // stall of whichever scheduler step crosses the threshold (the prefix map is sized at birth).
  if (content_dedup_) content_.reserve(pool_->capacity());
}

std::span<const uint32_t> BlockIndex::Tokens(BlockId b) const {
  return {tokens_.data() + static_cast<size_t>(b.value) * block_tokens_, block_tokens_};
}

bool BlockIndex::SameIdentity(BlockId e, const PrefixRef& parent, std::span<const uint32_t> tokens, uint32_t domain,
                              uint64_t salt) const {
  const Identity& id = identity_[e.value];
  // A caller-keyed block is never a token-keyed look-up's (its tokens were never verified).
  if (!id.indexed || id.caller_keyed || id.domain != domain || id.salt != salt) return false;
  if (id.parent != parent.block || (parent.block.valid() && id.parent_generation != parent.generation)) return false;
  std::span<const uint32_t> stored = Tokens(e);
  return tokens.size() == stored.size() && std::equal(tokens.begin(), tokens.end(), stored.begin());
}

bool BlockIndex::SameKeyedIdentity(BlockId e, const PrefixRef& parent, const CallerHash& caller, uint32_t domain,
                                   uint64_t salt) const {
  const Identity& id = identity_[e.value];
  if (!id.indexed || !id.caller_keyed || id.domain != domain || id.salt != salt) return false;
  if (id.parent != parent.block || (parent.block.valid() && id.parent_generation != parent.generation)) return false;
  // The whole caller hash, not Tessera's key of it: a key collision is never a hit.
  return std::memcmp(caller_hash_[e.value].data(), caller.data(), caller.size()) == 0;
}

void BlockIndex::EnableCallerKeys() {
  assert(!content_dedup_ && "caller-keyed blocks are verified by their caller hash, the content index by tokens");
  if (caller_hash_.empty()) caller_hash_.resize(pool_->capacity());
}

std::optional<PrefixRef> BlockIndex::LookupKeyed(const PrefixRef& parent, const Hash128& key, const CallerHash& caller,
                                                 uint32_t domain, uint64_t salt) {
  assert(caller_keys());
  return FindVerified(key, [&](BlockId e) { return SameKeyedIdentity(e, parent, caller, domain, salt); });
}

BlockIndex::SealResult BlockIndex::SealKeyed(BlockId candidate, const PrefixRef& parent, const Hash128& key,
                                             const CallerHash& caller, std::span<const uint32_t> tokens,
                                             uint32_t domain, uint64_t salt) {
  assert(caller_keys() && !content_dedup_);
  assert(pool_->state(candidate) == BlockState::kFilling && tokens.size() == block_tokens_);
  assert(key == hasher_.CallerKey(KeyOf(parent), caller, Extra(domain, salt)) && "a caller key for another hash");
  pool_->MarkSealed(candidate);
  Identity& id = identity_[candidate.value];
  id = Identity{key, {}, KeyOf(parent), parent.block, parent.generation, domain, salt, true, false, true};
  caller_hash_[candidate.value] = caller;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<ptrdiff_t>(candidate.value) * block_tokens_);
  // As Seal: the first live block under a key keeps it; an entry that is not this identity gives way.
  const PrefixRef sealed{candidate, pool_->generation(candidate), key};
  auto [entry, inserted] = prefix_.TryEmplace(key, candidate, PrefixKeyOf());
  if (!inserted) {
    const BlockId e = *entry;
    const BlockState st = pool_->state(e);
    const bool live = st == BlockState::kSealed || st == BlockState::kCached;
    if (live && SameKeyedIdentity(e, parent, caller, domain, salt)) {
      return {sealed, false, {e, pool_->generation(e), key}};
    }
    *entry = candidate;
  }
  return {sealed, false, sealed};
}

std::optional<PrefixRef> BlockIndex::Lookup(const PrefixRef& parent, std::span<const uint32_t> tokens, uint32_t domain,
                                            uint64_t salt) {
  return Lookup(parent, PrefixKey(KeyOf(parent), tokens, domain, salt), tokens, domain, salt);
}

std::optional<PrefixRef> BlockIndex::Lookup(const PrefixRef& parent, const Hash128& key,
                                            std::span<const uint32_t> tokens, uint32_t domain, uint64_t salt) {
  return FindVerified(key, [&](BlockId e) { return SameIdentity(e, parent, tokens, domain, salt); });
}

// The live block holding `key` whose identity `same` verifies, counted as a hit; a key held by a
// block that is not live or not this identity is a mismatch (a hash collision), never a hit.
template <typename Same>
std::optional<PrefixRef> BlockIndex::FindVerified(const Hash128& key, Same same) {
  const BlockId* found = prefix_.Find(key, PrefixKeyOf());
  if (found == nullptr) {
    Bump(stats_.prefix_misses, 1);
    return std::nullopt;
  }
  const BlockId e = *found;
  const BlockState s = pool_->state(e);
  if ((s != BlockState::kSealed && s != BlockState::kCached) || !same(e)) {
    Bump(stats_.prefix_key_mismatches, 1);
    Bump(stats_.prefix_misses, 1);
    return std::nullopt;
  }
  Bump(stats_.prefix_hits, 1);
  return PrefixRef{e, pool_->generation(e), key};
}

std::optional<PrefixRef> BlockIndex::Holder(const Hash128& key) {
  const BlockId* found = prefix_.Find(key, PrefixKeyOf());
  if (found == nullptr) return std::nullopt;
  const BlockState s = pool_->state(*found);
  if (s != BlockState::kSealed && s != BlockState::kCached) return std::nullopt;
  return PrefixRef{*found, pool_->generation(*found), key};
}

std::vector<PrefixRef> BlockIndex::LongestPrefix(std::span<const uint32_t> prompt, uint32_t domain, uint64_t salt) {
  std::vector<PrefixRef> chain;
  PrefixRef parent;
  for (size_t i = 0; i + block_tokens_ <= prompt.size(); i += block_tokens_) {
    std::optional<PrefixRef> hit = Lookup(parent, prompt.subspan(i, block_tokens_), domain, salt);
    if (!hit) break;
    chain.push_back(*hit);
    parent = *hit;
  }
  return chain;
}

std::vector<PrefixRef> BlockIndex::LongestPrefix(std::span<const uint32_t> prompt, std::span<const Hash128> keys,
                                                 uint32_t domain, uint64_t salt) {
  std::vector<PrefixRef> chain;
  PrefixRef parent;
  for (size_t b = 0; b < keys.size() && (b + 1) * block_tokens_ <= prompt.size(); ++b) {
    std::optional<PrefixRef> hit =
        Lookup(parent, keys[b], prompt.subspan(b * block_tokens_, block_tokens_), domain, salt);
    if (!hit) break;
    chain.push_back(*hit);
    parent = *hit;
  }
  return chain;
}

Hash128 BlockIndex::ContentKey(BlockId b, uint32_t domain) const {
  ContentHasher::Stream s = hasher_.Begin();
  s.Update(&domain, sizeof domain);
  for (uint32_t g = 0; g < pool_->groups().size(); ++g) {
    const std::string& name = pool_->groups()[g].format.name;
    s.Update(name.data(), name.size() + 1);
    s.Update(pool_->Bytes(pool_->BlockHandleOf(b, g)));
  }
  return s.Digest();
}

bool BlockIndex::BytesEqual(BlockId a, BlockId b) {
  for (uint32_t g = 0; g < pool_->groups().size(); ++g) {
    std::span<const std::byte> x = pool_->Bytes(pool_->BlockHandleOf(a, g));
    std::span<const std::byte> y = pool_->Bytes(pool_->BlockHandleOf(b, g));
    Bump(stats_.bytes_compared, x.size());
    if (std::memcmp(x.data(), y.data(), x.size()) != 0) return false;
  }
  return true;
}

BlockIndex::SealResult BlockIndex::Seal(BlockId candidate, const PrefixRef& parent, std::span<const uint32_t> tokens,
                                        uint32_t domain, uint64_t salt) {
  return Seal(candidate, parent, PrefixKey(KeyOf(parent), tokens, domain, salt), tokens, domain, salt);
}

BlockIndex::SealResult BlockIndex::Seal(BlockId candidate, const PrefixRef& parent, const Hash128& key,
                                        std::span<const uint32_t> tokens, uint32_t domain, uint64_t salt) {
  assert(pool_->state(candidate) == BlockState::kFilling && tokens.size() == block_tokens_);
  assert(key == hasher_.PrefixKey(KeyOf(parent), tokens, Extra(domain, salt)) && "a prefix key for other tokens");
  Hash128 content{};
  if (content_dedup_) {
    content = ContentKey(candidate, domain);
    auto it = content_.find(content);
    if (it != content_.end()) {
      bool collided = false;
      for (BlockId e : it->second) {
        if (identity_[e.value].domain != domain) {
          collided = true;  // the key includes the domain: equal keys across domains are a collision
          continue;
        }
        if (!BytesEqual(e, candidate)) {
          collided = true;
          continue;
        }
        if (!SameIdentity(e, parent, tokens, domain, salt)) {
          Bump(stats_.dedup_identity_mismatches, 1);
          continue;
        }
        pool_->Ref(e);
        pool_->Unref(candidate);  // filling, refcount 1 -> free
        Bump(stats_.dedup_hits, 1);
        const PrefixRef shared{e, pool_->generation(e), identity_[e.value].prefix_key};
        return {shared, true, shared};
      }
      if (collided) {
        Bump(stats_.dedup_collisions, 1);
        if (security_) security_({"dedup_collision", content, it->second.front(), candidate, domain});
      }
    }
  }
  pool_->MarkSealed(candidate);
  Identity& id = identity_[candidate.value];
  id = Identity{key, content, KeyOf(parent), parent.block, parent.generation, domain, salt, true, false};
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<ptrdiff_t>(candidate.value) * block_tokens_);
  if (content_dedup_) {
    std::vector<BlockId>& bucket = content_[content];
    if (bucket.size() < bucket_limit_) {
      bucket.push_back(candidate);
      id.in_content = true;
    }
  }
  // The first live block under a key keeps it. An entry whose block no longer carries this
  // identity (a child orphaned when its parent was evicted, or a key collision) gives way.
  const PrefixRef sealed{candidate, pool_->generation(candidate), key};
  auto [entry, inserted] = prefix_.TryEmplace(key, candidate, PrefixKeyOf());
  if (!inserted) {
    const BlockId e = *entry;
    const BlockState st = pool_->state(e);
    const bool live = st == BlockState::kSealed || st == BlockState::kCached;
    if (live && SameIdentity(e, parent, tokens, domain, salt)) return {sealed, false, {e, pool_->generation(e), key}};
    *entry = candidate;
  }
  return {sealed, false, sealed};
}

SealedIdentity BlockIndex::IdentityOf(BlockId b) const {
  const Identity& id = identity_[b.value];
  return {id.prefix_key, id.parent_key, id.domain, id.salt, Tokens(b), {}, root_key_};
}

void BlockIndex::OnEvict(BlockId b) {
  Identity& id = identity_[b.value];
  if (!id.indexed) return;
  if (evict_hook_) evict_hook_(b, IdentityOf(b));
  prefix_.Erase(id.prefix_key, b);
  if (id.in_content) {
    auto c = content_.find(id.content_key);
    if (c != content_.end()) {
      std::erase(c->second, b);
      if (c->second.empty()) content_.erase(c);
    }
  }
  id = Identity{};
}

}  // namespace tessera
