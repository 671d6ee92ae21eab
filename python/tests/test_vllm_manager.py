"""tessera.vllm.KVCacheManager against vLLM's own KVCacheManager: each scheduler trace under
tests/data/engine_traces/ is replayed (kv_trace.replay) through Tessera's adapter, and what the
scheduler observes after every step — prefix-hit tokens of every admission, which allocations
were refused, blocks in use, blocks held per running request, usage, the prefix-cache stats and
the KV events (blocks stored / removed / all cleared) — must equal the figures vLLM's
KVCacheManager gave for the same trace (NAME.vllm.json: provenance inside; obtained by running
vLLM's code outside this repository)."""
import glob
import json
import os
import unittest

import kv_trace
from tessera.vllm import KVCacheManager

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
        with self.assertRaisesRegex(ValueError, "get_computed_blocks"):
            m.allocate_slots(r, 20)
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


if __name__ == "__main__":
    unittest.main()
