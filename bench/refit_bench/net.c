/* refit bench scenarios for the fleet: fanout, elastic, straggler,
 * egress.  Each runs on one host: publishers and receivers are child
 * processes of this binary (shm transport, file registry), driven over pipes;
 * every child reports refit_now() (CLOCK_MONOTONIC) times, so spans are
 * measured across processes.
 *
 * Links, two ways:
 *   --net shm    every process on this host's shared memory; slow links are
 *                emulated with REFIT_TEST_THROTTLE (a per-reader pacing of one
 *                holder's chunks; see src/engine/fleet.c).
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
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tool_proc.h"

/* ---- options ------------------------------------------------------------- */

typedef struct {
    const char *model, *out, *src, *dst;
    uint32_t receivers, max_readers, chunk_kb;
    double link_mbps; /* emulated per-link rate (0: none) */
    bool verify;
    char dir[64], url[96], job[48];
    const char *net;       /* "shm" or "netns" (NULL: the scenario's default) */
    bool max_readers_set, dst_set, link_set;
    const char *transport; /* "shm" or "ucx" (netns) */
    char tag[16];          /* netns: names of this run's namespaces and links */
    uint32_t nodes;        /* netns: namespaces set up */
    bool netns;            /* the run used them */
    double delta;          /* delta scenario: share of elements changed per version (publishers offer deltas) */
    uint32_t versions;     /* delta scenario */
    const char *pub_transports; /* publishers' transports when not `transport` (fp8: "shm,ucx") */
    unsigned threads;      /* receivers' copy (and delta apply) threads; 0: 1 */
} nb_opts_t;

static int parse(int argc, char **argv, nb_opts_t *o, const char *src, const char *dst, uint32_t receivers,
                 double link)
{
    memset(o, 0, sizeof(*o));
    o->model = "qwen3-30b-a3b-mini";
    o->src = src;
    o->dst = dst;
    o->receivers = receivers;
    o->max_readers = 2;
    o->link_mbps = link;
    static const struct option opts[] = {{"scenario", required_argument, 0, 's'}, {"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},      {"receivers", required_argument, 0, 'n'},
                                         {"src", required_argument, 0, 'S'},      {"dst", required_argument, 0, 'D'},
                                         {"max-readers", required_argument, 0, 'r'}, {"chunk-kb", required_argument, 0, 'c'},
                                         {"link-mbps", required_argument, 0, 'l'}, {"verify", no_argument, 0, 'v'},
                                         {"net", required_argument, 0, 'N'},      {"fraction", required_argument, 0, 'f'},
                                         {"versions", required_argument, 0, 'V'}, {"threads", required_argument, 0, 'T'},
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
        default: return tool_usage("bench", "fleet scenarios: --model M --receivers N --src L --dst L --max-readers N "
                                            "--chunk-kb N --link-mbps X --net shm|netns --threads N --verify --runs N --out FILE "
                                            "(delta: --fraction F --versions N)");
        }
    }
    if (o->net && strcmp(o->net, "shm") && strcmp(o->net, "netns")) return tool_usage("bench", "--net is shm or netns");
    o->transport = "shm";
    if (o->receivers < 1 || o->receivers > 16) return tool_usage("bench", "--receivers is 1..16");
    return 0;
}

static int g_jobseq;

/* A fresh registry directory and job for one phase. */
static void fresh_registry(nb_opts_t *o)
{
    snprintf(o->dir, sizeof(o->dir), "/tmp/refit-bench-XXXXXX");
    if (!mkdtemp(o->dir)) snprintf(o->dir, sizeof(o->dir), "/tmp/refit-bench-%d", (int)getpid());
    snprintf(o->url, sizeof(o->url), "file:%s", o->dir);
    snprintf(o->job, sizeof(o->job), "bench%d-%d", (int)getpid(), ++g_jobseq);
}

static void rm_registry(const nb_opts_t *o)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", o->dir);
    if (system(cmd) != 0) {
    }
}

static refit_status_t rank_manifest(const char *model_name, const char *spec, uint32_t rank, refit_manifest_t **out)
{
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *layout = NULL;
    if ((st = refit_model_open(model_name, &model))) return st;
    if (!(st = refit_layout_parse(spec, &layout))) st = refit_layout_manifest(layout, model, rank, out);
    refit_layout_destroy(layout);
    refit_model_destroy(model);
    return st;
}

static uint32_t world_of(const char *spec)
{
    refit_layout_t *l = NULL;
    if (refit_layout_parse(spec, &l)) return 0;
    uint32_t w = refit_layout_world(l);
    refit_layout_destroy(l);
    return w;
}

/* ---- child processes, driven over pipes --------------------------------- */

/* A child (tools/common/tool_proc.h): commands are lines on to_child, its
 * replies lines on from_child. */
typedef tool_proc_t child_t;

typedef struct {
    bool publisher;
    uint32_t rank;
    int slot;              /* receivers: relay slot (-1 none) */
    const char *throttle;  /* REFIT_TEST_THROTTLE for this child */
    int node;              /* netns: the node (namespace) it runs in; -1: this host's */
    bool no_delta;         /* receivers: always pull in full */
    int fp8;               /* 1: an FP8 relay of bf16 rank `rank`; 2: a receiver of that rank's FP8 arena */
} role_t;

/* ---- network namespaces (--net netns) ------------------------------------ */

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

/* Whether namespaces can be made here; why not in `why`. */
static bool netns_possible(char *why, size_t n)
{
    if (geteuid() != 0) return snprintf(why, n, "not root"), false;
    if (!sh("{ command -v ip && command -v tc; }")) return snprintf(why, n, "ip or tc (iproute2) is not installed"), false;
    if (!(refit_features() & REFIT_FEATURE_UCX)) return snprintf(why, n, "refit was built without UCX"), false;
    return true;
}

static nb_opts_t *g_net; /* whose namespaces are up */

static void netns_down(nb_opts_t *o)
{
    for (uint32_t i = 0; i < o->nodes; i++) {
        sh("ip netns del rf%sn%u", o->tag, i);
        sh("ip link del rf%sp%u", o->tag, i);
    }
    if (o->nodes) sh("ip link del rf%sbr", o->tag);
    o->nodes = 0;
    g_net = NULL;
}

