/* Metrics (refit/metrics.h): what a scrape says after real pulls and
 * publishes, read back with a strict parser of the Prometheus text format
 * (0.0.4) written here, through all three ways out: refit_metrics_text, the
 * textfile (REFIT_METRICS_FILE) and the HTTP endpoint (REFIT_METRICS_ADDR and
 * refit_metrics_serve).  Values must equal the pull reports' fields. */
#include "testutil.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/metrics.h"
#include "io/file.h"

/* ---- a strict parser of the text exposition format ------------------------- */

#define MAX_SAMPLES 4096
typedef struct {
    char name[128];
    char labels[1024]; /* canonical: k="v",k="v" in the order written (values unescaped) */
    double value;
} sample_t;
typedef struct {
    sample_t s[MAX_SAMPLES];
    size_t n;
    char types[64][128]; /* family names seen with TYPE */
    char kinds[64][16];
    size_t nfam;
} scrape_t;

static bool name_char(int c, bool first) { return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c)); }

/* Parses one scrape; fails the test (naming the line) on anything the
 * format does not allow: a sample before its TYPE, a family typed twice, a
 * name or label outside the grammar, a bad escape, a value that is not a
 * float, a sample name that does not belong to its family's type, a
 * series given twice, buckets not cumulative, +Inf != _count. */
