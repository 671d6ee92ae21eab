"""SGLang's hierarchical-cache storage backend over Tessera's tiers.

``HiCacheStorage`` has the method surface of SGLang's ``HiCacheStorage``
(``python/sglang/srt/mem_cache/hicache_storage.py``; read at github.com/modal-projects/sglang
8905cbd42f4a27dbecad6487cd3904278756fef8, 2026-07-20): ``get``/``set``/``exists`` and
``batch_get``/``batch_set``/``batch_exists``, ``clear``, ``get_stats``,
``register_mem_pool_host``. A page (one key's value: a host-pool page, bytes of a CPU tensor or a
numpy array) is stored in Tessera's tiers (host DRAM, a disk directory, Redis; ``RecordTiers``)
under a keyed hash of the key, with the key itself inside the record: a value comes back only
when the tier verified it and it is the record of exactly that key and size (docs/PYTHON.md,
ADR 0024).
"""

import threading

from . import _records
from ._core import RecordTiers

MAX_KEY_BYTES = 4096


class HiCacheStorage:
    """SGLang's HiCacheStorage over Tessera's tiers.

    ``tiers``: a ``RecordTiers`` or a list of tier dicts for one (e.g. ``[{"kind": "host",
    "capacity_bytes": 1 << 30}, {"kind": "disk", "dir": "/var/cache/kv"}]``); when None, taken
    from ``storage_config.extra_config["tessera_tiers"]``. ``secret``: the key secret (bytes, at
    least 16; a fleet shares it). ``storage_config``: SGLang's ``HiCacheStorageConfig`` (or None);
    like SGLang's file backend, keys of a non-MLA model are kept apart per TP rank and size, and
    keys of every model apart by model name.
    """

    def __init__(self, storage_config=None, *, tiers=None, secret=None, namespace="sglang"):
        extra = getattr(storage_config, "extra_config", None) or {}
        if tiers is None:
            tiers = extra.get("tessera_tiers")
        if secret is None:
            secret = extra.get("tessera_secret")
        if tiers is None:
            raise ValueError("tiers: give RecordTiers, a list of tier dicts or extra_config['tessera_tiers']")
        self._secret = _records.check_secret(secret)
        if not isinstance(namespace, str) or not namespace or len(namespace) > 64:
            raise ValueError("namespace: must be a non-empty str of at most 64 characters")
        if isinstance(tiers, RecordTiers):
            self._tiers = tiers
        else:
            if not isinstance(tiers, (list, tuple)):
                raise TypeError("tiers: must be RecordTiers or a list of tier dicts (got %s)" % type(tiers).__name__)
            tiers = [dict(t, secret=self._secret) if isinstance(t, dict) and t.get("kind") == "redis"
                     and "secret" not in t else t for t in tiers]
            self._tiers = RecordTiers(list(tiers))
        suffix = ""
        if storage_config is not None:
            model = getattr(storage_config, "model_name", None) or ""
            suffix = "_" + "-".join(model.split("/"))
            if not getattr(storage_config, "is_mla_model", False):
                suffix += "_%d_%d" % (storage_config.tp_rank, storage_config.tp_size)
            if getattr(storage_config, "pp_size", 1) > 1:
                suffix += "_%d_%d" % (storage_config.pp_size, storage_config.pp_rank)
        self._suffix = suffix
        self._domain = ("hicache:" + namespace).encode()[:16]
        self._lock = threading.Lock()
        self._stats = {"gets": 0, "hits": 0, "misses": 0, "rejected": 0, "sets": 0, "set_failures": 0}
        self._written = set()
        self.mem_pool_host = None

    # --- keys and records -------------------------------------------------------------------
    def _identity(self, key, arg="key"):
        if not isinstance(key, str):
            raise TypeError("%s: must be a str (got %s)" % (arg, type(key).__name__))
        ident = (key + self._suffix).encode("utf-8", "surrogatepass")
        if len(ident) > MAX_KEY_BYTES:
            raise ValueError("%s: %d bytes exceed %d" % (arg, len(ident), MAX_KEY_BYTES))
        return ident

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
