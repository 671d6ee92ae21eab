"""What the engine adapters read from an engine's JSON extra-config (docs/ENGINES.md, "Engine
doors"; ADR 0030): the tiers, the secret (a file or an environment variable, never required
inline), the tenant and namespace. Each bad value is refused at load with a message naming the key.
"""

import hashlib
import os
import struct

from . import _records
from ._core import RecordTiers

KEYS = ("tessera_tiers", "tessera_secret", "tessera_secret_file", "tessera_secret_env", "tessera_tenant",
        "tessera_namespace", "tessera_async_load", "tessera_async_save", "tessera_revision")


def secret_from(extra, given=None):
    """The key secret: `given` (bytes) or extra-config's tessera_secret_file (a path), tessera_secret_env
    (an environment variable's name) or tessera_secret (bytes, or a str of at least 16 characters)."""
    if given is not None:
        return _records.check_secret(given)
    sources = [k for k in ("tessera_secret", "tessera_secret_file", "tessera_secret_env") if extra.get(k) is not None]
    if len(sources) > 1:
        raise ValueError("%s: give one of tessera_secret, tessera_secret_file, tessera_secret_env" % sources[1])
    if not sources:
        raise ValueError("tessera_secret_file: missing (or tessera_secret_env): the fleet's key secret, >= 16 bytes")
    key = sources[0]
    v = extra[key]
    if key == "tessera_secret_file":
        if not isinstance(v, str) or not v:
            raise ValueError("tessera_secret_file: must be a path (got %r)" % (v,))
        try:
            with open(v, "rb") as f:
                raw = f.read(4097)
        except OSError as e:
            raise ValueError("tessera_secret_file: cannot read %s (%s)" % (v, e.strerror)) from None
        if len(raw) > 4096:
            raise ValueError("tessera_secret_file: %s is over 4096 bytes" % v)
        return _records.check_secret(raw.rstrip(b"\r\n"), key)
    if key == "tessera_secret_env":
        if not isinstance(v, str) or not v:
            raise ValueError("tessera_secret_env: must be an environment variable's name (got %r)" % (v,))
        s = os.environ.get(v)
        if s is None:
            raise ValueError("tessera_secret_env: the environment variable %s is not set" % v)
        return _records.check_secret(os.fsencode(s), key)
    if isinstance(v, str):
        v = v.encode()
    return _records.check_secret(v, key)


def tiers_from(tiers, secret, key="tessera_tiers"):
    """RecordTiers from a RecordTiers or a list of tier dicts (a Redis tier gets the secret)."""
    if isinstance(tiers, RecordTiers):
        return tiers
    if tiers is None:
        raise ValueError("%s: missing (a list of tier dicts, e.g. [{\"kind\": \"host\", ...}])" % key)
    if not isinstance(tiers, (list, tuple)) or not tiers:
        raise ValueError("%s: must be a non-empty list of tier dicts (got %s)" % (key, type(tiers).__name__))
    out = []
    for i, t in enumerate(tiers):
        if not isinstance(t, dict):
            raise ValueError("%s[%d]: must be a dict (got %s)" % (key, i, type(t).__name__))
        if t.get("kind") in ("redis", "redis_cluster") and "secret" not in t:
            t = dict(t, secret=secret)
        out.append(t)
    try:
        return RecordTiers(out)
    except (TypeError, ValueError) as e:
        raise ValueError("%s: %s" % (key, e)) from None


def name_field(extra, key, default, limit=256):
    v = extra.get(key, default)
    if v is None:
        v = ""
    if not isinstance(v, str) or len(v) > limit:
        got = type(v).__name__ if not isinstance(v, str) else "%d characters" % len(v)
        raise ValueError("%s: must be a str of at most %d characters (got %s)" % (key, limit, got))
    return v


def unknown_keys(extra, known):
    for k in extra:
        if isinstance(k, str) and k.startswith("tessera_") and k not in known:
            raise ValueError("%s: not a Tessera key (known: %s)" % (k, ", ".join(known)))


def scope(*fields):
    """An injective encoding of text fields (length-prefixed UTF-8), hashed to 32 bytes: a namespace
    that is never cut, whatever the length of the model name, revision, tenant or namespace."""
    h = hashlib.blake2b(digest_size=32, person=b"tessera-scope")
    for f in fields:
        b = f.encode("utf-8", "surrogatepass")
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    return h.digest()
