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

log() { echo "sglang-venv: $*" >&2; }
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
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ] && [ -x "$venv/bin/python" ]; then
  log "reusing $venv (completed by another run)"
  echo "$venv/bin/python"
  exit 0
fi

t_all=$(now)
log "building $venv"
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
py="$venv/bin/python"
pip=("$py" -m pip install --no-input --progress-bar off --disable-pip-version-check --retries 2 --timeout 60 -q)

step() {
  local t
  t=$(now)
  log "pip install $*"
  "${pip[@]}" "$@" >&2 || die "pip install $* (is PyPI reachable?)"
  log "  done in $(since "$t")"
}

step "$torch_pin" packaging
step --no-deps "$sglang_pin"

# SGLang's requirements from its installed metadata, markers evaluated for
# this interpreter and machine, without torch, its add-ons and the CUDA
# kernel packages.
reqs=$("$py" - "$skip" <<'PYEOF'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
skip = set(sys.argv[1].split())
out = []
for s in md.requires("sglang") or []:
    r = Requirement(s)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if re.sub(r"[-_.]+", "-", r.name).lower() in skip:
        continue
    out.append(str(r).split(";")[0].strip())
print("\n".join(out))
PYEOF
) || die "reading sglang's requirements (packaging missing?)"
[ -n "$reqs" ] || die "sglang lists no requirements"
mapfile -t reqs_a <<<"$reqs"
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

echo "$recipe" >"$marker"
log "complete in $(since "$t_all"); $(du -sh "$venv" 2>/dev/null | cut -f1) at $venv"
echo "$venv/bin/python"
