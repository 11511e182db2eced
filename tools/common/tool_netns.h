/* Network namespaces for the benchmarks (refit-bench --net netns) and the
 * tests (tests/unit/test_ucx.c, bench/ucx_tcp.c, and tests/cli/test_netns.sh
 * through `refit-bench netns`): nodes on one bridge, each a namespace with a
 * veth port whose egress and ingress a tc tbf qdisc limits, as a node's NIC
 * would.  Needs root and iproute2; runs `ip` and `tc` through system().  One
 * set of namespaces per process at a time (SIGINT and SIGTERM take it down).
 * Every name carries the process id (in hex), so that sets made by processes
 * running at once never collide and a set whose process is gone can be told
 * from one in use (tool_netns_remove_stale). */
#ifndef REFIT_TOOL_NETNS_H
#define REFIT_TOOL_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char tag[16];    /* the pid in hex; names: rf<tag>br (bridge), rf<tag>n<i> (namespace), rf<tag>v<i> / rf<tag>p<i>
                        (veth) */
    uint32_t nodes;  /* namespaces up (0: none) */
    double queue_ms; /* set before tool_netns_up: the longest a packet waits in a port's tbf queue (0: 50 ms) */
    /* Set before tool_netns_up: every namespace's TCP congestion control
     * (net.ipv4.tcp_congestion_control, e.g. "cubic"); empty: whatever a new
     * namespace gets on this host (this VM's default is bbr, whose PROBE_RTT
     * stalls a connection for 200 ms every 10 s behind a full tbf queue:
     * docs/measured.md).  tool_netns_up fills it with the one in force. */
    char tcp_cc[16];
} tool_netns_t;

/* Whether namespaces can be made here (root, ip and tc); why not in `why`. */
bool tool_netns_possible(char *why, size_t n);
/* `nodes` namespaces rf<tag>n<i> (10.77.<i/250>.<i%250+1>/16), each on a
 * veth port of bridge rf<tag>br, egress and ingress limited to mbps MB/s by
 * tbf (mbps 0: unlimited).  On failure, nothing stays up and `why` says what failed. */
bool tool_netns_up(tool_netns_t *t, uint32_t nodes, double mbps, char *why, size_t n);
/* Takes every namespace, port and the bridge down (no-op when none is up). */
void tool_netns_down(tool_netns_t *t);
/* Sets node's link (both directions) to mbps MB/s. */
bool tool_netns_rate(const tool_netns_t *t, uint32_t node, double mbps);
/* The name of node's interface inside its namespace (rf<tag>v<node>). */
void tool_netns_ifname(const tool_netns_t *t, uint32_t node, char *buf, size_t n);
/* The name of node's namespace (rf<tag>n<node>), for `ip netns exec`. */
void tool_netns_name(const tool_netns_t *t, uint32_t node, char *buf, size_t n);
/* Node's IPv4 address (10.77.<node/250>.<node%250+1>). */
void tool_netns_addr(uint32_t node, char *buf, size_t n);
/* Takes down the namespaces and bridges of sets whose process is gone (a
 * process killed with SIGKILL leaves its set up); sets of live processes
 * are left alone. */
void tool_netns_remove_stale(void);
/* Moves the calling (child) process into node's namespace, with a /sys of
 * that namespace (as `ip netns exec` does: UCX lists the devices there).
 * 0, or -1 when it could not. */
int tool_netns_enter(const tool_netns_t *t, uint32_t node);

#endif
