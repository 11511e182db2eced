/* Receivers, the delta path (host memory, or a GPU receiver's pinned
 * staging): when every source the plan reads offers a delta from exactly
 * what this memory holds, fetch each source region's chunk table, check
 * that it takes this memory from the committed version to v, fetch the
 * payloads of the chunks the plan reads and apply them in place.  Nothing
 * is written unless the deltas are all in hand and sound; an error while
 * applying leaves the memory marked unusable (the caller then pulls in full,
 * which rewrites every byte). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/delta_hashed.h"
#include "engine/receiver_internal.h"

bool refit_rx_delta_eligible(const pull_t *p)
{
    const refit_receiver_t *r = p->r;
    const snapshot_t *s = &p->s;
    const refit_plan_t *plan = p->cp->plan;
    /* The committed version, from the same publisher incarnation (a restarted
     * trainer may publish a version number again with other bytes). */
    if (r->params.no_delta || !r->committed || !r->usable || p->v <= r->committed) return false;
    /* GPU memory: the delta applies to the pinned staging when that holds
     * the committed version whole (it came through it), then goes up. */
    if (r->params.device >= 0 && r->stage_version != r->committed) return false;
    bool any = false;
    for (uint32_t k = 0; k < r->world; k++) {
        if (!refit_plan_source_bytes(plan, k)) continue;
        if (s->recs[k].delta_base != r->committed || s->recs[k].incarnation != r->committed_inc[k] || !r->src[k].m ||
            !refit_rx_delta_regions(r->src[k].m))
            return false;
        any = true;
    }
    return any;
}

/* The source regions the plan reads, each with its delta index (once per plan). */
static refit_status_t delta_sources(refit_receiver_t *r, cached_plan_t *cp)
{
    if (cp->dsrc) return REFIT_OK;
    size_t n;
    const refit_plan_region_t *regs = refit_plan_regions(cp->plan, &n);
    delta_src_t *d = NULL;
    uint32_t nd = 0;
    refit_status_t st = REFIT_OK;
    for (size_t i = 0; i < n && !st; i++) {
        uint32_t j = 0;
        while (j < nd && (d[j].src != regs[i].src || d[j].region != regs[i].src_region)) j++;
        if (j < nd) continue;
        delta_src_t *g = realloc(d, (nd + 1) * sizeof(*d));
        if (!g) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "delta indices");
            break;
        }
        d = g;
        d[nd] = (delta_src_t){.src = regs[i].src, .region = regs[i].src_region};
        const refit_manifest_t *m = r->src[regs[i].src].m;
        if (!m || regs[i].src_region >= m->regions.len)
            st = refit_error(REFIT_ERR_INTERNAL, "the plan reads region %u of source %u, which has no manifest",
                             regs[i].src_region, regs[i].src);
        else
            st = refit_delta_index_create(cp->plan, regs[i].src, regs[i].src_region,
                                          m->regions.data[regs[i].src_region], &d[nd].ix);
        nd++;
    }
    if (st) {
        for (uint32_t j = 0; j < nd; j++) refit_delta_index_destroy(d[j].ix);
        free(d);
        return st;
    }
    cp->dsrc = d;
    cp->ndsrc = nd;
    return REFIT_OK;
}

/* Grows d's fetch buffer to at least n bytes. */
static refit_status_t wire_reserve(delta_src_t *d, uint64_t n)
{
    if (d->cap >= n) return REFIT_OK;
    unsigned char *w = realloc(d->wire, n);
    if (!w) return refit_error(REFIT_ERR_NO_MEMORY, "delta of source %u: %" PRIu64 " bytes", d->src, n);
    d->wire = w;
    d->cap = n;
    return REFIT_OK;
}

/* Appends one fetch to *regs (growing it). */
static refit_status_t push_region(refit_plan_region_t **regs, size_t *n, size_t *cap, refit_plan_region_t reg)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        refit_plan_region_t *g = realloc(*regs, nc * sizeof(**regs));
        if (!g) return refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
        *regs = g;
        *cap = nc;
    }
    (*regs)[(*n)++] = reg;
    return REFIT_OK;
}

