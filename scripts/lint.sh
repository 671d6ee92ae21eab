#!/usr/bin/env bash
# The lint CI runs: clang-format --dry-run -Werror on every C++ source of the project, and
# clang-tidy (.clang-tidy's checks, warnings as errors) on the sources changed since BASE
# (default: the previous commit; CI's clone of main ends at the landed commit).
# Usage: scripts/lint.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}

mapfile -t sources < <(git ls-files '*.cc' '*.h' | grep -v '^fuzz/.*corpus')
echo "clang-format: ${#sources[@]} files"
clang-format --dry-run -Werror "${sources[@]}"

mapfile -t changed < <(git diff --name-only --diff-filter=AMR "$base" -- 'src/*.cc' 'tools/*.cc' 2>/dev/null || true)
if [ "${#changed[@]}" -eq 0 ]; then
  echo "clang-tidy: no changed sources since ${base}"
  exit 0
fi
# The dev build's compile database (configuring is enough); GCC-only flags are not errors here.
if [ ! -f build/dev/compile_commands.json ]; then cmake --preset dev >/dev/null; fi
echo "clang-tidy: ${#changed[@]} changed files since ${base}"
clang-tidy -p build/dev --quiet --warnings-as-errors='*' --extra-arg=-Wno-unknown-warning-option "${changed[@]}" \
  2> >(grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated|^Suppressed|^Use -header-filter' >&2)
