#!/usr/bin/env bash
# What verification costs: the demo's refit (8 Megatron EP8 publishers -> 2 vLLM TP2 receivers over shm,
# qwen3-30b-a3b-mini, 1.12 GB) run with content digests off (--no-digest), with the receiver hashing in a
# pass of its own after the copy (REFIT_DIGEST_PASS=separate, what every receiver did before the fused
# copy) and with the copies hashing what they write (the default), interleaved: each round runs the three
# arms one after the other, in an order that rotates per round.  A receiver's cost of a version is its
# steady transfer_ms + digest_ms (the check: fetch, compare, and in the separate arm the hashing pass);
# ratios are taken within a round (arm / off), then the median and range over rounds.  The publishers'
# table time (steady_publisher_digest_ms, the slowest of 8 publishers sharing this machine's cores) is
# reported as measured; its ratio to a memcpy of the shard is bench_digest_fused's (one thread, one rank).
#
#   bench/digest-ab.sh [ROUNDS] [OUT.json]     (defaults: 5, bench/results/digest-ab/<date>.json)
#   ARMS="off fused" bench/digest-ab.sh ...      (a subset of the arms; off and one other at least)
#
# Needs build/refit (scripts/build.sh).  Prints a table; the JSON holds every run's demo output.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/digest-ab/$(date -u +%Y-%m-%d).json}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -r -a arms <<<"${ARMS:-off separate fused}"
na=${#arms[@]}
[[ " ${arms[*]} " == *" off "* ]] && ((na >= 2)) ||
  { echo "digest-ab: ARMS needs off and one other arm at least (off, separate, fused), not '${arms[*]}'" >&2; exit 2; }
for arm in "${arms[@]}"; do
  case $arm in off | separate | fused) ;; *) echo "digest-ab: unknown arm $arm (off, separate, fused)" >&2; exit 2 ;; esac
done
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < na; i++)); do
    arm=${arms[$(((i + r) % na))]}
    case $arm in
      off) args=(--no-digest); envs=() ;;
      separate) args=(); envs=(REFIT_DIGEST_PASS=separate) ;;
      fused) args=(); envs=() ;;
    esac
    echo "digest-ab: round $((r + 1))/$rounds, $arm" >&2
    env "${envs[@]}" build/refit demo --json "${args[@]}" | tail -1 >"$tmp/$r-$arm.json"
  done
done
python3 - "$tmp" "$rounds" "$out" "$(uptime)" "${arms[*]}" <<'EOF'
import json, os, statistics, sys
d, rounds, out, load, arms = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].split()
runs = {}
for r in range(rounds):
    for arm in arms:
        with open(os.path.join(d, f"{r}-{arm}.json")) as f:
            runs[(r, arm)] = json.load(f)
def cost(j):
    return j["steady_transfer_ms"] + j["steady_digest_ms"]
def stat(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}
cmd = ("ARMS='%s' " % " ".join(arms) if arms != ["off", "separate", "fused"] else "") + "bench/digest-ab.sh %d" % rounds
res = {"date": __import__("datetime").datetime.utcnow().isoformat() + "Z", "rounds": rounds, "load_at_end": load,
       "command": cmd, "arms": {}, "ratios": {}, "runs": []}
for arm in arms:
    res["arms"][arm] = {
        "receiver_ms": stat([cost(runs[(r, arm)]) for r in range(rounds)]),
        "transfer_ms": stat([runs[(r, arm)]["steady_transfer_ms"] for r in range(rounds)]),
        "digest_ms": stat([runs[(r, arm)]["steady_digest_ms"] for r in range(rounds)]),
        "fused_receivers": [runs[(r, arm)].get("digest_fused_receivers", 0) for r in range(rounds)],
        "unverified_bytes": [runs[(r, arm)]["unverified_bytes_per_cycle"] for r in range(rounds)],
        "digest_bytes": [runs[(r, arm)]["digest_bytes_per_cycle"] for r in range(rounds)],
    }
on = [a for a in ("separate", "fused") if a in arms]
for arm in on:
    if "off" in arms:
        res["ratios"][arm + "_vs_off"] = stat([cost(runs[(r, arm)]) / cost(runs[(r, "off")]) for r in range(rounds)])
if len(on) == 2:
    res["ratios"]["fused_vs_separate"] = stat([cost(runs[(r, "fused")]) / cost(runs[(r, "separate")])
                                               for r in range(rounds)])
res["publisher_digest_ms"] = {arm: stat([runs[(r, arm)]["steady_publisher_digest_ms"] for r in range(rounds)])
                              for arm in on}
for r in range(rounds):
    for arm in arms:
        res["runs"].append({"round": r, "arm": arm, "demo": runs[(r, arm)]})
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("%-10s %14s %14s %12s %8s" % ("arm", "receiver_ms", "transfer_ms", "digest_ms", "fused"))
for arm in arms:
    a = res["arms"][arm]
    print("%-10s %14.1f %14.1f %12.1f %8s" % (arm, a["receiver_ms"]["median"], a["transfer_ms"]["median"],
                                             a["digest_ms"]["median"], a["fused_receivers"]))
for k, v in res["ratios"].items():
    print("%-28s median %.3f (range %.3f-%.3f)" % (k, v["median"], v["min"], v["max"]))
print("written:", out)
EOF
