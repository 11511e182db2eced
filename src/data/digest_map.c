/* The digest map (digest.h): a receiver's placements as byte ranges of its
 * regions with their canonical coordinates, so that a copy loop can hash
 * each piece it moves with the kernel's fused copy (refit_digest_copy_rows)
 * and add it to the placement's sum.
 *
 * A segment is nrows rows of rowb bytes, back to back in memory: a
 * placement whose rows are contiguous (row pitch = row bytes, or one row) is
 * one segment; one whose rows have gaps between them (a box narrower than
 * its local tensor) is a segment per row, so that segments never overlap and
 * a binary search finds the one under any offset.  A piece of a copy is cut
 * where segments start and end: bytes between segments (padding, placements
 * no digest covers) are copied plainly; inside a segment, a partial first
 * row, whole rows in one kernel call, a partial last row. */
#include <string.h>

#include "data/digest_internal.h"

typedef struct {
    uint64_t off;      /* first byte in the region */
    uint64_t rowb;     /* bytes per row (even) */
    uint64_t nrows;    /* rows, back to back */
    uint64_t tid, row; /* canonical tensor id, its first row */
    uint64_t unit;     /* first canonical unit of every row */
    uint32_t region, pl;
} seg_t;

typedef REFIT_VEC(seg_t) segs_t;

struct refit_digest_map {
    const refit_digest_key_t *k;
    seg_t *segs;
    size_t nsegs;
    size_t *rstart; /* nregions + 1: the segments of region r are [rstart[r], rstart[r+1]) */
    uint32_t nregions;
    uint64_t bytes;
    bool avx512; /* the key's kernel is AVX-512 and the CPU has DQ: digest_units_sum_avx512 */
};

static int cmp_seg(const void *x, const void *y)
{
    const seg_t *a = x, *b = y;
    if (a->region != b->region) return a->region < b->region ? -1 : 1;
    return a->off < b->off ? -1 : a->off > b->off;
}

static uint64_t seg_end(const seg_t *s) { return s->off + s->nrows * s->rowb; }

/* The segments of placement i (one, or one per row). */
static int push_placement(segs_t *v, const refit_manifest_t *m, uint32_t i, const uint64_t *tids)
{
    const refit_placement_t *p = &m->placements.data[i];
    cbox_t b;
    if (cbox_of(&m->canon.data[p->canon], p, &b) != REFIT_DIGEST_VERIFIABLE) return 0;
    if (!cbox_full_rows(&b) && !cbox_all_rows(&b)) return 0; /* refit_digest_local's rule */
    uint64_t stride, off = digest_box_offset(m, p, &stride), rowb = b.n * 2;
    seg_t s = {.off = off,
               .rowb = rowb,
               .nrows = b.nrows,
               .tid = tids[p->canon],
               .row = b.a,
               .unit = b.c,
               .region = m->locals.data[p->local].region,
               .pl = i};
    if (b.nrows == 1 || stride == rowb) return REFIT_VEC_PUSH(v, s);
    for (uint64_t r = 0; r < b.nrows; r++) {
        seg_t one = s;
        one.off = off + r * stride;
        one.nrows = 1;
        one.row = b.a + r;
        if (REFIT_VEC_PUSH(v, one)) return -1;
    }
    return 0;
}

void refit_digest_map_destroy(refit_digest_map_t *m)
{
    if (!m) return;
    free(m->segs);
    free(m->rstart);
    free(m);
}

