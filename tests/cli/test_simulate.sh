#!/usr/bin/env bash
# refit simulate end to end: the calibration can fail (links ignored, relays
# ignored), the JSON and the PNG of a run, errors, and the planner at scale
# (every destination rank of the field's fleets planned with threads, plans
# identical to one thread's, within a bound of CPU time; REFIT_PLAN_BOUND_SCALE
# widens the bound for sanitizer builds).
# Usage: test_simulate.sh PATH_TO_REFIT RESULTS_DIR
set -u
refit=$1
results=$2
scale=${REFIT_PLAN_BOUND_SCALE:-1}
tmp=$(mktemp -d /tmp/refit-sim-XXXXXX)
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

# The calibration passes, and fails when the model leaves out the links' rates or the relays.
expect "calibration" 0 "0 outside" -- "$refit" simulate --calibrate --results "$results"
expect "calibration without tbf rates fails" 1 "outside" -- "$refit" simulate --calibrate --results "$results" --ignore tbf
expect "calibration without relays fails" 1 "fanout: 8 receivers" -- "$refit" simulate --calibrate --results "$results" --ignore relays
expect "calibration: unknown term" 1 "--ignore takes" -- "$refit" simulate --calibrate --results "$results" --ignore nothing
expect "calibration: no results" 1 "cannot read" -- "$refit" simulate --calibrate --results "$tmp/none"
"$refit" simulate --calibrate --results "$results" --json >"$tmp/cal.json"
if python3 -c "
import json,sys
o=json.load(open(sys.argv[1]))
rows=o['rows']
assert len(rows)>=13 and o['outside']==0, o
names=[r['name'] for r in rows]
for want in ['fanout','straggler','egress','delta','H200']:
    assert any(n.startswith(want) for n in names), want
assert all(abs(r['predicted_s']/r['measured_s']-1-r['error'])<1e-3 for r in rows)
" "$tmp/cal.json" 2>"$tmp/err"; then ok "calibration json"; else bad "calibration json: $(cat "$tmp/err")"; fi

# A run: JSON on stdout and in --out, a PNG timeline.
net="name=netns,gpus=1,nics=1,nic=200MB,nvlink=0,pcie=0,proto=tcp,mtu=1500,l2=14"
"$refit" simulate --model qwen3-30b-a3b-mini --src megatron:tp=1 --dst vllm:tp=4 --rank 0 --replicas 4 --relays \
  --max-readers 1 --cluster "$net" --json --out "$tmp/run.json" --plot "$tmp/run.png" >"$tmp/stdout.json"
rc=$?
if [ $rc -eq 0 ] && cmp -s "$tmp/stdout.json" "$tmp/run.json" && python3 -c "
import json,sys,zlib,struct
o=json.load(open(sys.argv[1]))
assert o['replicas']==4 and o['relays'] is True and o['mode']=='chunks'
assert o['predicted_refit_s']>0 and o['bottleneck']['link'].startswith('nic-')
assert o['trainer_egress_bytes']==o['bytes_per_receiver_max'], 'a chain: one copy leaves the trainer'
assert len(o['receivers'])==4 and all(r['end_s']>r['transfer_begin_s']>=r['begin_s'] for r in o['receivers'])
assert sum(n['tx_bytes'] for n in o['bytes_per_nic'])==sum(n['rx_bytes'] for n in o['bytes_per_nic'])
assert o['cluster']['wire_efficiency']==round(1448/1514,5)
d=open(sys.argv[2],'rb').read()
assert d[:8]==b'\x89PNG\r\n\x1a\n'
pos=8; idat=b''
while pos<len(d):
    n=struct.unpack('>I',d[pos:pos+4])[0]; t=d[pos+4:pos+8]; body=d[pos+8:pos+8+n]
    assert zlib.crc32(t+body)&0xffffffff==struct.unpack('>I',d[pos+8+n:pos+12+n])[0], t
    if t==b'IHDR': w,h=struct.unpack('>II',body[:8])
    if t==b'IDAT': idat+=body
    pos+=12+n
