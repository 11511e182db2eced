/* refit preflight: the checks of the network (tools/preflight.h): UCX
 * listeners and lanes, RDMA devices, TCP congestion control, the registry,
 * the secret, the clock. */
#include "preflight.h"
#ifdef REFIT_HAVE_REDIS
#include <hiredis.h>
#endif

/* ---- UCX ----------------------------------------------------------------------- */

void check_ucx(pf_t *p, const char *tmpdir)
{
    if (!p->want_ucx) {
        pf_put(p, "ucx listen", SKIP, "ucx is not among the transports%s",
               refit_transport_built("ucx") ? "" : " (not built in)");
        pf_put(p, "ucx lanes", SKIP, "ucx is not among the transports");
        return;
    }
    /* The listen address: the transport resolves it when created.  A
     * publisher waits ucx.listen_timeout for an address not assigned yet (or
     * an interface not up yet); preflight asks whether the host is ready now. */
    char *listen = pf_option(p->topts, "ucx.listen"), *lt = pf_option(p->topts, "ucx.listen_timeout");
    size_t olen = (p->topts ? strlen(p->topts) : 0) + 32;
    char *opts = malloc(olen);
    if (!opts) {
        free(listen);
        free(lt);
        pf_put(p, "ucx listen", FAIL, "out of memory");
        return;
    }
    snprintf(opts, olen, "%s%s%s", p->topts ? p->topts : "", p->topts && p->topts[0] ? "," : "",
             lt ? "" : "ucx.listen_timeout=0");
    if (opts[0] && opts[strlen(opts) - 1] == ',') opts[strlen(opts) - 1] = 0;
    free(lt);
    refit_status_t st = refit_transport_check("ucx", opts);
    if (st) {
        pf_put(p, "ucx listen", FAIL, "%s (%s)", refit_last_error(), refit_status_name(st));
        pf_remedy(p, "ucx.listen= takes an address or interface of this host that receivers reach (ip -br addr), never "
                     "0.0.0.0; an address assigned or an interface brought up later is waited for ucx.listen_timeout "
                     "seconds (10) when a publisher starts");
        free(listen);
        free(opts);
        pf_put(p, "ucx lanes", SKIP, "the ucx options are not valid");
        return;
    }
    pf_put(p, "ucx listen", PASS, "listen=%s is an address of this host%s", listen ? listen : "127.0.0.1",
           listen ? "" : " (the default: loopback only; multi-host jobs must name the interface receivers reach)");
    if (!listen) {
        p->checks[p->n - 1].v = WARN;
        pf_remedy(p, "for receivers on other hosts set --transport-options ucx.listen=IFNAME or ucx.listen=IP");
    }
    free(listen);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    st = pf_loopback("ucx", opts, tmpdir, &rep);
    free(opts);
    if (st) {
        pf_put(p, "ucx lanes", FAIL, "a UCX publisher and receiver of this process: %s (%s)", refit_last_error(),
               refit_status_name(st));
        if (p->require_rdma)
            pf_remedy(
                p, "UCX found no RDMA lane: check the RDMA devices line, UCX_TLS / ucx.tls= and ucx.devices=; or drop "
                   "ucx.require=rdma to accept TCP (about 7x slower)");
        else
            pf_remedy(p,
                      "run `ucx_info -d` to see UCX's devices; check ucx.listen= and the firewall for the listen port");
        return;
    }
    bool rdma = strstr(rep.lanes, "rc") || strstr(rep.lanes, "dc") || strstr(rep.lanes, "ud");
    pf_put(p, "ucx lanes", PASS,
           "one version over UCX to this host itself took lanes %s (%.0f ms); between hosts UCX "
           "may pick others of the same kinds",
           rep.lanes, (refit_now() - t0) * 1e3);
    if (!rdma) {
        p->checks[p->n - 1].v = WARN;
        pf_remedy(p, "TCP lanes: fine for tests, about 7x slower than RDMA; with RDMA NICs see the RDMA line, and set "
                     "ucx.require=rdma so that a fallback fails loudly");
    }
}

