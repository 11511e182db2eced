#!/usr/bin/env bash
# What verification costs beyond shm, in one run: interleaved digests-on / --no-digest pairs on three paths.
#   ucx    the demo's shape (qwen3-30b-a3b-mini, 8 Megatron EP8 publishers -> 2 vLLM TP2 receivers) between two
#          network namespaces on a veth bridge (`refit-bench netns 2`, no tbf), UCX over TCP, VERSIONS versions;
#          a run's cost: the median over versions 2..V of the slower receiver's transfer_ms + digest_ms.
#   relays `refit-bench --scenario fanout --net shm --receivers 8 --dst vllm:tp=4` (relays with fan-out 8, reader
#          limit 2: the receivers read each other's chunks, host_fleet); a run's cost: checked_all_receivers_s, the
#          steady version's span from the first pull's start to the end of the last receiver's digest check.
#   delta  `refit-bench --scenario delta --net shm --fraction 0.01` (1% of the elements change per version, a full
#          and a delta receiver); a run's cost: delta_checked_ms, the delta receiver's median over versions 2..V
#          of its transfer + digest check.
# Digests on is the default (hashing while copying: fused); off is --no-digest on publishers and receivers.  Each
# round runs, per path, the two arms one after the other in an order that alternates per round; ratios are taken
# within a round (on / off), then the median and range over rounds.
#
#   [PATHS="ucx relays delta"] bench/digest-ab-paths.sh [ROUNDS] [OUT.json] [VERSIONS]
#   (defaults: every path, 5, bench/results/digest-ab/<date>-paths.json, 4)
#
# Needs root (ip netns) and build/refit, build/refit-bench built with UCX (the fleet scenarios' build-tree binary).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/digest-ab/$(date -u +%Y-%m-%d)-paths.json}
versions=${3:-4}
refit=build/refit
bench=build/refit-bench
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d /tmp/refit-digest-paths-XXXXXX)
pids=()
netns_release() { local fd=${NETNS[1]:-}; [ -z "$fd" ] || eval "exec $fd>&-"; }
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  netns_release
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
paths=${PATHS:-ucx relays delta} # PATHS="delta": only those paths
for p in $paths; do
  case $p in ucx | relays | delta) ;; *) echo "digest-ab-paths: unknown path '$p' in PATHS (ucx, relays, delta)" >&2; exit 2 ;; esac
done
load_start=$(uptime)
coproc NETNS { exec build/refit-bench netns 2; }
read -r -t 60 a addr_a va <&"${NETNS[0]}"
read -r -t 60 b addr_b vb <&"${NETNS[0]}"
read -r -t 60 ready <&"${NETNS[0]}"
[ "$ready" = READY ] || { echo "digest-ab-paths: refit-bench netns failed" >&2; exit 1; }
echo "digest-ab-paths: ucx publishers in $a ($addr_a), receivers in $b ($addr_b)" >&2

