"""oracle.compare on dumps the oracle wrote itself: passes, fails on a perturbed page byte or logit,
refuses bad input with exit 2 and one line naming the field."""

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from oracle import compare
from oracle import model as om
from oracle import v4
from oracle import safetensors_io
from oracle.tests import selfdump
from oracle.tests import weightgen

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_weights(d, model, seed=7):
    path = os.path.join(d, f"{model}.safetensors")
    if not os.path.exists(path):
        t, m = weightgen.generate(model, seed)
        with open(path, "wb") as f:
            f.write(safetensors_io.serialize(t, m))
    return path


def write_dump(d, name, model, fmt, steps, flip=None, weights=None, **override):
    """Greedy run of the oracle itself (flip: a page byte XORed after prefill), as a dump file."""
    wpath = weights or write_weights(d, model)
    t, m = safetensors_io.load(wpath)
    o = om.Oracle(model, fmt, t, m)
    prompt = [1, 2, 3]
    tokens, logits = om.greedy(o, prompt, steps, flip=flip)
    dump = {"model": model, "kv_format": fmt, "attention": "naive", "weights": wpath,
            "prompt_len": len(prompt), "tokens": tokens, "logits": [l.tolist() for l in logits]}
    dump.update(override)
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump(dump, f)
    return path


