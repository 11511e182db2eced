/* The shm transport: same host, zero copy on the publisher side.
 *
 * Publisher memory from alloc() lives in a memfd; its descriptor names the
 * publisher's pid, the fd number and the offset, and a receiver maps it
 * read-only through /proc/PID/fd/FD (once per source incarnation: the
 * mapping is cached in the peer, prefaulted with MAP_POPULATE, so a steady
 * refit is plain memcpy at memory speed).  Memory the publisher did not get
 * from alloc() is read with process_vm_readv.  Descriptors carry the host's
 * boot id and the publisher's process start time, so a receiver on another
 * host, or a recycled pid, is refused instead of reading someone else's
 * memory. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/transport.h"

#define SHM_MAGIC 0x4d485352u /* "RSHM" */
#define SHM_DESC_VERSION 1
enum { SHM_MEMFD = 1, SHM_PVM = 2 };

typedef struct {
    uint32_t magic, version, kind, pid;
    int32_t fd;
    uint32_t pad;
    uint64_t offset; /* into the memfd */
    uint64_t size;
    uint64_t addr; /* publisher address (process_vm_readv) */
    uint64_t start_time; /* publisher's start time (clock ticks since boot) */
    char boot_id[40];
} shm_desc_t;

typedef struct {
    void *base;
    uint64_t size;
    int fd;
} shm_alloc_t;

struct refit_transport {
    pthread_mutex_t lock;
    REFIT_VEC(shm_alloc_t) allocs;
};

typedef struct {
    uint32_t kind;
    const unsigned char *map; /* SHM_MEMFD: mapped bytes */
    void *map_base;
    size_t map_len;
    uint64_t size, addr;
} shm_region_t;

struct refit_peer {
    uint32_t pid, nregions;
    uint64_t start_time;
    shm_region_t *regions;
};

void refit_boot_id(char out[40])
{
    memset(out, 0, 40);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(out, 40, f)) out[0] = '\0';
        fclose(f);
    }
    out[strcspn(out, "\n")] = '\0';
}

/* Start time of a process (field 22 of /proc/PID/stat), 0 if it is gone or
 * a zombie (killed but not yet reaped: dead all the same). */
uint64_t refit_proc_start_time(uint32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return 0;
    unsigned long long v = 0;
    char state = 0;
    /* after ") " come fields 3..: the state, then 18 fields up to field 22 */
    if (sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state, &v) != 2)
        return 0;
    return state == 'Z' || state == 'X' ? 0 : v;
}

static refit_status_t shm_create(const char *options, refit_transport_t **out)
{
    (void)options;
    refit_transport_t *t = calloc(1, sizeof(*t));
    if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "shm transport");
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return REFIT_OK;
}

static void shm_destroy(refit_transport_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->allocs.len; i++) {
        munmap(t->allocs.data[i].base, t->allocs.data[i].size);
        close(t->allocs.data[i].fd);
    }
    REFIT_VEC_FREE(&t->allocs);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static refit_status_t shm_alloc(refit_transport_t *t, uint64_t size, void **base)
{
    int fd = memfd_create("refit-region", MFD_CLOEXEC);
    if (fd < 0) return refit_error(REFIT_ERR_NO_MEMORY, "shm: memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm: sizing a %" PRIu64 "-byte memfd: %s", size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm: mapping %" PRIu64 " bytes: %s", size, strerror(e));
    }
    pthread_mutex_lock(&t->lock);
    int rc = REFIT_VEC_PUSH(&t->allocs, ((shm_alloc_t){p, size, fd}));
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        munmap(p, size);
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm: allocation table");
    }
    *base = p;
    return REFIT_OK;
}

static void shm_free(refit_transport_t *t, void *base, uint64_t size)
{
    (void)size;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->allocs.len; i++)
        if (t->allocs.data[i].base == base) {
            munmap(base, t->allocs.data[i].size);
            close(t->allocs.data[i].fd);
            t->allocs.data[i] = t->allocs.data[--t->allocs.len];
            break;
        }
    pthread_mutex_unlock(&t->lock);
}

