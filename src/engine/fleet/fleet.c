/* Fleet transfers: one receiver's plan executed as chunks that any holder of
 * the same bytes may serve (relays, failover, stragglers, egress).
 *
 * A plan reads each destination byte from one planned source.  Other holders
 * of the same bytes are found without planning again:
 *   - a trainer rank whose manifest equals the planned source's in everything
 *     but the rank (a DP replica: refit_fleet_mirror_key) holds those bytes
 *     at the same offsets;
 *   - a relay (a receiver of this very layout and rank that committed the
 *     version, see relay.c) holds them where this receiver puts them: the
 *     source side of the region is the destination side.
 * The plan's regions are cut into chunks of about chunk_bytes (along the
 * outermost loop, or the run) and shared out equally by bytes among the
 * holders that can serve them.  Each holder gets worker threads (the copy
 * threads over shm, REFIT_FLEET_NET_WORKERS chunks in flight over a network:
 * holder_workers); a worker
 * claims the next chunk of its holder's share, and when that is done, free
 * chunks of a holder whose chunks take over 3x as long as its own (REFIT_FLEET_SLOWER_RATIO):
 * equal holders serve equal bytes (egress balance), slow ones lose their
 * share to fast ones (work stealing).  A worker with
 * nothing left to claim re-reads a chunk another holder has had in flight for
 * more than 4x the mean chunk time (+100 ms: REFIT_FLEET_REREAD_*): a slow source's tail is worked
 * around.  A holder that fails (its process died: process_vm_readv fails, the
 * peer breaks) is dropped and its chunk goes back to the queue, so a reader
 * fails over at once to the other holders of those bytes.  The pull fails only
 * when a chunk is left that no live holder can serve.
 *
 * Chunk-level relays: a relay (relay.c) publishes a version as soon as its
 * own chunked transfer starts, with a progress region (fleet.h) in which this
 * code marks each chunk written.  A reader of that relay reads the progress
 * (a small one-sided pull, at most every millisecond while it has nothing
 * else to do) and serves itself the chunks written so far, row by row (the
 * bytes between rows may not be there yet); once the relay has committed, it
 * reads whole spans.  Readers of readers form a chain that pipelines: each
 * link runs about one chunk behind the one before.  A relay that stops
 * (failed, retired) clears its progress header, and its readers drop it.
 *
 * Direct pulls: when every planned source is served by its own trainer rank,
 * unpaced, no relay is among the holders, and either the transport is shm or
 * no bytes have a second holder, chunks buy nothing -- over shm the copying
 * CPU is the receiver's, every holder is as fast as memory, and the planner
 * already balanced DP replicas by bytes; without a second holder there is no
 * one to steal from or fail over to -- so the plan runs as one pull (with the
 * receiver's copy threads; over UCX from every source at once).  Over a
 * network a relay (its readers follow its chunks) always pulls in chunks.  The
 * receiver asks (refit_fleet_runs_direct) and calls refit_fleet_direct or
 * refit_fleet_chunks: that is its pull's path.  If a direct pull fails
 * because a source died, the receiver redoes the whole plan in chunks over
 * every holder, where the dead one is found and dropped: failover as above,
 * just later.
 *
 * Duplicate reads write identical bytes (one version, immutable while
 * leased); every worker is joined before the transfer returns.  Transports
 * without their own concurrency (anything but shm) are called one at a time.
 * A holder's `rate` paces its chunks to emulate a slow link in tests and
 * benchmarks on one host (test_hooks.h: REFIT_TEST_THROTTLE, test builds
 * only); its `delay_s` holds each read back before it copies
 * (REFIT_TEST_READ_DELAY_MS: a test's slow read that lands late).
 *
 * Hashing while copying (x->dmap, docs/digest.md): each read passes the
 * digest map to its transport with a scratch array of its worker's, so the
 * copies hash what they write.  A read's sums become the pull's (x->dacc,
 * the mapped bytes it hashed added to *x->dbytes) only when it completed its
 * chunk and no other read of that chunk was in flight at any time during it;
 * every other read's are dropped, and the chunks they wrote are hashed in
 * place after the workers are joined (hash_shared), when their bytes are
 * final.  So each chunk's bytes are summed exactly once, as they are in the
 * end: a steal's duplicate, or a read that failed while another ran, is
 * never counted twice, and whichever read wrote last is what is hashed.
 * With hashing on a relay is read row by row even when it holds the whole
 * version: its span would rewrite bytes of other chunks that another holder
 * may have written and hashed.  A try after a failed one (resume) keeps the
 * sums of the chunks it does not read again; any other try starts from zero.
 *
 * The rules above (chunks, shares, claims, direct pulls, the pick of holders)
 * are pure functions of the scheduling state (fleet.h, fleet_rules.c); the
 * workers below apply them under their lock at refit_now(), `refit simulate`
 * (tools/sim) applies the same functions in simulated time, and
 * tests/unit/test_fleet.c with a clock of its own. */
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/fleet/fleet.h"
#include "plan/plan.h"

