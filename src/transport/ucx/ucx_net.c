/* The ucx transport: this host's network as UCX sees it.  UCX's TCP
 * transport lists the interfaces that are up and running when a context is
 * made (ucp_init) and never again: an interface that comes up later is not
 * one of its devices, and endpoints to addresses behind it fail
 * "Destination is unreachable".  So the transport keeps a signature of the
 * active interfaces its receive context was made with (to know when to make
 * it again), probes routes itself (a UDP connect sends nothing), and says
 * in its errors what it saw: the route, the interfaces and their states. */

#include "transport/ucx/ucx_internal.h"

static bool if_active(unsigned flags) { return (flags & IFF_UP) && (flags & IFF_RUNNING); }

static const void *ifa_in(const struct ifaddrs *i, size_t *n)
{
    int f = i->ifa_addr ? i->ifa_addr->sa_family : AF_UNSPEC;
    if (f == AF_INET) return *n = 4, (const void *)&((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
    if (f == AF_INET6) return *n = 16, (const void *)&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
    return NULL;
}

uint64_t ucx_netif_sig(char *active, size_t cap)
{
    struct ifaddrs *ifa = NULL;
    uint64_t h = 0x6e6574696673ull;
    size_t used = 0;
    if (active && cap) active[0] = 0;
    if (getifaddrs(&ifa) != 0) return 0;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        size_t n = 0;
        const void *a = i->ifa_name ? ifa_in(i, &n) : NULL;
        if (!a || !if_active(i->ifa_flags)) continue;
        for (const char *c = i->ifa_name; *c; c++) h = refit_mix64(h ^ (unsigned char)*c);
        for (size_t k = 0; k < n; k++) h = refit_mix64(h ^ ((const unsigned char *)a)[k] ^ (k << 8));
        h = refit_mix64(h ^ 0xa5);
        /* the interface's name once (an interface has several addresses):
         * a whole name of the list, not the end of another ("eth0" in "veth0") */
        char key[IF_NAMESIZE + 2];
        snprintf(key, sizeof(key), "%s,", i->ifa_name);
        const char *at = used ? strstr(active, key) : NULL;
        while (at && at != active && at[-1] != ',') at = strstr(at + 1, key);
        if (active && !at) {
            int w = snprintf(active + used, cap - used, "%s,", i->ifa_name);
            if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
        }
    }
    freeifaddrs(ifa);
    if (active && used) active[used - 1] = 0; /* the last comma */
    return h;
}

static const char *if_state(unsigned flags)
{
    return if_active(flags) ? "up" : (flags & IFF_UP) ? "up, no carrier (not running)" : "down";
}

/* Whether interface `name` has an IPv4 or (not link-local) IPv6 address in ifa. */
static bool has_inet(const struct ifaddrs *ifa, const char *name)
{
    for (const struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        size_t n = 0;
        const void *a = i->ifa_name && !strcmp(i->ifa_name, name) ? ifa_in(i, &n) : NULL;
        if (a && !(n == 16 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a))) return true;
    }
    return false;
}

void ucx_netif_list(char *out, size_t cap)
{
    struct ifaddrs *ifa = NULL;
    size_t used = 0;
    out[0] = 0;
    if (getifaddrs(&ifa) != 0) {
        snprintf(out, cap, "(getifaddrs: %s)", strerror(errno));
        return;
    }
    /* Those with addresses first, then (once each, from the link-level entry) those without. */
    for (int pass = 0; pass < 2; pass++)
        for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
            size_t n = 0;
            const void *a = i->ifa_name ? ifa_in(i, &n) : NULL;
            char ip[INET6_ADDRSTRLEN] = "(no address)";
            if (a && (pass == 1 || (n == 16 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)))) continue;
            if (a) inet_ntop(n == 4 ? AF_INET : AF_INET6, a, ip, sizeof(ip));
            else if (pass == 0 || !i->ifa_name || !i->ifa_addr || i->ifa_addr->sa_family != AF_PACKET ||
                     has_inet(ifa, i->ifa_name))
                continue;
            int w = snprintf(out + used, cap - used, "%s%s %s %s", used ? ", " : "", i->ifa_name, ip,
                             if_state(i->ifa_flags));
            if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
        }
    freeifaddrs(ifa);
    if (!used) snprintf(out, cap, "none");
}

/* The name of the interface that has address a (n bytes), or "?". */
static void if_of(const void *a, size_t n, char *name, size_t cap)
{
    struct ifaddrs *ifa = NULL;
    snprintf(name, cap, "?");
    if (getifaddrs(&ifa) != 0) return;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        size_t m = 0;
        const void *b = i->ifa_name ? ifa_in(i, &m) : NULL;
        if (b && m == n && !memcmp(a, b, n)) {
            snprintf(name, cap, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifa);
}

int ucx_route_probe(const struct sockaddr *sa, socklen_t sl, char *via, size_t cap)
{
    if (via && cap) via[0] = 0;
    int fd = socket(sa->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int err = connect(fd, sa, sl) == 0 ? 0 : errno;
    struct sockaddr_storage me;
    socklen_t ml = sizeof(me);
    if (!err && via && cap && getsockname(fd, (struct sockaddr *)&me, &ml) == 0) {
        if (me.ss_family == AF_INET) if_of(&((struct sockaddr_in *)&me)->sin_addr, 4, via, cap);
        else if (me.ss_family == AF_INET6) if_of(&((struct sockaddr_in6 *)&me)->sin6_addr, 16, via, cap);
    }
    close(fd);
    return err;
}