static refit_status_t shm_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len)
{
    shm_desc_t *d = calloc(1, sizeof(*d));
    if (!d) return refit_error(REFIT_ERR_NO_MEMORY, "shm descriptor");
    d->magic = SHM_MAGIC;
    d->version = SHM_DESC_VERSION;
    d->pid = (uint32_t)getpid();
    d->size = size;
    d->addr = (uint64_t)(uintptr_t)base;
    d->start_time = refit_proc_start_time(d->pid);
    d->kind = SHM_PVM;
    d->fd = -1;
    refit_boot_id(d->boot_id);
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->allocs.len; i++) {
        const shm_alloc_t *a = &t->allocs.data[i];
        uintptr_t b = (uintptr_t)a->base, p = (uintptr_t)base;
        if (p >= b && p + size <= b + a->size) {
            d->kind = SHM_MEMFD;
            d->fd = a->fd;
            d->offset = p - b;
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
    *desc = d;
    *len = sizeof(*d);
    return REFIT_OK;
}

static void shm_unexpose(refit_transport_t *t, void *base)
{
    (void)t;
    (void)base;
}

static void shm_disconnect(refit_peer_t *peer)
{
    if (!peer) return;
    for (uint32_t i = 0; i < peer->nregions; i++)
        if (peer->regions[i].map_base) munmap(peer->regions[i].map_base, peer->regions[i].map_len);
    free(peer->regions);
    free(peer);
}

static refit_status_t shm_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t n,
                                  refit_peer_t **out)
{
    (void)t;
    refit_status_t st = REFIT_OK;
    char my_boot[40];
    refit_boot_id(my_boot);
    refit_peer_t *peer = calloc(1, sizeof(*peer));
    if (!peer || !(peer->regions = calloc(n ? n : 1, sizeof(shm_region_t)))) {
        free(peer);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm peer");
    }
    peer->nregions = n;
    long page = sysconf(_SC_PAGESIZE);
    for (uint32_t i = 0; i < n; i++) {
        shm_desc_t d;
        if (!descs[i] || lens[i] != sizeof(d)) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u descriptor has %zu bytes, want %zu", i, lens[i], sizeof(d));
            goto err;
        }
        memcpy(&d, descs[i], sizeof(d));
        d.boot_id[39] = '\0';
        if (d.magic != SHM_MAGIC || d.version != SHM_DESC_VERSION || (d.kind != SHM_MEMFD && d.kind != SHM_PVM)) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u descriptor is not a version-%d shm descriptor", i,
                             SHM_DESC_VERSION);
            goto err;
        }
        if (strcmp(d.boot_id, my_boot) != 0) {
            st = refit_error(REFIT_ERR_TRANSPORT, "shm: the source runs on another host (boot id %s, ours %s)",
                             d.boot_id, my_boot);
            goto err;
        }
        if (refit_proc_start_time(d.pid) != d.start_time) {
            st = refit_error(REFIT_ERR_PEER, "shm: source process %u is gone (or its pid was reused)", d.pid);
            goto err;
        }
        peer->pid = d.pid;
        peer->start_time = d.start_time;
        shm_region_t *r = &peer->regions[i];
        r->kind = d.kind;
        r->size = d.size;
        r->addr = d.addr;
        if (d.kind != SHM_MEMFD) continue;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%u/fd/%d", d.pid, d.fd);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            st = refit_error(errno == ENOENT ? REFIT_ERR_PEER : REFIT_ERR_TRANSPORT, "shm: opening %s: %s", path,
                             strerror(errno));
            goto err;
        }
        uint64_t aligned = d.offset / (uint64_t)page * (uint64_t)page, skew = d.offset - aligned;
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < d.offset + d.size) {
            close(fd);
            st = refit_error(REFIT_ERR_PEER, "shm: %s is smaller than its descriptor says", path);
            goto err;
        }
        r->map_len = skew + d.size;
        r->map_base = mmap(NULL, r->map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)aligned);
        close(fd);
        if (r->map_base == MAP_FAILED) {
            r->map_base = NULL;
            st = refit_error(REFIT_ERR_TRANSPORT, "shm: mapping %s: %s", path, strerror(errno));
            goto err;
        }
        r->map = (const unsigned char *)r->map_base + skew;
    }
    *out = peer;
    return REFIT_OK;
err:
    shm_disconnect(peer);
    return st;
}

typedef struct {
    refit_peer_t *const *peers;
} pull_ctx_t;

