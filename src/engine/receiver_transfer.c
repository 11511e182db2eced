/* Receivers, the full transfer: the receiver's path (r->route, decided at
 * create: receiver_path.c) connects and moves the bytes, the steps around it
 * are the same for every path: the memory marked unusable, the padding, the
 * copy up from the staging.
 *
 * Two paths, each a connect and a move (rx_path_ops_t):
 *   the host path: every holder of the bytes (trainer ranks, their DP
 *     replicas, relays: fleet_select); the pull then runs as one direct pull
 *     of the plan when the holders qualify (REFIT_RX_PATH_HOST_DIRECT), else
 *     in chunks over all of them (REFIT_RX_PATH_HOST_FLEET): host_run;
 *   the GPU path: the sources the plan reads, every transport, every source
 *     at once (REFIT_RX_PATH_GPU_DIRECT; an FP8 receiver's transport
 *     quantizes: REFIT_RX_PATH_GPU_FP8).
 * GPU memory that a transport cannot write is pulled into pinned host
 * staging and copied up region by region; the host path runs in host
 * memory, so a GPU receiver on it always goes through its staging. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/receiver_internal.h"
#include "engine/test_hooks.h"

refit_status_t refit_rx_tick(void *user)
{
    refit_receiver_t *r = user;
    double now = refit_now();
    refit_status_t rs = refit_relays_renew(r->relays, r->reader, r->params.lease_ms); /* its own pace (1.5 s tokens) */
    if (rs) return rs;
    if (now - r->lease_renewed < r->params.lease_ms / 3e3) return REFIT_OK;
    r->lease_renewed = now;
    return refit_registry_lease_renew(r->reg, r->group, r->lease_version, r->reader, r->params.lease_ms,
                                      r->lease_token);
}

void refit_rx_append(char *buf, size_t size, const char *sep, const char *s)
{
    size_t len = strlen(buf);
    if (len && len + 1 < size) {
        size_t n = strlen(sep) < size - len - 1 ? strlen(sep) : size - len - 1;
        memcpy(buf + len, sep, n);
        len += n;
    }
    size_t n = strlen(s) < size - len - 1 ? strlen(s) : size - len - 1;
    memcpy(buf + len, s, n);
    buf[len + n] = '\0';
}

/* ---- the host path: every holder of the bytes ----------------------------- */

/* While every holder is full, fleet_select looks again at least this often
 * (seconds; a registry wait returns earlier when a record changes). */
#define SELECT_POLL_S 0.02

/* The holders of one fleet pull. */
typedef struct {
    refit_fleet_holder_t *h;
    uint32_t n, max;
    bool with_trainer; /* trainer ranks are among them */
} holders_t;

/* Trainer ranks at version v that hold bytes the plan needs (planned sources
 * and their DP replicas), connected, appended to the holders. */
static refit_status_t trainer_holders(pull_t *p, holders_t *hs)
{
    refit_receiver_t *r = p->r;
    const snapshot_t *s = &p->s;
    const refit_plan_t *plan = p->cp->plan;
    for (uint32_t k = 0; k < r->world && hs->n < hs->max; k++) {
        source_t *src = &r->src[k];
        if (!s->present[k] || !s->alive[k] || s->recs[k].version != p->v || !src->m) continue;
        bool needed = refit_plan_source_bytes(plan, k) > 0;
        for (uint32_t j = 0; j < r->world && !needed; j++)
            needed = r->src[j].m && r->src[j].mkey == src->mkey && refit_plan_source_bytes(plan, j) > 0;
        if (!needed) continue;
        uint32_t b = s->recs[k].buffer;
        if (b >= MAX_BUFFERS) return refit_error(REFIT_ERR_CORRUPT, "source rank %u names staging buffer %u", k, b);
        int t;
        refit_status_t st = refit_rx_connect(r, k, b, &t);
        if (st) {
            if (refit_plan_source_bytes(plan, k)) return st;
            continue; /* a replica we cannot reach: the planned rank serves */
        }
        refit_fleet_holder_t *x = &hs->h[hs->n++];
        memset(x, 0, sizeof(*x));
        snprintf(x->name, sizeof(x->name), "trainer:%u", k);
        x->id = k;
        x->transport = (uint32_t)t;
        x->peer = src->peer[t][b];
        x->mirror_key = src->mkey;
        x->rate = refit_test_throttle("trainer", k);
        x->delay_s = refit_test_read_delay("trainer", k);
    }
    return REFIT_OK;
}

