#!/usr/bin/env bash
# Builds refit into build/ (or $1 with extra CMake arguments after it).
# Installs nothing: scripts/deps.sh installs what the build needs, once.
# Usage: scripts/build.sh [BUILD_DIR [cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cmake ninja cc; do
  command -v "$tool" >/dev/null || { echo "build: $tool is missing: run scripts/deps.sh first" >&2; exit 1; }
done
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
ninja -C "$dir"
