/* The ucx transport, receiver side: a pull.  The plan's regions become runs
 * per peer, runs become requests in slots, replies land in the destination
 * (rendezvous) or are copied or scattered from UCX's or a staging buffer. */

#include "transport/ucx/ucx_internal.h"

/* ------------------------------------------------------------------------ */
/* Receiver side: pull                                                       */

/* count rows of len bytes: source off + k * sstride -> dst + k * dstride,
 * which is byte doff + k * dstride of destination region dregion. */
typedef struct {
    uint64_t off, len, count, sstride, dstride;
    unsigned char *dst;
    uint64_t doff;
    uint32_t dregion;
} run_t;

/* FREE -> WAIT (request sent) -> [RECV (rendezvous receive)] -> DONE ->
 * (PARKED while UCX still completes the request's send) -> FREE or WAIT. */
enum { SLOT_FREE = 0, SLOT_WAIT, SLOT_RECV, SLOT_DONE, SLOT_PARKED };

typedef struct pull_peer pull_peer_t;
typedef struct {
    pull_t *pl; /* NULL once its pull gave up on it (leaked, see ucx_pull) */
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
    /* UCX_MAX_RUNS each, one allocation made at the slot's first request: a
     * pull has room for 4 * inflight requests per peer, and a fleet chunk's
     * pull makes one or two (20 KiB a slot zeroed for nothing per chunk). */
    run_t *runs;
    wire_run_t *wire;
    req_hdr_t hdr;
    unsigned char *stage;
    bool staged; /* data went to stage: scatter on completion */
    bool hashed; /* its bytes went through the pull's digest map (ctl->dmap) */
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
    int wake_fd; /* eventfd: another thread completed one of our slots */
    double idle_since;
    const refit_pull_ctl_t *ctl;
    const refit_pull_wait_t *wait; /* NULL, or the condition every request carries */
    size_t *idx;                   /* the regions of every peer (pps[k].regs point into it) */
    uint64_t total;                /* bytes the plan reads through this pull */
    unsigned per;                  /* slots per peer: pps[k]'s are slots[k * per, (k + 1) * per) */
    uint64_t window;               /* bytes in flight per peer, at most */
};

/* Whether replies to this pull from peer p are asked eager (ucx_opts_t.tcp_eager):
 * only over TCP-only lanes, always with tcp_eager=1, with auto when the
 * caller's round trips are slow (refit_pull_ctl_t.busy_egress). */
static bool pull_eager(const pull_t *pl, const refit_peer_t *p)
{
    int mode = pl->t->o.tcp_eager;
    return p->tcp_only && (mode == TCP_EAGER_ON || (mode == TCP_EAGER_AUTO && pl->ctl && pl->ctl->busy_egress));
}

/* ucx_rwait for a pull's thread: its own completions end the wait too, and it
 * sleeps without rlock, so that other pulls progress meanwhile. */
