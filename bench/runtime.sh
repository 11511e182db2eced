#!/usr/bin/env bash
# Runtime benchmarks on one CPU host (JSON results in bench/results/):
#   demo-shm-file.json   refit demo: 8 megatron ep=8 publishers -> 2 vllm tp=2 receivers of
#                        qwen3-30b-a3b-mini (qwen3-30b-a3b's 18,867 tensors, 1.12 GB) over shm,
#                        embedded file registry, every byte verified, memcpy measured in the same run
#   demo-shm-redis.json  the same with a real Redis (started here on 127.0.0.1, stopped after)
# Both report the content digests' cost next to the transfer (steady_digest_ms, digest_vs_transfer,
# steady_publisher_digest_ms).
# Usage: bench/runtime.sh [BUILD_DIR] [CYCLES]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cycles=${2:-8}
[ -x "$build/refit" ] || scripts/build.sh "$build"
mkdir -p bench/results
"$build/refit" demo --cycles "$cycles" --json > bench/results/demo-shm-file.json
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d /tmp/refit-bench-redis-XXXXXX)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null; wait $rpid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
# A networked registry needs the job's secret (docs/security.md): a fresh one for this run.
secret=$dir/job.secret
head -c 32 /dev/urandom >"$secret" && chmod 600 "$secret"
REFIT_SECRET_FILE=$secret "$build/refit" demo --cycles "$cycles" --registry "redis://127.0.0.1:$port" --json \
  > bench/results/demo-shm-redis.json
python3 - bench/results/demo-shm-file.json bench/results/demo-shm-redis.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    o = json.load(open(f))
    print(f"{f}: verified={o['verified']} cycles={o['cycles']} bytes/cycle={o['bytes_per_cycle']} "
          f"control={o['steady_control_ms']:.2f} ms transfer={o['steady_transfer_gbps']:.2f} GB/s "
          f"memcpy={o['memcpy_gbps']:.2f} GB/s ratio={o['transfer_vs_memcpy']:.2f} transport={o['transport']}")
    print(f"  content digests: check {o['steady_digest_ms']:.1f} ms per receiver = {o['digest_vs_transfer']:.3f} of "
          f"the transfer ({o['steady_transfer_ms']:.1f} ms); compute {o['steady_publisher_digest_ms']:.1f} ms per "
          f"publisher; {o['digest_bytes_per_cycle']} bytes checked, {o['unverified_bytes_per_cycle']} not checkable")
PY
