#!/usr/bin/env bash
# The field's published setups predicted by `refit simulate`, relays on and
# off, one JSON object per line (docs/scale.md explains the assumptions).
# Usage: bench/simulate-field.sh [PATH_TO_REFIT] > bench/results/simulate-field.jsonl
set -euo pipefail
refit=${1:-build/refit}
one() { # one NAME ARGS...: both relay settings
  local name=$1; shift
  for relays in --relays --no-relays; do
    "$refit" simulate "$@" "$relays" --json |
      python3 -c 'import json,sys
o=json.load(sys.stdin); o["scenario"]=sys.argv[1]
rx=o.pop("receivers"); o["receiver_count"]=len(rx)
o["receiver_end_s"]={"min":min(r["end_s"] for r in rx),"max":max(r["end_s"] for r in rx)}
o["links"]=sorted(o["links"],key=lambda l:-l["utilisation"])[:4]
print(json.dumps(o, separators=(",", ":")))' "$name"
    echo "$name $relays done" >&2
  done
}
one "kimi-k2 256 -> 128 (one EP128 replica)" --model kimi-k2 --src megatron:pp=4,ep=64,first=16 \
  --dst vllm:tp=8,dp=16,ep=128 --cluster hgx-h100
one "kimi-k2 256 -> 128 (16 TP8+EP8 replicas)" --model kimi-k2 --src megatron:pp=4,ep=64,first=16 \
  --dst vllm:tp=8,ep=8 --replicas 16 --cluster hgx-h100
one "deepseek-v3 128 -> 128 (one EP128 replica), GB200 RDMA" --model deepseek-v3 --src megatron:pp=4,ep=32,first=16 \
  --dst vllm:tp=8,dp=16,ep=128 --cluster gb200-rdma
one "deepseek-v3 128 -> 128 (16 TP8+EP8 replicas), GB200 RDMA" --model deepseek-v3 --src megatron:pp=4,ep=32,first=16 \
  --dst vllm:tp=8,ep=8 --replicas 16 --cluster gb200-rdma
one "deepseek-v3 128 -> 128 (one EP128 replica), GB200 NVL72" --model deepseek-v3 --src megatron:pp=4,ep=32,first=16 \
  --dst vllm:tp=8,dp=16,ep=128 --cluster gb200-nvl72
one "qwen3-30b-a3b EP8 -> TP2, GB200 400G" --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 --cluster gb200-rdma
one "qwen3-30b-a3b EP8 -> TP2, GB200 at 95G" --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 \
  --cluster gb200-rdma --cluster nic=95Gb
one "qwen3-30b-a3b EP8 -> TP2+EP2, GB200 400G" --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2,ep=2 \
  --cluster gb200-rdma
one "qwen3-30b-a3b EP8 -> TP2+EP2, GB200 at 95G" --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2,ep=2 \
  --cluster gb200-rdma --cluster nic=95Gb
one "qwen3-30b-a3b EP8 -> 8 TP2 replicas, GB200 400G" --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 \
  --replicas 8 --cluster gb200-rdma
