/* refit bench scenarios for the fleet: fanout, elastic, straggler,
 * egress.  Each runs on one host: publishers and receivers are child
 * processes of this binary (shm transport, file registry), driven over pipes;
 * every child reports refit_now() (CLOCK_MONOTONIC) times, so spans are
 * measured across processes.
 *
 * Links, two ways:
 *   --net shm    every process on this host's shared memory; slow links are
 *                emulated with REFIT_TEST_THROTTLE (a per-reader pacing of one
 *                holder's chunks; see src/engine/fleet/fleet.c).
 *   --net netns  (fanout's default when root, iproute2 and UCX are here)
 *                every process is a node of its own: a network namespace on a
 *                veth port of one bridge, its egress and its ingress each
 *                limited by a tc tbf qdisc to --link-mbps, bytes over UCX/TCP.
 *                The limits are real queues the kernel enforces on every
 *                reader at once, as a node's NIC would.
 * Output: one JSON object
 *   {"scenario":..,"config":{..},"metrics":{..},"assertions":[{"name","expected","observed","passed"}]}
 * on stdout (and --out FILE).  Exit status 0 even when an assertion fails
 * (they are measurements); 1 when a run itself failed.
 *
 * Common options: --model M (default qwen3-30b-a3b-mini), --receivers N,
 * --out FILE, --verify (check every byte against the synthetic truth; costs
 * CPU that the 2-core machines here share with the transfers). */
#include "net_internal.h"

/* ---- options ------------------------------------------------------------- */


int nb_parse(int argc, char **argv, nb_opts_t *o, const char *src, const char *dst, uint32_t receivers, double link)
{
    memset(o, 0, sizeof(*o));
    o->model = "qwen3-30b-a3b-mini";
    o->src = src;
    o->dst = dst;
    o->receivers = receivers;
    o->max_readers = 2;
    o->link_mbps = link;
    static const struct option opts[] = {{"scenario", required_argument, 0, 's'},
                                         {"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},
                                         {"receivers", required_argument, 0, 'n'},
                                         {"src", required_argument, 0, 'S'},
                                         {"dst", required_argument, 0, 'D'},
                                         {"max-readers", required_argument, 0, 'r'},
                                         {"chunk-kb", required_argument, 0, 'c'},
                                         {"link-mbps", required_argument, 0, 'l'},
                                         {"verify", no_argument, 0, 'v'},
                                         {"net", required_argument, 0, 'N'},
                                         {"fraction", required_argument, 0, 'f'},
                                         {"versions", required_argument, 0, 'V'},
                                         {"threads", required_argument, 0, 'T'},
                                         {"queue-ms", required_argument, 0, 'Q'},
                                         {"tcp-cc", required_argument, 0, 'C'},
                                         {"joiner-start", required_argument, 0, 'J'},
                                         {"joiner-prepare", required_argument, 0, 'P'},
                                         {"transport-options", required_argument, 0, 'X'},
                                         {"no-digest", no_argument, 0, 'G'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': break;
        case 'm': o->model = optarg; break;
        case 'o': o->out = optarg; break;
        case 'n': o->receivers = (uint32_t)atoi(optarg); break;
        case 'S': o->src = optarg; break;
        case 'D': o->dst = optarg, o->dst_set = true; break;
        case 'r': o->max_readers = (uint32_t)atoi(optarg), o->max_readers_set = true; break;
        case 'c': o->chunk_kb = (uint32_t)atoi(optarg); break;
        case 'l': o->link_mbps = atof(optarg), o->link_set = true; break;
        case 'v': o->verify = true; break;
        case 'N': o->net = optarg; break;
        case 'f': o->delta = atof(optarg); break;
        case 'V': o->versions = (uint32_t)atoi(optarg); break;
        case 'T': o->threads = (unsigned)atoi(optarg); break;
        case 'Q': o->queue_ms = atof(optarg); break;
        case 'C':
            if (!*optarg || strlen(optarg) >= sizeof(o->ns.tcp_cc) ||
                strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(optarg))
                return tool_usage("bench", "--tcp-cc is a congestion control's name (cubic, bbr, reno) or host");
            o->tcp_cc = optarg;
            break;
        case 'G': o->no_digest = true; break;
        case 'X':
            if (strlen(optarg) > 250) return tool_usage("bench", "--transport-options: at most 250 characters");
            o->topts = optarg;
            break;
        case 'J':
            if (strcmp(optarg, "before") && strcmp(optarg, "during"))
                return tool_usage("bench", "--joiner-start is before or during");
            o->joiner_starts_during = !strcmp(optarg, "during");
            break;
        case 'P':
            if (strcmp(optarg, "yes") && strcmp(optarg, "no"))
                return tool_usage("bench", "--joiner-prepare is yes or no");
            o->joiner_unprepared = !strcmp(optarg, "no");
            break;
        default:
            return tool_usage(
                "bench",
                "fleet scenarios: --model M --receivers N --src L --dst L --max-readers N "
                "--chunk-kb N --link-mbps X --queue-ms MS --tcp-cc NAME|host --net shm|netns --threads N --verify --runs N --out FILE "
                "--transport-options OPTS (e.g. ucx.tcp_eager=0) --no-digest "
                "(delta: --fraction F --versions N; elastic: --joiner-start before|during --joiner-prepare yes|no)");
        }
    }
    if (o->net && strcmp(o->net, "shm") && strcmp(o->net, "netns")) return tool_usage("bench", "--net is shm or netns");
    o->transport = "shm";
    if (o->receivers < 1 || o->receivers > 16) return tool_usage("bench", "--receivers is 1..16");
    return 0;
}

static int g_jobseq;

/* A fresh registry directory and job for one phase. */
void nb_fresh_registry(nb_opts_t *o)
{
    snprintf(o->dir, sizeof(o->dir), "/tmp/refit-bench-XXXXXX");
    if (!mkdtemp(o->dir)) snprintf(o->dir, sizeof(o->dir), "/tmp/refit-bench-%d", (int)getpid());
    snprintf(o->url, sizeof(o->url), "file:%s", o->dir);
    snprintf(o->job, sizeof(o->job), "bench%d-%d", (int)getpid(), ++g_jobseq);
}

void nb_rm_registry(const nb_opts_t *o)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", o->dir);
    if (system(cmd) != 0) {
    }
}

