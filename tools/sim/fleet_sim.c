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
 * with threads and transports, the simulator does with events (fleet_sim_rx.c).
 * This file: the event queue, the cluster's links and paths, setup and the
 * run loop; fleet_sim_rx.c: what a receiver does at each event. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_sim.h"

/* ---- events ----------------------------------------------------------------- */

static bool ev_less(const ev_t *a, const ev_t *b) { return a->t < b->t || (a->t == b->t && a->seq < b->seq); }

void fsim_push(sim_t *s, double t, uint32_t type, uint32_t rx, uint32_t w, uint64_t gen)
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

uint64_t fsim_user_of(uint32_t kind, uint32_t rx, uint32_t idx)
{
    return ((uint64_t)kind << 60) | ((uint64_t)rx << 32) | idx;
}

/* ---- the cluster's links and paths -------------------------------------------- */

static uint32_t node_of(const sim_t *s, uint32_t gpu) { return gpu / s->c->gpus; }
uint32_t fsim_nic_of(const sim_t *s, uint32_t gpu)
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
    /* Placements (dst_at + receivers, src_gpus, dst_gpus) and nodes x gpus
     * within the bound (sim.h): each GPU costs links. */
    uint64_t need = (uint64_t)c->nodes * c->gpus > maxg ? (uint64_t)c->nodes * c->gpus : maxg;
    if (need > SIM_MAX_GPUS)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "the cluster needs %llu GPUs (nodes %u x gpus %u; GPUs placed up to index %u), more than "
                           "the simulator's bound of %u",
                           (unsigned long long)need, c->nodes, c->gpus, maxg ? maxg - 1 : 0, SIM_MAX_GPUS);
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
        if (s->f->src_rate[k] > 0) rate[fsim_nic_of(s, s->src_gpu[k])] = s->f->src_rate[k];
    for (uint32_t i = 0; s->f->rx_rate && i < s->nrx; i++)
        if (s->f->rx_rate[i] > 0) rate[fsim_nic_of(s, s->rx[i].gpu)] = s->f->rx_rate[i];
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
    uint32_t na = fsim_nic_of(s, a), nb = fsim_nic_of(s, b);
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
double fsim_request_delay(const sim_t *s, uint32_t g)
{
    const sim_cluster_t *c = s->c;
    double d = c->rtt;
    if (c->req_queue > 0) {
        uint32_t l = s->l_nictx[fsim_nic_of(s, g)];
        uint32_t n;
        sim_link_t *lk = sim_net_links(s->net, &n);
        if (lk[l].nflows > 0) d += c->req_queue / lk[l].cap;
    }
    return d;
}

uint32_t fsim_start_flow(sim_t *s, uint32_t from, uint32_t to, double bytes, uint64_t user)
{
    sim_path_t p;
    path_of(s, from, to, &p);
    uint32_t f = sim_net_start(s->net, &p, bytes, 0, user, s->now);
    if (f == UINT32_MAX && !s->st) s->st = refit_error(REFIT_ERR_NO_MEMORY, "flows");
    s->flows++;
    s->dirty = true;
    return f;
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
    if ((uint64_t)f->replicas * s->P.ndst > SIM_MAX_GPUS)
        return refit_error(REFIT_ERR_INVALID_ARG,
                           "%u replicas of %u destination ranks: %llu receivers, more than the simulator's bound of %u "
                           "GPUs",
                           f->replicas, s->P.ndst, (unsigned long long)f->replicas * s->P.ndst, SIM_MAX_GPUS);
    s->nrx = f->replicas * s->P.ndst;
    s->chunk = f->chunk_kb ? (uint64_t)f->chunk_kb << 10 : 2u << 20;
    s->static_plan = f->transport && !strcmp(f->transport, "cuda_ipc");
    s->net_transport = !(f->transport && !strcmp(f->transport, "shm"));
    /* As the engine: chunks in flight per network holder, the copy threads' 2 over shm (fleet.c). */
    s->workers = f->workers ? f->workers : s->net_transport ? REFIT_FLEET_NET_WORKERS : 2;
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
        fsim_push(&s, t, EV_BEGIN, i, 0, 0);
    }
    uint32_t *done = malloc(65536 * sizeof(uint32_t));
    if (!done) st = refit_error(REFIT_ERR_NO_MEMORY, "events");
    double tol = s.fluid ? 1e-4 : 1e-9;
    while (!st && !s.st) {
        if (s.dirty) {
            if (s.fluid)
                for (int it = 0; it < 64; it++) {
                    bool ch = fsim_fluid_caps(&s);
                    sim_net_solve(s.net);
                    if (!ch && it > 0) break;
                }
            else sim_net_solve(s.net);
            s.dirty = false;
            sample(&s);
        }
        double tf = s.now + sim_net_next(s.net);
        double tc = s.fluid ? s.now + fsim_fluid_catchup(&s) : INFINITY;
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
            for (uint32_t i = 0; i < nd; i++) fsim_flow_done(&s, done[i]);
            continue;
        }
        if (t == tc && tc < te) {
            s.dirty = true;
            continue;
        }
        if (s.heap.len && s.heap.data[0].t <= t) {
            ev_t e = pop(&s);
            fsim_handle(&s, &e);
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
