#!/usr/bin/env bash
# The refit command end to end: plan (text, JSON, execute, dump), demo
# (processes, verification, JSON fields) and its errors (exit codes, messages).
# Usage: test_cli.sh PATH_TO_REFIT
set -u
refit=$1
tmp=$(mktemp -d /tmp/refit-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
expect() { # expect NAME WANT_RC NEEDLE -- command...
  local name=$1 want=$2 needle=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want: $out"; return; fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then bad "$name: output lacks '$needle': $out"; return; fi
  ok "$name"
}
json_check() { # json_check NAME PYTHON_EXPR FILE
  if python3 -c "import json,sys; o=json.load(open(sys.argv[1])); assert $2, o" "$3" 2>"$tmp/err"; then ok "$1"
  else bad "$1: $(cat "$tmp/err")"; fi
}

# plan
expect "plan text" 0 "30544916480" -- "$refit" plan --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 --rank 1
"$refit" plan --model qwen3-30b-a3b --src megatron:ep=8 --dst vllm:tp=2 --all-ranks --json >"$tmp/plan.json"
json_check "plan json" "len(o['ranks'])==2 and all(r['bytes_redundant']==0 and r['bytes_read']==r['bytes_written']==30544916480 for r in o['ranks'])" "$tmp/plan.json"
expect "plan execute" 0 "every destination byte verified" -- "$refit" plan --model tiny-mla --src megatron:tp=2,ep=4 --dst vllm:tp=4,ep=4 --all-ranks --execute
expect "plan dump" 0 "" -- "$refit" plan --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --all-ranks --execute --dump "$tmp/dump"
python3 - "$tmp/dump/rank-1/model.safetensors" <<'PY' && ok "dump is safetensors" || bad "dump is safetensors"
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
assert h['__metadata__']['refit_layout'].startswith('vllm:tp=2') and h['__metadata__']['refit_rank'] == '1'
t = h['lm_head.weight']
assert t['dtype'] == 'BF16' and t['shape'] == [512, 64]
s, e = t['data_offsets']
data = b[8 + n + s: 8 + n + e]
# vocab 997 padded to 1024: rank 1 holds rows 512..1023, the last 27 are padding and must be zero
assert data[485 * 128:] == bytes(27 * 128) and any(data[:485 * 128])
assert e - s == 512 * 64 * 2
PY
cat >"$tmp/config.json" <<'JSON'
{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
 "num_experts": 4, "vocab_size": 1024, "tie_word_embeddings": false, "decoder_sparse_step": 1,
 "mlp_only_layers": [], "torch_dtype": "bfloat16"}
JSON
expect "config.json model" 0 "every destination byte verified" -- "$refit" plan --model "$tmp/config.json" --src megatron:tp=2,ep=2,etp=1 --dst vllm:tp=4 --all-ranks --execute
expect "unknown model" 1 "neither a built-in model" -- "$refit" plan --model nope --src hf --dst hf
expect "bad geometry" 1 "must divide tensor x data parallel" -- "$refit" plan --model tiny-moe --src megatron:tp=2,ep=4,dp=1 --dst hf
expect "bad rank" 2 "not below the destination world size" -- "$refit" plan --model tiny-moe --src hf --dst vllm:tp=2 --rank 5
expect "missing args" 2 "required" -- "$refit" plan --model tiny-moe
expect "unknown command" 2 "unknown command" -- "$refit" frobnicate

# demo
"$refit" demo --model tiny-moe --src megatron:tp=2,ep=2,etp=1 --dst vllm:tp=2 --cycles 3 --json >"$tmp/demo.json" 2>"$tmp/demo.err"
rc=$?
if [ $rc -eq 0 ]; then ok "demo exit"; else bad "demo exit $rc: $(tail -5 "$tmp/demo.err")"; fi
json_check "demo json" "o['verified'] is True and o['cycles']==3 and o['bytes_per_cycle']>0 and o['transport']=='shm' and o['memcpy_gbps']>0 and o['steady_transfer_gbps']>0 and 'steady_control_ms' in o and len(o['per_cycle'])==3 and o['per_cycle'][0]['planned'] and not o['per_cycle'][2]['planned']" "$tmp/demo.json"
grep -q "cycle 3/3 verified" "$tmp/demo.err" && ok "demo progress" || bad "demo progress lines missing"
"$refit" demo --model tiny-moe --src megatron:ep=2 --dst vllm:tp=2 --cycles 3 --delta 0.02 --json >"$tmp/delta.json" 2>/dev/null
json_check "demo delta" "o['verified'] is True and [c['delta_pulls'] for c in o['per_cycle']]==[0,2,2] and o['per_cycle'][2]['bytes']*10 < o['per_cycle'][0]['bytes'] and [c['publisher_tables_from_delta'] for c in o['per_cycle']]==[0,2,2]" "$tmp/delta.json"
expect "demo delta range" 2 "--delta takes" -- "$refit" demo --model tiny-moe --delta 1.5
"$refit" demo --model tiny-dense --src megatron:tp=2 --dst vllm:tp=1 --cycles 2 --mode snapshot --json >"$tmp/snap.json" 2>/dev/null
json_check "demo snapshot" "o['verified'] is True" "$tmp/snap.json"
expect "demo bad layout" 1 "--dst" -- "$refit" demo --model tiny-moe --dst vllm:tp=3
expect "demo missing ucx or bad transport" 1 "transport 'carrier-pigeon'" -- "$refit" demo --model tiny-moe --src megatron:tp=1 --dst vllm:tp=1 --cycles 1 --transport carrier-pigeon --timeout-s 20

# cold start from disk: a checkpoint (hf layout, truth of version 1) published
# from its mapped safetensors file, pulled into vllm:tp=2 rank 1, verified, dumped
"$refit" plan --model tiny-moe --src megatron:tp=2 --dst hf --execute --dump "$tmp/ck" >/dev/null 2>&1
REFIT_REGISTRY="file:$tmp/reg" "$refit" publish --from-safetensors "$tmp/ck/rank-0" --model tiny-moe --hold-ms 20000 \
  --job st --acks 1 >"$tmp/stpub.out" 2>&1 &
stpub=$!
expect "pull from safetensors source" 0 "verified" -- env REFIT_REGISTRY="file:$tmp/reg" "$refit" pull --model tiny-moe \
  --layout vllm:tp=2 --rank 1 --job st --verify --timeout-ms 20000 --dump "$tmp/pulled"
kill "$stpub" 2>/dev/null; wait "$stpub" 2>/dev/null
[ -s "$tmp/pulled/rank-1/model.safetensors" ] && ok "pull --dump" || bad "pull --dump wrote nothing"
# pull --json: the pulled event names the receiver's path (host memory, one source over shm: direct)
REFIT_REGISTRY="file:$tmp/reg" "$refit" publish --from-safetensors "$tmp/ck/rank-0" --model tiny-moe --hold-ms 20000 \
  --job stj --acks 1 >"$tmp/stjpub.out" 2>&1 &
stpub=$!
REFIT_REGISTRY="file:$tmp/reg" "$refit" pull --model tiny-moe --layout vllm:tp=2 --rank 1 --job stj --verify \
  --timeout-ms 20000 --json 2>/dev/null | grep '"event":"pulled"' >"$tmp/pull.json"
kill "$stpub" 2>/dev/null; wait "$stpub" 2>/dev/null
json_check "pull json path" "o['path']=='host_direct' and o['verified'] is True" "$tmp/pull.json"
expect "publish from missing dir" 1 "neither model.safetensors.index.json" -- "$refit" publish --from-safetensors "$tmp/nope" --model tiny-moe
expect "publish from wrong model" 1 "" -- "$refit" publish --from-safetensors "$tmp/ck/rank-0" --model tiny-dense

# checkpoint files that are not regular files are refused, not read: a FIFO
# named model.safetensors or config.json blocked these commands forever (the
# timeout turns such a hang into exit 124, a failure)
mkdir -p "$tmp/fifo-st" "$tmp/fifo-cfg"
mkfifo "$tmp/fifo-st/model.safetensors" "$tmp/fifo-cfg/config.json"
expect "publish from a FIFO shard" 1 "model.safetensors is a FIFO, not a regular file" -- \
  timeout 20 "$refit" publish --from-safetensors "$tmp/fifo-st" --model tiny-moe
expect "model from a FIFO config.json" 1 "config.json is a FIFO, not a regular file" -- \
  timeout 20 "$refit" plan --model "$tmp/fifo-cfg" --src hf --dst hf

# a demo child that dies (here: SIGKILL to a receiver) fails the demo at once,
# naming the child and how it died, instead of the others waiting for it until
# their timeout (60 s here; 900 s by default)
"$refit" demo --model tiny-moe --src megatron:tp=2,ep=2,etp=1 --dst vllm:tp=2 --cycles 1000 --timeout-s 60 \
  >"$tmp/kill.out" 2>"$tmp/kill.err" &
demo=$!
victim=""
for _ in $(seq 100); do # up to 10 s for the receivers to start
  for c in $(pgrep -P "$demo"); do
    if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q " pull .*--rank 1 "; then victim=$c; fi
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  bad "demo child killed: no receiver child of the demo found"
else
  sleep 1 # let it be mid-cycle
  kill -9 "$victim"
  t0=$(date +%s)
  for _ in $(seq 100); do kill -0 "$demo" 2>/dev/null || break; sleep 0.1; done # up to 10 s
  if kill -0 "$demo" 2>/dev/null; then
    bad "demo child killed: the demo still runs $(( $(date +%s) - t0 )) s after receiver 1 (pid $victim) was killed"
    for c in $(pgrep -P "$demo"); do kill -9 "$c" 2>/dev/null; done
    kill -9 "$demo" 2>/dev/null; wait "$demo" 2>/dev/null
  else
    wait "$demo"; rc=$?
    if [ "$rc" -eq 0 ]; then bad "demo child killed: exit 0"
    elif ! grep -qF "receiver 1 (pid $victim) was killed by signal 9" "$tmp/kill.err"; then
      bad "demo child killed: stderr lacks 'receiver 1 (pid $victim) was killed by signal 9': $(tail -5 "$tmp/kill.err")"
    else ok "demo child killed (exit $rc in $(( $(date +%s) - t0 )) s)"; fi
  fi
fi
if [ -z "$victim" ]; then
  for c in $(pgrep -P "$demo"); do kill -9 "$c" 2>/dev/null; done
  kill -9 "$demo" 2>/dev/null; wait "$demo" 2>/dev/null
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