run_ucx() { # arm round -> $tmp/ucx-R-ARM.json (one JSON row per pull of either receiver)
  local arm=$1 r=$2 job="abp$2$1" extra=()
  [ "$arm" = off ] && extra=(--no-digest)
  local common=(--model qwen3-30b-a3b-mini --registry "file:$tmp/reg" --job "$job" --timeout-ms 120000)
  pids=()
  for k in 0 1 2 3 4 5 6 7; do
    ip netns exec "$a" "$refit" publish "${common[@]}" --layout megatron:ep=8 --rank $k --transports ucx \
      --transport-options ucx.listen="$addr_a" --versions "$versions" --acks 2 "${extra[@]}" >"$tmp/pub$k.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    ip netns exec "$b" "$refit" pull "${common[@]}" --layout vllm:tp=2 --rank $k --transports ucx \
      --versions "$versions" --json "${extra[@]}" >"$tmp/pull$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  [ $rc -eq 0 ] || { echo "digest-ab-paths: ucx $arm round $r failed:" >&2; tail -3 "$tmp"/*.log >&2; exit 1; }
  cat "$tmp/pull0.log" "$tmp/pull1.log" | grep '^{' >"$tmp/ucx-$r-$arm.json"
}

run_relays() { # arm round -> $tmp/relays-R-ARM.json (refit-bench's record)
  local arm=$1 r=$2 extra=()
  [ "$arm" = off ] && extra=(--no-digest)
  "$bench" --scenario fanout --net shm --receivers 8 --dst vllm:tp=4 --runs 1 "${extra[@]}" \
    --out "$tmp/relays-$r-$arm.json" >/dev/null 2>"$tmp/relays.err" ||
    { echo "digest-ab-paths: relays $arm round $r failed:" >&2; tail -5 "$tmp/relays.err" >&2; exit 1; }
}

run_delta() { # arm round -> $tmp/delta-R-ARM.json
  local arm=$1 r=$2 extra=()
  [ "$arm" = off ] && extra=(--no-digest)
  "$bench" --scenario delta --net shm --fraction 0.01 --versions "$versions" --runs 1 "${extra[@]}" \
    --out "$tmp/delta-$r-$arm.json" >/dev/null 2>"$tmp/delta.err" ||
    { echo "digest-ab-paths: delta $arm round $r failed:" >&2; tail -5 "$tmp/delta.err" >&2; exit 1; }
}

for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order=(on off); else order=(off on); fi
  for path in $paths; do
    for arm in "${order[@]}"; do
      echo "digest-ab-paths: round $((r + 1))/$rounds, $path, digests $arm ($(date -u +%H:%M:%S))" >&2
      "run_$path" "$arm" "$r"
    done
  done
done
PATHS="$paths" python3 - "$tmp" "$rounds" "$out" "$load_start" "$(uptime)" "$versions" <<'EOF'
import datetime, json, os, statistics, sys
d, rounds, out, load0, load1, versions = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
def stat(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
def ucx(r, arm):
    rows = [json.loads(l) for l in open(os.path.join(d, f"ucx-{r}-{arm}.json"))]
    rows = [x for x in rows if x.get("event") == "pulled"]
    per_v = {}
    for x in rows:
        if x["version"] >= 2:
            per_v[x["version"]] = max(per_v.get(x["version"], 0), x["transfer_ms"] + x["digest_ms"])
    return {"cost_ms": statistics.median(per_v.values()),
            "digest_ms": statistics.median(x["digest_ms"] for x in rows if x["version"] >= 2),
            "fused": sum(1 for x in rows if x.get("digest_fused")), "pulls": len(rows),
            "unverified_bytes": sum(x["unverified_bytes"] for x in rows), "rows": rows}
def relays(r, arm):
    j = json.load(open(os.path.join(d, f"relays-{r}-{arm}.json")))
    m = j["metrics"]
    return {"cost_ms": m["checked_all_receivers_s"] * 1e3, "transfer_span_ms": m["all_receivers_s"] * 1e3,
            "digest_ms": m["digest_ms_max"], "fused": m["digest_fused_receivers"], "pulls": len(m["receivers"]),
            "unverified_bytes": m["unverified_bytes"], "record": j}
def delta(r, arm):
    j = json.load(open(os.path.join(d, f"delta-{r}-{arm}.json")))
    m = j["metrics"]
    return {"cost_ms": m["delta_checked_ms"], "transfer_ms": m["delta_refit_ms"], "digest_ms": m["delta_digest_ms"],
            "full_cost_ms": m["full_checked_ms"], "fused": m["delta_digest_fused_pulls"], "pulls": versions - 1,
            "unverified_bytes": m["unverified_bytes"], "record": j}
paths = {p: {"ucx": ucx, "relays": relays, "delta": delta}[p] for p in os.environ["PATHS"].split()}
what = {"ucx": "8 megatron:ep=8 publishers -> 2 vllm:tp=2 receivers, UCX/TCP between two network namespaces (veth, "
               "no tbf); cost = median over versions 2..V of the slower receiver's transfer_ms + digest_ms",
        "relays": "refit-bench fanout --net shm --receivers 8 --dst vllm:tp=4 (relays, reader limit 2); cost = "
                  "steady version's span to the end of the last receiver's digest check",
        "delta": "refit-bench delta --net shm --fraction 0.01; cost = the delta receiver's median over versions 2..V "
                 "of transfer + digest check"}
res = {"date": datetime.datetime.utcnow().isoformat() + "Z", "rounds": rounds, "versions": versions,
       "load_at_start": load0, "load_at_end": load1,
       "command": "PATHS='%s' bench/digest-ab-paths.sh %d %s %d" % (os.environ["PATHS"], rounds, out, versions),
       "paths": {}}
for p, f in paths.items():
    runs = {(r, arm): f(r, arm) for r in range(rounds) for arm in ("on", "off")}
    ratios = [runs[(r, "on")]["cost_ms"] / runs[(r, "off")]["cost_ms"] for r in range(rounds)]
    res["paths"][p] = {
        "what": what[p],
        "on_ms": stat([runs[(r, "on")]["cost_ms"] for r in range(rounds)]),
        "off_ms": stat([runs[(r, "off")]["cost_ms"] for r in range(rounds)]),
        "on_digest_ms": stat([runs[(r, "on")]["digest_ms"] for r in range(rounds)]),
        "ratio_on_vs_off": stat(ratios),
        "fused_pulls_on": [runs[(r, "on")]["fused"] for r in range(rounds)],
        "pulls_on": [runs[(r, "on")]["pulls"] for r in range(rounds)],
        "unverified_bytes_on": [runs[(r, "on")]["unverified_bytes"] for r in range(rounds)],
        "runs": [{"round": r, "arm": arm, **runs[(r, arm)]} for r in range(rounds) for arm in ("on", "off")],
    }
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("%-7s %12s %12s %10s %24s %12s" % ("path", "on_ms", "off_ms", "check_ms", "on/off median (range)", "fused"))
for p, v in res["paths"].items():
    q = v["ratio_on_vs_off"]
    print("%-7s %12.1f %12.1f %10.1f %10.3f (%.3f-%.3f) %12s" % (
        p, v["on_ms"]["median"], v["off_ms"]["median"], v["on_digest_ms"]["median"], q["median"], q["min"], q["max"],
        "%s/%s" % (sum(v["fused_pulls_on"]), sum(v["pulls_on"]))))
print("load:", load0.strip(), "->", load1.strip())
print("written:", out)
EOF