static void parse_scrape(const char *text, scrape_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *cur_family = NULL, *cur_kind = NULL;
    int lineno = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) fail_msg("scrape: line %d is not terminated by a newline", lineno + 1);
        lineno++;
        char buf[2048];
        size_t len = (size_t)(end - line);
        if (len >= sizeof(buf)) {
            fail_msg("scrape: line %d too long", lineno);
            return;
        }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = end + 1;
        if (!len) continue;
        if (buf[0] == '#') {
            char kw[16], fam[128], rest[1024] = "";
            int k = sscanf(buf, "# %15s %127s %1023[^\n]", kw, fam, rest);
            if (k >= 2 && !strcmp(kw, "TYPE")) {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                    strcmp(rest, "summary") && strcmp(rest, "untyped"))
                    fail_msg("scrape line %d: unknown type '%s'", lineno, rest);
                for (size_t f = 0; f < out->nfam; f++)
                    if (!strcmp(out->types[f], fam)) fail_msg("scrape line %d: %s typed twice", lineno, fam);
                assert_true(out->nfam < 64);
                snprintf(out->types[out->nfam], sizeof(out->types[0]), "%.127s", fam);
                snprintf(out->kinds[out->nfam], sizeof(out->kinds[0]), "%.15s", rest);
                cur_family = out->types[out->nfam];
                cur_kind = out->kinds[out->nfam];
                out->nfam++;
            } else if (k >= 2 && !strcmp(kw, "HELP")) {
                if (!rest[0]) fail_msg("scrape line %d: empty HELP", lineno);
            }
            continue;
        }
        sample_t *s = &out->s[out->n];
        assert_true(out->n < MAX_SAMPLES);
        const char *p = buf;
        size_t nl = 0;
        if (!name_char((unsigned char)*p, true)) fail_msg("scrape line %d: bad metric name: %s", lineno, buf);
        while (name_char((unsigned char)*p, false)) {
            if (nl + 1 >= sizeof(s->name)) fail_msg("scrape line %d: name too long", lineno);
            s->name[nl++] = *p++;
        }
        s->name[nl] = '\0';
        size_t ll = 0;
        if (*p == '{') {
            p++;
            while (*p != '}') {
                if (!name_char((unsigned char)*p, true) || *p == ':')
                    fail_msg("scrape line %d: bad label name at '%s'", lineno, p);
                if (ll) s->labels[ll++] = ',';
                while (name_char((unsigned char)*p, false) && *p != ':') s->labels[ll++] = *p++;
                if (*p++ != '=' || *p++ != '"') fail_msg("scrape line %d: expected =\" after a label name", lineno);
                s->labels[ll++] = '=';
                s->labels[ll++] = '"';
                while (*p != '"') {
                    if (!*p) fail_msg("scrape line %d: unterminated label value", lineno);
                    if (*p == '\\') {
                        p++;
                        if (*p == 'n') s->labels[ll++] = '\n';
                        else if (*p == '\\' || *p == '"') s->labels[ll++] = *p;
                        else fail_msg("scrape line %d: bad escape \\%c", lineno, *p);
                        p++;
                    } else s->labels[ll++] = *p++;
                    if (ll > sizeof(s->labels) - 8) fail_msg("scrape line %d: labels too long", lineno);
                }
                p++;
                s->labels[ll++] = '"';
                if (*p == ',') p++;
                else if (*p != '}') fail_msg("scrape line %d: expected , or } after a label", lineno);
            }
            p++;
        }
        s->labels[ll] = '\0';
        if (*p++ != ' ') fail_msg("scrape line %d: expected one space before the value", lineno);
        char *vend;
        if (!strcmp(p, "NaN")) s->value = NAN;
        else if (!strcmp(p, "+Inf")) s->value = INFINITY;
        else if (!strcmp(p, "-Inf")) s->value = -INFINITY;
        else {
            errno = 0;
            s->value = strtod(p, &vend);
            if (vend == p || *vend || errno) fail_msg("scrape line %d: value '%s' is not a float", lineno, p);
        }
        /* The sample belongs to the family typed last. */
        if (!cur_family) fail_msg("scrape line %d: sample %s before any TYPE", lineno, s->name);
        size_t fl = strlen(cur_family);
        bool ok = !strcmp(s->name, cur_family);
        if (!strcmp(cur_kind, "histogram"))
            ok = !strncmp(s->name, cur_family, fl) &&
                 (!strcmp(s->name + fl, "_bucket") || !strcmp(s->name + fl, "_sum") || !strcmp(s->name + fl, "_count"));
        if (!ok) fail_msg("scrape line %d: %s does not belong to the %s %s", lineno, s->name, cur_kind, cur_family);
        if (!strcmp(cur_kind, "counter") && !(s->value >= 0)) fail_msg("scrape line %d: negative counter", lineno);
        for (size_t i = 0; i < out->n; i++)
            if (!strcmp(out->s[i].name, s->name) && !strcmp(out->s[i].labels, s->labels))
                fail_msg("scrape line %d: series %s{%s} given twice", lineno, s->name, s->labels);
        out->n++;
    }
    /* Histograms: buckets cumulative, the +Inf bucket equal to _count. */
    for (size_t i = 0; i < out->n; i++) {
        const sample_t *c = &out->s[i];
        size_t nl = strlen(c->name);
        if (nl < 6 || strcmp(c->name + nl - 6, "_count")) continue;
        char base[128];
        snprintf(base, sizeof(base), "%.*s_bucket", (int)(nl - 6), c->name);
        double prev = -1, inf = -1;
        int buckets = 0;
        for (size_t j = 0; j < out->n; j++) {
            const sample_t *b = &out->s[j];
            if (strcmp(b->name, base) || strncmp(b->labels, c->labels, strlen(c->labels))) continue;
            if (strncmp(b->labels + strlen(c->labels), ",le=\"", 5)) continue;
            if (b->value < prev) fail_msg("%s{%s}: buckets not cumulative", base, b->labels);
            prev = b->value;
            buckets++;
            if (strstr(b->labels, "le=\"+Inf\"")) inf = b->value;
        }
        if (!strstr(c->name, "_phase_seconds")) continue;
        if (buckets < 2 || inf != c->value)
            fail_msg("%s{%s}: +Inf bucket %g != count %g", c->name, c->labels, inf, c->value);
    }
}

/* The value of the one sample named `name` whose labels contain every
 * k="v" in `want` (comma separated); fails if none or several match. */
static double get(const scrape_t *s, const char *name, const char *want)
{
    const sample_t *hit = NULL;
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->s[i].name, name)) continue;
        bool all = true;
        char w[512];
        snprintf(w, sizeof(w), "%s", want);
        for (char *save = NULL, *tok = strtok_r(w, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
            if (!strstr(s->s[i].labels, tok)) all = false;
        if (!all) continue;
        if (hit) fail_msg("%s{%s}: more than one series", name, want);
        hit = &s->s[i];
    }
    if (!hit) fail_msg("%s{%s}: no such series", name, want);
    return hit->value;
}