raw=zlib.decompress(idat)
assert len(raw)==(w*3+1)*h and w==1000
" "$tmp/run.json" "$tmp/run.png" 2>"$tmp/err"; then ok "run json and png"; else bad "run json and png (rc $rc): $(cat "$tmp/err")"; fi

# Errors and listings.
expect "unknown cluster key" 1 "unknown key 'warp'" -- "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --cluster warp=9
expect "bad rate" 1 "bad value" -- "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --cluster nic=fast
expect "bad layout" 1 "" -- "$refit" simulate --model tiny-moe --src megatron:ep=3 --dst vllm:tp=2
expect "no model" 2 "usage" -- "$refit" simulate --src megatron:ep=4 --dst vllm:tp=2
expect "too many relay replicas" 1 "relay slots" -- "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --replicas 17 --relays
expect "cluster too small" 1 "the cluster has" -- "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --cluster nodes=1
# Cluster sizes past the simulator's bounds (nodes 4e9, gpus 1e8, dst_at 1e11 grew to gigabytes): named
# errors at once (the field, its value, the bound); a fleet of the field's largest size (~100k GPUs) still runs.
sim_tm=(timeout 30 "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2)
expect "bound: nodes" 1 "nodes = 4000000000 is more than the simulator's bound of 131072" -- "${sim_tm[@]}" --cluster '{"nodes": 4e9}'
expect "bound: gpus" 1 "gpus = 100000000 is more than the simulator's bound of 1024" -- "${sim_tm[@]}" --cluster '{"gpus": 1e8}'
expect "bound: dst_at" 1 "dst_at = 100000000000 is more than the simulator's bound of 131071" -- "${sim_tm[@]}" --cluster '{"dst_at": 1e11}'
expect "bound: nodes x gpus" 1 "the cluster needs 1048576 GPUs (nodes 131072 x gpus 8" -- "${sim_tm[@]}" --cluster nodes=131072,gpus=8
expect "bound: dst_gpus" 1 "bound of 131072 GPUs" -- "${sim_tm[@]}" --cluster dst_gpus=0/4000000000
expect "bound: a 102400-GPU cluster runs" 0 "predicted refit" -- "${sim_tm[@]}" --cluster nodes=12800,gpus=8
expect "presets" 0 "gb200-nvl72" -- "$refit" simulate --presets
expect "json cluster file" 0 "predicted refit" -- "$refit" simulate --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 \
  --cluster "{\"gpus\": 4, \"nics\": 4, \"nic\": \"100Gb\"}"

# The planner at scale: every destination rank of the field's fleets (one plan per rank; a receiver
# of any replica plans the same), planned with 2 threads, identical to 1 thread, within the bound.
plan_bound() { # plan_bound NAME MS MODEL SRC DST
  local name=$1 ms=$2; shift 2
  local bound=$((ms * scale))
  expect "plan at scale: $name (< $bound ms of CPU)" 0 "plans identical" -- "$refit" simulate --plan-scale --model "$1" --src "$2" \
    --dst "$3" --threads 2 --max-ms "$bound"
}
plan_bound "kimi-k2 256 -> tp8,ep8" 4000 kimi-k2 megatron:pp=4,ep=64,first=16 vllm:tp=8,ep=8
plan_bound "kimi-k2 256 -> tp16,ep16" 6000 kimi-k2 megatron:pp=4,ep=64,first=16 vllm:tp=16,ep=16
plan_bound "deepseek-v3 128 -> tp8,ep8" 3000 deepseek-v3 megatron:pp=4,ep=32,first=16 vllm:tp=8,ep=8
plan_bound "qwen3-30b-a3b ep8 -> tp2" 2000 qwen3-30b-a3b megatron:ep=8,dp=16 vllm:tp=2
plan_bound "qwen3-30b-a3b ep8 -> tp2,ep2" 2000 qwen3-30b-a3b megatron:ep=8,dp=16 vllm:tp=2,ep=2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
