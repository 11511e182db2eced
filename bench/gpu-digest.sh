#!/usr/bin/env bash
# GPU content digests (issue 36): builds test_gpu_digest on the device machine, runs the bit-for-bit test
# against the CPU kernels, then the timings (--bench) of the GPU table and own sums against a
# device-to-device copy of the same memory, for each "MODEL SPEC" of $BENCHES.  Everything into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-bench/results/gpu-digest-run}
mkdir -p "$out"
{ date -u; nvidia-smi; nvcc --version | tail -2; } > "$out/env.txt" 2>&1
grep -E "Driver Version|H200" "$out/env.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF -DREFIT_BUILD_TESTS=ON > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
timeout 400 ninja -C build-gpu test_gpu_digest > "$out/ninja.txt" 2>&1 || { grep -E "error" -A4 "$out/ninja.txt" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
timeout 300 build-gpu/tests/test_gpu_digest 2>&1 | tee "$out/test_gpu_digest.txt"
echo "test_gpu_digest exit: ${PIPESTATUS[0]}"
IFS=';' read -ra benches <<< "${BENCHES:-qwen3-30b-a3b megatron:ep=2;qwen3-30b-a3b vllm:tp=2}"
for b in "${benches[@]}"; do
  name=$(echo "$b" | tr ' :=,' '____')
  timeout 300 build-gpu/tests/test_gpu_digest --bench $b > "$out/bench-$name.json" 2> "$out/bench-$name.err"
  echo "bench $b exit: $?"; cat "$out/bench-$name.json"; tail -3 "$out/bench-$name.err"
done
