/* Prometheus metrics of the process's publishers and receivers
 * (refit/metrics.h, docs/operations.md).
 *
 * DESIGN.  One table of endpoints (role, job, group, rank), each with fixed
 * arrays: failures indexed by -status, a histogram per phase, bytes per
 * (transport, lane).  The engine reports each pull and publish once, from
 * the end of refit_receiver_pull / refit_publisher_publish; the report is
 * folded in under one mutex, so the cost per event is a few hundred
 * nanoseconds, plus - only when asked through the environment - rendering
 * the text (a few KB) and renaming it into place.  Cardinality is bounded:
 * at most 64 endpoints per process (later ones are counted in
 * refit_metrics_series_dropped_total) and 16 (transport, lane) pairs per
 * endpoint (the rest are summed under lane="other").
 *
 * The HTTP endpoint is one thread polling the listening socket and up to 16
 * nonblocking connections; each reads at most 8 KiB of request, answers GET
 * /metrics (and GET /) and closes, all within 3 s of its accept or it is
 * closed (a per-socket timeout alone let a client sending a byte a second
 * hold the only connection forever).  A 17th connection takes the oldest's
 * slot, so slow clients cannot starve a scraper, and at most 16 x 8 KiB
 * plus the answers in flight is what strangers can make us hold.  Label names avoid Prometheus's own target labels:
 * the job is `refit_job`, so a scrape's `job` stays the scrape job's. */
#include "engine/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "io/file.h"
#include "util/util.h"

#define NBUCKETS 16
static const double g_bounds[NBUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25,   0.5,   1,      2.5,   5,    10,    30,   60};

typedef struct {
    uint64_t counts[NBUCKETS + 1]; /* per bucket, not cumulative; the last one is (60, +Inf) */
    double sum;
    uint64_t n;
} hist_t;

enum { R_WAIT, R_DISCOVER, R_PLAN, R_CONNECT, R_TRANSFER, R_VERIFY, R_DIGEST, R_TOTAL, R_NPHASES };
static const char *const g_rphase[R_NPHASES] = {"wait",     "discover", "plan",   "connect",
                                                "transfer", "verify",   "digest", "total"};
enum { P_PUBLISH, P_DIGEST, P_DELTA_ENCODE, P_NPHASES };
static const char *const g_pphase[P_NPHASES] = {"publish", "digest", "delta_encode"};

#define MAX_LANES 16
#define NSTATUS 64
#define MAX_EPS 64
#define MAX_CONNS 16          /* HTTP connections served at once */
#define CONN_DEADLINE_MS 3000 /* for one connection, reading and writing together */
#define REQ_MAX 8192          /* request bytes read */

typedef struct {
    char *transport, *lane;
    uint64_t bytes;
} lane_t;

typedef struct {
    bool publisher;
    char *job, *group;
    uint32_t rank;
    uint64_t failures[NSTATUS];             /* by -status */
    hist_t phase[R_NPHASES];                /* publishers use the first P_NPHASES */
    uint64_t versions_full, versions_delta; /* receivers: committed, by kind; publishers: published (full) */
    uint64_t version;                       /* the last committed / published */
    bool have_version;
    lane_t lanes[MAX_LANES];
    size_t nlanes;
    uint64_t digest_checked, digest_unverified;
    uint64_t full_bytes; /* receivers: bytes of the last full pull */
    double delta_ratio;
    bool have_ratio;
    uint64_t bytes, delta_bytes; /* publishers: memory published, delta bytes offered */
} ep_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ep_t g_eps[MAX_EPS];
static size_t g_neps;
static uint64_t g_dropped;

/* ---- folding events in ------------------------------------------------------- */

static void observe(hist_t *h, double seconds)
{
    if (!(seconds >= 0)) seconds = 0; /* NaN or negative: a clock that went wrong, not a sample to lose */
    size_t b = 0;
    while (b < NBUCKETS && seconds > g_bounds[b]) b++;
    h->counts[b]++;
    h->sum += seconds;
    h->n++;
}

