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

name=bridge-venv
# shellcheck source=scripts/venv-lib.sh
. "$root/scripts/venv-lib.sh"
venv_reuse_or_lock
venv_create

for s in "${steps[@]}"; do
  # shellcheck disable=SC2086  # each step is a list of pip arguments
  step $s
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

venv_done
