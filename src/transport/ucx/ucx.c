/* The ucx transport: weights over the network through UCX (UCP API).
 *
 * DESIGN, and the measurements that chose it (UCX 1.13.1 without CUDA, a
 * 2-core VM shared with other jobs, publisher and receiver in two network
 * namespaces joined by veth; bench/ucx_tcp.c, bench/results/ucx-tcp.jsonl):
 *
 *   Receiver-driven pull by active messages.  UCX 1.13 RMA GET on TCP is
 *   emulated with messages (the owner must progress) and ran 0.7-2.7 GB/s
 *   where AM ran 4.2-4.7; forcing UCX's get_zcopy rendezvous here gave
 *   0.91x a plain TCP stream where its default (put_zcopy) gave 1.3-1.5x.
 *   An AM reply in rendezvous is a PUT_ZCOPY from the publisher's memory
 *   straight into the receiver's destination (sendmsg from the source,
 *   recv into the final address: no copy in UCX).  Result: 2 GiB pulls at
 *   1.09x, 1.47x, 1.53x the same run's plain TCP stream (0.9-1.1 GB/s);
 *   UCX_TLS unset picks tcp on the veth (lanes "ucx:tcp/<veth> am").
 *
 *   - Publisher: create() makes a ucp context (AM|WAKEUP; RMA only with
 *     rma=emulated, for tests); the first expose() starts a second context
 *     whose only network device is the listen interface, a worker, a
 *     ucp_listener on "listen=IP[:PORT]" or "listen=IFNAME" (default the
 *     loopback; a wildcard is refused) and a progress thread.  expose()
 *     returns a descriptor: publisher id, a random region id, size, the
 *     listen address and port, and (rma=emulated only) the base address and
 *     the packed rkey of the region.  A
 *     connection proves the job's key both ways before anything is served:
 *     HELLO phase 1 carries the client's nonce and gets the publisher's nonce
 *     and proof, phase 2 the client's proof and gets the regions' sizes; every
 *     REQ carries the connection's token.  The thread serves
 *     REQ messages (up to 256 (offset, length) runs of one region) with one
 *     AM_DATA reply carrying the runs' bytes: a single run is sent from the
 *     exposed memory itself (zero copy), several short runs are packed; a
 *     connection has at most max_queued bytes of replies in flight.
 *     Replies of >= rndv bytes (64K) are forced to rendezvous, shorter ones
 *     to eager (UCX's own switch moves between 8K and 20K with the lanes;
 *     16K replies in rendezvous ran 0.36-0.98 GB/s, eager 0.85-1.7).  It
 *     spins spin_us after activity, then sleeps on the worker's event fd;
 *     unexpose() waits for the replies still reading the region
 *     (force-closing their connections after 5 s), so the caller may free
 *     the memory after.
 *
 *   - Receiver: connect() makes a client endpoint to IP:port (each IP in
 *     turn, each with a share of connect_timeout; error mode PEER, so a dead
 *     publisher is an error, not a hang), says HELLO (both phases: checks
 *     the publisher's proof, the instance and the regions' sizes; a peer
 *     without the key is REFIT_ERR_AUTH) and reads the lanes UCX chose
 *     (ucp_ep_print_info, parsed: 1.13 has no ucp_ep_query for transports).
 *     pull() flattens the plan's strided regions into runs (adjacent runs
 *     coalesced), per peer, every peer at once: a run of >= solo bytes (16K)
 *     is a request of its own (zero copy on both sides; split at chunk, 4M),
 *     shorter runs are batched up to chunk bytes.  Up to inflight * chunk
 *     bytes (32M) per peer are in flight, in up to 4 * inflight requests.
 *     Rendezvous replies are received with ucp_am_recv_data_nbx into the
 *     destination (one run) or a staging buffer then scattered (a batch);
 *     eager replies are copied out of UCX's buffer.  Packing costs a copy
 *     on each side: 16K rows moved at 1.6x TCP zero copy against 0.5x
 *     packed; 4K rows (packed) at 0.85x.  Chunk 1M-16M, 2-16 in flight and
 *     spin 0-2000 us were all within this host's noise (+-20%), as were
 *     UCX_TCP_SNDBUF/RCVBUF, UCX_TCP_MAX_POLL and segment sizes: no UCX
 *     variable is changed (options tls= and devices= set UCX_TLS and
 *     UCX_NET_DEVICES through ucp_config_modify when asked).
 *
 *   - No RMA in production.  UCP's RMA feature installs software handlers
 *     that read or write any address a peer names, on every interface
 *     (TCP, shared memory, and the active-message lanes of RDMA transports
 *     too), before any refit handshake; RDMA verbs lanes move active-message
 *     rendezvous replies zero-copy without it.  "rma=emulated" (refused
 *     unless $REFIT_UNSAFE_RMA=1: tests) turns it on so that "method=get"
 *     (ucp_get_nbx with the rkey, one get per run) stays tested; "method=am"
 *     (the default, auto) never uses it.  stats->lanes reports
 *     "ucx:<tl>/<dev>[+...] am|get".  "require=rdma" fails connect with
 *     REFIT_ERR_TRANSPORT when no lane is RDMA (a silent TCP fallback once
 *     cost ModelExpress users 7x).  Replies are accepted only over the
 *     endpoint the request went out on.
 *
 *   - Every wait is bounded: connect by connect_timeout, pull by
 *     ctl->deadline (REFIT_ERR_TIMEOUT), by stall_timeout without a reply
 *     from a peer, and a peer whose endpoint fails fails the pull with
 *     REFIT_ERR_PEER naming it (a SIGKILLed publisher: ~0.1 s).  ctl->tick
 *     runs every 50 ms.  After a failure, requests in flight are drained
 *     (replies of live peers get 1 s, then endpoints are force-closed, which
 *     completes or cancels them), so UCX does not write into the caller's
 *     memory after pull returns; only if a request still were not done 2 s
 *     after its endpoint's force-close would its slot be leaked (kept, never
 *     freed) rather than risk a write into freed memory, and a rendezvous
 *     receive or get of it could then still land in the destination.  A
 *     force-closed peer fails later pulls with REFIT_ERR_PEER until it is
 *     reconnected (receivers reconnect every source after a failed pull).
 *     Fill regions are the caller's, as with every transport.
 *
 * Options ("key=value,..."): listen=IP[:PORT]|IFNAME (the loopback),
 * rma=off|emulated (off; emulated: tests, with $REFIT_UNSAFE_RMA=1), require=rdma, method=auto|am|get, tls=LIST and
 * devices=LIST ('+' separated), chunk=BYTES (4M), inflight=N (8), solo=BYTES
 * (16K), rndv=BYTES|auto (64K), spin_us=N (100), max_queued=BYTES (256M),
 * connect_timeout=S (10), stall_timeout=S (30), auth_timeout=S (10: a peer that
 * has not proven the key by then is disconnected; at most 1024 connections).  UCX_* environment
 * variables apply as usual.
 *
 * Threads: the publisher side is served by its own thread.  On the receiver
 * side connect and disconnect may be called from any thread, and pulls from
 * several threads at once (a fleet reads chunks from several holders in
 * parallel): they share one worker under rlock, which a pull holds except
 * while it sleeps or runs its tick.  Callbacks find their pull through the
 * slot (data replies by sequence number); whoever progresses the worker and
 * completes another pull's slot wakes that pull's thread (its eventfd).
 * Disconnect every peer before destroying its transport (a peer left over is
 * closed by destroy and must still be disconnected).
 */
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

#include "transport/transport.h"
#include "util/crypto.h"

#define UCX_MAGIC 0x58554652u /* "RFUX" */
#define UCX_DESC_VERSION 2
#define UCX_MAX_ADDRS 16
#define UCX_MAX_RUNS 256 /* runs per request: 4 KiB of run list */

enum { AM_HELLO = 17, AM_HELLO_REPLY = 18, AM_REQ = 19, AM_DATA = 20 };
enum { METHOD_AUTO = 0, METHOD_AM = 1, METHOD_GET = 2 };
/* Statuses a publisher puts in replies. */
enum { PUB_OK = 0, PUB_NO_REGION = 1, PUB_RANGE = 2, PUB_NO_MEMORY = 3, PUB_BAD_ID = 4, PUB_AUTH = 5,
       PUB_CHALLENGE = 6 };
enum { RMA_OFF = 0, RMA_EMULATED = 2 };
#define NONCE_LEN 16
#define TOKEN_LEN 16
#define UCX_MAX_REPLY (1ull << 30) /* bytes one request may ask for (the largest chunk option) */
#define UCX_MAX_JOBS_PER_CONN 4096 /* requests a connection may have queued or in flight */
#define UCX_MAX_CONNS 1024         /* connections a publisher keeps at once */
#define UCX_AUTH_TIMEOUT_S 10.0    /* default auth_timeout: a connection not proven by then is closed */

static const char *pub_status_str(int32_t s)
{
    switch (s) {
    case PUB_NO_REGION: return "region not exposed (unexposed or republished)";
    case PUB_RANGE: return "byte range outside the region";
    case PUB_NO_MEMORY: return "out of memory";
    case PUB_BAD_ID: return "different publisher instance";
    case PUB_AUTH: return "the connection did not prove the job's secret";
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
    /* data: wire_run_t runs[nruns] */
} req_hdr_t;

typedef struct {
    uint64_t off, len;
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
    char tls[128], devices[128];
    uint64_t chunk, rndv, solo;
    unsigned inflight, spin_us;
    double connect_timeout, stall_timeout, auth_timeout;
} ucx_opts_t;

static bool parse_u64(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v) return false;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
    if (*end) return false;
    return refit_mul_u64(x, mul, out);
}

static void copy_list(char *dst, size_t cap, const char *v)
{
    snprintf(dst, cap, "%s", v);
    for (char *p = dst; *p; p++)
        if (*p == '+') *p = ',';
}

/* The listener binds one address, never every interface: listen= names an
 * address (which must be one of this host's) or an interface (its first
 * address); the default is the loopback.  listen_if becomes the only
 * network device UCX uses on the publisher side. */
static refit_status_t resolve_listen(ucx_opts_t *o)
{
    unsigned char want[16];
    int family = inet_pton(AF_INET, o->listen_ip, want) == 1 ? AF_INET
                 : inet_pton(AF_INET6, o->listen_ip, want) == 1 ? AF_INET6 : 0;
    if (family == AF_INET ? !memcmp(want, (unsigned char[4]){0}, 4)
                          : family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED((struct in6_addr *)want))
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "ucx: listen=%s would accept connections on every interface: name the address or the "
                           "interface receivers reach (listen=10.0.0.5, listen=eth0)", o->listen_ip);
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0) return refit_error(REFIT_ERR_TRANSPORT, "ucx: getifaddrs: %s", strerror(errno));
    bool found = false;
    for (struct ifaddrs *i = ifa; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_name) continue;
        int f = i->ifa_addr->sa_family;
        if (f != AF_INET && f != AF_INET6) continue;
        const void *a = f == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                     : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (family) {
            found = f == family && !memcmp(a, want, f == AF_INET ? 4 : 16);
        } else if (!strcmp(i->ifa_name, o->listen_ip)) { /* an interface: its IPv4, else a global IPv6 */
            if (f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)) continue;
            if (f == AF_INET6) {
                bool v4 = false;
                for (struct ifaddrs *j = ifa; j; j = j->ifa_next)
                    v4 |= j->ifa_addr && j->ifa_name && !strcmp(j->ifa_name, i->ifa_name) &&
                          j->ifa_addr->sa_family == AF_INET;
                if (v4) continue;
            }
            found = true;
            snprintf(o->listen_if, sizeof(o->listen_if), "%s", i->ifa_name);
            inet_ntop(f, a, o->listen_ip, sizeof(o->listen_ip));
            break;
        }
        if (found) snprintf(o->listen_if, sizeof(o->listen_if), "%s", i->ifa_name);
    }
    freeifaddrs(ifa);
    if (!found)
        return refit_error(REFIT_ERR_INVALID_ARG, "ucx: listen=%s: no interface of this host %s", o->listen_ip,
                           family ? "has that address" : "of that name has an address");
    return REFIT_OK;
}

