/* The shm transport's receiver side: the handshake with a publisher's server, the mapped or
 * process_vm_readv regions, and the pull (shm.c describes the protocol). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm_internal.h"

void shm_disconnect(refit_peer_t *peer)
{
    if (!peer) return;
    for (uint32_t i = 0; i < peer->nregions; i++)
        if (peer->regions[i].map_base) munmap(peer->regions[i].map_base, peer->regions[i].map_len);
    if (peer->pidfd >= 0) close(peer->pidfd);
    free(peer->regions);
    free(peer);
}

/* Whether the publisher process is still the one we connected to. */
static bool peer_alive(const refit_peer_t *p)
{
    if (p->pidfd >= 0) {
        struct pollfd pf = {p->pidfd, POLLIN, 0};
        return poll(&pf, 1, 0) == 0; /* readable: it exited */
    }
    return refit_proc_start_time(p->pid) == p->start_time;
}

static int pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* Connects to the publisher's socket and runs the handshake; on success the
 * peer holds the publisher's pid (from the kernel) and mapped regions. */
/* Connects to the publisher's socket at sa (fd: the socket, open on return
 * whatever the status) and pins the identity of the process there, which
 * must run as this user. */
static refit_status_t dial(const struct sockaddr_un *sa, refit_peer_t *peer, int *fd, struct ucred *cred)
{
    const char *path = sa->sun_path;
    *fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (*fd < 0) return refit_error(REFIT_ERR_TRANSPORT, "shm: socket: %s", strerror(errno));
    shm_set_timeouts(*fd);
    if (connect(*fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0)
        return refit_error(errno == ENOENT || errno == ECONNREFUSED ? REFIT_ERR_PEER : REFIT_ERR_TRANSPORT,
                           "shm: connecting to the publisher at %s: %s", path, strerror(errno));
    if (!shm_peer_uid_ok(*fd, cred))
        return refit_error(REFIT_ERR_AUTH, "shm: the process at %s runs as uid %u, not as this user (uid %u)", path,
                           (unsigned)cred->uid, (unsigned)geteuid());
    /* Pin the peer's identity now, while its socket is connected to us: a
     * pidfd opened after a long handshake could name a recycled pid. */
    peer->pid = (uint32_t)cred->pid;
    peer->start_time = refit_proc_start_time(peer->pid);
    peer->pidfd = pidfd_of(cred->pid);
    return REFIT_OK;
}

/* Our hello and the publisher's challenge: its proof of the job's secret
 * checked; *hello and *ch hold both nonces for our proof. */
static refit_status_t publisher_proof(refit_transport_t *t, int fd, const char *path, pid_t pid, msg_hello_t *hello,
                                      msg_challenge_t *ch)
{
    *hello = (msg_hello_t){SHM_MAGIC, MSG_HELLO, {0}};
    refit_status_t st = refit_random_bytes(hello->nonce, sizeof(hello->nonce));
    if (st) return st;
    if (!shm_send_msg(fd, hello, sizeof(*hello), NULL, 0) ||
        shm_recv_msg(fd, ch, sizeof(*ch), NULL, 0, NULL) != (ssize_t)sizeof(*ch) || ch->magic != SHM_MAGIC ||
        ch->type != MSG_CHALLENGE)
        return refit_error(REFIT_ERR_PEER, "shm: the publisher at %s did not answer: %s", path, strerror(errno));
    uint8_t want[REFIT_SHA256_LEN];
    shm_mac(t, "refit shm publisher proof", hello->nonce, ch->nonce, want);
    if (!refit_ct_equal(want, ch->proof, sizeof(want)))
        return refit_error(REFIT_ERR_AUTH,
                           "shm: the process at %s (pid %d) did not prove the job's secret: not a "
                           "publisher of this job",
                           path, (int)pid);
    return REFIT_OK;
}

/* The grant's descriptors beyond the first message's (SHM_FDS_PER_MSG a message). */
static refit_status_t more_fds(int fd, const char *path, int *fds, size_t *nfds, uint32_t total)
{
    while (*nfds < total) {
        uint32_t hdr[3];
        size_t k = 0;
        ssize_t got = shm_recv_msg(fd, hdr, sizeof(hdr), fds + *nfds, total - *nfds, &k);
        *nfds += k;
        if (got != (ssize_t)sizeof(hdr) || hdr[0] != SHM_MAGIC || hdr[1] != MSG_FDS || hdr[2] != k || k == 0)
            return refit_error(REFIT_ERR_CORRUPT, "shm: malformed descriptors from the publisher at %s (%zu of %u): %s",
                               path, *nfds, total, got < 0 ? strerror(errno) : "bad message");
    }
    return REFIT_OK;
}

/* Maps region i's memory (descriptor rfd) as granted by g, read-only. */
static refit_status_t map_region(shm_region_t *r, const grant_t *g, int rfd, uint32_t i, const char *path)
{
    long page = sysconf(_SC_PAGESIZE);
    struct stat sb;
    uint64_t aligned = g->offset / (uint64_t)page * (uint64_t)page, skew = g->offset - aligned, end;
    if (fstat(rfd, &sb) != 0 || !S_ISREG(sb.st_mode) || !refit_add_u64(g->offset, g->size, &end) ||
        (uint64_t)sb.st_size < end)
        return refit_error(REFIT_ERR_CORRUPT, "shm: region %u's memory from %s is smaller than announced", i, path);
    r->map_len = skew + g->size;
    r->map_base = mmap(NULL, r->map_len ? r->map_len : 1, PROT_READ, MAP_SHARED | MAP_POPULATE, rfd, (off_t)aligned);
    if (r->map_base == MAP_FAILED) {
        r->map_base = NULL;
        return refit_error(REFIT_ERR_TRANSPORT, "shm: mapping region %u from %s: %s", i, path, strerror(errno));
    }
    r->map = (const unsigned char *)r->map_base + skew;
    return REFIT_OK;
}

/* The grants (after the grant header in buf): each region read in place
 * (process_vm_readv) or mapped from the next descriptor. */
static refit_status_t take_grants(refit_peer_t *peer, const unsigned char *grants, const int *fds, size_t nfds,
                                  const char *path)
{
    size_t fi = 0;
    for (uint32_t i = 0; i < peer->nregions; i++) {
        grant_t g;
        memcpy(&g, grants + i * sizeof(grant_t), sizeof(g));
        shm_region_t *r = &peer->regions[i];
        if (g.kind == 0 || g.size != r->size)
            return refit_error(REFIT_ERR_STALE, "shm: region %u of the publisher at %s is %s", i, path,
                               g.kind == 0 ? "no longer exposed" : "of a different size");
        if ((g.kind != SHM_PVM && g.kind != SHM_MEMFD) || (g.kind == SHM_MEMFD && fi >= nfds))
            return refit_error(REFIT_ERR_CORRUPT, "shm: region %u from the publisher at %s: %s", i, path,
                               g.kind == SHM_MEMFD ? "no memory descriptor sent for it" : "unknown kind");
        r->kind = g.kind;
        if (g.kind == SHM_PVM) {
            r->addr = g.addr;
            continue;
        }
        refit_status_t st = map_region(r, &g, fds[fi++], i, path);
        if (st) return st;
    }
    return REFIT_OK;
}

static refit_status_t handshake(refit_transport_t *t, const char *sock, const uint64_t *ids, refit_peer_t *peer)
{
    uint32_t n = peer->nregions;
    struct sockaddr_un sa;
    refit_status_t st = shm_dir_ready(t, false);
    if (st) return st;
    if (!shm_sock_addr(&sa, t->dir, sock)) return refit_error(REFIT_ERR_INVALID_ARG, "shm: %s: path too long", t->dir);
    const char *path = sa.sun_path;
    int fd = -1;
    unsigned char *buf = NULL;
    int *fds = NULL;
    size_t nfds = 0;
    struct ucred cred;
    msg_hello_t hello;
    msg_challenge_t ch;
    if ((st = dial(&sa, peer, &fd, &cred)) || (st = publisher_proof(t, fd, path, cred.pid, &hello, &ch))) goto out;
    size_t alen = sizeof(msg_auth_t) + n * 8ull, glen = sizeof(msg_grant_t) + n * sizeof(grant_t);
    buf = malloc(alen > glen ? alen : glen);
    fds = calloc(n ? n : 1, sizeof(int));
    if (!buf || !fds) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "shm: connect");
        goto out;
    }
    msg_auth_t a = {SHM_MAGIC, MSG_AUTH, {0}, n, 0};
    shm_mac(t, "refit shm receiver proof", hello.nonce, ch.nonce, a.proof);
    memcpy(buf, &a, sizeof(a));
    memcpy(buf + sizeof(a), ids, n * 8ull);
    ssize_t got;
    if (!shm_send_msg(fd, buf, alen, NULL, 0) || (got = shm_recv_msg(fd, buf, glen, fds, n, &nfds)) < 8) {
        st = refit_error(REFIT_ERR_PEER, "shm: the publisher at %s broke off the handshake: %s", path, strerror(errno));
        goto out;
    }
    msg_grant_t gh;
    memcpy(&gh, buf, got >= (ssize_t)sizeof(gh) ? sizeof(gh) : 8);
    if (gh.type == MSG_REFUSED) {
        st = refit_error(REFIT_ERR_AUTH, "shm: the publisher at %s refused our proof of the job's secret", path);
        goto out;
    }
    if ((size_t)got != glen || gh.magic != SHM_MAGIC || gh.type != MSG_GRANT || gh.nregions != n || gh.nfds > n ||
        nfds != (gh.nfds < SHM_FDS_PER_MSG ? gh.nfds : SHM_FDS_PER_MSG)) {
        st = refit_error(REFIT_ERR_CORRUPT, "shm: malformed answer from the publisher at %s", path);
        goto out;
    }
    if (!(st = more_fds(fd, path, fds, &nfds, gh.nfds))) st = take_grants(peer, buf + sizeof(gh), fds, nfds, path);