/* The endpoint (lock held); NULL when the table is full or memory is short. */
static ep_t *endpoint(bool publisher, const char *job, const char *group, const refit_manifest_t *m)
{
    if (!job || !job[0]) job = "default";
    if (!group || !group[0]) group = "trainer";
    uint32_t rank = 0;
    if (m) {
        refit_manifest_identity_t id;
        refit_manifest_identity(m, &id);
        rank = id.rank;
    }
    for (size_t i = 0; i < g_neps; i++) {
        ep_t *e = &g_eps[i];
        if (e->publisher == publisher && e->rank == rank && !strcmp(e->job, job) && !strcmp(e->group, group)) return e;
    }
    if (g_neps == MAX_EPS) return NULL;
    ep_t *e = &g_eps[g_neps];
    memset(e, 0, sizeof(*e));
    e->publisher = publisher;
    e->rank = rank;
    e->job = refit_strdup(job);
    e->group = refit_strdup(group);
    if (!e->job || !e->group) {
        free(e->job);
        free(e->group);
        return NULL;
    }
    g_neps++;
    return e;
}

static void count_failure(ep_t *e, refit_status_t st)
{
    int idx = -(int)st;
    if (idx <= 0 || idx >= NSTATUS) idx = NSTATUS - 1; /* rendered as refit_status_name's "REFIT_UNKNOWN" */
    e->failures[idx]++;
}

static void add_lane(ep_t *e, const char *transport, const char *lane, uint64_t bytes)
{
    if (!transport[0]) transport = "none";
    if (!lane[0]) lane = "none";
    for (size_t i = 0; i < e->nlanes; i++)
        if (!strcmp(e->lanes[i].transport, transport) && !strcmp(e->lanes[i].lane, lane)) {
            e->lanes[i].bytes += bytes;
            return;
        }
    if (e->nlanes == MAX_LANES - 1) transport = lane = "other"; /* the last slot sums the rest */
    if (e->nlanes == MAX_LANES) {
        e->lanes[MAX_LANES - 1].bytes += bytes;
        return;
    }
    lane_t *l = &e->lanes[e->nlanes];
    l->transport = refit_strdup(transport);
    l->lane = refit_strdup(lane);
    if (!l->transport || !l->lane) {
        free(l->transport);
        free(l->lane);
        l->transport = l->lane = NULL;
        return;
    }
    l->bytes = bytes;
    e->nlanes++;
}

static void export_now(void);

void refit_metrics_pull(const char *job, const char *group, const refit_manifest_t *m, refit_status_t st,
                        const refit_pull_report_t *rep)
{
    pthread_mutex_lock(&g_lock);
    ep_t *e = endpoint(false, job, group, m);
    if (!e) g_dropped++;
    else if (st != REFIT_OK || !rep) count_failure(e, st != REFIT_OK ? st : REFIT_ERR_INTERNAL);
    else {
        const double ms[R_NPHASES] = {rep->wait_ms,     rep->discover_ms, rep->plan_ms,   rep->connect_ms,
                                      rep->transfer_ms, rep->verify_ms,   rep->digest_ms, rep->total_ms};
        for (int k = 0; k < R_NPHASES; k++) observe(&e->phase[k], ms[k] / 1e3);
        if (rep->delta_base) e->versions_delta++;
        else e->versions_full++;
        e->version = rep->version;
        e->have_version = true;
        add_lane(e, rep->transport, rep->lanes, rep->bytes);
        e->digest_checked += rep->digest_bytes;
        e->digest_unverified += rep->unverified_bytes;
        if (!rep->delta_base) {
            e->full_bytes = rep->bytes;
            e->delta_ratio = 1;
            e->have_ratio = true;
        } else if (e->full_bytes) { /* a delta's bytes against the last full pull's */
            e->delta_ratio = (double)rep->bytes / (double)e->full_bytes;
            e->have_ratio = true;
        }
    }
    pthread_mutex_unlock(&g_lock);
    export_now();
}