uint64_t refit_fleet_origin(const refit_version_record_t *recs, const uint8_t *present, uint32_t world)
{
    uint64_t h = 0x6f726967696e2121ULL ^ world;
    for (uint32_t k = 0; k < world; k++)
        h = refit_mix64(h ^ (present[k] ? recs[k].incarnation : 0) ^ ((uint64_t)k << 56));
    return h ? h : 1;
}

uint64_t refit_fleet_mirror_key(const refit_manifest_t *m)
{
    /* The signature with the rank left out: equal keys mean equal layouts,
     * offsets included, so one rank's bytes sit where the other's do. */
    refit_manifest_t tmp = *m;
    tmp.rank = 0;
    return refit_manifest_compute_signature(&tmp);
}

/* ---- the engine: workers, transports, progress ----------------------------- */

typedef struct {
    refit_fleet_sched_t k; /* the rules' state (fleet.h) */
    const refit_tset_t *ts;
    refit_plan_key_t key; /* the plan's (relays' progress names it) */
    uint64_t chunk;       /* nominal chunk bytes */
    void *const *dst;
    double deadline;
    uint64_t version;
    refit_progress_hdr_t *progress; /* ours, when we are a relay */
    void (*marked)(void *user);     /* refit_fleet_xfer_t's */
    void *user;
    uint64_t origin;   /* see refit_fleet_xfer_t */
    uint64_t launches; /* GPU kernel launches of the chunk pulls (cuda_ipc) */
    /* Hashing while copying (refit_fleet_xfer_t's dmap; see the top comment):
     * per chunk, reads of it in flight now, whether two ever were at once
     * (their writes interleave: the chunk is hashed in place after the
     * workers), and whether its sums are in dacc. */
    const refit_digest_map_t *dmap;
    refit_dsum_t *dacc;
    size_t dn;
    uint64_t *dbytes;
    uint32_t *inflight;
    uint8_t *shared, *folded;
    bool finished;
    bool ran; /* the workers ran (their arrays could be allocated) */
    unsigned active;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_mutex_t serial[REFIT_MAX_TRANSPORTS];
} sched_t;

typedef struct {
    sched_t *S;
    uint32_t h;
} worker_arg_t;

/* Pulls regions regs[0..n) (src = h) from holder h into dst (lock not held);
 * transports without their own concurrency one call at a time. */
static refit_status_t pull_from(sched_t *S, uint32_t h, refit_plan_region_t *regs, size_t n, void *const *dst,
                                const refit_fleet_chunk_t *ahead, refit_dsum_t *sums, uint64_t *hashed,
                                refit_pull_stats_t *ps)
{
    refit_fleet_holder_t *H = &S->k.h[h];
    uint64_t *sb = calloc(S->k.nh, sizeof(uint64_t));
    refit_peer_t **peers = calloc(S->k.nh, sizeof(void *));
    if (!sb || !peers) {
        free(sb);
        free(peers);
        return refit_error(REFIT_ERR_NO_MEMORY, "pull from %s", H->name);
    }
    for (size_t i = 0; i < n; i++) sb[h] += refit_plan_region_bytes(&regs[i]);
    peers[h] = H->peer;
    struct refit_plan one = refit_plan_view(regs, n, sb, S->k.nh);
    refit_pull_ctl_t ctl = {.deadline = S->deadline,
                            .threads = 1,
                            .dmap = sums ? S->dmap : NULL,
                            .dacc = sums,
                            .dbytes = sums ? hashed : NULL,
                            .busy_egress = S->progress != NULL};
    const refit_transport_ops_t *ops = S->ts->ops[H->transport];
    void *ctx = S->ts->ctx[H->transport];
    const refit_transport_wait_t *cond = ahead ? refit_transport_wait(ops) : NULL;
    /* ahead: served once the relay has marked the chunk written in its progress for our version */
    refit_pull_wait_t w = {.region = (uint32_t)H->progress_region,
                           .ms = REFIT_FLEET_WAIT_MS,
                           .word_off = offsetof(refit_progress_hdr_t, version),
                           .word = S->version,
                           .flag_off = sizeof(refit_progress_hdr_t) + (uint64_t)(ahead ? ahead - S->k.c : 0)};
    bool serial = !(refit_transport_caps(ops) & REFIT_TCAP_CONCURRENT);
    refit_status_t st = REFIT_OK;
    if (ahead && !cond)
        st = refit_error(REFIT_ERR_UNSUPPORTED, "reading ahead from %s needs conditional pulls, which %s has not",
                         H->name, ops->name);
    if (!st) {
        if (serial) pthread_mutex_lock(&S->serial[H->transport]);
        st = cond ? cond->pull(ctx, peers, &one, dst, &ctl, &w, ps) : ops->pull(ctx, peers, &one, dst, &ctl, ps);
        if (serial) pthread_mutex_unlock(&S->serial[H->transport]);
    }
    free(sb);
    free(peers);
    return st;
}

/* Runs chunk c from holder h; `rows`: a relay still receiving, read row by
 * row, not in spans; `ahead`: c (the scheduler's) was asked for before the
 * relay had it (refit_fleet_claim_ahead).  sums (NULL: no hashing): the
 * read's copies hash what they write into it, the mapped bytes into
 * *hashed; a relay is then always read row by row (a span would rewrite
 * bytes of other chunks, which other holders may have written and hashed). */