static refit_status_t parse_opts(const char *s, ucx_opts_t *o)
{
    *o = (ucx_opts_t){.listen_ip = "127.0.0.1", .chunk = 4u << 20, .rndv = 64u << 10, .solo = 16u << 10, .inflight = 8,
                      .spin_us = 100, .connect_timeout = 10, .stall_timeout = 30, .max_queued = 256u << 20,
                      .auth_timeout = UCX_AUTH_TIMEOUT_S};
    if (!s) return resolve_listen(o);
    char *dup = refit_strdup(s), *save = NULL;
    if (!dup) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: options");
    refit_status_t st = REFIT_OK;
    for (char *kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *v = strchr(kv, '=');
        if (!v) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: option '%s' is not key=value", kv);
            break;
        }
        *v++ = 0;
        uint64_t n = 0;
        bool ok = true;
        if (!strcmp(kv, "listen")) {
            /* IP, IP:PORT, [IPv6]:PORT or :PORT */
            char *port = NULL;
            if (*v == '[') {
                char *e = strchr(v, ']');
                if (!e) ok = false;
                else {
                    *e = 0;
                    port = e[1] == ':' ? e + 2 : NULL;
                    v++;
                }
            } else if (strchr(v, ':') == strrchr(v, ':') && strchr(v, ':')) {
                port = strchr(v, ':');
                *port++ = 0;
            }
            if (ok && *v) snprintf(o->listen_ip, sizeof(o->listen_ip), "%s", v);
            if (ok && port) ok = parse_u64(port, &n) && n <= 65535, o->listen_port = (uint16_t)n;
            unsigned char tmp[16];
            /* An address, or the name of an interface (resolve_listen). */
            if (ok && inet_pton(AF_INET, o->listen_ip, tmp) != 1 && inet_pton(AF_INET6, o->listen_ip, tmp) != 1 &&
                (strlen(o->listen_ip) >= IF_NAMESIZE || !if_nametoindex(o->listen_ip)))
                ok = false;
        } else if (!strcmp(kv, "rma")) {
            if (!strcmp(v, "off")) o->rma = RMA_OFF;
            else if (!strcmp(v, "emulated")) o->rma = RMA_EMULATED;
            else ok = false;
        } else if (!strcmp(kv, "max_queued")) {
            ok = parse_u64(v, &o->max_queued) && o->max_queued >= (1u << 20);
        } else if (!strcmp(kv, "require")) {
            if (!strcmp(v, "rdma")) o->require_rdma = true;
            else if (!strcmp(v, "none") || !*v) o->require_rdma = false;
            else ok = false;
        } else if (!strcmp(kv, "method")) {
            if (!strcmp(v, "auto")) o->method = METHOD_AUTO;
            else if (!strcmp(v, "am")) o->method = METHOD_AM;
            else if (!strcmp(v, "get")) o->method = METHOD_GET;
            else ok = false;
        } else if (!strcmp(kv, "tls")) {
            copy_list(o->tls, sizeof(o->tls), v);
        } else if (!strcmp(kv, "devices")) {
            copy_list(o->devices, sizeof(o->devices), v);
        } else if (!strcmp(kv, "chunk")) {
            ok = parse_u64(v, &o->chunk) && o->chunk >= 4096 && o->chunk <= (1ull << 30);
        } else if (!strcmp(kv, "solo")) {
            ok = parse_u64(v, &o->solo) && o->solo > 0;
        } else if (!strcmp(kv, "rndv")) {
            if (!strcmp(v, "auto")) o->rndv = 0; /* UCX chooses */
            else ok = parse_u64(v, &o->rndv) && o->rndv > 0;
        } else if (!strcmp(kv, "inflight")) {
            ok = parse_u64(v, &n) && n >= 1 && n <= 1024;
            o->inflight = (unsigned)n;
        } else if (!strcmp(kv, "spin_us")) {
            ok = parse_u64(v, &n) && n <= 10000000;
            o->spin_us = (unsigned)n;
        } else if (!strcmp(kv, "connect_timeout") || !strcmp(kv, "stall_timeout") || !strcmp(kv, "auth_timeout")) {
            char *end;
            double d = strtod(v, &end);
            ok = end != v && !*end && d > 0 && d < 1e6;
            if (kv[0] == 'c') o->connect_timeout = d;
            else if (kv[0] == 'a') o->auth_timeout = d;
            else o->stall_timeout = d;
        } else {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: unknown option '%s'", kv);
            break;
        }
        if (!ok) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: bad value '%s' for option '%s'", v, kv);
            break;
        }
    }
    free(dup);
    if (!st && o->method == METHOD_GET && o->rma == RMA_OFF)
        st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: method=get needs rma=emulated (tests only)");
    const char *unsafe = getenv("REFIT_UNSAFE_RMA");
    if (!st && o->rma == RMA_EMULATED && !(unsafe && !strcmp(unsafe, "1")))
        st = refit_error(REFIT_ERR_INVALID_ARG,
                         "ucx: rma=emulated lets any peer that reaches this process read and write any address in it "
                         "(UCX serves RMA in software); it exists for tests and needs REFIT_UNSAFE_RMA=1");
    return st ? st : resolve_listen(o);
}

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
    bool closing; /* close once its last reply (a refusal) is sent */
    double created; /* refit_now() at accept: unauthenticated ones are closed after UCX_AUTH_TIMEOUT_S */
    /* Authentication (HELLO phases): nonces, then the proof was checked. */
    bool challenged, authed;
    uint8_t nonce_c[NONCE_LEN], nonce_s[NONCE_LEN], token[TOKEN_LEN];
    uint64_t sending_bytes; /* reply bytes UCX is sending for it (capped by max_queued) */
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
    uint32_t nitems;
    uint64_t items[]; /* REQ: 2 per run; HELLO: region ids, replaced by sizes */
};

typedef struct pull pull_t;
typedef struct hello_wait hello_wait_t;

struct refit_transport {
    ucx_opts_t o;
    ucp_context_h ctx;  /* receiver side (and RMA registrations when RMA is on) */
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
    REFIT_VEC(job_t *) jobs; /* received, not yet served */
    job_t *sending;          /* replies UCX is sending */
    char pub_error[256]; /* first failure of the progress thread */

    /* Receiver side: guarded by rlock. */
    pthread_mutex_t rlock;
    ucp_worker_h rw;
    int rw_efd;
    uint32_t pull_seq;
    REFIT_VEC(pull_t *) active; /* pulls in progress */
    pull_t *progressing;        /* the pull whose thread is progressing the worker, if any */
    hello_wait_t *hello;
    REFIT_VEC(refit_peer_t *) peers;
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
    char lanes[160];
    uint8_t token[TOKEN_LEN]; /* proves the handshake in every request */
};

/* The refit status for a UCX failure of an operation with a peer. */
static refit_status_t status_code(ucs_status_t s)
{
    switch (s) {
    case UCS_ERR_NO_MEMORY: return REFIT_ERR_NO_MEMORY;
    case UCS_ERR_TIMED_OUT: return REFIT_ERR_TIMEOUT;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_MESSAGE_TRUNCATED: return REFIT_ERR_PEER;
    default: return REFIT_ERR_TRANSPORT;
    }
}

static refit_status_t ucx_err(refit_status_t code, ucs_status_t s, const char *fmt, ...) REFIT_PRINTF(3, 4);
static refit_status_t ucx_err(refit_status_t code, ucs_status_t s, const char *fmt, ...)
{
    char buf[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return refit_error(code, "ucx: %s: %s", buf, ucs_status_string(s));
}

/* ------------------------------------------------------------------------ */
/* Context                                                                   */

static uint64_t random_id(void)
{
    uint64_t x = 0;
    if (refit_random_bytes(&x, sizeof(x))) x = refit_mix64(refit_now_ns() ^ ((uint64_t)getpid() << 32));
    return x ? x : 1;
}

/* A UCP context for this transport.  RMA is enabled only when asked for
 * (rma=emulated: tests): without it UCX
 * installs no handler that reads or writes memory for a peer, so the only
 * way to get bytes out of this process is refit's own checked protocol. */
static refit_status_t init_context(refit_transport_t *t, ucp_config_t *cfg, ucp_context_h *ctx)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                                    UCP_PARAM_FIELD_NAME,
                      .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (t->o.rma != RMA_OFF ? UCP_FEATURE_RMA : 0),
                      .mt_workers_shared = 1,
                      .name = "refit"};
    ucs_status_t s = ucp_init(&p, cfg, ctx);
    return s == UCS_OK ? REFIT_OK : ucx_err(REFIT_ERR_TRANSPORT, s, "ucp_init");
}

static void ucx_set_key(refit_transport_t *t, const uint8_t key[32])
{
    if (t && key) memcpy(t->key, key, sizeof(t->key));
}

/* HMAC(key, label || pub_id || nonce_c || nonce_s): the proofs and the token. */
static void conn_mac(const refit_transport_t *t, const char *label, uint64_t pub_id, const uint8_t *nc,
                     const uint8_t *ns, uint8_t out[REFIT_SHA256_LEN])
{
    refit_hmac_t h;
    uint8_t id[8];
    refit_put_le(id, pub_id, 8);
    refit_hmac_init(&h, t->key, sizeof(t->key));
    refit_hmac_update(&h, label, strlen(label) + 1);
    refit_hmac_update(&h, id, sizeof(id));
    refit_hmac_update(&h, nc, NONCE_LEN);
    refit_hmac_update(&h, ns, NONCE_LEN);
    refit_hmac_final(&h, out);
}

static refit_status_t ucx_create(const char *options, refit_transport_t **out)
{
    refit_status_t st;
    ucp_config_t *cfg = NULL;
    ucs_status_t s;
    refit_transport_t *t = calloc(1, sizeof(*t));
    if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: create");
    t->pw_efd = t->wake_fd = t->rw_efd = -1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->rlock, NULL);
    pthread_cond_init(&t->cond, NULL);
    if ((st = parse_opts(options, &t->o))) goto fail;
    t->pub_id = random_id();
    t->next_region_id = 1;
    atomic_init(&t->stop, false);
    atomic_init(&t->waiters, 0);

    if ((s = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK) {
        st = ucx_err(REFIT_ERR_TRANSPORT, s, "reading the UCX configuration");
        goto fail;
    }
    if (t->o.tls[0] && (s = ucp_config_modify(cfg, "TLS", t->o.tls)) != UCS_OK) {
        st = ucx_err(REFIT_ERR_INVALID_ARG, s, "tls=%s", t->o.tls);
        goto fail;
    }
    if (t->o.devices[0] && (s = ucp_config_modify(cfg, "NET_DEVICES", t->o.devices)) != UCS_OK) {
        st = ucx_err(REFIT_ERR_INVALID_ARG, s, "devices=%s", t->o.devices);
        goto fail;
    }
    if (t->o.rma == RMA_EMULATED)
        refit_log(REFIT_LOG_WARN, "ucx: rma=emulated: UCX serves RMA over TCP and shared memory in software, reading "
                                  "and writing any address a peer names: for tests only");
    if ((st = init_context(t, cfg, &t->ctx))) goto fail;
    ucp_config_release(cfg);
    *out = t;
    return REFIT_OK;
fail:
    if (cfg) ucp_config_release(cfg);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->rlock);
    pthread_cond_destroy(&t->cond);
    free(t);
    return st;
}

