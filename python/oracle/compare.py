"""Recomputes a `tessera generate --dump` run with the oracle and compares logits step by step.

Usage: /usr/bin/python3 -m oracle.compare --dump DUMP.json [--weights FILE] [--kv-format F] [--quiet]
       [--flip-entry-byte LAYER,ENTRY,BYTE | --flip-indexer-byte LAYER,ENTRY,BYTE]   (tiny-v4)

Teacher-forced: the dumped tokens are fed in order, and the oracle's logits at each dumped
position (prompt_len - 1 onwards) are compared with the dumped ones. Per step it prints the max
absolute error and the max error relative to the logits' scale, max|a - b| / max(1, max|b|) with b
the oracle's logits; ADR 0017 bounds the latter by 5e-3 for every page format (3x the largest
drift measured between two correct evaluations, oracle.precision_probe).
--kv-format recomputes with other pages than the dump's (e.g. a bf16 dump against fp8_ds_mla pages:
fp8's own error, which the ADR reports but does not bound).
tiny-v4 (ADR 0018): the dump may carry "indexer_format" (default indexer-mxfp4) and "selected" (per
fed position, per layer, the CSA layers' attended entries); with "selected" the oracle attends over
those entries after checking each is admissible (its oracle score within SELECTION_MARGIN of the
oracle's k-th score, relative to the step's largest |score|), which makes the logit comparison
independent of top-k flips between two correct evaluations (docs/ORACLE.md). --flip-entry-byte /
--flip-indexer-byte corrupt one byte of the oracle's own compressed (or indexer) entry right after
the step that writes it: an unperturbed dump must then fail.
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
from . import v4

TOLERANCE = 5e-3  # ADR 0017 "Tolerances": 3x precision_probe's worst (1.6e-3, tiny-dsa bf16)
MAX_DUMP_BYTES = 512 * 1024 * 1024
ATTENTIONS = ("absorbed", "naive")
MODELS = tuple(om.CONFIGS) + (v4.MODEL,)
# A dumped CSA selection is admissible when each entry's oracle score is at least the oracle's k-th
# score minus this fraction of the step's largest |score|: 3x the worst gap precision_probe measured
# between float32 and float64 evaluations of tiny-v4 (6.192e-02, indexer-mxfp4, prompt 1..40;
# docs/ORACLE.md), rounded up.
SELECTION_MARGIN = 0.19


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


def _config(model):
    return v4.CONFIG if model == v4.MODEL else om.CONFIGS[model]


def validate_dump(d):
    """Checks every field the comparison uses; returns (model, kv_format, prompt_len, tokens, logits)."""
    model = d.get("model")
    if model not in MODELS:
        raise InputError(f"model: {model!r} (the oracle knows {', '.join(MODELS)})")
    cfg = _config(model)
    formats = v4.KV_FORMATS if model == v4.MODEL else om.KV_FORMATS
    kv_format = d.get("kv_format")
    if kv_format not in formats:
        raise InputError(f"kv_format: {kv_format!r} ({model} pages: {', '.join(formats)})")
    if model == v4.MODEL:
        # tiny-v4 has one attention form; a dump may still name the CLI's default.
        if "attention" in d and not isinstance(d["attention"], str):
            raise InputError(f"attention: {d['attention']!r} is not a string")
        if d.get("indexer_format", v4.INDEXER_FORMATS[0]) not in v4.INDEXER_FORMATS:
            raise InputError(f"indexer_format: {d['indexer_format']!r} (expected one of {', '.join(v4.INDEXER_FORMATS)})")
    elif "attention" in d and d["attention"] not in ATTENTIONS:
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
    if "selected" in d:
        if model == v4.MODEL:
            validate_selected(d["selected"], prompt_len - 1 + len(rows))
        elif om.CONFIGS[model]["indexer"]:
            validate_selected_dsa(d["selected"], prompt_len - 1 + len(rows), om.CONFIGS[model])
        else:
            raise InputError(f"selected: only models with an indexer carry it, not {model}")
    return model, kv_format, prompt_len, tokens, rows


def validate_selected(sel, fed):
    """"selected": one item per fed position 0..fed-1, each a list of one item per layer: for a CSA
    layer min(index_topk, n_c) distinct ascending entry ids below n_c = floor((p + 1) / 4); for any
    other layer null or []."""
    cfg = v4.CONFIG
    if not isinstance(sel, list) or len(sel) != fed:
        raise InputError(f"selected: not a list of {fed} items (one per fed position)")
    for p, per_layer in enumerate(sel):
        if not isinstance(per_layer, list) or len(per_layer) != cfg["layers"]:
            raise InputError(f"selected[{p}]: not a list of {cfg['layers']} items (one per layer)")
        for l, ids in enumerate(per_layer):
            where = f"selected[{p}][{l}]"
            if cfg["ratios"][l] != 4:
                if ids not in (None, []):
                    raise InputError(f"{where}: layer {l} is not a CSA layer; expected null or []")
                continue
            n_c = (p + 1) // 4
            want = min(cfg["topk"], n_c)
            if not isinstance(ids, list) or len(ids) != want:
                raise InputError(f"{where}: not a list of {want} entry ids")
            for e in ids:
                if not _is_int(e) or not 0 <= e < n_c:
                    raise InputError(f"{where}: {e!r} is not an entry id below {n_c}")
            if any(a >= b for a, b in zip(ids, ids[1:])):
                raise InputError(f"{where}: ids not strictly ascending")


def validate_selected_dsa(sel, fed, cfg):
    """tiny-dsa: one item per fed position p in 0..fed-1, each a list of one item per layer: the
    min(index_topk, p + 1) distinct ascending positions <= p the layer attended."""
    if not isinstance(sel, list) or len(sel) != fed:
        raise InputError(f"selected: not a list of {fed} items (one per fed position)")
    topk = cfg["indexer"]["topk"]
    for p, per_layer in enumerate(sel):
        if not isinstance(per_layer, list) or len(per_layer) != cfg["layers"]:
            raise InputError(f"selected[{p}]: not a list of {cfg['layers']} items (one per layer)")
        for l, ids in enumerate(per_layer):
            where = f"selected[{p}][{l}]"
            want = min(topk, p + 1)
            if not isinstance(ids, list) or len(ids) != want:
                raise InputError(f"{where}: not a list of {want} positions")
            for e in ids:
                if not _is_int(e) or not 0 <= e <= p:
                    raise InputError(f"{where}: {e!r} is not a position <= {p}")
            if any(a >= b for a, b in zip(ids, ids[1:])):
                raise InputError(f"{where}: positions not strictly ascending")


def selection_gaps(oracle):
    """Per CSA selection: the worst (k-th score - score of a dumped entry) / max|score|, 0 when all
    dumped entries score at least the oracle's k-th. Returns [(position, layer, gap)]."""
    out = []
    for l, pos, score in oracle.scores:
        ids = oracle.selected[pos][l]
        topk = oracle.cfg["topk"] if "topk" in oracle.cfg else oracle.cfg["indexer"]["topk"]
        k = min(topk, len(score))
        kth = float(torch.sort(score.double(), descending=True).values[k - 1])
        scale = max(float(score.abs().max()), 1e-30)
        gap = max(0.0, max((kth - float(score[e])) / scale for e in ids))
        out.append((pos, l, gap))
    return out


