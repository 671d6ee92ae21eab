"""tessera.vllm.KVCacheManager against vLLM's own KVCacheManager: each scheduler trace under
tests/data/engine_traces/ is replayed (kv_trace.replay) through Tessera's adapter, and what the
scheduler observes after every step — prefix-hit tokens of every admission, which allocations
were refused, blocks in use, blocks held per running request, usage, the prefix-cache stats and
the KV events (blocks stored / removed / all cleared) — must equal the figures vLLM's
KVCacheManager gave for the same trace (NAME.vllm.json: provenance inside; obtained by running
vLLM's code outside this repository)."""
import array
import glob
import json
import os
import unittest
from dataclasses import dataclass

import kv_trace
import tessera
from tessera import _core
from tessera.vllm import KVCacheManager, deepseek_v4_kv_cache_groups

DATA = os.path.join(os.environ.get("TESSERA_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                    "tests", "data", "engine_traces")


def manager_for(trace, **kw):
    c = trace["config"]
    extra = {k: c[k] for k in ("model", "max_num_batched_tokens") if k in c}  # DeepSeek-V4 traces
    extra.update(kw)
    return KVCacheManager(num_gpu_blocks=c["num_gpu_blocks"], block_size=c["block_size"],
                          max_model_len=c["max_model_len"], enable_caching=c["enable_caching"], log_stats=True,
                          enable_kv_cache_events=True, **extra)


class TracesEqualVllm(unittest.TestCase):
    def test_every_trace(self):
        names = sorted(glob.glob(os.path.join(DATA, "*.trace.json")))
        self.assertGreaterEqual(len(names), 5)
        for path in names:
            with self.subTest(trace=os.path.basename(path)):
                with open(path) as f:
                    trace = json.load(f)
                with open(path.replace(".trace.json", ".vllm.json")) as f:
                    want = json.load(f)
                self.assertEqual(want["provenance"]["commit"], "28be48fa944d8c58aeffd1ab1b56e27828c6b268")
                got = kv_trace.replay(trace, manager_for(trace))
                self.assertEqual(len(got), len(want["steps"]))
                for i, (g, w) in enumerate(zip(got, want["steps"])):
                    self.assertEqual(g, w, "%s: step %d differs from vLLM's" % (trace["name"], i))

    def test_traces_exercise_what_they_claim(self):
        # The figures must contain hits, refusals, evictions, preemptions and a reset, or the
        # comparison above proves less than it says.
        seen = {"hit": 0, "refused": 0, "removed": 0, "cleared": 0, "preempted": 0, "reset_refused": 0}
        for path in glob.glob(os.path.join(DATA, "*.vllm.json")):
            with open(path) as f:
                for s in json.load(f)["steps"]:
                    for o in s["ops"]:
                        seen["hit"] += o.get("hit", 0) > 0
                        seen["refused"] += o.get("kind") == "admit" and not o["ok"]
                        seen["preempted"] += o.get("kind") in ("prefill", "decode") and not o["ok"]
                        seen["reset_refused"] += o.get("reset_prefix_cache") is False
                    seen["removed"] += s["events"]["removed"]
                    seen["cleared"] += s["events"]["cleared"]
        for k, v in seen.items():
            self.assertGreater(v, 0, k)


class FreeFirst(unittest.TestCase):
    """Tessera's own reuse order (block_reuse="free-first") departs from vLLM only where the pools
    choose different victims: the figures docs/ENGINES.md and ADR 0024 quote."""

    def replay(self, name):
        with open(os.path.join(DATA, name + ".trace.json")) as f:
            trace = json.load(f)
        with open(os.path.join(DATA, name + ".vllm.json")) as f:
            want = json.load(f)["steps"]
        c = trace["config"]
        m = KVCacheManager(num_gpu_blocks=c["num_gpu_blocks"], block_size=c["block_size"],
                           max_model_len=c["max_model_len"], enable_caching=c["enable_caching"], log_stats=True,
                           enable_kv_cache_events=True, block_reuse="free-first")
        got = kv_trace.replay(trace, m)
        hits = [sum(o.get("hit", 0) for s in steps for o in s["ops"]) for steps in (got, want)]
        return got, want, [i for i, (g, w) in enumerate(zip(got, want)) if g != w], hits

    def test_departs_from_vllm_only_under_pressure(self):
        for name in ("prefix-sharing", "lookahead-reset", "mixed-no-caching"):
            self.assertEqual(self.replay(name)[2], [], name)
        got, want, diff, hits = self.replay("eviction-pressure")
        self.assertEqual(diff, [4, 7])
        self.assertEqual([o["hit"] for o in got[7]["ops"] if "hit" in o], [48, 32])
        self.assertEqual([o["hit"] for o in want[7]["ops"] if "hit" in o], [32, 16])
        self.assertEqual(hits, [912, 880])
        got, want, diff, hits = self.replay("mixed")
        self.assertEqual(len(diff), 12)
        self.assertEqual(hits[0], hits[1])
        for i in diff:  # only which blocks were evicted when
            g = dict(got[i], events=None)
            w = dict(want[i], events=None)
            self.assertEqual(g, w)


class Surface(unittest.TestCase):
    def make(self, **kw):
        args = dict(num_gpu_blocks=17, block_size=16, max_model_len=1024, log_stats=True, enable_kv_cache_events=True)
        args.update(kw)
        return KVCacheManager(**args)

    def test_block_ids_skip_the_null_block_and_free_keeps_blocks_cached(self):
        m = self.make()
        r = kv_trace.TraceRequest("a", range(40))
        blocks, hit = m.get_computed_blocks(r)
        self.assertEqual(hit, 0)
        new = m.allocate_slots(r, 40, 0, blocks)
        ids = new.get_block_ids()[0]
        self.assertEqual(len(ids), 3)
        self.assertNotIn(0, ids)
        self.assertTrue(all(1 <= b <= 16 for b in ids))
        self.assertEqual(m.get_block_ids("a"), (ids,))
        self.assertAlmostEqual(m.usage, 3 / 16)
        m.free(r)
        self.assertEqual(m.usage, 0.0)
        r2 = kv_trace.TraceRequest("b", range(40))
        blocks, hit = m.get_computed_blocks(r2)
        self.assertEqual(hit, 32)
        self.assertEqual(blocks.get_block_ids()[0], ids[:2])  # the same blocks, found again

    def test_arguments(self):
        m = self.make()
        r = kv_trace.TraceRequest("a", range(20))
        with self.assertRaisesRegex(ValueError, "num_new_computed_tokens.*not looked up"):
            m.allocate_slots(r, 4, 16)  # a prefix it never found
        m.get_computed_blocks(r)
        with self.assertRaisesRegex(TypeError, "num_new_tokens"):
            m.allocate_slots(r, "20")
        with self.assertRaisesRegex(ValueError, "num_lookahead_tokens"):
            m.allocate_slots(r, 20, num_lookahead_tokens=-1)
        with self.assertRaisesRegex(ValueError, "num_new_computed_tokens"):
            m.allocate_slots(r, 4, 16)
        with self.assertRaisesRegex(ValueError, "num_new_tokens"):
            m.allocate_slots(r, 0)
        with self.assertRaisesRegex(ValueError, "num_gpu_blocks"):
            self.make(num_gpu_blocks=1)
        with self.assertRaisesRegex(ValueError, "model"):
            self.make(model="no-such-model")
        with self.assertRaisesRegex(ValueError, "use_eagle"):
            self.make(use_eagle=True)

    def test_core_ids_are_handles(self):
        # The adapter's core calls return and take the binding's handles (generation << 32 | slot,
        # ADR 0039): an id kept past its free is refused and never reaches the request that reused
        # its slot (before: _vllm_admit returned the slot, so both lives had id 0).
        core = tessera.RequestManager("tiny-mla", capacity_blocks=16, max_requests=1, backed=False)
        a, _, _, _ = core._vllm_admit(list(range(40)))
        core._vllm_advance(a, 40, list(range(40)))
        core.free(a)
        b, hit, _, table = core._vllm_admit(list(range(100, 110)))
        self.assertEqual(hit, 0)
        self.assertNotEqual(a, b)
        self.assertEqual(a & 0xFFFFFFFF, b & 0xFFFFFFFF)  # the one slot, reused
        for name, call in (("_vllm_advance", lambda: core._vllm_advance(a, 16, list(range(16)))),
                           ("free", lambda: core.free(a))):
            with self.subTest(call=name):
                with self.assertRaisesRegex(ValueError, "^request_id: no live request"):
                    call()
        self.assertEqual(core.tokens(b), 0)  # b is as it was
        # The adapter's calls give the table in vLLM's ids: pool id + 1 (vLLM's block 0 is null);
        # an advance gives the blocks it added.
        self.assertEqual([x + 1 for x in core.block_table(b)], table)
        self.assertEqual(core._vllm_advance(b, 10, list(range(100, 110))), [x + 1 for x in core.block_table(b)])
        self.assertEqual(core._vllm_advance(b, 30, None), [x + 1 for x in core.block_table(b)][1:])
        self.assertEqual(core._vllm_advance(b, 0, list(range(110, 140))), [])
        self.assertEqual(core._vllm_table(b), [x + 1 for x in core.block_table(b)])

    def test_refused_allocation_changes_nothing(self):
        m = self.make(num_gpu_blocks=5)  # 4 blocks
        a = kv_trace.TraceRequest("a", range(60))
        blocks, hit = m.get_computed_blocks(a)
        self.assertIsNotNone(m.allocate_slots(a, 60, 0, blocks))
        b = kv_trace.TraceRequest("b", range(100, 120))
        blocks, hit = m.get_computed_blocks(b)
        self.assertIsNone(m.allocate_slots(b, 20, 0, blocks))
        self.assertEqual(m.block_pool.get_num_free_blocks(), 0)
        self.assertEqual(m.get_block_ids("b"), ([],))
        self.assertFalse(m.reset_prefix_cache())
        m.free(a)
        self.assertTrue(m.reset_prefix_cache())
        blocks, hit = m.get_computed_blocks(kv_trace.TraceRequest("c", range(60)))
        self.assertEqual(hit, 0)
        kinds = [type(e).__name__ for e in m.take_events()]
        self.assertEqual(kinds, ["BlockStored", "AllBlocksCleared"])


def load(name):
    with open(os.path.join(DATA, name + ".trace.json")) as f:
        trace = json.load(f)
    with open(os.path.join(DATA, name + ".vllm.json")) as f:
        return trace, json.load(f)


# vLLM's types for what a request carries into its block hashes (vllm/lora/request.py LoRARequest,
# vllm/multimodal/inputs.py MultiModalFeatureSpec and PlaceholderRange at 9aaf83ef): the fields the
# hasher reads.
@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass(frozen=True)
class PlaceholderRange:
    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalFeatureSpec:
    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"
    data: object = None


def request(rid, prompt, **fields):
    r = kv_trace.TraceRequest(rid, prompt)
    for k, v in fields.items():
        setattr(r, k, v)
    return r


class _IdentityCases:
    """The identity inputs every admission path keeps apart, as vLLM's hashes do: 0 hit tokens
    across identities, 48 of 49 within one (block_size 16). A mixin: the TestCase that uses it
    gives ``check(first, others, same)``."""

    def test_cache_salt(self):
        self.check({"cache_salt": "alice"}, [{"cache_salt": "bob"}, {}], {"cache_salt": "alice"})

    def test_lora(self):
        a, b = LoRARequest("adapter-a", 1), LoRARequest("adapter-b", 2)
        self.check({"lora_request": a}, [{"lora_request": b}, {}], {"lora_request": LoRARequest("adapter-a", 1)})

    def test_multimodal_features(self):
        def img(ident, offset=4):
            return [MultiModalFeatureSpec(ident, PlaceholderRange(offset, 8))]
        # The same placeholder ids, two different images; the same image at another position.
        self.check({"mm_features": img("img-1")}, [{"mm_features": img("img-2")}, {"mm_features": img("img-1", 5)}, {}],
                   {"mm_features": img("img-1")})


class BlockIdentity(_IdentityCases, unittest.TestCase):
    """Every input vLLM folds into a block hash keeps cached blocks apart (issue 20 point 2, issue
    27 point 3): vLLM at 9aaf83ef gave 0 hit tokens across identities and 48 of 49 within one, for
    each input below (block_size 16); before this fix Tessera's adapter hit 48 across them all."""

    PROMPT = list(range(1000, 1049))  # 3 whole blocks and one token

    def managers(self):
        yield "one group", KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024,
                                          enable_kv_cache_events=True)
        yield "deepseek-v4", KVCacheManager(num_gpu_blocks=2001, block_size=256, max_model_len=65536,
                                            model="deepseek-v4-flash", max_num_batched_tokens=2048,
                                            enable_kv_cache_events=True)

    def run_one(self, m, rid, prompt, **fields):
        r = request(rid, prompt, **fields)
        blocks, hit = m.get_computed_blocks(r)
        self.assertIsNotNone(m.allocate_slots(r, r.num_tokens - hit, hit, blocks))
        m.free(r)
        return hit

    def check(self, first, others, same):
        for name, m in self.managers():
            prompt = self.PROMPT if m.num_kv_cache_groups == 1 else list(range(1000, 1000 + 513))
            want = 48 if m.num_kv_cache_groups == 1 else 512
            with self.subTest(manager=name):
                self.assertEqual(self.run_one(m, "a", prompt, **first), 0)
                for i, o in enumerate(others):
                    self.assertEqual(self.run_one(m, "o%d" % i, prompt, **o), 0, o)
                self.assertEqual(self.run_one(m, "same", prompt, **same), want)

    def test_prompt_embeds(self):
        import torch
        e1 = torch.arange(49 * 4, dtype=torch.float32).reshape(49, 4)
        e2 = e1.clone()
        e2[3, 1] = -1.0
        for name, m in self.managers():
            if m.num_kv_cache_groups != 1:
                continue
            self.assertEqual(self.run_one(m, "a", self.PROMPT, prompt_embeds=e1), 0)
            self.assertEqual(self.run_one(m, "b", self.PROMPT, prompt_embeds=e2), 0)
            self.assertEqual(self.run_one(m, "c", self.PROMPT), 0)
            self.assertEqual(self.run_one(m, "d", self.PROMPT, prompt_embeds=e1.clone()), 48)

    def test_events_of_salted_blocks_differ(self):
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024, enable_kv_cache_events=True)
        self.run_one(m, "a", self.PROMPT, cache_salt="alice")
        self.run_one(m, "b", self.PROMPT, cache_salt="bob")
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual(len(stored), 2)
        self.assertNotEqual(stored[0].block_hashes, stored[1].block_hashes)

    def test_events_carry_what_vllm_puts_in_them(self):
        # As vllm/v1/core/block_pool.py cache_full_blocks at 9aaf83ef fills BlockStored: the LoRA's
        # id and name, per block the extra keys (LoRA name, (image id, offset from the block's
        # start), the salt on block 0). Before: lora_name and extra_keys always None.
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024, enable_kv_cache_events=True)
        img = [MultiModalFeatureSpec("img-1", PlaceholderRange(20, 8))]
        self.run_one(m, "a", self.PROMPT, cache_salt="alice", lora_request=LoRARequest("adapter-a", 3),
                     mm_features=img)
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual(len(stored), 1)
        e = stored[0]
        self.assertEqual((e.lora_id, e.lora_name, e.medium, e.group_idx), (3, "adapter-a", "GPU", 0))
        self.assertEqual(e.extra_keys, [("adapter-a", "alice"), ("adapter-a", ("img-1", 4)), ("adapter-a",)])
        self.assertEqual(len(e.block_hashes), 3)
        self.assertEqual(e.token_ids, self.PROMPT[:48])
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024, enable_kv_cache_events=True)
        self.run_one(m, "plain", self.PROMPT)
        e = [e for e in m.take_events() if type(e).__name__ == "BlockStored"][0]
        # vLLM lists one None per block (its list of per-block keys is not empty).
        self.assertEqual((e.lora_id, e.lora_name, e.extra_keys), (None, None, [None, None, None]))

    def test_v4_events_name_their_group(self):
        m = KVCacheManager(num_gpu_blocks=2001, block_size=256, max_model_len=65536, model="deepseek-v4-flash",
                           max_num_batched_tokens=2048, enable_kv_cache_events=True)
        self.run_one(m, "a", list(range(1000, 1513)), lora_request=LoRARequest("adapter-a", 3))
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual(sorted(e.group_idx for e in stored), [0, 1, 2, 3, 4])
        for e in stored:
            self.assertEqual(e.lora_name, "adapter-a")
            self.assertEqual(len(e.extra_keys), len(e.token_ids) // e.block_size)

    def test_prompt_logprobs_blocks_stay_reusable(self):
        # vLLM: a request that skips reading the cache (prompt_logprobs) takes no hit, but the
        # blocks it computes are cached: the next request hits 48. Before: 0 (a salt of its own).
        for name, m in self.managers():
            prompt = self.PROMPT if m.num_kv_cache_groups == 1 else list(range(1000, 1000 + 513))
            want = 48 if m.num_kv_cache_groups == 1 else 512
            with self.subTest(manager=name):
                self.assertEqual(self.run_one(m, "warm", prompt), 0)
                self.assertEqual(self.run_one(m, "logprobs", prompt, skip_reading_prefix_cache=True), 0)
                self.assertEqual(self.run_one(m, "next", prompt), want)
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024)
        self.assertEqual(self.run_one(m, "logprobs", self.PROMPT, skip_reading_prefix_cache=True), 0)
        self.assertEqual(self.run_one(m, "next", self.PROMPT), 48)


