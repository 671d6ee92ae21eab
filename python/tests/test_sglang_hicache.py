"""tessera.sglang.HiCacheStorage: SGLang's storage-backend surface over Tessera's tiers, with
real page bytes (numpy and torch), every byte compared, through host memory, a disk directory
and a real redis-server; hostile and missing keys, damaged and planted records."""
import os
import tempfile
import unittest

import numpy as np

from tessera import _records
from tessera._core import RecordTiers
from tessera.sglang import HiCacheStorage

from redis_support import RedisServer

SECRET = b"hicache-test-secret-0123456789ab"
PAGE = (64, 576)  # one SGLang MLA host page: 64 tokens x 576 bytes (fp8 records)


def pages(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=PAGE, dtype=np.uint8) for _ in range(n)]


class Config:  # the fields of SGLang's HiCacheStorageConfig the backend reads
    def __init__(self, tp_rank=0, tp_size=1, is_mla_model=True, model_name="deepseek-ai/DeepSeek-V3"):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, 0, 1
        self.is_mla_model, self.model_name, self.extra_config = is_mla_model, model_name, None


class HiCacheHost(unittest.TestCase):
    def setUp(self):
        self.s = HiCacheStorage(Config(), tiers=[{"kind": "host", "capacity_bytes": 64 << 20}], secret=SECRET)

    def test_round_trip_every_byte(self):
        vals = pages(8, 1)
        keys = ["page-%d" % i for i in range(8)]
        self.assertTrue(self.s.batch_set(keys, vals))
        out = [np.zeros(PAGE, np.uint8) for _ in keys]
        got = self.s.batch_get(keys, out)
        for v, o, g in zip(vals, out, got):
            self.assertIs(g, o)
            np.testing.assert_array_equal(v, o)
        self.assertEqual(bytes(self.s.get("page-3")), vals[3].tobytes())  # no target: a copy
        self.assertEqual(self.s.get_stats()["hits"], 9)

    def test_exists_and_prefix_count(self):
        vals = pages(5, 2)
        self.assertTrue(self.s.batch_set(["a", "b", "c", "e", "f"], vals))
        self.assertTrue(self.s.exists("c"))
        self.assertFalse(self.s.exists("d"))
        self.assertEqual(self.s.batch_exists(["a", "b", "c", "d", "e"]), 3)
        self.assertEqual(self.s.batch_exists(["d", "a"]), 0)
        self.assertEqual(self.s.batch_exists([]), 0)

    def test_missing_key_is_none(self):
        self.assertIsNone(self.s.get("never-stored", np.zeros(PAGE, np.uint8)))
        self.assertEqual(self.s.batch_get(["x", "y"], [np.zeros(PAGE, np.uint8)] * 2), [None, None])

    def test_hostile_keys_and_arguments(self):
        v = pages(1, 3)[0]
        weird = ["../../etc/passwd", "", "\x00\x01", "k" * 4000, "ключ/🙂"]
        self.assertTrue(self.s.batch_set(weird, [v] * len(weird)))
        for k in weird:
            out = np.zeros(PAGE, np.uint8)
            self.assertIs(self.s.get(k, out), out)
            np.testing.assert_array_equal(out, v)
        with self.assertRaisesRegex(ValueError, "key"):
            self.s.set("k" * 5000, v)
        with self.assertRaisesRegex(TypeError, "keys"):
            self.s.batch_get("abc")
        with self.assertRaisesRegex(TypeError, r"keys\[1\]"):
            self.s.batch_set(["a", 7], [v, v])
        with self.assertRaisesRegex(ValueError, "values"):
            self.s.batch_set(["a", "b"], [v])
        with self.assertRaisesRegex(TypeError, "target_locations"):
            self.s.batch_get(["a"], [object()])
        with self.assertRaisesRegex(ValueError, "read-only"):
            ro = np.zeros(PAGE, np.uint8)
            ro.flags.writeable = False
            self.s.get("a", ro)
        with self.assertRaisesRegex(TypeError, "secret"):
            HiCacheStorage(tiers=[{"kind": "host", "capacity_bytes": 1 << 20}], secret="text")
        with self.assertRaisesRegex(ValueError, "secret"):
            HiCacheStorage(tiers=[{"kind": "host", "capacity_bytes": 1 << 20}], secret=b"short")
        with self.assertRaisesRegex(ValueError, r"tiers\[0\].kind"):
            HiCacheStorage(tiers=[{"kind": "tape"}], secret=SECRET)
        with self.assertRaisesRegex(ValueError, r"tiers\[0\].colour"):
            HiCacheStorage(tiers=[{"kind": "host", "capacity_bytes": 1 << 20, "colour": 1}], secret=SECRET)

    def test_wrong_size_target_is_a_miss_not_a_partial_copy(self):
        v = pages(1, 4)[0]
        self.s.set("p", v)
        small = np.full(100, 7, np.uint8)
        self.assertIsNone(self.s.get("p", small))
        self.assertTrue((small == 7).all())
        self.assertEqual(self.s.get_stats()["rejected"], 1)

    def test_torch_tensors(self):
        import torch
        t = torch.arange(64 * 576, dtype=torch.int32).to(torch.bfloat16).reshape(64, 576)
        self.assertTrue(self.s.set("t", t))
        out = torch.zeros_like(t)
        self.assertIs(self.s.get("t", out), out)
        self.assertTrue(torch.equal(out.view(torch.int16), t.view(torch.int16)))

    def test_keys_apart_per_rank_for_mha_not_for_mla(self):
        tiers = RecordTiers([{"kind": "host", "capacity_bytes": 8 << 20}])
        v = pages(1, 5)[0]
        mla0 = HiCacheStorage(Config(0, 2), tiers=tiers, secret=SECRET)
        mla1 = HiCacheStorage(Config(1, 2), tiers=tiers, secret=SECRET)
        mha0 = HiCacheStorage(Config(0, 2, False), tiers=tiers, secret=SECRET)
        mha1 = HiCacheStorage(Config(1, 2, False), tiers=tiers, secret=SECRET)
        mla0.set("k", v)
        mha0.set("k", v)
        self.assertTrue(mla1.exists("k"))  # MLA: one latent cache for every rank
        self.assertFalse(mha1.exists("k"))
        other = HiCacheStorage(Config(model_name="other/model"), tiers=tiers, secret=SECRET)
        self.assertFalse(other.exists("k"))

    def test_clear(self):
        self.s.batch_set(["a", "b"], pages(2, 6))
        self.s.clear()
        self.assertEqual(self.s.batch_exists(["a", "b"]), 0)


