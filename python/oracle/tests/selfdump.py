"""Test tooling: a dump in `tessera generate --dump`'s shape, produced by the oracle itself.

/usr/bin/python3 -m oracle.tests.selfdump --model tiny-mla --kv-format fp8_ds_mla --steps 64
    --seed 7 --out DIR [--flip-page-byte L,P,B]
writes DIR/<model>.safetensors (the ADR generator of weightgen) and DIR/dump.json (greedy decoding
of prompt 1,2,3; with --flip-page-byte, that page byte XORed with 0x01 after prefill, as tessera's
option does). Comparing such a dump with oracle.compare shows what the comparison detects without
the tessera binary.

tiny-v4 (ADR 0018): --model tiny-v4 --kv-format v4-fp8 [--indexer-format F] [--prompt 1,2,3]
[--selected] [--flip-entry-byte L,E,B]: --selected adds the run's CSA selections to the dump (the
field oracle.compare follows); the flip XORs 0x01 into that byte of compressed entry E of layer L
right after the step that writes it.
"""

import argparse
import json
import os
import sys

import torch

from oracle import model as om
from oracle import safetensors_io
from oracle import v4
from oracle.tests import weightgen


def v4_dump(wpath, tensors, meta, kv_format, indexer_format, prompt, steps, selected, flip):
    o = v4.V4Oracle(tensors, meta, kv_format, indexer_format)
    if flip:
        o.set_flip("entry", *flip)
    tokens, logits = v4.greedy(o, prompt, steps)
    dump = {"model": v4.MODEL, "kv_format": kv_format, "indexer_format": indexer_format, "weights": wpath,
            "prompt_len": len(prompt), "tokens": tokens, "logits": [l.tolist() for l in logits]}
    if selected:
        dump["selected"] = o.selected
    return dump


def main(argv=None):
    ap = argparse.ArgumentParser(prog="oracle.tests.selfdump")
    ap.add_argument("--model", required=True, choices=sorted(om.CONFIGS) + [v4.MODEL])
    ap.add_argument("--kv-format", required=True, choices=om.KV_FORMATS + v4.KV_FORMATS)
    ap.add_argument("--indexer-format", default=v4.INDEXER_FORMATS[0], choices=v4.INDEXER_FORMATS)
    ap.add_argument("--prompt", default="1,2,3")
    ap.add_argument("--selected", action="store_true")
    ap.add_argument("--flip-entry-byte")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--flip-page-byte")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps: at least 1")
    if (a.model == v4.MODEL) != (a.kv_format in v4.KV_FORMATS):
        ap.error(f"--kv-format: {a.kv_format} is not a {a.model} format")
    flip = None
    for opt, text in (("--flip-page-byte", a.flip_page_byte), ("--flip-entry-byte", a.flip_entry_byte)):
        if not text:
            continue
        if (opt == "--flip-entry-byte") != (a.model == v4.MODEL):
            ap.error(f"{opt}: not for {a.model}")
        try:
            flip = tuple(int(v) for v in text.split(","))
            if len(flip) != 3:
                raise ValueError
        except ValueError:
            ap.error(f"{opt}: expected three comma-separated integers")
    try:
        prompt = [int(v) for v in a.prompt.split(",")]
    except ValueError:
        ap.error("--prompt: expected comma-separated token ids")
    torch.set_num_threads(1)  # the same summation order on every run
    os.makedirs(a.out, exist_ok=True)
    wpath = os.path.join(a.out, f"{a.model}.safetensors")
    tensors, meta = weightgen.generate(a.model, a.seed)
    with open(wpath, "wb") as f:
        f.write(safetensors_io.serialize(tensors, meta))
    if a.model == v4.MODEL:
        dump = v4_dump(wpath, tensors, meta, a.kv_format, a.indexer_format, prompt, a.steps, a.selected, flip)
    else:
        o = om.Oracle(a.model, a.kv_format, tensors, meta)
        tokens, logits = om.greedy(o, prompt, a.steps, flip=flip)
        dump = {"model": a.model, "kv_format": a.kv_format, "attention": "naive", "weights": wpath,
                "prompt_len": len(prompt), "tokens": tokens, "logits": [l.tolist() for l in logits]}
    with open(os.path.join(a.out, "dump.json"), "w") as f:
        json.dump(dump, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