void check_rdma(pf_t *p)
{
    DIR *d = opendir("/sys/class/infiniband");
    char list[512] = "";
    int n = 0, active = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            n++;
            char path[512], state[64] = "?";
            snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", e->d_name);
            FILE *f = fopen(path, "r");
            if (f) {
                if (fgets(state, sizeof(state), f)) state[strcspn(state, "\n")] = '\0';
                fclose(f);
            }
            if (strstr(state, "ACTIVE")) active++;
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s (%s)", list[0] ? ", " : "", e->d_name,
                     state);
        }
        closedir(d);
    }
    bool needed = p->require_rdma;
    if (active) pf_put(p, "rdma devices", PASS, "%d of %d active: %s", active, n, list);
    else if (needed) {
        pf_put(p, "rdma devices", FAIL, "%s, and the options ask for RDMA (ucx.require=rdma)",
               n ? list : "none in /sys/class/infiniband");
        pf_remedy(p, "load the NIC's driver (ibv_devices lists it), expose the device to the container (RDMA device "
                     "plugin), or drop the RDMA options");
    } else if (!p->want_ucx) pf_put(p, "rdma devices", SKIP, "%s; not used without ucx", n ? list : "none");
    else {
        pf_put(p, "rdma devices", WARN, "%s: UCX can only use TCP between hosts",
               n ? list : "none in /sys/class/infiniband");
        pf_remedy(
            p, "on an RDMA cluster, expose the NICs (RDMA device plugin, /dev/infiniband); otherwise expect TCP speed");
    }
}

/* ---- TCP congestion control ------------------------------------------------------------ */

/* UCX's TCP lanes use the host's congestion control.  BBR (v1) cuts each
 * connection to 4 packets for at least 200 ms whenever 10 s pass without a
 * new minimum RTT (PROBE_RTT); behind a bottleneck whose queue never drains
 * that is every 10 s, and a relay chain cannot win a hop's stall back
 * (docs/measured.md#bbr: later elastic versions up to 6% slower than with
 * cubic). */
void check_tcp_cc(pf_t *p)
{
    if (!p->want_ucx) {
        pf_put(p, "tcp congestion", SKIP, "ucx is not among the transports");
        return;
    }
    char cc[64] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
    if (f) {
        if (!fgets(cc, sizeof(cc), f)) cc[0] = 0;
        cc[strcspn(cc, "\n")] = 0;
        fclose(f);
    }
    if (!cc[0]) {
        pf_put(p, "tcp congestion", SKIP, "/proc/sys/net/ipv4/tcp_congestion_control is not readable here");
        return;
    }
    if (strncmp(cc, "bbr", 3)) {
        pf_put(p, "tcp congestion", PASS, "net.ipv4.tcp_congestion_control=%s (UCX's TCP lanes)", cc);
        return;
    }
    pf_put(p, "tcp congestion", WARN,
           "net.ipv4.tcp_congestion_control=%s: every 10 s without a new minimum RTT (a link whose queue stays full) "
           "BBR holds each connection to 4 packets for 200 ms (PROBE_RTT); a chain of relays over TCP loses that at "
           "every hop",
           cc);
    pf_remedy(p, "for refits over TCP lanes at their line rate use cubic, Linux's default (sysctl -w "
                 "net.ipv4.tcp_congestion_control=cubic on each node); RDMA lanes are not affected");
}

/* ---- the registry -------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

const char *pf_registry_url(const pf_t *p) { return p->registry ? p->registry : refit_default_registry(); }

/* Reachability with a secret of our own (so that a missing job secret is
 * the auth line's finding, not this one's): open, then a probe lease under
 * the job written, read back (HMAC checked) and deleted, three times. */
