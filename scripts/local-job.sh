#!/usr/bin/env bash
# The Kubernetes recipe of deploy/k8s on one host, without containers: a real redis-server (no default
# user; one ACL user that may touch only the job's keys and channel, with the commands refit sends), the
# job's secret and the Redis password as 0600 files, optionally a TLS-only Redis behind a stunnel client,
# `refit preflight` for the trainer and the rollout side (any fail stops the job), then every trainer
# rank (`refit publish`) and every rollout rank (`refit pull --verify`) as processes, each writing its
# metrics to a textfile.  Exit status 0 only if every receiver verified every version.
#
# Usage: scripts/local-job.sh [options]
#   --refit PATH          the refit command (default: build/refit)
#   --job NAME            (default: local-job)
#   --model M --src L --dst L   (default: tiny-moe, megatron:ep=2, vllm:tp=2)
#   --versions K          versions to publish and pull (default: 3)
#   --transports LIST     (default: shm)
#   --timeout-ms N        how long ranks wait for each other (default: 60000)
#   --tls                 Redis on a TLS port only, reached through a stunnel client (needs openssl, stunnel)
#   --dir DIR             where everything goes (default: a fresh directory under /tmp)
#   --keep                keep DIR (logs, metrics/*.prom) after the job
# docs/operations.md describes it.
set -euo pipefail
cd "$(dirname "$0")/.."
refit=build/refit job=local-job model=tiny-moe src=megatron:ep=2 dst=vllm:tp=2 versions=3 transports=shm
tls=0 dir="" keep=0 timeout=60000
while [ $# -gt 0 ]; do
  case "$1" in
    --refit) refit=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --dst) dst=$2; shift 2 ;;
    --versions) versions=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    --timeout-ms) timeout=$2; shift 2 ;;
    --tls) tls=1; shift ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "local-job: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