refit_status_t refit_digest_map_create(const refit_digest_key_t *k, const refit_manifest_t *dst,
                                       refit_digest_map_t **out)
{
    if (!k || !dst || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_map_create: NULL argument");
    if (!dst->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "refit_digest_map_create: manifest not finalized");
    segs_t v = {0};
    refit_digest_map_t *m = calloc(1, sizeof(*m));
    uint64_t *tids = digest_tensor_ids(k, dst);
    bool oom = !m || !tids;
    for (uint32_t i = 0; !oom && i < dst->placements.len; i++) oom = push_placement(&v, dst, i, tids) != 0;
    free(tids);
    if (!oom) oom = !(m->rstart = calloc((size_t)dst->regions.len + 1, sizeof(size_t)));
    if (oom) {
        REFIT_VEC_FREE(&v);
        refit_digest_map_destroy(m);
        return refit_error(REFIT_ERR_NO_MEMORY, "digest map of %u placements", (unsigned)dst->placements.len);
    }
    if (v.len) qsort(v.data, v.len, sizeof(seg_t), cmp_seg);
    m->k = k;
    m->avx512 = digest_units_vectorised(k);
    m->segs = v.data;
    m->nsegs = v.len;
    m->nregions = (uint32_t)dst->regions.len;
    for (size_t i = 0; i < v.len; i++) {
        m->bytes += v.data[i].nrows * v.data[i].rowb;
        m->rstart[v.data[i].region + 1] = i + 1;
        if (i && v.data[i].region == v.data[i - 1].region && seg_end(&v.data[i - 1]) > v.data[i].off) {
            refit_digest_map_destroy(m);
            return refit_error(REFIT_ERR_INTERNAL, "digest map: placements %u and %u share bytes of region %u",
                               v.data[i - 1].pl, v.data[i].pl, v.data[i].region);
        }
    }
    for (uint32_t r = 0; r < m->nregions; r++) /* regions without segments start where the last one ended */
        if (m->rstart[r + 1] < m->rstart[r]) m->rstart[r + 1] = m->rstart[r];
    *out = m;
    return REFIT_OK;
}

uint64_t refit_digest_map_bytes(const refit_digest_map_t *m) { return m ? m->bytes : 0; }

/* ---------------------------------------------------------------- copies */

/* One piece of a segment's row: `len` bytes from byte `col` of row `row` (counted in the segment). */
static void row_piece(const refit_digest_key_t *k, const seg_t *s, uint64_t row, uint64_t col, uint8_t *d,
                      const uint8_t *src, uint64_t len, refit_dsum_t *sum)
{
    uint64_t crow = s->row + row, unit = s->unit + col / 2;
    if (col & 1) { /* the high byte of a unit: its value's share is 256 * (int8)hi */
        if (src) *d = *src++;
        uint8_t u[2] = {0, *d++};
        refit_digest_span(k, s->tid, crow, unit++, u, 1, sum);
        len--;
    }
    uint64_t n = len / 2;
    if (n && src) refit_digest_copy_rows(k, s->tid, crow, 1, unit, d, 0, src, 0, n, sum);
    else if (n) refit_digest_span(k, s->tid, crow, unit, d, n, sum);
    d += 2 * n;
    if (src) src += 2 * n;
    if (len & 1) { /* the low byte of a unit */
        if (src) *d = *src;
        uint8_t u[2] = {*d, 0};
        refit_digest_span(k, s->tid, crow, unit + n, u, 1, sum);
    }
}

/* sum += D of `len` bytes from byte `rel` of segment s (copied from src first, unless src is NULL). */
static void seg_sum(const refit_digest_key_t *k, const seg_t *s, uint64_t rel, uint8_t *d, const uint8_t *src,
                    uint64_t len, refit_dsum_t *out)
{
    refit_dsum_t sum = {{0, 0}};
    uint64_t row = rel / s->rowb, col = rel % s->rowb;
    if (col) {
        uint64_t take = REFIT_MIN(len, s->rowb - col);
        row_piece(k, s, row++, col, d, src, take, &sum);
        d += take;
        if (src) src += take;
        len -= take;
    }
    uint64_t whole = len / s->rowb;
    if (whole && src)
        refit_digest_copy_rows(k, s->tid, s->row + row, whole, s->unit, d, s->rowb, src, s->rowb, s->rowb / 2, &sum);
    else if (whole) refit_digest_rows(k, s->tid, s->row + row, whole, s->unit, d, s->rowb, s->rowb / 2, &sum);
    d += whole * s->rowb;
    if (src) src += whole * s->rowb;
    if (len % s->rowb) row_piece(k, s, row + whole, 0, d, src, len % s->rowb, &sum);
    out->lane[0] += sum.lane[0];
    out->lane[1] += sum.lane[1];
}

static void add_to(refit_dsum_t *acc, uint32_t pl, uint32_t l0, uint32_t l1)
{
    __atomic_fetch_add(&acc[pl].lane[0], l0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&acc[pl].lane[1], l1, __ATOMIC_RELAXED);
}

/* `len` bytes from byte `rel` of segment s into acc: their digest (update false), or with update, the
 * change from the bytes at d before the copy to src's. */
static void seg_piece(const refit_digest_key_t *k, const seg_t *s, uint64_t rel, uint8_t *d, const uint8_t *src,
                      uint64_t len, bool update, refit_dsum_t *acc)
{
    refit_dsum_t old = {{0, 0}}, now = {{0, 0}};
    if (update) seg_sum(k, s, rel, d, NULL, len, &old);
    seg_sum(k, s, rel, d, src, len, &now);
    add_to(acc, s->pl, now.lane[0] - old.lane[0], now.lane[1] - old.lane[1]);
}

/* The first segment of [lo, hi) that ends after off. */
static const seg_t *seg_after(const seg_t *lo, const seg_t *hi, uint64_t off)
{
    while (lo < hi) {
        const seg_t *mid = lo + (hi - lo) / 2;
        if (seg_end(mid) <= off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* refit_digest_map_copy (update false) and refit_digest_map_update's general case (true: src not NULL). */
static uint64_t walk(const refit_digest_map_t *m, uint32_t region, uint64_t off, void *dst, const void *src,
                     uint64_t len, bool update, refit_dsum_t *acc)
{
    uint8_t *d = dst;
    const uint8_t *sp = src;
    if (region >= m->nregions || !m->nsegs) { /* nothing mapped there (no segments at all: segs is NULL) */
        if (sp) memcpy(d, sp, len);
        return 0;
    }
    const seg_t *end = m->segs + m->rstart[region + 1];
    const seg_t *s = seg_after(m->segs + m->rstart[region], end, off);
    uint64_t pos = off, stop = off + len, hashed = 0;
    while (pos < stop) {
        uint64_t gap = s == end || s->off >= stop ? stop - pos : s->off > pos ? s->off - pos : 0;
        if (gap) { /* bytes no segment covers */
            if (sp) memcpy(d, sp, gap);
            d += gap;
            if (sp) sp += gap;
            pos += gap;
            continue;
        }
        uint64_t take = REFIT_MIN(stop, seg_end(s)) - pos;
        seg_piece(m->k, s, pos - s->off, d, sp, take, update, acc);
        d += take;
        if (sp) sp += take;
        pos += take;
        hashed += take;
        if (pos == seg_end(s)) s++;
    }
    return hashed;
}

uint64_t refit_digest_map_copy(const refit_digest_map_t *m, uint32_t region, uint64_t off, void *dst, const void *src,
                               uint64_t len, refit_dsum_t *acc)
{
    return walk(m, region, off, dst, src, len, false, acc);
}

void refit_digest_map_fold(const refit_digest_map_t *m, uint32_t region, uint64_t off, uint64_t len, refit_dsum_t *from,
                           refit_dsum_t *acc)
{
    if (!m || !from || !len || region >= m->nregions || !m->nsegs) return;
    const seg_t *end = m->segs + m->rstart[region + 1];
    for (const seg_t *s = seg_after(m->segs + m->rstart[region], end, off); s < end && s->off < off + len; s++) {
        refit_dsum_t *f = &from[s->pl];
        if (!f->lane[0] && !f->lane[1]) continue; /* nothing there, or a placement already moved */
        if (acc) add_to(acc, s->pl, f->lane[0], f->lane[1]);
        f->lane[0] = f->lane[1] = 0;
    }
}

/* Rows [0, n) of a copy_rows call that are consecutive rows of segment s, each run at the same column of its row
 * in whole units, hashed in one kernel call; returns how many rows it took (0: not such rows). */
static uint64_t box_rows(const refit_digest_map_t *m, const seg_t *s, uint64_t off, uint64_t dst_stride, uint8_t *d,
                         const uint8_t *sp, uint64_t src_stride, uint64_t len, uint64_t n, refit_dsum_t *acc)
{
    if (off < s->off || dst_stride != s->rowb) return 0;
    uint64_t rel = off - s->off, col = rel % s->rowb, first = rel / s->rowb;
    if (((col | len) & 1) || col + len > s->rowb || first >= s->nrows) return 0;
    uint64_t take = REFIT_MIN(n, s->nrows - first);
    refit_dsum_t sum = {{0, 0}};
    uint64_t row = s->row + first, unit = s->unit + col / 2;
    if (sp) refit_digest_copy_rows(m->k, s->tid, row, take, unit, d, dst_stride, sp, src_stride, len / 2, &sum);
    else refit_digest_rows(m->k, s->tid, row, take, unit, d, dst_stride, len / 2, &sum);
    add_to(acc, s->pl, sum.lane[0], sum.lane[1]);
    return take;
}

uint64_t refit_digest_map_copy_rows(const refit_digest_map_t *m, uint32_t region, uint64_t off, uint64_t dst_stride,
                                    void *dst, const void *src, uint64_t src_stride, uint64_t len, uint64_t nrows,
                                    refit_dsum_t *acc)
{
    uint8_t *d = dst;
    const uint8_t *sp = src;
    if (!len || !nrows) return 0;
    if (region >= m->nregions || !m->nsegs) { /* nothing mapped: every run copied, none hashed */
        for (uint64_t i = 0; i < nrows && sp; i++) memcpy(d + i * dst_stride, sp + i * src_stride, len);
        return 0;
    }
    const seg_t *lo = m->segs + m->rstart[region], *end = m->segs + m->rstart[region + 1], *s = NULL;
    uint64_t hashed = 0;
    for (uint64_t i = 0; i < nrows;) {
        uint64_t o = off + i * dst_stride;
        /* The segment under o: the last one, the next (rows running on into the next tensor), or a search. */
        if (!s || o < s->off || o >= seg_end(s))
            s = s && s + 1 < end && s[1].off <= o && o < seg_end(&s[1]) ? s + 1 : NULL;
        if (!s) s = seg_after(lo, end, o);
        uint64_t took = s < end ? box_rows(m, s, o, dst_stride, d + i * dst_stride, sp ? sp + i * src_stride : NULL,
                                           src_stride, len, nrows - i, acc)
                                : 0;
        if (!took) { /* a run across segments or gaps, or rows that are not a box: this one through the walk */
            hashed += walk(m, region, o, d + i * dst_stride, sp ? sp + i * src_stride : NULL, len, false, acc);
            s = NULL;
            i++;
            continue;
        }
        hashed += took * len;
        i += took;
    }
    return hashed;
}

/* ---------------------------------------------------------------- updates */

/* The segment of region `region` holding byte off, or NULL; c remembers the last one. */
static const seg_t *seg_at(const refit_digest_map_t *m, refit_digest_cursor_t *c, uint32_t region, uint64_t off)
{
    const seg_t *s = c->seg;
    if (s && s->region == region && s->off <= off && off < seg_end(s)) return s;
    if (region >= m->nregions || !m->nsegs) return NULL;
    const seg_t *end = m->segs + m->rstart[region + 1];
    s = seg_after(m->segs + m->rstart[region], end, off);
    if (s == end || s->off > off) return NULL;
    c->seg = s;
    c->row = UINT64_MAX;
    c->blk = 0;
    return s;
}

void refit_digest_map_update(const refit_digest_map_t *m, refit_digest_cursor_t *c, uint32_t region, uint64_t off,
                             void *dst, const void *src, uint64_t len, refit_dsum_t *acc)
{
    const seg_t *s = len == 2 ? seg_at(m, c, region, off) : NULL;
    if (!s) {
        walk(m, region, off, dst, src, len, true, acc);
        return;
    }
    /* A sparse delta's changes ascend, about 20 to a row at 1%: the row is
     * found by division only when a unit leaves the row kept (its start in
     * row_lo), and the key block's multipliers only when the block changes. */
    uint64_t col, row;
    if (c->row != UINT64_MAX && off >= c->row_lo && off - c->row_lo < s->rowb) {
        col = off - c->row_lo;
        row = c->row;
    } else {
        uint64_t rel = off - s->off;
        col = rel % s->rowb;
        row = s->row + rel / s->rowb;
    }
    if ((col & 1) || col + 2 > s->rowb) { /* not one whole unit of a segment: the general walk */
        walk(m, region, off, dst, src, len, true, acc);
        return;
    }
    const refit_digest_key_t *k = m->k;
    uint64_t j = s->unit + col / 2;
    if (c->row != row) { /* the row's keys, kept for the next unit of the same row */
        refit_dsum_t r = refit_digest_row_key(k, s->tid, row);
        c->row = row;
        c->row_lo = off - col;
        c->r[0] = r.lane[0];
        c->r[1] = r.lane[1];
    }
    if (c->blk != (j >> KBITS) + 1) {
        block_mult(k, j >> KBITS, c->mb);
        c->blk = (j >> KBITS) + 1;
    }
    const uint32_t *mb = c->mb;
    int16_t was, now;
    memcpy(&was, dst, 2);
    memcpy(&now, src, 2);
    memcpy(dst, src, 2);
    uint32_t d = (uint32_t)((int32_t)now - (int32_t)was);
    uint32_t k0 = mb[0] * (uint32_t)(int32_t)k->kc[0][j & (KCOLS - 1)],
             k1 = mb[1] * (uint32_t)(int32_t)k->kc[1][j & (KCOLS - 1)];
    if (c->pacc != acc || c->ppl != s->pl) {
        refit_digest_cursor_flush(c);
        c->pacc = acc;
        c->ppl = s->pl;
    }
    c->pend[0] += c->r[0] * k0 * d;
    c->pend[1] += c->r[1] * k1 * d;
}

/* Units of one segment whose sums refit_digest_map_update_units gathers before it adds them: their indices in the
 * segment and their changes. */
enum { UNITS_BATCH = 64 };

/* The sums of a run of units of segment s (index u[x], change d[x]) into c's pending sums. */
static void units_sum(const refit_digest_map_t *m, refit_digest_cursor_t *c, const seg_t *s, const uint32_t *u,
                      const int32_t *d, uint32_t n, refit_dsum_t *acc)
{
    digest_units_t j = {0};
    digest_units_init(&j, m->k, s->tid, s->row, s->unit, s->rowb / 2);
    uint32_t sum[2] = {0, 0};
#if DIGEST_HAVE_AVX512
    if (m->avx512) digest_units_sum_avx512(&j, u, d, n, sum);
    else
#endif
        for (uint32_t x = 0; x < n; x++) digest_unit_sum(&j, u[x], d[x], sum);
    if (c->pacc != acc || c->ppl != s->pl) {
        refit_digest_cursor_flush(c);
        c->pacc = acc;
        c->ppl = s->pl;
    }
    c->pend[0] += sum[0];
    c->pend[1] += sum[1];
}

void refit_digest_map_update_units(const refit_digest_map_t *m, refit_digest_cursor_t *c, uint32_t region, uint8_t *dst,
                                   const uint64_t *offs, const uint16_t *vals, uint32_t n, refit_dsum_t *acc)
{
    uint32_t U[UNITS_BATCH];
    int32_t D[UNITS_BATCH];
    for (uint32_t i = 0; i < n;) {
        uint64_t off = offs[i];
        const seg_t *s = seg_at(m, c, region, off);
        /* A segment whose units the batch takes: its columns in one key block, its units countable in 31 bits,
         * this unit whole in one of its rows; anything else goes alone. */
        if (!s || ((off - s->off) & 1) || !digest_one_key_block(s->unit, s->rowb / 2) ||
            seg_end(s) - s->off >= (2ull << 31)) {
            refit_digest_map_update(m, c, region, off, dst + off, &vals[i], 2, acc);
            i++;
            continue;
        }
        uint64_t end = seg_end(s);
        uint32_t nb = 0;
        for (; i < n && nb < UNITS_BATCH && offs[i] >= s->off && offs[i] < end && !((offs[i] - s->off) & 1); i++) {
            int16_t was, now = (int16_t)vals[i];
            memcpy(&was, dst + offs[i], 2);
            memcpy(dst + offs[i], &vals[i], 2);
            U[nb] = (uint32_t)((offs[i] - s->off) / 2);
            D[nb++] = (int32_t)now - (int32_t)was;
        }
        units_sum(m, c, s, U, D, nb, acc);
    }
}

void refit_digest_cursor_flush(refit_digest_cursor_t *c)
{
    if (c->pacc && (c->pend[0] || c->pend[1])) add_to(c->pacc, c->ppl, c->pend[0], c->pend[1]);
    c->pacc = NULL;
    c->pend[0] = c->pend[1] = 0;
}