def keyed_request(rid, prompt, block_size, **fields):
    """A request as vLLM builds one with prefix caching on: its fields, then its block_hashes from a
    vLLM-shaped SHA-256 hasher (kv_trace.sha256_block_hasher), kept up to date as tokens are added."""
    r = request(rid, prompt, **fields)
    r._block_hasher = kv_trace.sha256_block_hasher(block_size)
    r.block_hashes = r._block_hasher(r)
    return r


class CallerKeys(_IdentityCases, unittest.TestCase):
    """Admission keyed by vLLM's own 32-byte block hashes (ADR 0045): the blocks vLLM's hashes tell
    apart, and only those, are apart — per block, as vLLM — and no prompt token crosses into the
    core for a hit."""

    PROMPT = BlockIdentity.PROMPT  # 3 whole blocks of 16 and one token

    def make(self, **kw):
        args = dict(num_gpu_blocks=65, block_size=16, max_model_len=1024, enable_kv_cache_events=True)
        args.update(kw)
        return KVCacheManager(**args)

    def run_one(self, m, rid, prompt, keyed=True, **fields):
        r = keyed_request(rid, prompt, 16, **fields) if keyed else request(rid, prompt, **fields)
        blocks, hit = m.get_computed_blocks(r)
        self.assertIs(m._pending[1].keyed, keyed and m.trust_block_hashes)  # the path this test means
        self.assertEqual(len(blocks), hit // 16)
        self.assertIsNotNone(m.allocate_slots(r, r.num_tokens - hit, hit, blocks))
        m.free(r)
        return hit

    def check(self, first, others, same, prompt=None, want=48):
        prompt = prompt or self.PROMPT
        m = self.make()
        self.assertEqual(self.run_one(m, "a", prompt, **first), 0)
        for i, o in enumerate(others):
            self.assertEqual(self.run_one(m, "o%d" % i, prompt, **o), 0, o)
        self.assertEqual(self.run_one(m, "same", prompt, **same), want)

    def test_prompt_embeds(self):
        import torch
        e1 = torch.arange(49 * 4, dtype=torch.float32).reshape(49, 4)
        e2 = e1.clone()
        e2[3, 1] = -1.0
        self.check({"prompt_embeds": e1}, [{"prompt_embeds": e2}, {}], {"prompt_embeds": e1.clone()})

    def test_an_image_in_block_3_keeps_blocks_0_to_2_shared(self):
        # vLLM keys a feature into the blocks it overlaps (and, by the chain, every block after):
        # the same prompt with and without an image at tokens 50..57 (block 3) shares blocks 0-2.
        # The token path's one salt per request shared none (0 here, before ADR 0045).
        prompt = list(range(2000, 2081))  # 5 whole blocks and one token
        img = [MultiModalFeatureSpec("img-1", PlaceholderRange(50, 8))]
        m = self.make()
        self.assertEqual(self.run_one(m, "plain", prompt), 0)
        self.assertEqual(self.run_one(m, "image", prompt, mm_features=img), 48)
        self.assertEqual(self.run_one(m, "image again", prompt, mm_features=list(img)), 80)
        self.assertEqual(self.run_one(m, "other image", prompt,
                                      mm_features=[MultiModalFeatureSpec("img-2", PlaceholderRange(50, 8))]), 48)
        self.assertEqual(self.run_one(m, "plain again", prompt), 80)

    def test_caller_keyed_and_token_keyed_blocks_never_share(self):
        m = self.make()
        self.assertEqual(self.run_one(m, "tokens", self.PROMPT, keyed=False), 0)
        self.assertEqual(self.run_one(m, "hashes", self.PROMPT), 0)  # the same tokens, keyed: apart
        self.assertEqual(self.run_one(m, "tokens again", self.PROMPT, keyed=False), 48)
        self.assertEqual(self.run_one(m, "hashes again", self.PROMPT), 48)
        # Forced token verification: the hashes are not read, the tokens hit.
        m = self.make(trust_block_hashes=False)
        self.assertEqual(self.run_one(m, "tokens", self.PROMPT, keyed=False), 0)
        self.assertEqual(self.run_one(m, "hashes", self.PROMPT), 48)
        with self.assertRaisesRegex(TypeError, "trust_block_hashes"):
            self.make(trust_block_hashes=1)

    def test_hashes_that_are_not_32_bytes_take_the_token_path(self):
        # vLLM's xxhash block hashes are 16 bytes (not collision resistant): verified by tokens.
        m = self.make()
        for rid in ("a", "b"):
            r = request(rid, self.PROMPT)
            r.block_hashes = [bytes([i]) * 16 for i in range(3)]
            blocks, hit = m.get_computed_blocks(r)
            self.assertFalse(m._pending[1].keyed)
            m.allocate_slots(r, 49 - hit, hit, blocks)
            m.free(r)
        self.assertEqual(hit, 48)

    def test_a_key_collision_is_refused_by_the_whole_hash(self):
        # Tessera's keys of caller-keyed blocks cut to 4 bits (hash_bits, as simulate
        # --hash-bits): requests with other hashes collide with the cached block 0 by key, and the
        # 32-byte compare refuses each. Fails if the compare is removed (those requests hit).
        m = self.make()
        m._core = _core.RequestManager("deepseek-v3", block_tokens=16, capacity_blocks=64, max_requests=64,
                                       backed=False, hash_bits=4, hash_key_seed=7, caller_keys=True)
        self.assertEqual(self.run_one(m, "a", self.PROMPT), 0)
        self.assertEqual(self.run_one(m, "a again", self.PROMPT), 48)
        import hashlib
        for j in range(64):
            r = request("b%d" % j, self.PROMPT)  # the same tokens, other hashes: another identity
            r.block_hashes = [hashlib.sha256(b"other %d %d" % (j, i)).digest() for i in range(3)]
            blocks, hit = m.get_computed_blocks(r)
            self.assertTrue(m._pending[1].keyed)
            self.assertEqual(hit, 0, "request b%d" % j)
            m.new_step_starts()  # looked up only: released
        mismatches = m._core.metrics()["tessera_prefix_key_mismatches_total"]["samples"][""]
        self.assertGreater(mismatches, 0)  # collisions happened, and were refused
        self.assertEqual(self.run_one(m, "a third time", self.PROMPT), 48)

    def test_blocks_sealed_later_are_keyed_by_their_hashes(self):
        # Prefill in chunks and decode: each block is sealed under request.block_hashes[i] once
        # full, so the next turn (the prompt and the output) hits them, keyed.
        m = self.make()
        r = keyed_request("a", range(3000, 3040), 16)
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 20, hit, blocks)  # a chunk: block 0 full
        r.num_computed_tokens = 20
        m.allocate_slots(r, 20)
        r.num_computed_tokens = 40
        for t in range(30):  # decode: blocks 2 and 3 fill
            r.append_output_token_ids(9000 + t)
            self.assertIsNotNone(m.allocate_slots(r, 1))
            r.num_computed_tokens += 1
        self.assertEqual(m._reqs["a"].cached_upto, 4)
        m.free(r)
        turn = list(range(3000, 3040)) + [9000 + t for t in range(30)] + [5, 6]
        self.assertEqual(self.run_one(m, "next turn", turn), 64)

    def test_a_block_whose_hash_is_missing_waits_unsealed(self):
        # A request whose block_hashes do not (yet) cover a full block: the block is not sealed
        # (under no key: never a token-keyed one), its tokens wait in the request, and the next
        # call that finds the hash seals it.
        m = self.make()
        r = keyed_request("a", range(4000, 4020), 16)
        r._block_hasher = None  # block_hashes stop growing
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 20, hit, blocks)
        r.num_computed_tokens = 20
        for t in range(16):
            r.append_output_token_ids(9100 + t)
            m.allocate_slots(r, 1)
            r.num_computed_tokens += 1
        self.assertEqual(m._reqs["a"].cached_upto, 1)  # block 1 is full, its hash missing
        probe = keyed_request("probe", list(r.all_token_ids) + [1], 16)
        self.assertEqual(m.get_computed_blocks(probe)[1], 16)
        m.new_step_starts()
        r.block_hashes.extend(kv_trace.sha256_block_hasher(16)(r))  # the hash arrives
        r.append_output_token_ids(7)
        m.allocate_slots(r, 1)
        self.assertEqual(m._reqs["a"].cached_upto, 2)
        self.assertEqual(m.get_computed_blocks(probe)[1], 32)

    def test_placeholder_ids(self):
        # vLLM's -1 placeholder ids behind images (test_mm_prefix_caching's prompt, keyed): the
        # hit reads no token; the computed tokens cross with -1 read as 2^32 - 1.
        common = list(range(10)) + [-1] * 10 + list(range(10, 20)) + [-1] * 18
        prompt = common + [-1] * 7 + [100] * 4
        imgs = [MultiModalFeatureSpec("aaa", PlaceholderRange(11, 10)), MultiModalFeatureSpec("bbb", PlaceholderRange(30, 18)),
                MultiModalFeatureSpec("ccc", PlaceholderRange(48, 7))]
        m = KVCacheManager(num_gpu_blocks=11, block_size=16, max_model_len=8192)
        self.assertEqual(self.run_one(m, "0", prompt, mm_features=imgs), 0)
        self.assertEqual(self.run_one(m, "1", prompt, mm_features=list(imgs)), 48)
        self.assertEqual(self.run_one(m, "2", prompt, mm_features=imgs[:2]), 48)  # ccc is in block 3 (not hit)
        other = [imgs[0], MultiModalFeatureSpec("bbx", PlaceholderRange(30, 18)), imgs[2]]
        self.assertEqual(self.run_one(m, "3", prompt, mm_features=other), 16)  # bbx starts in block 1
        with self.assertRaisesRegex(ValueError, "tokens"):
            r = keyed_request("4", [1, 2, -2] * 20, 16)
            blocks, hit = m.get_computed_blocks(r)
            m.allocate_slots(r, 60, hit, blocks)

    def test_prompt_logprobs_blocks_stay_reusable(self):
        m = self.make()
        self.assertEqual(self.run_one(m, "logprobs", self.PROMPT, skip_reading_prefix_cache=True), 0)
        self.assertEqual(self.run_one(m, "warm", self.PROMPT, skip_reading_prefix_cache=True), 0)
        self.assertEqual(self.run_one(m, "next", self.PROMPT), 48)

    def test_events_carry_vllms_block_hashes(self):
        m = self.make()
        r = keyed_request("a", self.PROMPT, 16, cache_salt="s")
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 49, hit, blocks)
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual([h for e in stored for h in e.block_hashes], r.block_hashes)
        self.assertEqual(stored[0].extra_keys, [("s",), None, None])
        m.free(r)
        self.assertEqual(m.reset_prefix_cache(), True)

    def test_traces_equal_vllm_through_the_keyed_path(self):
        # The one-group traces, every request carrying vLLM-shaped SHA-256 block hashes: the same
        # figures as vLLM's own manager gave.
        names = [p for p in sorted(glob.glob(os.path.join(DATA, "*.trace.json")))
                 if not os.path.basename(p).startswith("v4-")]
        self.assertGreaterEqual(len(names), 5)
        for path in names:
            with self.subTest(trace=os.path.basename(path)):
                with open(path) as f:
                    trace = json.load(f)
                with open(path.replace(".trace.json", ".vllm.json")) as f:
                    want = json.load(f)
                m = manager_for(trace)
                got = kv_trace.replay(trace, m, kv_trace.sha256_block_hasher(trace["config"]["block_size"]))
                self.assertEqual(got, want["steps"])

    def test_bad_hashes_are_named_and_change_nothing(self):
        m = self.make()
        free = m.block_pool.get_num_free_blocks()
        for bad, err, name in (([b"x" * 32, 5, b"y" * 32], TypeError, r"block_hashes\[1\]"),
                               ([b"x" * 32, b"y" * 32, b"z" * 31], ValueError, r"block_hashes\[2\]")):
            r = request("bad", self.PROMPT)
            r.block_hashes = bad
            with self.assertRaisesRegex(err, "^" + name):
                m.get_computed_blocks(r)
            self.assertEqual((m.block_pool.get_num_free_blocks(), m._core.live_requests), (free, 0))
        # A request admitted keyed whose later hash is not bytes: named, nothing appended.
        r = keyed_request("a", range(20), 16)
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 20, hit, blocks)
        r.num_computed_tokens = 20
        r._block_hasher = None
        for t in range(12):
            r.append_output_token_ids(t)
        r.block_hashes.append("not bytes")
        with self.assertRaisesRegex(TypeError, r"^block_hashes\[1\]"):
            m.allocate_slots(r, 12)
        self.assertEqual((m._reqs["a"].cached_upto, m._core.tokens(m._reqs["a"].rid)), (1, 20))
        core = _core.RequestManager("tiny-mla", capacity_blocks=16, backed=False)
        with self.assertRaisesRegex(ValueError, "^caller_keys"):
            core._vllm_admit_keyed([b"x" * 32], core.block_tokens + 1)

    def test_refused_where_blocks_are_verified_by_tokens(self):
        with self.assertRaisesRegex(ValueError, "^caller_keys: a pool that holds KV bytes"):
            _core.RequestManager("tiny-mla", capacity_blocks=16, caller_keys=True)
        with self.assertRaisesRegex(ValueError, "^caller_keys: .*sliding windows"):
            _core.RequestManager("deepseek-v4-flash", block_tokens=256, capacity_blocks=16, backed=False,
                                 caller_keys=True)


