"""tessera.TieredStore: host, disk and Redis tiers under a request manager; blocks written by one
manager are found, verified and promoted by another, byte for byte."""

import os
import shutil
import socket
import tempfile
import unittest

import numpy as np

import pattern
import tessera
from redis_support import RedisServer

KEY = b"tessera-python-test-key-32-bytes"
BT = 64  # tiny-mla's block span


def prompt(n, base=1):
    return np.arange(base, base + n, dtype=np.uint32)


def manager(**kw):
    kw.setdefault("capacity_blocks", 16)
    return tessera.RequestManager("tiny-mla", max_requests=4, hash_key=KEY, **kw)


def fill(m, p):
    a = m.admit(p)
    m.append(a.request_id, p[a.cached_tokens:], writer="pattern")
    return a


def check_pattern(test, m, rid, tokens):
    g = m.groups[0]
    for position in range(0, tokens, 37):
        for layer in range(g["layers"]):
            planes = m.record(rid, 0, layer, position)
            np.testing.assert_array_equal(planes[0], pattern.record(0, layer, position, 0, g["record_bytes"]))


class StoreTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tessera-py-store-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def round_trip(self, **store_kw):
        """Manager A writes 4 blocks through to the store and checkpoints; manager B, a fresh
        one with the same key and a store over the same tier, promotes and verifies them."""
        p = prompt(4 * BT + 1)
        a = manager()
        sa = tessera.TieredStore(a, write_policy="write-through", **store_kw)
        self.assertTrue(sa.attached)
        ra = fill(a, p)
        self.assertGreaterEqual(a.checkpoint(), 4)
        sa.flush()
        self.assertGreaterEqual(sa.stats()["written_through"], 4)
        a.free(ra.request_id)
        del a, sa

        b = manager()
        sb = tessera.TieredStore(b, **store_kw)
        rb = b.admit(p)
        self.assertEqual(rb.cached_blocks, 4)
        self.assertEqual(rb.tier_blocks, 4)
        self.assertEqual(sb.stats()["tier_hits"], 4)
        b.append(rb.request_id, p[rb.cached_tokens:], writer="pattern")
        check_pattern(self, b, rb.request_id, len(p))
        # One scrape of the manager includes its store's families.
        text = b.prometheus_text()
        self.assertIn("# TYPE tessera_tier_promotions_total counter", text)
        self.assertIn("tessera_tier_records", b.metrics())
        return b, sb

    def test_disk_round_trip(self):
        b, sb = self.round_trip(disk_dir=os.path.join(self.dir, "disk"))
        self.assertEqual(sb.tiers, ["disk"])
        self.assertGreaterEqual(sb.tier_counters(0)["records"], 4)
        with self.assertRaises(ValueError):
            sb.tier_counters(1)

    @unittest.skipUnless(tessera._core.HAVE_REDIS, "built without the Redis tiers (TESSERA_WITH_REDIS=OFF)")
    def test_redis_round_trip(self):
        server = RedisServer()
        try:
            b, sb = self.round_trip(redis_url="redis://127.0.0.1:%d" % server.port, redis_secret=b"s" * 32)
            self.assertEqual(sb.tiers, ["redis"])
        finally:
            server.close()

    @unittest.skipUnless(tessera._core.HAVE_REDIS, "built without the Redis tiers (TESSERA_WITH_REDIS=OFF)")
    def test_redis_tenant_domains_keep_tenants_apart(self):
        """One server, one model: a store of tenant domain 2 reads nothing of domain 1's blocks,
        and its keys live in another namespace; domain 1 again reads them (issue 25 point 10)."""
        server = RedisServer()
        try:
            url = "redis://127.0.0.1:%d" % server.port
            self.round_trip(redis_url=url, redis_secret=b"s" * 32, redis_tenant_domain=1)
            keys = server.command("KEYS", "*")
            self.assertTrue(keys and all(b":1:" in k for k in keys), keys[:2])
            p = prompt(4 * BT + 1)
            c = manager()
            tessera.TieredStore(c, redis_url=url, redis_secret=b"s" * 32, redis_tenant_domain=2)
            self.assertEqual(c.admit(p).tier_blocks, 0)
            d = manager()
            tessera.TieredStore(d, redis_url=url, redis_secret=b"s" * 32, redis_tenant_domain=1)
            self.assertEqual(d.admit(p).tier_blocks, 4)
            with self.assertRaisesRegex(ValueError, "redis_tenant_domain"):
                tessera.TieredStore(d, redis_url=url, redis_secret=b"s" * 32, redis_tenant_domain=1,
                                    redis_namespace="mine")
        finally:
            server.close()

    def test_host_tier_takes_evicted_blocks(self):
        m = manager(capacity_blocks=4)
        s = tessera.TieredStore(m, host_bytes=64 << 20)
        first = prompt(3 * BT + 1)
        r = fill(m, first)
        m.free(r.request_id)
        # Another prompt needs every block: the first prompt's cached blocks are evicted to host.
        other = fill(m, prompt(3 * BT + 1, 100000))
        m.free(other.request_id)
        self.assertGreater(s.stats()["demoted"], 0)
        again = m.admit(first)
        self.assertEqual(again.cached_blocks, 3)
        self.assertGreater(again.tier_blocks, 0)
        m.append(again.request_id, first[again.cached_tokens:], writer="pattern")
        check_pattern(self, m, again.request_id, len(first))
        metrics = s.metrics()
        self.assertGreater(metrics["tessera_tier_demotions_total"]["samples"][""], 0)

    def test_detach_and_replace(self):
        m = manager()
        s1 = tessera.TieredStore(m, host_bytes=1 << 20)
        s2 = tessera.TieredStore(m, disk_dir=os.path.join(self.dir, "d2"))
        self.assertFalse(s1.attached)
        self.assertTrue(s2.attached)
        s2.detach()
        self.assertFalse(s2.attached)
        fill(m, prompt(2 * BT))  # no source: nothing is written anywhere
        self.assertEqual(s2.stats()["written_through"], 0)

    @unittest.skipUnless(tessera._core.HAVE_REDIS, "built without the Redis tiers (TESSERA_WITH_REDIS=OFF)")
    def test_unreachable_redis_degrades_to_misses(self):
        m = manager()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        s = tessera.TieredStore(m, redis_url="redis://127.0.0.1:%d" % port, redis_secret=b"s" * 32,
                                redis_timeout_ms=50)
        a = fill(m, prompt(2 * BT + 1))
        self.assertEqual(a.tier_blocks, 0)
        self.assertEqual(m.tokens(a.request_id), 2 * BT + 1)
        del s


if __name__ == "__main__":
    unittest.main()
