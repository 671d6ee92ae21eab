// RequestManager: the one request-level KV-cache manager, for every model Tessera knows.
//
// It holds a pool of pages for the paged caches (a block id per `block_tokens` span, with a page
// in every paged group), an index of sealed blocks (token-chain prefix keys for compute reuse,
// content keys for dedup), a request table, and — for models with sliding windows (DeepSeek-V4)
// — a state component for what does not page (window rings, compressor rows; RequestStates, with
// the window strategy). A model without windows simply has no state component.
//
// The life of a request, shaped for an engine's scheduler:
//   HashPrompt  the prompt's prefix keys, once (a scheduler keeps them across admission retries);
//   Admit       the longest cached prefix (pool, then the block source) — capped so that the
//               last prompt token is always computed — and the slots for the rest of the prompt,
//               in one call: all or nothing (kOutOfBlocks changes no request);
//   AllocateSlots / Append   room for more tokens, then the tokens (KV written by KvWriters into
//               the reserved slots; full blocks sealed: prefix key, content dedup, window state);
//   Step        AllocateSlots + Append for many requests in one call (a scheduler step);
//   Fork / Free copy-on-write children; release (blocks stay cached for later hits).
// Every refusal is a Status naming the field; nothing is half done.
//
// bytes_held() — pages plus block metadata plus the state arena's slabs and kept window state —
// equals the ledger's committed bytes (engine tessera) for the same state, at every phase and
// under every window strategy (tests).
//
// Thread-safety: single owner; metrics are atomics and may be read from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/block_index.h"
#include "tessera/block_pool.h"
#include "tessera/block_source.h"
#include "tessera/geometry.h"
#include "tessera/hash.h"
#include "tessera/kv_events.h"
#include "tessera/kv_writers.h"
#include "tessera/layout.h"
#include "tessera/metrics.h"
#include "tessera/request_state.h"
#include "tessera/status.h"