class WhatVllmPasses(unittest.TestCase):
    """vLLM's own call orders and types (issue 20 point 1)."""

    def make(self):
        return KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024)

    def test_all_token_ids_is_a_sequence_not_a_list(self):
        r = kv_trace.TraceRequest("a", range(49))
        self.assertNotIsInstance(r.all_token_ids, list)
        m = self.make()
        blocks, hit = m.get_computed_blocks(r)  # before: TypeError naming "prompt"
        self.assertEqual(hit, 0)
        self.assertIsNotNone(m.allocate_slots(r, 49, 0, blocks))
        m.free(r)
        for seq in (tuple(range(49)), array.array("I", range(49)), kv_trace.ConstantList(list(range(49)))):
            with self.subTest(kind=type(seq).__name__):
                q = kv_trace.TraceRequest("b", [])
                q.all_token_ids = seq
                blocks, hit = m.get_computed_blocks(q)
                self.assertEqual(hit, 48)
                m.allocate_slots(q, 1, hit, blocks)
                m.free(q)

    def test_allocate_slots_without_a_lookup(self):
        # vLLM's tests call allocate_slots for a new request without get_computed_blocks: no prefix
        # taken, the blocks still cached. Before: ValueError "was not looked up".
        m = self.make()
        r = kv_trace.TraceRequest("a", range(49))
        new = m.allocate_slots(r, 49)
        self.assertEqual(len(new.get_block_ids()[0]), 4)
        m.free(r)
        blocks, hit = m.get_computed_blocks(kv_trace.TraceRequest("b", range(49)))
        self.assertEqual(hit, 48)