/* Namespaces outlive a killed benchmark: SIGINT and SIGTERM take them down. */
static void netns_on_signal(int sig)
{
    if (g_net) netns_down(g_net);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* `nodes` namespaces rf<tag>n<i> (10.77.<i/250>.<i%250+1>/16), each on a
 * veth port of bridge rf<tag>br, egress and ingress limited to mbps MB/s by tbf. */
static bool netns_up(nb_opts_t *o, uint32_t nodes, double mbps, char *why, size_t n)
{
    snprintf(o->tag, sizeof(o->tag), "%x", (unsigned)getpid() & 0xfffff);
    if (!sh("ip link add rf%sbr type bridge", o->tag) || !sh("ip link set rf%sbr up", o->tag))
        return snprintf(why, n, "could not make a bridge"), false;
    o->nodes = nodes;
    o->netns = true;
    g_net = o;
    signal(SIGINT, netns_on_signal);
    signal(SIGTERM, netns_on_signal);
    /* burst: a 64 KiB GSO segment must fit, and a few ms of the rate. */
    uint64_t bps = (uint64_t)(mbps * 1e6), burst = bps / 200 > (256u << 10) ? bps / 200 : (256u << 10);
    for (uint32_t i = 0; i < nodes; i++) {
        const char *t = o->tag;
        bool ok = sh("ip netns add rf%sn%u", t, i) && sh("ip link add rf%sv%u type veth peer name rf%sp%u", t, i, t, i) &&
                  sh("ip link set rf%sv%u netns rf%sn%u", t, i, t, i) &&
                  sh("ip -n rf%sn%u addr add 10.77.%u.%u/16 dev rf%sv%u", t, i, i / 250, i % 250 + 1, t, i) &&
                  sh("ip -n rf%sn%u link set rf%sv%u up", t, i, t, i) && sh("ip -n rf%sn%u link set lo up", t, i) &&
                  sh("ip link set rf%sp%u master rf%sbr", t, i, t) && sh("ip link set rf%sp%u up", t, i);
        if (ok && mbps > 0)
            ok = sh("ip netns exec rf%sn%u tc qdisc add dev rf%sv%u root tbf rate %" PRIu64 "bit burst %" PRIu64
                    " latency 50ms", t, i, t, i, bps * 8, burst) &&
                 sh("tc qdisc add dev rf%sp%u root tbf rate %" PRIu64 "bit burst %" PRIu64 " latency 50ms", t, i, bps * 8,
                    burst);
        if (!ok) {
            snprintf(why, n, "setting up namespace %u failed", i);
            netns_down(o);
            return false;
        }
    }
    return true;
}

/* Sets node `node`'s link (both directions) to mbps MB/s. */
static bool node_rate(const nb_opts_t *o, uint32_t node, double mbps)
{
    uint64_t bps = (uint64_t)(mbps * 1e6), burst = bps / 200 > (256u << 10) ? bps / 200 : (256u << 10);
    const char *t = o->tag;
    return sh("ip netns exec rf%sn%u tc qdisc replace dev rf%sv%u root tbf rate %" PRIu64 "bit burst %" PRIu64
              " latency 50ms", t, node, t, node, bps * 8, burst) &&
           sh("tc qdisc replace dev rf%sp%u root tbf rate %" PRIu64 "bit burst %" PRIu64 " latency 50ms", t, node,
              bps * 8, burst);
}

/* A child's transport options: on a node, UCX listens on that node's veth
 * (listeners bind one named interface, never every one). */
static char g_child_topts[64];

static const char *child_topts(void) { return g_child_topts[0] ? g_child_topts : NULL; }

/* Moves this (child) process into node `node`'s namespace. */
static void enter_node(const nb_opts_t *o, int node)
{
    if (node < 0 || !o->nodes) return;
    snprintf(g_child_topts, sizeof(g_child_topts), "ucx.listen=rf%sv%d", o->tag, node);
    char path[96];
    snprintf(path, sizeof(path), "/run/netns/rf%sn%d", o->tag, node);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(5);
    close(fd);
    /* As `ip netns exec` does: a /sys of this namespace, where UCX lists the
     * network devices (the host's /sys would show it the host's). */
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 || mount("sysfs", "/sys", "sysfs", 0, NULL) != 0)
        _exit(5);
}

/* --net netns for a scenario: namespaces can be made here, links default to
 * 100 MB/s, bytes go over UCX, and `nodes` nodes are up.  False after saying
 * why on stderr. */
static bool net_up(nb_opts_t *o, const char *scenario, uint32_t nodes)
{
    char why[160] = "";
    if (!netns_possible(why, sizeof(why))) {
        fprintf(stderr, "refit bench %s --net netns: %s\n", scenario, why);
        return false;
    }
    if (!o->link_set) o->link_mbps = 100;
    o->transport = "ucx";
    if (!netns_up(o, nodes, o->link_mbps, why, sizeof(why))) {
        fprintf(stderr, "refit bench %s: %s\n", scenario, why);
        return false;
    }
    return true;
}

static void child_publisher(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    refit_manifest_t *m;
    if (rank_manifest(o->model, o->src, r->rank, &m)) _exit(3);
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = o->url;
    pp.job = o->job;
    pp.transports = o->pub_transports ? o->pub_transports : o->transport;
    pp.transport_options = child_topts();
    pp.mode = REFIT_MODE_SNAPSHOT;
    pp.delta = o->delta > 0;
    refit_publisher_t *p;
    void *base[64];
    if (refit_publisher_create(&pp, m, &p)) _exit(3);
    for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
        if (refit_publisher_alloc(p, i, &base[i])) _exit(3);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        refit_status_t st = REFIT_OK;
        double publish_ms = 0;
        if (sscanf(line, "publish %llu", &v) == 1) {
            /* The truth costs seconds per GB to compute: only when receivers
             * verify, or when only a share of it changes (delta). */
            if (o->delta > 0) st = refit_truth_fill_delta(m, base, v, o->delta);
            else if (o->verify) st = refit_truth_fill(m, base, v);
            else
                for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
                    memset(base[i], (int)(v & 0xff), refit_manifest_region_size(m, i));
            double t0 = refit_now();
            if (!st) st = refit_publisher_publish(p, v);
            publish_ms = (refit_now() - t0) * 1e3;
        } else if (line[0] == 'q') {
            break;
        }
        char buf[600];
        refit_publish_delta_t d = REFIT_PUBLISH_DELTA_INIT;
        int n = snprintf(buf, sizeof(buf), "%d %s\n", (int)st, st ? refit_last_error() : "");
        if (!st && o->delta > 0 && !refit_publisher_last_delta(p, &d))
            n = snprintf(buf, sizeof(buf), "0 %" PRIu64 " %" PRIu64 " %.3f %.3f\n", d.base_version, d.bytes,
                         d.encode_ms, publish_ms);
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    refit_publisher_destroy(p);
    _exit(0);
}

/* REFIT_OK if the FP8 arena equals the quantization of version v's truth. */
static refit_status_t fp8_check(const refit_manifest_t *bf16, const refit_fp8_target_t *t, const void *arena, uint64_t v)
{
    uint64_t n = refit_fp8_target_bytes(t);
    void *img = calloc(1, refit_manifest_region_size(bf16, 0));
    unsigned char *want = calloc(1, n);
    refit_status_t st = img && want ? REFIT_OK : refit_error(REFIT_ERR_NO_MEMORY, "fp8 check");
    if (!st) st = refit_truth_fill(bf16, &img, v);
    if (!st) st = refit_fp8_stage(t, img, want, 1);
    if (!st && memcmp(arena, want, n)) {
        uint64_t i = 0;
        while (i < n && ((const unsigned char *)arena)[i] == want[i]) i++;
        st = refit_error(REFIT_ERR_VERIFY, "the FP8 arena differs from the reference at byte %" PRIu64, i);
    }
    free(img);
    free(want);
    return st;
}

/* FP8 relay child: "step V" answers "status version pull_ms stage_ms publish_ms bf16_bytes fp8_bytes". */
static void child_fp8_relay(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    refit_manifest_t *m;
    if (rank_manifest(o->model, o->dst, r->rank, &m)) _exit(3);
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = o->url;
    rp.job = o->job;
    rp.transports = "shm"; /* next to the trainer */
    rp.threads = 1;
    rp.verify = REFIT_VERIFY_NONE; /* the FP8 receiver checks the end result against the truth */
    char reader[48];
    snprintf(reader, sizeof(reader), "fp8relay%u", r->rank);
    rp.reader = reader;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = o->url;
    pp.job = o->job;
    pp.group = "fp8";
    pp.transports = o->transport;
    pp.transport_options = child_topts();
    refit_fp8_relay_t *x;
    if (refit_fp8_relay_create(&rp, &pp, m, &x)) {
        char buf[600];
        int n = snprintf(buf, sizeof(buf), "fail %s\n", refit_last_error());
        if (write(out, buf, (size_t)n) != n) _exit(4);
        _exit(3);
    }
    if (write(out, "ready\n", 6) != 6) _exit(4);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        if (line[0] == 'q') break;
        if (sscanf(line, "step %llu", &v) != 1) continue;
        refit_fp8_relay_report_t rep = REFIT_FP8_RELAY_REPORT_INIT;
        refit_status_t st = refit_fp8_relay_step(x, v, 120000, &rep);
        char buf[700];
        int n = st ? snprintf(buf, sizeof(buf), "%d %s\n", (int)st, refit_last_error())
                   : snprintf(buf, sizeof(buf), "0 %" PRIu64 " %.3f %.3f %.3f %" PRIu64 " %" PRIu64 "\n", rep.version,
                              rep.pull_ms, rep.stage_ms, rep.publish_ms, rep.bf16_bytes, rep.fp8_bytes);
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    refit_fp8_relay_destroy(x);
    _exit(0);
}

/* Receiver child: "pull V" (0: newest) answers one line:
 *   status version begin end transfer_ms trainer_bytes relay_bytes bytes holders early "name=bytes,..."
 * (early: chunks read from relays still receiving the version). */