bool check_registry(pf_t *p, const char *tmpdir)
{
    char secret[4200], *shown = refit_redact_url(pf_registry_url(p));
    snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
    refit_registry_t *reg = NULL;
    double t0 = refit_now();
    refit_status_t st = refit_registry_connect(pf_registry_url(p), p->job, secret, &reg);
    double open_ms = (refit_now() - t0) * 1e3;
    if (st) {
        pf_put(p, "registry", FAIL, "%s: %s (%s)", shown ? shown : "?", refit_last_error(), refit_status_name(st));
        if (st == REFIT_ERR_REGISTRY)
            pf_remedy(p,
                      "is the store up and reachable from here? (redis-cli -h HOST -p PORT ping; the Service/port; the "
                      "ACL user's password in REFIT_REDIS_PASSWORD_FILE)");
        else if (st == REFIT_ERR_UNSUPPORTED) pf_remedy(p, "rebuild refit with libhiredis-dev installed for redis://");
        else pf_remedy(p, "--registry takes file:DIR or redis://[USER@]HOST:PORT; --job [A-Za-z0-9._-], 1..64 chars");
        free(shown);
        return false;
    }
    char reader[128], host[64];
    if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
    host[sizeof(host) - 1] = '\0';
    snprintf(reader, sizeof(reader), "preflight.%.60s.%d", host, (int)getpid());
    for (char *c = reader; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '-'))
            *c = '-';
    double w[3], r[3], d[3];
    for (int i = 0; i < 3 && !st; i++) st = refit_registry_probe(reg, reader, &w[i], &r[i], &d[i]);
    refit_registry_close(reg);
    if (st) {
        pf_put(p, "registry", FAIL, "%s: opened, but the probe under job %s failed: %s (%s)", shown, p->job,
               refit_last_error(), refit_status_name(st));
        pf_remedy(
            p, "the ACL user must be allowed every command on ~refit:%s:* (docs/security.md), the directory writable",
            p->job);
        free(shown);
        return false;
    }
    qsort(w, 3, sizeof(double), cmp_double);
    qsort(r, 3, sizeof(double), cmp_double);
    qsort(d, 3, sizeof(double), cmp_double);
    double worst = fmax(w[1], fmax(r[1], d[1]));
    pf_put(p, "registry", worst > 5 ? WARN : PASS,
           "%s: opened in %.1f ms; a probe key under job %s written, read back and deleted: %.2f / %.2f / %.2f ms "
           "(medians of 3)",
           shown, open_ms, p->job, w[1], r[1], d[1]);
    if (worst > 5)
        pf_remedy(p,
                  "a registry round trip over 5 ms makes every refit's control plane slow: move the registry closer");
    free(shown);
    return true;
}