class TwoKinds(unittest.TestCase):
    """KVCacheManager is a factory over two classes, one per kind of model (issue 25 point 3)."""

    def test_the_factory_builds_one_class_per_kind(self):
        from tessera._vllm_hybrid import HybridManager
        from tessera._vllm_kvbase import ManagerBase
        from tessera._vllm_one_group import OneGroupManager
        one = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024)
        v4 = KVCacheManager(num_gpu_blocks=2001, block_size=256, max_model_len=65536, model="deepseek-v4-flash")
        given = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024,
                               kv_cache_groups=[{"block_size": 16}, {"block_size": 4, "sliding_window": 8}])
        self.assertIs(type(one), OneGroupManager)
        self.assertIs(type(v4), HybridManager)
        self.assertIs(type(given), HybridManager)
        for m in (one, v4, given):
            self.assertIsInstance(m, KVCacheManager)
            self.assertIsInstance(m, ManagerBase)
            self.assertFalse(hasattr(m, "_hybrid"))
        self.assertEqual((one.num_kv_cache_groups, v4.num_kv_cache_groups, given.num_kv_cache_groups), (1, 5, 2))
        with self.assertRaisesRegex(ValueError, "kv_cache_groups"):
            OneGroupManager(num_gpu_blocks=33, block_size=16, max_model_len=1024, kv_cache_groups=[{}])
        with self.assertRaisesRegex(ValueError, "model: deepseek-v4-flash has sliding windows"):
            OneGroupManager(num_gpu_blocks=33, block_size=256, max_model_len=1024, model="deepseek-v4-flash")

    def test_the_modules_import_downwards_only(self):
        # No import cycle held apart by imports inside functions: every import of the package's
        # own modules is at module level (vLLM's optional one in event_classes is not the
        # package's), and neither kind imports the other or the factory.
        import ast
        import tessera
        root = os.path.dirname(tessera.__file__)
        names = ("_vllm_common", "_vllm_kvbase", "_vllm_one_group", "_vllm_hybrid", "_vllm_manager")
        below = {n: set(names[:i]) | {"_core"} for i, n in enumerate(names)}
        below["_vllm_one_group"].discard("_vllm_hybrid")
        below["_vllm_hybrid"].discard("_vllm_one_group")
        for n in names:
            with self.subTest(module=n):
                with open(os.path.join(root, n + ".py")) as f:
                    tree = ast.parse(f.read())
                top = set(tree.body)
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.level == 1:  # the package's own modules
                        self.assertIn(node, top, "%s: an import inside a function (line %d)" % (n, node.lineno))
                        got = {node.module} if node.module else {a.name for a in node.names}
                        self.assertLessEqual(got, below[n], "%s imports %s" % (n, got))

    def test_one_chain_for_both_kinds_and_placeholders_in_one_group_events(self):
        # The one-group manager's event keys are the chain the hybrid manager indexes by
        # (_vllm_common.extend_chain), vLLM's placeholder -1 included. Before: the one-group
        # events hashed -1 with struct.pack and allocate_slots raised struct.error after the
        # core had advanced.
        from tessera._vllm_common import PLACEHOLDER_TOKEN, chain_hash, extend_chain
        toks = [1, -1, -1, 2, 3, 4, 5, 6, 7]
        m = KVCacheManager(num_gpu_blocks=33, block_size=4, max_model_len=1024, enable_kv_cache_events=True)
        r = kv_trace.TraceRequest("a", toks)
        blocks, hit = m.get_computed_blocks(r)
        self.assertEqual(len(m.allocate_slots(r, r.num_tokens - hit, hit, blocks).get_block_ids()[0]), 3)
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual(len(stored), 1)
        want = extend_chain([], toks, 4, 2, 0)
        self.assertEqual(stored[0].block_hashes, want)
        first = chain_hash(b"", [1, PLACEHOLDER_TOKEN, PLACEHOLDER_TOKEN, 2])
        self.assertEqual(want, [first, chain_hash(first, [3, 4, 5, 6])])
        with self.assertRaisesRegex(ValueError, r"^request.all_token_ids: .*tokens 0..3"):
            extend_chain([], [1, -2, 3, 4], 4, 1, 0)


