"""What tessera.vllm's two KV-cache managers share (docs/PYTHON.md, "Engine adapters"): the
constructor's common arguments and their checks, the block pool view a scheduler reads, the
prefix-cache stats, the KV events and the count checks of ``allocate_slots``' checked path.

``tessera.vllm.KVCacheManager`` (``_vllm_manager.py``) is the factory vLLM's scheduler calls; it
builds a ``OneGroupManager`` (``_vllm_one_group.py``: one KV-cache group over a RequestManager) or
a ``HybridManager`` (``_vllm_hybrid.py``: several groups over one block pool, ADR 0028), both
``ManagerBase`` subclasses. The modules import downwards only: common <- kvbase <- one group,
hybrid <- manager.
"""

from ._vllm_common import KVCacheBlocks, PrefixCacheStats, _int, event_classes


class _BlockPoolView:
    """The parts of vLLM's BlockPool a scheduler reads."""

    def __init__(self, owner):
        self._o = owner

    @property
    def num_gpu_blocks(self):
        return self._o._capacity + 1

    def get_num_free_blocks(self):
        return self._o._available()

    def get_usage(self):
        return self._o.usage


class ManagerBase:
    """The common part of tessera.vllm.KVCacheManager's two kinds. A subclass sets
    ``num_kv_cache_groups`` before calling ``__init__`` (it sizes the empty blocks) and gives
    ``_available()`` (the pool's free blocks, cached ones included) and vLLM's per-kind methods."""

    num_kv_cache_groups = 1

    def __init__(self, *, num_gpu_blocks, block_size, max_model_len, model="deepseek-v3", enable_caching=True,
                 log_stats=False, enable_kv_cache_events=False, max_requests=None, use_eagle=False,
                 dcp_world_size=1, pcp_world_size=1, block_reuse="release-order"):
        _int(num_gpu_blocks, "num_gpu_blocks", 2)
        _int(block_size, "block_size", 1)
        _int(max_model_len, "max_model_len", 1)
        if use_eagle:
            raise ValueError("use_eagle: EAGLE's dropped last hit block is not modelled (use False)")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("dcp_world_size: context parallelism is not modelled (use 1)")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.log_stats = bool(log_stats)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self._capacity = num_gpu_blocks - 1
        if not isinstance(model, str):
            raise TypeError("model: must be a str (got %s)" % type(model).__name__)
        if block_reuse not in ("release-order", "free-first"):
            raise ValueError("block_reuse: must be 'release-order' (vLLM's) or 'free-first' (got %r)" % (block_reuse,))
        self._model = model
        self._block_reuse = block_reuse
        self._max_requests = max_requests if max_requests is not None else max(64, self._capacity)
        self.block_pool = _BlockPoolView(self)
        self.prefix_cache_stats = PrefixCacheStats() if self.log_stats else None
        self._events = []
        self._new_block_ids = []

    def _finish_init(self):
        """After the subclass set num_kv_cache_groups: the empty blocks of that many groups."""
        self.empty_kv_cache_blocks = KVCacheBlocks.of_groups([[] for _ in range(self.num_kv_cache_groups)])

    def _available(self):
        raise NotImplementedError

    @staticmethod
    def _check_counts(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_external_computed_tokens,
                      num_encoder_tokens):
        """allocate_slots' checked path: the counts, before anything changes. Plain ints in range
        pass on one compare each; anything else goes through ``_int``, which names the argument."""
        if (type(num_new_tokens) is int and type(num_new_computed_tokens) is int
                and type(num_lookahead_tokens) is int and type(num_external_computed_tokens) is int
                and num_new_tokens >= 0 and num_new_computed_tokens >= 0 and num_lookahead_tokens >= 0
                and num_external_computed_tokens >= 0 and not num_encoder_tokens
                and (num_new_tokens or num_external_computed_tokens)):
            return
        _int(num_new_tokens, "num_new_tokens")
        _int(num_new_computed_tokens, "num_new_computed_tokens")
        _int(num_lookahead_tokens, "num_lookahead_tokens")
        _int(num_external_computed_tokens, "num_external_computed_tokens")
        if num_encoder_tokens:
            raise ValueError("num_encoder_tokens: encoder-decoder models are not modelled")
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no external computed tokens")

    def _record_query(self, request, hit):
        """A lookup's query and hits in the stats (the caller checks log_stats)."""
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=hit,
                                           preempted=getattr(request, "num_preemptions", 0) > 0)

    def _note_reset(self):
        """What a reset says, for one group or several: the event, and the stats' flag."""
        if self.enable_kv_cache_events:
            self._events.append(event_classes()[2]())
        if self.log_stats:
            self.prefix_cache_stats.reset = True

    # --- vLLM's surface, the same for both kinds ------------------------------------------------
    @property
    def usage(self):
        return 1.0 - self._available() / self._capacity

    def make_prefix_cache_stats(self):
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def evict_blocks(self, block_ids):
        raise NotImplementedError("evict_blocks: Tessera evicts by LRU only")

    def take_events(self):
        ev, self._events = self._events, []
        return ev

    def get_block_ids(self, request_id):
        return self.get_blocks(request_id).get_block_ids()

    def create_kv_cache_blocks(self, blocks):
        if len(blocks) != self.num_kv_cache_groups:
            raise ValueError("blocks: %d groups, the manager has %d" % (len(blocks), self.num_kv_cache_groups))
        return KVCacheBlocks.of_groups(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self):
        ids, self._new_block_ids = self._new_block_ids, []
        return ids

    def remove_skipped_blocks(self, request_id, total_computed_tokens):
        return None  # full attention: nothing is skipped

    def new_step_starts(self):
        return None
