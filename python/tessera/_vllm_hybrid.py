"""tessera.vllm.KVCacheManager for models with several KV-cache groups (DeepSeek-V4).

vLLM lays a DeepSeek-V4 model out as several KV-cache groups that all take blocks from one pool
(``vllm/v1/core/kv_cache_utils.py`` ``get_kv_cache_groups`` -> ``group_and_unify_kv_cache_specs``,
``_get_kv_cache_groups_uniform_groups``; github.com/local-inference-lab/vllm 28be48fa, docs/adr/
0028-vllm-hybrid-groups.md): group 0 holds the compressed caches (CSA and HCA latents, the
indexer keys; full attention, ``block_size`` tokens per block, 256 by default), then the
sliding-window groups: the window rings of every layer (64-token blocks, window 128), split in
as many groups as needed to align their layer count with group 0's; the CSA compressor states
(4-token blocks, window 8) and the HCA compressor states (8-token blocks, window 128). vLLM's
``HybridKVCacheCoordinator`` runs one manager per group over the shared pool; this class gives
the same surface and the same figures (step for step on the traces of tests/data/engine_traces,
``v4-*``):

- each group's blocks per request (``get_block_ids`` -> one list per group; a sliding-window
  group puts the null block, id 0, where a block left the window);
- hits (``get_computed_blocks``): the longest prefix, a multiple of the least common multiple of
  the group block sizes, that every group can serve — a full-attention group all blocks from
  the start, a sliding-window group the blocks that cover its window before the hit point
  (``cdiv(window - 1, block_size)`` contiguous blocks; earlier ones may be gone); the groups'
  answers are narrowed until all agree;
- ``allocate_slots``: blocks that left a window are released first (``remove_skipped_blocks``),
  then all groups' blocks are counted against the pool (a hit block that is cached, not in use,
  counts: taking it removes it from the free queue), all or nothing; the admission check
  (``full_sequence_must_fit``) caps a sliding-window group at its admission bound
  ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1``;
- caching: full blocks are indexed per group at multiples of the alignment; a sliding-window
  group indexes only the blocks a hit can use (the last ``cdiv(window - 1, block_size)`` of
  each aligned segment), as vLLM;
- ``free``: each group's blocks, group by group, last block first; ``usage``, the pool's free
  blocks, prefix-cache stats and events (``group_idx`` per group) as vLLM's.

The pool is Tessera's (``tessera._core._EngineBlockPool``: a BlockPool, unbacked, reusing blocks
in release order as vLLM's free block queue, evicting cached blocks oldest first). Tessera's own
DeepSeek-V4 manager keeps the window rings and compressor states in a per-request arena, not in
pages, so it cannot report vLLM's window blocks: this class keeps vLLM's layout over the pool
instead (ADR 0028 says where the two differ; tests pin it).
"""

import math

from . import _core
from ._vllm_common import KVCacheBlocks, _int, event_classes, extend_chain, identity_salt, stored_event
from ._vllm_kvbase import ManagerBase

NULL = 0  # vLLM's null block: never handed out; a skipped sliding-window block


