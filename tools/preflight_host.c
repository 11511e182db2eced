/* refit preflight: the checks of this host (tools/preflight.h): /dev/shm and a
 * loopback pull over shm, GPUs and their peer access, memory limits, the plan. */
#include "preflight.h"

/* The socket directory the shm transport will use (util/userdir.h, as
 * shm.c); false when it is each job's own, named from the job's key. */
static bool shm_dir(const pf_t *p, char *out, size_t n)
{
    char *opt = pf_option(p->topts, "shm.dir");
    bool named = refit_runtime_dir(opt, out, n, NULL);
    free(opt);
    return named;
}

void check_shm(pf_t *p, const char *tmpdir)
{
    char dir[4096];
    struct stat sb;
    if (!shm_dir(p, dir, sizeof(dir))) {
        pf_put(p, "shm runtime dir", PASS,
               "no REFIT_RUNTIME_DIR or XDG_RUNTIME_DIR: each job's publishers use /tmp/refit-%u-<hex>, named from "
               "the job's secret (made 0700 at the first publish, removed with the last)",
               (unsigned)geteuid());
    } else if (lstat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            pf_put(p, "shm runtime dir", FAIL, "%s is %s of uid %u, mode %04o: shm publishers refuse it", dir,
                   S_ISDIR(sb.st_mode) ? "a directory" : "not a directory", (unsigned)sb.st_uid,
                   (unsigned)(sb.st_mode & 07777));
            pf_remedy(p, "chmod 700 %s (owned by uid %u), or point REFIT_RUNTIME_DIR / shm.dir= at a private directory",
                      dir, (unsigned)geteuid());
        } else pf_put(p, "shm runtime dir", PASS, "%s: ours, mode %04o", dir, (unsigned)(sb.st_mode & 07777));
    } else pf_put(p, "shm runtime dir", PASS, "%s does not exist yet; the first shm publisher creates it (0700)", dir);
    if (!p->want_shm) {
        pf_put(p, "shm loopback", SKIP, "shm is not among the transports");
        return;
    }
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    refit_status_t st = pf_loopback("shm", p->topts, tmpdir, &rep);
    if (st) {
        pf_put(p, "shm loopback", FAIL, "a publisher and a receiver of this process over shm: %s (%s)",
               refit_last_error(), refit_status_name(st));
        pf_remedy(p, "fix the shm runtime dir above; in a container, run every rank of the host as the same user");
    } else
        pf_put(p, "shm loopback", PASS, "one version of tiny-tied over shm (%s), verified, in %.0f ms", rep.lanes,
               (refit_now() - t0) * 1e3);
}

/* ---- GPUs ------------------------------------------------------------------------ */

/* "nvidia-smi topo -m": the link between GPU a and b ("NV18", "SYS", ...), or "". */
static void gpu_links(int n, char out[][8][8])
{
    for (int a = 0; a < n && a < 8; a++)
        for (int b = 0; b < n && b < 8; b++) out[a][b][0] = '\0';
    FILE *f = popen("nvidia-smi topo -m 2>/dev/null", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        int a;
        if (sscanf(line, "GPU%d", &a) != 1 || a < 0 || a >= n || a >= 8) continue;
        char *save = NULL, *tok = strtok_r(line, " \t\n", &save); /* GPUa */
        for (int b = 0; b < n && b < 8 && (tok = strtok_r(NULL, " \t\n", &save)); b++)
            snprintf(out[a][b], sizeof(out[a][b]), "%s", tok);
    }
    pclose(f);
}

