/* Receivers, verification before a commit.
 *
 * Content digests: after the transfer (and the re-check of the sources),
 * the receiver hashes its own memory in canonical coordinates, fetches the
 * few entries of the sources' digest tables its boxes need (one transport
 * pull of 8-byte runs) and compares (data/digest.h), so that bytes that do
 * not match what the publishers published are never committed, whatever
 * carried them (relays, deltas, a torn read).  Tests add the synthetic
 * truth (REFIT_VERIFY_TRUTH): every byte checked against its formula. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/receiver_internal.h"
#include "engine/test_hooks.h"

/* Forgets the digest fetch's read regions (fetch_regions makes them again). */
static void drop_fetch_regions(cached_plan_t *cp)
{
    free(cp->dregs);
    free(cp->dregion);
    cp->dregs = NULL;
    cp->dregion = NULL;
    cp->ndregs = cp->dnf = 0;
}

/* cp->dplan for the sources `usable` marks, made again when they changed
 * (bytes no digest covers said at INFO, once per plan). */
static refit_status_t digest_plan_for(refit_receiver_t *r, cached_plan_t *cp, const refit_manifest_t **srcs,
                                      const uint8_t *usable)
{
    if (cp->dplan && memcmp(cp->dusable, usable, r->world) == 0) return REFIT_OK;
    refit_digest_plan_destroy(cp->dplan);
#ifdef REFIT_HAVE_CUDA
    refit_gpu_digest_check_destroy(cp->gchk);
    cp->gchk = NULL;
#endif
    free(cp->dusable);
    drop_fetch_regions(cp);
    cp->dplan = NULL;
    cp->dusable = NULL;
    uint8_t *keep = malloc(r->world ? r->world : 1);
    if (!keep) return refit_error(REFIT_ERR_NO_MEMORY, "digests");
    memcpy(keep, usable, r->world);
    refit_status_t st = refit_digest_plan_create(srcs, r->world, usable, r->m, &cp->dplan);
    if (st) {
        free(keep);
        return st;
    }
    cp->dusable = keep;
    refit_digest_plan_stats_t ps;
    refit_digest_plan_stats(cp->dplan, &ps);
    if (ps.unverifiable_bytes)
        refit_log(REFIT_LOG_INFO,
                  "%s: %" PRIu64 " of %" PRIu64 " bytes cannot be checked against the "
                  "sources' digests (sources without digests, or boxes no digest covers)",
                  r->reader, ps.unverifiable_bytes, ps.bytes + ps.unverifiable_bytes);
    return REFIT_OK;
}

/* The digest plan's fetches (*f, *nf), every source they name connected.
 * The entries come from the sources the digest plan picks; one we cannot
 * reach (a replica the transfer did not need) is left out and the plan made
 * again without it, unless that leaves bytes unchecked that its digests
 * would have covered (a dead trainer rank whose bytes came through a
 * relay): REFIT_ERR_PEER rather than commit them. */
static refit_status_t digest_sources(pull_t *p, const refit_manifest_t **srcs, uint8_t *usable,
                                     const refit_digest_fetch_t **f, size_t *nf)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    uint64_t covered_unverifiable = UINT64_MAX; /* with every source that offers digests */
    uint32_t unreachable = UINT32_MAX;          /* a source dropped because it could not be reached */
    refit_status_t st = REFIT_OK;
    for (uint32_t attempt = 0; attempt <= r->world; attempt++) {
        if ((st = digest_plan_for(r, cp, srcs, usable))) return st;
        *f = refit_digest_plan_fetches(cp->dplan, nf);
        if (covered_unverifiable == UINT64_MAX) {
            refit_digest_plan_stats_t ps0;
            refit_digest_plan_stats(cp->dplan, &ps0);
            covered_unverifiable = ps0.unverifiable_bytes;
        }
        bool dropped = false;
        for (size_t i = 0; i < *nf; i++) {
            uint32_t k = (*f)[i].src;
            if (p->tix[k] >= 0 || !usable[k]) continue;
            if (refit_rx_connect(r, k, p->s.recs[k].buffer, &p->tix[k])) {
                refit_log(REFIT_LOG_INFO, "%s: digests of source rank %u unreachable (%s); using others", r->reader, k,
                          refit_last_error());
                p->tix[k] = -1;
                usable[k] = 0;
                dropped = true;
                unreachable = k;
            }
        }
        if (!dropped) break;
    }
    if (unreachable == UINT32_MAX) return REFIT_OK;
    refit_digest_plan_stats_t ps1;
    refit_digest_plan_stats(cp->dplan, &ps1);
    if (ps1.unverifiable_bytes > covered_unverifiable)
        return refit_error(REFIT_ERR_PEER,
                           "%" PRIu64 " bytes of version %" PRIu64 " cannot be checked: the digests "
                           "of source rank %u are unreachable",
                           ps1.unverifiable_bytes - covered_unverifiable, p->v, unreachable);
    return REFIT_OK;
}

