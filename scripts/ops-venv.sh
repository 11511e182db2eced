#!/usr/bin/env bash
# Creates the small Python virtual environment of the operations tests
# (tests/python/test_metrics.py, tests/deploy/validate.py): prometheus-client
# (its text parser reads refit's scrapes; python/refit/metrics.py uses it),
# kubernetes-validate (the Kubernetes JSON schemas ship inside the package:
# validation needs no network), pyyaml, pytest and numpy (the binding).
# Usage: scripts/ops-venv.sh
#
#   REFIT_OPS_VENV  where the venv goes (default build/ops-venv; a relative
#                   path is taken from the repository root)
#
# Prints the venv's python (absolute path) on stdout and nothing else there;
# progress goes to stderr.  Idempotent: once every step worked, a marker
# holding the recipe is written into the venv, and later runs with the same
# recipe reuse it without touching the network; an incomplete venv is
# completed in place.  Exits non-zero, saying which step failed, if anything
# fails (for example when PyPI cannot be reached).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv=${REFIT_OPS_VENV:-build/ops-venv}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

steps=(
  "prometheus-client==0.26.0 kubernetes-validate==1.37.0 pyyaml pytest numpy"
)
recipe="refit ops venv recipe 1: $(printf '%s; ' "${steps[@]}")"
marker="$venv/.refit-ops-venv-complete"
log() { echo "ops-venv: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi
log "building $venv"
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null; } >&2 ||
    die "apt-get install python3-venv"
fi
rm -f "$marker"
python3 -m venv "$venv" >&2 || die "python3 -m venv $venv"
for s in "${steps[@]}"; do
  log "pip install $s"
  # shellcheck disable=SC2086  # each step is a list of pip arguments
  "$venv/bin/python" -m pip install --no-input --progress-bar off --disable-pip-version-check --retries 2 \
    --timeout 60 -q $s >&2 || die "pip install $s (is PyPI reachable?)"
done
"$venv/bin/python" -c 'import prometheus_client, kubernetes_validate, yaml, pytest, numpy' >&2 || die "import check"
echo "$recipe" >"$marker"
log "complete: $(du -sh "$venv" 2>/dev/null | cut -f1) at $venv"
echo "$venv/bin/python"