namespace tessera {

// A request of one manager: an index into its request table and the generation of that slot
// when the request was created. A slot's generation grows each time a request there is freed,
// so an id kept past its Free (a stale id) names no request, even once the slot is reused: every
// call refuses it (kInvalidArgument on "request") instead of acting on the slot's new request
// (issue 27.2; docs/adr/0031-serve-hardening.md). Generations wrap after 2^32 frees of one slot.
struct RequestId {
  uint32_t value = UINT32_MAX;
  uint32_t generation = 0;
  friend bool operator==(RequestId, RequestId) = default;
};

// ManagerOptions::max_requests: no ceiling on live requests (the tables grow on demand).
inline constexpr uint32_t kNoRequestLimit = UINT32_MAX;

// ManagerOptions::seal_timing.
enum class SealTiming : uint8_t {
  kAuto,       // deferred with an unbacked pool and no windows, immediate otherwise
  kImmediate,  // a block is sealed in the step its last token arrives in
  kDeferred,   // queued (ADR 0048); refused where kAuto would seal immediately
};

// Validated once, by RequestManager::Create. The layout (record formats, block span, kernel, MTP
// layers, tensor-parallel ranks, scale formats; empty / unset: the model's defaults) is the
// CacheLayoutOptions it derives from.
struct ManagerOptions : CacheLayoutOptions {
  // Speculative decoding: slots for this many draft tokens are reserved ahead of every request.
  uint32_t spec_tokens = 0;
  // Capacity: page blocks, and live requests. The request table (and, with windows, the state
  // arena's slabs) grows on demand; max_requests is only a ceiling the caller chooses (Admit and
  // Fork beyond it: kOutOfBlocks on "requests", naming max-requests). The default sets none.
  uint32_t capacity_blocks = 1024;
  uint32_t max_requests = kNoRequestLimit;
  // kHost: the pool holds the KV bytes (writers fill them; Append without a writer is refused).
  // kUnbacked: bookkeeping only, for KV an engine keeps elsewhere (a device); no writer needed.
  RegionKind region_kind = RegionKind::kHost;
  // Models with windows: what a sealed block boundary keeps of the window state.
  SwaStrategy window_strategy = SwaStrategy::kRecompute;
  // Keys.
  HashAlgorithm hash = HashAlgorithm::kXxh3;
  uint32_t hash_bits = 128;
  uint64_t hash_key_seed = 0;  // 0: a random per-manager key
  // Non-empty: the secret the keys are derived from (>= 16 bytes; overrides hash_key_seed). A
  // persistent tier keeps one so that a later process computes the same prefix keys.
  std::vector<std::byte> hash_key;
  // The checkpoint's revision when known (e.g. a commit id); part of the cache identity
  // (CacheIdentityKey), so a fine-tune that keeps its base's config.json must set it to keep
  // their blocks apart.
  std::string weights_revision;
  bool content_dedup = true;
  // Which block an allocation reuses (block_pool.h): free blocks first (default), or blocks in
  // the order they were released, as vLLM's free block queue (tessera.vllm.KVCacheManager).
  BlockReuse block_reuse = BlockReuse::kFreeFirst;
  // Tenants mapped to one shared domain; a tenant not listed is its own domain.
  std::unordered_map<uint32_t, uint32_t> tenant_domain;
  // KV-cache events (kv_events.h): recorded for TakeKvEvents when set, at most
  // kv_events_capacity of them buffered between two calls (the rest dropped and counted).
  bool kv_events = false;
  uint32_t kv_events_capacity = 1u << 16;
  // Caller-keyed admissions (AdmitKeyed / AppendKeyed; ADR 0045): blocks keyed and verified by
  // the caller's own 32-byte hash of them (e.g. vLLM's SHA-256 block hashes) instead of their
  // tokens. Keeps 32 B more per block. Refused ("caller-keys") with a pool that holds bytes and
  // with windows; a block source attached refuses the keyed admission (tier records are verified
  // by tokens, ADR 0010).
  bool caller_keys = false;
  // When Step's one-token path seals (ADR 0048, ADR 0049). Deferred: a decode step's seals are
  // queued and performed over the steps after the next one (the next one is where the same
  // requests take their next blocks), at most max(64, batch / 16) per step, and wholly before
  // anything else reads or changes the index: every other call of the manager (Admit, Append,
  // AllocateSlots, Fork, Free, the event takes, index(), pool(), DrainSeals ...) and a step
  // that takes another path first performs every queued seal, in the order the steps made them,
  // so what any of them observes is what immediate seals give. It bounds the worst step where a
  // batch crosses its block boundaries together. Not seen until performed: the counters
  // CollectMetrics reads from any thread (the pool's seals, its blocks per state, the index's
  // counters). tessera_seals_pending says how many are queued: no more than the table has
  // request slots; a batch's seals are performed within about 17 of its steps, and a manager
  // left idle keeps its queue until its next call (DrainSeals). Deferred is refused
  // ("defer-seals") with a pool that holds KV bytes (a sealed block's bytes are final at once)
  // and with windows (the state component keeps state at the seal). kAuto, the default:
  // deferred where allowed, immediate elsewhere.
  SealTiming seal_timing = SealTiming::kAuto;
};

struct RequestSpec {
  uint32_t tenant = 0;
  uint64_t cache_salt = 0;
  uint8_t priority = kDefaultRetentionPriority;
  // Slots Admit reserves for the uncached part of the prompt: all of it by default, fewer for an
  // engine that prefills in chunks (it reserves the rest with AllocateSlots as it goes).
  std::optional<uint64_t> reserve_tokens;
  // False: the prompt takes no cached prefix (it is computed whole) but its full blocks are still
  // sealed and indexed under its key, for later requests (vLLM's skip_reading_prefix_cache, set for
  // prompt_logprobs: those blocks stay reusable).
  bool read_cache = true;
};

// A prompt as admission needs it: its tokens, tenant domain, salt and the prefix keys of its whole
// blocks. Computed once by HashPrompt; a scheduler that retries admission reuses it.
class PromptKeys {
 public:
  std::span<const uint32_t> tokens() const { return tokens_; }
  std::span<const Hash128> keys() const { return keys_; }
  uint32_t domain() const { return domain_; }
  uint64_t salt() const { return salt_; }

