/* The shm transport: same host, zero copy on the publisher side.
 *
 * Publisher memory from alloc() lives in a memfd, sealed against resizing
 * and against any new writable mapping or write (F_SEAL_FUTURE_WRITE: the
 * publisher's own mapping, made before the seal, stays writable).  Memory
 * the publisher did not get from alloc() is read with process_vm_readv.
 *
 * Nothing a registry entry names is opened or read directly.  The first
 * expose starts a server on a unix socket in a private directory (ours,
 * 0700: shm.dir=, $REFIT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/refit, else the
 * job's own /tmp/refit-<uid>-<hex> named from the job's key, util/userdir.h:
 * a fixed /tmp/refit-<uid> could be created first by another user, which
 * disabled shm for us); a descriptor names only that socket (a random name),
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

#include "transport/shm_internal.h"
#include "util/userdir.h"

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
    if (sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state, &v) !=
        2)
        return 0;
    return state == 'Z' || state == 'X' ? 0 : v;
}

/* ---- the private directory and the socket --------------------------------- */

/* Makes dir (0700) if missing (create) and checks it is ours and closed to
 * others. */
static refit_status_t check_private_dir(const char *dir, bool create)
{
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return refit_error(REFIT_ERR_TRANSPORT, "shm: cannot create %s: %s", dir, strerror(errno));
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        /* Not made yet, or gone with its publishers: the connect that
         * follows fails as for any publisher gone (REFIT_ERR_PEER). */
        if (!create && errno == ENOENT) return REFIT_OK;
        return refit_error(REFIT_ERR_TRANSPORT, "shm: %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077))
        return refit_error(REFIT_ERR_AUTH,
                           "shm: %s must be a directory of this user (uid %u) that no one else may enter (mode "
                           "0700); it is %s of uid %u, mode %04o",
                           dir, (unsigned)geteuid(), S_ISDIR(sb.st_mode) ? "a directory" : "not a directory",
                           (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777));
    if (strlen(dir) + 60 > sizeof(((struct sockaddr_un *)0)->sun_path))
        return refit_error(REFIT_ERR_INVALID_ARG, "shm: the socket directory %s is too long for a unix socket path",
                           dir);
    return REFIT_OK;
}

/* The socket directory, ready for a socket (bind: create, or connect):
 * named by configuration and checked at create, or the job's own
 * (userdir.h), named once the job's key is set and made by the first
 * publisher (a receiver only checks it: one that made it would leave it). */
refit_status_t shm_dir_ready(refit_transport_t *t, bool create)
{
    if (!t->per_job_dir) return REFIT_OK;
    if (!t->dir[0])
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "shm: no socket directory: set REFIT_RUNTIME_DIR or XDG_RUNTIME_DIR, or shm.dir= (without "
                           "them a job's directory is named from its key, and this transport has none)");
    return check_private_dir(t->dir, create);
}
/* sun_path of <dir>/<name>; false if it does not fit. */
bool shm_sock_addr(struct sockaddr_un *sa, const char *dir, const char *name)
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

void shm_mac(const refit_transport_t *t, const char *label, const uint8_t *nc, const uint8_t *ns,
             uint8_t out[REFIT_SHA256_LEN])
{
    refit_hmac_t h;
    refit_hmac_init(&h, t->key, sizeof(t->key));
    refit_hmac_update(&h, label, strlen(label) + 1);
    refit_hmac_update(&h, nc, 16);
    refit_hmac_update(&h, ns, 16);
    refit_hmac_final(&h, out);
}

bool shm_peer_uid_ok(int fd, struct ucred *cred)
{
    socklen_t len = sizeof(*cred);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0 && len == sizeof(*cred) && cred->uid == geteuid() &&
           cred->pid > 0;
}

void shm_set_timeouts(int fd)
{
    struct timeval tv = {SHM_IO_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Sends buf (and fds, as one SCM_RIGHTS control message). */
bool shm_send_msg(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
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
ssize_t shm_recv_msg(int fd, void *buf, size_t cap, int *fds, size_t max, size_t *nfds)
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
    refit_status_t st = REFIT_OK;
    if (refit_runtime_dir(dir, t->dir, sizeof(t->dir), NULL)) st = check_private_dir(t->dir, true);
    else t->per_job_dir = true, t->dir[0] = '\0'; /* named by shm_set_key */
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
    if (!t || !key) return;
    memcpy(t->key, key, sizeof(t->key));
    if (t->per_job_dir) refit_job_runtime_dir(key, t->dir, sizeof(t->dir));
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
        /* The job's own directory goes with its last socket (rmdir fails
         * while another publisher's is there; one that starts meanwhile
         * makes it again: shm_server_start). */
        if (t->per_job_dir) rmdir(t->dir);
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
    if (!st) st = shm_server_start(t);
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
