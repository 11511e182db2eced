"""Reads the files of REFIT_FLEET_TRACE=DIR (docs/env.md) from one run of a fleet scenario and prints, per version:
every receiver (its relay slot, the holder it read, when its last chunk landed), and for a reader of a relay the
latency of each chunk behind that relay (the reader's `done` minus the relay's own `done` of the same chunk:
p10/p50/p90/max) split into the relay's answer (its UCX publisher's `post` of the reply after its own `done`), the
wire (the reader's `arrive` after that `post`: the relay's socket, TCP, the links) and the reader's copy and hash
(its `done` after `arrive`), how many chunks it asked for before the relay had them, and the stalls: gaps of more than
--stall-ms between two of a receiver's chunk completions.  A chain of relays whose links all run at one rate cannot
win back time a hop lost: a stall of one hop delays every hop after it to the end of the version.

    REFIT_FLEET_TRACE=/tmp/ft build/refit-bench --scenario elastic --runs 1 --out /tmp/el.json
    python3 bench/fleet_trace.py /tmp/ft [--stall-ms 60] [--json]

Relay slots name the readers' holders ("relay:S"); a receiver's own slot comes from its `start` line."""
import argparse
import collections
import glob
import json
import os
import statistics


# A relay's chunk flags follow its progress header (refit_progress_hdr_t, 8 words): a conditional
# request's flag_off (the "post" and "arrive" lines' f<N>) names chunk N - PROGRESS_HDR.
PROGRESS_HDR = 64


def load(d):
    slot, holder, start, end, cpu = {}, {}, {}, {}, {}
    done = collections.defaultdict(dict)
    claim = collections.defaultdict(dict)
    post = collections.defaultdict(dict)    # (v, relay pid) -> chunk -> when the relay answered it
    arrive = collections.defaultdict(dict)  # (v, reader pid) -> chunk -> when its reply was in the reader
    for f in glob.glob(os.path.join(d, "fleet-*.txt")):
        cur = None  # the version this process's receiver is on (a relay serves the one it receives)
        for line in open(f):
            p = line.split()
            if len(p) < 4:
                continue
            t, pid, ev = float(p[0]), int(p[1]), p[2]
            if ev in ("post", "arrive"):
                if cur is not None:
                    (post if ev == "post" else arrive)[(cur, pid)].setdefault(int(p[3][1:]) - PROGRESS_HDR, t)
                continue
            if ev == "sent":
                continue
            v = int(p[3][1:])
            if ev == "start":
                cur = v
                slot[pid] = int(p[5])
                holder[(v, pid)] = p[8].split("=", 1)[1]
                start[(v, pid)] = t
                cpu[(v, pid)] = [float(p[10]), None]
            elif ev == "end":
                end[(v, pid)] = t
                if (v, pid) in cpu:
                    cpu[(v, pid)][1] = float(p[7])
            elif ev in ("claim", "done"):
                (claim if ev == "claim" else done)[(v, pid)].setdefault(int(p[4][1:]), t)
    return slot, holder, start, end, cpu, done, claim, post, arrive


def pcts(xs):
    xs = sorted(xs)
    return {"p50": round(q(xs, .5), 1), "p90": round(q(xs, .9), 1), "max": round(q(xs, 1), 1)} if xs else None


def q(xs, f):
    return xs[int(f * (len(xs) - 1))] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--stall-ms", type=float, default=60)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    slot, holder, start, end, cpu, done, claim, post, arrive = load(a.dir)
    pid_of = {s: p for p, s in slot.items()}
    out = []
    for v in sorted({k[0] for k in done}):
        t0 = min(t for (vv, _), t in start.items() if vv == v)
        rows = []
        for pid in sorted({k[1] for k in done if k[0] == v}, key=lambda p: max(done[(v, p)].values())):
            ds = done[(v, pid)]
            ts = sorted(ds.values())
            gaps = [(b - x, x - t0) for x, b in zip(ts, ts[1:]) if (b - x) * 1e3 > a.stall_ms]
            c = cpu.get((v, pid))
            row = {"slot": slot.get(pid), "holder": holder.get((v, pid)), "chunks": len(ds),
                   "end_ms": round((ts[-1] - t0) * 1e3, 1),
                   "stalls": [{"ms": round(g * 1e3), "at_ms": round(at * 1e3)} for g, at in gaps],
                   "cpu_s": round(c[1] - c[0], 3) if c and c[1] is not None else None}
            h = row["holder"] or ""
            up = pid_of.get(int(h.split(":")[1])) if h.startswith("relay:") else None
            if up is not None and (v, up) in done:
                ud = done[(v, up)]
                lat = sorted((ds[k] - ud[k]) * 1e3 for k in ds if k in ud)
                cl = claim[(v, pid)]
                row["behind_relay_ms"] = {"p10": round(q(lat, .1), 1), "p50": round(q(lat, .5), 1),
                                          "p90": round(q(lat, .9), 1), "max": round(q(lat, 1), 1)}
                row["asked_ahead"] = sum(1 for k in ds if k in ud and k in cl and cl[k] < ud[k])
                # Where "behind" goes: the relay's answer after its own chunk landed, the reply's way to the
                # reader (the relay's socket, its TCP, the links), the reader's copy and hash.
                up_post, arr = post.get((v, up), {}), arrive.get((v, pid), {})
                row["relay_answer_ms"] = pcts((up_post[k] - ud[k]) * 1e3 for k in ds  # chunks asked ahead only
                                              if k in ud and k in up_post and k in cl and cl[k] < ud[k])
                row["wire_ms"] = pcts((arr[k] - up_post[k]) * 1e3 for k in ds if k in up_post and k in arr)
                row["reader_ms"] = pcts((ds[k] - arr[k]) * 1e3 for k in ds if k in arr)
            rows.append(row)
        out.append({"version": v, "receivers": rows})
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for r in out:
        n = sum(len(x["stalls"]) for x in r["receivers"])
        print(f"version {r['version']}: {n} stall(s) over {a.stall_ms:g} ms")
        for x in r["receivers"]:
            b = x.get("behind_relay_ms")
            line = f"  slot {x['slot']} <- {x['holder']:10} last chunk {x['end_ms']:8.1f} ms, cpu {x['cpu_s']} s"
            if b:
                line += (f", behind its relay p50 {b['p50']} p90 {b['p90']} max {b['max']} ms, "
                         f"{x['asked_ahead']}/{x['chunks']} asked ahead")
            parts = [f"{name} p50 {x[key]['p50']} max {x[key]['max']}" for key, name in
                     (("relay_answer_ms", "relay answers"), ("wire_ms", "wire"), ("reader_ms", "reader"))
                     if x.get(key)]
            if parts:
                line += " (" + ", ".join(parts) + " ms)"
            if x["stalls"]:
                line += ", stalls " + ", ".join(f"{s['ms']} ms at {s['at_ms']}" for s in x["stalls"])
            print(line)
    ends = {r["version"]: max(x["end_ms"] for x in r["receivers"]) for r in out}
    if ends:
        print("slowest receiver's last chunk per version (ms):",
              ", ".join(f"v{v} {e:.0f}" for v, e in sorted(ends.items())),
              f"(median {statistics.median(ends.values()):.0f})")


if __name__ == "__main__":
    main()