out:
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    free(fds);
    free(buf);
    if (fd >= 0) close(fd);
    return st;
}

refit_status_t shm_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t n,
                           refit_peer_t **out)
{
    refit_status_t st = REFIT_OK;
    char my_boot[40];
    refit_boot_id(my_boot);
    if (n == 0 || n > SHM_MAX_REGIONS) return refit_error(REFIT_ERR_INVALID_ARG, "shm: %u regions", n);
    refit_peer_t *peer = calloc(1, sizeof(*peer));
    uint64_t *ids = calloc(n, sizeof(uint64_t));
    if (!peer || !ids || !(peer->regions = calloc(n, sizeof(shm_region_t)))) {
        free(peer);
        free(ids);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm peer");
    }
    peer->nregions = n;
    peer->pidfd = -1;
    char sock[48] = "";
    for (uint32_t i = 0; i < n; i++) {
        shm_desc_t d;
        if (!descs[i] || lens[i] != sizeof(d)) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u descriptor has %zu bytes, want %zu", i, lens[i],
                             sizeof(d));
            goto err;
        }
        memcpy(&d, descs[i], sizeof(d));
        d.boot_id[39] = '\0';
        d.sock[47] = '\0';
        if (d.magic != SHM_MAGIC || d.version != SHM_DESC_VERSION) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u descriptor is not a version-%d shm descriptor", i,
                             SHM_DESC_VERSION);
            goto err;
        }
        if (strcmp(d.boot_id, my_boot) != 0) {
            st = refit_error(REFIT_ERR_TRANSPORT, "shm: the source runs on another host (boot id %s, ours %s)",
                             d.boot_id, my_boot);
            goto err;
        }
        /* A file name in our private directory, nothing else. */
        if (!d.sock[0] || strchr(d.sock, '/') || d.sock[0] == '.' || (i && strcmp(d.sock, sock) != 0)) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u names socket \"%s\"", i, d.sock);
            goto err;
        }
        snprintf(sock, sizeof(sock), "%s", d.sock);
        ids[i] = d.region_id;
        peer->regions[i].size = d.size;
    }
    if ((st = handshake(t, sock, ids, peer))) goto err;
    free(ids);
    *out = peer;
    return REFIT_OK;
err:
    free(ids);
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

refit_status_t shm_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
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
        for (uint32_t r = 0; r < peers[s]->nregions; r++) flat[k++] = peers[s]->regions[r].map;
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
        if (p->regions[regs[i].src_region].map) mapped = true; /* what carried the bytes this plan reads */
        else pvm = true;
    }
    pull_ctx_t pc = {peers};
    refit_exec_opts_t o = {.threads = ctl ? ctl->threads : 0,
                           .copy = pvm ? pvm_copy : NULL,
                           .user = &pc,
                           .tick = ctl ? ctl->tick : NULL,
                           .tick_user = ctl ? ctl->user : NULL,
                           .deadline = ctl ? ctl->deadline : 0,
                           .only = only,
                           .skip_fills = true,
                           .dmap = ctl ? ctl->dmap : NULL,
                           .dacc = ctl ? ctl->dacc : NULL,
                           .dbytes = ctl ? ctl->dbytes : NULL};
    st = refit_plan_execute(plan, bases, dst_bases, &o);
    /* A mapping outlives its publisher, so the bytes would look fine; but a
     * publisher that died during the copy may have died while writing them. */
    for (size_t s = 0; !st && s < nsrc; s++)
        if (peers[s] && !peer_alive(peers[s]))
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
