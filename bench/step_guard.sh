#!/usr/bin/env bash
# The decode-step guard: builds a baseline commit and the working tree (release preset, target
# store_bench), runs the scheduler trace interleaved A, B, A, B ... and prints, per counter, the
# ratio baseline / working tree of every pair (above 1: the working tree is faster) as the median
# with its min and max. Absolute times on a shared machine are noise; the pairwise ratios of one
# interleaved run are the figure.
#
#   bench/step_guard.sh [BASE_REV] [PAIRS]          (defaults: origin/main or main, 12 pairs)
#
# Environment:
#   STEP_GUARD_FILTER       benchmark regex for both sides (default: the 1,024-request trace,
#                           named BM_SchedulerTrace before issue 26 and BM_SchedulerTrace/1024 after;
#                           its seals are deferred from ADR 0049 on, immediate before)
#   STEP_GUARD_BASE_FILTER  the baseline's regex where the variant has another name there (default:
#                           STEP_GUARD_FILTER), e.g. the working tree's BM_SchedulerTraceImmediateSeals
#                           against a baseline before ADR 0049, where BM_SchedulerTrace sealed at once
#   STEP_GUARD_COUNTERS     counters to compare (default: step_median_us step_p99_us step_max_us
#                           seal_step_mean_us)
#   STEP_GUARD_BASE_BUILD   reuse this directory for the baseline build (kept; default: a temp dir
#                           removed on exit)
#   STEP_GUARD_JOBS         build parallelism (default 2)
set -euo pipefail

base_rev=${1:-}
pairs=${2:-12}
filter=${STEP_GUARD_FILTER:-'^BM_SchedulerTrace(/1024)?/iterations'}
base_filter=${STEP_GUARD_BASE_FILTER:-$filter}
counters=${STEP_GUARD_COUNTERS:-"step_median_us step_p99_us step_max_us seal_step_mean_us"}
jobs=${STEP_GUARD_JOBS:-2}

repo=$(git rev-parse --show-toplevel)
cd "$repo"
if [[ -z "$base_rev" ]]; then
  if git rev-parse -q --verify origin/main >/dev/null; then base_rev=origin/main; else base_rev=main; fi
fi
base_sha=$(git rev-parse --verify "$base_rev^{commit}")

tmp=$(mktemp -d)
base_dir=${STEP_GUARD_BASE_BUILD:-"$tmp/base"}
cleanup() {
  if [[ -z "${STEP_GUARD_BASE_BUILD:-}" ]]; then git worktree remove --force "$base_dir" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

if [[ ! -e "$base_dir/.git" ]]; then
  git worktree add --detach "$base_dir" "$base_sha" >/dev/null
else
  git -C "$base_dir" checkout -q --detach "$base_sha"
fi

build() {  # $1: source dir
  (cd "$1" && cmake --preset release >/dev/null && cmake --build build/release -j"$jobs" --target store_bench >/dev/null)
}
echo "building baseline $base_sha ..." >&2
build "$base_dir"
echo "building the working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +changes)) ..." >&2
build "$repo"
a_bin="$base_dir/build/release/bench/store_bench"
b_bin="$repo/build/release/bench/store_bench"

echo "load before: $(uptime)"
for ((i = 0; i < pairs; i++)); do
  "$a_bin" --benchmark_filter="$base_filter" --benchmark_format=json >"$tmp/a$i.json" 2>/dev/null
  "$b_bin" --benchmark_filter="$filter" --benchmark_format=json >"$tmp/b$i.json" 2>/dev/null
done
echo "load after: $(uptime)"

python3 - "$tmp" "$pairs" "$base_sha" $counters <<'EOF'
import json, statistics, sys
tmp, pairs, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counters = sys.argv[4:]
def load(path):
    benches = json.load(open(path))["benchmarks"]
    if len(benches) != 1:
        sys.exit(f"{path}: the filter matched {len(benches)} benchmarks, want 1")
    if benches[0].get("error_occurred"):
        sys.exit(f"{path}: {benches[0].get('error_message')}")
    return benches[0]
print(f"baseline {base[:12]} (A) vs working tree (B), {pairs} interleaved pairs; ratio = A / B (> 1: B faster)")
print(f"{'counter':<22}{'A median':>12}{'B median':>12}{'ratio median':>14}{'min':>8}{'max':>8}")
for c in counters:
    a = [load(f"{tmp}/a{i}.json")[c] for i in range(pairs)]
    b = [load(f"{tmp}/b{i}.json")[c] for i in range(pairs)]
    r = [x / y for x, y in zip(a, b)]
    print(f"{c:<22}{statistics.median(a):>12.3f}{statistics.median(b):>12.3f}"
          f"{statistics.median(r):>14.3f}{min(r):>8.3f}{max(r):>8.3f}")
EOF
