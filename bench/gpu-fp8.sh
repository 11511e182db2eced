#!/usr/bin/env bash
# FP8 quantize-on-copy on the GPU: build, the GPU FP8 tests (WITH_TEST_GPU=1:
# test_gpu too), the kernel-level comparison on a real model (the bf16 batch
# kernel and the FP8 kernel on the same shards, medians; colocated, and
# across GPUs when two are present; FP8_BENCH_KERNELS="3 4" times other FP8
# kernels in the same run), then the engine: refit demo with bf16 receivers
# and FP8 receivers (--fp8), CYCLES versions each, colocated on GPU 0 and,
# with two GPUs, GPU 0 -> GPU 1 for each of $CROSS_EXEC (where the kernel
# runs: cuda_ipc.exec); gpu-h200-fp8.json gathers all; everything into $OUT.
#   OUT=... MODEL=qwen3-30b-a3b SRC=megatron:ep=2 DST=vllm:tp=2 ITERS=5 CYCLES=4 CROSS_EXEC="dst alt src" bench/gpu-fp8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-bench/results/gpu-fp8-run}
mkdir -p "$out"
{ date -u; nvidia-smi; nvcc --version | tail -2; } > "$out/env.txt" 2>&1
grep -E "Driver Version|H200|release" "$out/env.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
timeout 400 ninja -C build-gpu refit test_gpu_fp8 ${WITH_TEST_GPU:+test_gpu} > "$out/ninja.txt" 2>&1; grep -E "FAILED|error" -A4 "$out/ninja.txt" | head -30
echo "build: $(( $(date +%s) - t0 )) s"
[ -x build-gpu/tests/test_gpu_fp8 ] || exit 1
timeout 300 build-gpu/tests/test_gpu_fp8 > "$out/test_gpu_fp8.txt" 2>&1; echo "test_gpu_fp8 exit: $?"; tail -15 "$out/test_gpu_fp8.txt"
if [ -n "${WITH_TEST_GPU:-}" ]; then timeout 300 build-gpu/tests/test_gpu > "$out/test_gpu.txt" 2>&1; echo "test_gpu exit: $?"; tail -4 "$out/test_gpu.txt"; fi
[ -n "${NOBENCH:-}" ] && exit 0
timeout 400 build-gpu/tests/test_gpu_fp8 --bench "${MODEL:-qwen3-30b-a3b}" "${SRC:-megatron:ep=2}" "${DST:-vllm:tp=2}" \
  "${ITERS:-5}" "$out/kernel.json" 2>&1 | tee "$out/bench.txt"; echo "bench exit: ${PIPESTATUS[0]}"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
demo() {  # name src-device dst-device [options]
  local name=$1 sd=$2 dd=$3; shift 3
  timeout 300 build-gpu/refit demo --json --model "${MODEL:-qwen3-30b-a3b}" --src "${SRC:-megatron:ep=2}" \
    --dst "${DST:-vllm:tp=2}" --transport cuda_ipc --src-device $sd --dst-device $dd --cycles "${CYCLES:-4}" --prepare \
    "$@" > "$out/demo-$name.json" 2> "$out/demo-$name.err"; echo "demo $name exit: $?"
}
demo bf16 0 0; demo fp8 0 0 --fp8
cross=
if [ "$ngpu" -ge 2 ]; then
  for ex in ${CROSS_EXEC:-dst alt src}; do
    demo cross-$ex-bf16 0 1 --transport-options cuda_ipc.exec=$ex
    demo cross-$ex-fp8 0 1 --fp8 --transport-options cuda_ipc.exec=$ex
    cross="$cross $ex"
  done
fi
python3 - "$out" $cross <<'PY'
import json, sys, os
out, cross = sys.argv[1], sys.argv[2:]
k = json.load(open(os.path.join(out, "kernel.json")))
def load(name): return json.load(open(os.path.join(out, "demo-%s.json" % name)))
def engine(b, f):
    return {"bf16_refit_s": b["steady_span_ms"] / 1e3, "fp8_refit_s": f["steady_span_ms"] / 1e3,
            "fp8_vs_bf16": f["steady_span_ms"] / b["steady_span_ms"], "bf16_verified": b["verified"],
            "fp8_verified": f["verified"], "cycles": f["cycles"], "fp8_lanes": f["lanes"],
            "bf16_lanes": b["lanes"], "bf16_per_cycle": b["per_cycle"], "fp8_per_cycle": f["per_cycle"]}
b, f = load("bf16"), load("fp8")
rec = {"model": k["model"], "src": k["src"], "dst": k["dst"], "placement": "colocated (GPU 0)",
       "engine": engine(b, f), "kernel": k["cases"], "bit_exact": k["verified"]}
ok = k["verified"] and b["verified"] and f["verified"]
print("colocated: bf16 %.2f ms, fp8 %.2f ms, fp8_vs_bf16 %.3f, verified %s %s" % (b["steady_span_ms"], f["steady_span_ms"], rec["engine"]["fp8_vs_bf16"], b["verified"], f["verified"]))
if cross:
    c = {"placement": "GPU 0 -> GPU 1 (sources on GPU 0, receivers on GPU 1)"}
    for ex in cross:
        cb, cf = load("cross-%s-bf16" % ex), load("cross-%s-fp8" % ex)
        c["exec_" + ex] = engine(cb, cf)
        ok = ok and cb["verified"] and cf["verified"]
        print("cross-GPU exec=%s: bf16 %.2f ms, fp8 %.2f ms, fp8_vs_bf16 %.3f, verified %s %s" % (ex, cb["steady_span_ms"], cf["steady_span_ms"], c["exec_" + ex]["fp8_vs_bf16"], cb["verified"], cf["verified"]))
    bb = min(c["exec_" + ex]["bf16_refit_s"] for ex in cross)
    bf = min(c["exec_" + ex]["fp8_refit_s"] for ex in cross)
    c["best_bf16_refit_s"], c["best_fp8_refit_s"], c["fp8_vs_bf16"] = bb, bf, bf / bb
    print("cross-GPU, fastest of each: bf16 %.2f ms, fp8 %.2f ms, fp8_vs_bf16 %.3f" % (bb * 1e3, bf * 1e3, bf / bb))
    rec["cross_gpu"] = c
    rec["fp8_vs_bf16_cross_gpu"] = c["fp8_vs_bf16"]
rec["verified"] = ok
rec["fp8_vs_bf16"] = rec["engine"]["fp8_vs_bf16"]
json.dump(rec, open(os.path.join(out, "gpu-h200-fp8.json"), "w"), indent=1)
PY
