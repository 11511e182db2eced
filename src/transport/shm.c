/* The shm transport: same host, zero copy on the publisher side.
 *
 * Publisher memory from alloc() lives in a memfd, sealed against resizing
 * and against any new writable mapping or write (F_SEAL_FUTURE_WRITE: the
 * publisher's own mapping, made before the seal, stays writable).  Memory
 * the publisher did not get from alloc() is read with process_vm_readv.
 *
 * Nothing a registry entry names is opened or read directly.  The first
 * expose starts a server on a unix socket in a private directory (ours,
 * 0700: $REFIT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/refit, else
 * /tmp/refit-<uid>); a descriptor names only that socket (a random name),
 * a random region id, the size and the host's boot id.  A receiver
 * connects, both sides check the other's credentials (SO_PEERCRED: the same
 * user), prove the job's connection key both ways (nonces and HMACs, as the
 * ucx transport does), and the publisher then hands over, per region asked
 * for, a read-only file descriptor of its memfd (SCM_RIGHTS), or for
 * attached memory its address, read with process_vm_readv from the pid the
 * kernel reported for the socket's peer.  A pidfd of that process tells the
 * receiver when it is gone (a mapping outlives its publisher, so the bytes
 * would look fine; but a publisher that died during the copy may have died
 * while writing them).  Mappings are cached in the peer, prefaulted with
 * MAP_POPULATE, so a steady refit is plain memcpy at memory speed.
 *
 * Options: dir=PATH (the socket directory). */
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

#include "transport/transport.h"
#include "util/crypto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define SHM_MAGIC 0x4d485352u /* "RSHM" */
#define SHM_DESC_VERSION 2
#define SHM_MAX_REGIONS 1024
#define SHM_IO_TIMEOUT_S 5
#define SHM_MAX_HANDSHAKES 64
enum { SHM_MEMFD = 1, SHM_PVM = 2 };
enum { MSG_HELLO = 1, MSG_CHALLENGE = 2, MSG_AUTH = 3, MSG_GRANT = 4, MSG_REFUSED = 5, MSG_FDS = 6 };
/* File descriptors per message: the kernel takes at most SCM_MAX_FD (253)
 * in one SCM_RIGHTS message; more regions go in follow-up MSG_FDS messages. */
#define SHM_FDS_PER_MSG 250

typedef struct {
    uint32_t magic, version;
    uint64_t region_id; /* random, per exposed region */
    uint64_t size;
    char sock[48];      /* socket file name in the runtime directory */
    char boot_id[40];
} shm_desc_t;

/* Handshake messages (SOCK_SEQPACKET: one message each). */
typedef struct {
    uint32_t magic, type;
    uint8_t nonce[16];
} msg_hello_t;
typedef struct {
    uint32_t magic, type;
    uint8_t nonce[16];
    uint8_t proof[REFIT_SHA256_LEN];
} msg_challenge_t;
typedef struct {
    uint32_t magic, type;
    uint8_t proof[REFIT_SHA256_LEN];
    uint32_t nregions, pad;
    /* uint64_t region_ids[nregions] */
} msg_auth_t;
typedef struct {
    uint32_t kind; /* SHM_MEMFD (an fd follows, in order) or SHM_PVM; 0: not exposed */
    uint32_t pad;
    uint64_t size, offset, addr;
} grant_t;
typedef struct {
    uint32_t magic, type;
    uint32_t nregions, nfds;
    /* grant_t grants[nregions] */
} msg_grant_t;

typedef struct {
    void *base;
    uint64_t size;
    int fd;    /* the memfd (read-write: ours) */
    int ro_fd; /* the same file opened read-only: what receivers get */
} shm_alloc_t;

typedef struct {
    uint64_t id;
    const void *base;
    uint64_t size;
    int ro_fd;       /* -1: attached memory (process_vm_readv) */
    uint64_t offset; /* into the memfd */
} shm_export_t;