log() { echo "local-job: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
for p in redis-server redis-cli python3; do command -v $p >/dev/null || die "$p is not installed (scripts/deps.sh)"; done
[ -x "$refit" ] || die "no refit command at $refit (scripts/build.sh, or --refit PATH)"
if [ $tls = 1 ]; then for p in stunnel openssl; do command -v $p >/dev/null || die "--tls needs $p"; done; fi
[ -n "$dir" ] || dir=$(mktemp -d /tmp/refit-local-job-XXXXXX)
mkdir -p "$dir/logs" "$dir/metrics"
chmod 700 "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ $keep = 0 ]; then rm -rf "$dir"; else log "kept $dir"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
worlds() { "$refit" plan --model "$model" --src "$src" --dst "$dst" --json |
           python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["src_ranks"], d["dst_ranks"])'; }

# The job's credentials: files only this user can read.
umask 077
head -c 32 /dev/urandom >"$dir/job.secret"
python3 -c 'import secrets; print(secrets.token_hex(24))' >"$dir/redis-password"
user=$(echo "$job" | tr -cd 'A-Za-z0-9')
[ -n "$user" ] || die "--job $job has no letters or digits for a Redis user name"
# The same ACL as deploy/k8s/registry.yaml.
printf 'user default off\nuser %s on >%s resetkeys ~refit:%s:* resetchannels &refit:%s:events -@all +set +mget +del +scan +publish +subscribe +ping +time\n' \
  "$user" "$(cat "$dir/redis-password")" "$job" "$job" >"$dir/users.acl"
umask 022

port=$(free_port)
if [ $tls = 0 ]; then
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --aclfile "$dir/users.acl" \
    >"$dir/logs/redis.log" 2>&1 &
  pids+=($!)
  rport=$port
else
  ( cd "$dir" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=refit-local-ca" &&
    openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj "/CN=127.0.0.1" &&
    printf 'subjectAltName=IP:127.0.0.1\n' >ext.cnf &&
    openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 -extfile ext.cnf ) \
    >"$dir/logs/openssl.log" 2>&1 || die "openssl (see $dir/logs/openssl.log)"
  redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --tls-cert-file "$dir/srv.crt" --tls-key-file "$dir/srv.key" \
    --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no --save "" --appendonly no --dir "$dir" \
    --aclfile "$dir/users.acl" >"$dir/logs/redis.log" 2>&1 &
  pids+=($!)
  rport=$(free_port)
  cat >"$dir/stunnel.conf" <<EOF
foreground = yes
pid =
[redis]
client = yes
accept = 127.0.0.1:$rport
connect = 127.0.0.1:$port
verifyChain = yes
CAfile = $dir/ca.crt
checkIP = 127.0.0.1
EOF
  stunnel "$dir/stunnel.conf" >"$dir/logs/stunnel.log" 2>&1 &
  pids+=($!)
fi
for _ in $(seq 100); do
  if [ $tls = 0 ]; then
    redis-cli -p "$port" --user "$user" --pass "$(cat "$dir/redis-password")" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
  else
    redis-cli -p "$rport" --user "$user" --pass "$(cat "$dir/redis-password")" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
  fi
  sleep 0.1
done
export REFIT_SECRET_FILE=$dir/job.secret REFIT_REDIS_PASSWORD_FILE=$dir/redis-password
registry=redis://$user@127.0.0.1:$rport
how="plaintext on loopback"
[ $tls = 0 ] || how="TLS through stunnel"
log "registry $registry (user $user, keys refit:$job:*, $how)"

# Preflight, as the init containers do.
read -r ntrain nroll < <(worlds) || die "refit plan --model $model --src $src --dst $dst"
common=(--registry "$registry" --job "$job" --transports "$transports" --model "$model" --src "$src" --dst "$dst")
"$refit" preflight "${common[@]}" --role trainer --ranks all >"$dir/logs/preflight-trainer.txt" 2>&1 ||
  { cat "$dir/logs/preflight-trainer.txt" >&2; die "preflight (trainer) failed"; }
"$refit" preflight "${common[@]}" --role rollout --ranks all >"$dir/logs/preflight-rollout.txt" 2>&1 ||
  { cat "$dir/logs/preflight-rollout.txt" >&2; die "preflight (rollout) failed"; }
log "preflight passed for $ntrain trainer and $nroll rollout ranks ($(tail -1 "$dir/logs/preflight-rollout.txt"))"

run=(--registry "$registry" --job "$job" --transports "$transports" --model "$model" --versions "$versions"
     --timeout-ms "$timeout" --json)
pub_pids=()
for ((r = 0; r < ntrain; r++)); do
  REFIT_METRICS_FILE="$dir/metrics/trainer-$r.prom" "$refit" publish "${run[@]}" --layout "$src" --rank "$r" \
    --acks "$nroll" >"$dir/logs/trainer-$r.jsonl" 2>"$dir/logs/trainer-$r.err" &
  pub_pids+=($!)
  pids+=($!)
done
rx_pids=()
for ((r = 0; r < nroll; r++)); do
  REFIT_METRICS_FILE="$dir/metrics/rollout-$r.prom" "$refit" pull "${run[@]}" --layout "$dst" --rank "$r" --verify \
    >"$dir/logs/rollout-$r.jsonl" 2>"$dir/logs/rollout-$r.err" &
  rx_pids+=($!)
  pids+=($!)
done
failed=0
for r in "${!rx_pids[@]}"; do
  if ! wait "${rx_pids[$r]}"; then
    failed=1
    log "rollout rank $r failed: $(tail -2 "$dir/logs/rollout-$r.err")"
  fi
done
for r in "${!pub_pids[@]}"; do
  if ! wait "${pub_pids[$r]}"; then
    failed=1
    log "trainer rank $r failed: $(tail -2 "$dir/logs/trainer-$r.err")"
  fi
done
[ $failed = 0 ] || die "the job failed (logs in $dir/logs; --keep keeps them)"
verified=$(cat "$dir"/logs/rollout-*.jsonl | grep -c '"verified":true' || true)
[ "$verified" = $((nroll * versions)) ] || die "$verified verified pulls, want $((nroll * versions))"
log "done: $nroll rollout ranks verified $versions versions each from $ntrain trainer ranks; metrics in $dir/metrics"
echo "local job $job: $verified verified pulls ($nroll ranks x $versions versions), registry $registry"
