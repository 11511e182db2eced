#!/usr/bin/env bash
# Creates the Python virtual environment that bench/peers.sh runs the peer engines in: Mooncake Transfer Engine
# (the CPU wheel) and NIXL, plus numpy.  Not part of CI (no test uses it).  Usage: scripts/peers-venv.sh
#
#   REFIT_PEERS_VENV  where the venv goes (default build/peers-venv; a relative path is taken from the
#                     repository root)
#
# Prints the venv's python (absolute path) on stdout and nothing else there; progress and timings go to stderr.
# Idempotent like scripts/bridge-venv.sh (a marker holding the recipe; an incomplete venv is completed in place).
#
# The recipe, and why it is not simply `pip install mooncake-transfer-engine-non-cuda nixl`:
# - `nixl` on PyPI is a meta package (nixl/__init__.py picks nixl_cu13, nixl_cu12 or nixl_rocm at import).
#   nixl 1.5.2 requires nixl-cu12==1.5.2 AND nixl-cu13==1.5.2, and nixl-cu12 1.5.2 is not on PyPI (1.5.1 is the
#   newest seen on 2026-12-02), so a plain `pip install nixl` cannot resolve 1.5.2.  One backend wheel is
#   enough on a CPU host: nixl-cu12 1.5.1 (its UCX backend plugin and a bundled UCX).
# - nixl-cu12 declares `torch` as a requirement, but its Python API imports torch only if the caller already
#   did (nixl_cu12/_api.py looks in sys.modules): with --no-deps and numpy, no torch (about 5 GB from PyPI).
# - The meta package `nixl` is installed with --no-deps for the `nixl` import name the docs use.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

venv=${REFIT_PEERS_VENV:-build/peers-venv}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

steps=(
  "mooncake-transfer-engine-non-cuda==0.3.13.post1"
  "numpy"
  "--no-deps nixl-cu12==1.5.1"
  "--no-deps nixl==1.5.1"
)
recipe="refit peers venv recipe 1: $(printf '%s; ' "${steps[@]}")"
marker="$venv/.refit-peers-venv-complete"

name=peers-venv
# shellcheck source=scripts/venv-lib.sh
. "$root/scripts/venv-lib.sh"
venv_reuse_or_lock
venv_create

for s in "${steps[@]}"; do
  # shellcheck disable=SC2086  # each step is a list of pip arguments
  step $s
done

t=$(now)
"$venv/bin/python" - >&2 <<'PYEOF' || die "import check"
import importlib.metadata as md
from mooncake.engine import TransferEngine  # noqa: F401
from nixl._api import nixl_agent, nixl_agent_config  # noqa: F401
import numpy  # noqa: F401
print("  " + ", ".join(f"{p} {md.version(p)}" for p in
      ("mooncake-transfer-engine-non-cuda", "nixl-cu12", "nixl", "numpy")))
PYEOF
log "import check in $(since "$t")"

venv_done