def _cdiv(a, b):
    return -(-a // b)


def deepseek_v4_kv_cache_groups(model, block_size=256):
    """vLLM's KV-cache groups for a DeepSeek-V4 preset, in vLLM's order: a list of
    ``{"block_size", "sliding_window" (None: full attention), "layers"}``.

    The layers register as vllm/models/deepseek_v4 makes them: per CSA layer (ratio 4) the
    indexer's key cache and its compressor state, then the window ring, the compressed latent and
    the compressor state; per HCA layer (ratio 128) the ring, the latent and the state; a
    window-only layer its ring. Group 0 gathers the paged caches (latents, indexer keys); the
    state caches form one kind per (block size, window) in the order first met: rings (64, window),
    CSA states (4, 8), HCA states (8, 128). vLLM splits each kind into groups of about equal layer
    count: the count per group is the ``d`` no smaller than group 0's layers of one page size that
    pads the kinds' layer counts (per page size) least, ties to the larger ``d``; a kind of ``x``
    layers per page size becomes ``cdiv(x, d)`` groups taking every ``cdiv(x, d)``-th layer.
    """
    info = _core._model_layers(model)
    if not info["hybrid"]:
        raise ValueError("model: %s has one KV-cache group (no sliding windows)" % model)
    _int(block_size, "block_size", 1)
    if block_size % 128:
        raise ValueError("block_size: DeepSeek-V4's compressed group needs a multiple of 128 (got %d)" % block_size)
    window = info["sliding_window"]
    n4 = sum(1 for _, r in info["layers"] if r == 4)
    n128 = sum(1 for _, r in info["layers"] if r == 128)
    kinds = []  # [(block_size, window), layers per page size, page sizes], first met first
    seen = {}

    def meet(key, per_size, sizes):
        if key not in seen:
            seen[key] = len(kinds)
            kinds.append([key, per_size, sizes])

    for _, r in info["layers"]:
        if r == 4:
            meet((4, 8), n4, 2)  # the indexer's and the attention's compressor states
        meet((64, window), len(info["layers"]), 1)
        if r == 128:
            meet((8, 128), n128, 1)
    tuples0 = max(n4, n128)  # group 0: CSA latent, indexer keys, HCA latent (three page sizes)
    values = [tuples0] + [k[1] for k in kinds]
    best, best_pad = tuples0, None
    for d in range(tuples0, max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    groups = [{"block_size": block_size, "sliding_window": None, "layers": 2 * n4 + n128}]
    for (bs, win), per_size, sizes in kinds:
        split = _cdiv(per_size, best)
        for i in range(split):
            groups.append({"block_size": bs, "sliding_window": win,
                           "layers": sizes * len(range(i, per_size, split))})
    return groups


class _Group:
    __slots__ = ("index", "block_size", "window", "contiguous", "cap")

    def __init__(self, index, block_size, window):
        self.index = index
        self.block_size = block_size
        self.window = window  # None: full attention
        # Blocks a sliding-window hit needs before the hit point (the token being computed is in
        # its own window, hence window - 1).
        self.contiguous = _cdiv(window - 1, block_size) if window else 0
        self.cap = None

    def skipped_tokens(self, computed):
        return max(0, computed - self.window + 1) if self.window else 0


class _HReq:
    __slots__ = ("tables", "cached", "hashes", "allocated")

    def __init__(self, n):
        self.tables = [[] for _ in range(n)]  # per group: pool ids + 1, NULL where skipped
        self.cached = [0] * n                 # per group: blocks [0, cached) indexed (or null)
        self.hashes = []                      # chain hashes per hash_block_size tokens
        self.allocated = False                # vLLM's num_cached_block entry: allocate_slots ran


def _groups_of(groups, max_model_len, max_num_batched_tokens):
    """`kv_cache_groups` checked, as _Group objects (group 0 full attention), their caps set."""
    if not isinstance(groups, (list, tuple)):
        raise TypeError("kv_cache_groups: must be a list (got %s)" % type(groups).__name__)
    gs = []
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise TypeError("kv_cache_groups[%d]: must be a dict (got %s)" % (i, type(g).__name__))
        bs = _int(g.get("block_size"), "kv_cache_groups[%d].block_size" % i, 1)
        win = g.get("sliding_window")
        if win is not None:
            _int(win, "kv_cache_groups[%d].sliding_window" % i, 1)
        gs.append(_Group(i, bs, win))
    if len(gs) < 2:
        raise ValueError("kv_cache_groups: a hybrid manager needs at least two groups (got %d)" % len(gs))
    if gs[0].window is not None:
        raise ValueError("kv_cache_groups[0]: must be the full-attention group (sliding_window None)")
    mnbt = max_model_len if max_num_batched_tokens is None else _int(
        max_num_batched_tokens, "max_num_batched_tokens", 1)
    for g in gs:
        if g.window:
            g.cap = _cdiv(min(g.window - 1 + mnbt, max_model_len), g.block_size) + 1
    return gs


class HybridManager(ManagerBase):
    """tessera.vllm.KVCacheManager for a model with several KV-cache groups (DeepSeek-V4; the
    module's doc), over one shared block pool with vLLM's hybrid coordinator's rules (ADR 0028).
    ``tessera.vllm.KVCacheManager`` builds it. The groups are those vLLM makes for the preset
    (``deepseek_v4_kv_cache_groups``) unless ``kv_cache_groups`` gives them (a list of
    ``{"block_size", "sliding_window"}``, group 0 full attention). ``max_num_batched_tokens``
    bounds a sliding-window group's admission count as vLLM's scheduler does (None:
    ``max_model_len``, vLLM's default). ``trust_block_hashes`` is the one-group manager's (ADR
    0045); the hybrid manager keys its blocks by its own chain over the tokens either way. The
    other arguments are ManagerBase's.
    """

    def __init__(self, *, kv_cache_groups=None, max_num_batched_tokens=None, hash_block_size=None,
                 trust_block_hashes=True, **common):
        ManagerBase.__init__(self, **common)
        if type(trust_block_hashes) is not bool:
            raise TypeError("trust_block_hashes: must be a bool (got %s)" % type(trust_block_hashes).__name__)
        block_size = self.block_size
        if kv_cache_groups is None:
            kv_cache_groups = deepseek_v4_kv_cache_groups(self._model, block_size)
        gs = _groups_of(kv_cache_groups, self.max_model_len, max_num_batched_tokens)
        self._groups = gs
        # Groups with the same spec are looked up together; full attention first (vLLM's order).
        kinds = {}
        for g in gs:
            kinds.setdefault((g.block_size, g.window), []).append(g.index)
        self._kinds = sorted(kinds.items(), key=lambda kv: kv[0][1] is not None)
        self._lcm = math.lcm(*(g.block_size for g in gs))
        self._hbs = math.gcd(*(g.block_size for g in gs))
        self.num_kv_cache_groups = len(gs)
        self._event_meta = [("mla_attention", None) if g.window is None else ("sliding_window_mla", g.window)
                            for g in gs]
        if kv_cache_groups[0].get("block_size") != block_size:
            raise ValueError("kv_cache_groups[0].block_size: must equal block_size (%d)" % block_size)
        if hash_block_size not in (None, self._hbs):
            raise ValueError("hash_block_size: must be the gcd of the group block sizes (%d)" % self._hbs)
        self._hybrid_reset_pool()
        self._finish_init()

    # --- pool, index --------------------------------------------------------------------------
    def _hybrid_reset_pool(self):
        self._pool = _core._EngineBlockPool(self._capacity, block_reuse=self._block_reuse)
        self._index = {}      # (group, chain hash) -> {pool id: None}, in insertion order
        self._key_of = {}     # pool id -> its (group, chain hash) while indexed
        self._reqs = {}      # vLLM request id -> _HReq (holds blocks or was allocated)
        self._looked_up = None  # (request id, chain hashes) of the last get_computed_blocks

    def _evictions(self):
        for b in self._pool.take_evicted():
            key = self._key_of.pop(b, None)
            if key is None:
                continue
            ids = self._index.get(key)
            if ids is not None:
                ids.pop(b, None)
                if not ids:
                    del self._index[key]
            if self.enable_kv_cache_events:
                self._events.append(self._removed(key))

    def _removed(self, key):
        return event_classes()[1](block_hashes=[key[1]], medium="GPU", group_idx=key[0])

    def _cached_block(self, key):
        ids = self._index.get(key)
        return next(iter(ids)) + 1 if ids else None

    def _chain(self, request, r=None):
        """Chain hashes of the request's whole hash_block_size chunks (reused across calls)."""
        hashes = r.hashes if r is not None else []
        toks = request.all_token_ids
        upto = len(toks) // self._hbs
        if len(hashes) >= upto:
            return hashes
        # The request's identity (salt, LoRA, images, embeds) roots its chain, as in vLLM.
        return extend_chain(hashes, toks, self._hbs, upto, 0 if hashes else identity_salt(request))

    def _key(self, g, hashes, i):
        """The index key of block i of group g: the chain hash at the block's last token."""
        return (g.index, hashes[(i + 1) * g.block_size // self._hbs - 1])

    # --- hits ---------------------------------------------------------------------------------
    def _lookup(self, group_ids, hashes, i):
        """Block i cached in every group of `group_ids`: their ids, or None."""
        out = []
        for gi in group_ids:
            b = self._cached_block(self._key(self._groups[gi], hashes, i))
            if b is None:
                return None
            out.append(b)
        return out

    def _hit_full(self, g, group_ids, hashes, max_len):
        got = [[] for _ in group_ids]
        for i in range(max_len // g.block_size):
            ids = self._lookup(group_ids, hashes, i)
            if ids is None:
                break
            for lst, b in zip(got, ids):
                lst.append(b)
        while got[0] and len(got[0]) * g.block_size % self._lcm:
            for lst in got:
                lst.pop()
        return got

    def _hit_window(self, g, group_ids, hashes, max_len):
        n = max_len // g.block_size
        got = [[NULL] * n for _ in group_ids]
        run = 0
        for i in range(n - 1, -1, -1):
            ids = self._lookup(group_ids, hashes, i)
            if ids is None:
                run = 0
                continue
            if run == 0 and (i + 1) * g.block_size % self._lcm:
                continue  # a hit must end on the alignment
            for lst, b in zip(got, ids):
                lst[i] = b
            run += 1
            if run >= g.contiguous:
                return [lst[:i + run] for lst in got]
        got = [lst[:run] for lst in got]
        while got[0] and len(got[0]) * g.block_size % self._lcm:
            for lst in got:
                lst.pop()
        return got

    def _find_hit(self, hashes, max_len):
        per_group = [None] * len(self._groups)
        hit = max_len
        simple = len(self._kinds) == 2
        while True:
            cur = hit
            for (bs, win), group_ids in self._kinds:
                g = self._groups[group_ids[0]]
                if win is None and per_group[group_ids[0]] is not None:
                    cur = cur // bs * bs  # full attention: a prefix of what it found
                    continue
                got = (self._hit_full if win is None else self._hit_window)(g, group_ids, hashes, cur)
                cur = len(got[0]) * bs
                for gi, lst in zip(group_ids, got):
                    per_group[gi] = lst
            if cur >= hit:
                break
            hit = cur
            if simple:
                break
        for (bs, win), group_ids in self._kinds:
            if win is None:
                for gi in group_ids:
                    del per_group[gi][hit // bs:]
        return [lst if lst is not None else [] for lst in per_group], hit

    # --- counting and allocating --------------------------------------------------------------
    def _evictable(self, ids):
        return sum(1 for b in ids if b != NULL and self._pool.state(b - 1) == "cached")

    def _blocks_needed(self, g, r, num_tokens, hit_ids, computed, cap):
        required = _cdiv(num_tokens, g.block_size)
        if cap and g.cap is not None:
            required = min(required, g.cap)
        held = len(r.tables[g.index]) if r is not None else 0
        if r is not None and r.allocated:
            return max(required - held, 0)
        skipped = g.skipped_tokens(computed) // g.block_size
        new = max(required - max(skipped, len(hit_ids) + held), 0)
        return new + self._evictable(hit_ids[max(0, skipped - held):])

    def _remove_skipped(self, r, computed):
        for g in self._groups:
            if not g.window:
                continue
            table = r.tables[g.index]
            n = min(g.skipped_tokens(computed) // g.block_size, len(table))
            gone = []
            for i in range(n - 1, -1, -1):
                if table[i] == NULL:
                    break
                gone.append(table[i] - 1)
                table[i] = NULL
            if gone:
                self._pool.release(gone)

    def _cache(self, request, r, num_tokens):
        num_tokens = num_tokens // self._lcm * self._lcm
        hashes = None
        for g in self._groups:
            full = num_tokens // g.block_size
            done = r.cached[g.index]
            if done >= full:
                continue
            if hashes is None:
                hashes = self._chain(request, r)
            table = r.tables[g.index]
            per_seg = self._lcm // g.block_size
            skip = 0
            if g.window and per_seg > g.contiguous:
                skip = per_seg - g.contiguous  # blocks of a segment no hit can use
            new_hashes, seal = [], []
            for i in range(done, full):
                b = table[i]
                if b == NULL or i % per_seg < skip:
                    continue
                key = self._key(g, hashes, i)
                self._index.setdefault(key, {})[b - 1] = None
                self._key_of[b - 1] = key
                seal.append(b - 1)
                new_hashes.append(key[1])
            if seal:
                self._pool.seal(seal)
            if self.enable_kv_cache_events:
                kind, win = self._event_meta[g.index]
                parent = self._key(g, hashes, done - 1)[1] if done else None
                bs = g.block_size
                self._events.append(stored_event(request, new_hashes, parent, done * bs, full * bs, bs,
                                                 group_idx=g.index, kv_cache_spec_kind=kind,
                                                 kv_cache_spec_sliding_window=win))
            r.cached[g.index] = full
            r.allocated = True

    # --- vLLM's surface -------------------------------------------------------------------------
    def _available(self):
        return self._pool.available

    def get_computed_blocks(self, request):
        if request.request_id in self._reqs:
            raise ValueError("request: %r already holds blocks (free it first)" % (request.request_id,))
        if not self.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
            return self.empty_kv_cache_blocks, 0
        hashes = self._chain(request)
        self._looked_up = (request.request_id, hashes)
        per_group, hit = self._find_hit(hashes, request.num_tokens - 1)
        if self.log_stats:
            self._record_query(request, hit)
        if not any(per_group):
            return self.empty_kv_cache_blocks, hit
        return KVCacheBlocks.of_groups(per_group), hit

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        self._check_counts(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
                           num_external_computed_tokens, num_encoder_tokens)
        n_groups = len(self._groups)
        if new_computed_blocks is None:
            hit = [[] for _ in range(n_groups)]
        else:
            hit = [list(x) for x in new_computed_blocks.get_block_ids()]
            if len(hit) != n_groups:
                raise ValueError("new_computed_blocks: %d groups, the manager has %d" % (len(hit), n_groups))
        rid = request.request_id
        r = self._reqs.get(rid)
        if any(hit):
            self._check_hit(r, hit, num_new_computed_tokens)
        local = _int(request.num_computed_tokens, "request.num_computed_tokens") + num_new_computed_tokens
        total_computed = min(local + num_external_computed_tokens, self.max_model_len)
        free = self._pool.available
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = sum(self._blocks_needed(g, r, full, hit[g.index], total_computed, True) for g in self._groups)
            if need > free:
                return None
        main = total_computed + num_new_tokens
        need_slots = min(main + num_lookahead_tokens, self.max_model_len)
        if r is not None:
            self._remove_skipped(r, total_computed)
        computed = local + num_external_computed_tokens
        need = sum(self._blocks_needed(g, r, need_slots, hit[g.index], computed, False) for g in self._groups)
        if need > self._pool.available:
            return None
        if r is None:
            r = _HReq(n_groups)
            if self._looked_up is not None and self._looked_up[0] == rid:
                r.hashes = self._looked_up[1]
            self._reqs[rid] = r
        self._looked_up = None
        if any(hit) or num_external_computed_tokens > 0:
            if not r.allocated:
                for g in self._groups:
                    table = r.tables[g.index]
                    skipped = g.skipped_tokens(computed) // g.block_size
                    kept = hit[g.index][skipped:]
                    real = [b - 1 for b in kept if b != NULL]
                    if real:
                        self._pool.pin(real)
                    table.extend([NULL] * skipped)  # blocks before the window: the null block
                    table.extend(kept)
                    r.cached[g.index] = len(table)
                    if num_external_computed_tokens > 0:
                        more = _cdiv(computed, g.block_size) - len(table)
                        if more > 0:
                            table.extend(b + 1 for b in self._take(more))
                r.allocated = True
        new = []
        for g in self._groups:
            table = r.tables[g.index]
            more = _cdiv(need_slots, g.block_size) - len(table)
            got = [b + 1 for b in self._take(more)] if more > 0 else []
            table.extend(got)
            new.append(got)
        if self.enable_caching and not delay_cache_blocks:
            self._cache(request, r, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks.of_groups(new) if any(new) else self.empty_kv_cache_blocks

    def _check_hit(self, r, hit, num_new_computed_tokens):
        """Hit blocks as get_computed_blocks gives them, or a ValueError before anything changes."""
        if r is not None and r.allocated:
            raise ValueError("new_computed_blocks: the request is running; a running request has no new hits")
        for g in self._groups:
            ids = hit[g.index]
            if len(ids) * g.block_size != num_new_computed_tokens:
                raise ValueError("new_computed_blocks: group %d has %d blocks of %d tokens for %d computed tokens"
                                 % (g.index, len(ids), g.block_size, num_new_computed_tokens))
            for b in ids:
                if b == NULL:
                    continue
                if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= self._capacity:
                    raise ValueError("new_computed_blocks: block id %r is not one of the pool's" % (b,))
                if self._key_of.get(b - 1, (None,))[0] != g.index:
                    raise ValueError("new_computed_blocks: block %d is not a cached block of group %d" % (b, g.index))

    def _take(self, n):
        ids = self._pool.allocate(n)
        if ids is None:  # the count above said they fit: the pool disagrees
            raise RuntimeError("allocate_slots: the pool refused %d blocks it counted as free" % n)
        self._evictions()
        return ids

    def allocate_slots_batch(self, requests, num_new_tokens):
        """``[allocate_slots(r, n) for r, n in zip(requests, num_new_tokens)]`` (the one-group
        manager's fast decode loop; here each request takes the checked path)."""
        if type(num_new_tokens) is int:
            return [self.allocate_slots(r, num_new_tokens) for r in requests]
        if isinstance(num_new_tokens, (str, bytes)) or not hasattr(num_new_tokens, "__len__"):
            raise TypeError("num_new_tokens: must be an int or a sequence of ints (got %s)"
                            % type(num_new_tokens).__name__)
        if len(num_new_tokens) != len(requests):
            raise ValueError("num_new_tokens: %d counts for %d requests" % (len(num_new_tokens), len(requests)))
        return [self.allocate_slots(r, n) for r, n in zip(requests, num_new_tokens)]

    def free(self, request):
        rid = request.request_id if not isinstance(request, str) else request
        r = self._reqs.pop(rid, None)
        if r is None:
            return
        for g in self._groups:
            ids = [b - 1 for b in reversed(r.tables[g.index]) if b != NULL]
            if ids:
                self._pool.release(ids)

    def remove_skipped_blocks(self, request_id, total_computed_tokens):
        """Blocks that left a sliding window go back to the pool."""
        r = self._reqs.get(request_id)
        if r is not None:
            self._remove_skipped(r, _int(total_computed_tokens, "total_computed_tokens"))
        return None

    def cache_blocks(self, request, num_computed_tokens):
        r = self._reqs.get(request.request_id)
        if r is not None and self.enable_caching:
            self._cache(request, r, min(_int(num_computed_tokens, "num_computed_tokens"), request.num_tokens))

    def reset_prefix_cache(self):
        if self._pool.available != self._capacity:
            return False
        self._hybrid_reset_pool()
        self._note_reset()
        return True

    def get_num_common_prefix_blocks(self, rid):
        r = self._reqs.get(rid)
        out = []
        for g in self._groups:
            if g.window or r is None or not self.enable_caching:
                out.append(0)
                continue
            n = 0
            for b in r.tables[g.index]:
                if b == NULL or self._pool.refcount(b - 1) != len(self._reqs):
                    break
                n += 1
            out.append(n)
        return out

    def get_blocks(self, rid):
        r = self._reqs.get(rid)
        if r is None:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks.of_groups(r.tables)
