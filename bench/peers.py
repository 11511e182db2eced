"""The orchestrator of bench/peers.sh (issue 31): refit against a plain TCP stream, Mooncake TE and NIXL.

    python3 bench/peers.py --ns-a NS --ns-b NS --addr-a IP --addr-b IP --dev-a IF --dev-b IF
                           [--size BYTES] [--rounds N] [--arms LIST] [--out FILE]
                           [--bench PATH] [--peers-python PATH]

Standard library only.  bench/peers.sh makes the two namespaces (one veth pair) and calls this.  Every arm
moves the same SIZE bytes (bench_ucx_tcp's pattern) from a process in NS A into a process in NS B over the
veth, and the receiving side checks every byte.  Each round runs every arm once, the order rotating by
round; each arm starts a fresh pair of processes, and only the transfer itself is timed (inside the
receiving process).  One JSON record per run goes to FILE (and stdout); a table of medians follows.
"""

import argparse
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# refit-ucx-rndv (tcp_eager=0) was an arm of the records before 2026-12-07; the defaults (tcp_eager=auto) take
# rendezvous replies for a lone receiver since, and refit-ucx-eager keeps the earlier default (tcp_eager=1).
ALL_ARMS = ["tcp", "refit-ucx", "refit-ucx-eager", "refit-ucx-rndv", "mooncake-tcp", "nixl-ucx", "nixl-libfabric"]
DEFAULT_ARMS = ["tcp", "refit-ucx", "refit-ucx-eager", "mooncake-tcp", "nixl-ucx", "nixl-libfabric"]
TCP_PORT = "47131"


class Proc:
    def __init__(self, ns, argv, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", ns] + argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=e,
            text=True,
            bufsize=1,
        )

    def line(self, timeout):
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if sel.select(timeout=max(0.0, end - time.monotonic())):
                s = self.p.stdout.readline()
                if not s:
                    return None
                s = s.strip()
                if s:  # peers log to stdout at times; only our lines start with a capital word we know
                    if s.split()[0] in ("META", "DESC", "READY", "RESULT", "UCX", "TCP", "VERIFY"):
                        return s
            else:
                break
        return None

    def send(self, s):
        try:
            self.p.stdin.write(s)
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def finish(self, timeout=30):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        err = self.p.stderr.read() or ""
        return self.p.returncode, err.strip().splitlines()[-3:]


def arm_argv(arm, a, size):
    """(target argv, target env, reader argv from the target's first line, reader env, what it used)."""
    sz = str(size)
    py, side = a.peers_python, os.path.join(HERE, "peers_side.py")
    if arm == "tcp":
        return ([a.bench, "--tcp-send", TCP_PORT, sz, "1"], {},
                lambda first: [a.bench, "--tcp-recv", a.addr_a, TCP_PORT, sz, "1"], {},
                "one TCP socket, default kernel settings (build/bench_ucx_tcp --tcp-send/--tcp-recv)")
    if arm in ("refit-ucx", "refit-ucx-rndv", "refit-ucx-eager"):
        opts = {"refit-ucx-rndv": "tcp_eager=0", "refit-ucx-eager": "tcp_eager=1"}.get(arm, "")
        return ([a.bench, "--publish", sz, f"listen={a.addr_a}"], {},
                lambda first: [a.bench, "--pull", first.split()[1], sz, opts, "1", "0"], {},
                "refit's ucx transport: expose + pull of one region (build/bench_ucx_tcp --publish/--pull"
                + (f", --ucx-opts {opts})" if opts else ", defaults)"))
    if arm == "mooncake-tcp":
        return ([py, side, "mooncake-target", a.addr_a, sz], {},
                lambda first: [py, side, "mooncake-read", a.addr_b, sz] + first.split()[1:3], {},
                "Mooncake TransferEngine, protocol tcp, P2PHANDSHAKE; one transfer_sync_read of the whole buffer")
    if arm in ("nixl-ucx", "nixl-libfabric"):
        be = "UCX" if arm == "nixl-ucx" else "LIBFABRIC"
        # PEERS_NIXL_UCX_TLS: what UCX_TLS the NIXL arm gets (default tcp; empty: UCX's own choice, which
        # between two processes of one host is not the link).
        tls = os.environ.get("PEERS_NIXL_UCX_TLS", "tcp")
        ucx_a = {"UCX_TLS": tls, "UCX_NET_DEVICES": a.dev_a} if tls else {}
        ucx_b = {"UCX_TLS": tls, "UCX_NET_DEVICES": a.dev_b} if tls else {}
        env_a = ucx_a if be == "UCX" else {"FI_PROVIDER": "tcp"}
        env_b = ucx_b if be == "UCX" else {"FI_PROVIDER": "tcp"}
        what = (f"NIXL agent, backend {be}, "
                + (f"UCX_TLS={tls} on the veth" if tls else "UCX_TLS unset (UCX's choice)"
                   if be == "UCX" else "FI_PROVIDER=tcp")
                + "; one READ of the whole buffer, polled with check_xfer_state")
        return ([py, side, "nixl-target", a.addr_a, sz, be], env_a,
                lambda first: [py, side, "nixl-read", a.addr_b, sz, be] + first.split()[1:3], env_b, what)
    raise SystemExit(f"unknown arm {arm}")


