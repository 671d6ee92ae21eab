"""Test-only: ADR 0017's seeded weight generator, written from the ADR text.

The ADR makes the C++ side the only generator; this copy lets the oracle's tests run without the
tessera binary, and test_end_to_end checks that a file tessera wrote equals it.

Reading of the ADR used here (where its text leaves room, the choice is stated):
  - one SplitMix64 stream for the whole file, state = seed; each draw adds 0x9E3779B97F4A7C15 to
    the state and returns the usual mix of it; u = draw >> 40 (24 bits);
  - tensors are drawn "in the order above": embed, then every layer's twelve tensors (layer by
    layer, each followed for tiny-dsa by that layer's five indexer tensors), then norm, head;
  - value = (u + 0.5) / 2^24 * 2 - 1, times 1/sqrt(in) for 2-D tensors (in = columns, the hidden
    size for the embedding); 1 + 0.1 value for norm weights, 0.1 value for the k_norm bias;
    computed in double, rounded once to float32.
tiny-v4 (ADR 0018): its own list order (layer by layer, compressor and indexer tensors inside the
layer, then norm, head); ape 0.1 u, attn_sink u, the rest as above.
"""

import numpy as np

from oracle import model as om
from oracle import v4

GAMMA = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)


def draws(seed: int, start: int, n: int) -> np.ndarray:
    """Draws start .. start+n-1 (0-based) of the SplitMix64 stream seeded with `seed`, as uint64."""
    i = np.arange(start + 1, start + n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * GAMMA
        z = (z ^ (z >> np.uint64(30))) * M1
        z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def tensor_order(model: str):
    if model == v4.MODEL:
        return v4.weight_specs()  # ADR 0018: indexer and compressor tensors inside each layer
    shapes = om.expected_shapes(om.CONFIGS[model])
    # ADR 0017: embed; each layer's twelve tensors, then (tiny-dsa) its five indexer tensors;
    # norm; head. expected_shapes lists them in that order.
    return [(n, shapes[n]) for n in shapes]


def generate(model: str, seed: int):
    """(tensors in file order, metadata) for `model` and `seed`."""
    tensors = {}
    cursor = 0
    for name, shape in tensor_order(model):
        n = int(np.prod(shape))
        u = (draws(seed, cursor, n) >> np.uint64(40)).astype(np.float64)
        cursor += n
        val = (u + 0.5) / 2.0**24 * 2.0 - 1.0
        if name.endswith(".ape"):  # ADR 0018: 0.1 u (2-D but not a linear weight)
            val = 0.1 * val
        elif name.endswith(".attn_sink"):  # ADR 0018: u
            pass
        elif len(shape) == 2:
            val = val * (1.0 / np.sqrt(float(shape[1])))
        elif name.endswith("k_norm.bias"):
            val = 0.1 * val
        else:
            val = 1.0 + 0.1 * val
        tensors[name] = val.astype(np.float32).reshape(shape)
    metadata = {"model": model, "seed": str(seed), "format": om.WEIGHT_FORMAT}
    return tensors, metadata
