"""pip install . (offline, --no-build-isolation, Debian's setuptools) gives an importable
package, installed into a --target directory (Debian 12's pip refuses the system Python itself,
PEP 668; docs/PYTHON.md shows the virtual-environment form). The extension module is taken from
this build directory (TESSERA_CMAKE_BUILD_DIR), so the test does not rebuild the project."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CHECK = r"""
import sys, numpy as np, tessera
assert tessera.__file__.startswith(sys.argv[1]), tessera.__file__
d = tessera.ledger("deepseek-v3", context=4096)
assert d["requested_bytes"] == 4096 * 61 * 1152, d["requested_bytes"]
m = tessera.RequestManager("tiny-mla", capacity_blocks=8, max_requests=2, backed=False)
a = m.admit(np.arange(1, 100, dtype=np.uint32))
r = m.step(np.array([a.request_id], np.uint32), np.array([99], np.uint32), np.arange(99, dtype=np.uint32))
assert r.failed == 0 and m.tokens(a.request_id) == 99
print("ok", tessera.__file__)
"""


class PipInstallTest(unittest.TestCase):
    def setUp(self):
        self.src = os.environ.get("TESSERA_SOURCE_DIR")
        self.build = os.environ.get("TESSERA_BUILD_DIR")
        if not self.src or not self.build:
            self.skipTest("TESSERA_SOURCE_DIR / TESSERA_BUILD_DIR are not set (run through ctest)")
        self.tmp = tempfile.mkdtemp(prefix="tessera-pip-")
        self.env = dict(os.environ, TESSERA_CMAKE_BUILD_DIR=self.build,
                        TESSERA_SETUP_BUILD_BASE=os.path.join(self.tmp, "setup"), PIP_NO_CACHE_DIR="1")
        self.env.pop("PYTHONPATH", None)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pip(self, python, *args):
        cmd = [python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
               "--disable-pip-version-check", *args, self.src]
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])

    def check(self, python, where, env):
        out = subprocess.run([python, "-c", CHECK, where], env=env, cwd=self.tmp, capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(out.stdout.startswith("ok"), out.stdout)

    def test_target_directory(self):
        site = os.path.join(self.tmp, "site")
        self.pip(sys.executable, "--target", site)
        self.assertTrue(os.path.isdir(os.path.join(site, "tessera")))
        self.assertFalse(os.path.exists(os.path.join(site, "oracle")))  # a separate package
        self.check(sys.executable, site, dict(self.env, PYTHONPATH=site))
        # The vLLM plugin, found and loaded as vLLM's loader finds and loads general plugins
        # (vllm/plugins/__init__.py at 9aaf83ef: importlib.metadata entry points of the group
        # vllm.general_plugins, each .load()ed and called): opt-in, so a no-op here.
        find = ("import importlib.metadata as md\n"
                "eps = [e for e in md.entry_points(group='vllm.general_plugins') if e.value.startswith('tessera.')]\n"
                "print('ok' if len(eps) == 1 and eps[0].load()() is False else 'found %r' % (eps,))\n")
        env = dict(self.env, PYTHONPATH=site)
        env.pop("TESSERA_VLLM_KV_CACHE_MANAGER", None)
        out = subprocess.run([sys.executable, "-c", find], env=env, cwd=self.tmp, capture_output=True, text=True,
                             timeout=120)
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "ok"), out.stderr)


if __name__ == "__main__":
    unittest.main()
