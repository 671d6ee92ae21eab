// The two indexes of a block store, kept apart.
//
// Prefix (token-chain) index — compute reuse. A sealed block is keyed by
// H(parent key, its tokens, extra keys: tenant domain and cache salt). On lookup the stored
// tokens, the parent block (id and generation), the domain and the salt are compared, so a
// hash collision can never serve the wrong KV: a hit means this exact token prefix produced
// these bytes. This is what lets an engine skip prefill.
//
// Content index — memory dedup. On seal the block's bytes across all layers of all its groups
// are hashed together with the formats and the tenant domain (keyed xxh3-128, or SHA-256). On a
// hit the bytes are compared: equal (and the same token identity) → the existing block is shared
// and the candidate released; different → a dedup collision, counted and reported as a security
// event, and the candidate is installed as a fresh block. A collision is never a share.
//
// Why two: an MLA latent past layer 0 depends on every preceding token and its RoPE slice is
// rotated by position, so equal bytes only arise from the same prefix (concurrent requests,
// forks, tier imports); byte dedup cannot replace prefix matching (docs/adr/0007).
//
// Caller keys (ADR 0045), opt-in per index (EnableCallerKeys): a block may instead be keyed by its
// caller's own hash of it (an engine's chained block hash, e.g. vLLM's request.block_hashes[i]:
// SHA-256 over the parent's hash, the block's tokens and every extra key), as
// CallerKey(parent key, caller hash, domain, salt) — a function of its own, never a token key —
// and a hit is verified by the whole 32-byte caller hash kept with the block, the parent block
// (id and generation), the domain and the salt. A caller-keyed block never matches a token-keyed
// look-up and a token-keyed block never a caller-keyed one (a flag in the identity).
//
// Sharing never crosses tenant domains: both keys include the domain and both checks compare it.
// A domain is shared between tenants only when the store is told so (manager options).
//
// Thread-safety: single owner, like the pool it indexes; counters are atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/counter.h"
#include "tessera/hash.h"
#include "tessera/prefix_map.h"

namespace tessera {

// A caller's own hash of a block (CallerKey): 32 bytes, e.g. vLLM's SHA-256 block hash.
using CallerHash = std::array<std::byte, 32>;

// One life of a sealed block in the prefix chain; the root has no block.
struct PrefixRef {
  BlockId block;
  uint32_t generation = 0;
  Hash128 key;
  bool is_root() const { return !block.valid(); }
};

// What the index knows of a sealed block: enough to store it in a tier and to verify it when it
// comes back (recompute key = H(parent_key, tokens, domain, salt)).
struct SealedIdentity {
  Hash128 key;
  Hash128 parent_key;  // the index's root key (its cache identity) for the first block of a prompt
  uint32_t domain = 0;
  uint64_t salt = 0;
  std::span<const uint32_t> tokens;
  // State that travels with the block beyond the pool (a hybrid model's window and compressor
  // rows at this boundary); empty when none. Filled by the owner, not by the index.
  std::span<const std::byte> state;
  // What the block is valid for (model config, weights revision, layout): the index's root key.
  Hash128 cache_identity;
};

// The identity a cache's blocks are valid for: SHA-256 over the model's config.json digest, the
// weights revision (empty when unknown), the pool's layout (block tokens; each group's name,
// format, layers and page geometry) and a variant (e.g. a window strategy). Two models with the
// same geometry but other weights (DeepSeek-V3 and R1), or two formats of one model, get
// different identities, and so different prefix keys: they never see each other's blocks.
Hash128 CacheIdentityKey(std::string_view config_sha256, std::string_view weights_revision, const BlockPool& pool,
                         std::string_view variant = {});

struct SecurityEvent {
  std::string kind;  // "dedup_collision"
  Hash128 content_key;
  BlockId existing;
  BlockId candidate;
  uint32_t domain = 0;
};

struct IndexStats {
  std::atomic<uint64_t> prefix_hits{0};            // blocks
  std::atomic<uint64_t> prefix_misses{0};          // lookups that ended a prefix walk
  std::atomic<uint64_t> prefix_key_mismatches{0};  // key matched, identity did not (hash collision)
  std::atomic<uint64_t> dedup_hits{0};
  std::atomic<uint64_t> dedup_collisions{0};           // content key matched, bytes differed
  std::atomic<uint64_t> dedup_identity_mismatches{0};  // bytes equal, token identity differed: not shared
  std::atomic<uint64_t> bytes_compared{0};
  std::atomic<uint64_t> prefix_keys_hashed{0};  // prefix keys computed (PrefixKey, and Seal/Lookup without one)
};

class BlockIndex {
 public:
  // `content_dedup` false turns the content index off (e.g. for an unbacked pool). `root_key` is
  // the parent key of every prompt's first block: the cache identity (CacheIdentityKey).
  BlockIndex(BlockPool* pool, ContentHasher hasher, bool content_dedup, uint32_t bucket_limit = 8,
             Hash128 root_key = {});