static void child_receiver(const nb_opts_t *o, const role_t *r, FILE *in, int out)
{
    if (r->throttle) setenv("REFIT_TEST_THROTTLE", r->throttle, 1);
    refit_manifest_t *m, *bf16 = NULL;
    refit_fp8_target_t *target = NULL;
    if (rank_manifest(o->model, o->dst, r->rank, &m)) _exit(3);
    if (r->fp8 == 2) { /* the FP8 arena of that bf16 rank */
        bf16 = m;
        if (refit_fp8_target_create(bf16, &target) || refit_fp8_target_manifest(target, bf16, &m)) _exit(3);
    }
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = o->url;
    rp.job = o->job;
    rp.group = r->fp8 == 2 ? "fp8" : NULL;
    rp.transports = o->transport;
    rp.transport_options = child_topts();
    rp.threads = o->threads ? o->threads : 1;
    rp.verify = o->verify && !r->fp8 ? REFIT_VERIFY_TRUTH : REFIT_VERIFY_NONE;
    rp.relay_slot = r->slot;
    rp.max_readers = o->max_readers;
    rp.chunk_kb = o->chunk_kb;
    rp.relay_heartbeat_ms = 100;
    rp.no_delta = r->no_delta;
    rp.truth_fraction = o->delta;
    refit_receiver_t *rc;
    void *base;
    if (refit_receiver_create(&rp, m, &rc)) _exit(3);
    for (uint32_t i = 0; i < refit_manifest_num_regions(m); i++)
        if (refit_receiver_alloc(rc, i, &base)) _exit(3);
    if (write(out, "ready\n", 6) != 6) _exit(4);
    char line[128];
    while (fgets(line, sizeof(line), in)) {
        unsigned long long v;
        if (line[0] == 'q') break;
        if (sscanf(line, "pull %llu", &v) != 1) continue;
        refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
        refit_status_t st = refit_receiver_pull(rc, v ? v : REFIT_VERSION_NEWEST, 120000, &rep);
        if (!st && target && o->verify) { /* every byte against a quantization of the truth done here */
            double t0 = refit_now();
            st = fp8_check(bf16, target, base, rep.version);
            rep.verify_ms = (refit_now() - t0) * 1e3;
        }
        refit_holder_stat_t hs[32] = {REFIT_HOLDER_STAT_INIT};
        size_t nh = 0;
        if (refit_receiver_holders(rc, hs, 32, &nh)) nh = 0;
        uint64_t tb = 0, rb = 0, early = 0;
        char list[1024] = "";
        size_t pos = 0;
        for (size_t i = 0; i < nh && i < 32; i++) {
            if (!strncmp(hs[i].name, "trainer:", 8)) tb += hs[i].bytes;
            else rb += hs[i].bytes;
            early += hs[i].early;
            if (pos < sizeof(list) - 64)
                pos += (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s=%" PRIu64 "%s", pos ? "," : "", hs[i].name,
                                        hs[i].bytes, hs[i].failed ? "!" : "");
        }
        char buf[1400];
        int n = snprintf(buf, sizeof(buf),
                         "%d %" PRIu64 " %.6f %.6f %.3f %" PRIu64 " %" PRIu64 " %" PRIu64 " %zu %" PRIu64 " %" PRIu64
                         " %.3f %s\n",
                         (int)st, rep.version, rep.begin_s, rep.end_s, rep.transfer_ms, tb, rb, rep.bytes, nh, early,
                         rep.delta_base, rep.verify_ms, list[0] ? list : "-");
        if (st) n = snprintf(buf, sizeof(buf), "%d 0 0 0 0 0 0 0 0 0 0 0 %s\n", (int)st, refit_last_error());
        for (char *c = buf; *c && c < buf + n - 1; c++)
            if (*c == '\n') *c = ' ';
        if (write(out, buf, (size_t)n) != n) _exit(4);
    }
    refit_receiver_destroy(rc);
    refit_fp8_target_destroy(target);
    refit_manifest_destroy(bf16);
    _exit(0);
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

static child_t spawn(const nb_opts_t *o, const role_t *r)
{
    child_t c;
    if (tool_proc_fork(&c, child_main, &(child_body_t){o, r}, true)) return (child_t){-1, -1, -1};
    if (!r->publisher) { /* set up (manifest, memory) before anything is timed */
        char buf[16];
        tool_proc_line(&c, 60000, buf, sizeof(buf));
    }
    return c;
}

static void send_cmd(child_t *c, const char *fmt, ...)
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
static const char *reply(child_t *c, int timeout_ms, char *buf, size_t n) { return tool_proc_line(c, timeout_ms, buf, n); }

/* Asks it to quit ("q"), or kills it; reaped within 10 s either way. */
static void stop(child_t *c, bool kill_it) { tool_proc_stop(c, "q\n", 2, kill_it, 10); }

typedef struct {
    int st;
    uint64_t version, trainer_bytes, relay_bytes, bytes, early, delta_base;
    double begin, end, transfer_ms, verify_ms;
    size_t holders;
    char list[1024];
} result_t;

static bool get_result(child_t *c, result_t *r)
{
    char buf[1400];
    memset(r, 0, sizeof(*r));
    reply(c, 180000, buf, sizeof(buf));
    r->st = -999;
    int n = sscanf(buf,
                   "%d %" SCNu64 " %lf %lf %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %zu %" SCNu64 " %" SCNu64
                   " %lf %1023[^\n]",
                   &r->st, &r->version, &r->begin, &r->end, &r->transfer_ms, &r->trainer_bytes, &r->relay_bytes,
                   &r->bytes, &r->holders, &r->early, &r->delta_base, &r->verify_ms, r->list);
    if (n < 12) {
        snprintf(r->list, sizeof(r->list), "%.1000s", buf[0] ? buf : "no answer");
        if (r->st == 0) r->st = -999;
    }
    return r->st == 0;
}

static bool start_publishers(const nb_opts_t *o, child_t *pubs, uint32_t n, const char *throttle, uint64_t version)
{
    (void)throttle;
    for (uint32_t k = 0; k < n; k++) pubs[k] = spawn(o, &(role_t){true, k, -1, NULL, (int)k, false, 0});
    for (uint32_t k = 0; k < n; k++) send_cmd(&pubs[k], "publish %" PRIu64, version);
    bool ok = true;
    char buf[700];
    for (uint32_t k = 0; k < n; k++) {
        reply(&pubs[k], 120000, buf, sizeof(buf));
        if (strncmp(buf, "0 ", 2)) {
            fprintf(stderr, "refit bench: publisher %u: %s", k, buf[0] ? buf : "no answer\n");
            ok = false;
        }
    }
    return ok;
}

static bool publish_all(child_t *pubs, uint32_t n, uint64_t v)
{
    char buf[700];
    bool ok = true;
    for (uint32_t k = 0; k < n; k++) send_cmd(&pubs[k], "publish %" PRIu64, v);
    for (uint32_t k = 0; k < n; k++) ok &= !strncmp(reply(&pubs[k], 120000, buf, sizeof(buf)), "0 ", 2);
    return ok;
}

/* ---- JSON and repeated runs ---------------------------------------------- */

/* A scenario writes one run: its config, metrics and assertions.  Timing
 * assertions (check) are judged on the median of the runs' observations;
 * correctness assertions (require) must hold in every run.  With --runs N
 * (default 5 for the timing scenarios) the driver, repeat(), runs the
 * scenario N times, keeps every run's figures and judges the assertions:
 *   {"scenario", "config":{.., "runs":N}, "metrics":{the median run's},
 *    "median":{metric: median}, "spread":{metric: {"min","max","runs":[..]}},
 *    "median_run":i, "assertions":[{"name","expected","on","observed",
 *    "observed_runs":[..],"passed"}], "runs":[{"metrics","assertions"}..],
 *    "notes"} */

typedef struct {
    char name[64], expected[160];
    double observed, limit;
    char op[3];   /* "<=", ">=", "<", "==": a timing check on the median; "" a requirement of every run */
    bool passed;
} assert_rec_t;

#define MAX_ASSERTS 12
#define MAX_RUNS 15

typedef struct {
    FILE *f;    /* metrics, as written */
    char *buf;
    size_t len;
    char *cfg;  /* the config object */
    int nmetrics, nasserts;
    assert_rec_t as[MAX_ASSERTS];
    const nb_opts_t *o;
    const char *scenario;
} out_t;

typedef struct {
    char *cfg, *metrics, *notes;
    int nasserts;
    assert_rec_t as[MAX_ASSERTS];
} run_rec_t;

static struct {
    bool capture;           /* out_end keeps the run instead of printing it */
    run_rec_t run[MAX_RUNS];
    int n;
    const char *out;        /* --out */
} g_runs;

static void out_begin(out_t *j, const char *scenario, const nb_opts_t *o, const char *extra_config)
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
    fprintf(c, ",\"receivers\":%u,\"max_readers\":%u,\"chunk_kb\":%u,\"link_mbps\":%g,\"verify\":%s,\"cpus\":%ld,"
               "\"transport\":\"%s\",\"net\":\"%s\",\"registry\":\"file\"%s%s",
            o->receivers, o->max_readers, o->chunk_kb ? o->chunk_kb : 2048, o->link_mbps, o->verify ? "true" : "false",
            cpus, o->transport, o->netns ? "netns+tbf" : "shm", extra_config ? "," : "", extra_config ? extra_config : "");
    fclose(c);
}

