#!/usr/bin/env bash
# Refit while generating (issue 32) in the real vLLM 0.32 on the CPU: two-phase updates (stage while the engine
# decodes, commit under vLLM's pause in "keep" mode) of a 354 MB Qwen3-MoE at tp=1 (then tp=2 with TP2=1 in the
# environment; TP=2 without TP2: tp=2 only), beside single-phase updates of the same engine; every commit checked
# byte for byte against a vLLM started on that version.  Writes bench/results/inflight-vllm-cpu.json, or $OUT (per
# update: pause_ms, pull_ms, local_copy_ms, tokens_during_pull, verified).  UPDATES (default 5) two-phase updates.
# Usage: bench/inflight-vllm-cpu.sh [BUILD_DIR]   (default build)
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
# QUIET_WAIT_AB='[true,false]': the driver waits for the commit's replies asleep or spinning (vLLM's default), one
# per update in turn (an interleaved A/B; inflight.commit quiet_wait)
# COMMIT_COPY_AB=memmove,torch: the commit's host copies alternate between the two ways, one per update (an
# interleaved A/B in one engine; each pair's ratio is in the JSON)
ab=null
[ -n "${COMMIT_COPY_AB:-}" ] && ab=$(printf '%s' "$COMMIT_COPY_AB" | sed 's/[^,][^,]*/"&"/g; s/^/[/; s/$/]/')
runs=()
for tp in ${TP:-1} ${TP2:+2}; do
  cat > "$work/cfg-$tp.json" <<JSON
{"v1": "$work/v1/medium-qwen3-moe", "v2": "$work/v2/medium-qwen3-moe", "tp": $tp, "refit": "$build/refit",
 "work": "$work/run-$tp", "updates": ${UPDATES:-5}, "single": 3, "faults": false, "max_tokens": 64,
 "publisher_digest": false, "commit_copy_ab": $ab, "copy_probe": ${COPY_PROBE:-false},
 "hugepages_ab": ${HUGEPAGES_AB:-null}, "quiet_wait_ab": ${QUIET_WAIT_AB:-null}}
JSON
  echo "inflight-bench: tp=$tp at $(uptime)" >&2
  "$py" tests/python/vllm_inflight_driver.py "$work/cfg-$tp.json" "$work/out-$tp.json" > "$work/log-$tp.txt" 2>&1 ||
    { tail -40 "$work/log-$tp.txt"; exit 1; }
  grep -a "^inflight_driver:" "$work/log-$tp.txt" | cut -c1-300
  runs+=("$work/out-$tp.json")
