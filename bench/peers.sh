#!/usr/bin/env bash
# The peer benchmark (issue 31): the same bytes (default 1 GiB, one contiguous buffer) moved between two
# processes in two network namespaces joined by one veth pair, by
#   tcp             one plain TCP socket (the floor),
#   refit-ucx       refit's UCX pull (defaults), refit-ucx-eager the same with tcp_eager=1 (the default before
#                   2026-12-07; refit-ucx-rndv, tcp_eager=0, on request),
#   mooncake-tcp    Mooncake Transfer Engine over TCP (PyPI mooncake-transfer-engine-non-cuda),
#   nixl-ucx        NIXL with its UCX backend on TCP, nixl-libfabric NIXL's LIBFABRIC backend (PyPI nixl),
# in interleaved rounds (each round runs every arm once, the order rotating).  An arm whose package is absent
# or fails to import is skipped with one line saying why.  Every run's bytes are checked by the receiver.
#
# Usage (root, for the namespaces):
#   bench/peers.sh [--size BYTES] [--rounds N] [--arms a,b,...] [--out FILE.jsonl]
# Needs build/bench_ucx_tcp (scripts/build.sh build) and, for the peers, build/peers-venv
# (scripts/peers-venv.sh; REFIT_PEERS_VENV picks another).  Prints one JSON record per run (also appended
# to FILE), then a table of medians, ranges and each arm's ratio to the TCP stream paired by round.
# Knobs for the NIXL arm: PEERS_NIXL_UCX_TLS (default tcp; empty leaves UCX_TLS to UCX, which between two
# processes of one host is not the link), PEERS_NIXL_PROG_THREAD=0 (the reader without NIXL's progress thread).
# The namespaces (rfpeers<pid>a/b, 10.78.<x>.1 and .2 on a /24 of their own) are deleted at the end, also
# on Ctrl-C or a kill.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "peers.sh: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "peers.sh: needs iproute2 (ip)" >&2; exit 2; }
venv=${REFIT_PEERS_VENV:-build/peers-venv}
tag=$(printf '%x' $$)
na=rfpeers${tag}a nb=rfpeers${tag}b va=rfp${tag}a vb=rfp${tag}b
net=10.78.$(( $$ % 250 ))
# shellcheck disable=SC2317  # cleanup and stop run from the traps
cleanup() {
  ip netns del "$na" 2>/dev/null || true
  ip netns del "$nb" 2>/dev/null || true
  ip link del "$va" 2>/dev/null || true
}
child=
# shellcheck disable=SC2317
stop() { [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child"; exit "$1"; }
trap cleanup EXIT
trap 'stop 130' INT
trap 'stop 143' TERM
ip netns add "$na"
ip netns add "$nb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$na"
ip link set "$vb" netns "$nb"
ip -n "$na" addr add "$net.1/24" dev "$va"
ip -n "$nb" addr add "$net.2/24" dev "$vb"
for n in "$na" "$nb"; do ip -n "$n" link set lo up; done
ip -n "$na" link set "$va" up
ip -n "$nb" link set "$vb" up
# Wait for the link to carry (a veth is up once both ends are; UCX lists devices at start-up).
for _ in $(seq 50); do
  ip -n "$na" link show "$va" | grep -q 'state UP' && ip -n "$nb" link show "$vb" | grep -q 'state UP' && break
  sleep 0.1
done
# In the background and waited for, so that a signal to this script runs its trap at once.
python3 bench/peers.py --ns-a "$na" --ns-b "$nb" --addr-a "$net.1" --addr-b "$net.2" --dev-a "$va" --dev-b "$vb" \
  --peers-python "$venv/bin/python" "$@" &
child=$!
rc=0
wait "$child" || rc=$?
child=
exit "$rc"
