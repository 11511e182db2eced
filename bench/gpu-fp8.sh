#!/usr/bin/env bash
# FP8 quantize-on-copy on the GPU: build, the GPU FP8 tests (WITH_TEST_GPU=1:
# test_gpu too), the kernel-level comparison on a real model (the bf16 batch
# kernel and the FP8 kernel on the same shards, medians), then the engine:
# refit demo colocated on GPU 0, bf16 receivers and FP8 receivers (--fp8),
# CYCLES versions each; gpu-h200-fp8.json gathers both; everything into $OUT.
#   OUT=... MODEL=qwen3-30b-a3b SRC=megatron:ep=2 DST=vllm:tp=2 ITERS=5 CYCLES=4 bench/gpu-fp8.sh
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
for mode in bf16 fp8; do
  timeout 300 build-gpu/refit demo --json --model "${MODEL:-qwen3-30b-a3b}" --src "${SRC:-megatron:ep=2}" \
    --dst "${DST:-vllm:tp=2}" --transport cuda_ipc --src-device 0 --dst-device 0 --cycles "${CYCLES:-4}" --prepare \
    $([ $mode = fp8 ] && echo --fp8) > "$out/demo-$mode.json" 2> "$out/demo-$mode.err"; echo "demo $mode exit: $?"
done
python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
k = json.load(open(os.path.join(out, "kernel.json")))
d = {m: json.load(open(os.path.join(out, "demo-%s.json" % m))) for m in ("bf16", "fp8")}
b, f = d["bf16"], d["fp8"]
rec = {"model": k["model"], "src": k["src"], "dst": k["dst"], "placement": "colocated (GPU 0)",
       "engine": {"bf16_refit_s": b["steady_span_ms"] / 1e3, "fp8_refit_s": f["steady_span_ms"] / 1e3,
                  "fp8_vs_bf16": f["steady_span_ms"] / b["steady_span_ms"], "bf16_verified": b["verified"],
                  "fp8_verified": f["verified"], "cycles": f["cycles"], "fp8_lanes": f["lanes"],
                  "bf16_lanes": b["lanes"], "bf16_per_cycle": b["per_cycle"], "fp8_per_cycle": f["per_cycle"]},
       "kernel": k["cases"], "bit_exact": k["verified"], "verified": k["verified"] and b["verified"] and f["verified"]}
rec["fp8_vs_bf16"] = rec["engine"]["fp8_vs_bf16"]
json.dump(rec, open(os.path.join(out, "gpu-h200-fp8.json"), "w"), indent=1)
print("engine: bf16 %.2f ms, fp8 %.2f ms, fp8_vs_bf16 %.3f, verified %s" % (b["steady_span_ms"], f["steady_span_ms"], rec["fp8_vs_bf16"], rec["verified"]))
PY