done
out=${OUT:-bench/results/inflight-vllm-cpu.json}
mkdir -p "$(dirname "$out")"
# OpenMP's wait policy, when set, is part of the command (GOMP_SPINCOUNT, OMP_WAIT_POLICY: how long the engine's
# OpenMP team spins after a parallel region; the commit's copies share the cores with it: docs/vllm.md)
omp=""
for v in GOMP_SPINCOUNT OMP_WAIT_POLICY; do [ -n "${!v:-}" ] && omp="$omp$v=${!v} "; done
cmd="${omp}UPDATES=${UPDATES:-5} TP=${TP:-1} TP2=${TP2:-} COMMIT_COPY_AB=${COMMIT_COPY_AB:-} COPY_PROBE=${COPY_PROBE:-false}"
cmd="$cmd HUGEPAGES_AB='${HUGEPAGES_AB:-}' QUIET_WAIT_AB='${QUIET_WAIT_AB:-}'"
cmd="$cmd bench/inflight-vllm-cpu.sh"
"$py" - "$out" "$cmd" "$(uptime)" "${runs[@]}" <<'PY'
import json, statistics, sys, time
out = {"what": "refit two-phase updates in vLLM 0.32 (CPU), 354 MB Qwen3-MoE; bench/inflight-vllm-cpu.sh",
       "command": sys.argv[2], "uptime_after": sys.argv[3].strip(),
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}
for path in sys.argv[4:]:
    r = json.load(open(path))
    ups = [{k: u[k] for k in ("version", "pause_ms", "pull_ms", "prepare_ms", "local_copy_ms", "pause_over_copy",
                              "copy_ms", "commit_rpc_ms", "calls_ms", "worker_commit_ms", "worker_agree_ms", "worker_agree_parts_ms", "worker_agreement", "workers_plain_copy_ms", "pause_over_workers_copy", "bytes_copied", "handles_exchanged", "rank_bytes",
                              "steps_in_stage",
                              "local_copy_before_after_ms", "local_copy_ways_ms", "commit_copy",
                              "commit_ms_by_kind", "copy_probe", "cpu_during_commit", "staging_hugepages", "staging_huge_bytes", "thread", "step_ms_after_publish",
                              "tokens_during_pull", "tokens_during_stage", "live_untouched_while_staged",
                              "verified")} for u in r["updates"]]
    out["runs"].append({
        "tp": r["config"]["tp"], "env": r["env"], "updates": ups,
        "single_phase": [{k: s[k] for k in ("version", "pause_ms", "pull_ms", "apply_ms", "verified")}
                         for s in r["single"]],
        "median": {"pause_ms": statistics.median(u["pause_ms"] for u in ups),
                   "local_copy_ms": statistics.median(u["local_copy_ms"] for u in ups),
                   "pause_over_copy": statistics.median(u["pause_over_copy"] for u in ups),
                   "workers_plain_copy_ms": statistics.median(u["workers_plain_copy_ms"] for u in ups),
                   "pause_over_workers_copy": statistics.median(u["pause_over_workers_copy"] for u in ups),
                   "pull_ms": statistics.median(u["pull_ms"] for u in ups),
                   "single_phase_pause_ms": statistics.median(s["pause_ms"] for s in r["single"])},
        "all_verified": all(u["verified"] for u in ups) and all(s["verified"] for s in r["single"]),
        "generation_during_every_pull": all(u["tokens_during_pull"] > 0 for u in ups),
        "final_generation_equal": r.get("final_generation_equal")})
    hab = r["config"].get("hugepages_ab")
    if hab:  # consecutive updates a (hab[0]), b (hab[1]): the pause and copy ratios b / a per pair
        pairs = [ups[i:i + 2] for i in range(0, len(ups) - 1, 2)]
        rp = [p[1]["pause_ms"] / p[0]["pause_ms"] for p in pairs]
        rc = [p[1]["copy_ms"] / p[0]["copy_ms"] for p in pairs]
        out["runs"][-1]["hugepages_ab"] = {
            "modes": hab, "pairs": len(pairs),
            "pause_ratio_b_over_a": {"median": statistics.median(rp), "min": min(rp), "max": max(rp), "all": rp},
            "copy_ratio_b_over_a": {"median": statistics.median(rc), "min": min(rc), "max": max(rc), "all": rc},
            "pause_over_copy": {str(m): [u["pause_over_copy"] for u in ups if u["staging_hugepages"] == m]
                                for m in hab}}
    qab = r["config"].get("quiet_wait_ab")
    if qab:  # consecutive updates a (qab[0]), b (qab[1]): the pause ratio b / a per pair, and each arm's ratios
        pairs = [ups[i:i + 2] for i in range(0, len(ups) - 1, 2)]
        rp = [p[1]["pause_ms"] / p[0]["pause_ms"] for p in pairs]
        out["runs"][-1]["quiet_wait_ab"] = {
            "modes": qab, "pairs": len(pairs),
            "pause_ratio_b_over_a": {"median": statistics.median(rp), "min": min(rp), "max": max(rp), "all": rp},
            "pause_over_copy": {str(m): [u["pause_over_copy"] for u in ups if u["calls_ms"].get("quiet_wait") == m]
                                for m in (True, False)},
            "pause_over_workers_copy": {str(m): [u["pause_over_workers_copy"] for u in ups
                                                 if u["calls_ms"].get("quiet_wait") == m] for m in (True, False)}}
    modes = r["config"].get("commit_copy_ab")
    if modes:  # consecutive updates a, b of one pair: pause and copy ratios b / a, and each against its local copy
        pairs = [ups[i:i + len(modes)] for i in range(0, len(ups) - len(modes) + 1, len(modes))]
        rat = [p[1]["pause_ms"] / p[0]["pause_ms"] for p in pairs]
        out["runs"][-1]["commit_copy_ab"] = {
            "modes": modes, "pairs": len(pairs),
            "pause_ratio_b_over_a": {"median": statistics.median(rat), "min": min(rat), "max": max(rat)},
            "pause_over_copy": {m: [u["pause_over_copy"] for u in ups if u["commit_copy"] == m] for m in modes}}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps([x["median"] for x in out["runs"]]))
PY
