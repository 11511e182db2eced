/* The ucx transport's internal header: the wire formats, the options, the
 * transport's state and the functions its files share.  The design of the
 * transport is in docs/ucx.md; the files are
 *   ucx.c         contexts, workers, create/destroy, the ops table
 *   ucx_opts.c    the options string
 *   ucx_server.c  the publisher side: listener, connections, serving requests
 *   ucx_client.c  the receiver side: descriptors, connect, HELLO, lanes
 *   ucx_pull.c    the receiver side: pull (slots, requests, replies)
 *   ucx_net.c     this host's interfaces and routes as UCX sees them
 */
#ifndef REFIT_TRANSPORT_UCX_INTERNAL_H
#define REFIT_TRANSPORT_UCX_INTERNAL_H

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "transport/ucx/ucx_dl.h"

#include "transport/transport.h"
#include "util/crypto.h"
#include "util/trace.h"

#define UCX_MAGIC 0x58554652u /* "RFUX" */
#define UCX_DESC_VERSION 4    /* 3: requests carry strided runs (wire_run_t); 4: and a condition (wait_t) */
#define UCX_MAX_ADDRS 16
#define UCX_MAX_RUNS 256 /* runs per request: 8 KiB of run list */

enum { AM_HELLO = 17, AM_HELLO_REPLY = 18, AM_REQ = 19, AM_DATA = 20 };
enum { METHOD_AUTO = 0, METHOD_AM = 1, METHOD_GET = 2 };
/* Statuses a publisher puts in replies. */
enum {
    PUB_OK = 0,
    PUB_NO_REGION = 1,
    PUB_RANGE = 2,
    PUB_NO_MEMORY = 3,
    PUB_BAD_ID = 4,
    PUB_AUTH = 5,
    PUB_CHALLENGE = 6,
    PUB_NOT_READY = 7, /* a conditional request's condition did not hold in time, or too many wait */
    PUB_TOO_LARGE = 8, /* the reply would pass the publisher's max_queued */
    PUB_OVERLAP = 9    /* two runs of the request read the same bytes */
};
enum { RMA_OFF = 0, RMA_EMULATED = 2 };
#define NONCE_LEN 16
#define TOKEN_LEN 16
#define UCX_MAX_REPLY (1ull << 30) /* bytes one request may ask for (the largest chunk option) */
#define UCX_MAX_JOBS_PER_CONN 4096 /* requests a connection may have queued or in flight */
#define UCX_MAX_CONNS 1024         /* connections a publisher keeps at once, at most (descriptors permitting) */
#define UCX_AUTH_TIMEOUT_S 10.0    /* default auth_timeout: a connection not proven by then is closed */
/* Descriptors (conn_limits in ucx_server.c): a connection over TCP holds 2
 * (UCX's connection-manager socket and its data socket, measured with
 * 1.13); 3 are counted.  A quarter of the limit, at least 256, is left to
 * the rest of the process (registry, shm, files, the receiver side). */
#define UCX_FDS_PER_CONN 3
#define UCX_FD_RESERVE_MIN 256
#define UCX_NOFILE_MAX 65536u /* the soft limit is raised toward the hard one, not past this */
#define UCX_MAX_UNPROVEN 64   /* connections not yet authenticated, at most (a quarter of the total below it) */
#define UCX_PACKED_SHARES 4   /* packed reply bytes across connections: at most this many max_queued */
#define UCX_STUCK_S 2.0       /* a connection that completed no reply for this long is not reading */
#define UCX_PARKED_CONNS 64   /* parked conditional requests in all: this many connections' max_parked */

static inline const char *pub_status_str(int32_t s)
{
    switch (s) {
    case PUB_NO_REGION: return "region not exposed (unexposed or republished)";
    case PUB_RANGE: return "byte range outside the region";
    case PUB_NO_MEMORY: return "out of memory";
    case PUB_BAD_ID: return "different publisher instance";
    case PUB_AUTH: return "the connection did not prove the job's secret";
    case PUB_NOT_READY: return "the bytes were not written in time (condition not met)";
    case PUB_TOO_LARGE: return "the reply asked for is larger than the publisher's max_queued (ask in smaller chunks)";
    case PUB_OVERLAP: return "the request's runs overlap (the same bytes asked for twice)";
    default: return "unknown error";
    }
}

/* ------------------------------------------------------------------------ */
/* Wire formats (same-endian hosts; the magic catches the others).           */

typedef struct {
    uint8_t family; /* AF_INET or AF_INET6 */
    uint8_t pad[3];
    uint8_t addr[16];
} wire_addr_t;