class HiCacheDisk(unittest.TestCase):
    def test_host_evicts_to_disk_and_disk_survives_reopen(self):
        with tempfile.TemporaryDirectory() as root:
            d = os.path.join(root, "kv")
            page_bytes = PAGE[0] * PAGE[1]
            tiers = [{"kind": "host", "capacity_bytes": 3 * (page_bytes + 4096)}, {"kind": "disk", "dir": d}]
            s = HiCacheStorage(Config(), tiers=tiers, secret=SECRET)
            vals = pages(10, 7)
            keys = ["../disk-%d" % i for i in range(10)]
            self.assertTrue(s.batch_set(keys, vals))
            c = s.get_stats()["tiers"]
            self.assertEqual(c[0]["tier"], "host")
            self.assertLessEqual(c[0]["records"], 3)
            self.assertGreaterEqual(c[1]["records"], 7)
            out = [np.zeros(PAGE, np.uint8) for _ in keys]
            s.batch_get(keys, out)
            for v, o in zip(vals, out):
                np.testing.assert_array_equal(v, o)
            self.assertEqual(sorted(os.listdir(root)), ["kv"])  # nothing written beside the directory
            del s
            s2 = HiCacheStorage(Config(), tiers=[{"kind": "disk", "dir": d}], secret=SECRET)
            self.assertEqual(s2.batch_exists(keys[:7]), 7)  # the seven the host tier evicted
            out = np.zeros(PAGE, np.uint8)
            self.assertIs(s2.get(keys[0], out), out)
            np.testing.assert_array_equal(out, vals[0])

    def test_damaged_disk_record_is_a_miss(self):
        with tempfile.TemporaryDirectory() as d:
            s = HiCacheStorage(Config(), tiers=[{"kind": "disk", "dir": d}], secret=SECRET)
            vals = pages(2, 8)
            s.batch_set(["a", "b"], vals)
            del s
            segs = [os.path.join(d, f) for f in os.listdir(d) if os.path.getsize(os.path.join(d, f)) > 70000]
            self.assertTrue(segs)
            with open(segs[0], "r+b") as f:  # one byte inside the first record's page
                f.seek(8192)
                b = f.read(1)
                f.seek(8192)
                f.write(bytes([b[0] ^ 0x40]))
            s = HiCacheStorage(Config(), tiers=[{"kind": "disk", "dir": d}], secret=SECRET)
            got = s.batch_get(["a", "b"], [np.zeros(PAGE, np.uint8), np.zeros(PAGE, np.uint8)])
            self.assertEqual(sum(g is None for g in got), 1)
            for g, v in zip(got, vals):
                if g is not None:
                    np.testing.assert_array_equal(g, v)

    def test_other_secret_reads_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            s = HiCacheStorage(Config(), tiers=[{"kind": "disk", "dir": d}], secret=SECRET)
            s.set("a", pages(1, 9)[0])
            del s
            t = HiCacheStorage(Config(), tiers=[{"kind": "disk", "dir": d}], secret=b"another-secret-0123456789abcdef")
            self.assertFalse(t.exists("a"))
            self.assertIsNone(t.get("a", np.zeros(PAGE, np.uint8)))