/* Connects every source the deltas come from (host memory only: the deltas
 * apply there); rep->sources, rep->connect_ms. */
static refit_status_t delta_connect(pull_t *p)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    double tc = refit_now();
    for (uint32_t k = 0; k < r->world; k++) p->tix[k] = -1;
    p->rep->sources = 0;
    for (uint32_t j = 0; j < cp->ndsrc; j++) {
        uint32_t k = cp->dsrc[j].src;
        if (p->tix[k] >= 0) continue;
        refit_status_t st = refit_rx_connect_recorded(r, &p->s, k, &p->tix[k]);
        if (st) return st;
        if (!(refit_transport_caps(r->ts.ops[p->tix[k]]) & REFIT_TCAP_HOST_DST))
            return refit_error(REFIT_ERR_TRANSPORT, "transport %s cannot write host memory",
                               r->ts.ops[p->tix[k]]->name);
        p->rep->sources++;
    }
    p->rep->connect_ms = (refit_now() - tc) * 1e3;
    return REFIT_OK;
}

/* 1. Headers and chunk tables (their size follows from the region's), each
 * into its source region's buffer (bufs[j]); regs: room for one fetch each. */
static refit_status_t fetch_tables(pull_t *p, void **bufs, refit_plan_region_t *regs)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    refit_status_t st;
    for (uint32_t j = 0; j < cp->ndsrc; j++) {
        delta_src_t *d = &cp->dsrc[j];
        const refit_manifest_t *m = r->src[d->src].m;
        if ((st = wire_reserve(d, refit_delta_table_bytes(m->regions.data[d->region])))) return st;
        bufs[j] = d->wire;
        regs[j] = (refit_plan_region_t){.src = d->src,
                                        .src_region = (uint32_t)m->regions.len + d->region,
                                        .dst_region = j,
                                        .run = refit_delta_table_bytes(m->regions.data[d->region])};
    }
    return refit_rx_raw_pull(p, regs, cp->ndsrc, bufs, p->rep);
}

/* 2. Source region j's table must take `committed` to v, for this region's
 * size; *total: the bytes of its delta (the buffer grown to them). */
static refit_status_t check_table(pull_t *p, uint32_t j, uint64_t *total)
{
    refit_receiver_t *r = p->r;
    delta_src_t *d = &p->cp->dsrc[j];
    uint64_t rb = r->src[d->src].m->regions.data[d->region], tb = refit_delta_table_bytes(rb);
    refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
    refit_status_t st = refit_delta_info(d->wire, tb, &info);
    if (st) {
        refit_error_prefix("delta of source rank %u region %u", d->src, d->region);
        return st;
    }
    if (info.base_version != r->committed || info.version != p->v || info.region_bytes != rb ||
        info.header_bytes != tb || info.total_bytes > tb + rb)
        return refit_error(REFIT_ERR_STALE,
                           "source rank %u region %u offers a delta from %" PRIu64 " to %" PRIu64 " (%" PRIu64
                           " bytes of %" PRIu64 "); wanted %" PRIu64 " to %" PRIu64,
                           d->src, d->region, info.base_version, info.version, info.total_bytes, info.region_bytes,
                           r->committed, p->v);
    *total = info.total_bytes;
    return wire_reserve(d, *total);
}

/* 3. The payloads of the chunks the plan reads from source region j
 * (neighbours merged), appended to *regs. */
