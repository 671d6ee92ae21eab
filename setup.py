"""pip install . — the Python package `tessera` (python/tessera) with its extension module
tessera._core, built by the project's CMake (target tessera_python; docs/PYTHON.md).

Offline, with Debian's setuptools:  python3 -m pip install --no-build-isolation --no-index .
Environment:
  TESSERA_CMAKE_BUILD_DIR   an existing, configured build directory to build the target in and
                            take the module from (e.g. build/dev); default: a fresh Release build
                            under the setuptools build directory.
  TESSERA_SETUP_BUILD_BASE  where setuptools builds (default build/setuptools).
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = os.environ.get("TESSERA_SETUP_BUILD_BASE", os.path.join(ROOT, "build", "setuptools"))
os.makedirs(BUILD_BASE, exist_ok=True)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("TESSERA_CMAKE_BUILD_DIR")
        if not build_dir:
            build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
            configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                         "-DTESSERA_BUILD_TESTS=OFF", "-DTESSERA_BUILD_BENCH=OFF", "-DTESSERA_BUILD_PYTHON=ON",
                         "-DTESSERA_PYTHON=" + sys.executable]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", build_dir, "--target", "tessera_python", "-j", jobs], check=True)
        built = os.path.join(build_dir, "python", "tessera", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(built):
            raise RuntimeError("the CMake build produced no %s (is pybind11-dev and python3-dev installed, and "
                               "TESSERA_BUILD_PYTHON on in %s?)" % (built, build_dir))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(
    name="tessera",
    version="0.1.0",
    description="KV-cache ledger and request manager for MLA models",
    package_dir={"": "python"},
    packages=find_packages("python", include=["tessera", "tessera.*"]),  # not python/oracle
    ext_modules=[Extension("tessera._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    # numpy is needed at run time (Debian: python3-numpy). It is not declared, so that an offline
    # --target install does not try to fetch a second copy of it.
    install_requires=[],
    # vLLM's plugin loader runs every vllm.general_plugins entry point in each of its processes;
    # this one swaps vLLM's scheduler's KV-cache manager for Tessera's only when
    # TESSERA_VLLM_KV_CACHE_MANAGER=1 (docs/ENGINES.md).
    entry_points={"vllm.general_plugins": ["tessera_kv_cache_manager = tessera.vllm_plugin:register"]},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
