"""Records the engine adapters keep in Tessera's tiers (docs/adr/0024-engine-adapters.md).

The tiers (``tessera._core.RecordTiers``) authenticate what they return (a checksum in host memory,
a keyed MAC on disk and in Redis). On top of that every adapter record names what it is: a magic,
the adapter's record kind, the full identity it was stored for (an SGLang key, or a vLLM block's
chain key, parent key and tokens) and the length of every part. A record read back is used only
when all of these equal what the caller asked for; otherwise it is a miss, counted.
"""

import hashlib
import struct

MAGIC = b"TSAR"  # Tessera adapter record
VERSION = 1
HEADER = struct.Struct("<4sHHIQ")  # magic, version, kind, identity length, body length
MAX_IDENTITY_BYTES = 1 << 20

KIND_SGLANG_PAGE = 1
KIND_VLLM_BLOCK = 2

FORMAT_ID = 0x5441  # the tiers' format id for adapter records ("TA")


def check_secret(secret, arg="secret"):
    """The adapters' key secret: bytes-like of at least 16 bytes (TypeError/ValueError naming `arg`)."""
    if isinstance(secret, str) or not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError("%s: must be bytes (got %s)" % (arg, type(secret).__name__))
    secret = bytes(secret)
    if len(secret) < 16:
        raise ValueError("%s: must be at least 16 bytes (got %d)" % (arg, len(secret)))
    return secret


def tier_key(secret, domain, identity):
    """The 16-byte tier key of `identity` (bytes) in `domain` (bytes): a keyed BLAKE2b, so that
    nobody without the secret can aim a record at a key."""
    return hashlib.blake2b(identity, digest_size=16, key=secret[:64], person=domain[:16]).digest()


def encode(kind, identity, body):
    """header | identity | body."""
    if len(identity) > MAX_IDENTITY_BYTES:
        raise ValueError("identity: %d bytes exceed %d" % (len(identity), MAX_IDENTITY_BYTES))
    return b"".join((HEADER.pack(MAGIC, VERSION, kind, len(identity), len(body)), identity, body))


def decode(payload, kind, identity, body_bytes=None):
    """The body of `payload` as a memoryview if it is a well-formed record of `kind` for exactly
    `identity` (and, when given, of exactly `body_bytes`); None otherwise."""
    mv = memoryview(payload)
    if len(mv) < HEADER.size:
        return None
    magic, version, k, n_id, n_body = HEADER.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION or k != kind or n_id != len(identity):
        return None
    if HEADER.size + n_id + n_body != len(mv):
        return None
    if body_bytes is not None and n_body != body_bytes:
        return None
    if mv[HEADER.size:HEADER.size + n_id] != identity:
        return None
    return mv[HEADER.size + n_id:]


def as_bytes_view(value, arg):
    """A flat uint8 memoryview of a numpy array, a torch tensor (CPU) or a bytes-like object."""
    if value is None:
        raise TypeError("%s: must be an array or bytes-like (got None)" % arg)
    if type(value).__module__.startswith("torch"):
        if getattr(value, "device", None) is not None and str(value.device) != "cpu":
            raise ValueError("%s: a tensor on %s; give a CPU tensor" % (arg, value.device))
        value = _torch_bytes(value.contiguous())
    try:
        mv = memoryview(value)
    except TypeError:
        raise TypeError("%s: must be an array or bytes-like (got %s)" % (arg, type(value).__name__)) from None
    if not mv.c_contiguous:
        raise ValueError("%s: must be C-contiguous" % arg)
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def writable_bytes_view(target, arg):
    """A writable flat uint8 memoryview of `target` (numpy array, CPU torch tensor, bytearray)."""
    if type(target).__module__.startswith("torch"):
        if str(target.device) != "cpu":
            raise ValueError("%s: a tensor on %s; give a CPU tensor" % (arg, target.device))
        if not target.is_contiguous():
            raise ValueError("%s: must be contiguous" % arg)
        target = _torch_bytes(target)
    try:
        mv = memoryview(target)
    except TypeError:
        raise TypeError("%s: must be a writable array (got %s)" % (arg, type(target).__name__)) from None
    if mv.readonly:
        raise ValueError("%s: is read-only" % arg)
    if not mv.c_contiguous:
        raise ValueError("%s: must be C-contiguous" % arg)
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _torch_bytes(t):
    """A uint8 numpy view of a contiguous CPU tensor's bytes (any dtype, bfloat16 included)."""
    import torch
    return t.view(-1).view(torch.uint8).numpy()
