#!/usr/bin/env bash
# The CUDA path on a GPU (ADR 0025), in one run of about five minutes: builds the CUDA target and
# its tests and benchmark (Release), runs the host-side tests, runs the device tests (the paged
# MLA decode against the CPU reference attention within ADR 0017's tolerances, tiny models and
# DeepSeek-V3 / V3.2 shapes with random records; promotion and demotion through the host tier),
# then measures decode bandwidth against a device-to-device copy and promotion throughput against
# a plain cudaMemcpyAsync, both baselines measured in the same run (bench/cuda_bench.cc).
#
# Writes into OUT_DIR: gpu.txt, the logs, cuda_device_test.json, cuda_bench.json, and
# device-check.md (the tables for docs/PERFORMANCE.md, with each target met or not).
# Exit status: non-zero when the build fails, when any device test fails or is skipped (no device:
# nothing was checked), or when the benchmark cannot run. Missing a bandwidth target is reported
# in device-check.md, not an error.
#
# Usage: scripts/device-check.sh [OUT_DIR]   (default: $OUT when set, else build/device-check)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-build/device-check}}
mkdir -p "$out"
build=${TESSERA_DEVICE_BUILD:-build/device}
jobs=$(nproc)
start=$(date +%s)
stamp() { echo "=== [$(($(date +%s) - start)) s] $*"; }

stamp "device"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv | tee "$out/gpu.txt"
else
  echo "nvidia-smi not found" | tee "$out/gpu.txt"
fi
git rev-parse HEAD 2>/dev/null >"$out/commit.txt" || echo unknown >"$out/commit.txt"

stamp "configure and build (Release: kernels, tests, benchmark)"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_WITH_CUDA=ON "${launcher[@]}" \
  >"$out/configure.log" 2>&1 || { tail -n 40 "$out/configure.log"; exit 1; }
if ! grep -q 'cuda_device_test' "$build/build.ninja"; then
  echo "nvcc was not found: the CUDA target is not configured" >&2
  exit 1
fi
cmake --build "$build" -j "$jobs" --target cuda_plan_test cuda_device_test cuda_bench >"$out/build.log" 2>&1 ||
  { tail -n 60 "$out/build.log"; exit 1; }

stamp "host-side tests"
"$build/tests/cuda_plan_test" --gtest_brief=1 2>&1 | tee "$out/cuda_plan_test.log"

stamp "device tests (parity with the CPU reference; transfers)"
status=0
"$build/tests/cuda_device_test" --gtest_output="json:$out/cuda_device_test.json" 2>&1 |
  tee "$out/cuda_device_test.log" || status=$?
# The no-device test skips when a device is present; any other skip means nothing ran on a GPU.
skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$out/cuda_device_test.log" | grep -v 'ReportsNoDeviceCleanly' |
  grep -c -v 'listed below' || true)
if [ "$status" -ne 0 ]; then echo "device tests FAILED" >&2; fi
if [ "$skipped" -ne 0 ]; then
  echo "device tests skipped ($skipped): no usable CUDA device" >&2
  status=1
fi

stamp "benchmarks (decode vs HBM copy; promotion vs plain copy)"
"$build/bench/cuda_bench" --benchmark_out="$out/cuda_bench.json" --benchmark_out_format=json 2>&1 |
  tee "$out/cuda_bench.log" || status=1

stamp "summary"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" - "$out" <<'PY' || status=1
import json, re, sys
out = sys.argv[1]
bench = json.load(open(f"{out}/cuda_bench.json"))
ctx = bench["context"]
lines = ["## CUDA device check (scripts/device-check.sh)", "",
         f"GPU: {open(f'{out}/gpu.txt').read().strip()}", f"commit: {open(f'{out}/commit.txt').read().strip()}",
         f"host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, run {ctx.get('date', '?')}", "",
         "### Parity (max |gpu - cpu| per request, bound = tol x max(1, max |cpu|), ADR 0017)", ""]
for line in open(f"{out}/cuda_device_test.log"):
    if "max |gpu - cpu|" in line:
        lines.append("- " + line.strip())
tests = json.load(open(f"{out}/cuda_device_test.json"))
lines += ["", f"device tests: {tests['tests']} run, {tests['failures']} failed, {tests.get('disabled', 0)} disabled", ""]
errors = [b for b in bench["benchmarks"] if b.get("error_occurred")]
lines += ["### Decode bandwidth (page bytes read / kernel time) vs device-to-device copy (target >= 0.70)", "",
          "| benchmark | decode GB/s | HBM copy GB/s | ratio | splits | target |", "|---|---|---|---|---|---|"]
for b in bench["benchmarks"]:
    if b["name"].startswith("BM_Decode") and not b.get("error_occurred"):
        r = b["hbm_ratio"]
        lines.append(f"| {b['name']} | {b['decode_GBps']:.1f} | {b['hbm_copy_GBps']:.1f} | {r:.3f} | "
                     f"{int(b['splits'])} | {'met' if r >= 0.70 else 'NOT met'} |")
lines += ["", "### Promotion (host -> device pages) vs one plain cudaMemcpyAsync of the same bytes (target >= 0.80)", "",
          "| benchmark | promote GB/s | plain copy GB/s | ratio | target |", "|---|---|---|---|---|"]
for b in bench["benchmarks"]:
    if b["name"].startswith("BM_Promote") and not b.get("error_occurred"):
        r = b["copy_ratio"]
        lines.append(f"| {b['name']} | {b['promote_GBps']:.2f} | {b['plain_copy_GBps']:.2f} | {r:.3f} | "
                     f"{'met' if r >= 0.80 else 'NOT met'} |")
for b in errors:
    lines.append(f"- {b['name']}: ERROR {b.get('error_message', '')}")
open(f"{out}/device-check.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if errors else 0)
PY
stamp "done (exit ${status}); results in ${out}/device-check.md"
exit "$status"
