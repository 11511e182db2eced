#!/usr/bin/env bash
# Multi-process CUDA IPC: publisher and receiver processes over cuda_ipc
# (refit demo), then the GPU benchmark on a small model when there are two
# GPUs.  Exit 77 (skipped) without a GPU.
set -euo pipefail
refit=$1
export NCCL_NVLS_ENABLE=0
n=$("$refit" gpus | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
if [ "$n" = 0 ]; then echo "SKIP: no CUDA device here"; exit 77; fi
dst=0; [ "$n" -gt 1 ] && dst=1
out=$("$refit" demo --json --model tiny-moe --src megatron:ep=2 --dst vllm:tp=2 --transport cuda_ipc \
      --src-device 0 --dst-device $dst --cycles 3 --timeout-s 120)
echo "$out"
echo "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["verified"], "not verified"
assert d["transport"] == "cuda_ipc", d["transport"]
for c in d["per_cycle"][1:]:
    assert not c["planned"] and 1 <= c["launches"] <= 4, c
print("demo over cuda_ipc: verified, steady launches", [c["launches"] for c in d["per_cycle"]])'
if [ "$n" -gt 1 ]; then
  "$refit" bench --scenario gpu --model qwen3-30b-a3b-mini --cycles 3 --iters 2 --out /tmp/refit-gpu-bench-test.json >/dev/null
  python3 -c '
import json
d = json.load(open("/tmp/refit-gpu-bench-test.json"))
assert d["verified"] and d["refit_s"] > 0 and d["peer_copy_s"] > 0, d
print("bench: refit %.4f s, peer copy %.4f s, nccl %.4f s" % (d["refit_s"], d["peer_copy_s"], d["nccl_s"]))'
fi
