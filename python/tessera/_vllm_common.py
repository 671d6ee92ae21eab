"""What tessera.vllm's one-group and hybrid managers share: vLLM's value types (KVCacheBlocks,
PrefixCacheStats, the KV events), a request's identity (the salt of its prefix keys, the extra
keys of its blocks), the one int check (``_int``) and the one BLAKE2b block chain (``chain_hash``,
``extend_chain``; the connector's tier keys too). Imports neither manager."""

import hashlib
import importlib.util
import struct
import sys
from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """vLLM's PrefixCacheStats: queries and hits in tokens, per make_prefix_cache_stats() period."""
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens, num_hits, preempted):
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


# KV events in the shape vLLM publishes them (vllm/distributed/kv_events.py).
@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object = None
    medium: str = "GPU"
    lora_name: object = None
    extra_keys: object = None
    group_idx: int = 0
    kv_cache_spec_kind: str = "mla_attention"
    kv_cache_spec_sliding_window: object = None


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: str = "GPU"
    group_idx: int = 0


@dataclass
class AllBlocksCleared:
    pass


_VLLM_EVENTS = None


def event_classes():
    """(BlockStored, BlockRemoved, AllBlocksCleared): vLLM's own (vllm.distributed.kv_events) when
    vLLM is importable, so that its consumers' isinstance checks and msgspec encoding hold; else
    the stand-ins above, with the same fields."""
    global _VLLM_EVENTS
    if _VLLM_EVENTS is None:
        _VLLM_EVENTS = (BlockStored, BlockRemoved, AllBlocksCleared)
        try:
            ke = sys.modules.get("vllm.distributed.kv_events")  # already imported: vLLM's own
            if ke is None and importlib.util.find_spec("vllm") is not None:
                from vllm.distributed import kv_events as ke
            if ke is not None:
                _VLLM_EVENTS = (ke.BlockStored, ke.BlockRemoved, ke.AllBlocksCleared)
        except Exception:  # a vLLM that does not import: the stand-ins
            pass
    return _VLLM_EVENTS


def block_extra_keys(request, start, end):
    """What vLLM's hasher adds to the block of tokens [start, end), as vLLM reports it in
    BlockStored.extra_keys: the LoRA name, (feature identifier, its offset from the block's start)
    for each multimodal feature the block overlaps, the cache salt on the first block, a sha256 of
    the block's prompt embeddings. None when there are none."""
    keys = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    for f in getattr(request, "mm_features", None) or ():
        pos = f.mm_position
        if pos.offset < end and start < pos.offset + pos.length:
            keys.append((f.identifier, pos.offset - start))
    salt = getattr(request, "cache_salt", None)
    if start == 0 and salt:
        keys.append(salt)
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        block = embeds[start:end]
        data = block.detach().cpu().contiguous().numpy().tobytes() if hasattr(block, "detach") else bytes(block)
        keys.append(hashlib.sha256(data).digest())
    return tuple(keys) if keys else None


def stored_event(request, block_hashes, parent, start, end, block_size, group_idx=0, **spec):
    """A BlockStored for the request's blocks of tokens [start, end), filled as vLLM fills it
    (vllm/v1/core/block_pool.py cache_full_blocks at 9aaf83ef)."""
    lora = getattr(request, "lora_request", None)
    extra = [block_extra_keys(request, b, b + block_size) for b in range(start, end, block_size)]
    return event_classes()[0](
        block_hashes=block_hashes, parent_block_hash=parent, token_ids=list(request.all_token_ids[start:end]),
        block_size=block_size, lora_id=getattr(lora, "lora_int_id", None) if lora is not None else None,
        medium="GPU", lora_name=lora.lora_name if lora is not None else None,
        extra_keys=extra if extra else None, group_idx=group_idx, **spec)


