"""safetensors_io: round trip and every refusal, each naming the tensor or field."""

import json
import os
import struct
import tempfile
import unittest

import numpy as np

from oracle import safetensors_io as st


def build(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def f32bytes(n, start=0.0):
    return np.arange(start, start + n, dtype="<f4").tobytes()


class SafetensorsTest(unittest.TestCase):
    def test_round_trip(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.array([1.5, -2.0], dtype=np.float32)
        blob = st.serialize({"a": a, "b": b}, {"model": "tiny-mla"})
        tensors, meta = st.parse(blob)
        np.testing.assert_array_equal(tensors["a"], a)
        np.testing.assert_array_equal(tensors["b"], b)
        self.assertEqual(meta, {"model": "tiny-mla"})
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "w.safetensors")
            with open(p, "wb") as f:
                f.write(blob)
            tensors, _ = st.load(p)
            np.testing.assert_array_equal(tensors["a"], a)

    def test_little_endian(self):
        blob = build({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, struct.pack("<f", 2.5))
        self.assertEqual(st.parse(blob)[0]["x"].tolist(), [2.5])

    def refused(self, blob, *words):
        with self.assertRaises(ValueError) as cm:
            st.parse(blob)
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_refusals(self):
        ok = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        self.refused(b"\x01\x02", "header length")
        self.refused(struct.pack("<Q", 100) + b"{}", "header length", "100")
        self.refused(struct.pack("<Q", 3) + b"{x}", "header", "JSON")
        self.refused(struct.pack("<Q", 2) + b"\xff\xfe", "header", "UTF-8")
        self.refused(struct.pack("<Q", 2) + b"[]", "not a JSON object")
        self.refused(build({"w": dict(ok, dtype="F16")}, f32bytes(2)), "'w'", "dtype")
        self.refused(build({"w": dict(ok, dtype="BF16")}, f32bytes(2)), "'w'", "F32")
        self.refused(build({"w": dict(ok, shape=[3])}, f32bytes(2)), "'w'", "shape")
        self.refused(build({"w": dict(ok, shape=[-1])}, f32bytes(2)), "'w'", "shape")
        self.refused(build({"w": dict(ok, shape=[2.0])}, f32bytes(2)), "'w'", "shape")
        self.refused(build({"w": dict(ok, data_offsets=[0, 12])}, f32bytes(2)), "'w'", "beyond")
        self.refused(build({"w": dict(ok, data_offsets=[8, 0])}, f32bytes(2)), "'w'", "order")
        self.refused(build({"w": dict(ok, data_offsets=[0])}, f32bytes(2)), "'w'", "data_offsets")
        self.refused(build({"w": dict(ok, data_offsets=[True, 8])}, f32bytes(2)), "'w'", "data_offsets")
        self.refused(build({"w": {"dtype": "F32", "shape": [2]}}, f32bytes(2)), "'w'", "data_offsets")
        self.refused(build({"w": dict(ok, extra=1)}, f32bytes(2)), "'w'", "extra")
        self.refused(build({"w": [1]}, f32bytes(2)), "'w'")
        # two tensors over the same bytes
        self.refused(
            build({"a": ok, "b": dict(ok, data_offsets=[4, 12])}, f32bytes(3)), "'b'", "overlap")
        # a hole between tensors, and bytes after the last one
        self.refused(
            build({"a": ok, "b": dict(ok, data_offsets=[12, 20])}, f32bytes(5)), "'b'", "unindexed")
        self.refused(build({"a": ok}, f32bytes(3)), "data", "after the last tensor")
        self.refused(build({"__metadata__": {"k": 1}}, b""), "__metadata__")
        dup = b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
        self.refused(struct.pack("<Q", len(dup)) + dup, "duplicate", "'a'")

    def test_load_refuses_non_files(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ValueError) as cm:
                st.load(d)
            self.assertIn("not a regular file", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                st.load(os.path.join(d, "missing"))
            self.assertIn("cannot read", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
