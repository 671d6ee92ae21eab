"""tessera.vllm.TesseraConnector: a vLLM v1 KV connector over Tessera's tiers.

vLLM's v1 connector API (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``, read at
github.com/local-inference-lab/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268, upstream 9aaf83ef)
splits a connector in two roles. The scheduler side decides what to load and save:
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``,
``request_finished``. The worker side moves page bytes between vLLM's paged KV buffers and the
store: ``register_kv_caches``, ``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``,
``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors``.

When vLLM is importable the class subclasses vLLM's ``KVConnectorBase_V1`` and ``SupportsHMA``, so
that vLLM's ``KVConnectorFactory`` loads it from ``kv_connector_module_path="tessera.vllm"``;
otherwise it subclasses a stand-in with the same methods and vLLM's role enum (tests).

One record per full block holds the block's page in every registered layer; its tier key is a
keyed hash of the parent block's key and the block's tokens (a prefix chain), rooted in the
model's identity (name, weights revision), the tenant, the namespace and the request's own
scope (cache_salt, LoRA adapter) with the multimodal inputs each block overlaps; the record
carries the parent key, the tokens and the layout (layer names, page bytes), all checked before a
byte reaches the paged buffer (docs/ENGINES.md, "Engine doors"; ADR 0030).
"""

import collections
import hashlib
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import _engine_config, _records
from ._vllm_common import _int, chain_hash, event_classes, request_scope

try:  # vLLM's own base classes when vLLM is importable
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1 as _Base,
        KVConnectorMetadata as _MetaBase,
        KVConnectorRole,
        SupportsHMA as _HMA,
    )
    HAVE_VLLM = True
except Exception:  # noqa: BLE001  (vLLM absent or not importable here: the stand-in)
    HAVE_VLLM = False
    from ._vllm_base import KVConnectorBase_V1 as _Base  # noqa: F401
    from ._vllm_base import KVConnectorMetadata as _MetaBase
    from ._vllm_base import KVConnectorRole
    from ._vllm_base import SupportsHMA as _HMA

try:  # vLLM's container of a connector's KV events (worker -> scheduler, KVConnectorOutput.kv_cache_events)
    from vllm.distributed.kv_events import KVConnectorKVEvents as _EventsBase  # type: ignore
except Exception:  # noqa: BLE001
    _EventsBase = object

try:  # vLLM's stats base class (a dataclass with `data`)
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats as _StatsBase  # type: ignore
except Exception:  # noqa: BLE001
    _StatsBase = None

STAT_NAMES = ("matched_blocks", "loaded_blocks", "saved_blocks", "load_errors", "save_failures")


class _StandInStats:
    def __init__(self, data=None):
        self.data = dict(data or {})