#ifdef REFIT_HAVE_CUDA
#define HAVE_GPU_DIGESTS true
#else
#define HAVE_GPU_DIGESTS false
#endif

/* r->dlocal from the receiver's GPU memory (its kernels' work list made at
 * the first check: the memory does not move). */
static refit_status_t gpu_sums(refit_receiver_t *r)
{
#ifdef REFIT_HAVE_CUDA
    refit_status_t st;
    if (!r->gdig && (st = refit_gpu_digest_create(r->params.device, r->dkey, r->m, r->mem, false, &r->gdig))) return st;
    return refit_gpu_digest_local_run(r->gdig, r->dlocal);
#else
    (void)r;
    return REFIT_OK; /* no GPU memory without CUDA */
#endif
}

/* Where the entries land: one buffer kept for the receiver's life and only
 * ever grown, so that a transport that registers host memory it writes
 * (cuda_ipc, from a GPU publisher's table) registers it once, not a fresh
 * allocation per pull (and never one that reuses freed registered memory). */
static unsigned char *fetch_buffer(refit_receiver_t *r, size_t nf)
{
    size_t want = (nf ? nf : 1) * 8;
    if (r->dfetch_len >= want) return r->dfetch;
    size_t len = REFIT_MAX(want, 2 * r->dfetch_len);
    len = (len + 4095) & ~(size_t)4095;
    void *b = NULL;
    if (posix_memalign(&b, 4096, len)) return NULL;
    memset(b, 0, len);
    if (r->dfetch) REFIT_VEC_PUSH(&r->dfetch_old, r->dfetch); /* kept: it may be registered (freed at destroy) */
    r->dfetch = b;
    r->dfetch_len = len;
    return b;
}

/* The phases of one check, for REFIT_DIGEST_TRACE (docs/env.md). */
typedef struct {
    double plan_ms, fetch_ms, sums_ms, compare_ms;
    const char *how;
} dprof_t;

#ifdef REFIT_HAVE_CUDA
/* REFIT_DIGEST_GPU=host|separate (a measurement knob): 2 = the entries pulled
 * to the host and compared there, the sums a pass of their own; 1 = compared
 * on the GPU, the sums a pass of their own; 0 = the default (compared on the
 * GPU, the sums made by the copy kernel where it can). */
static int gpu_knob(void)
{
    const char *k = refit_diag()->digest_gpu;
    return !k ? 0 : !strcmp(k, "host") ? 2 : !strcmp(k, "separate") ? 1 : 0;
}

struct refit_gpu_digest *refit_rx_gpu_hasher(refit_receiver_t *r)
{
    if (!r->dkey || r->fp8 || r->params.device < 0 || gpu_knob() != 0) return NULL;
    if (!r->gdig && refit_gpu_digest_create(r->params.device, r->dkey, r->m, r->mem, false, &r->gdig)) {
        refit_log(REFIT_LOG_INFO, "%s: GPU digests: %s (hashed after the copy instead)", r->reader, refit_last_error());
        return NULL;
    }
    return r->gdig;
}