void check_gpus(pf_t *p)
{
    if (!(refit_features() & REFIT_FEATURE_CUDA)) {
        if (p->device >= 0) {
            pf_put(p, "gpus", FAIL, "--device %d asked, but this refit was built without CUDA", p->device);
            pf_remedy(p, "rebuild with the CUDA toolkit on PATH (REFIT_WITH_CUDA=ON)");
        } else pf_put(p, "gpus", SKIP, "built without CUDA (host-memory jobs only)");
        pf_put(p, "gpu peer access", SKIP, "built without CUDA");
        return;
    }
    int n = refit_gpu_count();
    if (n == 0) {
        if (p->device >= 0) {
            pf_put(p, "gpus", FAIL, "--device %d asked, but no CUDA device is usable here", p->device);
            pf_remedy(p, "request GPUs for the pod (nvidia.com/gpu) and check the driver (nvidia-smi)");
        } else pf_put(p, "gpus", SKIP, "no CUDA device here (host-memory job)");
        return;
    }
    if (p->device >= n) {
        pf_put(p, "gpus", FAIL, "--device %d asked, %d device%s here", p->device, n, n == 1 ? "" : "s");
        pf_remedy(p, "use a device below %d (CUDA_VISIBLE_DEVICES renumbers them)", n);
        return;
    }
    char names[400] = "";
    for (int d = 0; d < n && d < 8; d++) {
        refit_gpu_info_t gi;
        if (!refit_gpu_info(d, &gi))
            snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%d: %s", d ? ", " : "", d, gi.name);
    }
    pf_put(p, "gpus", PASS, "%d device%s: %s%s", n, n == 1 ? "" : "s", names, n > 8 ? ", ..." : "");
    if (n < 2) {
        pf_put(p, "gpu peer access", SKIP, "one device: no peer copies");
        return;
    }
    char links[8][8][8];
    gpu_links(n, links);
    char desc[600] = "";
    int denied = 0, nvlink = 0, pairs = 0;
    for (int a = 0; a < n && a < 8; a++)
        for (int b = a + 1; b < n && b < 8; b++) {
            bool ok = refit_gpu_can_access_peer(a, b) && refit_gpu_can_access_peer(b, a);
            pairs++;
            denied += !ok;
            nvlink += !strncmp(links[a][b], "NV", 2);
            snprintf(desc + strlen(desc), sizeof(desc) - strlen(desc), "%s%d-%d %s%s%s", desc[0] ? ", " : "", a, b,
                     ok ? "p2p" : "NO p2p", links[a][b][0] ? " " : "", links[a][b]);
        }
    pf_put(p, "gpu peer access",
           denied            ? FAIL
           : nvlink == pairs ? PASS
                             : WARN,
           "%s%s", desc, links[0][1][0] ? "" : " (no nvidia-smi: NVLink topology unknown)");
    if (denied)
        pf_remedy(p, "cuda_ipc needs peer access between the GPUs of a host: check IOMMU/ACS settings and that the "
                     "container sees every GPU of the job");
    else if (nvlink < pairs)
        pf_remedy(p, "pairs without NVLink copy over PCIe (several times slower); place publishers and receivers on "
                     "NVLink-connected GPUs");
}

/* ---- memory limits ------------------------------------------------------------------ */

static bool has_cap_ipc_lock(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return false;
    char line[256];
    unsigned long long eff = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1) break;
    fclose(f);
    return (eff >> 14) & 1; /* CAP_IPC_LOCK */
}

void check_memlock(pf_t *p)
{
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[32], need[32];
    if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof(lim), "unlimited");
    else pf_fmt_bytes(rl.rlim_cur, lim, sizeof(lim));
    bool cap = has_cap_ipc_lock();
    /* Pinned by the job: memory registered with RDMA NICs (UCX over rc/dc
     * registers what it sends and receives).  UCX over TCP and shm pin nothing; CUDA's pinned
     * staging is not counted against RLIMIT_MEMLOCK. */
    bool rdma_pins = p->want_ucx && (p->require_rdma || access("/sys/class/infiniband", F_OK) == 0);
    uint64_t want = rdma_pins ? p->host_bytes : 0;
    if (cap) {
        pf_put(p, "memlock", PASS, "CAP_IPC_LOCK held: no limit on pinned memory (RLIMIT_MEMLOCK %s)", lim);
        return;
    }
    if (!rdma_pins) {
        pf_put(p, "memlock", PASS, "RLIMIT_MEMLOCK %s, no CAP_IPC_LOCK; nothing is pinned without RDMA lanes", lim);
        return;
    }
    if (!p->host_bytes) {
        bool small = rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (1ull << 30);
        pf_put(p, "memlock", small ? WARN : PASS,
               "RLIMIT_MEMLOCK %s, no CAP_IPC_LOCK; RDMA registers the job's memory "
               "(give --model/--src/--dst/--ranks to compare with its bytes)",
               lim);
        if (small)
            pf_remedy(p, "add the IPC_LOCK capability to the container or raise `ulimit -l` (memlock) to unlimited");
        return;
    }
    pf_fmt_bytes(want, need, sizeof(need));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        pf_put(p, "memlock", FAIL, "RLIMIT_MEMLOCK %s < %s this host's ranks register for RDMA, and no CAP_IPC_LOCK",
               lim, need);
        pf_remedy(p, "add capabilities: [IPC_LOCK] to the container, or raise the memlock limit (ulimit -l unlimited, "
                     "LimitMEMLOCK=infinity, docker --ulimit memlock=-1)");
    } else pf_put(p, "memlock", PASS, "RLIMIT_MEMLOCK %s >= %s to register", lim, need);
}

