/* The ucx transport's options: "key=value,..." (the list is in
 * docs/ucx.md), and the listen address they name, resolved to one interface. */

#include "transport/ucx/ucx_internal.h"

#include "engine/test_hooks.h" /* REFIT_UNSAFE_RMA: the test flavour only */

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

static bool parse_u64(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v) return false;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
    if (*end) return false;
    return refit_mul_u64(x, mul, out);
}

static void copy_list(char *dst, size_t cap, const char *v)
{
    snprintf(dst, cap, "%s", v);
    for (char *p = dst; *p; p++)
        if (*p == '+') *p = ',';
}

enum { LISTEN_FOUND = 0, LISTEN_NONE = 1, LISTEN_INACTIVE = 2 };

/* Looks for listen_ip (an address, or an interface's name) among this
 * host's interfaces: found (listen_if and listen_ip set) on an interface that
 * is up and running, found on one that is not, or not found. */
static int find_listen(ucx_opts_t *o, int family, const unsigned char *want)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0) return LISTEN_NONE;
    int verdict = LISTEN_NONE;
    for (struct ifaddrs *i = ifa; i && verdict == LISTEN_NONE; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_name) continue;
        int f = i->ifa_addr->sa_family;
        if (f != AF_INET && f != AF_INET6) continue;
        const void *a = f == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                     : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        bool found = false;
        if (family) {
            found = f == family && !memcmp(a, want, f == AF_INET ? 4 : 16);
        } else if (!strcmp(i->ifa_name, o->listen_ip)) { /* an interface: its IPv4, else a global IPv6 */
            if (f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)) continue;
            if (f == AF_INET6) {
                bool v4 = false;
                for (struct ifaddrs *j = ifa; j; j = j->ifa_next)
                    v4 |= j->ifa_addr && j->ifa_name && !strcmp(j->ifa_name, i->ifa_name) &&
                          j->ifa_addr->sa_family == AF_INET;
                if (v4) continue;
            }
            found = true;
            inet_ntop(f, a, o->listen_ip, sizeof(o->listen_ip));
        }
        if (!found) continue;
        snprintf(o->listen_if, sizeof(o->listen_if), "%s", i->ifa_name);
        verdict = (i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING) ? LISTEN_FOUND : LISTEN_INACTIVE;
    }
    freeifaddrs(ifa);
    return verdict;
}

/* The listener binds one address, never every interface: listen= names an
 * address (which must be one of this host's) or an interface (its first
 * address); the default is the loopback.  listen_if becomes the only
 * network device UCX uses on the publisher side, and UCX lists only the
 * interfaces that are up and running when its context is made: an address
 * not assigned yet, or on an interface that is not up yet, is waited for
 * (listen_timeout, default 10 s; logged once), then refused naming what this
 * host has. */
static refit_status_t resolve_listen(ucx_opts_t *o)
{
    unsigned char want[16];
    int family = inet_pton(AF_INET, o->listen_ip, want) == 1    ? AF_INET
                 : inet_pton(AF_INET6, o->listen_ip, want) == 1 ? AF_INET6
                                                                : 0;
    if (family == AF_INET ? !memcmp(want, (unsigned char[4]){0}, 4)
                          : family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED((struct in6_addr *)want))
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "ucx: listen=%s would accept connections on every interface: name the address or the "
                           "interface receivers reach (listen=10.0.0.5, listen=eth0)",
                           o->listen_ip);
    char asked[sizeof(o->listen_ip)];
    snprintf(asked, sizeof(asked), "%s", o->listen_ip);
    double t0 = refit_now(), until = t0 + o->listen_timeout;
    int v;
    bool logged = false;
    while ((v = find_listen(o, family, want)) != LISTEN_FOUND && refit_now() < until) {
        if (!logged)
            refit_log(REFIT_LOG_WARN, "ucx: listen=%s: %s yet; waiting up to %g s (listen_timeout)", asked,
                      v == LISTEN_INACTIVE ? "its interface is not up and running"
                      : family             ? "no interface of this host has that address"
                                           : "that interface has no address",
                      o->listen_timeout);
        logged = true;
        snprintf(o->listen_ip, sizeof(o->listen_ip), "%s", asked);
        usleep(50 * 1000);
    }
    if (v == LISTEN_FOUND) return REFIT_OK;
    char ifs[512], waited[64] = "";
    ucx_netif_list(ifs, sizeof(ifs));
    if (o->listen_timeout > 0) snprintf(waited, sizeof(waited), " after %g s (listen_timeout)", o->listen_timeout);
    if (v == LISTEN_INACTIVE)
        return refit_error(REFIT_ERR_TRANSPORT,
                           "ucx: listen=%s: interface %s has the address but is not up and running%s (UCX lists only "
                           "active interfaces); interfaces: %s",
                           asked, o->listen_if, waited, ifs);
    return refit_error(REFIT_ERR_INVALID_ARG, "ucx: listen=%s: no interface of this host %s%s; interfaces: %s", asked,
                       family ? "has that address" : "of that name has an address", waited, ifs);
}

