"""Test tooling: a dump in `tessera generate --dump`'s shape, produced by the oracle itself.

/usr/bin/python3 -m oracle.tests.selfdump --model tiny-mla --kv-format fp8_ds_mla --steps 64
    --seed 7 --out DIR [--flip-page-byte L,P,B]
writes DIR/<model>.safetensors (the ADR generator of weightgen) and DIR/dump.json (greedy decoding
of prompt 1,2,3; with --flip-page-byte, that page byte XORed with 0x01 after prefill, as tessera's
option does). Comparing such a dump with oracle.compare shows what the comparison detects without
the tessera binary.
"""

import argparse
import json
import os
import sys

import torch

from oracle import model as om
from oracle import safetensors_io
from oracle.tests import weightgen


def main(argv=None):
    ap = argparse.ArgumentParser(prog="oracle.tests.selfdump")
    ap.add_argument("--model", required=True, choices=sorted(om.CONFIGS))
    ap.add_argument("--kv-format", required=True, choices=om.KV_FORMATS)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--flip-page-byte")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps: at least 1")
    flip = None
    if a.flip_page_byte:
        try:
            flip = tuple(int(v) for v in a.flip_page_byte.split(","))
            if len(flip) != 3:
                raise ValueError
        except ValueError:
            ap.error("--flip-page-byte: expected LAYER,POSITION,BYTE")
    torch.set_num_threads(1)  # the same summation order on every run
    os.makedirs(a.out, exist_ok=True)
    wpath = os.path.join(a.out, f"{a.model}.safetensors")
    tensors, meta = weightgen.generate(a.model, a.seed)
    with open(wpath, "wb") as f:
        f.write(safetensors_io.serialize(tensors, meta))
    o = om.Oracle(a.model, a.kv_format, tensors, meta)
    prompt = [1, 2, 3]
    tokens, logits = om.greedy(o, prompt, a.steps, flip=flip)
    dump = {"model": a.model, "kv_format": a.kv_format, "attention": "naive", "weights": wpath,
            "prompt_len": len(prompt), "tokens": tokens, "logits": [l.tolist() for l in logits]}
    with open(os.path.join(a.out, "dump.json"), "w") as f:
        json.dump(dump, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