struct refit_transport {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    REFIT_VEC(shm_alloc_t) allocs;
    REFIT_VEC(shm_export_t) exports;
    uint8_t key[32];
    char dir[PATH_MAX];
    /* the server (started by the first expose) */
    int lfd, stop[2];
    char sock[48];
    char sock_path[PATH_MAX];
    pthread_t thread;
    bool started;
    unsigned handshakes; /* handshake threads running */
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
    int pidfd;           /* -1: no pidfd support: start_time tells */
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

/* ---- the private directory and the socket --------------------------------- */

static refit_status_t private_dir(const char *option, char out[PATH_MAX])
{
    const char *env = getenv("REFIT_RUNTIME_DIR"), *run = getenv("XDG_RUNTIME_DIR");
    if (option && option[0]) snprintf(out, PATH_MAX, "%.4000s", option);
    else if (env && env[0]) snprintf(out, PATH_MAX, "%.4000s", env);
    else if (run && run[0] == '/' && strlen(run) < PATH_MAX - 8) snprintf(out, PATH_MAX, "%.4000s/refit", run);
    else snprintf(out, PATH_MAX, "/tmp/refit-%u", (unsigned)geteuid());
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return refit_error(REFIT_ERR_TRANSPORT, "shm: cannot create %s: %s", out, strerror(errno));
    struct stat sb;
    if (lstat(out, &sb) != 0) return refit_error(REFIT_ERR_TRANSPORT, "shm: %s: %s", out, strerror(errno));
    if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077))
        return refit_error(REFIT_ERR_AUTH,
                           "shm: %s must be a directory of this user (uid %u) that no one else may enter (mode "
                           "0700); it is %s of uid %u, mode %04o",
                           out, (unsigned)geteuid(), S_ISDIR(sb.st_mode) ? "a directory" : "not a directory",
                           (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777));
    if (strlen(out) + 60 > sizeof(((struct sockaddr_un *)0)->sun_path))
        return refit_error(REFIT_ERR_INVALID_ARG, "shm: the socket directory %s is too long for a unix socket path", out);
    return REFIT_OK;
}

/* sun_path of <dir>/<name>; false if it does not fit. */
static bool sock_addr(struct sockaddr_un *sa, const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (dl + 1 + nl + 1 > sizeof(sa->sun_path)) return false;
    memcpy(sa->sun_path, dir, dl);
    sa->sun_path[dl] = '/';
    memcpy(sa->sun_path + dl + 1, name, nl + 1);
    return true;
}

static void shm_mac(const refit_transport_t *t, const char *label, const uint8_t *nc, const uint8_t *ns,
                    uint8_t out[REFIT_SHA256_LEN])
{
    refit_hmac_t h;
    refit_hmac_init(&h, t->key, sizeof(t->key));
    refit_hmac_update(&h, label, strlen(label) + 1);
    refit_hmac_update(&h, nc, 16);
    refit_hmac_update(&h, ns, 16);
    refit_hmac_final(&h, out);
}

static bool peer_uid_ok(int fd, struct ucred *cred)
{
    socklen_t len = sizeof(*cred);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0 && len == sizeof(*cred) &&
           cred->uid == geteuid() && cred->pid > 0;
}

static void set_timeouts(int fd)
{
    struct timeval tv = {SHM_IO_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Sends buf (and fds, as one SCM_RIGHTS control message). */
static bool send_msg(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    struct iovec iov = {(void *)buf, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    char *ctl = NULL;
    if (nfds) {
        size_t cl = CMSG_SPACE(nfds * sizeof(int));
        ctl = calloc(1, cl);
        if (!ctl) return false;
        mh.msg_control = ctl;
        mh.msg_controllen = cl;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    free(ctl);
    return n == (ssize_t)len;
}

/* Receives one message of at most cap bytes; fds received go to fds[] (up
 * to max, *nfds of them; the caller closes them).  Returns its length or -1. */
static ssize_t recv_msg(int fd, void *buf, size_t cap, int *fds, size_t max, size_t *nfds)
{
    struct iovec iov = {buf, cap};
    size_t cl = CMSG_SPACE((max ? max : 1) * sizeof(int));
    char *ctl = calloc(1, cl);
    if (!ctl) return -1;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = cl};
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (nfds) *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *got = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (fds && nfds && *nfds < max) fds[(*nfds)++] = got[i];
            else close(got[i]);
        }
    }
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) n = -1;
    free(ctl);
    return n;
}

