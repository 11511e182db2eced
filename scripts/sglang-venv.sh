#!/usr/bin/env bash
# Creates the Python virtual environment that tests/python/test_sglang.py runs
# in: the real SGLang 0.5.23 on the CPU (sglang from PyPI), torch 2.14.1 from
# PyPI, SGLang's requirements without its CUDA kernel packages, pytest, and
# the refit package (editable, the checkout's code).
# Usage: scripts/sglang-venv.sh
#
#   REFIT_SGLANG_VENV  where the venv goes (default build/sglang-venv; a
#                      relative path is taken from the repository root)
#
# Prints the venv's python (absolute path) on stdout and nothing else there;
# progress and timings go to stderr.  Idempotent: once every step has worked,
# a marker file holding the recipe is written into the venv, and later runs
# with the same recipe reuse it without touching the network.  An existing
# directory without the marker is completed in place, never deleted.  Exits
# non-zero, saying which step failed, if anything fails (e.g. no PyPI).
#
# The recipe, and why it is not `pip install sglang`: sglang 0.5.23's
# metadata requires a dozen CUDA-only kernel packages (sglang-kernel,
# flashinfer, flash-attn-4, deep-ep, deep-gemm, flash-mla, cutlass-dsl,
# tilelang, quack, ...) that are GPU wheels of several GB and none of which
# has a CPU build on PyPI.  So sglang goes in with --no-deps, next to
# torch==2.14.1 from PyPI (the CUDA build; it runs on the CPU), and then
# SGLang's requirements as its wheel metadata lists them for this machine,
# except torch, its add-ons and the CUDA kernel packages ($skip below).
# SGLang does not import on the CPU without an `sgl_kernel` module; the tests
# put refit's pure-torch stand-in (tests/python/sglang_stub) first on
# PYTHONPATH instead - it is not installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

venv=${REFIT_SGLANG_VENV:-build/sglang-venv}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

torch_pin="torch==2.14.1"
sglang_pin="sglang==0.5.23"
pins="transformers==5.19.0"
skip="torch torchaudio torchvision torchcodec sglang-kernel sgl-deep-ep sgl-deep-gemm sgl-flash-mla flash-attn-4"
skip+=" flashinfer-python humming-kernels nvidia-cutlass-dsl nvidia-mathdx nvshmem4py-cu13 quack-kernels tilelang"
skip+=" cuda-python torch-memory-saver"
extra="pytest"
recipe="refit sglang venv recipe 1: $torch_pin packaging; --no-deps $sglang_pin; its requirements without $skip, $pins; $extra; -e python"
marker="$venv/.refit-sglang-venv-complete"

name=sglang-venv
# shellcheck source=scripts/venv-lib.sh
. "$root/scripts/venv-lib.sh"
venv_reuse_or_lock
venv_create

step "$torch_pin" packaging
step --no-deps "$sglang_pin"

# SGLang's requirements from its installed metadata, without torch, its add-ons and the CUDA kernel packages.
venv_requirements sglang "$skip"
# torch pinned in the same resolution, so that no requirement replaces it.
step "$torch_pin" $pins "${reqs_a[@]}"
step $extra
step --no-deps -e "$root/python"

t=$(now)
PYTHONPATH="$root/tests/python/sglang_stub" SGLANG_USE_CPU_ENGINE=1 "$py" - "$root/python/" >&2 <<'PYEOF' || die "import check"
import importlib.metadata as md, importlib.util, sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers, safetensors, pytest
import sglang, sglang.srt.entrypoints.engine
import sgl_kernel
assert getattr(sgl_kernel, "REFIT_TEST_STAND_IN", False), sgl_kernel.__file__  # the stand-in, not a CUDA wheel
# refit itself needs librefit.so (a build or REFIT_LIBRARY), which need not exist yet: found, not imported
spec = importlib.util.find_spec("refit")
assert spec is not None and spec.origin.startswith(sys.argv[1]), f"refit's package is not this checkout's: {spec}"
print("  " + ", ".join(f"{p} {md.version(p)}" for p in ("torch", "sglang", "transformers", "safetensors", "pytest")))
PYEOF
log "import check in $(since "$t")"

venv_done
