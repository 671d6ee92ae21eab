#!/usr/bin/env bash
# Builds and runs every test: the dev build, the library under clang's thread-safety analysis
# (build only: the check is the compile), bounded libFuzzer runs of the segment parser and of the
# config.json reader (clang), then the whole suite under ASan+UBSan and under TSan.
# Usage: scripts/test-all.sh [preset...]   (default: dev clang fuzz asan tsan)
#        TESSERA_FUZZ_SECONDS=N sets the fuzzing time per target (default 15).
set -euo pipefail
cd "$(dirname "$0")/.."

presets=("$@")
if [ "${#presets[@]}" -eq 0 ]; then presets=(dev clang fuzz asan tsan); fi
jobs=$(nproc)

for p in "${presets[@]}"; do
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
  cmake --build "build/$p" -j "$jobs"
  if [ "$p" = clang ]; then continue; fi  # -Wthread-safety -Werror: building clean is the test
  echo "=== preset ${p}: tests"
  # TSan needs a fixed address-space layout on kernels with high mmap randomisation.
  runner=()
  if [ "$p" = tsan ] && command -v setarch >/dev/null; then runner=(setarch "$(uname -m)" -R); fi
  "${runner[@]}" ctest --preset "$p" -j "$jobs"
done