/* The job's secret as a process of the job would find it. */
void check_auth(pf_t *p, bool reachable)
{
    const char *file = getenv("REFIT_SECRET_FILE"), *env = getenv("REFIT_SECRET"), *ins = getenv("REFIT_INSECURE");
    bool redis = !strncmp(pf_registry_url(p), "redis:", 6);
    verdict_t v = PASS;
    char detail[600];
    if (file && file[0]) {
        struct stat sb;
        if (stat(file, &sb) != 0) {
            pf_put(p, "auth", FAIL, "REFIT_SECRET_FILE=%s: %s", file, strerror(errno));
            pf_remedy(
                p, "mount the job's secret there (Kubernetes: a Secret volume, defaultMode 0400), or fix the variable");
            return;
        }
        if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            pf_put(p, "auth", FAIL,
                   "REFIT_SECRET_FILE=%s is %s of uid %u, mode %04o: group and others must not read it, "
                   "and it must be ours (uid %u)",
                   file, S_ISREG(sb.st_mode) ? "a file" : "not a regular file", (unsigned)sb.st_uid,
                   (unsigned)(sb.st_mode & 07777), (unsigned)geteuid());
            pf_remedy(p, "chmod 600 %s (Kubernetes: defaultMode: 0400 and the pod's runAsUser / fsGroup)", file);
            return;
        }
        snprintf(detail, sizeof(detail), "secret from file %s (mode %04o, %lld bytes)", file,
                 (unsigned)(sb.st_mode & 07777), (long long)sb.st_size);
    } else if (env && env[0])
        snprintf(detail, sizeof(detail),
                 "secret from $REFIT_SECRET (%zu characters; a file is preferable: the "
                 "environment shows in /proc/PID/environ to this user and root)",
                 strlen(env));
    else if (ins && !strcmp(ins, "1")) {
        v = WARN;
        snprintf(detail, sizeof(detail),
                 "REFIT_INSECURE=1: registry entries and connections use a public key; anyone "
                 "who can write the registry or reach a listener is trusted");
    } else if (!redis)
        snprintf(detail, sizeof(detail), "file registry: the job directory's .secret (made 0600 on first use)");
    else {
        pf_put(p, "auth", FAIL,
               "a redis registry and no secret: no REFIT_SECRET_FILE, REFIT_SECRET or REFIT_INSECURE=1");
        pf_remedy(
            p, "head -c 32 /dev/urandom > job.secret; chmod 600 job.secret; export REFIT_SECRET_FILE=$PWD/job.secret "
               "(the same file for every rank)");
        return;
    }
    const char *pwf = getenv("REFIT_REDIS_PASSWORD_FILE");
    if (redis && pwf && pwf[0]) {
        struct stat sb;
        if (stat(pwf, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            pf_put(p, "auth", FAIL, "REFIT_REDIS_PASSWORD_FILE=%s: %s", pwf,
                   errno && stat(pwf, &sb) != 0 ? strerror(errno) : "must be a regular file of ours, mode 0600");
            pf_remedy(p, "chmod 600 %s, owned by the user the ranks run as", pwf);
            return;
        }
    }
    if (reachable) {
        /* What a rank of the job would get, for real. */
        refit_registry_t *reg = NULL;
        refit_status_t st = refit_registry_connect(pf_registry_url(p), p->job, NULL, &reg);
        if (st) {
            pf_put(p, "auth", FAIL, "%s (%s)", refit_last_error(), refit_status_name(st));
            pf_remedy(p, st == REFIT_ERR_AUTH ? "give every rank the same secret (REFIT_SECRET_FILE, mode 0600; "
                                                "docs/security.md)"
                                              : "see the registry line");
            return;
        }
        snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail), "; the registry opened with it (source: %s)",
                 refit_registry_secret_source(reg));
        if (!refit_registry_secure(reg)) v = WARN;
        refit_registry_close(reg);
    }
    pf_put(p, "auth", v, "%s", detail);
    if (v == WARN) pf_remedy(p, "set REFIT_SECRET_FILE to a 0600 file of 32 random bytes shared by the job's ranks");
}

