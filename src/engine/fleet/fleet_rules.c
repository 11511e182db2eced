/* The rules of a fleet transfer (fleet.h): how a plan becomes chunks, how
 * chunks are shared among holders, which chunk a holder's worker takes next
 * (stealing and re-reads), what a chunk read from a relay is, when a pull runs
 * direct, and which holders a receiver picks.  Pure functions of the
 * scheduling state: no threads, clocks or I/O.  fleet.c's workers apply them
 * under their lock at refit_now(); `refit simulate` (tools/sim) applies them in
 * simulated time; tests/unit/test_fleet.c with a clock of its own. */
#include <stdlib.h>
#include <string.h>

#include "engine/fleet/fleet.h"
#include "plan/plan.h"

bool refit_fleet_could_serve(const refit_fleet_sched_t *S, uint32_t h, const refit_fleet_chunk_t *c)
{
    const refit_fleet_holder_t *H = &S->h[h];
    if (H->failed || !H->peer) return false;
    if (H->mirror_dst) return true;
    return c->planned < S->nplan && H->mirror_key == S->plan_keys[c->planned];
}

bool refit_fleet_can_serve(const refit_fleet_sched_t *S, uint32_t h, const refit_fleet_chunk_t *c)
{
    if (!refit_fleet_could_serve(S, h, c)) return false;
    const refit_fleet_holder_t *H = &S->h[h];
    return !H->mirror_dst || !H->partial || (S->avail && S->avail[h] && S->avail[h][c - S->c]);
}

typedef REFIT_VEC(refit_fleet_chunk_t) chunkvec_t;
typedef REFIT_VEC(refit_plan_region_t) piecevec_t;

/* Cuts region r into pieces of at most about `chunk` bytes. */
static refit_status_t cut(piecevec_t *out, const refit_plan_region_t *r, uint64_t chunk)
{
    uint64_t bytes = refit_plan_region_bytes(r);
    struct {
        refit_plan_region_t reg;
    } c = {*r};
    if (bytes <= chunk) return REFIT_VEC_PUSH(out, c.reg) ? refit_error(REFIT_ERR_NO_MEMORY, "chunks") : REFIT_OK;
    if (r->nloops == 0) {
        for (uint64_t off = 0; off < r->run; off += chunk) {
            c.reg = *r;
            c.reg.src_offset += off;
            c.reg.dst_offset += off;
            c.reg.run = REFIT_MIN(chunk, r->run - off);
            if (REFIT_VEC_PUSH(out, c.reg)) return refit_error(REFIT_ERR_NO_MEMORY, "chunks");
        }
        return REFIT_OK;
    }
    uint32_t o = r->nloops - 1;
    uint64_t per = bytes / r->count[o]; /* bytes of one outer iteration */
    uint64_t step = per >= chunk ? 1 : chunk / per;
    for (uint64_t i = 0; i < r->count[o]; i += step) {
        c.reg = *r;
        c.reg.src_offset += i * r->src_stride[o];
        c.reg.dst_offset += i * r->dst_stride[o];
        c.reg.count[o] = REFIT_MIN(step, r->count[o] - i);
        if (c.reg.count[o] == 1) { /* a loop of one is no loop */
            c.reg.nloops--;
            c.reg.count[o] = 0;
            c.reg.src_stride[o] = c.reg.dst_stride[o] = 0;
            if (per > chunk) { /* one outer iteration is still too big: cut it further */
                refit_status_t st = cut(out, &c.reg, chunk);
                if (st) return st;
                continue;
            }
        }
        if (REFIT_VEC_PUSH(out, c.reg)) return refit_error(REFIT_ERR_NO_MEMORY, "chunks");
    }
    return REFIT_OK;
}

