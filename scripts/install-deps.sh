#!/usr/bin/env bash
# Installs what Tessera needs to build and test on Debian 12, skipping what is already there.
# Every dependency is a Debian package (see docs/adr/0001-language-build-dependencies.md).
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  zlib1g-dev chromium
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libssl-dev libxxhash-dev
  libhiredis-dev redis-server liburing-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3-torch python3-numpy python3-pip python3-setuptools
  python3-dev pybind11-dev python3-pybind11 python3-zmq python3-msgpack python3-yaml
  libcivetweb-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libyaml-cpp-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
