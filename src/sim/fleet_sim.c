/* One refit of a fleet, simulated: receivers that discover, pick holders,
 * pull and serve as relays, over the network model (net.c).
 *
 * Every decision a receiver makes comes from the engine's rules (fleet.h):
 * which holders it picks (refit_fleet_pick, refit_fleet_room on load
 * tokens: the relay tree), whether the pull runs direct (refit_fleet_direct_ok),
 * how the plan becomes chunks (refit_fleet_sched_chunks) and shares
 * (refit_fleet_share), which chunk a holder's worker takes next with stealing
 * and re-reads (refit_fleet_claim, refit_fleet_chunk_done), and what a chunk
 * read from a relay costs (refit_fleet_piece_from).  What the engine does
 * with threads and transports, this file does with events:
 *
 *   begin -> (control plane, or discover + plan + connect on a first pull)
 *   select: pick holders (or wait for room: woken by any relay announcing or
 *           any reader leaving, else after 20 ms, as fleet_select waits)
 *   transfer: chunks: each holder's workers claim chunks; a claim costs a
 *             request round trip (plus the queue of a busy egress link) and
 *             the chunk is a flow; a worker with nothing to claim sleeps 2 ms
 *             or until a chunk of its receiver is done, and reads a relay's
 *             progress (a round trip) at most every millisecond;
 *             fluid: one flow per holder with the share the rules give it,
 *             a reader of a relay still receiving held to that relay's pace
 *             once it is within `workers` chunks of it; a holder done early
 *             takes over part of a clearly slower holder's rest;
 *             direct: one flow per planned source;
 *             delta: chunk tables, then the payloads of the chunks the plan
 *             reads, then the apply (CPU);
 *   end (data in place, after the records are re-read) -> commit: the relay
 *   serves the whole version, the reader's load tokens are released. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim_internal.h"

enum { EV_BEGIN, EV_SELECT, EV_XFER, EV_TRY, EV_REQ, EV_REFRESH, EV_END, EV_COMMIT, EV_DELTA, EV_TICK };
enum { FL_CHUNK = 1, FL_DIRECT, FL_FLUID, FL_DELTA };

typedef struct {
    double t;
    uint64_t seq;
    uint32_t type, rx, w;
    uint64_t gen;
} ev_t;

typedef struct {
    uint32_t h;
    uint64_t gen;
    bool busy, sleeping, stopped;
    refit_fleet_chunk_t *c;
    double t0;
    bool rows;
    uint64_t bytes;
} worker_t;

typedef struct {
    uint32_t idx, rank, replica, plan;
    int slot;
    uint32_t gpu;
    int state; /* 0 idle, 1 setup, 2 select, 3 transfer, 4 data in place, 5 committed */
    double begin, xfer, end;
    uint64_t sel_gen;
    bool waiting;
    /* holders */
    uint32_t nh;
    refit_fleet_holder_t *H;
    int32_t *hsrc;   /* >= 0: trainer rank; < 0: -(receiver + 1), a relay */
    uint32_t *hgpu;
    uint64_t *plan_keys;
    refit_fleet_sched_t S;
    bool direct, with_trainer;
    /* as a relay */
    bool announced, data_done, complete;
    uint32_t readers;
    /* tokens held */
    bool trainer_token;
    uint32_t held[REFIT_MAX_RELAYS_SIM];
    uint32_t nheld;
    /* chunks */
    worker_t *W;
    uint32_t nw;
    /* fluid */
    uint32_t *hflow;     /* per holder: active flow, UINT32_MAX none */
    double *hbytes;      /* per holder: payload bytes assigned so far */
    double total;        /* payload bytes this receiver reads */
    double recv_done;    /* payload bytes of flows finished */
    uint32_t flows_left;
    double idle;         /* seconds of request gaps its workers cannot hide */
    /* delta */
    int phase;
    /* results */
    uint64_t bytes_trainer, bytes_relay;
    uint32_t used;
    char first_holder[32];
} rx_t;

typedef struct {
    const sim_fleet_t *f;
    const sim_cluster_t *c;
    sim_plans_t P;
    sim_net_t *net;
    rx_t *rx;
    uint32_t nrx;
    uint32_t *src_gpu;
    uint32_t *tokens;    /* trainer load tokens per destination rank */
    double now;
    REFIT_VEC(ev_t) heap;
    uint64_t seq;
    bool dirty;
    uint64_t chunk;
    unsigned workers;
    bool fluid, net_transport, static_plan;
    /* links */
    uint32_t ngpu, nnode;
    uint32_t *l_nvtx, *l_nvrx, *l_pctx, *l_pcrx, *l_nictx, *l_nicrx, *l_up, *l_down;
    /* delta, per plan: table and payload bytes per source, units applied */
    double **d_table, **d_payload;
    double *d_units;
    /* stats */
    uint64_t events, flows;
    REFIT_VEC(sim_sample_t) samples;
    double *last_util;
    char err[256];
    refit_status_t st;
} sim_t;

static refit_peer_t *const g_peer = (refit_peer_t *)&g_peer; /* any non-NULL peer: the rules only test it */

/* ---- events ----------------------------------------------------------------- */

static bool ev_less(const ev_t *a, const ev_t *b) { return a->t < b->t || (a->t == b->t && a->seq < b->seq); }

static void push(sim_t *s, double t, uint32_t type, uint32_t rx, uint32_t w, uint64_t gen)
{
    ev_t e = {t, s->seq++, type, rx, w, gen};
    if (REFIT_VEC_PUSH(&s->heap, e)) {
        if (!s->st) s->st = refit_error(REFIT_ERR_NO_MEMORY, "events");
        return;
    }
    size_t i = s->heap.len - 1;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&s->heap.data[i], &s->heap.data[p])) break;
        ev_t tmp = s->heap.data[i];
        s->heap.data[i] = s->heap.data[p];
        s->heap.data[p] = tmp;
        i = p;
    }
}

static ev_t pop(sim_t *s)
{
    ev_t top = s->heap.data[0];
    s->heap.data[0] = s->heap.data[--s->heap.len];
    size_t i = 0, n = s->heap.len;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ev_less(&s->heap.data[l], &s->heap.data[m])) m = l;
        if (r < n && ev_less(&s->heap.data[r], &s->heap.data[m])) m = r;
        if (m == i) break;
        ev_t tmp = s->heap.data[i];
        s->heap.data[i] = s->heap.data[m];
        s->heap.data[m] = tmp;
        i = m;
    }
    return top;
}

static uint64_t user_of(uint32_t kind, uint32_t rx, uint32_t idx)
{
    return ((uint64_t)kind << 60) | ((uint64_t)rx << 32) | idx;
}

/* ---- the cluster's links and paths -------------------------------------------- */