static void metric(out_t *j, const char *name, const char *fmt, ...)
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
static void check(out_t *j, const char *name, const char *expected, double observed, const char *op, double limit)
{
    add_assert(j, name, expected, observed, op, limit, compare(observed, op, limit));
}

/* A correctness goal: must hold in every run. */
static void require(out_t *j, const char *name, const char *expected, double observed, bool passed)
{
    add_assert(j, name, expected, observed, "", 0, passed);
}

static int out_end(out_t *j, const char *notes)
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
            for (int k = i; k > 0 && g_runs.run[order[k - 1]].as[first].observed > g_runs.run[order[k]].as[first].observed; k--) {
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
            all = js[i] && refit_json_type(refit_json_get(js[i], key)) == REFIT_JSON_NUMBER &&
                  refit_json_double(refit_json_get(js[i], key), &v[i]);
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
static int repeat(const char *scenario, int (*once)(int, char **), int argc, char **argv, int dflt)
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

static void result_json(out_t *j, const char *name, const result_t *r, size_t n)
{
    fprintf(j->f, "%s\"%s\":[", j->nmetrics++ ? "," : "", name);
    for (size_t i = 0; i < n; i++) {
        fprintf(j->f, "%s{\"ok\":%s,\"version\":%" PRIu64 ",\"transfer_ms\":%.2f,\"trainer_bytes\":%" PRIu64
                      ",\"relay_bytes\":%" PRIu64 ",\"early_chunks\":%" PRIu64 ",\"holders\":",
                i ? "," : "", r[i].st == 0 ? "true" : "false", r[i].version, r[i].transfer_ms, r[i].trainer_bytes,
                r[i].relay_bytes, r[i].early);
        tool_json_string(j->f, r[i].list);
        fprintf(j->f, "}");
    }
    fprintf(j->f, "]");
}

static double span(const result_t *r, size_t n)
{
    double b = 1e300, e = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].begin < b) b = r[i].begin;
        if (r[i].end > e) e = r[i].end;
    }
    return n ? e - b : 0;
}

static char *throttle_all(const char *kind, uint32_t n, double mbps, uint32_t slow, double slow_mbps)
{
    static char buf[1024];
    size_t pos = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && pos < sizeof(buf) - 40; i++) {
        double r = i == slow ? slow_mbps : mbps;
        if (r > 0) pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%s:%u=%g", pos ? "," : "", kind, i, r);
    }
    return buf[0] ? buf : NULL;
}

/* ---- fanout ---------------------------------------------------------------- */

/* This host's CPU time (all CPUs, from /proc/stat, in ticks): busy and total. */
typedef struct {
    unsigned long long busy, total;
} cpu_ticks_t;

static cpu_ticks_t cpu_ticks(void)
{
    cpu_ticks_t t = {0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) == 8) {
        for (int i = 0; i < 8; i++) t.total += v[i];
        t.busy = t.total - v[3] - v[4]; /* all but idle and iowait */
    }
    if (f) fclose(f);
    return t;
}

/* Share of the host's CPU time that was busy between a and b (anything on
 * the host counts: the figure says whether the CPUs, not the links, could
 * have bounded a phase). */
static double cpu_busy(cpu_ticks_t a, cpu_ticks_t b)
{
    return b.total > a.total ? (double)(b.busy - a.busy) / (double)(b.total - a.total) : 0;
}

/* Runs n receivers (relay slots 0..n-1) pulling version 1 at once; results in
 * res; *busy: the host's CPU busy share while they pulled. */
static bool fanout_phase(nb_opts_t *o, uint32_t n, result_t *res, double *busy)
{
    fresh_registry(o);
    uint32_t P = world_of(o->src);
    child_t pubs[64], rc[16];
    bool ok = start_publishers(o, pubs, P, NULL, 1);
    for (uint32_t i = 0; i < n; i++) rc[i] = spawn(o, &(role_t){false, 0, (int)i, NULL, (int)(P + i), false, 0});
    cpu_ticks_t c0 = cpu_ticks();
    for (uint32_t i = 0; i < n && ok; i++) send_cmd(&rc[i], "pull 1");
    for (uint32_t i = 0; i < n && ok; i++)
        if (!get_result(&rc[i], &res[i])) {
            fprintf(stderr, "refit bench: receiver %u: %s\n", i, res[i].list);
            ok = false;
        }
    *busy = cpu_busy(c0, cpu_ticks());
    for (uint32_t i = 0; i < n; i++) stop(&rc[i], false);
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(o);
    return ok;
}

static int fanout_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = parse(argc, argv, &o, "megatron:tp=1", "vllm:tp=2", 8, 0);
    if (rc) return rc;
    char why[160] = "";
    bool net = !o.net || !strcmp(o.net, "netns");
    if (net && !netns_possible(why, sizeof(why))) {
        if (o.net) {
            fprintf(stderr, "refit bench fanout --net netns: %s\n", why);
            return 1;
        }
        fprintf(stderr, "refit bench fanout: network namespaces unavailable (%s): running over shm\n", why);
        net = false;
    }
    if (net) {
        /* Nodes with one link each way: a relay's egress feeds one reader at
         * the link's rate, so readers form chains (--max-readers 1) that
         * pipeline chunk by chunk.  A quarter of the model per receiver
         * (vllm tp=4, 280 MB) at 50 MB/s keeps the 2 CPUs' TCP work well under
         * what they can do with 8 readers at once. */
        if (!o.max_readers_set) o.max_readers = 1;
        if (!o.dst_set) o.dst = "vllm:tp=4";
        if (!o.link_set) o.link_mbps = 50;
        o.transport = "ucx";
        if (!netns_up(&o, world_of(o.src) + o.receivers, o.link_mbps, why, sizeof(why))) {
            fprintf(stderr, "refit bench fanout: %s\n", why);
            return 1;
        }
    }
    result_t one[1], all[16];
    double busy1 = 0, busyn = 0;
    bool ok1 = fanout_phase(&o, 1, one, &busy1), okn = ok1 && fanout_phase(&o, o.receivers, all, &busyn);
    netns_down(&o);
    if (!ok1) return tool_fail(REFIT_ERR_PEER, "bench fanout: single receiver");
    if (!okn) return tool_fail(REFIT_ERR_PEER, "bench fanout: fleet");
    uint64_t trainer = 0, relay = 0;
    for (uint32_t i = 0; i < o.receivers; i++) trainer += all[i].trainer_bytes, relay += all[i].relay_bytes;
    double t1 = span(one, 1), tn = span(all, o.receivers);
    double ratio = tn / t1, egress = (double)trainer / (double)one[0].bytes;
    out_t j = {0};
    out_begin(&j, "fanout", &o, NULL);
    metric(&j, "replica_bytes", "%" PRIu64, one[0].bytes);
    metric(&j, "one_receiver_s", "%.4f", t1);
    metric(&j, "all_receivers_s", "%.4f", tn);
    metric(&j, "ratio", "%.3f", ratio);
    metric(&j, "trainer_egress_bytes", "%" PRIu64, trainer);
    metric(&j, "relay_egress_bytes", "%" PRIu64, relay);
    metric(&j, "trainer_egress_replicas", "%.3f", egress);
    metric(&j, "aggregate_gbps", "%.3f", (double)(trainer + relay) * 8 / tn / 1e9);
    metric(&j, "cpu_busy_one", "%.3f", busy1);
    metric(&j, "cpu_busy_all", "%.3f", busyn);
    result_json(&j, "receivers", all, o.receivers);
    char exp[64];
    snprintf(exp, sizeof(exp), "<= 1.1 (%u receivers vs one alone)", o.receivers);
    check(&j, "all_done_within_1.1x_of_one", exp, ratio, "<=", 1.1);
    require(&j, "trainer_egress_at_most_2_replicas", "<= 2.0", egress, egress <= 2.0 + 1e-9);
    if (net)
        return out_end(&j, "every process a node of its own (network namespace, veth on one bridge, tbf on its egress "
                           "and its ingress at link_mbps), bytes over UCX/TCP; relays serve chunks as they land, "
                           "so with one reader per holder the receivers form a chain that pipelines.");
    return out_end(&j, "shm on one host: every receiver's bytes are copied by the CPUs all receivers share, so "
                       "N receivers cost N times the copy work whatever the tree; the trainer's egress is the "
                       "figure the relays change.");
}

