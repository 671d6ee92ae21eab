"""How far a second, equally correct evaluation of the ADR 0017 forward drifts from the oracle's.

/usr/bin/python3 -m oracle.precision_probe --model tiny-mla --kv-format mla-bf16 --steps 64 [--seed 7]
/usr/bin/python3 -m oracle.precision_probe --model tiny-v4 --kv-format v4-fp8 --steps 400
    [--indexer-format indexer-fp8] [--forced]

Runs the oracle greedily in float32 on weights from the ADR generator (tests/weightgen), then
teacher-forced in float64 on the same tokens, and prints the per-run max of ADR 0017's relative
logit error, the number of steps beyond its bound (compare.TOLERANCE), how many cached records differ in at
least one byte, and (tiny-dsa) how many (step, layer) top-k selections differ. The two runs differ
only in rounding order (float64 is the more accurate), so whatever exceeds the bound here can
exceed it between any two correct implementations: a last-bit difference in a latent moves its
bf16/e4m3 rounding to the neighbouring value, and the cache turns ~1e-7 into a quantum.
tiny-v4: --forced makes the float64 run attend the float32 run's CSA selections (what a dump's
"selected" does in oracle.compare); it also prints the worst gap of those selections below the
float64 run's own k-th indexer score (compare.SELECTION_MARGIN's basis).
"""

import argparse
import sys

import torch

from . import model as om
from . import v4
from .compare import TOLERANCE


def probe_v4(kv_format, steps, seed=7, indexer_format="indexer-mxfp4", forced=False, prompt=(1, 2, 3)):
    from .compare import selection_gaps
    from .tests import weightgen

    t, m = weightgen.generate(v4.MODEL, seed)
    a = v4.V4Oracle(t, m, kv_format, indexer_format)
    tokens, la = v4.greedy(a, list(prompt), steps)
    b = v4.V4Oracle(t, m, kv_format, indexer_format, dtype=torch.float64)
    if forced:
        b.forced = a.selected
    lb = om.teacher_forced(b, tokens, len(prompt), steps)
    rels = [((x.double() - y).abs().max() / max(1.0, y.abs().max().item())).item() for x, y in zip(la, lb)]
    recs = [(ra, rb) for la_, lb_ in zip(a.layers, b.layers)
            for ra, rb in zip(la_.window + la_.entries + la_.ientries, lb_.window + lb_.entries + lb_.ientries)]
    sel = [(x, y) for sa, sb in zip(a.selected, b.selected) for x, y in zip(sa, sb) if x is not None]
    return dict(max_rel=max(rels), over=sum(r > TOLERANCE for r in rels), steps=steps, records=len(recs),
                records_differ=sum(bytes(x) != bytes(y) for x, y in recs),
                selections=len(sel), selections_differ=sum(x != y for x, y in sel),
                worst_gap=max((g[2] for g in selection_gaps(b)), default=0.0))


def probe(model, kv_format, steps, seed=7):
    from .tests import weightgen

    t, m = weightgen.generate(model, seed)
    a = om.Oracle(model, kv_format, t, m)
    tokens, la = om.greedy(a, [1, 2, 3], steps)
    b = om.Oracle(model, kv_format, t, m, dtype=torch.float64)
    lb = om.teacher_forced(b, tokens, 3, steps)
    rels = [((x.double() - y).abs().max() / max(1.0, y.abs().max().item())).item() for x, y in zip(la, lb)]
    records = sum(len(r) for r in a.cache.records)
    differ = sum(ra != rb for l in range(len(a.cache.records))
                 for ra, rb in zip(a.cache.records[l], b.cache.records[l]))
    sel = sum(x != y for sa, sb in zip(a.selected, b.selected) for x, y in zip(sa, sb))
    return dict(max_rel=max(rels), over=sum(r > TOLERANCE for r in rels), steps=steps,
                records=records, records_differ=differ, selections_differ=sel)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="oracle.precision_probe")
    ap.add_argument("--model", required=True, choices=sorted(om.CONFIGS) + [v4.MODEL])
    ap.add_argument("--kv-format", required=True, choices=om.KV_FORMATS + v4.KV_FORMATS)
    ap.add_argument("--indexer-format", default=v4.INDEXER_FORMATS[0], choices=v4.INDEXER_FORMATS)
    ap.add_argument("--forced", action="store_true", help="tiny-v4: float64 attends float32's selections")
    ap.add_argument("--prompt", default="1,2,3", help="tiny-v4: comma-separated prompt token ids")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps: at least 1")
    if (a.model == v4.MODEL) != (a.kv_format in v4.KV_FORMATS):
        ap.error(f"--kv-format: {a.kv_format} is not a {a.model} format")
    torch.set_num_threads(1)
    if a.model == v4.MODEL:
        try:
            prompt = [int(v) for v in a.prompt.split(",")]
        except ValueError:
            ap.error("--prompt: expected comma-separated token ids")
        if not prompt or not all(0 <= v < v4.CONFIG["vocab"] for v in prompt):
            ap.error(f"--prompt: token ids below {v4.CONFIG['vocab']}")
        r = probe_v4(a.kv_format, a.steps, a.seed, a.indexer_format, a.forced, prompt)
        print(f"{a.model} {a.kv_format} {a.indexer_format} seed {a.seed} prompt {len(prompt)} tokens"
              f"{' forced selections' if a.forced else ''}: "
              f"float32 vs float64 over {r['steps']} steps: max_rel {r['max_rel']:.3e}, {r['over']} steps beyond "
              f"{TOLERANCE:g}; records differing {r['records_differ']}/{r['records']}; CSA selections differing "
              f"{r['selections_differ']}/{r['selections']}; worst selection gap {r['worst_gap']:.3e}")
        return 0
    r = probe(a.model, a.kv_format, a.steps, a.seed)
    print(f"{a.model} {a.kv_format} seed {a.seed}: float32 vs float64 over {r['steps']} steps: "
          f"max_rel {r['max_rel']:.3e}, {r['over']} steps beyond {TOLERANCE:g}; "
          f"records differing {r['records_differ']}/{r['records']}; "
          f"top-k selections differing {r['selections_differ']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