class HiCacheRedis(unittest.TestCase):
    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.close)
        self.tiers = [{"kind": "redis", "host": "127.0.0.1", "port": self.redis.port}]

    def test_round_trip_through_redis(self):
        s = HiCacheStorage(Config(), tiers=self.tiers, secret=SECRET)
        vals = pages(6, 10)
        keys = ["r%d" % i for i in range(6)]
        self.assertTrue(s.batch_set(keys, vals))
        self.assertEqual(self.redis.command("DBSIZE"), 6)
        self.assertEqual(s.batch_exists(keys + ["missing"]), 6)
        out = [np.zeros(PAGE, np.uint8) for _ in keys]
        s.batch_get(keys, out)
        for v, o in zip(vals, out):
            np.testing.assert_array_equal(v, o)
        # A second process (another backend object, same secret) reads them.
        s2 = HiCacheStorage(Config(), tiers=self.tiers, secret=SECRET)
        o = np.zeros(PAGE, np.uint8)
        self.assertIs(s2.get("r4", o), o)
        np.testing.assert_array_equal(o, vals[4])

    def test_tampered_and_planted_values_are_misses(self):
        s = HiCacheStorage(Config(), tiers=self.tiers, secret=SECRET)
        vals = pages(3, 11)
        s.batch_set(["a", "b", "c"], vals)
        rkeys = sorted(self.redis.command("KEYS", "*"))
        self.assertEqual(len(rkeys), 3)
        before = {k: self.redis.command("GET", k) for k in rkeys}
        # Plant, at the key of "b", a well-formed record for "b" written by someone without the
        # secret (the tier's MAC key): the tier refuses it, it is never served.
        attacker = RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": self.redis.port,
                                 "secret": b"attacker-secret-0123456789abcdef"}])
        ident = s._identity("b")
        tk = s._tier_key(ident)
        evil = np.full(PAGE, 0xEE, np.uint8)
        self.assertEqual(attacker.put([tk], [_records.encode(_records.KIND_SGLANG_PAGE, ident, evil)],
                                      _records.FORMAT_ID), [True])
        self.assertEqual(self.redis.command("DBSIZE"), 3)  # it replaced a stored value
        changed = [k for k in rkeys if self.redis.command("GET", k) != before[k]]
        self.assertEqual(len(changed), 1)
        # Flip one byte in the middle of another stored value.
        victim = [k for k in rkeys if k != changed[0]][0]
        v = before[victim]
        self.redis.command("SETRANGE", victim, len(v) // 2, bytes([v[len(v) // 2] ^ 1]))
        got = s.batch_get(["a", "b", "c"], [np.zeros(PAGE, np.uint8) for _ in range(3)])
        self.assertIsNone(got[1])  # the planted record
        self.assertEqual(sum(g is None for g in got), 2)  # and the flipped one
        for g, val in zip(got, vals):
            if g is not None:
                np.testing.assert_array_equal(g, val)

    def test_server_lost_degrades_to_misses(self):
        s = HiCacheStorage(Config(), tiers=[dict(self.tiers[0], timeout_ms=200)], secret=SECRET)
        v = pages(1, 12)[0]
        self.assertTrue(s.set("a", v))
        self.redis.stop()
        self.assertIsNone(s.get("a", np.zeros(PAGE, np.uint8)))
        self.assertFalse(s.exists("a"))
        self.assertFalse(s.set("b", v))
        self.assertGreaterEqual(s.get_stats()["set_failures"], 1)


if __name__ == "__main__":
    unittest.main()