/* ---- straggler ------------------------------------------------------------- */

static int straggler_once(int argc, char **argv)
{
    nb_opts_t o;
    /* Two DP replicas of the trainer; links emulated at --link-mbps (default 1000 MB/s over shm, 100 over netns). */
    int rc = parse(argc, argv, &o, "megatron:tp=1,dp=2", "vllm:tp=4", 4, 1000);
    if (rc) return rc;
    o.max_readers = 0;
    uint32_t P = world_of(o.src);
    bool net = !o.net || !strcmp(o.net, "netns"); /* the goal is stated for links */
    if (P + o.receivers > 62) return tool_usage("bench", "too many nodes");
    if (net && !net_up(&o, "straggler", P + o.receivers)) return 1;
    double L = o.link_mbps;
    /* Nodes (netns): replicas 0..P-1, receivers P..P+N-1.  Over shm every
     * link is a pacing of one holder's chunks per reader. */
    int rnode0 = net ? (int)P : -1;
    /* A. one receiver, both replicas at full rate; B. replica 1 at a tenth. */
    result_t a, b;
    nb_opts_t oa = o;
    fresh_registry(&oa);
    child_t pubs[64];
    bool ok = true;
    for (uint32_t k = 0; k < P; k++) pubs[k] = spawn(&oa, &(role_t){true, k, -1, NULL, net ? (int)k : -1, false, 0});
    ok = publish_all(pubs, P, 1);
    child_t r1 = spawn(&oa, &(role_t){false, 0, -1, net ? NULL : throttle_all("trainer", P, L, UINT32_MAX, 0), rnode0,
                                      false, 0});
    child_t r2 = spawn(&oa, &(role_t){false, 0, -1, net ? NULL : throttle_all("trainer", P, L, 1, L / 10), rnode0,
                                      false, 0});
    send_cmd(&r1, "pull 1");
    ok &= get_result(&r1, &a);
    if (net) ok &= node_rate(&o, 1, L / 10);
    send_cmd(&r2, "pull 1");
    ok &= get_result(&r2, &b);
    stop(&r1, false);
    stop(&r2, false);
    /* C. N receivers, none slowed; D. N receivers, receiver 0's links at a
     * tenth.  Receivers' links at L/4 here (over shm L/10, so that the links,
     * not the two CPUs all receivers share, bound them), the replicas' at L,
     * so that each healthy receiver is bound by its own link. */
    result_t c[16], d[16];
    child_t rcv[16];
    double LR = net ? L / 4 : L / 10;
    if (net) {
        ok &= node_rate(&o, 1, L);
        for (uint32_t i = 0; i < o.receivers; i++) ok &= node_rate(&o, P + i, LR);
    }
    for (int phase = 0; phase < 2 && ok; phase++) {
        result_t *res = phase ? d : c;
        if (net && phase) ok &= node_rate(&o, P, LR / 10);
        for (uint32_t i = 0; i < o.receivers; i++)
            rcv[i] = spawn(&oa, &(role_t){false, 0, -1,
                                          net ? NULL : throttle_all("trainer", P, phase && i == 0 ? LR / 10 : LR, UINT32_MAX, 0),
                                          net ? (int)(P + i) : -1, false, 0});
        for (uint32_t i = 0; i < o.receivers; i++) send_cmd(&rcv[i], "pull 1");
        for (uint32_t i = 0; i < o.receivers; i++) ok &= get_result(&rcv[i], &res[i]);
        for (uint32_t i = 0; i < o.receivers; i++) stop(&rcv[i], false);
    }
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(&oa);
    netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench straggler: a pull failed");
    /* Times from the discovery round to the data in place (transfer_ms
     * alone would leave out waiting for a holder). */
    double ta = (a.end - a.begin) * 1e3, tb = (b.end - b.begin) * 1e3;
    double ratio = tb / ta;
    double healthy_c = 0, healthy_d = 0, worst = 0, tc[16], td[16];
    for (uint32_t i = 0; i < o.receivers; i++) {
        tc[i] = (c[i].end - c[i].begin) * 1e3;
        td[i] = (d[i].end - d[i].begin) * 1e3;
    }
    for (uint32_t i = 1; i < o.receivers; i++) {
        healthy_c += tc[i] / (o.receivers - 1);
        healthy_d += td[i] / (o.receivers - 1);
    }
    for (uint32_t i = 1; i < o.receivers; i++) {
        double dev = td[i] / healthy_c - 1;
        if (dev > worst) worst = dev;
    }
    out_t j = {0};
    out_begin(&j, "straggler", &o, NULL);
    metric(&j, "slow_source_unthrottled_ms", "%.2f", ta);
    metric(&j, "slow_source_throttled_ms", "%.2f", tb);
    metric(&j, "slow_source_ratio", "%.3f", ratio);
    metric(&j, "static_split_ratio_expected", "%.3f", 5.0); /* half the bytes at a tenth of the rate */
    metric(&j, "slow_source_holders", "\"%s\"", b.list);
    metric(&j, "healthy_mean_ms_no_straggler", "%.2f", healthy_c);
    metric(&j, "healthy_mean_ms_with_straggler", "%.2f", healthy_d);
    metric(&j, "straggler_ms", "%.2f", td[0]);
    metric(&j, "healthy_worst_individual_slowdown", "%.4f", worst);
    double mean_dev = healthy_d / healthy_c - 1;
    metric(&j, "healthy_mean_slowdown", "%.4f", mean_dev);
    result_json(&j, "with_straggler", d, o.receivers);
    check(&j, "slow_replica_refit_within_1.3x", "<= 1.3", ratio, "<=", 1.3);
    check(&j, "healthy_receivers_mean_within_10pct", "<= 0.10", mean_dev, "<=", 0.10);
    check(&j, "healthy_receivers_each_within_10pct", "<= 0.10", worst, "<=", 0.10);
    if (net)
        return out_end(&j, "each process a node (network namespace, tbf on both directions), UCX/TCP; slow source: the "
                           "replicas and the receiver at link_mbps, then replica 1 at a tenth; slow receiver: replicas at "
                           "link_mbps, receivers at a quarter, receiver 0 then at a fortieth; times from the discovery "
                           "round to the data in place");
    return out_end(&j, "links emulated by REFIT_TEST_THROTTLE pacing (per reader, per holder): --link-mbps for the "
                       "slow-source runs (replica 1 at a tenth), a tenth of that for the slow-receiver runs (the "
                       "straggler receiver's links at a tenth again)");
}

/* ---- egress ---------------------------------------------------------------- */

