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
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "engine/engine.h"
#include "plan/local.h"
#include "registry/registry.h"
#include "tool.h"
#include "transport/transport.h"
#include "util/util.h"
#ifdef REFIT_HAVE_CUDA
#include "transport/cuda/gpu.h"
#endif
#ifdef REFIT_HAVE_REDIS
#include <hiredis.h>
#endif

typedef enum { PASS, WARN, FAIL, SKIP } verdict_t;
static const char *const g_verdict[] = {"pass", "warn", "fail", "skip"};

#define MAX_CHECKS 32
typedef struct {
    const char *name;
    verdict_t v;
    char detail[640];
    char remedy[400];
} check_t;

typedef struct {
    const char *registry, *job, *transports, *topts, *model, *src, *dst, *ranks, *role;
    int device; /* -1: none asked */
    bool json, snapshot;
    uint64_t shm_need;
    /* derived */
    bool trainer;
    uint32_t rank_list[256];
    uint32_t nranks;
    uint64_t host_bytes; /* bytes this host's ranks hold (0: unknown) */
    bool want_ucx, want_shm, require_rdma;
    check_t checks[MAX_CHECKS];
    size_t n;
} pf_t;

REFIT_PRINTF(4, 0) static void vput(pf_t *p, const char *name, verdict_t v, const char *fmt, va_list ap)
{
    if (p->n == MAX_CHECKS) return;
    check_t *c = &p->checks[p->n++];
    c->name = name;
    c->v = v;
    vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
    c->remedy[0] = '\0';
}

/* Adds a check; remedy() then sets the remedy of the last one. */
REFIT_PRINTF(4, 5) static void put(pf_t *p, const char *name, verdict_t v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(p, name, v, fmt, ap);
    va_end(ap);
}

REFIT_PRINTF(2, 3) static void remedy(pf_t *p, const char *fmt, ...)
{
    if (!p->n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->checks[p->n - 1].remedy, sizeof(p->checks[0].remedy), fmt, ap);
    va_end(ap);
}

static const char *fmt_bytes(uint64_t b, char *buf, size_t n)
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
static char *option(const char *opts, const char *key)
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
    if (refit_transport_find("ucx")) strcat(built, ", ucx");
    if (refit_transport_find("cuda_ipc")) strcat(built, ", cuda_ipc");
    char missing[128] = "";
    for (const char *s = asked; *s;) {
        const char *e = s + strcspn(s, ",");
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)(e - s), s);
        if (!refit_transport_find(name))
            snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s", missing[0] ? ", " : "", name);
        s = *e ? e + 1 : e;
    }
    p->want_shm = list_has(asked, "shm");
    p->want_ucx = list_has(asked, "ucx");
    if (missing[0]) {
        put(p, "transports", FAIL, "asked for %s; not built into this refit: %s (built in: %s)", asked, missing, built);
        remedy(p, "install libucx-dev (UCX) or CUDA and rebuild refit (scripts/build.sh), or drop them from --transports");
        p->want_ucx = p->want_ucx && refit_transport_find("ucx");
    } else
        put(p, "transports", PASS, "asked for %s; built in: %s", asked, built);
}

/* One version of a tiny model through a publisher and a receiver of this
 * process over `transport`, a private file registry and a fresh secret in
 * tmpdir: *rep is the receiver's report.  The detail of a failure is left
 * in refit_last_error(). */
static refit_status_t loopback(const char *transport, const char *topts, const char *tmpdir, refit_pull_report_t *rep)
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

/* The socket directory the shm transport will use (shm.c: private_dir). */
static void shm_dir(const pf_t *p, char *out, size_t n)
{
    char *opt = option(p->topts, "shm.dir");
    const char *env = getenv("REFIT_RUNTIME_DIR"), *run = getenv("XDG_RUNTIME_DIR");
    if (opt && opt[0]) snprintf(out, n, "%s", opt);
    else if (env && env[0]) snprintf(out, n, "%s", env);
    else if (run && run[0] == '/') snprintf(out, n, "%s/refit", run);
    else snprintf(out, n, "/tmp/refit-%u", (unsigned)geteuid());
    free(opt);
}

