"""How far a second, equally correct evaluation of the ADR 0017 forward drifts from the oracle's.

/usr/bin/python3 -m oracle.precision_probe --model tiny-mla --kv-format mla-bf16 --steps 64 [--seed 7]

Runs the oracle greedily in float32 on weights from the ADR generator (tests/weightgen), then
teacher-forced in float64 on the same tokens, and prints the per-run max of ADR 0017's relative
logit error, the number of steps beyond its bound (compare.TOLERANCE), how many cached records differ in at
least one byte, and (tiny-dsa) how many (step, layer) top-k selections differ. The two runs differ
only in rounding order (float64 is the more accurate), so whatever exceeds the bound here can
exceed it between any two correct implementations: a last-bit difference in a latent moves its
bf16/e4m3 rounding to the neighbouring value, and the cache turns ~1e-7 into a quantum.
"""

import argparse
import sys

import torch

from . import model as om
from .compare import TOLERANCE


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
    ap.add_argument("--model", required=True, choices=sorted(om.CONFIGS))
    ap.add_argument("--kv-format", required=True, choices=om.KV_FORMATS)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps: at least 1")
    torch.set_num_threads(1)
    r = probe(a.model, a.kv_format, a.steps, a.seed)
    print(f"{a.model} {a.kv_format} seed {a.seed}: float32 vs float64 over {r['steps']} steps: "
          f"max_rel {r['max_rel']:.3e}, {r['over']} steps beyond {TOLERANCE:g}; "
          f"records differing {r['records_differ']}/{r['records']}; "
          f"top-k selections differing {r['selections_differ']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
