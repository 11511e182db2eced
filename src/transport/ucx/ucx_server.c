/* The ucx transport, publisher side: the listener and its progress thread,
 * connections (HELLO in two phases, then requests carrying their token),
 * the jobs that serve requests from exposed memory, expose/unexpose.
 *
 * What a peer may cost the publisher is bounded (docs/ucx.md, "What a peer
 * may cost"): descriptors by a connection cap derived from RLIMIT_NOFILE,
 * with a small share for connections not yet proven, the oldest of which
 * makes way for a new one; memory by max_queued per connection for every
 * reply, a cap on packed (copied) reply bytes across connections, and
 * requests that may not ask for more than their region nor for a byte
 * twice; the progress thread's time by parked conditional requests that are
 * capped and looked at only when something may have made them due. */

#include <sys/resource.h>

#include "transport/ucx/ucx_internal.h"

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

/* A new connection.  Every entry of t->conns holds descriptors until the
 * round frees it, so they all count against max_conns.  When the unproven
 * share or the whole cap is full, the oldest connection that has not proven
 * the key is cut off to make room (a proven one never is): refusing the new
 * one instead would let a stranger who holds max_unproven idle connections
 * (renewed every auth_timeout) keep every receiver out, while making way
 * for it means a stranger must open connections faster than a receiver
 * completes its handshake (one round trip) to keep it out.
 *
 * A connection over the cap is accepted and cut off in the same round, not
 * refused with ucp_listener_reject: UCX 1.13's TCP connection manager sends
 * the refusal and frees its socket in its own thread, and a write event
 * for that socket, queued while this thread held UCX's lock, is then
 * delivered to the next connection accepted on the same descriptor number,
 * which aborts the process (tcp_sockcm_ep.c:416; UCX 1.22 filters such
 * events, openucx/ucx#11458).  Refusing half of a flood's requests aborted
 * 3 of 12 floods; accepting them and cutting them off at once, none of 16
 * (docs/ucx.md).  The round comes soon: pub_progress yields to it once
 * max_unproven connections wait to be cut off (checked between progress
 * calls: one call may deliver more).  Past a hard ceiling (max_unproven
 * more entries again) a request is still refused.  UCX itself refuses when
 * ucp_ep_create fails on some paths. */
