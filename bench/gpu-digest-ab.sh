#!/usr/bin/env bash
# What verification costs on a GPU (device tool): `refit demo` over cuda_ipc with publishers and receivers on GPU 0
# (colocated; with two GPUs, receivers on GPU 1), qwen3-30b-a3b-mini, Megatron EP2 -> vLLM TP2, with content digests
# and with --no-digest, interleaved: each round runs every arm, in an order that rotates.  Arms (ARMS, default
# "on off"): on = digests, the default (the receivers' sums made by the copy kernel, compared on the GPU);
# sep = REFIT_DIGEST_GPU=separate (compared on the GPU, the sums a pass of their own); host =
# REFIT_DIGEST_GPU=host (the entries pulled to the host and compared there, the sums a pass of their own: the
# check before 2026-12-02's second change); off = --no-digest.  A receiver's cost of a version is the demo's
# steady transfer_ms + digest_ms; ratios to `off` within a round, then median and range.  Every check's phases
# (REFIT_DIGEST_TRACE) are summarised per arm.  Output: $OUT/summary.json only (the runs inside it).
# Usage: OUT=$OUT [ARMS="on sep host off"] bench/gpu-digest-ab.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
rounds=${1:-5}
out=${OUT:-build-gpu/digest-ab}
arms=(${ARMS:-on off})
runs=build-gpu/digest-ab-runs
mkdir -p "$out" "$runs"
rm -f "$runs"/*
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF >/tmp/refit-gpu-cmake.log 2>&1
ninja -C build-gpu refit >/tmp/refit-gpu-ninja.log 2>&1 || { tail -20 /tmp/refit-gpu-ninja.log; exit 1; }
n=$(build-gpu/refit gpus | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
dst=0; [ "$n" -gt 1 ] && dst=1
na=${#arms[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < na; i++)); do
    arm=${arms[$(((i + r) % na))]}
    extra=(); envs=(REFIT_DIGEST_TRACE=$PWD/$runs/$r-$arm.trace)
    case $arm in
      off) extra=(--no-digest) ;;
      sep) envs+=(REFIT_DIGEST_GPU=separate) ;;
      host) envs+=(REFIT_DIGEST_GPU=host) ;;
    esac
    env "${envs[@]}" build-gpu/refit demo --json --model qwen3-30b-a3b-mini --src megatron:ep=2 --dst vllm:tp=2 \
      --transport cuda_ipc --src-device 0 --dst-device $dst --cycles ${CYCLES:-5} --timeout-s 300 "${extra[@]}" \
      >"$runs/$r-$arm.out" 2>"$runs/$r-$arm.err" ||
      { echo "round $r arm $arm failed:"; tail -5 "$runs/$r-$arm.err"; }
    tail -1 "$runs/$r-$arm.out" | grep '^{' >"$runs/$r-$arm.json" || rm -f "$runs/$r-$arm.json"
  done
done
python3 - "$runs" "$out" "$rounds" "$dst" "${arms[*]}" <<'PY'
import json, os, statistics, sys
d, o, rounds, dst, arms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
def stat(v): return {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
runs = {(r, a): json.load(open(f"{d}/{r}-{a}.json")) for r in range(rounds) for a in arms
        if os.path.exists(f"{d}/{r}-{a}.json")}
failed = sorted(f"{r}-{a}" for r in range(rounds) for a in arms if (r, a) not in runs)
ok_rounds = [r for r in range(rounds) if all((r, a) in runs for a in arms)]
cost = lambda j: j["steady_transfer_ms"] + j["steady_digest_ms"]
res = {"rounds": rounds, "complete_rounds": ok_rounds, "failed_runs": failed, "dst_device": dst, "arms": arms,
       "command": "OUT=$OUT ARMS=\"%s\" bench/gpu-digest-ab.sh %d" % (" ".join(arms), rounds), "per_arm": {}}
for a in arms:
    R = ok_rounds
    e = {"cost_ms": stat([cost(runs[(r, a)]) for r in R]),
         "transfer_ms": stat([runs[(r, a)]["steady_transfer_ms"] for r in R]),
         "digest_ms": stat([runs[(r, a)]["steady_digest_ms"] for r in R]),
         "span_ms": stat([runs[(r, a)]["steady_span_ms"] for r in R]),
         "first_refit_transfer_ms": stat([runs[(r, a)]["per_cycle"][0]["transfer_ms"] for r in R]),
         "unverified_bytes": [runs[(r, a)]["unverified_bytes_per_cycle"] for r in R],
         "digest_bytes": [runs[(r, a)]["digest_bytes_per_cycle"] for r in R],
         "digest_fused_receivers": [runs[(r, a)]["digest_fused_receivers"] for r in R],
         "publisher_digest_ms": stat([runs[(r, a)]["steady_publisher_digest_ms"] for r in R])}
    if "off" in arms and a != "off":
        e["ratio_vs_off"] = stat([cost(runs[(r, a)]) / cost(runs[(r, "off")]) for r in R])
        e["span_ratio_vs_off"] = stat([runs[(r, a)]["steady_span_ms"] / runs[(r, "off")]["steady_span_ms"]
                                       for r in R])
    # the checks' phases, versions >= 2 (steady), every receiver
    ph = {}
    hows = {}
    for r in R:
        p = f"{d}/{r}-{a}.trace"
        if not os.path.exists(p): continue
        for line in open(p):
            w = line.split()
            kv = {w[i]: w[i + 1] for i in range(1, len(w) - 1, 2) if w[i] in
                  ("version", "how", "entries", "plan", "fetch", "sums", "compare", "total", "status")}
            if int(kv.get("version", 0)) < 2: continue
            hows[kv["how"]] = hows.get(kv["how"], 0) + 1
            for k in ("plan", "fetch", "sums", "compare", "total"):
                ph.setdefault(k, []).append(float(kv[k]))
            e["entries"] = int(kv["entries"])
    e["check_phases_ms"] = {k: stat(v) for k, v in ph.items()}
    e["check_how"] = hows
    res["per_arm"][a] = e
res["failed_stderr"] = {n: open(f"{d}/{n}.err").read()[-3000:] for n in failed if os.path.exists(f"{d}/{n}.err")}
res["runs"] = {f"{r}-{a}": runs[(r, a)] for (r, a) in runs}
json.dump(res, open(f"{o}/summary.json", "w"), indent=1)
print("failed runs:", failed, "complete rounds:", ok_rounds)
for a in arms:
    e = res["per_arm"][a]
    print(a, "cost", e["cost_ms"], "transfer", e["transfer_ms"], "digest", e["digest_ms"],
          "ratio", e.get("ratio_vs_off"), "how", e["check_how"])
    print("   phases", {k: round(v["median"], 3) for k, v in e["check_phases_ms"].items()},
          "unverified", e["unverified_bytes"], "checked", e["digest_bytes"])
PY