/* ---- publisher side: the server ------------------------------------------ */

typedef struct {
    refit_transport_t *t;
    int fd;
} handshake_t;

/* One connection: credentials, the two proofs, then the grants. */
static void serve_client(refit_transport_t *t, int fd)
{
    struct ucred cred;
    if (!peer_uid_ok(fd, &cred)) {
        refit_log(REFIT_LOG_WARN, "shm: refused a connection from uid %u (only uid %u may read this memory)",
                  (unsigned)cred.uid, (unsigned)geteuid());
        return;
    }
    set_timeouts(fd);
    msg_hello_t hello;
    if (recv_msg(fd, &hello, sizeof(hello), NULL, 0, NULL) != (ssize_t)sizeof(hello) || hello.magic != SHM_MAGIC ||
        hello.type != MSG_HELLO)
        return;
    msg_challenge_t ch = {SHM_MAGIC, MSG_CHALLENGE, {0}, {0}};
    if (refit_random_bytes(ch.nonce, sizeof(ch.nonce))) return;
    shm_mac(t, "refit shm publisher proof", hello.nonce, ch.nonce, ch.proof);
    if (!send_msg(fd, &ch, sizeof(ch), NULL, 0)) return;
    size_t cap = sizeof(msg_auth_t) + SHM_MAX_REGIONS * 8;
    unsigned char *buf = malloc(cap);
    if (!buf) return;
    ssize_t n = recv_msg(fd, buf, cap, NULL, 0, NULL);
    msg_auth_t a;
    uint8_t want[REFIT_SHA256_LEN];
    shm_mac(t, "refit shm receiver proof", hello.nonce, ch.nonce, want);
    if (n < (ssize_t)sizeof(a)) goto out;
    memcpy(&a, buf, sizeof(a));
    if (a.magic != SHM_MAGIC || a.type != MSG_AUTH || a.nregions > SHM_MAX_REGIONS ||
        (size_t)n != sizeof(a) + a.nregions * 8ull)
        goto out;
    if (!refit_ct_equal(want, a.proof, sizeof(want))) {
        uint32_t refused[2] = {SHM_MAGIC, MSG_REFUSED};
        send_msg(fd, refused, sizeof(refused), NULL, 0);
        refit_log(REFIT_LOG_WARN, "shm: pid %d did not prove the job's secret; refused", (int)cred.pid);
        goto out;
    }
    size_t glen = sizeof(msg_grant_t) + a.nregions * sizeof(grant_t);
    unsigned char *g = calloc(1, glen);
    int *fds = calloc(a.nregions ? a.nregions : 1, sizeof(int));
    if (!g || !fds) {
        free(g);
        free(fds);
        goto out;
    }
    msg_grant_t gh = {SHM_MAGIC, MSG_GRANT, a.nregions, 0};
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < a.nregions; i++) {
        uint64_t id;
        memcpy(&id, buf + sizeof(a) + 8ull * i, 8);
        grant_t gr = {0};
        for (size_t k = 0; k < t->exports.len; k++) {
            const shm_export_t *e = &t->exports.data[k];
            if (e->id != id) continue;
            gr.size = e->size;
            if (e->ro_fd >= 0) {
                gr.kind = SHM_MEMFD;
                gr.offset = e->offset;
                fds[gh.nfds++] = e->ro_fd;
            } else {
                gr.kind = SHM_PVM;
                gr.addr = (uint64_t)(uintptr_t)e->base;
            }
            break;
        }
        memcpy(g + sizeof(gh) + i * sizeof(grant_t), &gr, sizeof(gr));
    }
    memcpy(g, &gh, sizeof(gh));
    /* Sent under the lock: the fds stay open (unexpose takes the lock).  The
     * grants carry the first SHM_FDS_PER_MSG descriptors, MSG_FDS messages
     * the rest. */
    uint32_t sent = gh.nfds < SHM_FDS_PER_MSG ? gh.nfds : SHM_FDS_PER_MSG;
    bool ok = send_msg(fd, g, glen, fds, sent);
    while (ok && sent < gh.nfds) {
        uint32_t k = gh.nfds - sent < SHM_FDS_PER_MSG ? gh.nfds - sent : SHM_FDS_PER_MSG;
        uint32_t hdr[3] = {SHM_MAGIC, MSG_FDS, k};
        ok = send_msg(fd, hdr, sizeof(hdr), fds + sent, k);
        sent += k;
    }
    int err = errno;
    pthread_mutex_unlock(&t->lock);
    if (!ok)
        refit_log(REFIT_LOG_WARN, "shm: sending %u regions (%u descriptors) to pid %d failed: %s", a.nregions,
                  gh.nfds, (int)cred.pid, strerror(err));
    free(g);
    free(fds);
