"""Replays a scheduler trace (docs/ENGINES.md, "Scheduler traces") against any object with the
method surface of vLLM v1's KVCacheManager, and records what the scheduler would observe.

The replay is the scheduler's side only: requests, their tokens and their computed counts, in the
order vLLM's scheduler calls the manager (get_computed_blocks then allocate_slots for a waiting
request; allocate_slots for a running one; free; reset_prefix_cache), and after every step the
pool's free blocks, each running request's block count, the prefix-cache stats and the KV events.
It imports nothing but the standard library, so the same file drives Tessera's adapter (the tests)
and any other manager with that surface.
"""

import hashlib
import pickle
from collections.abc import Sequence

TRACE_FORMAT = "tessera-kv-trace/1"

# The parent of a request's first block in sha256_block_hasher (vLLM seeds its own from
# PYTHONHASHSEED or at random; any fixed 32 bytes model it).
NONE_HASH = hashlib.sha256(b"kv_trace none hash").digest()


class ConstantList(Sequence):
    """A read-only view of a list, as vLLM's vllm.v1.utils.ConstantList (Request.all_token_ids is
    one): indexing, slicing (a list), len and iteration; no mutation, and not a list."""

    def __init__(self, x):
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)

    def __contains__(self, item):
        return item in self._x

    def index(self, item, start=0, stop=None):
        return self._x.index(item, start, len(self._x) if stop is None else stop)

    def __repr__(self):
        return "ConstantList(%r)" % (self._x,)


def prompt_tokens(runs):
    """A prompt from its runs: [[first, count], ...] -> first, first + 1, ... for each run."""
    out = []
    for first, count in runs:
        out.extend(range(first, first + count))
    return out


def decode_token(out_seed, num_tokens):
    """The token a request samples when it holds `num_tokens` tokens (deterministic)."""
    return 50000 + (out_seed * 131 + num_tokens) % 10000


class TraceRequest:
    """The fields of vLLM's Request that a KV-cache manager reads."""

    def __init__(self, request_id, prompt, block_hasher=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt)
        self._all_token_ids = list(prompt)
        self.all_token_ids = ConstantList(self._all_token_ids)  # as vLLM's Request
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.lora_request = None
        self.cache_salt = None
        self.mm_features = []
        self.prompt_embeds = None
        self.block_hashes = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes = block_hasher(self)

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    def append_output_token_ids(self, token):
        self._all_token_ids.append(token)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))


def _block_extra_keys(r, start, end):
    """What vLLM's block hasher folds into the hash of the block of tokens [start, end) besides
    them (the behaviour of vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys at
    9aaf83ef, written here from its description): the LoRA adapter's name, (identifier, offset
    from the block's start) of each multimodal feature the block overlaps, the cache salt on the
    first block, a sha256 of the block's prompt embeddings — in that order; None when none."""
    keys = []
    lora = getattr(r, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    for f in getattr(r, "mm_features", None) or ():
        pos = f.mm_position
        if start < pos.offset + pos.length and pos.offset < end:
            keys.append((f.identifier, pos.offset - start))
    salt = getattr(r, "cache_salt", None)
    if start == 0 and salt:
        keys.append(salt)
    embeds = getattr(r, "prompt_embeds", None)
    if embeds is not None:
        block = embeds[start:end]
        data = block.detach().cpu().contiguous().numpy().tobytes() if hasattr(block, "detach") else bytes(block)
        keys.append(hashlib.sha256(data).digest())
    return tuple(keys) if keys else None


def sha256_block_hasher(block_size):
    """A block hasher shaped like vLLM's (``get_request_block_hasher(block_size, sha256)``): called
    with a request, it returns the 32-byte hashes of the whole blocks past ``request.block_hashes``,
    each a SHA-256 over the pickled (parent hash, the block's token ids, its extra keys)."""

    def hasher(r):
        start = len(r.block_hashes) * block_size
        parent = r.block_hashes[-1] if r.block_hashes else NONE_HASH
        out = []
        while start + block_size <= r.num_tokens:
            end = start + block_size
            item = (parent, tuple(r.all_token_ids[start:end]), _block_extra_keys(r, start, end))
            parent = hashlib.sha256(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)).digest()
            out.append(parent)
            start = end
        return out

    return hasher


def _group_counts(ids):
    """Per KV-cache group: [entries, real blocks] (entries include the null block, id 0, that a
    sliding-window group puts where a block left its window)."""
    return [[len(g), sum(1 for b in g if b != 0)] for g in ids]


def _held(ids):
    """Blocks a request holds: a count for one KV-cache group, per-group counts for several."""
    return len(ids[0]) if len(ids) == 1 else _group_counts(ids)


