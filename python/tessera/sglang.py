"""SGLang's hierarchical-cache storage backend over Tessera's tiers.

``HiCacheStorage`` implements SGLang's ``HiCacheStorage``
(``python/sglang/srt/mem_cache/hicache_storage.py``; read at github.com/modal-projects/sglang
8905cbd42f4a27dbecad6487cd3904278756fef8): ``get``/``set``/``exists`` and
``batch_get``/``batch_set``/``batch_exists``, the host-pool ``batch_get_v1``/``batch_set_v1``, the
hybrid-pool ``batch_exists_v2``/``batch_get_v2``/``batch_set_v2``/``register_mem_host_pool_v2``,
``clear``, ``get_stats``, ``register_mem_pool_host``. When SGLang is importable it subclasses
SGLang's class, so that SGLang's ``StorageBackendFactory`` loads it with
``--hicache-storage-backend dynamic`` and extra-config ``{"backend_name": "tessera", "module_path":
"tessera.sglang", "class_name": "HiCacheStorage", ...}`` and constructs it as
``HiCacheStorage(storage_config, kwargs)``.

A page (one key's value: a host-pool page, bytes of a tensor of any dtype, a numpy array) is stored
in Tessera's tiers (host DRAM, a disk directory, Redis, Redis Cluster; ``RecordTiers``) under a keyed
hash of the key, with the key itself inside the record: a value comes back only when the tier
verified it and it is the record of exactly that key and size (docs/PYTHON.md, ADR 0024, ADR 0030).
Keys are scoped by the model, the tenant and the namespace, each kept whole (hashed, never cut).
"""

import threading

from . import _engine_config, _records

try:  # SGLang's own base class when SGLang is importable
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base  # type: ignore
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransferResult  # type: ignore
    HAVE_SGLANG = True
except Exception:  # noqa: BLE001  (SGLang absent or not importable here)
    HAVE_SGLANG = False
    _Base = object
    PoolHitPolicy = None
    PoolTransferResult = None

MAX_KEY_BYTES = 4096
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "interface_v2")


def _policy_name(p):
    return str(getattr(p, "value", p) or "all_pages")


def _transfer_result(kv_hit_pages, extra):
    if PoolTransferResult is not None:
        return PoolTransferResult(kv_hit_pages, extra)
    from types import SimpleNamespace
    return SimpleNamespace(kv_hit_pages=kv_hit_pages, extra_pool_hit_pages=extra)