static refit_status_t payload_fetches(pull_t *p, uint32_t j, refit_plan_region_t **regs, size_t *nregs, size_t *capregs)
{
    delta_src_t *d = &p->cp->dsrc[j];
    const refit_manifest_t *m = p->r->src[d->src].m;
    uint64_t nch;
    const uint8_t *need = refit_delta_index_need(d->ix, &nch);
    uint64_t lo = 0, hi = 0;
    refit_status_t st = REFIT_OK;
    for (uint64_t c = 0; c <= nch && !st; c++) {
        uint64_t off = 0, len = 0;
        if (c < nch && need[c]) refit_delta_chunk_payload(d->wire, c, &off, &len);
        if (len && off == hi && hi > lo) {
            hi += len;
            continue;
        }
        if (hi > lo)
            st = push_region(regs, nregs, capregs,
                             (refit_plan_region_t){.src = d->src,
                                                   .src_region = (uint32_t)m->regions.len + d->region,
                                                   .src_offset = lo,
                                                   .dst_region = j,
                                                   .dst_offset = lo,
                                                   .run = hi - lo});
        lo = off;
        hi = off + len;
    }
    return st;
}

/* 4. Apply: from here the memory holds a partial version until committed
 * (GPU memory: the staging, then copied up). */
static refit_status_t delta_apply(pull_t *p, const uint64_t *total)
{
    refit_receiver_t *r = p->r;
    refit_pull_report_t *rep = p->rep;
    cached_plan_t *cp = p->cp;
    refit_status_t st = REFIT_OK;
    refit_relays_withdraw(r->relays, (int)r->params.lease_ms);
    r->usable = false;
    r->stage_version = 0; /* the staging is being written too (GPU) */
    bool gpu = r->params.device >= 0;
    void *const *dst = gpu ? r->stage : r->mem;
    /* The sums of the committed version's memory, updated by every byte the
     * apply writes (docs/digest.md): the check then reads nothing again. */
    const refit_digest_map_t *map = r->dsum_version == r->committed ? r->dmap : NULL;
    r->dsum_version = 0;
    for (uint32_t j = 0; j < cp->ndsrc && !st; j++) {
        refit_delta_apply_stats_t as = REFIT_DELTA_APPLY_STATS_INIT;
        st = refit_delta_apply_hashed(cp->dsrc[j].ix, cp->dsrc[j].wire, total[j], r->committed, dst, r->params.threads,
                                      &as, map, r->dlocal);
        if (st)
            refit_error_prefix("applying the delta of source rank %u region %u", cp->dsrc[j].src, cp->dsrc[j].region);
        rep->delta_units += as.units_written + as.bytes_written / 2;
    }
    for (uint32_t i = 0; gpu && !st && i < r->nregions; i++)
        st = r->dom->copy(r->mem[i], r->stage[i], r->m->regions.data[i]);
    if (gpu && !st) refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", "(via pinned host staging)");
    if (gpu) r->pull_staged = true;
    p->ddelta = !st && map;
    if (!st) {
        rep->delta_base = r->committed;
        refit_rx_append(rep->lanes, sizeof(rep->lanes), " ", "(delta)");
    }
    return st;
}

refit_status_t refit_rx_delta_pull(pull_t *p)
{
    refit_receiver_t *r = p->r;
    cached_plan_t *cp = p->cp;
    refit_status_t st;
    r->nholders = 0; /* not a fleet pull: no holders to report */
    if ((st = delta_sources(r, cp)) || (st = delta_connect(p))) return st;
    uint32_t nd = cp->ndsrc;
    size_t nregs = 0, capregs = nd;
    void **bufs = calloc(nd, sizeof(void *));
    refit_plan_region_t *regs = calloc(nd ? nd : 1, sizeof(*regs));
    uint64_t *total = calloc(nd ? nd : 1, sizeof(uint64_t));
    if (!bufs || !regs || !total) st = refit_error(REFIT_ERR_NO_MEMORY, "delta fetch");
    p->rep->transport[0] = p->rep->lanes[0] = '\0';
    if (!st) st = fetch_tables(p, bufs, regs);
    for (uint32_t j = 0; j < nd && !st; j++) {
        if ((st = check_table(p, j, &total[j]))) break;
        bufs[j] = cp->dsrc[j].wire;
        st = payload_fetches(p, j, &regs, &nregs, &capregs);
    }
    if (!st && nregs) st = refit_rx_raw_pull(p, regs, nregs, bufs, p->rep);
    if (!st) st = delta_apply(p, total);
    free(total);
    free(regs);
    free(bufs);
    return st;
}