/* The check on the GPU: the entries read in place from the sources' tables
 * (GPU memory mapped through cuda_ipc), summed and compared with this
 * memory's sums by a kernel; one count comes back.  *handled false: a
 * source whose table this GPU cannot read in place (another transport,
 * another device), left to the pull of the entries.  On a mismatch r->dlocal
 * holds the sums and *handled is false too: the caller fetches the entries
 * and names what differs. */
static refit_status_t gpu_check(pull_t *p, const refit_digest_fetch_t *f, size_t nf, bool *handled,
                                refit_digest_report_t *dr, dprof_t *prof)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    *handled = false;
    const void **tables = calloc(r->world ? r->world : 1, sizeof(void *));
    const refit_transport_devmem_t **dm = calloc(r->world ? r->world : 1, sizeof(void *));
    refit_peer_t **peer = calloc(r->world ? r->world : 1, sizeof(void *));
    refit_status_t st = tables && dm && peer ? REFIT_OK : refit_error(REFIT_ERR_NO_MEMORY, "digests");
    double t0 = refit_now();
    bool can = !st;
    for (size_t i = 0; can && i < nf; i++) {
        uint32_t k = f[i].src;
        if (tables[k]) continue;
        if (p->tix[k] < 0) {
            st = refit_error(REFIT_ERR_PEER, "source rank %u holds digests this receiver needs and is unreachable", k);
            can = false;
            break;
        }
        dm[k] = refit_transport_devmem(r->ts.ops[p->tix[k]]);
        peer[k] = r->src[k].peer[p->tix[k]][p->s.recs[k].buffer];
        void *ptr = NULL;
        int dev = -1;
        can = dm[k] && peer[k] && !dm[k]->region(peer[k], (uint32_t)refit_rx_digest_region(r->src[k].m), &ptr, &dev) &&
              dev == r->params.device && ptr;
        tables[k] = ptr;
    }
    if (can && !r->gdig) st = refit_gpu_digest_create(r->params.device, r->dkey, r->m, r->mem, false, &r->gdig);
    if (can && !st && !cp->gchk) st = refit_gpu_digest_check_create(r->gdig, cp->dplan, r->world, &cp->gchk);
    prof->plan_ms += (refit_now() - t0) * 1e3;
    uint64_t bad = 0;
    if (can && !st) {
        double t1 = refit_now();
        st = refit_gpu_digest_verify_run(r->gdig, cp->gchk, tables, p->gsummed, &bad, NULL, r->dlocal);
        /* words read from a process that died meanwhile prove nothing */
        for (uint32_t k = 0; !st && k < r->world; k++)
            if (tables[k]) st = dm[k]->alive(peer[k]);
        prof->compare_ms += (refit_now() - t1) * 1e3;
        prof->how = p->gsummed ? "gpu-fused" : "gpu";
    }
    if (can && !st && !bad) {
        refit_digest_plan_stats_t ps;
        refit_digest_plan_stats(cp->dplan, &ps);
        dr->checked = ps.verifiable;
        dr->bytes = ps.bytes - ps.unverifiable_bytes;
        *handled = true;
    }
    free(tables);
    free(dm);
    free(peer);
    return st;
}
#endif

/* cp->dregs: the read of the digest plan's fetches f[0, nf) (8 bytes each,
 * from each source's digest region, to i * 8 in the fetch buffer), entries
 * next to each other in one source's table as one run.  Built at the first
 * check of a digest plan and kept while every source's digest region is
 * where it was (a steady refit reads the same entries every version: tens of
 * thousands of them, whose regions cost as much to make as to read). */