/* Creates a worker of context ctx with wakeup; *efd is its event fd. */
static refit_status_t make_worker_in(refit_transport_t *t, ucp_context_h ctx, ucp_worker_h *w, int *efd,
                                     const char *name)
{
    ucs_status_t s;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED,
                              .name = name};
    if ((s = ucp_worker_create(ctx, &wp, w)) != UCS_OK) return ucx_err(REFIT_ERR_TRANSPORT, s, "ucp_worker_create");
    if ((s = ucp_worker_get_efd(*w, efd)) != UCS_OK) {
        ucp_worker_destroy(*w);
        *w = NULL;
        return ucx_err(REFIT_ERR_TRANSPORT, s, "ucp_worker_get_efd");
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if (ucp_worker_query(*w, &wa) == UCS_OK) t->max_am_header = wa.max_am_header;
    return REFIT_OK;
}

static refit_status_t set_am(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = id,
                                 .flags = UCP_AM_FLAG_WHOLE_MSG,
                                 .cb = cb,
                                 .arg = arg};
    ucs_status_t s = ucp_worker_set_am_recv_handler(w, &hp);
    return s == UCS_OK ? REFIT_OK : ucx_err(REFIT_ERR_TRANSPORT, s, "setting an active message handler");
}

/* Progresses w until it has no more work or `max` rounds passed. */
static unsigned progress_all(ucp_worker_h w)
{
    unsigned total = 0, n, rounds = 0;
    while ((n = ucp_worker_progress(w)) && rounds++ < 64) total += n;
    return total;
}

/* ------------------------------------------------------------------------ */
/* Publisher side                                                            */

static void conn_unref(conn_t *c);

static void conn_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    conn_t *c = arg;
    c->failed = true; /* closed by the progress thread, once no job uses it */
}

static void conn_close(conn_t *c)
{
    if (c->closed) return;
    c->closed = true;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(c->ep, &rp);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r); /* released when it completes */
}

static void conn_req_cb(ucp_conn_request_h creq, void *arg)
{
    refit_transport_t *t = arg;
    conn_t *c = t->conns.len < UCX_MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
    if (!c || REFIT_VEC_RESERVE(&t->conns, t->conns.len + 1)) {
        free(c);
        ucp_listener_reject(t->listener, creq);
        return;
    }
    c->t = t;
    c->created = refit_now();
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .conn_request = creq,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {conn_err_cb, c}};
    if (ucp_ep_create(t->pw, &ep, &c->ep) != UCS_OK) {
        free(c);
        return; /* the client sees its endpoint fail or its hello time out */
    }
    t->conns.data[t->conns.len++] = c;
}

static conn_t *conn_of(refit_transport_t *t, ucp_ep_h ep)
{
    for (size_t i = 0; i < t->conns.len; i++)
        if (t->conns.data[i]->ep == ep && !t->conns.data[i]->closed) return t->conns.data[i];
    return NULL;
}

static pub_region_t *region_of(refit_transport_t *t, uint64_t id)
{
    for (size_t i = 0; i < t->regions.len; i++)
        if (t->regions.data[i]->id == id && !t->regions.data[i]->dead) return t->regions.data[i];
    return NULL;
}

/* AM handlers of the publisher: queue a job (replies are sent outside UCX callbacks). */
static ucs_status_t queue_job(refit_transport_t *t, int type, const void *hdr, size_t hdr_len, const void *data,
                              size_t len, const ucp_am_recv_param_t *param)
{
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        return UCS_OK; /* not from a refit receiver: drop */
    conn_t *c = conn_of(t, param->reply_ep);
    if (!c || c->failed || c->closing) return UCS_OK;
    if (c->refs >= UCX_MAX_JOBS_PER_CONN) {
        /* A client that keeps asking without reading its replies: cut it off
         * rather than queue without bound. */
        refit_log(REFIT_LOG_WARN, "ucx: a connection has %u requests queued; closing it", c->refs);
        c->failed = true;
        return UCS_OK;
    }
    /* UCX may hand headers over unaligned: copy before reading. */
    uint32_t n;
    req_hdr_t rh;
    hello_hdr_t hh;
    if (type == AM_REQ) {
        if (hdr_len != sizeof(rh)) return UCS_OK;
        memcpy(&rh, hdr, sizeof(rh));
        if (rh.magic != UCX_MAGIC || rh.nruns == 0 || rh.nruns > UCX_MAX_RUNS || len != rh.nruns * sizeof(wire_run_t))
            return UCS_OK;
        n = rh.nruns * 2;
    } else {
        if (hdr_len != sizeof(hh)) return UCS_OK;
        memcpy(&hh, hdr, sizeof(hh));
        if (hh.magic != UCX_MAGIC || hh.nregions > 65536 || len != hh.nregions * 8ull ||
            (hh.phase != 1 && hh.phase != 2) || (hh.phase == 1 && hh.nregions)) /* ids only once proven */
            return UCS_OK;
        n = hh.nregions;
    }
    job_t *j = calloc(1, sizeof(*j) + (size_t)n * 8);
    if (!j || REFIT_VEC_PUSH(&t->jobs, j)) {
        free(j);
        return UCS_OK; /* the receiver times out; nothing better to do */
    }
    j->type = type;
    j->conn = c;
    c->refs++;
    j->nitems = n;
    if (type == AM_REQ) j->req = rh;
    else j->hello = hh;
    if (len) memcpy(j->items, data, len);
    return UCS_OK;
}

static ucs_status_t am_req_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                              const ucp_am_recv_param_t *param)
{
    return queue_job(arg, AM_REQ, hdr, hdr_len, data, len, param);
}

static ucs_status_t am_hello_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                                const ucp_am_recv_param_t *param)
{
    return queue_job(arg, AM_HELLO, hdr, hdr_len, data, len, param);
}

static void job_free(refit_transport_t *t, job_t *j)
{
    if (j->prev) j->prev->next = j->next;
    else if (t->sending == j) t->sending = j->next;
    if (j->next) j->next->prev = j->prev;
    if (j->region) {
        j->region->inflight--;
        pthread_cond_broadcast(&t->cond);
    }
    j->conn->sending_bytes -= j->bytes;
    free(j->pack);
    conn_unref(j->conn);
    free(j);
}

static void job_sent_cb(void *request, ucs_status_t status, void *user)
{
    (void)status;
    job_t *j = user;
    refit_transport_t *t = j->conn->t;
    if (status != UCS_OK) j->conn->failed = true;
    job_free(t, j);
    ucp_request_free(request);
}

static void conn_unref(conn_t *c)
{
    c->refs--;
}

/* The reply to a HELLO: phase 1 answers with the publisher's nonce and its
 * proof of the key (nothing about the regions); phase 2 checks the
 * client's proof and only then says which regions exist and their sizes.
 * A client that fails the check is told so and cut off. */
static void hello_reply(refit_transport_t *t, job_t *j, const void **buf, size_t *len)
{
    conn_t *c = j->conn;
    hello_reply_t *h = &j->hdr.hello;
    memset(h, 0, sizeof(*h));
    h->cookie = j->hello.cookie;
    *buf = NULL;
    *len = 0;
    if (j->hello.phase == 1) {
        memcpy(c->nonce_c, j->hello.nonce, NONCE_LEN);
        if (refit_random_bytes(c->nonce_s, NONCE_LEN)) {
            h->status = PUB_NO_MEMORY;
            return;
        }
        c->challenged = true;
        c->authed = false;
        h->status = PUB_CHALLENGE;
        h->pub_id = t->pub_id;
        memcpy(h->nonce, c->nonce_s, NONCE_LEN);
        conn_mac(t, "refit ucx publisher proof", t->pub_id, c->nonce_c, c->nonce_s, h->proof);
        return;
    }
    uint8_t want[REFIT_SHA256_LEN];
    if (c->challenged) conn_mac(t, "refit ucx receiver proof", t->pub_id, c->nonce_c, c->nonce_s, want);
    if (!c->challenged || !refit_ct_equal(want, j->hello.proof, sizeof(want)) ||
        memcmp(c->nonce_c, j->hello.nonce, NONCE_LEN) != 0) {
        h->status = PUB_AUTH;
        c->closing = true; /* closed once the refusal is sent */
        refit_log(REFIT_LOG_WARN, "ucx: a client failed to prove the job's secret; connection closed");
        return;
    }
    if (j->hello.pub_id != t->pub_id) { /* the right job, another instance: nothing to say */
        h->status = PUB_BAD_ID;
        return;
    }
    uint8_t tok[REFIT_SHA256_LEN];
    conn_mac(t, "refit ucx token", t->pub_id, c->nonce_c, c->nonce_s, tok);
    memcpy(c->token, tok, TOKEN_LEN);
    c->authed = true;
    h->status = PUB_OK;
    for (uint32_t i = 0; i < j->nitems; i++) {
        pub_region_t *r = region_of(t, j->items[i]);
        j->items[i] = r ? r->size : UINT64_MAX;
    }
    *buf = j->items;
    *len = (size_t)j->nitems * 8;
}

/* Checks a request: its connection authenticated with this token, this
 * publisher, an exposed region, runs inside it, at most UCX_MAX_REPLY bytes. */
static int32_t check_req(refit_transport_t *t, const job_t *j, pub_region_t **region, uint64_t *total)
{
    const conn_t *c = j->conn;
    if (!c->authed || !refit_ct_equal(c->token, j->req.token, TOKEN_LEN) || j->req.pub_id != t->pub_id)
        return PUB_AUTH;
    pub_region_t *r = region_of(t, j->req.region_id);
    if (!r) return PUB_NO_REGION;
    const wire_run_t *runs = (const wire_run_t *)j->items;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < j->req.nruns; i++) {
        uint64_t end;
        if (!refit_add_u64(runs[i].off, runs[i].len, &end) || end > r->size || !runs[i].len ||
            !refit_add_u64(sum, runs[i].len, &sum) || sum > UCX_MAX_REPLY)
            return PUB_RANGE;
    }
    *region = r;
    *total = sum;
    return PUB_OK;
}

/* Sends the reply of job j (lock held).  false: not now - its connection
 * already has max_queued bytes of replies in flight (the job stays queued). */
