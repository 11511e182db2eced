/* refit-bench netns NODES [--link-mbps X]: the benchmarks' network namespaces
 * (tools/common/tool_netns.h) held up for a script, so that shell tests
 * (tests/cli/test_netns.sh) use the same setup as refit-bench and the C tests
 * instead of one of their own.  Prints one line per node, "NAMESPACE ADDRESS
 * INTERFACE", then "READY"; takes everything down when its standard input
 * ends (the script closed it, or died) or on SIGINT/SIGTERM.  Exit status 0,
 * 2 a usage error, 77 when namespaces cannot be made here (why on stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "tool_netns.h"

int bench_netns(int argc, char **argv)
{
    uint64_t nodes = 0;
    double mbps = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--link-mbps") && i + 1 < argc) mbps = atof(argv[++i]);
        else if (tool_parse_u64(argv[i], &nodes) != 0) return tool_usage("bench netns", "NODES [--link-mbps X]");
    }
    if (nodes < 1 || nodes > 1000 || mbps < 0) return tool_usage("bench netns", "NODES (1..1000) [--link-mbps X]");
    char why[256];
    tool_netns_t ns = {0};
    if (!tool_netns_possible(why, sizeof(why)) || !tool_netns_up(&ns, (uint32_t)nodes, mbps, why, sizeof(why))) {
        fprintf(stderr, "refit-bench netns: %s\n", why);
        return 77;
    }
    for (uint32_t i = 0; i < ns.nodes; i++) {
        char name[32], addr[32], ifname[32];
        tool_netns_name(&ns, i, name, sizeof(name));
        tool_netns_addr(i, addr, sizeof(addr));
        tool_netns_ifname(&ns, i, ifname, sizeof(ifname));
        printf("%s %s %s\n", name, addr, ifname);
    }
    printf("READY\n");
    fflush(stdout);
    char buf[256];
    while (fgets(buf, sizeof(buf), stdin)) {
    }
    tool_netns_down(&ns);
    return 0;
}