refit_status_t refit_fleet_sched_chunks(refit_fleet_sched_t *S, const refit_plan_t *plan, uint64_t chunk)
{
    refit_status_t st = REFIT_OK;
    chunkvec_t cv = {0};
    piecevec_t pv = {0};
    size_t nregs;
    const refit_plan_region_t *regs = refit_plan_regions(plan, &nregs);
    for (size_t i = 0; i < nregs && !st; i++) st = cut(&pv, &regs[i], chunk);
    /* Consecutive pieces of one source make one chunk, up to `chunk` bytes
     * (a plan has thousands of small regions: one chunk each would cost more
     * than the copy). */
    for (size_t i = 0; i < pv.len && !st; i++) {
        uint64_t b = refit_plan_region_bytes(&pv.data[i]);
        refit_fleet_chunk_t *last = cv.len ? &cv.data[cv.len - 1] : NULL;
        if (last && last->planned == pv.data[i].src && last->bytes + b <= chunk) {
            last->n++;
            last->bytes += b;
            continue;
        }
        refit_fleet_chunk_t c = {.first = i, .n = 1, .bytes = b, .planned = pv.data[i].src};
        if (REFIT_VEC_PUSH(&cv, c)) st = refit_error(REFIT_ERR_NO_MEMORY, "chunks");
    }
    if (st) {
        REFIT_VEC_FREE(&cv);
        REFIT_VEC_FREE(&pv);
        return st;
    }
    S->c = cv.data;
    S->nc = cv.len;
    S->pieces = pv.data;
    S->npieces = pv.len;
    return REFIT_OK;
}

void refit_fleet_sched_free(refit_fleet_sched_t *S)
{
    for (uint32_t h = 0; S->avail && h < S->nh; h++) free(S->avail[h]);
    free(S->avail);
    free(S->c);
    free(S->pieces);
    S->avail = NULL;
    S->c = NULL;
    S->pieces = NULL;
    S->nc = S->npieces = 0;
}

/* Seconds per byte of holder h: copy and link pacing, not the time its
 * threads waited for a CPU (see worker_main). */
static double per_byte(const refit_fleet_sched_t *S, uint32_t h)
{
    const refit_fleet_holder_t *H = &S->h[h];
    return H->bytes ? H->busy_s / (double)H->bytes : 0;
}

/* Whether holder v is clearly slower than holder h: over
 * REFIT_FLEET_SLOWER_RATIO (3x) the seconds per byte (after
 * REFIT_FLEET_SLOWER_CHUNKS chunks each), or a chunk in flight for over
 * REFIT_FLEET_STUCK_RATIO (10x) what h would take for it
 * (+REFIT_FLEET_STUCK_S, 100 ms; fleet.h).  CPU scheduling noise on a busy 2-core host
 * stays under that; a link at a tenth of the speed, or a stuck source, not. */
static bool slower(const refit_fleet_sched_t *S, uint32_t v, uint32_t h, double now)
{
    double mine = per_byte(S, h);
    if (S->h[h].chunks < REFIT_FLEET_SLOWER_CHUNKS || mine <= 0) return false;
    if (S->h[v].chunks >= REFIT_FLEET_SLOWER_CHUNKS && per_byte(S, v) > REFIT_FLEET_SLOWER_RATIO * mine) return true;
    for (size_t i = 0; i < S->nc; i++) {
        const refit_fleet_chunk_t *c = &S->c[i];
        if (c->state == REFIT_CHUNK_BUSY && c->owner == v &&
            now - c->start > REFIT_FLEET_STUCK_RATIO * mine * (double)c->bytes + REFIT_FLEET_STUCK_S)
            return true;
    }
    return false;
}

/* Whether holder h is clearly slower than another live holder and already
 * has a chunk in flight: then it takes no second one (a slow link with
 * several chunks in flight ends the pull that much later, each of them
 * waiting behind the others; the faster holders take its share). */
static bool held_back(const refit_fleet_sched_t *S, uint32_t h, double now)
{
    bool busy = false;
    for (size_t i = 0; i < S->nc && !busy; i++) busy = S->c[i].state == REFIT_CHUNK_BUSY && S->c[i].owner == h;
    if (!busy) return false;
    for (uint32_t v = 0; v < S->nh; v++)
        if (v != h && !S->h[v].failed && S->h[v].peer && slower(S, h, v, now)) return true;
    return false;
}