uint32_t nb_world_of(const char *spec)
{
    refit_layout_t *l = NULL;
    if (refit_layout_parse(spec, &l)) return 0;
    uint32_t w = refit_layout_world(l);
    refit_layout_destroy(l);
    return w;
}

/* ---- network namespaces (--net netns) ------------------------------------ */

/* Whether namespaces can be made here (and UCX is built in); why not in `why`. */
bool nb_netns_possible(char *why, size_t n)
{
    if (!tool_netns_possible(why, n)) return false;
    if (!(refit_features() & REFIT_FEATURE_UCX)) return snprintf(why, n, "refit was built without UCX"), false;
    return true;
}

bool nb_netns_up(nb_opts_t *o, uint32_t nodes, double mbps, char *why, size_t n)
{
    o->ns.queue_ms = o->queue_ms;
    const char *cc = o->tcp_cc ? o->tcp_cc : "cubic";
    snprintf(o->ns.tcp_cc, sizeof(o->ns.tcp_cc), "%s", strcmp(cc, "host") ? cc : "");
    if (!tool_netns_up(&o->ns, nodes, mbps, why, n)) return false;
    o->netns = true;
    return true;
}

void nb_netns_down(nb_opts_t *o) { tool_netns_down(&o->ns); }

bool nb_node_rate(const nb_opts_t *o, uint32_t node, double mbps) { return tool_netns_rate(&o->ns, node, mbps); }

/* A child's transport options: on a node, UCX listens on that node's veth
 * (listeners bind one named interface, never every one); then
 * --transport-options, if given. */
static char g_child_topts[320];

const char *child_topts(void) { return g_child_topts[0] ? g_child_topts : NULL; }

