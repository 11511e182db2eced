#!/usr/bin/env bash
# Refit while generating (issue 32) in the real vLLM 0.32 on the CPU: two-phase updates (stage while the engine
# decodes, commit under vLLM's pause in "keep" mode) of a 354 MB Qwen3-MoE at tp=1 (and tp=2 with TP=2 in the
# environment), beside single-phase updates of the same engine; every commit checked byte for byte against a vLLM
# started on that version.  Writes bench/results/inflight-vllm-cpu.json (per update: pause_ms, pull_ms,
# local_copy_ms, tokens_during_pull, verified).  Usage: bench/inflight-vllm-cpu.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(cd "${1:-build}" && pwd)
py=$(scripts/vllm-venv.sh)
work=$(mktemp -d /tmp/refit-inflight-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$root/python:$root/tests/python/worktree_site" REFIT_LIBRARY="$build/librefit.so"
"$py" - "$work" <<'PY'
import os, sys
sys.path.insert(0, "tests/python")
import vllm_models
for ver, seed in (("v1", 1), ("v2", 2)):
    vllm_models.write(vllm_models.MOE, os.path.join(sys.argv[1], ver, "medium-qwen3-moe"), seed, vocab_size=32000,
                      hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=64, num_experts=16, moe_intermediate_size=512)
PY
runs=()
for tp in 1 ${TP2:+2}; do
  cat > "$work/cfg-$tp.json" <<JSON
{"v1": "$work/v1/medium-qwen3-moe", "v2": "$work/v2/medium-qwen3-moe", "tp": $tp, "refit": "$build/refit",
 "work": "$work/run-$tp", "updates": ${UPDATES:-5}, "single": 3, "faults": false, "max_tokens": 64,
 "publisher_digest": false}
JSON
  "$py" tests/python/vllm_inflight_driver.py "$work/cfg-$tp.json" "$work/out-$tp.json" > "$work/log-$tp.txt" 2>&1 ||
    { tail -40 "$work/log-$tp.txt"; exit 1; }
  grep -a "^inflight_driver:" "$work/log-$tp.txt" | cut -c1-300
  runs+=("$work/out-$tp.json")
done
mkdir -p bench/results
"$py" - bench/results/inflight-vllm-cpu.json "${runs[@]}" <<'PY'
import json, statistics, sys, time
out = {"what": "refit two-phase updates in vLLM 0.32 (CPU), 354 MB Qwen3-MoE; bench/inflight-vllm-cpu.sh",
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}
for path in sys.argv[2:]:
    r = json.load(open(path))
    ups = [{k: u[k] for k in ("version", "pause_ms", "pull_ms", "prepare_ms", "local_copy_ms", "pause_over_copy",
                              "copy_ms", "commit_rpc_ms", "bytes_copied", "handles_exchanged", "rank_bytes",
                              "steps_in_stage",
                              "local_copy_before_after_ms", "thread", "step_ms_after_publish",
                              "tokens_during_pull", "tokens_during_stage", "live_untouched_while_staged",
                              "verified")} for u in r["updates"]]
    out["runs"].append({
        "tp": r["config"]["tp"], "env": r["env"], "updates": ups,
        "single_phase": [{k: s[k] for k in ("version", "pause_ms", "pull_ms", "apply_ms", "verified")}
                         for s in r["single"]],
        "median": {"pause_ms": statistics.median(u["pause_ms"] for u in ups),
                   "local_copy_ms": statistics.median(u["local_copy_ms"] for u in ups),
                   "pause_over_copy": statistics.median(u["pause_over_copy"] for u in ups),
                   "pull_ms": statistics.median(u["pull_ms"] for u in ups),
                   "single_phase_pause_ms": statistics.median(s["pause_ms"] for s in r["single"])},
        "all_verified": all(u["verified"] for u in ups) and all(s["verified"] for s in r["single"]),
        "generation_during_every_pull": all(u["tokens_during_pull"] > 0 for u in ups),
        "final_generation_equal": r.get("final_generation_equal")})
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps([x["median"] for x in out["runs"]]))
PY