static void conn_req_cb(ucp_conn_request_h creq, void *arg)
{
    refit_transport_t *t = arg;
    size_t unproven = 0, gone = 0;
    conn_t *oldest = NULL;
    for (size_t i = 0; i < t->conns.len; i++) {
        conn_t *o = t->conns.data[i];
        if (o->failed || o->closed) gone++;
        else if (!o->authed) {
            unproven++;
            if (!oldest || o->created < oldest->created) oldest = o;
        }
    }
    if (oldest && (unproven >= t->max_unproven || t->conns.len - gone >= t->max_conns)) {
        oldest->failed = true; /* closed by the round, after this callback */
        t->doomed++;
        gone++;
        refit_log(REFIT_LOG_DEBUG, "ucx: %zu connections not proven yet (at most %u): closing the oldest", unproven,
                  t->max_unproven);
    }
    /* Failed ones still hold their descriptors until the round closes and
     * frees them: past max_unproven more entries, a new one is cut off at
     * once too. */
    bool over = t->conns.len - gone >= t->max_conns || t->conns.len >= (size_t)t->max_conns + t->max_unproven;
    /* The hard ceiling: past max_unproven more entries again (one progress
     * call delivered more requests than that), refusing is the lesser harm
     * than descriptors without bound. */
    bool ceiling = t->conns.len >= (size_t)t->max_conns + 2 * (size_t)t->max_unproven;
    conn_t *c = ceiling ? NULL : calloc(1, sizeof(*c));
    if (!c || REFIT_VEC_RESERVE(&t->conns, t->conns.len + 1)) {
        free(c);
        ucp_listener_reject(t->listener, creq); /* the ceiling, or out of memory: no entry to close it by */
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
    if (over) {
        c->failed = true;
        t->doomed++;
        refit_log(REFIT_LOG_DEBUG,
                  "ucx: %zu connections held (at most %u, %u of them to be closed): cutting the new one off",
                  t->conns.len, t->max_conns, t->doomed);
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
        n = rh.nruns * (uint32_t)(sizeof(wire_run_t) / 8);
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
    j->arrived = refit_now();
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

void ucx_job_free(refit_transport_t *t, job_t *j)
{
    if (j->prev) j->prev->next = j->next;
    else if (t->sending == j) t->sending = j->next;
    if (j->next) j->next->prev = j->prev;
    if (j->region) {
        j->region->inflight--;
        pthread_cond_broadcast(&t->cond);
    }
    j->conn->sending_bytes -= j->bytes;
    if (j->pack) {
        j->conn->packed_bytes -= j->bytes;
        t->packed_bytes -= j->bytes;
    }
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
    if (status == UCS_OK && j->type == AM_REQ) j->conn->progress_at = j->conn->read_at = refit_now(); /* it reads */
    if (j->type == AM_REQ && j->req.wait_ms && refit_fleet_tracing())
        refit_fleet_trace("sent f%" PRIu64 " status %d", j->req.flag_off, (int)status);
    ucx_job_free(t, j);
    ucp_request_free(request);
}

static void conn_unref(conn_t *c) { c->refs--; }

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
        ucx_conn_mac(t, "refit ucx publisher proof", t->pub_id, c->nonce_c, c->nonce_s, h->proof);
        return;
    }
    uint8_t want[REFIT_SHA256_LEN];
    if (c->challenged) ucx_conn_mac(t, "refit ucx receiver proof", t->pub_id, c->nonce_c, c->nonce_s, want);
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
    ucx_conn_mac(t, "refit ucx token", t->pub_id, c->nonce_c, c->nonce_s, tok);
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

/* A request's condition (req_hdr_t): PUB_OK when it holds or there is none,
 * PUB_NOT_READY when it does not (yet), PUB_NO_REGION / PUB_RANGE when it
 * names memory this publisher does not expose (the word 8-byte aligned).
 * *wr: the region it waits on. */
static int32_t check_wait(refit_transport_t *t, const req_hdr_t *q, pub_region_t **wr)
{
    if (!q->wait_ms) return PUB_OK;
    pub_region_t *w = region_of(t, q->wait_region);
    if (!w) return PUB_NO_REGION;
    if (w->size < 8 || q->word_off > w->size - 8 || (uintptr_t)(w->base + q->word_off) % 8 || q->flag_off >= w->size ||
        q->wait_ms > UCX_MAX_WAIT_MS)
        return PUB_RANGE;
    *wr = w;
    /* The writer marks the flag (release) after the bytes it guards, and
     * changes the word before it clears flags for other bytes: the word read
     * again after the flag rules out a flag of the next round. */
    const uint64_t *word = (const uint64_t *)(w->base + q->word_off);
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != q->word) return PUB_NOT_READY;
    if (!__atomic_load_n(w->base + q->flag_off, __ATOMIC_ACQUIRE)) return PUB_NOT_READY;
    return __atomic_load_n(word, __ATOMIC_ACQUIRE) == q->word ? PUB_OK : PUB_NOT_READY;
}

/* The same test on a parked request's cached addresses. */
static bool parked_holds(const parked_t *p)
{
    return __atomic_load_n(p->word, __ATOMIC_ACQUIRE) == p->want && __atomic_load_n(p->flag, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(p->word, __ATOMIC_ACQUIRE) == p->want;
}

/* Whether two rows of runs[0..n) (each checked inside the region, its own
 * rows apart) share a byte.  Runs are sorted by their first row; runs whose
 * spans (first row to the end of the last) meet are then walked row by row
 * in address order (a heap of each one's next row).  That costs at most a
 * few steps per row of those runs, which packing them would cost anyway; a
 * receiver's requests (adjacent rows, or strided runs one after the other)
 * have no such runs and cost one sort of at most UCX_MAX_RUNS. */
typedef struct {
    uint64_t start, end; /* first row's offset, last row's end */
    uint32_t i;
} span_t;

typedef struct {
    uint64_t at; /* this row's offset */
    uint64_t k;  /* its index in the run */
    uint32_t i;
} row_t;

static void span_sort(span_t *v, uint32_t n)
{
    for (uint32_t a = 1; a < n; a++) /* n <= 256, nearly always sorted already */
        for (uint32_t b = a; b > 0 && v[b - 1].start > v[b].start; b--) {
            span_t x = v[b];
            v[b] = v[b - 1];
            v[b - 1] = x;
        }
}

static void heap_down(row_t *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t m = i, l = 2 * i + 1, r = l + 1;
        if (l < n && h[l].at < h[m].at) m = l;
        if (r < n && h[r].at < h[m].at) m = r;
        if (m == i) return;
        row_t x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

static bool rows_meet(const wire_run_t *runs, const span_t *sp, uint32_t n)
{
    row_t h[UCX_MAX_RUNS];
    for (uint32_t k = 0; k < n; k++) h[k] = (row_t){runs[sp[k].i].off, 0, sp[k].i};
    for (uint32_t k = n / 2; k-- > 0;) heap_down(h, n, k);
    uint64_t end = 0; /* the end of the rows walked so far */
    bool first = true;
    while (n) {
        const wire_run_t *w = &runs[h[0].i];
        if (!first && h[0].at < end) return true;
        first = false;
        if (h[0].at + w->len > end) end = h[0].at + w->len;
        if (++h[0].k < w->count) h[0].at += w->stride;
        else h[0] = h[--n];
        heap_down(h, n, 0);
    }
    return false;
}

static bool runs_overlap(const wire_run_t *runs, uint32_t n)
{
    span_t sp[UCX_MAX_RUNS];
    for (uint32_t i = 0; i < n; i++) /* checked: no overflow */
        sp[i] = (span_t){runs[i].off, runs[i].off + (runs[i].count - 1) * runs[i].stride + runs[i].len, i};
    span_sort(sp, n);
    for (uint32_t a = 0; a < n;) {
        uint32_t b = a + 1;
        uint64_t end = sp[a].end;
        for (; b < n && sp[b].start < end; b++)
            if (sp[b].end > end) end = sp[b].end;
        if (b - a > 1 && rows_meet(runs, sp + a, b - a)) return true;
        a = b;
    }
    return false;
}

/* Checks a request: its connection authenticated with this token, this
 * publisher, an exposed region, runs inside it that do not overlap, a reply
 * no larger than the region nor than max_queued.  The runs are checked once
 * (a request that waits is looked at again). */
static int32_t check_req(refit_transport_t *t, job_t *j, pub_region_t **region, uint64_t *total)
{
    const conn_t *c = j->conn;
    if (!c->authed || !refit_ct_equal(c->token, j->req.token, TOKEN_LEN) || j->req.pub_id != t->pub_id) return PUB_AUTH;
    pub_region_t *r = region_of(t, j->req.region_id);
    if (!r) return PUB_NO_REGION;
    *region = r;
    if (j->checked) { /* region ids are never reused: the same region, the same size */
        *total = j->total;
        return PUB_OK;
    }
    const wire_run_t *runs = (const wire_run_t *)j->items;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < j->req.nruns; i++) {
        /* count rows of len at off + k * stride (k < count), rows apart */
        const wire_run_t *w = &runs[i];
        uint64_t end, span, bytes;
        if (!w->len || !w->count || (w->count > 1 && w->stride < w->len) ||
            !refit_mul_u64(w->count - 1, w->stride, &span) || !refit_add_u64(w->off, span, &end) ||
            !refit_add_u64(end, w->len, &end) || end > r->size || !refit_mul_u64(w->count, w->len, &bytes) ||
            !refit_add_u64(sum, bytes, &sum) || sum > UCX_MAX_REPLY)
            return PUB_RANGE;
    }
    if (sum > r->size) return PUB_RANGE; /* bytes asked for more than once: runs_overlap would say so, later */
    /* A reply of one run is sent from the exposed memory itself; only a
     * packed (copied) one costs the publisher memory, so only it is capped. */
    bool packs = !(j->req.nruns == 1 && runs[0].count == 1);
    if (packs && sum > t->o.max_queued) return PUB_TOO_LARGE;
    if (j->req.nruns > 1 && runs_overlap(runs, j->req.nruns)) return PUB_OVERLAP;
    j->checked = true;
    j->total = sum;
    *total = sum;
    return PUB_OK;
}

enum { SERVED, WAITS, PARKED }; /* what serve_job did with a job */

/* The cap on packed reply bytes stops c's reply: a connection that holds
 * packed replies and has completed none for UCX_STUCK_S is not reading
 * them, and is closed (the one holding most) so that its memory serves the
 * others, rather than hold every packed reply of every other connection up.
 * Once a round (at least every 100 ms while jobs wait: pub_thread). */
static void close_stuck(refit_transport_t *t, const conn_t *c, double now)
{
    conn_t *worst = NULL;
    for (size_t i = 0; i < t->conns.len; i++) {
        conn_t *o = t->conns.data[i];
        if (o != c && !o->failed && o->packed_bytes && now - o->progress_at > UCX_STUCK_S &&
            (!worst || o->packed_bytes > worst->packed_bytes))
            worst = o;
    }
    if (!worst) return;
    worst->failed = true;
    refit_log(REFIT_LOG_WARN,
              "ucx: a connection has held %" PRIu64 " bytes of packed replies unread for %.1f s while others wait "
              "(%" PRIu64 " bytes packed in all, at most %" PRIu64 "); closing it",
              worst->packed_bytes, now - worst->progress_at, t->packed_bytes,
              (uint64_t)UCX_PACKED_SHARES * t->o.max_queued);
}

/* Puts job j (its condition not met, its wait w not over) aside until
 * notify, its due time or its connection's end; false when the caps on
 * parked requests are reached (it is then answered PUB_NOT_READY at once). */
static bool park(refit_transport_t *t, job_t *j, pub_region_t *w, pub_region_t *r)
{
    conn_t *c = j->conn;
    if (c->parked >= t->o.max_parked || t->parked.len >= (size_t)UCX_PARKED_CONNS * t->o.max_parked) {
        refit_log(REFIT_LOG_DEBUG, "ucx: %u conditional requests wait for this connection, %zu in all: refusing one",
                  c->parked, t->parked.len);
        return false;
    }
    parked_t p = {(const uint64_t *)(w->base + j->req.word_off),
                  w->base + j->req.flag_off,
                  j->req.word,
                  j->arrived + j->req.wait_ms * 1e-3,
                  w,
                  r,
                  j};
    if (REFIT_VEC_PUSH(&t->parked, p)) return false;
    c->parked++;
    if (p.due < t->parked_due) t->parked_due = p.due;
    double now = refit_now();
    if (now - (double)atomic_load(&t->notify_ns) * 1e-9 > 1.0 && now + 0.005 < t->parked_due)
        t->parked_due = now + 0.005; /* no notify lately: look again within 5 ms */
    return true;
}

/* Serves job j (lock held): SERVED (answered, or dropped with its
 * connection), WAITS (its connection already has max_queued bytes of
 * replies in flight, or all connections the cap on packed bytes: it stays
 * queued) or PARKED (in t->parked). */
static int serve_job(refit_transport_t *t, job_t *j, bool *stuck_checked)
{
    conn_t *c = j->conn;
    const void *buf = NULL;
    size_t len = 0, hlen;
    const void *hdr;
    uint32_t flags = 0;
    if (c->failed || c->closed || c->closing) {
        ucx_job_free(t, j);
        return SERVED;
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
        pub_region_t *r = NULL, *w = NULL;
        uint64_t total = 0;
        double now = refit_now();
        d->status = check_req(t, j, &r, &total);
        if (d->status == PUB_OK) d->status = check_wait(t, &j->req, &w);
        if (d->status == PUB_NOT_READY && now - j->arrived < j->req.wait_ms * 1e-3 && park(t, j, w, r))
            return PARKED; /* not written yet */
        if (d->status == PUB_AUTH) {
            c->closing = true; /* a request without the handshake: cut off after the refusal */
            refit_log(REFIT_LOG_WARN, "ucx: a request without a valid connection token; connection closed");
        }
        const wire_run_t *runs = (const wire_run_t *)j->items;
        uint32_t nr = j->req.nruns;
        bool packs = !(nr == 1 && runs[0].count == 1);
        if (d->status == PUB_OK && (c->sending_bytes || packs) && c->sending_bytes + total > t->o.max_queued)
            return WAITS; /* its earlier replies first (a single run larger than the cap goes alone) */
        /* Packed bytes are the memory a peer costs: 4 x max_queued in all,
         * the second half only for connections that read their replies
         * (one completed within UCX_STUCK_S), so that peers which never
         * read cannot hold up those which do. */
        uint64_t cap = UCX_PACKED_SHARES * t->o.max_queued;
        if (!(c->read_at > 0 && now - c->read_at < UCX_STUCK_S)) cap /= 2;
        if (d->status == PUB_OK && packs && t->packed_bytes + total > cap) {
            if (!*stuck_checked) close_stuck(t, c, now);
            *stuck_checked = true;
            return WAITS; /* the other connections' packed replies first */
        }
        if (d->status == PUB_OK && !packs) {
            buf = r->base + runs[0].off;
        } else if (d->status == PUB_OK) {
            j->pack = malloc(total);
            if (!j->pack) d->status = PUB_NO_MEMORY;
            else {
                unsigned char *p = j->pack;
                for (uint32_t i = 0; i < nr; i++)
                    for (uint64_t k = 0; k < runs[i].count; k++) {
                        memcpy(p, r->base + runs[i].off + k * runs[i].stride, runs[i].len);
                        p += runs[i].len;
                    }
                buf = j->pack;
                c->packed_bytes += total;
                t->packed_bytes += total;
            }
        }
        if (d->status == PUB_OK) {
            len = total;
            d->len = total;
            j->region = r;
            r->inflight++;
            j->bytes = total;
            if (!c->sending_bytes) c->progress_at = now; /* stuck from now if nothing completes */
            c->sending_bytes += total;
            if (j->req.flags & REQ_EAGER) flags |= UCP_AM_SEND_FLAG_EAGER;
            else if (t->o.rndv) flags |= total >= t->o.rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
        }
    }
    /* REPLY: the receiver checks that data comes over the connection it asked on. */
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = flags | UCP_AM_SEND_FLAG_REPLY,
                              .cb.send = job_sent_cb,
                              .user_data = j};
    void *req = ucp_am_send_nbx(c->ep, j->type == AM_HELLO ? AM_HELLO_REPLY : AM_DATA, hdr, hlen, buf, len, &rp);
    if (j->type == AM_REQ && j->req.wait_ms && refit_fleet_tracing()) /* a conditional request answered */
        refit_fleet_trace("post f%" PRIu64 " n%zu status %d after %.1f ms%s", j->req.flag_off, len,
                          (int)j->hdr.data.status, (refit_now() - j->arrived) * 1e3, req == NULL ? " sent" : "");
    if (UCS_PTR_IS_ERR(req)) {
        c->failed = true;
        ucx_job_free(t, j);
    } else if (req == NULL) {
        if (j->type == AM_REQ) c->progress_at = c->read_at = refit_now();
        ucx_job_free(t, j);
    } else {
        j->next = t->sending;
        if (t->sending) t->sending->prev = j;
        t->sending = j;
    }
    return SERVED;
}

/* Parked requests that may be due go back to t->jobs: all of them are
 * looked at after notify (memory changed), when the earliest wait ends, when
 * a connection that has some failed, and every 5 ms while no notify came for
 * a second (a writer that never notifies).  Otherwise a round costs nothing
 * for them, however many wait. */
static void unpark_due(refit_transport_t *t, double now)
{
    bool notified = atomic_exchange(&t->notified, false);
    if (!t->parked.len || (!notified && !t->parked_stale && now < t->parked_due)) return;
    bool poll = now - (double)atomic_load(&t->notify_ns) * 1e-9 > 1.0;
    t->parked_stale = false;
    t->parked_due = 1e300;
    for (size_t i = 0; i < t->parked.len;) {
        parked_t *p = &t->parked.data[i];
        conn_t *c = p->job->conn;
        if (c->failed || c->closed || c->closing || now >= p->due || parked_holds(p)) {
            if (REFIT_VEC_PUSH(&t->jobs, p->job)) break; /* out of memory: next round */
            c->parked--;
            *p = t->parked.data[--t->parked.len];
            continue;
        }
        if (p->due < t->parked_due) t->parked_due = p->due;
        i++;
    }
    if (poll && t->parked.len && now + 0.005 < t->parked_due) t->parked_due = now + 0.005;
}

/* ucx_progress_all for the publisher's worker, stopping early once
 * max_unproven connections wait to be cut off (conn_req_cb), so a flood's
 * connections are closed in bursts of that size. */
static unsigned pub_progress(refit_transport_t *t)
{
    unsigned total = 0, n, rounds = 0;
    while (t->doomed < t->max_unproven && (n = ucp_worker_progress(t->pw)) && rounds++ < 64) total += n;
    return total;
}

/* One round of publisher work (lock held): progress, serve jobs, close failed conns. */
unsigned ucx_pub_round(refit_transport_t *t)
{
    unsigned n = pub_progress(t);
    unpark_due(t, refit_now());
    bool stuck_checked = false;
    while (t->jobs.len) {
        /* serve in arrival order */
        size_t k = t->jobs.len;
        job_t **v = malloc(k * sizeof(*v));
        if (!v) break;
        memcpy(v, t->jobs.data, k * sizeof(*v));
        t->jobs.len = 0;
        size_t served = 0;
        for (size_t i = 0; i < k; i++) {
            int r = serve_job(t, v[i], &stuck_checked);
            if (r == SERVED) served++;
            else if (r == WAITS) REFIT_VEC_PUSH(&t->jobs, v[i]); /* cannot fail: the vector held k before */
        }
        free(v);
        n += (unsigned)served;
        n += pub_progress(t);
        if (!served) break; /* every queued job waits for its connection's replies to drain */
    }
    double now = refit_now();
    for (size_t i = 0; i < t->conns.len;) {
        conn_t *c = t->conns.data[i];
        if (!c->authed && !c->failed && now - c->created > t->o.auth_timeout) c->failed = true; /* never proven */
        if (c->failed && c->parked) t->parked_stale = true; /* its parked requests are dropped next round */
        if ((c->failed || (c->closing && c->refs == 0)) && !c->closed) conn_close(c), n++;
        if (c->closed && c->refs == 0) {
            t->conns.data[i] = t->conns.data[--t->conns.len];
            free(c);
            continue;
        }
        i++;
    }
    t->doomed = 0; /* every failed one is closed now */
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
        unsigned n = ucx_pub_round(t);
        double now = refit_now();
        if (n) idle_since = now;
        bool sleep = !n && now - idle_since >= t->o.spin_us * 1e-6;
        ucs_status_t s = sleep ? ucp_worker_arm(t->pw) : UCS_ERR_BUSY;
        /* A job left queued waits for replies to drain (an event wakes us);
         * a parked one for its condition (the writer wakes us:
         * refit_transport_wait_t.notify) or its due time (unpark_due sets
         * parked_due 5 ms ahead for a writer that does not notify). */
        int timeout_ms = 100;
        if (t->parked.len) {
            double ms = (t->parked_due - now) * 1e3;
            timeout_ms = ms <= 0 ? 0 : ms < 100 ? (int)ms + 1 : 100;
        }
        pthread_mutex_unlock(&t->lock);
        if (atomic_load(&t->waiters)) usleep(20);
        if (s == UCS_OK) {
            struct pollfd pf[2] = {{t->pw_efd, POLLIN, 0}, {t->wake_fd, POLLIN, 0}};
            if (poll(pf, 2, timeout_ms) > 0 && (pf[1].revents & POLLIN)) {
                uint64_t x;
                if (read(t->wake_fd, &x, sizeof(x)) < 0) { /* nothing to do */
                }
            }
            idle_since = refit_now();
        }
    }
    return NULL;
}

