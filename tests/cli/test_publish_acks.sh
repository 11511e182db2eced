#!/usr/bin/env bash
# Errors that say what to change (issue 31, item 4): `refit publish --versions N` with one receiver and no
# --acks used to replace each version before the receiver leased it (REFIT_ERR_STALE over ucx) and to exit
# under the last one's transfer ("source rank 0 died during the transfer" over shm).  Now a publish without
# --acks and without --hold-ms waits for one receiver to commit each version; what still goes wrong says
# what to change.  Every pull --verify checks the synthetic truth byte for byte.
# Usage: test_publish_acks.sh PATH_TO_REFIT
set -u
refit=$1
tmp=$(mktemp -d /tmp/refit-acks-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
have_ucx=0
"$refit" version | grep -q "transports:.* ucx)" && have_ucx=1
n=0
args() { echo --model tiny-moe --registry "file:$tmp/reg$n" --job acks$n; }

# 1. --versions 3, one receiver of 3 versions, no --acks: every version arrives, verified (shm and ucx).
for tr in shm ucx; do
  [ "$tr" = ucx ] && [ $have_ucx = 0 ] && { echo "skipped: ucx is not built in"; continue; }
  n=$((n + 1))
  "$refit" publish $(args) --layout megatron:ep=1 --rank 0 --transports $tr --versions 3 --timeout-ms 30000 \
    >"$tmp/pub$n.log" 2>&1 & pp=$!; pids+=($pp)
  "$refit" pull $(args) --layout vllm:tp=1 --rank 0 --transports $tr --versions 3 --verify --json --timeout-ms 30000 \
    >"$tmp/pull$n.log" 2>&1; rc=$?
  wait $pp; prc=$?
  if [ $rc -eq 0 ] && [ $prc -eq 0 ] && python3 - "$tmp/pull$n.log" "$tr" <<'PY'; then ok "$tr: publish --versions 3 without --acks: 3 versions pulled, verified"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
assert [r['version'] for r in rows] == [1, 2, 3], rows
assert all(r['event'] == 'pulled' and r['verified'] and r['bytes'] > 0 and r['transport'] == sys.argv[2] for r in rows), rows
PY
  else bad "$tr: rc $rc/$prc: $(tail -3 "$tmp/pull$n.log") $(tail -2 "$tmp/pub$n.log")"; fi
done

# 2. A publisher told not to wait (--acks 0) moved on: the receiver's REFIT_ERR_STALE says what to change.
n=$((n + 1))
"$refit" publish $(args) --layout megatron:ep=1 --rank 0 --transports shm --versions 3 --acks 0 --hold-ms 8000 \
  >"$tmp/pub$n.log" 2>&1 & pp=$!; pids+=($pp)
for _ in $(seq 100); do grep -q "published version 3" "$tmp/pub$n.log" && break; sleep 0.05; done
out=$("$refit" pull $(args) --layout vllm:tp=1 --rank 0 --transports shm --versions 1 --timeout-ms 10000 2>&1); rc=$?
kill $pp 2>/dev/null
if [ $rc -ne 0 ] && grep -q "version 1 was replaced by 3 before it was pulled: its publishers did not wait" <<<"$out" &&
  grep -qF 'refit publish --acks N' <<<"$out" && grep -qF 'refit pull --newest' <<<"$out" &&
  grep -q "(REFIT_ERR_STALE)" <<<"$out"; then ok "a version replaced before it was pulled: the error names --acks N and --newest"
else bad "stale: rc $rc: $out"; fi

# 3. No receiver comes: the default --acks 1 times out saying what it waited for and how not to.
n=$((n + 1))
t0=$(date +%s.%N)
out=$("$refit" publish $(args) --layout megatron:ep=1 --rank 0 --transports shm --timeout-ms 1000 2>&1); rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
if [ $rc -ne 0 ] && grep -q "0 of 1 receivers committed version 1 within 1000 ms: --acks 1 (the default without --hold-ms)" <<<"$out" &&
  grep -qF -- "--acks 0" <<<"$out" && [ "$(echo "$took >= 1 && $took < 10" | bc)" = 1 ]; then
  ok "no receiver: the default --acks 1 fails after ${took}s naming it"
else bad "no receiver: rc $rc after ${took}s: $out"; fi

# 4. --acks 0 asks for no waiting: the publisher exits at once, as before.
n=$((n + 1))
t0=$(date +%s.%N)
out=$("$refit" publish $(args) --layout megatron:ep=1 --rank 0 --transports shm --acks 0 --timeout-ms 20000 2>&1); rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
if [ $rc -eq 0 ] && grep -q "published version 1" <<<"$out" && [ "$(echo "$took < 5" | bc)" = 1 ]; then
  ok "--acks 0: published and exited in ${took}s"
else bad "--acks 0: rc $rc after ${took}s: $out"; fi
pids=()
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
