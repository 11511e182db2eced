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
  "$(dirname "$refit")/refit-bench" --scenario gpu --model qwen3-30b-a3b-mini --cycles 3 --iters 2 --out /tmp/refit-gpu-bench-test.json >/dev/null
  python3 -c '
import json
d = json.load(open("/tmp/refit-gpu-bench-test.json"))
assert d["verified"] and d["refit_s"] > 0 and d["peer_copy_s"] > 0, d
print("bench: refit %.4f s, peer copy %.4f s, nccl %.4f s" % (d["refit_s"], d["peer_copy_s"], d["nccl_s"]))'
fi
# Colocated (publishers and receivers on GPU 0), receivers prepared before
# their first pull: the first pull opens nothing; the colocated benchmark on
# the mini model (d2d copy baseline in the same record).
out=$("$refit" demo --json --model tiny-moe --src megatron:ep=2 --dst vllm:tp=2 --transport cuda_ipc \
      --src-device 0 --dst-device 0 --cycles 3 --timeout-s 120 --prepare)
echo "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["verified"], "not verified"
assert d["prepare_ms"] > 0, d["prepare_ms"]
c = d["per_cycle"][0]
assert not c["planned"] and c["connect_ms"] < 1.0, c
print("colocated demo, prepared in %.1f ms: first pull connect %.3f ms, not planned" % (d["prepare_ms"], c["connect_ms"]))'
"$(dirname "$refit")/refit-bench" --scenario colocated --model qwen3-30b-a3b-mini --dst vllm:tp=2 --cycles 3 --iters 2 \
  --out /tmp/refit-colocated-bench-test.json >/dev/null
python3 -c '
import json
d = json.load(open("/tmp/refit-colocated-bench-test.json"))
r = d["runs"][0]
assert d["verified"] and r["refit_s"] > 0 and r["d2d_copy_s"] > 0 and r["cold_first_refit_s"] > 0, r
print("colocated bench: refit %.4f s, d2d copy %.4f s, first refit %.4f s" % (r["refit_s"], r["d2d_copy_s"], r["first_refit_s"]))'