class CountingCore:
    """Counts the calls the adapter makes into its core (the boundary cost of issue 20 point 4)."""

    def __init__(self, core):
        self._c = core
        self.calls = []

    def __getattr__(self, name):
        v = getattr(self._c, name)
        self.calls.append(name)
        return v


class VllmRunsPinned(unittest.TestCase):
    """Behaviours vLLM's own tests (tests/v1/core/test_prefix_caching.py at fork 28be48fa9, run with
    only the class swapped: docs/ENGINES.md) and its scheduler's hot path showed, with vLLM's figures."""

    def test_placeholder_ids(self):
        # test_mm_prefix_caching: -1 placeholder ids behind two images; vLLM allocates blocks
        # [1, 2, 3, 4] for 59 tokens and a request with the same images hits its 3 whole blocks.
        # Before: ValueError "prompt[10]: must not be negative (got -1)".
        common = list(range(10)) + [-1] * 10 + list(range(10, 20)) + [-1] * 18
        prompt = common + [-1] * 7 + [100] * 4
        imgs = [MultiModalFeatureSpec("aaa", PlaceholderRange(11, 10)), MultiModalFeatureSpec("bbb", PlaceholderRange(30, 18)),
                MultiModalFeatureSpec("ccc", PlaceholderRange(48, 7))]
        m = KVCacheManager(num_gpu_blocks=11, block_size=16, max_model_len=8192)
        r0 = request("0", prompt, mm_features=imgs)
        blocks, hit = m.get_computed_blocks(r0)
        self.assertEqual(hit, 0)
        self.assertEqual(m.allocate_slots(r0, 59, 0, blocks).get_block_ids(), ([1, 2, 3, 4],))
        m.free(r0)
        blocks, hit = m.get_computed_blocks(request("1", prompt, mm_features=list(imgs)))
        self.assertEqual(hit, 48)
        with self.assertRaisesRegex(ValueError, "prompt"):
            m.get_computed_blocks(request("2", [1, 2, -2]))

    def test_placeholder_ids_deepseek_v4(self):
        # The same for the hybrid manager: 513 tokens with an image's -1 ids; the same request
        # again hits 512 (the V4 figure of BlockIdentity). Before: ValueError naming all_token_ids.
        prompt = list(range(1000, 1100)) + [-1] * 64 + list(range(2000, 2349))
        img = [MultiModalFeatureSpec("img-1", PlaceholderRange(100, 64))]
        m = KVCacheManager(num_gpu_blocks=2001, block_size=256, max_model_len=65536, model="deepseek-v4-flash",
                           max_num_batched_tokens=2048)
        for rid, want in (("a", 0), ("b", 512)):
            r = request(rid, prompt, mm_features=list(img))
            blocks, hit = m.get_computed_blocks(r)
            self.assertEqual(hit, want)
            self.assertIsNotNone(m.allocate_slots(r, r.num_tokens - hit, hit, blocks))
            m.free(r)
        with self.assertRaisesRegex(ValueError, "all_token_ids"):
            m.get_computed_blocks(request("c", [1, -2] * 300))

    def test_events_carry_vllms_block_hashes(self):
        # vLLM's BlockStored names the request's own block_hashes (its hasher's, extra keys
        # included). Before: the adapter's BLAKE2b chain, which no vLLM consumer can match.
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024, enable_kv_cache_events=True)
        r = request("a", range(49))
        r.block_hashes = [b"vllm-%d" % i for i in range(3)]
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 49, hit, blocks)
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual([h for e in stored for h in e.block_hashes], r.block_hashes)

    def test_vllms_event_classes_once_imported(self):
        # vLLM's own kv_events, already imported (vLLM loaded as a package without a spec, as
        # under vLLM's test runner shims): its classes, so isinstance checks hold (vLLM's
        # test_kv_cache_events_with_lora). Before: the stand-ins.
        import sys
        import types
        from tessera import _vllm_common
        mod = types.ModuleType("vllm.distributed.kv_events")
        for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            setattr(mod, name, type(name, (getattr(_vllm_common, name),), {}))
        saved = {k: sys.modules.get(k) for k in ("vllm", "vllm.distributed.kv_events")}
        sys.modules["vllm"] = types.ModuleType("vllm")
        sys.modules["vllm.distributed.kv_events"] = mod
        old, _vllm_common._VLLM_EVENTS = _vllm_common._VLLM_EVENTS, None
        try:
            self.assertIs(_vllm_common.event_classes()[0], mod.BlockStored)
        finally:
            _vllm_common._VLLM_EVENTS = old
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

    def test_batched_decode_equals_the_per_request_calls(self):
        # allocate_slots_batch: what vLLM's scheduler's decode loop gets from allocate_slots, one
        # request after another — blocks, and None (nothing changed) once the pool is out.
        def run(batched):
            m = KVCacheManager(num_gpu_blocks=12, block_size=4, max_model_len=1024)
            reqs = [request("r%d" % i, range(100 * i, 100 * i + 6)) for i in range(4)]
            for r in reqs:
                blocks, hit = m.get_computed_blocks(r)
                m.allocate_slots(r, r.num_tokens - hit, hit, blocks)
                r.num_computed_tokens = r.num_tokens
            seen = []
            for step in range(6):
                live = [r for r in reqs if r.request_id in m._reqs]
                for r in live:
                    r.append_output_token_ids(7)
                got = m.allocate_slots_batch(live, 1) if batched else [m.allocate_slots(r, 1) for r in live]
                for r, b in zip(live, got):
                    seen.append(None if b is None else b.get_block_ids())
                    if b is None:
                        m.free(r)
                    else:
                        r.num_computed_tokens += 1
            return seen, m.block_pool.get_num_free_blocks()
        per_request, batched = run(False), run(True)
        self.assertIn(None, per_request[0])
        self.assertEqual(batched, per_request)
        m = KVCacheManager(num_gpu_blocks=12, block_size=4, max_model_len=1024)
        with self.assertRaisesRegex(ValueError, "num_new_tokens"):
            m.allocate_slots_batch([request("a", range(4))], [1, 1])
        with self.assertRaisesRegex(TypeError, "num_new_tokens"):
            m.allocate_slots_batch([request("a", range(4))], "1")

    def test_lookahead_for_an_empty_prompt(self):
        # test_kv_cache_utils.py test_allocate_with_lookahead: a request with no prompt tokens,
        # allocate_slots(num_new_tokens=3, num_lookahead_tokens=2) without a lookup: vLLM hands out
        # ceil(5 / 4) = 2 blocks. Before: ValueError "prompt: must hold at least one token".
        m = KVCacheManager(num_gpu_blocks=10, block_size=4, max_model_len=100)
        self.assertEqual(len(m.allocate_slots(request("0", []), 3, num_lookahead_tokens=2).get_block_ids()[0]), 2)

    def test_a_decode_step_is_at_most_one_core_call(self):
        # vLLM's scheduler calls allocate_slots(request, 1) for every running request each step.
        # Inside the request's last block: no core call; a step that opens a block or fills one:
        # one. Before: an append per step, and 7 calls (block_table x3, available_blocks,
        # allocate, append, ...) for a step that opens a block.
        m = KVCacheManager(num_gpu_blocks=33, block_size=16, max_model_len=1024)
        r = request("a", range(32))
        blocks, hit = m.get_computed_blocks(r)
        m.allocate_slots(r, 32, hit, blocks)
        r.num_computed_tokens = 32
        core = m._core = CountingCore(m._core)
        per_step = []
        for t in range(17):
            r.append_output_token_ids(5000 + t)
            core.calls.clear()
            new = m.allocate_slots(r, 1)
            per_step.append(len(core.calls))
            r.num_computed_tokens += 1
            self.assertEqual(len(new.get_block_ids()[0]), 1 if t in (0, 16) else 0)
        self.assertEqual(per_step, [1] + [0] * 14 + [1, 1])
        # Bad counts still take the checked path on a running request, and change nothing.
        for bad in ({"num_lookahead_tokens": False}, {"num_new_computed_tokens": "0"}, {"num_new_tokens": True}):
            args = dict({"num_new_tokens": 1}, **bad)
            with self.assertRaisesRegex(TypeError, next(iter(bad))):
                m.allocate_slots(r, **args)
        self.assertEqual(m.get_block_ids("a"), ([1, 2, 3, 4],))
        m._core = core._c
        m.free(r)
        # The 16 decoded tokens sealed block 2: a prompt with them hits 48 of 49.
        blocks, hit = m.get_computed_blocks(request("b", list(range(32)) + [5000 + t for t in range(17)]))
        self.assertEqual(hit, 48)


