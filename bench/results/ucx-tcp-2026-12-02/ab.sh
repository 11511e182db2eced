#!/usr/bin/env bash
# Interleaved rounds of bench_ucx_tcp: each round runs every variant once, in rotating order.
set -u
cd "$(dirname "$0")/../../.."
out=bench/results/ucx-tcp-2026-12-02/runs.jsonl
rounds=${1:-5}; OFF=${OFF:-0}; R0=${R0:-0}
variants=(${VARIANTS:-A B C})
for r in $(seq 1 "$rounds"); do
  for i in 0 1 2; do
    v=${variants[$(( (i + r + OFF) % 3 ))]}
    case $v in
      A) env=(); opts="";;
      B) env=(); opts="tcp_eager=0";;
      C) env=(UCX_TCP_TX_SEG_SIZE=256k UCX_TCP_RX_SEG_SIZE=256k); opts="";;
      D) env=(UCX_TCP_TX_SEG_SIZE=256k UCX_TCP_RX_SEG_SIZE=256k); opts="tcp_eager=0";;
    esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    line=$(env "${env[@]}" build/bench_ucx_tcp --size 1073741824 --reps 5 ${opts:+--ucx-opts "$opts"} 2>/dev/null | tail -1)
    echo "{\"round\":$((r + R0)),\"variant\":\"$v\",\"env\":\"${env[*]}\",\"load1\":$load,\"at\":\"$(date -u +%H:%M:%S)\",\"run\":$line}" >> "$out"
  done
done