/* Chooses holders by refit_fleet_pick (fleet.h): relays with room first; the
 * trainer when there is no limit (with the relays), or while no relay holds
 * v and the trainer has room (alone).  A receiver that read a relay last time
 * first waits for it: REFIT_FLEET_STICKY_MS, and on while that relay is alive
 * and has not begun v (it waits for its own upstream), up to
 * REFIT_FLEET_STICKY_MAX_MS (a quarter of the time left at most).  A joiner
 * (no pull read a holder yet) that knows relays of its layout alive
 * (refit_receiver_prepare read them, or an earlier look) takes nothing for
 * the same grace, on while some of them have not begun v: the receivers
 * already in the fleet take the holders they read last time, and it then
 * reads one with room, the trainer only if no relay holds v.  Waits (up to
 * the deadline) while every holder is full. */
static refit_status_t fleet_select(pull_t *p, holders_t *hs)
{
    refit_receiver_t *r = p->r;
    uint32_t cap = r->params.max_readers;
    double t0 = refit_now();
    double longest = REFIT_MIN(REFIT_FLEET_STICKY_MAX_MS * 1e-3, (p->deadline - t0) / 4);
    /* Known before this pull looked (a relay found in this look is no fleet
     * that was there before us). */
    bool joiner = cap && refit_relays_upstream(r->relays) == REFIT_RELAYS_NONE &&
                  refit_relays_mirrors_alive(r->relays) > 0;
    bool sticky = refit_relays_upstream(r->relays) >= 0 || joiner, looked = false;
    for (;;) {
        uint32_t holding = 0;
        /* Within the grace, only the relay read last time (see refit_fleet_pick); a joiner, none. */
        double waited = refit_now() - t0;
        bool upstream_coming = false;
        uint32_t coming = looked ? refit_relays_coming(r->relays, &upstream_coming) : 0;
        bool defer = sticky && (waited < REFIT_FLEET_STICKY_MS * 1e-3 ||
                                (waited < longest && (joiner ? coming > 0 : upstream_coming)));
        hs->n = refit_relays_find(r->relays, &r->ts, p->v, p->s.origin, r->reader, r->params.lease_ms, hs->h,
                                  REFIT_MIN(hs->max, REFIT_MAX_RELAYS), &holding, defer);
        looked = true;
        refit_log(REFIT_LOG_DEBUG, "%s: version %" PRIu64 ": %u relay(s) hold it, %u with room%s", r->reader, p->v,
                  holding, hs->n,
                  !defer   ? ""
                  : joiner ? " (joining: the fleet's receivers take their holders first)"
                           : " (waiting for the one read last time)");
        refit_fleet_pick_t pick = refit_fleet_pick(cap, hs->n, holding, defer);
        if (pick == REFIT_FLEET_PICK_RELAYS) {
            hs->with_trainer = false;
            refit_relays_set_upstream(r->relays, (int)hs->h[0].id);
            return REFIT_OK;
        }
        if (pick == REFIT_FLEET_PICK_ALL ||
            (pick == REFIT_FLEET_PICK_TRAINER_IF_ROOM && refit_relays_trainer_token(r->relays, p->v, r->reader, cap))) {
            hs->with_trainer = true;
            refit_relays_set_upstream(r->relays, REFIT_RELAYS_TRAINER);
            return trainer_holders(p, hs);
        }
        double left = p->deadline - refit_now();
        if (left <= 0)
            return refit_error(REFIT_ERR_TIMEOUT, "every holder of version %" PRIu64 " stayed at %u readers", p->v,
                               cap);
        refit_status_t st = refit_registry_wait(r->reg, (int)(REFIT_MIN(left, SELECT_POLL_S) * 1e3) + 1);
        if (st && st != REFIT_ERR_TIMEOUT) return st;
    }
}

/* Our chunked transfer has begun and our progress is valid: serve it. */
static void fleet_announce(void *user)
{
    refit_receiver_t *r = user;
    refit_relays_announce(r->relays, r->lease_version);
}

static void fleet_marked(void *user)
{
    refit_receiver_t *r = user;
    refit_relays_marked(r->relays);
}