/* listen=IP, IP:PORT, [IPv6]:PORT or :PORT, or an interface's name
 * (resolve_listen); false: a bad value.  *vp is left at the address part
 * (what an error message shows). */
static bool parse_listen(char **vp, ucx_opts_t *o)
{
    char *v = *vp, *port = NULL;
    uint64_t n = 0;
    bool ok = true;
    if (*v == '[') {
        char *e = strchr(v, ']');
        if (!e) ok = false;
        else {
            *e = 0;
            port = e[1] == ':' ? e + 2 : NULL;
            *vp = ++v;
        }
    } else if (strchr(v, ':') == strrchr(v, ':') && strchr(v, ':')) {
        port = strchr(v, ':');
        *port++ = 0;
    }
    if (ok && *v) snprintf(o->listen_ip, sizeof(o->listen_ip), "%s", v);
    if (ok && port) ok = parse_u64(port, &n) && n <= 65535, o->listen_port = (uint16_t)n;
    unsigned char tmp[16];
    /* An address, or the name of an interface (resolve_listen). */
    if (ok && inet_pton(AF_INET, o->listen_ip, tmp) != 1 && inet_pton(AF_INET6, o->listen_ip, tmp) != 1 &&
        (strlen(o->listen_ip) >= IF_NAMESIZE || !if_nametoindex(o->listen_ip)))
        ok = false;
    return ok;
}

/* The options that name a mode or a list; false: kv is none of them.  *ok:
 * whether v is a value of kv. */
static bool parse_mode(const char *kv, const char *v, ucx_opts_t *o, bool *ok)
{
    if (!strcmp(kv, "rma")) {
        if (!strcmp(v, "off")) o->rma = RMA_OFF;
        else if (!strcmp(v, "emulated")) o->rma = RMA_EMULATED;
        else *ok = false;
    } else if (!strcmp(kv, "require")) {
        if (!strcmp(v, "rdma")) o->require_rdma = true;
        else if (!strcmp(v, "none") || !*v) o->require_rdma = false;
        else *ok = false;
    } else if (!strcmp(kv, "method")) {
        if (!strcmp(v, "auto")) o->method = METHOD_AUTO;
        else if (!strcmp(v, "am")) o->method = METHOD_AM;
        else if (!strcmp(v, "get")) o->method = METHOD_GET;
        else *ok = false;
    } else if (!strcmp(kv, "tls")) {
        copy_list(o->tls, sizeof(o->tls), v);
    } else if (!strcmp(kv, "devices")) {
        copy_list(o->devices, sizeof(o->devices), v);
    } else if (!strcmp(kv, "tcp_eager")) {
        if (!strcmp(v, "auto")) o->tcp_eager = TCP_EAGER_AUTO;
        else if (!strcmp(v, "1")) o->tcp_eager = TCP_EAGER_ON;
        else if (!strcmp(v, "0")) o->tcp_eager = TCP_EAGER_OFF;
        else *ok = false;
    } else {
        return false;
    }
    return true;
}