def why_absent(arm, a):
    """A line saying why the arm cannot run here, or None."""
    if arm.startswith("tcp") or arm.startswith("refit"):
        if not os.access(a.bench, os.X_OK):
            return f"{a.bench} is not built (scripts/build.sh build)"
        return None
    if not a.peers_python or not os.access(a.peers_python, os.X_OK):
        return "no peers venv python (scripts/peers-venv.sh makes build/peers-venv)"
    mod = {"mooncake-tcp": "from mooncake.engine import TransferEngine",
           "nixl-ucx": "from nixl._api import nixl_agent",
           "nixl-libfabric": "from nixl._api import nixl_agent"}[arm]
    r = subprocess.run([a.peers_python, "-c", mod], capture_output=True, text=True)
    if r.returncode:
        return "import failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    if arm.startswith("nixl-"):
        be = "UCX" if arm == "nixl-ucx" else "LIBFABRIC"
        r = subprocess.run([a.peers_python, os.path.join(HERE, "peers_side.py"), "nixl-probe", "-", "0", be],
                           capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or ["probe gave no answer: " + r.stderr.strip()[-200:]])[-1]
        if last != "OK":
            return "NIXL " + last
    return None


def run_arm(arm, a, rnd, order):
    tgt, env_a, reader, env_b, _ = arm_argv(arm, a, a.size)
    rec = {"arm": arm, "round": rnd, "order": order, "bytes": a.size, "gbps": None, "verified": False}
    t = Proc(a.ns_a, tgt, env_a)
    r = None
    try:
        first = t.line(120)
        if not first:
            rec["error"] = "target did not start"
            return rec
        r = Proc(a.ns_b, reader(first), env_b)
        if r.line(180) != "READY":
            rec["error"] = "reader did not start"
            return rec
        rec["load1"] = float(open("/proc/loadavg").read().split()[0])
        rec["at"] = time.strftime("%H:%M:%S", time.gmtime())
        r.send("GO\n")
        res = r.line(600)
        if not res or len(res.split()) < 2:
            rec["error"] = "no result"
            return rec
        rec["gbps"] = float(res.split()[1])
        if res.startswith("UCX") and len(res.split()) > 2:
            rec["lanes"] = " ".join(res.split()[2:])
        rec["verified"] = r.line(120) == "VERIFY ok"
        return rec
    finally:
        for name, p in (("reader", r), ("target", t)):
            if p is None:
                continue
            rc, tail = p.finish()
            if rc and "error" in rec:
                rec[f"{name}_stderr"] = tail
            if rc and name == "reader" and "error" not in rec:
                rec["error"] = f"reader exit {rc}"
                rec[f"{name}_stderr"] = tail


def table(recs, arms):
    tcp = {x["round"]: x["gbps"] for x in recs if x["arm"] == "tcp" and x["gbps"] and x["verified"] and "error" not in x}
    rows = []
    for arm in arms:
        ok = [x for x in recs if x["arm"] == arm and x["gbps"] and x["verified"] and "error" not in x]
        if not ok:
            continue
        g = [x["gbps"] for x in ok]
        ratios = [x["gbps"] / tcp[x["round"]] for x in ok if x["round"] in tcp]
        rows.append((arm, len(ok), statistics.median(g), min(g), max(g),
                     statistics.median(ratios) if ratios else None,
                     (min(ratios), max(ratios)) if ratios else None))
    out = ["| arm | runs ok | GB/s median | GB/s range | / TCP by round, median | range |",
           "| --- | --- | --- | --- | --- | --- |"]
    for arm, n, med, lo, hi, rm, rr in rows:
        rs = f"{rm:.2f}" if rm is not None else "-"
        rrs = f"{rr[0]:.2f}-{rr[1]:.2f}" if rr else "-"
        out.append(f"| {arm} | {n} | {med:.2f} | {lo:.2f}-{hi:.2f} | {rs} | {rrs} |")
    return "\n".join(out)


def _interrupt(*_):
    raise KeyboardInterrupt


def main():
    # SIGTERM (bench/peers.sh's trap) unwinds like Ctrl-C: run_arm's finally ends the arm's processes.
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser()
    for k in ("ns-a", "ns-b", "addr-a", "addr-b", "dev-a", "dev-b"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    ap.add_argument("--out", default="")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench_ucx_tcp"))
    ap.add_argument("--peers-python", default=os.path.join(ROOT, "build", "peers-venv", "bin", "python"))
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    for x in arms:
        if x not in ALL_ARMS:
            raise SystemExit(f"unknown arm {x} (known: {', '.join(ALL_ARMS)})")
    live = []
    for arm in arms:
        why = why_absent(arm, a)
        if why:
            print(f"peers: skipping {arm}: {why}", flush=True)
        else:
            live.append(arm)
    out = open(a.out, "a") if a.out else None
    recs = []
    for rnd in range(1, a.rounds + 1):
        k = (rnd - 1) % max(1, len(live))
        for order, arm in enumerate(live[k:] + live[:k]):
            rec = run_arm(arm, a, rnd, order)
            recs.append(rec)
            line = json.dumps(rec)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
    print(f"\n{a.size} bytes, {a.rounds} rounds, between {a.ns_a} ({a.addr_a}) and {a.ns_b} ({a.addr_b}) "
          f"over one veth pair; every arm's order rotating by round\n")
    print(table(recs, live))
    print("\nwhat each arm used:")
    for arm in live:
        print(f"- {arm}: {arm_argv(arm, a, a.size)[4]}")
    bad = [x for x in recs if not x["verified"] or "error" in x]
    if bad:
        print(f"\n{len(bad)} run(s) failed or were not verified: "
              + "; ".join(f"{x['arm']} round {x['round']}: {x.get('error', 'bytes differ')}" for x in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("peers: interrupted", file=sys.stderr)
        sys.exit(130)