void ucx_notify(refit_transport_t *t)
{
    atomic_store(&t->notify_ns, refit_now_ns());
    atomic_store(&t->notified, true);
    ucx_wake_thread(t);
}

void ucx_wake_thread(refit_transport_t *t)
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

/* The connection caps from the descriptor limit: the soft limit is raised
 * to the hard one first (at most UCX_NOFILE_MAX), because the common soft
 * limit of 1024 let ~500 connections that never said HELLO take every
 * descriptor (heartbeats and pulls then failed with EMFILE).  A quarter of
 * the limit, at least UCX_FD_RESERVE_MIN, is left to the rest of the
 * process; the rest is UCX_FDS_PER_CONN per connection, max_unproven of
 * them held back for connections being closed (conn_req_cb). */
static void conn_limits(refit_transport_t *t)
{
    struct rlimit rl;
    uint64_t have = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        uint64_t hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
        uint64_t want = hard < UCX_NOFILE_MAX ? hard : UCX_NOFILE_MAX;
        have = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
        if (have < want) {
            struct rlimit up = {(rlim_t)want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
                refit_log(REFIT_LOG_INFO,
                          "ucx: raised this process's descriptor limit (RLIMIT_NOFILE) from %" PRIu64 " to %" PRIu64
                          " for the publisher's connections",
                          have, want);
                have = want;
            } else {
                refit_log(REFIT_LOG_INFO, "ucx: could not raise the descriptor limit from %" PRIu64 ": %s", have,
                          strerror(errno));
            }
        }
    }
    if (have > UCX_NOFILE_MAX) have = UCX_NOFILE_MAX;
    uint64_t reserve = have / 4 > UCX_FD_RESERVE_MIN ? have / 4 : UCX_FD_RESERVE_MIN;
    uint64_t room = have > reserve ? (have - reserve) / UCX_FDS_PER_CONN : 0;
    uint64_t unproven = room / 5 < UCX_MAX_UNPROVEN ? room / 5 : UCX_MAX_UNPROVEN;
    t->max_unproven = unproven ? (unsigned)unproven : 1;
    uint64_t conns = room > t->max_unproven ? room - t->max_unproven : 0;
    t->max_conns = conns > UCX_MAX_CONNS ? UCX_MAX_CONNS : conns < 4 ? 4 : (unsigned)conns;
    if (t->max_unproven > t->max_conns) t->max_unproven = t->max_conns;
    refit_log(REFIT_LOG_INFO, "ucx: descriptor limit %" PRIu64 ": at most %u connections, %u of them not proven yet",
              have, t->max_conns, t->max_unproven);
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
        if (tls && (cs = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK)
            st = ucx_err(REFIT_ERR_INVALID_ARG, cs, "tls=%s", tls);
        else if (devs && devs[0] && (cs = ucp_config_modify(cfg, "NET_DEVICES", devs)) != UCS_OK)
            st = ucx_err(REFIT_ERR_INVALID_ARG, cs, "devices=%s", devs);
        else st = ucx_init_context(t, cfg, &t->pctx);
        ucp_config_release(cfg);
        if (st) return st;
    }
    if (!t->pw) {
        if ((st = ucx_make_worker_in(t, t->pctx, &t->pw, &t->pw_efd, "refit-pub"))) return st;
        if ((st = ucx_set_am(t->pw, AM_HELLO, am_hello_cb, t)) || (st = ucx_set_am(t->pw, AM_REQ, am_req_cb, t)))
            return st;
    }
    if (!t->listener) {
        conn_limits(t);
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

refit_status_t ucx_expose(refit_transport_t *t, void *base, uint64_t size, void **desc, size_t *len)
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
    if (!st) r->id = ucx_random_id();
    wire_desc_t h = {UCX_MAGIC, UCX_DESC_VERSION,     t->pub_id, r->id, (uint64_t)(uintptr_t)base, size, t->port,
                     t->naddrs, (uint32_t)r->rkey_len};
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

void ucx_region_release(refit_transport_t *t, pub_region_t *r)
{
    if (r->rkey) ucp_rkey_buffer_release(r->rkey);
    if (r->memh) ucp_mem_unmap(t->pctx, r->memh);
    free(r);
}

void ucx_unexpose(refit_transport_t *t, void *base)
{
    if (!t) return;
    pub_lock(t);
    for (size_t i = 0; i < t->regions.len; i++) {
        pub_region_t *r = t->regions.data[i];
        if (r->base != base || r->dead) continue;
        r->dead = true;
        /* Parked requests naming it hold its addresses: back to the queue,
         * where they are refused (PUB_NO_REGION). */
        for (size_t k = 0; k < t->parked.len;) {
            parked_t *p = &t->parked.data[k];
            if (p->w != r && p->r != r) {
                k++;
                continue;
            }
            p->job->conn->parked--;
            if (REFIT_VEC_PUSH(&t->jobs, p->job)) ucx_job_free(t, p->job); /* its receiver times out */
            *p = t->parked.data[--t->parked.len];
        }
        ucx_wake_thread(t);
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
                ucx_wake_thread(t);
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
            ucx_region_release(t, r);
        }
        break;
    }
    pthread_mutex_unlock(&t->lock);
}
