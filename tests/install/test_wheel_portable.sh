#!/usr/bin/env bash
# The wheel as it installs anywhere (docs/install.md): builds it from python/ without build isolation (the venv
# of scripts/wheel-venv.sh build), retags it with `auditwheel repair` and requires `auditwheel show` to find it
# consistent with a manylinux tag with no external library; installs it offline into the bare venv of
# scripts/wheel-venv.sh run (numpy and libucx-cu12 only); then, in a mount namespace where the system's UCX
# (libucp, libucs, libuct, libucm and its module folder) and libhiredis are empty files, shows that the system
# build's librefit.so no longer loads and runs real pulls through the installed package (wheel_pull.py: shm, and
# UCX over TCP on 127.0.0.1 with a redis registry), checking every byte.
# Needs root (unshare -m, mount --bind); skips (77) without.  The CPU flavour: REFIT_WITH_CUDA=OFF, with the
# CUDA-flavoured libucx-cu12 on a machine without a CUDA driver (UCX skips its cuda modules).
# Usage: test_wheel_portable.sh SYSTEM_LIBREFIT_SO WHEEL_BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
syslib=$1
build_dir=$2
fail() { echo "test_wheel_portable: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null || { echo "SKIPPED: needs root and unshare"; exit 77; }
command -v redis-server >/dev/null || fail "redis-server is missing (scripts/deps.sh)"
unset REFIT_LIBRARY REFIT_BIN PYTHONPATH
tmp=$(mktemp -d)
redis_pid=""
cleanup() { [ -z "$redis_pid" ] || kill "$redis_pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
bpy=$("$root/scripts/wheel-venv.sh" build) || fail "scripts/wheel-venv.sh build"
rpy=$("$root/scripts/wheel-venv.sh" run) || fail "scripts/wheel-venv.sh run"
bbin=$(dirname "$bpy")

t=$SECONDS
"$bpy" -m pip wheel --no-input --disable-pip-version-check -q --no-deps --no-build-isolation -w "$tmp/dist" \
  -C cmake.define.REFIT_WITH_CUDA=OFF -C build-dir="$build_dir" "$root/python" >"$tmp/wheel.log" 2>&1 ||
  { tail -40 "$tmp/wheel.log"; fail "pip wheel ./python"; }
echo "built $(basename "$tmp"/dist/*.whl) in $((SECONDS - t)) s"
PATH="$bbin:$PATH" "$bbin/auditwheel" repair -w "$tmp/fixed" "$tmp"/dist/*.whl >"$tmp/repair.log" 2>&1 ||
  { cat "$tmp/repair.log"; fail "auditwheel repair"; }
wheel=$(ls "$tmp"/fixed/refit-*.whl)
"$bbin/auditwheel" show "$wheel" | tee "$tmp/show.txt"
"$bbin/auditwheel" show --json "$wheel" >"$tmp/show.json" || fail "auditwheel show --json"
"$bpy" - "$wheel" "$tmp/show.json" <<'PY' || fail "auditwheel's verdict"
import json, sys, zipfile
wheel, show = sys.argv[1], json.load(open(sys.argv[2]))
tag = show["overall_tag"]
assert tag.startswith("manylinux_") and tag.endswith("_x86_64"), f"auditwheel show: consistent with {tag}"
assert not show["external_libs"], f"external libraries: {show['external_libs']}"
assert f"-py3-none-{tag}.whl" in wheel, f"{wheel} is not tagged {tag}"
names = zipfile.ZipFile(wheel).namelist()
grafted = [n for n in names if ".libs/" in n]
assert not grafted, f"auditwheel grafted libraries into the wheel: {grafted}"
meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
assert "Requires-Dist: libucx-cu12" in meta, "the wheel does not depend on libucx-cu12"
print(f"auditwheel: {tag}, no external library, nothing grafted; depends on libucx-cu12")
PY

"$rpy" -m pip uninstall -q -y refit >/dev/null 2>&1 || true
"$rpy" -m pip install --no-input --disable-pip-version-check -q --no-index "$wheel" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "pip install --no-index the wheel (its dependencies must be in the run venv)"; }

port=$("$rpy" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

: >"$tmp/empty"
mkdir "$tmp/emptydir"
export tmp syslib rpy port
cd "$tmp"  # nowhere near the checkout
unshare -m bash -euo pipefail -c '
  lib=/usr/lib/x86_64-linux-gnu
  hidden=0
  for f in "$lib"/libucp.so* "$lib"/libucs.so* "$lib"/libucs_signal.so* "$lib"/libuct.so* "$lib"/libucm.so* \
           "$lib"/libhiredis.so*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    mount --bind "$tmp/empty" "$f"; hidden=$((hidden + 1))
  done
  [ -d "$lib/ucx" ] && mount --bind "$tmp/emptydir" "$lib/ucx"
  echo "hid $hidden system UCX/hiredis libraries and $lib/ucx"
  if python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$syslib" 2>"$tmp/sysload.txt"; then
    echo "test_wheel_portable: FAIL: the system build $syslib still loads: UCX/hiredis not hidden" >&2; exit 1
  fi
  echo "the system build no longer loads: $(tail -1 "$tmp/sysload.txt")"
  exec "$rpy" '"$root"'/tests/install/wheel_pull.py "$(dirname "$(dirname "$rpy")")" "$port" "$tmp"
' || fail "pulls through the installed wheel"
echo "test_wheel_portable: OK"