static bool has(const scrape_t *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->s[i].name, name)) return true;
    return false;
}

static scrape_t g_scrape; /* large: not on the stack */

static void scrape_text(scrape_t *out)
{
    char *text;
    size_t len;
    REFIT_ASSERT_OK(refit_metrics_text(&text, &len));
    assert_int_equal(strlen(text), len);
    parse_scrape(text, out);
    free(text);
}

/* ---- a scene: one publisher, one receiver, in this process ------------------ */

static char g_dir[] = "/tmp/refit-metrics-XXXXXX";
static char g_url[4200], g_file[4300], g_addr[64];

static void near(double got, double want, const char *what)
{
    if (fabs(got - want) > 1e-9 * fmax(1, fabs(want)))
        fail_msg("%s: scrape says %.17g, reports add up to %.17g", what, got, want);
}

/* Sends `req` to the endpoint, returns the whole answer (malloc'ed). */
static int connect_to(const char *addr, int ms)
{
    char host[64];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    assert_non_null(colon);
    *colon = '\0';
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    assert_int_equal(inet_pton(AF_INET, host, &a.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    /* connect() waits at most the send timeout (a full backlog drops SYNs). */
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static char *http(const char *addr, const char *req)
{
    int fd = connect_to(addr, 10000);
    if (fd < 0) fail_msg("connect %s: %s", addr, strerror(errno));
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    for (ssize_t n; (n = recv(fd, buf + len, cap - 1 - len, 0)) > 0;) len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    return buf;
}

static void pull_and_publish_match_reports(void **state)
{
    (void)state;
    refit_metrics_reset();
    refit_manifest_t *pm = t_manifest_named("tiny-dense", "megatron:tp=1", 0);
    refit_manifest_t *rm = t_manifest_named("tiny-dense", "vllm:tp=2", 1);
    uint64_t pbytes = refit_manifest_region_size(pm, 0);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = g_url;
    pp.job = "metrics";
    pp.transports = "shm";
    refit_publisher_t *p;
    REFIT_ASSERT_OK(refit_publisher_create(&pp, pm, &p));
    void *pbase;
    REFIT_ASSERT_OK(refit_publisher_alloc(p, 0, &pbase));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g_url;
    rp.job = "metrics";
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, rm, &r));
    void *rbase;
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &rbase));

    refit_pull_report_t rep[3] = {REFIT_PULL_REPORT_INIT, REFIT_PULL_REPORT_INIT, REFIT_PULL_REPORT_INIT};
    for (uint64_t v = 1; v <= 3; v++) {
        REFIT_ASSERT_OK(refit_truth_fill(pm, &pbase, v));
        REFIT_ASSERT_OK(refit_publisher_publish(p, v));
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep[v - 1]));
        REFIT_ASSERT_OK(refit_publisher_wait_readers(p, v, 10000));
    }
    /* Failures, each counted by its status name, and the pull's own detail kept. */
    refit_pull_report_t bad = REFIT_PULL_REPORT_INIT;
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 9, 50, &bad), REFIT_ERR_TIMEOUT, "");
    char detail[1024];
    snprintf(detail, sizeof(detail), "%s", refit_last_error());
    assert_true(detail[0] != '\0');
    REFIT_ASSERT_ERR(refit_receiver_pull(r, 9, 50, &bad), REFIT_ERR_TIMEOUT, detail);
    REFIT_ASSERT_ERR(refit_publisher_publish(p, 2), REFIT_ERR_INVALID_ARG, "not after the last published 3");

    scrape_t *s = &g_scrape;
    scrape_text(s);
    const char *me = "refit_job=\"metrics\";group=\"trainer\";rank=\"1\"";
    char lbl[1024];
    assert_int_equal(get(s, "refit_receiver_versions_committed_total", "kind=\"full\";rank=\"1\""), 3);
    assert_int_equal(get(s, "refit_receiver_versions_committed_total", "kind=\"delta\""), 0);
    assert_int_equal(get(s, "refit_receiver_committed_version", me), 3);
    assert_int_equal(get(s, "refit_receiver_failures_total", "status=\"REFIT_ERR_TIMEOUT\""), 2);
    assert_int_equal(get(s, "refit_publisher_failures_total", "status=\"REFIT_ERR_INVALID_ARG\";rank=\"0\""), 1);
    snprintf(lbl, sizeof(lbl), "transport=\"%s\";lane=\"%s\"", rep[0].transport, rep[0].lanes);
    assert_string_equal(rep[0].transport, "shm");
    near(get(s, "refit_receiver_bytes_total", lbl), (double)(rep[0].bytes + rep[1].bytes + rep[2].bytes), "bytes");
    assert_true(rep[0].bytes > 0);
    near(get(s, "refit_receiver_digest_checked_bytes_total", me),
         (double)(rep[0].digest_bytes + rep[1].digest_bytes + rep[2].digest_bytes), "digest bytes");
    assert_true(rep[0].digest_bytes > 0);
    near(get(s, "refit_receiver_digest_unverified_bytes_total", me),
         (double)(rep[0].unverified_bytes + rep[1].unverified_bytes + rep[2].unverified_bytes), "unverified bytes");
    near(get(s, "refit_receiver_delta_ratio", me), 1, "delta ratio");
    struct {
        const char *phase;
        size_t off;
    } ph[] = {{"wait", offsetof(refit_pull_report_t, wait_ms)},
              {"discover", offsetof(refit_pull_report_t, discover_ms)},
              {"plan", offsetof(refit_pull_report_t, plan_ms)},
              {"connect", offsetof(refit_pull_report_t, connect_ms)},
              {"transfer", offsetof(refit_pull_report_t, transfer_ms)},
              {"verify", offsetof(refit_pull_report_t, verify_ms)},
              {"digest", offsetof(refit_pull_report_t, digest_ms)},
              {"total", offsetof(refit_pull_report_t, total_ms)}};
    for (size_t k = 0; k < REFIT_ARRAY_LEN(ph); k++) {
        double sum = 0;
        int le_1ms = 0;
        for (int v = 0; v < 3; v++) {
            double ms = *(const double *)((const char *)&rep[v] + ph[k].off);
            sum += ms / 1e3;
            le_1ms += ms <= 1.0;
        }
        snprintf(lbl, sizeof(lbl), "phase=\"%s\";rank=\"1\"", ph[k].phase);
        near(get(s, "refit_receiver_phase_seconds_sum", lbl), sum, ph[k].phase);
        assert_int_equal(get(s, "refit_receiver_phase_seconds_count", lbl), 3);
        snprintf(lbl, sizeof(lbl), "phase=\"%s\";rank=\"1\";le=\"0.001\"", ph[k].phase);
        assert_int_equal(get(s, "refit_receiver_phase_seconds_bucket", lbl), le_1ms);
    }
    assert_true(get(s, "refit_receiver_phase_seconds_sum", "phase=\"transfer\"") > 0);
    /* the publisher */
    const char *pub = "refit_job=\"metrics\";group=\"trainer\";rank=\"0\"";
    assert_int_equal(get(s, "refit_publisher_versions_published_total", pub), 3);
    assert_int_equal(get(s, "refit_publisher_published_version", pub), 3);
    near(get(s, "refit_publisher_bytes_total", pub), 3.0 * (double)pbytes, "published bytes");
    assert_int_equal(get(s, "refit_publisher_phase_seconds_count", "phase=\"publish\""), 3);
    assert_int_equal(get(s, "refit_publisher_phase_seconds_count", "phase=\"digest\""), 3);
    assert_false(has(s, "refit_publisher_delta_ratio")); /* not a delta publisher */
    assert_int_equal(get(s, "refit_metrics_series_dropped_total", ""), 0);

    /* The textfile (REFIT_METRICS_FILE, set before the first event) was
     * rewritten after the last event: the same scrape, and no temporary left. */
    char *text, *file;
    size_t len, flen;
    REFIT_ASSERT_OK(refit_metrics_text(&text, &len));
    char path[4400];
    snprintf(path, sizeof(path), "%s/metrics-%d.prom", g_dir, (int)getpid());
    REFIT_ASSERT_OK(refit_read_regular(path, 1 << 20, &file, &flen));
    assert_string_equal(file, text);
    struct stat st;
    char tmp[4500];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    assert_int_equal(stat(tmp, &st), -1);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    free(file);

    /* The endpoint (REFIT_METRICS_ADDR) started at the first event. */
    char *got = http(g_addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(!strncmp(got, "HTTP/1.1 200 OK\r\n", 17));
    assert_non_null(strstr(got, "Content-Type: text/plain; version=0.0.4"));
    char *body = strstr(got, "\r\n\r\n");
    assert_non_null(body);
    assert_string_equal(body + 4, text); /* nothing happened in between */
    free(got);
    free(text);
    got = http(g_addr, "GET /other HTTP/1.0\r\n\r\n");
    assert_true(!strncmp(got, "HTTP/1.1 404", 12));
    free(got);
    got = http(g_addr, "POST /metrics HTTP/1.0\r\n\r\n");
    assert_true(!strncmp(got, "HTTP/1.1 405", 12));
    free(got);
    got = http(g_addr, "\r\n\r\n");
    assert_true(!strncmp(got, "HTTP/1.1 400", 12));
    free(got);

    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
}

