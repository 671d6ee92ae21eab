"""Recomputes a `tessera generate --dump` run with the oracle and compares logits step by step.

Usage: /usr/bin/python3 -m oracle.compare --dump DUMP.json [--weights FILE] [--kv-format F] [--quiet]

Teacher-forced: the dumped tokens are fed in order, and the oracle's logits at each dumped
position (prompt_len - 1 onwards) are compared with the dumped ones. Per step it prints the max
absolute error and the max error relative to the logits' scale, max|a - b| / max(1, max|b|) with b
the oracle's logits; ADR 0017 bounds the latter by 5e-3 for every page format (3x the largest
drift measured between two correct evaluations, oracle.precision_probe).
--kv-format recomputes with other pages than the dump's (e.g. a bf16 dump against fp8_ds_mla pages:
fp8's own error, which the ADR reports but does not bound).
Exit status: 0 every step within the bound, 1 some step beyond it, 2 bad input (one line on
stderr naming the field).
"""

import argparse
import json
import math
import os
import stat
import sys

import numpy as np
import torch

from . import model as om
from . import safetensors_io

TOLERANCE = 5e-3  # ADR 0017 "Tolerances": 3x precision_probe's worst (1.6e-3, tiny-dsa bf16)
MAX_DUMP_BYTES = 512 * 1024 * 1024
ATTENTIONS = ("absorbed", "naive")