static uint32_t node_of(const sim_t *s, uint32_t gpu) { return gpu / s->c->gpus; }
static uint32_t nic_of(const sim_t *s, uint32_t gpu)
{
    uint32_t local = gpu % s->c->gpus;
    return node_of(s, gpu) * s->c->nics + local * s->c->nics / s->c->gpus;
}

static refit_status_t build_links(sim_t *s)
{
    const sim_cluster_t *c = s->c;
    uint32_t maxg = 0;
    for (uint32_t k = 0; k < s->P.src_world; k++)
        if (s->src_gpu[k] + 1 > maxg) maxg = s->src_gpu[k] + 1;
    for (uint32_t i = 0; i < s->nrx; i++)
        if (s->rx[i].gpu + 1 > maxg) maxg = s->rx[i].gpu + 1;
    s->nnode = (maxg + c->gpus - 1) / c->gpus;
    if (c->nodes > s->nnode) s->nnode = c->nodes;
    if (c->nodes && maxg > c->nodes * c->gpus)
        return refit_error(REFIT_ERR_INVALID_ARG, "the fleet needs %u GPUs; the cluster has %u", maxg,
                           c->nodes * c->gpus);
    s->ngpu = s->nnode * c->gpus;
    uint32_t nnic = s->nnode * c->nics, nleaf = (s->nnode + c->leaf - 1) / c->leaf;
    s->l_nvtx = calloc(s->ngpu, sizeof(uint32_t));
    s->l_nvrx = calloc(s->ngpu, sizeof(uint32_t));
    s->l_pctx = calloc(s->ngpu, sizeof(uint32_t));
    s->l_pcrx = calloc(s->ngpu, sizeof(uint32_t));
    s->l_nictx = calloc(nnic, sizeof(uint32_t));
    s->l_nicrx = calloc(nnic, sizeof(uint32_t));
    s->l_up = calloc(nleaf ? nleaf : 1, sizeof(uint32_t));
    s->l_down = calloc(nleaf ? nleaf : 1, sizeof(uint32_t));
    if (!s->l_nvtx || !s->l_nvrx || !s->l_pctx || !s->l_pcrx || !s->l_nictx || !s->l_nicrx || !s->l_up || !s->l_down)
        return refit_error(REFIT_ERR_NO_MEMORY, "links");
    char name[48];
    for (uint32_t g = 0; g < s->ngpu; g++) {
        s->l_nvtx[g] = s->l_nvrx[g] = s->l_pctx[g] = s->l_pcrx[g] = UINT32_MAX;
        if (c->nvlink > 0) {
            snprintf(name, sizeof(name), "nvlink-out gpu%u", g);
            s->l_nvtx[g] = sim_net_link(s->net, name, SIM_LINK_NVL_TX, c->nvlink);
            snprintf(name, sizeof(name), "nvlink-in gpu%u", g);
            s->l_nvrx[g] = sim_net_link(s->net, name, SIM_LINK_NVL_RX, c->nvlink);
        }
        if (c->pcie > 0) {
            snprintf(name, sizeof(name), "pcie-out gpu%u", g);
            s->l_pctx[g] = sim_net_link(s->net, name, SIM_LINK_PCIE, c->pcie);
            snprintf(name, sizeof(name), "pcie-in gpu%u", g);
            s->l_pcrx[g] = sim_net_link(s->net, name, SIM_LINK_PCIE, c->pcie);
        }
    }
    /* Per-rank NIC rates (a node's tbf in the calibration): a rank's rate sets its NIC's. */
    double *rate = malloc(nnic * sizeof(double));
    if (!rate) return refit_error(REFIT_ERR_NO_MEMORY, "links");
    for (uint32_t n = 0; n < nnic; n++) rate[n] = c->nic;
    for (uint32_t k = 0; s->f->src_rate && k < s->P.src_world; k++)
        if (s->f->src_rate[k] > 0) rate[nic_of(s, s->src_gpu[k])] = s->f->src_rate[k];
    for (uint32_t i = 0; s->f->rx_rate && i < s->nrx; i++)
        if (s->f->rx_rate[i] > 0) rate[nic_of(s, s->rx[i].gpu)] = s->f->rx_rate[i];
    for (uint32_t n = 0; n < nnic; n++) {
        snprintf(name, sizeof(name), "nic-tx node%u.%u", n / c->nics, n % c->nics);
        s->l_nictx[n] = sim_net_link(s->net, name, SIM_LINK_NIC_TX, rate[n]);
        snprintf(name, sizeof(name), "nic-rx node%u.%u", n / c->nics, n % c->nics);
        s->l_nicrx[n] = sim_net_link(s->net, name, SIM_LINK_NIC_RX, rate[n]);
    }
    free(rate);
    for (uint32_t l = 0; l < nleaf; l++) {
        s->l_up[l] = s->l_down[l] = UINT32_MAX;
        if (c->spine > 1) {
            double cap = (double)c->leaf * c->nics * c->nic / c->spine;
            snprintf(name, sizeof(name), "spine-up leaf%u", l);
            s->l_up[l] = sim_net_link(s->net, name, SIM_LINK_UP, cap);
            snprintf(name, sizeof(name), "spine-down leaf%u", l);
            s->l_down[l] = sim_net_link(s->net, name, SIM_LINK_DOWN, cap);
        }
    }
    return REFIT_OK;
}

static void add(sim_path_t *p, uint32_t link, double w, bool data)
{
    if (link == UINT32_MAX || p->n >= SIM_PATH_MAX) return;
    p->link[p->n] = link;
    p->w[p->n] = (float)w;
    p->data[p->n] = data;
    p->n++;
}

/* The links bytes from GPU a to GPU b cross (and their acknowledgements). */
static void path_of(const sim_t *s, uint32_t a, uint32_t b, sim_path_t *p)
{
    const sim_cluster_t *c = s->c;
    memset(p, 0, sizeof(*p));
    if (a == b) return;
    if (c->nvlink > 0 && a / c->nvdomain == b / c->nvdomain) {
        add(p, s->l_nvtx[a], 1, true);
        add(p, s->l_nvrx[b], 1, true);
        return;
    }
    double w = 1 / c->eff;
    uint32_t na = nic_of(s, a), nb = nic_of(s, b);
    uint32_t la = node_of(s, a) / c->leaf, lb = node_of(s, b) / c->leaf;
    add(p, s->l_pctx[a], 1, true);
    add(p, s->l_nictx[na], w, true);
    if (la != lb) {
        add(p, s->l_up[la], w, true);
        add(p, s->l_down[lb], w, true);
    }
    add(p, s->l_nicrx[nb], w, true);
    add(p, s->l_pcrx[b], 1, true);
    if (c->ack > 0) { /* acknowledgements ride the reverse direction */
        add(p, s->l_nictx[nb], c->ack, false);
        add(p, s->l_nicrx[na], c->ack, false);
    }
}