/* The host path's decision, per pull: one direct pull when the holders
 * qualify (refit_fleet_runs_direct), else chunks over every holder; a
 * direct pull that a source's death broke is redone in chunks (where the
 * dead one is found and dropped).  p->rep->path: the way that moved them. */
static refit_status_t host_run(pull_t *p, const refit_fleet_xfer_t *fx, holders_t *hs, refit_pull_stats_t *stats)
{
    if (refit_fleet_runs_direct(fx, hs->h, hs->n)) {
        p->rep->path = REFIT_RX_PATH_HOST_DIRECT;
        refit_status_t st = refit_fleet_direct(fx, hs->h, hs->n, stats);
        if (st != REFIT_ERR_PEER) return st;
        refit_log(REFIT_LOG_INFO, "fleet: direct pull failed (%s); redoing it in chunks over every holder",
                  refit_last_error());
        refit_fleet_clear_counts(hs->h, hs->n);
    }
    p->rep->path = REFIT_RX_PATH_HOST_FLEET;
    return refit_fleet_chunks(fx, hs->h, hs->n, stats);
}

/* The holders' statistics become the receiver's (refit_receiver_holders);
 * p->tix names the trainer ranks read; returns the holders that served. */
static uint32_t keep_holders(pull_t *p, const holders_t *hs)
{
    refit_receiver_t *r = p->r;
    free(r->holders);
    r->holders = calloc(hs->n ? hs->n : 1, sizeof(refit_holder_stat_t));
    r->nholders = r->holders ? hs->n : 0;
    uint32_t used = 0;
    for (uint32_t k = 0; k < r->world; k++) p->tix[k] = -1;
    for (uint32_t i = 0; i < hs->n; i++) {
        const refit_fleet_holder_t *h = &hs->h[i];
        if (r->holders) {
            refit_holder_stat_t *o = &r->holders[i];
            snprintf(o->name, sizeof(o->name), "%s", h->name);
            o->bytes = h->bytes;
            o->chunks = h->chunks;
            o->steals = h->steals;
            o->failed = h->failed;
            o->early = h->early;
            o->ahead = h->ahead;
            o->late = h->late;
        }
        if (h->chunks) used++;
        if (h->chunks && !h->mirror_dst) p->tix[h->id] = (int)h->transport; /* re-checked after */
    }
    return used;
}

/* The process's CPU seconds (REFIT_FLEET_TRACE's start and end lines). */
static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The transfer over the holders into dst; the trainer serves what is left
 * when every relay read failed. */
static refit_status_t fleet_transfer(pull_t *p, void *const *dst, holders_t *hs, refit_pull_stats_t *stats,
                                     uint32_t *used)
{
    refit_receiver_t *r = p->r;
    uint64_t *keys = calloc(r->world ? r->world : 1, sizeof(uint64_t));
    if (!keys) return refit_error(REFIT_ERR_NO_MEMORY, "fleet");
    for (uint32_t k = 0; k < r->world; k++) keys[k] = r->src[k].m ? r->src[k].mkey : 0;
    refit_fleet_xfer_t x = {.ts = &r->ts,
                            .plan = p->cp->plan,
                            .plan_keys = keys,
                            .dst = dst,
                            .deadline = p->deadline,
                            .chunk_bytes = (uint64_t)r->params.chunk_kb << 10,
                            .tick = refit_rx_tick,
                            .user = r,
                            .seed = (uint32_t)refit_random_u64(),
                            /* The receiver's copy-thread budget caps the workers each holder gets. */
                            .workers = r->params.threads ? REFIT_MIN(r->params.threads, 2u) : 0,
                            .threads = r->params.threads,
                            .version = p->v,
                            .progress = refit_relays_progress(r->relays, dst),
                            .announce = fleet_announce,
                            .marked = fleet_marked,
                            .origin = p->s.origin,
                            .dmap = r->dmap,
                            .dacc = r->dlocal,
                            .dn = r->m->placements.len,
                            .dbytes = &p->dhashed};
    refit_fleet_resume_t resume = {0};
    x.resume = &resume;
    if (refit_fleet_tracing())
        refit_fleet_trace("start v%" PRIu64 " slot %d holders %u first=%s cpu %.4f", p->v, r->params.relay_slot, hs->n,
                          hs->n ? hs->h[0].name : "-", process_cpu_s());
    refit_status_t st = host_run(p, &x, hs, stats);
    if (refit_fleet_tracing())
        refit_fleet_trace("end v%" PRIu64 " slot %d cpu %.4f status %d", p->v, r->params.relay_slot, process_cpu_s(),
                          (int)st);
    if (st && !hs->with_trainer && (st == REFIT_ERR_PEER || st == REFIT_ERR_MISSING_SOURCE)) {
        /* Failover: every relay we had failed; the trainer serves what is
         * left (the chunks already written stay). */
        refit_log(REFIT_LOG_INFO, "relays failed (%s); reading version %" PRIu64 " from the trainer",
                  refit_last_error(), p->v);
        uint32_t before = hs->n;
        if (!(st = trainer_holders(p, hs))) {
            for (uint32_t i = 0; i < before; i++) hs->h[i].failed = true;
            memset(stats, 0, sizeof(*stats));
            st = host_run(p, &x, hs, stats);
        }
    }
    free(keys);
    free(resume.done);
    *used = keep_holders(p, hs);
    return st;
}

