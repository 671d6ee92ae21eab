"""tessera.vllm.Connector: vLLM's KVConnectorBase_V1 shape over Tessera's tiers, driven the way
vLLM's scheduler and workers drive a connector, with a worker stand-in whose paged KV buffers are
numpy arrays: engine A computes a prompt and saves its blocks, engine B (another buffer, other
block ids) loads them, and every byte of every loaded page is compared with A's. Through host
memory, a disk directory and a real redis-server; missing, damaged and foreign records."""
import os
import tempfile
import unittest
from types import SimpleNamespace

import numpy as np

from tessera.vllm import Connector, ConnectorMetadata

from redis_support import RedisServer

SECRET = b"connector-test-secret-0123456789"
BS = 16
LAYERS = ["model.layers.%d.self_attn.attn" % i for i in range(3)]
NUM_BLOCKS = 40


class Request:  # the fields of vLLM's Request a connector reads
    def __init__(self, rid, tokens):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_computed_tokens = 0

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


class Engine:
    """One engine: a paged buffer per layer (MLA: [blocks, block_size, 576] bf16 as uint16) and a
    connector in both roles."""

    def __init__(self, tiers, seed):
        self.kv = {n: np.zeros((NUM_BLOCKS, BS, 576), np.uint16) for n in LAYERS}
        self.conn = Connector(role="scheduler", block_size=BS, tiers=tiers, secret=SECRET)
        self.conn.register_kv_caches(self.kv)
        self.rng = np.random.default_rng(seed)

    def forward(self, block_ids):
        """The model writes the KV of these blocks (random bytes stand in for it)."""
        for n in LAYERS:
            for b in block_ids:
                self.kv[n][b] = self.rng.integers(0, 1 << 16, size=(BS, 576), dtype=np.uint16)

    def step(self, req, block_ids, local_tokens, scheduled):
        """One scheduler step for a new request whose blocks are `block_ids`, then the worker."""
        ext, is_async = self.conn.get_num_new_matched_tokens(req, local_tokens)
        assert is_async is False
        self.conn.update_state_after_alloc(req, (list(block_ids),), ext)
        req.num_computed_tokens = local_tokens + ext
        out = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=req.request_id, block_ids=(list(block_ids),),
                                                num_computed_tokens=req.num_computed_tokens)],
            scheduled_cached_reqs=None,
            num_scheduled_tokens={req.request_id: scheduled})
        meta = self.conn.build_connector_meta(out)
        self.conn.bind_connector_metadata(meta)
        self.conn.start_load_kv(None)
        for n in LAYERS:  # the forward pass, layer by layer
            self.conn.wait_for_layer_load(n)
        self.forward([block_ids[i] for i in range(req.num_computed_tokens // BS, len(block_ids))])
        for n in LAYERS:
            self.conn.save_kv_layer(n, self.kv[n], None)
        self.conn.wait_for_save()
        self.conn.clear_connector_metadata()
        return ext, meta


def prompt(n, base=1000):
    return list(range(base, base + n))


class ConnectorCases:
    """The cases, run over each tier configuration (subclasses give `tiers()`)."""

    def test_save_then_load_every_byte(self):
        a, b = Engine(self.tiers(), 1), Engine(self.tiers(), 2)
        toks = prompt(100)
        ids_a = [3, 9, 1, 17, 5, 30, 12]
        ext, meta = a.step(Request("r", toks), ids_a, 0, 100)
        self.assertEqual(ext, 0)
        self.assertEqual([t.index for t in meta.saves], [0, 1, 2, 3, 4, 5])  # whole blocks only
        ids_b = [20, 21, 2, 33, 8, 6, 39]
        ext, meta = b.step(Request("r", toks), ids_b, 0, 4)
        self.assertEqual(ext, 96)  # six blocks; the last prompt token is computed
        self.assertEqual([t.block_id for t in meta.loads], ids_b[:6])
        for n in LAYERS:
            for i in range(6):
                np.testing.assert_array_equal(b.kv[n][ids_b[i]], a.kv[n][ids_a[i]])
        self.assertEqual(b.conn.stats["loaded_blocks"], 6)
        self.assertEqual(b.conn.get_block_ids_with_load_errors(), set())

    def test_local_hits_load_only_the_rest(self):
        a, b = Engine(self.tiers(), 3), Engine(self.tiers(), 4)
        toks = prompt(90)
        ids_a = list(range(6))
        a.step(Request("r", toks), ids_a, 0, 90)
        ids_b = [10, 11, 12, 13, 14, 15]
        before = {n: b.kv[n].copy() for n in LAYERS}
        ext, meta = b.step(Request("r", toks), ids_b, 32, 10)  # two blocks were in B's own cache
        self.assertEqual(ext, 48)
        self.assertEqual([t.index for t in meta.loads], [2, 3, 4])
        for n in LAYERS:
            for i in (2, 3, 4):
                np.testing.assert_array_equal(b.kv[n][ids_b[i]], a.kv[n][ids_a[i]])
            for i in (0, 1):  # not touched
                np.testing.assert_array_equal(b.kv[n][ids_b[i]], before[n][ids_b[i]])

    def test_prefix_stops_at_the_first_different_block(self):
        a, b = Engine(self.tiers(), 5), Engine(self.tiers(), 6)
        a.step(Request("r", prompt(80)), list(range(5)), 0, 80)
        toks = prompt(80)
        toks[50] = 7  # block 3 differs
        ext, _ = b.step(Request("q", toks), list(range(10, 15)), 0, 80)
        self.assertEqual(ext, 48)
        ext, _ = b.step(Request("z", prompt(80, base=5)), list(range(20, 25)), 0, 80)
        self.assertEqual(ext, 0)  # a missing key: nothing matched

    def test_arguments(self):
        c = Connector(role="worker", block_size=BS, tiers=self.tiers(), secret=SECRET)
        with self.assertRaisesRegex(ValueError, "kv_caches"):
            c.register_kv_caches({"l": np.zeros((4, 8, 576), np.uint16)})  # block dimension 8
        with self.assertRaisesRegex(TypeError, "kv_caches"):
            c.register_kv_caches([])
        with self.assertRaisesRegex(ValueError, "role"):
            Connector(role="both", block_size=BS, tiers=self.tiers(), secret=SECRET)
        with self.assertRaisesRegex(TypeError, "block_size"):
            Connector(block_size="16", tiers=self.tiers(), secret=SECRET)
        with self.assertRaisesRegex(ValueError, "num_computed_tokens"):
            c.get_num_new_matched_tokens(Request("r", prompt(40)), -1)
        with self.assertRaisesRegex(TypeError, "connector_metadata"):
            c.bind_connector_metadata({})
        c.register_kv_caches({n: np.zeros((4, BS, 576), np.uint16) for n in LAYERS})
        c.bind_connector_metadata(ConnectorMetadata())
        with self.assertRaisesRegex(ValueError, "layer_name"):
            c.wait_for_layer_load("nope")


class ConnectorHost(ConnectorCases, unittest.TestCase):
    def tiers(self):
        if not hasattr(self, "_tiers"):
            from tessera._core import RecordTiers
            self._tiers = RecordTiers([{"kind": "host", "capacity_bytes": 32 << 20}])
        return self._tiers


class ConnectorDisk(ConnectorCases, unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.addCleanup(self._dir.cleanup)

    def tiers(self):
        # A host tier of two blocks in front of the disk: most records are demoted to disk. One
        # RecordTiers per directory (a disk tier holds its directory's lock).
        if not hasattr(self, "_tiers"):
            from tessera._core import RecordTiers
            self._tiers = RecordTiers([{"kind": "host", "capacity_bytes": 2 * (3 * BS * 576 * 2 + 4096)},
                                       {"kind": "disk", "dir": os.path.join(self._dir.name, "kv")}])
        return self._tiers

    def test_records_survive_the_process_and_a_damaged_one_is_a_load_error(self):
        from tessera._core import RecordTiers
        d = os.path.join(self._dir.name, "alone")
        ta = RecordTiers([{"kind": "disk", "dir": d}])
        a = Engine(ta, 7)
        toks = prompt(70)
        ids_a = [0, 1, 2, 3, 4]
        a.step(Request("r", toks), ids_a, 0, 70)
        kv_a = {n: a.kv[n].copy() for n in LAYERS}
        del a, ta  # the first process ends
        tb = RecordTiers([{"kind": "disk", "dir": d}])  # reopened: every record verified
        b = Engine(tb, 8)
        segs = [os.path.join(d, f) for f in os.listdir(d) if os.path.getsize(os.path.join(d, f)) > 100000]
        self.assertEqual(len(segs), 1)
        size = os.path.getsize(segs[0])
        with open(segs[0], "r+b") as f:  # then one byte of the third of four records goes bad
            f.seek(size * 5 // 8)
            x = f.read(1)
            f.seek(size * 5 // 8)
            f.write(bytes([x[0] ^ 0x10]))
        ids_b = [30, 31, 32, 33, 34]
        before = {n: b.kv[n].copy() for n in LAYERS}
        ext, _ = b.step(Request("r", toks), ids_b, 0, 70)
        self.assertEqual(ext, 64)
        errors = b.conn.get_block_ids_with_load_errors()
        self.assertEqual(errors, {ids_b[2]})
        self.assertEqual(b.conn.stats["loaded_blocks"], 3)
        for i in range(4):
            for n in LAYERS:
                if ids_b[i] in errors:  # the damaged block: not one byte written
                    np.testing.assert_array_equal(b.kv[n][ids_b[i]], before[n][ids_b[i]])
                else:
                    np.testing.assert_array_equal(b.kv[n][ids_b[i]], kv_a[n][ids_a[i]])


class ConnectorRedis(ConnectorCases, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()

    @classmethod
    def tearDownClass(cls):
        cls.redis.close()

    def setUp(self):
        self.redis.command("FLUSHALL")

    def tiers(self):
        return [{"kind": "redis", "host": "127.0.0.1", "port": self.redis.port}]

    def test_foreign_records_are_never_matched_nor_loaded(self):
        a = Engine(self.tiers(), 9)
        toks = prompt(40)
        a.step(Request("r", toks), [0, 1, 2], 0, 40)
        keys = self.redis.command("KEYS", "*")
        self.assertEqual(len(keys), 2)
        for k in keys:  # every stored value replaced: one garbage, one a byte flipped
            v = self.redis.command("GET", k)
            self.redis.command("SET", k, b"\x01" * 64 if k == keys[0] else v[:100] + bytes([v[100] ^ 1]) + v[101:])
        b = Engine(self.tiers(), 10)
        ext, meta = b.step(Request("r", toks), [5, 6, 7], 0, 40)
        self.assertEqual(ext, 0)  # the tier refused both values: nothing to load, B computes
        self.assertEqual(meta.loads, [])
        self.assertEqual(b.conn.stats["loaded_blocks"], 0)


if __name__ == "__main__":
    unittest.main()
