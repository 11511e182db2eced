#!/usr/bin/env bash
# refit preflight: a healthy host passes (file registry, and a real Redis
# with an ACL user and a secret file), and each check's failure is provoked
# for real and reported as "fail" on its own line, with a remedy, and exit
# status 1: a stopped Redis, a Redis user without the job's keys, no secret /
# a missing / an over-permissive secret file, a tiny memlock without
# CAP_IPC_LOCK (prlimit + setpriv), ucx.require=rdma on TCP lanes, a listen
# address of no interface here and a wildcard, a shm runtime dir others may
# enter, a small /dev/shm (a private mount namespace, as root), more memory
# than this host has, a clock 30 s off (faketime), a GPU asked for where
# there is none, a plan that cannot be made.  Usage: test_preflight.sh PATH_TO_REFIT
set -u
refit=$1
tmp=$(mktemp -d /tmp/refit-preflight-test-XXXXXX)
chmod 700 "$tmp"
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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The ASan runtime must come first among preloaded libraries; faketime preloads its own.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"

# run NAME [env...] -- ARGS: refit preflight --json ARGS (with env), output in $tmp/NAME.json, status in $tmp/NAME.rc
run() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"
  echo $? >"$tmp/$name.rc"
}
# field NAME CHECK KEY: the check's status (or detail, remedy)
field() {
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
c=[c for c in d["checks"] if c["name"]==sys.argv[2]]
print(c[0][sys.argv[3]] if c else "absent")' "$tmp/$1.json" "$2" "$3" 2>/dev/null || echo "unparsable"
}
# expect NAME CHECK STATUS [NEEDLE]: the check has that status, its detail the needle, and a fail
# has a remedy and made the exit status 1
expect() {
  local name=$1 check=$2 want=$3 needle=${4:-}
  local got rc detail rem
  got=$(field "$name" "$check" status)
  detail=$(field "$name" "$check" detail)
  rem=$(field "$name" "$check" remedy)
  rc=$(cat "$tmp/$name.rc")
  # want may list alternatives: "pass|warn" (a registry round trip can pass 5 ms on a loaded machine)
  if ! grep -qxF -- "$got" <<<"$(tr '|' '\n' <<<"$want")"; then
    bad "$name: $check is '$got', want '$want' ($detail)"; sed 's/^/    /' "$tmp/$name.err" | head -5; return
  fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$detail"; then bad "$name: $check detail lacks '$needle': $detail"; return; fi
  if [ "$want" = fail ] && [ -z "$rem" ]; then bad "$name: $check fails without a remedy"; return; fi
  if [ "$want" = fail ] && [ "$rc" != 1 ]; then bad "$name: a fail, but exit status $rc"; return; fi
  ok "$name: $check $want${needle:+ ($needle)}"
}
# healthy NAME: no check failed and the exit status is 0
healthy() {
  local rc n
  rc=$(cat "$tmp/$1.rc")
  n=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["fail"], d["ok"])' "$tmp/$1.json" 2>/dev/null)
  if [ "$rc" = 0 ] && [ "$n" = "0 True" ]; then ok "$1: no fail, exit 0"; else bad "$1: exit $rc, fail/ok '$n'"; cat "$tmp/$1.json"; fi
}

model=(--model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --ranks 0,1)
P=("$refit" preflight --json)

# ---- a healthy host, file registry ---------------------------------------------------------
# (the job's metrics variables set, as in deploy/k8s: preflight's probe refits must not touch them)
run file_ok REFIT_METRICS_FILE="$tmp/job.prom" -- "${P[@]}" --registry "file:$tmp/reg" --job pf "${model[@]}"
healthy file_ok
[ ! -e "$tmp/job.prom" ] && ok "file_ok: the job's metrics textfile is left alone" || bad "preflight wrote REFIT_METRICS_FILE"
for c in transports plan memory memlock /dev/shm "shm runtime dir" "shm loopback" auth clock; do
  expect file_ok "$c" pass