static bool serve_job(refit_transport_t *t, job_t *j)
{
    conn_t *c = j->conn;
    const void *buf = NULL;
    size_t len = 0, hlen;
    const void *hdr;
    uint32_t flags = 0;
    if (c->failed || c->closed || c->closing) {
        job_free(t, j);
        return true;
    }
    if (j->type == AM_HELLO) {
        hello_reply(t, j, &buf, &len);
        hdr = &j->hdr.hello;
        hlen = sizeof(j->hdr.hello);
    } else {
        data_hdr_t *d = &j->hdr.data;
        *d = (data_hdr_t){j->req.seq, j->req.idx, j->req.gen, PUB_OK, 0};
        hdr = d;
        hlen = sizeof(*d);
        pub_region_t *r = NULL;
        uint64_t total = 0;
        d->status = check_req(t, j, &r, &total);
        if (d->status == PUB_AUTH) {
            c->closing = true; /* a request without the handshake: cut off after the refusal */
            refit_log(REFIT_LOG_WARN, "ucx: a request without a valid connection token; connection closed");
        }
        if (d->status == PUB_OK && c->sending_bytes && c->sending_bytes + total > t->o.max_queued)
            return false; /* its earlier replies first */
        const wire_run_t *runs = (const wire_run_t *)j->items;
        uint32_t nr = j->req.nruns;
        if (d->status == PUB_OK && nr == 1) {
            buf = r->base + runs[0].off;
        } else if (d->status == PUB_OK) {
            j->pack = malloc(total);
            if (!j->pack) d->status = PUB_NO_MEMORY;
            else {
                unsigned char *p = j->pack;
                for (uint32_t i = 0; i < nr; i++) {
                    memcpy(p, r->base + runs[i].off, runs[i].len);
                    p += runs[i].len;
                }
                buf = j->pack;
            }
        }
        if (d->status == PUB_OK) {
            len = total;
            d->len = total;
            j->region = r;
            r->inflight++;
            j->bytes = total;
            c->sending_bytes += total;
            if (t->o.rndv) flags |= total >= t->o.rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
        }
    }
    /* REPLY: the receiver checks that data comes over the connection it asked on. */
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = flags | UCP_AM_SEND_FLAG_REPLY,
                              .cb.send = job_sent_cb,
                              .user_data = j};
    void *req = ucp_am_send_nbx(c->ep, j->type == AM_HELLO ? AM_HELLO_REPLY : AM_DATA, hdr, hlen, buf, len, &rp);
    if (UCS_PTR_IS_ERR(req)) {
        c->failed = true;
        job_free(t, j);
    } else if (req == NULL) {
        job_free(t, j);
    } else {
        j->next = t->sending;
        if (t->sending) t->sending->prev = j;
        t->sending = j;
    }
    return true;
}

/* One round of publisher work (lock held): progress, serve jobs, close failed conns. */
static unsigned pub_round(refit_transport_t *t)
{
    unsigned n = progress_all(t->pw);
    while (t->jobs.len) {
        /* serve in arrival order */
        size_t k = t->jobs.len;
        job_t **v = malloc(k * sizeof(*v));
        if (!v) break;
        memcpy(v, t->jobs.data, k * sizeof(*v));
        t->jobs.len = 0;
        size_t served = 0;
        for (size_t i = 0; i < k; i++) {
            if (serve_job(t, v[i])) served++;
            else REFIT_VEC_PUSH(&t->jobs, v[i]); /* cannot fail: the vector held k before */
        }
        free(v);
        n += (unsigned)served;
        n += progress_all(t->pw);
        if (!served) break; /* every queued job waits for its connection's replies to drain */
    }
    double now = refit_now();
    for (size_t i = 0; i < t->conns.len;) {
        conn_t *c = t->conns.data[i];
        if (!c->authed && !c->failed && now - c->created > t->o.auth_timeout) c->failed = true; /* never proven */
        if ((c->failed || (c->closing && c->refs == 0)) && !c->closed) conn_close(c), n++;
        if (c->closed && c->refs == 0) {
            t->conns.data[i] = t->conns.data[--t->conns.len];
            free(c);
            continue;
        }
        i++;
    }
    return n;
}

/* The lock as taken by threads other than the progress thread: the
 * progress thread steps back while someone waits (mutexes are not fair). */
static void pub_lock(refit_transport_t *t)
{
    atomic_fetch_add(&t->waiters, 1);
    pthread_mutex_lock(&t->lock);
    atomic_fetch_sub(&t->waiters, 1);
}

static void *pub_thread(void *arg)
{
    refit_transport_t *t = arg;
    double idle_since = refit_now();
    while (!atomic_load(&t->stop)) {
        pthread_mutex_lock(&t->lock);
        unsigned n = pub_round(t);
        double now = refit_now();
        if (n) idle_since = now;
        bool sleep = !n && now - idle_since >= t->o.spin_us * 1e-6;
        ucs_status_t s = sleep ? ucp_worker_arm(t->pw) : UCS_ERR_BUSY;
        pthread_mutex_unlock(&t->lock);
        if (atomic_load(&t->waiters)) usleep(20);
        if (s == UCS_OK) {
            struct pollfd pf[2] = {{t->pw_efd, POLLIN, 0}, {t->wake_fd, POLLIN, 0}};
            if (poll(pf, 2, 100) > 0 && (pf[1].revents & POLLIN)) {
                uint64_t x;
                if (read(t->wake_fd, &x, sizeof(x)) < 0) { /* nothing to do */
                }
            }
            idle_since = refit_now();
        }
    }
    return NULL;
}

static void wake_thread(refit_transport_t *t)
{
    uint64_t one = 1;
    if (t->wake_fd >= 0 && write(t->wake_fd, &one, sizeof(one)) < 0) { /* counter saturated: awake anyway */
    }
}

/* The host's addresses of `family`, non-loopback first. */
static void list_addrs(refit_transport_t *t, int family)
{
    struct ifaddrs *ifa = NULL;
    t->naddrs = 0;
    if (getifaddrs(&ifa) != 0) return;
    for (int pass = 0; pass < 2; pass++)
        for (struct ifaddrs *i = ifa; i && t->naddrs < UCX_MAX_ADDRS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
            bool lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
            if (lo != (pass == 1)) continue;
            wire_addr_t *a = &t->addrs[t->naddrs];
            memset(a, 0, sizeof(*a));
            a->family = (uint8_t)family;
            if (family == AF_INET) {
                memcpy(a->addr, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, 4);
            } else {
                const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)i->ifa_addr;
                if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) continue;
                memcpy(a->addr, &s6->sin6_addr, 16);
            }
            t->naddrs++;
        }
    freeifaddrs(ifa);
}

/* Starts the publisher side: worker, listener, thread (lock held). */
static refit_status_t pub_start(refit_transport_t *t)
{
    refit_status_t st;
    ucs_status_t s;
    if (t->thread_started) return REFIT_OK;
    if (!t->pctx) {
        /* UCX opens listening sockets on every network device it uses: on
         * the publisher side, only the listen interface (unless devices=). */
        ucp_config_t *cfg = NULL;
        ucs_status_t cs = ucp_config_read(NULL, NULL, &cfg);
        if (cs != UCS_OK) return ucx_err(REFIT_ERR_TRANSPORT, cs, "reading the UCX configuration");
        const char *tls = t->o.tls[0] ? t->o.tls : NULL;
        const char *devs = t->o.devices[0] ? t->o.devices : t->o.listen_if;
        if (tls && (cs = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) st = ucx_err(REFIT_ERR_INVALID_ARG, cs, "tls=%s", tls);
        else if (devs && devs[0] && (cs = ucp_config_modify(cfg, "NET_DEVICES", devs)) != UCS_OK)
            st = ucx_err(REFIT_ERR_INVALID_ARG, cs, "devices=%s", devs);
        else st = init_context(t, cfg, &t->pctx);
        ucp_config_release(cfg);
        if (st) return st;
    }
    if (!t->pw) {
        if ((st = make_worker_in(t, t->pctx, &t->pw, &t->pw_efd, "refit-pub"))) return st;
        if ((st = set_am(t->pw, AM_HELLO, am_hello_cb, t)) || (st = set_am(t->pw, AM_REQ, am_req_cb, t))) return st;
    }
    if (!t->listener) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        int family = strchr(t->o.listen_ip, ':') ? AF_INET6 : AF_INET;
        socklen_t sl;
        if (family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            a->sin_family = AF_INET;
            a->sin_port = htons(t->o.listen_port);
            inet_pton(AF_INET, t->o.listen_ip, &a->sin_addr);
            sl = sizeof(*a);
        } else {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            a->sin6_family = AF_INET6;
            a->sin6_port = htons(t->o.listen_port);
            inet_pton(AF_INET6, t->o.listen_ip, &a->sin6_addr);
            sl = sizeof(*a);
        }
        ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                                  UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                    .sockaddr = {(const struct sockaddr *)&ss, sl},
                                    .conn_handler = {conn_req_cb, t}};
        if ((s = ucp_listener_create(t->pw, &lp, &t->listener)) != UCS_OK)
            return ucx_err(REFIT_ERR_TRANSPORT, s, "listening on %s:%u", t->o.listen_ip, t->o.listen_port);
        ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
        if ((s = ucp_listener_query(t->listener, &la)) != UCS_OK)
            return ucx_err(REFIT_ERR_TRANSPORT, s, "querying the listener on %s", t->o.listen_ip);
        t->port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&la.sockaddr)->sin_port
                                          : ((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
        bool any = family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_addr.s_addr == htonl(INADDR_ANY)
                                     : IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr);
        if (any) {
            list_addrs(t, family);
        } else {
            t->naddrs = 1;
            memset(&t->addrs[0], 0, sizeof(t->addrs[0]));
            t->addrs[0].family = (uint8_t)family;
            if (family == AF_INET) memcpy(t->addrs[0].addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
            else memcpy(t->addrs[0].addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        }
        if (!t->naddrs) return refit_error(REFIT_ERR_TRANSPORT, "ucx: no network address to publish on this host");
    }
    if (t->wake_fd < 0 && (t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        return refit_error(REFIT_ERR_TRANSPORT, "ucx: eventfd: %s", strerror(errno));
    int e = pthread_create(&t->thread, NULL, pub_thread, t);
    if (e) return refit_error(REFIT_ERR_TRANSPORT, "ucx: starting the progress thread: %s", strerror(e));
    t->thread_started = true;
    return REFIT_OK;
}

static refit_status_t ucx_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len)
{
    refit_status_t st;
    ucs_status_t s;
    if (!t || (!base && size) || !desc || !len) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: expose: NULL argument");
    pub_region_t *r = calloc(1, sizeof(*r));
    if (!r) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: expose");
    r->base = base;
    r->size = size;
    pub_lock(t);
    st = pub_start(t);
    pthread_mutex_unlock(&t->lock);
    if (st) goto fail;
    if (size && t->o.rma != RMA_OFF) {
        /* rma=emulated (tests): registered for remote reads, the packed key in the manifest. */
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                                 UCP_MEM_MAP_PARAM_FIELD_PROT,
                                   .address = base,
                                   .length = size,
                                   .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ};
        if ((s = ucp_mem_map(t->pctx, &mp, &r->memh)) != UCS_OK) {
            st = ucx_err(REFIT_ERR_TRANSPORT, s, "registering %" PRIu64 " bytes at %p", size, base);
            goto fail;
        }
        if ((s = ucp_rkey_pack(t->pctx, r->memh, &r->rkey, &r->rkey_len)) != UCS_OK) {
            st = ucx_err(REFIT_ERR_TRANSPORT, s, "packing the remote key of %p", base);
            goto fail;
        }
    }
    pub_lock(t);
    if (REFIT_VEC_PUSH(&t->regions, r)) st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: expose");
    /* Unguessable region ids: a request must name one it was told about. */
    if (!st) r->id = random_id();
    wire_desc_t h = {UCX_MAGIC, UCX_DESC_VERSION, t->pub_id, r->id, (uint64_t)(uintptr_t)base, size,
                     t->port, t->naddrs, (uint32_t)r->rkey_len};
    if (t->o.rma == RMA_OFF) h.base = 0; /* no one needs our addresses */
    wire_addr_t addrs[UCX_MAX_ADDRS];
    memcpy(addrs, t->addrs, sizeof(addrs));
    pthread_mutex_unlock(&t->lock);
    if (st) goto fail;
    size_t n = sizeof(h) + h.naddrs * sizeof(wire_addr_t) + r->rkey_len;
    unsigned char *d = malloc(n);
    if (!d) {
        pub_lock(t);
        r->dead = true; /* released by destroy; no request can use it */
        pthread_mutex_unlock(&t->lock);
        return refit_error(REFIT_ERR_NO_MEMORY, "ucx: expose");
    }
    memcpy(d, &h, sizeof(h));
    memcpy(d + sizeof(h), addrs, h.naddrs * sizeof(wire_addr_t));
    if (r->rkey_len) memcpy(d + sizeof(h) + h.naddrs * sizeof(wire_addr_t), r->rkey, r->rkey_len);
    *desc = d;
    *len = n;
    return REFIT_OK;
fail:
    if (r->rkey) ucp_rkey_buffer_release(r->rkey);
    if (r->memh) ucp_mem_unmap(t->pctx, r->memh);
    free(r);
    return st;
}

static void region_release(refit_transport_t *t, pub_region_t *r)
{
    if (r->rkey) ucp_rkey_buffer_release(r->rkey);
    if (r->memh) ucp_mem_unmap(t->pctx, r->memh);
    free(r);
}

static void ucx_unexpose(refit_transport_t *t, void *base)
{
    if (!t) return;
    pub_lock(t);
    for (size_t i = 0; i < t->regions.len; i++) {
        pub_region_t *r = t->regions.data[i];
        if (r->base != base || r->dead) continue;
        r->dead = true;
        /* Replies still being sent read this memory: wait for them (the
         * progress thread runs while we wait); after 5 s force-close the
         * connections that hold them, which completes their sends. */
        double t0 = refit_now();
        bool forced = false;
        atomic_fetch_add(&t->waiters, 1); /* cond waits re-take the lock */
        while (r->inflight && t->thread_started) {
            if (!forced && refit_now() - t0 > 5) {
                for (job_t *j = t->sending; j; j = j->next)
                    if (j->region == r) j->conn->failed = true;
                forced = true;
                wake_thread(t);
            }
            if (refit_now() - t0 > 15) break; /* give up waiting; keep the registration */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&t->cond, &t->lock, &ts);
        }
        atomic_fetch_sub(&t->waiters, 1);
        if (r->inflight == 0) {
            t->regions.data[i] = t->regions.data[--t->regions.len];
            region_release(t, r);
        }
        break;
    }
    pthread_mutex_unlock(&t->lock);
}

