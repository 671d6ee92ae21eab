#!/usr/bin/env bash
# Builds and runs every test: the lint (clang-format on every source, clang-tidy on the sources
# changed by the last commit), the dev build, the library under clang's thread-safety analysis
# (build only: the check is the compile), the tiers configured without Redis, bounded libFuzzer
# runs of the segment parser and of the config.json reader (clang), then the whole suite under
# ASan+UBSan and under TSan, and the release preset built in full at -O3 (tests and benches
# included; build only — its tests are the dev suite's, and GCC's -O3 warnings are the check).
# Usage: scripts/test-all.sh [preset...]   (default: lint dev clang noredis fuzz asan tsan release)
#        TESSERA_FUZZ_SECONDS=N sets the fuzzing time per target (default 15).
set -euo pipefail
cd "$(dirname "$0")/.."

presets=("$@")
if [ "${#presets[@]}" -eq 0 ]; then presets=(lint dev clang noredis fuzz asan tsan release); fi
jobs=$(nproc)

# Each phase's wall time, printed as it ends and summed at the end (CI stops at 90 minutes: the
# figures say where a run's time went).
started=$SECONDS
phase_start=$SECONDS
phase_name=
phase() {
  if [ -n "$phase_name" ]; then echo "=== ${phase_name}: $((SECONDS - phase_start)) s"; fi
  phase_name=$1
  phase_start=$SECONDS
}
trap 'phase ""; echo "=== test-all: $((SECONDS - started)) s"' EXIT

for p in "${presets[@]}"; do
  phase "$p"
  if [ "$p" = lint ]; then
    echo "=== lint"
    scripts/lint.sh
    continue
  fi
  echo "=== preset ${p}: configure and build"
  cmake --preset "$p" >/dev/null
  if [ "$p" = fuzz ]; then
    cmake --build "build/$p" -j "$jobs" --target segment_fuzz config_fuzz
    # Each target runs for TESSERA_FUZZ_SECONDS on a scratch copy of its seed corpus.
    for target in segment_fuzz config_fuzz; do
      seeds=fuzz/corpus
      extra=()
      if [ "$target" = config_fuzz ]; then seeds=fuzz/config_corpus; extra=(-dict=fuzz/config.dict -timeout=10); fi
      corpus=$(mktemp -d)
      cp "$seeds"/* "$corpus"/
      echo "=== preset ${p}: ${target} for ${TESSERA_FUZZ_SECONDS:-15} s"
      "build/$p/fuzz/$target" -max_total_time="${TESSERA_FUZZ_SECONDS:-15}" -rss_limit_mb=4096 \
        -print_final_stats=1 "${extra[@]}" "$corpus" 2>&1 | tail -n 4
      rm -rf "$corpus"
    done
    continue
  fi
  if [ "$p" = noredis ]; then
    # The tiers and the runtime without hiredis: they build, and the tier tests that remain pass.
    cmake --build "build/$p" -j "$jobs" --target tessera runtime_link_test tier_adapters_test tiered_store_test
    ctest --test-dir "build/$p" -j "$jobs" -R 'Runtime|TierAdapters|TieredStore|RedisAdapter' --output-on-failure
    continue
  fi
  cmake --build "build/$p" -j "$jobs"
  if [ "$p" = clang ]; then continue; fi  # -Wthread-safety -Werror: building clean is the test
  if [ "$p" = release ]; then continue; fi  # -O3 -Werror in full (ADR 0034): building is the test
  echo "=== preset ${p}: tests"
  # TSan needs a fixed address-space layout on kernels with high mmap randomisation.
  runner=()
  if [ "$p" = tsan ] && command -v setarch >/dev/null; then runner=(setarch "$(uname -m)" -R); fi
  "${runner[@]}" ctest --preset "$p" -j "$jobs"
done