/* ---- the paths of a full transfer ------------------------------------------ */

/* One full transfer: what the path and the steps around it share. */
typedef struct {
    holders_t hs;     /* the host path: the holders picked */
    void *const *dst; /* where the bytes go: the memory, or its staging */
    bool bounce;      /* through pinned host staging, then one copy per region */
    refit_pull_stats_t stats;
} xfer_t;

/* A path: peers (or holders) for the sources the plan reads, then the move
 * of the bytes into x->dst (which writes p->rep's transport, lanes, sources
 * and path). */
typedef struct {
    refit_status_t (*connect)(pull_t *p, xfer_t *x);
    refit_status_t (*move)(pull_t *p, xfer_t *x);
    bool host_memory; /* its bytes land in host memory (a GPU receiver's: its staging) */
} rx_path_ops_t;

static refit_status_t host_connect(pull_t *p, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    for (uint32_t k = 0; k < r->world; k++) p->tix[k] = -1;
    x->hs = (holders_t){.max = REFIT_MAX_RELAYS + r->world, .with_trainer = true};
    if (!(x->hs.h = calloc(x->hs.max, sizeof(*x->hs.h)))) return refit_error(REFIT_ERR_NO_MEMORY, "holders");
    return fleet_select(p, &x->hs);
}

static refit_status_t host_move(pull_t *p, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    uint32_t used = 0;
    refit_status_t st = fleet_transfer(p, x->dst, &x->hs, &x->stats, &used);
    if (st) return st;
    rep->sources = used;
    snprintf(rep->transport, sizeof(rep->transport), "%s", r->ts.ops[0]->name);
    refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", x->stats.lanes);
    return REFIT_OK;
}

/* ---- the GPU path: every transport, every source at once ------------------ */

static refit_status_t gpu_connect(pull_t *p, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    (void)x;
    for (uint32_t k = 0; k < r->world; k++) {
        p->tix[k] = -1;
        if (!refit_plan_source_bytes(p->cp->plan, k)) continue;
        refit_status_t st = refit_rx_connect_recorded(r, &p->s, k, &p->tix[k]);
        if (st) return st;
        p->rep->sources++;
    }
    return REFIT_OK;
}

/* Transport t's pull (or warm) for this receiver: an FP8 receiver's through
 * the transport's FP8 extension (refused, naming the transport, without it). */
refit_status_t refit_rx_transport_pull(refit_receiver_t *r, uint32_t t, refit_peer_t *const *peers,
                                       const refit_plan_t *plan, void *const *dst, const refit_pull_ctl_t *ctl,
                                       refit_pull_stats_t *stats, bool warm)
{
    const refit_transport_ops_t *ops = r->ts.ops[t];
    void *ctx = r->ts.ctx[t];
    if (r->fp8) {
        const refit_transport_fp8_t *x = refit_transport_fp8(ops);
        if (!x)
            return refit_error(REFIT_ERR_UNSUPPORTED,
                               "an FP8 receiver quantizes while it pulls, which transport %s cannot do (cuda_ipc can): "
                               "serve every source of an FP8 receiver through cuda_ipc",
                               ops->name);
        refit_pull_fp8_t f = {.target = r->fp8, .bf16 = r->m};
        return warm ? x->warm(ctx, peers, plan, dst, ctl, &f) : x->pull(ctx, peers, plan, dst, ctl, &f, stats);
    }
    if (warm) return ops->warm ? ops->warm(ctx, peers, plan, dst, ctl) : REFIT_OK;
    return ops->pull(ctx, peers, plan, dst, ctl, stats);
}