 private:
  friend class RequestManager;
  std::vector<uint32_t> tokens_;
  std::vector<Hash128> keys_;
  uint32_t domain_ = 0;
  uint64_t salt_ = 0;
  uint64_t owner_ = 0;  // the manager that hashed it (keys are per manager key)
};

struct Admission {
  RequestId id;
  uint64_t cached_tokens = 0;  // whole blocks, at most prompt - 1 tokens
  uint32_t cached_blocks = 0;
  uint32_t tier_blocks = 0;     // of cached_blocks, promoted from the block source
  bool state_restored = false;  // windows, snapshot/retain: the boundary state was restored
  // Windows, otherwise: the engine must recompute tokens [recompute_from, cached_tokens)
  // (Recompute) to rebuild the rings.
  uint64_t recompute_from = 0;
  uint64_t recompute_tokens = 0;
};

// One scheduler step for many requests: request i reserves room for counts[i] tokens and appends
// them (tokens concatenated in request order).
struct StepBatch {
  std::span<const RequestId> requests;
  std::span<const uint32_t> counts;
  std::span<const uint32_t> tokens;
};
struct StepResult {
  std::vector<StatusCode> codes;  // per request: kOk, or why it was left unchanged
  uint32_t failed = 0;
  // Blocks each request took this step: new_blocks[offsets[i], offsets[i + 1]).
  std::vector<uint32_t> offsets;
  std::vector<BlockId> new_blocks;
  // Slots a request already had whose block id changed this step: a copy-on-write of a block
  // shared with a fork, or a block sealed as a duplicate of a cached one (then shared). An
  // engine that mirrors block tables applies these as well as new_blocks.
  struct SlotChange {
    uint32_t request = 0;  // index into the batch
    uint32_t slot = 0;     // index into the request's block table
    BlockId from;
    BlockId to;
  };
  std::vector<SlotChange> replaced;
};

struct ManagerMetrics {
  std::atomic<uint64_t> requests_admitted{0};
  std::atomic<uint64_t> forks{0};
  std::atomic<uint64_t> cow_copies{0};
  std::atomic<uint64_t> prefix_hit_tokens{0};
  std::atomic<uint64_t> prefix_miss_tokens{0};
  std::atomic<uint64_t> prefix_hit_blocks{0};
  std::atomic<uint64_t> prefix_miss_blocks{0};  // full prompt blocks not served from cache
  std::atomic<uint64_t> out_of_blocks{0};
  std::atomic<uint64_t> tier_hit_blocks{0};  // prompt blocks promoted from the block source
  std::atomic<uint64_t> tier_hit_tokens{0};
  std::atomic<uint64_t> states_restored{0};    // windows: resumptions that restored kept state
  std::atomic<uint64_t> recompute_tokens{0};   // windows: tokens named for recomputation
  std::atomic<uint64_t> state_bytes{0};        // windows: arena slabs in use and kept window state
  std::atomic<uint64_t> kv_events_dropped{0};  // events past kv_events_capacity, not recorded
  std::atomic<uint64_t> seals_pending{0};      // deferred seals queued, as of the last call
};

class RequestManager {
 public:
  // Errors name the option or config field: the format options as the ledger reports them,
  // "max-requests", "capacity-blocks", "sliding_window", "hash-bits", "hash-key".
  static Result<std::unique_ptr<RequestManager>> Create(const Geometry& g, const ManagerOptions& options);
  ~RequestManager();
  RequestManager(const RequestManager&) = delete;
  RequestManager& operator=(const RequestManager&) = delete;

