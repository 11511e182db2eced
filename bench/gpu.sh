#!/usr/bin/env bash
# The GPU benchmark, start to finish, on a machine with two GPUs joined by
# NVLink (the results under bench/results/*h200*.json came from this):
# builds refit with CUDA, runs the GPU tests, compares where the copy kernel
# runs (exec=dst: the receiver's GPU pulls over P2P; exec=src: the source's
# GPU pushes; exec=alt: receiver rank 0 pulls, rank 1 pushes), then runs
# `refit-bench --scenario gpu` on the full qwen3-30b-a3b with the fastest.
# A diagnostic run with one receiver (vllm:tp=1) shows what two receiver
# processes sharing one GPU cost (their kernels take turns).  Everything lands in $OUT (or
# bench/results/gpu-run): environment, log, JSON.
#   usage: bench/gpu.sh [MODEL]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
model=${1:-qwen3-30b-a3b}
out=${OUT:-bench/results/gpu-run}
mkdir -p "$out"
log=$out/gpu-log.txt
exec > >(tee "$log") 2>&1
echo "== environment"
{ date -u; uname -a; nvidia-smi; nvidia-smi topo -m; which nvcc; nvcc --version | tail -2; cmake --version | head -1;
  python3 -c 'import nvidia.nccl as n; print("nccl wheel:", list(n.__path__)[0])'; } > "$out/gpu-env.txt" 2>&1
grep -E "Driver Version|H200|GPU0|GPU1|release" "$out/gpu-env.txt"
echo "== build"
t0=$(date +%s)
nvcc_path=$(command -v nvcc || find / -xdev -name nvcc -type f -path '*bin*' 2>/dev/null | head -1)
echo "nvcc: $nvcc_path"
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc_path" > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
grep -E "refit:" "$out/cmake.txt"
timeout 400 ninja -C build-gpu refit refit-bench test_gpu 2>&1 | tail -5 || true
echo "build: $(( $(date +%s) - t0 )) s"
[ -x build-gpu/refit ] || { echo "no refit binary"; exit 1; }
build-gpu/refit gpus
echo "== GPU tests"
timeout 150 build-gpu/tests/test_gpu 2>&1 | tail -25; echo "test_gpu exit: ${PIPESTATUS[0]}"
timeout 150 tests/gpu/test_gpu_demo.sh build-gpu/refit 2>&1 | tail -6; echo "test_gpu_demo exit: ${PIPESTATUS[0]}"
echo "== where the copy runs (full model, 3 versions each)"
best=dst best_ms=1e9
for ex in dst src alt; do
  timeout 150 build-gpu/refit demo --json --model "$model" --src megatron:ep=2 --dst vllm:tp=2 --transport cuda_ipc \
    --src-device 0 --dst-device 1 --cycles 3 --transport-options cuda_ipc.exec=$ex > "$out/variant-$ex.json"
  ms=$(python3 -c "import json; d=json.load(open('$out/variant-$ex.json')); print(d['steady_span_ms'] if d['verified'] else 1e9)" 2>/dev/null || echo 1e9)
  echo "exec=$ex: steady refit span $ms ms"
  if python3 -c "import sys; sys.exit(0 if float('$ms') < float('$best_ms') else 1)"; then best=$ex best_ms=$ms; fi
done
echo "== diagnostic: one receiver process (vllm:tp=1), exec=dst"
timeout 150 build-gpu/refit demo --json --model "$model" --src megatron:ep=2 --dst vllm:tp=1 --transport cuda_ipc \
  --src-device 0 --dst-device 1 --cycles 3 > "$out/diag-tp1.json"
python3 -c "import json; d=json.load(open('$out/diag-tp1.json')); print('tp=1: steady span %.3f ms for %d bytes, verified %s' % (d['steady_span_ms'], d['bytes_per_cycle'], d['verified']))" || true
echo "== benchmark (exec=$best)"
timeout 400 build-gpu/refit-bench --scenario gpu --model "$model" --src megatron:ep=2 --dst vllm:tp=2 \
  --src-device 0 --dst-device 1 --cycles 6 --iters 5 --transport-options cuda_ipc.exec=$best \
  --out "$out/gpu-h200.json" > /dev/null
echo "bench exit: $?"
