/* Shared by the shm transport's files: shm.c (memory, descriptors, the socket and its messages),
 * shm_server.c (the publisher's server) and shm_client.c (the receiver: handshake, mappings, pull). */
#ifndef REFIT_TRANSPORT_SHM_INTERNAL_H
#define REFIT_TRANSPORT_SHM_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

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
    char sock[48]; /* socket file name in the runtime directory */
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
    bool per_job_dir; /* dir is the job's own, named from the key (util/userdir.h) */
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
    int pidfd; /* -1: no pidfd support: start_time tells */
    uint64_t start_time;
    shm_region_t *regions;
};

/* shm.c: the socket and its messages */
bool shm_sock_addr(struct sockaddr_un *sa, const char *dir, const char *name);
/* The socket directory checked (and with create made) where it is the job's
 * own (shm.c). */
refit_status_t shm_dir_ready(refit_transport_t *t, bool create);
void shm_mac(const refit_transport_t *t, const char *label, const uint8_t *nc, const uint8_t *ns,
             uint8_t out[REFIT_SHA256_LEN]);
bool shm_peer_uid_ok(int fd, struct ucred *cred);
void shm_set_timeouts(int fd);
bool shm_send_msg(int fd, const void *buf, size_t len, const int *fds, size_t nfds);
ssize_t shm_recv_msg(int fd, void *buf, size_t cap, int *fds, size_t max, size_t *nfds);

/* shm_server.c */
refit_status_t shm_server_start(refit_transport_t *t);

/* shm_client.c */
refit_status_t shm_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t n,
                           refit_peer_t **out);
void shm_disconnect(refit_peer_t *peer);
refit_status_t shm_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                        void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats);

#endif
