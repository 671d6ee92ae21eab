"""tessera.ledger: the same document as `tessera ledger --format json`, figure for figure."""

import json
import subprocess
import unittest

import tessera

from support import cli


class LedgerTest(unittest.TestCase):
    def cli_json(self, *args):
        path = cli()
        self.assertIsNotNone(path, "TESSERA_CLI must name the tessera binary (ctest sets it)")
        out = subprocess.run([path, "ledger", "--format", "json", *args], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    def test_equals_cli_for_presets_and_engines(self):
        cases = [
            (dict(model="deepseek-v3", context="128k"), ["--model", "deepseek-v3", "--context", "128k"]),
            (dict(model="deepseek-v3", context=131072, kv_format="fp8_ds_mla", engine="vllm", tp=8),
             ["--model", "deepseek-v3", "--context", "131072", "--kv-format", "fp8_ds_mla", "--engine", "vllm",
              "--tp", "8"]),
            (dict(model="deepseek-v4-pro", context="1m", engine="sglang"),
             ["--model", "deepseek-v4-pro", "--context", "1m", "--engine", "sglang"]),
            (dict(model="deepseek-v4-flash", context=65536, swa_strategy="snapshot", batch=4, spec_tokens=2),
             ["--model", "deepseek-v4-flash", "--context", "65536", "--swa-strategy", "snapshot", "--batch", "4",
              "--spec-tokens", "2"]),
            (dict(model="deepseek-v3.2", context=32768, include_mtp=True, block_tokens=128),
             ["--model", "deepseek-v3.2", "--context", "32768", "--include-mtp", "--block-tokens", "128"]),
        ]
        for kwargs, args in cases:
            with self.subTest(kwargs=kwargs):
                got = tessera.ledger(**kwargs)
                want = self.cli_json(*args)
                self.assertEqual(got, want)
                # The per-term figures, named: they add up to the committed bytes.
                terms = got["committed_terms"]
                self.assertGreater(len(terms), 0)
                self.assertGreater(got["committed_bytes"], 0)

    def test_known_figure(self):
        # DeepSeek-V3, 128K tokens, bf16 latents (576 elements = 1,152 B per token per layer over
        # 61 layers): 131072 x 61 x 1152 requested bytes (docs/adr/0004-ledger-terms.md).
        d = tessera.ledger("deepseek-v3", context="128k")
        self.assertEqual(d["requested_bytes"], 131072 * 61 * 1152)

    def test_config_file(self):
        import os
        src = os.environ.get("TESSERA_SOURCE_DIR")
        if not src:
            self.skipTest("TESSERA_SOURCE_DIR is not set (run through ctest)")
        path = os.path.join(src, "data", "models", "deepseek-v3.json")
        self.assertTrue(os.path.exists(path), path)
        got = tessera.ledger(config=path, context=4096)
        self.assertEqual(got["requested_bytes"], tessera.ledger("deepseek-v3", context=4096)["requested_bytes"])

    def test_models(self):
        names = tessera.models()
        self.assertIn("deepseek-v3", names)
        self.assertIn("deepseek-v4-pro", names)

    def test_bad_input_names_the_argument(self):
        cases = [
            (dict(model="no-such-model", context=1), ValueError, "model"),
            (dict(context=1), ValueError, "model"),
            (dict(model="deepseek-v3"), ValueError, "context"),
            (dict(model="deepseek-v3", context=-1), ValueError, "context"),
            (dict(model="deepseek-v3", context=1.5), TypeError, "context"),
            (dict(model="deepseek-v3", context="12q"), ValueError, "context"),
            (dict(model="deepseek-v3", context=1, tp=0), ValueError, "tp"),
            (dict(model="deepseek-v3", context=1, tp=10**30), ValueError, "tp"),
            (dict(model="deepseek-v3", context=1, kv_format="nope"), ValueError, "kv_format"),
            (dict(model="deepseek-v3", context=1, kv_format=3), TypeError, "kv_format"),
            (dict(model="deepseek-v3", context=1, engine="tgi"), ValueError, "engine"),
            (dict(model="deepseek-v3", context=1, include_mtp="yes"), TypeError, "include_mtp"),
            (dict(model="deepseek-v3", context=1, batch=True), TypeError, "batch"),
            (dict(model="deepseek-v3", context=1, prefill_chunk=0), ValueError, "prefill_chunk"),
            (dict(model="deepseek-v3", config="/nonexistent/config.json", context=1), ValueError, "model"),
            (dict(config="/nonexistent/config.json", context=1), Exception, "config"),
            (dict(model="deepseek-v3", context=2**62, batch=2**62), ValueError, None),
        ]
        for kwargs, exc, name in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(exc) as cm:
                    tessera.ledger(**kwargs)
                if name is not None:
                    self.assertTrue(str(cm.exception).startswith(name), str(cm.exception))


if __name__ == "__main__":
    unittest.main()