static void delta_ratios(void **state)
{
    (void)state;
    refit_metrics_reset();
    refit_manifest_t *pm = t_manifest_named("tiny-dense", "megatron:tp=1", 0);
    refit_manifest_t *rm = t_manifest_named("tiny-dense", "vllm:tp=1", 0);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = g_url;
    pp.job = "metrics-delta";
    pp.transports = "shm";
    pp.delta = true;
    pp.delta_max_pct = 50;
    refit_publisher_t *p;
    REFIT_ASSERT_OK(refit_publisher_create(&pp, pm, &p));
    void *pbase;
    REFIT_ASSERT_OK(refit_publisher_alloc(p, 0, &pbase));
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = g_url;
    rp.job = "metrics-delta";
    rp.transports = "shm";
    rp.verify = REFIT_VERIFY_TRUTH;
    rp.truth_fraction = 0.01;
    refit_receiver_t *r;
    REFIT_ASSERT_OK(refit_receiver_create(&rp, rm, &r));
    void *rbase;
    REFIT_ASSERT_OK(refit_receiver_alloc(r, 0, &rbase));
    refit_pull_report_t rep[2] = {REFIT_PULL_REPORT_INIT, REFIT_PULL_REPORT_INIT};
    refit_publish_delta_t d = REFIT_PUBLISH_DELTA_INIT;
    for (uint64_t v = 1; v <= 2; v++) {
        REFIT_ASSERT_OK(refit_truth_fill_delta(pm, &pbase, v, 0.01));
        REFIT_ASSERT_OK(refit_publisher_publish(p, v));
        REFIT_ASSERT_OK(refit_receiver_pull(r, v, 10000, &rep[v - 1]));
        REFIT_ASSERT_OK(refit_publisher_wait_readers(p, v, 10000));
    }
    REFIT_ASSERT_OK(refit_publisher_last_delta(p, &d));
    assert_int_equal(rep[0].delta_base, 0);
    assert_int_equal(rep[1].delta_base, 1); /* the second pull applied a delta */
    assert_int_equal(d.base_version, 1);
    scrape_t *s = &g_scrape;
    scrape_text(s);
    assert_int_equal(get(s, "refit_receiver_versions_committed_total", "kind=\"delta\""), 1);
    assert_int_equal(get(s, "refit_receiver_versions_committed_total", "kind=\"full\""), 1);
    near(get(s, "refit_receiver_delta_ratio", ""), (double)rep[1].bytes / (double)rep[0].bytes, "receiver delta ratio");
    assert_true(get(s, "refit_receiver_delta_ratio", "") < 0.5);
    near(get(s, "refit_publisher_delta_ratio", ""), (double)d.bytes / (double)d.region_bytes, "publisher delta ratio");
    near(get(s, "refit_publisher_delta_bytes_total", ""), (double)d.bytes, "delta bytes"); /* v1 offered none */
    assert_int_equal(get(s, "refit_publisher_phase_seconds_count", "phase=\"delta_encode\""), 2);
    refit_receiver_destroy(r);
    refit_publisher_destroy(p);
}

