"""tessera.RequestManager: the request life cycle for every preset model, the batched step,
zero-copy page views and metrics."""

import gc
import threading
import unittest

import numpy as np

import pattern
import tessera


def prompt(n, base=1):
    return np.arange(base, base + n, dtype=np.uint32)


class EveryPresetTest(unittest.TestCase):
    def test_life_cycle_every_preset(self):
        for name in tessera.models():
            with self.subTest(model=name):
                m = tessera.RequestManager(name, capacity_blocks=64, max_requests=8, backed=False)
                bt = m.block_tokens
                p = prompt(2 * bt + 5)
                a = m.admit(p)
                self.assertEqual(a.cached_tokens, 0)
                self.assertEqual(m.tokens(a.request_id), 0)
                m.append(a.request_id, p)
                self.assertEqual(m.tokens(a.request_id), len(p))
                table = m.block_table(a.request_id)
                self.assertEqual(table.dtype, np.uint32)
                self.assertGreaterEqual(len(table), 1)
                # A fork shares the blocks; one step for both grows each by its count.
                c = m.fork(a.request_id)
                self.assertEqual(m.tokens(c), len(p))
                r = m.step(np.array([a.request_id, c], np.uint32), np.array([3, 2], np.uint32),
                           np.arange(5, dtype=np.uint32))
                self.assertEqual(r.failed, 0)
                self.assertEqual(r.codes.tolist(), [0, 0])
                self.assertEqual(len(r.offsets), 3)
                self.assertEqual(m.tokens(a.request_id), len(p) + 3)
                self.assertEqual(m.tokens(c), len(p) + 2)
                # The same prompt again hits its two whole blocks (the last token is computed).
                b = m.admit(p)
                self.assertEqual(b.cached_tokens, 2 * bt)
                self.assertEqual(b.cached_blocks, 2)
                metrics = m.metrics()
                self.assertEqual(metrics["tessera_requests_admitted_total"]["samples"][""], 2)
                self.assertEqual(m.live_requests, 3)
                for rid in (a.request_id, c, b.request_id):
                    m.free(rid)
                self.assertEqual(m.live_requests, 0)
                self.assertFalse(m.is_live(c))