  PromptKeys HashPrompt(std::span<const uint32_t> prompt, const RequestSpec& spec) const;
  // REQUIRES: keys from this manager's HashPrompt for the same tenant and cache salt as `spec`
  // (else kInvalidArgument on "prompt": keys of one tenant never look up another's blocks).
  // Errors: kOutOfBlocks on "blocks" (no slots) or "requests" (the table is full): no request
  // is created; blocks promoted from the source stay cached in the pool.
  Result<Admission> Admit(const PromptKeys& keys, const RequestSpec& spec);
  Result<Admission> Admit(std::span<const uint32_t> prompt, const RequestSpec& spec);
  // Caller-keyed admission (options.caller_keys; ADR 0045) of a prompt of `prompt_tokens` tokens
  // whose whole blocks the caller hashed itself: hashes[i] is its hash of block i, chained over
  // the blocks before it and over every input that makes the block's KV (at most prompt_tokens /
  // block_tokens of them). The longest cached prefix is looked up by those hashes alone — block
  // i's key is CallerKey(key of block i - 1, hashes[i], domain, salt), a hit is verified by the
  // hash kept with the block, its parent, domain and salt; no token is read — capped as Admit's
  // so that the last prompt token is computed. A caller-keyed block is never a token-keyed
  // admission's hit, nor the reverse. The request's tokens from the hit on are appended with
  // AppendKeyed. Errors as Admit's, and kInvalidArgument on "caller-keys" (not enabled, or a
  // block source attached) or "hashes" (more than the prompt's whole blocks).
  Result<Admission> AdmitKeyed(std::span<const CallerHash> hashes, uint64_t prompt_tokens, const RequestSpec& spec);
  // Append for a caller-keyed request: `hashes` holds the caller's hash of each block the tokens
  // complete, in order (exactly that many: kInvalidArgument on "hashes"); each is sealed under
  // its caller key and keeps its hash. REQUIRES: slots (AllocateSlots). Nothing changes on an error.
  Status AppendKeyed(RequestId r, std::span<const uint32_t> tokens, std::span<const CallerHash> hashes);

  // Room for `n` more tokens (and the spec draft tokens), copying any block the request shares
  // with a fork and has not sealed. kOutOfBlocks changes nothing.
  Status AllocateSlots(RequestId r, uint64_t n);
  // REQUIRES: slots for tokens.size() more tokens. Writes through `writers`, seals full blocks.
  // A pool that holds bytes needs writers (kInvalidArgument on "writers"); a caller-keyed
  // request appends with AppendKeyed (kInvalidArgument on "request").
  Status Append(RequestId r, std::span<const uint32_t> tokens, const KvWriters& writers);
  // AllocateSlots + Append for each request of the batch; a request that fails is left unchanged
  // and reported in `out` (the call itself fails only on a malformed batch).
  Status Step(const StepBatch& batch, const KvWriters& writers, StepResult* out);
  // Windows, Recompute: rebuilds the rings from tokens [recompute_from, cached_tokens) of an
  // admission (no entries are written: the pages hold them).
  Status Recompute(RequestId r, std::span<const uint32_t> tokens, const KvWriters& writers);
  Result<RequestId> Fork(RequestId parent);
  Status Free(RequestId r);