/* Moves this (child) process into node `node`'s namespace. */
static void enter_node(const nb_opts_t *o, int node)
{
    const char *extra = o->topts ? o->topts : "";
    snprintf(g_child_topts, sizeof(g_child_topts), "%s", extra);
    if (node < 0 || !o->ns.nodes) return;
    char ifname[32];
    tool_netns_ifname(&o->ns, (uint32_t)node, ifname, sizeof(ifname));
    snprintf(g_child_topts, sizeof(g_child_topts), "ucx.listen=%s%s%s", ifname, extra[0] ? "," : "", extra);
    if (tool_netns_enter(&o->ns, (uint32_t)node)) _exit(5);
}

/* --net netns for a scenario: namespaces can be made here, links default to
 * 100 MB/s, bytes go over UCX, and `nodes` nodes are up.  False after saying
 * why on stderr. */
bool nb_net_up(nb_opts_t *o, const char *scenario, uint32_t nodes)
{
    char why[160] = "";
    if (!nb_netns_possible(why, sizeof(why))) {
        fprintf(stderr, "refit bench %s --net netns: %s\n", scenario, why);
        return false;
    }
    if (!o->link_set) o->link_mbps = 100;
    o->transport = "ucx";
    if (!nb_netns_up(o, nodes, o->link_mbps, why, sizeof(why))) {
        fprintf(stderr, "refit bench %s: %s\n", scenario, why);
        return false;
    }
    return true;
}

typedef struct {
    const nb_opts_t *o;
    const role_t *r;
} child_body_t;

static int child_main(void *vb, int in_fd, int out)
{
    const child_body_t *b = vb;
    enter_node(b->o, b->r->node);
    FILE *in = fdopen(in_fd, "r");
    if (b->r->publisher) child_publisher(b->o, b->r, in, out);
    else if (b->r->fp8 == 1) child_fp8_relay(b->o, b->r, in, out);
    else child_receiver(b->o, b->r, in, out);
    return 0;
}

child_t nb_spawn(const nb_opts_t *o, const role_t *r)
{
    child_t c;
    if (tool_proc_fork(&c, child_main, &(child_body_t){o, r}, true)) return (child_t){-1, -1, -1};
    if (!r->publisher) { /* set up (manifest, memory) before anything is timed */
        char buf[16];
        tool_proc_line(&c, 60000, buf, sizeof(buf));
    }
    return c;
}

void nb_send_cmd(child_t *c, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    buf[n++] = '\n';
    if (c->pid > 0 && write(c->to_child, buf, (size_t)n) != n) {
    }
}

/* One reply line (bounded: timeout_ms); "" on timeout or a dead child. */
const char *nb_reply(child_t *c, int timeout_ms, char *buf, size_t n) { return tool_proc_line(c, timeout_ms, buf, n); }

/* Asks it to quit ("q"), or kills it; reaped within 10 s either way. */
void nb_stop(child_t *c, bool kill_it) { tool_proc_stop(c, "q\n", 2, kill_it, 10); }


bool nb_get_result(child_t *c, result_t *r)
{
    char buf[1400];
    memset(r, 0, sizeof(*r));
    nb_reply(c, 660000, buf, sizeof(buf)); /* a receiver's pull deadline is 600 s */
    r->st = -999;
    int n = sscanf(buf,
                   "%d %" SCNu64 " %lf %lf %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %zu %" SCNu64 " %" SCNu64 " %" SCNu64
                   " %" SCNu64 " %lf %lf %d %" SCNu64 " %1023[^\n]",
                   &r->st, &r->version, &r->begin, &r->end, &r->transfer_ms, &r->trainer_bytes, &r->relay_bytes,
                   &r->bytes, &r->holders, &r->early, &r->ahead, &r->late, &r->delta_base, &r->verify_ms, &r->digest_ms,
                   &r->digest_fused, &r->unverified, r->list);
    if (n < 17) {
        snprintf(r->list, sizeof(r->list), "%.1000s", buf[0] ? buf : "no answer");
        if (r->st == 0) r->st = -999;
    }
    if (r->st != 0) fprintf(stderr, "refit bench: a pull failed (%d): %s\n", r->st, r->list);
    return r->st == 0;
}

