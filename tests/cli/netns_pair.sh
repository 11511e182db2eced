# shellcheck shell=bash
# Sourced by the network-namespace tests (test_netns.sh, test_netns_start.sh) after `refit=PATH_TO_REFIT` and
# `tmp_prefix=NAME`: skips (exit 77) when namespaces cannot be made (not root, no iproute2) or refit was built
# without UCX; otherwise holds two namespaces on a bridge up (`refit-bench netns 2`: tools/common/tool_netns.c,
# the setup the benchmarks and the C tests use) until the script exits, and sets a, addr_a, va and b, addr_b, vb
# (each namespace, its address, its veth), tmp (a fresh directory, removed at exit), pids (processes the script
# starts: killed at exit), and ok/bad counting into pass/fail.
skip() { echo "SKIPPED: $1"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
"$refit" version | grep -q "transports:.* ucx)" || skip "refit was built without UCX"
bench="$(dirname "$refit")/refit-bench"
[ -x "$bench" ] || { echo "FAIL: $bench is missing"; exit 1; }
tmp=$(mktemp -d "/tmp/$tmp_prefix-XXXXXX")
pids=()
# refit-bench netns takes its namespaces down when its standard input ends.
netns_release() { local fd=${NETNS[1]:-}; [ -z "$fd" ] || eval "exec $fd>&-"; }
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  netns_release
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
coproc NETNS { exec "$bench" netns 2; }
{ read -r -t 60 a addr_a va && read -r -t 60 b addr_b vb && read -r -t 60 ready && [ "$ready" = READY ]; } \
  <&"${NETNS[0]}" || {
  netns_release
  wait "$NETNS_PID"; rc=$?
  [ $rc -eq 77 ] && skip "refit-bench netns could not make namespaces"
  echo "FAIL: refit-bench netns 2: exit $rc"; exit 1
}
echo "namespaces: $a ($addr_a, $va) and $b ($addr_b, $vb)"
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
