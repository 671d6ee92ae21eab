"""Bad input from Python: TypeError or ValueError naming the argument, never a crash, and
nothing changed by a refused call."""

import unittest

import numpy as np

import tessera


def prompt(n, base=1):
    return np.arange(base, base + n, dtype=np.uint32)


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.m = tessera.RequestManager("tiny-mla", capacity_blocks=16, max_requests=4, backed=False)
        self.a = self.m.admit(prompt(100))
        self.m.append(self.a.request_id, prompt(100))
        self.ids = np.array([self.a.request_id], np.uint32)

    def assertNames(self, exc, name, fn, *args, **kwargs):
        with self.assertRaises(exc) as cm:
            fn(*args, **kwargs)
        self.assertTrue(str(cm.exception).startswith(name), "%r does not start with %r" % (str(cm.exception), name))

    def assertUnchanged(self):
        self.assertEqual(self.m.tokens(self.a.request_id), 100)
        self.assertEqual(self.m.live_requests, 1)

    def test_constructor(self):
        R = tessera.RequestManager
        self.assertNames(ValueError, "model", R, "no-such-model")
        self.assertNames(ValueError, "model", R)
        self.assertNames(TypeError, "model", R, 3)
        self.assertNames(ValueError, "model", R, "tiny-mla", config="/x.json")
        self.assertNames(ValueError, "config", R, config="/nonexistent/config.json")
        self.assertNames(ValueError, "kv_format", R, "tiny-mla", kv_format="nope")
        self.assertNames(ValueError, "capacity_blocks", R, "tiny-mla", capacity_blocks=0)
        self.assertNames(ValueError, "capacity_blocks", R, "tiny-mla", capacity_blocks=-1)
        self.assertNames(ValueError, "capacity_blocks", R, "tiny-mla", capacity_blocks=2**40)
        self.assertNames(TypeError, "capacity_blocks", R, "tiny-mla", capacity_blocks=1.0)
        self.assertNames(ValueError, "max_requests", R, "tiny-mla", max_requests=0)
        self.assertNames(TypeError, "backed", R, "tiny-mla", backed=1)
        self.assertNames(ValueError, "window_strategy", R, "tiny-v4", window_strategy="keep")
        self.assertNames(ValueError, "hash", R, "tiny-mla", hash="md5")
        self.assertNames(ValueError, "hash_bits", R, "tiny-mla", hash_bits=0)
        self.assertNames(TypeError, "hash_key", R, "tiny-mla", hash_key="secret")
        self.assertNames(ValueError, "hash_key", R, "tiny-mla", hash_key=b"short")
        self.assertNames(TypeError, "tenant_domain", R, "tiny-mla", tenant_domain=[1, 2])
        self.assertNames(ValueError, "tenant_domain", R, "tiny-mla", tenant_domain={1: -2})
        self.assertNames(ValueError, "spec_tokens", R, "tiny-mla", spec_tokens=10**6)
        self.assertNames(ValueError, "block_tokens", R, "tiny-mla", block_tokens=0)

    def test_admit(self):
        m = self.m
        self.assertNames(TypeError, "prompt", m.admit, "hello")
        self.assertNames(TypeError, "prompt", m.admit, b"\x01\x02")
        self.assertNames(TypeError, "prompt", m.admit, np.arange(4, dtype=np.float32))
        self.assertNames(TypeError, "prompt", m.admit, np.ones(4, dtype=bool))
        self.assertNames(TypeError, "prompt", m.admit, np.array(["a"], dtype=object))
        self.assertNames(ValueError, "prompt", m.admit, np.zeros((2, 2), np.uint32))
        self.assertNames(ValueError, "prompt", m.admit, np.array([1, -1], np.int64))
        self.assertNames(ValueError, "prompt", m.admit, np.array([2**32], np.int64))
        self.assertNames(ValueError, "prompt[1]", m.admit, [1, -5])
        self.assertNames(TypeError, "prompt[0]", m.admit, [1.5])
        # An empty prompt is refused, as tessera serve refuses it (issue 27; before: admitted).
        self.assertNames(ValueError, "prompt", m.admit, [])
        self.assertNames(ValueError, "prompt", m.admit, np.zeros(0, np.uint32))
        self.assertNames(TypeError, "read_cache", m.admit, prompt(4), read_cache=1)
        self.assertNames(ValueError, "prompt", m.admit, np.array([1, -1], np.int8))
        self.assertNames(ValueError, "prompt", m.admit, np.array([2**40], np.uint64))
        self.assertNames(ValueError, "priority", m.admit, prompt(4), priority=101)
        self.assertNames(TypeError, "tenant", m.admit, prompt(4), tenant="a")
        self.assertNames(ValueError, "cache_salt", m.admit, prompt(4), cache_salt=-1)
        self.assertUnchanged()
        # Big-endian arrays are read by value (issue 27; before: TypeError), with their errors.
        self.assertNames(ValueError, "prompt", m.admit, np.array([1, -1], ">i8"))
        for dt in (">u4", ">i8", ">u2"):
            be = m.admit(prompt(100).astype(dt), reserve_tokens=0)
            le = m.admit(prompt(100), reserve_tokens=0)
            self.assertEqual(be.cached_tokens, le.cached_tokens)
            self.assertGreater(be.cached_tokens, 0)  # the prefix of the live request's prompt
            m.free(be.request_id)
            m.free(le.request_id)
        # Narrow and wide integer dtypes, and numpy integer scalars, are read by value.
        small = m.admit(np.arange(1, 6, dtype=np.uint16), tenant=np.int64(0))
        self.assertEqual(m.tokens(np.uint64(small.request_id)), 0)
        m.free(small.request_id)

    def test_request_ids(self):
        m, rid = self.m, self.a.request_id
        for fn, args in ((m.allocate, (5,)), (m.append, (prompt(1),)), (m.free, ()), (m.fork, ()),
                         (m.block_table, ()), (m.tokens, ()), (m.live_state, ())):
            with self.subTest(fn=fn.__name__):
                self.assertNames(ValueError, "request_id", fn, -1, *args)
                self.assertNames(ValueError, "request_id", fn, 3, *args)
                self.assertNames(ValueError, "request_id", fn, 2**40, *args)
                self.assertNames(TypeError, "request_id", fn, "0", *args)
                self.assertNames(TypeError, "request_id", fn, None, *args)
                self.assertNames(TypeError, "request_id", fn, True, *args)
        b = m.admit(prompt(10, 5000))
        m.free(b.request_id)
        self.assertNames(ValueError, "request_id", m.free, b.request_id)
        self.assertNames(ValueError, "request_id", m.tokens, b.request_id)
        self.assertNames(ValueError, "request_id", m.block_table, b.request_id)
        self.assertNames(ValueError, "request_id", m.append, b.request_id, prompt(3))
        self.assertNames(ValueError, "n", m.allocate, rid, -3)
        self.assertNames(ValueError, "tokens", m.append, rid, prompt(500))  # no slots for them
        self.assertUnchanged()

    def test_step(self):
        m, ids = self.m, self.ids
        one, tok = np.array([1], np.uint32), prompt(1)
        self.assertNames(ValueError, "counts", m.step, ids, np.array([1, 1], np.uint32), prompt(2))
        self.assertNames(ValueError, "tokens", m.step, ids, one, prompt(2))
        self.assertNames(ValueError, "tokens", m.step, ids, np.array([2], np.uint32), tok)
        self.assertNames(ValueError, "request_ids", m.step, np.array([-1], np.int64), one, tok)
        self.assertNames(ValueError, "request_ids", m.step, np.array([7], np.uint32), one, tok)
        self.assertNames(ValueError, "request_ids", m.step, np.array([ids[0], ids[0]], np.uint32),
                         np.array([1, 1], np.uint32), prompt(2))
        self.assertNames(TypeError, "request_ids", m.step, ids.astype(np.float64), one, tok)
        self.assertNames(TypeError, "counts", m.step, ids, one.astype(np.float32), tok)
        self.assertNames(TypeError, "tokens", m.step, ids, one, "x")
        self.assertNames(TypeError, "request_ids", m.step, {0: 1}, one, tok)
        self.assertNames(ValueError, "request_ids", m.step, np.zeros((1, 1), np.uint32), one, tok)
        self.assertNames(ValueError, "counts", m.step, ids, np.array([-1], np.int32), tok)
        self.assertNames(ValueError, "writer", m.step, ids, one, tok, writer="magic")
        self.assertNames(TypeError, "writer", m.step, ids, one, tok, writer=3)
        self.assertNames(ValueError, "steps", m._step_loop_ns, ids, one, tok, -1)
        # A freed request in a batch: refused before any request changes.
        b = m.admit(prompt(10, 5000))
        m.free(b.request_id)
        self.assertNames(ValueError, "request_ids", m.step, np.array([ids[0], b.request_id], np.uint32),
                         np.array([1, 1], np.uint32), prompt(2))
        self.assertUnchanged()
        # Empty batches are fine.
        r = m.step(np.array([], np.uint32), np.array([], np.uint32), np.array([], np.uint32))
        self.assertEqual(len(r.offsets), 1)
        self.assertNames(ValueError, "index", r.blocks_of, 0)

    def test_backed_pool_needs_writers(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2)
        a = m.admit(prompt(10))
        self.assertNames(ValueError, "writers", m.append, a.request_id, prompt(10))
        self.assertNames(ValueError, "writers", m.step, [a.request_id], [1], [5])
        self.assertEqual(m.tokens(a.request_id), 0)

    def test_views(self):
        m = self.m
        self.assertNames(ValueError, "backed", m.page, 0, 0, 0)
        self.assertNames(ValueError, "backed", m.record, self.a.request_id, 0, 0, 0)
        b = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2)
        a = b.admit(prompt(10))
        b.append(a.request_id, prompt(10), writer="pattern")
        self.assertNames(ValueError, "block_id", b.page, 4, 0, 0)
        self.assertNames(ValueError, "block_id", b.page, -1, 0, 0)
        self.assertNames(ValueError, "group", b.page, 0, 1, 0)
        self.assertNames(ValueError, "layer", b.page, 0, 0, 1000)
        self.assertNames(ValueError, "position", b.record, a.request_id, 0, 0, 10)
        self.assertNames(ValueError, "layer", b.record, a.request_id, 0, 1000, 0)
        self.assertNames(ValueError, "layer", b.entry, a.request_id, 0, False, 0)
        self.assertNames(TypeError, "indexer", b.entry, a.request_id, 0, 0, 0)
        self.assertNames(ValueError, "block_id", b.block_state, 99)

    def test_store(self):
        S = tessera.TieredStore
        self.assertNames(ValueError, "tiers", S, self.m)
        self.assertNames(TypeError, "host_bytes", S, self.m, host_bytes="1G")
        self.assertNames(ValueError, "write_policy", S, self.m, host_bytes=1 << 20, write_policy="sometimes")
        self.assertNames(ValueError, "batch_records", S, self.m, host_bytes=1 << 20, batch_records=0)
        self.assertNames(ValueError, "redis_secret", S, self.m, redis_url="redis://127.0.0.1:1")
        self.assertNames(ValueError, "redis_url", S, self.m, redis_url="http://x", redis_secret=b"0" * 16)
        self.assertNames(ValueError, "redis_url", S, self.m, redis_url="redis://h:99999", redis_secret=b"0" * 16)
        self.assertNames(ValueError, "redis_url", S, self.m, redis_url="redis://a b:1", redis_secret=b"0" * 16)
        self.assertNames(TypeError, "redis_secret", S, self.m, redis_url="redis://h:1", redis_secret="0" * 16)
        self.assertNames(ValueError, "redis_secret", S, self.m, redis_url="redis://h:1", redis_secret=b"0" * 15)
        self.assertNames(ValueError, "redis_timeout_ms", S, self.m, redis_url="redis://h:1", redis_secret=b"0" * 16,
                         redis_timeout_ms=0)
        self.assertNames(ValueError, "disk_dir", S, self.m, disk_dir="")
        self.assertNames(ValueError, "disk_fsync", S, self.m, disk_dir="/tmp/x", disk_fsync="never-ever")
        self.assertNames(TypeError, "manager", S, None, host_bytes=1)


if __name__ == "__main__":
    unittest.main()