bool nb_start_publishers(const nb_opts_t *o, child_t *pubs, uint32_t n, const char *throttle, uint64_t version)
{
    (void)throttle;
    for (uint32_t k = 0; k < n; k++) pubs[k] = nb_spawn(o, &(role_t){true, k, -1, NULL, (int)k, false, 0, false});
    for (uint32_t k = 0; k < n; k++) nb_send_cmd(&pubs[k], "publish %" PRIu64, version);
    bool ok = true;
    char buf[700];
    for (uint32_t k = 0; k < n; k++) {
        nb_reply(&pubs[k], 120000, buf, sizeof(buf));
        if (strncmp(buf, "0 ", 2)) {
            fprintf(stderr, "refit bench: publisher %u: %s", k, buf[0] ? buf : "no answer\n");
            ok = false;
        }
    }
    return ok;
}

bool nb_publish_all(child_t *pubs, uint32_t n, uint64_t v)
{
    char buf[700];
    bool ok = true;
    for (uint32_t k = 0; k < n; k++) nb_send_cmd(&pubs[k], "publish %" PRIu64, v);
    for (uint32_t k = 0; k < n; k++) ok &= !strncmp(nb_reply(&pubs[k], 120000, buf, sizeof(buf)), "0 ", 2);
    return ok;
}

/* ---- JSON and repeated runs ---------------------------------------------- */

/* A scenario writes one run: its config, metrics and assertions.  Timing
 * assertions (check) are judged on the median of the runs' observations;
 * correctness assertions (require) must hold in every run.  With --runs N
 * (default 5 for the timing scenarios) the driver, nb_repeat(), runs the
 * scenario N times, keeps every run's figures and judges the assertions:
 *   {"scenario", "config":{.., "runs":N}, "metrics":{the median run's},
 *    "median":{metric: median}, "spread":{metric: {"min","max","runs":[..]}},
 *    "median_run":i, "assertions":[{"name","expected","on","observed",
 *    "observed_runs":[..],"passed"}], "runs":[{"metrics","assertions"}..],
 *    "notes"} */


typedef struct {
    char *cfg, *metrics, *notes;
    int nasserts;
    assert_rec_t as[MAX_ASSERTS];
} run_rec_t;

static struct {
    bool capture; /* out_end keeps the run instead of printing it */
    run_rec_t run[MAX_RUNS];
    int n;
    const char *out; /* --out */
} g_runs;

void nb_out_begin(out_t *j, const char *scenario, const nb_opts_t *o, const char *extra_config)
{
    memset(j, 0, sizeof(*j));
    size_t clen;
    FILE *c = open_memstream(&j->cfg, &clen);
    j->f = open_memstream(&j->buf, &j->len);
    j->o = o;
    j->scenario = scenario;
    fprintf(c, "{\"model\":");
    tool_json_string(c, o->model);
    fprintf(c, ",\"src\":");
    tool_json_string(c, o->src);
    fprintf(c, ",\"dst\":");
    tool_json_string(c, o->dst);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(c,
            ",\"receivers\":%u,\"max_readers\":%u,\"chunk_kb\":%u,\"link_mbps\":%g,\"verify\":%s,\"cpus\":%ld,"
            "\"transport\":\"%s\",\"net\":\"%s\",\"queue_ms\":%g,\"registry\":\"file\",\"digests\":%s%s%s",
            o->receivers, o->max_readers, o->chunk_kb ? o->chunk_kb : 2048, o->link_mbps, o->verify ? "true" : "false",
            cpus, o->transport, o->netns ? "netns+tbf" : "shm", o->netns ? (o->queue_ms > 0 ? o->queue_ms : 50) : 0,
            o->no_digest ? "false" : "true", extra_config ? "," : "", extra_config ? extra_config : "");
    if (o->netns) {
        fprintf(c, ",\"tcp_cc\":");
        tool_json_string(c, o->ns.tcp_cc[0] ? o->ns.tcp_cc : "unknown");
        fprintf(c, ",\"tcp_cc_asked\":");
        tool_json_string(c, o->tcp_cc ? o->tcp_cc : "cubic");
    }
    if (o->topts) {
        fprintf(c, ",\"transport_options\":");
        tool_json_string(c, o->topts);
    }
    fclose(c);
}