done
expect file_ok plan pass "redundant 0 bytes"
expect file_ok "shm loopback" pass "shm:mmap"
expect file_ok registry "pass|warn" "written, read back and deleted"
if "$refit" version | grep -q "transports:.*ucx"; then
  expect file_ok "ucx lanes" warn "ucx:tcp"
  # ---- UCX: require=rdma on TCP lanes; listen addresses --------------------------------------
  run rdma_req -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transport-options ucx.require=rdma
  expect rdma_req "ucx lanes" fail "REFIT_ERR_TRANSPORT"
  grep -q "UCX found no RDMA lane" "$tmp/rdma_req.json" && ok "rdma_req: remedy names the RDMA lane" || bad "rdma_req: remedy"
  if [ ! -d /sys/class/infiniband ]; then expect rdma_req "rdma devices" fail "ucx.require=rdma"; fi
  run listen_bad -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports ucx --transport-options ucx.listen=192.0.2.1
  expect listen_bad "ucx listen" fail "no interface of this host"
  expect listen_bad "ucx lanes" skip
  run listen_any -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports ucx --transport-options ucx.listen=0.0.0.0
  expect listen_any "ucx listen" fail "every interface"
  run listen_lo -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports ucx --transport-options ucx.listen=lo
  expect listen_lo "ucx listen" pass "listen=lo"
  # ---- TCP congestion control: this host's, then both verdicts in a namespace set to each -----
  case $(cat /proc/sys/net/ipv4/tcp_congestion_control) in
  bbr*) expect file_ok "tcp congestion" warn "PROBE_RTT" ;;
  *) expect file_ok "tcp congestion" pass "tcp_congestion_control=" ;;
  esac
  ns=refit-pf-$$
  if [ "$(id -u)" = 0 ] && ip netns add "$ns" 2>/dev/null; then
    trap 'ip netns del "$ns" 2>/dev/null; cleanup' EXIT
    ip -n "$ns" link set lo up
    for cc in cubic bbr; do
      if ip netns exec "$ns" sh -c "echo $cc > /proc/sys/net/ipv4/tcp_congestion_control" 2>/dev/null; then
        run cc_$cc -- ip netns exec "$ns" "${P[@]}" --registry "file:$tmp/reg" --job pf --transports ucx
        if [ $cc = cubic ]; then expect cc_$cc "tcp congestion" pass "tcp_congestion_control=cubic"
        else
          expect cc_$cc "tcp congestion" warn "holds each connection to 4 packets for 200 ms (PROBE_RTT)"
          grep -q "tcp_congestion_control=cubic on each node" "$tmp/cc_$cc.json" && ok "cc_bbr: the remedy names cubic" ||
            bad "cc_bbr: remedy lacks cubic"
        fi
      else
        echo "skip: congestion control $cc is not available here"
      fi
    done
    ip netns del "$ns"
  else
    echo "skip: no network namespace (not root, or no ip): only this host's congestion control checked"
  fi
  # ---- memlock: RDMA registration against a tiny limit, without CAP_IPC_LOCK ------------------
  nocap=(setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock)
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    run memlock_small -- "${nocap[@]}" prlimit --memlock=65536:65536 "${P[@]}" --registry "file:$tmp/reg" --job pf \
      "${model[@]}" --transport-options ucx.require=rdma
    expect memlock_small memlock fail "RLIMIT_MEMLOCK 64.0 KiB <"
    # (8 MiB: the hard limit may not be raised here; the job's 816 KiB fit)
    run memlock_big -- "${nocap[@]}" prlimit --memlock=8388608:8388608 "${P[@]}" --registry "file:$tmp/reg" --job pf \
      "${model[@]}" --transport-options ucx.require=rdma
    expect memlock_big memlock pass "RLIMIT_MEMLOCK 8.0 MiB >= 816"
    run memlock_cap -- prlimit --memlock=65536:65536 "${P[@]}" --registry "file:$tmp/reg" --job pf "${model[@]}" \
      --transport-options ucx.require=rdma
    expect memlock_cap memlock pass "CAP_IPC_LOCK held"
  elif [ "$(id -u)" != 0 ] && [ "$(ulimit -Hl)" != unlimited ]; then
    # not root: no CAP_IPC_LOCK; lower our own limit
    run memlock_small -- prlimit --memlock=65536:65536 "${P[@]}" --registry "file:$tmp/reg" --job pf "${model[@]}" \
      --transport-options ucx.require=rdma
    expect memlock_small memlock fail "RLIMIT_MEMLOCK 64.0 KiB <"
  else
    echo "SKIPPED (memlock): cannot drop CAP_IPC_LOCK here"
  fi