typedef struct {
    uint32_t magic, version;
    uint64_t pub_id;    /* publisher instance */
    uint64_t region_id; /* exposed region on that publisher */
    uint64_t base, size;
    uint16_t port, naddrs;
    uint32_t rkey_len;
    /* wire_addr_t addrs[naddrs]; rkey bytes */
} wire_desc_t;

/* HELLO, in two phases: 1 carries the client's nonce (the reply carries
 * the publisher's nonce and its proof of the key, nothing else); 2 carries
 * the client's proof (the reply: the regions' sizes). */
typedef struct {
    uint32_t magic, nregions;
    uint64_t pub_id, cookie;
    uint32_t phase, pad;
    uint8_t nonce[NONCE_LEN];
    uint8_t proof[REFIT_SHA256_LEN]; /* phase 2 */
    /* data: uint64_t region_ids[nregions] */
} hello_hdr_t;

typedef struct {
    uint64_t cookie;
    int32_t status, pad;
    uint64_t pub_id;                 /* the instance that answers (a restarted publisher: another one) */
    uint8_t nonce[NONCE_LEN];        /* PUB_CHALLENGE: the publisher's nonce */
    uint8_t proof[REFIT_SHA256_LEN]; /* PUB_CHALLENGE: the publisher's proof */
    /* data (PUB_OK): uint64_t sizes[nregions] (UINT64_MAX: not exposed) */
} hello_reply_t;

typedef struct {
    uint32_t magic, nruns;
    uint32_t seq, idx, gen, pad;
    uint64_t region_id;
    uint64_t pub_id;
    uint8_t token[TOKEN_LEN]; /* the connection's token (derived from both nonces under the key) */
    /* The condition (refit_pull_wait_t; wait_ms 0: none): serve once the
     * word at word_off of region wait_region equals `word` and the byte at
     * flag_off is non-zero, or answer PUB_NOT_READY after wait_ms (at most
     * UCX_MAX_WAIT_MS). */
    uint64_t wait_region, word_off, word, flag_off;
    uint32_t wait_ms;
    uint32_t flags; /* REQ_* */
    /* data: wire_run_t runs[nruns] */
} req_hdr_t;
#define REQ_EAGER 1u /* reply eager whatever its size (a receiver on TCP lanes: ucx_opts_t.tcp_eager) */
/* ucx_opts_t.tcp_eager: when a receiver whose data lanes are all TCP asks for
 * eager replies.  A rendezvous reply lands in its destination (no copy out of
 * UCX's buffer) but costs a round trip: the receiver's answer to the
 * publisher's RTS.  That answer waits in this host's egress queue, which is
 * short unless this process serves data itself (a relay of a fleet: its
 * readers' bytes fill that queue).  AUTO asks for eager replies only for pulls
 * whose caller says so (refit_pull_ctl_t.busy_egress). */
enum { TCP_EAGER_OFF = 0, TCP_EAGER_ON = 1, TCP_EAGER_AUTO = 2 };
#define UCX_MAX_WAIT_MS 10000

/* count runs of len bytes at off, off + stride, ...: the rows of a strided
 * region in 32 bytes instead of 16 per row (a relay's egress carries its own
 * requests beside the bytes it serves: per-row lists were ~9% of the bytes
 * read for megatron:tp=1 -> vllm:tp=4, docs/ucx.md). */
typedef struct {
    uint64_t off, len, stride, count;
} wire_run_t;

typedef struct {
    uint32_t seq, idx, gen;
    int32_t status;
    uint64_t len;
} data_hdr_t;

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

typedef struct {
    char listen_ip[INET6_ADDRSTRLEN];
    char listen_if[IF_NAMESIZE]; /* the interface that has listen_ip */
    uint16_t listen_port;
    bool require_rdma;
    int method, rma;
    uint64_t max_queued;
    unsigned max_parked; /* conditional requests one connection may have waiting */
    char tls[128], devices[128];
    uint64_t chunk, rndv, solo;
    unsigned inflight, spin_us;
    int tcp_eager; /* TCP_EAGER_* */
    double connect_timeout, stall_timeout, auth_timeout;
    double listen_timeout; /* how long create waits for the listen address and its interface (ucx_opts.c) */
} ucx_opts_t;

/* Parses "key=value,..." into *o (defaults for keys not given). */
refit_status_t ucx_parse_opts(const char *s, ucx_opts_t *o);

/* ------------------------------------------------------------------------ */
/* Transport state                                                           */

typedef struct {
    uint64_t id;
    unsigned char *base;
    uint64_t size;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    unsigned inflight; /* replies being sent from it */
    bool dead;         /* unexposed, waiting for inflight to drain */
} pub_region_t;

