"""RequestManager.take_events: KV-cache events (include/tessera/kv_events.h) as Python objects."""

import unittest

import numpy as np

import tessera

BT = 64  # tiny-mla's block span


def prompt(n, base=1):
    return np.arange(base, base + n, dtype=np.uint32)


class EventsTest(unittest.TestCase):
    def test_off_by_default(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=8, max_requests=2, backed=False)
        a = m.admit(prompt(3 * BT))
        m.append(a.request_id, prompt(3 * BT))
        self.assertEqual(m.take_events(), [])

    def test_stored_removed_cleared(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2, backed=False, kv_events=True,
                                   tenant_domain={5: 9})
        p = prompt(3 * BT + 7)
        a = m.admit(p, tenant=5)
        m.append(a.request_id, p)
        (stored,) = m.take_events()
        self.assertEqual(stored.kind, "BlockStored")
        self.assertEqual(len(stored.block_hashes), 3)
        self.assertTrue(all(isinstance(h, bytes) and len(h) == 16 for h in stored.block_hashes))
        self.assertEqual(len(set(stored.block_hashes)), 3)
        self.assertIsNone(stored.parent_block_hash)
        np.testing.assert_array_equal(stored.token_ids, p[:3 * BT])
        self.assertEqual(stored.block_size, BT)
        self.assertEqual(stored.domain, 9)
        self.assertEqual(stored.medium, "GPU")
        self.assertEqual(m.take_events(), [])  # drained

        # The fourth block continues the chain: its parent is the third block.
        m.step([a.request_id], [BT - 7], prompt(BT - 7, 500000))
        (more,) = m.take_events()
        self.assertEqual(more.kind, "BlockStored")
        self.assertEqual(more.parent_block_hash, stored.block_hashes[-1])
        self.assertEqual(len(more.block_hashes), 1)

        # Another prompt needs the pool: the cached blocks are evicted and announced as removed.
        m.free(a.request_id)
        b = m.admit(prompt(2 * BT, 900000), tenant=5)
        removed = [e for e in m.take_events() if e.kind == "BlockRemoved"]
        self.assertGreater(len(removed), 0)
        gone = [h for e in removed for h in e.block_hashes]
        self.assertTrue(set(gone) <= set(stored.block_hashes + more.block_hashes))

        with self.assertRaises(ValueError) as cm:
            m.reset_prefix_cache()  # a live request holds blocks
        self.assertTrue(str(cm.exception).startswith("requests"), str(cm.exception))
        m.free(b.request_id)
        m.reset_prefix_cache()
        events = m.take_events()
        self.assertEqual(events[-1].kind, "AllBlocksCleared")

    def test_backed_medium_is_cpu(self):
        m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2, kv_events=True)
        a = m.admit(prompt(BT))
        m.append(a.request_id, prompt(BT), writer="pattern")
        (e,) = m.take_events()
        self.assertEqual(e.medium, "CPU")

    def test_same_prefix_same_hashes(self):
        # Keys are per manager key: two managers with one hash key announce the same hashes.
        key = b"k" * 32
        hashes = []
        for _ in range(2):
            m = tessera.RequestManager("tiny-mla", capacity_blocks=4, max_requests=2, backed=False, kv_events=True,
                                       hash_key=key)
            a = m.admit(prompt(2 * BT))
            m.append(a.request_id, prompt(2 * BT))
            hashes.append(m.take_events()[0].block_hashes)
        self.assertEqual(hashes[0], hashes[1])


if __name__ == "__main__":
    unittest.main()
