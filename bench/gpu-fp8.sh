#!/usr/bin/env bash
# FP8 quantize-on-copy on the GPU (issue 16): build, the GPU FP8 tests, then
# the kernel-level comparison on a real model, everything into $OUT.
#   OUT=... MODEL=qwen3-30b-a3b SRC=megatron:ep=2 DST=vllm:tp=2 ITERS=5 bench/gpu-fp8.sh
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
timeout 400 ninja -C build-gpu test_gpu_fp8 ${TARGETS:-} > "$out/ninja.txt" 2>&1; grep -E "FAILED|error" -A4 "$out/ninja.txt" | head -30
echo "build: $(( $(date +%s) - t0 )) s"
[ -x build-gpu/tests/test_gpu_fp8 ] || exit 1
timeout 300 build-gpu/tests/test_gpu_fp8 > "$out/test_gpu_fp8.txt" 2>&1; echo "test_gpu_fp8 exit: $?"; cat "$out/test_gpu_fp8.txt" | tail -15
[ -n "${NOBENCH:-}" ] && exit 0
timeout 400 build-gpu/tests/test_gpu_fp8 --bench "${MODEL:-qwen3-30b-a3b}" "${SRC:-megatron:ep=2}" "${DST:-vllm:tp=2}" \
  "${ITERS:-5}" "$out/gpu-h200-fp8.json" 2>&1 | tee "$out/bench.txt"; echo "bench exit: ${PIPESTATUS[0]}"
