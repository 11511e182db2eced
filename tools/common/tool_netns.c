/* tools/common/tool_netns.h: namespaces, veth ports on a bridge, tbf. */
#include "tool_netns.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

static bool sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    char quiet[600];
    snprintf(quiet, sizeof(quiet), "%s >/dev/null 2>&1", cmd);
    return system(quiet) == 0;
}

bool tool_netns_possible(char *why, size_t n)
{
    if (geteuid() != 0) return snprintf(why, n, "not root"), false;
    if (!sh("{ command -v ip && command -v tc; }"))
        return snprintf(why, n, "ip or tc (iproute2) is not installed"), false;
    return true;
}

static tool_netns_t *g_up; /* whose namespaces are up */

void tool_netns_down(tool_netns_t *t)
{
    for (uint32_t i = 0; i < t->nodes; i++) {
        sh("ip netns del rf%sn%u", t->tag, i);
        sh("ip link del rf%sp%u", t->tag, i);
    }
    if (t->nodes) sh("ip link del rf%sbr", t->tag);
    t->nodes = 0;
    g_up = NULL;
}

/* Namespaces outlive a killed benchmark: SIGINT and SIGTERM take them down. */
static void on_signal(int sig)
{
    if (g_up) tool_netns_down(g_up);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The longest a packet may wait in a port's queue (tbf's latency). */
static double queue_ms(const tool_netns_t *t) { return t->queue_ms > 0 ? t->queue_ms : 50; }

/* burst: a 64 KiB GSO segment must fit, and a few ms of the rate. */
static uint64_t burst_of(uint64_t bps) { return bps / 200 > (256u << 10) ? bps / 200 : (256u << 10); }

bool tool_netns_up(tool_netns_t *t, uint32_t nodes, double mbps, char *why, size_t n)
{
    snprintf(t->tag, sizeof(t->tag), "%x", (unsigned)getpid());
    if (!sh("ip link add rf%sbr type bridge", t->tag) || !sh("ip link set rf%sbr up", t->tag))
        return snprintf(why, n, "could not make a bridge"), false;
    t->nodes = nodes;
    g_up = t;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    uint64_t bps = (uint64_t)(mbps * 1e6), burst = burst_of(bps);
    for (uint32_t i = 0; i < nodes; i++) {
        const char *g = t->tag;
        bool ok = sh("ip netns add rf%sn%u", g, i) &&
                  sh("ip link add rf%sv%u type veth peer name rf%sp%u", g, i, g, i) &&
                  sh("ip link set rf%sv%u netns rf%sn%u", g, i, g, i) &&
                  sh("ip -n rf%sn%u addr add 10.77.%u.%u/16 dev rf%sv%u", g, i, i / 250, i % 250 + 1, g, i) &&
                  sh("ip -n rf%sn%u link set rf%sv%u up", g, i, g, i) && sh("ip -n rf%sn%u link set lo up", g, i) &&
                  sh("ip link set rf%sp%u master rf%sbr", g, i, g) && sh("ip link set rf%sp%u up", g, i);
        if (ok && mbps > 0)
            ok = sh("ip netns exec rf%sn%u tc qdisc add dev rf%sv%u root tbf rate %" PRIu64 "bit burst %" PRIu64
                    " latency %gms",
                    g, i, g, i, bps * 8, burst, queue_ms(t)) &&
                 sh("tc qdisc add dev rf%sp%u root tbf rate %" PRIu64 "bit burst %" PRIu64 " latency %gms", g, i,
                    bps * 8, burst, queue_ms(t));
        if (ok && t->tcp_cc[0] &&
            !sh("ip netns exec rf%sn%u sh -c 'echo %s > /proc/sys/net/ipv4/tcp_congestion_control'", g, i, t->tcp_cc)) {
            snprintf(why, n,
                     "TCP congestion control %s is not available (/proc/sys/net/ipv4/tcp_available_congestion_control)",
                     t->tcp_cc);
            tool_netns_down(t);
            return false;
        }
        if (!ok) {
            snprintf(why, n, "setting up namespace %u failed", i);
            tool_netns_down(t);
            return false;
        }
    }
    if (!t->tcp_cc[0]) { /* record the one a new namespace got */
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "ip netns exec rf%sn0 cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null",
                 t->tag);
        FILE *f = popen(cmd, "r");
        if (f) {
            if (!fgets(t->tcp_cc, sizeof(t->tcp_cc), f)) t->tcp_cc[0] = 0;
            t->tcp_cc[strcspn(t->tcp_cc, "\n")] = 0;
            pclose(f);
        }
    }
    return true;
}