void refit_metrics_publish(const char *job, const char *group, const refit_manifest_t *m, refit_status_t st,
                           uint64_t version, double seconds, double digest_ms, const refit_publish_delta_t *delta)
{
    pthread_mutex_lock(&g_lock);
    ep_t *e = endpoint(true, job, group, m);
    if (!e) g_dropped++;
    else if (st != REFIT_OK) count_failure(e, st);
    else {
        uint64_t bytes = 0;
        for (uint32_t r = 0; m && r < refit_manifest_num_regions(m); r++) bytes += refit_manifest_region_size(m, r);
        observe(&e->phase[P_PUBLISH], seconds);
        observe(&e->phase[P_DIGEST], digest_ms / 1e3);
        e->versions_full++;
        e->version = version;
        e->have_version = true;
        e->bytes += bytes;
        if (delta && delta->version == version) {
            observe(&e->phase[P_DELTA_ENCODE], delta->encode_ms / 1e3);
            if (delta->base_version) e->delta_bytes += delta->bytes;
            e->delta_ratio = delta->base_version && delta->region_bytes
                                 ? (double)delta->bytes / (double)delta->region_bytes
                                 : 1.0; /* no delta offered: a receiver pulls in full */
            e->have_ratio = true;
        }
    }
    pthread_mutex_unlock(&g_lock);
    export_now();
}

void refit_metrics_reset(void)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_neps; i++) {
        free(g_eps[i].job);
        free(g_eps[i].group);
        for (size_t l = 0; l < g_eps[i].nlanes; l++) {
            free(g_eps[i].lanes[l].transport);
            free(g_eps[i].lanes[l].lane);
        }
    }
    memset(g_eps, 0, sizeof(g_eps));
    g_neps = 0;
    g_dropped = 0;
    pthread_mutex_unlock(&g_lock);
}

/* ---- the text format ------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} buf_t;

REFIT_PRINTF(2, 3) static void bput(buf_t *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* A label value: backslash, double quote and newline escaped (the format's three). */
static void bput_value(buf_t *b, const char *s)
{
    bput(b, "\"");
    for (; *s; s++) {
        if (*s == '\\') bput(b, "\\\\");
        else if (*s == '"') bput(b, "\\\"");
        else if (*s == '\n') bput(b, "\\n");
        else bput(b, "%c", *s);
    }
    bput(b, "\"");
}

/* {refit_job="..",group="..",rank="R"[,k1="v1"][,k2="v2"]} */
static void bput_labels(buf_t *b, const ep_t *e, const char *k1, const char *v1, const char *k2, const char *v2)
{
    bput(b, "{refit_job=");
    bput_value(b, e->job);
    bput(b, ",group=");
    bput_value(b, e->group);
    bput(b, ",rank=\"%" PRIu32 "\"", e->rank);
    if (k1) {
        bput(b, ",%s=", k1);
        bput_value(b, v1);
    }
    if (k2) {
        bput(b, ",%s=", k2);
        bput_value(b, v2);
    }
    bput(b, "}");
}

/* A float as the format takes it (Go's ParseFloat): NaN, +Inf, or %.17g. */
static void bput_float(buf_t *b, double v)
{
    if (isnan(v)) bput(b, "NaN");
    else if (isinf(v)) bput(b, v > 0 ? "+Inf" : "-Inf");
    else bput(b, "%.17g", v);
}

