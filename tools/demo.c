/* refit demo: P publisher processes in a trainer layout and R receiver
 * processes in a rollout layout (children of this binary: `refit publish` /
 * `refit pull`), K refit cycles with new weights every version, every byte
 * verified against the synthetic truth, timings per phase, and this
 * machine's single-thread memcpy rate measured in the same run. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tool.h"
#include "tool_proc.h"

#define MAX_CHILDREN 256
#define MAX_CYCLES 1000

typedef struct {
    pid_t pid;
    int fd;
    bool receiver, eof;
    bool exited;  /* reaped: pid is no longer ours to signal */
    bool stopped; /* killed by the demo itself (timeout, or another child failed) */
    int status;
    uint32_t rank;
    char buf[16384];
    size_t len;
} child_t;

typedef struct {
    uint32_t reports;
    uint64_t bytes;
    double discover, plan, transfer, verify, total; /* max over receivers */
    bool planned;
    double begin, end;                       /* earliest begin_s, latest end_s over receivers (CLOCK_MONOTONIC) */
    double xbegin;                           /* earliest transfer_begin_s over receivers */
    double connect;                          /* max over receivers */
    uint64_t launches, requests;             /* sums over receivers */
    double published, publish_ms, fill_ms;   /* latest publish time, max publish_ms / fill_ms over publishers */
    uint32_t deltas;                         /* receivers that applied a delta */
    double digest_ms;                        /* max over receivers: checking against the publishers' digests */
    double pub_digest_ms;                    /* max over publishers: computing them (part of publish_ms) */
    uint32_t tables_from_delta;              /* publishers whose table was the last one plus the delta's changes */
    uint64_t digest_bytes, unverified_bytes; /* sums over receivers */
    double stamp_ms;                         /* max over receivers: reading the sources' version stamps */
    uint32_t fused;                          /* receivers whose copies computed the digests as they wrote */
} cycle_t;

/* Aggregate rate of a cycle: every receiver's bytes over the window from the
 * first transfer's start to the last one's end (receivers overlap in time, so
 * bytes over the slowest receiver's own transfer time would overstate it). */
static double cycle_gbps(const cycle_t *c)
{
    double w = c->end - c->xbegin;
    return c->xbegin > 0 && w > 0 ? c->bytes / (w * 1e9) : 0;
}

static double measure_memcpy_gbps(void)
{
    const size_t n = 256u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int i = 0; i < 5; i++) {
        double t0 = refit_now();
        memcpy(b, a, n);
        double dt = refit_now() - t0;
        a[i] = b[n - 1 - (size_t)i]; /* keep the copies observable */
        if (dt > 0 && n / dt / 1e9 > best) best = n / dt / 1e9;
    }
    free(a);
    free(b);
    return best;
}

/* Runs this program (refit) with argv, its stdout into c->fd. */
static int spawn(child_t *c, char *const argv[])
{
    tool_proc_t p;
    if (tool_proc_exec(&p, "/proc/self/exe", argv)) return -1;
    c->pid = p.pid;
    c->fd = p.from_child;
    return 0;
}

static double num(const refit_json_t *o, const char *k)
{
    double d = 0;
    refit_json_double(refit_json_get(o, k), &d);
    return d;
}

static double g_prepare_ms; /* the slowest receiver's refit_receiver_prepare (--prepare), 0 without */

