#!/usr/bin/env bash
# Installs the dependencies and builds refit into build/ (or $1 with extra
# CMake arguments after it).  Usage: scripts/build.sh [BUILD_DIR [cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
ninja -C "$dir"