static void check_shm(pf_t *p, const char *tmpdir)
{
    char dir[4096];
    shm_dir(p, dir, sizeof(dir));
    struct stat sb;
    if (lstat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            put(p, "shm runtime dir", FAIL, "%s is %s of uid %u, mode %04o: shm publishers refuse it", dir,
                S_ISDIR(sb.st_mode) ? "a directory" : "not a directory", (unsigned)sb.st_uid,
                (unsigned)(sb.st_mode & 07777));
            remedy(p, "chmod 700 %s (owned by uid %u), or point REFIT_RUNTIME_DIR / shm.dir= at a private directory", dir,
                   (unsigned)geteuid());
        } else
            put(p, "shm runtime dir", PASS, "%s: ours, mode %04o", dir, (unsigned)(sb.st_mode & 07777));
    } else
        put(p, "shm runtime dir", PASS, "%s does not exist yet; the first shm publisher creates it (0700)", dir);
    if (!p->want_shm) {
        put(p, "shm loopback", SKIP, "shm is not among the transports");
        return;
    }
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    refit_status_t st = loopback("shm", p->topts, tmpdir, &rep);
    if (st) {
        put(p, "shm loopback", FAIL, "a publisher and a receiver of this process over shm: %s (%s)", refit_last_error(),
            refit_status_name(st));
        remedy(p, "fix the shm runtime dir above; in a container, run every rank of the host as the same user");
    } else
        put(p, "shm loopback", PASS, "one version of tiny-tied over shm (%s), verified, in %.0f ms", rep.lanes,
            (refit_now() - t0) * 1e3);
}

/* ---- UCX ----------------------------------------------------------------------- */

static void check_ucx(pf_t *p, const char *tmpdir)
{
    if (!p->want_ucx) {
        put(p, "ucx listen", SKIP, "ucx is not among the transports%s", refit_transport_find("ucx") ? "" : " (not built in)");
        put(p, "ucx lanes", SKIP, "ucx is not among the transports");
        return;
    }
    /* The listen address: the transport resolves it when created. */
    refit_tset_t ts;
    char *listen = option(p->topts, "ucx.listen");
    refit_status_t st = refit_tset_open(&ts, "ucx", p->topts, NULL);
    if (st) {
        put(p, "ucx listen", FAIL, "%s (%s)", refit_last_error(), refit_status_name(st));
        remedy(p, "ucx.listen= takes an address or interface of this host that receivers reach (ip -br addr), never "
                  "0.0.0.0");
        free(listen);
        put(p, "ucx lanes", SKIP, "the ucx options are not valid");
        return;
    }
    refit_tset_close(&ts);
    put(p, "ucx listen", PASS, "listen=%s is an address of this host%s", listen ? listen : "127.0.0.1",
        listen ? "" : " (the default: loopback only; multi-host jobs must name the interface receivers reach)");
    if (!listen) {
        p->checks[p->n - 1].v = WARN;
        remedy(p, "for receivers on other hosts set --transport-options ucx.listen=IFNAME or ucx.listen=IP");
    }
    free(listen);
    refit_pull_report_t rep = REFIT_PULL_REPORT_INIT;
    double t0 = refit_now();
    st = loopback("ucx", p->topts, tmpdir, &rep);
    if (st) {
        put(p, "ucx lanes", FAIL, "a UCX publisher and receiver of this process: %s (%s)", refit_last_error(),
            refit_status_name(st));
        if (p->require_rdma)
            remedy(p, "UCX found no RDMA lane: check the RDMA devices line, UCX_TLS / ucx.tls= and ucx.devices=; or drop "
                      "ucx.require=rdma to accept TCP (about 7x slower)");
        else
            remedy(p, "run `ucx_info -d` to see UCX's devices; check ucx.listen= and the firewall for the listen port");
        return;
    }
    bool rdma = strstr(rep.lanes, "rc") || strstr(rep.lanes, "dc") || strstr(rep.lanes, "ud");
    put(p, "ucx lanes", PASS, "one version over UCX to this host itself took lanes %s (%.0f ms); between hosts UCX "
        "may pick others of the same kinds", rep.lanes, (refit_now() - t0) * 1e3);
    if (!rdma) {
        p->checks[p->n - 1].v = WARN;
        remedy(p, "TCP lanes: fine for tests, about 7x slower than RDMA; with RDMA NICs see the RDMA line, and set "
                  "ucx.require=rdma so that a fallback fails loudly");
    }
}

