/* refit preflight: checks a trainer or rollout host (or its container)
 * before a job, with the registry and transport options the job will use,
 * and says for each check pass, warn, fail or skip, with a one-line remedy.
 *
 * Every check does the real thing where it can: the registry is opened and
 * a probe lease written, read back (its HMAC checked) and deleted under the
 * job; shm and UCX publishers and receivers are made in this process, over
 * a private registry, and one version of a tiny model is pulled through each
 * (the lanes UCX picked come from that pull's report); the plan is computed
 * from the layouts.  The rest reads the kernel (limits, capabilities,
 * /sys/class/infiniband, /proc/meminfo, cgroups, statvfs of /dev/shm) and,
 * built with CUDA, the GPUs.  docs/operations.md explains each line.
 *
 * Exit status: 0 when nothing failed (warnings allowed), 1 when a check
 * failed, 2 for a usage error. */
#include "preflight.h"

static const char *const g_verdict[] = {"pass", "warn", "fail", "skip"};

TOOL_PRINTF(4, 0) static void vput(pf_t *p, const char *name, verdict_t v, const char *fmt, va_list ap)
{
    if (p->n == MAX_CHECKS) return;
    check_t *c = &p->checks[p->n++];
    c->name = name;
    c->v = v;
    vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
    c->remedy[0] = '\0';
}

/* Adds a check; pf_remedy() then sets the remedy of the last one. */
TOOL_PRINTF(4, 5) void pf_put(pf_t *p, const char *name, verdict_t v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(p, name, v, fmt, ap);
    va_end(ap);
}

TOOL_PRINTF(2, 3) void pf_remedy(pf_t *p, const char *fmt, ...)
{
    if (!p->n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->checks[p->n - 1].remedy, sizeof(p->checks[0].remedy), fmt, ap);
    va_end(ap);
}

const char *pf_fmt_bytes(uint64_t b, char *buf, size_t n)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 5) x /= 1024, i++;
    if (i == 0) snprintf(buf, n, "%" PRIu64 " B", b);
    else snprintf(buf, n, "%.1f %s", x, u[i]);
    return buf;
}

/* The value of `key` in a "a.b=v,c=w" option list (malloc'ed) or NULL. */
char *pf_option(const char *opts, const char *key)
{
    if (!opts) return NULL;
    size_t kl = strlen(key);
    for (const char *s = opts; *s;) {
        const char *e = s + strcspn(s, ",");
        if ((size_t)(e - s) > kl && !strncmp(s, key, kl) && s[kl] == '=') {
            size_t vl = (size_t)(e - s) - kl - 1;
            char *v = malloc(vl + 1);
            if (v) {
                memcpy(v, s + kl + 1, vl);
                v[vl] = '\0';
            }
            return v;
        }
        s = *e ? e + 1 : e;
    }
    return NULL;
}

static bool list_has(const char *list, const char *name)
{
    size_t nl = strlen(name);
    for (const char *s = list; *s;) {
        const char *e = s + strcspn(s, ",");
        if ((size_t)(e - s) == nl && !strncmp(s, name, nl)) return true;
        s = *e ? e + 1 : e;
    }
    return false;
}

/* ---- transports ------------------------------------------------------------ */

static void check_transports(pf_t *p)
{
    const char *asked = p->transports ? p->transports : (p->device >= 0 ? "cuda_ipc" : "shm,ucx");
    char built[64] = "shm";
    if (refit_transport_built("ucx")) strcat(built, ", ucx");
    if (refit_transport_built("cuda_ipc")) strcat(built, ", cuda_ipc");
    char missing[128] = "";
    for (const char *s = asked; *s;) {
        const char *e = s + strcspn(s, ",");
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)(e - s), s);
        if (!refit_transport_built(name))
            snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     name);
        s = *e ? e + 1 : e;
    }
    p->want_shm = list_has(asked, "shm");
    p->want_ucx = list_has(asked, "ucx");
    if (missing[0]) {
        pf_put(p, "transports", FAIL, "asked for %s; not built into this refit: %s (built in: %s)", asked, missing,
               built);
        pf_remedy(
            p, "install libucx-dev (UCX) or CUDA and rebuild refit (scripts/build.sh), or drop them from --transports");
        p->want_ucx = p->want_ucx && refit_transport_built("ucx");
    } else pf_put(p, "transports", PASS, "asked for %s; built in: %s", asked, built);
}