/* ------------------------------------------------------------------------ */
/* Receiver side: connect                                                    */

struct hello_wait {
    uint64_t cookie;
    uint32_t nregions;
    uint64_t *sizes;
    bool done;
    int32_t status;
    ucp_ep_h ep;                     /* the reply must come over it */
    uint64_t pub_id;                 /* PUB_CHALLENGE: who answered */
    uint8_t nonce[NONCE_LEN];        /* PUB_CHALLENGE */
    uint8_t proof[REFIT_SHA256_LEN]; /* PUB_CHALLENGE */
};

static ucs_status_t am_hello_reply_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                                      const ucp_am_recv_param_t *param)
{
    refit_transport_t *t = arg;
    hello_wait_t *w = t->hello;
    hello_reply_t h;
    if (!w || hdr_len != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return UCS_OK;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep != w->ep) return UCS_OK;
    memcpy(&h, hdr, sizeof(h));
    if (h.cookie != w->cookie) return UCS_OK;
    w->status = h.status;
    if (h.status == PUB_OK && len == (size_t)w->nregions * 8) memcpy(w->sizes, data, len);
    else if (h.status == PUB_OK) w->status = PUB_RANGE;
    if (h.status == PUB_CHALLENGE) {
        w->pub_id = h.pub_id;
        memcpy(w->nonce, h.nonce, NONCE_LEN);
        memcpy(w->proof, h.proof, sizeof(w->proof));
    }
    w->done = true;
    return UCS_OK;
}

static ucs_status_t am_data_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                               const ucp_am_recv_param_t *param);

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    refit_peer_t *p = arg;
    if (p->failed == UCS_OK) p->failed = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
}

/* One step of waiting on the receiver worker: progresses it; after spin_s
 * without events, sleeps on its event fd (at most 10 ms, and not past
 * `until`).  Callers loop on their own condition. */
static void pwait(refit_transport_t *t, pull_t *pl, double until, double spin_s);

/* Progresses the receive worker, then sleeps (at most 10 ms, until `until`)
 * when nothing happened for spin_s.  rlock held. */
static void rwait(refit_transport_t *t, double until, double spin_s) { pwait(t, NULL, until, spin_s); }

static void ep_force_close(refit_transport_t *t, ucp_ep_h ep)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(r)) {
        double until = refit_now() + 2;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && refit_now() < until) progress_all(t->rw);
        ucp_request_free(r);
    }
}

/* Closes an endpoint politely (flush), waiting at most 2 s; a close still
 * in progress then finishes on its own (its request is released by UCX). */
static void ep_close(refit_transport_t *t, ucp_ep_h ep)
{
    ucp_request_param_t rp = {.op_attr_mask = 0};
    void *r = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(r)) {
        double until = refit_now() + 2;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && refit_now() < until) rwait(t, until, 0.0005);
        ucp_request_free(r);
    }
}

static bool tl_is_rdma(const char *tl)
{
    return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2) || strstr(tl, "verbs") ||
           strstr(tl, "mlx");
}

static bool tl_rma_native(const char *tl)
{
    return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2);
}

/* Reads which transports and devices the endpoint's lanes use, from
 * ucp_ep_print_info (lines "lane[i]: k:tl/dev.path md[..] -> ... usage...").
 * Only lanes that carry data (am, am_bw, rma, rma_bw) count. */
static void read_lanes(refit_peer_t *p)
{
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    p->lanes[0] = 0;
    p->rdma = false;
    bool rma_lane = false, rma_native = true;
    if (!f) return;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    size_t used = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *l = strstr(line, "lane[");
        if (!l) continue;
        char *colon = strchr(l, ':');
        if (!colon) continue;
        char *tok = colon + 1;
        while (*tok == ' ') tok++;
        char *c2 = strchr(tok, ':');
        if (!c2) continue;
        tok = c2 + 1;
        size_t tl_len = strcspn(tok, " \t");
        char tldev[64];
        snprintf(tldev, sizeof(tldev), "%.*s", (int)tl_len, tok);
        char *dot = strrchr(tldev, '.'); /* ".0" path index */
        if (dot && strchr(tldev, '/') && dot > strchr(tldev, '/')) *dot = 0;
        const char *arrow = strstr(tok, "->");
        const char *usage = arrow ? strchr(arrow + 2, ' ') : NULL;
        if (!usage) continue;
        bool data = strstr(usage, " am") || strstr(usage, " rma");
        if (!data) continue;
        char tl[32];
        snprintf(tl, sizeof(tl), "%.*s", (int)strcspn(tldev, "/"), tldev);
        if (tl_is_rdma(tl)) p->rdma = true;
        if (strstr(usage, " rma_bw") || strstr(usage, " rma ") || strstr(usage, " rma#")) {
            rma_lane = true;
            if (!tl_rma_native(tl)) rma_native = false;
        }
        if (!strstr(p->lanes, tldev)) {
            int w = snprintf(p->lanes + used, sizeof(p->lanes) - used, "%s%s", used ? "+" : "", tldev);
            if (w > 0 && (size_t)w < sizeof(p->lanes) - used) used += (size_t)w;
        }
    }
    free(buf);
    int m = p->t->o.method;
    p->use_get = m == METHOD_GET || (m == METHOD_AUTO && rma_lane && rma_native && p->rdma);
}

static refit_status_t parse_desc(const void *buf, size_t len, wire_desc_t *h, const wire_addr_t **addrs,
                                 const void **rkey)
{
    if (!buf || len < sizeof(*h)) return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor of %zu bytes", len);
    memcpy(h, buf, sizeof(*h));
    if (h->magic != UCX_MAGIC) return refit_error(REFIT_ERR_CORRUPT, "ucx: not a ucx descriptor (bad magic)");
    if (h->version != UCX_DESC_VERSION)
        return refit_error(REFIT_ERR_UNSUPPORTED, "ucx: descriptor version %u (this build reads %u)", h->version,
                           UCX_DESC_VERSION);
    if (h->naddrs == 0 || h->naddrs > UCX_MAX_ADDRS ||
        len != sizeof(*h) + h->naddrs * sizeof(wire_addr_t) + (size_t)h->rkey_len)
        return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor length %zu does not match its contents", len);
    *addrs = (const wire_addr_t *)((const unsigned char *)buf + sizeof(*h));
    *rkey = (const unsigned char *)buf + sizeof(*h) + h->naddrs * sizeof(wire_addr_t);
    return REFIT_OK;
}

static void addr_str(const wire_addr_t *a, uint16_t port, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family, a->addr, ip, sizeof(ip));
    if (a->family == AF_INET6) snprintf(out, cap, "[%s]:%u", ip, port);
    else snprintf(out, cap, "%s:%u", ip, port);
}

static void peer_free(refit_peer_t *p)
{
    if (!p) return;
    for (uint32_t i = 0; p->regions && i < p->nregions; i++) {
        if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey);
        free(p->regions[i].rkey_buf);
    }
    free(p->regions);
    free(p);
}

/* Tries one address: endpoint, HELLO, reply. */
static refit_status_t try_addr(refit_transport_t *t, refit_peer_t *p, const wire_addr_t *a, uint16_t port,
                               double until)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t sl;
    if (a->family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        memcpy(&s4->sin_addr, a->addr, 4);
        sl = sizeof(*s4);
    } else if (a->family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        memcpy(&s6->sin6_addr, a->addr, 16);
        sl = sizeof(*s6);
    } else {
        return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor address family %u", a->family);
    }
    addr_str(a, port, p->name, sizeof(p->name));
    p->failed = UCS_OK;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {(const struct sockaddr *)&ss, sl},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {peer_err_cb, p}};
    ucs_status_t s = ucp_ep_create(t->rw, &ep, &p->ep);
    if (s != UCS_OK) {
        p->ep = NULL;
        return ucx_err(REFIT_ERR_TRANSPORT, s, "connecting to publisher %s", p->name);
    }
    uint64_t *ids = calloc(p->nregions ? p->nregions : 1, 8), *sizes = calloc(p->nregions ? p->nregions : 1, 8);
    refit_status_t st = REFIT_OK;
    if (!ids || !sizes) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
        goto out;
    }
    for (uint32_t i = 0; i < p->nregions; i++) ids[i] = p->regions[i].id;
    /* Phase 1: our nonce; the publisher proves the key over both nonces.
     * Phase 2: we prove it; then, and only then, it answers about regions. */
    hello_wait_t w = {.nregions = p->nregions, .sizes = sizes, .ep = p->ep};
    hello_hdr_t h = {.magic = UCX_MAGIC, .nregions = p->nregions, .pub_id = p->pub_id};
    if ((st = refit_random_bytes(h.nonce, NONCE_LEN))) goto out;
    t->hello = &w;
    for (uint32_t phase = 1; phase <= 2 && !st; phase++) {
        w.done = false;
        w.cookie = h.cookie = random_id();
        h.phase = phase;
        h.nregions = phase == 1 ? 0 : p->nregions; /* region ids only once the key is proven */
        if (phase == 2) conn_mac(t, "refit ucx receiver proof", p->pub_id, h.nonce, w.nonce, h.proof);
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
        void *req = ucp_am_send_nbx(p->ep, AM_HELLO, &h, sizeof(h), ids, (size_t)h.nregions * 8, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            st = ucx_err(REFIT_ERR_TRANSPORT, UCS_PTR_STATUS(req), "saying hello to publisher %s", p->name);
            break;
        }
        while (!w.done && p->failed == UCS_OK && refit_now() < until) rwait(t, until, 0.001);
        if (req) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS && p->failed == UCS_OK && refit_now() < until)
                rwait(t, until, 0.001);
            ucp_request_free(req); /* if still in flight, closing the endpoint below completes it */
        }
        uint8_t want[REFIT_SHA256_LEN];
        bool proven = false;
        if (w.done && phase == 1 && w.status == PUB_CHALLENGE) {
            conn_mac(t, "refit ucx publisher proof", p->pub_id, h.nonce, w.nonce, want);
            proven = refit_ct_equal(want, w.proof, sizeof(want));
        }
        if (!w.done && p->failed != UCS_OK) st = ucx_err(REFIT_ERR_PEER, p->failed, "publisher %s", p->name);
        else if (!w.done)
            st = refit_error(REFIT_ERR_TIMEOUT, "ucx: publisher %s did not answer within the connect timeout", p->name);
        else if (phase == 1 && proven)
            continue;
        else if (phase == 1 && w.status == PUB_CHALLENGE && w.pub_id != p->pub_id)
            /* another instance answers there (the publisher restarted on this port): try the next address */
            st = refit_error(REFIT_ERR_PEER, "ucx: %s is another publisher (instance changed or address reused)", p->name);
        else if (phase == 1)
            st = refit_error(REFIT_ERR_AUTH, "ucx: %s did not prove the job's secret (%s): not a publisher of this job, "
                             "or one with another secret", p->name,
                             w.status == PUB_CHALLENGE ? "wrong proof" : pub_status_str(w.status));
        else if (w.status == PUB_BAD_ID) /* another publisher answered there: try the next address */
            st = refit_error(REFIT_ERR_PEER, "ucx: %s is another publisher (instance changed or address reused)", p->name);
        else if (w.status == PUB_AUTH)
            st = refit_error(REFIT_ERR_AUTH, "ucx: publisher %s refused our proof of the job's secret", p->name);
        else if (w.status != PUB_OK)
            st = refit_error(REFIT_ERR_PEER, "ucx: publisher %s: %s", p->name, pub_status_str(w.status));
    }
    if (!st) {
        uint8_t tok[REFIT_SHA256_LEN];
        conn_mac(t, "refit ucx token", p->pub_id, h.nonce, w.nonce, tok);
        memcpy(p->token, tok, TOKEN_LEN);
    }
    for (uint32_t i = 0; !st && i < p->nregions; i++)
        if (sizes[i] != p->regions[i].size)
            st = refit_error(REFIT_ERR_STALE, "ucx: publisher %s: region %u is %s", p->name, i,
                             sizes[i] == UINT64_MAX ? "no longer exposed" : "of a different size");
    t->hello = NULL;