@dataclass
class TesseraConnectorStats(_StatsBase or _StandInStats):
    """The connector's counters for one interval, as vLLM's KVConnectorStats: `data` holds one int
    per counter; aggregate sums, reduce gives the sums, is_empty is all zero. vLLM's scheduler
    aggregates the workers' (and KVConnectorLogging rebuilds them with build_kv_connector_stats),
    which the base class leaves unimplemented."""
    data: dict = field(default_factory=dict)

    def reset(self):
        self.data = {k: 0 for k in STAT_NAMES}

    def aggregate(self, other):
        for k, v in (getattr(other, "data", None) or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


ROLE_SCHEDULER = KVConnectorRole.SCHEDULER
ROLE_WORKER = KVConnectorRole.WORKER
MEDIUM = "TESSERA"  # BlockStored/BlockRemoved.medium of the blocks the connector stores in Tessera's tiers


class TesseraKVEvents(_EventsBase):
    """The KV events of the workers' connectors for one step, as vLLM's KVConnectorKVEvents: the
    worker returns one from get_kv_connector_kv_cache_events, vLLM's output aggregator merges the
    workers' (add_events + increment_workers), and the scheduler's connector takes them in
    update_connector_output and yields them from take_events. aggregate keeps the events every
    worker emitted, once (each TP rank of an MLA model stores the same blocks)."""

    def __init__(self, num_workers=1, events=()):
        self._events = list(events)
        self._workers = num_workers

    def add_events(self, events):
        self._events.extend(events)

    def aggregate(self):
        seen = collections.Counter(repr(e) for e in self._events)
        out, kept = [], set()
        for e in self._events:
            k = repr(e)
            if seen[k] >= self._workers and k not in kept:
                kept.add(k)
                out.append(e)
        self._events, self._workers = out, 1
        return self

    def increment_workers(self, count=1):
        self._workers += count

    def get_all_events(self):
        return list(self._events)

    def get_number_of_workers(self):
        return self._workers

    def clear_events(self):
        self._events, self._workers = [], 1

    def merge(self, other):
        self.add_events(other.get_all_events())
        return self


class _Mover:
    """A thread that moves pages between the paged buffers and the tiers off the forward path.
    Jobs run in the order submitted; each names the requests whose blocks it reads or writes, so
    that `busy`/`wait` can tell when a request's blocks are no longer touched."""

    def __init__(self):
        self._pool = None
        self._cv = threading.Condition()
        self._pending = collections.Counter()  # request id -> jobs queued or running
        self._closed = False

    def submit(self, fn, req_ids):
        req_ids = tuple(req_ids)
        with self._cv:
            if self._closed:
                raise RuntimeError("the connector was shut down")
            for r in req_ids:
                self._pending[r] += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-kv")
            return self._pool.submit(self._run, fn, req_ids)

    def _run(self, fn, req_ids):
        try:
            return fn()
        finally:
            with self._cv:
                for r in req_ids:
                    self._pending[r] -= 1
                    if not self._pending[r]:
                        del self._pending[r]
                self._cv.notify_all()

    def busy(self, req_id):
        with self._cv:
            return req_id in self._pending

    def wait(self, req_ids=None):
        """Until no job of `req_ids` (None: any job) is queued or running."""
        with self._cv:
            if req_ids is None:
                self._cv.wait_for(lambda: not self._pending)
            else:
                ids = set(req_ids)
                self._cv.wait_for(lambda: not ids.intersection(self._pending))

    def close(self):
        """Runs every queued job, then stops the thread; later submissions are refused."""
        with self._cv:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


@dataclass
class BlockTransfer:
    """One block to load or save: the request, the block's index in the request, its block id
    in the paged buffer, its tier key, its parent's key and its tokens."""
    req_id: str
    index: int
    block_id: int
    key: bytes
    parent: bytes
    tokens: tuple
    lora_id: object = None    # for the BlockStored event
    lora_name: object = None


@dataclass
class ConnectorMetadata(_MetaBase):
    """What the scheduler side hands the worker side for one step (a KVConnectorMetadata).
    ``async_loads``: the requests whose loads the worker completes in start_load_kv and reports
    through get_finished (vLLM's asynchronous load). ``preempted``: the requests vLLM preempted
    this step (their blocks are freed: handle_preemptions waits for their saves). ``freed_on_recv``:
    requests that finished while vLLM waited for their asynchronous load; vLLM frees them on
    finished_recving, so the worker never reports them sent (vLLM would free them twice)."""
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    async_loads: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    freed_on_recv: list = field(default_factory=list)


@dataclass
class _ReqState:
    request: object
    keys: list
    block_ids: list = field(default_factory=list)
    saved: int = 0          # blocks [0, saved) are in the store (loaded, saved or scheduled to save)
    pending_load: list = field(default_factory=list)
    local_tokens: int = 0   # tokens the engine's own prefix cache had (get_num_new_matched_tokens)
    loading: bool = False   # an asynchronous load is scheduled or running
    save_scheduled: bool = False  # an asynchronous save was handed to the worker (request_finished delays the free)


def _role_of(role):
    if isinstance(role, KVConnectorRole):
        return role
    name = str(getattr(role, "name", role)).upper()
    if name.startswith("KV_"):
        name = name[3:]
    for r in KVConnectorRole:
        if r.name == name:
            return r
    raise ValueError("role: must be KVConnectorRole.SCHEDULER or .WORKER (got %r)" % (role,))


def _block_ids_of(blocks):
    if hasattr(blocks, "get_block_ids"):
        ids = blocks.get_block_ids()
        return list(ids[0]) if ids else []
    if isinstance(blocks, (list, tuple)):
        if blocks and isinstance(blocks[0], (list, tuple)):
            return list(blocks[0])
        return list(blocks)
    raise TypeError("blocks: must be KVCacheBlocks or a list of block ids (got %s)" % type(blocks).__name__)


def _mm_in_block(request, start, end):
    """The multimodal inputs (hash, offset, length) whose placeholder tokens overlap [start, end)."""
    out = []
    for f in getattr(request, "mm_features", None) or ():
        pos = getattr(f, "mm_position", None)
        ident = getattr(f, "mm_hash", None) or getattr(f, "identifier", None)
        if pos is None or ident is None:
            continue
        off, n = int(pos.offset), int(pos.length)
        if off < end and off + n > start:
            out.append((str(ident), off, n))
    return out


def _is_cuda(t):
    """A tensor on a CUDA device (torch's ``is_cuda``): its pages go through Tessera's CUDA module."""
    return getattr(t, "is_cuda", False) is True


def _new_cuda_staging(device, staging_bytes):
    """Tessera's CUDA module's device <-> pinned host staging (tessera._core.CudaStaging)."""
    from . import _core
    return _core.CudaStaging(device, staging_bytes)


def _cuda_built():
    from . import _core
    return bool(getattr(_core, "CUDA_BUILT", False))


def _stage_cuda_caches(cuda, pages):
    """{layer: (CudaStaging, region)} for the CUDA tensors `cuda` (layer -> tensor), one staging
    buffer per device; ValueError naming the tensor when Tessera's CUDA module is not built or
    cannot reach the tensor's device. Pages are never copied through torch (.cpu(), .numpy())."""
    out, staging = {}, {}
    for name in sorted(cuda):
        arr = cuda[name]
        where = "kv_caches[%r] (a CUDA tensor on %s)" % (name, arr.device)
        if not _cuda_built():
            raise ValueError("%s: this Tessera was built without its CUDA module (nvcc not found), and CUDA "
                             "pages are never copied through torch" % where)
        dev = getattr(arr.device, "index", None) or 0
        try:
            if dev not in staging:
                big = max(pages[n] for n in cuda if (getattr(cuda[n].device, "index", None) or 0) == dev)
                staging[dev] = _new_cuda_staging(dev, max(2 * big, 1 << 16))
            region = staging[dev].add(arr.data_ptr(), arr.shape[0] * pages[name], name)
        except ValueError as e:
            raise ValueError("%s: Tessera's CUDA module cannot stage it: %s" % (where, e)) from None
        out[name] = (staging[dev], region)
    return out


def _as_torch_page(cache, block_id):
    """The bytes of one block of a torch KV cache (any dtype, any device) as a flat uint8 tensor view."""
    import torch
    return cache[block_id].reshape(-1).view(torch.uint8)


class TesseraConnector(_Base, _HMA):
    """vLLM's KVConnectorBase_V1 (and SupportsHMA) over Tessera's tiers.

    vLLM constructs it as ``TesseraConnector(vllm_config, role, kv_cache_config)``. Read from
    ``vllm_config``: the block size (``cache_config.block_size``), the model's identity
    (``model_config.model``, ``model_config.revision``) and ``kv_transfer_config.kv_connector_extra_config``:
    ``tessera_tiers`` (a list of tier dicts: host, disk, redis, redis_cluster), the secret as
    ``tessera_secret_file`` or ``tessera_secret_env`` (or ``tessera_secret``), ``tessera_tenant``,
    ``tessera_namespace``, ``tessera_revision`` (overrides the model's), ``tessera_async_load`` and
    ``tessera_async_save``.
    Outside vLLM the keyword arguments give the same (``block_size``, ``tiers``, ``secret``, ``model``,
    ``tenant``...). One object may serve both roles (tests).
    """

    def __init__(self, vllm_config=None, role=ROLE_SCHEDULER, kv_cache_config=None, *, block_size=None,
                 tiers=None, secret=None, namespace=None, model=None, revision=None, tenant=None,
                 async_load=None, async_save=None):
        role = _role_of(role)
        if vllm_config is not None and getattr(vllm_config, "kv_transfer_config", None) is not None:
            _Base.__init__(self, vllm_config, role, kv_cache_config)
        else:  # outside vLLM: the base's state, set by hand
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_cache_config = kv_cache_config
            self._role = role
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = (getattr(ktc, "kv_connector_extra_config", None) or {}) if ktc is not None else {}
        if not isinstance(extra, dict):
            raise ValueError("kv_connector_extra_config: must be a JSON object")
        _engine_config.unknown_keys(extra, _engine_config.KEYS)
        if block_size is None and vllm_config is not None:
            block_size = vllm_config.cache_config.block_size
        self.block_size = _int(block_size, "block_size", 1, 1 << 16)
        mc = getattr(vllm_config, "model_config", None)
        if model is None:
            model = getattr(mc, "model", None) or ""
        if revision is None:
            revision = _engine_config.name_field(extra, "tessera_revision", getattr(mc, "revision", None) or "")
        if tenant is None:
            tenant = _engine_config.name_field(extra, "tessera_tenant", "")
        if namespace is None:
            namespace = _engine_config.name_field(extra, "tessera_namespace", "vllm")
        for arg, v in (("model", model), ("revision", revision), ("tenant", tenant), ("namespace", namespace)):
            if not isinstance(v, str) or len(v) > 1024:
                raise ValueError("%s: must be a str of at most 1024 characters (got %r)" % (arg, v))
        if not namespace:
            raise ValueError("namespace: must not be empty")
        if async_load is None:
            async_load = extra.get("tessera_async_load", False)
        if not isinstance(async_load, bool):
            raise ValueError("tessera_async_load: must be true or false (got %r)" % (async_load,))
        self.async_load = async_load
        if async_save is None:
            async_save = extra.get("tessera_async_save", False)
        if not isinstance(async_save, bool):
            raise ValueError("tessera_async_save: must be true or false (got %r)" % (async_save,))
        self.async_save = async_save
        self._secret = _engine_config.secret_from(extra, secret)
        self._tiers = _engine_config.tiers_from(extra.get("tessera_tiers") if tiers is None else tiers, self._secret,
                                               "tessera_tiers" if tiers is None else "tiers")
        self.identity = {"model": model, "revision": revision, "tenant": tenant, "namespace": namespace}
        # The scope: every field whole (length-prefixed, hashed), never cut (issue 27 points 4-5).
        self._scope = _engine_config.scope("vllm-connector", model, revision, tenant, namespace)
        self._domain = b"tessera-vllm-kv"
        self._reqs = {}
        self._metadata = None
        self._gpu_block_pool = None
        self._new_requests = 0
        self._sched_events = None  # TesseraKVEvents from the workers, until take_events
        # Worker side.
        self._layers = []
        self._caches = {}
        self._cuda_pages = {}      # layer -> (CudaStaging, region) for CUDA caches
        self._page_bytes = {}
        self._staged_loads = {}   # (req, index) -> (transfer, body memoryview)
        self._staged_saves = {}   # (req, index) -> [page bytes per layer]
        self._load_errors = set()
        self._lock = threading.Lock()  # the worker's state shared with the mover thread
        self._loader = _Mover()  # loads: never queued behind a save
        self._saver = _Mover()
        self._read_job = None      # the sync loads' tier read of this step (start_load_kv)
        self._save_layers = {}     # async saves: layer name -> the kv_layer given to save_kv_layer
        self._saving = set()       # requests with asynchronous saves (reported sent once finished and idle)
        self._finished_seen = set()  # of those, the ones vLLM said finished
        self._freed_on_recv = set()  # finished while their async load ran: reported received only
        self._recv_held = set()    # of those, loaded but with saves still running
        self._loads_done = []      # (request ids, load error block ids) of finished async loads
        self._worker_events = []   # BlockStored/BlockRemoved since get_kv_connector_kv_cache_events
        self.stats = {k: 0 for k in STAT_NAMES}
        self._stats_reported = {}

    def _count(self, name, n=1):
        with self._lock:
            self.stats[name] += n

    # --- keys -------------------------------------------------------------------------------------
    def _root_for(self, request):
        scope = _engine_config.scope("request", *request_scope(request))
        return _records.tier_key(self._secret, self._domain, b"root" + scope + self._scope)

    def _keys_for(self, request):
        tokens = request.all_token_ids
        n = len(tokens) // self.block_size
        st = self._reqs.get(request.request_id)
        if st is None or len(st.keys) > n or st.request is not request:
            st = _ReqState(request=request, keys=[])
            self._reqs[request.request_id] = st
        if len(st.keys) < n:
            st.keys += self._chain_from(request, tokens, st.keys, n)
        return st

    def _chain_from(self, request, tokens, have, n):
        bs = self.block_size
        parent = have[-1] if have else self._root_for(request)
        out = []
        for b in range(len(have), n):
            blk = tokens[b * bs:(b + 1) * bs]
            mm = _mm_in_block(request, b * bs, (b + 1) * bs)
            extra = _engine_config.scope("mm", *("%s@%d+%d" % m for m in mm)) if mm else b""
            # The tier key: the adapters' one BLAKE2b chain, keyed (as _records.tier_key).
            key = chain_hash(parent, blk, extra, key=self._secret[:64], person=self._domain[:16])
            out.append(key)
            parent = key
        return out

    def _parent(self, st, i):
        return st.keys[i - 1] if i else self._root_for(st.request)

    # --- scheduler side --------------------------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool):
        """vLLM's scheduler hands its BlockPool at start; kept, not used (keys are Tessera's own)."""
        self._gpu_block_pool = gpu_block_pool

    def on_new_request(self, request):
        self._new_requests += 1

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens beyond `num_computed_tokens` the tiers hold for this prompt, load is async): the
        longest run of the prompt's whole blocks held, capped (as vLLM's own prefix cache) so
        that the last prompt token is computed."""
        _int(num_computed_tokens, "num_computed_tokens")
        st = self._keys_for(request)
        if st.loading:  # vLLM asks again after an asynchronous load finished
            return 0, False
        limit = max(0, (request.num_tokens - 1) // self.block_size)
        keys = st.keys[:limit]
        first = num_computed_tokens // self.block_size
        st.local_tokens = num_computed_tokens
        held = self._tiers.contains(keys[first:]) if first < len(keys) else []
        n = first
        for h in held:
            if not h:
                break
            n += 1
        matched = n * self.block_size
        ext = max(0, matched - num_computed_tokens)
        self._count("matched_blocks", ext // self.block_size)
        return ext, bool(self.async_load and ext)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Records the blocks the scheduler allocated; with external tokens, the blocks to load
        into (those after the locally computed ones)."""
        st = self._keys_for(request)
        st.block_ids = _block_ids_of(blocks)
        if num_external_tokens:
            if num_external_tokens % self.block_size:
                raise ValueError("num_external_tokens: must be whole blocks of %d" % self.block_size)
            n_ext = num_external_tokens // self.block_size
            start = st.local_tokens // self.block_size
            if start + n_ext > len(st.keys) or start + n_ext > len(st.block_ids):
                raise ValueError("num_external_tokens: %d tokens past the request's blocks" % num_external_tokens)
            st.pending_load = list(range(start, start + n_ext))
            st.saved = max(st.saved, start + n_ext)
            st.loading = self.async_load

    def build_connector_meta(self, scheduler_output):
        """The loads decided since the last call and the saves of blocks this step completes.
        Reads vLLM's SchedulerOutput: ``scheduled_new_reqs`` (req_id, block_ids,
        num_computed_tokens), ``scheduled_cached_reqs`` (req_ids, new_block_ids,
        num_computed_tokens) and ``num_scheduled_tokens``; it does not modify it."""
        meta = ConnectorMetadata()
        meta.freed_on_recv, self._freed_on_recv = self._freed_on_recv, []
        for st in self._reqs.values():
            for i in st.pending_load:
                meta.loads.append(self._transfer(st, i))
            if st.pending_load and st.loading:
                meta.async_loads.append(st.request.request_id)
            st.pending_load = []
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            meta.preempted.append(rid)
            st = self._reqs.get(rid)
            if st is not None:  # vLLM freed its blocks; a resumed request gets all of them anew
                st.block_ids = []
        sched = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        computed = {}
        for nr in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            computed[nr.req_id] = nr.num_computed_tokens
            st = self._reqs.get(nr.req_id)
            if st is not None:
                st.block_ids = _block_ids_of(nr.block_ids)
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = getattr(cached, "resumed_req_ids", None) or ()
            for j, rid in enumerate(cached.req_ids):
                computed[rid] = cached.num_computed_tokens[j]
                st = self._reqs.get(rid)
                nb = cached.new_block_ids[j]
                if st is not None and nb is not None:
                    st.block_ids = (st.block_ids if rid not in resumed else []) + _block_ids_of(nb)
        for rid, done in computed.items():
            st = self._reqs.get(rid)
            if st is None:
                continue
            r = st.request
            upto = min(done + sched.get(rid, 0), r.num_tokens) // self.block_size
            self._keys_for(r)
            upto = min(upto, len(st.keys), len(st.block_ids))
            for i in range(st.saved, upto):
                meta.saves.append(self._transfer(st, i))
                st.save_scheduled = st.save_scheduled or self.async_save
            st.saved = max(st.saved, upto)
        return meta

    def _transfer(self, st, i):
        r, bs = st.request, self.block_size
        lora = getattr(r, "lora_request", None)
        return BlockTransfer(r.request_id, i, st.block_ids[i], st.keys[i], self._parent(st, i),
                             tuple(r.all_token_ids[i * bs:(i + 1) * bs]),
                             getattr(lora, "lora_int_id", None) if lora is not None else None,
                             getattr(lora, "lora_name", None) if lora is not None else None)

    def update_connector_output(self, connector_output):
        """vLLM's KVConnectorOutput of a step: the requests whose asynchronous loads finished, and
        the workers' KV events (``kv_cache_events``, merged by vLLM's output aggregator)."""
        for rid in getattr(connector_output, "finished_recving", None) or ():
            st = self._reqs.get(rid)
            if st is not None:
                st.loading = False
        ev = getattr(connector_output, "kv_cache_events", None)
        if ev is not None and hasattr(ev, "get_all_events"):
            if self._sched_events is None:
                self._sched_events = TesseraKVEvents(ev.get_number_of_workers(), ev.get_all_events())
            else:
                self._sched_events.add_events(ev.get_all_events())
                self._sched_events.increment_workers(ev.get_number_of_workers())

    def request_finished(self, request, block_ids):
        """Forgets the request. (True, None) when asynchronous saves of its blocks were handed to
        the worker: vLLM keeps the blocks until get_finished reports the request sent. Else
        (False, None): synchronous saves are written in wait_for_save, so vLLM frees at once."""
        st = self._reqs.pop(request.request_id, None)
        if st is not None and st.loading:
            # vLLM's finish_requests delays a WAITING_FOR_REMOTE_KVS request itself and frees it on
            # finished_recving; a finished_sending too would free it twice (a request saved, then
            # preempted and admitted again through an asynchronous load): the worker is told to
            # report it received only.
            self._freed_on_recv.append(request.request_id)
            return False, None
        return bool(st is not None and st.save_scheduled), None

    def request_finished_all_groups(self, request, block_ids):
        """SupportsHMA: the same for every KV-cache group's blocks."""
        return self.request_finished(request, block_ids)

    def take_events(self):
        """The workers' KV events since the last call, each once however many TP workers emitted
        it: BlockStored for every block the connector stored in the tiers (block_hashes: the
        block's tier key; parent_block_hash: its parent's, None for a request's first block;
        medium "TESSERA"), BlockRemoved for every block a load found missing or failing its
        checks. vLLM's own event classes when vLLM is importable."""
        ev, self._sched_events = self._sched_events, None
        return ev.aggregate().get_all_events() if ev is not None else []

    def reset_cache(self):
        """vLLM's reset_prefix_cache: forgets what this connector tracks, except requests whose
        asynchronous saves vLLM still waits for; the tiers' records stay (another engine of the
        fleet may be reading them). True."""
        self._reqs = {r: st for r, st in self._reqs.items() if st.save_scheduled}
        return True

    # --- worker side -----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        """vLLM's paged buffers, layer name -> tensor [num_blocks, block_size, ...] of any dtype
        (bf16 for the default MLA cache, uint8 for fp8_ds_mla, V4's per-group caches with their
        own page sizes), on the CPU or a CUDA device; numpy arrays too. Pages are moved as bytes:
        nothing is converted. A CUDA tensor (``is_cuda``) is staged device <-> pinned host through
        Tessera's CUDA module (tessera._core.CudaStaging over the tensor's memory, never indexed,
        ``.cpu()``-copied or ``.numpy()``-read); without that module or without a device it is a
        ValueError naming the tensor, and nothing is registered."""
        if not isinstance(kv_caches, dict) or not kv_caches:
            raise TypeError("kv_caches: must be a non-empty dict of layer name -> tensor")
        caches, pages, cuda = {}, {}, {}
        for name, arr in kv_caches.items():
            if not isinstance(name, str):
                raise TypeError("kv_caches: layer names must be str")
            is_torch = type(arr).__module__.startswith("torch")
            if not hasattr(arr, "shape") or len(arr.shape) < 2:
                raise ValueError("kv_caches[%r]: must be a tensor [num_blocks, block_size, ...]" % name)
            if arr.shape[1] != self.block_size:
                raise ValueError("kv_caches[%r]: block dimension %d is not block_size %d" % (name, arr.shape[1],
                                                                                           self.block_size))
            if _is_cuda(arr):  # never indexed nor copied here: staged through the CUDA module
                if not arr.is_contiguous():
                    raise ValueError("kv_caches[%r]: must be contiguous" % name)
                p = arr.numel() // arr.shape[0] * arr.element_size()
                cuda[name] = arr
            elif is_torch:
                if not arr.is_contiguous():
                    raise ValueError("kv_caches[%r]: must be contiguous" % name)
                p = arr[0].numel() * arr.element_size()
            else:
                if not arr.flags.c_contiguous or not arr.flags.writeable:
                    raise ValueError("kv_caches[%r]: must be C-contiguous and writable" % name)
                p = arr[0].nbytes
            caches[name] = arr
            pages[name] = p
        self._cuda_pages = _stage_cuda_caches(cuda, pages)  # before anything changes
        self._caches = caches
        self._layers = sorted(caches)
        self._page_bytes = pages
        desc = struct.pack("<I", self.block_size) + b"".join(
            struct.pack("<IQ", len(n.encode()), pages[n]) + n.encode() for n in self._layers)
        self._layout = hashlib.blake2b(desc, digest_size=16).digest()
        self._offsets = {}
        off = 0
        for n in self._layers:
            self._offsets[n] = off
            off += pages[n]
        self._body_bytes = off

    def bind_connector_metadata(self, connector_metadata):
        if not isinstance(connector_metadata, ConnectorMetadata):
            raise TypeError("connector_metadata: must be ConnectorMetadata")
        self._metadata = connector_metadata
        self._connector_metadata = connector_metadata
        if connector_metadata.freed_on_recv:
            with self._lock:
                self._freed_on_recv |= set(connector_metadata.freed_on_recv)

    def clear_connector_metadata(self):
        self._collect_read()
        self._metadata = None
        self._connector_metadata = None
        self._staged_loads = {}
        self._save_layers = {}

    def has_connector_metadata(self):
        return self._metadata is not None

    def _identity(self, t):
        return self._layout + t.parent + struct.pack("<%dI" % len(t.tokens), *t.tokens)

    def _meta(self):
        if self._metadata is None:
            raise RuntimeError("no connector metadata bound (bind_connector_metadata first)")
        if not self._caches:
            raise RuntimeError("no KV caches registered (register_kv_caches first)")
        return self._metadata

    def start_load_kv(self, forward_context=None, **kwargs):
        """Hands this step's loads to the mover thread and returns. Synchronous loads: the thread
        reads and checks the records; wait_for_layer_load copies each layer's pages (the first
        call waits for the read). Asynchronous loads (tessera_async_load): the thread reads,
        checks and writes the blocks whole; get_finished reports the request once done (its
        blocks are not in vLLM's forward until then)."""
        meta = self._meta()
        self._collect_read()
        self._staged_loads = {}
        if not meta.loads:
            return
        later = set(meta.async_loads)
        now = [t for t in meta.loads if t.req_id not in later]
        if now:
            self._read_job = self._loader.submit(lambda: self._read(now), {t.req_id for t in now})
        if later:
            loads = [t for t in meta.loads if t.req_id in later]
            self._loader.submit(lambda: self._load_whole(loads, later), later)

    def _read(self, transfers):
        """(verified bodies by (request, index), the block ids that failed) for `transfers`;
        a BlockRemoved event for each failure (the tiers do not hold that block)."""
        got = self._tiers.get([t.key for t in transfers])
        staged, failed, removed = {}, set(), []
        for t, rec in zip(transfers, got):
            body = None
            if rec is not None and rec[0] == _records.FORMAT_ID:
                body = _records.decode(rec[1], _records.KIND_VLLM_BLOCK, self._identity(t), self._body_bytes)
            if body is None:
                failed.add(t.block_id)
                removed.append(event_classes()[1](block_hashes=[t.key], medium=MEDIUM, group_idx=None))
            else:
                staged[(t.req_id, t.index)] = (t, body)
        with self._lock:
            self.stats["load_errors"] += len(failed)
            self._worker_events += removed
        return staged, failed

    def _load_whole(self, transfers, req_ids):
        try:
            staged, failed = self._read(transfers)
            for t, body in staged.values():
                for n in self._layers:
                    self._write_page(n, t.block_id, body)
            self._count("loaded_blocks", len(staged))
        except Exception:  # noqa: BLE001  (a tier or copy failure: vLLM recomputes the blocks)
            failed = {t.block_id for t in transfers}
            self._count("load_errors", len(failed))
        with self._lock:
            self._loads_done.append((set(req_ids), failed))

    def _collect_read(self):
        """Takes the sync loads' read of this step (waiting for it) into the staged pages."""
        job, self._read_job = self._read_job, None
        if job is None:
            return
        try:
            staged, failed = job.result()
        except Exception:  # noqa: BLE001
            staged, failed = {}, set()
        self._staged_loads.update(staged)
        with self._lock:
            self._load_errors |= failed

    def _write_page(self, layer_name, block_id, body):
        dst = self._caches[layer_name]
        off, p = self._offsets[layer_name], self._page_bytes[layer_name]
        src = memoryview(body)[off:off + p]
        staged = self._cuda_pages.get(layer_name)
        if staged is not None:  # pinned host -> device through the CUDA module
            staged[0].write(staged[1], block_id * p, src)
        elif type(dst).__module__.startswith("torch"):
            import torch
            page = _as_torch_page(dst, block_id)
            page.copy_(torch.frombuffer(bytearray(src), dtype=torch.uint8), non_blocking=False)
        else:
            dst[block_id].reshape(-1).view("u1")[:] = src

    def wait_for_layer_load(self, layer_name):
        """Copies this layer's page of every block read for start_load_kv into the paged buffer."""
        if layer_name not in self._caches:
            raise ValueError("layer_name: %r is not a registered layer" % (layer_name,))
        self._collect_read()
        last = layer_name == self._layers[-1]
        for t, body in self._staged_loads.values():
            self._write_page(layer_name, t.block_id, body)
        if last and self._staged_loads:
            self._count("loaded_blocks", len(self._staged_loads))

    def _page_of(self, layer_name, kv_layer, block_id):
        """One block's page of `kv_layer` as bytes (a device tensor is copied to the host first)."""
        if not 0 <= block_id < kv_layer.shape[0]:
            raise ValueError("kv_layer: block id %d outside its %d blocks" % (block_id, kv_layer.shape[0]))
        if _is_cuda(kv_layer):  # device -> pinned host through the CUDA module
            page = self._cuda_page(layer_name, kv_layer, block_id)
        elif type(kv_layer).__module__.startswith("torch"):
            page = _as_torch_page(kv_layer, block_id).cpu().numpy().tobytes()  # CPU: no copy
        else:
            page = kv_layer[block_id].tobytes()
        if len(page) != self._page_bytes[layer_name]:
            raise ValueError("kv_layer: a page of %d bytes, registered %d" % (len(page), self._page_bytes[layer_name]))
        return page

    def _cuda_page(self, layer_name, kv_layer, block_id):
        staged, reg = self._cuda_pages.get(layer_name), self._caches.get(layer_name)
        if staged is None or kv_layer.data_ptr() != reg.data_ptr():
            raise ValueError("kv_layer: a CUDA tensor that is not the registered cache of layer %r (CUDA pages are "
                             "staged through the registered memory only)" % (layer_name,))
        p = self._page_bytes[layer_name]
        return staged[0].read(staged[1], block_id * p, p)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        """Synchronous saves: copies this layer's page of every block to save this step out of
        `kv_layer`. Asynchronous saves (tessera_async_save): checks `kv_layer` and keeps it; the
        mover thread reads the pages after wait_for_save."""
        meta = self._meta()
        if layer_name not in self._caches:
            raise ValueError("layer_name: %r is not a registered layer" % (layer_name,))
        if self.async_save:
            want = self._caches[layer_name].shape
            if tuple(kv_layer.shape[1:]) != tuple(want[1:]):
                raise ValueError("kv_layer: shape %s, registered %s" % (tuple(kv_layer.shape), tuple(want)))
            for t in meta.saves:
                if not 0 <= t.block_id < kv_layer.shape[0]:
                    raise ValueError("kv_layer: block id %d outside its %d blocks" % (t.block_id, kv_layer.shape[0]))
            self._save_layers[layer_name] = kv_layer
            return
        li = self._layers.index(layer_name)
        for t in meta.saves:
            pages = self._staged_saves.setdefault((t.req_id, t.index), [None] * len(self._layers))
            pages[li] = self._page_of(layer_name, kv_layer, t.block_id)

    def wait_for_save(self):
        """Synchronous saves: writes every block whose pages were saved in all layers to the tiers
        before returning. Asynchronous saves: hands the step's blocks to the mover thread and
        returns; vLLM keeps their blocks until get_finished reports the request (request_finished
        answered True) and handle_preemptions waits for a preempted request's saves, so no block
        is overwritten before its pages are read."""
        meta = self._meta()
        if self.async_save:
            saves, layers = list(meta.saves), dict(self._save_layers)
            self._save_layers = {}
            if saves:
                rids = {t.req_id for t in saves}
                with self._lock:
                    self._saving |= rids
                self._saver.submit(lambda: self._store(saves, layers), rids)
            return
        done = []
        for t in meta.saves:
            pages = self._staged_saves.pop((t.req_id, t.index), None)
            done.append((t, pages if pages is not None and all(p is not None for p in pages) else None))
        self._put(done)

    def _store(self, saves, layers):
        """The mover's half of an asynchronous save: read each block's pages, write the records."""
        done = []
        for t in saves:
            try:
                pages = [self._page_of(n, layers[n], t.block_id) for n in self._layers] \
                    if all(n in layers for n in self._layers) else None
            except Exception:  # noqa: BLE001
                pages = None
            done.append((t, pages))
        try:
            self._put(done)
        except Exception:  # noqa: BLE001  (a tier failure: the blocks are not stored)
            self._count("save_failures", sum(1 for _, p in done if p is not None))

    def _put(self, done):
        """Writes (transfer, pages or None) to the tiers; counts; a BlockStored per stored block."""
        todo = [(t, p) for t, p in done if p is not None]
        self._count("save_failures", len(done) - len(todo))
        if not todo:
            return
        payloads = [_records.encode(_records.KIND_VLLM_BLOCK, self._identity(t), b"".join(p)) for t, p in todo]
        stored = self._tiers.put([t.key for t, _ in todo], payloads, _records.FORMAT_ID)
        stored_cls = event_classes()[0]
        events = [stored_cls(block_hashes=[t.key], parent_block_hash=t.parent if t.index else None,
                             token_ids=list(t.tokens), block_size=len(t.tokens), lora_id=t.lora_id, medium=MEDIUM,
                             lora_name=t.lora_name, extra_keys=None, group_idx=None)
                  for (t, _), ok in zip(todo, stored) if ok]
        with self._lock:
            self.stats["saved_blocks"] += sum(1 for s in stored if s)
            self.stats["save_failures"] += sum(1 for s in stored if not s)
            self._worker_events += events

    def handle_preemptions(self, kv_connector_metadata):
        """vLLM calls it before the forward: the preempted requests' blocks are freed and may be
        rewritten this step, so this waits for their queued saves (and loads)."""
        pre = getattr(kv_connector_metadata, "preempted", None) or ()
        if pre:
            self._saver.wait(pre)
            self._loader.wait(pre)

    def get_block_ids_with_load_errors(self):
        self._collect_read()
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    def get_finished(self, finished_req_ids):
        """(requests sent, requests received): sent are those of `finished_req_ids` (now or in an
        earlier call) whose asynchronous saves are all written; received are those whose
        asynchronous loads completed since the last call (their failed blocks are reported by
        get_block_ids_with_load_errors). None for an empty set, as vLLM's connectors answer.
        Each request once, in one of the two: one that finished during its asynchronous load
        (ConnectorMetadata.freed_on_recv) is only received, once its saves are written too."""
        with self._lock:
            done, self._loads_done = self._loads_done, []
            recv = set(self._recv_held)
            for rids, failed in done:
                recv |= rids
                self._load_errors |= failed
            gone = self._freed_on_recv
            self._saving -= gone
            self._finished_seen -= gone
            self._finished_seen |= self._saving.intersection(finished_req_ids or ())
            candidates = list(self._finished_seen)
        sent = {r for r in candidates if not self._saver.busy(r)}
        held = {r for r in recv & gone if self._saver.busy(r)}
        recv -= held
        with self._lock:
            self._finished_seen -= sent
            self._saving -= sent
            self._recv_held = held
            self._freed_on_recv -= recv
        return (sent or None), (recv or None)

    def get_kv_connector_kv_cache_events(self):
        """The BlockStored/BlockRemoved events of this worker since the last call, as
        TesseraKVEvents (a KVConnectorKVEvents when vLLM is present); None when there are none."""
        with self._lock:
            events, self._worker_events = self._worker_events, []
        return TesseraKVEvents(1, events) if events else None

    def get_kv_connector_stats(self):
        """The counters since the last call, as TesseraConnectorStats (a KVConnectorStats when vLLM
        is present); None when nothing happened. ``self.stats`` keeps the totals."""
        with self._lock:
            now = dict(self.stats)
        delta = {k: now[k] - self._stats_reported.get(k, 0) for k in STAT_NAMES}
        self._stats_reported = now
        out = TesseraConnectorStats(data=delta)
        return None if out.is_empty() else out

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return TesseraConnectorStats(data=dict(data or {}))

    def wait_for_transfers(self):
        """Until every queued load and save has finished (tests; shutdown drains the same way)."""
        self._loader.wait()
        self._saver.wait()

    def shutdown(self):
        """Drains the movers (every queued save is written, every load finished), then stops them."""
        self._loader.close()
        self._saver.close()
        self._read_job = None
        self._staged_loads = {}
        self._staged_saves = {}
        self._save_layers = {}


Connector = TesseraConnector  # the earlier name