static refit_status_t run_chunk(sched_t *S, uint32_t h, const refit_fleet_chunk_t *c, bool rows,
                                const refit_fleet_chunk_t *ahead, refit_dsum_t *sums, uint64_t *hashed, uint64_t *read)
{
    refit_fleet_holder_t *H = &S->k.h[h];
    refit_plan_region_t *regs = calloc(c->n, sizeof(*regs));
    if (!regs) return refit_error(REFIT_ERR_NO_MEMORY, "chunk");
    *read = 0;
    for (size_t i = 0; i < c->n; i++) {
        refit_plan_region_t reg = S->k.pieces[c->first + i];
        refit_fleet_piece_from(H, rows || sums, &reg);
        reg.src = h;
        regs[i] = reg;
        *read += refit_plan_region_bytes(&reg);
    }
    refit_pull_stats_t st = {0};
    if (H->delay_s > 0) usleep((useconds_t)(H->delay_s * 1e6)); /* a test's held-back holder */
    refit_status_t rc = pull_from(S, h, regs, c->n, S->dst, ahead, sums, hashed, &st);
    __atomic_add_fetch(&S->launches, st.launches, __ATOMIC_RELAXED);
    if (!rc && !H->lanes[0]) snprintf(H->lanes, sizeof(H->lanes), "%.63s", st.lanes);
    free(regs);
    return rc;
}

/* Reads holder h's progress (a relay; lock not held) into buf (header + nc
 * bytes) with the holder's transport. */
static refit_status_t read_progress(sched_t *S, uint32_t h, uint8_t *buf, uint64_t len)
{
    refit_plan_region_t reg;
    memset(&reg, 0, sizeof(reg));
    reg.src = h;
    reg.src_region = (uint32_t)S->k.h[h].progress_region;
    reg.dst_region = 0;
    reg.run = len;
    void *dst[1] = {buf};
    refit_pull_stats_t ps = {0};
    return pull_from(S, h, &reg, 1, dst, NULL, NULL, NULL, &ps);
}

/* Refreshes a partial relay's chunk availability (called with the lock held;
 * drops it while reading).  Fails the holder when the relay no longer serves
 * the version. */
static void refresh(sched_t *S, uint32_t h)
{
    refit_fleet_holder_t *H = &S->k.h[h];
    uint64_t len = sizeof(refit_progress_hdr_t) + S->k.nc;
    uint8_t *buf = malloc(len);
    H->refreshing = true;
    pthread_mutex_unlock(&S->lock);
    refit_status_t st = buf ? read_progress(S, h, buf, len) : refit_error(REFIT_ERR_NO_MEMORY, "progress");
    pthread_mutex_lock(&S->lock);
    H->refreshing = false;
    H->progress_read = refit_now();
    refit_progress_hdr_t hd;
    if (!st) memcpy(&hd, buf, sizeof(hd));
    if (!st && (hd.magic != REFIT_PROGRESS_MAGIC || hd.version != S->version))
        st = refit_error(REFIT_ERR_PEER, "%s stopped serving version %" PRIu64, H->name, S->version);
    else if (!st && hd.origin != S->origin)
        st = refit_error(REFIT_ERR_PEER, "%s holds version %" PRIu64 " from other trainer publishers (restarted)",
                         H->name, S->version);
    if (st) {
        if (!H->failed) {
            H->failed = true;
            H->failed_at = refit_now();
            snprintf(H->error, sizeof(H->error), "%s", refit_last_error());
        }
    } else if (hd.complete) {
        H->partial = false;
    } else {
        bool same = hd.plan_src == S->key.src && hd.plan_dst == S->key.dst && hd.chunk_bytes == S->chunk &&
                    hd.nchunks == S->k.nc;
        bool news = false;
        H->waitable = same && refit_transport_wait(S->ts->ops[H->transport]) != NULL;
        for (size_t i = 0; same && i < S->k.nc; i++)
            if (buf[sizeof(hd) + i] && !S->k.avail[h][i]) S->k.avail[h][i] = 1, news = true;
        if (!news) H->waits++;
    }
    free(buf);
    pthread_cond_broadcast(&S->cond);
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Emulated link: the holder's link carries one chunk after another at
 * `rate`; a chunk that started at t0 is through at max(link free, t0) +
 * bytes/rate, and its worker waits until then (the copy overlaps the link). */
static void pace(sched_t *S, refit_fleet_holder_t *H, uint64_t bytes, double t0)
{
    if (H->rate <= 0) return;
    pthread_mutex_lock(&S->lock);
    if (H->busy_until < t0) H->busy_until = t0;
    H->busy_until += (double)bytes / H->rate;
    double until = H->busy_until;
    while (!S->finished && refit_now() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&S->cond, &S->lock, &ts);
    }
    pthread_mutex_unlock(&S->lock);
}

/* Chunk c, which holder h's worker did not read, is free again if h still
 * has it (lock held). */
static void give_back(refit_fleet_chunk_t *c, uint32_t h)
{
    if (c->state == REFIT_CHUNK_BUSY && c->owner == h) c->state = REFIT_CHUNK_FREE, c->dup = 0;
}