static void handle_line(child_t *c, const char *line, cycle_t *cycles, uint64_t first, uint64_t ncycles,
                        char *transport, size_t tsize, char *lanes, size_t lsize, bool *failed)
{
    refit_json_t *o = NULL;
    if (refit_json_parse(line, strlen(line), &o)) {
        fprintf(stderr, "refit demo: unreadable line from %s %u: %s\n", c->receiver ? "receiver" : "publisher", c->rank,
                line);
        return;
    }
    size_t len;
    const char *ev = refit_json_string(refit_json_get(o, "event"), &len);
    if (ev && !strcmp(ev, "pulled")) {
        int64_t v = 0;
        refit_json_int(refit_json_get(o, "version"), &v);
        if (v >= (int64_t)first && (uint64_t)v < first + ncycles) {
            cycle_t *cy = &cycles[v - (int64_t)first];
            int64_t bytes = 0;
            refit_json_int(refit_json_get(o, "bytes"), &bytes);
            cy->reports++;
            cy->bytes += (uint64_t)bytes;
            cy->discover = TOOL_MAX(cy->discover, num(o, "discover_ms"));
            cy->plan = TOOL_MAX(cy->plan, num(o, "plan_ms"));
            cy->transfer = TOOL_MAX(cy->transfer, num(o, "transfer_ms"));
            cy->verify = TOOL_MAX(cy->verify, num(o, "verify_ms"));
            cy->digest_ms = TOOL_MAX(cy->digest_ms, num(o, "digest_ms"));
            cy->stamp_ms = TOOL_MAX(cy->stamp_ms, num(o, "stamp_ms"));
            cy->digest_bytes += (uint64_t)num(o, "digest_bytes");
            cy->unverified_bytes += (uint64_t)num(o, "unverified_bytes");
            cy->total = TOOL_MAX(cy->total, num(o, "total_ms"));
            cy->connect = TOOL_MAX(cy->connect, num(o, "connect_ms"));
            double b = num(o, "begin_s"), e = num(o, "end_s"), xb = num(o, "transfer_begin_s");
            if (b > 0 && (cy->begin == 0 || b < cy->begin)) cy->begin = b;
            if (xb > 0 && (cy->xbegin == 0 || xb < cy->xbegin)) cy->xbegin = xb;
            cy->end = TOOL_MAX(cy->end, e);
            int64_t x = 0;
            refit_json_int(refit_json_get(o, "launches"), &x);
            cy->launches += (uint64_t)x;
            x = 0;
            refit_json_int(refit_json_get(o, "requests"), &x);
            cy->requests += (uint64_t)x;
            x = 0;
            refit_json_int(refit_json_get(o, "delta_base"), &x);
            cy->deltas += x > 0;
            bool planned = false, fused = false;
            refit_json_bool(refit_json_get(o, "digest_fused"), &fused);
            cy->fused += fused;
            refit_json_bool(refit_json_get(o, "planned"), &planned);
            cy->planned |= planned;
            const char *t = refit_json_string(refit_json_get(o, "transport"), &len);
            if (t) snprintf(transport, tsize, "%s", t);
            const char *l = refit_json_string(refit_json_get(o, "lanes"), &len);
            if (l) snprintf(lanes, lsize, "%s", l);
        }
    } else if (ev && !strcmp(ev, "published")) {
        int64_t v = 0;
        refit_json_int(refit_json_get(o, "version"), &v);
        if (v >= (int64_t)first && (uint64_t)v < first + ncycles) {
            cycle_t *cy = &cycles[v - (int64_t)first];
            cy->published = TOOL_MAX(cy->published, num(o, "at_s"));
            cy->publish_ms = TOOL_MAX(cy->publish_ms, num(o, "publish_ms"));
            cy->fill_ms = TOOL_MAX(cy->fill_ms, num(o, "fill_ms"));
            cy->pub_digest_ms = TOOL_MAX(cy->pub_digest_ms, num(o, "digest_ms"));
            const char *dt = refit_json_string(refit_json_get(o, "digest_table"), &len);
            cy->tables_from_delta += dt && len == 5 && !strncmp(dt, "delta", 5);
        }
    } else if (ev && !strcmp(ev, "prepared")) {
        g_prepare_ms = TOOL_MAX(g_prepare_ms, num(o, "prepare_ms"));
    } else if (ev && !strcmp(ev, "failed")) {
        const char *e = refit_json_string(refit_json_get(o, "error"), &len);
        fprintf(stderr, "refit demo: receiver %u failed: %s\n", c->rank, e ? e : "?");
        *failed = true;
    }
    refit_json_free(o);
}

static const char *role(const child_t *c) { return c->receiver ? "receiver" : "publisher"; }

/* Reaps every child that has ended, without waiting.  A child that ended
 * other than with status 0 (killed, crashed, failed) fails the demo at once:
 * the others would otherwise wait for it until their timeout (publishers for
 * its acks, receivers for its versions).  Returns true if one did. */
static bool reap_ended(child_t *kids, uint32_t n)
{
    bool failed = false;
    for (uint32_t i = 0; i < n; i++) {
        child_t *c = &kids[i];
        if (c->exited) continue;
        int status;
        pid_t got = waitpid(c->pid, &status, WNOHANG);
        if (got != c->pid) continue;
        c->exited = true;
        c->status = status;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
        if (!c->stopped) {
            char how[96];
            tool_proc_describe(status, how, sizeof(how));
            fprintf(stderr, "refit demo: %s %u (pid %d) %s; stopping the other children\n", role(c), c->rank,
                    (int)c->pid, how);
        }
        failed = true;
    }
    return failed;
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[4096];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            if (e->d_type == DT_DIR) remove_tree(sub);
            else unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One whole demo of the caller's options (argv[1..argc), without --digest-ab and --json), run as a child
 * `refit demo --json` with digests on or off: its receiver cost (the slowest receiver's steady transfer_ms +
 * digest_ms, the same figure as bench/digest-ab.sh's) in *ms; false when it failed. */
static bool ab_arm(int argc, char **argv, bool off, double *ms, double *check_ms, double *fused, double *unverified)
{
    char **args = calloc((size_t)argc + 4, sizeof(char *));
    if (!args) return false;
    int a = 0;
    args[a++] = "refit";
    args[a++] = "demo";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "--no-digest") || !strncmp(argv[i], "--digest-ab", 11))
            continue;
        args[a++] = argv[i];
    }
    args[a++] = "--json";
    if (off) args[a++] = "--no-digest";
    args[a] = NULL;
    int status = 0;
    char *out = tool_proc_capture("/proc/self/exe", args, &status);
    free(args);
    bool ok = out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    /* The report: the last line of its output */
    size_t len = out ? strlen(out) : 0;
    while (len && out[len - 1] == '\n') out[--len] = '\0';
    char *line = ok ? strrchr(out, '\n') : NULL;
    line = ok ? (line ? line + 1 : out) : NULL;
    refit_json_t *o = NULL;
    ok = line && !refit_json_parse(line, strlen(line), &o);
    if (ok) {
        *check_ms = num(o, "steady_digest_ms");
        *ms = num(o, "steady_transfer_ms") + *check_ms;
        *fused = num(o, "digest_fused_receivers");
        *unverified = num(o, "unverified_bytes_per_cycle");
        refit_json_free(o);
    }
    free(out);
    return ok && *ms > 0;
}