/* Bytes of memory this process may still take: MemAvailable, and the
 * cgroup's limit less its usage where one is set (v2, then v1). */
static uint64_t memory_available(char *where, size_t n)
{
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (uint64_t)kb * 1024;
        fclose(f);
    }
    snprintf(where, n, "MemAvailable");
    static const char *const lim[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    static const char *const use[] = {"/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"};
    for (int i = 0; i < 2; i++) {
        unsigned long long l = 0, u = 0;
        FILE *a = fopen(lim[i], "r"), *b = fopen(use[i], "r");
        bool ok = a && b && fscanf(a, "%llu", &l) == 1 && fscanf(b, "%llu", &u) == 1;
        if (a) fclose(a);
        if (b) fclose(b);
        if (ok && l > u && l < (1ull << 60) && l - u < avail) {
            avail = l - u;
            snprintf(where, n, "the cgroup's limit (%s)", lim[i]);
        }
        if (ok) break;
    }
    return avail;
}

void check_memory(pf_t *p)
{
    char where[128], a[32], need[32];
    uint64_t avail = memory_available(where, sizeof(where));
    pf_fmt_bytes(avail, a, sizeof(a));
    if (!p->host_bytes) {
        pf_put(p, "memory", PASS, "%s free by %s (give --model/--src/--dst/--ranks to compare with the job's bytes)", a,
               where);
        return;
    }
    /* A trainer rank's memory, and in snapshot mode its two staging arenas;
     * a rollout rank's memory (a GPU receiver's pinned staging when it pulls
     * through host transports). */
    uint64_t want = p->host_bytes * (p->trainer && p->snapshot ? 3 : 1);
    pf_fmt_bytes(want, need, sizeof(need));
    if (want > avail) {
        pf_put(p, "memory", FAIL, "this host's ranks need %s of host memory (shm memfds%s), %s free by %s", need,
               p->trainer && p->snapshot ? " with two snapshot arenas" : "", a, where);
        pf_remedy(p, "raise the container's memory limit (shm memfds count against it) or place fewer ranks per host");
    } else
        pf_put(p, "memory", want > avail / 10 * 8 ? WARN : PASS,
               "this host's ranks need %s of host memory, %s free by %s", need, a, where);
    if (p->checks[p->n - 1].v == WARN) pf_remedy(p, "less than 20%% would be left: raise the memory limit");
}