static refit_status_t pvm_copy(void *user, uint32_t src, uint32_t src_region, uint64_t off, void *dst, uint64_t len)
{
    const pull_ctx_t *c = user;
    const refit_peer_t *p = c->peers[src];
    const shm_region_t *r = &p->regions[src_region];
    if (r->map) {
        memcpy(dst, r->map + off, len);
        return REFIT_OK;
    }
    unsigned char *d = dst;
    while (len) {
        struct iovec lo = {d, len}, re = {(void *)(uintptr_t)(r->addr + off), len};
        ssize_t n = process_vm_readv((pid_t)p->pid, &lo, 1, &re, 1, 0);
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            return refit_error(e == ESRCH ? REFIT_ERR_PEER : REFIT_ERR_TRANSPORT,
                               "shm: process_vm_readv from pid %u: %s", p->pid, strerror(e));
        }
        d += n;
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    return REFIT_OK;
}

static refit_status_t shm_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                               void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats)
{
    (void)t;
    size_t nsrc = refit_plan_num_sources(plan);
    uint8_t *only = calloc(nsrc ? nsrc : 1, 1);
    const void **flat = NULL;
    const void *const **bases = calloc(nsrc ? nsrc : 1, sizeof(*bases));
    refit_status_t st = REFIT_OK;
    size_t total_regions = 0;
    for (size_t s = 0; s < nsrc; s++)
        if (peers[s]) total_regions += peers[s]->nregions;
    flat = calloc(total_regions ? total_regions : 1, sizeof(*flat));
    if (!only || !bases || !flat) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "shm pull");
        goto out;
    }
    bool pvm = false, mapped = false;
    size_t k = 0;
    for (size_t s = 0; s < nsrc; s++) {
        if (!peers[s]) continue;
        only[s] = 1;
        bases[s] = &flat[k];
        for (uint32_t r = 0; r < peers[s]->nregions; r++) {
            flat[k++] = peers[s]->regions[r].map;
            if (peers[s]->regions[r].map) mapped = true;
            else pvm = true;
        }
    }
    /* Every region of the plan must come from a region the peer has. */
    size_t n;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &n);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!only[regs[i].src]) continue;
        const refit_peer_t *p = peers[regs[i].src];
        if (regs[i].src_region >= p->nregions || refit_region_src_end(&regs[i]) > p->regions[regs[i].src_region].size) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: the plan reads past region %u of source %u", regs[i].src_region,
                             regs[i].src);
            goto out;
        }
        bytes += refit_plan_region_bytes(&regs[i]);
    }
    pull_ctx_t pc = {peers};
    refit_exec_opts_t o = {.threads = ctl ? ctl->threads : 0, .copy = pvm ? pvm_copy : NULL, .user = &pc,
                           .tick = ctl ? ctl->tick : NULL, .tick_user = ctl ? ctl->user : NULL,
                           .deadline = ctl ? ctl->deadline : 0, .only = only, .skip_fills = true};
    st = refit_plan_execute(plan, bases, dst_bases, &o);
    /* A mapping outlives its publisher, so the bytes would look fine; but a
     * publisher that died during the copy may have died while writing them. */
    for (size_t s = 0; !st && s < nsrc; s++)
        if (peers[s] && refit_proc_start_time(peers[s]->pid) != peers[s]->start_time)
            st = refit_error(REFIT_ERR_PEER, "shm: source process %u died during the transfer", peers[s]->pid);
    if (!st && stats) {
        stats->bytes += bytes;
        stats->requests += n;
        snprintf(stats->lanes, sizeof(stats->lanes), "shm:%s%s%s", mapped ? "mmap" : "", mapped && pvm ? "+" : "",
                 pvm ? "process_vm_readv" : "");
    }
out:
    free(only);
    free(bases);
    free(flat);
    return st;
}

const refit_transport_ops_t refit_transport_shm = {
    .name = "shm",
    .caps = REFIT_TCAP_HOST | REFIT_TCAP_CONCURRENT,
    .create = shm_create,
    .destroy = shm_destroy,
    .alloc = shm_alloc,
    .free = shm_free,
    .expose = shm_expose,
    .unexpose = shm_unexpose,
    .connect = shm_connect,
    .disconnect = shm_disconnect,
    .pull = shm_pull,
};