  // The child of `parent` that holds exactly `tokens` in `domain` with `salt`, verified.
  std::optional<PrefixRef> Lookup(const PrefixRef& parent, std::span<const uint32_t> tokens, uint32_t domain,
                                  uint64_t salt);

  // The live block that holds `key` in the index (the first sealed under it), or nullopt. A
  // block sealed under a key another live block already holds is cached but not found: its
  // children chain under the holder (Seal's caller takes this as the parent of its next block).
  std::optional<PrefixRef> Holder(const Hash128& key);

  // As Lookup, with the child's prefix key already computed (PrefixKey of parent and tokens).
  std::optional<PrefixRef> Lookup(const PrefixRef& parent, const Hash128& key, std::span<const uint32_t> tokens,
                                  uint32_t domain, uint64_t salt);

  // The longest verified prefix of `prompt` in whole blocks, as a chain of references (no
  // reference counts are taken: the caller refs the blocks it keeps).
  std::vector<PrefixRef> LongestPrefix(std::span<const uint32_t> prompt, uint32_t domain, uint64_t salt);
  // As LongestPrefix, with the prefix keys of the prompt's blocks computed already (a scheduler
  // keeps them across admission retries); at most keys.size() blocks.
  std::vector<PrefixRef> LongestPrefix(std::span<const uint32_t> prompt, std::span<const Hash128> keys, uint32_t domain,
                                       uint64_t salt);

  struct SealResult {
    PrefixRef ref;              // the block the caller now holds in its table
    bool deduplicated = false;  // the candidate was released in favour of an equal block
    // The live block that holds ref.key in the index after the seal (what Holder(ref.key) would
    // return): ref itself, or an equal block sealed first that the caller's next block chains under.
    PrefixRef holder;
  };
  // Seals `candidate` (kFilling, refcount 1, full) as the child of `parent`. May return an
  // existing equal block instead (its refcount raised, the candidate unref'ed).
  SealResult Seal(BlockId candidate, const PrefixRef& parent, std::span<const uint32_t> tokens, uint32_t domain,
                  uint64_t salt);
  // As Seal, with the block's prefix key already computed (a prompt's keys, from HashPrompt):
  // the key is not hashed again. REQUIRES: key == PrefixKey(parent's key, tokens, domain, salt).
  SealResult Seal(BlockId candidate, const PrefixRef& parent, const Hash128& key, std::span<const uint32_t> tokens,
                  uint32_t domain, uint64_t salt);

  // ---- Caller keys (ADR 0045) ----
  // Allocates the caller hashes' side array (32 B per block) and allows the calls below. Once,
  // before any seal; REQUIRES: no content dedup (the content index verifies by tokens).
  void EnableCallerKeys();
  bool caller_keys() const { return !caller_hash_.empty(); }
  // The key of the block the caller hashed as `caller` after the block keyed `parent_key`.
  Hash128 CallerKey(const Hash128& parent_key, const CallerHash& caller, uint32_t domain, uint64_t salt) const {
    Bump(stats_.prefix_keys_hashed, 1);
    return hasher_.CallerKey(parent_key, caller, Extra(domain, salt));
  }
  // The caller-keyed child of `parent` under `key` (CallerKey of parent's key and `caller`),
  // verified: a caller-keyed block whose stored caller hash, parent, domain and salt are these.
  // REQUIRES: caller_keys().
  std::optional<PrefixRef> LookupKeyed(const PrefixRef& parent, const Hash128& key, const CallerHash& caller,
                                       uint32_t domain, uint64_t salt);
  // Seals `candidate` (kFilling, refcount 1, full, holding `tokens`) as the caller-keyed child of
  // `parent`, keeping `caller` with it. No content dedup: the result's ref is the candidate.
  // REQUIRES: caller_keys(), key == CallerKey(parent's key, caller, domain, salt).
  SealResult SealKeyed(BlockId candidate, const PrefixRef& parent, const Hash128& key, const CallerHash& caller,
                       std::span<const uint32_t> tokens, uint32_t domain, uint64_t salt);
  // Whether b was sealed under a caller key. REQUIRES: Indexed(b).
  bool CallerKeyed(BlockId b) const { return identity_[b.value].caller_keyed; }