static int egress_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = parse(argc, argv, &o, "megatron:tp=1,dp=4", "vllm:tp=2", 4, 0);
    if (rc) return rc;
    o.max_readers = 0;
    uint32_t P = world_of(o.src);
    bool net = !o.net || !strcmp(o.net, "netns"); /* the goal is stated for links */
    if (P + o.receivers > 62) return tool_usage("bench", "too many nodes");
    /* every replica and receiver a node, every link at --link-mbps (default 100) */
    if (net && !net_up(&o, "egress", P + o.receivers)) return 1;
    fresh_registry(&o);
    child_t pubs[64], rcv[16];
    result_t res[16];
    for (uint32_t k = 0; k < P; k++) pubs[k] = spawn(&o, &(role_t){true, k, -1, NULL, net ? (int)k : -1, false, 0});
    bool ok = publish_all(pubs, P, 1);
    for (uint32_t i = 0; i < o.receivers; i++)
        rcv[i] = spawn(&o, &(role_t){false, i % world_of(o.dst), -1, NULL, net ? (int)(P + i) : -1, false, 0});
    for (uint32_t i = 0; i < o.receivers && ok; i++) send_cmd(&rcv[i], "pull 1");
    for (uint32_t i = 0; i < o.receivers && ok; i++) ok &= get_result(&rcv[i], &res[i]);
    for (uint32_t i = 0; i < o.receivers; i++) stop(&rcv[i], false);
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(&o);
    netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench egress: a pull failed");
    uint64_t per[64] = {0}, total = 0;
    for (uint32_t i = 0; i < o.receivers; i++) {
        char list[1024];
        snprintf(list, sizeof(list), "%s", res[i].list);
        char *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            unsigned k;
            unsigned long long b;
            if (sscanf(t, "trainer:%u=%llu", &k, &b) == 2 && k < 64) per[k] += b, total += b;
        }
    }
    double mean = (double)total / P, dev = 0;
    out_t j = {0};
    out_begin(&j, "egress", &o, NULL);
    fprintf(j.f, "\"bytes_per_source\":[");
    for (uint32_t k = 0; k < P; k++) {
        fprintf(j.f, "%s%" PRIu64, k ? "," : "", per[k]);
        double d = per[k] / mean - 1;
        if (d < 0) d = -d;
        if (d > dev) dev = d;
    }
    fprintf(j.f, "]");
    j.nmetrics++;
    metric(&j, "mean_bytes", "%.0f", mean);
    metric(&j, "max_deviation", "%.4f", dev);
    metric(&j, "refit_s", "%.4f", span(res, o.receivers));
    result_json(&j, "receivers", res, o.receivers);
    check(&j, "bytes_per_source_within_5pct", "<= 0.05", dev, "<=", 0.05);
    if (net)
        return out_end(&j, "every trainer rank is a DP replica holding the same bytes, each a node (network namespace, "
                           "tbf at link_mbps both ways) like each receiver, UCX/TCP; chunks go to whichever holder is "
                           "free first");
    return out_end(&j, "every trainer rank is a DP replica holding the same bytes; receivers are ranks of vllm "
                       "layouts; chunks go to whichever holder is free first");
}

/* ---- elastic --------------------------------------------------------------- */

static int elastic_once(int argc, char **argv)
{
    nb_opts_t o;
    /* Links emulated (default 200 MB/s) so that the links, not the two CPUs
     * here, bound a pull, and a pull lasts long enough for a relay to leave
     * in the middle of it. */
    int rc = parse(argc, argv, &o, "megatron:tp=1", "vllm:tp=4", 4, 200);
    if (rc) return rc;
    uint32_t P = world_of(o.src), N = o.receivers;
    bool net = !o.net || !strcmp(o.net, "netns"); /* the goal is stated for links */
    if (P + N + 1 > 62 || N > 15) return tool_usage("bench", "too many nodes");
    /* Over netns every process is a node with one link each way: one reader
     * per holder (--max-readers 1, a chain that pipelines), 100 MB/s links. */
    if (!net) o.max_readers = 0;
    else if (!o.max_readers_set) o.max_readers = 1;
    if (net && !net_up(&o, "elastic", P + N + 1)) return 1;
    fresh_registry(&o);
    double L = o.link_mbps;
    char thr[1024];
    snprintf(thr, sizeof(thr), "%s", throttle_all("trainer", P, L, UINT32_MAX, 0));
    size_t l = strlen(thr);
    for (uint32_t s = 0; s < 16 && l < sizeof(thr) - 30; s++) l += (size_t)snprintf(thr + l, sizeof(thr) - l, ",relay:%u=%g", s, L);
    const char *th = net ? NULL : thr; /* over netns the links are real */
    child_t pubs[64], rcv[17];
    result_t v0[17], v1[17], v2[17], v3[17];
    for (uint32_t k = 0; k < P; k++) pubs[k] = spawn(&o, &(role_t){true, k, -1, NULL, net ? (int)k : -1, false, 0});
    bool ok = publish_all(pubs, P, 1);
    for (uint32_t i = 0; i < N; i++) rcv[i] = spawn(&o, &(role_t){false, 0, (int)i, th, net ? (int)(P + i) : -1, false, 0});
    /* Version 1 warms up (plans, connections); version 2 is the baseline: the fleet alone. */
    for (uint32_t i = 0; i < N && ok; i++) send_cmd(&rcv[i], "pull 1");
    for (uint32_t i = 0; i < N && ok; i++) ok &= get_result(&rcv[i], &v0[i]);
    ok = ok && publish_all(pubs, P, 2);
    cpu_ticks_t c0 = cpu_ticks();
    for (uint32_t i = 0; i < N && ok; i++) send_cmd(&rcv[i], "pull 2");
    for (uint32_t i = 0; i < N && ok; i++) ok &= get_result(&rcv[i], &v1[i]);
    double busy_base = cpu_busy(c0, cpu_ticks());
    /* Version 3: a joiner starts while the others pull. */
    ok = ok && publish_all(pubs, P, 3);
    c0 = cpu_ticks();
    for (uint32_t i = 0; i < N && ok; i++) send_cmd(&rcv[i], "pull 3");
    rcv[N] = spawn(&o, &(role_t){false, 0, (int)N, th, net ? (int)(P + N) : -1, false, 0});
    double join_t0 = refit_now();
    send_cmd(&rcv[N], "pull 0");
    for (uint32_t i = 0; i <= N && ok; i++) ok &= get_result(&rcv[i], &v2[i]);
    double busy_join = cpu_busy(c0, cpu_ticks());
    double join_s = v2[N].end - join_t0;
    /* Version 4: receiver 0 pulls first and serves; the others then read from
     * it (and the trainer), and it is killed a third of a pull into theirs. */
    ok = ok && publish_all(pubs, P, 4);
    double t_kill = 0;
    if (ok) {
        send_cmd(&rcv[0], "pull 4");
        ok &= get_result(&rcv[0], &v3[0]);
    }
    for (uint32_t i = 1; i <= N && ok; i++) send_cmd(&rcv[i], "pull 4");
    if (ok) {
        usleep((useconds_t)(v1[0].transfer_ms * 1e3 / 3));
        kill(rcv[0].pid, SIGKILL);
        t_kill = refit_now();
    }
    for (uint32_t i = 1; i <= N && ok; i++) get_result(&rcv[i], &v3[i]);
    uint32_t failovers = 0, ok3 = 0;
    double worst_after_kill = 0;
    for (uint32_t i = 1; i <= N && ok; i++) {
        if (strstr(v3[i].list, "relay:0=") && strstr(v3[i].list, "!")) failovers++;
        ok3 += v3[i].st == 0;
        if (v3[i].end - t_kill > worst_after_kill) worst_after_kill = v3[i].end - t_kill;
    }
    stop(&rcv[0], true);
    for (uint32_t i = 1; i <= N; i++) stop(&rcv[i], false);
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(&o);
    netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench elastic: a pull failed");
    double worst = 0;
    for (uint32_t i = 0; i < N; i++) {
        double d = v2[i].transfer_ms / v1[i].transfer_ms - 1;
        if (d > worst) worst = d;
    }
    out_t j = {0};
    out_begin(&j, "elastic", &o, NULL);
    metric(&j, "joiner_first_version", "%" PRIu64, v2[N].version);
    metric(&j, "joiner_s", "%.4f", join_s);
    metric(&j, "joiner_holders", "\"%s\"", v2[N].list);
    metric(&j, "worst_slowdown_of_others_by_joiner", "%.4f", worst);
    metric(&j, "cpu_busy_baseline", "%.3f", busy_base);
    metric(&j, "cpu_busy_with_joiner", "%.3f", busy_join);
    metric(&j, "relay_killed_readers_failed_over", "%u", failovers);
    metric(&j, "receivers_completing_v3_after_kill", "%u", ok3);
    metric(&j, "last_completion_after_kill_s", "%.4f", worst_after_kill);
    result_json(&j, "v1_warmup", v0, N);
    result_json(&j, "v2_baseline", v1, N);
    result_json(&j, "v3_joiner", v2, N + 1);
    result_json(&j, "v4_relay_killed", v3, N + 1);
    require(&j, "joiner_gets_newest", "== 3", (double)v2[N].version, v2[N].version == 3);
    check(&j, "joiner_slows_others_at_most_5pct", "<= 0.05", worst, "<=", 0.05);
    require(&j, "all_remaining_complete_after_relay_killed", "== receivers", (double)ok3, ok3 == N);
    if (net)
        return out_end(&j, "each process a node (network namespace, tbf at link_mbps both ways), UCX/TCP, one reader "
                           "per holder; receivers are relays (slots 0..N); v3: a joiner starts with the others' pulls; "
                           "v4: receiver 0 commits first, then is killed while the others read from it and each other");
    return out_end(&j, "receivers are relays (slots 0..N); v3: a joiner starts with the others' pulls; v4: "
                       "receiver 0 commits first, then is killed while the others read from it and the trainer");
}