void nb_metric(out_t *j, const char *name, const char *fmt, ...)
{
    fprintf(j->f, "%s\"%s\":", j->nmetrics++ ? "," : "", name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(j->f, fmt, ap);
    va_end(ap);
}

static bool compare(double x, const char *op, double limit)
{
    if (!strcmp(op, "<=")) return x <= limit;
    if (!strcmp(op, ">=")) return x >= limit;
    if (!strcmp(op, "<")) return x < limit;
    return x == limit;
}

static void add_assert(out_t *j, const char *name, const char *expected, double observed, const char *op, double limit,
                       bool passed)
{
    if (j->nasserts >= MAX_ASSERTS) return;
    assert_rec_t *a = &j->as[j->nasserts++];
    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->expected, sizeof a->expected, "%s", expected);
    snprintf(a->op, sizeof a->op, "%s", op);
    a->observed = observed;
    a->limit = limit;
    a->passed = passed;
}

/* A timing goal: judged on the median over the runs. */
void nb_check(out_t *j, const char *name, const char *expected, double observed, const char *op, double limit)
{
    add_assert(j, name, expected, observed, op, limit, compare(observed, op, limit));
}

/* A correctness goal: must hold in every run. */
void nb_require(out_t *j, const char *name, const char *expected, double observed, bool passed)
{
    add_assert(j, name, expected, observed, "", 0, passed);
}

int nb_out_end(out_t *j, const char *notes)
{
    fclose(j->f);
    if (g_runs.n < MAX_RUNS) {
        run_rec_t *r = &g_runs.run[g_runs.n++];
        r->cfg = j->cfg;
        r->metrics = j->buf;
        r->notes = strdup(notes ? notes : "");
        r->nasserts = j->nasserts;
        memcpy(r->as, j->as, sizeof(r->as));
    } else {
        free(j->cfg);
        free(j->buf);
    }
    return 0;
}

static void runs_free(void)
{
    for (int i = 0; i < g_runs.n; i++) {
        free(g_runs.run[i].cfg);
        free(g_runs.run[i].metrics);
        free(g_runs.run[i].notes);
    }
    g_runs.n = 0;
}

static void json_num(FILE *f, double v)
{
    if (v == (double)(int64_t)v && fabs(v) < 9e15) fprintf(f, "%" PRId64, (int64_t)v);
    else fprintf(f, "%.6g", v);
}

static void json_list(FILE *f, const double *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        json_num(f, v[i]);
    }
    fputc(']', f);
}