out:
    free(ids);
    free(sizes);
    if (st) {
        if (p->failed != UCS_OK || st == REFIT_ERR_TIMEOUT) ep_force_close(t, p->ep);
        else ep_close(t, p->ep);
        p->ep = NULL;
    }
    return st;
}

static refit_status_t ucx_connect(refit_transport_t *t, const void *const *descs, const size_t *lens,
                                  uint32_t nregions, refit_peer_t **out)
{
    refit_status_t st = REFIT_OK;
    if (!t || !out || (nregions && (!descs || !lens)))
        return refit_error(REFIT_ERR_INVALID_ARG, "ucx: connect: NULL argument");
    if (nregions == 0) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: connect: no regions");
    refit_peer_t *p = calloc(1, sizeof(*p));
    if (!p || !(p->regions = calloc(nregions, sizeof(*p->regions)))) {
        free(p);
        return refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
    }
    p->t = t;
    p->nregions = nregions;
    wire_desc_t h0;
    const wire_addr_t *addrs0 = NULL;
    for (uint32_t i = 0; i < nregions; i++) {
        wire_desc_t h;
        const wire_addr_t *addrs = NULL;
        const void *rkey = NULL;
        if ((st = parse_desc(descs[i], lens[i], &h, &addrs, &rkey))) {
            refit_error_prefix("region %u: ", i);
            goto fail;
        }
        if (i == 0) {
            h0 = h;
            addrs0 = addrs;
            p->pub_id = h.pub_id;
        } else if (h.pub_id != h0.pub_id) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: region %u belongs to another publisher than region 0", i);
            goto fail;
        }
        p->regions[i].id = h.region_id;
        p->regions[i].size = h.size;
        p->regions[i].base = h.base;
        if (h.rkey_len) {
            if (!(p->regions[i].rkey_buf = malloc(h.rkey_len))) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
                goto fail;
            }
            memcpy(p->regions[i].rkey_buf, rkey, h.rkey_len);
            p->regions[i].rkey_len = h.rkey_len;
        }
    }
    pthread_mutex_lock(&t->rlock);
    if (!t->rw) {
        if ((st = make_worker_in(t, t->ctx, &t->rw, &t->rw_efd, "refit-recv")) ||
            (st = set_am(t->rw, AM_HELLO_REPLY, am_hello_reply_cb, t)) ||
            (st = set_am(t->rw, AM_DATA, am_data_cb, t))) {
            if (t->rw) ucp_worker_destroy(t->rw);
            t->rw = NULL;
            pthread_mutex_unlock(&t->rlock);
            goto fail;
        }
    }
    if (REFIT_VEC_RESERVE(&t->peers, t->peers.len + 1)) {
        pthread_mutex_unlock(&t->rlock);
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
        goto fail;
    }
    double until = refit_now() + t->o.connect_timeout;
    char tried[512] = "";
    size_t tl = 0;
    st = REFIT_ERR_TRANSPORT;
    for (uint16_t k = 0; k < h0.naddrs && st; k++) {
        /* Each address gets its share of what is left (at least 1 s), so
         * one that drops packets cannot use up the whole budget. */
        double left = until - refit_now(), share = left / (h0.naddrs - k);
        st = try_addr(t, p, &addrs0[k], h0.port, refit_now() + (share < 1 ? REFIT_MIN(1.0, left) : share));
        if (st == REFIT_ERR_STALE || st == REFIT_ERR_AUTH) break; /* reached it; it is not the right one */
        if (st) {
            int w = snprintf(tried + tl, sizeof(tried) - tl, "%s%s: %s", tl ? "; " : "", p->name, refit_last_error());
            if (w > 0 && (size_t)w < sizeof(tried) - tl) tl += (size_t)w;
        }
        if (refit_now() >= until) break;
    }
    if (st && st != REFIT_ERR_STALE && st != REFIT_ERR_AUTH)
        st = refit_error(st == REFIT_ERR_TIMEOUT ? REFIT_ERR_TIMEOUT : REFIT_ERR_PEER,
                         "ucx: cannot reach the publisher at any of its %u addresses (%s)", h0.naddrs, tried);
    if (!st) {
        read_lanes(p);
        if (t->o.require_rdma && !p->rdma) {
            st = refit_error(REFIT_ERR_TRANSPORT,
                             "ucx: require=rdma, but UCX connected publisher %s over %s only (no RDMA lane; "
                             "check the RDMA devices, UCX_TLS and UCX_NET_DEVICES)",
                             p->name, p->lanes[0] ? p->lanes : "unknown lanes");
            ep_close(t, p->ep);
            p->ep = NULL;
        }
    }
    for (uint32_t i = 0; !st && i < nregions; i++) {
        if (!p->regions[i].rkey_len) continue;
        ucs_status_t s = ucp_ep_rkey_unpack(p->ep, p->regions[i].rkey_buf, &p->regions[i].rkey);
        if (s != UCS_OK) {
            p->regions[i].rkey = NULL;
            if (p->use_get) {
                st = ucx_err(REFIT_ERR_TRANSPORT, s, "unpacking the remote key of region %u of publisher %s", i,
                             p->name);
                ep_close(t, p->ep);
                p->ep = NULL;
            }
        }
    }
    if (!st) t->peers.data[t->peers.len++] = p;
    pthread_mutex_unlock(&t->rlock);
    if (st) goto fail;
    *out = p;
    return REFIT_OK;
fail:
    peer_free(p);
    return st;
}

static void ucx_disconnect(refit_peer_t *p)
{
    if (!p) return;
    refit_transport_t *t = p->t;
    if (t) {
        pthread_mutex_lock(&t->rlock);
        for (uint32_t i = 0; i < p->nregions; i++)
            if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey), p->regions[i].rkey = NULL;
        if (p->ep) {
            if (p->failed != UCS_OK || p->broken) ep_force_close(t, p->ep);
            else ep_close(t, p->ep);
            p->ep = NULL;
        }
        for (size_t i = 0; i < t->peers.len; i++)
            if (t->peers.data[i] == p) {
                t->peers.data[i] = t->peers.data[--t->peers.len];
                break;
            }
        pthread_mutex_unlock(&t->rlock);
    }
    peer_free(p);
}

/* ------------------------------------------------------------------------ */
/* Receiver side: pull                                                       */

typedef struct {
    uint64_t off, len;
    unsigned char *dst;
} run_t;

/* FREE -> WAIT (request sent) -> [RECV (rendezvous receive)] -> DONE ->
 * (PARKED while UCX still completes the request's send) -> FREE or WAIT. */
enum { SLOT_FREE = 0, SLOT_WAIT, SLOT_RECV, SLOT_DONE, SLOT_PARKED };

typedef struct pull_peer pull_peer_t;
typedef struct {
    pull_t *pl;      /* NULL once its pull gave up on it (leaked, see ucx_pull) */
    pull_peer_t *pp;
    uint32_t idx, gen;
    int state;
    bool send_pending;
    unsigned gets_pending;
    ucs_status_t status;
    int32_t pub_status;
    uint32_t region;
    uint32_t nruns;
    uint64_t bytes;
    run_t runs[UCX_MAX_RUNS];
    wire_run_t wire[UCX_MAX_RUNS];
    req_hdr_t hdr;
    unsigned char *stage;
    bool staged; /* data went to stage: scatter on completion */
} slot_t;

struct pull_peer {
    refit_peer_t *peer;
    uint32_t src;
    /* cursor over this peer's plan regions */
    size_t *regs, nregs, ri;
    uint64_t row, row_off, rows;
    bool exhausted;
    unsigned busy;
    uint64_t inflight_bytes;
    double last_data;
    uint64_t bytes;
};

struct pull {
    refit_transport_t *t;
    const refit_plan_region_t *regs;
    void *const *dst_bases;
    uint32_t seq;
    pull_peer_t *pps;
    size_t npps;
    slot_t *slots;
    size_t nslots;
    uint32_t *done; /* slot indices completed by callbacks */
    size_t ndone;
    uint64_t requests;
    int wake_fd;    /* eventfd: another thread completed one of our slots */
    double idle_since;
};

/* rwait for a pull's thread: its own completions end the wait too, and it
 * sleeps without rlock, so that other pulls progress meanwhile. */
static void pwait(refit_transport_t *t, pull_t *pl, double until, double spin_s)
{
    static __thread double idle_since;
    double *idle = pl ? &pl->idle_since : &idle_since;
    t->progressing = pl;
    unsigned n = progress_all(t->rw);
    t->progressing = NULL;
    double now = refit_now();
    if (n || (pl && pl->ndone)) {
        *idle = now;
        if (pl && t->active.len > 1) { /* let the other pulls in: a busy one would keep the lock */
            pthread_mutex_unlock(&t->rlock);
            sched_yield();
            pthread_mutex_lock(&t->rlock);
        }
        return;
    }
    if (*idle == 0 || *idle > now) *idle = now;
    if (now - *idle < spin_s) return;
    if (ucp_worker_arm(t->rw) != UCS_OK) return;
    double left = until - now;
    int ms = left <= 0 ? 0 : left > 0.01 ? 10 : (int)(left * 1000) + 1;
    struct pollfd pf[2] = {{t->rw_efd, POLLIN, 0}, {pl ? pl->wake_fd : -1, POLLIN, 0}};
    if (pl) pthread_mutex_unlock(&t->rlock);
    poll(pf, pl && pl->wake_fd >= 0 ? 2 : 1, ms);
    if (pl && pl->wake_fd >= 0 && (pf[1].revents & POLLIN)) {
        uint64_t v;
        if (read(pl->wake_fd, &v, sizeof(v)) < 0) {
        }
    }
    if (pl) pthread_mutex_lock(&t->rlock);
}