/* A request from GPU g waits behind the data queued on its busy egress. */
static double request_delay(const sim_t *s, uint32_t g)
{
    const sim_cluster_t *c = s->c;
    double d = c->rtt;
    if (c->req_queue > 0) {
        uint32_t l = s->l_nictx[nic_of(s, g)];
        uint32_t n;
        sim_link_t *lk = sim_net_links(s->net, &n);
        if (lk[l].nflows > 0) d += c->req_queue / lk[l].cap;
    }
    return d;
}

static uint32_t start_flow(sim_t *s, uint32_t from, uint32_t to, double bytes, uint64_t user)
{
    sim_path_t p;
    path_of(s, from, to, &p);
    uint32_t f = sim_net_start(s->net, &p, bytes, 0, user, s->now);
    if (f == UINT32_MAX && !s->st) s->st = refit_error(REFIT_ERR_NO_MEMORY, "flows");
    s->flows++;
    s->dirty = true;
    return f;
}

/* ---- receivers ------------------------------------------------------------------- */

static const refit_plan_t *plan_of(const sim_t *s, const rx_t *r) { return s->P.plans[r->plan]; }

static void wake_waiters(sim_t *s)
{
    for (uint32_t i = 0; i < s->nrx; i++)
        if (s->rx[i].waiting) {
            s->rx[i].waiting = false;
            push(s, s->now, EV_SELECT, i, 0, ++s->rx[i].sel_gen);
        }
}

static void broadcast(sim_t *s, rx_t *r)
{
    for (uint32_t w = 0; w < r->nw; w++)
        if (r->W[w].sleeping) {
            r->W[w].sleeping = false;
            push(s, s->now, EV_TRY, r->idx, w, ++r->W[w].gen);
        }
}

static refit_status_t add_holder(rx_t *r, uint32_t max, const char *name, int32_t src, uint32_t gpu)
{
    if (r->nh >= max) return refit_error(REFIT_ERR_INVALID_ARG, "too many holders");
    refit_fleet_holder_t *h = &r->H[r->nh];
    memset(h, 0, sizeof(*h));
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->peer = g_peer;
    h->progress_region = -1;
    r->hsrc[r->nh] = src;
    r->hgpu[r->nh] = gpu;
    r->nh++;
    return REFIT_OK;
}

/* Trainer ranks holding bytes the plan needs (planned sources and their DP
 * replicas), as trainer_holders() in receiver.c lists them. */
static refit_status_t trainer_holders(sim_t *s, rx_t *r, uint32_t max)
{
    const refit_plan_t *plan = plan_of(s, r);
    for (uint32_t k = 0; k < s->P.src_world; k++) {
        bool needed = refit_plan_source_bytes(plan, k) > 0;
        for (uint32_t j = 0; j < s->P.src_world && !needed; j++)
            needed = s->P.mkeys[j] == s->P.mkeys[k] && refit_plan_source_bytes(plan, j) > 0;
        if (!needed) continue;
        char name[32];
        snprintf(name, sizeof(name), "trainer:%u", k);
        refit_status_t st = add_holder(r, max, name, (int32_t)k, s->src_gpu[k]);
        if (st) return st;
        refit_fleet_holder_t *h = &r->H[r->nh - 1];
        h->id = k;
        h->mirror_key = s->P.mkeys[k];
    }
    return REFIT_OK;
}

/* Relays of r's rank holding the version (announced), with room: tokens taken. */
static uint32_t find_relays(sim_t *s, rx_t *r, uint32_t max, uint32_t *holding)
{
    *holding = 0;
    uint32_t n = 0;
    if (!s->f->relays) return 0;
    for (uint32_t j = 0; j < s->nrx && n < max; j++) {
        rx_t *q = &s->rx[j];
        if (q == r || q->rank != r->rank || q->slot < 0 || !q->announced) continue;
        (*holding)++;
        if (!refit_fleet_room(q->readers, s->f->max_readers)) continue;
        q->readers++;
        r->held[r->nheld++] = j;
        char name[32];
        snprintf(name, sizeof(name), "relay:%d", q->slot);
        if (add_holder(r, max + s->P.src_world, name, -(int32_t)j - 1, q->gpu)) return n;
        refit_fleet_holder_t *h = &r->H[r->nh - 1];
        h->mirror_dst = true;
        h->progress_region = 0;
        h->id = (uint32_t)q->slot;
        n++;
    }
    return n;
}

static void release_tokens(sim_t *s, rx_t *r)
{
    for (uint32_t i = 0; i < r->nheld; i++) s->rx[r->held[i]].readers--;
    r->nheld = 0;
    if (r->trainer_token) s->tokens[r->plan]--;
    r->trainer_token = false;
}

static double setup_time(const sim_t *s, const rx_t *r, bool before)
{
    const sim_cluster_t *c = s->c;
    if (!before) return c->control / 2; /* the records re-read after the transfer */
    if (!c->first) return c->control;
    double plan = c->plan_s >= 0 ? c->plan_s : s->P.plan_ms[r->plan] * 1e-3;
    return c->discover + plan;
}

static void do_select(sim_t *s, rx_t *r)
{
    uint32_t max = REFIT_MAX_RELAYS_SIM + s->P.src_world;
    r->nh = 0;
    uint32_t holding = 0;
    uint32_t found = find_relays(s, r, REFIT_MAX_RELAYS_SIM, &holding);
    refit_fleet_pick_t pick = refit_fleet_pick(s->f->max_readers, found, holding);
    if (pick == REFIT_FLEET_PICK_TRAINER_IF_ROOM) {
        if (refit_fleet_room(s->tokens[r->plan], s->f->max_readers)) {
            s->tokens[r->plan]++;
            r->trainer_token = s->f->max_readers != 0;
            pick = REFIT_FLEET_PICK_ALL;
        } else {
            pick = REFIT_FLEET_PICK_WAIT;
        }
    }
    if (pick == REFIT_FLEET_PICK_WAIT) {
        r->waiting = true;
        push(s, s->now + 0.02, EV_SELECT, r->idx, 0, ++r->sel_gen);
        return;
    }
    r->with_trainer = pick == REFIT_FLEET_PICK_ALL;
    if (r->with_trainer) {
        refit_status_t st = trainer_holders(s, r, max);
        if (st && !s->st) s->st = st;
    }
    r->state = 3;
    double connect = s->c->first ? s->c->connect * r->nh : 0;
    push(s, s->now + connect, EV_XFER, r->idx, 0, 0);
}