void ucx_pwait(refit_transport_t *t, pull_t *pl, double until, double spin_s)
{
    static __thread double idle_since;
    double *idle = pl ? &pl->idle_since : &idle_since;
    t->progressing = pl;
    unsigned n = ucx_progress_all(t->rw);
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

/* Whether a row at source offset so, landing at dst, continues run g's rows
 * at equal strides on both sides (rows in order, not overlapping). */
static bool joins_rows(run_t *g, uint64_t so, unsigned char *dst)
{
    if (g->count == 1) {
        if (so < g->off + g->len || dst < g->dst + g->len) return false;
        g->sstride = so - g->off;
        g->dstride = (uint64_t)(dst - g->dst);
        return true;
    }
    return so == g->off + g->count * g->sstride && dst == g->dst + g->count * g->dstride;
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
        bool same = last && last->dregion == r->dst_region; /* offsets are counted in one region */
        bool adjacent = same && last->count == 1 && last->off + last->len == so && last->dst + last->len == dst;
        /* A request is one run (zero copy on both sides), or a batch of
         * short runs (packed by the publisher, scattered here): a run of
         * solo bytes or more never joins a batch. */
        if (s->nruns && !adjacent && (left >= o->solo || s->runs[0].len >= o->solo)) break;
        if (adjacent) {
            last->len += take;
        } else if (same && take == last->len && joins_rows(last, so, dst)) {
            last->count++; /* the next row of a strided run */
        } else {
            if (s->nruns == UCX_MAX_RUNS) break;
            s->runs[s->nruns++] = (run_t){so, take, 1, 0, 0, dst, dof + pp->row_off, r->dst_region};
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

/* Copies a reply (src: UCX's buffer or the slot's staging) into the slot's
 * runs, or with src NULL leaves the bytes where they landed (a rendezvous
 * into place, RMA gets); with the pull's digest map, hashes them on the way
 * (fused with the copy) or in place, while they are in cache. */
static void scatter(slot_t *s, const unsigned char *src)
{
    const refit_pull_ctl_t *ctl = s->pl ? s->pl->ctl : NULL;
    const refit_digest_map_t *map = ctl ? ctl->dmap : NULL;
    uint64_t hashed = 0;
    for (uint32_t i = 0; i < s->nruns; i++) {
        const run_t *r = &s->runs[i];
        if (map) /* a run's rows lie back to back in the reply (src) */
            hashed += refit_digest_map_copy_rows(map, r->dregion, r->doff, r->dstride, r->dst, src, r->len, r->len,
                                                 r->count, ctl->dacc);
        else
            for (uint64_t k = 0; k < r->count && src; k++) memcpy(r->dst + k * r->dstride, src + k * r->len, r->len);
        if (src) src += r->len * r->count;
    }
    if (hashed) __atomic_fetch_add(ctl->dbytes, hashed, __ATOMIC_RELAXED);
    s->hashed = true;
}

ucs_status_t ucx_am_data_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
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
    if (s->hdr.wait_ms && refit_fleet_tracing()) /* a conditional request (a relay's chunk): its reply is here */
        refit_fleet_trace("arrive f%" PRIu64 " n%zu rndv=%d", s->hdr.flag_off, len,
                          !!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV));
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
    if (s->nruns == 1 && s->runs[0].count == 1) {
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
    s->hashed = false;
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
        for (uint32_t i = 0; i < s->nruns && s->status == UCS_OK; i++)
            for (uint64_t k = 0; k < s->runs[i].count; k++) {
                const run_t *g = &s->runs[i];
                ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                          .cb.send = get_done_cb,
                                          .user_data = s};
                void *r = ucp_get_nbx(p->ep, g->dst + k * g->dstride, g->len, pr->base + g->off + k * g->sstride,
                                      pr->rkey, &rp);
                if (UCS_PTR_IS_ERR(r)) {
                    s->status = UCS_PTR_STATUS(r);
                    break;
                }
                if (r) s->gets_pending++;
            }
        if (--s->gets_pending == 0) mark_done(pl, s);
        return UCS_OK;
    }
    for (uint32_t i = 0; i < s->nruns; i++)
        s->wire[i] = (wire_run_t){s->runs[i].off, s->runs[i].len, s->runs[i].sstride, s->runs[i].count};
    s->hdr = (req_hdr_t){.magic = UCX_MAGIC,
                         .nruns = s->nruns,
                         .seq = pl->seq,
                         .idx = s->idx,
                         .gen = s->gen,
                         .region_id = p->regions[s->region].id,
                         .pub_id = p->pub_id,
                         .flags = pull_eager(pl, p) ? REQ_EAGER : 0};
    memcpy(s->hdr.token, p->token, TOKEN_LEN);
    if (pl->wait) {
        const refit_pull_wait_t *c = pl->wait;
        s->hdr.wait_region = p->regions[c->region].id;
        s->hdr.word_off = c->word_off;
        s->hdr.word = c->word;
        s->hdr.flag_off = c->flag_off;
        s->hdr.wait_ms = c->ms;
    }
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
    return s->send_pending || s->state == SLOT_RECV || s->gets_pending || (s->state == SLOT_WAIT && s->pp->peer->ep);
}

