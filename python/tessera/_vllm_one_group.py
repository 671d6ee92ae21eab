"""tessera.vllm.KVCacheManager for a model with one KV-cache group: the KV-cache manager surface
vLLM v1's scheduler calls, over a Tessera RequestManager (``OneGroupManager``; the factory
``tessera.vllm.KVCacheManager`` in ``_vllm_manager.py`` builds it, the common part is
``_vllm_kvbase.ManagerBase``).

The surface and its semantics are those of ``vllm/v1/core/kv_cache_manager.py``
(github.com/local-inference-lab/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268, whose v1/core files
equal upstream 9aaf83ef502fc37bc647f6e474314d48ba36cd1c) for a model with one KV-cache group
(DeepSeek-V2/V3/V3.2 MLA; every layer's page of a block shares one block id):

- ``get_computed_blocks(request) -> (blocks, num_computed_tokens)``: the longest cached prefix in
  whole blocks, at most ``request.num_tokens - 1`` tokens (the last prompt token is computed);
  records the prefix-cache stats.
- ``allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
  num_lookahead_tokens=0, ..., full_sequence_must_fit=False) -> blocks | None``: slots for
  ``computed + new + lookahead`` tokens (capped at ``max_model_len``), all or nothing; None when
  the pool cannot hold them (nothing changes). The request's full blocks among its computed and
  new tokens (never past ``request.num_tokens``: drafts are not cached) are cached at once, so a
  request scheduled later in the same step hits them, as in vLLM.
- ``free(request)``: the request's blocks are released, last block first; full blocks stay
  cached (evictable) for later hits.
- ``get_block_ids(request_id)``, ``get_blocks``, ``usage``, ``block_pool.get_num_free_blocks()``,
  ``make_prefix_cache_stats()``, ``reset_prefix_cache()``, ``take_events()``
  (``BlockStored``/``BlockRemoved``/``AllBlocksCleared``), ``get_num_common_prefix_blocks``,
  ``cache_blocks``, ``new_step_starts``, ``take_new_block_ids``.

Block ids are Tessera's pool ids plus one: id 0 is never handed out, as vLLM's null block, so an
engine sizes its paged buffer with ``num_gpu_blocks = capacity + 1``.

How it maps (docs/adr/0024-engine-adapters.md): ``get_computed_blocks`` admits the request into
Tessera with no slots reserved (the hit blocks are pinned, nothing allocated) — by vLLM's own
``request.block_hashes`` when they are 32-byte hashes of its whole blocks
(``_vllm_admit_keyed``, docs/adr/0045-caller-keyed-vllm-admission.md: vLLM's identity per
block, no prompt token read; ``trust_block_hashes=False`` turns it off), else by its tokens
(``admit(prompt, reserve_tokens=0)``); ``allocate_slots`` then checks vLLM's conditions against the pool's
available blocks and reserves and appends in one core call (``_vllm_advance``: full blocks are
sealed and indexed; the tokens of a block still filling wait in the request, so a decode step
inside a block calls nothing: docs/adr/0037-vllm-adapter-speed.md); a refusal releases the
admission. ``allocate_slots_batch`` is the scheduler's decode loop in one call. A scheduler that calls
``get_computed_blocks`` and then not ``allocate_slots`` for that request leaves a pending
admission, released by the next call for any other request. The pool holds no bytes here
(``backed=False``): the KV lives in the engine's buffer.
"""

from . import _core
from ._core import OutOfBlocksError
from ._vllm_common import (KVCacheBlocks, event_classes, extend_chain, identity_salt, scope_salt, stored_event,
                           with_placeholders)
from ._vllm_kvbase import ManagerBase


_ZERO = 0  # allocate_slots' default counts (its decode path compares them by identity)