static uint64_t read_bytes(const sim_t *s, const rx_t *r, uint32_t h, const refit_fleet_chunk_t *c, bool rows)
{
    uint64_t b = 0;
    for (size_t i = 0; i < c->n; i++) {
        refit_plan_region_t reg = r->S.pieces[c->first + i];
        refit_fleet_piece_from(&r->H[h], rows, &reg);
        b += refit_plan_region_bytes(&reg);
    }
    (void)s;
    return b;
}

static void end_transfer(sim_t *s, rx_t *r)
{
    if (r->state >= 4) return;
    r->state = 4;
    r->data_done = true;
    r->end = s->now + r->idle + setup_time(s, r, false);
    push(s, r->end, EV_END, r->idx, 0, 0);
    s->dirty = true; /* readers following it are no longer held to its pace */
}

/* ---- chunks ----------------------------------------------------------------------- */

static void worker_try(sim_t *s, rx_t *r, uint32_t w)
{
    worker_t *W = &r->W[w];
    if (W->busy || W->stopped || r->state != 3) return;
    refit_fleet_holder_t *H = &r->H[W->h];
    if (r->S.done == r->S.nc || H->failed) {
        W->stopped = true;
        return;
    }
    bool none = false;
    refit_fleet_chunk_t *c = refit_fleet_claim(&r->S, W->h, s->now, &none);
    if (c) {
        W->busy = true;
        W->c = c;
        W->rows = H->partial;
        W->t0 = s->now;
        W->bytes = read_bytes(s, r, W->h, c, W->rows);
        push(s, s->now + request_delay(s, r->gpu), EV_REQ, r->idx, w, W->gen);
        return;
    }
    if (none) {
        W->stopped = true;
        return;
    }
    if (H->mirror_dst && H->partial && !H->refreshing && s->now - H->progress_read > 1e-3) {
        H->refreshing = true;
        push(s, s->now + s->c->rtt, EV_REFRESH, r->idx, w, W->gen);
        return;
    }
    W->sleeping = true;
    push(s, s->now + 2e-3, EV_TRY, r->idx, w, ++W->gen);
}

static void refresh_done(sim_t *s, rx_t *r, uint32_t w)
{
    worker_t *W = &r->W[w];
    refit_fleet_holder_t *H = &r->H[W->h];
    H->refreshing = false;
    H->progress_read = s->now;
    rx_t *q = &s->rx[-r->hsrc[W->h] - 1];
    if (q->complete) {
        H->partial = false;
    } else {
        bool news = false;
        bool same = q->S.c && q->S.nc == r->S.nc && q->plan == r->plan;
        for (size_t i = 0; same && i < r->S.nc; i++)
            if (q->S.c[i].state == REFIT_CHUNK_DONE && !r->S.avail[W->h][i]) r->S.avail[W->h][i] = 1, news = true;
        if (!news) H->waits++;
    }
    broadcast(s, r);
    worker_try(s, r, w);
}

static void chunk_done(sim_t *s, rx_t *r, uint32_t w)
{
    worker_t *W = &r->W[w];
    W->busy = false;
    double dt = s->now - W->t0;
    refit_fleet_holder_t *H = &r->H[W->h];
    if (H->mirror_dst) r->bytes_relay += W->bytes;
    else r->bytes_trainer += W->bytes;
    refit_fleet_chunk_done(&r->S, W->h, W->c, W->bytes, dt, dt, W->rows);
    broadcast(s, r);
    if (r->S.done == r->S.nc) {
        end_transfer(s, r);
        return;
    }
    worker_try(s, r, w);
}

/* ---- fluid -------------------------------------------------------------------------- */

static double rx_received(const sim_t *s, const rx_t *r)
{
    double b = r->recv_done;
    for (uint32_t h = 0; r->hflow && h < r->nh; h++)
        if (r->hflow[h] != UINT32_MAX) b += sim_net_flow(s->net, r->hflow[h])->sent;
    return b;
}

static double rx_rate(const sim_t *s, const rx_t *r)
{
    double v = 0;
    for (uint32_t h = 0; r->hflow && h < r->nh; h++)
        if (r->hflow[h] != UINT32_MAX) v += sim_net_flow(s->net, r->hflow[h])->rate;
    return v;
}

/* Where a flow reading relay q may be: `workers` chunks and a progress
 * poll (2 ms, as the engine's idle workers wait) behind q; q's pace as
 * payload bytes/s of this flow's share. */
static void follow(const sim_t *s, const rx_t *q, const sim_flow_t *fl, double *allowed, double *pace)
{
    double B = fl->sent + fl->remaining;
    double frac_rate = rx_rate(s, q) / q->total;
    double lag = (double)s->workers * (double)s->chunk / q->total + frac_rate * 2e-3;
    *allowed = (rx_received(s, q) / q->total - lag) * B;
    *pace = B * frac_rate;
}

/* Caps on flows that read a relay still receiving: a reader that has caught
 * up with its relay goes at the relay's pace; one ahead of where it may be
 * (at the start) waits.  Returns whether a cap changed. */
static bool fluid_caps(sim_t *s)
{
    bool changed = false;
    for (uint32_t i = 0; i < s->nrx; i++) {
        rx_t *r = &s->rx[i];
        if (r->state != 3 || !r->hflow) continue;
        for (uint32_t h = 0; h < r->nh; h++) {
            if (r->hflow[h] == UINT32_MAX || r->hsrc[h] >= 0) continue;
            sim_flow_t *fl = sim_net_flow(s->net, r->hflow[h]);
            rx_t *q = &s->rx[-r->hsrc[h] - 1];
            double cap = 0;
            if (!q->data_done && q->total > 0) {
                double allowed, pace, tol = 1e-9 * (fl->sent + fl->remaining) + 1;
                follow(s, q, fl, &allowed, &pace);
                if (fl->sent > allowed + tol) cap = 1; /* waits for its relay */
                else if (fl->sent >= allowed - tol) cap = pace > 1 ? pace : 1;
            }
            if (fabs(cap - fl->cap) > 1e-9 * (cap + fl->cap) + 1e-9) {
                sim_net_set_cap(s->net, r->hflow[h], cap);
                changed = true;
            }
        }
    }
    return changed;
}

/* Seconds until a follower reaches its relay's pace, or a waiting one may
 * go on (INFINITY: none). */
