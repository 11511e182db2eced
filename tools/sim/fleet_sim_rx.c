/* The simulated receivers (fleet_sim.c runs them): every event a receiver
 * handles, through the engine's rules (fleet.h):
 *
 *   begin -> (control plane, or discover + plan + connect on a first pull)
 *   select: pick holders (or wait for room: woken by any relay announcing or
 *           any reader leaving, else after 20 ms, as fleet_select waits)
 *   transfer: chunks: each holder's workers claim chunks; a claim costs a
 *             request round trip (plus the queue of a busy egress link) and
 *             the chunk is a flow; a worker with nothing to claim asks a
 *             relay still receiving for its next chunk ahead (a conditional
 *             request over a network transport, once a progress read showed
 *             the relay's chunks are ours): the request waits at the relay
 *             and the bytes leave when the relay has the chunk (half a round
 *             trip later here); otherwise it sleeps 2 ms or until a chunk of
 *             its receiver is done, and reads a relay's progress (a round
 *             trip) at most every millisecond;
 *             fluid: one flow per holder with the share the rules give it,
 *             a reader of a relay still receiving held to that relay's pace
 *             once it is within one chunk and half a round trip of it (over
 *             shm, without conditional requests: `workers` chunks and a
 *             2 ms poll); a holder done early takes over part of a clearly
 *             slower holder's rest;
 *             direct: one flow per planned source;
 *             delta: chunk tables, then the payloads of the chunks the plan
 *             reads, then the apply (CPU);
 *   end (data in place, after the records are re-read) -> commit: the relay
 *   serves the whole version, the reader's load tokens are released. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_sim.h"

static refit_peer_t *const g_peer = (refit_peer_t *)&g_peer; /* any non-NULL peer: the rules only test it */

/* ---- receivers ------------------------------------------------------------------- */

static const refit_plan_t *plan_of(const sim_t *s, const rx_t *r) { return s->P.plans[r->plan]; }

static void wake_waiters(sim_t *s)
{
    for (uint32_t i = 0; i < s->nrx; i++)
        if (s->rx[i].waiting) {
            s->rx[i].waiting = false;
            fsim_push(s, s->now, EV_SELECT, i, 0, ++s->rx[i].sel_gen);
        }
}