/* Closes the endpoints of the pull's failed peers (that completes their requests). */
static void close_failed(refit_transport_t *t, pull_t *pl)
{
    for (size_t k = 0; k < pl->npps; k++) {
        refit_peer_t *p = pl->pps[k].peer;
        if (p->failed != UCS_OK && p->ep) {
            ucx_ep_force_close(t, p->ep);
            p->ep = NULL;
            p->broken = true;
        }
    }
}


/* What region r of the plan needs of its peer p before the pull starts. */
static refit_status_t check_region(const pull_t *pl, const refit_plan_region_t *r, const refit_peer_t *p)
{
    const refit_pull_wait_t *w = pl->wait;
    if (p->t != pl->t)
        return refit_error(REFIT_ERR_INVALID_ARG, "ucx: pull: source %u was connected by another transport", r->src);
    if (r->src_region >= p->nregions || refit_region_src_end(r) > p->regions[r->src_region].size)
        return refit_error(REFIT_ERR_CORRUPT, "ucx: the plan reads past region %u of source %u (publisher %s)",
                           r->src_region, r->src, p->name);
    if (!p->ep || p->broken)
        return refit_error(REFIT_ERR_PEER, "ucx: source %u (publisher %s) failed in an earlier pull; reconnect", r->src,
                           p->name);
    if (p->failed != UCS_OK)
        return ucx_err(REFIT_ERR_PEER, p->failed, "source %u (publisher %s) failed", r->src, p->name);
    if (w && (p->use_get || w->region >= p->nregions || w->ms > UCX_MAX_WAIT_MS))
        return refit_error(p->use_get ? REFIT_ERR_UNSUPPORTED : REFIT_ERR_INVALID_ARG,
                           "ucx: a conditional pull from publisher %s %s", p->name,
                           p->use_get ? "needs requests (method=am), not gets"
                                      : "names a region it does not have, or waits too long");
    if (p->use_get && !p->regions[r->src_region].rkey)
        return refit_error(REFIT_ERR_TRANSPORT, "ucx: no remote key for region %u of publisher %s (method=get)",
                           r->src_region, p->name);
    return REFIT_OK;
}

/* The pull's peers (pl->pps): the plan's region indices grouped by source,
 * in plan order, after every region's checks. */
static refit_status_t group_by_source(pull_t *pl, refit_peer_t *const *peers, size_t nsrc, size_t nregs)
{
    const refit_plan_region_t *regs = pl->regs;
    pl->pps = calloc(nsrc ? nsrc : 1, sizeof(*pl->pps));
    pl->idx = calloc(nregs ? nregs : 1, sizeof(*pl->idx));
    size_t *count = calloc(nsrc ? nsrc : 1, sizeof(size_t));
    refit_status_t st = REFIT_OK;
    if (!pl->pps || !pl->idx || !count) {
        free(count);
        return refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
    }
    for (size_t i = 0; i < nregs && !st; i++) {
        const refit_plan_region_t *r = &regs[i];
        if (r->src >= nsrc || !peers[r->src]) continue;
        if ((st = check_region(pl, r, peers[r->src])) || refit_plan_region_bytes(r) == 0) continue;
        count[r->src]++;
        pl->total += refit_plan_region_bytes(r);
    }
    size_t at = 0;
    for (size_t s = 0; s < nsrc && !st; s++) {
        if (!count[s]) continue;
        pull_peer_t *pp = &pl->pps[pl->npps++];
        pp->peer = peers[s];
        pp->src = (uint32_t)s;
        pp->regs = pl->idx + at;
        at += count[s];
    }
    free(count);
    if (st) return st;
    for (size_t i = 0, k = 0; i < nregs; i++) {
        const refit_plan_region_t *r = &regs[i];
        if (r->src >= nsrc || !peers[r->src] || refit_plan_region_bytes(r) == 0) continue;
        while (pl->pps[k].src != r->src) k = (k + 1) % pl->npps;
        pl->pps[k].regs[pl->pps[k].nregs++] = i;
    }
    for (size_t k = 0; k < pl->npps; k++) pl->pps[k].rows = refit_region_rows(&regs[pl->pps[k].regs[0]]);
    return REFIT_OK;
}