  std::span<const BlockId> BlockTable(RequestId r) const;
  uint64_t Tokens(RequestId r) const;
  // The page record of token `position` of request `r` (per-token groups), read-only: its block
  // may be sealed, and a sealed block's bytes are final (issue 27.7, ADR 0039).
  Result<ConstRecordView> Record(RequestId r, uint32_t group, uint32_t layer, uint64_t position) const;
  // The same record writable, for a caller that fills the request's block itself: refused with
  // kFailedPrecondition on "block", naming it, unless the block is filling and held by this
  // request alone (not sealed, not shared by a fork). Take it per write: the span is not checked
  // again (a checked handle that outlives a seal is Writable's WritableView).
  Result<RecordView> MutableRecord(RequestId r, uint32_t group, uint32_t layer, uint64_t position);
  // Windows: a compressed entry of request r — model layer, indexer or main, entry index;
  // read-only, as Record.
  Result<ConstRecordView> Entry(RequestId r, uint32_t layer, bool indexer, uint64_t entry) const;
  // Fault injection only (`tessera run --flip-page-byte`, the corruption tests): the record of
  // Record / Entry writable whatever its block's state, to damage a sealed block on purpose and
  // see that the damage is detected. Never a writer's path (writers take MutableRecord/Writable).
  Result<RecordView> FaultInjectionRecord(RequestId r, uint32_t group, uint32_t layer, uint64_t position);
  Result<RecordView> FaultInjectionEntry(RequestId r, uint32_t layer, bool indexer, uint64_t entry);
  // Windows: the live window and compressor rows (RequestStates::LiveState).
  std::vector<std::byte> LiveState(RequestId r) const;
  size_t live_requests() const { return live_; }
  // The tenant that admitted live request r (a fork keeps its parent's), or nullopt when r names
  // no live request (stale or never issued). Callers that serve several clients refuse an id
  // whose tenant is not the caller's.
  std::optional<uint32_t> TenantOf(RequestId r) const;
  // The id of the live request in table slot `slot` (its current generation), or nullopt. For a
  // binding that hands out slot numbers to a single in-process owner.
  std::optional<RequestId> LiveAt(uint32_t slot) const;

  // Pages + block metadata of every block not free + the state component's bytes.
  uint64_t bytes_held() const;
  // Both perform the deferred seals first (ManagerOptions::seal_timing).
  const BlockPool& pool() const {
    DrainAll();
    return *pool_;
  }
  // A writable view of the page (b, group, layer), or of block b's bytes in one group (layer
  // unset), for a caller that fills a block the manager handed out (a zero-copy view of a block
  // being filled). The view is checked on every access: once b is sealed (or freed, or shared by
  // a fork) it writes nothing and names the block (BlockPool::Writable; issue 27.7, ADR 0039).
  Result<WritableView> Writable(BlockId b, uint32_t group, std::optional<uint32_t> layer = std::nullopt) {
    return pool_->Writable(b, group, layer);
  }
  const BlockIndex& index() const {
    DrainAll();
    return *index_;
  }
  // Whether Step defers its seals (ManagerOptions::seal_timing, resolved at creation); the
  // seals queued and not yet performed, and a call that performs them all now (in order).
  bool defers_seals() const { return defer_seals_; }
  size_t pending_seals() const { return pending_end_ - pending_head_; }
  void DrainSeals() { DrainAll(); }
  // The state component, or nullptr for a model without windows.
  const RequestStates* states() const { return states_.get(); }
  uint32_t block_tokens() const { return block_tokens_; }
  const ManagerMetrics& metrics() const { return metrics_; }
  // The KV-cache events recorded since the last call, oldest first (options.kv_events; empty
  // otherwise). The buffer is handed over: the next events start a new one.
  std::vector<KvEvent> TakeKvEvents();
  // As TakeKvEvents, into *out, whose elements' storage is reused: a caller that hands back the
  // vector of an earlier call takes events without allocating in a steady state.
  void TakeKvEvents(std::vector<KvEvent>* out);
  // As TakeKvEvents, as a log swapped with *out (cleared first, its storage kept): O(1), for a
  // consumer that drains often (a publisher thread) and reads the events through views.
  void TakeKvEventLog(KvEventLog* out);
  // Drops every cached block from the prefix index and the pool (nothing is demoted to the
  // block source: a reset means the cached KV is no longer wanted, e.g. new weights) and records
  // AllBlocksCleared, which supersedes the events not yet taken. kFailedPrecondition on
  // "requests" while any request is live (its blocks cannot be dropped).
  Status ResetPrefixCache();