/* refit demo --digest-ab[=N]: what verification costs, on this demo's workload: N pairs (default 3) of whole
 * demos, digests on (the default: the copies hash what they write) and off (--no-digest), each pair's order
 * alternating; the ratio on / off of the receiver cost taken within each pair, then its median and range.
 * bench/digest-ab.sh (shm, with the separate pass as a third arm) and bench/digest-ab-paths.sh (UCX, relays,
 * delta) are the benchmarks that record it. */
static int digest_ab(int argc, char **argv, uint64_t pairs, bool json)
{
    double on[64], off[64], ratio[64], chk[64], fused[64], unv[64];
    if (!json)
        printf("refit demo --digest-ab: %" PRIu64 " pairs of whole demos (the options given), digests on and off "
               "(--no-digest), in alternating order\n%5s %12s %12s %8s %10s %7s\n",
               pairs, "pair", "on_ms", "off_ms", "on/off", "check_ms", "fused");
    fflush(stdout);
    for (uint64_t k = 0; k < pairs; k++) {
        double x, y, f, u, c, f2, u2, c2; /* the on arm's check, fused receivers, unverified bytes; the off arm's */
        bool off_first = k % 2, ok;
        ok = off_first ? ab_arm(argc, argv, true, &y, &c2, &f2, &u2) && ab_arm(argc, argv, false, &x, &c, &f, &u)
                       : ab_arm(argc, argv, false, &x, &c, &f, &u) && ab_arm(argc, argv, true, &y, &c2, &f2, &u2);
        if (!ok) {
            fprintf(stderr, "refit demo --digest-ab: pair %" PRIu64 ": a demo failed\n", k + 1);
            return 1;
        }
        on[k] = x, off[k] = y, ratio[k] = x / y, chk[k] = c, fused[k] = f, unv[k] = u;
        if (!json) printf("%5" PRIu64 " %12.1f %12.1f %8.3f %10.1f %7.0f\n", k + 1, x, y, x / y, c, f);
        fflush(stdout);
    }
    double lo = ratio[0], hi = ratio[0];
    for (uint64_t k = 1; k < pairs; k++) lo = ratio[k] < lo ? ratio[k] : lo, hi = ratio[k] > hi ? ratio[k] : hi;
    double r_on[64], r_off[64], r_ratio[64];
    memcpy(r_on, on, sizeof(on));
    memcpy(r_off, off, sizeof(off));
    memcpy(r_ratio, ratio, sizeof(ratio));
    double mon = median(r_on, pairs), moff = median(r_off, pairs), mr = median(r_ratio, pairs);
    if (json) {
        printf("{\"digest_ab\":{\"pairs\":%" PRIu64 ",\"on_ms_median\":%.3f,\"off_ms_median\":%.3f,"
               "\"ratio_median\":%.4f,\"ratio_min\":%.4f,\"ratio_max\":%.4f,\"pairs_detail\":[",
               pairs, mon, moff, mr, lo, hi);
        for (uint64_t k = 0; k < pairs; k++)
            printf("%s{\"on_ms\":%.3f,\"off_ms\":%.3f,\"ratio\":%.4f,\"on_check_ms\":%.3f,"
                   "\"fused_receivers\":%.0f,\"unverified_bytes\":%.0f}",
                   k ? "," : "", on[k], off[k], ratio[k], chk[k], fused[k], unv[k]);
        printf("]}}\n");
    } else {
        printf("verification cost: a refit with content digests takes %.3f x one without (median of %" PRIu64
               " pairs, range %.3f-%.3f; receiver cost = the slowest receiver's steady transfer + check: %.1f ms on, "
               "%.1f ms off)\n",
               mr, pairs, lo, hi, mon, moff);
    }
    return 0;
}