/* First a free chunk of its own share, then a free chunk of another holder's
 * share (from the back of it), then a chunk another holder has had in flight
 * for too long (a re-read); nothing more for a slow holder that has one in
 * flight (held_back). */
refit_fleet_chunk_t *refit_fleet_claim(refit_fleet_sched_t *S, uint32_t h, double now, bool *none_left)
{
    double mean = S->time_n ? S->time_sum / (double)S->time_n : REFIT_FLEET_FIRST_MEAN_S;
    refit_fleet_chunk_t *take = NULL, *steal = NULL;
    bool any = false;
    if (held_back(S, h, now)) {
        *none_left = false;
        return NULL;
    }
    for (size_t i = 0; i < S->nc; i++) {
        refit_fleet_chunk_t *c = &S->c[i];
        if (c->state == REFIT_CHUNK_DONE || !refit_fleet_could_serve(S, h, c)) continue;
        any = true;
        if (c->state == REFIT_CHUNK_FREE && c->pref == h && refit_fleet_can_serve(S, h, c)) {
            take = c;
            break;
        }
    }
    /* Another holder's share only when that holder is clearly slower (its
     * chunks take over 3x as long) or is a relay that does not have the
     * chunk yet: equal holders keep equal shares (egress balance), slow ones
     * lose theirs (stragglers), and nobody waits for a relay's chunk that
     * someone else can serve now (taken from the back: the relay's readers
     * work from the front). */
    for (size_t i = S->nc; !take && i-- > 0;) {
        refit_fleet_chunk_t *c = &S->c[i];
        if (c->state != REFIT_CHUNK_FREE || !refit_fleet_can_serve(S, h, c)) continue;
        const refit_fleet_holder_t *v = c->pref < S->nh ? &S->h[c->pref] : NULL;
        if (!v || v->failed || !v->peer || !refit_fleet_can_serve(S, c->pref, c) || slower(S, c->pref, h, now))
            take = c;
    }
    if (take) {
        if (take->pref != h) S->h[h].taken++;
        take->state = REFIT_CHUNK_BUSY;
        take->owner = h;
        take->start = now;
        return take;
    }
    for (size_t i = 0; i < S->nc && !steal; i++) {
        refit_fleet_chunk_t *c = &S->c[i];
        if (c->state == REFIT_CHUNK_BUSY && !c->dup && c->owner != h && !S->h[c->owner].failed &&
            refit_fleet_can_serve(S, h, c) && now - c->start > REFIT_FLEET_REREAD_RATIO * mean + REFIT_FLEET_REREAD_S)
            steal = c;
    }
    if (steal) {
        steal->dup = 1;
        steal->owner = h;
        steal->start = now;
        S->h[h].steals++;
        return steal;
    }
    *none_left = !any;
    return NULL;
}

refit_fleet_chunk_t *refit_fleet_claim_ahead(refit_fleet_sched_t *S, uint32_t h, double now)
{
    refit_fleet_holder_t *H = &S->h[h];
    if (!H->mirror_dst || !H->partial || !H->waitable || H->failed || !H->peer || held_back(S, h, now)) return NULL;
    for (size_t i = 0; i < S->nc; i++) {
        refit_fleet_chunk_t *c = &S->c[i];
        if (c->state != REFIT_CHUNK_FREE || c->pref != h) continue;
        c->state = REFIT_CHUNK_BUSY;
        c->owner = h;
        c->start = now;
        H->ahead++;
        return c;
    }
    return NULL;
}

void refit_fleet_share(refit_fleet_sched_t *S, uint32_t seed)
{
    uint64_t *load = calloc(S->nh ? S->nh : 1, sizeof(uint64_t));
    for (size_t i = 0; i < S->nc; i++) {
        refit_fleet_chunk_t *c = &S->c[i];
        uint32_t best = UINT32_MAX;
        for (uint32_t k = 0; k < S->nh; k++) {
            uint32_t h = (k + seed) % S->nh;
            if (!refit_fleet_could_serve(S, h, c)) continue;
            if (best == UINT32_MAX || (load && load[h] < load[best])) best = h;
        }
        c->pref = best;
        if (load && best != UINT32_MAX) load[best] += c->bytes;
    }
    free(load);
}