bool tool_netns_rate(const tool_netns_t *t, uint32_t node, double mbps)
{
    uint64_t bps = (uint64_t)(mbps * 1e6), burst = burst_of(bps);
    const char *g = t->tag;
    return sh("ip netns exec rf%sn%u tc qdisc replace dev rf%sv%u root tbf rate %" PRIu64 "bit burst %" PRIu64
              " latency %gms",
              g, node, g, node, bps * 8, burst, queue_ms(t)) &&
           sh("tc qdisc replace dev rf%sp%u root tbf rate %" PRIu64 "bit burst %" PRIu64 " latency %gms", g, node,
              bps * 8, burst, queue_ms(t));
}

void tool_netns_ifname(const tool_netns_t *t, uint32_t node, char *buf, size_t n)
{
    snprintf(buf, n, "rf%sv%u", t->tag, node);
}

void tool_netns_name(const tool_netns_t *t, uint32_t node, char *buf, size_t n)
{
    snprintf(buf, n, "rf%sn%u", t->tag, node);
}

void tool_netns_addr(uint32_t node, char *buf, size_t n)
{
    snprintf(buf, n, "10.77.%u.%u", node / 250, node % 250 + 1);
}

/* The pid in a name rf<hex pid><suffix> (suffix "br", or "n" and digits) whose
 * process is gone; 0 when the name is not one of ours or its process lives. */
static unsigned stale_pid(const char *name)
{
    size_t len = strlen(name), end;
    if (strncmp(name, "rf", 2) != 0 || len < 5) return 0;
    if (!strcmp(name + len - 2, "br")) {
        end = len - 2;
    } else {
        end = len;
        while (end > 2 && name[end - 1] >= '0' && name[end - 1] <= '9') end--;
        if (end == len || name[--end] != 'n') return 0;
    }
    if (end <= 2 || end - 2 > 8) return 0;
    unsigned pid = 0;
    for (size_t i = 2; i < end; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        pid = pid * 16 + (unsigned)d;
    }
    return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH ? pid : 0;
}

void tool_netns_remove_stale(void)
{
    /* Deleting a namespace deletes its veth end and the port that is its peer. */
    static const char *const lists[] = {"ip netns list 2>/dev/null", "ip -o link show type bridge 2>/dev/null"};
    for (int k = 0; k < 2; k++) {
        FILE *f = popen(lists[k], "r");
        char line[512], name[64];
        while (f && fgets(line, sizeof(line), f)) {
            /* "NAME (id: N)" or "IDX: NAME: <FLAGS> ..." */
            if (sscanf(line, k == 0 ? "%63[^ \n]" : "%*u: %63[^:@ ]", name) != 1 || !stale_pid(name)) continue;
            if (k == 0) sh("ip netns del %s", name);
            else sh("ip link del %s", name);
        }
        if (f) pclose(f);
    }
}

int tool_netns_enter(const tool_netns_t *t, uint32_t node)
{
    char path[96];
    snprintf(path, sizeof(path), "/run/netns/rf%sn%u", t->tag, node);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    if (rc != 0) return -1;
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 || mount("sysfs", "/sys", "sysfs", 0, NULL) != 0)
        return -1;
    return 0;
}
