#!/usr/bin/env bash
# What verification costs over the network: the demo's shape (qwen3-30b-a3b-mini, 8 Megatron EP8 publishers ->
# 2 vLLM TP2 receivers) between two network namespaces on a veth bridge (`refit-bench netns 2`, no tbf),
# UCX over TCP, with content digests off (--no-digest on both sides), hashed by the receiver in a pass of its
# own (REFIT_DIGEST_PASS=separate) and hashed while received (the default), interleaved: each round runs the
# three arms, in an order that rotates per round.  A receiver's cost of a version is its transfer_ms +
# digest_ms; per run the median over versions 2..V of the slower receiver; ratios are taken within a round.
#
#   bench/digest-ab-ucx.sh [ROUNDS] [OUT.json] [VERSIONS]   (defaults: 5, bench/results/digest-ab/<date>-ucx.json, 4)
#
# Needs root (ip netns) and build/refit, build/refit-bench built with UCX.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/digest-ab/$(date -u +%Y-%m-%d)-ucx.json}
versions=${3:-4}
refit=build/refit
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d /tmp/refit-digest-ab-XXXXXX)
pids=()
netns_release() { local fd=${NETNS[1]:-}; [ -z "$fd" ] || eval "exec $fd>&-"; }
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  netns_release
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
coproc NETNS { exec build/refit-bench netns 2; }
read -r -t 60 a addr_a va <&"${NETNS[0]}"
read -r -t 60 b addr_b vb <&"${NETNS[0]}"
read -r -t 60 ready <&"${NETNS[0]}"
[ "$ready" = READY ] || { echo "digest-ab-ucx: refit-bench netns failed" >&2; exit 1; }
echo "digest-ab-ucx: publishers in $a ($addr_a), receivers in $b ($addr_b)" >&2

run_arm() { # arm round -> $tmp/R-ARM.json (one JSON row per pull of either receiver)
  local arm=$1 r=$2 job="ab$2$1" extra=() envs=()
  case $arm in
    off) extra=(--no-digest) ;;
    separate) envs=(REFIT_DIGEST_PASS=separate) ;;
  esac
  local common=(--model qwen3-30b-a3b-mini --registry "file:$tmp/reg" --job "$job" --timeout-ms 120000)
  pids=()
  for k in 0 1 2 3 4 5 6 7; do
    ip netns exec "$a" "$refit" publish "${common[@]}" --layout megatron:ep=8 --rank $k --transports ucx \
      --transport-options ucx.listen="$addr_a" --versions "$versions" --acks 2 "${extra[@]}" >"$tmp/pub$k.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    ip netns exec "$b" env "${envs[@]}" "$refit" pull "${common[@]}" --layout vllm:tp=2 --rank $k --transports ucx \
      --versions "$versions" --json "${extra[@]}" >"$tmp/pull$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  [ $rc -eq 0 ] || { echo "digest-ab-ucx: $arm round $r failed:" >&2; tail -3 "$tmp"/*.log >&2; exit 1; }
  cat "$tmp/pull0.log" "$tmp/pull1.log" | grep '^{' >"$tmp/$r-$arm.json"
}

arms=(off separate fused)
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < 3; i++)); do
    arm=${arms[$(((i + r) % 3))]}
    echo "digest-ab-ucx: round $((r + 1))/$rounds, $arm" >&2
    run_arm "$arm" "$r"
  done
done
python3 - "$tmp" "$rounds" "$out" "$(uptime)" "$versions" <<'EOF'
import datetime, json, os, statistics, sys
d, rounds, out, load, versions = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def stat(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}
runs, cost, fused = {}, {}, {}
for r in range(rounds):
    for arm in ("off", "separate", "fused"):
        rows = [json.loads(l) for l in open(os.path.join(d, f"{r}-{arm}.json"))]
        rows = [x for x in rows if x.get("event") == "pulled"]
        runs[(r, arm)] = rows
        per_v = {}
        for x in rows:
            if x["version"] >= 2:
                per_v[x["version"]] = max(per_v.get(x["version"], 0), x["transfer_ms"] + x["digest_ms"])
        cost[(r, arm)] = statistics.median(per_v.values())
        fused[(r, arm)] = sum(1 for x in rows if x.get("digest_fused"))
res = {"date": datetime.datetime.utcnow().isoformat() + "Z", "rounds": rounds, "versions": versions,
       "load_at_end": load, "command": "bench/digest-ab-ucx.sh %d" % rounds,
       "net": "two network namespaces on a veth bridge, no tbf; UCX over TCP", "arms": {}, "ratios": {}, "runs": []}
for arm in ("off", "separate", "fused"):
    res["arms"][arm] = {"receiver_ms": stat([cost[(r, arm)] for r in range(rounds)]),
                        "fused_pulls": [fused[(r, arm)] for r in range(rounds)],
                        "unverified_bytes": [sum(x["unverified_bytes"] for x in runs[(r, arm)]) for r in range(rounds)],
                        "lanes": runs[(0, arm)][0]["lanes"]}
for arm in ("separate", "fused"):
    res["ratios"][arm + "_vs_off"] = stat([cost[(r, arm)] / cost[(r, "off")] for r in range(rounds)])
res["ratios"]["fused_vs_separate"] = stat([cost[(r, "fused")] / cost[(r, "separate")] for r in range(rounds)])
for (r, arm), rows in runs.items():
    res["runs"].append({"round": r, "arm": arm, "pulls": rows})
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("%-10s %14s %10s" % ("arm", "receiver_ms", "fused"))
for arm in ("off", "separate", "fused"):
    a = res["arms"][arm]
    print("%-10s %14.1f %10s" % (arm, a["receiver_ms"]["median"], a["fused_pulls"]))
for k, v in res["ratios"].items():
    print("%-22s median %.3f (range %.3f-%.3f)" % (k, v["median"], v["min"], v["max"]))
print("lanes:", res["arms"]["fused"]["lanes"])
print("written:", out)
EOF
