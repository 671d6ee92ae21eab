#!/usr/bin/env bash
# Usage: runtime_symbols.sh BINARY RUNTIME_LIB FORBIDDEN_LIB...
# Fails when BINARY defines a function that a FORBIDDEN_LIB defines (its object was linked in),
# or when it defines none of RUNTIME_LIB's (the check would be reading nothing).
set -euo pipefail
binary=$1 runtime=$2
shift 2
strong() { nm -P --defined-only "$@" | awk '$2 == "T" { print $1 }' | sort -u; }
in_binary=$(nm -P --defined-only "$binary" | awk '{ print $1 }' | sort -u)
found=$(comm -12 <(strong "$runtime") <(echo "$in_binary") | wc -l)
if [ "$found" -eq 0 ]; then
  echo "FAIL: $binary defines no function of $runtime" >&2
  exit 1
fi
leaked=$(comm -12 <(strong "$@") <(echo "$in_binary"))
if [ -n "$leaked" ]; then
  echo "FAIL: $binary links code of $*:" >&2
  echo "$leaked" | head -20 | c++filt >&2
  exit 1
fi
echo "ok: $found functions of $runtime, none of $*"
