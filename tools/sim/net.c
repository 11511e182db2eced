/* A flow-level network: links with capacities, flows along paths, max-min
 * fair rates.
 *
 * Rates are computed by progressive filling: every flow not yet frozen rises
 * at the same pace; a link is full when the wire bytes of its flows (each
 * flow's rate times its weight on that link: protocol overhead on data,
 * acknowledgements on the reverse direction) reach its capacity, and the
 * flows crossing it freeze; a flow also freezes at its own cap.  The result
 * is the max-min fair allocation, which is what many long TCP or RDMA flows
 * sharing bottlenecks converge to (not the transients).  Rates change only
 * when a flow starts, ends or changes its cap; between those events bytes
 * flow at constant rates, so time jumps from event to event. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "util/util.h"

struct sim_net {
    REFIT_VEC(sim_link_t) links;
    REFIT_VEC(sim_flow_t) flows;
    REFIT_VEC(uint32_t) active; /* indices of active flows */
    double *load;               /* per link: wire bytes/s now */
    double *prate;              /* per link: payload bytes/s now (data direction) */
    size_t nload;
};

refit_status_t sim_net_create(sim_net_t **out)
{
    sim_net_t *n = calloc(1, sizeof(*n));
    if (!n) return refit_error(REFIT_ERR_NO_MEMORY, "network");
    *out = n;
    return REFIT_OK;
}

void sim_net_destroy(sim_net_t *net)
{
    if (!net) return;
    REFIT_VEC_FREE(&net->links);
    REFIT_VEC_FREE(&net->flows);
    REFIT_VEC_FREE(&net->active);
    free(net->load);
    free(net->prate);
    free(net);
}

uint32_t sim_net_link(sim_net_t *net, const char *name, sim_link_kind_t kind, double cap)
{
    sim_link_t l;
    memset(&l, 0, sizeof(l));
    snprintf(l.name, sizeof(l.name), "%s", name);
    l.kind = kind;
    l.cap = cap;
    if (REFIT_VEC_PUSH(&net->links, l)) return UINT32_MAX;
    return (uint32_t)(net->links.len - 1);
}

sim_link_t *sim_net_links(sim_net_t *net, uint32_t *n)
{
    *n = (uint32_t)net->links.len;
    return net->links.data;
}

uint32_t sim_net_start(sim_net_t *net, const sim_path_t *path, double bytes, double cap, uint64_t user, double now)
{
    sim_flow_t f;
    memset(&f, 0, sizeof(f));
    f.path = *path;
    f.remaining = bytes > 0 ? bytes : 0;
    f.cap = cap;
    f.user = user;
    f.start = now;
    f.active = true;
    if (REFIT_VEC_PUSH(&net->flows, f)) return UINT32_MAX;
    uint32_t id = (uint32_t)(net->flows.len - 1);
    if (REFIT_VEC_PUSH(&net->active, id)) {
        net->flows.len--;
        return UINT32_MAX;
    }
    for (uint32_t k = 0; k < path->n; k++)
        if (path->data[k]) net->links.data[path->link[k]].nflows++;
    return id;
}

sim_flow_t *sim_net_flow(sim_net_t *net, uint32_t f) { return &net->flows.data[f]; }

void sim_net_set_cap(sim_net_t *net, uint32_t f, double cap) { net->flows.data[f].cap = cap; }

uint32_t sim_net_active(const sim_net_t *net) { return (uint32_t)net->active.len; }