static refit_status_t fetch_regions(pull_t *p, const refit_digest_fetch_t *f, size_t nf)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    if (!nf) return REFIT_OK;
    bool same = cp->dregs != NULL && cp->dnf == nf;
    for (uint32_t k = 0; same && k < r->world; k++) same = cp->dregion[k] == refit_rx_digest_region(r->src[k].m);
    if (same) return REFIT_OK;
    drop_fetch_regions(cp);
    cp->dregs = calloc(nf, sizeof(*cp->dregs));
    cp->dregion = calloc(r->world ? r->world : 1, sizeof(*cp->dregion));
    if (!cp->dregs || !cp->dregion) {
        drop_fetch_regions(cp);
        return refit_error(REFIT_ERR_NO_MEMORY, "digest entries");
    }
    for (uint32_t k = 0; k < r->world; k++) cp->dregion[k] = refit_rx_digest_region(r->src[k].m);
    cp->dnf = nf;
    for (size_t i = 0; i < nf; i++) {
        refit_plan_region_t *last = cp->ndregs ? &cp->dregs[cp->ndregs - 1] : NULL;
        if (last && last->src == f[i].src && last->src_offset + last->run == f[i].offset) {
            last->run += 8;
            continue;
        }
        if (cp->dregion[f[i].src] < 0) { /* digest_sources keeps only sources that publish digests */
            drop_fetch_regions(cp);
            return refit_error(REFIT_ERR_INTERNAL, "digest entries from source rank %u, which has no digest table",
                               f[i].src);
        }
        cp->dregs[cp->ndregs++] = (refit_plan_region_t){.src = f[i].src,
                                                        .src_region = (uint32_t)cp->dregion[f[i].src],
                                                        .src_offset = f[i].offset,
                                                        .dst_offset = i * 8,
                                                        .run = 8};
    }
    return REFIT_OK;
}

/* Fetches the entries (from the sources' digest regions), hashes this
 * memory and compares; the report's digest counts. */
static refit_status_t digest_fetch_check(pull_t *p, const refit_digest_fetch_t *f, size_t nf, dprof_t *prof)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    refit_status_t st = REFIT_OK;
    /* This memory: the staging when the pull went through it (GPU), hashed
     * here; else the receiver's own, host memory here and GPU memory with
     * the GPU's kernels (the same sums).  A pull whose copies hashed every
     * mapped byte as they wrote it left the sums in r->dlocal already
     * (docs/digest.md); any other is hashed here, in a pass over the memory.
     * An FP8 receiver's GPU memory holds its FP8 arena, not the bf16 layout
     * the sources' digests are of: not checked here. */
    bool host = r->params.device < 0 || r->pull_staged, checked = host || (HAVE_GPU_DIGESTS && !r->fp8);
    void *const *mem = r->params.device >= 0 ? r->stage : r->mem;
    bool fused = host && refit_rx_digests_fused(p);
    refit_digest_report_t dr = {0};
    bool done = false, summed = false; /* checked on the GPU; r->dlocal holds the GPU's sums */
#ifdef REFIT_HAVE_CUDA
    if (!host && checked && gpu_knob() < 2) {
        st = gpu_check(p, f, nf, &done, &dr, prof);
        fused = done && p->gsummed;
        summed = !st && !done && prof->how; /* a mismatch: the sums came back */
    }
#endif
    unsigned char *fetched = NULL;
    double t0 = refit_now();
    if (!st && !done) {
        fetched = fetch_buffer(r, nf);
        if (!fetched) st = refit_error(REFIT_ERR_NO_MEMORY, "digest entries");
        else st = fetch_regions(p, f, nf);
    }
    for (size_t i = 0; i < p->cp->ndregs && !st && !done; i++) {
        uint32_t k = p->cp->dregs[i].src;
        if (p->tix[k] < 0)
            st = refit_error(REFIT_ERR_PEER, "source rank %u holds digests this receiver needs and is unreachable", k);
    }
    refit_pull_report_t scratch = {0};
    void *bufs[1] = {fetched};
    if (!st && !done && nf) st = refit_rx_raw_pull(p, p->cp->dregs, p->cp->ndregs, bufs, &scratch);
    double t1 = refit_now();
    if (!done) prof->fetch_ms += (t1 - t0) * 1e3;
    if (!st && !done && host && !fused)
        st = refit_digest_local(r->dkey, r->m, (const void *const *)mem, r->dlocal, r->params.threads);
    if (!st && !done && !host && checked && !summed) st = gpu_sums(r);
    double t2 = refit_now();
    if (!done) prof->sums_ms += (t2 - t1) * 1e3;
    if (!st && !done && checked) st = refit_digest_check(p->cp->dplan, fetched, r->dlocal, &dr);
    if (!done) {
        prof->compare_ms += (refit_now() - t2) * 1e3;
        if (!prof->how) prof->how = host ? (fused ? "host-fused" : "host") : "gpu-sums-host-compare";
    }
    if (!st && host) r->dsum_version = p->v; /* the sums of what the memory holds now: a delta updates them */
    if (st == REFIT_ERR_VERIFY)
        refit_error_prefix("version %" PRIu64 " does not match what its publishers published", p->v);
    refit_digest_plan_stats_t ps;
    refit_digest_plan_stats(p->cp->dplan, &ps);
    rep->digest_bytes = checked ? dr.bytes : 0;
    rep->digest_fused = fused;
    rep->unverified_bytes = checked ? ps.unverifiable_bytes : ps.bytes + ps.unverifiable_bytes;
    return st;
}

