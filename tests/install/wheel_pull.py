"""Real pulls through the installed wheel, run by test_wheel_portable.sh in a venv holding only the wheel and its
dependencies, with the system's UCX and hiredis hidden from the loader.

Checks that refit and its librefit.so come from the venv, then for each case starts a publisher (a child process
of this venv's Python) holding tiny-moe in the hf layout and pulls version 3 into vllm tp=2 rank 0 (a planned
reshard); every byte is compared with what the receiver computes on its own (Manifest.truth_fill of the version):
  shm over a file: registry
  UCX over TCP on 127.0.0.1 with a redis:// registry (hiredis, linked into librefit.so), the lanes reported by
  the pull must be TCP ones
and finally that the process mapped UCX from the libucx wheel and no libucp or libhiredis of the system.
Usage: python wheel_pull.py VENV REDIS_PORT TMPDIR"""
import ctypes
import os
import subprocess
import sys

import numpy as np

import refit

PUB = r"""
import sys
import numpy as np
import refit
transport, reg, secret = sys.argv[1], sys.argv[2], sys.argv[3]
man = refit.Layout("hf").manifest(refit.Model("tiny-moe"), 0)
with refit.Publisher(man, registry=reg, job="wheel", transports=transport, transport_options="ucx.tls=tcp",
                     secret_file=secret) as p:
    mem = np.zeros(man.regions()[0], np.uint8)
    p.attach(0, mem)
    man.truth_fill([mem], 3)
    p.publish(3)
    p.wait_acks(3, 1, 60000)
    p.wait_readers(3, 60000)
print("publisher ok")
"""


def check_installed(venv):
    pkg = os.path.dirname(os.path.realpath(refit.__file__))
    assert pkg.startswith(os.path.realpath(venv) + os.sep), f"refit imported from {pkg}, not the venv {venv}"
    assert os.path.realpath(refit.library_path) == os.path.join(pkg, "librefit.so"), refit.library_path
    feats = refit.features()
    assert "ucx" in feats and "redis" in feats, f"the wheel's library lacks ucx or redis: {feats}"
    print(f"refit {refit.version()} ({' '.join(feats)}) from {refit.library_path}")


def pull(transport, reg, secret):
    pub = subprocess.Popen([sys.executable, "-c", PUB, transport, reg, secret], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        layout, model = refit.Layout("vllm:tp=2"), refit.Model("tiny-moe")
        man = layout.manifest(model, 0)
        with refit.Receiver(man, registry=reg, job="wheel", transports=transport,
                            transport_options="ucx.tls=tcp", secret_file=secret) as r:
            mem = np.zeros(man.regions()[0], np.uint8)
            r.attach(0, mem)
            rep = r.pull(3, timeout_ms=60000)
        own = layout.manifest(model, 0)  # the receiver owned (and destroyed) man
        want = np.zeros_like(mem)
        own.truth_fill([want], 3)
        assert rep.version == 3 and rep.bytes > 0, (rep.version, rep.bytes)
        assert rep.transport == transport, f"pulled over {rep.transport!r}, not {transport}"
        assert np.array_equal(mem, want), f"{transport}: {int((mem != want).sum())} of {mem.size} bytes differ"
        own.truth_verify([mem], 3)
        print(f"{transport} via {reg.split(':')[0]}: {rep.bytes} bytes, lanes {rep.lanes!r}, all equal")
        return rep
    finally:
        out, err = pub.communicate(timeout=90)
        assert pub.returncode == 0, f"publisher ({transport}) failed:\n{out}{err}"


def check_maps(venv):
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    ucp = sorted(p for p in paths if os.path.basename(p).startswith("libucp.so"))
    venv = os.path.realpath(venv)
    assert ucp and all(os.path.realpath(p).startswith(venv + os.sep) for p in ucp), f"libucp mapped from {ucp}"
    system = sorted(p for p in paths if "hiredis" in p or (p.startswith("/usr/lib") and "/libuc" in p))
    assert not system, f"system libraries mapped: {system}"
    print(f"UCX from {ucp[0]}; no system libucp/libucs/libhiredis mapped")
    try:  # the CPU case the wheel must survive: libucx-cu12's CUDA modules without a CUDA driver
        ctypes.CDLL("libcuda.so.1")
        print("a CUDA driver is present")
    except OSError:
        print("no CUDA driver here: UCX skipped its cuda modules and the pulls worked")


def main():
    venv, redis_port, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
    check_installed(venv)
    secret = os.path.join(tmp, "secret")  # the job's shared secret (docs/security.md)
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(32))
    pull("shm", f"file:{tmp}/reg", secret)
    rep = pull("ucx", f"redis://127.0.0.1:{redis_port}", secret)
    assert "tcp" in rep.lanes, f"UCX lanes are not TCP: {rep.lanes!r}"
    check_maps(venv)
    print("wheel_pull: OK")


if __name__ == "__main__":
    main()
