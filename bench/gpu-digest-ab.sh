#!/usr/bin/env bash
# What verification costs on a GPU (device tool): `refit demo` over cuda_ipc with publishers and receivers on GPU 0
# (colocated; with two GPUs, receivers on GPU 1), qwen3-30b-a3b-mini, Megatron EP2 -> vLLM TP2, with content digests
# (GPU publishers' tables at publish, receivers' sums by the GPU kernels) and with --no-digest, interleaved: each
# round runs both, in an order that alternates.  A receiver's cost of a version is the demo's steady transfer_ms +
# digest_ms; ratios within a round, then median and range.  Usage: OUT=$OUT bench/gpu-digest-ab.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
rounds=${1:-5}
out=${OUT:-build-gpu/digest-ab}
mkdir -p "$out"
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF >/tmp/refit-gpu-cmake.log 2>&1
ninja -C build-gpu refit >/tmp/refit-gpu-ninja.log 2>&1 || { tail -20 /tmp/refit-gpu-ninja.log; exit 1; }
n=$(build-gpu/refit gpus | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
dst=0; [ "$n" -gt 1 ] && dst=1
for ((r = 0; r < rounds; r++)); do
  for arm in on off; do
    [ $((r % 2)) = 1 ] && arm=$([ $arm = on ] && echo off || echo on)
    extra=(); [ $arm = off ] && extra=(--no-digest)
    build-gpu/refit demo --json --model qwen3-30b-a3b-mini --src megatron:ep=2 --dst vllm:tp=2 --transport cuda_ipc \
      --src-device 0 --dst-device $dst --cycles 5 --timeout-s 300 "${extra[@]}" | tail -1 >"$out/$r-$arm.json"
  done
done
python3 - "$out" "$rounds" "$dst" <<'PY'
import json, statistics, sys
d, rounds, dst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def stat(v): return {"median": statistics.median(v), "min": min(v), "max": max(v)}
runs = {(r, a): json.load(open(f"{d}/{r}-{a}.json")) for r in range(rounds) for a in ("on", "off")}
cost = lambda j: j["steady_transfer_ms"] + j["steady_digest_ms"]
res = {"rounds": rounds, "dst_device": dst, "command": "OUT=$OUT bench/gpu-digest-ab.sh %d" % rounds,
       "on_ms": stat([cost(runs[(r, "on")]) for r in range(rounds)]),
       "off_ms": stat([cost(runs[(r, "off")]) for r in range(rounds)]),
       "on_digest_ms": stat([runs[(r, "on")]["steady_digest_ms"] for r in range(rounds)]),
       "on_span_ms": stat([runs[(r, "on")]["steady_span_ms"] for r in range(rounds)]),
       "off_span_ms": stat([runs[(r, "off")]["steady_span_ms"] for r in range(rounds)]),
       "ratio_on_vs_off": stat([cost(runs[(r, "on")]) / cost(runs[(r, "off")]) for r in range(rounds)]),
       "span_ratio_on_vs_off": stat([runs[(r, "on")]["steady_span_ms"] / runs[(r, "off")]["steady_span_ms"]
                                     for r in range(rounds)]),
       "on_unverified_bytes": [runs[(r, "on")]["unverified_bytes_per_cycle"] for r in range(rounds)],
       "on_digest_bytes": [runs[(r, "on")]["digest_bytes_per_cycle"] for r in range(rounds)],
       "publisher_digest_ms_on": stat([runs[(r, "on")]["steady_publisher_digest_ms"] for r in range(rounds)]),
       "runs": {f"{r}-{a}": runs[(r, a)] for (r, a) in runs}}
json.dump(res, open(f"{d}/summary.json", "w"), indent=1)
for k in ("on_ms", "off_ms", "on_digest_ms", "ratio_on_vs_off", "span_ratio_on_vs_off", "publisher_digest_ms_on"):
    print(k, res[k])
print("unverified (on):", res["on_unverified_bytes"], "checked (on):", res["on_digest_bytes"])
PY