/* One version of a tiny model through a publisher and a receiver of this
 * process over `transport`, a private file registry and a fresh secret in
 * tmpdir: *rep is the receiver's report.  The detail of a failure is left
 * in refit_last_error(). */
refit_status_t pf_loopback(const char *transport, const char *topts, const char *tmpdir, refit_pull_report_t *rep)
{
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *layout = NULL;
    refit_manifest_t *pm = NULL, *fm = NULL, *rm = NULL;
    refit_publisher_t *pub = NULL;
    refit_receiver_t *rx = NULL;
    void *pb, *rb;
    char url[4200], secret[4200], job[32];
    snprintf(url, sizeof(url), "file:%s/registry", tmpdir);
    snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
    snprintf(job, sizeof(job), "loopback-%s", transport);
    if ((st = refit_model_open("tiny-tied", &model)) || (st = refit_layout_parse("hf", &layout)) ||
        (st = refit_layout_manifest(layout, model, 0, &pm)) || (st = refit_layout_manifest(layout, model, 0, &fm)) ||
        (st = refit_layout_manifest(layout, model, 0, &rm)))
        goto out;
    refit_publisher_params_t pp = REFIT_PUBLISHER_PARAMS_INIT;
    pp.registry = url;
    pp.job = job;
    pp.transports = transport;
    pp.transport_options = topts;
    pp.secret_file = secret;
    if ((st = refit_publisher_create(&pp, pm, &pub))) goto out;
    pm = NULL; /* the publisher's */
    if ((st = refit_publisher_alloc(pub, 0, &pb)) || (st = refit_truth_fill(fm, &pb, 1)) ||
        (st = refit_publisher_publish(pub, 1)))
        goto out;
    refit_receiver_params_t rp = REFIT_RECEIVER_PARAMS_INIT;
    rp.registry = url;
    rp.job = job;
    rp.transports = transport;
    rp.transport_options = topts;
    rp.secret_file = secret;
    rp.verify = REFIT_VERIFY_TRUTH;
    if ((st = refit_receiver_create(&rp, rm, &rx))) goto out;
    rm = NULL;
    if ((st = refit_receiver_alloc(rx, 0, &rb))) goto out;
    st = refit_receiver_pull(rx, 1, 10000, rep);
out:
    refit_receiver_destroy(rx);
    refit_publisher_destroy(pub);
    refit_manifest_destroy(pm);
    refit_manifest_destroy(fm);
    refit_manifest_destroy(rm);
    refit_layout_destroy(layout);
    refit_model_destroy(model);
    return st;
}

