#!/usr/bin/env bash
# Installs what refit needs to build and test on Debian 12: only the packages
# that are missing, so a second run costs nothing.  Runs apt-get as root (or
# through sudo).  The only script that runs apt for the build: scripts/build.sh
# and scripts/test.sh never call it (the README's first command and .ci/run do).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev libcmocka-dev python3
      libhiredis-dev redis-server libucx-dev ucx-utils iproute2 procps openssl stunnel4
      faketime python3-venv clang-format-14)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