/* Chunk c's pieces' sums in `sums` (the read's scratch) moved into acc, or
 * dropped (acc NULL); `sums` is left all zero. */
static void fold_chunk(const sched_t *S, const refit_fleet_chunk_t *c, refit_dsum_t *sums, refit_dsum_t *acc)
{
    for (size_t i = 0; i < c->n; i++) {
        const refit_plan_region_t *r = &S->k.pieces[c->first + i];
        refit_digest_map_fold(S->dmap, r->dst_region, r->dst_offset, refit_region_dst_end(r) - r->dst_offset, sums,
                              acc);
    }
}

static void *worker_main(void *arg)
{
    worker_arg_t *a = arg;
    sched_t *S = a->S;
    uint32_t h = a->h;
    refit_fleet_holder_t *H = &S->k.h[h];
    /* This worker's reads hash into sums (one entry per destination
     * placement, pages touched as used); NULL: its reads do not hash, and the
     * chunks they complete are hashed in place after the workers. */
    refit_dsum_t *sums = S->dmap ? calloc(S->dn ? S->dn : 1, sizeof(*sums)) : NULL;
    pthread_mutex_lock(&S->lock);
    for (;;) {
        if (S->finished || H->failed || S->k.done == S->k.nc || refit_now() > S->deadline) break;
        bool none_left = false;
        refit_fleet_chunk_t *c = refit_fleet_claim(&S->k, h, refit_now(), &none_left), *ahead = NULL;
        if (!c && !none_left) c = ahead = refit_fleet_claim_ahead(&S->k, h, refit_now());
        if (!c) {
            if (none_left) break;
            bool poll = H->mirror_dst && H->partial && !H->refreshing;
            double since = refit_now() - H->progress_read;
            if (poll && since > 1e-3) {
                refresh(S, h);
                continue;
            }
            /* Until this holder's next progress read is due; otherwise until
             * a chunk ends or a read brings news (both broadcast), or 20 ms
             * for the time-based rules (re-reads after 4x the mean chunk time
             * + 100 ms): every worker waking every 2 ms cost 8 receivers on
             * two CPUs ~10% of the CPU time. */
            long wait_ns = poll ? (long)((1e-3 - since) * 1e9) + 100000 : 20000000;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += wait_ns;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&S->cond, &S->lock, &ts);
            continue;
        }
        refit_fleet_chunk_t copy = *c;
        bool rows = H->partial;
        size_t ci = (size_t)(c - S->k.c);
        if (S->inflight && S->inflight[ci]++) S->shared[ci] = 1; /* another read of it is in flight */
        pthread_mutex_unlock(&S->lock);
        double t0 = refit_now(), c0 = thread_cpu();
        refit_fleet_trace("claim v%" PRIu64 " c%zu %s ahead=%d", S->version, ci, H->name, ahead != NULL);
        uint64_t bytes = 0, hashed = 0;
        refit_status_t st = run_chunk(S, h, &copy, rows, ahead, sums, &hashed, &bytes);
        double dt = refit_now() - t0;
        refit_fleet_trace("pulled v%" PRIu64 " c%zu status %d", S->version, ci, (int)st);
        /* A holder's speed: for shm, the CPU time of the copy (wall time would
         * count the time this thread waited for a CPU, which says nothing about
         * the source); for network transports, the wall time, except for a
         * chunk asked for ahead, whose wall time is mostly the relay's own
         * wait for it: booked at the holder's speed so far. */
        double cost = S->ts->ops[H->transport] == &refit_transport_shm ? thread_cpu() - c0 : dt;
        pthread_mutex_lock(&S->lock);
        if (S->inflight) S->inflight[ci]--;
        if (ahead && H->bytes) cost = H->busy_s / (double)H->bytes * (double)bytes;
        if (st == REFIT_ERR_BUSY && ahead) {
            /* Not written within the wait: the relay is slow, stuck or gone;
             * its progress says which (refresh fails a relay that stopped). */
            H->late++;
            give_back(c, h);
            if (sums) fold_chunk(S, &copy, sums, NULL);
            if (!H->refreshing) refresh(S, h);
            continue;
        }
        if (ahead && !st && S->k.avail[h]) S->k.avail[h][c - S->k.c] = 1;
        if (st) {
            if (!H->failed) {
                H->failed = true;
                snprintf(H->error, sizeof(H->error), "%s", refit_last_error());
                H->failed_at = refit_now();
            }
            give_back(c, h);
            pthread_cond_broadcast(&S->cond);
            break;
        }
        /* Once done, our own readers may take it from here (the bytes are written). */
        bool first = refit_fleet_chunk_done(&S->k, h, c, bytes, cost, dt, rows);
        bool marked = first && S->progress;
        /* The read's sums are the chunk's when it completed the chunk and no
         * other read of it was in flight at any time during it (a read that
         * failed before it started wrote a subset of the same bytes, all
         * rewritten by this one); otherwise they are dropped and the chunk is
         * hashed in place once every worker has stopped (hash_shared). */
        bool keep = first && sums && !S->shared[ci];
        if (keep) S->folded[ci] = 1;
        if (marked) __atomic_store_n((uint8_t *)(S->progress + 1) + (c - S->k.c), 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&S->cond);
        pthread_mutex_unlock(&S->lock);
        if (sums) fold_chunk(S, &copy, sums, keep ? S->dacc : NULL);
        if (keep && hashed) __atomic_fetch_add(S->dbytes, hashed, __ATOMIC_RELAXED);
        refit_fleet_trace("done v%" PRIu64 " c%zu %s first=%d relay=%d", S->version, ci, H->name, (int)first,
                          S->progress != NULL);
        if (marked && S->marked) S->marked(S->user);
        double tp = refit_now();
        pace(S, H, bytes, t0);
        pthread_mutex_lock(&S->lock);
        H->busy_s += refit_now() - tp;
    }
    S->active--;
    pthread_cond_broadcast(&S->cond);
    pthread_mutex_unlock(&S->lock);
    free(sums);
    return NULL;
}