/* ---- delta through the engine ---------------------------------------------- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof(double), cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Publishers in delta mode change --fraction of their elements per version;
 * per version, a full receiver (no_delta) pulls it, then a delta receiver of
 * the same layout and rank, one after the other so that each has the links
 * (or the CPUs) to itself.  Both verify every byte against the truth. */
static int delta_net_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = parse(argc, argv, &o, "megatron:ep=2", "vllm:tp=2", 1, 0);
    if (rc) return rc;
    if (o.delta <= 0) o.delta = 0.01;
    if (o.delta >= 1) return tool_usage("bench", "--fraction is a share of elements, below 1");
    if (!o.versions) o.versions = 4;
    if (o.versions < 2 || o.versions > 30) return tool_usage("bench", "--versions is 2..30");
    o.verify = true; /* bit-exactness is what this scenario asserts */
    o.receivers = 2;
    bool net = !o.net || !strcmp(o.net, "netns"); /* the goal is stated for links */
    uint32_t P = world_of(o.src);
    if (!P || P > 62) return tool_usage("bench", "--src names a layout of 1..62 ranks");
    if (net && !net_up(&o, "delta", P + 2)) return 1;
    fresh_registry(&o);
    child_t pubs[64], full, delta;
    for (uint32_t k = 0; k < P; k++) pubs[k] = spawn(&o, &(role_t){true, k, -1, NULL, net ? (int)k : -1, false, 0});
    full = spawn(&o, &(role_t){false, 0, -1, NULL, net ? (int)P : -1, true, 0});
    delta = spawn(&o, &(role_t){false, 0, -1, NULL, net ? (int)P + 1 : -1, false, 0});
    uint32_t V = o.versions;
    result_t rf[32], rd[32];
    double enc[32] = {0}, pub[32] = {0};
    uint64_t dbytes[32] = {0}, base[32] = {0};
    uint32_t verified = 0;
    bool ok = true;
    char buf[700];
    for (uint32_t v = 1; v <= V && ok; v++) {
        for (uint32_t k = 0; k < P; k++) send_cmd(&pubs[k], "publish %u", v);
        for (uint32_t k = 0; k < P; k++) {
            uint64_t b = 0, n = 0;
            double e = 0, t = 0;
            reply(&pubs[k], 600000, buf, sizeof(buf));
            if (sscanf(buf, "0 %" SCNu64 " %" SCNu64 " %lf %lf", &b, &n, &e, &t) != 4) {
                fprintf(stderr, "refit bench delta: publisher %u: %s", k, buf[0] ? buf : "no answer\n");
                ok = false;
                continue;
            }
            if (e > enc[v]) enc[v] = e; /* the slowest rank sets the pace */
            if (t > pub[v]) pub[v] = t;
            dbytes[v] += n;
            base[v] = b;
        }
        if (!ok) break;
        /* A failed pull (a verification failure among them) is counted, not fatal. */
        send_cmd(&full, "pull %u", v);
        if (!get_result(&full, &rf[v])) fprintf(stderr, "refit bench delta: full receiver, version %u: %s\n", v, rf[v].list);
        else verified++;
        send_cmd(&delta, "pull %u", v);
        if (!get_result(&delta, &rd[v])) fprintf(stderr, "refit bench delta: delta receiver, version %u: %s\n", v, rd[v].list);
        else verified++;
        if (rf[v].st == -999 || rd[v].st == -999) ok = false; /* no answer: a receiver is gone */
    }
    stop(&full, false);
    stop(&delta, false);
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(&o);
    netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench delta");
    /* Steady state: versions 2..V. */
    double tf[32], td[32], te[32], tp[32];
    uint64_t fb = 0, db = 0;
    bool all_delta = true;
    size_t n = 0;
    for (uint32_t v = 2; v <= V; v++, n++) {
        tf[n] = (rf[v].end - rf[v].begin) * 1e3;
        td[n] = (rd[v].end - rd[v].begin) * 1e3;
        te[n] = enc[v];
        tp[n] = pub[v];
        fb += rf[v].bytes;
        db += rd[v].bytes;
        all_delta &= rd[v].delta_base == v - 1 && rf[v].delta_base == 0;
    }
    double full_ms = median_of(tf, n), delta_ms = median_of(td, n), ratio = delta_ms / full_ms;
    double wire = (double)db / (double)fb;
    out_t j = {0};
    char extra[96];
    snprintf(extra, sizeof(extra), "\"fraction\":%g,\"versions\":%u,\"threads_per_receiver\":%u", o.delta, V,
             o.threads ? o.threads : 1);
    out_begin(&j, "delta", &o, extra);
    metric(&j, "full_refit_ms", "%.3f", full_ms);
    metric(&j, "delta_refit_ms", "%.3f", delta_ms);
    metric(&j, "time_ratio", "%.4f", ratio);
    metric(&j, "full_refit_bytes", "%" PRIu64, fb / n);
    metric(&j, "delta_wire_bytes", "%" PRIu64, db / n);
    metric(&j, "wire_ratio", "%.4f", wire);
    metric(&j, "publisher_encode_ms", "%.3f", median_of(te, n));
    metric(&j, "publisher_publish_ms", "%.3f", median_of(tp, n));
    fprintf(j.f, ",\"per_version\":[");
    for (uint32_t v = 1; v <= V; v++)
        fprintf(j.f,
                "%s{\"version\":%u,\"offered_base\":%" PRIu64 ",\"delta_bytes_offered\":%" PRIu64
                ",\"encode_ms\":%.3f,\"full\":{\"ms\":%.3f,\"bytes\":%" PRIu64 ",\"verify_ms\":%.1f},"
                "\"delta\":{\"ms\":%.3f,\"bytes\":%" PRIu64 ",\"applied_base\":%" PRIu64 ",\"verify_ms\":%.1f}}",
                v > 1 ? "," : "", v, base[v], dbytes[v], enc[v], (rf[v].end - rf[v].begin) * 1e3, rf[v].bytes,
                rf[v].verify_ms, (rd[v].end - rd[v].begin) * 1e3, rd[v].bytes, rd[v].delta_base, rd[v].verify_ms);
    fprintf(j.f, "]");
    j.nmetrics++;
    char exp[96];
    snprintf(exp, sizeof(exp), "%u (every pull of both receivers verified against the truth)", 2 * V);
    require(&j, "bit_exact", exp, verified, verified == 2 * V);
    require(&j, "deltas_applied", "the delta receiver applied a delta from v-1 for every v >= 2 (1 = yes)",
              all_delta ? 1 : 0, all_delta);
    require(&j, "wire_bytes_ratio", "<= 0.05", wire, wire <= 0.05);
    check(&j, "time_ratio", "<= 0.15", ratio, "<=", 0.15);
    if (net)
        return out_end(&j, "each process a node (network namespace, tbf at link_mbps on both directions), UCX/TCP; "
                           "times from the discovery round that found the version to the data in place (verification "
                           "after, not timed); full and delta receivers pull one after the other.");
    return out_end(&j, "shm on one host: a full refit is a memory copy here, and the delta's scattered writes into "
                       "the receiver's memory cost a fair share of it, so the time ratio stays far above the wire "
                       "ratio; over a link it follows the bytes.");
}