/* Per peer: up to inflight * chunk bytes in flight, in at most 4 * inflight
 * requests (short solo runs make small requests); the pull becomes one of
 * the transport's active ones.  rlock held. */
static refit_status_t start_slots(pull_t *pl)
{
    refit_transport_t *t = pl->t;
    pl->per = t->o.inflight * 4 > 256 ? 256 : t->o.inflight * 4;
    pl->window = (uint64_t)t->o.inflight * t->o.chunk;
    pl->nslots = pl->npps * pl->per;
    pl->slots = calloc(pl->nslots ? pl->nslots : 1, sizeof(slot_t));
    pl->done = calloc(pl->nslots ? pl->nslots : 1, sizeof(uint32_t));
    if (!pl->slots || !pl->done) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
    for (size_t i = 0; i < pl->nslots; i++) {
        pl->slots[i].idx = (uint32_t)i;
        pl->slots[i].pp = &pl->pps[i / pl->per];
        pl->slots[i].pl = pl;
    }
    if (REFIT_VEC_RESERVE(&t->active, t->active.len + 1)) return refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull");
    pl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pl->seq = ++t->pull_seq;
    t->active.data[t->active.len++] = pl;
    return REFIT_OK;
}

/* Fills every peer's window with free slots. */
static refit_status_t fill_windows(pull_t *pl)
{
    for (size_t i = 0; i < pl->nslots; i++) {
        slot_t *s = &pl->slots[i];
        pull_peer_t *pp = s->pp;
        if (s->state != SLOT_FREE || pp->exhausted || pp->inflight_bytes >= pl->window) continue;
        if (!s->runs && !(s->runs = malloc(UCX_MAX_RUNS * (sizeof(run_t) + sizeof(wire_run_t)))))
            return refit_error(REFIT_ERR_NO_MEMORY, "ucx: pull: request %zu's run list", i);
        s->wire = (wire_run_t *)(s->runs + UCX_MAX_RUNS);
        if (next_request(pl, pp, s)) issue(pl, s);
        else pp->exhausted = true;
    }
    return REFIT_OK;
}

/* Completed slots: scatter, account; then those whose request send has
 * completed are free again. */
static refit_status_t reap_slots(pull_t *pl, double now)
{
    while (pl->ndone) {
        slot_t *s = &pl->slots[pl->done[--pl->ndone]];
        pull_peer_t *pp = s->pp;
        if (s->pub_status != PUB_OK)
            return refit_error(s->pub_status == PUB_NOT_READY ? REFIT_ERR_BUSY : REFIT_ERR_PEER,
                               "ucx: publisher %s (source %u): %s", pp->peer->name, pp->src,
                               pub_status_str(s->pub_status));
        if (s->status != UCS_OK) {
            ucs_status_t why = pp->peer->failed != UCS_OK ? pp->peer->failed : s->status;
            return ucx_err(ucx_status_code(why), why, "pulling from publisher %s (source %u)", pp->peer->name, pp->src);
        }
        if (s->staged) scatter(s, s->stage);
        else if (!s->hashed && pl->ctl && pl->ctl->dmap) scatter(s, NULL); /* landed in place: hash it there */
        pp->bytes += s->bytes;
        pp->inflight_bytes -= s->bytes;
        pp->last_data = now;
        s->state = SLOT_PARKED;
    }
    for (size_t i = 0; i < pl->nslots; i++) {
        slot_t *s = &pl->slots[i];
        if (s->state != SLOT_PARKED || s->send_pending) continue;
        s->state = SLOT_FREE;
        s->pp->busy--;
    }
    return REFIT_OK;
}

/* A peer that failed, or stalled past stall_timeout, fails the pull. */
static refit_status_t check_peers(const pull_t *pl, double now)
{
    for (size_t k = 0; k < pl->npps; k++) {
        const pull_peer_t *pp = &pl->pps[k];
        if (pp->peer->failed != UCS_OK)
            return ucx_err(REFIT_ERR_PEER, pp->peer->failed, "publisher %s (source %u) failed mid-pull", pp->peer->name,
                           pp->src);
        if (pp->busy && now - pp->last_data > pl->t->o.stall_timeout)
            return refit_error(REFIT_ERR_PEER, "ucx: publisher %s (source %u) sent nothing for %.0f s", pp->peer->name,
                               pp->src, pl->t->o.stall_timeout);
    }
    return REFIT_OK;
}