static refit_status_t gpu_move(pull_t *p, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    refit_pull_ctl_t ctl = {.deadline = p->deadline, .threads = r->params.threads, .tick = refit_rx_tick, .user = r};
    rep->path = r->route;
    p->gsummed = false;
#ifdef REFIT_HAVE_CUDA
    /* One transport carrying every source straight into this GPU memory may
     * hash it as it copies (cuda_ipc): no second pass at the check. */
    uint32_t carriers = 0;
    for (uint32_t t = 0; t < r->ts.n; t++) {
        bool any = false;
        for (uint32_t k = 0; k < r->world; k++) any |= p->tix[k] == (int)t;
        carriers += any;
    }
    if (carriers == 1 && !x->bounce && x->dst == r->mem && (ctl.gdig = refit_rx_gpu_hasher(r)))
        ctl.ghashed = &p->gsummed;
#endif
    for (uint32_t t = 0; t < r->ts.n; t++) {
        bool any = false;
        for (uint32_t k = 0; k < r->world; k++) {
            p->peers[k] = p->tix[k] == (int)t ? r->src[k].peer[t][p->s.recs[k].buffer] : NULL;
            any |= p->peers[k] != NULL;
        }
        if (!any) continue;
        refit_pull_stats_t ts = {0};
        refit_status_t st = refit_rx_transport_pull(r, t, p->peers, p->cp->plan, x->dst, &ctl, &ts, false);
        if (st) return st;
        x->stats.bytes += ts.bytes;
        x->stats.requests += ts.requests;
        x->stats.launches += ts.launches;
        refit_rx_append(rep->transport, sizeof(rep->transport), "+", r->ts.ops[t]->name);
        refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", ts.lanes);
    }
    return REFIT_OK;
}

static const rx_path_ops_t host_path = {host_connect, host_move, true};
static const rx_path_ops_t gpu_path = {gpu_connect, gpu_move, false};

/* The path of r->route (refit_rx_route: HOST_FLEET names the host path,
 * whose pulls run direct when their holders qualify). */
static const rx_path_ops_t *path_ops(refit_rx_path_t route)
{
    switch (route) {
    case REFIT_RX_PATH_GPU_DIRECT:
    case REFIT_RX_PATH_GPU_FP8: return &gpu_path;
    default: return &host_path;
    }
}

refit_status_t refit_rx_raw_pull(pull_t *p, refit_plan_region_t *regs, size_t n, void *const *bufs,
                                 refit_pull_report_t *rep)
{
    refit_receiver_t *r = p->r;
    refit_status_t st = REFIT_OK;
    uint64_t *sb = calloc(r->world, sizeof(uint64_t));
    refit_peer_t **peers = calloc(r->world, sizeof(void *));
    refit_plan_region_t *sub = NULL; /* the regions of one transport, when the sources are on several */
    if (!sb || !peers) st = refit_error(REFIT_ERR_NO_MEMORY, "raw pull");
    for (uint32_t t = 0; t < r->ts.n && !st; t++) {
        size_t m = 0;
        memset(sb, 0, r->world * sizeof(uint64_t));
        for (uint32_t k = 0; k < r->world; k++)
            peers[k] = p->tix[k] == (int)t ? r->src[k].peer[t][p->s.recs[k].buffer] : NULL;
        for (size_t i = 0; i < n; i++)
            if (peers[regs[i].src]) {
                m++;
                sb[regs[i].src] += regs[i].run;
            }
        if (!m) continue;
        refit_plan_region_t *mine = regs;
        if (m < n) {
            if (!sub && !(sub = malloc(n * sizeof(*sub)))) {
                st = refit_error(REFIT_ERR_NO_MEMORY, "raw pull");
                break;
            }
            m = 0;
            for (size_t i = 0; i < n; i++)
                if (peers[regs[i].src]) sub[m++] = regs[i];
            mine = sub;
        }
        struct refit_plan one = refit_plan_view(mine, m, sb, r->world);
        refit_pull_ctl_t ctl = {
            .deadline = p->deadline, .threads = r->params.threads, .tick = refit_rx_tick, .user = r};
        refit_pull_stats_t ps = {0};
        if ((st = r->ts.ops[t]->pull(r->ts.ctx[t], peers, &one, bufs, &ctl, &ps))) break;
        rep->bytes += ps.bytes;
        rep->requests += ps.requests;
        if (!strstr(rep->transport, r->ts.ops[t]->name))
            refit_rx_append(rep->transport, sizeof(rep->transport), "+", r->ts.ops[t]->name);
        if (!strstr(rep->lanes, ps.lanes)) refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", ps.lanes);
    }
    free(sb);
    free(peers);
    free(sub);
    return st;
}