static void broadcast(sim_t *s, rx_t *r)
{
    for (uint32_t w = 0; w < r->nw; w++)
        if (r->W[w].sleeping) {
            r->W[w].sleeping = false;
            fsim_push(s, s->now, EV_TRY, r->idx, w, ++r->W[w].gen);
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
    refit_fleet_pick_t pick = refit_fleet_pick(s->f->max_readers, found, holding, false);
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
        fsim_push(s, s->now + 0.02, EV_SELECT, r->idx, 0, ++r->sel_gen);
        return;
    }
    r->with_trainer = pick == REFIT_FLEET_PICK_ALL;
    if (r->with_trainer) {
        refit_status_t st = trainer_holders(s, r, max);
        if (st && !s->st) s->st = st;
    }
    r->state = 3;
    double connect = s->c->first ? s->c->connect * r->nh : 0;
    fsim_push(s, s->now + connect, EV_XFER, r->idx, 0, 0);
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

/* Whether the relay r's worker W asked ahead has W's chunk now. */
static bool relay_has(const sim_t *s, const rx_t *r, const worker_t *W)
{
    const rx_t *q = &s->rx[-r->hsrc[W->h] - 1];
    size_t i = (size_t)(W->c - r->S.c);
    return q->data_done || q->complete || (q->S.c && i < q->S.nc && q->S.c[i].state == REFIT_CHUNK_DONE);
}

/* Relay q marked a chunk (or has them all): requests waiting at it for what
 * it now has are answered; the bytes arrive half a round trip later. */
static void answer_parked(sim_t *s, const rx_t *q)
{
    if (!s->parked) return;
    for (uint32_t i = 0; i < s->nrx; i++) {
        rx_t *r = &s->rx[i];
        if (r->state != 3 || !r->W) continue;
        for (uint32_t w = 0; w < r->nw; w++) {
            worker_t *W = &r->W[w];
            if (!W->busy || !W->parked || r->hsrc[W->h] != -(int32_t)q->idx - 1 || !relay_has(s, r, W)) continue;
            W->parked = false;
            W->ahead = false;
            s->parked--;
            fsim_push(s, s->now + s->c->rtt / 2, EV_REQ, r->idx, w, W->gen);
        }
    }
}

static void end_transfer(sim_t *s, rx_t *r)
{
    if (r->state >= 4) return;
    r->state = 4;
    r->data_done = true;
    answer_parked(s, r);
    r->end = s->now + r->idle + setup_time(s, r, false);
    fsim_push(s, r->end, EV_END, r->idx, 0, 0);
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
    refit_fleet_chunk_t *c = refit_fleet_claim(&r->S, W->h, s->now, &none), *ahead = NULL;
    if (!c && !none) c = ahead = refit_fleet_claim_ahead(&r->S, W->h, s->now);
    if (c) {
        W->busy = true;
        W->c = c;
        W->ahead = ahead != NULL;
        W->parked = false;
        W->rows = H->partial;
        W->t0 = s->now;
        W->bytes = read_bytes(s, r, W->h, c, W->rows);
        fsim_push(s, s->now + fsim_request_delay(s, r->gpu), EV_REQ, r->idx, w, W->gen);
        return;
    }
    if (none) {
        W->stopped = true;
        return;
    }
    if (H->mirror_dst && H->partial && !H->refreshing && s->now - H->progress_read > 1e-3) {
        H->refreshing = true;
        fsim_push(s, s->now + s->c->rtt, EV_REFRESH, r->idx, w, W->gen);
        return;
    }
    W->sleeping = true;
    fsim_push(s, s->now + 2e-3, EV_TRY, r->idx, w, ++W->gen);
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
        H->waitable = same && s->net_transport; /* conditional requests: UCX's REFIT_TEXT_WAIT extension */
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
    answer_parked(s, r);
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

/* Where a flow reading relay q may be: over a network transport one chunk
 * and half a round trip behind q (its requests wait at q and leave as q
 * marks each chunk); over shm `workers` chunks and a progress poll (2 ms, as
 * the engine's idle workers wait); q's pace as payload bytes/s of this
 * flow's share. */
static void follow(const sim_t *s, const rx_t *q, const sim_flow_t *fl, double *allowed, double *pace)
{
    double B = fl->sent + fl->remaining;
    double frac_rate = rx_rate(s, q) / q->total;
    double lag = s->net_transport ? (double)s->chunk / q->total + frac_rate * s->c->rtt / 2
                                  : (double)s->workers * (double)s->chunk / q->total + frac_rate * 2e-3;
    *allowed = (rx_received(s, q) / q->total - lag) * B;
    *pace = B * frac_rate;
}

/* Caps on flows that read a relay still receiving: a reader that has caught
 * up with its relay goes at the relay's pace; one ahead of where it may be
 * (at the start) waits.  Returns whether a cap changed. */
bool fsim_fluid_caps(sim_t *s)
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
double fsim_fluid_catchup(const sim_t *s)
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
    double chunk_s = (double)s->chunk / fmax(lk[s->l_nicrx[fsim_nic_of(s, r->gpu)]].cap * s->c->eff, 1);
    double gap = fmax(0, fsim_request_delay(s, r->gpu) - ((double)busy * s->workers - 1) * chunk_s);
    r->idle = gap * ((double)ps.bytes_read / (double)s->chunk) / fmax(1.0, (double)busy * s->workers);
    for (uint32_t h = 0; h < r->nh; h++) {
        r->hflow[h] = UINT32_MAX;
        r->total += r->hbytes[h];
        if (r->hbytes[h] <= 0) continue;
        r->hflow[h] = fsim_start_flow(s, r->hgpu[h], r->gpu, r->hbytes[h], fsim_user_of(FL_FLUID, r->idx, h));
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
        r->hflow[h] = fsim_start_flow(s, r->hgpu[h], r->gpu, x, fsim_user_of(FL_FLUID, r->idx, h));
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
        fsim_start_flow(s, s->src_gpu[k], r->gpu, (double)b, fsim_user_of(FL_DIRECT, r->idx, k));
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
        fsim_start_flow(s, s->src_gpu[k], r->gpu, b, fsim_user_of(FL_DELTA, r->idx, k));
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
        fsim_push(s, s->now + s->c->rtt, EV_DELTA, r->idx, 0, 0);
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
    for (uint32_t w = 0; w < r->nw; w++) fsim_push(s, s->now, EV_TRY, r->idx, w, r->W[w].gen);
}

void fsim_flow_done(sim_t *s, uint32_t flow)
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
                fsim_push(s, s->now + s->c->rtt, EV_DELTA, r->idx, 0, 0);
            } else { /* payloads in: apply through the plan (CPU) */
                r->phase = 2;
                fsim_push(s, s->now + s->c->apply_ns * 1e-9 * s->d_units[r->plan], EV_DELTA, r->idx, 0, 0);
            }
        }
        break;
    }
}

void fsim_handle(sim_t *s, const ev_t *e)
{
    rx_t *r = &s->rx[e->rx];
    switch (e->type) {
    case EV_BEGIN:
        r->begin = s->now;
        r->state = 2;
        fsim_push(s, s->now + setup_time(s, r, true), EV_SELECT, r->idx, 0, ++r->sel_gen);
        break;
    case EV_SELECT:
        if (e->gen != r->sel_gen || r->state != 2) break;
        r->waiting = false;
        if (s->f->delta > 0 || s->static_plan) {
            r->state = 3;
            fsim_push(s, s->now, EV_XFER, r->idx, 0, 0);
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
        if (W->ahead && !relay_has(s, r, W)) { /* waits at the relay (answer_parked) */
            W->parked = true;
            s->parked++;
            break;
        }
        fsim_start_flow(s, r->hgpu[W->h], r->gpu, (double)W->bytes, fsim_user_of(FL_CHUNK, r->idx, e->w));
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
            fsim_push(s, s->now, EV_DELTA, r->idx, 0, 0);
        }
        break;
    }
}