else
  echo "SKIPPED (ucx): refit was built without UCX"
fi

# ---- shm runtime dir that others may enter ---------------------------------------------------
mkdir -p "$tmp/open"
chmod 777 "$tmp/open"
run rundir_open REFIT_RUNTIME_DIR="$tmp/open" -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
expect rundir_open "shm runtime dir" fail "mode 0777"
expect rundir_open "shm loopback" fail "REFIT_ERR_AUTH"

# ---- /dev/shm too small: a private mount namespace with a 16 MiB tmpfs (root only) ------------------
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  run shm_small -- unshare -m sh -c 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"' sh \
    "${P[@]}" --registry "file:$tmp/reg" --job pf
  expect shm_small /dev/shm fail "below 64.0 MiB"
else
  echo "SKIPPED (/dev/shm): a private mount namespace needs root"
fi
run shm_need -- "${P[@]}" --registry "file:$tmp/reg" --job pf --shm-need 1000000000000000
expect shm_need /dev/shm fail "(--shm-need)"

# ---- memory: a trainer host holding more than this machine has ----------------------------------
run memory_big -- "${P[@]}" --registry "file:$tmp/reg" --job pf --model qwen3-235b-a22b --src megatron:tp=1 \
  --dst vllm:tp=8 --role trainer --ranks 0 --transports shm
expect memory_big memory fail "need 437.9 GiB"
expect memory_big plan pass "all 8 rollout ranks plan from them"

# ---- the plan: a rank out of range, a layout the model cannot take ------------------------------------
run plan_rank -- "${P[@]}" --registry "file:$tmp/reg" --job pf --model tiny-moe --src megatron:ep=4 --dst vllm:tp=2 --ranks 5
expect plan_rank plan fail "rank 5 is not below"
run plan_geom -- "${P[@]}" --registry "file:$tmp/reg" --job pf --model tiny-dense --src megatron:tp=3 --dst vllm:tp=2
expect plan_geom plan fail "--src"

# ---- a GPU asked for where there is none -----------------------------------------------------------
gpus=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])' < <("$refit" gpus) 2>/dev/null || echo 0)
if [ "$gpus" = 0 ]; then
  run gpu_none -- "${P[@]}" --registry "file:$tmp/reg" --job pf --device 0 --transports shm
  expect gpu_none gpus fail "--device 0 asked"
  expect file_ok gpus skip
fi

# ---- the clock 30 s off: the file registry's times disagree with ours ------------------------------------
if command -v faketime >/dev/null; then
  run clock_off -- faketime -f +30s "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
  expect clock_off clock fail "are -30.0"
else
  echo "SKIPPED (clock): faketime is not installed (scripts/deps.sh installs it)"
fi

# ---- secrets on a file registry ------------------------------------------------------------------------
head -c 32 /dev/urandom >"$tmp/job.secret"
chmod 600 "$tmp/job.secret"
run secret_ok REFIT_SECRET_FILE="$tmp/job.secret" -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
expect secret_ok auth pass "file $tmp/job.secret"
run secret_missing REFIT_SECRET_FILE="$tmp/nope.secret" -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
expect secret_missing auth fail "No such file"
cp "$tmp/job.secret" "$tmp/open.secret"
chmod 644 "$tmp/open.secret"
run secret_open REFIT_SECRET_FILE="$tmp/open.secret" -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
expect secret_open auth fail "mode 0644"
run insecure REFIT_INSECURE=1 -- "${P[@]}" --registry "file:$tmp/reg" --job pf --transports shm
expect insecure auth warn "REFIT_INSECURE=1"