static double fluid_catchup(const sim_t *s)
{
    double t = INFINITY;
    for (uint32_t i = 0; i < s->nrx; i++) {
        const rx_t *r = &s->rx[i];
        if (r->state != 3 || !r->hflow) continue;
        for (uint32_t h = 0; h < r->nh; h++) {
            if (r->hflow[h] == UINT32_MAX || r->hsrc[h] >= 0) continue;
            const sim_flow_t *fl = sim_net_flow(s->net, r->hflow[h]);
            const rx_t *q = &s->rx[-r->hsrc[h] - 1];
            if (q->data_done || q->total <= 0) continue;
            double allowed, pace, x = INFINITY, tol = 1e-9 * (fl->sent + fl->remaining) + 1;
            follow(s, q, fl, &allowed, &pace);
            if (fl->cap == 0 && fl->rate > pace && allowed > fl->sent) x = (allowed - fl->sent) / (fl->rate - pace);
            else if (fl->sent > allowed + tol && pace > 0) x = (fl->sent - allowed) / pace;
            if (x < t) t = x;
        }
    }
    return t;
}

static void fluid_start(sim_t *s, rx_t *r)
{
    const refit_plan_t *plan = plan_of(s, r);
    refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
    refit_plan_stats(plan, &ps);
    /* The engine's shares, over chunks of at least 1/2048 of the plan (the
     * same rule; coarser, so that shares of a large fleet stay cheap). */
    uint64_t chunk = s->chunk, floor_ = ps.bytes_read / 2048;
    if (chunk < floor_) chunk = floor_;
    refit_status_t st = refit_fleet_sched_chunks(&r->S, plan, chunk);
    if (!st && !(r->hflow = malloc(r->nh * sizeof(uint32_t)))) st = refit_error(REFIT_ERR_NO_MEMORY, "fluid");
    if (!st && !(r->hbytes = calloc(r->nh, sizeof(double)))) st = refit_error(REFIT_ERR_NO_MEMORY, "fluid");
    if (st) {
        if (!s->st) s->st = st;
        return;
    }
    refit_fleet_share(&r->S, (uint32_t)(r->idx * 2654435761u));
    for (size_t i = 0; i < r->S.nc; i++) {
        refit_fleet_chunk_t *c = &r->S.c[i];
        if (c->pref == UINT32_MAX) continue;
        /* A relay that has committed is read in spans; one still receiving, row by row. */
        const rx_t *q = r->hsrc[c->pref] < 0 ? &s->rx[-r->hsrc[c->pref] - 1] : NULL;
        r->hbytes[c->pref] += (double)read_bytes(s, r, c->pref, c, !(q && q->complete));
    }
    refit_fleet_sched_free(&r->S);
    r->total = 0;
    /* A worker waits a request's round trip per chunk; with several chunks
     * in flight the others fill the gap.  What they cannot fill adds up. */
    uint32_t busy = 0;
    for (uint32_t h = 0; h < r->nh; h++) busy += r->hbytes[h] > 0;
    uint32_t nl;
    const sim_link_t *lk = sim_net_links(s->net, &nl);
    double chunk_s = (double)s->chunk / fmax(lk[s->l_nicrx[nic_of(s, r->gpu)]].cap * s->c->eff, 1);
    double gap = fmax(0, request_delay(s, r->gpu) - ((double)busy * s->workers - 1) * chunk_s);
    r->idle = gap * ((double)ps.bytes_read / (double)s->chunk) / fmax(1.0, (double)busy * s->workers);
    for (uint32_t h = 0; h < r->nh; h++) {
        r->hflow[h] = UINT32_MAX;
        r->total += r->hbytes[h];
        if (r->hbytes[h] <= 0) continue;
        r->hflow[h] = start_flow(s, r->hgpu[h], r->gpu, r->hbytes[h], user_of(FL_FLUID, r->idx, h));
        r->flows_left++;
        r->used++;
        if (!r->first_holder[0]) snprintf(r->first_holder, sizeof(r->first_holder), "%.31s", r->H[h].name);
    }
    if (!r->flows_left) end_transfer(s, r);
}

static void fluid_done(sim_t *s, rx_t *r, uint32_t h, uint32_t flow)
{
    sim_flow_t *fl = sim_net_flow(s->net, flow);
    r->recv_done += fl->sent;
    if (r->hsrc[h] < 0) r->bytes_relay += (uint64_t)fl->sent;
    else r->bytes_trainer += (uint64_t)fl->sent;
    r->hflow[h] = UINT32_MAX;
    r->flows_left--;
    /* Stealing: a holder done early takes part of a clearly slower holder's
     * rest (over 3x its seconds per byte), as refit_fleet_claim lets it. */
    double mine = r->hbytes[h] / fmax(s->now - r->xfer, 1e-9);
    for (uint32_t v = 0; v < r->nh && r->state == 3; v++) {
        if (v == h || r->hflow[v] == UINT32_MAX) continue;
        sim_flow_t *o = sim_net_flow(s->net, r->hflow[v]);
        bool serve = r->H[h].mirror_dst || (!r->H[v].mirror_dst && r->H[v].mirror_key == r->H[h].mirror_key);
        if (!serve || o->rate * 3 >= mine || o->remaining <= 0) continue;
        double x = o->remaining * mine / (mine + o->rate);
        if (x < (double)s->chunk) continue;
        o->remaining -= x;
        r->hbytes[h] += x;
        r->hbytes[v] -= x;
        r->hflow[h] = start_flow(s, r->hgpu[h], r->gpu, x, user_of(FL_FLUID, r->idx, h));
        r->flows_left++;
        break;
    }
    if (!r->flows_left) end_transfer(s, r);
}

/* ---- transfers -------------------------------------------------------------------- */

static void start_direct(sim_t *s, rx_t *r)
{
    const refit_plan_t *plan = plan_of(s, r);
    r->direct = true;
    for (uint32_t k = 0; k < s->P.src_world; k++) {
        uint64_t b = refit_plan_source_bytes(plan, k);
        if (!b) continue;
        start_flow(s, s->src_gpu[k], r->gpu, (double)b, user_of(FL_DIRECT, r->idx, k));
        r->flows_left++;
        r->used++;
        r->bytes_trainer += b;
        if (!r->first_holder[0]) snprintf(r->first_holder, sizeof(r->first_holder), "trainer:%u", k);
    }
    if (!r->flows_left) end_transfer(s, r);
}

static void start_delta_phase(sim_t *s, rx_t *r)
{
    double **bytes = r->phase == 0 ? s->d_table : s->d_payload;
    for (uint32_t k = 0; k < s->P.src_world; k++) {
        double b = bytes[r->plan][k];
        if (b <= 0) continue;
        start_flow(s, s->src_gpu[k], r->gpu, b, user_of(FL_DELTA, r->idx, k));
        r->flows_left++;
        r->bytes_trainer += (uint64_t)b;
    }
}