/* The pull's deadline and tick (the tick without rlock: it may wait on the
 * registry, and other pulls go on meanwhile). */
static refit_status_t deadline_and_tick(pull_t *pl, double now, double deadline, double *next_tick)
{
    const refit_pull_ctl_t *ctl = pl->ctl;
    if (deadline && now > deadline) {
        uint64_t got = 0;
        for (size_t k = 0; k < pl->npps; k++) got += pl->pps[k].bytes;
        return refit_error(REFIT_ERR_TIMEOUT, "ucx: pull deadline passed with %" PRIu64 " of %" PRIu64 " bytes moved",
                           got, pl->total);
    }
    if (!ctl || !ctl->tick || now < *next_tick) return REFIT_OK;
    *next_tick = now + 0.05;
    pthread_mutex_unlock(&pl->t->rlock);
    refit_status_t ts = ctl->tick(ctl->user);
    pthread_mutex_lock(&pl->t->rlock);
    if (ts) refit_error_prefix("ucx: pull aborted by its tick");
    return ts;
}

/* Requests and replies until every peer's regions are in, or a failure. */
static refit_status_t run_pull(pull_t *pl)
{
    refit_transport_t *t = pl->t;
    refit_status_t st = REFIT_OK;
    double deadline = pl->ctl && pl->ctl->deadline > 0 ? pl->ctl->deadline : 0;
    double now = refit_now(), next_tick = now + 0.05;
    for (size_t k = 0; k < pl->npps; k++) pl->pps[k].last_data = now;
    for (;;) {
        /* Another pull sharing a peer may have closed it while this one
         * slept or ticked without the lock. */
        for (size_t k = 0; k < pl->npps; k++)
            if ((pl->pps[k].busy || !pl->pps[k].exhausted) && (!pl->pps[k].peer->ep || pl->pps[k].peer->broken))
                return refit_error(REFIT_ERR_PEER, "ucx: publisher %s (source %u) failed in another pull",
                                   pl->pps[k].peer->name, pl->pps[k].src);
        if ((st = fill_windows(pl))) return st;
        bool busy = false;
        for (size_t k = 0; k < pl->npps; k++) busy |= pl->pps[k].busy > 0;
        if (!busy) return REFIT_OK;
        ucx_pwait(t, pl, deadline ? deadline : refit_now() + 1, t->o.spin_us * 1e-6);
        now = refit_now();
        if ((st = reap_slots(pl, now)) || (st = check_peers(pl, now)) ||
            (st = deadline_and_tick(pl, now, deadline, &next_tick)))
            return st;
    }
}

/* Takes the pull out of the transport's active ones (late replies no longer
 * find it). */
static void deactivate(pull_t *pl)
{
    refit_transport_t *t = pl->t;
    for (size_t i = 0; i < t->active.len; i++)
        if (t->active.data[i] == pl) {
            t->active.data[i] = t->active.data[--t->active.len];
            break;
        }
}

static bool any_busy(const pull_t *pl, size_t from, size_t to)
{
    bool any = false;
    for (size_t i = from; i < to; i++) any |= slot_busy(&pl->slots[i]);
    return any;
}

/* After a failure: lets UCX finish (or cancel) everything that may touch the
 * slots or the destination before the pull returns.  Failed peers are closed
 * at once (that completes their requests); the replies of live ones get a
 * second (and a conditional request's its wait), then their endpoints are
 * closed too. */
