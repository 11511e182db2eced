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
 * the unit before (a sparse delta's changes arrive in address order).
 *
 * The same sums are kept by a refit_digest_changes_t across calls and workers: a delta publisher's encoder
 * notes each chunk's changed units while both versions' bytes are in its cache, one accumulator per encoder
 * thread, and the publisher then applies them to the table of the version before (publisher.c). */
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
 * sums, before the column keys); allocated when a change first meets it, zeroed (not freed) once applied. */
typedef struct {
    uint32_t *dP, *dQ;
    bool touched; /* since the last apply or reset */
} pdelta_t;

/* One worker's sums and cursors. */
typedef struct {
    pdelta_t *pd;
    REFIT_VEC(uint32_t) touched; /* the placements with touched set */
    const uint8_t *nw, *od;      /* the region of the note being summed: now, before */
    /* the scalar path's cursor: the row whose key is r, and the block whose multipliers are bm */
    uint32_t cur_pl;
    uint64_t cur_row, cur_blk;
    uint32_t r[2], bm[2];
    size_t cur; /* the segment the last note ended in: notes in address order need no search */
    bool failed;
} upd_t;

struct refit_digest_changes {
    const refit_digest_key_t *k;
    bool avx512; /* the key's kernel is AVX-512 and the CPU has DQ: digest_units_avx512 */
    const refit_manifest_t *m;
    cbox_t *boxes;
    uint64_t *tids, *offs;
    REFIT_VEC(seg_t) segs;
    upd_t *w[REFIT_DIGEST_CHANGES_WORKERS];
};

/* The lengths of a placement's dP and dQ (two lanes each). */
static inline size_t dp_len(const cbox_t *b) { return 2 * REFIT_MAX(b->nrows, 1); }
static inline size_t dq_len(const cbox_t *b) { return 2 * REFIT_MAX(b->n, 1); }

