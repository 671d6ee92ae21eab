#!/bin/sh
# The installed package (ADR 0026): `cmake --install` of the built tree into a temporary prefix,
# then tests/consumer built against it twice — through find_package(tessera) and through
# `pkg-config --static tessera` — and run (each checks a ledger figure), and the installed
# `tessera --version` compared with the build tree's.
#
#   install_consumer_test.sh CMAKE BUILD_DIR CONSUMER_SRC CXX TESSERA_BINARY VERSION
set -eu
cmake_cmd=$1 build_dir=$2 consumer_src=$3 cxx=$4 built_tessera=$5 version=$6

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake_cmd" --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1; }
for f in include/tessera/ledger.h bin/tessera share/doc/tessera/LICENSE; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
config=$(find "$prefix" -name tesseraConfig.cmake | head -n 1)
pc=$(find "$prefix" -name tessera.pc | head -n 1)
[ -n "$config" ] || { echo "FAIL: no tesseraConfig.cmake installed"; exit 1; }
[ -n "$pc" ] || { echo "FAIL: no tessera.pc installed"; exit 1; }
[ -e "$(dirname "$config")/tesseraConfigVersion.cmake" ] || { echo "FAIL: no version file"; exit 1; }

# 1. find_package(tessera).
"$cmake_cmd" -S "$consumer_src" -B "$tmp/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DEXPECTED_VERSION="$version" >"$tmp/configure.log" 2>&1 || {
  cat "$tmp/configure.log"; echo "FAIL: configuring the find_package consumer"; exit 1; }
"$cmake_cmd" --build "$tmp/consumer-cmake" >"$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"; echo "FAIL: building the find_package consumer"; exit 1; }
"$tmp/consumer-cmake/consumer" || { echo "FAIL: the find_package consumer"; exit 1; }

# 2. pkg-config (static libraries: --static adds their private dependencies).
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
[ "$(pkg-config --modversion tessera)" = "$version" ] || { echo "FAIL: pkg-config --modversion"; exit 1; }
# shellcheck disable=SC2046  # the flags are words
"$cxx" -std=c++20 -O1 -o "$tmp/consumer-pc" "$consumer_src/consumer.cc" \
  $(pkg-config --cflags tessera) $(pkg-config --static --libs tessera) || {
  echo "FAIL: building the pkg-config consumer"; exit 1; }
"$tmp/consumer-pc" || { echo "FAIL: the pkg-config consumer"; exit 1; }

# 3. The installed binary.
want=$("$built_tessera" --version)
got=$("$prefix/bin/tessera" --version)
echo "installed: $got"
case $got in
  "tessera "?*) ;;
  *) echo "FAIL: tessera --version printed '$got'"; exit 1 ;;
esac
[ "$got" = "$want" ] || { echo "FAIL: installed '$got' != built '$want'"; exit 1; }
echo "PASS"
