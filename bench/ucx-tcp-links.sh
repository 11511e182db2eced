#!/usr/bin/env bash
# refit's UCX pull against one plain TCP socket on three links, in one run (issue 31's "done when"): the
# loopback of one network namespace, a veth pair between two namespaces, and the same veth pair shaped by tbf
# (MBPS MB/s both ways).  Each round runs build/bench_ucx_tcp once per link and arm, the order rotating by
# round; each bench_ucx_tcp run is REPS alternating pairs (a TCP stream, then refit's pull of the same bytes
# into one region), every pull's bytes checked.  Ratios are taken pair by pair (UCX GB/s / TCP GB/s of the same
# pair), then the median and range over every pair of every round.
#
#   bench/ucx-tcp-links.sh [ROUNDS] [OUT.json]
#     (defaults: 5 rounds, bench/results/ucx-tcp-links/<date>.json; root, for the namespaces)
#   env: REPS (pairs per run, 3), SIZE (bytes, 536870912), TBF_SIZE (bytes under tbf, 134217728),
#        MBPS (tbf rate, 50), ARMS ("auto": the defaults; add "eager" for --ucx-opts tcp_eager=1, the
#        default before 2026-12-07)
#
# Needs build/bench_ucx_tcp (scripts/build.sh).  Prints a table; the JSON holds every run.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/ucx-tcp-links/$(date -u +%Y-%m-%d).json}
reps=${REPS:-3} size=${SIZE:-536870912} tbf_size=${TBF_SIZE:-134217728} mbps=${MBPS:-50}
read -r -a arms <<<"${ARMS:-auto}"
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
links=(loopback veth tbf)
n=0
for ((r = 0; r < rounds; r++)); do
  jobs=()
  for l in "${links[@]}"; do for a in "${arms[@]}"; do jobs+=("$l:$a"); done; done
  for ((i = 0; i < ${#jobs[@]}; i++)); do
    job=${jobs[$(((i + r) % ${#jobs[@]}))]}
    link=${job%%:*} arm=${job#*:}
    args=(--reps "$reps" --size "$size")
    case $link in
      loopback) args+=(--loopback) ;;
      tbf) args=(--reps "$reps" --size "$tbf_size" --mbps "$mbps") ;;
    esac
    [ "$arm" = eager ] && args+=(--ucx-opts tcp_eager=1)
    echo "ucx-tcp-links: round $((r + 1))/$rounds, $link, $arm" >&2
    load=$(cut -d' ' -f1 /proc/loadavg)
    line=$(build/bench_ucx_tcp "${args[@]}" 2>"$tmp/err" | tail -1) || line=""
    [ -n "$line" ] || { echo "ucx-tcp-links: $link $arm failed: $(tail -3 "$tmp/err")" >&2; line=null; }
    echo "{\"round\":$r,\"link\":\"$link\",\"arm\":\"$arm\",\"load1\":$load,\"at\":\"$(date -u +%H:%M:%S)\",\"run\":$line}" >>"$tmp/runs.jsonl"
    n=$((n + 1))
  done
done
python3 - "$tmp/runs.jsonl" "$out" "$rounds" "$reps" "$size" "$tbf_size" "$mbps" "${ARMS:-auto}" <<'EOF'
import datetime, json, statistics, sys
path, out, rounds, reps, size, tbf_size, mbps, arms = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
def stat(v):
    return {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3), "n": len(v)} if v else None
res = {"date": datetime.datetime.utcnow().isoformat() + "Z", "command": f"REPS={reps} SIZE={size} TBF_SIZE={tbf_size} "
       f"MBPS={mbps} ARMS='{arms}' bench/ucx-tcp-links.sh {rounds}", "loads": [r["load1"] for r in runs],
       "summary": {}, "runs": runs}
print(f"{'link':9} {'arm':6} {'UCX/TCP median (range) over pairs':36} {'TCP GB/s':>9} {'UCX GB/s':>9} verified")
for key in sorted({(r["link"], r["arm"]) for r in runs}):
    rs = [r["run"] for r in runs if (r["link"], r["arm"]) == key]
    ok = [x for x in rs if x]
    pairs = [u / t for x in ok for t, u in zip(x["tcp_runs"], x["ucx_runs"]) if t > 0]
    s = {"ratio_pairs": stat(pairs), "tcp_gbps": stat([t for x in ok for t in x["tcp_runs"]]),
         "ucx_gbps": stat([u for x in ok for u in x["ucx_runs"]]), "failed_runs": len(rs) - len(ok),
         "verified": all(x["verified"] for x in ok) and len(ok) == len(rs),
         "lanes": sorted({x["lanes"] for x in ok})}
    res["summary"][f"{key[0]}/{key[1]}"] = s
    rp = s["ratio_pairs"]
    txt = f"{rp['median']:.3f} ({rp['min']:.3f}-{rp['max']:.3f}), {rp['n']} pairs" if rp else "no pairs"
    print(f"{key[0]:9} {key[1]:6} {txt:36} {s['tcp_gbps']['median'] if ok else 0:9.3f} "
          f"{s['ucx_gbps']['median'] if ok else 0:9.3f} {s['verified']}")
json.dump(res, open(out, "w"), indent=1)
print("wrote", out)
EOF