static bool make_tmpdir(char *dir, size_t n)
{
    snprintf(dir, n, "%s/refit-preflight-XXXXXX", getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return false;
    char path[4200];
    snprintf(path, sizeof(path), "%s/secret", dir);
    unsigned char key[32];
    int r = open("/dev/urandom", O_RDONLY | O_CLOEXEC), fd = -1;
    bool ok = r >= 0 && read(r, key, sizeof(key)) == (ssize_t)sizeof(key) &&
              (fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) >= 0 &&
              write(fd, key, sizeof(key)) == (ssize_t)sizeof(key);
    if (r >= 0) close(r);
    if (fd >= 0) close(fd);
    return ok;
}

static void rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[4200];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            struct stat sb;
            if (!lstat(sub, &sb) && S_ISDIR(sb.st_mode)) rm_tree(sub);
            else unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

/* ---- output ---------------------------------------------------------------------------------- */

static void print_human(const pf_t *p, int counts[4])
{
    char *shown = refit_redact_url(pf_registry_url(p));
    printf("refit preflight: job %s, registry %s, %s", p->job, shown ? shown : "?", p->trainer ? "trainer" : "rollout");
    if (p->model) {
        printf(" ranks");
        for (uint32_t i = 0; i < p->nranks; i++) printf("%s%u", i ? "," : " ", p->rank_list[i]);
    }
    printf(", transports %s%s%s\n\n", p->transports ? p->transports : "(default)", p->topts ? ", options " : "",
           p->topts ? p->topts : "");
    free(shown);
    printf("%-16s %-5s %s\n", "CHECK", "", "DETAIL");
    for (size_t i = 0; i < p->n; i++) {
        const check_t *c = &p->checks[i];
        printf("%-16s %-5s %s\n", c->name, g_verdict[c->v], c->detail);
        if (c->remedy[0]) printf("%-16s %-5s -> %s\n", "", "", c->remedy);
    }
    printf("\n%d pass, %d warn, %d fail, %d skip: %s\n", counts[PASS], counts[WARN], counts[FAIL], counts[SKIP],
           counts[FAIL]   ? "NOT ready (fix each fail above)"
           : counts[WARN] ? "ready, with warnings"
                          : "ready");
}

static void print_json(const pf_t *p, int counts[4])
{
    char *shown = refit_redact_url(pf_registry_url(p));
    printf("{\"ok\":%s,\"job\":", counts[FAIL] ? "false" : "true");
    tool_json_string(stdout, p->job);
    printf(",\"registry\":");
    tool_json_string(stdout, shown ? shown : "?");
    printf(",\"role\":\"%s\",\"ranks\":[", p->trainer ? "trainer" : "rollout");
    for (uint32_t i = 0; p->model && i < p->nranks; i++) printf("%s%u", i ? "," : "", p->rank_list[i]);
    printf("],\"host_bytes\":%" PRIu64 ",\"checks\":[", p->host_bytes);
    free(shown);
    for (size_t i = 0; i < p->n; i++) {
        const check_t *c = &p->checks[i];
        printf("%s{\"name\":", i ? "," : "");
        tool_json_string(stdout, c->name);
        printf(",\"status\":\"%s\",\"detail\":", g_verdict[c->v]);
        tool_json_string(stdout, c->detail);
        printf(",\"remedy\":");
        tool_json_string(stdout, c->remedy);
        printf("}");
    }
    printf("],\"pass\":%d,\"warn\":%d,\"fail\":%d,\"skip\":%d}\n", counts[PASS], counts[WARN], counts[FAIL],
           counts[SKIP]);
}

int cmd_preflight(int argc, char **argv); /* called by tools/refit.c */
int cmd_preflight(int argc, char **argv)
{
    static pf_t pf; /* large */
    pf_t *p = &pf;
    memset(p, 0, sizeof(*p));
    p->device = -1;
    p->job = "default";
    enum {
        O_REGISTRY = 1,
        O_JOB,
        O_TRANSPORTS,
        O_TOPTS,
        O_DEVICE,
        O_MODEL,
        O_SRC,
        O_DST,
        O_RANKS,
        O_ROLE,
        O_MODE,
        O_SHM_NEED,
        O_JSON,
        O_HELP
    };
    static const struct option opts[] = {{"registry", required_argument, 0, O_REGISTRY},
                                         {"job", required_argument, 0, O_JOB},
                                         {"transports", required_argument, 0, O_TRANSPORTS},
                                         {"transport-options", required_argument, 0, O_TOPTS},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"model", required_argument, 0, O_MODEL},
                                         {"src", required_argument, 0, O_SRC},
                                         {"dst", required_argument, 0, O_DST},
                                         {"ranks", required_argument, 0, O_RANKS},
                                         {"role", required_argument, 0, O_ROLE},
                                         {"mode", required_argument, 0, O_MODE},
                                         {"shm-need", required_argument, 0, O_SHM_NEED},
                                         {"json", no_argument, 0, O_JSON},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    int c;
    uint64_t u;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_REGISTRY: p->registry = optarg; break;
        case O_JOB: p->job = optarg; break;
        case O_TRANSPORTS: p->transports = optarg; break;
        case O_TOPTS: p->topts = optarg; break;
        case O_DEVICE:
            if (tool_parse_u64(optarg, &u) || u > 1024)
                return tool_usage("preflight", "--device takes a CUDA device number");
            p->device = (int)u;
            break;
        case O_MODEL: p->model = optarg; break;
        case O_SRC: p->src = optarg; break;
        case O_DST: p->dst = optarg; break;
        case O_RANKS: p->ranks = optarg; break;
        case O_ROLE:
            if (!strcmp(optarg, "trainer")) p->trainer = true;
            else if (strcmp(optarg, "rollout")) return tool_usage("preflight", "--role is trainer or rollout");
            p->role = optarg;
            break;
        case O_MODE:
            if (!strcmp(optarg, "snapshot")) p->snapshot = true;
            else if (strcmp(optarg, "in-place")) return tool_usage("preflight", "--mode is in-place or snapshot");
            break;
        case O_SHM_NEED:
            if (tool_parse_u64(optarg, &p->shm_need) || !p->shm_need)
                return tool_usage("preflight", "--shm-need takes a positive number of bytes");
            break;
        case O_JSON: p->json = true; break;
        case O_HELP:
            printf(
                "usage: refit preflight [--registry URL] [--job J] [--transports LIST] [--transport-options OPTS]\n"
                "                       [--device N] [--model M --src LAYOUT --dst LAYOUT [--role trainer|rollout]\n"
                "                       [--ranks R,S-T|all] [--mode in-place|snapshot]] [--shm-need BYTES] [--json]\n"
                "checks this host for a job with those options; exit 1 if a check fails (docs/operations.md)\n");
            return 0;
        default: return tool_usage("preflight", "unknown option (refit preflight --help)");
        }
    }
    if (optind < argc) return tool_usage("preflight", "unexpected argument");
    if ((p->src || p->dst || p->ranks) && !(p->model && p->src && p->dst))
        return tool_usage("preflight", "--src, --dst and --ranks go with --model, --src and --dst together");
    if (p->model && !(p->src && p->dst)) return tool_usage("preflight", "--model needs --src and --dst");
    char *v = pf_option(p->topts, "ucx.require");
    p->require_rdma = v && !strcmp(v, "rdma");
    free(v);

    char tmpdir[4096];
    if (!make_tmpdir(tmpdir, sizeof(tmpdir))) {
        fprintf(stderr, "refit preflight: cannot make a private temporary directory under %s: %s\n",
                getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", strerror(errno));
        return 1;
    }
    /* The loopback refits below are probes, not the job: they must not
     * overwrite the job's metrics textfile or take its metrics port. */
    unsetenv("REFIT_METRICS_FILE");
    unsetenv("REFIT_METRICS_ADDR");
    /* UCX (1.13) logs its warnings to stdout: while the checks run, stdout
     * is stderr, so that the table and --json stay clean. */
    fflush(stdout);
    int saved_stdout = dup(STDOUT_FILENO);
    if (saved_stdout >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
    check_transports(p);
    check_plan(p);
    check_memory(p);
    check_memlock(p);
    check_dev_shm(p);
    check_shm(p, tmpdir);
    check_ucx(p, tmpdir);
    check_rdma(p);
    check_tcp_cc(p);
    check_gpus(p);
    bool reachable = check_registry(p, tmpdir);
    check_auth(p, reachable);
    check_clock(p, reachable);
    rm_tree(tmpdir);
    fflush(stdout);
    if (saved_stdout >= 0) {
        dup2(saved_stdout, STDOUT_FILENO);
        close(saved_stdout);
    }

    int counts[4] = {0};
    for (size_t i = 0; i < p->n; i++) counts[p->checks[i].v]++;
    if (p->json) print_json(p, counts);
    else print_human(p, counts);
    return counts[FAIL] ? 1 : 0;
}
