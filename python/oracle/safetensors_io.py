"""Reads and writes safetensors files holding F32 tensors, checking every byte before use.

Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data buffer. Each
header entry (other than "__metadata__", a map of strings) is {"dtype", "shape", "data_offsets":
[begin, end]} relative to the data buffer. The oracle accepts only dtype F32 (ADR 0017). Every
violation raises ValueError whose message names the tensor (or the header field) at fault.
"""

import json
import os
import stat
import struct

import numpy as np

MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_FILE_BYTES = 4 * 1024 * 1024 * 1024


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"header: duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse(blob: bytes):
    """Returns (tensors: dict name -> float32 ndarray, metadata: dict str -> str)."""
    size = len(blob)
    if size < 8:
        raise ValueError(f"header length: file has {size} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > size - 8:
        raise ValueError(f"header length: {n} exceeds the {size - 8} bytes after it")
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"header length: {n} exceeds the limit of {MAX_HEADER_BYTES}")
    try:
        text = blob[8 : 8 + n].decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise ValueError(f"header: not UTF-8 ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"header: not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header: not a JSON object")
    data = memoryview(blob)[8 + n :]
    data_len = len(data)

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__: not a map of strings")

    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise ValueError(f"tensor {name!r}: entry is not an object")
        extra = set(entry) - {"dtype", "shape", "data_offsets"}
        if extra:
            raise ValueError(f"tensor {name!r}: unknown field {sorted(extra)[0]!r}")
        dtype = entry.get("dtype")
        if dtype != "F32":
            raise ValueError(f"tensor {name!r}: dtype {dtype!r}, only F32 is accepted")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        offsets = entry.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
        ):
            raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if begin < 0 or end < begin:
            raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] out of order")
        if end > data_len:
            raise ValueError(f"tensor {name!r}: data_offsets end {end} beyond the {data_len}-byte data buffer")
        count = 1
        for d in shape:
            count *= d
        if count * 4 != end - begin:
            raise ValueError(
                f"tensor {name!r}: shape {shape} needs {count * 4} bytes, data_offsets span {end - begin}"
            )
        spans.append((begin, end, name, shape))

    # The buffer is covered exactly: no overlap, no hole, nothing after the last tensor.
    spans.sort()
    cursor = 0
    for begin, end, name, _ in spans:
        if begin < cursor:
            raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] overlap the previous tensor")
        if begin > cursor:
            raise ValueError(f"tensor {name!r}: {begin - cursor} unindexed bytes before it")
        cursor = end
    if cursor != data_len:
        raise ValueError(f"data: {data_len - cursor} bytes after the last tensor")

    tensors = {}
    for begin, end, name, shape in spans:
        arr = np.frombuffer(data[begin:end], dtype="<f4").astype(np.float32).reshape(shape)
        tensors[name] = arr
    return tensors, metadata


def load(path: str):
    """Reads a regular file of at most MAX_FILE_BYTES and parses it (see parse)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"weights: cannot read {path!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"weights: {path!r} is not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise ValueError(f"weights: {path!r} is larger than {MAX_FILE_BYTES} bytes")
    with open(path, "rb") as f:
        blob = f.read(MAX_FILE_BYTES + 1)
    return parse(blob)


def serialize(tensors, metadata=None) -> bytes:
    """The safetensors bytes of float32 arrays, in the given order (used by tests)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    chunks = []
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)
