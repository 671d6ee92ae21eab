"""tessera.TieredStore(redis_cluster=...): a real 3-node Redis Cluster on 127.0.0.1. Pages one
manager writes through to the cluster are spread over the nodes and come back, verified, into a
second manager, every byte; a wrong secret and a lost cluster are misses, never a crash."""

import unittest

import numpy as np

import pattern
import tessera
from redis_support import RedisCluster

KEY = b"tessera-python-test-key-32-bytes"
SECRET = b"cluster-fleet-secret-0123456789ab"
BT = 64  # tiny-mla's block span
BLOCKS = 12  # sealed blocks of the prompt: their keys land on all three nodes


def prompt(n, base=1):
    return np.arange(base, base + n, dtype=np.uint32)


def manager():
    return tessera.RequestManager("tiny-mla", capacity_blocks=16, max_requests=4, hash_key=KEY)


def fill(m, p):
    a = m.admit(p)
    m.append(a.request_id, p[a.cached_tokens:], writer="pattern")
    return a


def mismatches(m, rid, tokens):
    """Every byte of every plane of every record (group, layer, position) the request holds, against
    the pattern writer's bytes: a list of (group, layer, position, plane) that differ."""
    bad = []
    for g, group in enumerate(m.groups):
        for layer in range(group["layers"]):
            for position in range(tokens):
                planes = m.record(rid, g, layer, position)
                for k, plane in enumerate(planes):
                    want = pattern.record(g, layer, position, k, len(plane))
                    if not np.array_equal(np.asarray(plane), want):
                        bad.append((g, layer, position, k))
    return bad


