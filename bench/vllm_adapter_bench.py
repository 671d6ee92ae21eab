#!/usr/bin/env python3
"""tessera.vllm.KVCacheManager against a plain-Python prefix-cache manager on vLLM's scheduler
trace, same process, interleaved (issue 20 point 4). Loads no vLLM.

The trace: 1,024 requests sharing a 4,096-token prefix, each with 128 tokens of its own, 64-token
blocks (DeepSeek-V3, one KV-cache group). Each request is a vLLM-shaped request: its
``all_token_ids`` a read-only Sequence wrapper (as vLLM's ConstantList), its ``block_hashes``
computed once when it is built (as vLLM's Request does through its block hasher; the manager
never hashes). Timed per pass:

- admission: ``get_computed_blocks`` then ``allocate_slots`` for every request, as vLLM's
  scheduler calls them for a waiting request (the whole prompt in one chunk);
- decode steps: one token appended to every request, then ``allocate_slots(request, 1)`` for
  each; twice: the first opens a new block for every request (the prompts end on a block
  boundary), the second stays inside it (63 of a block's 64 steps);
- free: ``free`` for every request.

The baseline is the algorithm of vLLM's manager in plain Python (a dict from block hash to block,
a free queue, one block list per request; vllm/v1/core/block_pool.py and
single_type_kv_cache_manager.py at 9aaf83ef are the model; no vLLM code). The two alternate per
repeat (A, B, B, A, ...); reported: the median of each, the ratio baseline / Tessera and the
spread of the per-pair ratios. The garbage collector is off while a pass is timed (for both).
Times are the process's CPU time (time.process_time): on a shared machine a wall clock counts the
slices the process waited for a core, which land at random in either side's millisecond-long pass.

    cmake --preset release && cmake --build build/release --target tessera_python
    PYTHONPATH=build/release/python /usr/bin/python3 bench/vllm_adapter_bench.py --repeats 5
"""

import argparse
import gc
import hashlib
import json
import statistics
import time
from collections import deque
from collections.abc import Sequence

from tessera.vllm import KVCacheManager

REQUESTS, SHARED, OWN, BLOCK = 1024, 4096, 128, 64


class ConstantList(Sequence):
    """A read-only view of a list (the shape of vLLM's ConstantList)."""

    def __init__(self, x):
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)


class Request:
    """The fields of vLLM's Request a KV-cache manager reads."""

    def __init__(self, rid, prompt):
        self.request_id = rid
        self._tokens = list(prompt)
        self.all_token_ids = ConstantList(self._tokens)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.cache_salt = None
        self.lora_request = None
        self.mm_features = []
        self.prompt_embeds = None
        self.block_hashes = []
        self._hash_blocks()

    @property
    def num_tokens(self):
        return len(self._tokens)

    def _hash_blocks(self):
        while (len(self.block_hashes) + 1) * BLOCK <= len(self._tokens):
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if i else b""
            chunk = repr(self._tokens[i * BLOCK:(i + 1) * BLOCK]).encode()
            self.block_hashes.append(hashlib.sha256(parent + chunk).digest())

    def append_output_token_ids(self, token):
        self._tokens.append(token)
        self._hash_blocks()