# vLLM's KV-cache config types (vllm/v1/kv_cache_interface.py at 9aaf83ef): the fields the plugin reads.
@dataclass(frozen=True)
class MLAAttentionSpec:
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 576
    dtype: str = "fp8_ds_mla"


@dataclass(frozen=True)
class SlidingWindowMLASpec(MLAAttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclass(frozen=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


class VllmPlugin(unittest.TestCase):
    """The vllm.general_plugins entry point (issue 20 point 6), loaded as vLLM's plugin loader
    loads it (importlib.metadata entry point, .load(), called; maybe several times)."""

    def entry_point(self):
        import ast
        import importlib.metadata
        src = os.path.join(os.environ.get("TESSERA_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                           "setup.py")
        with open(src) as f:
            tree = ast.parse(f.read())
        eps = None
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "entry_points":
                eps = ast.literal_eval(node.value)
        self.assertIsNotNone(eps, "setup.py declares no entry_points")
        (spec,) = eps["vllm.general_plugins"]
        name, value = (x.strip() for x in spec.split("="))
        return importlib.metadata.EntryPoint(name=name, value=value, group="vllm.general_plugins")

    def test_swaps_the_schedulers_manager_only_when_asked(self):
        import sys
        import types
        from unittest import mock

        class VllmKVCacheManager:
            pass

        mod = types.ModuleType("vllm.v1.core.sched.scheduler")
        mod.KVCacheManager = VllmKVCacheManager
        with mock.patch.dict(sys.modules, {"vllm.v1.core.sched.scheduler": mod}):
            with mock.patch.dict(os.environ, {"TESSERA_VLLM_KV_CACHE_MANAGER": ""}):
                self.assertFalse(self.entry_point().load()())
                self.assertIs(mod.KVCacheManager, VllmKVCacheManager)
            with mock.patch.dict(os.environ, {"TESSERA_VLLM_KV_CACHE_MANAGER": "1"}):
                for _ in range(2):  # vLLM may load plugins more than once
                    self.assertTrue(self.entry_point().load()())
                self.assertIs(mod._vllm_kv_cache_manager, VllmKVCacheManager)
                # Built as the scheduler builds its manager (its keyword arguments).
                cfg = KVCacheConfig(num_blocks=65, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer.0"], MLAAttentionSpec(16))])
                m = mod.KVCacheManager(kv_cache_config=cfg, max_model_len=1024, max_num_batched_tokens=2048,
                                       enable_caching=True, use_eagle=False, log_stats=True,
                                       enable_kv_cache_events=True, dcp_world_size=1, pcp_world_size=1,
                                       hash_block_size=16, metrics_collector=None)
                self.assertIsInstance(m, KVCacheManager)
                self.assertEqual((m.block_pool.num_gpu_blocks, m.block_size), (65, 16))
                r = kv_trace.TraceRequest("a", range(40))
                self.assertIsNotNone(m.allocate_slots(r, 40))


class DeepSeekV4(unittest.TestCase):
    """vLLM's hybrid KV-cache groups for DeepSeek-V4 (ADR 0028): the group layout, what the V4
    traces exercise, the per-group surface, and where Tessera's own V4 manager differs."""

    def test_groups_are_vllms(self):
        # The groups vLLM built for each preset (recorded with its figures) are the adapter's.
        names = sorted(glob.glob(os.path.join(DATA, "v4-*.vllm.json")))
        self.assertGreaterEqual(len(names), 18)
        for path in names:
            with open(path) as f:
                inputs = json.load(f)["provenance"]["inputs"]
            want = inputs["kv_cache_groups"]
            got = deepseek_v4_kv_cache_groups(inputs["model"], 256)
            self.assertEqual([(g["block_size"], g["sliding_window"], g["layers"]) for g in want],
                             [(g["block_size"], g["sliding_window"], g["layers"]) for g in got], path)
            self.assertEqual([g["spec"] for g in want], ["MLAAttentionSpec"] + ["SlidingWindowMLASpec"] * 4)
        flash = deepseek_v4_kv_cache_groups("deepseek-v4-flash")
        pro = deepseek_v4_kv_cache_groups("deepseek-v4-pro")
        # Flash meets a CSA layer (its 4-token states) before an HCA one; Pro the other way round.
        self.assertEqual([g["block_size"] for g in flash], [256, 64, 64, 4, 8])
        self.assertEqual([g["block_size"] for g in pro], [256, 64, 64, 8, 4])

    def test_traces_exercise_what_they_claim(self):
        seen = {"hit": 0, "window_hit_with_nulls": 0, "refused": 0, "preempted": 0, "reset": 0}
        removed = [0] * 5
        for path in glob.glob(os.path.join(DATA, "v4-*.vllm.json")):
            with open(path) as f:
                for s in json.load(f)["steps"]:
                    for o in s["ops"]:
                        seen["hit"] += o.get("hit", 0) > 0
                        hb = o.get("hit_blocks")
                        if hb and o["hit"]:
                            seen["window_hit_with_nulls"] += all(n > real for n, real in hb[1:])
                        seen["refused"] += o.get("kind") == "admit" and not o["ok"]
                        seen["preempted"] += o.get("kind") in ("prefill", "decode") and not o["ok"]
                        seen["reset"] += o.get("reset_prefix_cache") is True
                    removed = [a + b for a, b in zip(removed, s["events"]["removed_by_group"])]
        for k, v in seen.items():
            self.assertGreater(v, 0, k)
        for g, n in enumerate(removed):
            self.assertGreater(n, 0, "evictions in group %d" % g)

    def make(self, **kw):
        args = dict(num_gpu_blocks=2001, block_size=256, max_model_len=65536, model="deepseek-v4-flash",
                    max_num_batched_tokens=2048, log_stats=True, enable_kv_cache_events=True)
        args.update(kw)
        return KVCacheManager(**args)

    def test_block_ids_per_group(self):
        m = self.make()
        self.assertEqual(m.num_kv_cache_groups, 5)
        r = kv_trace.TraceRequest("a", range(1000))
        blocks, hit = m.get_computed_blocks(r)
        self.assertEqual((blocks.get_block_ids(), hit), (([], [], [], [], []), 0))
        new = m.allocate_slots(r, 1000, 0, blocks)
        ids = new.get_block_ids()
        self.assertEqual([len(g) for g in ids], [4, 16, 16, 250, 125])  # cdiv(1000, block size)
        flat = [b for g in ids for b in g]
        self.assertEqual(len(set(flat)), len(flat))  # every group its own blocks, from one pool
        self.assertTrue(all(1 <= b <= 2000 for b in flat))
        self.assertEqual(m.get_block_ids("a"), ids)
        self.assertEqual(m.block_pool.get_num_free_blocks(), 2000 - len(flat))
        r.num_computed_tokens = 1000
        r.append_output_token_ids(7)
        self.assertIsNotNone(m.allocate_slots(r, 1))
        held = m.get_block_ids("a")
        # Blocks before each window are back in the pool; the null block (0) holds their place.
        self.assertEqual([len(g) for g in held], [4, 16, 16, 251, 126])
        self.assertEqual([sum(1 for b in g if b) for g in held], [4, 3, 3, 3, 17])
        self.assertEqual(held[1][:13], [0] * 13)
        self.assertEqual(m.get_num_common_prefix_blocks("a"), [4, 0, 0, 0, 0])
        stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
        self.assertEqual(sorted({e.group_idx for e in stored}), [0, 1, 2, 3, 4])
        self.assertEqual({e.kv_cache_spec_kind for e in stored if e.group_idx},
                         {"sliding_window_mla"})
        self.assertEqual({(e.group_idx, e.kv_cache_spec_sliding_window) for e in stored if e.group_idx},
                         {(1, 128), (2, 128), (3, 8), (4, 128)})
        m.free(r)
        self.assertEqual(m.usage, 0.0)
        # The prompt comes back: 768 tokens hit (a multiple of 256), each window's last blocks
        # found again, the null block before them.
        r2 = kv_trace.TraceRequest("b", range(1000))
        blocks, hit = m.get_computed_blocks(r2)
        self.assertEqual(hit, 768)
        got = blocks.get_block_ids()
        self.assertEqual([len(g) for g in got], [3, 12, 12, 192, 96])
        self.assertEqual([sum(1 for b in g if b) for g in got], [3, 2, 2, 2, 16])
        self.assertTrue(m.reset_prefix_cache())  # nothing in use (b was only looked up)
        self.assertEqual(m.get_computed_blocks(r2)[1], 0)

    def test_tessera_v4_manager_differs_from_vllms_layout(self):
        # Window trace, step 2: "long" (3000 tokens) computed, "same" (its 3000 tokens + 100)
        # admitted. vLLM holds the windows and compressor states in pool blocks; Tessera's own V4
        # manager keeps them in its per-request arena and pages only what vLLM's group 0 holds.
        trace, want = load("v4-flash-window")
        step = want["steps"][2]
        admit = [o for o in step["ops"] if o.get("kind") == "admit"][0]
        g0 = {rid: h[0][0] for rid, h in step["held"].items()}
        m = tessera.RequestManager("deepseek-v4-flash", block_tokens=256, capacity_blocks=64, max_requests=4,
                                   backed=False)
        long = kv_trace.prompt_tokens(trace["requests"]["long"]["prompt"])
        same = kv_trace.prompt_tokens(trace["requests"]["same"]["prompt"])
        a = m.admit(long, reserve_tokens=len(long))
        m.append(a.request_id, long)
        b = m.admit(same, reserve_tokens=len(same))
        self.assertEqual(b.cached_tokens, admit["hit"])  # the same hit: 2816 tokens
        self.assertEqual(64 - m.free_blocks, g0["long"] + g0["same"] - admit["hit_blocks"][0][1])  # 14 pages
        self.assertEqual(step["blocks_in_use"], 540)  # vLLM: all five groups in the pool
        # ... but Tessera names the window's tokens to recompute (window_strategy "recompute"),
        # where vLLM finds the window blocks cached.
        self.assertEqual((b.recompute_from, b.recompute_tokens), (2816 - 128, 128))
        self.assertEqual(sum(real for _, real in admit["hit_blocks"][1:]), 2 + 2 + 2 + 16)
        # Tessera's paged groups are vLLM's group 0: the 62 CSA, indexer and HCA layers.
        vllm_g0 = want["provenance"]["inputs"]["kv_cache_groups"][0]["layers"]
        self.assertEqual(sum(g["layers"] for g in m.groups), vllm_g0)

    def test_arguments(self):
        with self.assertRaisesRegex(ValueError, "block_size"):
            self.make(block_size=200)
        with self.assertRaisesRegex(TypeError, "kv_cache_groups"):
            self.make(kv_cache_groups="groups")
        with self.assertRaisesRegex(ValueError, r"kv_cache_groups\[0\]"):
            self.make(kv_cache_groups=[{"block_size": 64, "sliding_window": 128}, {"block_size": 256}])
        with self.assertRaisesRegex(ValueError, "kv_cache_groups"):
            self.make(kv_cache_groups=[{"block_size": 256}])
        with self.assertRaisesRegex(TypeError, r"kv_cache_groups\[1\].block_size"):
            self.make(kv_cache_groups=[{"block_size": 256}, {"block_size": "64", "sliding_window": 128}])
        with self.assertRaisesRegex(ValueError, "hash_block_size"):
            self.make(hash_block_size=256)
        with self.assertRaisesRegex(ValueError, "max_num_batched_tokens"):
            self.make(max_num_batched_tokens=0)
        m = self.make()
        r = kv_trace.TraceRequest("a", range(100))
        with self.assertRaisesRegex(ValueError, "new_computed_blocks"):
            m.allocate_slots(r, 100, 0, tessera.vllm.KVCacheBlocks([1]))
        with self.assertRaisesRegex(ValueError, "blocks"):
            m.create_kv_cache_blocks(([1],))
        blocks = tessera.vllm.KVCacheBlocks.of_groups([[5], [9] * 4, [0] * 4, [0] * 64, [0] * 32])
        with self.assertRaisesRegex(ValueError, "not a cached block"):
            m.allocate_slots(r, 44, 256, blocks)  # made-up hit blocks
        with self.assertRaisesRegex(ValueError, "group 0 has 1 blocks"):
            m.allocate_slots(r, 44, 512, blocks)
        with self.assertRaisesRegex(ValueError, "request.all_token_ids"):
            m.get_computed_blocks(kv_trace.TraceRequest("t", [1, 2, -3, 4]))
        with self.assertRaisesRegex(ValueError, "request.all_token_ids"):
            m.get_computed_blocks(kv_trace.TraceRequest("t", [1, 2, 3, 1 << 32]))
        self.assertEqual((m.usage, m.get_block_ids("a")), (0.0, ([], [], [], [], [])))  # nothing changed

    def test_explicit_groups(self):
        # The same layout given explicitly gives the same figures as the preset's.
        trace, want = load("v4-flash-eviction-pressure")
        groups = [{"block_size": g["block_size"], "sliding_window": g["sliding_window"]}
                  for g in want["provenance"]["inputs"]["kv_cache_groups"]]
        got = kv_trace.replay(trace, manager_for(trace, kv_cache_groups=groups))
        self.assertEqual(got, want["steps"])
        # And a wrong layout does not (the HCA and CSA state groups swapped).
        groups[3], groups[4] = groups[4], groups[3]
        self.assertNotEqual(kv_trace.replay(trace, manager_for(trace, kv_cache_groups=groups)), want["steps"])


class EngineBlockPool(unittest.TestCase):
    """tessera._core._EngineBlockPool: Tessera's BlockPool as the groups' shared pool."""

    def test_release_order_and_evictions(self):
        p = _core._EngineBlockPool(4)
        a = p.allocate(3)
        self.assertEqual(len(a), 3)
        p.seal([a[0]])
        p.release([a[2], a[0], a[1]])  # a[0] is sealed: cached, not free
        self.assertEqual((p.available, p.cached), (4, 1))
        self.assertEqual(p.state(a[0]), "cached")
        p.pin([a[0]])  # a hit: in use again
        self.assertEqual((p.state(a[0]), p.refcount(a[0]), p.available), ("sealed", 1, 3))
        p.release([a[0]])
        # Never used first, then in release order (free and cached alike): a[2], a[1], a[0].
        b = p.allocate(4)
        self.assertEqual(b[1:], [a[2], a[1], a[0]])
        self.assertEqual(p.take_evicted(), [a[0]])
        self.assertIsNone(p.allocate(1))
        p.check_invariants()

    def test_free_first(self):
        p = _core._EngineBlockPool(3, block_reuse="free-first")
        a = p.allocate(2)
        p.seal([a[0]])
        p.release(a)
        p.allocate(2)  # the free blocks first: the cached one survives
        self.assertEqual(p.take_evicted(), [])
        self.assertEqual(p.state(a[0]), "cached")

    def test_bad_arguments_change_nothing(self):
        p = _core._EngineBlockPool(4)
        a = p.allocate(2)
        with self.assertRaisesRegex(ValueError, "ids"):
            p.release([a[0], a[0]])  # held once
        with self.assertRaisesRegex(ValueError, "ids"):
            p.pin([a[1]])  # filling: nothing to hit
        with self.assertRaisesRegex(ValueError, "ids"):
            p.seal([a[0], a[0]])
        with self.assertRaisesRegex(ValueError, "ids"):
            p.release([7])
        with self.assertRaisesRegex(TypeError, "ids"):
            p.release(["x"])
        with self.assertRaisesRegex(ValueError, "id"):
            p.state(4)
        self.assertEqual((p.refcount(a[0]), p.state(a[0]), p.available), (1, "filling", 2))
        with self.assertRaisesRegex(ValueError, "capacity"):
            _core._EngineBlockPool(0)
        with self.assertRaisesRegex(ValueError, "block_reuse"):
            _core._EngineBlockPool(4, block_reuse="lifo")
        with self.assertRaisesRegex(ValueError, "n: "):
            p.allocate(-1)
        p.check_invariants()


if __name__ == "__main__":
    unittest.main()
