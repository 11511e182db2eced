/* The publisher's table updated from the bytes that changed (refit_digest_table_update).
 *
 * The table is linear in the memory.  A unit of a placement's box at row i (counted from the box's first),
 * column t, that changes by d = new - old changes the row term of row i by r_l(i) * K_l[c + t] * d and the
 * column sum of column t by r_l(i) * d, so P[k] for every k > i and Q[k] for every k > t move by the prefix
 * of those changes.  A call sums, per placement the changed bytes meet, the row changes (dP) and the column
 * changes (dQ), then adds their prefix sums into the P and Q entries: the cost is that of the changed bytes
 * plus one pass over the table entries of the placements they meet, not a pass over the memory.
 *
 * A byte counts on its own: a unit's value is lo + 256 * (int8)hi, so a change of its low byte adds new_lo -
 * old_lo and a change of its high byte 256 * ((int8)new_hi - (int8)old_hi), exactly; a range may start or end
 * inside a unit, and two ranges that share a unit add up.  Runs of whole units go through the kernels
 * (digest_pub_row_any: +r over the new bytes, -r over the old ones gives the column changes, and its dots the
 * row's), single units through a scalar path that keeps the segment, the row key and the block multiplier of
 * the unit before (a sparse delta's changes arrive in address order). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/digest_internal.h"

/* Units below which a run is summed unit by unit rather than by the kernels. */
#define UPDATE_KERNEL_UNITS 32
/* Ranges ahead whose bytes are prefetched: 1% of a 329 MB shard changed as single units (one range each)
 * took 209 ms without, 70-85 ms with 16 ahead (64: 70-91, 256: 168-194; loaded host). */
#define UPDATE_PREFETCH 16

/* Bytes of one region that belong to one placement's box: rows [row0, row0 + nrows) of the box, row i at
 * start + (i - row0) * stride, each 2n bytes. */
typedef struct {
    uint64_t start, end; /* [start, end): the first row's first byte to the last row's end */
    uint64_t stride, row0, nrows;
    uint32_t pl, region;
} seg_t;

/* Per placement the changes met so far: dP[2 * i + l] (row terms, without prefix), dQ[l * n + t] (column
 * sums, before the column keys); NULL until a change meets it. */
typedef struct {
    uint32_t *dP, *dQ;
} pdelta_t;

typedef struct {
    const refit_digest_key_t *k;
    const refit_manifest_t *m;
    const uint8_t *const *bases, *const *old;
    cbox_t *boxes;
    uint64_t *tids;
    pdelta_t *pd;
    /* the scalar path's cursor: the row whose key is r, and the block whose multipliers are bm */
    uint32_t cur_pl;
    uint64_t cur_row, cur_blk;
    uint32_t r[2], bm[2];
    bool oom;
} upd_t;