class PlainPythonManager:
    """vLLM's manager's algorithm for one group, in plain Python (the baseline)."""

    def __init__(self, num_blocks):
        self.free = deque(range(1, num_blocks))
        self.cached = {}      # block hash -> block
        self.hash_of = {}     # block -> hash
        self.ref = [0] * num_blocks
        self.blocks = {}      # request id -> [block]
        self.num_cached = {}  # request id -> full blocks cached

    def get_computed_blocks(self, r):
        hit = []
        for h in r.block_hashes[:(r.num_tokens - 1) // BLOCK]:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit, len(hit) * BLOCK

    def _take(self):
        b = self.free.popleft()
        h = self.hash_of.pop(b, None)
        if h is not None and self.cached.get(h) == b:
            del self.cached[h]
        return b

    def allocate_slots(self, r, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None):
        blocks = self.blocks.get(r.request_id)
        if blocks is None:
            blocks = self.blocks[r.request_id] = []
            for b in new_computed_blocks or ():
                if self.ref[b] == 0:
                    self.free.remove(b)
                self.ref[b] += 1
                blocks.append(b)
            self.num_cached[r.request_id] = len(blocks)
        total = r.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = -(-total // BLOCK) - len(blocks)
        if need > len(self.free):
            return None
        new = []
        for _ in range(need):
            b = self._take()
            self.ref[b] = 1
            new.append(b)
        blocks.extend(new)
        full = min(total, r.num_tokens) // BLOCK
        for i in range(self.num_cached[r.request_id], full):
            h = r.block_hashes[i]
            self.hash_of[blocks[i]] = h
            self.cached.setdefault(h, blocks[i])
        self.num_cached[r.request_id] = max(full, self.num_cached[r.request_id])
        return new

    def free_request(self, r):
        for b in reversed(self.blocks.pop(r.request_id)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        del self.num_cached[r.request_id]


def prompts():
    shared = list(range(1, SHARED + 1))
    return [shared + [100000 + i * OWN + j for j in range(OWN)] for i in range(REQUESTS)]


def num_blocks():
    return SHARED // BLOCK + REQUESTS * (OWN // BLOCK + 2) + 8


def run(kind, ps):
    """One pass: (admission s, decode step s, free s) over all requests."""
    reqs = [Request("r%d" % i, p) for i, p in enumerate(ps)]
    if kind == "tessera":
        m = KVCacheManager(num_gpu_blocks=num_blocks(), block_size=BLOCK, max_model_len=SHARED + OWN + 1024,
                           max_requests=REQUESTS + 1)

        def free(r):
            m.free(r)
    else:
        m = PlainPythonManager(num_blocks())

        def free(r):
            m.free_request(r)
    # A full collection walks every item of the 1,024 prompt lists (~4.3M): it would land in
    # whichever pass allocates at that moment. Collected before, off while timed, for both.
    gc.collect()
    gc.disable()
    t0 = time.process_time()
    for r in reqs:
        blocks, hit = m.get_computed_blocks(r)
        if m.allocate_slots(r, r.num_tokens - hit, hit, blocks) is None:
            raise SystemExit("%s: admission of %s refused" % (kind, r.request_id))
        r.num_computed_tokens = r.num_tokens
    t1 = time.process_time()
    steps = []
    for _ in range(2):  # the first step opens a block for every request; the second stays in it
        for r in reqs:
            r.append_output_token_ids(7)
        t2 = time.process_time()
        for r in reqs:
            if m.allocate_slots(r, 1) is None:
                raise SystemExit("%s: decode of %s refused" % (kind, r.request_id))
            r.num_computed_tokens += 1
        steps.append(time.process_time() - t2)
    t3 = time.process_time()
    for r in reqs:
        free(r)
    t4 = time.process_time()
    gc.enable()
    return t1 - t0, steps[0], steps[1], t4 - t3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats: must be >= 1 (got %d)" % args.repeats)
    ps = prompts()
    times = {"tessera": [], "python": []}
    for i in range(args.repeats):
        order = ("tessera", "python") if i % 2 == 0 else ("python", "tessera")
        for kind in order:
            times[kind].append(run(kind, ps))
    out = {}
    names = ("admission_us_per_request", "decode_step_new_block_ms", "decode_step_ms", "free_us_per_request")
    for j, name in enumerate(names):
        scale = 1e3 if name.endswith("_ms") else 1e6 / REQUESTS
        t = statistics.median(x[j] for x in times["tessera"]) * scale
        p = statistics.median(x[j] for x in times["python"]) * scale
        pairs = [b[j] / a[j] for a, b in zip(times["tessera"], times["python"])]
        out[name] = {"tessera": round(t, 2), "plain_python": round(p, 2), "ratio_python_over_tessera": round(p / t, 2),
                     "ratio_per_pair_min_max": [round(min(pairs), 2), round(max(pairs), 2)]}
    out["trace"] = {"requests": REQUESTS, "shared_prefix": SHARED, "own_tokens": OWN, "block_size": BLOCK,
                    "repeats": args.repeats}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
