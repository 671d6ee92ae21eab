"""tessera.vllm.Connector: the shape of vLLM's KVConnectorBase_V1 over Tessera's tiers.

vLLM's v1 connector API (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``, read at
github.com/local-inference-lab/vllm 28be48fa944d8c58aeffd1ab1b56e27828c6b268) splits a connector
in two roles. The scheduler side decides what to load and save:
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``,
``request_finished``. The worker side moves page bytes between vLLM's paged KV buffer and the
store: ``register_kv_caches``, ``bind_connector_metadata``, ``start_load_kv``,
``wait_for_layer_load``, ``save_kv_layer``, ``wait_for_save``, ``get_block_ids_with_load_errors``.

Here the store is Tessera's tiers (``RecordTiers``: host DRAM, a disk directory, Redis). One record
per full block holds the block's page in every registered layer; its tier key is a keyed hash of
the parent block's key and the block's tokens (a prefix chain, as vLLM's block hashes), and the
record carries the parent key, the tokens and the layout (layer names, page bytes), all checked
before a byte reaches the paged buffer. A block whose record is missing or fails a check is
reported by ``get_block_ids_with_load_errors`` (vLLM then recomputes it).
"""

import hashlib
import struct
from dataclasses import dataclass, field

from . import _records
from ._core import RecordTiers

ROLE_SCHEDULER = "scheduler"
ROLE_WORKER = "worker"


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


@dataclass
class ConnectorMetadata:
    """What the scheduler side hands the worker side for one step."""
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


@dataclass
class _ReqState:
    request: object
    keys: list
    block_ids: list = field(default_factory=list)
    saved: int = 0          # blocks [0, saved) are in the store (loaded, saved or scheduled to save)
    pending_load: list = field(default_factory=list)
    local_tokens: int = 0   # tokens the engine's own prefix cache had (get_num_new_matched_tokens)


def _role_name(role):
    name = getattr(role, "name", role)
    name = str(name).lower()
    if name.startswith("kv_"):
        name = name[3:]
    if name not in (ROLE_SCHEDULER, ROLE_WORKER):
        raise ValueError("role: must be 'scheduler' or 'worker' (got %r)" % (role,))
    return name


def _block_ids_of(blocks):
    if hasattr(blocks, "get_block_ids"):
        ids = blocks.get_block_ids()
        return list(ids[0]) if ids else []
    if isinstance(blocks, (list, tuple)):
        if blocks and isinstance(blocks[0], (list, tuple)):
            return list(blocks[0])
        return list(blocks)
    raise TypeError("blocks: must be KVCacheBlocks or a list of block ids (got %s)" % type(blocks).__name__)