static void family(buf_t *b, const char *name, const char *type, const char *help)
{
    bput(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histograms(buf_t *b, bool publisher, const char *name, const char *help, const char *const *phases,
                       int nphases)
{
    family(b, name, "histogram", help);
    for (size_t i = 0; i < g_neps; i++) {
        const ep_t *e = &g_eps[i];
        if (e->publisher != publisher) continue;
        for (int k = 0; k < nphases; k++) {
            const hist_t *h = &e->phase[k];
            if (!h->n) continue;
            uint64_t cum = 0;
            for (int q = 0; q <= NBUCKETS; q++) {
                char le[32];
                cum += h->counts[q];
                if (q < NBUCKETS) snprintf(le, sizeof(le), "%g", g_bounds[q]);
                else snprintf(le, sizeof(le), "+Inf");
                bput(b, "%s_bucket", name);
                bput_labels(b, e, "phase", phases[k], "le", le);
                bput(b, " %" PRIu64 "\n", cum);
            }
            bput(b, "%s_sum", name);
            bput_labels(b, e, "phase", phases[k], NULL, NULL);
            bput(b, " ");
            bput_float(b, h->sum);
            bput(b, "\n%s_count", name);
            bput_labels(b, e, "phase", phases[k], NULL, NULL);
            bput(b, " %" PRIu64 "\n", h->n);
        }
    }
}

static void failures(buf_t *b, bool publisher, const char *name, const char *help)
{
    family(b, name, "counter", help);
    for (size_t i = 0; i < g_neps; i++) {
        const ep_t *e = &g_eps[i];
        if (e->publisher != publisher) continue;
        for (int s = 1; s < NSTATUS; s++) {
            if (!e->failures[s]) continue;
            bput(b, "%s", name);
            bput_labels(b, e, "status", refit_status_name((refit_status_t)-s), NULL, NULL);
            bput(b, " %" PRIu64 "\n", e->failures[s]);
        }
    }
}

/* One sample per endpoint of the role: an unsigned value, or (is_float) a double. */
typedef enum { F_VERSION, F_CHECKED, F_UNVERIFIED, F_RATIO, F_BYTES, F_DELTA_BYTES, F_PUBLISHED } field_t;
static void simple(buf_t *b, bool publisher, const char *name, const char *type, const char *help, field_t f)
{
    family(b, name, type, help);
    for (size_t i = 0; i < g_neps; i++) {
        const ep_t *e = &g_eps[i];
        if (e->publisher != publisher) continue;
        if ((f == F_VERSION && !e->have_version) || (f == F_RATIO && !e->have_ratio)) continue;
        bput(b, "%s", name);
        bput_labels(b, e, NULL, NULL, NULL, NULL);
        bput(b, " ");
        switch (f) {
        case F_VERSION: bput(b, "%" PRIu64, e->version); break;
        case F_CHECKED: bput(b, "%" PRIu64, e->digest_checked); break;
        case F_UNVERIFIED: bput(b, "%" PRIu64, e->digest_unverified); break;
        case F_RATIO: bput_float(b, e->delta_ratio); break;
        case F_BYTES: bput(b, "%" PRIu64, e->bytes); break;
        case F_DELTA_BYTES: bput(b, "%" PRIu64, e->delta_bytes); break;
        case F_PUBLISHED: bput(b, "%" PRIu64, e->versions_full); break;
        }
        bput(b, "\n");
    }
}

static void render(buf_t *b)
{
    /* receivers */
    family(b, "refit_receiver_versions_committed_total", "counter",
           "Versions a receiver committed, by kind (full: every byte pulled; delta: a delta applied).");
    for (size_t i = 0; i < g_neps; i++) {
        const ep_t *e = &g_eps[i];
        if (e->publisher) continue;
        bput(b, "refit_receiver_versions_committed_total");
        bput_labels(b, e, "kind", "full", NULL, NULL);
        bput(b, " %" PRIu64 "\nrefit_receiver_versions_committed_total", e->versions_full);
        bput_labels(b, e, "kind", "delta", NULL, NULL);
        bput(b, " %" PRIu64 "\n", e->versions_delta);
    }
    simple(b, false, "refit_receiver_committed_version", "gauge", "The version a receiver committed last.", F_VERSION);
    failures(b, false, "refit_receiver_failures_total", "Pulls that failed, by refit status name.");
    histograms(b, false, "refit_receiver_phase_seconds",
               "Seconds per phase of each committed pull (wait: for the trainer; verify includes digest; total: "
               "the pull without wait).",
               g_rphase, R_NPHASES);
    family(b, "refit_receiver_bytes_total", "counter",
           "Bytes pulled, by transport and lane (what carried them, as the pull report names it).");
    for (size_t i = 0; i < g_neps; i++) {
        const ep_t *e = &g_eps[i];
        if (e->publisher) continue;
        for (size_t l = 0; l < e->nlanes; l++) {
            bput(b, "refit_receiver_bytes_total");
            bput_labels(b, e, "transport", e->lanes[l].transport, "lane", e->lanes[l].lane);
            bput(b, " %" PRIu64 "\n", e->lanes[l].bytes);
        }
    }
    simple(b, false, "refit_receiver_digest_checked_bytes_total", "counter",
           "Bytes checked against the publishers' content digests before commit.", F_CHECKED);
    simple(b, false, "refit_receiver_digest_unverified_bytes_total", "counter",
           "Bytes committed that no content digest could check (sources without digests, GPU memory).", F_UNVERIFIED);
    simple(b, false, "refit_receiver_delta_ratio", "gauge",
           "Bytes of the last pull over the bytes of the last full pull (1: a full pull).", F_RATIO);
    /* publishers */
    simple(b, true, "refit_publisher_versions_published_total", "counter", "Versions a publisher published.",
           F_PUBLISHED);
    simple(b, true, "refit_publisher_published_version", "gauge", "The version a publisher published last.", F_VERSION);
    failures(b, true, "refit_publisher_failures_total", "Publishes that failed, by refit status name.");
    histograms(b, true, "refit_publisher_phase_seconds",
               "Seconds per publish (publish: the whole call; digest: the content digests; delta_encode: the delta).",
               g_pphase, P_NPHASES);
    simple(b, true, "refit_publisher_bytes_total", "counter", "Bytes of memory published (every region, per version).",
           F_BYTES);
    simple(b, true, "refit_publisher_delta_bytes_total", "counter", "Encoded delta bytes offered with versions.",
           F_DELTA_BYTES);
    simple(b, true, "refit_publisher_delta_ratio", "gauge",
           "Encoded delta bytes of the last version over its memory's bytes (1: no delta offered).", F_RATIO);
    family(b, "refit_metrics_series_dropped_total", "counter",
           "Events not recorded: this process had more than 64 publishers and receivers.");
    bput(b, "refit_metrics_series_dropped_total %" PRIu64 "\n", g_dropped);
}

refit_status_t refit_metrics_text(char **out, size_t *len)
{
    if (!out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_metrics_text: NULL argument");
    buf_t b = {0};
    pthread_mutex_lock(&g_lock);
    render(&b);
    pthread_mutex_unlock(&g_lock);
    if (b.oom || !b.p) {
        free(b.p);
        return refit_error(REFIT_ERR_NO_MEMORY, "rendering the metrics");
    }
    *out = b.p;
    if (len) *len = b.len;
    return REFIT_OK;
}

/* ---- the textfile ----------------------------------------------------------- */

static char *expand_path(const char *path)
{
    buf_t b = {0};
    for (const char *s = path; *s; s++) {
        if (s[0] == '%' && s[1] == 'p') {
            bput(&b, "%d", (int)getpid());
            s++;
        } else bput(&b, "%c", *s);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : refit_strdup("");
}

refit_status_t refit_metrics_write_file(const char *path)
{
    if (!path || !path[0]) return refit_error(REFIT_ERR_INVALID_ARG, "refit_metrics_write_file: no path");
    char *text = NULL, *real = expand_path(path);
    size_t len = 0;
    refit_status_t st = refit_metrics_text(&text, &len);
    if (!st && !real) st = refit_error(REFIT_ERR_NO_MEMORY, "metrics file name");
    /* An exclusive temporary of a random name, renamed into place (io/file.h):
     * "<path>.tmp.<pid>" could be a link someone else put there.  The
     * directory may be shared (a node exporter's textfile directory is often
     * group-writable): whoever can write it can replace the file anyway, but
     * can no longer make us write anywhere else.  0644: the node exporter
     * usually runs as another user. */
    refit_outfile_t o;
    if (!st && !(st = refit_outfile_open(&o, real, 0644, false))) {
        refit_outfile_write(&o, text, len);
        st = refit_outfile_commit(&o, real);
    }
    free(text);
    free(real);
    return st;
}

/* ---- the HTTP endpoint -------------------------------------------------------- */

static pthread_mutex_t g_srv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool running;
    int fd, stop[2];
    pthread_t th;
} g_srv = {false, -1, {-1, -1}, 0};

static bool all_digits(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

static refit_status_t parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *sl)
{
    char host[128] = "127.0.0.1";
    const char *port;
    size_t n = strlen(addr);
    if (n == 0 || n >= sizeof(host))
        return refit_error(REFIT_ERR_INVALID_ARG, "metrics address '%s': expected PORT, IP:PORT or [IPv6]:PORT", addr);
    if (all_digits(addr)) port = addr;
    else if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':')
            return refit_error(REFIT_ERR_INVALID_ARG, "metrics address '%s': expected [IPv6]:PORT", addr);
        memcpy(host, addr + 1, (size_t)(close - addr - 1));
        host[close - addr - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon) return refit_error(REFIT_ERR_INVALID_ARG, "metrics address '%s': no port (IP:PORT)", addr);
        if (colon > addr) {
            memcpy(host, addr, (size_t)(colon - addr));
            host[colon - addr] = '\0';
        }
        port = colon + 1;
    }
    if (!strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
    uint64_t p = 0;
    for (const char *s = port; all_digits(port) && *s && p <= 65535; s++) p = p * 10 + (uint64_t)(*s - '0');
    if (!all_digits(port) || p > 65535)
        return refit_error(REFIT_ERR_INVALID_ARG, "metrics address '%s': the port must be 0..65535", addr);
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        if (a4->sin_addr.s_addr == htonl(INADDR_ANY))
            return refit_error(REFIT_ERR_INVALID_ARG,
                               "metrics address '%s' would accept connections on every "
                               "interface: name one address (the loopback is the default)",
                               addr);
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)p);
        *sl = sizeof(*a4);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr))
            return refit_error(REFIT_ERR_INVALID_ARG,
                               "metrics address '%s' would accept connections on every "
                               "interface: name one address (the loopback is the default)",
                               addr);
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)p);
        *sl = sizeof(*a6);
    } else
        return refit_error(REFIT_ERR_INVALID_ARG, "metrics address '%s': '%s' is not an IP address (or localhost)",
                           addr, host);
    return REFIT_OK;
}

