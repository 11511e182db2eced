/* The ucx transport: weights over the network through UCX (UCP API), pulled by the receiver with active
 * messages.  This file: UCX status translation, contexts and workers, create/destroy and the ops table;
 * the publisher side is in ucx_server.c, the receiver's in ucx_client.c and ucx_pull.c.  The design, the
 * measurements that chose it, the options and the threading contract: docs/ucx.md.
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
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
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
void ucx_conn_mac(const refit_transport_t *t, const char *label, uint64_t pub_id, const uint8_t *nc, const uint8_t *ns,
                  uint8_t out[REFIT_SHA256_LEN])
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

refit_status_t ucx_recv_context(refit_transport_t *t)
{
    refit_status_t st;
    ucp_config_t *cfg = NULL;
    ucs_status_t s;
    /* Before ucp_init: an interface that comes up between the two is seen
     * as new by the next look, and the context is made again (ucx_client.c). */
    t->ctx_sig = ucx_netif_sig(t->ctx_devs, sizeof(t->ctx_devs));
    if ((s = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK)
        return ucx_err(REFIT_ERR_TRANSPORT, s, "reading the UCX configuration");
    if (t->o.tls[0] && (s = ucp_config_modify(cfg, "TLS", t->o.tls)) != UCS_OK)
        st = ucx_err(REFIT_ERR_INVALID_ARG, s, "tls=%s", t->o.tls);
    else if (t->o.devices[0] && (s = ucp_config_modify(cfg, "NET_DEVICES", t->o.devices)) != UCS_OK)
        st = ucx_err(REFIT_ERR_INVALID_ARG, s, "devices=%s", t->o.devices);
    else st = ucx_init_context(t, cfg, &t->ctx);
    ucp_config_release(cfg);
    return st;
}

static refit_status_t ucx_create(const char *options, refit_transport_t **out)
{
    refit_status_t st;
    refit_transport_t *t = calloc(1, sizeof(*t));
    if (!t) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: create");
    t->pw_efd = t->wake_fd = t->rw_efd = -1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->rlock, NULL);
    pthread_cond_init(&t->cond, NULL);
    if ((st = ucx_parse_opts(options, &t->o))) goto fail;
    if ((st = ucx_dl_load())) goto fail;
    t->pub_id = ucx_random_id();
    t->next_region_id = 1;
    atomic_init(&t->stop, false);
    atomic_init(&t->waiters, 0);
    atomic_init(&t->notified, false);
    atomic_init(&t->notify_ns, 0);
    t->parked_due = 1e300;
    if (t->o.rma == RMA_EMULATED)
        refit_log(REFIT_LOG_WARN, "ucx: rma=emulated: UCX serves RMA over TCP and shared memory in software, reading "
                                  "and writing any address a peer names: for tests only");
    if ((st = ucx_recv_context(t))) goto fail;
    *out = t;
    return REFIT_OK;
fail:
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->rlock);
    pthread_cond_destroy(&t->cond);
    free(t);
    return st;
}

/* Creates a worker of context ctx with wakeup; *efd is its event fd. */
refit_status_t ucx_make_worker_in(refit_transport_t *t, ucp_context_h ctx, ucp_worker_h *w, int *efd, const char *name)
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
        for (size_t i = 0; i < t->parked.len; i++) ucx_job_free(t, t->parked.data[i].job);
        t->parked.len = 0;
        double until = refit_now() + 2;
        do ucx_pub_round(t);
        while (t->conns.len && refit_now() < until);
        for (size_t i = 0; i < t->conns.len; i++) free(t->conns.data[i]);
    }
    for (size_t i = 0; i < t->regions.len; i++) ucx_region_release(t, t->regions.data[i]);
    REFIT_VEC_FREE(&t->regions);
    REFIT_VEC_FREE(&t->conns);
    REFIT_VEC_FREE(&t->jobs);
    REFIT_VEC_FREE(&t->parked);
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

/* Extensions: conditional pulls (ucx_pull.c). */
static const void *ucx_ext(refit_transport_ext_kind_t kind) { return kind == REFIT_TEXT_WAIT ? &ucx_wait_ext : NULL; }

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
    .ext = ucx_ext,
};