def replay(trace, manager, block_hasher=None):
    """Runs `trace` (a parsed trace file) through `manager`; returns the observations per step."""
    if trace.get("format") != TRACE_FORMAT:
        raise ValueError("trace: format must be %r" % TRACE_FORMAT)
    cfg = trace["config"]
    usable = cfg["num_gpu_blocks"] - 1
    must_fit = cfg.get("full_sequence_must_fit", True)
    specs = trace["requests"]
    reqs = {}      # id -> TraceRequest (not finished)
    running = {}   # id -> True while it holds blocks
    out = []
    for step in trace["steps"]:
        ops = []
        for op in step:
            if "run" in op:
                rid = op["run"]
                chunk = op.get("chunk", 1 << 30)
                lookahead = op.get("lookahead", 0)
                if rid not in reqs:
                    reqs[rid] = TraceRequest(rid, prompt_tokens(specs[rid]["prompt"]), block_hasher)
                r = reqs[rid]
                if rid not in running:
                    blocks, hit = manager.get_computed_blocks(r)
                    n = min(chunk, r.num_tokens - hit)
                    got = manager.allocate_slots(r, n, hit, blocks, num_lookahead_tokens=lookahead,
                                                 full_sequence_must_fit=must_fit)
                    ok = got is not None
                    if ok:
                        running[rid] = True
                        r.num_computed_tokens = hit + n
                    op_out = {"run": rid, "kind": "admit", "hit": hit, "ok": ok}
                    hit_ids = blocks.get_block_ids()
                    if len(hit_ids) > 1:  # several KV-cache groups: the hit blocks of each
                        op_out["hit_blocks"] = _group_counts(hit_ids)
                    ops.append(op_out)
                    continue
                if r.num_computed_tokens < r.num_tokens:
                    kind = "prefill"
                    n = min(chunk, r.num_tokens - r.num_computed_tokens)
                else:
                    kind = "decode"
                    r.append_output_token_ids(decode_token(specs[rid].get("out_seed", 0), r.num_tokens))
                    n = 1
                got = manager.allocate_slots(r, n, num_lookahead_tokens=lookahead)
                ok = got is not None
                if ok:
                    r.num_computed_tokens += n
                else:  # preempted: its blocks go, it waits to be admitted again
                    manager.free(r)
                    del running[rid]
                    r.num_computed_tokens = 0
                    r.num_preemptions += 1
                ops.append({"run": rid, "kind": kind, "ok": ok})
            elif "free" in op:
                rid = op["free"]
                r = reqs.pop(rid)
                if running.pop(rid, None):
                    manager.free(r)
                ops.append({"free": rid})
            elif "reset_prefix_cache" in op:
                ops.append({"reset_prefix_cache": bool(manager.reset_prefix_cache())})
            else:
                raise ValueError("trace: unknown op %r" % (op,))
        free = manager.block_pool.get_num_free_blocks()
        stats = manager.make_prefix_cache_stats()
        events = {"stored": 0, "removed": 0, "cleared": 0}
        groups = getattr(manager, "num_kv_cache_groups", 1)
        if groups > 1:  # several KV-cache groups: stored and removed blocks per group too
            events["stored_by_group"] = [0] * groups
            events["removed_by_group"] = [0] * groups
        for e in manager.take_events():
            name = type(e).__name__
            if name == "BlockStored":
                events["stored"] += len(e.block_hashes)
                if groups > 1:
                    events["stored_by_group"][e.group_idx] += len(e.block_hashes)
            elif name == "BlockRemoved":
                events["removed"] += len(e.block_hashes)
                if groups > 1:
                    events["removed_by_group"][e.group_idx] += len(e.block_hashes)
            elif name == "AllBlocksCleared":
                events["cleared"] += 1
        extra = {}
        if groups > 1:  # several KV-cache groups: cascade-attention prefixes and new block ids too
            extra["common_prefix_blocks"] = {rid: list(manager.get_num_common_prefix_blocks(rid))
                                             for rid in sorted(running)}
            extra["new_block_ids"] = len(manager.take_new_block_ids())
        out.append({
            **extra,
            "ops": ops,
            "blocks_in_use": usable - free,
            "usage": round(manager.usage, 9),
            "held": {rid: _held(manager.get_block_ids(rid)) for rid in sorted(running)},
            "stats": None if stats is None else {
                k: getattr(stats, k) for k in ("requests", "queries", "hits", "preempted_requests",
                                               "preempted_queries", "preempted_hits", "reset")},
            "events": events,
        })
    return out