out:
    free(buf);
}

static void *handshake_main(void *arg)
{
    handshake_t *h = arg;
    refit_transport_t *t = h->t;
    serve_client(t, h->fd);
    close(h->fd);
    free(h);
    pthread_mutex_lock(&t->lock);
    t->handshakes--;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

static void *server_main(void *arg)
{
    refit_transport_t *t = arg;
    for (;;) {
        struct pollfd pf[2] = {{t->lfd, POLLIN, 0}, {t->stop[0], POLLIN, 0}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
        if (pf[1].revents) break;
        if (!(pf[0].revents & POLLIN)) continue;
        int fd = accept4(t->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        /* Each handshake in a thread of its own: a client that stalls holds
         * up no one (it is cut off after SHM_IO_TIMEOUT_S). */
        handshake_t *h = malloc(sizeof(*h));
        pthread_t th;
        pthread_attr_t at;
        pthread_mutex_lock(&t->lock);
        bool room = t->handshakes < SHM_MAX_HANDSHAKES && h;
        if (room) t->handshakes++;
        pthread_mutex_unlock(&t->lock);
        if (room) {
            *h = (handshake_t){t, fd};
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            room = pthread_create(&th, &at, handshake_main, h) == 0;
            pthread_attr_destroy(&at);
            if (!room) {
                pthread_mutex_lock(&t->lock);
                t->handshakes--;
                pthread_mutex_unlock(&t->lock);
            }
        }
        if (!room) {
            free(h);
            close(fd);
        }
    }
    return NULL;
}

/* Starts the server (lock held). */
static refit_status_t server_start(refit_transport_t *t)
{
    if (t->started) return REFIT_OK;
    uint8_t rnd[12];
    refit_status_t st = refit_random_bytes(rnd, sizeof(rnd));
    if (st) return st;
    snprintf(t->sock, sizeof(t->sock), "pub-%u-", (unsigned)getpid());
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(t->sock + strlen(t->sock), sizeof(t->sock) - strlen(t->sock), "%02x", rnd[i]);
    struct sockaddr_un sa;
    if (!sock_addr(&sa, t->dir, t->sock)) return refit_error(REFIT_ERR_INVALID_ARG, "shm: %s: path too long", t->dir);
    memcpy(t->sock_path, sa.sun_path, sizeof(sa.sun_path));
    t->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (t->lfd < 0) return refit_error(REFIT_ERR_TRANSPORT, "shm: socket: %s", strerror(errno));
    if (bind(t->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(t->lfd, 64) != 0) {
        st = refit_error(REFIT_ERR_TRANSPORT, "shm: listening on %s: %s", t->sock_path, strerror(errno));
        close(t->lfd);
        t->lfd = -1;
        return st;
    }
    if (pipe2(t->stop, O_CLOEXEC) != 0 || pthread_create(&t->thread, NULL, server_main, t) != 0) {
        st = refit_error(REFIT_ERR_TRANSPORT, "shm: starting the server: %s", strerror(errno));
        close(t->lfd);
        unlink(t->sock_path);
        t->lfd = -1;
        return st;
    }
    t->started = true;
    return REFIT_OK;
}

static refit_status_t shm_create(const char *options, refit_transport_t **out)
{
    refit_transport_t *t = calloc(1, sizeof(*t));
    if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "shm transport");
    t->lfd = t->stop[0] = t->stop[1] = -1;
    const char *dir = NULL;
    char opt[PATH_MAX + 8] = "";
    if (options && options[0]) {
        snprintf(opt, sizeof(opt), "%s", options);
        if (strncmp(opt, "dir=", 4) != 0 || strchr(opt, ',')) {
            free(t);
            return refit_error(REFIT_ERR_INVALID_ARG, "shm: unknown options '%s' (dir=PATH)", options);
        }
        dir = opt + 4;
    }
    refit_status_t st = private_dir(dir, t->dir);
    if (st) {
        free(t);
        return st;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    *out = t;
    return REFIT_OK;
}

static void shm_set_key(refit_transport_t *t, const uint8_t key[32])
{
    if (t && key) memcpy(t->key, key, sizeof(t->key));
}

static void shm_destroy(refit_transport_t *t)
{
    if (!t) return;
    if (t->started) {
        if (write(t->stop[1], "x", 1) != 1) { /* the thread still sees the pipe closed below */
        }
        pthread_join(t->thread, NULL);
        pthread_mutex_lock(&t->lock);
        while (t->handshakes) pthread_cond_wait(&t->cond, &t->lock);
        pthread_mutex_unlock(&t->lock);
        close(t->lfd);
        close(t->stop[0]);
        close(t->stop[1]);
        unlink(t->sock_path);
    }
    for (size_t i = 0; i < t->allocs.len; i++) {
        munmap(t->allocs.data[i].base, t->allocs.data[i].size);
        close(t->allocs.data[i].fd);
        close(t->allocs.data[i].ro_fd);
    }
    REFIT_VEC_FREE(&t->allocs);
    REFIT_VEC_FREE(&t->exports);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    refit_wipe(t->key, sizeof(t->key));
    free(t);
}

static refit_status_t shm_alloc(refit_transport_t *t, uint64_t size, void **base)
{
    int fd = memfd_create("refit-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return refit_error(REFIT_ERR_NO_MEMORY, "shm: memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm: sizing a %" PRIu64 "-byte memfd: %s", size, strerror(e));
    }
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return refit_error(REFIT_ERR_NO_MEMORY, "shm: mapping %" PRIu64 " bytes: %s", size, strerror(e));
    }
    /* From here on only our mapping writes it; receivers get a read-only
     * descriptor of the same file and can neither write, map it writable
     * (not even after reopening it through /proc), nor resize it. */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int ro = -1;
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 ||
        (ro = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        int e = errno;
        munmap(p, size ? size : 1);
        close(fd);
        return refit_error(REFIT_ERR_TRANSPORT, "shm: sealing the memfd: %s", strerror(e));
    }
    pthread_mutex_lock(&t->lock);
    int rc = REFIT_VEC_PUSH(&t->allocs, ((shm_alloc_t){p, size ? size : 1, fd, ro}));
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        munmap(p, size ? size : 1);
        close(fd);
        close(ro);
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
            close(t->allocs.data[i].ro_fd);
            t->allocs.data[i] = t->allocs.data[--t->allocs.len];
            break;
        }
    pthread_mutex_unlock(&t->lock);
}

static refit_status_t shm_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len)
{
    shm_desc_t *d = calloc(1, sizeof(*d));
    if (!d) return refit_error(REFIT_ERR_NO_MEMORY, "shm descriptor");
    shm_export_t e = {.base = base, .size = size, .ro_fd = -1};
    refit_status_t st = refit_random_bytes(&e.id, sizeof(e.id));
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->allocs.len && !st; i++) {
        const shm_alloc_t *a = &t->allocs.data[i];
        uintptr_t b = (uintptr_t)a->base, p = (uintptr_t)base;
        if (p >= b && p + size <= b + a->size) {
            e.ro_fd = a->ro_fd;
            e.offset = p - b;
            break;
        }
    }
    if (!st) st = server_start(t);
    if (!st && REFIT_VEC_PUSH(&t->exports, e)) st = refit_error(REFIT_ERR_NO_MEMORY, "shm: exports");
    if (!st) {
        *d = (shm_desc_t){.magic = SHM_MAGIC, .version = SHM_DESC_VERSION, .region_id = e.id, .size = size};
        snprintf(d->sock, sizeof(d->sock), "%s", t->sock);
        refit_boot_id(d->boot_id);
    }
    pthread_mutex_unlock(&t->lock);
    if (st) {
        free(d);
        return st;
    }
    *desc = d;
    *len = sizeof(*d);
    return REFIT_OK;
}