class Connector:
    """KVConnectorBase_V1's shape over Tessera's tiers.

    ``vllm_config``/``kv_cache_config``: vLLM's objects when run inside vLLM (the block size is
    read from ``vllm_config.cache_config.block_size``, tiers and secret from
    ``kv_transfer_config.kv_connector_extra_config["tessera_tiers"/"tessera_secret"]``);
    outside vLLM give ``block_size``, ``tiers`` (``RecordTiers`` or a list of tier dicts) and
    ``secret`` (bytes, at least 16) directly. One object may serve both roles (tests).
    """

    def __init__(self, vllm_config=None, role=ROLE_SCHEDULER, kv_cache_config=None, *, block_size=None,
                 tiers=None, secret=None, namespace="vllm"):
        self.role = _role_name(role)
        extra = {}
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        if ktc is not None:
            extra = getattr(ktc, "kv_connector_extra_config", None) or {}
        if block_size is None and vllm_config is not None:
            block_size = vllm_config.cache_config.block_size
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError("block_size: must be an int (got %s)" % type(block_size).__name__)
        if not 1 <= block_size <= 1 << 16:
            raise ValueError("block_size: must be 1..65536 (got %d)" % block_size)
        self.block_size = block_size
        tiers = extra.get("tessera_tiers") if tiers is None else tiers
        secret = extra.get("tessera_secret") if secret is None else secret
        self._secret = _records.check_secret(secret)
        if isinstance(tiers, RecordTiers):
            self._tiers = tiers
        elif isinstance(tiers, (list, tuple)):
            self._tiers = RecordTiers([dict(t, secret=self._secret) if isinstance(t, dict) and
                                       t.get("kind") == "redis" and "secret" not in t else t for t in tiers])
        else:
            raise TypeError("tiers: must be RecordTiers or a list of tier dicts (got %s)" % type(tiers).__name__)
        if not isinstance(namespace, str) or not namespace or len(namespace) > 64:
            raise ValueError("namespace: must be a non-empty str of at most 64 characters")
        self._domain = ("vllm:" + namespace).encode()[:16]
        self._root = _records.tier_key(self._secret, self._domain, b"root:" + namespace.encode())
        self._reqs = {}
        self._metadata = None
        # Worker side.
        self._layers = []
        self._caches = {}
        self._page_bytes = 0
        self._staged_loads = {}   # (req, index) -> (transfer, body memoryview)
        self._staged_saves = {}   # (req, index) -> [page bytes per layer]
        self._load_errors = set()
        self.stats = {"matched_blocks": 0, "loaded_blocks": 0, "saved_blocks": 0, "load_errors": 0,
                      "save_failures": 0}

    # --- keys -------------------------------------------------------------------------------------
    def _keys_for(self, request):
        tokens = request.all_token_ids
        n = len(tokens) // self.block_size
        st = self._reqs.get(request.request_id)
        if st is None or len(st.keys) > n or st.request is not request:
            st = _ReqState(request=request, keys=[])
            self._reqs[request.request_id] = st
        if len(st.keys) < n:
            st.keys += self._chain_from(tokens, st.keys, n)
        return st

    def _chain_from(self, tokens, have, n):
        bs = self.block_size
        parent = have[-1] if have else self._root
        out = []
        for b in range(len(have), n):
            blk = tokens[b * bs:(b + 1) * bs]
            key = _records.tier_key(self._secret, self._domain, parent + struct.pack("<%dI" % bs, *blk))
            out.append(key)
            parent = key
        return out

    # --- scheduler side --------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens beyond `num_computed_tokens` the tiers hold for this prompt, False): the
        longest run of the prompt's whole blocks held, capped (as vLLM's own prefix cache) so
        that the last prompt token is computed."""
        if isinstance(num_computed_tokens, bool) or not isinstance(num_computed_tokens, int) or num_computed_tokens < 0:
            raise ValueError("num_computed_tokens: must be a non-negative int")
        st = self._keys_for(request)
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
        self.stats["matched_blocks"] += ext // self.block_size
        return ext, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Records the blocks the scheduler allocated; with external tokens, the blocks to load
        into (those after the locally computed ones)."""
        st = self._keys_for(request)
        st.block_ids = _block_ids_of(blocks)
        if num_external_tokens:
            if num_external_tokens % self.block_size:
                raise ValueError("num_external_tokens: must be whole blocks of %d" % self.block_size)
            n_ext = num_external_tokens // self.block_size
            # The external blocks follow the locally cached ones (vLLM hands every block of the
            # request, local hits first): those get_num_new_matched_tokens was told of.
            start = st.local_tokens // self.block_size
            if start + n_ext > len(st.keys) or start + n_ext > len(st.block_ids):
                raise ValueError("num_external_tokens: %d tokens past the request's blocks" % num_external_tokens)
            st.pending_load = list(range(start, start + n_ext))
            st.saved = max(st.saved, start + n_ext)

    def build_connector_meta(self, scheduler_output):
        """The loads decided since the last call and the saves of blocks this step completes.
        Reads, duck-typed, vLLM's SchedulerOutput: ``scheduled_new_reqs`` (req_id, block_ids,
        num_computed_tokens), ``scheduled_cached_reqs`` (req_ids, new_block_ids,
        num_computed_tokens) and ``num_scheduled_tokens``; it does not modify it."""
        meta = ConnectorMetadata()
        bs = self.block_size
        for st in self._reqs.values():
            for i in st.pending_load:
                r = st.request
                meta.loads.append(BlockTransfer(r.request_id, i, st.block_ids[i], st.keys[i],
                                                st.keys[i - 1] if i else self._root,
                                                tuple(r.all_token_ids[i * bs:(i + 1) * bs])))
            st.pending_load = []
        sched = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        computed = {}
        for nr in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            computed[nr.req_id] = nr.num_computed_tokens
            st = self._reqs.get(nr.req_id)
            if st is not None:
                st.block_ids = _block_ids_of(nr.block_ids)
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            for j, rid in enumerate(cached.req_ids):
                computed[rid] = cached.num_computed_tokens[j]
                st = self._reqs.get(rid)
                nb = cached.new_block_ids[j]
                if st is not None and nb is not None:
                    st.block_ids += _block_ids_of(nb)
        for rid, done in computed.items():
            st = self._reqs.get(rid)
            if st is None:
                continue
            r = st.request
            upto = min(done + sched.get(rid, 0), r.num_tokens) // bs
            self._keys_for(r)
            upto = min(upto, len(st.keys), len(st.block_ids))
            for i in range(st.saved, upto):
                meta.saves.append(BlockTransfer(rid, i, st.block_ids[i], st.keys[i],
                                                st.keys[i - 1] if i else self._root,
                                                tuple(r.all_token_ids[i * bs:(i + 1) * bs])))
            st.saved = max(st.saved, upto)
        return meta

    def request_finished(self, request, block_ids):
        """Forgets the request. Saves are written by wait_for_save in the step that computes
        them, so vLLM may free the blocks at once: (False, None)."""
        self._reqs.pop(request.request_id, None)
        return False, None

    # --- worker side -----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        """vLLM's paged buffers, layer name -> array [num_blocks, block_size, ...] (numpy, or CPU
        torch tensors); every layer's page (one block) must have the same byte size."""
        if not isinstance(kv_caches, dict) or not kv_caches:
            raise TypeError("kv_caches: must be a non-empty dict of layer name -> array")
        caches, page = {}, None
        for name, arr in kv_caches.items():
            if not isinstance(name, str):
                raise TypeError("kv_caches: layer names must be str")
            if type(arr).__module__.startswith("torch"):
                arr = arr.numpy()
            if not hasattr(arr, "shape") or len(arr.shape) < 2:
                raise ValueError("kv_caches[%r]: must be an array [num_blocks, block_size, ...]" % name)
            if arr.shape[1] != self.block_size:
                raise ValueError("kv_caches[%r]: block dimension %d is not block_size %d" % (name, arr.shape[1],
                                                                                           self.block_size))
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise ValueError("kv_caches[%r]: must be C-contiguous and writable" % name)
            p = arr[0].nbytes
            if page is not None and p != page:
                raise ValueError("kv_caches[%r]: page of %d bytes, other layers %d" % (name, p, page))
            page = p
            caches[name] = arr
        self._caches = caches
        self._layers = sorted(caches)
        self._page_bytes = page
        desc = struct.pack("<II", self.block_size, page) + b"\0".join(n.encode() for n in self._layers)
        self._layout = hashlib.blake2b(desc, digest_size=16).digest()

    def bind_connector_metadata(self, connector_metadata):
        if not isinstance(connector_metadata, ConnectorMetadata):
            raise TypeError("connector_metadata: must be ConnectorMetadata")
        self._metadata = connector_metadata

    def clear_connector_metadata(self):
        self._metadata = None
        self._staged_loads = {}

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
        """Reads every block to load this step from the tiers and checks it; the bytes reach the
        paged buffer layer by layer in wait_for_layer_load."""
        meta = self._meta()
        if not meta.loads:
            return
        got = self._tiers.get([t.key for t in meta.loads])
        body_bytes = self._page_bytes * len(self._layers)
        for t, rec in zip(meta.loads, got):
            body = None
            if rec is not None and rec[0] == _records.FORMAT_ID:
                body = _records.decode(rec[1], _records.KIND_VLLM_BLOCK, self._identity(t), body_bytes)
            if body is None:
                self._load_errors.add(t.block_id)
                self.stats["load_errors"] += 1
                continue
            self._staged_loads[(t.req_id, t.index)] = (t, body)

    def wait_for_layer_load(self, layer_name):
        """Copies this layer's page of every block read by start_load_kv into the paged buffer."""
        if layer_name not in self._caches:
            raise ValueError("layer_name: %r is not a registered layer" % (layer_name,))
        li = self._layers.index(layer_name)
        dst = self._caches[layer_name]
        p = self._page_bytes
        for t, body in self._staged_loads.values():
            page = dst[t.block_id].reshape(-1).view("u1")
            page[:] = memoryview(body)[li * p:(li + 1) * p]
            if li == len(self._layers) - 1:
                self.stats["loaded_blocks"] += 1

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        """Copies this layer's page of every block to save this step out of `kv_layer`."""
        meta = self._meta()
        if layer_name not in self._caches:
            raise ValueError("layer_name: %r is not a registered layer" % (layer_name,))
        if type(kv_layer).__module__.startswith("torch"):
            kv_layer = kv_layer.numpy()
        li = self._layers.index(layer_name)
        for t in meta.saves:
            if not 0 <= t.block_id < kv_layer.shape[0]:
                raise ValueError("kv_layer: block id %d outside its %d blocks" % (t.block_id, kv_layer.shape[0]))
            pages = self._staged_saves.setdefault((t.req_id, t.index), [None] * len(self._layers))
            pages[li] = kv_layer[t.block_id].tobytes()

    def wait_for_save(self):
        """Writes every block whose pages were saved in all layers to the tiers."""
        meta = self._meta()
        keys, payloads = [], []
        for t in meta.saves:
            pages = self._staged_saves.pop((t.req_id, t.index), None)
            if pages is None or any(p is None for p in pages):
                self.stats["save_failures"] += 1
                continue
            keys.append(t.key)
            payloads.append(_records.encode(_records.KIND_VLLM_BLOCK, self._identity(t), b"".join(pages)))
        if keys:
            stored = self._tiers.put(keys, payloads, _records.FORMAT_ID)
            self.stats["saved_blocks"] += sum(stored)
            self.stats["save_failures"] += sum(1 for s in stored if not s)

    def get_block_ids_with_load_errors(self):
        out, self._load_errors = self._load_errors, set()
        return out

    def get_finished(self, finished_req_ids):
        return None, None

    def shutdown(self):
        self._staged_loads = {}
        self._staged_saves = {}

    def take_events(self):
        return ()