/* Workers for holder H: the copy-thread budget where CPUs copy (shm) or the
 * transport runs one pull at a time (cuda_ipc); over a network (a concurrent
 * transport other than shm), chunks in flight enough to hide a request's
 * round trip, whatever the copy threads. */
static unsigned holder_workers(const refit_fleet_xfer_t *x, const refit_fleet_holder_t *H)
{
    const refit_transport_ops_t *ops = x->ts->ops[H->transport];
    bool net = ops != &refit_transport_shm && (refit_transport_caps(ops) & REFIT_TCAP_CONCURRENT);
    if (net) return x->net_workers ? x->net_workers : REFIT_FLEET_NET_WORKERS;
    return x->workers ? x->workers : 2;
}

bool refit_fleet_runs_direct(const refit_fleet_xfer_t *x, const refit_fleet_holder_t *h, uint32_t nh)
{
    if (!nh) return false;
    bool net = x->ts->ops[h[0].transport] != &refit_transport_shm;
    return refit_fleet_direct_ok(h, nh, net, x->progress != NULL, x->plan);
}

void refit_fleet_clear_counts(refit_fleet_holder_t *h, uint32_t nh)
{
    for (uint32_t i = 0; i < nh; i++) {
        h[i].bytes = 0;
        h[i].chunks = 0;
        h[i].busy_s = 0;
        h[i].lanes[0] = '\0';
    }
}

/* A direct pull's counts: each planned source's holder served its bytes as one chunk. */
static void direct_counts(const refit_fleet_xfer_t *x, refit_fleet_holder_t *h, const int *of, double dt,
                          const refit_pull_stats_t *ps, refit_pull_stats_t *stats)
{
    size_t nplan = refit_plan_num_sources(x->plan);
    for (uint32_t s = 0; s < nplan; s++) {
        if (of[s] < 0) continue;
        refit_fleet_holder_t *H = &h[of[s]];
        H->bytes += refit_plan_source_bytes(x->plan, s);
        H->chunks++; /* a direct pull counts as one chunk per source */
        H->busy_s = dt;
        snprintf(H->lanes, sizeof(H->lanes), "%.63s", ps->lanes);
    }
    if (stats) {
        stats->bytes += ps->bytes;
        stats->requests += ps->requests;
        stats->launches += ps->launches;
        snprintf(stats->lanes, sizeof(stats->lanes), "%s", ps->lanes);
    }
}

refit_status_t refit_fleet_direct(const refit_fleet_xfer_t *x, refit_fleet_holder_t *h, uint32_t nh,
                                  refit_pull_stats_t *stats)
{
    if (!refit_fleet_runs_direct(x, h, nh))
        return refit_error(REFIT_ERR_INTERNAL, "fleet: a direct pull over holders that do not qualify for one");
    size_t nplan = refit_plan_num_sources(x->plan);
    uint32_t t = h[0].transport;
    refit_peer_t **peers = calloc(nplan ? nplan : 1, sizeof(void *));
    int *of = calloc(nplan ? nplan : 1, sizeof(int));
    if (!peers || !of) {
        free(peers);
        free(of);
        return refit_error(REFIT_ERR_NO_MEMORY, "direct pull");
    }
    for (uint32_t s = 0; s < nplan; s++) { /* refit_fleet_direct_ok found a holder for each */
        of[s] = refit_plan_source_bytes(x->plan, s) ? refit_fleet_direct_holder(h, nh, s) : -1;
        if (of[s] >= 0) peers[s] = h[of[s]].peer;
    }
    refit_pull_ctl_t ctl = {.deadline = x->deadline,
                            .threads = x->threads,
                            .tick = x->tick,
                            .user = x->user,
                            .dmap = x->dmap,
                            .dacc = x->dacc,
                            .dbytes = x->dbytes};
    refit_pull_stats_t ps = {0};
    if (x->dmap) { /* what a try before hashed is not what this one writes */
        memset(x->dacc, 0, x->dn * sizeof(*x->dacc));
        *x->dbytes = 0;
    }
    double t0 = refit_now();
    refit_status_t st = x->ts->ops[t]->pull(x->ts->ctx[t], peers, x->plan, x->dst, &ctl, &ps);
    if (!st) direct_counts(x, h, of, refit_now() - t0, &ps, stats);
    free(peers);
    free(of);
    return st;
}

/* Chunks a failed try of the same plan left in place are marked done (not
 * read again); returns how many. */