int cmd_demo(int argc, char **argv)
{
    const char *model_name = "qwen3-30b-a3b-mini", *src_spec = "megatron:ep=8", *dst_spec = "vllm:tp=2";
    const char *transport = "shm", *registry = NULL, *mode = "in-place", *topts = NULL;
    bool no_digest = false, prepare = false, fp8 = false;
    uint64_t ab_pairs = 0; /* --digest-ab: pairs of whole demos, digests on and off */
    int64_t src_device = -1, dst_device = -1;
    uint64_t cycles = 5, timeout_s = 900, threads = 0, replicas = 1;
    bool json = false;
    const char *delta = NULL;
    enum {
        D_MODEL = 1,
        D_SRC,
        D_DST,
        D_CYCLES,
        D_TRANSPORT,
        D_REGISTRY,
        D_JSON,
        D_TIMEOUT,
        D_THREADS,
        D_MODE,
        D_REPLICAS,
        D_SRC_DEVICE,
        D_DST_DEVICE,
        D_TOPTS,
        D_DELTA,
        D_NO_DIGEST,
        D_PREPARE,
        D_FP8,
        D_DIGEST_AB
    };
    static const struct option opts[] = {{"model", required_argument, 0, D_MODEL},
                                         {"src", required_argument, 0, D_SRC},
                                         {"dst", required_argument, 0, D_DST},
                                         {"cycles", required_argument, 0, D_CYCLES},
                                         {"transport", required_argument, 0, D_TRANSPORT},
                                         {"registry", required_argument, 0, D_REGISTRY},
                                         {"json", no_argument, 0, D_JSON},
                                         {"timeout-s", required_argument, 0, D_TIMEOUT},
                                         {"threads", required_argument, 0, D_THREADS},
                                         {"mode", required_argument, 0, D_MODE},
                                         {"replicas", required_argument, 0, D_REPLICAS},
                                         {"src-device", required_argument, 0, D_SRC_DEVICE},
                                         {"dst-device", required_argument, 0, D_DST_DEVICE},
                                         {"transport-options", required_argument, 0, D_TOPTS},
                                         {"delta", required_argument, 0, D_DELTA},
                                         {"no-digest", no_argument, 0, D_NO_DIGEST},
                                         {"prepare", no_argument, 0, D_PREPARE},
                                         {"fp8", no_argument, 0, D_FP8},
                                         {"digest-ab", optional_argument, 0, D_DIGEST_AB},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case D_MODEL: model_name = optarg; break;
        case D_SRC: src_spec = optarg; break;
        case D_DST: dst_spec = optarg; break;
        case D_TRANSPORT: transport = optarg; break;
        case D_REGISTRY: registry = optarg; break;
        case D_MODE: mode = optarg; break;
        case D_JSON: json = true; break;
        case D_CYCLES:
            if (tool_parse_u64(optarg, &cycles) || !cycles || cycles > MAX_CYCLES)
                return tool_usage("demo", "--cycles takes 1..1000");
            break;
        case D_TIMEOUT:
            if (tool_parse_u64(optarg, &timeout_s) || !timeout_s)
                return tool_usage("demo", "--timeout-s takes seconds");
            break;
        case D_THREADS:
            if (tool_parse_u64(optarg, &threads)) return tool_usage("demo", "--threads takes a number");
            break;
        case D_TOPTS: topts = optarg; break;
        case D_NO_DIGEST: no_digest = true; break;
        case D_PREPARE: prepare = true; break;
        case D_FP8: fp8 = true; break;
        case D_DIGEST_AB:
            ab_pairs = 3;
            if (optarg && (tool_parse_u64(optarg, &ab_pairs) || !ab_pairs || ab_pairs > 64))
                return tool_usage("demo", "--digest-ab=N takes 1..64 pairs");
            break;
        case D_DELTA: {
            char *end;
            double f = strtod(optarg, &end);
            if (*end || !(f > 0 && f < 1))
                return tool_usage("demo", "--delta takes the share of elements that change per version, in (0, 1)");
            delta = optarg;
            break;
        }
        case D_SRC_DEVICE:
        case D_DST_DEVICE: {
            uint64_t d;
            if (tool_parse_u64(optarg, &d) || d > 1024)
                return tool_usage("demo", "--src-device/--dst-device take a CUDA device number");
            *(c == D_SRC_DEVICE ? &src_device : &dst_device) = (int64_t)d;
            break;
        }
        case D_REPLICAS:
            if (tool_parse_u64(optarg, &replicas) || !replicas || replicas > 16)
                return tool_usage("demo", "--replicas takes 1..16");
            break;
        default: return tool_usage("demo", "unknown option");
        }
    }
    if (optind < argc) return tool_usage("demo", "unexpected argument");
    if (strcmp(mode, "in-place") && strcmp(mode, "snapshot"))
        return tool_usage("demo", "--mode is in-place or snapshot");
    if (delta && (src_device >= 0 || dst_device >= 0)) return tool_usage("demo", "--delta needs host memory");
    if (ab_pairs && no_digest) return tool_usage("demo", "--digest-ab runs digests on and off itself: no --no-digest");
    if (ab_pairs && cycles < 2) return tool_usage("demo", "--digest-ab compares steady cycles: --cycles 2 or more");

    /* Check everything the children will check, so errors surface here once. */
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *src = NULL, *dst = NULL;
    if ((st = refit_model_open(model_name, &model))) return tool_fail(st, "--model");
    if ((st = refit_layout_parse(src_spec, &src)) || (st = refit_layout_check(src, model))) {
        tool_fail(st, "--src");
        goto early;
    }
    if ((st = refit_layout_parse(dst_spec, &dst)) || (st = refit_layout_check(dst, model))) {
        tool_fail(st, "--dst");
        goto early;
    }
    uint32_t P = refit_layout_world(src), dst_world = refit_layout_world(dst), R = dst_world * (uint32_t)replicas;
    if (P + R > MAX_CHILDREN) {
        fprintf(stderr, "refit demo: %u processes is more than this demo starts (%d)\n", P + R, MAX_CHILDREN);
        goto early;
    }
    uint64_t model_bytes = refit_model_total_bytes(model);
    char model_label[80];
    snprintf(model_label, sizeof(model_label), "%s", refit_model_name(model));
    char src_label[160], dst_label[160];
    snprintf(src_label, sizeof(src_label), "%s", refit_layout_string(src));
    snprintf(dst_label, sizeof(dst_label), "%s", refit_layout_string(dst));
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
    src = dst = NULL;
    model = NULL;
    if (ab_pairs) return digest_ab(argc, argv, ab_pairs, json);

    char tmpdir[64] = "", reg[128], job[64];
    if (!registry) {
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/refit-demo-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            fprintf(stderr, "refit demo: cannot create a registry directory: %s\n", strerror(errno));
            return 1;
        }
        snprintf(reg, sizeof(reg), "file:%s", tmpdir);
        registry = reg;
    }
    snprintf(job, sizeof(job), "demo-%d", (int)getpid());
    /* A networked registry needs the job's secret (docs/security.md): when
     * none is given, the demo makes a fresh one for its children. */
    char secret_dir[64] = "";
    if (!strncmp(registry, "redis:", 6) && !getenv("REFIT_SECRET_FILE") && !getenv("REFIT_SECRET") &&
        !getenv("REFIT_INSECURE")) {
        char path[96];
        unsigned char key[32];
        snprintf(secret_dir, sizeof(secret_dir), "/tmp/refit-demo-secret-XXXXXX");
        FILE *f = NULL;
        if (mkdtemp(secret_dir) && !refit_random_bytes(key, sizeof(key)) &&
            snprintf(path, sizeof(path), "%s/job.secret", secret_dir) > 0 && (f = fopen(path, "wx")) &&
            fchmod(fileno(f), 0600) == 0 && fwrite(key, 1, sizeof(key), f) == sizeof(key) && fclose(f) == 0) {
            setenv("REFIT_SECRET_FILE", path, 1);
            if (!json) printf("refit demo: a fresh job secret for this run in %s\n", path);
        } else {
            if (f) fclose(f);
            fprintf(stderr, "refit demo: cannot make a job secret: %s\n", strerror(errno));
            return 1;
        }
    }

    /* A URL with a password goes to the children in their environment, not
     * on their command lines (which other users can read in /proc), and is
     * printed redacted. */
    char *reg_shown = refit_redact_url(registry);
    bool has_password = reg_shown && strcmp(reg_shown, registry) != 0;
    if (has_password) setenv("REFIT_REGISTRY", registry, 1);
    double memcpy_gbps = measure_memcpy_gbps();
    if (!json)
        printf("refit demo: %s (%.2f GB) from %s (%u publishers) to %s (%u receivers), %" PRIu64
               " cycles over %s, registry %s\nmemcpy on this machine (1 thread, same run): %.1f GB/s\n\n",
               model_label, model_bytes / 1e9, src_label, P, dst_label, R, cycles, transport,
               reg_shown ? reg_shown : "?", memcpy_gbps);
    free(reg_shown);
    fflush(stdout);

    child_t *kids = calloc(P + R, sizeof(child_t));
    cycle_t *cy = calloc(cycles, sizeof(cycle_t));
    if (!kids || !cy) {
        free(kids);
        free(cy);
        return tool_fail(refit_error(REFIT_ERR_NO_MEMORY, "demo"), "demo");
    }
    char ncyc[32], nacks[32], nthreads[32], rankbuf[MAX_CHILDREN][16], readers[MAX_CHILDREN][48], tmo[32], sdev[16],
        ddev[16];
    snprintf(sdev, sizeof(sdev), "%" PRId64, src_device);
    snprintf(ddev, sizeof(ddev), "%" PRId64, dst_device);
    snprintf(ncyc, sizeof(ncyc), "%" PRIu64, cycles);
    snprintf(nacks, sizeof(nacks), "%u", R);
    /* Receivers share this host's CPUs: by default each copies with its share. */
    if (!threads) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        threads = ncpu > (long)R ? (uint64_t)ncpu / R : 1;
    }
    snprintf(nthreads, sizeof(nthreads), "%" PRIu64, threads);
    snprintf(tmo, sizeof(tmo), "%" PRIu64, timeout_s * 1000);
    bool failed = false;
    uint32_t started = 0;
    for (uint32_t i = 0; i < P + R; i++) {
        bool rx = i >= P;
        uint32_t rank = rx ? (i - P) % dst_world : i;
        snprintf(rankbuf[i], sizeof(rankbuf[i]), "%u", rank);
        if (rx) snprintf(readers[i], sizeof(readers[i]), "demo-replica%u-rank%u", (i - P) / dst_world, rank);
        char *args[48];
        int a = 0;
        args[a++] = "refit";
        args[a++] = rx ? "pull" : "publish";
        args[a++] = "--model", args[a++] = (char *)model_name;
        args[a++] = "--layout", args[a++] = (char *)(rx ? dst_spec : src_spec);
        args[a++] = "--rank", args[a++] = rankbuf[i];
        if (!has_password) args[a++] = "--registry", args[a++] = (char *)registry;
        args[a++] = "--job", args[a++] = job;
        args[a++] = "--transports", args[a++] = (char *)transport;
        args[a++] = "--versions", args[a++] = ncyc;
        args[a++] = "--timeout-ms", args[a++] = tmo;
        args[a++] = "--json";
        if (topts) args[a++] = "--transport-options", args[a++] = (char *)topts;
        if ((rx ? dst_device : src_device) >= 0) args[a++] = "--device", args[a++] = rx ? ddev : sdev;
        if (delta) args[a++] = "--delta", args[a++] = (char *)delta;
        if (no_digest) args[a++] = "--no-digest";
        if (prepare && rx) args[a++] = "--prepare";
        if (fp8 && rx) args[a++] = "--fp8";
        if (rx) {
            args[a++] = "--verify";
            args[a++] = "--threads", args[a++] = nthreads;
            args[a++] = "--reader", args[a++] = readers[i];
        } else {
            args[a++] = "--acks", args[a++] = nacks;
            args[a++] = "--mode", args[a++] = (char *)mode;
        }
        args[a] = NULL;
        kids[i].receiver = rx;
        kids[i].rank = rank;
        kids[i].fd = -1;
        if (spawn(&kids[i], args) != 0) {
            fprintf(stderr, "refit demo: cannot start a child process: %s\n", strerror(errno));
            failed = true;
            break;
        }
        started++;
    }
    /* Collect reports until every child is done or time runs out. */
    double deadline = refit_now() + (double)timeout_s;
    uint64_t shown = 0;
    char used_transport[32] = "", lanes[256] = "";
    for (;;) {
        struct pollfd pfd[MAX_CHILDREN];
        uint32_t map[MAX_CHILDREN], n = 0;
        for (uint32_t i = 0; i < started; i++)
            if (!kids[i].eof) {
                pfd[n] = (struct pollfd){.fd = kids[i].fd, .events = POLLIN};
                map[n++] = i;
            }
        if (!n) break;
        if (reap_ended(kids, started)) failed = true;
        if (refit_now() > deadline || failed) {
            if (!failed) fprintf(stderr, "refit demo: timed out after %" PRIu64 " s\n", timeout_s);
            failed = true;
            for (uint32_t i = 0; i < started; i++)
                if (!kids[i].exited && !kids[i].stopped) {
                    kids[i].stopped = true;
                    kill(kids[i].pid, SIGKILL);
                }
        }
        /* A child's end closes its pipe and wakes the poll; the next turn
         * reaps it (its exit status may come a moment after the EOF). */
        if (poll(pfd, n, 200) < 0 && errno != EINTR) break;
        for (uint32_t k = 0; k < n; k++) {
            if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            child_t *ch = &kids[map[k]];
            ssize_t got = read(ch->fd, ch->buf + ch->len, sizeof(ch->buf) - 1 - ch->len);
            if (got <= 0) {
                ch->eof = true;
                close(ch->fd);
                continue;
            }
            ch->len += (size_t)got;
            ch->buf[ch->len] = '\0';
            char *nl;
            while ((nl = strchr(ch->buf, '\n'))) {
                *nl = '\0';
                if (ch->buf[0] == '{')
                    handle_line(ch, ch->buf, cy, 1, cycles, used_transport, sizeof(used_transport), lanes,
                                sizeof(lanes), &failed);
                size_t rest = ch->len - (size_t)(nl + 1 - ch->buf);
                memmove(ch->buf, nl + 1, rest);
                ch->len = rest;
                ch->buf[rest] = '\0';
            }
            if (ch->len == sizeof(ch->buf) - 1) ch->len = 0; /* an absurd line: drop it */
        }
        while (shown < cycles && cy[shown].reports == R) {
            const cycle_t *x = &cy[shown];
            fprintf(stderr,
                    "refit demo: cycle %" PRIu64 "/%" PRIu64 " verified on %u receivers: transfer %.1f ms, %.2f GB/s\n",
                    shown + 1, cycles, R, x->transfer, cycle_gbps(x));
            shown++;
        }
    }
    for (uint32_t i = 0; i < started; i++) {
        child_t *ch = &kids[i];
        if (!ch->exited) {
            if (waitpid(ch->pid, &ch->status, 0) != ch->pid) continue;
            ch->exited = true;
            if (WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == 0) continue;
            if (!ch->stopped) {
                char how[96];
                tool_proc_describe(ch->status, how, sizeof(how));
                fprintf(stderr, "refit demo: %s %u (pid %d) %s\n", role(ch), ch->rank, (int)ch->pid, how);
            }
        }
        if (!(WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == 0)) failed = true;
    }
    bool verified = !failed;
    for (uint64_t k = 0; k < cycles; k++) verified &= cy[k].reports == R;
    /* Steady state: cycles after the first. */
    double ctrl[MAX_CYCLES], gbps[MAX_CYCLES], span[MAX_CYCLES], xfer[MAX_CYCLES], p2c[MAX_CYCLES], dig[MAX_CYCLES],
        pdig[MAX_CYCLES], stm[MAX_CYCLES];
    size_t ns = 0;
    for (uint64_t k = 1; k < cycles; k++)
        if (cy[k].reports == R && cy[k].transfer > 0) {
            ctrl[ns] = cy[k].discover + cy[k].plan;
            gbps[ns] = cycle_gbps(&cy[k]);
            span[ns] = (cy[k].end - cy[k].begin) * 1e3;
            xfer[ns] = cy[k].transfer;
            p2c[ns] = cy[k].published > 0 ? (cy[k].end - cy[k].published) * 1e3 : 0;
            dig[ns] = cy[k].digest_ms;
            pdig[ns] = cy[k].pub_digest_ms;
            stm[ns] = cy[k].stamp_ms;
            ns++;
        }
    if (ns == 0 && cycles == 1 && cy[0].reports == R && cy[0].transfer > 0) {
        ctrl[0] = cy[0].discover + cy[0].plan;
        gbps[0] = cycle_gbps(&cy[0]);
        ns = 1;
    }
    double steady_ctrl = median(ctrl, ns), steady_gbps = median(gbps, ns), steady_span = median(span, ns),
           steady_xfer = median(xfer, ns), steady_p2c = median(p2c, ns), steady_dig = median(dig, ns),
           steady_pdig = median(pdig, ns), steady_stamp = median(stm, ns);
    uint64_t bytes_per_cycle = cy[0].bytes;
    if (json) {
        printf(
            "{\"verified\":%s,\"cycles\":%" PRIu64 ",\"bytes_per_cycle\":%" PRIu64 ",\"steady_control_ms\":%.3f,"
            "\"steady_transfer_gbps\":%.3f,\"memcpy_gbps\":%.3f,\"transfer_vs_memcpy\":%.3f,"
            "\"steady_span_ms\":%.3f,\"steady_transfer_ms\":%.3f,\"steady_publish_to_commit_ms\":%.3f,"
            "\"steady_digest_ms\":%.3f,\"digest_vs_transfer\":%.3f,\"steady_publisher_digest_ms\":%.3f,"
            "\"digest_bytes_per_cycle\":%" PRIu64 ",\"unverified_bytes_per_cycle\":%" PRIu64 ","
            "\"digest_fused_receivers\":%u,\"steady_stamp_ms\":%.3f,\"stamp_vs_transfer\":%.3f,\"src_device\":%" PRId64
            ",\"dst_device\":%" PRId64 ",\"prepare_ms\":%.3f,\"fp8\":%s,\"transport\":",
            verified ? "true" : "false", cycles, bytes_per_cycle, steady_ctrl, steady_gbps, memcpy_gbps,
            memcpy_gbps > 0 ? steady_gbps / memcpy_gbps : 0, steady_span, steady_xfer, steady_p2c, steady_dig,
            steady_xfer > 0 ? steady_dig / steady_xfer : 0, steady_pdig, cy[cycles - 1].digest_bytes,
            cy[cycles - 1].unverified_bytes, cy[cycles - 1].fused, steady_stamp,
            steady_xfer > 0 ? steady_stamp / steady_xfer : 0, src_device, dst_device, g_prepare_ms,
            fp8 ? "true" : "false");
        tool_json_string(stdout, used_transport[0] ? used_transport : transport);
        printf(",\"lanes\":");
        tool_json_string(stdout, lanes);
        printf(",\"model\":");
        tool_json_string(stdout, model_label);
        printf(",\"src\":");
        tool_json_string(stdout, src_label);
        printf(",\"dst\":");
        tool_json_string(stdout, dst_label);
        printf(",\"publishers\":%u,\"receivers\":%u,\"per_cycle\":[", P, R);
        for (uint64_t k = 0; k < cycles; k++)
            printf("%s{\"version\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"discover_ms\":%.3f,\"plan_ms\":%.3f,"
                   "\"transfer_ms\":%.3f,\"verify_ms\":%.3f,\"total_ms\":%.3f,\"planned\":%s,\"span_ms\":%.3f,"
                   "\"connect_ms\":%.3f,\"launches\":%" PRIu64 ",\"requests\":%" PRIu64 ",\"publish_ms\":%.3f,"
                   "\"fill_ms\":%.3f,\"publish_to_commit_ms\":%.3f,\"delta_pulls\":%u,\"digest_ms\":%.3f,"
                   "\"publisher_digest_ms\":%.3f,\"digest_bytes\":%" PRIu64 ",\"unverified_bytes\":%" PRIu64
                   ",\"stamp_ms\":%.3f,\"publisher_tables_from_delta\":%u}",
                   k ? "," : "", k + 1, cy[k].bytes, cy[k].discover, cy[k].plan, cy[k].transfer, cy[k].verify,
                   cy[k].total, cy[k].planned ? "true" : "false", (cy[k].end - cy[k].begin) * 1e3, cy[k].connect,
                   cy[k].launches, cy[k].requests, cy[k].publish_ms, cy[k].fill_ms,
                   cy[k].published > 0 ? (cy[k].end - cy[k].published) * 1e3 : 0, cy[k].deltas, cy[k].digest_ms,
                   cy[k].pub_digest_ms, cy[k].digest_bytes, cy[k].unverified_bytes, cy[k].stamp_ms,
                   cy[k].tables_from_delta);
        printf("]}\n");
    } else {
        printf("%5s %14s %12s %10s %12s %11s %10s %8s %9s\n", "cycle", "bytes", "discover_ms", "plan_ms", "transfer_ms",
               "verify_ms", "total_ms", "GB/s", "x memcpy");
        for (uint64_t k = 0; k < cycles; k++) {
            double g = cycle_gbps(&cy[k]);
            printf("%5" PRIu64 " %14" PRIu64 " %12.2f %10.2f %12.1f %11.1f %10.1f %8.2f %9.2f%s%s\n", k + 1,
                   cy[k].bytes, cy[k].discover, cy[k].plan, cy[k].transfer, cy[k].verify, cy[k].total, g,
                   memcpy_gbps > 0 ? g / memcpy_gbps : 0, cy[k].deltas ? "  (delta)" : "",
                   cy[k].reports == R ? "" : "  (incomplete)");
        }
        printf(
            "\n(transfer_ms: the slowest receiver's; GB/s: every receiver's bytes from the first transfer's start to\n"
            " the last one's end; control plane: discover + plan, the slowest receiver's)\n");
        printf("steady state (median of cycles 2..%" PRIu64
               "): control plane %.2f ms, transfer %.2f GB/s = %.2f x memcpy\n",
               cycles, steady_ctrl, steady_gbps, memcpy_gbps > 0 ? steady_gbps / memcpy_gbps : 0);
        printf("content digests: %.1f ms per receiver to check (%.2f x transfer), %.1f ms per publisher to compute; "
               "%" PRIu64 " bytes checked, %" PRIu64 " not checkable\n",
               steady_dig, steady_xfer > 0 ? steady_dig / steady_xfer : 0, steady_pdig, cy[cycles - 1].digest_bytes,
               cy[cycles - 1].unverified_bytes);
        if (cy[cycles - 1].digest_bytes)
            printf(
                "  %u of %u receivers hashed their bytes while copying them (inside transfer_ms; the others in a pass "
                "of their own, inside the check); bench/digest-ab.sh measures digests on against off\n",
                cy[cycles - 1].fused, R);
        printf("version stamps: %.2f ms per receiver to read every source's, before and after (%.4f x transfer)\n",
               steady_stamp, steady_xfer > 0 ? steady_stamp / steady_xfer : 0);
        printf("transport %s (%s)\n", used_transport[0] ? used_transport : transport, lanes);
        printf("%s\n", verified ? "verified: every byte of every receiver in every cycle matched the synthetic truth"
                                : "FAILED: see the messages above");
    }
    free(kids);
    free(cy);
    if (tmpdir[0]) remove_tree(tmpdir);
    if (secret_dir[0]) remove_tree(secret_dir);
    return verified ? 0 : 1;
early:
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
    return 1;
}