static void mark_done(pull_t *pl, slot_t *s)
{
    s->state = SLOT_DONE;
    pl->done[pl->ndone++] = s->idx;
    if (pl != pl->t->progressing && pl->wake_fd >= 0) {
        uint64_t one = 1;
        if (write(pl->wake_fd, &one, sizeof(one)) < 0) {
        }
    }
}

/* Fills slot s with the next request of pp: runs of one source region, up
 * to chunk bytes and UCX_MAX_RUNS runs; false when pp has nothing left. */
static bool next_request(pull_t *pl, pull_peer_t *pp, slot_t *s)
{
    const ucx_opts_t *o = &pl->t->o;
    s->nruns = 0;
    s->bytes = 0;
    while (pp->ri < pp->nregs) {
        const refit_plan_region_t *r = &pl->regs[pp->regs[pp->ri]];
        if (s->nruns && r->src_region != s->region) break;
        uint64_t so, dof;
        refit_region_row_offsets(r, pp->row, &so, &dof);
        uint64_t left = r->run - pp->row_off;
        uint64_t room = o->chunk - s->bytes;
        uint64_t take = left < room ? left : room;
        unsigned char *dst = (unsigned char *)pl->dst_bases[r->dst_region] + dof + pp->row_off;
        so += pp->row_off;
        run_t *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
        bool adjacent = last && last->off + last->len == so && last->dst + last->len == dst;
        /* A request is one run (zero copy on both sides), or a batch of
         * short runs (packed by the publisher, scattered here): a run of
         * solo bytes or more never joins a batch. */
        if (s->nruns && !adjacent && (left >= o->solo || s->runs[0].len >= o->solo)) break;
        if (adjacent) {
            last->len += take;
        } else {
            if (s->nruns == UCX_MAX_RUNS) break;
            s->runs[s->nruns++] = (run_t){so, take, dst};
        }
        s->region = r->src_region;
        s->bytes += take;
        pp->row_off += take;
        if (pp->row_off == r->run) {
            pp->row_off = 0;
            if (++pp->row == pp->rows) {
                pp->row = 0;
                if (++pp->ri < pp->nregs) pp->rows = refit_region_rows(&pl->regs[pp->regs[pp->ri]]);
            }
        }
        if (s->bytes >= o->chunk) break;
    }
    return s->nruns > 0;
}

static void recv_done_cb(void *request, ucs_status_t status, size_t length, void *user)
{
    slot_t *s = user;
    pull_t *pl = s->pl;
    if (status == UCS_OK && length != s->bytes) status = UCS_ERR_MESSAGE_TRUNCATED;
    s->status = status;
    if (pl) mark_done(pl, s);
    ucp_request_free(request);
}

static void send_done_cb(void *request, ucs_status_t status, void *user)
{
    slot_t *s = user;
    s->send_pending = false;
    if (status != UCS_OK && s->status == UCS_OK) s->status = status;
    if (status != UCS_OK && s->state == SLOT_WAIT) {
        pull_t *pl = s->pl;
        if (pl) mark_done(pl, s);
    }
    ucp_request_free(request);
}

static void get_done_cb(void *request, ucs_status_t status, void *user)
{
    slot_t *s = user;
    if (status != UCS_OK && s->status == UCS_OK) s->status = status;
    if (--s->gets_pending == 0) {
        pull_t *pl = s->pl;
        if (pl) mark_done(pl, s);
    }
    ucp_request_free(request);
}

static void scatter(slot_t *s, const unsigned char *src)
{
    for (uint32_t i = 0; i < s->nruns; i++) {
        memcpy(s->runs[i].dst, src, s->runs[i].len);
        src += s->runs[i].len;
    }
}

static ucs_status_t am_data_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                               const ucp_am_recv_param_t *param)
{
    refit_transport_t *t = arg;
    pull_t *pl = NULL;
    data_hdr_t h;
    if (hdr_len != sizeof(h)) return UCS_OK;
    memcpy(&h, hdr, sizeof(h));
    for (size_t i = 0; i < t->active.len && !pl; i++)
        if (t->active.data[i]->seq == h.seq) pl = t->active.data[i];
    if (!pl || h.idx >= pl->nslots) return UCS_OK; /* stale: its pull is over */
    slot_t *s = &pl->slots[h.idx];
    if (s->gen != h.gen || s->state != SLOT_WAIT) return UCS_OK;
    /* Only the publisher we asked, over the connection we asked on, answers. */
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep != s->pp->peer->ep) return UCS_OK;
    if (h.status != PUB_OK) {
        s->pub_status = h.status;
        mark_done(pl, s);
        return UCS_OK;
    }
    if (len != s->bytes || h.len != s->bytes) {
        s->status = UCS_ERR_MESSAGE_TRUNCATED;
        mark_done(pl, s);
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        scatter(s, data);
        s->status = UCS_OK;
        mark_done(pl, s);
        return UCS_OK;
    }
    void *dst;
    if (s->nruns == 1) {
        dst = s->runs[0].dst;
        s->staged = false;
    } else {
        if (!s->stage) s->stage = malloc(t->o.chunk);
        if (!s->stage) {
            s->status = UCS_ERR_NO_MEMORY;
            mark_done(pl, s);
            return UCS_OK; /* UCX drops the rendezvous */
        }
        dst = s->stage;
        s->staged = true;
    }
    s->state = SLOT_RECV;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_am = recv_done_cb,
                              .user_data = s};
    void *r = ucp_am_recv_data_nbx(t->rw, data, dst, len, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        s->status = UCS_PTR_STATUS(r);
        mark_done(pl, s);
    } else if (r == NULL) {
        s->status = UCS_OK;
        mark_done(pl, s);
    }
    return UCS_OK;
}

/* Issues slot s's request (or gets). */
static ucs_status_t issue(pull_t *pl, slot_t *s)
{
    pull_peer_t *pp = s->pp;
    refit_peer_t *p = pp->peer;
    s->gen++;
    s->status = UCS_OK;
    s->pub_status = PUB_OK;
    s->staged = false;
    s->state = SLOT_WAIT;
    pp->busy++;
    pp->inflight_bytes += s->bytes;
    pl->requests++;
    if (!p->ep) { /* closed by another pull that found the peer broken */
        s->status = UCS_ERR_NOT_CONNECTED;
        mark_done(pl, s);
        return UCS_OK;
    }
    if (p->use_get) {
        const peer_region_t *pr = &p->regions[s->region];
        s->gets_pending = 1; /* guard while issuing */
        for (uint32_t i = 0; i < s->nruns; i++) {
            ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                      .cb.send = get_done_cb,
                                      .user_data = s};
            void *r = ucp_get_nbx(p->ep, s->runs[i].dst, s->runs[i].len, pr->base + s->runs[i].off, pr->rkey, &rp);
            if (UCS_PTR_IS_ERR(r)) {
                s->status = UCS_PTR_STATUS(r);
                break;
            }
            if (r) s->gets_pending++;
        }
        if (--s->gets_pending == 0) mark_done(pl, s);
        return UCS_OK;
    }
    for (uint32_t i = 0; i < s->nruns; i++) s->wire[i] = (wire_run_t){s->runs[i].off, s->runs[i].len};
    s->hdr = (req_hdr_t){UCX_MAGIC, s->nruns, pl->seq, s->idx, s->gen, 0, p->regions[s->region].id, p->pub_id, {0}};
    memcpy(s->hdr.token, p->token, TOKEN_LEN);
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                              .cb.send = send_done_cb,
                              .user_data = s};
    void *r = ucp_am_send_nbx(p->ep, AM_REQ, &s->hdr, sizeof(s->hdr), s->wire, s->nruns * sizeof(wire_run_t), &rp);
    if (UCS_PTR_IS_ERR(r)) {
        s->status = UCS_PTR_STATUS(r);
        mark_done(pl, s);
    } else if (r) {
        s->send_pending = true;
    }
    return UCS_OK;
}

/* True while UCX may still touch slot s, or its reply may still come. */
static bool slot_busy(const slot_t *s)
{
    return s->send_pending || s->state == SLOT_RECV || s->gets_pending ||
           (s->state == SLOT_WAIT && s->pp->peer->ep);
}