static void start_transfer(sim_t *s, rx_t *r)
{
    r->xfer = s->now;
    if (s->f->delta > 0) {
        r->phase = 0;
        r->direct = true;
        r->used = 0;
        for (uint32_t k = 0; k < s->P.src_world; k++) r->used += s->d_payload[r->plan][k] > 0;
        push(s, s->now + s->c->rtt, EV_DELTA, r->idx, 0, 0);
        return;
    }
    if (s->static_plan) {
        start_direct(s, r);
        return;
    }
    const refit_plan_t *plan = plan_of(s, r);
    bool relay = s->f->relays && r->slot >= 0;
    for (uint32_t h = 0; h < r->nh; h++) r->H[h].partial = r->H[h].mirror_dst && r->H[h].progress_region >= 0;
    if (refit_fleet_direct_ok(r->H, r->nh, s->net_transport, relay, plan)) {
        start_direct(s, r);
        return;
    }
    /* Chunked: announced as a relay from here on (readers follow it). */
    r->S.h = r->H;
    r->S.nh = r->nh;
    r->S.plan_keys = r->plan_keys;
    r->S.nplan = refit_plan_num_sources(plan);
    if (relay) {
        r->announced = true;
        wake_waiters(s);
    }
    if (s->fluid) {
        fluid_start(s, r);
        return;
    }
    refit_status_t st = refit_fleet_sched_chunks(&r->S, plan, s->chunk);
    if (!st && !(r->S.avail = calloc(r->nh ? r->nh : 1, sizeof(uint8_t *)))) st = REFIT_ERR_NO_MEMORY;
    for (uint32_t h = 0; !st && h < r->nh; h++)
        if (r->H[h].partial && !(r->S.avail[h] = calloc(r->S.nc ? r->S.nc : 1, 1))) st = REFIT_ERR_NO_MEMORY;
    if (st) {
        if (!s->st) s->st = refit_error(REFIT_ERR_NO_MEMORY, "chunks");
        return;
    }
    refit_fleet_share(&r->S, (uint32_t)(r->idx * 2654435761u));
    r->nw = r->nh * s->workers;
    if (!(r->W = calloc(r->nw ? r->nw : 1, sizeof(worker_t)))) {
        if (!s->st) s->st = refit_error(REFIT_ERR_NO_MEMORY, "workers");
        return;
    }
    for (uint32_t w = 0; w < r->nw; w++) r->W[w].h = w % r->nh;
    for (uint32_t h = 0; h < r->nh; h++) {
        r->used++;
        if (!r->first_holder[0]) snprintf(r->first_holder, sizeof(r->first_holder), "%.31s", r->H[h].name);
    }
    if (!r->S.nc) {
        end_transfer(s, r);
        return;
    }
    for (uint32_t w = 0; w < r->nw; w++) push(s, s->now, EV_TRY, r->idx, w, r->W[w].gen);
}

static void flow_done(sim_t *s, uint32_t flow)
{
    sim_flow_t *fl = sim_net_flow(s->net, flow);
    uint32_t kind = (uint32_t)(fl->user >> 60), ri = (uint32_t)((fl->user >> 32) & 0x0fffffff);
    uint32_t idx = (uint32_t)fl->user;
    rx_t *r = &s->rx[ri];
    switch (kind) {
    case FL_CHUNK: chunk_done(s, r, idx); break;
    case FL_FLUID: fluid_done(s, r, idx, flow); break;
    case FL_DIRECT:
        if (--r->flows_left == 0) end_transfer(s, r);
        break;
    case FL_DELTA:
        if (--r->flows_left == 0) {
            if (r->phase == 0) { /* tables in: fetch the payloads */
                r->phase = 1;
                push(s, s->now + s->c->rtt, EV_DELTA, r->idx, 0, 0);
            } else { /* payloads in: apply through the plan (CPU) */
                r->phase = 2;
                push(s, s->now + s->c->apply_ns * 1e-9 * s->d_units[r->plan], EV_DELTA, r->idx, 0, 0);
            }
        }
        break;
    }
}

static void handle(sim_t *s, const ev_t *e)
{
    rx_t *r = &s->rx[e->rx];
    switch (e->type) {
    case EV_BEGIN:
        r->begin = s->now;
        r->state = 2;
        push(s, s->now + setup_time(s, r, true), EV_SELECT, r->idx, 0, ++r->sel_gen);
        break;
    case EV_SELECT:
        if (e->gen != r->sel_gen || r->state != 2) break;
        r->waiting = false;
        if (s->f->delta > 0 || s->static_plan) {
            r->state = 3;
            push(s, s->now, EV_XFER, r->idx, 0, 0);
            break;
        }
        do_select(s, r);
        break;
    case EV_XFER: start_transfer(s, r); break;
    case EV_TRY:
        if (e->gen != r->W[e->w].gen) break;
        r->W[e->w].sleeping = false;
        worker_try(s, r, e->w);
        break;
    case EV_REQ: {
        worker_t *W = &r->W[e->w];
        if (!W->busy) break;
        start_flow(s, r->hgpu[W->h], r->gpu, (double)W->bytes, user_of(FL_CHUNK, r->idx, e->w));
        break;
    }
    case EV_REFRESH: refresh_done(s, r, e->w); break;
    case EV_END:
        r->state = 5;
        r->complete = true;
        if (s->f->relays && r->slot >= 0 && !r->announced) { /* a direct pull serves at the commit, whole */
            r->announced = true;
        }
        release_tokens(s, r);
        wake_waiters(s);
        break;
    case EV_DELTA:
        if (r->phase < 2) start_delta_phase(s, r);
        else end_transfer(s, r);
        if (r->phase < 2 && !r->flows_left) { /* nothing to fetch in this phase */
            r->phase++;
            push(s, s->now, EV_DELTA, r->idx, 0, 0);
        }
        break;
    }
}

/* ---- setup ------------------------------------------------------------------------- */