bool refit_rx_digests_fused(const pull_t *p)
{
    uint64_t mapped = refit_digest_map_bytes(p->r->dmap);
    if (p->rep && p->rep->path == REFIT_RX_PATH_DELTA) return p->ddelta;
    bool host = p->rep && (p->rep->path == REFIT_RX_PATH_HOST_DIRECT || p->rep->path == REFIT_RX_PATH_HOST_FLEET);
    return host && mapped && p->dhashed == mapped;
}

/* REFIT_DIGEST_TRACE=FILE: one line per check with its phases (ms). */
static void trace_check(const pull_t *p, const dprof_t *prof, size_t nf, refit_status_t st)
{
    const char *path = refit_diag()->digest_trace;
    FILE *out = path ? fopen(path, "a") : NULL;
    if (!out) return;
    fprintf(out,
            "digest pid %d reader %s version %" PRIu64 " how %s entries %zu plan %.3f fetch %.3f sums %.3f "
            "compare %.3f total %.3f status %d\n",
            (int)getpid(), p->r->reader, p->v, prof->how ? prof->how : "-", nf, prof->plan_ms, prof->fetch_ms,
            prof->sums_ms, prof->compare_ms, p->rep->digest_ms, (int)st);
    fclose(out);
}

/* Checks this memory against the sources' content digests: hash it, fetch
 * the table entries the digest plan names (connecting sources the transfer
 * did not read: relays served it), compare.  REFIT_ERR_VERIFY names the
 * first tensor that differs.  Bytes no digest covers are counted as
 * unverified (and said once per plan at INFO). */
refit_status_t refit_rx_digest_verify(pull_t *p)
{
    refit_receiver_t *r = p->r;
    const snapshot_t *s = &p->s;
    double t0 = refit_now();
    uint8_t *usable = calloc(r->world ? r->world : 1, 1);
    const refit_manifest_t **srcs = calloc(r->world ? r->world : 1, sizeof(void *));
    refit_status_t st = usable && srcs ? REFIT_OK : refit_error(REFIT_ERR_NO_MEMORY, "digests");
    for (uint32_t k = 0; !st && k < r->world; k++) {
        srcs[k] = r->src[k].m;
        usable[k] = s->present[k] && s->alive[k] && s->recs[k].version == p->v && r->src[k].m &&
                    s->recs[k].incarnation == r->src[k].incarnation && refit_rx_digest_region(r->src[k].m) >= 0;
    }
    size_t nf = 0;
    const refit_digest_fetch_t *f = NULL;
    dprof_t prof = {0};
    if (!st && !(st = digest_sources(p, srcs, usable, &f, &nf))) {
        prof.plan_ms = (refit_now() - t0) * 1e3;
        st = digest_fetch_check(p, f, nf, &prof);
    }
    free(usable);
    free(srcs);
    p->rep->digest_ms = (refit_now() - t0) * 1e3;
    trace_check(p, &prof, nf, st);
    return st;
}

/* The records the registry holds now: a second look at what a stamp said.
 * Free *now with refit_rx_snapshot_free whatever this returns. */
static refit_status_t records_now(pull_t *p, snapshot_t *now)
{
    refit_receiver_t *r = p->r;
    if (refit_rx_snapshot_alloc(now, r->world)) return refit_error(REFIT_ERR_NO_MEMORY, "stamps");
    return refit_registry_records(r->reg, r->group, r->world, now->recs, now->present);
}