static double median_n(const double *v, int n)
{
    double t[MAX_RUNS];
    memcpy(t, v, (size_t)n * sizeof(double));
    for (int i = 1; i < n; i++) /* insertion sort: n <= 15 */
        for (int k = i; k > 0 && t[k - 1] > t[k]; k--) {
            double x = t[k];
            t[k] = t[k - 1];
            t[k - 1] = x;
        }
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Writes the runs kept in g_runs as one JSON object to f. */
static void runs_json(FILE *f, const char *scenario)
{
    int n = g_runs.n;
    run_rec_t *r0 = &g_runs.run[0];
    /* The median run: by the first timing check's observation. */
    int mid = 0, first = -1;
    for (int a = 0; a < r0->nasserts && first < 0; a++)
        if (r0->as[a].op[0]) first = a;
    if (first >= 0) {
        int order[MAX_RUNS];
        for (int i = 0; i < n; i++) order[i] = i;
        for (int i = 1; i < n; i++)
            for (int k = i;
                 k > 0 && g_runs.run[order[k - 1]].as[first].observed > g_runs.run[order[k]].as[first].observed; k--) {
                int x = order[k];
                order[k] = order[k - 1];
                order[k - 1] = x;
            }
        mid = order[(n - 1) / 2];
    }
    fprintf(f, "{\"scenario\":\"%s\",\"config\":%s,\"runs\":%d}", scenario, r0->cfg, n);
    /* r0->cfg ends with no brace: see out_begin */
    fprintf(f, ",\"metrics\":{%s}", g_runs.run[mid].metrics);
    /* Medians and spread of every numeric metric the runs share. */
    refit_json_t *js[MAX_RUNS] = {0};
    for (int i = 0; i < n; i++) {
        size_t len = strlen(g_runs.run[i].metrics) + 3;
        char *t = malloc(len);
        if (!t) continue;
        snprintf(t, len, "{%s}", g_runs.run[i].metrics);
        if (refit_json_parse(t, strlen(t), &js[i])) js[i] = NULL;
        free(t);
    }
    FILE *sp;
    char *spbuf = NULL;
    size_t splen = 0;
    sp = open_memstream(&spbuf, &splen);
    fprintf(f, ",\"median\":{");
    int nm = 0;
    for (size_t k = 0; js[0] && k < refit_json_len(js[0]); k++) {
        const char *key = refit_json_key(js[0], k, NULL);
        double v[MAX_RUNS];
        bool all = true;
        for (int i = 0; i < n && all; i++)
            all = js[i] && refit_json_double(refit_json_get(js[i], key), &v[i]); /* false unless a number */
        if (!all) continue;
        double lo = v[0], hi = v[0];
        for (int i = 1; i < n; i++) lo = v[i] < lo ? v[i] : lo, hi = v[i] > hi ? v[i] : hi;
        fprintf(f, "%s\"%s\":", nm ? "," : "", key);
        json_num(f, median_n(v, n));
        fprintf(sp, "%s\"%s\":{\"min\":", nm ? "," : "", key);
        json_num(sp, lo);
        fprintf(sp, ",\"max\":");
        json_num(sp, hi);
        fprintf(sp, ",\"runs\":");
        json_list(sp, v, n);
        fputc('}', sp);
        nm++;
    }
    fclose(sp);
    fprintf(f, "},\"spread\":{%s},\"median_run\":%d,\"assertions\":[", spbuf ? spbuf : "", mid);
    free(spbuf);
    for (int i = 0; i < n; i++) refit_json_free(js[i]);
    for (int a = 0; a < r0->nasserts; a++) {
        const assert_rec_t *A = &r0->as[a];
        double obs[MAX_RUNS];
        bool every = true;
        for (int i = 0; i < n; i++) {
            const assert_rec_t *x = a < g_runs.run[i].nasserts ? &g_runs.run[i].as[a] : NULL;
            obs[i] = x ? x->observed : NAN;
            every &= x && x->passed;
        }
        bool timing = A->op[0] != 0;
        double med = median_n(obs, n);
        bool passed = timing ? compare(med, A->op, A->limit) : every;
        fprintf(f, "%s{\"name\":", a ? "," : "");
        tool_json_string(f, A->name);
        fprintf(f, ",\"expected\":");
        tool_json_string(f, A->expected);
        fprintf(f, ",\"on\":\"%s\",\"observed\":", timing ? "median" : "every run");
        json_num(f, timing ? med : obs[mid]);
        fprintf(f, ",\"observed_runs\":");
        json_list(f, obs, n);
        fprintf(f, ",\"passed\":%s}", passed ? "true" : "false");
    }
    fprintf(f, "],\"runs_detail\":[");
    for (int i = 0; i < n; i++) {
        run_rec_t *r = &g_runs.run[i];
        fprintf(f, "%s{\"metrics\":{%s},\"assertions\":[", i ? "," : "", r->metrics);
        for (int a = 0; a < r->nasserts; a++) {
            fprintf(f, "%s{\"name\":", a ? "," : "");
            tool_json_string(f, r->as[a].name);
            fprintf(f, ",\"observed\":");
            json_num(f, r->as[a].observed);
            fprintf(f, ",\"passed\":%s}", r->as[a].passed ? "true" : "false");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"notes\":");
    tool_json_string(f, g_runs.run[mid].notes);
    fprintf(f, "}\n");
}

/* Runs a scenario --runs times (default `dflt`), then prints the judged
 * result on stdout and in --out.  Each run's own --out is suppressed. */
int nb_repeat(const char *scenario, int (*once)(int, char **), int argc, char **argv, int dflt)
{
    int runs = dflt;
    const char *out = NULL;
    char **av = calloc((size_t)argc + 1, sizeof(char *));
    if (!av) return tool_fail(REFIT_ERR_NO_MEMORY, "bench");
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strncmp(a, "--runs=", 7)) runs = atoi(a + 7);
        else if (!strcmp(a, "--out") && i + 1 < argc) out = argv[++i];
        else if (!strncmp(a, "--out=", 6)) out = a + 6;
        else av[ac++] = argv[i];
    }
    if (runs < 1 || runs > MAX_RUNS) {
        free(av);
        return tool_usage("bench", "--runs is 1..15");
    }
    int rc = 0;
    runs_free();
    for (int r = 0; r < runs && !rc; r++) {
        if (runs > 1) fprintf(stderr, "refit bench %s: run %d of %d\n", scenario, r + 1, runs);
        rc = once(ac, av);
    }
    free(av);
    if (!rc && g_runs.n == runs) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        runs_json(f, scenario);
        fclose(f);
        refit_status_t wst = tool_report_write(buf, out);
        if (wst) rc = tool_fail(wst, "bench: writing --out");
        free(buf);
    }
    runs_free();
    return rc;
}