typedef struct conn conn_t;
struct conn {
    refit_transport_t *t;
    ucp_ep_h ep;
    unsigned refs; /* jobs using it (queued or sending) */
    bool failed, closed;
    bool closing;   /* close once its last reply (a refusal) is sent */
    double created; /* refit_now() at accept: unauthenticated ones are closed after UCX_AUTH_TIMEOUT_S */
    /* Authentication (HELLO phases): nonces, then the proof was checked. */
    bool challenged, authed;
    uint8_t nonce_c[NONCE_LEN], nonce_s[NONCE_LEN], token[TOKEN_LEN];
    uint64_t sending_bytes; /* reply bytes UCX is sending for it (capped by max_queued) */
    uint64_t packed_bytes;  /* of those, in buffers of our own (packed): counted in t->packed_bytes */
    double progress_at;     /* when a data reply of it last completed, or its first one left */
    double read_at;         /* when a data reply of it last completed (0: none yet) */
    unsigned parked;        /* its requests in t->parked */
};

typedef struct job job_t;
struct job {
    job_t *prev, *next; /* in t->sending while UCX sends the reply */
    int type;           /* AM_HELLO or AM_REQ */
    conn_t *conn;
    pub_region_t *region; /* REQ: region being read (counted in inflight) */
    void *pack;           /* packed runs */
    union {
        hello_reply_t hello;
        data_hdr_t data;
    } hdr;
    req_hdr_t req;
    hello_hdr_t hello;
    uint64_t bytes; /* REQ: reply bytes counted in conn->sending_bytes */
    uint64_t total; /* REQ: reply bytes, once checked (runs are checked once) */
    bool checked;   /* REQ: its runs were found inside the region, apart, within the caps */
    double arrived; /* REQ: when it came (a condition waits from then) */
    uint32_t nitems;
    uint64_t items[]; /* REQ: 2 per run; HELLO: region ids, replaced by sizes */
};

/* A conditional request whose condition did not hold yet (t->parked):
 * looked at again only when notify says memory changed, its wait ends,
 * its connection fails, or (a writer that never notifies) every 5 ms. */
typedef struct {
    const uint64_t *word; /* in region w */
    const uint8_t *flag;
    uint64_t want;
    double due;          /* when it is answered PUB_NOT_READY */
    pub_region_t *w, *r; /* the regions it names: unexpose takes it out */
    job_t *job;
} parked_t;

typedef struct pull pull_t;
typedef struct hello_wait hello_wait_t;

struct refit_transport {
    ucx_opts_t o;
    ucp_context_h ctx;  /* receiver side (and RMA registrations when RMA is on) */
    uint64_t ctx_sig;   /* ucx_netif_sig when ctx was made: UCX's device list is fixed then */
    char ctx_devs[256]; /* the active interfaces then ("lo,eth0") */
    ucp_context_h pctx; /* publisher side: only the listen interface */
    uint8_t key[32];    /* connection key (set_key; zeros: public) */
    uint64_t pub_id;
    size_t max_am_header;

    /* Publisher side: everything below lock is guarded by it, and the
     * publisher worker is used only with it held. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ucp_worker_h pw;
    int pw_efd, wake_fd;
    ucp_listener_h listener;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    atomic_uint waiters; /* threads other than the progress thread wanting lock */
    uint16_t port;
    wire_addr_t addrs[UCX_MAX_ADDRS];
    uint16_t naddrs;
    REFIT_VEC(pub_region_t *) regions;
    uint64_t next_region_id;
    REFIT_VEC(conn_t *) conns;
    unsigned max_conns, max_unproven; /* from the descriptor limit (conn_limits) */
    unsigned doomed;                  /* connections conn_req_cb cut off since the last round closed them */
    REFIT_VEC(job_t *) jobs;          /* received, not yet served */
    REFIT_VEC(parked_t) parked;       /* conditional requests waiting for their condition */
    double parked_due;                /* the earliest due among them (or after which to poll) */
    atomic_bool notified;             /* notify() since the last look at the parked ones */
    _Atomic uint64_t notify_ns;       /* the last notify (refit_now_ns) */
    bool parked_stale;                /* a connection with parked requests failed */
    uint64_t packed_bytes;            /* packed reply bytes in flight, all connections */
    job_t *sending;                   /* replies UCX is sending */
    char pub_error[256];              /* first failure of the progress thread */

    /* Receiver side: guarded by rlock. */
    pthread_mutex_t rlock;
    ucp_worker_h rw;
    int rw_efd;
    uint32_t pull_seq;
    REFIT_VEC(pull_t *) active; /* pulls in progress */
    pull_t *progressing;        /* the pull whose thread is progressing the worker, if any */
    hello_wait_t *hello;
    REFIT_VEC(refit_peer_t *) peers;
    /* The last address found unreachable for a whole connect_timeout, with
     * the interfaces then: until unreach_until it is not waited for again
     * while they stay the same (ucx_client.c: reach). */
    wire_addr_t unreach_addr;
    uint64_t unreach_sig;
    double unreach_until;
};

