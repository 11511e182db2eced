#!/usr/bin/env bash
# The Python package as a user gets it: builds the wheel from python/ (pip,
# scikit-build-core, the library compiled from this checkout), checks that it
# carries librefit.so, installs it into a fresh venv (numpy and libucx-cu12 from PyPI) and,
# from outside the checkout with no REFIT_* variables, plans tiny-dense from
# megatron tp=2 to hf, moves version 5's bytes with the plan and verifies
# them, and checks that a wrong version fails verification.
# Usage: test_wheel.sh [extra pip arguments, e.g. -C cmake.define.REFIT_WITH_CUDA=OFF]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_wheel: FAIL: $*" >&2; exit 1; }
unset REFIT_LIBRARY REFIT_BIN PYTHONPATH
pip_flags=(--no-input --disable-pip-version-check --progress-bar off --retries 2 --timeout 60)

python3 -m venv "$tmp/build-venv" || fail "python3 -m venv (python3-venv: scripts/deps.sh)"
t=$SECONDS
"$tmp/build-venv/bin/pip" wheel "${pip_flags[@]}" -q --no-deps -w "$tmp/dist" "$@" "$root/python" \
  >"$tmp/wheel.log" 2>&1 || { tail -40 "$tmp/wheel.log"; fail "pip wheel ./python (is PyPI reachable?)"; }
wheel=$(ls "$tmp"/dist/refit-*.whl)
echo "built $(basename "$wheel") in $((SECONDS - t)) s"
case $(basename "$wheel") in refit-*-py3-none-linux_*.whl) ;; *) fail "unexpected wheel tags: $wheel" ;; esac
python3 - "$wheel" <<'PY' || fail "wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["refit/__init__.py", "refit/_lib.py", "refit/core.py", "refit/librefit.so", "refit/vllm/__init__.py",
        "refit/vllm/plugin.py", "refit/vllm/backend.py"]
missing = [n for n in need if n not in names]
assert not missing, f"missing from the wheel: {missing}"
ep = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
assert ep, "no entry_points.txt"
text = zipfile.ZipFile(sys.argv[1]).read(ep[0]).decode()
assert "vllm.general_plugins" in text and "refit.vllm.plugin:register" in text, text
print("wheel:", len(names), "files, librefit.so included, vllm.general_plugins entry point present")
PY

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install "${pip_flags[@]}" -q "$wheel" >"$tmp/install.log" 2>&1 ||
  { tail -20 "$tmp/install.log"; fail "pip install the wheel"; }
cd "$tmp"  # nowhere near the checkout: nothing can come from python/ or build/
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY' || fail "using the installed package"
import importlib.metadata, os, sys
import numpy as np
import refit

venv = os.path.realpath(sys.argv[1])
pkg = os.path.dirname(os.path.realpath(refit.__file__))
assert pkg.startswith(venv + os.sep), f"refit imported from {pkg}, not the venv"
assert os.path.realpath(refit.library_path) == os.path.join(pkg, "librefit.so"), refit.library_path
assert refit.version() == refit.__version__ == importlib.metadata.version("refit"), \
    (refit.version(), refit.__version__, importlib.metadata.version("refit"))
assert "shm" in refit.features(), refit.features()

model = refit.Model("tiny-dense")
srcs = [refit.Layout("megatron:tp=2").manifest(model, r) for r in range(2)]
dst = refit.Layout("hf").manifest(model, 0)
plan = refit.Plan(srcs, dst)
st = plan.stats()
assert st.bytes_written == st.bytes_read == model.total_bytes and st.regions > 0, (st, model.total_bytes)
src_regions = [[np.zeros(n, np.uint8) for n in m.regions()] for m in srcs]
for m, rs in zip(srcs, src_regions):
    m.truth_fill(rs, 5)
dst_regions = [np.zeros(n, np.uint8) for n in dst.regions()]
plan.execute(src_regions, dst_regions)
rep = dst.truth_verify(dst_regions, 5)
assert rep["bytes_checked"] == model.total_bytes, rep
try:
    dst.truth_verify(dst_regions, 6)
except refit.RefitError:
    pass
else:
    raise AssertionError("version 6 verified against version 5's bytes")
print(f"refit {refit.version()} ({' '.join(refit.features())}) from {refit.library_path}: "
      f"planned and verified {rep['bytes_checked']} bytes")
PY
echo "test_wheel: OK"