void sim_net_solve(sim_net_t *net)
{
    size_t L = net->links.len;
    if (net->nload < L) {
        free(net->load);
        free(net->prate);
        net->load = calloc(L ? L : 1, sizeof(double));
        net->prate = calloc(L ? L : 1, sizeof(double));
        net->nload = net->load && net->prate ? L : 0;
        if (!net->nload) return;
    }
    sim_link_t *lk = net->links.data;
    for (size_t l = 0; l < L; l++) lk[l].resid = lk[l].cap, lk[l].wsum = 0;
    size_t nunf = 0;
    for (size_t i = 0; i < net->active.len; i++) {
        sim_flow_t *f = &net->flows.data[net->active.data[i]];
        f->rate = 0;
        f->frozen = f->remaining <= 0;
        if (f->frozen) continue;
        nunf++;
        for (uint32_t k = 0; k < f->path.n; k++) lk[f->path.link[k]].wsum += f->path.w[k];
    }
    while (nunf > 0) {
        double lambda = INFINITY;
        for (size_t l = 0; l < L; l++)
            if (lk[l].wsum > 1e-12) {
                double x = lk[l].resid > 0 ? lk[l].resid / lk[l].wsum : 0;
                if (x < lambda) lambda = x;
            }
        for (size_t i = 0; i < net->active.len; i++) {
            sim_flow_t *f = &net->flows.data[net->active.data[i]];
            if (!f->frozen && f->cap > 0 && f->cap - f->rate < lambda) lambda = f->cap - f->rate;
        }
        if (!isfinite(lambda)) { /* flows that cross no limited link: unbounded; give them a huge rate */
            for (size_t i = 0; i < net->active.len; i++) {
                sim_flow_t *f = &net->flows.data[net->active.data[i]];
                if (!f->frozen) f->rate = 1e18, f->frozen = true;
            }
            break;
        }
        if (lambda < 0) lambda = 0;
        for (size_t l = 0; l < L; l++) lk[l].resid -= lambda * lk[l].wsum;
        size_t before = nunf;
        for (size_t i = 0; i < net->active.len; i++) {
            sim_flow_t *f = &net->flows.data[net->active.data[i]];
            if (f->frozen) continue;
            f->rate += lambda;
            bool freeze = f->cap > 0 && f->rate >= f->cap * (1 - 1e-12);
            for (uint32_t k = 0; k < f->path.n && !freeze; k++) {
                const sim_link_t *x = &lk[f->path.link[k]];
                if (f->path.w[k] > 0 && x->resid <= x->cap * 1e-12) freeze = true;
            }
            if (freeze) {
                f->frozen = true;
                nunf--;
            }
        }
        /* Remove frozen flows' weights (recomputed: exact, no drift). */
        for (size_t l = 0; l < L; l++) lk[l].wsum = 0;
        for (size_t i = 0; i < net->active.len; i++) {
            sim_flow_t *f = &net->flows.data[net->active.data[i]];
            if (f->frozen) continue;
            for (uint32_t k = 0; k < f->path.n; k++) lk[f->path.link[k]].wsum += f->path.w[k];
        }
        if (nunf == before && lambda <= 0) { /* no progress: freeze everything left (should not happen) */
            for (size_t i = 0; i < net->active.len; i++) net->flows.data[net->active.data[i]].frozen = true;
            break;
        }
    }
    memset(net->load, 0, L * sizeof(double));
    memset(net->prate, 0, L * sizeof(double));
    for (size_t i = 0; i < net->active.len; i++) {
        const sim_flow_t *f = &net->flows.data[net->active.data[i]];
        for (uint32_t k = 0; k < f->path.n; k++) {
            net->load[f->path.link[k]] += f->rate * f->path.w[k];
            if (f->path.data[k]) net->prate[f->path.link[k]] += f->rate;
        }
    }
}

double sim_net_link_rate(const sim_net_t *net, uint32_t l) { return l < net->nload ? net->prate[l] : 0; }

double sim_net_link_load(const sim_net_t *net, uint32_t l) { return l < net->nload ? net->load[l] : 0; }

double sim_net_next(const sim_net_t *net)
{
    double t = INFINITY;
    for (size_t i = 0; i < net->active.len; i++) {
        const sim_flow_t *f = &net->flows.data[net->active.data[i]];
        if (f->remaining <= 0) return 0;
        if (f->rate > 0 && f->remaining / f->rate < t) t = f->remaining / f->rate;
    }
    return t;
}

void sim_net_advance(sim_net_t *net, double dt, double tol, uint32_t *done, uint32_t max, uint32_t *ndone)
{
    *ndone = 0;
    if (dt > 0 && net->nload >= net->links.len) {
        for (size_t l = 0; l < net->links.len; l++) {
            sim_link_t *x = &net->links.data[l];
            x->wire += net->load[l] * dt;
            x->payload += net->prate[l] * dt;
            if (x->cap > 0 && net->load[l] >= 0.99 * x->cap) x->full_s += dt;
        }
    }
    for (size_t i = 0; i < net->active.len;) {
        uint32_t id = net->active.data[i];
        sim_flow_t *f = &net->flows.data[id];
        double moved = f->rate * dt;
        if (moved > f->remaining) moved = f->remaining;
        f->remaining -= moved;
        f->sent += moved;
        bool fin = f->remaining <= 1e-6 || (f->rate > 0 && f->remaining <= f->rate * tol);
        if (fin && *ndone < max) {
            f->sent += f->remaining;
            f->remaining = 0;
            f->active = false;
            for (uint32_t k = 0; k < f->path.n; k++)
                if (f->path.data[k]) net->links.data[f->path.link[k]].nflows--;
            done[(*ndone)++] = id;
            net->active.data[i] = net->active.data[--net->active.len];
            continue;
        }
        i++;
    }
}