/* The whole answer to one request (head and body), malloc'ed; NULL when
 * out of memory. */
static char *answer(const char *status, const char *type, const char *body, size_t len, size_t *out_len)
{
    char *msg = refit_asprintf("HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                               status, type, len);
    size_t hl = msg ? strlen(msg) : 0;
    char *all = msg ? realloc(msg, hl + len + 1) : NULL;
    if (!all) {
        free(msg);
        return NULL;
    }
    memcpy(all + hl, body, len);
    *out_len = hl + len;
    return all;
}

static char *respond(char *req, size_t *out_len)
{
    char method[16], path[256];
    if (sscanf(req, "%15s %255s", method, path) != 2) {
        static const char msg[] = "bad request\n";
        return answer("400 Bad Request", "text/plain", msg, sizeof(msg) - 1, out_len);
    }
    char *q = strchr(path, '?');
    if (q) *q = '\0';
    if (strcmp(method, "GET")) {
        static const char msg[] = "only GET\n";
        return answer("405 Method Not Allowed", "text/plain", msg, sizeof(msg) - 1, out_len);
    }
    if (strcmp(path, "/metrics") && strcmp(path, "/")) {
        static const char msg[] = "refit serves /metrics\n";
        return answer("404 Not Found", "text/plain", msg, sizeof(msg) - 1, out_len);
    }
    char *text = NULL;
    size_t tlen = 0;
    if (refit_metrics_text(&text, &tlen)) {
        static const char msg[] = "out of memory\n";
        return answer("500 Internal Server Error", "text/plain", msg, sizeof(msg) - 1, out_len);
    }
    char *all = answer("200 OK", "text/plain; version=0.0.4; charset=utf-8", text, tlen, out_len);
    free(text);
    return all;
}

/* One connection: reading its request until the blank line (at most
 * REQ_MAX bytes), then writing the answer; closed at its deadline whatever
 * it is doing, so a client that sends (or reads) a byte a second holds a
 * slot CONN_DEADLINE_MS at most. */
typedef struct {
    int fd;
    uint64_t deadline_ns;
    size_t len; /* request bytes read */
    char *out;  /* the answer, once the request is complete */
    size_t out_len, sent;
    char req[REQ_MAX + 1];
} conn_t;

static void conn_close(conn_t *c)
{
    close(c->fd);
    free(c->out);
    c->fd = -1;
    c->out = NULL;
}

/* Reads what is there; answers once the request is complete.  false: done
 * with (peer closed, error, answer sent). */
static bool conn_read(conn_t *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->req + c->len, REQ_MAX - c->len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        if (n < 0) return false;
        c->len += (size_t)n;
        c->req[c->len] = '\0';
        if (n == 0 || c->len == REQ_MAX || strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) break;
    }
    c->out = respond(c->req, &c->out_len);
    return c->out != NULL;
}