class BatchedStepTest(unittest.TestCase):
    """A batched step equals AllocateSlots + Append request by request."""

    def setUp(self):
        self.n = 24
        self.prompts = [np.concatenate([prompt(128, 1 + 1000 * (r // 4)), prompt(70, 50000 + 1000 * r)])
                        for r in range(self.n)]

    def build(self):
        m = tessera.RequestManager("deepseek-v3", kv_format="fp8_ds_mla", capacity_blocks=512, max_requests=64,
                                   backed=False, hash_key_seed=7)
        ids = []
        for p in self.prompts:
            a = m.admit(p)
            m.append(a.request_id, p[a.cached_tokens:])
            ids.append(a.request_id)
        return m, np.array(ids, dtype=np.uint32)

    def test_step_equals_per_request_calls(self):
        stepped, ids = self.build()
        single, ids2 = self.build()
        np.testing.assert_array_equal(ids, ids2)
        rng = np.random.default_rng(1)
        for _ in range(20):
            counts = rng.integers(0, 40, size=self.n).astype(np.uint32)
            tokens = rng.integers(0, 30000, size=int(counts.sum())).astype(np.uint32)
            before = [stepped.block_table(i) for i in ids]
            r = stepped.step(ids, counts, tokens)
            self.assertEqual(r.failed, 0)
            offset = 0
            for k, rid in enumerate(ids):
                single.allocate(int(rid), int(counts[k]))
                single.append(int(rid), tokens[offset:offset + counts[k]])
                offset += int(counts[k])
            for k, rid in enumerate(ids):
                after = stepped.block_table(rid)
                np.testing.assert_array_equal(after, single.block_table(rid))
                self.assertEqual(stepped.tokens(rid), single.tokens(rid))
                # new_blocks[offsets[k]:offsets[k+1]] is what the table grew by.
                np.testing.assert_array_equal(r.blocks_of(k), after[len(before[k]):])
                np.testing.assert_array_equal(r.new_blocks[r.offsets[k]:r.offsets[k + 1]], after[len(before[k]):])
            # Renamed slots (sealed as duplicates of cached blocks) are reported.
            for req, slot, frm, to in r.replaced.tolist():
                self.assertEqual(before[req][slot], frm)
                self.assertEqual(stepped.block_table(ids[req])[slot], to)
        self.assertEqual(stepped.metrics(), single.metrics())

    def test_input_forms_agree(self):
        # Lists, int64 arrays and non-contiguous views give the same step as uint32 arrays.
        results = []
        for form in ("uint32", "list", "int64", "strided"):
            m, ids = self.build()
            counts = np.full(self.n, 3, dtype=np.uint32)
            tokens = np.arange(3 * self.n, dtype=np.uint32) + 5
            if form == "list":
                args = (ids.tolist(), counts.tolist(), tokens.tolist())
            elif form == "int64":
                args = (ids.astype(np.int64), counts.astype(np.int64), tokens.astype(np.int64))
            elif form == "strided":
                wide = np.zeros((3, 2 * self.n), dtype=np.uint32)
                wide[0, ::2] = ids
                wide[1, ::2] = counts
                tw = np.zeros(6 * self.n, dtype=np.uint32)
                tw[::2] = tokens
                args = (wide[0, ::2], wide[1, ::2], tw[::2])
                self.assertFalse(args[0].flags.c_contiguous)
            else:
                args = (ids, counts, tokens)
            r = m.step(*args)
            results.append((r.offsets.tolist(), r.new_blocks.tolist(), [m.tokens(i) for i in ids],
                            [m.block_table(i).tolist() for i in ids]))
        for other in results[1:]:
            self.assertEqual(other, results[0])

    def test_out_of_blocks_is_per_request(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=4, backed=False)
        a = m.admit(prompt(64 * 2))
        b = m.admit(prompt(64 * 2, 9000))
        self.assertEqual(m.available_blocks, 0)
        # Request a needs a third block: refused, left unchanged; b asks for nothing.
        r = m.step(np.array([a.request_id, b.request_id], np.uint32), np.array([64 * 2 + 1, 0], np.uint32),
                   prompt(64 * 2 + 1))
        self.assertEqual(r.failed, 1)
        self.assertEqual(tessera.STATUS_NAMES[int(r.codes[0])], "out_of_blocks")
        self.assertEqual(int(r.codes[1]), 0)
        self.assertEqual(m.tokens(a.request_id), 0)
        with self.assertRaises(tessera.OutOfBlocksError):
            m.admit(prompt(10, 777))
        with self.assertRaises(tessera.OutOfBlocksError):
            m.allocate(a.request_id, 64 * 3)

    def test_threads_share_a_manager(self):
        # Calls release the GIL; the manager's lock keeps them one at a time.
        m = tessera.RequestManager("deepseek-v3", capacity_blocks=4096, max_requests=256, backed=False)
        errors = []

        def worker(t):
            try:
                for i in range(30):
                    a = m.admit(prompt(300, 1 + 100000 * t + 1000 * i))
                    m.append(a.request_id, prompt(300, 1 + 100000 * t + 1000 * i))
                    m.step(np.array([a.request_id], np.uint64), np.array([5], np.uint32), prompt(5))
                    m.free(a.request_id)
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])
        self.assertEqual(m.live_requests, 0)
        self.assertEqual(m.metrics()["tessera_requests_admitted_total"]["samples"][""], 120)


class TokenListsTest(unittest.TestCase):
    def test_every_int_of_a_list_reads_as_its_uint32_array(self):
        # A list's one-digit ints (and 0) are read from the objects in place (python/src/common.cc
        # SmallInt); ints of two 30-bit digits and int subclasses by the checked path; 2^32, -1 and
        # bools refused naming the argument. The list hits exactly the blocks its uint32 array sealed.
        class Sub(int):
            pass
        edges = [0, 1, 2 ** 30 - 1, 2 ** 30, 2 ** 31, 2 ** 32 - 1, Sub(7), 255, 256, 257]
        m = tessera.RequestManager("tiny-mla", capacity_blocks=64, max_requests=8, backed=False)
        bt = m.block_tokens
        values = [edges[i % len(edges)] for i in range(2 * bt)] + [5]
        a = m.admit(np.array([int(v) for v in values], dtype=np.uint32))
        m.append(a.request_id, np.array([int(v) for v in values], dtype=np.uint32))
        b = m.admit(values)
        self.assertEqual(b.cached_tokens, 2 * bt)
        other = list(values)
        other[bt + 3] = 2 ** 32 - 2  # one token of the second block differs
        c = m.admit(other)
        self.assertEqual(c.cached_tokens, bt)
        for bad, arg in ((values[:-1] + [2 ** 32], "prompt"), (values[:-1] + [-1], "prompt"),
                         (values[:-1] + [True], "prompt")):
            with self.assertRaisesRegex((ValueError, TypeError), "^" + arg):
                m.admit(bad)


class RequestIdsTest(unittest.TestCase):
    """Issue 27.2: an id carries its slot's generation, so a freed id never reaches the request that
    reused its slot (before: ids were slot numbers, and a stale id acted on the new request)."""

    def test_a_stale_id_is_refused_and_never_reaches_the_request_that_reused_its_slot(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=16, max_requests=4, hash_key_seed=3)
        alice = m.admit(prompt(70), tenant=1)
        m.append(alice.request_id, prompt(70), writer="pattern")
        m.free(alice.request_id)
        bob = m.admit(prompt(10, 9000), tenant=2)
        m.append(bob.request_id, prompt(10, 9000), writer="pattern")
        self.assertNotEqual(bob.request_id, alice.request_id)
        self.assertEqual(bob.request_id & 0xFFFFFFFF, alice.request_id & 0xFFFFFFFF)  # the slot is reused
        self.assertFalse(m.is_live(alice.request_id))
        self.assertTrue(m.is_live(bob.request_id))
        stale = alice.request_id
        for name, call in (("free", lambda: m.free(stale)), ("tokens", lambda: m.tokens(stale)),
                           ("append", lambda: m.append(stale, prompt(1), writer="pattern")),
                           ("allocate", lambda: m.allocate(stale, 1)), ("fork", lambda: m.fork(stale)),
                           ("block_table", lambda: m.block_table(stale)),
                           ("record", lambda: m.record(stale, 0, 0, 0))):
            with self.subTest(call=name):
                with self.assertRaisesRegex(ValueError, "^request_id: no live request"):
                    call()
        with self.assertRaisesRegex(ValueError, "^request_ids: element 0"):
            m.step([stale], [1], prompt(1))
        with self.assertRaisesRegex(ValueError, "^request_ids: element 0"):
            m.step(np.array([stale], np.uint64), np.array([1], np.uint32), prompt(1))
        # Bob's request is as Bob left it.
        self.assertEqual(m.live_requests, 1)
        self.assertEqual(m.tokens(bob.request_id), 10)
        np.testing.assert_array_equal(m.record(bob.request_id, 0, 1, 9)[0],
                                      pattern.record(0, 1, 9, 0, m.groups[0]["record_bytes"]))
        r = m.step(np.array([bob.request_id], np.uint64), np.array([1], np.uint32), prompt(1), writer="pattern")
        self.assertEqual(r.failed, 0)
        m.free(bob.request_id)
        self.assertEqual(m.live_requests, 0)


class ViewsTest(unittest.TestCase):
    def test_records_are_zero_copy_views_of_the_pattern(self):
        m = tessera.RequestManager("deepseek-v3", kv_format="fp8_ds_mla", capacity_blocks=8, max_requests=4)
        p = prompt(100)
        a = m.admit(p)
        m.append(a.request_id, p, writer="pattern")
        g = m.groups[0]
        for position in (0, 63, 64, 99):
            for layer in (0, 60):
                planes = m.record(a.request_id, 0, layer, position)
                self.assertEqual(len(planes), 1)
                np.testing.assert_array_equal(planes[0], pattern.record(0, layer, position, 0, g["record_bytes"]))
        # Block 0 is sealed: read-only; block 1 is being filled: writable, and a write through the
        # view is what the manager holds (zero-copy).
        sealed = m.record(a.request_id, 0, 5, 10)[0]
        self.assertFalse(sealed.flags.writeable)
        with self.assertRaises(ValueError):
            sealed[0] = 1
        self.assertFalse(memoryview(sealed).readonly is False)
        filling = m.record(a.request_id, 0, 5, 70)[0]
        self.assertTrue(filling.flags.writeable)
        filling[:4] = [1, 2, 3, 4]
        again = m.record(a.request_id, 0, 5, 70)[0]
        self.assertEqual(again[:4].tolist(), [1, 2, 3, 4])
        # The page view of block 1, layer 5 holds token 70's record at slot 6.
        block1 = m.block_table(a.request_id)[1]
        page = m.page(block1, 0, 5)
        self.assertEqual(len(page), g["page_bytes"])
        self.assertEqual(page[6 * g["record_bytes"]:6 * g["record_bytes"] + 4].tolist(), [1, 2, 3, 4])
        self.assertFalse(m.page(m.block_table(a.request_id)[0], 0, 5).flags.writeable)
        whole = m.block(block1, 0)
        self.assertEqual(len(whole), g["page_bytes"] * g["layers"] // g["layers_per_page"])

    def test_sealing_revokes_a_writable_view_and_the_next_hit_serves_the_original_bytes(self):
        # Issue 27.7: views taken while a block fills (page, block, record) become read-only when
        # the block is sealed, so a write through them is refused and the cached block is unchanged.
        m = tessera.RequestManager("tiny-mla", capacity_blocks=8, max_requests=4, hash_key_seed=5)
        p = prompt(100)
        a = m.admit(p)
        block0 = int(m.block_table(a.request_id)[0])
        page = m.page(block0, 0, 1)
        whole = m.block(block0, 0)
        m.append(a.request_id, p[:3], writer="pattern")
        rec = m.record(a.request_id, 0, 1, 2)[0]
        tail = m.page(int(m.block_table(a.request_id)[1]), 0, 1)
        for v in (page, whole, rec, tail):
            self.assertTrue(v.flags.writeable)
        m.append(a.request_id, p[3:], writer="pattern")  # seals block 0; block 1 still fills
        self.assertEqual(m.block_state(block0), "sealed")
        original = page.copy()
        for v in (page, whole, rec):
            self.assertFalse(v.flags.writeable)
            with self.assertRaisesRegex(ValueError, "read-only"):
                v[:8] = 0xEE
        self.assertTrue(tail.flags.writeable)  # block 1 is still being filled by one request
        c = m.fork(a.request_id)  # now shared: no longer writable
        self.assertFalse(tail.flags.writeable)
        m.free(c)
        m.free(a.request_id)
        b = m.admit(p)
        self.assertEqual(b.cached_blocks, 1)
        self.assertEqual(int(m.block_table(b.request_id)[0]), block0)
        np.testing.assert_array_equal(m.page(block0, 0, 1), original)
        np.testing.assert_array_equal(m.record(b.request_id, 0, 1, 2)[0],
                                      pattern.record(0, 1, 2, 0, m.groups[0]["record_bytes"]))

    def test_view_keeps_manager_alive(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2)
        a = m.admit(prompt(70))
        m.append(a.request_id, prompt(70), writer="pattern")
        view = m.record(a.request_id, 0, 1, 3)[0]
        expect = pattern.record(0, 1, 3, 0, len(view))
        del m
        gc.collect()
        np.testing.assert_array_equal(view, expect)

    def test_prewritten_writes_through_page_views(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2)
        g = m.groups[0]
        a = m.admit(prompt(64))  # reserves one block
        block = m.block_table(a.request_id)[0]
        for layer in range(g["layers"]):
            page = m.page(block, 0, layer)
            self.assertTrue(page.flags.writeable)
            page[:] = layer + 1
        m.append(a.request_id, prompt(64), writer="prewritten")
        self.assertEqual(m.block_state(block), "sealed")
        self.assertEqual(int(m.record(a.request_id, 0, 2, 17)[0][0]), 3)

    def test_v4_entries_and_state(self):
        m = tessera.RequestManager("tiny-v4", capacity_blocks=8, max_requests=2)
        self.assertTrue(m.has_windows)
        a = m.admit(prompt(300))
        m.append(a.request_id, prompt(300), writer="pattern")
        names = [g["name"] for g in m.groups]
        self.assertIn("compressed/4", names)
        # Layer 0 of tiny-v4's compressed/4 group: find a layer with ratio 4 entries.
        found = False
        for layer in range(8):
            try:
                planes = m.entry(a.request_id, layer, False, 10)
            except ValueError:
                continue
            found = True
            self.assertGreater(sum(len(x) for x in planes), 0)
            break
        self.assertTrue(found)
        self.assertGreater(len(m.live_state(a.request_id)), 0)


class DeferredSealsTest(unittest.TestCase):
    """defer_seals=True (ADR 0048): a step's seals are queued and performed over later steps, and
    wholly before anything reads the index (an admission here)."""

    def test_a_seal_step_queues_and_an_admission_sees_every_seal(self):
        n = 200
        m = tessera.RequestManager("deepseek-v3", capacity_blocks=4 * n, backed=False, defer_seals=True)
        bt = m.block_tokens
        ids = []
        for r in range(n):
            a = m.admit(prompt(bt - 1, base=1000 * r + 1))
            m.append(a.request_id, prompt(bt - 1, base=1000 * r + 1))
            ids.append(a.request_id)
        ids = np.array(ids, np.uint32)
        ones = np.ones(n, np.uint32)
        self.assertEqual(m.step(ids, ones, np.full(n, 7, np.uint32)).failed, 0)
        self.assertEqual(m.pending_seals, n)
        self.assertEqual(m.step(ids, ones, np.full(n, 8, np.uint32)).failed, 0)
        self.assertEqual(m.pending_seals, n)  # the step after a seal step performs none
        self.assertEqual(m.step(ids, ones, np.full(n, 9, np.uint32)).failed, 0)
        self.assertEqual(m.pending_seals, n - 64)  # then max(64, n / 16) a step
        again = np.concatenate([prompt(bt - 1, base=1000 * 5 + 1), [7, 99]]).astype(np.uint32)
        self.assertEqual(m.admit(again).cached_tokens, bt)
        self.assertEqual(m.pending_seals, 0)
        # The same figures as a manager that seals at once.
        now = tessera.RequestManager("deepseek-v3", capacity_blocks=4 * n, backed=False, defer_seals=False)
        self.assertFalse(now.defers_seals)
        for r in range(n):
            a = now.admit(prompt(bt - 1, base=1000 * r + 1))
            now.append(a.request_id, prompt(bt - 1, base=1000 * r + 1))
        now.step(ids, ones, np.full(n, 7, np.uint32))
        now.step(ids, ones, np.full(n, 8, np.uint32))
        now.step(ids, ones, np.full(n, 9, np.uint32))
        self.assertEqual(now.pending_seals, 0)
        self.assertEqual(now.admit(again).cached_tokens, bt)
        self.assertEqual(m.metrics(), now.metrics())

    def test_the_default_defers_where_allowed(self):
        # None (the default): deferred with an unbacked pool and no windows (ADR 0049).
        self.assertTrue(tessera.RequestManager("deepseek-v3", capacity_blocks=16, backed=False).defers_seals)
        self.assertFalse(tessera.RequestManager("deepseek-v3", capacity_blocks=16).defers_seals)
        self.assertFalse(
            tessera.RequestManager("deepseek-v4-flash", capacity_blocks=16, backed=False).defers_seals)
        self.assertTrue(
            tessera.RequestManager("deepseek-v3", capacity_blocks=16, backed=False, defer_seals=True).defers_seals)
        m = tessera.RequestManager("deepseek-v3", capacity_blocks=64, backed=False)
        bt = m.block_tokens
        a = m.admit(prompt(bt - 1))
        m.append(a.request_id, prompt(bt - 1))
        m.step(np.array([a.request_id], np.uint32), np.ones(1, np.uint32), np.full(1, 7, np.uint32))
        self.assertEqual(m.pending_seals, 1)
        self.assertEqual(m.metrics()["tessera_seals_pending"]["samples"][""], 1)

    def test_refused_where_a_seal_must_happen_at_once(self):
        with self.assertRaisesRegex(ValueError, "^defer_seals: a pool that holds KV bytes"):
            tessera.RequestManager("deepseek-v3", capacity_blocks=16, defer_seals=True)
        with self.assertRaisesRegex(ValueError, "^defer_seals: .*sliding windows"):
            tessera.RequestManager("deepseek-v4-flash", capacity_blocks=16, backed=False, defer_seals=True)
        with self.assertRaisesRegex(TypeError, "defer_seals"):
            tessera.RequestManager("deepseek-v3", capacity_blocks=16, backed=False, defer_seals="yes")


class MetricsTest(unittest.TestCase):
    def test_prometheus_text_matches_dict(self):
        m = tessera.RequestManager("deepseek-v3", capacity_blocks=64, backed=False)
        p = prompt(200)
        a = m.admit(p)
        m.append(a.request_id, p)
        m.admit(p)
        text = m.prometheus_text()
        d = m.metrics()
        self.assertEqual(d["tessera_prefix_hits_total"]["type"], "counter")
        for name, fam in d.items():
            self.assertIn("# TYPE %s %s" % (name, fam["type"]), text)
            for labels, value in fam["samples"].items():
                line = "%s{%s} %d" % (name, labels, value) if labels else "%s %d" % (name, value)
                self.assertIn(line + "\n", text)
        self.assertEqual(d["tessera_requests_admitted_total"]["samples"][""], 2)


if __name__ == "__main__":
    unittest.main()
