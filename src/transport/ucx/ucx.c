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

#include "transport/ucx/ucx_internal.h"

/* The refit status for a UCX failure of an operation with a peer. */
refit_status_t ucx_status_code(ucs_status_t s)
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

refit_status_t ucx_err(refit_status_t code, ucs_status_t s, const char *fmt, ...)
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

uint64_t ucx_random_id(void)
{
    uint64_t x = 0;
    if (refit_random_bytes(&x, sizeof(x))) x = refit_mix64(refit_now_ns() ^ ((uint64_t)getpid() << 32));
    return x ? x : 1;
}

/* A UCP context for this transport.  RMA is enabled only when asked for
 * (rma=emulated: tests): without it UCX
 * installs no handler that reads or writes memory for a peer, so the only
 * way to get bytes out of this process is refit's own checked protocol. */
refit_status_t ucx_init_context(refit_transport_t *t, ucp_config_t *cfg, ucp_context_h *ctx)
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
void ucx_conn_mac(const refit_transport_t *t, const char *label, uint64_t pub_id, const uint8_t *nc,
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
    if ((st = ucx_parse_opts(options, &t->o))) goto fail;
    t->pub_id = ucx_random_id();
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
    if ((st = ucx_init_context(t, cfg, &t->ctx))) goto fail;
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
refit_status_t ucx_make_worker_in(refit_transport_t *t, ucp_context_h ctx, ucp_worker_h *w, int *efd,
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

refit_status_t ucx_set_am(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void *arg)
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
unsigned ucx_progress_all(ucp_worker_h w)
{
    unsigned total = 0, n, rounds = 0;
    while ((n = ucp_worker_progress(w)) && rounds++ < 64) total += n;
    return total;
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
        if (p->ep) ucx_ep_force_close(t, p->ep);
        p->ep = NULL;
        p->t = NULL;
    }
    REFIT_VEC_FREE(&t->peers);
    REFIT_VEC_FREE(&t->active);
    pthread_mutex_unlock(&t->rlock);
    /* Publisher side. */
    if (t->thread_started) {
        atomic_store(&t->stop, true);
        ucx_wake_thread(t);
        pthread_join(t->thread, NULL);
        t->thread_started = false;
    }
    if (t->pw) {
        if (t->listener) ucp_listener_destroy(t->listener);
        for (size_t i = 0; i < t->conns.len; i++) t->conns.data[i]->failed = true;
        for (size_t i = 0; i < t->jobs.len; i++) ucx_job_free(t, t->jobs.data[i]);
        t->jobs.len = 0;
        double until = refit_now() + 2;
        do ucx_pub_round(t);
        while (t->conns.len && refit_now() < until);
        for (size_t i = 0; i < t->conns.len; i++) free(t->conns.data[i]);
    }
    for (size_t i = 0; i < t->regions.len; i++) ucx_region_release(t, t->regions.data[i]);
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