static int seg_cmp(const void *a, const void *b)
{
    const seg_t *x = a, *y = b;
    if (x->region != y->region) return x->region < y->region ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

static bool touch(upd_t *U, uint32_t pl)
{
    pdelta_t *d = &U->pd[pl];
    if (d->dP) return true;
    d->dP = calloc(2 * REFIT_MAX(U->boxes[pl].nrows, 1), sizeof(uint32_t));
    d->dQ = calloc(2 * REFIT_MAX(U->boxes[pl].n, 1), sizeof(uint32_t));
    if (!d->dP || !d->dQ) {
        U->oom = true;
        return false;
    }
    return true;
}

/* Row key of row `row` (counted from the box's first) of placement pl, kept while the cursor stays there. */
static void row_key(upd_t *U, uint32_t pl, uint64_t row)
{
    if (U->cur_pl == pl && U->cur_row == row) return;
    uint64_t h = row_hash(U->k, U->tids[U->m->placements.data[pl].canon], U->boxes[pl].a + row);
    U->r[0] = (uint32_t)h | 1;
    U->r[1] = (uint32_t)(h >> 32) | 1;
    U->cur_pl = pl;
    U->cur_row = row;
}

/* Adds a change of d to unit t of row `row` of placement pl. */
static inline void unit_change(upd_t *U, uint32_t pl, uint64_t row, uint64_t t, uint32_t d)
{
    const cbox_t *b = &U->boxes[pl];
    uint64_t j = b->c + t;
    if (j >> KBITS != U->cur_blk) block_mult(U->k, U->cur_blk = j >> KBITS, U->bm);
    pdelta_t *pd = &U->pd[pl];
    size_t jj = (size_t)(j & (KCOLS - 1));
    for (int l = 0; l < 2; l++) {
        uint32_t rd = U->r[l] * d;
        pd->dP[2 * row + l] += rd * (U->bm[l] * (uint32_t)(int32_t)U->k->kc[l][jj]);
        pd->dQ[l * b->n + t] += rd;
    }
}

/* The changes of bytes [x, e) of row `row` of segment s (offsets inside the row, x < e <= 2n). */
static void row_piece(upd_t *U, const seg_t *s, uint64_t row, uint64_t x, uint64_t e)
{
    uint32_t pl = s->pl;
    if (!touch(U, pl)) return;
    row_key(U, pl, row);
    uint64_t base = s->start + (row - s->row0) * s->stride;
    const uint8_t *nw = U->bases[s->region] + base, *od = U->old[s->region] + base;
    if (x & 1) { /* a unit's high byte alone */
        unit_change(U, pl, row, x / 2, 256u * (uint32_t)((int32_t)(int8_t)nw[x] - (int32_t)(int8_t)od[x]));
        x++;
    }
    uint64_t u0 = x / 2, u1 = e / 2; /* whole units [u0, u1) */
    if (u1 > u0 && u1 - u0 >= UPDATE_KERNEL_UNITS) {
        const cbox_t *b = &U->boxes[pl];
        pdelta_t *pd = &U->pd[pl];
        uint32_t sn[2] = {0, 0}, so[2] = {0, 0};
        digest_pub_row_any(U->k, nw + 2 * u0, b->c + u0, u1 - u0, U->r[0], U->r[1], pd->dQ + u0, pd->dQ + b->n + u0,
                           sn);
        digest_pub_row_any(U->k, od + 2 * u0, b->c + u0, u1 - u0, 0u - U->r[0], 0u - U->r[1], pd->dQ + u0,
                           pd->dQ + b->n + u0, so);
        pd->dP[2 * row] += U->r[0] * (sn[0] - so[0]);
        pd->dP[2 * row + 1] += U->r[1] * (sn[1] - so[1]);
    } else {
        for (uint64_t t = u0; t < u1; t++) {
            uint16_t a, c;
            memcpy(&a, nw + 2 * t, 2);
            memcpy(&c, od + 2 * t, 2);
            if (a != c) unit_change(U, pl, row, t, (uint32_t)((int32_t)(int16_t)a - (int32_t)(int16_t)c));
        }
    }
    if (e & 1) /* a unit's low byte alone */
        unit_change(U, pl, row, e / 2, (uint32_t)((int32_t)nw[e - 1] - (int32_t)od[e - 1]));
}

/* The changes of region bytes [lo, hi) inside segment s. */
static void seg_piece(upd_t *U, const seg_t *s, uint64_t lo, uint64_t hi)
{
    uint64_t rowb = 2 * U->boxes[s->pl].n;
    uint64_t row = s->row0 + (lo - s->start) / s->stride;
    for (uint64_t at = lo; at < hi && row < s->row0 + s->nrows; row++) {
        uint64_t rs = s->start + (row - s->row0) * s->stride;
        if (at < rs) at = rs; /* a gap between rows (stride > row bytes): not this placement's */
        if (at >= hi) break;
        uint64_t e = REFIT_MIN(hi, rs + rowb);
        if (at < e) row_piece(U, s, row, at - rs, e - rs);
        at = rs + s->stride;
    }
}

refit_status_t refit_digest_table_update(const refit_digest_key_t *k, const refit_manifest_t *m,
                                         const void *const *bases, const void *const *old_bases,
                                         const refit_digest_range_t *ranges, size_t nranges, void *table)
{
    if (!k || !m || !bases || !old_bases || (!ranges && nranges) || (!table && refit_digest_table_bytes(m)))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_update: NULL argument");
    if (!m->finalized)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_update: manifest is not finalized");
    if ((uintptr_t)table % 8)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_update: table not 8-byte aligned");
    for (size_t x = 0; x < nranges; x++) {
        const refit_digest_range_t *g = &ranges[x];
        if (g->region >= m->regions.len || g->off > m->regions.data[g->region] ||
            g->len > m->regions.data[g->region] - g->off)
            return refit_error(REFIT_ERR_INVALID_ARG,
                               "refit_digest_table_update: range %zu (region %u, bytes %" PRIu64 "+%" PRIu64
                               ") is outside the manifest's regions",
                               x, g->region, g->off, g->len);
        if (g->len && (!bases[g->region] || !old_bases[g->region]))
            return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_table_update: region %u has no memory", g->region);
    }
    size_t np = m->placements.len;
    refit_status_t st = REFIT_OK;
    upd_t U = {.k = k,
               .m = m,
               .bases = (const uint8_t *const *)bases,
               .old = (const uint8_t *const *)old_bases,
               .cur_pl = UINT32_MAX,
               .cur_blk = 0,
               .bm = {1, 1}};
    uint64_t *offs = malloc(REFIT_MAX(np, 1) * sizeof(*offs));
    U.boxes = calloc(REFIT_MAX(np, 1), sizeof(*U.boxes));
    U.pd = calloc(REFIT_MAX(np, 1), sizeof(*U.pd));
    U.tids = digest_tensor_ids(k, m);
    REFIT_VEC(seg_t) segs = {0};
    if (!offs || !U.boxes || !U.pd || !U.tids) goto oom;
    refit_digest_table_offsets(m, offs);
    /* Segments: a box whose rows are contiguous is one, another a segment per row (rows of boxes side by
     * side interleave in memory, whole rows never overlap). */
    for (uint32_t i = 0; i < np; i++) {
        if (offs[i] == UINT64_MAX) continue;
        const refit_placement_t *p = &m->placements.data[i];
        cbox_of(&m->canon.data[p->canon], p, &U.boxes[i]);
        const cbox_t *b = &U.boxes[i];
        if (!b->nrows || !b->n) continue;
        uint64_t stride, off = digest_box_offset(m, p, &stride), rowb = 2 * b->n;
        uint32_t region = m->locals.data[p->local].region;
        if (b->nrows == 1 || stride == rowb) {
            seg_t s = {off, off + b->nrows * rowb, rowb, 0, b->nrows, i, region};
            if (REFIT_VEC_PUSH(&segs, s)) goto oom;
        } else {
            for (uint64_t r = 0; r < b->nrows; r++) {
                seg_t s = {off + r * stride, off + r * stride + rowb, stride, r, 1, i, region};
                if (REFIT_VEC_PUSH(&segs, s)) goto oom;
            }
        }
    }
    if (segs.len) qsort(segs.data, segs.len, sizeof(seg_t), seg_cmp);
    size_t cur = 0; /* the segment the last range ended in: ranges in address order need no search */
    for (size_t x = 0; x < nranges && !U.oom; x++) {
        const refit_digest_range_t *g = &ranges[x];
        uint64_t lo = g->off, hi = g->off + g->len;
        if (x + UPDATE_PREFETCH < nranges) { /* sparse changes miss the caches in both memories */
            const refit_digest_range_t *f = &ranges[x + UPDATE_PREFETCH];
            __builtin_prefetch(U.bases[f->region] + f->off);
            __builtin_prefetch(U.old[f->region] + f->off);
        }
        if (lo == hi) continue;
        if (!(cur < segs.len && segs.data[cur].region == g->region && segs.data[cur].start <= lo &&
              lo < segs.data[cur].end)) {
            /* the first segment of the region that ends after lo */
            size_t a = 0, z = segs.len;
            while (a < z) {
                size_t mid = a + (z - a) / 2;
                const seg_t *s = &segs.data[mid];
                if (s->region < g->region || (s->region == g->region && s->end <= lo)) a = mid + 1;
                else z = mid;
            }
            cur = a;
        }
        for (size_t y = cur; y < segs.len && segs.data[y].region == g->region && segs.data[y].start < hi; y++) {
            const seg_t *s = &segs.data[y];
            if (s->end <= lo) continue;
            seg_piece(&U, s, REFIT_MAX(lo, s->start), REFIT_MIN(hi, s->end));
            cur = y;
        }
    }
    if (U.oom) goto oom;
    /* The changes' prefix sums into P and Q; the row and column totals of a placement agree (both are
     * D(new) - D(old) of its box), else the memory changed during the call. */
    uint32_t *T = table;
    for (uint32_t i = 0; i < np; i++) {
        const pdelta_t *d = &U.pd[i];
        if (!d->dP) continue;
        const cbox_t *b = &U.boxes[i];
        uint32_t s0 = 0, s1 = 0, q0 = 0, q1 = 0, bm[2] = {1, 1};
        for (uint64_t r = 0; r < b->nrows; r++) {
            s0 += d->dP[2 * r];
            s1 += d->dP[2 * r + 1];
        }
        uint64_t blk = UINT64_MAX;
        for (uint64_t t = 0; t < b->n; t++) {
            uint64_t j = b->c + t;
            if (j >> KBITS != blk) block_mult(k, blk = j >> KBITS, bm);
            size_t jj = (size_t)(j & (KCOLS - 1));
            q0 += bm[0] * (uint32_t)(int32_t)k->kc[0][jj] * d->dQ[t];
            q1 += bm[1] * (uint32_t)(int32_t)k->kc[1][jj] * d->dQ[b->n + t];
        }
        if (q0 != s0 || q1 != s1) {
            st = refit_error(REFIT_ERR_INTERNAL,
                             "digest table update of %s rank %u: placement %u (%s) changes differently by rows and by "
                             "columns: the memory changed during the update",
                             m->layout, m->rank, i, m->canon.data[m->placements.data[i].canon].name);
            goto done;
        }
    }
    for (uint32_t i = 0; i < np; i++) {
        const pdelta_t *d = &U.pd[i];
        if (!d->dP) continue;
        const cbox_t *b = &U.boxes[i];
        uint32_t *P = T + offs[i] / 4, *Q = P + 2 * (b->nrows + 1);
        uint32_t s0 = 0, s1 = 0, bm[2] = {1, 1};
        for (uint64_t r = 0; r < b->nrows; r++) {
            s0 += d->dP[2 * r];
            s1 += d->dP[2 * r + 1];
            P[2 * (r + 1)] += s0;
            P[2 * (r + 1) + 1] += s1;
        }
        s0 = s1 = 0;
        uint64_t blk = UINT64_MAX;
        for (uint64_t t = 0; t < b->n; t++) {
            uint64_t j = b->c + t;
            if (j >> KBITS != blk) block_mult(k, blk = j >> KBITS, bm);
            size_t jj = (size_t)(j & (KCOLS - 1));
            s0 += bm[0] * (uint32_t)(int32_t)k->kc[0][jj] * d->dQ[t];
            s1 += bm[1] * (uint32_t)(int32_t)k->kc[1][jj] * d->dQ[b->n + t];
            Q[2 * (t + 1)] += s0;
            Q[2 * (t + 1) + 1] += s1;
        }
    }
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "digest table update of %s rank %u", m->layout, m->rank);
done:
    for (size_t i = 0; U.pd && i < np; i++) {
        free(U.pd[i].dP);
        free(U.pd[i].dQ);
    }
    REFIT_VEC_FREE(&segs);
    free(U.pd);
    free(U.boxes);
    free(U.tids);
    free(offs);
    return st;
}