static refit_status_t ucx_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                               void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats)
{
    if (!t || !peers || !plan || !dst_bases) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: pull: NULL argument");
    refit_status_t st = REFIT_OK;
    size_t nsrc = refit_plan_num_sources(plan), nregs;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &nregs);
    pull_t pl = {.t = t, .regs = regs, .dst_bases = dst_bases, .wake_fd = -1};
    size_t *idx = NULL;
    uint64_t total = 0;

    pthread_mutex_lock(&t->rlock);
    /* Peers of this pull, their regions, checks. */
    pl.pps = calloc(nsrc ? nsrc : 1, sizeof(*pl.pps));
    idx = calloc(nregs ? nregs : 1, sizeof(*idx));
    if (!pl.pps || !idx) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
        goto out;
    }
    size_t *count = calloc(nsrc ? nsrc : 1, sizeof(size_t));
    if (!count) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
        goto out;
    }
    for (size_t i = 0; i < nregs; i++) {
        const refit_plan_region_t *r = &regs[i];
        if (r->src >= nsrc || !peers[r->src]) continue;
        const refit_peer_t *p = peers[r->src];
        if (p->t != t) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: pull: source %u was connected by another transport", r->src);
            break;
        }
        if (r->src_region >= p->nregions || refit_region_src_end(r) > p->regions[r->src_region].size) {
            st = refit_error(REFIT_ERR_CORRUPT, "ucx: the plan reads past region %u of source %u (publisher %s)",
                             r->src_region, r->src, p->name);
            break;
        }
        if (!p->ep || p->broken) {
            st = refit_error(REFIT_ERR_PEER, "ucx: source %u (publisher %s) failed in an earlier pull; reconnect",
                             r->src, p->name);
            break;
        }
        if (p->failed != UCS_OK) {
            st = ucx_err(REFIT_ERR_PEER, p->failed, "source %u (publisher %s) failed", r->src, p->name);
            break;
        }
        if (p->use_get && !p->regions[r->src_region].rkey) {
            st = refit_error(REFIT_ERR_TRANSPORT, "ucx: no remote key for region %u of publisher %s (method=get)",
                             r->src_region, p->name);
            break;
        }
        if (refit_plan_region_bytes(r) == 0) continue;
        count[r->src]++;
        total += refit_plan_region_bytes(r);
    }
    if (st) {
        free(count);
        goto out;
    }
    /* Group region indices by source, in plan order. */
    size_t at = 0;
    for (size_t s = 0; s < nsrc; s++) {
        if (!count[s]) continue;
        pull_peer_t *pp = &pl.pps[pl.npps++];
        pp->peer = peers[s];
        pp->src = (uint32_t)s;
        pp->regs = idx + at;
        at += count[s];
    }
    free(count);
    for (size_t i = 0, k = 0; i < nregs; i++) {
        const refit_plan_region_t *r = &regs[i];
        if (r->src >= nsrc || !peers[r->src] || refit_plan_region_bytes(r) == 0) continue;
        while (pl.pps[k].src != r->src) k = (k + 1) % pl.npps;
        pl.pps[k].regs[pl.pps[k].nregs++] = i;
    }
    for (size_t k = 0; k < pl.npps; k++) pl.pps[k].rows = refit_region_rows(&regs[pl.pps[k].regs[0]]);

    /* Per peer: up to inflight * chunk bytes in flight, in at most 4 *
     * inflight requests (short solo runs make small requests). */
    unsigned per = t->o.inflight * 4 > 256 ? 256 : t->o.inflight * 4;
    uint64_t window = (uint64_t)t->o.inflight * t->o.chunk;
    pl.nslots = pl.npps * per;
    pl.slots = calloc(pl.nslots ? pl.nslots : 1, sizeof(slot_t));
    pl.done = calloc(pl.nslots ? pl.nslots : 1, sizeof(uint32_t));
    if (!pl.slots || !pl.done) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
        goto out;
    }
    for (size_t i = 0; i < pl.nslots; i++) {
        pl.slots[i].idx = (uint32_t)i;
        pl.slots[i].pp = &pl.pps[i / per];
        pl.slots[i].pl = &pl;
    }
    if (REFIT_VEC_RESERVE(&t->active, t->active.len + 1)) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
        goto out;
    }
    pl.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pl.seq = ++t->pull_seq;
    t->active.data[t->active.len++] = &pl;

    double deadline = ctl && ctl->deadline > 0 ? ctl->deadline : 0;
    double now = refit_now(), next_tick = now + 0.05;
    for (size_t k = 0; k < pl.npps; k++) pl.pps[k].last_data = now;
    for (;;) {
        /* Another pull sharing a peer may have closed it while this one
         * slept or ticked without the lock. */
        for (size_t k = 0; k < pl.npps && !st; k++)
            if ((pl.pps[k].busy || !pl.pps[k].exhausted) && (!pl.pps[k].peer->ep || pl.pps[k].peer->broken))
                st = refit_error(REFIT_ERR_PEER, "ucx: publisher %s (source %u) failed in another pull",
                                 pl.pps[k].peer->name, pl.pps[k].src);
        if (st) break;
        /* Fill every peer's window with free slots. */
        for (size_t i = 0; i < pl.nslots; i++) {
            slot_t *s = &pl.slots[i];
            pull_peer_t *pp = s->pp;
            if (s->state != SLOT_FREE || pp->exhausted || pp->inflight_bytes >= window) continue;
            if (next_request(&pl, pp, s)) issue(&pl, s);
            else pp->exhausted = true;
        }
        bool busy = false;
        for (size_t k = 0; k < pl.npps; k++) busy |= pl.pps[k].busy > 0;
        if (!busy) break;
        pwait(t, &pl, deadline ? deadline : refit_now() + 1, t->o.spin_us * 1e-6);
        now = refit_now();
        /* Completed slots: scatter, account, refill. */
        while (pl.ndone && !st) {
            slot_t *s = &pl.slots[pl.done[--pl.ndone]];
            pull_peer_t *pp = s->pp;
            if (s->pub_status != PUB_OK) {
                st = refit_error(REFIT_ERR_PEER, "ucx: publisher %s (source %u): %s", pp->peer->name, pp->src,
                                 pub_status_str(s->pub_status));
                break;
            }
            if (s->status != UCS_OK) {
                ucs_status_t why = pp->peer->failed != UCS_OK ? pp->peer->failed : s->status;
                st = ucx_err(status_code(why), why, "pulling from publisher %s (source %u)", pp->peer->name, pp->src);
                break;
            }
            if (s->staged) scatter(s, s->stage);
            pp->bytes += s->bytes;
            pp->inflight_bytes -= s->bytes;
            pp->last_data = now;
            s->state = SLOT_PARKED;
        }
        if (st) break;
        /* Slots whose request send has completed are free again. */
        for (size_t i = 0; i < pl.nslots; i++) {
            slot_t *s = &pl.slots[i];
            if (s->state != SLOT_PARKED || s->send_pending) continue;
            s->state = SLOT_FREE;
            s->pp->busy--;
        }
        for (size_t k = 0; k < pl.npps && !st; k++) {
            pull_peer_t *pp = &pl.pps[k];
            if (pp->peer->failed != UCS_OK) {
                st = ucx_err(REFIT_ERR_PEER, pp->peer->failed, "publisher %s (source %u) failed mid-pull",
                             pp->peer->name, pp->src);
            } else if (pp->busy && now - pp->last_data > t->o.stall_timeout) {
                st = refit_error(REFIT_ERR_PEER, "ucx: publisher %s (source %u) sent nothing for %.0f s",
                                 pp->peer->name, pp->src, t->o.stall_timeout);
            }
        }
        if (st) break;
        if (deadline && now > deadline) {
            uint64_t got = 0;
            for (size_t k = 0; k < pl.npps; k++) got += pl.pps[k].bytes;
            st = refit_error(REFIT_ERR_TIMEOUT, "ucx: pull deadline passed with %" PRIu64 " of %" PRIu64 " bytes moved",
                             got, total);
            break;
        }
        if (ctl && ctl->tick && now >= next_tick) {
            next_tick = now + 0.05;
            pthread_mutex_unlock(&t->rlock); /* a tick may wait on the registry: other pulls go on */
            refit_status_t ts = ctl->tick(ctl->user);
            pthread_mutex_lock(&t->rlock);
            if (ts) {
                st = ts;
                refit_error_prefix("ucx: pull aborted by its tick: ");
                break;
            }
        }
    }
    if (st) {
        /* Drain: let UCX finish (or cancel) everything that may touch the
         * slots or the destination before returning.  Failed peers are
         * closed at once (that completes their requests); the replies of
         * live ones get a second, then their endpoints are closed too. */
        for (size_t k = 0; k < pl.npps; k++) {
            refit_peer_t *p = pl.pps[k].peer;
            if (p->failed != UCS_OK && p->ep) {
                ep_force_close(t, p->ep);
                p->ep = NULL;
                p->broken = true;
            }
        }
        double until = refit_now() + 1;
        bool any;
        do {
            any = false;
            for (size_t i = 0; i < pl.nslots; i++) any |= slot_busy(&pl.slots[i]);
            if (any) pwait(t, &pl, until, 0.0005);
        } while (any && refit_now() < until);
        if (any) {
            for (size_t k = 0; k < pl.npps; k++) {
                refit_peer_t *p = pl.pps[k].peer;
                bool mine = false;
                for (size_t i = k * per; i < (k + 1) * per; i++) mine |= slot_busy(&pl.slots[i]);
                if (mine && p->ep) {
                    ep_force_close(t, p->ep);
                    p->ep = NULL;
                    p->broken = true;
                }
            }
            until = refit_now() + 2;
            do {
                any = false;
                for (size_t i = 0; i < pl.nslots; i++) any |= slot_busy(&pl.slots[i]);
                if (any) progress_all(t->rw);
            } while (any && refit_now() < until);
        }
        if (any) {
            /* UCX still holds requests pointing into the slots: leak them
             * rather than let a callback write into freed memory (the
             * slots forget this pull, which is about to end, and late
             * replies no longer find it). */
            for (size_t i = 0; i < pl.nslots; i++) pl.slots[i].pl = NULL;
            for (size_t i = 0; i < t->active.len; i++)
                if (t->active.data[i] == &pl) {
                    t->active.data[i] = t->active.data[--t->active.len];
                    break;
                }
            pl.nslots = 0;
            pl.slots = NULL;
            pl.done = NULL;
        }
        for (size_t k = 0; k < pl.npps; k++) {
            refit_peer_t *p = pl.pps[k].peer;
            if (p->failed != UCS_OK && p->ep) {
                ep_force_close(t, p->ep);
                p->ep = NULL;
                p->broken = true;
            }
        }
    } else if (stats) {
        stats->bytes += total;
        stats->requests += pl.requests;
        size_t used = strlen(stats->lanes);
        for (size_t k = 0; k < pl.npps; k++) {
            const refit_peer_t *p = pl.pps[k].peer;
            char one[200];
            snprintf(one, sizeof(one), "ucx:%s %s", p->lanes[0] ? p->lanes : "?", p->use_get ? "get" : "am");
            if (strstr(stats->lanes, one)) continue;
            int w = snprintf(stats->lanes + used, sizeof(stats->lanes) - used, "%s%s", used ? ", " : "", one);
            if (w > 0 && (size_t)w < sizeof(stats->lanes) - used) used += (size_t)w;
        }
    }
out:
    for (size_t i = 0; i < t->active.len; i++)
        if (t->active.data[i] == &pl) {
            t->active.data[i] = t->active.data[--t->active.len];
            break;
        }
    if (pl.wake_fd >= 0) close(pl.wake_fd);
    if (pl.slots)
        for (size_t i = 0; i < pl.nslots; i++) free(pl.slots[i].stage);
    free(pl.slots);
    free(pl.done);
    free(pl.pps);
    free(idx);
    pthread_mutex_unlock(&t->rlock);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Teardown                                                                  */

static void ucx_destroy(refit_transport_t *t)
{
    if (!t) return;
    /* Receiver side: peers the caller did not disconnect lose their endpoints. */
    pthread_mutex_lock(&t->rlock);
    for (size_t i = 0; i < t->peers.len; i++) {
        refit_peer_t *p = t->peers.data[i];
        for (uint32_t k = 0; k < p->nregions; k++)
            if (p->regions[k].rkey) ucp_rkey_destroy(p->regions[k].rkey), p->regions[k].rkey = NULL;
        if (p->ep) ep_force_close(t, p->ep);
        p->ep = NULL;
        p->t = NULL;
    }
    REFIT_VEC_FREE(&t->peers);
    REFIT_VEC_FREE(&t->active);
    pthread_mutex_unlock(&t->rlock);
    /* Publisher side. */
    if (t->thread_started) {
        atomic_store(&t->stop, true);
        wake_thread(t);
        pthread_join(t->thread, NULL);
        t->thread_started = false;
    }
    if (t->pw) {
        if (t->listener) ucp_listener_destroy(t->listener);
        for (size_t i = 0; i < t->conns.len; i++) t->conns.data[i]->failed = true;
        for (size_t i = 0; i < t->jobs.len; i++) job_free(t, t->jobs.data[i]);
        t->jobs.len = 0;
        double until = refit_now() + 2;
        do pub_round(t);
        while (t->conns.len && refit_now() < until);
        for (size_t i = 0; i < t->conns.len; i++) free(t->conns.data[i]);
    }
    for (size_t i = 0; i < t->regions.len; i++) region_release(t, t->regions.data[i]);
    REFIT_VEC_FREE(&t->regions);
    REFIT_VEC_FREE(&t->conns);
    REFIT_VEC_FREE(&t->jobs);
    if (t->pw) ucp_worker_destroy(t->pw);
    if (t->rw) ucp_worker_destroy(t->rw);
    if (t->wake_fd >= 0) close(t->wake_fd);
    if (t->pctx) ucp_cleanup(t->pctx);
    ucp_cleanup(t->ctx);
    refit_wipe(t->key, sizeof(t->key));
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->rlock);
    pthread_cond_destroy(&t->cond);
    free(t);
}

const refit_transport_ops_t refit_transport_ucx = {
    .name = "ucx",
    .caps = REFIT_TCAP_HOST | REFIT_TCAP_CONCURRENT,
    .create = ucx_create,
    .destroy = ucx_destroy,
    .alloc = NULL,
    .free = NULL,
    .expose = ucx_expose,
    .unexpose = ucx_unexpose,
    .connect = ucx_connect,
    .disconnect = ucx_disconnect,
    .pull = ucx_pull,
    .set_key = ucx_set_key,
};
