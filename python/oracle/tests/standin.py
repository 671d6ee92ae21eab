"""Test tooling: a stand-in for `tessera generate` made of the oracle itself, so the end-to-end
tests' own code runs before the C++ side has tiny-v4.

/usr/bin/python3 -m oracle.tests.standin generate --model M --prompt-tokens 1,2,3 --steps N
    --kv-format F [--indexer-format F] [--attention A] --weights FILE [--init-weights --seed S]
    [--dump FILE] [--flip-page-byte L,P,B]

Environment: STANDIN_FLOAT64=1 evaluates tiny-v4 in float64 (a second correct implementation
whose roundings all differ from the oracle's float32 ones); STANDIN_SELECTED=1 adds the tiny-v4
run's CSA selections to the dump ("selected", docs/ORACLE.md).
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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["generate"]:
        print("standin: only `generate`", file=sys.stderr)
        return 2
    if "--help" in argv:
        print("--prompt-tokens (stand-in)")
        return 0
    ap = argparse.ArgumentParser(prog="standin generate")
    for opt in ("--model", "--prompt-tokens", "--steps", "--kv-format", "--indexer-format", "--attention",
                "--weights", "--seed", "--dump", "--flip-page-byte"):
        ap.add_argument(opt)
    ap.add_argument("--init-weights", action="store_true")
    a = ap.parse_args(argv[1:])
    torch.set_num_threads(1)
    if a.init_weights:
        t, m = weightgen.generate(a.model, int(a.seed))
        with open(a.weights, "wb") as f:
            f.write(safetensors_io.serialize(t, m))
    t, m = safetensors_io.load(a.weights)
    prompt = [int(v) for v in a.prompt_tokens.split(",")]
    if a.model == v4.MODEL:
        ifmt = a.indexer_format or v4.INDEXER_FORMATS[0]
        dtype = torch.float64 if os.environ.get("STANDIN_FLOAT64") else torch.float32
        o = v4.V4Oracle(t, m, a.kv_format, ifmt, dtype=dtype)
        tokens, logits = v4.greedy(o, prompt, int(a.steps))
        dump = {"model": a.model, "kv_format": a.kv_format, "indexer_format": ifmt}
        if os.environ.get("STANDIN_SELECTED"):
            dump["selected"] = o.selected
    else:
        o = om.Oracle(a.model, a.kv_format, t, m)
        flip = tuple(int(v) for v in a.flip_page_byte.split(",")) if a.flip_page_byte else None
        tokens, logits = om.greedy(o, prompt, int(a.steps), flip=flip)
        dump = {"model": a.model, "kv_format": a.kv_format, "attention": a.attention or "absorbed"}
    dump.update({"weights": a.weights, "prompt_len": len(prompt), "tokens": tokens,
                 "logits": [l.float().tolist() for l in logits]})
    if a.dump:
        with open(a.dump, "w") as f:
            json.dump(dump, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
