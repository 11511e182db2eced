"""Summarises the interleaved elastic runs of this directory (elastic-cubic-N.json, elastic-host-N.json: the
namespaces' TCP congestion control cubic, or the host's, bbr on this VM): per arm, the slowest steady receiver's
transfer per version (mean over runs, ms), each later version against version 2, the joiner and control figures.
    python3 summary.py [--json]"""
import glob, json, os, statistics as st, sys

here = os.path.dirname(os.path.abspath(__file__))


def per_version(d):
    m = d["metrics"]
    out = {}
    for k, v in m.items():
        if (isinstance(v, list) and v and isinstance(v[0], dict) and "transfer_ms" in v[0] and "killed" not in k
                and k != "v1_warmup"):  # the fleet's 4 receivers (a joiner's result comes after them)
            out[k] = max(r["transfer_ms"] for r in v[:4] if r.get("ok", True))
    return out


res = {}
for arm in ("cubic", "host"):
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(here, f"elastic-{arm}-*.json")))]
    if not runs:
        continue
    keys = [k for k in per_version(runs[0])]
    pv = {k: [per_version(r)[k] for r in runs] for k in keys}
    mean = {k: round(st.mean(v), 1) for k, v in pv.items()}
    base = mean.get("v2_warmup")
    res[arm] = {
        "tcp_cc": runs[0]["config"]["tcp_cc"], "runs": len(runs),
        "slowest_steady_ms_mean": mean,
        "per_run": pv,
        "later_vs_v2": {k: round(v / base - 1, 4) for k, v in mean.items() if base and k != "v2_warmup"},
        "joiner_slowdown_median": st.median(r["metrics"]["worst_slowdown_of_others_by_joiner"] for r in runs),
        "control_slowdown_median": st.median(r["metrics"]["worst_slowdown_without_joiner"] for r in runs),
    }
if "--json" in sys.argv:
    print(json.dumps(res, indent=1))
else:
    for arm, r in res.items():
        print(f"{arm} ({r['tcp_cc']}, {r['runs']} runs): " + ", ".join(f"{k} {v:.0f}" for k, v in r["slowest_steady_ms_mean"].items()))
        print("   vs v2: " + ", ".join(f"{k} {v:+.1%}" for k, v in r["later_vs_v2"].items()) +
              f"; joiner {r['joiner_slowdown_median']:+.2%}, control {r['control_slowdown_median']:+.2%} (medians)")