bool refit_fleet_chunk_done(refit_fleet_sched_t *S, uint32_t h, refit_fleet_chunk_t *c, uint64_t bytes, double cost,
                            double dt, bool rows)
{
    refit_fleet_holder_t *H = &S->h[h];
    H->bytes += bytes;
    H->chunks++;
    H->early += rows;
    H->busy_s += cost;
    if (c->state == REFIT_CHUNK_DONE) return false;
    c->state = REFIT_CHUNK_DONE;
    S->done++;
    S->time_sum += dt;
    S->time_n++;
    return true;
}

void refit_fleet_piece_from(const refit_fleet_holder_t *H, bool rows, refit_plan_region_t *reg)
{
    /* Rows that tile their destination span are read as that span: the same
     * bytes, one run instead of a walk over every row (a relay's readers are
     * mostly on this path, a chunk at a time). */
    bool gaps = refit_region_dst_end(reg) - reg->dst_offset != refit_plan_region_bytes(reg);
    if (H->mirror_dst && rows && gaps) {
        /* The relay holds the piece where we put it: read exactly its rows
         * (the bytes between them may belong to chunks it has not written). */
        reg->src_region = reg->dst_region;
        reg->src_offset = reg->dst_offset;
        memcpy(reg->src_stride, reg->dst_stride, sizeof(reg->src_stride));
    } else if (H->mirror_dst) {
        /* A relay holds the whole version where we put it: read each
         * piece's destination span in one run (bytes between its rows are
         * the same version's bytes too, or padding, which the relay has as
         * zeros). */
        uint64_t lo = reg->dst_offset, hi = refit_region_dst_end(reg);
        uint32_t dr = reg->dst_region;
        memset(reg, 0, sizeof(*reg));
        reg->src_region = reg->dst_region = dr;
        reg->src_offset = reg->dst_offset = lo;
        reg->run = hi - lo;
    }
}

int refit_fleet_direct_holder(const refit_fleet_holder_t *h, uint32_t nh, uint32_t s)
{
    for (uint32_t i = 0; i < nh; i++)
        if (!h[i].mirror_dst && h[i].id == s && h[i].peer && !h[i].failed) return (int)i;
    return -1;
}

bool refit_fleet_direct_ok(const refit_fleet_holder_t *h, uint32_t nh, bool net, bool relay, const refit_plan_t *plan)
{
    if (!nh) return false;
    uint32_t t = h[0].transport;
    for (uint32_t i = 0; i < nh; i++)
        if (h[i].mirror_dst || h[i].rate > 0 || h[i].transport != t) return false;
    /* Over a network a DP replica may be the faster link: keep chunks (and
     * stealing) whenever some bytes have two holders; and a relay's readers
     * follow its chunks, which a direct pull does not mark. */
    if (net && relay) return false;
    for (uint32_t i = 0; i < nh && net; i++)
        for (uint32_t j = i + 1; j < nh; j++)
            if (h[i].mirror_key == h[j].mirror_key) return false;
    size_t nplan = refit_plan_num_sources(plan);
    for (uint32_t s = 0; s < nplan; s++)
        if (refit_plan_source_bytes(plan, s) && refit_fleet_direct_holder(h, nh, s) < 0) return false;
    return true;
}

refit_fleet_pick_t refit_fleet_pick(uint32_t max_readers, uint32_t relays_with_room, uint32_t relays_holding,
                                    bool defer_trainer)
{
    if (relays_with_room && max_readers) return REFIT_FLEET_PICK_RELAYS;
    /* With a limit, the trainer feeds only while no relay holds the version,
     * and first the receiver that read it last time. */
    if (!max_readers) return REFIT_FLEET_PICK_ALL;
    if (!relays_holding && !defer_trainer) return REFIT_FLEET_PICK_TRAINER_IF_ROOM;
    return REFIT_FLEET_PICK_WAIT;
}

bool refit_fleet_room(uint32_t readers, uint32_t max_readers) { return !max_readers || readers < max_readers; }