class _Req:
    __slots__ = ("rid", "salt", "keyed", "hashes", "cached_upto", "skipped", "blocks", "have", "limit", "next_seal")

    # Admitted with `hit` tokens in `hit_blocks` blocks: have and cached_upto until the next advance.
    def __init__(self, rid, salt, keyed, hit, hit_blocks, blocks, read_cache, block_size, max_model_len, track):
        self.rid = rid            # Tessera request id
        self.salt = salt
        self.keyed = keyed        # admitted by vLLM's block_hashes (ADR 0045): its blocks sealed under them
        self.hashes = [] if track else None  # chain hashes of the request's sealed blocks (events only)
        self.cached_upto = hit_blocks  # blocks [0, cached_upto) sealed (the hit blocks are)
        self.skipped = not read_cache  # admitted without reading the cache
        # Blocks in the core's table. The table itself stays in the core (``_vllm_table``): each
        # call that changes it returns what it added, and a list kept per request is host memory
        # every admission would fault in (ADR 0045).
        self.blocks = blocks
        self.have = hit           # tokens appended in the core (a filling block's wait in the request)
        # The decode path's two compares (kept by _sync whenever blocks or cached_upto change):
        room = blocks * block_size
        self.limit = room if room < max_model_len else max_model_len  # tokens the table holds
        self.next_seal = (hit_blocks + 1) * block_size  # tokens at which the next block fills


def _token_list(tokens):
    """The list behind a vLLM ConstantList (its ``_x``: read, never written), else `tokens`: the
    binding reads a list in place, any other Sequence through a copy (a third of admission)."""
    inner = getattr(tokens, "_x", None)
    return inner if type(inner) is list else tokens


