#!/usr/bin/env bash
# The GPU tests (tests/gpu: test_gpu, test_gpu_fp8, test_gpu_digest, test_gpu_demo.sh) on the device machine,
# built there with its nvcc; logs into $OUT.  Usage (device tool): OUT=$OUT bench/gpu-tests.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-build-gpu/tests}
mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
timeout 300 ninja -C build-gpu refit refit-bench test_gpu test_gpu_fp8 test_gpu_digest > "$out/ninja.txt" 2>&1 ||
  { grep -E "error" -A4 "$out/ninja.txt" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
for t in test_gpu test_gpu_fp8 test_gpu_digest; do
  timeout ${T:-150} build-gpu/tests/$t > "$out/$t.txt" 2>&1; r=$?; echo "$t exit: $r"; [ $r = 0 ] || { rc=1; grep -E "FAIL|Assert|error" "$out/$t.txt" | head -8; }
  tail -2 "$out/$t.txt"
done
timeout 150 tests/gpu/test_gpu_demo.sh build-gpu/refit > "$out/test_gpu_demo.txt" 2>&1; r=$?; echo "test_gpu_demo exit: $r"; [ $r = 0 ] || rc=1
tail -3 "$out/test_gpu_demo.txt"
exit $rc