static size_t resume_chunks(sched_t *S, const refit_fleet_resume_t *resume)
{
    size_t resumed = 0;
    if (resume && resume->done && resume->n == S->k.nc)
        for (size_t i = 0; i < S->k.nc; i++)
            if (resume->done[i]) S->k.c[i].state = REFIT_CHUNK_DONE, S->k.done++, resumed++;
    if (resumed)
        refit_log(REFIT_LOG_INFO, "fleet: %zu of %zu chunks already in place from the try before", resumed, S->k.nc);
    return resumed;
}

/* Every chunk left needs some holder from the start. */
static refit_status_t check_coverage(const sched_t *S)
{
    for (size_t i = 0; i < S->k.nc; i++) {
        if (S->k.c[i].state == REFIT_CHUNK_DONE) continue;
        bool ok = false;
        for (uint32_t h = 0; h < S->k.nh && !ok; h++) ok = refit_fleet_could_serve(&S->k, h, &S->k.c[i]);
        if (!ok)
            return refit_error(REFIT_ERR_MISSING_SOURCE, "no connected holder serves plan source %u's bytes",
                               S->k.c[i].planned);
    }
    return REFIT_OK;
}

/* Partial relays start with nothing known written; a relay without a
 * progress region, or one we cannot follow, is left out. */
static refit_status_t follow_relays(sched_t *S)
{
    uint32_t nh = S->k.nh;
    refit_fleet_holder_t *holders = S->k.h;
    if (!(S->k.avail = calloc(nh ? nh : 1, sizeof(uint8_t *)))) return refit_error(REFIT_ERR_NO_MEMORY, "holders");
    for (uint32_t h = 0; h < nh; h++) {
        holders[h].partial = holders[h].mirror_dst && holders[h].progress_region >= 0;
        if (holders[h].mirror_dst && holders[h].progress_region < 0 && !holders[h].failed) {
            /* Without progress there is no telling which trainer its bytes came from. */
            holders[h].failed = true;
            snprintf(holders[h].error, sizeof(holders[h].error), "a relay without a progress region");
        }
        if (holders[h].partial && !(S->k.avail[h] = calloc(S->k.nc ? S->k.nc : 1, 1))) {
            /* Without a map of what it has, a relay still receiving cannot be
             * read safely: leave it out (the other holders serve). */
            holders[h].failed = true;
            snprintf(holders[h].error, sizeof(holders[h].error), "no memory to follow its progress");
        }
    }
    return REFIT_OK;
}

/* The scheduler's state for a chunked transfer: chunks cut, resumed chunks
 * marked, coverage checked, shares dealt, relays to follow.  On failure
 * S->k is freed. */
static refit_status_t sched_setup(sched_t *S, const refit_fleet_xfer_t *x, refit_fleet_holder_t *holders, uint32_t nh,
                                  size_t *resumed)
{
    memset(S, 0, sizeof(*S));
    S->ts = x->ts;
    S->k.h = holders;
    S->k.nh = nh;
    S->dst = x->dst;
    S->deadline = x->deadline;
    S->k.nplan = refit_plan_num_sources(x->plan);
    refit_plan_key(x->plan, &S->key);
    S->version = x->version;
    S->k.plan_keys = x->plan_keys;
    S->origin = x->origin;
    S->chunk = x->chunk_bytes ? x->chunk_bytes : (2u << 20);
    refit_status_t st = refit_fleet_sched_chunks(&S->k, x->plan, S->chunk);
    if (st) return st;
    *resumed = resume_chunks(S, x->resume);
    if ((st = check_coverage(S))) {
        refit_fleet_sched_free(&S->k);
        return st;
    }
    refit_fleet_share(&S->k, x->seed);
    if ((st = follow_relays(S))) refit_fleet_sched_free(&S->k);
    return st;
}

/* We are a relay: readers may follow us chunk by chunk from now on. */
static void progress_start(sched_t *S, const refit_fleet_xfer_t *x, size_t resumed)
{
    if (!x->progress || S->k.nc > REFIT_PROGRESS_MAX_CHUNKS) return;
    refit_progress_hdr_t *hd = x->progress;
    /* A retry of the same transfer (resumed) keeps its progress as it
     * is, so that readers following it see no gap. */
    bool same = __atomic_load_n(&hd->version, __ATOMIC_ACQUIRE) == x->version && resumed &&
                hd->magic == REFIT_PROGRESS_MAGIC && hd->plan_src == S->key.src && hd->plan_dst == S->key.dst &&
                hd->chunk_bytes == S->chunk && hd->nchunks == S->k.nc && !hd->complete;
    if (!same) {
        __atomic_store_n(&hd->version, 0, __ATOMIC_RELEASE);
        memset(hd + 1, 0, S->k.nc);
        hd->magic = REFIT_PROGRESS_MAGIC;
        hd->plan_src = S->key.src;
        hd->plan_dst = S->key.dst;
        hd->chunk_bytes = S->chunk;
        hd->nchunks = S->k.nc;
        hd->complete = 0;
    }
    for (size_t i = 0; i < S->k.nc; i++)
        if (S->k.c[i].state == REFIT_CHUNK_DONE) __atomic_store_n((uint8_t *)(hd + 1) + i, 1, __ATOMIC_RELEASE);
    hd->origin = x->origin;
    __atomic_store_n(&hd->version, x->version, __ATOMIC_RELEASE);
    S->progress = hd;
    S->marked = x->marked;
    S->user = x->user;
    if (x->announce) x->announce(x->user);
}