/* The options that are numbers (sizes, counts, seconds); as parse_mode. */
static bool parse_number(const char *kv, const char *v, ucx_opts_t *o, bool *ok)
{
    uint64_t n = 0;
    if (!strcmp(kv, "max_queued")) {
        *ok = parse_u64(v, &o->max_queued) && o->max_queued >= (1u << 20);
    } else if (!strcmp(kv, "max_parked")) {
        *ok = parse_u64(v, &n) && n >= 1 && n <= UCX_MAX_JOBS_PER_CONN;
        o->max_parked = (unsigned)n;
    } else if (!strcmp(kv, "chunk")) {
        *ok = parse_u64(v, &o->chunk) && o->chunk >= 4096 && o->chunk <= (1ull << 30);
    } else if (!strcmp(kv, "solo")) {
        *ok = parse_u64(v, &o->solo) && o->solo > 0;
    } else if (!strcmp(kv, "rndv")) {
        if (!strcmp(v, "auto")) o->rndv = 0; /* UCX chooses */
        else *ok = parse_u64(v, &o->rndv) && o->rndv > 0;
    } else if (!strcmp(kv, "inflight")) {
        *ok = parse_u64(v, &n) && n >= 1 && n <= 1024;
        o->inflight = (unsigned)n;
    } else if (!strcmp(kv, "spin_us")) {
        *ok = parse_u64(v, &n) && n <= 10000000;
        o->spin_us = (unsigned)n;
    } else if (!strcmp(kv, "connect_timeout") || !strcmp(kv, "stall_timeout") || !strcmp(kv, "auth_timeout") ||
               !strcmp(kv, "listen_timeout")) {
        char *end;
        double d = strtod(v, &end);
        bool may_be_0 = kv[0] == 'l'; /* listen_timeout=0: the address must be there at once */
        *ok = end != v && !*end && (d > 0 || (may_be_0 && d == 0)) && d < 1e6;
        if (kv[0] == 'c') o->connect_timeout = d;
        else if (kv[0] == 'a') o->auth_timeout = d;
        else if (kv[0] == 'l') o->listen_timeout = d;
        else o->stall_timeout = d;
    } else {
        return false;
    }
    return true;
}

refit_status_t ucx_parse_opts(const char *s, ucx_opts_t *o)
{
    *o = (ucx_opts_t){.listen_ip = "127.0.0.1",
                      .chunk = 4u << 20,
                      .rndv = 64u << 10,
                      .solo = 16u << 10,
                      .inflight = 8,
                      .tcp_eager = TCP_EAGER_AUTO,
                      .spin_us = 0, /* TCP data arrives all the time: any spin became a busy poll (README: Fleet) */
                      .connect_timeout = 10,
                      .listen_timeout = 10,
                      .stall_timeout = 30,
                      .max_queued = 256u << 20,
                      .max_parked = 256,
                      .auth_timeout = UCX_AUTH_TIMEOUT_S};
    if (!s) return resolve_listen(o);
    char *dup = refit_strdup(s), *save = NULL;
    if (!dup) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: options");
    refit_status_t st = REFIT_OK;
    for (char *kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *v = strchr(kv, '=');
        if (!v) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: option '%s' is not key=value", kv);
            break;
        }
        *v++ = 0;
        bool ok = true;
        if (!strcmp(kv, "listen")) {
            ok = parse_listen(&v, o);
        } else if (!parse_mode(kv, v, o, &ok) && !parse_number(kv, v, o, &ok)) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: unknown option '%s'", kv);
            break;
        }
        if (!ok) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: bad value '%s' for option '%s'", v, kv);
            break;
        }
    }
    free(dup);
    if (!st && o->method == METHOD_GET && o->rma == RMA_OFF)
        st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: method=get needs rma=emulated (tests only)");
    const char *unsafe = refit_test_unsafe_rma();
    if (!st && o->rma == RMA_EMULATED && !(unsafe && !strcmp(unsafe, "1")))
        st = refit_error(REFIT_ERR_INVALID_ARG,
                         "ucx: rma=emulated lets any peer that reaches this process read and write any address in it "
                         "(UCX serves RMA in software); it exists for tests: librefit-test with REFIT_UNSAFE_RMA=1");
    return st ? st : resolve_listen(o);
}