static void label_values_escaped(void **state)
{
    (void)state;
    /* A group name cannot hold quotes, but a lane string is the transport's
     * own text: the engine hook takes any, and the scrape must stay valid. */
    refit_metrics_reset();
    refit_pull_report_t rep = {.version = 4, .bytes = 10, .total_ms = 2};
    snprintf(rep.transport, sizeof(rep.transport), "t\"x");
    snprintf(rep.lanes, sizeof(rep.lanes), "a\\b\nc \"d\"");
    refit_metrics_pull("j", "g", NULL, REFIT_OK, &rep);
    scrape_t *s = &g_scrape;
    scrape_text(s);
    assert_int_equal(get(s, "refit_receiver_bytes_total", "transport=\"t\"x\";lane=\"a\\b\nc \"d\"\""), 10);
    refit_metrics_reset();
}

static void serve_errors(void **state)
{
    (void)state;
    char bound[80];
    REFIT_ASSERT_ERR(refit_metrics_serve("0.0.0.0:9400", bound, sizeof(bound)), REFIT_ERR_INVALID_ARG,
                     "every interface");
    REFIT_ASSERT_ERR(refit_metrics_serve("[::]:9400", bound, sizeof(bound)), REFIT_ERR_INVALID_ARG, "every interface");
    REFIT_ASSERT_ERR(refit_metrics_serve("127.0.0.1:70000", bound, sizeof(bound)), REFIT_ERR_INVALID_ARG, "0..65535");
    REFIT_ASSERT_ERR(refit_metrics_serve("metrics.example:80", bound, sizeof(bound)), REFIT_ERR_INVALID_ARG,
                     "not an IP address");
    REFIT_ASSERT_ERR(refit_metrics_serve("127.0.0.1", bound, sizeof(bound)), REFIT_ERR_INVALID_ARG, "no port");
    /* the env-started server runs: a second one is refused */
    REFIT_ASSERT_ERR(refit_metrics_serve("127.0.0.1:0", bound, sizeof(bound)), REFIT_ERR_BUSY, "already serves");
    refit_metrics_stop();
    /* 192.0.2.1 (TEST-NET-1) is no interface of this host: binding fails, nothing is sent. */
    REFIT_ASSERT_ERR(refit_metrics_serve("192.0.2.1:0", bound, sizeof(bound)), REFIT_ERR_IO, "cannot bind");
    REFIT_ASSERT_OK(refit_metrics_serve(":0", bound, sizeof(bound)));
    assert_true(!strncmp(bound, "127.0.0.1:", 10));
    char *got = http(bound, "GET / HTTP/1.0\r\n\r\n");
    assert_true(!strncmp(got, "HTTP/1.1 200 OK", 15));
    free(got);
    refit_metrics_stop();
    refit_metrics_stop(); /* idempotent */
    REFIT_ASSERT_ERR(refit_metrics_write_file("/nonexistent-dir/x.prom"), REFIT_ERR_IO, "/nonexistent-dir/x.prom");
}