static void shm_unexpose(refit_transport_t *t, void *base)
{
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->exports.len; i++)
        if (t->exports.data[i].base == base) {
            t->exports.data[i] = t->exports.data[--t->exports.len];
            break;
        }
    pthread_mutex_unlock(&t->lock);
}

/* ---- receiver side ---------------------------------------------------------- */

static void shm_disconnect(refit_peer_t *peer)
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
static refit_status_t handshake(refit_transport_t *t, const char *sock, const uint64_t *ids, refit_peer_t *peer)
{
    uint32_t n = peer->nregions;
    struct sockaddr_un sa;
    if (!sock_addr(&sa, t->dir, sock)) return refit_error(REFIT_ERR_INVALID_ARG, "shm: %s: path too long", t->dir);
    const char *path = sa.sun_path;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return refit_error(REFIT_ERR_TRANSPORT, "shm: socket: %s", strerror(errno));
    refit_status_t st = REFIT_OK;
    unsigned char *buf = NULL;
    int *fds = NULL;
    size_t nfds = 0;
    set_timeouts(fd);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        st = refit_error(errno == ENOENT || errno == ECONNREFUSED ? REFIT_ERR_PEER : REFIT_ERR_TRANSPORT,
                         "shm: connecting to the publisher at %s: %s", path, strerror(errno));
        goto out;
    }
    struct ucred cred;
    if (!peer_uid_ok(fd, &cred)) {
        st = refit_error(REFIT_ERR_AUTH, "shm: the process at %s runs as uid %u, not as this user (uid %u)", path,
                         (unsigned)cred.uid, (unsigned)geteuid());
        goto out;
    }
    /* Pin the peer's identity now, while its socket is connected to us: a
     * pidfd opened after a long handshake could name a recycled pid. */
    peer->pid = (uint32_t)cred.pid;
    peer->start_time = refit_proc_start_time(peer->pid);
    peer->pidfd = pidfd_of(cred.pid);
    msg_hello_t hello = {SHM_MAGIC, MSG_HELLO, {0}};
    msg_challenge_t ch;
    if ((st = refit_random_bytes(hello.nonce, sizeof(hello.nonce)))) goto out;
    if (!send_msg(fd, &hello, sizeof(hello), NULL, 0) ||
        recv_msg(fd, &ch, sizeof(ch), NULL, 0, NULL) != (ssize_t)sizeof(ch) || ch.magic != SHM_MAGIC ||
        ch.type != MSG_CHALLENGE) {
        st = refit_error(REFIT_ERR_PEER, "shm: the publisher at %s did not answer: %s", path, strerror(errno));
        goto out;
    }
    uint8_t want[REFIT_SHA256_LEN];
    shm_mac(t, "refit shm publisher proof", hello.nonce, ch.nonce, want);
    if (!refit_ct_equal(want, ch.proof, sizeof(want))) {
        st = refit_error(REFIT_ERR_AUTH, "shm: the process at %s (pid %d) did not prove the job's secret: not a "
                         "publisher of this job", path, (int)cred.pid);
        goto out;
    }
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
    if (!send_msg(fd, buf, alen, NULL, 0) || (got = recv_msg(fd, buf, glen, fds, n, &nfds)) < 8) {
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
    while (nfds < gh.nfds) {
        uint32_t hdr[3];
        size_t k = 0;
        got = recv_msg(fd, hdr, sizeof(hdr), fds + nfds, gh.nfds - nfds, &k);
        nfds += k;
        if (got != (ssize_t)sizeof(hdr) || hdr[0] != SHM_MAGIC || hdr[1] != MSG_FDS || hdr[2] != k || k == 0) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: malformed descriptors from the publisher at %s (%zu of %u): %s",
                             path, nfds, gh.nfds, got < 0 ? strerror(errno) : "bad message");
            goto out;
        }
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t fi = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        grant_t g;
        memcpy(&g, buf + sizeof(gh) + i * sizeof(grant_t), sizeof(g));
        shm_region_t *r = &peer->regions[i];
        if (g.kind == 0 || g.size != r->size) {
            st = refit_error(REFIT_ERR_STALE, "shm: region %u of the publisher at %s is %s", i, path,
                             g.kind == 0 ? "no longer exposed" : "of a different size");
            break;
        }
        if ((g.kind != SHM_PVM && g.kind != SHM_MEMFD) || (g.kind == SHM_MEMFD && fi >= nfds)) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u from the publisher at %s: %s", i, path,
                             g.kind == SHM_MEMFD ? "no memory descriptor sent for it" : "unknown kind");
            break;
        }
        r->kind = g.kind;
        if (g.kind == SHM_PVM) {
            r->addr = g.addr;
            continue;
        }
        int rfd = fds[fi++];
        struct stat sb;
        uint64_t aligned = g.offset / (uint64_t)page * (uint64_t)page, skew = g.offset - aligned, end;
        if (fstat(rfd, &sb) != 0 || !S_ISREG(sb.st_mode) || !refit_add_u64(g.offset, g.size, &end) ||
            (uint64_t)sb.st_size < end) {
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u's memory from %s is smaller than announced", i, path);
            break;
        }
        r->map_len = skew + g.size;
        r->map_base = mmap(NULL, r->map_len ? r->map_len : 1, PROT_READ, MAP_SHARED | MAP_POPULATE, rfd, (off_t)aligned);
        if (r->map_base == MAP_FAILED) {
            r->map_base = NULL;
            st = refit_error(REFIT_ERR_TRANSPORT, "shm: mapping region %u from %s: %s", i, path, strerror(errno));
            break;
        }
        r->map = (const unsigned char *)r->map_base + skew;
    }
out:
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    free(fds);
    free(buf);
    close(fd);
    return st;
}

static refit_status_t shm_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t n,
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
            st = refit_error(REFIT_ERR_CORRUPT, "shm: region %u descriptor has %zu bytes, want %zu", i, lens[i], sizeof(d));
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
    refit_exec_opts_t o = {.threads = ctl ? ctl->threads : 0, .copy = pvm ? pvm_copy : NULL, .user = &pc,
                           .tick = ctl ? ctl->tick : NULL, .tick_user = ctl ? ctl->user : NULL,
                           .deadline = ctl ? ctl->deadline : 0, .only = only, .skip_fills = true};
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
    .set_key = shm_set_key,
};
