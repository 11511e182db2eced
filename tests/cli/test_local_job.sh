#!/usr/bin/env bash
# scripts/local-job.sh, the one-host version of deploy/k8s: a real redis-server with only the job's ACL
# user, the secret and password as 0600 files, preflight, trainer and rollout ranks as processes.
# Checks: every receiver verified every version; each process's metrics textfile says so (versions,
# bytes equal to the pull reports); the files' modes; the ACL user cannot touch another job's keys; a
# trainer that dies makes the job fail (exit non-zero, not a false success); the TLS variant through
# stunnel.  Skips (77) without redis-server.  Usage: test_local_job.sh PATH_TO_REFIT
set -u
refit=$(readlink -f "$1")
here=$(cd "$(dirname "$0")/../.." && pwd)
command -v redis-server >/dev/null || { echo "SKIPPED: redis-server is not installed"; exit 77; }
"$refit" version | grep -q "registries:.*redis" || { echo "SKIPPED: refit was built without hiredis"; exit 77; }
tmp=$(mktemp -d /tmp/refit-local-job-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }

"$here/scripts/local-job.sh" --refit "$refit" --model tiny-moe --src megatron:ep=2 --dst vllm:tp=2 --versions 3 \
  --dir "$tmp/job" --keep >"$tmp/out.txt" 2>"$tmp/err.txt"
rc=$?
if [ $rc = 0 ] && grep -q "6 verified pulls" "$tmp/out.txt"; then ok "local job: 2 ranks x 3 versions verified"
else bad "local job exit $rc: $(tail -5 "$tmp/err.txt")"; fi
grep -q "preflight passed" "$tmp/err.txt" && ok "preflight ran and passed" || bad "no preflight"
# every receiver's metrics textfile against its own pull reports (JSON lines)
python3 - "$tmp/job" <<'PY' && ok "metrics textfiles match the pull reports" || bad "metrics textfiles"
import json, re, sys
d = sys.argv[1]
def series(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)\n', line)
        assert m, f"{path}: bad line {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
for r in (0, 1):
    reps = [json.loads(l) for l in open(f"{d}/logs/rollout-{r}.jsonl")]
    s = series(f"{d}/metrics/rollout-{r}.prom")
    lab = f'refit_job="local-job",group="trainer",rank="{r}"'
    assert s[f'refit_receiver_versions_committed_total{{{lab},kind="full"}}'] == 3
    assert s[f'refit_receiver_committed_version{{{lab}}}'] == 3
    key = f'refit_receiver_bytes_total{{{lab},transport="{reps[0]["transport"]}",lane="{reps[0]["lanes"]}"}}'
    assert s[key] == sum(x["bytes"] for x in reps), (key, s.get(key))
    assert s[f'refit_receiver_digest_checked_bytes_total{{{lab}}}'] == sum(x["digest_bytes"] for x in reps) > 0
    t = s[f'refit_receiver_phase_seconds_sum{{{lab},phase="transfer"}}']
    assert abs(t - sum(x["transfer_ms"] for x in reps) / 1e3) < 1e-5, t
for r in (0, 1):
    s = series(f"{d}/metrics/trainer-{r}.prom")
    assert s[f'refit_publisher_versions_published_total{{refit_job="local-job",group="trainer",rank="{r}"}}'] == 3
PY
modes=$(stat -c '%a' "$tmp/job/job.secret" "$tmp/job/redis-password" "$tmp/job/users.acl" | tr '\n' ' ')
[ "$modes" = "600 600 600 " ] && ok "secret, password and ACL files are 0600" || bad "modes: $modes"

# The ACL user is scoped to the job: the same credentials cannot open another job's keys.
port=$(sed -n 's/.*redis:\/\/localjob@127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/out.txt")
redis-server --port "${port:-0}" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/job" \
  --aclfile "$tmp/job/users.acl" >"$tmp/redis2.log" 2>&1 &
rpid=$!
for _ in $(seq 50); do redis-cli -p "$port" ping 2>&1 | grep -q "NOAUTH\|PONG" && break; sleep 0.1; done
REFIT_SECRET_FILE=$tmp/job/job.secret REFIT_REDIS_PASSWORD_FILE=$tmp/job/redis-password \
  "$refit" preflight --json --registry "redis://localjob@127.0.0.1:$port" --job other-job --transports shm >"$tmp/other.json" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q '"name":"registry","status":"fail","detail":"[^"]*NOPERM' "$tmp/other.json"; then
  ok "the job's ACL user is refused another job's keys (NOPERM)"
else bad "another job's keys: rc $rc $(head -c 600 "$tmp/other.json")"; fi
redis-cli -p "$port" ping 2>&1 | grep -q NOAUTH && ok "the default user is off" || bad "the default user answers"
kill $rpid; wait $rpid 2>/dev/null

# A job whose trainer cannot serve (its rank's publisher exits at once) must fail, not pass.
cat >"$tmp/refit-broken" <<EOF
#!/bin/sh
if [ "\$1" = publish ]; then case " \$* " in *" --rank 1 "*) echo "refit: broken on purpose" >&2; exit 1;; esac; fi
exec "$refit" "\$@"
EOF
chmod +x "$tmp/refit-broken"
timeout 300 "$here/scripts/local-job.sh" --refit "$tmp/refit-broken" --versions 1 --timeout-ms 5000 --dir "$tmp/broken" >"$tmp/b.out" 2>"$tmp/b.err"
rc=$?
if [ $rc != 0 ] && grep -q "trainer rank 1 failed\|rollout rank 0 failed" "$tmp/b.err"; then ok "a broken trainer fails the job (exit $rc)"
else bad "broken trainer: exit $rc $(tail -3 "$tmp/b.err")"; fi

if command -v stunnel >/dev/null && command -v openssl >/dev/null; then
  "$here/scripts/local-job.sh" --refit "$refit" --versions 2 --tls --dir "$tmp/tls" >"$tmp/t.out" 2>"$tmp/t.err"
  rc=$?
  if [ $rc = 0 ] && grep -q "4 verified pulls" "$tmp/t.out" && grep -q "TLS through stunnel" "$tmp/t.err"; then
    ok "--tls: through stunnel to a TLS-only Redis"
  else bad "--tls: exit $rc $(tail -3 "$tmp/t.err")"; fi
else echo "SKIPPED (--tls): no stunnel/openssl"; fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