def run(*argv):
    """(exit status, stdout, stderr) of oracle.compare.main in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = compare.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


class CompareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.d = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_own_dump_passes(self):
        for model, fmt, steps in (("tiny-mla", "mla-bf16", 6), ("tiny-mla", "fp8_ds_mla", 6),
                                  ("tiny-dsa", "fp8_ds_mla", 66)):
            p = write_dump(self.d, f"own-{model}-{fmt}.json", model, fmt, steps)
            rc, out, err = run("--dump", p)
            self.assertEqual(rc, 0, out + err)
            self.assertIn(f"max over {steps} steps", out)
            self.assertIn("PASS", out)
            self.assertIn(f"argmax agrees {steps}/{steps}", out)

    def test_flipped_page_byte_fails(self):
        # What `tessera generate --flip-page-byte L,P,B` does, done here to the oracle's own pages:
        # the byte chosen for each format must make the comparison fail (test_end_to_end uses them).
        for fmt in om.KV_FORMATS:
            layer, pos, byte = FLIP[fmt]
            p = write_dump(self.d, f"flip-{fmt}.json", "tiny-mla", fmt, 16, flip=(layer, pos, byte))
            rc, out, err = run("--dump", p)
            self.assertEqual(rc, 1, out + err)
            self.assertIn("FAIL", out)
            # the prefill's logits (position 2) were computed before the flip
            self.assertRegex(out, r"step    0 position      2 .* ok")

    def test_bound_admits_another_correct_evaluation(self):
        # ADR 0017 "Tolerances": float32 vs float64 of the same forward through fp8 pages drifts past
        # the first bound (1e-4) but stays within TOLERANCE; the flipped bytes above are far beyond.
        from oracle import precision_probe
        r = precision_probe.probe("tiny-mla", "fp8_ds_mla", 8)
        self.assertGreater(r["max_rel"], 1e-4)
        self.assertEqual(r["over"], 0, r)
        self.assertLessEqual(r["max_rel"], compare.TOLERANCE / 3, r)

    def test_perturbed_logit_fails(self):
        p = write_dump(self.d, "good.json", "tiny-mla", "mla-bf16", 4)
        with open(p) as f:
            dump = json.load(f)
        bound = compare.TOLERANCE * max(1.0, max(abs(v) for v in dump["logits"][2]))
        dump["logits"][2][17] += 2 * bound
        bad = os.path.join(self.d, "bad-logit.json")
        with open(bad, "w") as f:
            json.dump(dump, f)
        rc, out, _ = run("--dump", bad)
        self.assertEqual(rc, 1)
        self.assertRegex(out, r"step    2 .* FAIL")
        dump["logits"][2][17] -= 1.5 * bound  # 0.5 x bound: within
        with open(bad, "w") as f:
            json.dump(dump, f)
        self.assertEqual(run("--dump", bad)[0], 0)

    def test_bad_input(self):
        good = write_dump(self.d, "good2.json", "tiny-mla", "mla-bf16", 3)
        with open(good) as f:
            base = json.load(f)
        wrong_dtype = os.path.join(self.d, "f16.safetensors")
        with open(write_weights(self.d, "tiny-mla"), "rb") as f:
            blob = bytearray(f.read())
        blob = blob.replace(b'"dtype":"F32"', b'"dtype":"F16"', 1)
        with open(wrong_dtype, "wb") as f:
            f.write(blob)
        cases = [
            ({"model": "tiny-v5"}, "model"),
            ({"kv_format": "mla-fp16"}, "kv_format"),
            ({"kv_format": "v4-fp8"}, "kv_format"),
            ({"selected": []}, "selected"),
            ({"attention": "flash"}, "attention"),
            ({"weights": 3}, "weights"),
            ({"weights": os.path.join(self.d, "missing")}, "weights"),
            ({"weights": wrong_dtype}, "dtype"),
            ({"weights": write_weights(self.d, "tiny-dsa")}, "__metadata__.model"),
            ({"tokens": [1, 2, 256, 4, 5]}, "tokens[2]"),
            ({"tokens": [1, 2, True, 4, 5]}, "tokens[2]"),
            ({"prompt_len": 0}, "prompt_len"),
            ({"prompt_len": 99}, "prompt_len"),
            ({"logits": []}, "logits"),
            ({"logits": [[0.0] * 255]}, "logits[0]"),
            ({"logits": base["logits"] + [base["logits"][0]] * 3}, "logits"),
            ({"logits": [base["logits"][0][:-1] + ["x"]]}, "logits[0][255]"),
        ]
        for i, (change, field) in enumerate(cases):
            dump = dict(base, **change)
            p = os.path.join(self.d, f"bad{i}.json")
            with open(p, "w") as f:
                json.dump(dump, f)
            rc, out, err = run("--dump", p)
            self.assertEqual(rc, 2, f"{change}: {out} {err}")
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(field, err)
        with open(os.path.join(self.d, "nan.json"), "w") as f:
            f.write(json.dumps(base).replace(str(base["logits"][0][0]), "NaN", 1))
        rc, _, err = run("--dump", os.path.join(self.d, "nan.json"))
        self.assertEqual(rc, 2)
        self.assertIn("logits[0][0]", err)
        for blob in (b"[1, 2]", b"{", b"\xff"):
            with open(os.path.join(self.d, "junk.json"), "wb") as f:
                f.write(blob)
            self.assertEqual(run("--dump", os.path.join(self.d, "junk.json"))[0], 2)
        self.assertEqual(run("--dump", self.d)[0], 2)  # a directory
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(run()[0], 2)  # --dump missing

    def test_other_pages(self):
        # A bf16 dump recomputed on fp8 pages: fp8's own error is far beyond the bound.
        p = write_dump(self.d, "pages.json", "tiny-mla", "mla-bf16", 4)
        rc, out, _ = run("--dump", p, "--kv-format", "fp8_ds_mla")
        self.assertEqual(rc, 1)
        self.assertIn("kv_format mla-bf16 (oracle: fp8_ds_mla)", out)
        rc, _, err = run("--dump", p, "--kv-format", "fp4")
        self.assertEqual(rc, 2)
        self.assertIn("--kv-format", err)

    def test_selfdump_tool(self):
        out = os.path.join(self.d, "selfdump")
        self.assertEqual(selfdump.main(["--model", "tiny-mla", "--kv-format", "fp8_ds_mla", "--steps", "3",
                                        "--out", out]), 0)
        self.assertEqual(run("--dump", os.path.join(out, "dump.json"))[0], 0)
        self.assertEqual(selfdump.main(["--model", "tiny-mla", "--kv-format", "fp8_ds_mla", "--steps", "3",
                                        "--out", out, "--flip-page-byte", "0,1,515"]), 0)
        self.assertEqual(run("--dump", os.path.join(out, "dump.json"))[0], 1)

    def test_command_line(self):
        p = write_dump(self.d, "cli.json", "tiny-mla", "mla-bf16", 2)
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run([sys.executable, "-m", "oracle.compare", "--dump", p, "--quiet"],
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^max_rel \S+ over 2 steps: PASS\n$")
        r = subprocess.run([sys.executable, "-m", "oracle.compare", "--dump", p + ".missing"],
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--dump", r.stderr)


class CompareV4Test(unittest.TestCase):
    """tiny-v4 dumps made by the oracle itself (oracle.tests.selfdump's v4_dump)."""

    STEPS = 130  # positions 2..131: the HCA layer's first entry (position 127) is read from 127 on

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.d = cls.tmp.name
        cls.weights = write_weights(cls.d, v4.MODEL)
        t, m = safetensors_io.load(cls.weights)
        cls.dump = selfdump.v4_dump(cls.weights, t, m, "v4-fp8", "indexer-mxfp4", [1, 2, 3], cls.STEPS, True, None)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, **change):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            json.dump(dict(self.dump, **change), f)
        return path

    def test_own_dump_passes_with_and_without_selected(self):
        without = {k: v for k, v in self.dump.items() if k != "selected"}
        path = os.path.join(self.d, "plain.json")
        with open(path, "w") as f:
            json.dump(without, f)
        for p, note in ((self.write("sel.json"), "worst gap below the oracle's k-th score 0.000e+00"),
                        (path, "not in the dump")):
            rc, out, err = run("--dump", p)
            self.assertEqual(rc, 0, out + err)
            self.assertIn(note, out)
            self.assertIn(f"argmax agrees {self.STEPS}/{self.STEPS}", out)

    def test_flipped_entry_byte_fails(self):
        # The oracle corrupts its own record; the (clean) dump must then disagree. An indexer key
        # only moves the selection, which a dump's "selected" overrides (within the margin): that
        # flip is checked against the dump without it (docs/ORACLE.md).
        p = self.write("flip.json")
        plain = os.path.join(self.d, "flip-plain.json")
        with open(plain, "w") as f:
            json.dump({k: v for k, v in self.dump.items() if k != "selected"}, f)
        for path, opt, target in ((p, "--flip-entry-byte", V4_FLIP), (plain, "--flip-entry-byte", V4_FLIP),
                                  (plain, "--flip-indexer-byte", "1,0,64")):
            rc, out, err = run("--dump", path, opt, target)
            self.assertEqual(rc, 1, f"{opt} {target}: {out} {err}")
            self.assertRegex(out, r"step    0 position      2 .* ok")  # before any entry exists
        for bad in ("0,0,1", "2,0,584", "2,0", "x,0,1"):
            rc, _, err = run("--dump", p, "--flip-entry-byte", bad)
            self.assertEqual(rc, 2, bad)
            self.assertIn("--flip-entry-byte", err)
        rc, _, err = run("--dump", p, "--flip-indexer-byte", "2,0,1")  # HCA has no indexer
        self.assertEqual(rc, 2)

    def test_inadmissible_selection_fails(self):
        # Position 100, layer 1: swap the dumped selection for the 8 lowest-scoring entries.
        t, m = safetensors_io.load(self.weights)
        o = v4.V4Oracle(t, m)
        for tok in self.dump["tokens"][:101]:
            o.step(tok)
        score = next(s for l, pos, s in o.scores if l == 1 and pos == 100)
        worst = sorted(int(e) for e in np.argsort(score.numpy(), kind="stable")[:8])
        sel = copy.deepcopy(self.dump["selected"])
        self.assertNotEqual(sel[100][1], worst)
        sel[100][1] = worst
        rc, out, err = run("--dump", self.write("inadmissible.json", selected=sel))
        self.assertEqual(rc, 1, out + err)
        self.assertIn("(position 100, layer 1)", out)

    def test_bad_v4_input(self):
        sel = self.dump["selected"]
        cases = [
            ({"kv_format": "fp8_ds_mla"}, "kv_format"),
            ({"indexer_format": "indexer-fp4"}, "indexer_format"),
            ({"attention": 1}, "attention"),
            ({"selected": sel[:-1]}, "selected"),
            ({"selected": [sel[0]] + sel[1:9] + [[None, [0], None, [0]]] + sel[10:]}, "selected[9][1]"),
            ({"selected": sel[:20] + [[None, [0, 0, 1, 2], None, sel[20][3]]] + sel[21:]}, "selected[20][1]"),
            ({"selected": sel[:20] + [[None, sel[20][1], [0], sel[20][3]]] + sel[21:]}, "selected[20][2]"),
            ({"selected": sel[:20] + [[None, [0, 1, 2, 5], None, sel[20][3]]] + sel[21:]}, "selected[20][1]"),
            ({"selected": sel[:20] + [[None, [0, 1, 2, True], None, sel[20][3]]] + sel[21:]}, "selected[20][1]"),
            ({"tokens": [1, 2, 300] + self.dump["tokens"][3:]}, "tokens[2]"),
            ({"weights": write_weights(self.d, "tiny-mla")}, "__metadata__.model"),
        ]
        for i, (change, field) in enumerate(cases):
            rc, out, err = run("--dump", self.write(f"bad-v4-{i}.json", **change))
            self.assertEqual(rc, 2, f"{field}: {out} {err}")
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(field, err)
        p = write_dump(self.d, "mla.json", "tiny-mla", "mla-bf16", 2)
        rc, _, err = run("--dump", p, "--flip-entry-byte", "2,0,576")
        self.assertEqual(rc, 2)
        self.assertIn("only for tiny-v4", err)