# ---- a real Redis with an ACL user and a secret file ------------------------------------------------------
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null && "$refit" version | grep -q "registries:.*redis"; then
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
  rpid=$!
  pids+=($rpid)
  for _ in $(seq 50); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  echo "pfpw-$RANDOM-$RANDOM" >"$tmp/redis.pw"
  chmod 600 "$tmp/redis.pw"
  redis-cli -p "$port" ACL SETUSER pf on ">$(cat "$tmp/redis.pw")" '~refit:pf:*' '&refit:pf:events' -@all +set +mget +del +scan +publish +subscribe +ping +time >/dev/null
  redis-cli -p "$port" ACL SETUSER other on ">$(cat "$tmp/redis.pw")" '~refit:other:*' '&refit:other:events' -@all +set +mget +del +scan +publish +subscribe +ping +time >/dev/null
  R=(--registry "redis://pf@127.0.0.1:$port" --job pf)
  E=(REFIT_SECRET_FILE="$tmp/job.secret" REFIT_REDIS_PASSWORD_FILE="$tmp/redis.pw")
  run redis_ok "${E[@]}" -- "${P[@]}" "${R[@]}" "${model[@]}"
  healthy redis_ok
  expect redis_ok registry "pass|warn" "redis://pf@127.0.0.1:$port"
  expect redis_ok auth pass "file $tmp/job.secret"
  expect redis_ok clock pass "Redis's clock is"
  if [ "$(redis-cli -p "$port" --no-auth-warning --user pf --pass "$(cat "$tmp/redis.pw")" --scan --pattern 'refit:pf:preflight*' | wc -l)" = 0 ]; then
    ok "redis_ok: the probe left no key behind"
  else bad "redis_ok: probe keys left in Redis"; fi
  # the human table says the same, one line per check, remedies under warnings
  env "${E[@]}" "$refit" preflight "${R[@]}" "${model[@]}" >"$tmp/human.txt" 2>&1
  if [ $? = 0 ] && grep -q "^registry  *pass " "$tmp/human.txt" && grep -q "^ucx lanes  *warn " "$tmp/human.txt" &&
     grep -q "^  *-> TCP lanes" "$tmp/human.txt" && grep -q "pass, .* warn, 0 fail" "$tmp/human.txt"; then
    ok "human table"
  else bad "human table:"; cat "$tmp/human.txt"; fi
  run redis_nosecret REFIT_REDIS_PASSWORD_FILE="$tmp/redis.pw" -- "${P[@]}" "${R[@]}" --transports shm
  expect redis_nosecret auth fail "a redis registry and no secret"
  expect redis_nosecret registry "pass|warn"
  run redis_wrongpw "${E[@]}" REFIT_REDIS_PASSWORD=wrong REFIT_REDIS_PASSWORD_FILE= -- "${P[@]}" "${R[@]}" --transports shm
  expect redis_wrongpw registry fail "REFIT_ERR_AUTH"
  run redis_noperm "${E[@]}" -- "${P[@]}" --registry "redis://other@127.0.0.1:$port" --job pf --transports shm
  expect redis_noperm registry fail "NOPERM"
  # a stopped Redis
  kill "$rpid"
  wait "$rpid" 2>/dev/null
  run redis_down "${E[@]}" -- "${P[@]}" "${R[@]}" --transports shm
  expect redis_down registry fail "REFIT_ERR_REGISTRY"
  expect redis_down clock skip
  expect redis_down auth pass
else
  echo "SKIPPED (redis): no redis-server/redis-cli, or refit built without hiredis"
fi

# ---- usage errors --------------------------------------------------------------------------------------
"$refit" preflight --src megatron:ep=4 >/dev/null 2>"$tmp/usage.err"
if [ $? = 2 ] && grep -q "go with --model" "$tmp/usage.err"; then ok "usage: --src without --model"; else bad "usage"; fi
"$refit" preflight --role chef >/dev/null 2>&1
[ $? = 2 ] && ok "usage: --role" || bad "usage: --role"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