static void check_rdma(pf_t *p)
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
    if (active) put(p, "rdma devices", PASS, "%d of %d active: %s", active, n, list);
    else if (needed) {
        put(p, "rdma devices", FAIL, "%s, and the options ask for RDMA (ucx.require=rdma)",
            n ? list : "none in /sys/class/infiniband");
        remedy(p, "load the NIC's driver (ibv_devices lists it), expose the device to the container (RDMA device "
                  "plugin), or drop the RDMA options");
    } else if (!p->want_ucx)
        put(p, "rdma devices", SKIP, "%s; not used without ucx", n ? list : "none");
    else {
        put(p, "rdma devices", WARN, "%s: UCX can only use TCP between hosts", n ? list : "none in /sys/class/infiniband");
        remedy(p, "on an RDMA cluster, expose the NICs (RDMA device plugin, /dev/infiniband); otherwise expect TCP speed");
    }
}

/* ---- GPUs ------------------------------------------------------------------------ */

#ifdef REFIT_HAVE_CUDA
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
#endif

static void check_gpus(pf_t *p)
{
#ifdef REFIT_HAVE_CUDA
    int n = refit_gpu_count();
    if (n == 0) {
        if (p->device >= 0) {
            put(p, "gpus", FAIL, "--device %d asked, but no CUDA device is usable here", p->device);
            remedy(p, "request GPUs for the pod (nvidia.com/gpu) and check the driver (nvidia-smi)");
        } else
            put(p, "gpus", SKIP, "no CUDA device here (host-memory job)");
        return;
    }
    if (p->device >= n) {
        put(p, "gpus", FAIL, "--device %d asked, %d device%s here", p->device, n, n == 1 ? "" : "s");
        remedy(p, "use a device below %d (CUDA_VISIBLE_DEVICES renumbers them)", n);
        return;
    }
    char names[400] = "";
    for (int d = 0; d < n && d < 8; d++) {
        refit_gpu_info_t gi;
        if (!refit_gpu_info(d, &gi))
            snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%d: %s", d ? ", " : "", d, gi.name);
    }
    put(p, "gpus", PASS, "%d device%s: %s%s", n, n == 1 ? "" : "s", names, n > 8 ? ", ..." : "");
    if (n < 2) {
        put(p, "gpu peer access", SKIP, "one device: no peer copies");
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
    put(p, "gpu peer access", denied ? FAIL : nvlink == pairs ? PASS : WARN, "%s%s", desc,
        links[0][1][0] ? "" : " (no nvidia-smi: NVLink topology unknown)");
    if (denied)
        remedy(p, "cuda_ipc needs peer access between the GPUs of a host: check IOMMU/ACS settings and that the "
                  "container sees every GPU of the job");
    else if (nvlink < pairs)
        remedy(p, "pairs without NVLink copy over PCIe (several times slower); place publishers and receivers on "
                  "NVLink-connected GPUs");
#else
    if (p->device >= 0) {
        put(p, "gpus", FAIL, "--device %d asked, but this refit was built without CUDA", p->device);
        remedy(p, "rebuild with the CUDA toolkit on PATH (REFIT_WITH_CUDA=ON)");
    } else
        put(p, "gpus", SKIP, "built without CUDA (host-memory jobs only)");
    put(p, "gpu peer access", SKIP, "built without CUDA");
#endif
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

static void check_memlock(pf_t *p)
{
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[32], need[32];
    if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof(lim), "unlimited");
    else fmt_bytes(rl.rlim_cur, lim, sizeof(lim));
    bool cap = has_cap_ipc_lock();
    /* Pinned by the job: memory registered with RDMA NICs (UCX over rc/dc
     * registers what it sends and receives).  UCX over TCP and shm pin nothing; CUDA's pinned
     * staging is not counted against RLIMIT_MEMLOCK. */
    bool rdma_pins = p->want_ucx && (p->require_rdma || access("/sys/class/infiniband", F_OK) == 0);
    uint64_t want = rdma_pins ? p->host_bytes : 0;
    if (cap) {
        put(p, "memlock", PASS, "CAP_IPC_LOCK held: no limit on pinned memory (RLIMIT_MEMLOCK %s)", lim);
        return;
    }
    if (!rdma_pins) {
        put(p, "memlock", PASS, "RLIMIT_MEMLOCK %s, no CAP_IPC_LOCK; nothing is pinned without RDMA lanes", lim);
        return;
    }
    if (!p->host_bytes) {
        bool small = rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (1ull << 30);
        put(p, "memlock", small ? WARN : PASS, "RLIMIT_MEMLOCK %s, no CAP_IPC_LOCK; RDMA registers the job's memory "
            "(give --model/--src/--dst/--ranks to compare with its bytes)", lim);
        if (small) remedy(p, "add the IPC_LOCK capability to the container or raise `ulimit -l` (memlock) to unlimited");
        return;
    }
    fmt_bytes(want, need, sizeof(need));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        put(p, "memlock", FAIL, "RLIMIT_MEMLOCK %s < %s this host's ranks register for RDMA, and no CAP_IPC_LOCK", lim,
            need);
        remedy(p, "add capabilities: [IPC_LOCK] to the container, or raise the memlock limit (ulimit -l unlimited, "
                  "LimitMEMLOCK=infinity, docker --ulimit memlock=-1)");
    } else
        put(p, "memlock", PASS, "RLIMIT_MEMLOCK %s >= %s to register", lim, need);
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

static void check_memory(pf_t *p)
{
    char where[128], a[32], need[32];
    uint64_t avail = memory_available(where, sizeof(where));
    fmt_bytes(avail, a, sizeof(a));
    if (!p->host_bytes) {
        put(p, "memory", PASS, "%s free by %s (give --model/--src/--dst/--ranks to compare with the job's bytes)", a,
            where);
        return;
    }
    /* A trainer rank's memory, and in snapshot mode its two staging arenas;
     * a rollout rank's memory (a GPU receiver's pinned staging when it pulls
     * through host transports). */
    uint64_t want = p->host_bytes * (p->trainer && p->snapshot ? 3 : 1);
    fmt_bytes(want, need, sizeof(need));
    if (want > avail) {
        put(p, "memory", FAIL, "this host's ranks need %s of host memory (shm memfds%s), %s free by %s", need,
            p->trainer && p->snapshot ? " with two snapshot arenas" : "", a, where);
        remedy(p, "raise the container's memory limit (shm memfds count against it) or place fewer ranks per host");
    } else
        put(p, "memory", want > avail / 10 * 8 ? WARN : PASS, "this host's ranks need %s of host memory, %s free by %s",
            need, a, where);
    if (p->checks[p->n - 1].v == WARN) remedy(p, "less than 20%% would be left: raise the memory limit");
}

static void check_dev_shm(pf_t *p)
{
    struct statvfs vs;
    char size[32], fr[32], need[32];
    if (statvfs("/dev/shm", &vs) != 0) {
        put(p, "/dev/shm", FAIL, "/dev/shm: %s", strerror(errno));
        remedy(p, "mount a tmpfs on /dev/shm (Kubernetes: an emptyDir with medium: Memory)");
        return;
    }
    uint64_t total = (uint64_t)vs.f_blocks * vs.f_frsize, free_b = (uint64_t)vs.f_bavail * vs.f_frsize;
    uint64_t want = p->shm_need ? p->shm_need : 64ull << 20;
    fmt_bytes(total, size, sizeof(size));
    fmt_bytes(free_b, fr, sizeof(fr));
    fmt_bytes(want, need, sizeof(need));
    /* refit's own shm transport uses memfds, which /dev/shm's size does not
     * bound; NCCL, vLLM's shared-memory broadcast and PyTorch's data loaders
     * write /dev/shm and die with SIGBUS when it is full. */
    if (free_b < want) {
        put(p, "/dev/shm", FAIL, "%s free of %s, below %s%s", fr, size, need,
            p->shm_need ? " (--shm-need)" : " (Docker's default size: NCCL and vLLM fail with SIGBUS)");
        remedy(p, "mount a larger /dev/shm: Kubernetes emptyDir {medium: Memory, sizeLimit: 2Gi}, docker --shm-size=2g");
    } else if (!p->shm_need && free_b < (1ull << 30)) {
        put(p, "/dev/shm", WARN, "%s free of %s (refit's shm transport needs none: memfds; NCCL and vLLM do)", fr, size);
        remedy(p, "give NCCL and vLLM at least 1 GiB of /dev/shm");
    } else
        put(p, "/dev/shm", PASS, "%s free of %s (refit's shm transport needs none: memfds; NCCL and vLLM do)", fr, size);
}

/* ---- the plan ------------------------------------------------------------------------ */

static refit_status_t parse_ranks(pf_t *p, uint32_t world)
{
    p->nranks = 0;
    const char *s = p->ranks ? p->ranks : "0";
    if (!strcmp(s, "all")) {
        for (uint32_t r = 0; r < world && p->nranks < 256; r++) p->rank_list[p->nranks++] = r;
        return world <= 256 ? REFIT_OK : refit_error(REFIT_ERR_INVALID_ARG, "--ranks all: %u ranks, at most 256 per host", world);
    }
    while (*s) {
        char *end;
        errno = 0;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (end == s || errno) return refit_error(REFIT_ERR_INVALID_ARG, "--ranks %s: expected R, R-S or all", p->ranks);
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

static void check_plan(pf_t *p)
{
    if (!p->model) {
        put(p, "plan", SKIP, "no --model/--src/--dst: the plan and the job's bytes are not checked");
        return;
    }
    refit_status_t st;
    refit_model_t *model = NULL;
    refit_layout_t *src = NULL, *dst = NULL;
    refit_local_set_t set = {0};
    char what[64] = "--model";
    if ((st = refit_model_open(p->model, &model))) goto fail;
    snprintf(what, sizeof(what), "--src");
    if ((st = refit_layout_parse(p->src, &src)) || (st = refit_layout_check(src, model))) goto fail;
    snprintf(what, sizeof(what), "--dst");
    if ((st = refit_layout_parse(p->dst, &dst)) || (st = refit_layout_check(dst, model))) goto fail;
    snprintf(what, sizeof(what), "--ranks");
    if ((st = parse_ranks(p, refit_layout_world(p->trainer ? src : dst)))) goto fail;
    snprintf(what, sizeof(what), "the trainer layout's manifests");
    if ((st = refit_local_set_create(model, src, false, 1, &set))) goto fail;
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
        refit_local_result_t res;
        snprintf(what, sizeof(what), "rollout rank %u", r);
        if ((st = refit_layout_manifest(dst, model, r, &dm))) goto fail;
        st = refit_local_run(&set, dm, false, 1, &pp, NULL, &res);
        refit_manifest_destroy(dm);
        if (st) goto fail;
        written += res.stats.bytes_written;
        read += res.stats.bytes_read;
        redundant += res.stats.bytes_redundant;
        regions += res.stats.regions;
        sources = REFIT_MAX(sources, res.stats.sources_used);
        plan_ms = REFIT_MAX(plan_ms, res.stats.plan_ms);
        char b[32];
        if (!p->trainer && strlen(per) < sizeof(per) - 80)
            snprintf(per + strlen(per), sizeof(per) - strlen(per), "%srank %u: %s from %zu sources in %zu regions",
                     i ? "; " : "", r, fmt_bytes(res.stats.bytes_written, b, sizeof(b)), res.stats.sources_used,
                     res.stats.regions);
    }
    char wb[32], hb[32];
    fmt_bytes(written, wb, sizeof(wb));
    fmt_bytes(p->host_bytes, hb, sizeof(hb));
    if (p->trainer)
        put(p, redundant ? "plan" : "plan", redundant ? WARN : PASS,
            "%s -> %s of %s: this host's %u trainer rank%s hold %s; all %u rollout ranks plan from them (%s read, "
            "redundant %" PRIu64 " bytes, up to %zu sources, %.1f ms)",
            refit_layout_string(src), refit_layout_string(dst), refit_model_name(model), p->nranks,
            p->nranks == 1 ? "" : "s", hb, n, wb, redundant, sources, plan_ms);
    else
        put(p, "plan", redundant ? WARN : PASS,
            "%s -> %s of %s: this host's %u rollout rank%s pull %s (%s read, redundant %" PRIu64 " bytes) in %zu "
            "regions, %.1f ms to plan: %s",
            refit_layout_string(src), refit_layout_string(dst), refit_model_name(model), p->nranks,
            p->nranks == 1 ? "" : "s", wb, fmt_bytes(read, hb, sizeof(hb)), redundant, regions, plan_ms, per);
    if (redundant) remedy(p, "bytes read twice: report the layouts (refit plan --json shows the ranks)");
    goto out;
fail:
    put(p, "plan", FAIL, "%s: %s (%s)", what, refit_last_error()[0] ? refit_last_error() : refit_status_message(st),
        refit_status_name(st));
    remedy(p, "check --model/--src/--dst/--ranks against the job (`refit plan --model M --src L --dst L --all-ranks`)");
    p->host_bytes = 0;
out:
    refit_local_set_destroy(&set);
    refit_layout_destroy(src);
    refit_layout_destroy(dst);
    refit_model_destroy(model);
}

/* ---- the registry -------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *registry_url(const pf_t *p) { return p->registry ? p->registry : refit_default_registry(); }

/* Reachability with a secret of our own (so that a missing job secret is
 * the auth line's finding, not this one's): open, then a probe lease under
 * the job written, read back (HMAC checked) and deleted, three times. */
static bool check_registry(pf_t *p, const char *tmpdir)
{
    char secret[4200], *shown = refit_redact_url(registry_url(p));
    snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
    refit_registry_auth_t auth = {.secret_file = secret};
    refit_registry_t *reg = NULL;
    double t0 = refit_now();
    refit_status_t st = refit_registry_open_auth(registry_url(p), p->job, &auth, &reg);
    double open_ms = (refit_now() - t0) * 1e3;
    if (st) {
        put(p, "registry", FAIL, "%s: %s (%s)", shown ? shown : "?", refit_last_error(), refit_status_name(st));
        if (st == REFIT_ERR_REGISTRY)
            remedy(p, "is the store up and reachable from here? (redis-cli -h HOST -p PORT ping; the Service/port; the "
                      "ACL user's password in REFIT_REDIS_PASSWORD_FILE)");
        else if (st == REFIT_ERR_UNSUPPORTED) remedy(p, "rebuild refit with libhiredis-dev installed for redis://");
        else remedy(p, "--registry takes file:DIR or redis://[USER@]HOST:PORT; --job [A-Za-z0-9._-], 1..64 chars");
        free(shown);
        return false;
    }
    char reader[128], host[64];
    refit_hostname(host, sizeof(host));
    snprintf(reader, sizeof(reader), "preflight.%.60s.%d", host, (int)getpid());
    for (char *c = reader; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
            *c = '-';
    double w[3], r[3], d[3];
    for (int i = 0; i < 3 && !st; i++) {
        uint64_t token;
        double a = refit_now();
        st = refit_registry_lease_take(reg, "preflight", 1, reader, 10000, &token);
        double b = refit_now();
        if (!st) st = refit_registry_lease_holds(reg, "preflight", 1, reader, token);
        double c = refit_now();
        if (!st) st = refit_registry_lease_release(reg, "preflight", 1, reader);
        double e = refit_now();
        w[i] = (b - a) * 1e3, r[i] = (c - b) * 1e3, d[i] = (e - c) * 1e3;
    }
    refit_registry_close(reg);
    if (st) {
        put(p, "registry", FAIL, "%s: opened, but the probe under job %s failed: %s (%s)", shown, p->job,
            refit_last_error(), refit_status_name(st));
        remedy(p, "the ACL user must be allowed every command on ~refit:%s:* (docs/security.md), the directory writable",
               p->job);
        free(shown);
        return false;
    }
    qsort(w, 3, sizeof(double), cmp_double);
    qsort(r, 3, sizeof(double), cmp_double);
    qsort(d, 3, sizeof(double), cmp_double);
    double worst = fmax(w[1], fmax(r[1], d[1]));
    put(p, "registry", worst > 5 ? WARN : PASS,
        "%s: opened in %.1f ms; a probe key under job %s written, read back and deleted: %.2f / %.2f / %.2f ms "
        "(medians of 3)", shown, open_ms, p->job, w[1], r[1], d[1]);
    if (worst > 5)
        remedy(p, "a registry round trip over 5 ms makes every refit's control plane slow: move the registry closer");
    free(shown);
    return true;
}

/* The job's secret as a process of the job would find it. */
static void check_auth(pf_t *p, bool reachable)
{
    const char *file = getenv("REFIT_SECRET_FILE"), *env = getenv("REFIT_SECRET"), *ins = getenv("REFIT_INSECURE");
    bool redis = !strncmp(registry_url(p), "redis:", 6);
    verdict_t v = PASS;
    char detail[600];
    if (file && file[0]) {
        struct stat sb;
        if (stat(file, &sb) != 0) {
            put(p, "auth", FAIL, "REFIT_SECRET_FILE=%s: %s", file, strerror(errno));
            remedy(p, "mount the job's secret there (Kubernetes: a Secret volume, defaultMode 0400), or fix the variable");
            return;
        }
        if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            put(p, "auth", FAIL, "REFIT_SECRET_FILE=%s is %s of uid %u, mode %04o: group and others must not read it, "
                "and it must be ours (uid %u)", file, S_ISREG(sb.st_mode) ? "a file" : "not a regular file",
                (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777), (unsigned)geteuid());
            remedy(p, "chmod 600 %s (Kubernetes: defaultMode: 0400 and the pod's runAsUser / fsGroup)", file);
            return;
        }
        snprintf(detail, sizeof(detail), "secret from file %s (mode %04o, %lld bytes)", file,
                 (unsigned)(sb.st_mode & 07777), (long long)sb.st_size);
    } else if (env && env[0])
        snprintf(detail, sizeof(detail), "secret from $REFIT_SECRET (%zu characters; a file is preferable: the "
                 "environment shows in /proc/PID/environ to this user and root)", strlen(env));
    else if (ins && !strcmp(ins, "1")) {
        v = WARN;
        snprintf(detail, sizeof(detail), "REFIT_INSECURE=1: registry entries and connections use a public key; anyone "
                 "who can write the registry or reach a listener is trusted");
    } else if (!redis)
        snprintf(detail, sizeof(detail), "file registry: the job directory's .secret (made 0600 on first use)");
    else {
        put(p, "auth", FAIL, "a redis registry and no secret: no REFIT_SECRET_FILE, REFIT_SECRET or REFIT_INSECURE=1");
        remedy(p, "head -c 32 /dev/urandom > job.secret; chmod 600 job.secret; export REFIT_SECRET_FILE=$PWD/job.secret "
                  "(the same file for every rank)");
        return;
    }
    const char *pwf = getenv("REFIT_REDIS_PASSWORD_FILE");
    if (redis && pwf && pwf[0]) {
        struct stat sb;
        if (stat(pwf, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            put(p, "auth", FAIL, "REFIT_REDIS_PASSWORD_FILE=%s: %s", pwf,
                errno && stat(pwf, &sb) != 0 ? strerror(errno) : "must be a regular file of ours, mode 0600");
            remedy(p, "chmod 600 %s, owned by the user the ranks run as", pwf);
            return;
        }
    }
    if (reachable) {
        /* What a rank of the job would get, for real. */
        refit_registry_t *reg = NULL;
        refit_status_t st = refit_registry_open(registry_url(p), p->job, &reg);
        if (st) {
            put(p, "auth", FAIL, "%s (%s)", refit_last_error(), refit_status_name(st));
            remedy(p, st == REFIT_ERR_AUTH ? "give every rank the same secret (REFIT_SECRET_FILE, mode 0600; "
                                             "docs/security.md)"
                                           : "see the registry line");
            return;
        }
        snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail), "; the registry opened with it (source: %s)",
                 refit_registry_secret_source(reg));
        if (!refit_registry_secure(reg)) v = WARN;
        refit_registry_close(reg);
    }
    put(p, "auth", v, "%s", detail);
    if (v == WARN) remedy(p, "set REFIT_SECRET_FILE to a 0600 file of 32 random bytes shared by the job's ranks");
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

static void check_clock(pf_t *p, bool reachable)
{
    const char *url = registry_url(p);
    if (!reachable) {
        put(p, "clock", SKIP, "the registry is not reachable");
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
            put(p, "clock", WARN, "cannot write %s: %s", path, strerror(errno));
            remedy(p, "see the registry line");
            return;
        }
        /* File times come from the kernel's coarse clock (a tick behind). */
        double skew = (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec / 1e9 - (a + b) / 2;
        verdict_t v = fabs(skew) > 1 ? FAIL : fabs(skew) > 0.1 ? WARN : PASS;
        put(p, "clock", v, "the registry directory's file times are %+.3f s from this host's clock", skew);
        if (v != PASS)
            remedy(p, "run chrony/ntpd on every host sharing the registry directory: entries expire by their writer's "
                      "clock");
        return;
    }
#ifdef REFIT_HAVE_REDIS
    double skew = 0;
    char err[256];
    if (!redis_skew(url, &skew, err, sizeof(err))) {
        put(p, "clock", WARN, "Redis TIME: %s", err);
        remedy(p, "see the registry line");
        return;
    }
    put(p, "clock", fabs(skew) > 1 ? WARN : PASS,
        "Redis's clock is %+.3f s from this host's (Redis expires keys by its own clock: refit does not depend on "
        "this; logs do)", skew);
    if (fabs(skew) > 1) remedy(p, "run chrony/ntpd on this host and the Redis server's");
#else
    put(p, "clock", SKIP, "no redis support built in");
#endif
}

/* ---- output ---------------------------------------------------------------------------------- */

static void print_human(const pf_t *p, int counts[4])
{
    char *shown = refit_redact_url(registry_url(p));
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
           counts[FAIL] ? "NOT ready (fix each fail above)" : counts[WARN] ? "ready, with warnings" : "ready");
}

static void print_json(const pf_t *p, int counts[4])
{
    char *shown = refit_redact_url(registry_url(p));
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
    printf("],\"pass\":%d,\"warn\":%d,\"fail\":%d,\"skip\":%d}\n", counts[PASS], counts[WARN], counts[FAIL], counts[SKIP]);
}

int cmd_preflight(int argc, char **argv); /* called by tools/refit.c */
int cmd_preflight(int argc, char **argv)
{
    static pf_t pf; /* large */
    pf_t *p = &pf;
    memset(p, 0, sizeof(*p));
    p->device = -1;
    p->job = "default";
    enum { O_REGISTRY = 1, O_JOB, O_TRANSPORTS, O_TOPTS, O_DEVICE, O_MODEL, O_SRC, O_DST, O_RANKS, O_ROLE, O_MODE,
           O_SHM_NEED, O_JSON, O_HELP };
    static const struct option opts[] = {
        {"registry", required_argument, 0, O_REGISTRY}, {"job", required_argument, 0, O_JOB},
        {"transports", required_argument, 0, O_TRANSPORTS}, {"transport-options", required_argument, 0, O_TOPTS},
        {"device", required_argument, 0, O_DEVICE},     {"model", required_argument, 0, O_MODEL},
        {"src", required_argument, 0, O_SRC},           {"dst", required_argument, 0, O_DST},
        {"ranks", required_argument, 0, O_RANKS},       {"role", required_argument, 0, O_ROLE},
        {"mode", required_argument, 0, O_MODE},         {"shm-need", required_argument, 0, O_SHM_NEED},
        {"json", no_argument, 0, O_JSON},               {"help", no_argument, 0, O_HELP},
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
            if (tool_parse_u64(optarg, &u) || u > 1024) return tool_usage("preflight", "--device takes a CUDA device number");
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
            printf("usage: refit preflight [--registry URL] [--job J] [--transports LIST] [--transport-options OPTS]\n"
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
    char *v = option(p->topts, "ucx.require");
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