/* Where the bytes go: GPU memory that a transport of the sources read cannot
 * write, or any GPU memory on the host path, goes through pinned host
 * staging (allocated on first use); host memory needs transports that write it. */
static refit_status_t choose_dst(pull_t *p, const rx_path_ops_t *path, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    bool gpu = r->params.device >= 0;
    x->bounce = gpu && path->host_memory;
    for (uint32_t k = 0; k < r->world; k++)
        if (p->tix[k] >= 0) {
            unsigned caps = refit_transport_caps(r->ts.ops[p->tix[k]]);
            if (gpu && !(caps & REFIT_TCAP_DEVICE_DST)) x->bounce = true;
            if (!gpu && !(caps & REFIT_TCAP_HOST_DST))
                return refit_error(REFIT_ERR_TRANSPORT, "transport %s cannot write host memory",
                                   r->ts.ops[p->tix[k]]->name);
        }
    x->dst = r->mem;
    if (!x->bounce) return REFIT_OK;
    for (uint32_t i = 0; i < r->nregions; i++) {
        refit_status_t st = r->stage[i] ? REFIT_OK : r->dom->staging_alloc(r->m->regions.data[i], &r->stage[i]);
        if (st) return st;
    }
    x->dst = r->stage;
    return REFIT_OK;
}

/* After the move: the padding (zeros, ours to write where the bytes went;
 * an FP8 receiver's table wrote them), the copy up from the staging, the
 * report's counts. */
static refit_status_t finish(pull_t *p, xfer_t *x)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    const refit_memdom_t *fd = x->bounce ? &refit_memdom_host : r->dom; /* the staging is host memory */
    refit_status_t st;
    if (!r->fp8 && (st = fd->fills(p->cp->plan, r->params.device, x->dst, &x->stats.launches))) return st;
    for (uint32_t i = 0; x->bounce && i < r->nregions; i++)
        if ((st = r->dom->copy(r->mem[i], r->stage[i], r->m->regions.data[i]))) return st;
    if (x->bounce) refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", "(via pinned host staging)");
    r->pull_staged = x->bounce;
    rep->bytes = x->stats.bytes;
    rep->requests = x->stats.requests;
    rep->launches = x->stats.launches;
    return REFIT_OK;
}

refit_status_t refit_rx_full_transfer(pull_t *p)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    const rx_path_ops_t *path = path_ops(r->route);
    xfer_t x = {0};
    double tc = refit_now();
    refit_status_t st = path->connect(p, &x);
    if (st) goto done;
    rep->connect_ms = (refit_now() - tc) * 1e3;
    if ((st = choose_dst(p, path, &x))) goto done;
    /* 5. Transfer: from here the memory holds a partial version until committed
     * (a relay stops serving first, and waits for its readers). */
    refit_relays_withdraw(r->relays, (int)r->params.lease_ms);
    r->usable = false;
    r->stage_version = 0; /* the staging is being written too (GPU) */
    r->dsum_version = 0;  /* and the sums of it are no longer those of a version */
    /* A pause for the test suite (test_hooks.h): after the receiver committed
     * to the transfer, during which a test kills a process. */
    unsigned pause_ms = refit_test_pause_ms();
    if (pause_ms) usleep((useconds_t)pause_ms * 1000u);
    rep->transport[0] = rep->lanes[0] = '\0';
    if (!(st = path->move(p, &x))) st = finish(p, &x);
done:
    free(x.hs.h);
    return st;
}