def resolve_weights(path, dump_path):
    if os.path.isabs(path) or os.path.exists(path):
        return path
    beside = os.path.join(os.path.dirname(os.path.abspath(dump_path)), path)
    return beside if os.path.exists(beside) else path


def compare(dump_path, weights=None, out=sys.stdout, kv_format=None, flip=None):
    """Returns (ok, per-step list of (position, max_abs, max_rel)). Raises InputError on bad input.
    flip: (kind, layer, entry, byte), kind "entry" or "indexer" (tiny-v4 only)."""
    d = read_dump(dump_path)
    model, dumped_format, prompt_len, tokens, rows = validate_dump(d)
    formats = v4.KV_FORMATS if model == v4.MODEL else om.KV_FORMATS
    if kv_format is None:
        kv_format = dumped_format
    elif kv_format not in formats:
        raise InputError(f"--kv-format: {kv_format!r} ({model} pages: {', '.join(formats)})")
    if flip is not None and model != v4.MODEL:
        raise InputError(f"--flip-{flip[0]}-byte: only for tiny-v4 dumps, not {model}")
    wpath = weights or resolve_weights(d["weights"], dump_path)
    try:
        tensors, metadata = safetensors_io.load(wpath)
        if model == v4.MODEL:
            oracle = v4.V4Oracle(tensors, metadata, kv_format, d.get("indexer_format", v4.INDEXER_FORMATS[0]))
        else:
            oracle = om.Oracle(model, kv_format, tensors, metadata)
    except ValueError as e:
        raise InputError(f"weights: {e}") from None
    if flip is not None:
        try:
            oracle.set_flip(*flip)
        except ValueError as e:
            raise InputError(f"--flip-{flip[0]}-byte: {e}") from None
    if "selected" in d:
        oracle.forced = d["selected"]
    ours = om.teacher_forced(oracle, tokens, prompt_len, len(rows))
    steps = []
    ok = True
    agree = 0
    if model == v4.MODEL or om.CONFIGS[model]["indexer"]:
        gaps = selection_gaps(oracle)
        worst = max(gaps, key=lambda g: g[2], default=(0, 0, 0.0))
        if "selected" in d:
            admissible = worst[2] <= SELECTION_MARGIN
            ok = ok and admissible
            print(f"selected: {len(gaps)} dumped top-k selections attended; worst gap below the oracle's k-th score "
                  f"{worst[2]:.3e} of max|score| (position {worst[0]}, layer {worst[1]}), margin {SELECTION_MARGIN:g}: "
                  f"{'ok' if admissible else 'FAIL'}", file=out)
        else:
            print("selected: not in the dump; the oracle attends its own top-k (a top-k flip between two "
                  "correct evaluations can exceed the bound, docs/ORACLE.md)", file=out)
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
    ap.add_argument("--flip-entry-byte", metavar="LAYER,ENTRY,BYTE",
                    help="tiny-v4: XOR 0x01 into that byte of the oracle's compressed entry once written")
    ap.add_argument("--flip-indexer-byte", metavar="LAYER,ENTRY,BYTE",
                    help="tiny-v4: XOR 0x01 into that byte of the oracle's indexer entry once written")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    flip = None
    for kind, text in (("entry", args.flip_entry_byte), ("indexer", args.flip_indexer_byte)):
        if text is None:
            continue
        parts = text.split(",")
        if flip is not None or len(parts) != 3 or not all(p.isdigit() and len(p) <= 9 for p in parts):
            print(f"oracle.compare: --flip-{kind}-byte: {text!r} is not LAYER,ENTRY,BYTE (one flip at most)",
                  file=sys.stderr)
            return 2
        flip = (kind, *(int(p) for p in parts))
    torch.set_num_threads(1)  # deterministic summation order from run to run
    sink = open(os.devnull, "w") if args.quiet else sys.stdout
    try:
        ok, steps = compare(args.dump, args.weights, out=sink, kv_format=args.kv_format, flip=flip)
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
