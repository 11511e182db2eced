#!/usr/bin/env bash
# Planner benchmark: bytes written/read/redundant, regions and plan time per
# destination rank for the field's reference recipes, pinned to one core.
# Writes one JSON object per scenario (one per line) to bench/results/plan-cpu.jsonl
# and prints a summary.  Usage: bench/plan.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -x "$build/refit" ] || scripts/build.sh "$build"
out=bench/results/plan-cpu.jsonl
: > "$out"
run() {
  local model=$1 src=$2 dst=$3
  taskset -c 0 "$build/refit" plan --model "$model" --src "$src" --dst "$dst" --all-ranks --json >> "$out"
}
run qwen3-30b-a3b megatron:ep=8 vllm:tp=2
run qwen3-30b-a3b megatron:ep=8 vllm:tp=2,ep=2
run qwen3-30b-a3b megatron:tp=2,ep=4 vllm:tp=4,ep=4
run qwen3-235b-a22b megatron:tp=4,pp=2,ep=8 vllm:tp=8,ep=8
run deepseek-v3 megatron:tp=2,pp=4,ep=32,first=16 vllm:tp=8,ep=8
run kimi-k2 megatron:pp=4,ep=64,first=16 vllm:tp=8,ep=8
python3 - "$out" <<'PY'
import json, sys
print(f"{'model':16} {'src':44} {'dst':28} {'GB/rank':>8} {'redundant':>9} {'regions':>8} {'plan_ms max':>11}")
for line in open(sys.argv[1]):
    o = json.loads(line)
    r = o["ranks"]
    print(f"{o['model']:16} {o['src']:44} {o['dst']:28} {max(x['bytes_written'] for x in r)/1e9:8.2f} "
          f"{sum(x['bytes_redundant'] for x in r):9d} {max(x['regions'] for x in r):8d} {max(x['plan_ms'] for x in r):11.1f}")
PY
