"""tessera.TieredStore: host, disk and Redis tiers under a request manager; blocks written by one
manager are found, verified and promoted by another, byte for byte."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import numpy as np

import pattern
import tessera

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


class RedisServer:
    """A real redis-server on 127.0.0.1 with no persistence, in a temporary directory."""

    def __init__(self):
        path = shutil.which("redis-server")
        if path is None:
            raise AssertionError("redis-server is not on PATH: run scripts/install-deps.sh")
        self.dir = tempfile.mkdtemp(prefix="tessera-py-redis-")
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen(
                [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir, "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self.wait_up():
                return
            self.stop()
        raise AssertionError("redis-server did not start")

    def wait_up(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


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

    def test_redis_round_trip(self):
        server = RedisServer()
        try:
            b, sb = self.round_trip(redis_url="redis://127.0.0.1:%d" % server.port, redis_secret=b"s" * 32)
            self.assertEqual(sb.tiers, ["redis"])
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