class KVCacheBlocks:
    """vLLM's KVCacheBlocks: one list of block ids per KV-cache group; ``get_block_ids()`` ->
    ``([ids of group 0], [ids of group 1], ...)``. ``KVCacheBlocks(ids)`` is one group."""

    __slots__ = ("blocks",)

    def __init__(self, ids=()):
        self.blocks = (list(ids),)

    @classmethod
    def of_list(cls, ids):
        """One group over `ids` itself (a list the caller hands over and no longer touches)."""
        kb = cls.__new__(cls)
        kb.blocks = (ids,)
        return kb

    @classmethod
    def of_groups(cls, groups):
        kb = cls.__new__(cls)
        kb.blocks = tuple(list(g) for g in groups)
        return kb

    def get_block_ids(self, allow_none=False):
        if allow_none and not any(self.blocks):
            return None
        return tuple(list(g) for g in self.blocks)

    def __add__(self, other):
        if len(self.blocks) != len(other.blocks):
            raise ValueError("other: %d groups, these blocks have %d" % (len(other.blocks), len(self.blocks)))
        return KVCacheBlocks.of_groups([a + b for a, b in zip(self.blocks, other.blocks)])

    def new_empty(self):
        return KVCacheBlocks.of_groups([[] for _ in self.blocks])

    def __len__(self):
        return len(self.blocks[0])


def request_scope(request):
    """What makes two equal token runs of two requests different KV, besides multimodal inputs
    (which vLLM keys per block): the request's ``cache_salt``, its LoRA adapter's name and a
    SHA-256 of its prompt embeddings, as text ("" for each it lacks). The one reading of these
    fields for the manager (``identity_salt``) and the connector's keys."""
    salt = getattr(request, "cache_salt", None)
    lora = getattr(request, "lora_request", None)
    embeds = getattr(request, "prompt_embeds", None)
    digest = ""
    if embeds is not None:
        data = embeds.detach().cpu().contiguous().numpy().tobytes() if hasattr(embeds, "detach") else bytes(embeds)
        digest = hashlib.sha256(data).hexdigest()
    return (str(salt) if salt else "", "" if lora is None else str(getattr(lora, "lora_name", lora)), digest)


def _salt_of(parts):
    """A nonzero 64-bit salt over length-prefixed `parts` (BLAKE2b-64)."""
    h = hashlib.blake2b(b"\1".join(len(p).to_bytes(4, "little") + p for p in parts), digest_size=8).digest()
    return int.from_bytes(h, "little") or 1


def scope_salt(request):
    """The salt of a caller-keyed admission (ADR 0045): the request's ``cache_salt`` and LoRA
    adapter's name, the inputs vLLM's hashes fold into every block of a request alike (the salt
    into block 0, which every later block chains over; the LoRA name into each), so that keys which
    vLLM's hashes already keep apart are kept apart by Tessera's key and check as well — a hash
    list that is wrong still never crosses a salt or an adapter. Multimodal features and prompt
    embeddings are left to vLLM's per-block hashes (a request-wide salt would be coarser). 0 when
    the request has neither."""
    salt = getattr(request, "cache_salt", None)
    lora = getattr(request, "lora_request", None)
    if not salt and lora is None:
        return 0
    parts = []
    if salt:
        parts.append(b"salt\0" + str(salt).encode("utf-8", "surrogatepass"))
    if lora is not None:
        parts.append(b"lora\0" + str(getattr(lora, "lora_name", lora)).encode("utf-8", "surrogatepass"))
    return _salt_of(parts)


