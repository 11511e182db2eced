#!/usr/bin/env bash
# refit-bench --scenario delta|partial|fp8 on the tiny models: each prints its
# JSON and the correctness assertions hold (timing targets are judged on the
# benchmark model, not here).
set -u
bench="$1" # refit-bench; refit is the program beside it
refit="$(dirname "$bench")/refit"
pass=0
fail=0
check() { # name json-file assertion...
    local name="$1" out="$2"
    shift 2
    for a in "$@"; do
        # the judged assertions at the top level (not one run's in runs_detail)
        if python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); sys.exit(not any(x["name"]==sys.argv[2] and x["passed"] is True for x in o["assertions"]))' "$out" "$a"; then
            pass=$((pass + 1))
        else
            echo "FAIL: $name: assertion $a"; cat "$out"; fail=$((fail + 1))
        fi
    done
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bench" --scenario delta --net none --model tiny-moe --versions 3 >"$tmp/delta.json"
check delta "$tmp/delta.json" bit_exact wire_bytes_ratio full_refit_without_base
"$bench" --scenario delta --net=none --model tiny-dense --src megatron:tp=2 --dst vllm:tp=1 --fraction 0.2 --versions 2 >"$tmp/delta2.json"
check delta-20% "$tmp/delta2.json" bit_exact full_refit_without_base
# Through the engine: publishers offer deltas, a full and a delta receiver pull every version.
"$bench" --scenario delta --net shm --runs 2 --model tiny-moe --versions 3 >"$tmp/delta3.json"
check delta-engine "$tmp/delta3.json" bit_exact deltas_applied wire_bytes_ratio
# --runs 2: both runs kept, timing goals judged on the median of the runs, correctness in every run.
if python3 - "$tmp/delta3.json" <<'PY'; then pass=$((pass + 1)); else echo "FAIL: delta-engine --runs 2: $(cat "$tmp/delta3.json")"; fail=$((fail + 1)); fi
import json, statistics, sys
o = json.load(open(sys.argv[1]))
assert o['config']['runs'] == 2 and len(o['runs_detail']) == 2, o['config']
assert len(o['spread']['delta_refit_ms']['runs']) == 2
assert abs(o['median']['delta_refit_ms'] / statistics.median(o['spread']['delta_refit_ms']['runs']) - 1) < 1e-5
for a in o['assertions']:
    assert len(a['observed_runs']) == 2, a
    if a['on'] == 'median':
        assert abs(a['observed'] - statistics.median(a['observed_runs'])) <= 1e-5 * max(1e-9, abs(a['observed'])), a
        assert a['passed'] == (a['observed'] <= 0.15), a
    else:
        assert a['on'] == 'every run'
        assert a['passed'] == all(r['assertions'][i]['passed'] for r in o['runs_detail'] for i in range(len(r['assertions'])) if r['assertions'][i]['name'] == a['name']), a
PY
"$bench" --scenario partial --model tiny-moe --select "layer:1,lm_head.weight" >"$tmp/partial.json"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: partial exited $rc"; fail=$((fail + 1)); }
check partial "$tmp/partial.json" selected_tensors_verified others_untouched fused_whole bytes_only_selected
"$bench" --scenario fp8 --model tiny-fp8 >"$tmp/fp8.json"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: fp8 exited $rc"; fail=$((fail + 1)); }
check fp8 "$tmp/fp8.json" fp8_bits_exact wire_carries_fp8 misaligned_refused
# Through the engine: FP8 relays next to the trainer, an FP8 and a bf16 receiver.
"$bench" --scenario fp8 --net shm --runs 1 --model tiny-fp8 >"$tmp/fp8e.json"
check fp8-engine "$tmp/fp8e.json" fp8_bits_exact wire_carries_fp8
# A model whose shards cut FP8 blocks is refused with a clear error.
if "$bench" --scenario fp8 --model tiny-moe >/dev/null 2>"$tmp/err"; then
    echo "FAIL: fp8 on tiny-moe was accepted"; fail=$((fail + 1))
elif grep -q "block grid" "$tmp/err"; then pass=$((pass + 1)); else
    echo "FAIL: fp8 on tiny-moe: $(cat "$tmp/err")"; fail=$((fail + 1)); fi
# `refit bench ARGS` runs refit-bench ARGS and says so.
if "$refit" bench --scenario no-such >/dev/null 2>"$tmp/err"; then
    echo "FAIL: refit bench --scenario no-such was accepted"; fail=$((fail + 1))
elif grep -q "running .*refit-bench" "$tmp/err" && grep -q "scenario is one of" "$tmp/err"; then pass=$((pass + 1)); else
    echo "FAIL: refit bench did not forward to refit-bench: $(cat "$tmp/err")"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