void nb_result_json(out_t *j, const char *name, const result_t *r, size_t n)
{
    /* begin_ms / end_ms: the pull's span, from the earliest begin of these n. */
    double b0 = 1e300;
    for (size_t i = 0; i < n; i++)
        if (r[i].st == 0 && r[i].begin < b0) b0 = r[i].begin;
    fprintf(j->f, "%s\"%s\":[", j->nmetrics++ ? "," : "", name);
    for (size_t i = 0; i < n; i++) {
        bool ok = r[i].st == 0;
        fprintf(j->f,
                "%s{\"ok\":%s,\"version\":%" PRIu64 ",\"begin_ms\":%.1f,\"end_ms\":%.1f,\"transfer_ms\":%.2f,"
                "\"digest_ms\":%.2f,\"digest_fused\":%s,\"unverified_bytes\":%" PRIu64 ","
                "\"trainer_bytes\":%" PRIu64 ",\"relay_bytes\":%" PRIu64 ",\"early_chunks\":%" PRIu64
                ",\"ahead_chunks\":%" PRIu64 ",\"late_chunks\":%" PRIu64 ",\"holders\":",
                i ? "," : "", ok ? "true" : "false", r[i].version, ok ? (r[i].begin - b0) * 1e3 : 0,
                ok ? (r[i].end - b0) * 1e3 : 0, r[i].transfer_ms, r[i].digest_ms, r[i].digest_fused ? "true" : "false",
                r[i].unverified, r[i].trainer_bytes, r[i].relay_bytes, r[i].early, r[i].ahead, r[i].late);
        tool_json_string(j->f, r[i].list);
        fprintf(j->f, "}");
    }
    fprintf(j->f, "]");
}

double nb_span(const result_t *r, size_t n)
{
    double b = 1e300, e = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].begin < b) b = r[i].begin;
        if (r[i].end > e) e = r[i].end;
    }
    return n ? e - b : 0;
}

double nb_span_checked(const result_t *r, size_t n)
{
    double b = 1e300, e = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].begin < b) b = r[i].begin;
        if (r[i].end + r[i].digest_ms * 1e-3 > e) e = r[i].end + r[i].digest_ms * 1e-3;
    }
    return n ? e - b : 0;
}

char *nb_throttle_all(const char *kind, uint32_t n, double mbps, uint32_t slow, double slow_mbps)
{
    static char buf[1024];
    size_t pos = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && pos < sizeof(buf) - 40; i++) {
        double r = i == slow ? slow_mbps : mbps;
        if (r > 0) pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%s:%u=%g", pos ? "," : "", kind, i, r);
    }
    if (buf[0] && !nb_paced_links) {
        fprintf(stderr, "refit bench: links emulated by pacing (REFIT_TEST_THROTTLE) need the test flavour of the "
                        "library: this refit-bench links the shipped librefit, which has no test hooks; use --net "
                        "netns, or the refit-bench of a build tree (linked against librefit-test)\n");
        exit(2);
    }
    return buf[0] ? buf : NULL;
}