static void drain(pull_t *pl)
{
    refit_transport_t *t = pl->t;
    close_failed(t, pl);
    double until = refit_now() + 1 + (pl->wait ? pl->wait->ms * 1e-3 : 0);
    bool any;
    while ((any = any_busy(pl, 0, pl->nslots)) && refit_now() < until) ucx_pwait(t, pl, until, 0.0005);
    if (any) {
        for (size_t k = 0; k < pl->npps; k++) {
            refit_peer_t *p = pl->pps[k].peer;
            if (p->ep && any_busy(pl, k * pl->per, (k + 1) * pl->per)) {
                ucx_ep_force_close(t, p->ep);
                p->ep = NULL;
                p->broken = true;
            }
        }
        until = refit_now() + 2;
        while ((any = any_busy(pl, 0, pl->nslots)) && refit_now() < until) ucx_progress_all(t->rw);
    }
    if (any) {
        /* UCX still holds requests pointing into the slots: leak them rather
         * than let a callback write into freed memory (the slots forget this
         * pull, which is about to end, and late replies no longer find it). */
        for (size_t i = 0; i < pl->nslots; i++) pl->slots[i].pl = NULL;
        deactivate(pl);
        pl->nslots = 0;
        pl->slots = NULL;
        pl->done = NULL;
    }
    close_failed(t, pl);
}

/* A successful pull's bytes, requests and lanes, added to stats. */
static void add_stats(const pull_t *pl, refit_pull_stats_t *stats)
{
    stats->bytes += pl->total;
    stats->requests += pl->requests;
    size_t used = strlen(stats->lanes);
    for (size_t k = 0; k < pl->npps; k++) {
        const refit_peer_t *p = pl->pps[k].peer;
        char one[200];
        snprintf(one, sizeof(one), "ucx:%s %s", p->lanes[0] ? p->lanes : "?",
                 p->use_get          ? "get"
                 : pull_eager(pl, p) ? "am, eager"
                                     : "am");
        if (strstr(stats->lanes, one)) continue;
        int w = snprintf(stats->lanes + used, sizeof(stats->lanes) - used, "%s%s", used ? ", " : "", one);
        if (w > 0 && (size_t)w < sizeof(stats->lanes) - used) used += (size_t)w;
    }
}

/* Takes the pull out of the transport's active ones and frees what it holds. */
static void pull_end(pull_t *pl)
{
    deactivate(pl);
    if (pl->wake_fd >= 0) close(pl->wake_fd);
    if (pl->slots)
        for (size_t i = 0; i < pl->nslots; i++) {
            free(pl->slots[i].stage);
            free(pl->slots[i].runs);
        }
    free(pl->slots);
    free(pl->done);
    free(pl->pps);
    free(pl->idx);
}

/* A pull, conditional where w is not NULL. */
static refit_status_t pull_with(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                                void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_wait_t *w,
                                refit_pull_stats_t *stats)
{
    if (!t || !peers || !plan || !dst_bases) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: pull: NULL argument");
    size_t nsrc = refit_plan_num_sources(plan), nregs;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &nregs);
    pull_t pl = {.t = t, .regs = regs, .dst_bases = dst_bases, .wake_fd = -1, .ctl = ctl, .wait = w};
    pthread_mutex_lock(&t->rlock);
    refit_status_t st = group_by_source(&pl, peers, nsrc, nregs);
    if (!st && !(st = start_slots(&pl))) {
        if ((st = run_pull(&pl))) drain(&pl);
        else if (stats) add_stats(&pl, stats);
    }
    pull_end(&pl);
    pthread_mutex_unlock(&t->rlock);
    return st;
}

refit_status_t ucx_pull(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                        void *const *dst_bases, const refit_pull_ctl_t *ctl, refit_pull_stats_t *stats)
{
    return pull_with(t, peers, plan, dst_bases, ctl, NULL, stats);
}

static refit_status_t ucx_pull_wait(refit_transport_t *t, refit_peer_t *const *peers, const refit_plan_t *plan,
                                    void *const *dst_bases, const refit_pull_ctl_t *ctl, const refit_pull_wait_t *w,
                                    refit_pull_stats_t *stats)
{
    if (!w || !w->ms) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: a conditional pull without a wait (ms 0)");
    return pull_with(t, peers, plan, dst_bases, ctl, w, stats);
}

const refit_transport_wait_t ucx_wait_ext = {.pull = ucx_pull_wait, .notify = ucx_notify};