class InputError(ValueError):
    pass


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def read_dump(path):
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"--dump: cannot read {path!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"--dump: {path!r} is not a regular file")
    if st.st_size > MAX_DUMP_BYTES:
        raise InputError(f"--dump: {path!r} is larger than {MAX_DUMP_BYTES} bytes")
    with open(path, "rb") as f:
        blob = f.read(MAX_DUMP_BYTES + 1)
    try:
        d = json.loads(blob.decode("utf-8"), parse_constant=lambda c: float("nan"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"--dump: not UTF-8 JSON ({e})") from None
    if not isinstance(d, dict):
        raise InputError("--dump: not a JSON object")
    return d


def validate_dump(d):
    """Checks every field the comparison uses; returns (model, kv_format, prompt_len, tokens, logits)."""
    model = d.get("model")
    if model not in om.CONFIGS:
        raise InputError(f"model: {model!r} (the oracle knows {', '.join(om.CONFIGS)})")
    cfg = om.CONFIGS[model]
    kv_format = d.get("kv_format")
    if kv_format not in om.KV_FORMATS:
        raise InputError(f"kv_format: {kv_format!r} (the oracle knows {', '.join(om.KV_FORMATS)})")
    if "attention" in d and d["attention"] not in ATTENTIONS:
        raise InputError(f"attention: {d['attention']!r} (expected one of {', '.join(ATTENTIONS)})")
    if not isinstance(d.get("weights"), str) or not d["weights"]:
        raise InputError("weights: missing or not a non-empty string")
    tokens = d.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise InputError("tokens: missing or not a non-empty list")
    for i, t in enumerate(tokens):
        if not _is_int(t) or not 0 <= t < cfg["vocab"]:
            raise InputError(f"tokens[{i}]: {t!r} is not a token id below {cfg['vocab']}")
    if len(tokens) > cfg["max_pos"]:
        raise InputError(f"tokens: {len(tokens)} exceed max_position_embeddings {cfg['max_pos']}")
    prompt_len = d.get("prompt_len")
    if not _is_int(prompt_len) or not 1 <= prompt_len <= len(tokens):
        raise InputError(f"prompt_len: {prompt_len!r} is not in 1..{len(tokens)} (the number of tokens)")
    logits = d.get("logits")
    if not isinstance(logits, list) or not logits:
        raise InputError("logits: missing or not a non-empty list")
    # The logits at position q were computed after feeding tokens[q], so q must be a fed position.
    if prompt_len - 1 + len(logits) > len(tokens):
        raise InputError(
            f"logits: {len(logits)} rows from position {prompt_len - 1} run past the {len(tokens)} tokens fed"
        )
    rows = []
    for i, row in enumerate(logits):
        if not isinstance(row, list) or len(row) != cfg["vocab"]:
            raise InputError(f"logits[{i}]: not a list of {cfg['vocab']} numbers")
        for j, v in enumerate(row):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(f"logits[{i}][{j}]: {v!r} is not a finite number")
        rows.append(np.array(row, dtype=np.float64))
    return model, kv_format, prompt_len, tokens, rows


def resolve_weights(path, dump_path):
    if os.path.isabs(path) or os.path.exists(path):
        return path
    beside = os.path.join(os.path.dirname(os.path.abspath(dump_path)), path)
    return beside if os.path.exists(beside) else path


def compare(dump_path, weights=None, out=sys.stdout, kv_format=None):
    """Returns (ok, per-step list of (position, max_abs, max_rel)). Raises InputError on bad input."""
    d = read_dump(dump_path)
    model, dumped_format, prompt_len, tokens, rows = validate_dump(d)
    if kv_format is None:
        kv_format = dumped_format
    elif kv_format not in om.KV_FORMATS:
        raise InputError(f"--kv-format: {kv_format!r} (the oracle knows {', '.join(om.KV_FORMATS)})")
    wpath = weights or resolve_weights(d["weights"], dump_path)
    try:
        tensors, metadata = safetensors_io.load(wpath)
        oracle = om.Oracle(model, kv_format, tensors, metadata)
    except ValueError as e:
        raise InputError(f"weights: {e}") from None
    ours = om.teacher_forced(oracle, tokens, prompt_len, len(rows))
    steps = []
    ok = True
    agree = 0
    print(
        f"model {model}  kv_format {dumped_format}"
        f"{'' if kv_format == dumped_format else f' (oracle: {kv_format})'}  attention {d.get('attention', '?')}  "
        f"prompt_len {prompt_len}  steps {len(rows)}  bound max|a-b| <= {TOLERANCE:g} * max(1, max|oracle|)",
        file=out,
    )
    for i, (theirs, mine) in enumerate(zip(rows, ours)):
        mine = mine.to(torch.float64).numpy()
        pos = prompt_len - 1 + i
        max_abs = float(np.max(np.abs(theirs - mine)))
        max_rel = max_abs / max(1.0, float(np.max(np.abs(mine))))
        within = max_rel <= TOLERANCE
        ok = ok and within
        if int(np.argmax(mine)) == int(np.argmax(theirs)):
            agree += 1
        steps.append((pos, max_abs, max_rel))
        print(f"step {i:4d} position {pos:6d}  max_abs {max_abs:.3e}  max_rel {max_rel:.3e}  "
              f"{'ok' if within else 'FAIL'}", file=out)
    worst_abs = max(s[1] for s in steps)
    worst_rel = max(s[2] for s in steps)
    print(f"max over {len(steps)} steps: max_abs {worst_abs:.3e}  max_rel {worst_rel:.3e}  "
          f"argmax agrees {agree}/{len(steps)}  {'PASS' if ok else 'FAIL'}", file=out)
    return ok, steps


def main(argv=None):
    ap = argparse.ArgumentParser(prog="oracle.compare", description=__doc__.split("\n")[0])
    ap.add_argument("--dump", required=True, help="JSON written by tessera generate --dump")
    ap.add_argument("--weights", help="weight file (default: the dump's \"weights\")")
    ap.add_argument("--kv-format", help="the oracle's pages (default: the dump's kv_format)")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    torch.set_num_threads(1)  # deterministic summation order from run to run
    sink = open(os.devnull, "w") if args.quiet else sys.stdout
    try:
        ok, steps = compare(args.dump, args.weights, out=sink, kv_format=args.kv_format)
    except InputError as e:
        print(f"oracle.compare: {e}", file=sys.stderr)
        return 2
    finally:
        if args.quiet:
            sink.close()
    if args.quiet:
        worst = max(s[2] for s in steps)
        print(f"max_rel {worst:.3e} over {len(steps)} steps: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