/* ---- FP8 through the engine -------------------------------------------------- */

/* Node 0 is the trainer's host: the bf16 publishers and one FP8 relay per
 * bf16 rank of --dst (reading the publishers over shm, quantizing, publishing
 * in group "fp8").  Node 1 holds a receiver of rank 0's FP8 arena, node 2 a
 * bf16 receiver of the same rank; per version the bf16 receiver pulls, then
 * the relays step, then the FP8 receiver pulls, each with the links to
 * itself.  Every FP8 byte is checked against a quantization of the truth
 * made in the receiver's process. */
static int fp8_net_once(int argc, char **argv)
{
    nb_opts_t o;
    int rc = parse(argc, argv, &o, "megatron:ep=2", "vllm:tp=2", 1, 0);
    if (rc) return rc;
    if (!strcmp(o.model, "qwen3-30b-a3b-mini")) o.model = "qwen3-fp8-mini"; /* head_dim 32 cuts FP8 blocks */
    if (!o.versions) o.versions = 2;
    if (o.versions > 30) return tool_usage("bench", "--versions is 1..30");
    o.verify = true;
    o.receivers = 2;
    bool net = !strcmp(o.net, "netns");
    uint32_t P = world_of(o.src), W = world_of(o.dst);
    if (!P || P > 32 || !W || W > 16) return tool_usage("bench", "--src is 1..32 ranks, --dst 1..16");
    {   /* A layout that cuts FP8 blocks: say so before starting anything. */
        refit_manifest_t *m;
        refit_fp8_target_t *t;
        refit_status_t st = rank_manifest(o.model, o.dst, 0, &m);
        if (!st) {
            st = refit_fp8_target_create(m, &t);
            refit_fp8_target_destroy(t);
            refit_manifest_destroy(m);
        }
        if (st) return tool_fail(st, "bench fp8");
    }
    if (net) o.pub_transports = "shm,ucx"; /* the relays read the trainer over shm on node 0 */
    if (net && !net_up(&o, "fp8", 3)) return 1;
    fresh_registry(&o);
    child_t pubs[32], relays[16], fp8rx, bfrx;
    for (uint32_t k = 0; k < P; k++) pubs[k] = spawn(&o, &(role_t){true, k, -1, NULL, net ? 0 : -1, false, 0});
    for (uint32_t k = 0; k < W; k++) relays[k] = spawn(&o, &(role_t){false, k, -1, NULL, net ? 0 : -1, false, 1});
    fp8rx = spawn(&o, &(role_t){false, 0, -1, NULL, net ? 1 : -1, false, 2});
    bfrx = spawn(&o, &(role_t){false, 0, -1, NULL, net ? 2 : -1, false, 0});
    uint32_t V = o.versions;
    result_t rb[32], rf[32];
    double relay_ms[32] = {0}, stage_ms[32] = {0};
    uint64_t relay_bf16 = 0, relay_fp8 = 0;
    uint32_t verified = 0;
    bool ok = true;
    char buf[800];
    for (uint32_t v = 1; v <= V && ok; v++) {
        ok = publish_all(pubs, P, v);
        if (!ok) {
            fprintf(stderr, "refit bench fp8: publishing version %u failed\n", v);
            break;
        }
        send_cmd(&bfrx, "pull %u", v);
        if (get_result(&bfrx, &rb[v])) verified++;
        else fprintf(stderr, "refit bench fp8: bf16 receiver, version %u: %s\n", v, rb[v].list);
        for (uint32_t k = 0; k < W; k++) send_cmd(&relays[k], "step %u", v);
        for (uint32_t k = 0; k < W; k++) {
            unsigned long long ver, b16, b8;
            double pm, sm, tm;
            reply(&relays[k], 600000, buf, sizeof(buf));
            if (sscanf(buf, "0 %llu %lf %lf %lf %llu %llu", &ver, &pm, &sm, &tm, &b16, &b8) != 6) {
                fprintf(stderr, "refit bench fp8: relay %u: %s", k, buf[0] ? buf : "no answer\n");
                ok = false;
                continue;
            }
            if (k == 0) {
                relay_ms[v] = pm + sm + tm;
                stage_ms[v] = sm;
                relay_bf16 = b16;
                relay_fp8 = b8;
            }
        }
        if (!ok) break;
        send_cmd(&fp8rx, "pull %u", v);
        if (get_result(&fp8rx, &rf[v])) verified++;
        else fprintf(stderr, "refit bench fp8: FP8 receiver, version %u: %s\n", v, rf[v].list);
        if (rb[v].st == -999 || rf[v].st == -999) ok = false;
    }
    stop(&fp8rx, false);
    stop(&bfrx, false);
    for (uint32_t k = 0; k < W; k++) stop(&relays[k], false);
    for (uint32_t k = 0; k < P; k++) stop(&pubs[k], false);
    rm_registry(&o);
    netns_down(&o);
    if (!ok) return tool_fail(REFIT_ERR_PEER, "bench fp8");
    /* The last version (the first planned and connected). */
    double tb[32], tf[32], tr[32], ts[32];
    size_t n = 0;
    for (uint32_t v = V > 1 ? 2 : 1; v <= V; v++, n++) {
        tb[n] = (rb[v].end - rb[v].begin) * 1e3;
        tf[n] = (rf[v].end - rf[v].begin) * 1e3;
        tr[n] = relay_ms[v];
        ts[n] = stage_ms[v];
    }
    double bf16_ms = median_of(tb, n), fp8_ms = median_of(tf, n), relay = median_of(tr, n);
    double wire = (double)rf[V].bytes / (double)rb[V].bytes;
    out_t j = {0};
    char extra[96];
    snprintf(extra, sizeof(extra), "\"versions\":%u,\"relays\":%u", V, W);
    out_begin(&j, "fp8", &o, extra);
    metric(&j, "bf16_pull_ms", "%.3f", bf16_ms);
    metric(&j, "fp8_pull_ms", "%.3f", fp8_ms);
    metric(&j, "relay_step_ms", "%.3f", relay);
    metric(&j, "relay_stage_ms", "%.3f", median_of(ts, n));
    metric(&j, "fp8_end_to_end_ms", "%.3f", relay + fp8_ms);
    metric(&j, "bf16_wire_bytes", "%" PRIu64, rb[V].bytes);
    metric(&j, "fp8_wire_bytes", "%" PRIu64, rf[V].bytes);
    metric(&j, "relay_bf16_bytes", "%" PRIu64, relay_bf16);
    metric(&j, "relay_fp8_arena_bytes", "%" PRIu64, relay_fp8);
    metric(&j, "wire_ratio", "%.4f", wire);
    metric(&j, "fp8_pull_time_ratio", "%.4f", fp8_ms / bf16_ms);
    char exp[96];
    snprintf(exp, sizeof(exp), "%u (bf16 pulls verified against the truth, FP8 pulls against its quantization)", 2 * V);
    require(&j, "fp8_bits_exact", exp, verified, verified == 2 * V);
    require(&j, "wire_carries_fp8", "< 0.6 (fp8 bytes and scales over the link, not bf16)", wire, wire < 0.6);
    if (net)
        return out_end(&j, "node 0 holds the trainer ranks and the FP8 relays (bf16 read over shm there), the FP8 and "
                           "bf16 receivers are nodes of their own behind tbf at link_mbps, UCX/TCP; fp8_end_to_end is "
                           "the relay's step (pull, quantize, publish) plus the FP8 pull.");
    return out_end(&j, "shm on one host: relays, receivers and publishers share the CPUs; the wire ratio is the "
                       "figure that carries over to a network.");
}

int bench_fanout(int argc, char **argv) { return repeat("fanout", fanout_once, argc, argv, 5); }

int bench_straggler(int argc, char **argv) { return repeat("straggler", straggler_once, argc, argv, 5); }

int bench_egress(int argc, char **argv) { return repeat("egress", egress_once, argc, argv, 5); }

int bench_elastic(int argc, char **argv) { return repeat("elastic", elastic_once, argc, argv, 5); }

int bench_delta_net(int argc, char **argv) { return repeat("delta", delta_net_once, argc, argv, 5); }

int bench_fp8_net(int argc, char **argv) { return repeat("fp8", fp8_net_once, argc, argv, 1); }
