/* The shm transport's publisher side: the server thread that answers receivers on the unix socket (shm.c
 * describes the protocol). */
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

typedef struct {
    refit_transport_t *t;
    int fd;
} handshake_t;

/* One connection: credentials, the two proofs, then the grants. */
static void serve_client(refit_transport_t *t, int fd)
{
    struct ucred cred;
    if (!shm_peer_uid_ok(fd, &cred)) {
        refit_log(REFIT_LOG_WARN, "shm: refused a connection from uid %u (only uid %u may read this memory)",
                  (unsigned)cred.uid, (unsigned)geteuid());
        return;
    }
    shm_set_timeouts(fd);
    msg_hello_t hello;
    if (shm_recv_msg(fd, &hello, sizeof(hello), NULL, 0, NULL) != (ssize_t)sizeof(hello) || hello.magic != SHM_MAGIC ||
        hello.type != MSG_HELLO)
        return;
    msg_challenge_t ch = {SHM_MAGIC, MSG_CHALLENGE, {0}, {0}};
    if (refit_random_bytes(ch.nonce, sizeof(ch.nonce))) return;
    shm_mac(t, "refit shm publisher proof", hello.nonce, ch.nonce, ch.proof);
    if (!shm_send_msg(fd, &ch, sizeof(ch), NULL, 0)) return;
    size_t cap = sizeof(msg_auth_t) + SHM_MAX_REGIONS * 8;
    unsigned char *buf = malloc(cap);
    if (!buf) return;
    ssize_t n = shm_recv_msg(fd, buf, cap, NULL, 0, NULL);
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
        shm_send_msg(fd, refused, sizeof(refused), NULL, 0);
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
    bool ok = shm_send_msg(fd, g, glen, fds, sent);
    while (ok && sent < gh.nfds) {
        uint32_t k = gh.nfds - sent < SHM_FDS_PER_MSG ? gh.nfds - sent : SHM_FDS_PER_MSG;
        uint32_t hdr[3] = {SHM_MAGIC, MSG_FDS, k};
        ok = shm_send_msg(fd, hdr, sizeof(hdr), fds + sent, k);
        sent += k;
    }
    int err = errno;
    pthread_mutex_unlock(&t->lock);
    if (!ok)
        refit_log(REFIT_LOG_WARN, "shm: sending %u regions (%u descriptors) to pid %d failed: %s", a.nregions, gh.nfds,
                  (int)cred.pid, strerror(err));
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
refit_status_t shm_server_start(refit_transport_t *t)
{
    if (t->started) return REFIT_OK;
    uint8_t rnd[12];
    refit_status_t st = refit_random_bytes(rnd, sizeof(rnd));
    if (st) return st;
    snprintf(t->sock, sizeof(t->sock), "pub-%u-", (unsigned)getpid());
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(t->sock + strlen(t->sock), sizeof(t->sock) - strlen(t->sock), "%02x", rnd[i]);
    struct sockaddr_un sa;
    if ((st = shm_dir_ready(t, true))) return st;
    if (!shm_sock_addr(&sa, t->dir, t->sock))
        return refit_error(REFIT_ERR_INVALID_ARG, "shm: %s: path too long", t->dir);
    memcpy(t->sock_path, sa.sun_path, sizeof(sa.sun_path));
    t->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (t->lfd < 0) return refit_error(REFIT_ERR_TRANSPORT, "shm: socket: %s", strerror(errno));
    int rc = bind(t->lfd, (struct sockaddr *)&sa, sizeof(sa));
    /* The job's directory removed by its last publisher just now: again. */
    if (rc != 0 && errno == ENOENT && t->per_job_dir && !(st = shm_dir_ready(t, true)))
        rc = bind(t->lfd, (struct sockaddr *)&sa, sizeof(sa));
    if (rc != 0 || listen(t->lfd, 64) != 0) {
        if (!st) st = refit_error(REFIT_ERR_TRANSPORT, "shm: listening on %s: %s", t->sock_path, strerror(errno));
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
