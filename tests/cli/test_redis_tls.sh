#!/usr/bin/env bash
# The registry over TLS: hiredis 0.14 (Debian 12) speaks no TLS, so the
# documented way (docs/security.md) is a stunnel client on the refit host
# that verifies the server's certificate and forwards 127.0.0.1:LOCAL to
# Redis's TLS port.  Here: a CA and a server certificate made with openssl,
# redis-server with only a TLS port (no plaintext port), stunnel in client
# mode, and a publisher and a receiver that refit a model through it, every
# byte verified.  Also: refit pointed straight at the TLS port fails clearly,
# and a stunnel that does not trust the server's CA carries nothing.  And
# `refit demo` with a password in its Redis URL: the password reaches the
# children in their environment, never on a command line, and is printed
# redacted.
# Skips (77) without redis-server, stunnel or openssl.
# Usage: test_redis_tls.sh PATH_TO_REFIT
set -u
refit=$1
skip() { echo "SKIPPED: $1"; exit 77; }
for p in redis-server stunnel openssl; do command -v $p >/dev/null || skip "$p is not installed"; done
"$refit" version | grep -q "registries:.*redis" || skip "refit was built without hiredis"
tmp=$(mktemp -d /tmp/refit-tls-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }

# A CA, and a server certificate for 127.0.0.1 signed by it.
( cd "$tmp" &&
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=refit-test-ca" &&
  openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj "/CN=127.0.0.1" &&
  printf 'subjectAltName=IP:127.0.0.1\n' >ext.cnf &&
  openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 -extfile ext.cnf &&
  openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj "/CN=other-ca" ) \
  >"$tmp/openssl.log" 2>&1 || { cat "$tmp/openssl.log"; skip "openssl could not make certificates"; }

tls_port=$(free_port)
redis-server --port 0 --tls-port "$tls_port" --bind 127.0.0.1 --tls-cert-file "$tmp/srv.crt" \
  --tls-key-file "$tmp/srv.key" --tls-ca-cert-file "$tmp/ca.crt" --tls-auth-clients no --save "" \
  --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
pids+=($!)

start_stunnel() { # NAME CAFILE PORT (not in a subshell: its pid must reach cleanup)
  local port=$3
  cat >"$tmp/$1.conf" <<EOF
foreground = yes
pid =
[redis]
client = yes
accept = 127.0.0.1:$port
connect = 127.0.0.1:$tls_port
verifyChain = yes
CAfile = $2
checkIP = 127.0.0.1
EOF
  stunnel "$tmp/$1.conf" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
}
local_port=$(free_port)
distrust_port=$(free_port)
start_stunnel tunnel "$tmp/ca.crt" "$local_port"
start_stunnel distrust "$tmp/other.crt" "$distrust_port"
for _ in $(seq 50); do
  python3 - "$local_port" <<'PY' && break
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n"); assert s.recv(16).startswith(b"+PONG")
PY
  sleep 0.1
done

secret=$tmp/job.secret
head -c 32 /dev/urandom >"$secret" && chmod 600 "$secret"
export REFIT_SECRET_FILE=$secret
reg=redis://127.0.0.1:$local_port
common=(--model tiny-moe --registry "$reg" --job tls --timeout-ms 30000)
"$refit" publish "${common[@]}" --layout megatron:ep=2 --rank 0 --versions 2 --acks 1 --json >"$tmp/pub0.log" 2>&1 &
p0=$!
"$refit" publish "${common[@]}" --layout megatron:ep=2 --rank 1 --versions 2 --acks 1 --json >"$tmp/pub1.log" 2>&1 &
p1=$!
"$refit" pull "${common[@]}" --layout vllm:tp=1 --rank 0 --versions 2 --verify --json >"$tmp/pull.log" 2>&1
rc=$?
wait $p0 && wait $p1 || rc=1
if [ $rc -eq 0 ] && [ "$(grep -c '"verified":true' "$tmp/pull.log")" -eq 2 ]; then
  ok "a refit through stunnel to Redis's TLS port: 2 versions verified"
else
  bad "refit through the tunnel: $(tail -5 "$tmp"/pub0.log "$tmp"/pull.log)"
fi
# The keys really went through Redis (over TLS): ask it through the tunnel.
keys=$(python3 - "$local_port" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"*2\r\n$4\r\nKEYS\r\n$10\r\nrefit:tls*\r\n"); print(s.recv(65536).decode(errors="replace"))
PY
)
grep -q "refit:tls:epoch" <<<"$keys" && grep -q "refit:tls:trainer/ack/" <<<"$keys" && ok "the entries are in the TLS-only Redis" || bad "keys: $keys"

# Straight at the TLS port: a clear registry error, not a hang.
out=$(timeout 20 "$refit" pull "${common[@]}" --registry "redis://127.0.0.1:$tls_port" --layout vllm:tp=1 --rank 0 \
  --timeout-ms 3000 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "REFIT_ERR_REGISTRY" <<<"$out"; then ok "plaintext to the TLS port refused: $(head -c 160 <<<"$out")"
else bad "plaintext to the TLS port: exit $rc: $out"; fi
# A tunnel that does not trust the server's certificate carries nothing.
out=$(timeout 20 "$refit" pull "${common[@]}" --registry "redis://127.0.0.1:$distrust_port" --layout vllm:tp=1 \
  --rank 0 --timeout-ms 3000 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "REFIT_ERR_REGISTRY" <<<"$out" && grep -qi "certificate verify failed\|CERT" "$tmp/distrust.log"; then
  ok "an untrusted server certificate: the tunnel refuses, refit reports a registry error"
else bad "untrusted certificate: exit $rc: $out / $(tail -3 "$tmp/distrust.log")"; fi

# A password in the URL: not on any child's command line, not in the output.
pw_port=$(free_port)
redis-server --port "$pw_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --user default off \
  --user demo on '>p@ss:w0rd' '~refit:*' '&refit:*' -@all +set +mget +del +scan +publish +subscribe +ping \
  >"$tmp/redis-pw.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$pw_port" ping 2>/dev/null | grep -q NOAUTH && break; sleep 0.1; done
"$refit" demo --model tiny-moe --src megatron:ep=2 --dst vllm:tp=2 --cycles 40 --timeout-s 60 \
  --registry "redis://demo:p@ss:w0rd@127.0.0.1:$pw_port" >"$tmp/demo.out" 2>&1 &
demo=$!
seen=0 leaked=0
for _ in $(seq 100); do
  for c in $(pgrep -P "$demo"); do
    seen=$((seen + 1))
    tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q "w0rd" && leaked=$((leaked + 1))
  done
  [ $seen -gt 0 ] && break
  sleep 0.1
done
wait "$demo"; rc=$?
if [ $rc -eq 0 ] && grep -q "cycle 40/40 verified" "$tmp/demo.out"; then ok "demo over a password URL verified"
else bad "demo over a password URL: exit $rc: $(tail -5 "$tmp/demo.out")"; fi
if [ $seen -gt 0 ] && [ $leaked -eq 0 ]; then ok "the password is on no child's command line ($seen children looked at)"
else bad "password on a command line: $leaked of $seen children"; fi
if ! grep -q "w0rd" "$tmp/demo.out" && grep -q "demo:\*\*\*@127.0.0.1" "$tmp/demo.out"; then ok "the demo prints the URL redacted"
else bad "demo output shows the password or no redacted URL: $(grep -m2 registry "$tmp/demo.out")"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