/* Sends what the socket takes.  false: done with (all sent, or an error). */
static bool conn_write(conn_t *c)
{
    while (c->sent < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->sent, c->out_len - c->sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        if (w <= 0) return false;
        c->sent += (size_t)w;
    }
    return false;
}

static void *serve_thread(void *arg)
{
    (void)arg;
    conn_t *conns = calloc(MAX_CONNS, sizeof(conn_t));
    if (!conns) return NULL; /* no endpoint; refit_metrics_stop still joins */
    for (int i = 0; i < MAX_CONNS; i++) conns[i].fd = -1;
    for (;;) {
        struct pollfd p[2 + MAX_CONNS];
        int idx[MAX_CONNS], np = 2;
        p[0] = (struct pollfd){.fd = g_srv.fd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = g_srv.stop[0], .events = POLLIN};
        uint64_t now = refit_now_ns(), next = UINT64_MAX;
        for (int i = 0; i < MAX_CONNS; i++) {
            conn_t *c = &conns[i];
            if (c->fd < 0) continue;
            if (now >= c->deadline_ns) {
                conn_close(c);
                continue;
            }
            if (c->deadline_ns < next) next = c->deadline_ns;
            idx[np - 2] = i;
            p[np++] = (struct pollfd){.fd = c->fd, .events = c->out ? POLLOUT : POLLIN};
        }
        int ms = next == UINT64_MAX ? -1 : (int)((next - now) / 1000000u + 1);
        if (poll(p, (nfds_t)np, ms) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents) break;
        for (int k = 2; k < np; k++) {
            conn_t *c = &conns[idx[k - 2]];
            if (!p[k].revents) continue;
            bool more = c->out ? conn_write(c) : conn_read(c);
            if (more && c->out && !(p[k].events & POLLOUT)) more = conn_write(c); /* answer at once */
            if (!more) conn_close(c);
        }
        /* Every connection waiting (the listening socket is nonblocking):
         * each takes a free slot, else the oldest connection's, so a crowd
         * of slow clients cannot keep a scraper waiting. */
        for (int fd;
             (p[0].revents & POLLIN) && (fd = accept4(g_srv.fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
            int slot = 0;
            for (int i = 0; i < MAX_CONNS; i++) {
                if (conns[i].fd < 0) {
                    slot = i;
                    break;
                }
                if (conns[i].deadline_ns < conns[slot].deadline_ns) slot = i;
            }
            if (conns[slot].fd >= 0) conn_close(&conns[slot]);
            conn_t *c = &conns[slot];
            memset(c, 0, offsetof(conn_t, req));
            c->fd = fd;
            c->req[0] = '\0';
            c->deadline_ns = refit_now_ns() + (uint64_t)CONN_DEADLINE_MS * 1000000u;
        }
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].fd >= 0) conn_close(&conns[i]);
    free(conns);
    return NULL;
}

refit_status_t refit_metrics_serve(const char *addr, char *bound, size_t n)
{
    if (!addr) return refit_error(REFIT_ERR_INVALID_ARG, "refit_metrics_serve: no address");
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    refit_status_t st = parse_addr(addr, &ss, &sl);
    if (st) return st;
    pthread_mutex_lock(&g_srv_lock);
    if (g_srv.running) {
        pthread_mutex_unlock(&g_srv_lock);
        return refit_error(REFIT_ERR_BUSY, "this process already serves its metrics");
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0) st = refit_error(REFIT_ERR_IO, "metrics socket: %s", strerror(errno));
    else {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&ss, sl) != 0)
            st = refit_error(REFIT_ERR_IO, "metrics address %s: cannot bind: %s", addr, strerror(errno));
        else if (listen(fd, 64) != 0)
            st = refit_error(REFIT_ERR_IO, "metrics address %s: cannot listen: %s", addr, strerror(errno));
    }
    if (!st && pipe2(g_srv.stop, O_CLOEXEC) != 0) st = refit_error(REFIT_ERR_IO, "metrics: pipe: %s", strerror(errno));
    if (!st) {
        g_srv.fd = fd;
        if (pthread_create(&g_srv.th, NULL, serve_thread, NULL) != 0) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "metrics: cannot start the server thread");
            close(g_srv.stop[0]);
            close(g_srv.stop[1]);
            g_srv.fd = -1;
        }
    }
    if (st) {
        if (fd >= 0) close(fd);
        pthread_mutex_unlock(&g_srv_lock);
        return st;
    }
    g_srv.running = true;
    struct sockaddr_storage got;
    socklen_t gl = sizeof(got);
    if (bound && n) {
        char ip[INET6_ADDRSTRLEN] = "?";
        unsigned port = 0;
        if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0) {
            if (got.ss_family == AF_INET) {
                inet_ntop(AF_INET, &((struct sockaddr_in *)&got)->sin_addr, ip, sizeof(ip));
                port = ntohs(((struct sockaddr_in *)&got)->sin_port);
                snprintf(bound, n, "%s:%u", ip, port);
            } else {
                inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&got)->sin6_addr, ip, sizeof(ip));
                port = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
                snprintf(bound, n, "[%s]:%u", ip, port);
            }
        } else snprintf(bound, n, "%s", addr);
    }
    pthread_mutex_unlock(&g_srv_lock);
    return REFIT_OK;
}