void check_dev_shm(pf_t *p)
{
    struct statvfs vs;
    char size[32], fr[32], need[32];
    if (statvfs("/dev/shm", &vs) != 0) {
        pf_put(p, "/dev/shm", FAIL, "/dev/shm: %s", strerror(errno));
        pf_remedy(p, "mount a tmpfs on /dev/shm (Kubernetes: an emptyDir with medium: Memory)");
        return;
    }
    uint64_t total = (uint64_t)vs.f_blocks * vs.f_frsize, free_b = (uint64_t)vs.f_bavail * vs.f_frsize;
    uint64_t want = p->shm_need ? p->shm_need : 64ull << 20;
    pf_fmt_bytes(total, size, sizeof(size));
    pf_fmt_bytes(free_b, fr, sizeof(fr));
    pf_fmt_bytes(want, need, sizeof(need));
    /* refit's own shm transport uses memfds, which /dev/shm's size does not
     * bound; NCCL, vLLM's shared-memory broadcast and PyTorch's data loaders
     * write /dev/shm and die with SIGBUS when it is full. */
    if (free_b < want) {
        pf_put(p, "/dev/shm", FAIL, "%s free of %s, below %s%s", fr, size, need,
               p->shm_need ? " (--shm-need)" : " (Docker's default size: NCCL and vLLM fail with SIGBUS)");
        pf_remedy(
            p, "mount a larger /dev/shm: Kubernetes emptyDir {medium: Memory, sizeLimit: 2Gi}, docker --shm-size=2g");
    } else if (!p->shm_need && free_b < (1ull << 30)) {
        pf_put(p, "/dev/shm", WARN, "%s free of %s (refit's shm transport needs none: memfds; NCCL and vLLM do)", fr,
               size);
        pf_remedy(p, "give NCCL and vLLM at least 1 GiB of /dev/shm");
    } else
        pf_put(p, "/dev/shm", PASS, "%s free of %s (refit's shm transport needs none: memfds; NCCL and vLLM do)", fr,
               size);
}

/* ---- the plan ------------------------------------------------------------------------ */

static refit_status_t parse_ranks(pf_t *p, uint32_t world)
{
    p->nranks = 0;
    const char *s = p->ranks ? p->ranks : "0";
    if (!strcmp(s, "all")) {
        for (uint32_t r = 0; r < world && p->nranks < 256; r++) p->rank_list[p->nranks++] = r;
        return world <= 256 ? REFIT_OK
                            : refit_error(REFIT_ERR_INVALID_ARG, "--ranks all: %u ranks, at most 256 per host", world);
    }
    while (*s) {
        char *end;
        errno = 0;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (end == s || errno)
            return refit_error(REFIT_ERR_INVALID_ARG, "--ranks %s: expected R, R-S or all", p->ranks);
        if (*end == '-') {
            const char *t = end + 1;
            b = strtoul(t, &end, 10);
            if (end == t || b < a) return refit_error(REFIT_ERR_INVALID_ARG, "--ranks %s: bad range", p->ranks);
        }
        if (b >= world)
            return refit_error(REFIT_ERR_INVALID_ARG, "--ranks %s: rank %lu is not below the %s layout's %u ranks",
                               p->ranks, b, p->trainer ? "trainer" : "rollout", world);
        for (unsigned long r = a; r <= b; r++) {
            if (p->nranks == 256) return refit_error(REFIT_ERR_INVALID_ARG, "--ranks: at most 256 per host");
            p->rank_list[p->nranks++] = (uint32_t)r;
        }
        if (*end == ',') end++;
        else if (*end) return refit_error(REFIT_ERR_INVALID_ARG, "--ranks %s: expected R, R-S or all", p->ranks);
        s = end;
    }
    return REFIT_OK;
}