/* A TCP connection to addr ("IP:PORT"), connect and receive timeouts ms;
 * -1 if it did not connect in time. */

#define SLOW 20 /* more than the endpoint serves at once */
static struct {
    int fd[SLOW];
    volatile bool stop;
} g_slow;

/* Each slow client sends one byte of a request every 250 ms. */
static void *dribble(void *arg)
{
    (void)arg;
    while (!g_slow.stop) {
        for (int i = 0; i < SLOW; i++)
            if (g_slow.fd[i] >= 0) send(g_slow.fd[i], "G", 1, MSG_NOSIGNAL);
        t_msleep(250);
    }
    return NULL;
}

/* Clients sending a byte every 250 ms (more of them than the endpoint serves
 * at once) neither keep scrapes from being answered (the endpoint served one
 * connection at a time: 0 of 4 answered) nor hold a connection past its 3 s
 * deadline. */
static void slow_clients_do_not_starve(void **state)
{
    (void)state;
    char bound[80];
    REFIT_ASSERT_OK(refit_metrics_serve("127.0.0.1:0", bound, sizeof(bound)));
    double t0 = refit_now();
    int connected = 0;
    for (int i = 0; i < SLOW; i++) connected += (g_slow.fd[i] = connect_to(bound, 200)) >= 0;
    g_slow.stop = false;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, dribble, NULL), 0);
    t_msleep(300);
    int answered = 0;
    for (int k = 0; k < 4; k++) {
        double t1 = refit_now();
        int fd = connect_to(bound, 1000);
        if (fd < 0) continue;
        const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        char buf[64] = {0};
        ssize_t n = -1;
        if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1)
            n = recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL);
        if (n > 0 && !strncmp(buf, "HTTP/1.1 200 OK\r\n", 17) && t_ms_since(t1) < 1000) answered++;
        close(fd);
    }
    /* The slow clients still dribbling past their deadline: closed by then. */
    while (t_ms_since(t0) < 3600) t_msleep(50);
    g_slow.stop = true;
    pthread_join(th, NULL);
    int closed = 0;
    for (int i = 0; i < SLOW; i++) {
        char b[256];
        ssize_t n;
        if (g_slow.fd[i] < 0) continue;
        while ((n = recv(g_slow.fd[i], b, sizeof(b), 0)) > 0) {
        }
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed++;
        close(g_slow.fd[i]);
    }
    refit_metrics_stop();
    if (answered != 4 || connected != SLOW || closed != SLOW)
        fail_msg("%d of 4 scrapes answered within 1 s; %d of %d slow clients connected, %d closed by their deadline",
                 answered, connected, SLOW, closed);
}