/* A source whose stamp says it has published `head` > v, pulled as the
 * newest: the registry must show that too (else its record was put back). */
static refit_status_t check_heads(pull_t *p, const uint64_t *head)
{
    snapshot_t now;
    refit_status_t st = records_now(p, &now);
    for (uint32_t k = 0; !st && k < p->r->world; k++) {
        if (head[k] <= p->v) continue;
        if (!now.present[k]) {
            st = refit_error(REFIT_ERR_STALE,
                             "source rank %u has published version %" PRIu64
                             " and its record is gone from the registry: version %" PRIu64 " not pulled",
                             k, head[k], p->v);
            break;
        }
        uint64_t said = now.recs[k].version;
        if (said < head[k])
            st = refit_error(REFIT_ERR_REPLAY,
                             "source rank %u has published version %" PRIu64 ", but the registry's record for it "
                             "says %" PRIu64 " (a replayed or rolled-back record): version %" PRIu64
                             " is not the newest",
                             k, head[k], said, p->v);
    }
    refit_rx_snapshot_free(&now);
    return st;
}

/* Source k's buffer holds `now`, newer than the record read: a replayed
 * record, unless the registry now shows that version too (the source moved
 * on during this pull: a lease that lapsed, a store that lost it). */
static refit_status_t moved_on(pull_t *p, uint32_t k, uint64_t now, const char *when)
{
    char detail[1024];
    snprintf(detail, sizeof(detail), "%s", refit_last_error());
    snapshot_t again;
    bool moved = !records_now(p, &again) && again.present[k] && again.recs[k].version >= now;
    refit_rx_snapshot_free(&again);
    if (moved)
        return refit_error(REFIT_ERR_STALE,
                           "%s: source rank %u moved on to version %" PRIu64 " during the pull of %" PRIu64
                           " (its readers' leases lapsed or were lost): not committed",
                           when, k, now, p->v);
    return refit_error(REFIT_ERR_REPLAY, "%s", detail);
}

/* After the transfer, source k's connection failed (a holder the fleet dropped after it had served chunks,
 * its other chunks read from its replicas): connect to it again, so that its stamp can still be read. */
static refit_status_t reconnect(pull_t *p, uint32_t k)
{
    refit_receiver_t *r = p->r;
    refit_log(REFIT_LOG_INFO, "%s: stamp of source rank %u after the transfer: %s; connecting again", r->reader, k,
              refit_last_error());
    refit_rx_drop_peers(r, &r->src[k]);
    p->tix[k] = -1;
    refit_status_t st = refit_rx_connect_recorded(r, &p->s, k, &p->tix[k]);
    if (st) refit_error_prefix("source rank %u served bytes of this pull, then its connection failed", k);
    return st;
}

