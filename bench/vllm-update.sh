#!/usr/bin/env bash
# refit's weight update inside the real vLLM 0.32 (CPU) against vLLM's own path for the same bytes
# (layerwise reload + model.load_weights from in-memory tensors, inside each worker): runs
# tests/python/test_vllm.py (every case is also a correctness test) and writes
# bench/results/vllm-update-cpu.json.  Usage: bench/vllm-update.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=$(scripts/vllm-venv.sh)
REFIT_LIBRARY="$build/librefit.so" REFIT_BIN="$build/refit" \
  REFIT_VLLM_BENCH_JSON=bench/results/vllm-update-cpu.json \
  exec "$py" -m pytest -q -rA -p no:cacheprovider tests/python/test_vllm.py
