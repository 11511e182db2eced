#!/usr/bin/env bash
# Start-up before the network (issue 31, item 3): a receiver or publisher started while its UCX device or
# route is not up yet waits for it within its timeout, and fails naming the device/address and what it saw
# when it never comes.  Two network namespaces on a bridge (`refit-bench netns 2`, as test_netns.sh), UCX
# over TCP on the veth pair, the embedded file registry; every pull --verify checks the synthetic truth
# byte for byte ("verified": true only when every byte matched).  Before the change: a receiver started
# with its link down failed at once "Destination is unreachable"; a publisher whose listen address was not
# assigned yet failed at create; one whose link was down listened but UCX refused its connections ("a device
# which was not present during UCP initialization") and receivers failed "Endpoint is not connected".
# Skips (exit 77) when namespaces cannot be made (not root, no iproute2) or refit was built without UCX.
# Usage: test_netns_start.sh PATH_TO_REFIT
set -u
refit=$1
tmp_prefix=refit-netns-start
# shellcheck source=tests/cli/netns_pair.sh
. "$(dirname "$0")/netns_pair.sh"
now() { date +%s.%N; }
n=0
common() { echo --model tiny-moe --registry "file:$tmp/reg$n" --job start$n --timeout-ms 30000; }
publish() { # publish LOG [extra transport options]: one version, waits for one receiver's ack
  local log=$1 opt="ucx.listen=${LISTEN:-$addr_a}${2:+,$2}"
  ip netns exec "$a" env REFIT_LOG_LEVEL=info "$refit" publish $(common) --layout megatron:ep=1 --rank 0 \
    --transports ucx --transport-options "$opt" --versions 1 --acks 1 --json >"$log" 2>&1
}
pull() { # pull LOG [transport options]
  ip netns exec "$b" env REFIT_LOG_LEVEL=info "$refit" pull $(common) --layout vllm:tp=1 --rank 0 --transports ucx \
    ${2:+--transport-options "$2"} --verify --json >"$1" 2>&1
}
# The pull's JSON line: version 1, every byte verified, over TCP on the receiver's veth.
pulled() {
  python3 - "$1" "$vb" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
assert len(rows) == 1, rows
r = rows[0]
assert r['event'] == 'pulled' and r['version'] == 1 and r['verified'] and r['bytes'] > 0, r
assert r['transport'] == 'ucx' and 'tcp/' + sys.argv[2] in r['lanes'], r
PY
}

# 1. A receiver started while its link is down; the link comes up 1.5 s later.
n=1
ip -n "$b" link set "$vb" down
publish "$tmp/pub1.log" & pids+=($!)
t0=$(now)
pull "$tmp/pull1.log" & rp=$!
sleep 1.5
ip -n "$b" link set "$vb" up
wait $rp; rc=$?
took=$(echo "$(now) - $t0" | bc)
wait "${pids[-1]}"; prc=$?
if [ $rc -eq 0 ] && [ $prc -eq 0 ] && pulled "$tmp/pull1.log" && grep -q "made the receive context again" "$tmp/pull1.log" &&
  [ "$(echo "$took >= 1.5" | bc)" = 1 ]; then
  ok "receiver started before its link: waited ${took}s, pulled and verified over tcp/$vb (UCX's context made again)"
else bad "receiver before its link: rc $rc/$prc after ${took}s: $(tail -4 "$tmp/pull1.log") $(tail -2 "$tmp/pub1.log")"; fi

# 2. Its link never comes up: the pull fails after connect_timeout (3 s, within --timeout-ms 30 s), naming the
#    route, the device and its state.
n=2
ip -n "$b" link set "$vb" down
publish "$tmp/pub2.log" & pids+=($!)
t0=$(now)
pull "$tmp/pull2.log" "ucx.connect_timeout=3"; rc=$?
took=$(echo "$(now) - $t0" | bc)
kill "${pids[-1]}" 2>/dev/null
ip -n "$b" link set "$vb" up
err=$(grep '^refit: pull' "$tmp/pull2.log")
if [ $rc -ne 0 ] && [ "$(echo "$took >= 3 && $took < 10" | bc)" = 1 ] && grep -q "(REFIT_ERR_PEER)" <<<"$err" &&
  grep -q "within connect_timeout (3 s)" <<<"$err" && grep -q "no route to $addr_a" <<<"$err" &&
  grep -q "$vb $addr_b down" <<<"$err"; then
  ok "receiver whose link never comes up: failed after ${took}s naming the route and $vb (down)"