refit_status_t refit_rx_check_stamps(pull_t *p, bool after)
{
    refit_receiver_t *r = p->r;
    const snapshot_t *s = &p->s;
    double t0 = refit_now();
    refit_status_t st = REFIT_OK;
    const char *when = after ? "after the transfer" : "before the transfer";
    uint32_t n = 0, unstamped = 0;
    refit_plan_region_t *regs = calloc(r->world ? r->world : 1, sizeof(*regs));
    unsigned char *buf = calloc(r->world ? r->world : 1, REFIT_STAMP_BYTES);
    uint64_t *head = calloc(r->world ? r->world : 1, sizeof(uint64_t));
    if (!regs || !buf || !head) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "stamps");
        goto out;
    }
    for (uint32_t k = 0; k < r->world; k++) {
        if (!s->present[k] || !s->alive[k] || s->recs[k].version != p->v || !r->src[k].m) continue;
        int64_t sr = refit_rx_stamp_region(r->src[k].m);
        if (sr < 0) {
            unstamped++;
            continue;
        }
        /* After: the sources read (data, arenas, digest entries); a replica
         * left behind in a failover gave nothing.  Before: every source
         * holding v; one that cannot be reached now gives no bytes either,
         * and what a later read took from it is checked by the read after. */
        if (after && p->tix[k] < 0) continue;
        if (p->tix[k] < 0 && refit_rx_connect_recorded(r, s, k, &p->tix[k])) {
            refit_log(REFIT_LOG_INFO, "%s: stamp of source rank %u %s: unreachable (%s)", r->reader, k, when,
                      refit_last_error());
            p->tix[k] = -1;
            continue;
        }
        regs[n] = (refit_plan_region_t){.src = k,
                                        .src_region = (uint32_t)sr,
                                        .dst_offset = (uint64_t)n * REFIT_STAMP_BYTES,
                                        .run = REFIT_STAMP_BYTES};
        n++;
    }
    refit_pull_report_t scratch = {0};
    void *bufs[1] = {buf};
    int broken = after ? refit_test_stamp_broken() : -1; /* a test: this source's connection failed */
    if (n && broken < 0) st = refit_rx_raw_pull(p, regs, n, bufs, &scratch);
    if (n && (st || broken >= 0)) {
        /* One by one.  Before: a source that died since it was last
         * connected (a replica the transfer can do without) is left to the
         * transfer's failover, as it was before stamps.  After: a source whose
         * connection failed during the transfer (a DP replica the fleet
         * dropped after it had served chunks; seen once over UCX/TCP on a
         * loaded host) is connected again and read: a publisher clears its
         * stamp before it rewrites, so the stamp read now still covers what
         * it served; one that cannot be read fails the pull. */
        uint32_t kept = 0;
        st = REFIT_OK;
        for (uint32_t i = 0; i < n && !st; i++) {
            refit_plan_region_t one = regs[i];
            one.dst_offset = (uint64_t)kept * REFIT_STAMP_BYTES;
            refit_status_t e = (int64_t)one.src == broken
                                   ? refit_error(REFIT_ERR_PEER, "its connection failed (a test hook)")
                                   : refit_rx_raw_pull(p, &one, 1, bufs, &scratch);
            if (e == REFIT_ERR_PEER && after && !(e = reconnect(p, one.src)))
                e = refit_rx_raw_pull(p, &one, 1, bufs, &scratch);
            if (e && after) {
                st = e;
                break;
            }
            if (e) {
                refit_log(REFIT_LOG_INFO, "%s: stamp of source rank %u %s: %s", r->reader, one.src, when,
                          refit_last_error());
                continue;
            }
            regs[kept++] = one;
        }
        n = kept;
    }
    if (st) {
        refit_error_prefix("reading the version stamps %s", when);
        goto out;
    }
    bool newer = false;
    for (uint32_t i = 0; i < n && !st; i++) {
        uint32_t k = regs[i].src;
        refit_stamp_t stamp;
        if ((st = refit_stamp_decode(buf + (size_t)i * REFIT_STAMP_BYTES, k, &stamp))) break;
        if ((st = refit_stamp_matches(&stamp, &s->recs[k], k, when)) == REFIT_ERR_REPLAY &&
            stamp.version > s->recs[k].version)
            st = moved_on(p, k, stamp.version, when);
        head[k] = stamp.head;
        newer |= stamp.head > p->v;
    }
    if (!st && newer && p->want == REFIT_VERSION_NEWEST) st = check_heads(p, head);
    if (p->rep) p->rep->unstamped_sources = unstamped;
out:
    free(regs);
    free(buf);
    free(head);
    if (p->rep) p->rep->stamp_ms += (refit_now() - t0) * 1e3;
    return st;
}

static refit_status_t digests_check(void *user, const refit_verify_mem_t *mem)
{
    (void)mem; /* the pull's receiver memory, which the pull names too */
    return refit_rx_digest_verify(user);
}

const refit_verifier_t refit_rx_digests = {.name = "digests", .check = digests_check};

refit_status_t refit_rx_verify(refit_receiver_t *r, uint64_t v, const refit_verifier_t *check, void *user)
{
    refit_verify_mem_t mem = {.m = r->m,
                              .fp8 = r->fp8,
                              .device = r->params.device,
                              .bases = (const void *const *)r->mem,
                              .version = v,
                              .fraction = r->params.truth_fraction};
    return check->check(user, &mem);
}
