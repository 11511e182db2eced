#!/usr/bin/env bash
# The GPU RL step with real parts (issue 36, tests/gpu/rl_step_mcore.py) on the device machine: megatron-core
# from the wheel carried in .whl (pip-installed into /tmp/site), refit built with CUDA, then the test.
# Output: $OUT/rl-step-mcore.json and its log.  Usage (device tool, carry [".whl"]): OUT=$OUT bench/gpu-rl-step.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False
export PYTHONUNBUFFERED=1
out=${OUT:-build-gpu/rl-step}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -c 'import megatron.core, torch, transformers; print("megatron-core", megatron.core.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())'
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF -DREFIT_BUILD_TESTS=OFF > "$out/cmake.txt" 2>&1 || { tail -30 "$out/cmake.txt"; exit 1; }
timeout 400 ninja -C build-gpu refit_shared > "$out/ninja.txt" 2>&1 || { grep -E "error" -A4 "$out/ninja.txt" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export REFIT_LIBRARY=$root/build-gpu/librefit.so
timeout 540 python3 tests/gpu/rl_step_mcore.py --steps ${STEPS:-4} --out "$out/rl-step-mcore.json" > "$out/rl-step-log.txt" 2>&1
rc=$?
grep -v "^ \|^{\|^}" "$out/rl-step-log.txt" | grep -v Warning | tail -40
python3 - "$out/rl-step-mcore.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result:", e); sys.exit(0)
print("passed", d["passed"], "processes_ok", d["processes_ok"], "versions", len(d["versions"]))
for v in d["versions"]: print(v)
for s in d["trainer"].get("steps", []): print("trainer", s)
for p in d["receiver"].get("pulls", []): print("receiver", p)
PY
echo "rl_step exit: $rc"
exit $rc