else bad "link never up: rc $rc after ${took}s: $err"; fi

# 3. A publisher whose listen address is assigned 1.5 s after it starts.
n=3
ip -n "$a" addr del "$addr_a/16" dev "$va"
t0=$(now)
publish "$tmp/pub3.log" & pp=$!
sleep 1.5
ip -n "$a" addr add "$addr_a/16" dev "$va"
pull "$tmp/pull3.log"; rc=$?
wait $pp; prc=$?
if [ $rc -eq 0 ] && [ $prc -eq 0 ] && pulled "$tmp/pull3.log" &&
  grep -q "listen=$addr_a: no interface of this host has that address yet; waiting" "$tmp/pub3.log"; then
  ok "publisher before its listen address: waited, served, pulled and verified"
else bad "publisher before its address: rc $rc/$prc: $(tail -3 "$tmp/pub3.log") $(tail -2 "$tmp/pull3.log")"; fi

# 3b. The same with listen=IFNAME: the interface exists, its address comes 1.5 s later.
n=31
ip -n "$a" addr del "$addr_a/16" dev "$va"
LISTEN=$va publish "$tmp/pub31.log" & pp=$!
sleep 1.5
ip -n "$a" addr add "$addr_a/16" dev "$va"
pull "$tmp/pull31.log"; rc=$?
wait $pp; prc=$?
if [ $rc -eq 0 ] && [ $prc -eq 0 ] && pulled "$tmp/pull31.log" &&
  grep -q "listen=$va: that interface has no address yet; waiting" "$tmp/pub31.log"; then
  ok "publisher with listen=$va before its address: waited, served, pulled and verified"
else bad "listen=IFNAME before its address: rc $rc/$prc: $(tail -3 "$tmp/pub31.log") $(tail -2 "$tmp/pull31.log")"; fi

# 4. A publisher whose link is down when it starts and up 1.5 s later.
n=4
ip -n "$a" link set "$va" down
publish "$tmp/pub4.log" & pp=$!
sleep 1.5
ip -n "$a" link set "$va" up
pull "$tmp/pull4.log"; rc=$?
wait $pp; prc=$?
if [ $rc -eq 0 ] && [ $prc -eq 0 ] && pulled "$tmp/pull4.log" &&
  grep -q "listen=$addr_a: its interface is not up and running yet; waiting" "$tmp/pub4.log"; then
  ok "publisher before its link: waited, served, pulled and verified"
else bad "publisher before its link: rc $rc/$prc: $(tail -3 "$tmp/pub4.log") $(tail -2 "$tmp/pull4.log")"; fi

# 5 and 6. The address never assigned, the link never up: the publisher fails after listen_timeout (2 s)
#    naming the address, the interface and its state.
n=5
ip -n "$a" addr del "$addr_a/16" dev "$va"
t0=$(now)
publish "$tmp/pub5.log" "ucx.listen_timeout=2"; rc=$?
took=$(echo "$(now) - $t0" | bc)
ip -n "$a" addr add "$addr_a/16" dev "$va"
err=$(grep '^refit: publisher' "$tmp/pub5.log")
if [ $rc -ne 0 ] && [ "$(echo "$took >= 2 && $took < 8" | bc)" = 1 ] && grep -q "(REFIT_ERR_INVALID_ARG)" <<<"$err" &&
  grep -q "listen=$addr_a: no interface of this host has that address after 2 s (listen_timeout)" <<<"$err" &&
  grep -q "interfaces: .*lo 127.0.0.1 up" <<<"$err" && grep -q "$va (no address) up" <<<"$err"; then
  ok "listen address never assigned: failed after ${took}s naming it"
else bad "address never assigned: rc $rc after ${took}s: $err"; fi
n=6
ip -n "$a" link set "$va" down
publish "$tmp/pub6.log" "ucx.listen_timeout=2"; rc=$?
ip -n "$a" link set "$va" up
err=$(grep '^refit: publisher' "$tmp/pub6.log")
if [ $rc -ne 0 ] && grep -q "(REFIT_ERR_TRANSPORT)" <<<"$err" &&
  grep -q "interface $va has the address but is not up and running after 2 s" <<<"$err" &&
  grep -q "$va $addr_a down" <<<"$err"; then
  ok "listen interface never up: failed naming $va (down)"
else bad "interface never up: rc $rc: $err"; fi
pids=()
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