@unittest.skipUnless(tessera._core.HAVE_REDIS, "built without the Redis tiers (TESSERA_WITH_REDIS=OFF)")
class ClusterStoreTest(unittest.TestCase):
    # Redis tests fail rather than skip without redis-server (as the C++ ones do, and
    # test_store.py's): RedisCluster raises, naming scripts/install-deps.sh.
    # One cluster for the class (forming one takes ~2 s), emptied before each test; the test that
    # kills its nodes forms its own.
    @classmethod
    def setUpClass(cls):
        cls.shared = RedisCluster()

    @classmethod
    def tearDownClass(cls):
        cls.shared.close()

    def setUp(self):
        self.cluster = self.shared
        for n in self.cluster.nodes:
            n.command("FLUSHALL")
        self.p = prompt(BLOCKS * BT + 1)

    def store(self, m, secret=SECRET, **kw):
        return tessera.TieredStore(m, redis_cluster=self.cluster.seeds(), redis_secret=secret, **kw)

    def write(self):
        """Manager A writes the prompt's sealed blocks through to the cluster."""
        a = manager()
        sa = self.store(a, write_policy="write-through")
        self.assertEqual(sa.tiers, ["redis-cluster"])
        ra = fill(a, self.p)
        sa.flush()
        self.assertEqual(sa.stats()["written_through"], BLOCKS)
        self.assertEqual(sa.stats()["write_errors"], 0)
        a.free(ra.request_id)
        sa.detach()

    def test_blocks_round_trip_through_the_cluster_every_byte(self):
        self.write()
        sizes = self.cluster.dbsizes()
        self.assertEqual(sum(sizes), BLOCKS)  # one value per block, no more
        for i, n in enumerate(sizes):
            self.assertGreater(n, 0, "node %d holds none of the blocks: %s" % (i, sizes))

        b = manager()
        sb = self.store(b)
        rb = b.admit(self.p)
        self.assertEqual(rb.cached_blocks, BLOCKS)
        self.assertEqual(rb.tier_blocks, BLOCKS)
        self.assertEqual(rb.cached_tokens, BLOCKS * BT)
        st = sb.stats()
        self.assertEqual(st["tier_hits"], BLOCKS)
        self.assertEqual(st["verify_failures"], 0)
        # The promoted blocks' bytes are the cluster's: check them before B writes anything.
        self.assertEqual(mismatches(b, rb.request_id, BLOCKS * BT), [])
        b.append(rb.request_id, self.p[rb.cached_tokens:], writer="pattern")
        self.assertEqual(mismatches(b, rb.request_id, len(self.p)), [])

    def test_a_wrong_secret_is_misses(self):
        self.write()
        b = manager()
        sb = self.store(b, secret=b"another-fleet-secret-0123456789a")
        rb = b.admit(self.p)
        self.assertEqual(rb.tier_blocks, 0)
        self.assertEqual(rb.cached_blocks, 0)
        self.assertEqual(sb.stats()["tier_hits"], 0)
        # Every value was found and refused by the tier itself: its tag does not verify under
        # this secret (quarantined, served as a miss).
        self.assertEqual(sb.tier_counters(0)["quarantined"], BLOCKS)
        # The request goes on, computed from scratch.
        b.append(rb.request_id, self.p, writer="pattern")
        self.assertEqual(b.tokens(rb.request_id), len(self.p))
        self.assertEqual(mismatches(b, rb.request_id, 2 * BT), [])
        # The right secret on the same cluster still finds every block: nothing was damaged.
        c = manager()
        self.store(c)
        self.assertEqual(c.admit(self.p).tier_blocks, BLOCKS)

    def test_a_lost_cluster_is_misses(self):
        self.cluster = RedisCluster()
        self.addCleanup(self.cluster.close)
        self.write()
        b = manager()
        sb = self.store(b, redis_timeout_ms=100, write_policy="write-through")
        self.cluster.stop()  # every node killed (SIGKILL) after the store met the cluster
        rb = b.admit(self.p)
        self.assertEqual(rb.tier_blocks, 0)
        self.assertEqual(rb.cached_blocks, 0)
        self.assertEqual(sb.stats()["tier_hits"], 0)
        # Writes through to the dead cluster fail as errors counted, not raised.
        b.append(rb.request_id, self.p, writer="pattern")
        self.assertEqual(b.tokens(rb.request_id), len(self.p))
        try:
            sb.flush()
        except tessera.TierIOError:
            pass  # records dropped: flush says so
        self.assertEqual(sb.stats()["tier_hits"], 0)
        self.assertEqual(mismatches(b, rb.request_id, 2 * BT), [])
        # A store opened on the dead seeds degrades the same way.
        c = manager()
        self.store(c, redis_timeout_ms=100)
        self.assertEqual(c.admit(self.p).tier_blocks, 0)

    def assertNames(self, exc, name, **kw):
        with self.assertRaises(exc) as cm:
            tessera.TieredStore(self.m, **kw)
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(name), "%r does not start with %r" % (msg, name))
        self.assertNotIn("\n", msg)

    def test_bad_cluster_options_name_the_argument(self):
        self.m = manager()
        seeds = self.cluster.seeds()
        for bad in (seeds + ",", "," + seeds, seeds.replace(",", ",,"), ""):
            self.assertNames(ValueError, "redis_cluster", redis_cluster=bad, redis_secret=SECRET)
        self.assertNames(ValueError, "redis_url", redis_cluster=seeds, redis_url="redis://127.0.0.1:1",
                         redis_secret=SECRET)
        self.assertNames(ValueError, "redis_secret", redis_cluster=seeds)
        self.assertNames(ValueError, "redis_secret", redis_cluster=seeds, redis_secret=b"0" * 15)
        self.assertNames(TypeError, "redis_secret", redis_cluster=seeds, redis_secret="0" * 32)
        self.assertNames(TypeError, "redis_cluster", redis_cluster=7, redis_secret=SECRET)
        # What the cluster tier itself refuses is named by the argument that carried it.
        for bad in ("127.0.0.1:0", "localhost", "127.0.0.1:1,[]:1", "h:65536", ",".join(["127.0.0.1:1"] * 1001)):
            self.assertNames(ValueError, "redis_cluster", redis_cluster=bad, redis_secret=SECRET)
        self.assertNames(ValueError, "redis_timeout_ms", redis_cluster=seeds, redis_secret=SECRET, redis_timeout_ms=0)
        self.assertNames(ValueError, "redis_namespace", redis_cluster=seeds, redis_secret=SECRET,
                         redis_namespace="ns{x}")
        self.assertNotIn("tessera_tier_records", self.m.metrics())  # no store was attached

if __name__ == "__main__":
    unittest.main()