def identity_salt(request):
    """The 64-bit cache salt that keeps apart what vLLM's block hashes keep apart (the extra keys of
    vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys at 9aaf83ef): the request's
    ``cache_salt``, its LoRA adapter's name, its multimodal features' identifiers with their
    positions, and its prompt embeddings. 0 when it has none of them (plain token prefixes).

    One salt per request, over all its blocks: coarser than vLLM for multimodal features (vLLM
    keys only the blocks at and after a feature; here a request with an image never shares even
    the blocks before it with one without) — never a hit vLLM would not give, fewer in that case.
    The token path's salt: a request admitted by vLLM's own 32-byte block hashes (ADR 0045) has
    vLLM's identity per block, and ``scope_salt``.
    """
    features = getattr(request, "mm_features", None)
    salt, lora, embeds = request_scope(request)
    if not (salt or lora or embeds or features):
        return 0  # plain token prefixes
    parts = []
    if salt:
        parts.append(b"salt\0" + salt.encode("utf-8", "surrogatepass"))
    if lora:
        parts.append(b"lora\0" + lora.encode("utf-8", "surrogatepass"))
    for f in features or ():
        pos = getattr(f, "mm_position", None)
        parts.append(b"mm\0%s\0%d\0%d" % (str(f.identifier).encode("utf-8", "surrogatepass"),
                                           getattr(pos, "offset", -1), getattr(pos, "length", -1)))
    if embeds:
        parts.append(b"embeds\0" + bytes.fromhex(embeds))
    if not parts:
        return 0
    return _salt_of(parts)


def _int(v, arg, lo=0, hi=None):
    """The one int check of the vLLM adapters: `v` if it is an int (not a bool) in [lo, hi] (hi None:
    no bound), else a TypeError / ValueError naming `arg`."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s: must be an int (got %s)" % (arg, type(v).__name__))
    if hi is not None:
        if not lo <= v <= hi:
            raise ValueError("%s: must be %d..%d (got %d)" % (arg, lo, hi, v))
    elif v < lo:
        raise ValueError("%s: must be >= %d (got %d)" % (arg, lo, v))
    return v


def chain_hash(parent, tokens, extra=b"", key=b"", person=b""):
    """The one BLAKE2b chain of the vLLM adapters: the 16-byte key of a block of `tokens` after the
    block keyed `parent` (bytes; b"" or the request's salt for the first), over the parent's key,
    the tokens as little-endian u32 and `extra`. The managers' prefix keys are unkeyed; the
    connector's tier keys are keyed (`key`: its secret, `person`: its domain) so that nobody
    without the secret can aim a record at a key. struct.error for a token outside [0, 2^32)."""
    return hashlib.blake2b(parent + struct.pack("<%dI" % len(tokens), *tokens) + extra, digest_size=16,
                           key=key, person=person).digest()


def extend_chain(hashes, tokens, size, upto, salt):
    """Appends to `hashes` (the chain keys of the first ``len(hashes)`` blocks of `size` tokens) the
    keys of the blocks up to `upto`; the first block's parent is the request's identity `salt`
    (identity_salt: 8 bytes little-endian, b"" for 0), as vLLM roots its chain in the request's
    extra keys. vLLM's placeholder id -1 is hashed as the u32 2^32-1 (PLACEHOLDER_TOKEN); any
    other token outside [0, 2^32) is a ValueError naming the block's tokens. Returns `hashes`."""
    for k in range(len(hashes), upto):
        parent = (hashes[k - 1] or b"") if k else (salt.to_bytes(8, "little") if salt else b"")
        chunk = tokens[k * size:(k + 1) * size]
        try:
            try:
                hashes.append(chain_hash(parent, chunk))
            except struct.error:  # vLLM's placeholder id -1
                hashes.append(chain_hash(parent, with_placeholders(chunk)))
        except struct.error:
            raise ValueError("request.all_token_ids: tokens must be ints in [0, 2^32) (tokens %d..%d)"
                             % (k * size, (k + 1) * size - 1)) from None
    return hashes


PLACEHOLDER_TOKEN = 0xFFFFFFFF  # vLLM's placeholder id -1 (image tokens in its tests), as the core's u32


def with_placeholders(tokens):
    """`tokens` with vLLM's placeholder id -1 as ``PLACEHOLDER_TOKEN`` (vLLM hashes -1 as any other
    id; the core reads u32). Anything else stays as it is, so a bad id is still named by the core."""
    return [PLACEHOLDER_TOKEN if t == -1 else t for t in tokens]
