#!/usr/bin/env bash
# What a delta publisher's digest table costs, in one run: `refit-bench --scenario delta --net shm --fraction F`
# (qwen3-30b-a3b-mini, 2 Megatron EP2 publishers in snapshot mode, F of the elements changing per version) in
# three arms, interleaved (the order rotates per round):
#   delta  digests on, the default: each table after the first is the one before plus the changes the delta
#          encoder noted in its own pass (docs/digest.md, "The publisher's table");
#   full   digests on with REFIT_DIGEST_TABLE=full: every table a pass over the shard;
#   off    --no-digest.
# Per run, the slowest publisher's publish_ms, encode_ms and digest_ms (median over versions 2..V), and a memcpy
# of a rank's bytes timed in the same process right after each publish (publisher_memcpy_ms).  A table's cost is
# publish_ms(arm) - publish_ms(off) of the same round: the notes inside the encoder's pass and the apply (or the
# fill) together; reported against the memcpy of the same round (the issue's yardstick: <= 0.5x).
#
#   bench/digest-table-ab.sh [ROUNDS] [OUT.json] [VERSIONS] [FRACTION]
#   (defaults: 5, bench/results/digest-table/<date>.json, 4, 0.01)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-bench/results/digest-table/$(date -u +%Y-%m-%d).json}
versions=${3:-4}
fraction=${4:-0.01}
bench=build/refit-bench
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d /tmp/refit-digest-table-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
load_start=$(uptime)
arms=(delta full off)
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < 3; i++)); do
    arm=${arms[$(((r + i) % 3))]}
    echo "digest-table-ab: round $((r + 1))/$rounds, $arm ($(date -u +%H:%M:%S))" >&2
    extra=()
    [ "$arm" = off ] && extra=(--no-digest)
    if [ "$arm" = full ]; then export REFIT_DIGEST_TABLE=full; else unset REFIT_DIGEST_TABLE; fi
    "$bench" --scenario delta --net shm --fraction "$fraction" --versions "$versions" --runs 1 "${extra[@]}" \
      --out "$tmp/$r-$arm.json" >/dev/null 2>"$tmp/err" ||
      { echo "digest-table-ab: $arm round $r failed:" >&2; tail -5 "$tmp/err" >&2; exit 1; }
  done
done
unset REFIT_DIGEST_TABLE
python3 - "$tmp" "$rounds" "$out" "$load_start" "$(uptime)" "$versions" "$fraction" <<'EOF'
import datetime, json, os, statistics, sys
d, rounds, out, load0, load1, versions, fraction = sys.argv[1:8]
rounds, versions = int(rounds), int(versions)
def stat(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
def load(r, arm):
    m = json.load(open(os.path.join(d, f"{r}-{arm}.json")))["metrics"]
    return {k: m[k] for k in ("publisher_publish_ms", "publisher_encode_ms", "publisher_digest_ms",
                              "publisher_memcpy_ms", "publisher_tables_from_delta", "delta_checked_ms",
                              "unverified_bytes")}
runs = {(r, a): load(r, a) for r in range(rounds) for a in ("delta", "full", "off")}
res = {"date": datetime.datetime.utcnow().isoformat() + "Z", "rounds": rounds, "versions": versions,
       "fraction": float(fraction), "load_at_start": load0, "load_at_end": load1,
       "command": "bench/digest-table-ab.sh %d %s %d %s" % (rounds, out, versions, fraction),
       "what": "refit-bench --scenario delta --net shm --fraction F --versions V: the slowest of 2 publishers "
               "(megatron:ep=2 of qwen3-30b-a3b-mini, snapshot mode), medians over versions 2..V; table cost = "
               "publish_ms(arm) - publish_ms(off) in the same round; memcpy = a memcpy of the rank's bytes in the "
               "publisher process after each publish", "arms": {}}
for a in ("delta", "full", "off"):
    res["arms"][a] = {k: stat([runs[(r, a)][k] for r in range(rounds)]) for k in runs[(0, a)]}
for a in ("delta", "full"):
    cost = [runs[(r, a)]["publisher_publish_ms"] - runs[(r, "off")]["publisher_publish_ms"] for r in range(rounds)]
    copy = [statistics.median(runs[(r, x)]["publisher_memcpy_ms"] for x in ("delta", "full", "off"))
            for r in range(rounds)]
    res["arms"][a]["table_cost_ms"] = stat(cost)
    res["arms"][a]["table_cost_vs_memcpy"] = stat([c / m for c, m in zip(cost, copy)])
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("%-6s %11s %11s %11s %11s %28s %7s" % ("arm", "publish_ms", "encode_ms", "digest_ms", "memcpy_ms",
                                              "table cost / memcpy (range)", "tables"))
for a, v in res["arms"].items():
    q = v.get("table_cost_vs_memcpy")
    print("%-6s %11.1f %11.1f %11.1f %11.1f %28s %7s" % (
        a, v["publisher_publish_ms"]["median"], v["publisher_encode_ms"]["median"],
        v["publisher_digest_ms"]["median"], v["publisher_memcpy_ms"]["median"],
        "%.3f (%.3f-%.3f)" % (q["median"], q["min"], q["max"]) if q else "-",
        "%d" % sum(v["publisher_tables_from_delta"]["rounds"])))
print("load:", load0.strip(), "->", load1.strip())
print("written:", out)
EOF