class HiCacheStorage(_Base):
    """SGLang's HiCacheStorage over Tessera's tiers.

    ``tiers``: a ``RecordTiers`` or a list of tier dicts for one (e.g. ``[{"kind": "host",
    "capacity_bytes": 1 << 30}, {"kind": "disk", "dir": "/var/cache/kv"}]``); when None, taken
    from ``storage_config.extra_config["tessera_tiers"]``. ``secret``: the key secret (bytes, at
    least 16; a fleet shares it). ``storage_config``: SGLang's ``HiCacheStorageConfig`` (or None);
    like SGLang's file backend, keys of a non-MLA model are kept apart per TP rank and size, and
    keys of every model apart by model name.
    """

    def __init__(self, storage_config=None, kwargs=None, *, tiers=None, secret=None, namespace=None, tenant=None):
        extra = getattr(storage_config, "extra_config", None) or {}
        if not isinstance(extra, dict):
            raise ValueError("extra_config: must be a JSON object")
        _engine_config.unknown_keys(extra, _engine_config.KEYS)
        self._secret = _engine_config.secret_from(extra, secret)
        self._tiers = _engine_config.tiers_from(extra.get("tessera_tiers") if tiers is None else tiers, self._secret,
                                               "tessera_tiers" if tiers is None else "tiers")
        if namespace is None:
            namespace = _engine_config.name_field(extra, "tessera_namespace", "sglang")
        if tenant is None:
            tenant = _engine_config.name_field(extra, "tessera_tenant", "")
        for arg, v in (("namespace", namespace), ("tenant", tenant)):
            if not isinstance(v, str) or len(v) > 1024:
                raise ValueError("%s: must be a str of at most 1024 characters" % arg)
        if not namespace:
            raise ValueError("namespace: must not be empty")
        model, rank = "", ""
        if storage_config is not None:
            model = getattr(storage_config, "model_name", None) or ""
            # Like SGLang's file backend: a non-MLA model's pages differ per TP rank and size; MLA's
            # one copy serves every rank.
            if not getattr(storage_config, "is_mla_model", False):
                rank = "tp%d/%d" % (storage_config.tp_rank, storage_config.tp_size)
            if getattr(storage_config, "pp_size", 1) > 1:
                rank += "pp%d/%d" % (storage_config.pp_rank, storage_config.pp_size)
        self.identity = {"model": model, "tenant": tenant, "namespace": namespace, "rank": rank}
        # Every field whole, length-prefixed and hashed (never cut: issue 27 point 5).
        self._scope = _engine_config.scope("sglang-hicache", model, tenant, namespace, rank)
        self._domain = b"tessera-hicache"
        self._lock = threading.Lock()
        self._stats = {"gets": 0, "hits": 0, "misses": 0, "rejected": 0, "sets": 0, "set_failures": 0}
        self._written = set()
        self.mem_pool_host = None
        self.registered_pools = {}

    # --- keys and records -------------------------------------------------------------------
    def _identity(self, key, arg="key"):
        if not isinstance(key, str):
            raise TypeError("%s: must be a str (got %s)" % (arg, type(key).__name__))
        ident = key.encode("utf-8", "surrogatepass")
        if len(ident) > MAX_KEY_BYTES:
            raise ValueError("%s: %d bytes exceed %d" % (arg, len(ident), MAX_KEY_BYTES))
        return self._scope + ident

    def _tier_key(self, ident):
        return _records.tier_key(self._secret, self._domain, ident)

    def _count(self, name, n=1):
        with self._lock:
            self._stats[name] += n

    # --- SGLang's surface -------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def get(self, key, target_location=None, target_sizes=None):
        """The value of `key` copied into `target_location` (returned), or, without a target, a
        new bytearray; None when no tier holds a verified record of exactly this key (and size)."""
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        keys = self._check_keys(keys)
        targets = self._check_targets(target_locations, len(keys), writable=True)
        idents = [self._identity(k, "keys[%d]" % i) for i, k in enumerate(keys)]
        got = self._tiers.get([self._tier_key(i) for i in idents])
        out = []
        for i, rec in enumerate(got):
            self._count("gets")
            if rec is None:
                self._count("misses")
                out.append(None)
                continue
            fmt, payload = rec
            want = None if targets is None else len(targets[i])
            body = None if fmt != _records.FORMAT_ID else _records.decode(
                payload, _records.KIND_SGLANG_PAGE, idents[i], want)
            if body is None:  # not this key's record, or not of the target's size
                self._count("rejected")
                out.append(None)
                continue
            self._count("hits")
            if targets is None:
                out.append(bytearray(body))
            else:
                targets[i][:] = body
                out.append(target_locations[i])
        return out

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores values[i] (or target_locations[i]: SGLang passes host-pool pages either way)
        under keys[i]; True when every key is held by a tier afterwards."""
        keys = self._check_keys(keys)
        src = values if values is not None else target_locations
        if src is None:
            raise ValueError("values: give values or target_locations")
        views = self._check_targets(src, len(keys), writable=False,
                                    arg="values" if values is not None else "target_locations")
        idents = [self._identity(k, "keys[%d]" % i) for i, k in enumerate(keys)]
        tkeys = [self._tier_key(i) for i in idents]
        payloads = [_records.encode(_records.KIND_SGLANG_PAGE, ident, v) for ident, v in zip(idents, views)]
        stored = self._tiers.put(tkeys, payloads, _records.FORMAT_ID)
        self._count("sets", len(keys))
        self._count("set_failures", sum(1 for s in stored if not s))
        with self._lock:
            self._written.update(k for k, s in zip(tkeys, stored) if s)
        return all(stored)

    def exists(self, key):
        return self._tiers.contains([self._tier_key(self._identity(key))])[0]

    def batch_exists(self, keys, extra_info=None):
        """How many keys from the start are held (SGLang's prefix semantics)."""
        keys = self._check_keys(keys)
        held = self._tiers.contains([self._tier_key(self._identity(k, "keys[%d]" % i)) for i, k in enumerate(keys)])
        n = 0
        for h in held:
            if not h:
                break
            n += 1
        return n

    def clear(self):
        """Erases every record this backend stored."""
        with self._lock:
            keys = list(self._written)
            self._written.clear()
        if keys:
            self._tiers.erase(keys)

    def get_stats(self):
        with self._lock:
            s = dict(self._stats)
        s["tiers"] = self._tiers.counters()
        return s

    # --- host-pool pages (v1) and hybrid pools (v2) -------------------------------------------
    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        self.registered_pools[str(getattr(host_pool_name, "value", host_pool_name))] = host_pool

    def _pool(self, name):
        name = str(getattr(name, "value", name))
        pool = self.registered_pools.get(name)
        if pool is None and name == "kv":
            pool = self.mem_pool_host
        if pool is None:
            raise ValueError("pool: %r is not registered (register_mem_host_pool_v2 first)" % name)
        return name, pool

    @staticmethod
    def _page_starts(pool, host_indices, n, arg="host_indices"):
        ps = int(pool.page_size)
        if host_indices is None or len(host_indices) < n * ps:
            raise ValueError("%s: %s indices for %d pages of %d" % (arg, "no" if host_indices is None else
                                                                  len(host_indices), n, ps))
        return [int(host_indices[i * ps]) for i in range(n)]

    def _pages_set(self, pool, prefix, keys, host_indices):
        starts = self._page_starts(pool, host_indices, len(keys))
        data = [pool.get_data_page(s, flat=True) for s in starts]
        keys = [prefix + k for k in self._check_keys(keys)]
        idents = [self._identity(k, "keys[%d]" % i) for i, k in enumerate(keys)]
        views = [_records.as_bytes_view(d, "page[%d]" % i) for i, d in enumerate(data)]
        tkeys = [self._tier_key(i) for i in idents]
        stored = self._tiers.put(tkeys, [_records.encode(_records.KIND_SGLANG_PAGE, i, v)
                                         for i, v in zip(idents, views)], _records.FORMAT_ID)
        self._count("sets", len(keys))
        self._count("set_failures", sum(1 for s in stored if not s))
        with self._lock:
            self._written.update(k for k, ok in zip(tkeys, stored) if ok)
        return [bool(x) for x in stored]

    def _pages_get(self, pool, prefix, keys, host_indices):
        """Each page read straight into the host pool's page when that page is one contiguous view
        of the pool's buffer (page_first layouts), else into a flat page and set from it."""
        starts = self._page_starts(pool, host_indices, len(keys))
        targets, direct = [], []
        for s in starts:
            page = pool.get_data_page(s, flat=True)
            shares = page.is_contiguous() and page.data_ptr() != 0 and _shares_storage(page, pool)
            targets.append(page if shares else pool.get_dummy_flat_data_page())
            direct.append(shares)
        got = self.batch_get([prefix + k for k in self._check_keys(keys)], targets)
        out = []
        for s, t, d, g in zip(starts, targets, direct, got):
            if g is not None and not d:
                pool.set_from_flat_data_page(s, t)
            out.append(g is not None)
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """The host pool's pages at `host_indices` (one page per key) stored under `keys`."""
        if self.mem_pool_host is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host first)")
        return self._pages_set(self.mem_pool_host, "", keys, host_indices)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Per key, whether its verified page was written into the host pool at `host_indices`."""
        if self.mem_pool_host is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host first)")
        return self._pages_get(self.mem_pool_host, "", keys, host_indices)

    @staticmethod
    def _pool_prefix(name):
        return "" if name == "kv" else "pool:%s/" % name

    def batch_set_v2(self, transfers, extra_info=None):
        out = {}
        for t in transfers:
            name, pool = self._pool(t.name)
            out[name] = self._pages_set(pool, self._pool_prefix(name), t.keys or [], t.host_indices)
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        out = {}
        for t in transfers:
            name, pool = self._pool(t.name)
            out[name] = self._pages_get(pool, self._pool_prefix(name), t.keys or [], t.host_indices)
        return out

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix: the KV pages held from the start, shortened to what every extra pool
        holds. ``all_pages``: the pool's pages from the start (its keys, else the KV keys);
        ``trailing_pages``: the pool's keys (the prefix's last pages) must all be held, else
        nothing of the prefix is usable."""
        kv_hit = self.batch_exists(keys)
        extra = {}
        for t in pool_transfers or ():
            name = str(getattr(t.name, "value", t.name))
            pk = [self._pool_prefix(name) + k for k in self._check_keys(t.keys if t.keys is not None else keys)]
            if _policy_name(t.hit_policy) == "trailing_pages":
                held = self._tiers.contains([self._tier_key(self._identity(k)) for k in pk])
                extra[name] = sum(1 for h in held if h)
                if not all(held):
                    kv_hit = 0
            else:
                n = self.batch_exists(pk[:kv_hit])
                extra[name] = n
                kv_hit = min(kv_hit, n)
        return _transfer_result(kv_hit, extra)

    # --- checks -------------------------------------------------------------------------------
    @staticmethod
    def _check_keys(keys):
        if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
            raise TypeError("keys: must be a list of str (got %s)" % type(keys).__name__)
        return list(keys)

    @staticmethod
    def _check_targets(targets, n, writable, arg="target_locations"):
        if targets is None:
            return None
        if not isinstance(targets, (list, tuple)):
            raise TypeError("%s: must be a list (got %s)" % (arg, type(targets).__name__))
        if len(targets) != n:
            raise ValueError("%s: has %d entries for %d keys" % (arg, len(targets), n))
        conv = _records.writable_bytes_view if writable else _records.as_bytes_view
        return [conv(t, "%s[%d]" % (arg, i)) for i, t in enumerate(targets)]


def _shares_storage(page, pool):
    buf = getattr(pool, "kv_buffer", None)
    if buf is None or not hasattr(buf, "data_ptr"):
        return False
    lo = buf.data_ptr()
    hi = lo + buf.numel() * buf.element_size()
    return lo <= page.data_ptr() < hi