static refit_status_t delta_setup(sim_t *s)
{
    uint32_t n = s->P.ndst, P = s->P.src_world;
    s->d_table = calloc(n, sizeof(double *));
    s->d_payload = calloc(n, sizeof(double *));
    s->d_units = calloc(n, sizeof(double));
    if (!s->d_table || !s->d_payload || !s->d_units) return refit_error(REFIT_ERR_NO_MEMORY, "delta");
    double f = s->f->delta;
    /* Sparse chunks: a u16 index and a 2-byte value per changed unit; dense
     * when that is cheaper (delta.h). */
    double per_chunk = fmin(4.0 * REFIT_DELTA_CHUNK_UNITS * f, 2.0 * REFIT_DELTA_CHUNK_UNITS);
    for (uint32_t i = 0; i < n; i++) {
        s->d_table[i] = calloc(P, sizeof(double));
        s->d_payload[i] = calloc(P, sizeof(double));
        if (!s->d_table[i] || !s->d_payload[i]) return refit_error(REFIT_ERR_NO_MEMORY, "delta");
        const refit_plan_t *plan = s->P.plans[i];
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(plan, &ps);
        s->d_units[i] = (double)ps.bytes_written / 2 * f;
        size_t nr;
        const refit_plan_region_t *regs = refit_plan_regions(plan, &nr);
        for (uint32_t k = 0; k < P; k++) {
            if (!refit_plan_source_bytes(plan, k)) continue;
            uint32_t nreg = refit_manifest_num_regions(s->P.srcs[k]);
            for (uint32_t g = 0; g < nreg; g++) {
                bool used = false;
                for (size_t x = 0; x < nr && !used; x++) used = regs[x].src == k && regs[x].src_region == g;
                if (!used) continue;
                uint64_t size = refit_manifest_region_size(s->P.srcs[k], g);
                refit_delta_index_t *ix = NULL;
                refit_status_t st = refit_delta_index_create(plan, k, g, size, &ix);
                if (st) return st;
                uint64_t nch;
                const uint8_t *need = refit_delta_index_need(ix, &nch);
                uint64_t nneed = 0;
                for (uint64_t cidx = 0; cidx < nch; cidx++) nneed += need[cidx] != 0;
                refit_delta_index_destroy(ix);
                s->d_table[i][k] += (double)refit_delta_table_bytes(size);
                s->d_payload[i][k] += (double)nneed * per_chunk;
            }
        }
    }
    return REFIT_OK;
}

static void sim_free(sim_t *s)
{
    for (uint32_t i = 0; s->rx && i < s->nrx; i++) {
        rx_t *r = &s->rx[i];
        refit_fleet_sched_free(&r->S);
        free(r->H);
        free(r->hsrc);
        free(r->hgpu);
        free(r->plan_keys);
        free(r->W);
        free(r->hflow);
        free(r->hbytes);
    }
    for (uint32_t i = 0; s->d_table && i < s->P.ndst; i++) free(s->d_table[i]);
    for (uint32_t i = 0; s->d_payload && i < s->P.ndst; i++) free(s->d_payload[i]);
    free(s->d_table);
    free(s->d_payload);
    free(s->d_units);
    free(s->rx);
    free(s->src_gpu);
    free(s->tokens);
    free(s->l_nvtx);
    free(s->l_nvrx);
    free(s->l_pctx);
    free(s->l_pcrx);
    free(s->l_nictx);
    free(s->l_nicrx);
    free(s->l_up);
    free(s->l_down);
    REFIT_VEC_FREE(&s->heap);
    REFIT_VEC_FREE(&s->samples);
    free(s->last_util);
    sim_net_destroy(s->net);
    sim_plans_free(&s->P);
}

static refit_status_t setup(sim_t *s)
{
    const sim_fleet_t *f = s->f;
    const sim_cluster_t *c = s->c;
    refit_status_t st = sim_plans_build(f->model, f->src, f->dst, f->only_rank, f->threads, &s->P);
    if (st) return st;
    if (!f->replicas) return refit_error(REFIT_ERR_INVALID_ARG, "no replicas");
    s->nrx = f->replicas * s->P.ndst;
    s->chunk = f->chunk_kb ? (uint64_t)f->chunk_kb << 10 : 2u << 20;
    s->workers = f->workers ? f->workers : 2;
    s->static_plan = f->transport && !strcmp(f->transport, "cuda_ipc");
    s->net_transport = !(f->transport && !strcmp(f->transport, "shm"));
    if (f->relays && f->replicas > REFIT_MAX_RELAYS_SIM)
        return refit_error(REFIT_ERR_INVALID_ARG, "%u replicas: a rank has at most %d relay slots", f->replicas,
                           REFIT_MAX_RELAYS_SIM);
    s->rx = calloc(s->nrx, sizeof(rx_t));
    s->src_gpu = calloc(s->P.src_world, sizeof(uint32_t));
    s->tokens = calloc(s->P.ndst, sizeof(uint32_t));
    if (!s->rx || !s->src_gpu || !s->tokens) return refit_error(REFIT_ERR_NO_MEMORY, "fleet");
    uint32_t maxsrc = 0;
    for (uint32_t k = 0; k < s->P.src_world; k++) {
        s->src_gpu[k] = k < c->nsrc_gpu && c->src_gpu[k] >= 0 ? (uint32_t)c->src_gpu[k] : k;
        if (s->src_gpu[k] + 1 > maxsrc) maxsrc = s->src_gpu[k] + 1;
    }
    uint32_t base = c->dst_at >= 0 ? (uint32_t)c->dst_at : (maxsrc + c->gpus - 1) / c->gpus * c->gpus;
    uint32_t hmax = REFIT_MAX_RELAYS_SIM + s->P.src_world;
    for (uint32_t i = 0; i < s->nrx; i++) {
        rx_t *r = &s->rx[i];
        r->idx = i;
        r->replica = i / s->P.ndst;
        r->plan = i % s->P.ndst;
        r->rank = s->P.dst_rank[r->plan];
        r->slot = f->relays ? (int)r->replica : -1;
        r->gpu = i < c->ndst_gpu && c->dst_gpu[i] >= 0 ? (uint32_t)c->dst_gpu[i] : base + i;
        r->H = calloc(hmax, sizeof(refit_fleet_holder_t));
        r->hsrc = calloc(hmax, sizeof(int32_t));
        r->hgpu = calloc(hmax, sizeof(uint32_t));
        r->plan_keys = calloc(s->P.src_world, sizeof(uint64_t));
        if (!r->H || !r->hsrc || !r->hgpu || !r->plan_keys) return refit_error(REFIT_ERR_NO_MEMORY, "fleet");
        memcpy(r->plan_keys, s->P.mkeys, s->P.src_world * sizeof(uint64_t));
    }
    if ((st = sim_net_create(&s->net)) || (st = build_links(s))) return st;
    if (f->delta > 0 && (st = delta_setup(s))) return st;
    uint64_t chunks = 0;
    for (uint32_t i = 0; i < s->P.ndst; i++) {
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(s->P.plans[i], &ps);
        chunks += (ps.bytes_read / s->chunk + 1) * f->replicas;
    }
    s->fluid = f->mode == SIM_MODE_FLUID || (f->mode == SIM_MODE_AUTO && chunks > 200000);
    return REFIT_OK;
}

static void sample(sim_t *s)
{
    if (!s->f->timeline || s->samples.len > 4000000) return;
    uint32_t n;
    sim_link_t *lk = sim_net_links(s->net, &n);
    if (!s->last_util && !(s->last_util = calloc(n ? n : 1, sizeof(double)))) return;
    for (uint32_t l = 0; l < n; l++) {
        double util = lk[l].cap > 0 ? sim_net_link_load(s->net, l) / lk[l].cap : 0;
        if (fabs(s->last_util[l] - util) < 1e-3) continue; /* keep changes only: the plot draws steps */
        s->last_util[l] = util;
        sim_sample_t x = {l, s->now, util};
        if (REFIT_VEC_PUSH(&s->samples, x)) return;
    }
}