/* The calling thread renews leases (tick) while the workers run, until
 * every chunk is done, no worker is left, the deadline passes or tick
 * fails (its error).  Lock held. */
static refit_status_t supervise(sched_t *S, const refit_fleet_xfer_t *x)
{
    while (S->active > 0 && S->k.done < S->k.nc) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&S->cond, &S->lock, &ts);
        if (x->tick) {
            pthread_mutex_unlock(&S->lock);
            refit_status_t st = x->tick(x->user);
            pthread_mutex_lock(&S->lock);
            if (st) return st;
        }
        if (refit_now() > S->deadline) break;
    }
    return REFIT_OK;
}

/* Starts the holders' workers, supervises them and joins them; *left: the
 * chunks not done when they were told to stop. */
static refit_status_t run_workers(sched_t *S, const refit_fleet_xfer_t *x, size_t *left)
{
    refit_fleet_holder_t *holders = S->k.h;
    size_t nw = 0;
    for (uint32_t h = 0; h < S->k.nh; h++) nw += holder_workers(x, &holders[h]);
    pthread_t *th = calloc(nw ? nw : 1, sizeof(pthread_t));
    worker_arg_t *wa = calloc(nw ? nw : 1, sizeof(worker_arg_t));
    bool *started = calloc(nw ? nw : 1, sizeof(bool));
    refit_status_t st = REFIT_OK;
    *left = 0;
    if (!th || !wa || !started) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "workers");
        goto out;
    }
    S->ran = true;
    pthread_mutex_lock(&S->lock);
    for (uint32_t h = 0, w = 0; h < S->k.nh; h++)
        for (unsigned k = holder_workers(x, &holders[h]); k > 0; k--, w++) {
            if (holders[h].failed || !holders[h].peer) continue;
            wa[w] = (worker_arg_t){S, h};
            if (pthread_create(&th[w], NULL, worker_main, &wa[w]) == 0) {
                started[w] = true;
                S->active++;
            }
        }
    st = supervise(S, x);
    S->finished = true;
    *left = S->k.nc - S->k.done;
    pthread_cond_broadcast(&S->cond);
    pthread_mutex_unlock(&S->lock);
    for (size_t w = 0; w < nw; w++)
        if (started[w]) pthread_join(th[w], NULL);
out:
    free(th);
    free(wa);
    free(started);
    return st;
}

/* Chunks left after the workers stopped: the deadline passed, or no live
 * holder was left (the failed holders' errors say why). */
static refit_status_t chunks_left_error(const sched_t *S, size_t left)
{
    const refit_fleet_holder_t *holders = S->k.h;
    char why[600] = "";
    size_t pos = 0;
    for (uint32_t h = 0; h < S->k.nh && pos < sizeof(why) - 1; h++)
        if (holders[h].failed)
            pos += (size_t)snprintf(why + pos, sizeof(why) - pos, "%s%s: %s", pos ? "; " : "", holders[h].name,
                                    holders[h].error);
    if (refit_now() > S->deadline)
        return refit_error(REFIT_ERR_TIMEOUT, "%zu of %zu chunks not transferred by the deadline%s%s", left, S->k.nc,
                           why[0] ? "; " : "", why);
    return refit_error(REFIT_ERR_PEER, "%zu of %zu chunks have no live holder left (%s)", left, S->k.nc, why);
}

/* After the workers: each holder's part logged, what is in place kept for
 * a try after this one, and (success) the statistics. */
static void chunks_finish(const sched_t *S, const refit_fleet_xfer_t *x, bool ok, refit_pull_stats_t *stats)
{
    const refit_fleet_holder_t *holders = S->k.h;
    for (uint32_t h = 0; h < S->k.nh; h++)
        refit_log(REFIT_LOG_DEBUG,
                  "fleet: %s: %u chunks (%u from others' shares, %u re-read, %u while it was receiving, %u asked "
                  "ahead, %u late, %u idle progress reads), %" PRIu64 " bytes, %.1f ms busy%s%s",
                  holders[h].name, holders[h].chunks, holders[h].taken, holders[h].steals, holders[h].early,
                  holders[h].ahead, holders[h].late, holders[h].waits, holders[h].bytes, holders[h].busy_s * 1e3,
                  holders[h].failed ? ", failed: " : "", holders[h].failed ? holders[h].error : "");
    if (x->resume) { /* what is in place now, for a try after this one */
        uint8_t *d = x->resume->n == S->k.nc ? x->resume->done : realloc(x->resume->done, S->k.nc ? S->k.nc : 1);
        if (d) {
            for (size_t i = 0; i < S->k.nc; i++) d[i] = S->k.c[i].state == REFIT_CHUNK_DONE;
            x->resume->done = d;
            x->resume->n = S->k.nc;
        }
    }
    if (!ok || !stats) return;
    for (size_t i = 0; i < S->k.nc; i++) stats->bytes += S->k.c[i].bytes; /* a resumed try's included: same pull */
    stats->requests += S->k.nc;
    stats->launches += S->launches;
    for (uint32_t h = 0; h < S->k.nh; h++)
        if (holders[h].chunks && !strstr(stats->lanes, holders[h].lanes)) {
            size_t l = strlen(stats->lanes);
            snprintf(stats->lanes + l, sizeof(stats->lanes) - l, "%s%s", l ? " " : "", holders[h].lanes);
        }
}

