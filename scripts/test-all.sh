#!/usr/bin/env bash
# Builds and runs every test: the dev build, then the same suite under ASan+UBSan and TSan.
# Usage: scripts/test-all.sh [preset...]   (default: dev asan tsan)
set -euo pipefail
cd "$(dirname "$0")/.."

presets=("$@")
if [ "${#presets[@]}" -eq 0 ]; then presets=(dev asan tsan); fi
jobs=$(nproc)

for p in "${presets[@]}"; do
  echo "=== preset ${p}: configure and build"
  cmake --preset "$p" >/dev/null
  cmake --build "build/$p" -j "$jobs"
  echo "=== preset ${p}: tests"
  # TSan needs a fixed address-space layout on kernels with high mmap randomisation.
  runner=()
  if [ "$p" = tsan ] && command -v setarch >/dev/null; then runner=(setarch "$(uname -m)" -R); fi
  "${runner[@]}" ctest --preset "$p" -j "$jobs"
done