/* The textfile is never written through a name someone else put in its way:
 * a hard link to another file at the temporary name it used to use
 * ("<path>.tmp.<pid>", opened O_TRUNC: the linked file was truncated and
 * overwritten), a symbolic link at the final name (replaced, not followed). */
static void textfile_not_through_links(void **state)
{
    (void)state;
    static const char precious[] = "the victim's own bytes\n";
    char victim[4400], path[4400], tmp[4500];
    snprintf(victim, sizeof(victim), "%s/victim", g_dir);
    snprintf(path, sizeof(path), "%s/links.prom", g_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(victim, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(precious, 1, sizeof(precious) - 1, f), sizeof(precious) - 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(link(victim, tmp), 0);
    REFIT_ASSERT_OK(refit_metrics_write_file(path));
    char *got = NULL;
    size_t len = 0;
    REFIT_ASSERT_OK(refit_read_regular(victim, 4096, &got, &len));
    assert_string_equal(got, precious);
    free(got);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(victim, path), 0);
    REFIT_ASSERT_OK(refit_metrics_write_file(path));
    REFIT_ASSERT_OK(refit_read_regular(victim, 4096, &got, &len));
    assert_string_equal(got, precious);
    free(got);
    struct stat sb;
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0644);
    unlink(tmp);
    unlink(path);
    unlink(victim);
}

int main(void)
{
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_url, sizeof(g_url), "file:%s/reg", g_dir);
    snprintf(g_file, sizeof(g_file), "%s/metrics-%%p.prom", g_dir);
    setenv("REFIT_METRICS_FILE", g_file, 1);
    snprintf(g_addr, sizeof(g_addr), "127.0.0.1:%d", t_free_port());
    setenv("REFIT_METRICS_ADDR", g_addr, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pull_and_publish_match_reports), cmocka_unit_test(delta_ratios),
        cmocka_unit_test(label_values_escaped),           cmocka_unit_test(serve_errors),
        cmocka_unit_test(textfile_not_through_links),     cmocka_unit_test(slow_clients_do_not_starve),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    refit_metrics_stop();
    t_rm_tree(g_dir);
    return rc;
}
