"""`tessera serve` KV events received by a Python subscriber (python3-zmq, python3-msgpack), the
way a fleet router written against vLLM's events consumes them.

Usage: /usr/bin/python3 tests/serve_events_test.py PATH/TO/tessera
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import msgpack
import zmq

TESSERA = sys.argv.pop(1) if len(sys.argv) > 1 else os.environ.get("TESSERA_BINARY", "")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


class ServeEventsTest(unittest.TestCase):
    def setUp(self):
        if not TESSERA:
            self.skipTest("give the tessera binary as the first argument")
        self.dir = tempfile.TemporaryDirectory()
        config = os.path.join(self.dir.name, "serve.yaml")
        with open(config, "w") as f:
            f.write(
                "model: deepseek-v3\nkv_format: fp8_ds_mla\ncapacity_blocks: 8\n"
                "http:\n  listen: 127.0.0.1:0\n"
                "events:\n  endpoint: tcp://127.0.0.1:*\n  topic: kv@host\n"
            )
        self.proc = subprocess.Popen([TESSERA, "serve", "--config", config], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.addCleanup(self.stop_server)  # runs even when setUp fails below
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        self.assertTrue(ready, "the server did not start")
        line = self.proc.stdout.readline().decode()
        fields = dict(kv.split("=", 1) for kv in line.split()[3:])
        self.port = int(fields["http"].rsplit(":", 1)[1])
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@host")
        self.sub.connect(fields["events"])

    def stop_server(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.assertEqual(self.proc.wait(timeout=20), 0)
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def tearDown(self):
        if hasattr(self, "sub"):
            self.sub.close(linger=0)
            self.ctx.term()
        if hasattr(self, "dir"):
            self.dir.cleanup()

    def receive(self, seconds):
        batches = []
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.sub.poll(50):
                topic, seq, payload = self.sub.recv_multipart()
                self.assertEqual(topic, b"kv@host")
                self.assertEqual(len(seq), 8)
                batches.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
        return batches

    def test_stored_removed_cleared_in_vllms_shape(self):
        # PUB drops what is sent before the subscription lands: warm up with throwaway prompts.
        warm = []
        for i in range(50):
            r = post(self.port, "/v1/admit", {"tokens": list(range(10**6 + 100 * i, 10**6 + 100 * i + 65))})
            post(self.port, "/v1/free", {"request": r["request"]})
            warm = self.receive(0.1)
            if warm:
                break
        self.assertTrue(warm, "no event reached the subscriber")
        post(self.port, "/v1/reset", {})  # start from an empty cache: AllBlocksCleared

        prompt = list(range(1, 3 * 64 + 2))
        r = post(self.port, "/v1/admit", {"tokens": prompt, "tenant": 4})
        post(self.port, "/v1/free", {"request": r["request"], "tenant": 4})  # its tenant (ADR 0031)
        # Eight blocks of capacity: a seven-block prompt evicts the first prompt's three.
        r2 = post(self.port, "/v1/admit", {"tokens": list(range(5000, 5000 + 7 * 64 + 1))})
        batches = self.receive(0.5)
        seqs = [s for s, _ in batches]
        self.assertEqual(seqs, sorted(seqs))
        events = []
        for _, batch in batches:
            ts, evs, rank = batch  # KVEventBatch(ts, events, data_parallel_rank), array-like
            self.assertIsInstance(ts, float)
            self.assertEqual(rank, 0)
            events.extend(evs)
        tags = [e[0] for e in events]
        # Late warm-up events may come first; the reset's AllBlocksCleared starts this test's.
        self.assertIn("AllBlocksCleared", tags)
        events = events[len(tags) - 1 - tags[::-1].index("AllBlocksCleared"):]
        tags = [e[0] for e in events]
        self.assertEqual(tags, ["AllBlocksCleared", "BlockStored", "BlockRemoved", "BlockStored"])
        stored = events[1]
        # ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
        #  lora_name, extra_keys]
        self.assertEqual(len(stored[1]), 3)
        self.assertTrue(all(isinstance(h, bytes) and len(h) == 16 for h in stored[1]))
        self.assertIsNone(stored[2])
        self.assertEqual(stored[3], prompt[: 3 * 64])
        self.assertEqual(stored[4], 64)
        self.assertIsNone(stored[5])
        self.assertEqual(stored[6], "CPU")
        self.assertIsNone(stored[7])
        self.assertEqual(stored[8], [["tenant_domain", 4]] * 3)
        removed = events[2]
        self.assertEqual(removed[0], "BlockRemoved")
        self.assertEqual(sorted(removed[1]), sorted(stored[1]))
        self.assertEqual(removed[2], "CPU")
        self.assertEqual(len(events[3][1]), 7)
        self.assertEqual(len(events[3]), 8)  # tenant 0: no extra_keys
        post(self.port, "/v1/free", {"request": r2["request"]})


if __name__ == "__main__":
    unittest.main()