void refit_metrics_stop(void)
{
    pthread_mutex_lock(&g_srv_lock);
    if (g_srv.running) {
        char x = 1;
        while (write(g_srv.stop[1], &x, 1) < 0 && errno == EINTR) {
        }
        pthread_join(g_srv.th, NULL);
        close(g_srv.fd);
        close(g_srv.stop[0]);
        close(g_srv.stop[1]);
        g_srv.fd = g_srv.stop[0] = g_srv.stop[1] = -1;
        g_srv.running = false;
    }
    pthread_mutex_unlock(&g_srv_lock);
}

/* ---- what the environment asks for -------------------------------------------- */

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static char *g_file; /* REFIT_METRICS_FILE */
static bool g_file_warned;

static void read_env(void)
{
    const char *f = refit_env(REFIT_ENV_METRICS_FILE);
    if (f && f[0]) g_file = refit_strdup(f);
    const char *a = refit_env(REFIT_ENV_METRICS_ADDR);
    if (a && a[0]) {
        char bound[80];
        refit_status_t st = refit_metrics_serve(a, bound, sizeof(bound));
        if (st)
            refit_log(REFIT_LOG_WARN, "REFIT_METRICS_ADDR: %s (%s); metrics are not served", refit_last_error(),
                      refit_status_name(st));
        else refit_log(REFIT_LOG_INFO, "metrics served on http://%s/metrics", bound);
    }
}

/* After each event.  The caller's last-error detail (a failed pull's) is
 * kept: a metrics failure must not replace it. */
static void export_now(void)
{
    char saved[1024];
    snprintf(saved, sizeof(saved), "%s", refit_last_error());
    pthread_once(&g_env_once, read_env);
    if (g_file) {
        refit_status_t st = refit_metrics_write_file(g_file);
        pthread_mutex_lock(&g_lock);
        bool warn = st && !g_file_warned;
        if (st) g_file_warned = true;
        pthread_mutex_unlock(&g_lock);
        if (warn)
            refit_log(REFIT_LOG_WARN, "REFIT_METRICS_FILE: %s (%s); later failures are not logged", refit_last_error(),
                      refit_status_name(st));
    }
    if (strcmp(saved, refit_last_error())) {
        if (saved[0]) refit_error(REFIT_OK, "%s", saved);
        else refit_clear_error();
    }
}