static int seg_cmp(const void *a, const void *b)
{
    const seg_t *x = a, *y = b;
    if (x->region != y->region) return x->region < y->region ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

static bool touch(const refit_digest_changes_t *C, upd_t *U, uint32_t pl)
{
    pdelta_t *d = &U->pd[pl];
    if (d->touched) return true;
    if (!d->dP) {
        d->dP = calloc(dp_len(&C->boxes[pl]), sizeof(uint32_t));
        d->dQ = calloc(dq_len(&C->boxes[pl]), sizeof(uint32_t));
    }
    if (!d->dP || !d->dQ || REFIT_VEC_PUSH(&U->touched, pl)) {
        U->failed = true;
        return false;
    }
    d->touched = true;
    return true;
}

/* Row key of row `row` (counted from the box's first) of placement pl, kept while the cursor stays there. */
static void row_key(const refit_digest_changes_t *C, upd_t *U, uint32_t pl, uint64_t row)
{
    if (U->cur_pl == pl && U->cur_row == row) return;
    uint64_t h = row_hash(C->k, C->tids[C->m->placements.data[pl].canon], C->boxes[pl].a + row);
    U->r[0] = (uint32_t)h | 1;
    U->r[1] = (uint32_t)(h >> 32) | 1;
    U->cur_pl = pl;
    U->cur_row = row;
}

/* Adds a change of d to unit t of row `row` of placement pl. */
static inline void unit_change(const refit_digest_changes_t *C, upd_t *U, uint32_t pl, uint64_t row, uint64_t t,
                               uint32_t d)
{
    const cbox_t *b = &C->boxes[pl];
    uint64_t j = b->c + t;
    if (j >> KBITS != U->cur_blk) block_mult(C->k, U->cur_blk = j >> KBITS, U->bm);
    pdelta_t *pd = &U->pd[pl];
    size_t jj = (size_t)(j & (KCOLS - 1));
    for (int l = 0; l < 2; l++) {
        uint32_t rd = U->r[l] * d;
        pd->dP[2 * row + l] += rd * (U->bm[l] * (uint32_t)(int32_t)C->k->kc[l][jj]);
        pd->dQ[l * b->n + t] += rd;
    }
}

/* The changes of bytes [x, e) of row `row` of segment s (offsets inside the row, x < e <= 2n). */
static void row_piece(const refit_digest_changes_t *C, upd_t *U, const seg_t *s, uint64_t row, uint64_t x, uint64_t e)
{
    uint32_t pl = s->pl;
    if (!touch(C, U, pl)) return;
    row_key(C, U, pl, row);
    uint64_t base = s->start + (row - s->row0) * s->stride;
    const uint8_t *nw = U->nw + base, *od = U->od + base;
    if (x & 1) { /* a unit's high byte alone */
        unit_change(C, U, pl, row, x / 2, 256u * (uint32_t)((int32_t)(int8_t)nw[x] - (int32_t)(int8_t)od[x]));
        x++;
    }
    uint64_t u0 = x / 2, u1 = e / 2; /* whole units [u0, u1) */
    if (u1 > u0 && u1 - u0 >= UPDATE_KERNEL_UNITS) {
        const cbox_t *b = &C->boxes[pl];
        pdelta_t *pd = &U->pd[pl];
        uint32_t sn[2] = {0, 0}, so[2] = {0, 0};
        digest_pub_row_any(C->k, nw + 2 * u0, b->c + u0, u1 - u0, U->r[0], U->r[1], pd->dQ + u0, pd->dQ + b->n + u0,
                           sn);
        digest_pub_row_any(C->k, od + 2 * u0, b->c + u0, u1 - u0, 0u - U->r[0], 0u - U->r[1], pd->dQ + u0,
                           pd->dQ + b->n + u0, so);
        pd->dP[2 * row] += U->r[0] * (sn[0] - so[0]);
        pd->dP[2 * row + 1] += U->r[1] * (sn[1] - so[1]);
    } else {
        for (uint64_t t = u0; t < u1; t++) {
            uint16_t a, c;
            memcpy(&a, nw + 2 * t, 2);
            memcpy(&c, od + 2 * t, 2);
            if (a != c) unit_change(C, U, pl, row, t, (uint32_t)((int32_t)(int16_t)a - (int32_t)(int16_t)c));
        }
    }
    if (e & 1) /* a unit's low byte alone */
        unit_change(C, U, pl, row, e / 2, (uint32_t)((int32_t)nw[e - 1] - (int32_t)od[e - 1]));
}

/* The changes of region bytes [lo, hi) inside segment s. */
static void seg_piece(const refit_digest_changes_t *C, upd_t *U, const seg_t *s, uint64_t lo, uint64_t hi)
{
    uint64_t rowb = 2 * C->boxes[s->pl].n;
    uint64_t row = s->row0 + (lo - s->start) / s->stride;
    for (uint64_t at = lo; at < hi && row < s->row0 + s->nrows; row++) {
        uint64_t rs = s->start + (row - s->row0) * s->stride;
        if (at < rs) at = rs; /* a gap between rows (stride > row bytes): not this placement's */
        if (at >= hi) break;
        uint64_t e = REFIT_MIN(hi, rs + rowb);
        if (at < e) row_piece(C, U, s, row, at - rs, e - rs);
        at = rs + s->stride;
    }
}

void refit_digest_changes_destroy(refit_digest_changes_t *C)
{
    if (!C) return;
    size_t np = C->m->placements.len;
    for (uint32_t w = 0; w < REFIT_DIGEST_CHANGES_WORKERS; w++) {
        upd_t *U = C->w[w];
        if (!U) continue;
        for (size_t i = 0; U->pd && i < np; i++) {
            free(U->pd[i].dP);
            free(U->pd[i].dQ);
        }
        free(U->pd);
        REFIT_VEC_FREE(&U->touched);
        free(U);
    }
    REFIT_VEC_FREE(&C->segs);
    free(C->boxes);
    free(C->tids);
    free(C->offs);
    free(C);
}

refit_status_t refit_digest_changes_create(const refit_digest_key_t *k, const refit_manifest_t *m,
                                           refit_digest_changes_t **out)
{
    if (!k || !m || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_changes_create: NULL argument");
    if (!m->finalized)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_changes_create: manifest is not finalized");
    size_t np = m->placements.len;
    refit_digest_changes_t *C = calloc(1, sizeof(*C));
    if (!C) goto oom;
    C->k = k;
    C->avx512 = digest_units_vectorised(k);
    C->m = m;
    C->offs = malloc(REFIT_MAX(np, 1) * sizeof(*C->offs));
    C->boxes = calloc(REFIT_MAX(np, 1), sizeof(*C->boxes));
    C->tids = digest_tensor_ids(k, m);
    if (!C->offs || !C->boxes || !C->tids) goto oom;
    refit_digest_table_offsets(m, C->offs);
    /* Segments: a box whose rows are contiguous is one, another a segment per row (rows of boxes side by
     * side interleave in memory, whole rows never overlap). */
    for (uint32_t i = 0; i < np; i++) {
        if (C->offs[i] == UINT64_MAX) continue;
        const refit_placement_t *p = &m->placements.data[i];
        cbox_of(&m->canon.data[p->canon], p, &C->boxes[i]);
        const cbox_t *b = &C->boxes[i];
        if (!b->nrows || !b->n) continue;
        uint64_t stride, off = digest_box_offset(m, p, &stride), rowb = 2 * b->n;
        uint32_t region = m->locals.data[p->local].region;
        if (b->nrows == 1 || stride == rowb) {
            seg_t s = {off, off + b->nrows * rowb, rowb, 0, b->nrows, i, region};
            if (REFIT_VEC_PUSH(&C->segs, s)) goto oom;
        } else {
            for (uint64_t r = 0; r < b->nrows; r++) {
                seg_t s = {off + r * stride, off + r * stride + rowb, stride, r, 1, i, region};
                if (REFIT_VEC_PUSH(&C->segs, s)) goto oom;
            }
        }
    }
    if (C->segs.len) qsort(C->segs.data, C->segs.len, sizeof(seg_t), seg_cmp);
    *out = C;
    return REFIT_OK;
oom:
    refit_digest_changes_destroy(C);
    return refit_error(REFIT_ERR_NO_MEMORY, "digest changes of %s rank %u", m->layout, m->rank);
}

/* The index of the first segment of `region` that ends after byte o (segments are sorted by region, then
 * start, and do not overlap); the number of segments when none does. */
static size_t first_ending_after(const refit_digest_changes_t *C, uint32_t region, uint64_t o)
{
    const seg_t *sg = C->segs.data;
    size_t a = 0, z = C->segs.len;
    while (a < z) {
        size_t mid = a + (z - a) / 2;
        if (sg[mid].region < region || (sg[mid].region == region && sg[mid].end <= o)) a = mid + 1;
        else z = mid;
    }
    return a;
}

static upd_t *worker(refit_digest_changes_t *C, unsigned w)
{
    if (C->w[w]) return C->w[w];
    upd_t *U = calloc(1, sizeof(*U));
    if (U && !(U->pd = calloc(REFIT_MAX(C->m->placements.len, 1), sizeof(*U->pd)))) {
        free(U);
        U = NULL;
    }
    if (U) {
        U->cur_pl = UINT32_MAX;
        U->bm[0] = U->bm[1] = 1;
    }
    return C->w[w] = U;
}

bool refit_digest_changes_note(refit_digest_changes_t *C, unsigned w, uint32_t region, uint64_t off, uint64_t len,
                               const void *now, const void *before)
{
    if (!C || w >= REFIT_DIGEST_CHANGES_WORKERS) return false;
    upd_t *U = worker(C, w);
    if (!U) return false;
    if (region >= C->m->regions.len || off > C->m->regions.data[region] || len > C->m->regions.data[region] - off ||
        (len && (!now || !before)))
        U->failed = true;
    if (U->failed || !len) return !U->failed;
    U->nw = now;
    U->od = before;
    uint64_t lo = off, hi = off + len;
    const seg_t *sg = C->segs.data;
    size_t ns = C->segs.len, cur = U->cur;
    if (!(cur < ns && sg[cur].region == region && sg[cur].start <= lo && lo < sg[cur].end))
        cur = first_ending_after(C, region, lo);
    for (size_t y = cur; y < ns && sg[y].region == region && sg[y].start < hi && !U->failed; y++) {
        if (sg[y].end <= lo) continue;
        seg_piece(C, U, &sg[y], REFIT_MAX(lo, sg[y].start), REFIT_MIN(hi, sg[y].end));
        cur = y;
    }
    U->cur = cur;
    return !U->failed;
}

/* The segment of `region` that holds byte o, from the cursor *cur on (a few steps forward, else a search);
 * NULL when no segment does (padding, a placement no digest covers). */
static const seg_t *seg_at(const refit_digest_changes_t *C, uint32_t region, uint64_t o, size_t *cur)
{
    const seg_t *sg = C->segs.data;
    size_t ns = C->segs.len, c = *cur;
    for (size_t step = 0; step < 4 && c < ns; step++, c++) {
        if (sg[c].region != region || sg[c].start > o) break;
        if (o < sg[c].end) {
            *cur = c;
            return &sg[c];
        }
    }
    size_t a = first_ending_after(C, region, o);
    if (a < ns && sg[a].region == region && sg[a].start <= o) {
        *cur = a;
        return &sg[a];
    }
    return NULL;
}

/* The changed units `units` [0, n) (offsets from `off`, in units) of segment s, whose rows are contiguous
 * (segments of more than one row are).  Each unit's row, column and row keys are computed on its own
 * (digest_unit_note), 16 units a vector with the AVX-512 kernel: at 1% changed a new row came every 2.4 units
 * (qwen3-30b-a3b-mini, Megatron EP2), so a cursor that kept a row's key saved little; it cost 13.8 ns a changed
 * unit, the scalar units 12.2, the AVX-512 kernel 6.2 (one thread; docs/digest.md). */
static void seg_units(const refit_digest_changes_t *C, upd_t *U, const seg_t *s, uint64_t off, const uint16_t *units,
                      uint32_t n)
{
    uint32_t pl = s->pl;
    if (!touch(C, U, pl)) return;
    const cbox_t *b = &C->boxes[pl];
    const uint8_t *nw = U->nw, *od = U->od;
    uint64_t bn = b->n;
    if (!digest_one_key_block(b->c, bn)) { /* its columns cross a key block: unit by unit */
        for (uint32_t x = 0; x < n; x++) {
            uint64_t o = off + 2 * (uint64_t)units[x], u = (o - s->start) / 2, row = s->row0 + u / bn;
            int16_t a, c;
            memcpy(&a, nw + o, 2);
            memcpy(&c, od + o, 2);
            row_key(C, U, pl, row);
            unit_change(C, U, pl, row, u % bn, (uint32_t)((int32_t)a - (int32_t)c));
        }
        return;
    }
    digest_units_t j = {
        .nwo = nw + off,
        .odo = od + off,
        .u0 = ((int64_t)off - (int64_t)s->start) / 2,
        .dP = U->pd[pl].dP + 2 * s->row0,
        .dq0 = U->pd[pl].dQ,
        .dq1 = U->pd[pl].dQ + bn,
    };
    digest_units_init(&j, C->k, C->tids[C->m->placements.data[pl].canon], b->a + s->row0, b->c, bn);
    uint32_t x = 0;
#if DIGEST_HAVE_AVX512
    /* The kernel reads the 2 bytes before each unit: the region's first unit goes alone. */
    if (C->avx512 && (s->end - s->start) / 2 < (1ull << 31)) {
        if (off + 2 * (uint64_t)units[0] < 2) digest_unit_note(&j, units[x++]);
        digest_units_avx512(&j, units + x, n - x);
        return;
    }
#endif
    for (; x < n; x++) digest_unit_note(&j, units[x]);
}

bool refit_digest_changes_note_units(refit_digest_changes_t *C, unsigned w, uint32_t region, uint64_t off,
                                     const uint16_t *units, uint32_t n, const void *now, const void *before)
{
    if (!C || w >= REFIT_DIGEST_CHANGES_WORKERS) return false;
    upd_t *U = worker(C, w);
    if (!U) return false;
    if (!n || U->failed) return !U->failed;
    if (!units || !now || !before || region >= C->m->regions.len || (off & 1) || off > C->m->regions.data[region] ||
        2 * ((uint64_t)units[n - 1] + 1) > C->m->regions.data[region] - off) {
        U->failed = true;
        return false;
    }
    U->nw = now;
    U->od = before;
    const seg_t *sg = C->segs.data;
    size_t ns = C->segs.len, cur = U->cur;
    for (uint32_t i = 0; i < n && !U->failed;) {
        uint64_t o = off + 2 * (uint64_t)units[i];
        const seg_t *s = seg_at(C, region, o, &cur);
        if (!s) { /* bytes no digest covers: on to the next segment's first */
            size_t a = first_ending_after(C, region, o);
            uint64_t next = a < ns && sg[a].region == region ? sg[a].start : UINT64_MAX;
            while (i < n && off + 2 * (uint64_t)units[i] < next) i++;
            continue;
        }
        if ((s->start | s->stride) & 1) { /* units that straddle the encoder's: byte by byte */
            seg_piece(C, U, s, o, o + 2);
            i++;
            continue;
        }
        uint64_t lim = (s->end - off) / 2; /* the units before the segment's end (both offsets even) */
        uint32_t j = i + 1;
        while (j < n && units[j] < lim) j++;
        seg_units(C, U, s, off, units + i, j - i);
        i = j;
    }
    U->cur = cur;
    return !U->failed;
}

/* Every worker's sums dropped (the arrays stay, zeroed). */
static void clear(refit_digest_changes_t *C)
{
    for (uint32_t w = 0; w < REFIT_DIGEST_CHANGES_WORKERS; w++) {
        upd_t *U = C->w[w];
        if (!U) continue;
        for (size_t x = 0; x < U->touched.len; x++) {
            uint32_t pl = U->touched.data[x];
            pdelta_t *d = &U->pd[pl];
            if (!d->touched) continue; /* applied: zeroed then */
            memset(d->dP, 0, dp_len(&C->boxes[pl]) * sizeof(uint32_t));
            memset(d->dQ, 0, dq_len(&C->boxes[pl]) * sizeof(uint32_t));
            d->touched = false;
        }
        U->touched.len = 0;
        U->failed = false;
        U->cur_pl = UINT32_MAX;
        U->cur = 0;
    }
}

void refit_digest_changes_reset(refit_digest_changes_t *C)
{
    if (C) clear(C);
}

/* Placement pl's changes, summed over every worker into the first that met it (its arrays); NULL if none. */
static pdelta_t *gather(refit_digest_changes_t *C, uint32_t pl)
{
    pdelta_t *into = NULL;
    size_t nr = dp_len(&C->boxes[pl]), nq = dq_len(&C->boxes[pl]);
    for (uint32_t w = 0; w < REFIT_DIGEST_CHANGES_WORKERS; w++) {
        upd_t *U = C->w[w];
        if (!U || !U->pd[pl].touched) continue;
        pdelta_t *d = &U->pd[pl];
        if (!into) {
            into = d;
            continue;
        }
        for (size_t i = 0; i < nr; i++) into->dP[i] += d->dP[i];
        for (size_t i = 0; i < nq; i++) into->dQ[i] += d->dQ[i];
        memset(d->dP, 0, nr * sizeof(uint32_t));
        memset(d->dQ, 0, nq * sizeof(uint32_t));
        d->touched = false;
    }
    return into;
}

refit_status_t refit_digest_changes_apply(refit_digest_changes_t *C, void *table)
{
    if (!C || (!table && refit_digest_table_bytes(C->m)))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_changes_apply: NULL argument");
    if ((uintptr_t)table % 8)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_changes_apply: table not 8-byte aligned");
    const refit_digest_key_t *k = C->k;
    const refit_manifest_t *m = C->m;
    size_t np = m->placements.len;
    refit_status_t st = REFIT_OK;
    for (uint32_t w = 0; w < REFIT_DIGEST_CHANGES_WORKERS; w++)
        if (C->w[w] && C->w[w]->failed) {
            st = refit_error(REFIT_ERR_NO_MEMORY,
                             "digest changes of %s rank %u: a note failed (out of memory, or a range outside its "
                             "region)",
                             m->layout, m->rank);
            goto done;
        }
    /* Per placement: the column sums times their keys (in place), the row and column totals, which agree (both
     * are D(new) - D(old) of its box) unless the memory changed while the changes were noted; then their prefix
     * sums into P and Q, zeroing the sums as they are read (one pass over them while they are in cache). */
    uint32_t *T = table;
    for (uint32_t i = 0; i < np; i++) {
        pdelta_t *d = gather(C, i);
        if (!d) continue;
        const cbox_t *b = &C->boxes[i];
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
            q0 += d->dQ[t] *= bm[0] * (uint32_t)(int32_t)k->kc[0][jj];
            q1 += d->dQ[b->n + t] *= bm[1] * (uint32_t)(int32_t)k->kc[1][jj];
        }
        if (q0 != s0 || q1 != s1) {
            st = refit_error(REFIT_ERR_INTERNAL,
                             "digest table update of %s rank %u: placement %u (%s) changes differently by rows and by "
                             "columns: the memory changed during the update",
                             m->layout, m->rank, i, m->canon.data[m->placements.data[i].canon].name);
            goto done;
        }
        uint32_t *P = T + C->offs[i] / 4, *Q = P + 2 * (b->nrows + 1);
        s0 = s1 = 0;
        for (uint64_t r = 0; r < b->nrows; r++) {
            s0 += d->dP[2 * r];
            s1 += d->dP[2 * r + 1];
            d->dP[2 * r] = d->dP[2 * r + 1] = 0;
            P[2 * (r + 1)] += s0;
            P[2 * (r + 1) + 1] += s1;
        }
        s0 = s1 = 0;
        for (uint64_t t = 0; t < b->n; t++) {
            s0 += d->dQ[t];
            s1 += d->dQ[b->n + t];
            d->dQ[t] = d->dQ[b->n + t] = 0;
            Q[2 * (t + 1)] += s0;
            Q[2 * (t + 1) + 1] += s1;
        }
        d->touched = false;
    }
done:
    clear(C);
    return st;
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
    refit_digest_changes_t *C;
    refit_status_t st = refit_digest_changes_create(k, m, &C);
    if (st) return st;
    const uint8_t *const *nb = (const uint8_t *const *)bases, *const *ob = (const uint8_t *const *)old_bases;
    for (size_t x = 0; x < nranges; x++) {
        const refit_digest_range_t *g = &ranges[x];
        if (x + UPDATE_PREFETCH < nranges) { /* sparse changes miss the caches in both memories */
            const refit_digest_range_t *f = &ranges[x + UPDATE_PREFETCH];
            __builtin_prefetch(nb[f->region] + f->off);
            __builtin_prefetch(ob[f->region] + f->off);
        }
        if (!refit_digest_changes_note(C, 0, g->region, g->off, g->len, nb[g->region], ob[g->region])) break;
    }
    st = refit_digest_changes_apply(C, table);
    refit_digest_changes_destroy(C);
    return st;
}