class EndToEndHarnessTest(unittest.TestCase):
    """test_end_to_end's tiny-v4 tests run against oracle.tests.standin (the oracle in float64, a
    second correct implementation) in place of tessera: they pass when its dump carries "selected"
    and fail without it (top-k flips, docs/ORACLE.md "tiny-v4"). Checks the harness before the C++
    side exists, and the reason the dump needs the field."""

    def run_e2e(self, d, **env):
        binary = os.path.join(d, "tessera")
        with open(binary, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} -m oracle.tests.standin \"$@\"\n")
        os.chmod(binary, 0o755)
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONDONTWRITEBYTECODE="1", TESSERA_BINARY=binary,
                   STANDIN_FLOAT64="1", **env)
        return subprocess.run([sys.executable, "-m", "unittest", "oracle.tests.test_end_to_end.EndToEndV4Test"],
                              capture_output=True, text=True, env=env, cwd=PYTHON_DIR, timeout=900)

    def test_second_implementation_passes_only_with_selected(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_e2e(d, STANDIN_SELECTED="1")
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("Ran 3 tests", r.stderr)
            self.assertNotIn("skipped", r.stderr)
            r = self.run_e2e(d)
            self.assertNotEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn('the dump has no \"selected\"', r.stderr)
            # The 400-step indexer-mxfp4 dump fails (a top-k flip); the 140-step indexer-fp8 one may
            # happen to have no flip; the weights and the corrupted entry pass.
            self.assertIn("indexer_format='indexer-mxfp4'", r.stderr)
            self.assertRegex(r.stderr, r"failures=[12]\)")


# tiny-v4's perturbation: layer 2 (HCA), entry 0 (written at position 127, read by every later
# token), byte 576 = the scale row's first ue8m0 code, bit 0 its exponent's LSB (64 values x2 or /2).
V4_FLIP = "2,0,576"

# The page byte each format's perturbation test flips (layer, position, byte):
#   mla-bf16: byte 1 is the high byte of c[0] (little-endian bf16), its bit 0 the exponent's bit 1
#             (c[0] multiplied or divided by 4);
#   fp8_ds_mla: byte 515 is the high byte of tile 0's fp32 scale, its bit 0 the exponent's bit 1
#             (128 latent values multiplied or divided by 4).
FLIP = {"mla-bf16": (0, 1, 1), "fp8_ds_mla": (0, 1, 515)}


if __name__ == "__main__":
    unittest.main()