void check_plan(pf_t *p)
{
    if (!p->model) {
        pf_put(p, "plan", SKIP, "no --model/--src/--dst: the plan and the job's bytes are not checked");
        return;
    }
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *src = NULL, *dst = NULL;
    tool_local_set_t set = {0};
    char what[64] = "--model";
    if ((st = refit_model_open(p->model, &model))) goto fail;
    snprintf(what, sizeof(what), "--src");
    if ((st = refit_layout_parse(p->src, &src)) || (st = refit_layout_check(src, model))) goto fail;
    snprintf(what, sizeof(what), "--dst");
    if ((st = refit_layout_parse(p->dst, &dst)) || (st = refit_layout_check(dst, model))) goto fail;
    snprintf(what, sizeof(what), "--ranks");
    if ((st = parse_ranks(p, refit_layout_world(p->trainer ? src : dst)))) goto fail;
    snprintf(what, sizeof(what), "the trainer layout's manifests");
    if ((st = tool_local_set_create(model, src, false, 1, &set))) goto fail;
    /* This host's bytes: the memory its ranks hold (regions, padding included). */
    p->host_bytes = 0;
    for (uint32_t i = 0; i < p->nranks; i++) {
        refit_manifest_t *m = NULL;
        if ((st = refit_layout_manifest(p->trainer ? src : dst, model, p->rank_list[i], &m))) goto fail;
        for (uint32_t r = 0; r < refit_manifest_num_regions(m); r++) p->host_bytes += refit_manifest_region_size(m, r);
        refit_manifest_destroy(m);
    }
    /* Rollout ranks: each one's plan.  Trainer ranks: every rollout rank's
     * plan (the trainer layout must cover them all). */
    uint32_t n = p->trainer ? refit_layout_world(dst) : p->nranks;
    uint64_t written = 0, read = 0, redundant = 0;
    size_t regions = 0, sources = 0;
    double plan_ms = 0;
    char per[300] = "";
    refit_plan_params_t pp = REFIT_PLAN_PARAMS_INIT;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = p->trainer ? i : p->rank_list[i];
        refit_manifest_t *dm = NULL;
        tool_local_result_t res;
        snprintf(what, sizeof(what), "rollout rank %u", r);
        if ((st = refit_layout_manifest(dst, model, r, &dm))) goto fail;
        st = tool_local_run(&set, dm, false, 1, &pp, NULL, &res);
        refit_manifest_destroy(dm);
        if (st) goto fail;
        written += res.stats.bytes_written;
        read += res.stats.bytes_read;
        redundant += res.stats.bytes_redundant;
        regions += res.stats.regions;
        sources = TOOL_MAX(sources, res.stats.sources_used);
        plan_ms = TOOL_MAX(plan_ms, res.stats.plan_ms);
        char b[32];
        if (!p->trainer && strlen(per) < sizeof(per) - 80)
            snprintf(per + strlen(per), sizeof(per) - strlen(per), "%srank %u: %s from %zu sources in %zu regions",
                     i ? "; " : "", r, pf_fmt_bytes(res.stats.bytes_written, b, sizeof(b)), res.stats.sources_used,
                     res.stats.regions);
    }
    char wb[32], hb[32];
    pf_fmt_bytes(written, wb, sizeof(wb));
    pf_fmt_bytes(p->host_bytes, hb, sizeof(hb));
    if (p->trainer)
        pf_put(p, redundant ? "plan" : "plan", redundant ? WARN : PASS,
               "%s -> %s of %s: this host's %u trainer rank%s hold %s; all %u rollout ranks plan from them (%s read, "
               "redundant %" PRIu64 " bytes, up to %zu sources, %.1f ms)",
               refit_layout_string(src), refit_layout_string(dst), refit_model_name(model), p->nranks,
               p->nranks == 1 ? "" : "s", hb, n, wb, redundant, sources, plan_ms);
    else
        pf_put(p, "plan", redundant ? WARN : PASS,
               "%s -> %s of %s: this host's %u rollout rank%s pull %s (%s read, redundant %" PRIu64 " bytes) in %zu "
               "regions, %.1f ms to plan: %s",
               refit_layout_string(src), refit_layout_string(dst), refit_model_name(model), p->nranks,
               p->nranks == 1 ? "" : "s", wb, pf_fmt_bytes(read, hb, sizeof(hb)), redundant, regions, plan_ms, per);
    if (redundant) pf_remedy(p, "bytes read twice: report the layouts (refit plan --json shows the ranks)");
    goto out;
fail:
    pf_put(p, "plan", FAIL, "%s: %s (%s)", what, refit_last_error()[0] ? refit_last_error() : refit_status_message(st),
           refit_status_name(st));
    pf_remedy(p,
              "check --model/--src/--dst/--ranks against the job (`refit plan --model M --src L --dst L --all-ranks`)");
    p->host_bytes = 0;
out:
    tool_local_set_destroy(&set);
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
}