typedef struct {
    uint64_t id, size;
    void *rkey_buf;
    size_t rkey_len;
    ucp_rkey_h rkey;
    uint64_t base;
} peer_region_t;

struct refit_peer {
    refit_transport_t *t; /* NULL once the transport is gone */
    ucp_ep_h ep;
    char name[96]; /* "IP:port" */
    uint64_t pub_id;
    uint32_t nregions;
    peer_region_t *regions;
    ucs_status_t failed; /* set by the error handler */
    bool broken;         /* force-closed after a failed pull */
    bool use_get, rdma;
    bool tcp_only; /* every data lane is TCP: replies eager (ucx_opts_t.tcp_eager) */
    char lanes[160];
    uint8_t token[TOKEN_LEN]; /* proves the handshake in every request */
};

/* ------------------------------------------------------------------------ */
/* Shared by the files of the transport                                      */

/* ucx.c */
refit_status_t ucx_status_code(ucs_status_t s);
/* Makes t->ctx, the receiver side's context (tls=, devices= applied), and
 * records the interfaces it was made with (ctx_sig, ctx_devs). */
refit_status_t ucx_recv_context(refit_transport_t *t);
refit_status_t ucx_err(refit_status_t code, ucs_status_t s, const char *fmt, ...) REFIT_PRINTF(3, 4);
uint64_t ucx_random_id(void);
refit_status_t ucx_init_context(refit_transport_t *t, ucp_config_t *cfg, ucp_context_h *ctx);
void ucx_conn_mac(const refit_transport_t *t, const char *label, uint64_t pub_id, const uint8_t *nc, const uint8_t *ns,
                  uint8_t out[REFIT_SHA256_LEN]);
refit_status_t ucx_make_worker_in(refit_transport_t *t, ucp_context_h ctx, ucp_worker_h *w, int *efd, const char *name);
refit_status_t ucx_set_am(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void *arg);
unsigned ucx_progress_all(ucp_worker_h w);

/* ucx_net.c: this host's network as UCX sees it */
/* A signature of the interfaces that are up and running with an address (what
 * UCX's TCP transport lists at ucp_init); their names, comma-separated, into
 * active (may be NULL). */
uint64_t ucx_netif_sig(char *active, size_t cap);
/* "lo 127.0.0.1 up, eth1 10.0.0.2 down, ...": every interface with an address. */
void ucx_netif_list(char *out, size_t cap);
/* 0 when this host has a route to sa (a UDP connect: nothing is sent), the
 * interface of the source address it would use in via; else the errno. */
int ucx_route_probe(const struct sockaddr *sa, socklen_t sl, char *via, size_t cap);

/* ucx_server.c: the publisher side */
void ucx_job_free(refit_transport_t *t, job_t *j);
unsigned ucx_pub_round(refit_transport_t *t);
void ucx_wake_thread(refit_transport_t *t);
void ucx_notify(refit_transport_t *t);
void ucx_region_release(refit_transport_t *t, pub_region_t *r);
refit_status_t ucx_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len);
void ucx_unexpose(refit_transport_t *t, void *base);

/* ucx_client.c: the receiver side's connections */
void ucx_ep_force_close(refit_transport_t *t, ucp_ep_h ep);
refit_status_t ucx_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t nregions,
                           refit_peer_t **out);
void ucx_disconnect(refit_peer_t *p);

/* ucx_pull.c: the receiver side's pulls */
ucs_status_t ucx_am_data_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                            const ucp_am_recv_param_t *param);

/* One step of waiting on the receiver worker: progresses it; after spin_s
 * without events, sleeps on its event fd (at most 10 ms, and not past
 * `until`).  Callers loop on their own condition. */
void ucx_pwait(refit_transport_t *t, pull_t *pl, double until, double spin_s);

/* Progresses the receive worker, then sleeps (at most 10 ms, until `until`)
 * when nothing happened for spin_s.  rlock held. */
static inline void ucx_rwait(refit_transport_t *t, double until, double spin_s) { ucx_pwait(t, NULL, until, spin_s); }
refit_status_t ucx_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                        void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats);
/* The conditional pulls (REFIT_TEXT_WAIT): pulls whose requests carry the
 * condition (req_hdr_t's wait fields), and ucx_notify. */
extern const refit_transport_wait_t ucx_wait_ext;

#endif
