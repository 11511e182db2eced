#!/usr/bin/env bash
# The real-model end-to-end refit (tests/python/e2e_qwen3_moe.py) on a CUDA machine: builds refit with CUDA
# (as bench/gpu.sh does), then runs the test with the publishers' arenas on cuda:0 and the receiver's
# transformers model on the last GPU (cuda:1 with two), moved by the cuda_ipc transport; logits must equal the
# reference (torch.equal) for version 1 and after an optimizer step (version 2).  Then the same test on the CPU
# with the same packages, for comparison.  Uses the machine's python3 as it is (torch, transformers 4.x or
# 5.x, numpy, safetensors; nothing is installed).
# Output: $OUT/e2e-gpu.json, $OUT/e2e-cpu.json, $OUT/e2e-log.txt (default OUT: build-gpu/e2e).
# Usage: tests/python/e2e_gpu.sh            exit 0 when the GPU run passed
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
export CUBLAS_WORKSPACE_CONFIG=:4096:8   # deterministic cuBLAS, so logits compare exactly across processes
# cuda_ipc exports torch tensors with cudaIpcGetMemHandle, which needs cudaMalloc segments (not expandable ones)
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False
out=${OUT:-build-gpu/e2e}
mkdir -p "$out"
exec > >(tee "$out/e2e-log.txt") 2>&1
echo "== environment"
date -u
nvidia-smi -L || true
python3 -c 'import torch, transformers, numpy, safetensors; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "gpus", torch.cuda.device_count(), "| transformers", transformers.__version__, "| numpy", numpy.__version__,
  "| safetensors", safetensors.__version__)' || { echo "python3 lacks torch/transformers/numpy/safetensors"; exit 1; }
echo "== build (CUDA)"
t0=$(date +%s)
nvcc_path=$(command -v nvcc || find / -xdev -name nvcc -type f -path '*bin*' 2>/dev/null | head -1)
echo "nvcc: $nvcc_path"
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc_path" > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
grep -E "refit:" "$out/cmake.txt"
timeout 400 ninja -C build-gpu refit refit_shared 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"
[ -f build-gpu/librefit.so ] || { echo "no build-gpu/librefit.so"; exit 1; }
build-gpu/refit version
build-gpu/refit gpus
export REFIT_LIBRARY=$root/build-gpu/librefit.so
echo "== e2e on the GPU (cuda_ipc)"
work=$(mktemp -d /tmp/refit-e2e-gpu-XXXXXX)
timeout 500 python3 tests/python/e2e_qwen3_moe.py --device cuda --workdir "$work" --out "$out/e2e-gpu.json"
rc=$?
echo "e2e gpu exit: $rc"
echo "== e2e on the CPU (shm), same packages"
work2=$(mktemp -d /tmp/refit-e2e-cpu-XXXXXX)
timeout 300 python3 tests/python/e2e_qwen3_moe.py --device cpu --workdir "$work2" --out "$out/e2e-cpu.json"
echo "e2e cpu exit: $?"
rm -rf "$work" "$work2"
exit $rc