  // The parent key of a prompt's first block.
  const Hash128& root_key() const { return root_key_; }
  // The prefix key of the block holding `tokens` after the block keyed `parent_key`
  // (root_key() for a prompt's first block).
  Hash128 PrefixKey(const Hash128& parent_key, std::span<const uint32_t> tokens, uint32_t domain, uint64_t salt) const {
    Bump(stats_.prefix_keys_hashed, 1);
    return hasher_.PrefixKey(parent_key, tokens, Extra(domain, salt));
  }
  // The same key for tokens given as head then tail (ContentHasher::PrefixKey's two-part form).
  Hash128 PrefixKey(const Hash128& parent_key, std::span<const uint32_t> head, std::span<const uint32_t> tail,
                    uint32_t domain, uint64_t salt) const {
    Bump(stats_.prefix_keys_hashed, 1);
    return hasher_.PrefixKey(parent_key, head, tail, Extra(domain, salt));
  }
  // Hints for a scheduler that knows ahead which blocks it seals (no effect on what is stored):
  // fetch the index lines a Seal of `candidate` writes (its identity and token ids), and the
  // prefix-table slot a key probes first.
  void PrefetchSeal(BlockId candidate) const {
    const char* id = reinterpret_cast<const char*>(&identity_[candidate.value]);
    __builtin_prefetch(id, 1);
    __builtin_prefetch(id + sizeof(Identity) - 1, 1);
    const char* t = reinterpret_cast<const char*>(tokens_.data() + size_t{candidate.value} * block_tokens_);
    for (size_t off = 0; off < size_t{block_tokens_} * sizeof(uint32_t); off += 64) __builtin_prefetch(t + off, 1);
  }
  void PrefetchKey(const Hash128& key) const { prefix_.Prefetch(key); }
  // REQUIRES: Indexed(b).
  SealedIdentity IdentityOf(BlockId b) const;
  // Whether b is a sealed (or cached) block that Seal indexed and no eviction has dropped.
  bool Indexed(BlockId b) const { return identity_[b.value].indexed; }
  // Called with each indexed block about to be evicted, before its identity is dropped (the
  // tier layer demotes it there; its bytes are still readable).
  void SetEvictionHook(std::function<void(BlockId, const SealedIdentity&)> hook) { evict_hook_ = std::move(hook); }

  // The tokens a sealed block holds (for tests and tiers).
  std::span<const uint32_t> Tokens(BlockId b) const;
  uint32_t Domain(BlockId b) const { return identity_[b.value].domain; }

  void SetSecurityListener(std::function<void(const SecurityEvent&)> listener) { security_ = std::move(listener); }
  const IndexStats& stats() const { return stats_; }
  // Whether Seal may hand back an equal block in place of the candidate (content dedup).
  bool dedups() const { return content_dedup_; }
  size_t prefix_entries() const { return prefix_.size(); }

 private:
  const Hash128& KeyOf(const PrefixRef& parent) const { return parent.is_root() ? root_key_ : parent.key; }
  // The full prefix key a block in the prefix map carries (the map keeps fingerprints).
  auto PrefixKeyOf() const {
    return [this](BlockId b) -> const Hash128& { return identity_[b.value].prefix_key; };
  }
  struct Identity;

 public:
  // Host bytes the index keeps per block besides its token ids.
  static const uint64_t kIdentityBytes;

 private:
  struct Identity {
    Hash128 prefix_key;
    Hash128 content_key;
    Hash128 parent_key;
    BlockId parent;
    uint32_t parent_generation = 0;
    uint32_t domain = 0;
    uint64_t salt = 0;
    bool indexed = false;
    bool in_content = false;
    bool caller_keyed = false;  // sealed by SealKeyed: its caller hash is caller_hash_[block]
  };
  Hash128 ContentKey(BlockId b, uint32_t domain) const;
  bool BytesEqual(BlockId a, BlockId b);
  bool SameIdentity(BlockId e, const PrefixRef& parent, std::span<const uint32_t> tokens, uint32_t domain,
                    uint64_t salt) const;
  bool SameKeyedIdentity(BlockId e, const PrefixRef& parent, const CallerHash& caller, uint32_t domain,
                         uint64_t salt) const;
  template <typename Same>
  std::optional<PrefixRef> FindVerified(const Hash128& key, Same same);
  void OnEvict(BlockId b);
  static uint64_t Extra(uint32_t domain, uint64_t salt) { return (uint64_t{domain} << 32) ^ salt; }

  BlockPool* pool_;
  ContentHasher hasher_;
  Hash128 root_key_;
  bool content_dedup_;
  uint32_t bucket_limit_;
  uint32_t block_tokens_;
  std::vector<Identity> identity_;
  std::vector<uint32_t> tokens_;         // capacity x block_tokens
  std::vector<CallerHash> caller_hash_;  // capacity, only once EnableCallerKeys (else empty)
  PrefixMap prefix_;                     // at most one entry per indexed block
  std::unordered_map<Hash128, std::vector<BlockId>, Hash128Hasher> content_;
  std::function<void(const SecurityEvent&)> security_;
  std::function<void(BlockId, const SealedIdentity&)> evict_hook_;
  mutable IndexStats stats_;  // PrefixKey (const) counts the keys it hashes
};

}  // namespace tessera