/* Hashing while copying, set up for a chunked try: sums start from zero,
 * except those of the chunks a try before left in place (resumed), which
 * stay (that try hashed each of them exactly once).  Without the per-chunk
 * state nothing is hashed (the receiver then hashes its memory after). */
static void hashing_start(sched_t *S, const refit_fleet_xfer_t *x, size_t resumed)
{
    if (!x->dmap || !x->dacc || !x->dbytes) return;
    if (!resumed) { /* what a direct try before hashed is not what this one writes */
        memset(x->dacc, 0, x->dn * sizeof(*x->dacc));
        *x->dbytes = 0;
    }
    size_t nc = S->k.nc ? S->k.nc : 1;
    S->inflight = calloc(nc, sizeof(*S->inflight));
    S->shared = calloc(nc, 1);
    S->folded = calloc(nc, 1);
    if (!S->inflight || !S->shared || !S->folded) {
        refit_log(REFIT_LOG_WARN, "fleet: no memory to hash %zu chunks as they land: hashing after the transfer", nc);
        free(S->inflight);
        free(S->shared);
        free(S->folded);
        S->inflight = NULL;
        S->shared = S->folded = NULL;
        return;
    }
    for (size_t i = 0; i < S->k.nc; i++) S->folded[i] = S->k.c[i].state == REFIT_CHUNK_DONE;
    S->dmap = x->dmap;
    S->dacc = x->dacc;
    S->dn = x->dn;
    S->dbytes = x->dbytes;
}

/* The mapped bytes of piece r hashed where they lie in the destination. */
static uint64_t hash_piece(const sched_t *S, const refit_plan_region_t *r)
{
    uint8_t *base = S->dst[r->dst_region];
    if (r->nloops == 0)
        return refit_digest_map_copy(S->dmap, r->dst_region, r->dst_offset, base + r->dst_offset, NULL, r->run,
                                     S->dacc);
    uint64_t hashed = 0, rows = refit_region_rows(r);
    for (uint64_t row = 0; row < rows; row += r->count[0]) { /* loop 0's rows in one call */
        uint64_t so, dof;
        refit_region_row_offsets(r, row, &so, &dof);
        hashed += refit_digest_map_copy_rows(S->dmap, r->dst_region, dof, r->dst_stride[0], base + dof, NULL, 0, r->run,
                                             r->count[0], S->dacc);
    }
    return hashed;
}

/* After the workers (every read has returned: the bytes are final): the
 * chunks in place whose sums no single read gave (two reads of them were in
 * flight at once, a steal's duplicate or a read that failed while another
 * ran, or a worker without its scratch) are hashed in place, once each. */
static void hash_shared(sched_t *S)
{
    if (!S->dmap) return;
    uint64_t hashed = 0;
    size_t n = 0;
    for (size_t i = 0; i < S->k.nc; i++) {
        const refit_fleet_chunk_t *c = &S->k.c[i];
        if (c->state != REFIT_CHUNK_DONE || S->folded[i]) continue;
        for (size_t j = 0; j < c->n; j++) hashed += hash_piece(S, &S->k.pieces[c->first + j]);
        S->folded[i] = 1;
        n++;
    }
    if (hashed) __atomic_fetch_add(S->dbytes, hashed, __ATOMIC_RELAXED);
    if (n) refit_log(REFIT_LOG_DEBUG, "fleet: %zu chunks written by more than one read, hashed in place", n);
}

refit_status_t refit_fleet_chunks(const refit_fleet_xfer_t *x, refit_fleet_holder_t *holders, uint32_t nh,
                                  refit_pull_stats_t *stats)
{
    sched_t S;
    size_t resumed = 0;
    refit_status_t st = sched_setup(&S, x, holders, nh, &resumed);
    if (st) return st;
    hashing_start(&S, x, resumed);
    progress_start(&S, x, resumed);
    pthread_mutex_init(&S.lock, NULL);
    pthread_cond_init(&S.cond, NULL);
    for (uint32_t t = 0; t < REFIT_MAX_TRANSPORTS; t++) pthread_mutex_init(&S.serial[t], NULL);
    size_t left = 0;
    st = run_workers(&S, x, &left);
    if (!st && left) st = chunks_left_error(&S, left);
    if (S.ran) hash_shared(&S);
    if (S.ran) chunks_finish(&S, x, !st, stats);
    pthread_mutex_destroy(&S.lock);
    pthread_cond_destroy(&S.cond);
    for (uint32_t t = 0; t < REFIT_MAX_TRANSPORTS; t++) pthread_mutex_destroy(&S.serial[t]);
    refit_fleet_sched_free(&S.k);
    free(S.inflight);
    free(S.shared);
    free(S.folded);
    return st;
}