  // Every counter of the manager, its pool, its index and its state component; safe to call
  // from any thread (reads atomics only).
  std::vector<MetricFamily> CollectMetrics() const;
  uint32_t domain_of(uint32_t tenant) const;
  void SetSecurityListener(std::function<void(const SecurityEvent&)> listener);

  // Attaches a second level of blocks (not owned; nullptr detaches). It is told of seals and
  // evictions (with the window state a block keeps) and asked for prefix blocks on Admit.
  void SetBlockSource(BlockSource* source) { source_ = source; }
  // Hands every sealed block (with its kept state) to the source's OnCheckpoint and waits until
  // the source has made it persistent; returns how many (0 without a source), or its error.
  Result<uint64_t> Checkpoint();

 private:
  struct Request;
  RequestManager();
  Request* Get(RequestId r);
  const Request* GetConst(RequestId r) const;
  static Status NoRequest(RequestId r);
  Status OutOfBlocks(uint64_t needed);
  uint64_t BlocksNeeded(uint64_t tokens) const;
  uint32_t SharedSlots(const Request& q, uint64_t n) const;
  Status UnshareSlots(Request& q, uint64_t n);
  Status CopyOnWrite(Request& q, size_t slot);
  Status Reserve(Request& q, uint64_t n);
  Status AppendReserved(Request& q, std::span<const uint32_t> tokens, const KvWriters& w);
  StatusCode StepOne(uint32_t index, RequestId r, std::span<const uint32_t> tokens, const KvWriters& writers,
                     StepResult* out);
  StatusCode StepNewBlock(Request& q, uint32_t token);
  // What a seal is for: a span the request wrote (handed to the block source), or a block
  // promoted from the source (never written back), with the state it brought (models with windows).
  struct Promoted {
    const std::vector<std::byte>* state = nullptr;
  };
  void SealSlot(Request& q, size_t slot, std::span<const uint32_t> tokens, std::optional<Promoted> promoted);
  void SealKeyedSlot(Request& q, size_t slot, std::span<const uint32_t> tokens, const CallerHash& hash);
  void SealSpan(Request& q);
  const Hash128* PromptKey(const Request& q, size_t slot, const PrefixRef& parent,
                           std::span<const uint32_t> tokens) const;
  // Step's look-ahead (ADR 0040): the lines of the request kStepLines ahead; for the request
  // kStepAhead ahead, the lines it reads and, when its tokens complete a block, the key of that
  // block (hashed now, so that the index slot it probes and the lines its seal writes arrive
  // before the seal).
  static constexpr size_t kStepLines = 8, kStepAhead = 4;
  // Deferred seals: each step performs at most max(kDrainMin, batch / kDrainSteps) (ADR 0048).
  static constexpr size_t kDrainMin = 64, kDrainSteps = 16;
  static constexpr size_t kPrefetchFrom = 2048;  // request slots: below, the lines stay cached
  struct StepSeal {
    const Request* request = nullptr;  // the request, as it was when the key was hashed
    uint64_t tokens = 0;
    size_t chain = 0;
    size_t slot = 0;
    size_t index = SIZE_MAX;  // its position in the batch
    Hash128 key;
  };
  // Deferred seals (ADR 0048): Step's one-token path queues a seal (the request, its slot, a
  // copy of the block's tokens); Drain performs up to `max` of them in order, hashing each key
  // kStepAhead seals ahead. DrainAll is const for the const accessors that must see them all
  // (the manager has a single owner: nothing else reads it meanwhile).
  struct PendingSeal {
    uint32_t request = 0;  // slot in requests_
    uint32_t slot = 0;     // in its block table
    uint32_t step = 0;     // the step that made it (steps_, wrapping)
  };
  void DeferSeal(Request& q);
  void Drain(size_t max, bool older_only = false);
  void DrainAll() const {
    if (pending_head_ != pending_end_) [[unlikely]]
      const_cast<RequestManager*>(this)->Drain(SIZE_MAX);
  }
  uint32_t TakeRequestSlot();
  void PrefetchRequest(RequestId r) const;
  void LookAhead(size_t index, RequestId r, std::span<const uint32_t> tokens);
  void HashSealAhead(StepSeal& s, const Request& q, size_t slot, size_t index, std::span<const uint32_t> head,
                     std::span<const uint32_t> tail);
  const Hash128* StepSealKey(const Request& q, size_t slot) const;
  std::vector<std::byte> TierState(BlockId b) const;
  // Mirrors the state component's bytes into metrics_ (read from any thread).
  void SyncStateBytes();
  // KV events (options_.kv_events): a block sealed into the index, a block evicted from it.
  void RecordStored(const PrefixRef& parent, const Hash128& key, std::span<const uint32_t> tokens, uint32_t domain);
  void RecordRemoved(const Hash128& key);

  ManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<RequestStates> states_;
  std::vector<Request> requests_;
  std::vector<uint32_t> free_request_ids_;
  size_t live_ = 0;
  uint32_t block_tokens_ = 0;
  bool token_groups_ = false;  // some group holds a record per token (else entries only)
  uint64_t instance_ = 0;      // tells this manager's PromptKeys from another's (unique per process)
  BlockSource* source_ = nullptr;
  ManagerMetrics metrics_;
  std::vector<BlockId> step_slots_;                  // StepOne's scratch: the ids of the slots a step may replace
  std::array<StepSeal, kStepAhead + 1> step_seals_;  // LookAhead's keys, by batch position
  const StepSeal* step_seal_ = nullptr;              // the one of the request StepOne is on, if any
  bool step_sealed_ = false;                         // set by SealSlot (Step: whether a request sealed)
  // False after an admission: its prompts' traffic has evicted the request lines, and the next
  // step prefetches them as it does above kPrefetchFrom.
  bool steps_warm_ = false;
  bool defer_seals_ = false;           // ManagerOptions::seal_timing, resolved
  StepResult* step_result_ = nullptr;  // the result Step fills (StepNewBlock's new blocks)
  // block_tokens_ per request slot: the tokens of its unsealed span (SpanOffset(tokens) of them),
  // one array in slot order rather than a vector per request (a step reads them in batch order).
  std::vector<uint32_t> span_arena_;
  // The span of a token count without a division when block_tokens_ is a power of two (the hot
  // path divides by it several times per request per step).
  uint64_t SpanOf(uint64_t tokens) const { return span_shift_ >= 0 ? tokens >> span_shift_ : tokens / block_tokens_; }
  uint64_t SpanOffset(uint64_t tokens) const {
    return span_shift_ >= 0 ? tokens & (uint64_t{block_tokens_} - 1) : tokens % block_tokens_;
  }
  int span_shift_ = -1;
  // A filling block is shared only by a fork (Fork clones the table); until the first fork no
  // slot can need a copy-on-write, and the step skips looking.
  bool forked_ = false;
  KvEventLog kv_log_;  // recorded, not yet taken
  KvMedium kv_medium_ = KvMedium::kGpu;
  bool resetting_ = false;  // ResetPrefixCache is evicting: nothing goes to the source
  // Deferred seals: entries [pending_head_, pending_end_) of pending_ (one per request slot, sized
  // with span_arena_), their tokens block_tokens_ per entry in pending_tokens_.
  std::vector<PendingSeal> pending_;
  std::vector<uint32_t> pending_tokens_;
  size_t pending_head_ = 0, pending_end_ = 0;
  // Steps so far (wrapping): a step performs only seals made before the step before it, so that
  // the step after a seal step — where the same requests take their next blocks — performs none.
  uint32_t steps_ = 0;
  std::array<StepSeal, kStepAhead + 1> drain_seals_;  // Drain's look-ahead keys, by queue position
};

}  // namespace tessera
