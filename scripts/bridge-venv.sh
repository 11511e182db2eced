#!/usr/bin/env bash
# Creates the Python virtual environment that tests/python/bridge_check.py
# runs in: torch, megatron-core and Megatron-Bridge's HF<->Megatron parameter
# mappings, on the CPU; also pytest, numpy and safetensors for the Python
# binding's tests (tests/python/test_*.py).  Usage: scripts/bridge-venv.sh
#
#   REFIT_BRIDGE_VENV  where the venv goes (default build/bridge-venv; a
#                      relative path is taken from the repository root)
#
# Prints the venv's python (absolute path) on stdout and nothing else there;
# progress and timings go to stderr.  Idempotent: once every step has worked,
# a marker file holding the recipe is written into the venv, and later runs
# with the same recipe reuse the venv without touching the network.  An
# existing directory without the marker is completed in place, never deleted.
# Exits non-zero, saying which step failed, if anything fails (for example
# when PyPI cannot be reached).
#
# The recipe, and why it is not simply `pip install megatron-bridge`:
# megatron-bridge's own dependencies (transformer-engine, mamba-ssm,
# causal-conv1d, nv-grouped-gemm) are CUDA source builds that need nvcc and an
# NVIDIA driver.  The mapping code needs none of them: it needs torch,
# megatron-core without extras, megatron-bridge with --no-deps, and
# transformers < 5 with a few small packages.  torch comes from PyPI (the CUDA
# build with its nvidia-* wheels, about 5 GB; download.pytorch.org is not
# assumed reachable); it runs on the CPU.  Versions are the ones this recipe
# was verified with, pinned so that the check does not drift.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

venv=${REFIT_BRIDGE_VENV:-build/bridge-venv}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

steps=(
  "torch==2.15.0"
  "megatron-core==0.16.1"
  "--no-deps megatron-bridge==0.3.1"
  "transformers==4.57.6 safetensors rich omegaconf hydra-core>1.3,<=1.3.2 pyyaml tqdm regex six"
  "pytest numpy safetensors"
)
# Recipe 2 added pytest, numpy and safetensors for tests/python (the binding's tests): a venv completed
# with recipe 1 has no matching marker and is completed in place (pip skips what is installed).
recipe="refit bridge venv recipe 2: $(printf '%s; ' "${steps[@]}")"
marker="$venv/.refit-bridge-venv-complete"

log() { echo "bridge-venv: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; then
  log "reusing $venv (complete)"
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
# Another run may have finished it while this one waited for the lock.
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; then
  log "reusing $venv (completed by another run)"
  echo "$venv/bin/python"
  exit 0
fi

t_all=$(now)
log "building $venv"

# python3 -m venv needs Debian's python3-venv (ensurepip); install it as
# scripts/deps.sh installs packages.
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
  t=$(now)
  log "installing python3-venv from apt"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null; } >&2 ||
    die "apt-get install python3-venv"
  log "python3-venv installed in $(since "$t")"
fi

t=$(now)
rm -f "$marker"
python3 -m venv "$venv" >&2 || die "python3 -m venv $venv"
log "venv created in $(since "$t")"

pip=("$venv/bin/python" -m pip install --no-input --progress-bar off --disable-pip-version-check
     --retries 2 --timeout 60 -q)
for s in "${steps[@]}"; do
  t=$(now)
  log "pip install $s"
  # shellcheck disable=SC2086  # each step is a list of pip arguments
  "${pip[@]}" $s >&2 || die "pip install $s (is PyPI reachable?)"
  log "  done in $(since "$t")"
done

# Prove that what the checker needs imports: megatron.core, and Bridge's
# conversion modules (the checker skips megatron.bridge's package __init__s,
# which import transformer_engine; here it is enough that the files exist).
t=$(now)
"$venv/bin/python" - >&2 <<'EOF' || die "import check"
import importlib.metadata as md, os, warnings
warnings.filterwarnings("ignore")
import torch, safetensors.torch, transformers, megatron.core, pytest, numpy
base = os.path.join(list(__import__("megatron").__path__)[0], "bridge", "models", "conversion")
for f in ("param_mapping.py", "model_bridge.py", "mapping_registry.py"):
    assert os.path.isfile(os.path.join(base, f)), f"missing megatron/bridge/models/conversion/{f}"
print("  " + ", ".join(f"{p} {md.version(p)}" for p in
      ("torch", "megatron-core", "megatron-bridge", "transformers", "safetensors", "pytest", "numpy")))
EOF
log "import check in $(since "$t")"

echo "$recipe" >"$marker"
log "complete in $(since "$t_all"); $(du -sh "$venv" 2>/dev/null | cut -f1) at $venv"
echo "$venv/bin/python"