refit_status_t sim_fleet_run(const sim_fleet_t *f, const sim_cluster_t *c, sim_result_t *out)
{
    memset(out, 0, sizeof(*out));
    out->bottleneck = UINT32_MAX;
    double w0 = refit_now();
    sim_t s;
    memset(&s, 0, sizeof(s));
    s.f = f;
    s.c = c;
    refit_status_t st = setup(&s);
    if (st) {
        snprintf(out->error, sizeof(out->error), "%s", refit_last_error());
        sim_free(&s);
        return st;
    }
    for (uint32_t i = 0; i < s.nrx; i++) {
        double t = f->start_at ? f->start_at[i] : s.nrx > 1 ? f->start_spread * i / (s.nrx - 1) : 0;
        push(&s, t, EV_BEGIN, i, 0, 0);
    }
    uint32_t *done = malloc(65536 * sizeof(uint32_t));
    if (!done) st = refit_error(REFIT_ERR_NO_MEMORY, "events");
    double tol = s.fluid ? 1e-4 : 1e-9;
    while (!st && !s.st) {
        if (s.dirty) {
            if (s.fluid)
                for (int it = 0; it < 64; it++) {
                    bool ch = fluid_caps(&s);
                    sim_net_solve(s.net);
                    if (!ch && it > 0) break;
                }
            else
                sim_net_solve(s.net);
            s.dirty = false;
            sample(&s);
        }
        double tf = s.now + sim_net_next(s.net);
        double tc = s.fluid ? s.now + fluid_catchup(&s) : INFINITY;
        double te = s.heap.len ? s.heap.data[0].t : INFINITY;
        double t = fmin(tf, fmin(tc, te));
        if (!isfinite(t)) break;
        uint32_t nd = 0;
        /* Time moves to the next event; flows finishing within tol of it end together. */
        double dt = t - s.now;
        if (dt < 0) dt = 0;
        sim_net_advance(s.net, dt, t == tf ? fmax(tol * t, 1e-12) : 0, done, 65536, &nd);
        s.now = t;
        s.events++;
        if (nd) {
            s.dirty = true;
            for (uint32_t i = 0; i < nd; i++) flow_done(&s, done[i]);
            continue;
        }
        if (t == tc && tc < te) {
            s.dirty = true;
            continue;
        }
        if (s.heap.len && s.heap.data[0].t <= t) {
            ev_t e = pop(&s);
            handle(&s, &e);
        }
        if (s.events > 400000000ULL) st = refit_error(REFIT_ERR_TIMEOUT, "simulation did not converge");
    }
    free(done);
    if (!st && s.st) st = s.st;
    for (uint32_t i = 0; !st && i < s.nrx; i++)
        if (s.rx[i].state < 4)
            st = refit_error(REFIT_ERR_INTERNAL, "receiver %u (rank %u) never finished (state %d)", i, s.rx[i].rank,
                             s.rx[i].state);
    /* Results. */
    out->src_world = s.P.src_world;
    out->dst_world = s.P.dst_world;
    out->receivers = s.nrx;
    out->model_bytes = s.P.model_bytes;
    out->manifests_ms = s.P.manifests_ms;
    out->plan_wall_ms = s.P.plan_wall_ms;
    out->plan_threads = s.P.threads;
    out->mode = s.fluid ? SIM_MODE_FLUID : SIM_MODE_CHUNKS;
    for (uint32_t i = 0; i < s.P.ndst; i++) {
        refit_plan_stats_t ps = REFIT_PLAN_STATS_INIT;
        refit_plan_stats(s.P.plans[i], &ps);
        if (ps.bytes_written > out->rank_bytes_max) out->rank_bytes_max = ps.bytes_written;
        if (s.P.plan_ms[i] > out->plan_ms_max) out->plan_ms_max = s.P.plan_ms[i];
        out->plan_ms_sum += s.P.plan_ms[i];
    }
    if (!st) {
        out->rx = calloc(s.nrx, sizeof(sim_rx_result_t));
        double b0 = INFINITY, x0 = INFINITY, e1 = 0, sum = 0;
        for (uint32_t i = 0; i < s.nrx; i++) {
            rx_t *r = &s.rx[i];
            b0 = fmin(b0, r->begin);
            x0 = fmin(x0, r->xfer);
            e1 = fmax(e1, r->end);
            sum += r->end - r->begin;
            out->wire_bytes += r->bytes_trainer + r->bytes_relay;
            out->trainer_egress += r->bytes_trainer;
            out->relay_egress += r->bytes_relay;
            if (out->rx) {
                sim_rx_result_t *o = &out->rx[i];
                o->rank = r->rank;
                o->replica = r->replica;
                o->gpu = r->gpu;
                o->begin = r->begin;
                o->xfer = r->xfer;
                o->end = r->end;
                o->bytes_trainer = r->bytes_trainer;
                o->bytes_relay = r->bytes_relay;
                o->holders = r->used;
                o->direct = r->direct;
                snprintf(o->first_holder, sizeof(o->first_holder), "%s", r->first_holder);
            }
        }
        out->refit_s = e1 - b0;
        out->transfer_s = e1 - x0;
        out->mean_rx_s = sum / s.nrx;
        uint32_t n;
        sim_link_t *lk = sim_net_links(s.net, &n);
        out->links = malloc((n ? n : 1) * sizeof(sim_link_t));
        if (out->links) {
            memcpy(out->links, lk, n * sizeof(sim_link_t));
            out->nlinks = n;
        }
        double best = -1;
        for (uint32_t l = 0; l < n; l++) {
            double score = lk[l].full_s * 1e6 + (lk[l].cap > 0 ? lk[l].wire / lk[l].cap : 0);
            if (lk[l].kind != SIM_LINK_CAP && lk[l].wire > 0 && score > best) best = score, out->bottleneck = l;
        }
        out->samples = s.samples.data;
        out->nsamples = s.samples.len;
        s.samples.data = NULL;
        s.samples.len = s.samples.cap = 0;
    }
    out->events = s.events;
    out->flows = s.flows;
    out->sim_wall_ms = (refit_now() - w0) * 1e3;
    if (st) snprintf(out->error, sizeof(out->error), "%s", refit_last_error());
    sim_free(&s);
    return st;
}

void sim_result_free(sim_result_t *r)
{
    free(r->links);
    free(r->rx);
    free(r->samples);
    memset(r, 0, sizeof(*r));
}