/* ---- the clock ---------------------------------------------------------------------------- */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#ifdef REFIT_HAVE_REDIS
/* Redis's TIME against ours, the midpoint of the round trip. */
static bool redis_skew(const char *url, double *skew, char *err, size_t n)
{
    const char *h = url + strlen("redis://");
    char user[128] = "", pass[256] = "", host[256] = "";
    int port = 6379;
    const char *at = strchr(h, '@');
    if (at) {
        const char *colon = memchr(h, ':', (size_t)(at - h));
        snprintf(user, sizeof(user), "%.*s", (int)((colon ? colon : at) - h), h);
        if (colon) snprintf(pass, sizeof(pass), "%.*s", (int)(at - colon - 1), colon + 1);
        h = at + 1;
    }
    if (!pass[0]) {
        const char *pf = getenv("REFIT_REDIS_PASSWORD_FILE"), *pw = getenv("REFIT_REDIS_PASSWORD");
        if (pf && pf[0]) {
            FILE *f = fopen(pf, "r");
            if (f) {
                if (fgets(pass, sizeof(pass), f)) pass[strcspn(pass, "\r\n")] = '\0';
                fclose(f);
            }
        } else if (pw) snprintf(pass, sizeof(pass), "%s", pw);
    }
    if (*h == '[') {
        const char *e = strchr(h, ']');
        if (!e) return snprintf(err, n, "malformed url"), false;
        snprintf(host, sizeof(host), "%.*s", (int)(e - h - 1), h + 1);
        h = e + 1;
    } else {
        size_t l = strcspn(h, ":/?#");
        snprintf(host, sizeof(host), "%.*s", (int)l, h);
        h += l;
    }
    if (*h == ':') port = atoi(h + 1);
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c || c->err) {
        snprintf(err, n, "%s", c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return false;
    }
    redisSetTimeout(c, tv);
    if (pass[0]) {
        redisReply *r = user[0] ? redisCommand(c, "AUTH %s %s", user, pass) : redisCommand(c, "AUTH %s", pass);
        bool ok = r && r->type != REDIS_REPLY_ERROR;
        if (r) freeReplyObject(r);
        if (!ok) {
            snprintf(err, n, "AUTH refused");
            redisFree(c);
            return false;
        }
    }
    double a = wall_now();
    redisReply *r = redisCommand(c, "TIME");
    double b = wall_now();
    bool ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING;
    if (ok) *skew = atof(r->element[0]->str) + atof(r->element[1]->str) / 1e6 - (a + b) / 2;
    else snprintf(err, n, "TIME: %s", r && r->type == REDIS_REPLY_ERROR ? r->str : "no answer");
    if (r) freeReplyObject(r);
    redisFree(c);
    return ok;
}
#endif

void check_clock(pf_t *p, bool reachable)
{
    const char *url = pf_registry_url(p);
    if (!reachable) {
        pf_put(p, "clock", SKIP, "the registry is not reachable");
        return;
    }
    if (!strncmp(url, "file:", 5)) {
        /* The file registry stores each entry's expiry as its writer's wall
         * time: on a directory shared by hosts, clocks that disagree by
         * about dead_ms (2 s) make live publishers look dead. */
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s/.preflight-clock-%d", url + 5, p->job, (int)getpid());
        double a = wall_now();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        struct stat sb;
        bool ok = fd >= 0 && write(fd, "x", 1) == 1 && fstat(fd, &sb) == 0;
        double b = wall_now();
        if (fd >= 0) close(fd);
        unlink(path);
        if (!ok) {
            pf_put(p, "clock", WARN, "cannot write %s: %s", path, strerror(errno));
            pf_remedy(p, "see the registry line");
            return;
        }
        /* File times come from the kernel's coarse clock (a tick behind). */
        double skew = (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec / 1e9 - (a + b) / 2;
        verdict_t v = fabs(skew) > 1 ? FAIL : fabs(skew) > 0.1 ? WARN : PASS;
        pf_put(p, "clock", v, "the registry directory's file times are %+.3f s from this host's clock", skew);
        if (v != PASS)
            pf_remedy(p,
                      "run chrony/ntpd on every host sharing the registry directory: entries expire by their writer's "
                      "clock");
        return;
    }
#ifdef REFIT_HAVE_REDIS
    double skew = 0;
    char err[256];
    if (!redis_skew(url, &skew, err, sizeof(err))) {
        pf_put(p, "clock", WARN, "Redis TIME: %s", err);
        pf_remedy(p, "see the registry line");
        return;
    }
    pf_put(p, "clock", fabs(skew) > 1 ? WARN : PASS,
           "Redis's clock is %+.3f s from this host's (Redis expires keys by its own clock: refit does not depend on "
           "this; logs do)",
           skew);
    if (fabs(skew) > 1) pf_remedy(p, "run chrony/ntpd on this host and the Redis server's");
#else
    pf_put(p, "clock", SKIP, "no redis support built in");
#endif
}