class OneGroupManager(ManagerBase):
    """tessera.vllm.KVCacheManager for a model with one KV-cache group (DeepSeek-V2/V3 family),
    over a RequestManager (see the module's doc). ``tessera.vllm.KVCacheManager`` builds it; the
    arguments are vLLM's (``kv_cache_groups`` and ``max_num_batched_tokens`` matter only to the
    hybrid manager: a one-group model has neither windows nor their admission bound).
    ``block_reuse``: "release-order" (default) reuses blocks in the order they were released,
    free or cached alike, as vLLM's free block queue, so that the same cached blocks are evicted
    and the same prefixes hit as in vLLM; "free-first" is Tessera's own order (a cached block is
    evicted only when no free block is left: never fewer cached blocks, and under pressure more
    hits than vLLM).
    """

    def __init__(self, *, hash_block_size=None, max_num_batched_tokens=None, kv_cache_groups=None,
                 trust_block_hashes=True, **common):
        ManagerBase.__init__(self, **common)
        if type(trust_block_hashes) is not bool:
            raise TypeError("trust_block_hashes: must be a bool (got %s)" % type(trust_block_hashes).__name__)
        # Caller keys (ADR 0045): a request whose block_hashes are vLLM's 32-byte hashes of its
        # whole blocks is looked up and sealed by them (vLLM's own semantics: its hasher folds the
        # tokens and every extra key into them); False verifies every prompt token by token.
        self.trust_block_hashes = trust_block_hashes
        self._keyed = trust_block_hashes and self.enable_caching
        self._keyed_seen = False  # a request had 32-byte hashes: prompts without a whole block are keyed too
        if kv_cache_groups is not None:
            raise ValueError("kv_cache_groups: a one-group manager takes none (tessera.vllm.KVCacheManager "
                             "builds the hybrid manager for several groups)")
        if _core._model_layers(self._model)["hybrid"]:  # an unknown preset: the error names the model
            raise ValueError("model: %s has sliding windows (several groups); this adapter serves one group"
                             % self._model)
        block_size = self.block_size
        self._track_hashes = self.enable_kv_cache_events and self.enable_caching  # keys for events only
        if hash_block_size not in (None, block_size):
            raise ValueError("hash_block_size: must equal block_size (one group)")
        self._core = self._new_core()
        self._reqs = {}           # vLLM request id -> _Req (admitted: holds blocks)
        self._pending = None      # (request id, _Req, hit tokens): admitted by get_computed_blocks
        self._block_hash = {}     # block id (vLLM's) -> chain hash of the sealed block (for events)
        self._salt = 0            # caching off: every admission its own salt (no hits, ever)
        self._finish_init()

    def _new_core(self):
        core = _core._engine_request_manager(self._model, block_tokens=self.block_size,
                                             capacity_blocks=self._capacity, max_requests=self._max_requests,
                                             block_reuse=self._block_reuse, caller_keys=self._keyed)
        if core.has_windows:
            raise ValueError("model: %s has sliding windows (several groups); this adapter serves one group"
                             % self._model)
        return core

    # --- helpers -------------------------------------------------------------------------------
    def _release_pending(self, keep=None):
        if self._pending is not None and self._pending[0] != keep:
            self._core.free(self._pending[1].rid)
            self._pending = None

    def _note_new_blocks(self, new):
        """Blocks a call handed the request: a block that was cached before is an eviction."""
        if not self._track_hashes:
            self._new_block_ids.extend(new)
            return
        for b in new:
            self._new_block_ids.append(b)
            h = self._block_hash.pop(b, None)
            if h is not None and self.enable_kv_cache_events:
                self._events.append(event_classes()[1](block_hashes=[h], medium="GPU"))

    def _advance(self, request, r, alloc, upto):
        """One core call: room for `alloc` more tokens (0: none), and the request's tokens up to
        `upto` appended once a block of them is full (sealed: a later request hits it). Tokens
        inside the last block wait in the request (vLLM's tokens are append-only), so a decode
        step inside a block calls nothing. OutOfBlocksError (only when alloc) changes nothing.
        Returns the blocks the call added to the request's table (a list of its own), or None."""
        if r.keyed:
            return self._advance_keyed(request, r, alloc, upto)
        full = upto // self.block_size
        seal = full > r.cached_upto
        if not alloc and not seal:
            return None
        toks = _token_list(request.all_token_ids)[r.have:upto] if seal else None
        try:
            new = self._core._vllm_advance(r.rid, alloc, toks)
        except ValueError:  # vLLM's -1 placeholders (the tokens are read before anything changes)
            if toks is None:
                raise
            new = self._core._vllm_advance(r.rid, alloc, with_placeholders(toks))
        if new:
            r.blocks += len(new)
            self._note_new_blocks(new)
        if seal:
            r.have = upto
            if self._track_hashes:
                self._note_sealed(request, r, full)
            r.cached_upto = full
        self._sync(r)
        return new

    def _advance_keyed(self, request, r, alloc, upto):
        """_advance for a request admitted by its block_hashes (ADR 0045): each block is sealed
        under its hash in ``request.block_hashes``; blocks whose hash is not there yet wait
        unsealed (their tokens in the request) until a later call finds it. The core call returns
        the blocks it added. (The admission's and a block's path: kept to the bone.)"""
        bs = self.block_size
        full = upto // bs
        hashes = request.block_hashes
        if full > len(hashes):
            full = len(hashes)
            upto = full * bs
        seal = full > r.cached_upto
        if seal:
            toks = request.all_token_ids
            toks = getattr(toks, "_x", toks)[r.have:upto]  # a ConstantList's list, read in place
        elif alloc:
            toks = None
        else:
            return None
        try:
            new = self._core._vllm_advance_keyed(r.rid, alloc, toks, hashes)
        except ValueError:  # vLLM's -1 placeholders (read before anything changes)
            if toks is None:
                raise
            new = self._core._vllm_advance_keyed(r.rid, alloc, with_placeholders(toks), hashes)
        if new:
            r.blocks += len(new)
            room = r.blocks * bs
            r.limit = room if room < self.max_model_len else self.max_model_len
            if self._track_hashes:
                self._note_new_blocks(new)
            else:
                self._new_block_ids += new
        if seal:
            r.have = upto
            if self._track_hashes:
                self._note_sealed(request, r, full)
            r.cached_upto = full
            r.next_seal = (full + 1) * bs
        return new

    def _sync(self, r):
        """The decode path's bounds of `r` after its table or its sealed blocks changed."""
        bs = self.block_size
        room = r.blocks * bs
        r.limit = room if room < self.max_model_len else self.max_model_len
        r.next_seal = (r.cached_upto + 1) * bs

    def _note_sealed(self, request, r, full):
        """Events: the keys of the request's newly sealed blocks — vLLM's own ``block_hashes``
        when the request carries them (vLLM's BlockStored names those), else the adapter's chain."""
        bs, first = self.block_size, r.cached_upto
        table = self._core._vllm_table(r.rid)  # events only
        toks = request.all_token_ids
        theirs = getattr(request, "block_hashes", None)
        if theirs is not None and len(theirs) >= full:
            r.hashes.extend(theirs[first:full])
        else:
            extend_chain(r.hashes, toks, bs, full, r.salt)
        new_hashes = r.hashes[first:full]
        for i, h in enumerate(new_hashes, first):
            self._block_hash[table[i]] = h
        self._events.append(stored_event(request, new_hashes, r.hashes[first - 1] if first else None,
                                         first * bs, full * bs, bs))

    def _available(self):
        return self._core.available_blocks

    # --- vLLM's surface ------------------------------------------------------------------------
    def get_computed_blocks(self, request):
        rid = request.request_id
        if rid in self._reqs:
            raise ValueError("request: %r already holds blocks (free it first)" % (rid,))
        if self._pending is not None:
            self._release_pending()
        skip = not self.enable_caching or getattr(request, "skip_reading_prefix_cache", False)
        r, table = self._admit(request, not skip)
        hit = r.have
        if hit and self._track_hashes:
            r.hashes.extend(self._block_hash.get(b) for b in table)
        self._pending = (rid, r, hit)
        if skip:
            return self.empty_kv_cache_blocks, 0
        if self.log_stats:
            self._record_query(request, hit)
        # The core's table after the admission: the hit blocks (no slots reserved yet).
        return KVCacheBlocks.of_list(table) if hit else self.empty_kv_cache_blocks, hit

    def _admit(self, request, read_cache):
        """Admits `request` into the core with no slots reserved: by vLLM's block_hashes when they
        are 32-byte hashes of its whole blocks (ADR 0045; no prompt token crosses), else by its
        tokens. Caching off: a salt of its own (its blocks are never found). A request that skips
        reading the cache (prompt_logprobs) takes no hit, but its full blocks are indexed under its
        identity and stay reusable, as in vLLM. Returns the _Req and its hit blocks (vLLM's ids)."""
        if self._keyed:
            salt = (scope_salt(request) if getattr(request, "cache_salt", None) or getattr(request, "lora_request", None)
                    is not None else 0)
            n = request.num_tokens
            got = self._core._vllm_admit_keyed(getattr(request, "block_hashes", None), n, salt, read_cache,
                                               self._keyed_seen)
            if got is not None:
                if n >= self.block_size:
                    self._keyed_seen = True
                table = got[3]
                return _Req(got[0], salt, True, got[1], got[2], len(table), read_cache, self.block_size,
                            self.max_model_len, self._track_hashes), table
        if self.enable_caching:
            salt = identity_salt(request)
        else:
            self._salt += 1
            salt = self._salt
        toks = _token_list(request.all_token_ids)
        try:
            rid, hit, hit_blocks, table = self._core._vllm_admit(toks, salt, read_cache)
        except ValueError:  # vLLM's -1 placeholders, read as one id (nothing changed on the first try)
            rid, hit, hit_blocks, table = self._core._vllm_admit(with_placeholders(toks), salt, read_cache)
        return _Req(rid, salt, False, hit, hit_blocks, len(table), read_cache, self.block_size, self.max_model_len,
                    self._track_hashes), table

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        # The decode step (vLLM's scheduler: allocate_slots(request, n) for a running request):
        # inside the request's blocks it calls nothing in the core; a full block is one append.
        # The defaults are compared by identity (0 is one object in CPython); any other value,
        # an equal one included, takes the checked path below, so the result never depends on it.
        if (num_lookahead_tokens is _ZERO and num_external_computed_tokens is _ZERO and num_encoder_tokens is _ZERO
                and full_sequence_must_fit is False and type(num_new_tokens) is int and num_new_tokens > 0):
            pending = self._pending
            r = None
            if pending is not None:
                # vLLM's admission: allocate_slots for the request get_computed_blocks just looked
                # up, with the hit it found. One core call: the core refuses (changing nothing)
                # where vLLM's pool would, so the free blocks are not read first.
                if (pending[0] == request.request_id and type(num_new_computed_tokens) is int
                        and num_new_computed_tokens == pending[2]):
                    q = pending[1]
                    total = request.num_computed_tokens + num_new_computed_tokens
                    need = total + num_new_tokens
                    mml = self.max_model_len
                    if total <= mml:
                        if need > mml:
                            need = mml
                        n = request.num_tokens
                        last = 0 if delay_cache_blocks else (total + num_new_tokens if total + num_new_tokens < n else n)
                        more = -(-need // self.block_size) > q.blocks
                        try:
                            new = self._advance(request, q, need - q.have if more and need > q.have else 0, last)
                        except OutOfBlocksError:
                            return self._refuse(True)
                        self._reqs[pending[0]] = q
                        self._pending = None
                        return KVCacheBlocks.of_list(new) if new else self.empty_kv_cache_blocks
            elif num_new_computed_tokens is _ZERO and new_computed_blocks is None:
                r = self._reqs.get(request.request_id)
            if r is not None:
                upto = request.num_computed_tokens + num_new_tokens
                if upto <= r.limit:  # inside the request's blocks (and max_model_len)
                    # A block fills: append up to it (never past the request's own tokens).
                    if upto >= r.next_seal and not delay_cache_blocks:
                        n = request.num_tokens
                        self._advance(request, r, 0, upto if upto < n else n)
                    return self.empty_kv_cache_blocks
                if upto <= self.max_model_len:
                    n = request.num_tokens
                    last = 0 if delay_cache_blocks else (upto if upto < n else n)
                    try:  # a new block: the core refuses (changing nothing) where vLLM's pool would
                        new = self._advance(request, r, upto - r.have, last)
                    except OutOfBlocksError:
                        return None
                    return KVCacheBlocks.of_list(new) if new else self.empty_kv_cache_blocks
        self._check_counts(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
                           num_external_computed_tokens, num_encoder_tokens)
        rid = request.request_id
        self._release_pending(keep=rid)
        r = self._reqs.get(rid)
        fresh = r is None
        if fresh:
            if self._pending is None or self._pending[0] != rid:
                # vLLM allows it: no lookup, so no prefix taken; the blocks are still cached.
                if num_new_computed_tokens:
                    raise ValueError("num_new_computed_tokens: %d, but request %r was not looked up "
                                     "(get_computed_blocks)" % (num_new_computed_tokens, rid))
                self._pending = (rid, self._admit(request, read_cache=False)[0], 0)
            _, r, hit = self._pending
            if num_new_computed_tokens != hit and not (num_new_computed_tokens == 0 and r.skipped):
                raise ValueError("num_new_computed_tokens: %d, but get_computed_blocks found %d"
                                 % (num_new_computed_tokens, hit))
        # A decode step that stays inside the request's last block is one core call (append).
        held = r.blocks
        local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(local + num_external_computed_tokens, self.max_model_len)
        bs = self.block_size
        need_slots = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        more = -(-need_slots // bs) - held
        if more > 0 or full_sequence_must_fit:
            avail = self._core.available_blocks
            if full_sequence_must_fit:
                full = min(request.num_tokens, self.max_model_len)
                if -(-full // bs) - held > avail:
                    return self._refuse(fresh)
            if more > avail:
                return self._refuse(fresh)
        upto = 0 if delay_cache_blocks else min(total_computed + num_new_tokens, request.num_tokens)
        try:
            new = self._advance(request, r, need_slots - r.have if more > 0 and need_slots > r.have else 0, upto)
        except OutOfBlocksError:  # cannot happen after the check above; keep vLLM's contract
            return self._refuse(fresh)
        if fresh:
            self._reqs[rid] = r
            self._pending = None
        return KVCacheBlocks.of_list(new) if new else self.empty_kv_cache_blocks

    def allocate_slots_batch(self, requests, num_new_tokens):
        """``[allocate_slots(r, n) for r, n in zip(requests, num_new_tokens)]`` in one call: the
        decode loop of vLLM's scheduler (``Scheduler.schedule`` calls ``allocate_slots(request,
        num_new_tokens, num_lookahead_tokens=...)`` once per running request; with no lookahead
        this call replaces that loop). ``num_new_tokens``: one int for every request, or one per
        request. A request inside its blocks costs a dict look-up and two compares; any other goes
        through ``allocate_slots`` itself, in order, so the results (blocks, None where the pool
        cannot hold them: nothing changed for that request) are the same. The scheduler preempts
        for a None as it does now, after the batch instead of inside its loop."""
        single = type(num_new_tokens) is int
        if not single:
            if isinstance(num_new_tokens, (str, bytes)) or not hasattr(num_new_tokens, "__len__"):
                raise TypeError("num_new_tokens: must be an int or a sequence of ints (got %s)"
                                % type(num_new_tokens).__name__)
            if len(num_new_tokens) != len(requests):
                raise ValueError("num_new_tokens: %d counts for %d requests" % (len(num_new_tokens), len(requests)))
        out = []
        get, empty = self._reqs.get, self.empty_kv_cache_blocks
        fast = single and num_new_tokens > 0
        n = num_new_tokens
        for i, request in enumerate(requests):
            if not single:
                n = num_new_tokens[i]
                fast = type(n) is int and n > 0
            r = get(request.request_id) if fast and self._pending is None else None
            if r is not None:
                upto = request.num_computed_tokens + n
                if upto <= r.limit:
                    if upto >= r.next_seal:  # a block fills (never past the request's tokens)
                        nt = request.num_tokens
                        self._advance(request, r, 0, upto if upto < nt else nt)
                    out.append(empty)
                    continue
            out.append(self.allocate_slots(request, n))
        return out

    def _refuse(self, fresh):
        if fresh and self._pending is not None:
            self._core.free(self._pending[1].rid)
            self._pending = None
        return None

    def free(self, request):
        rid = request.request_id if not isinstance(request, str) else request
        self._release_pending()
        r = self._reqs.pop(rid, None)
        if r is None:
            return
        self._core.free(r.rid)

    def reset_prefix_cache(self):
        self._release_pending()
        if self._core.available_blocks != self._capacity or self._reqs:
            return False
        self._core = self._new_core()
        self._block_hash.clear()
        self._note_reset()
        return True

    def get_num_common_prefix_blocks(self, running_request_id):
        r = self._reqs.get(running_request_id)
        if r is None:
            return [0]
        return [self._core._vllm_common_prefix_blocks(r.rid, [q.rid for q in self._reqs.values()])]

    def get_blocks(self, request_id):
        r = self._reqs.get(request_id)
        return KVCacheBlocks.of_list(self._core._vllm_table(r.rid)) if r is not None else self.empty_kv_cache_blocks

    def cache_blocks(self, request, num_computed_tokens):
        r = self._reqs.get(request.request_id)
        if r is not None and self.enable_caching:
            self._advance(request, r, 0, min(num_computed_tokens, request.num_tokens))

    def new_step_starts(self):
        self._release_pending()
