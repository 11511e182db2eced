#!/usr/bin/env bash
# Interleaved A/B rounds of bench_ucx_tcp on a quiet host (issue 31: the evidence the 12-02 loaded run lacked):
# A = the defaults (tcp_eager=1), B = --ucx-opts tcp_eager=0; each round runs both, the order alternating by round.
# Usage (root, for the namespaces): bench/results/ucx-tcp-quiet/ab.sh [ROUNDS]   -> runs.jsonl beside this script
set -u
cd "$(dirname "$0")/../../.."
out=bench/results/ucx-tcp-quiet/runs.jsonl
rounds=${1:-6}
for r in $(seq 1 "$rounds"); do
  for i in 0 1; do
    v=$([ $(( (i + r) % 2 )) = 0 ] && echo A || echo B)
    opts=$([ $v = B ] && echo tcp_eager=0 || true)
    load=$(cut -d' ' -f1 /proc/loadavg)
    line=$(build/bench_ucx_tcp --size 1073741824 --reps 5 ${opts:+--ucx-opts "$opts"} 2>/dev/null | tail -1)
    echo "{\"round\":$r,\"variant\":\"$v\",\"load1\":$load,\"at\":\"$(date -u +%H:%M:%S)\",\"run\":$line}" >> "$out"
  done
done
