/* Builds quantize-on-copy tables (see fp8_table.h). */
#include "plan/fp8_table.h"

#include <stdlib.h>
#include <string.h>

#include "data/fp8_hd.h"
#include "plan/plan.h"

#define B REFIT_FP8_BLOCK
#define MAX_RUNS (64ull << 20) /* runs walked one by one, per region (a loop the table cannot fold) */

/* A bf16 local tensor of the receiver, by its place in the bf16 image. */
typedef struct {
    uint64_t lo, hi; /* [lo, hi) in the bf16 image */
    int64_t delta;   /* kept: arena offset - image offset */
    uint32_t mat;    /* quantized: its first matrix */
    uint32_t rows, cols;
    bool quantized;
} span_tensor_t;

/* Rows [r0, r0 + nr) x columns [c0, c0 + nc) of matrix `mat`, rows src_stride apart from src_offset. */
typedef struct {
    uint64_t src_offset, src_stride;
    uint32_t mat, r0, nr, c0, nc, slot;
} span_t;

typedef struct {
    const refit_plan_t *plan;
    refit_fp8_table_t *x;
    span_tensor_t *tens;
    uint32_t ntens;
    REFIT_VEC(span_t) spans;
    REFIT_VEC(refit_plan_region_t) kept; /* copies and fills moved into the arena */
} build_t;

static const span_tensor_t *tensor_at(const build_t *b, uint64_t off)
{
    uint32_t lo = 0, hi = b->ntens;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (b->tens[mid].hi <= off) lo = mid + 1;
        else hi = mid;
    }
    return lo < b->ntens && b->tens[lo].lo <= off ? &b->tens[lo] : NULL;
}

static int cmp_tensor(const void *a, const void *b)
{
    const span_tensor_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static refit_status_t push_span(build_t *b, const span_t *s)
{
    if (s->nr == 0 || s->nc == 0) return REFIT_OK;
    return REFIT_VEC_PUSH(&b->spans, *s) ? refit_error(REFIT_ERR_NO_MEMORY, "fp8 table") : REFIT_OK;
}

static refit_status_t push_kept(build_t *b, const refit_plan_region_t *r, const span_tensor_t *t)
{
    refit_plan_region_t k = *r;
    k.dst_offset = (uint64_t)((int64_t)k.dst_offset + t->delta);
    return REFIT_VEC_PUSH(&b->kept, k) ? refit_error(REFIT_ERR_NO_MEMORY, "fp8 table") : REFIT_OK;
}

/* rows x cols bytes of matrix rows, from a bf16 image offset inside tensor t. */
static void locate(const span_tensor_t *t, uint64_t off, uint32_t *mat, uint32_t *row, uint32_t *colb)
{
    uint64_t rb = (uint64_t)t->cols * 2, mb = rb * t->rows, x = off - t->lo;
    *mat = t->mat + (uint32_t)(x / mb);
    x %= mb;
    *row = (uint32_t)(x / rb);
    *colb = (uint32_t)(x % rb);
}

/* One contiguous run [d, d + len) of the bf16 image read from src_offset of
 * slot: into spans (quantized) or a kept region, split at tensor, matrix and
 * row edges. */
static refit_status_t add_run(build_t *b, const refit_plan_region_t *r, uint32_t slot, uint64_t d, uint64_t s,
                              uint64_t len)
{
    refit_status_t st = REFIT_OK;
    while (len && !st) {
        const span_tensor_t *t = tensor_at(b, d);
        if (!t)
            return refit_error(REFIT_ERR_GEOMETRY,
                               "fp8 table: the plan writes byte %llu of the bf16 image, outside every tensor",
                               (unsigned long long)d);
        uint64_t n = t->hi - d < len ? t->hi - d : len;
        if (!t->quantized) {
            refit_plan_region_t k = *r;
            k.nloops = 0;
            k.dst_offset = d;
            k.src_offset = r->src == REFIT_PLAN_FILL ? 0 : s;
            k.run = n;
            st = push_kept(b, &k, t);
        } else if (r->src != REFIT_PLAN_FILL) { /* padding inside a quantized matrix: the kernel's zeros */
            if ((d | s | n) & 1) return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: a bf16 copy at an odd byte");
            uint64_t rb = (uint64_t)t->cols * 2, dd = d, ss = s, left = n;
            while (left && !st) {
                uint32_t mat, row, colb;
                locate(t, dd, &mat, &row, &colb);
                span_t sp = {.src_offset = ss, .src_stride = rb, .mat = mat, .r0 = row, .slot = slot};
                uint64_t take;
                if (colb == 0 && left >= rb) { /* whole rows, to the matrix's end at most */
                    uint64_t nr = left / rb, room = b->x->mats[mat].rows - row;
                    if (nr > room) nr = room;
                    sp.nr = (uint32_t)nr;
                    sp.nc = t->cols;
                    take = nr * rb;
                } else {
                    take = rb - colb < left ? rb - colb : left;
                    sp.nr = 1;
                    sp.c0 = colb / 2;
                    sp.nc = (uint32_t)(take / 2);
                }
                st = push_span(b, &sp);
                dd += take;
                ss += take;
                left -= take;
            }
        }
        d += n;
        s += n;
        len -= n;
    }
    return st;
}

/* A region inside one quantized tensor whose runs each lie in one row, loop
 * 0 stepping one row (same columns): spans of count[0] rows, one per outer
 * iteration, without walking the rows. */
static bool fold_rows(const refit_plan_region_t *r, const span_tensor_t *t)
{
    uint64_t rb = (uint64_t)t->cols * 2;
    if (r->src == REFIT_PLAN_FILL || r->nloops == 0 || r->dst_stride[0] != rb) return false;
    if ((r->dst_offset - t->lo) % rb + r->run > rb || ((r->dst_offset | r->src_offset | r->run) & 1)) return false;
    for (uint32_t i = 0; i < r->nloops; i++)
        if ((i && r->dst_stride[i] % rb) || (r->src_stride[i] & 1)) return false;
    return refit_region_dst_end(r) <= t->hi;
}

static refit_status_t add_folded(build_t *b, const refit_plan_region_t *r, const span_tensor_t *t, uint32_t slot)
{
    refit_status_t st = REFIT_OK;
    uint64_t outer = 1;
    for (uint32_t i = 1; i < r->nloops; i++) outer *= r->count[i];
    for (uint64_t o = 0; o < outer && !st; o++) {
        uint64_t d = r->dst_offset, s = r->src_offset, q = o;
        for (uint32_t i = 1; i < r->nloops; i++) {
            uint64_t k = q % r->count[i];
            q /= r->count[i];
            d += k * r->dst_stride[i];
            s += k * r->src_stride[i];
        }
        uint64_t rows = r->count[0];
        while (rows && !st) { /* split where loop 0 crosses into the next matrix */
            uint32_t mat, row, colb;
            locate(t, d, &mat, &row, &colb);
            uint64_t nr = b->x->mats[mat].rows - row;
            if (nr > rows) nr = rows;
            span_t sp = {.src_offset = s,
                         .src_stride = r->src_stride[0],
                         .mat = mat,
                         .r0 = row,
                         .nr = (uint32_t)nr,
                         .c0 = colb / 2,
                         .nc = (uint32_t)(r->run / 2),
                         .slot = slot};
            st = push_span(b, &sp);
            d += nr * r->dst_stride[0];
            s += nr * r->src_stride[0];
            rows -= nr;
        }
    }
    return st;
}

static refit_status_t add_region(build_t *b, const refit_plan_region_t *r, uint32_t slot)
{
    if (r->dst_region != 0)
        return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: the bf16 layout has more than one region");
    if (r->run == 0) return REFIT_OK;
    const span_tensor_t *t = tensor_at(b, r->dst_offset);
    uint64_t end = refit_region_dst_end(r);
    if (t && end <= t->hi) {
        if (!t->quantized) return push_kept(b, r, t);
        if (r->src == REFIT_PLAN_FILL) return REFIT_OK;
        if (fold_rows(r, t)) return add_folded(b, r, t, slot);
    }
    uint64_t runs = refit_region_rows(r);
    if (runs > MAX_RUNS)
        return refit_error(REFIT_ERR_GEOMETRY,
                           "fp8 table: a region of %llu runs of %llu bytes that the table cannot fold",
                           (unsigned long long)runs, (unsigned long long)r->run);
    refit_status_t st = REFIT_OK;
    for (uint64_t i = 0; i < runs && !st; i++) {
        uint64_t so, dof;
        refit_region_row_offsets(r, i, &so, &dof);
        st = add_run(b, r, slot, dof, so, r->run);
    }
    return st;
}

/* The target's matrices and the bf16 tensors, sorted by image offset. */
static refit_status_t index_target(build_t *b, const refit_manifest_t *m, const refit_fp8_target_t *t)
{
    refit_fp8_table_t *x = b->x;
    uint32_t n = refit_fp8_target_num_tensors(t);
    b->tens = calloc(n ? n : 1, sizeof(*b->tens));
    if (!b->tens) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    uint64_t nmats = 0;
    for (uint32_t i = 0; i < n; i++) {
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        if (e->dtype == REFIT_DTYPE_F8_E4M3) nmats += e->ndim == 3 ? e->shape[0] : 1;
    }
    x->mats = calloc(nmats ? nmats : 1, sizeof(*x->mats));
    if (!x->mats) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    for (uint32_t i = 0; i < n; i++) {
        const refit_fp8_tensor_t *e = refit_fp8_target_tensor(t, i);
        const refit_local_t *l = &m->locals.data[e->local];
        span_tensor_t *st = &b->tens[b->ntens++];
        st->lo = l->offset;
        st->hi = l->offset + l->nbytes;
        if (e->dtype != REFIT_DTYPE_F8_E4M3) {
            st->delta = (int64_t)e->offset - (int64_t)l->offset;
            continue;
        }
        /* its scales follow it (refit_fp8_target_create) */
        const refit_fp8_tensor_t *sc = refit_fp8_target_tensor(t, i + 1);
        if (!sc || sc->local != e->local || sc->dtype != REFIT_DTYPE_F32)
            return refit_error(REFIT_ERR_INVALID_ARG, "fp8 table: no scales after %s", e->name);
        uint64_t lead = e->ndim == 3 ? e->shape[0] : 1, rows = e->shape[e->ndim - 2], cols = e->shape[e->ndim - 1];
        if (rows > UINT32_MAX || cols > UINT32_MAX || l->nbytes != lead * rows * cols * 2)
            return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: %s is not a bf16 matrix of its shape", e->name);
        uint32_t br = (uint32_t)((rows + B - 1) / B), bc = (uint32_t)((cols + B - 1) / B);
        st->quantized = true;
        st->mat = x->nmats;
        st->rows = (uint32_t)rows;
        st->cols = (uint32_t)cols;
        for (uint64_t k = 0; k < lead; k++) {
            refit_fp8_matrix_t *mt = &x->mats[x->nmats++];
            mt->first_block = x->nblocks;
            mt->dst_offset = e->offset + k * rows * cols;
            mt->scale_offset = sc->offset + k * (uint64_t)br * bc * 4;
            mt->rows = (uint32_t)rows;
            mt->cols = (uint32_t)cols;
            mt->bcols = bc;
            x->nblocks += (uint64_t)br * bc;
            x->quantized_out += rows * cols + (uint64_t)br * bc * 4;
        }
        i++; /* the scales */
    }
    qsort(b->tens, b->ntens, sizeof(*b->tens), cmp_tensor);
    return REFIT_OK;
}

/* Spans cut into per-block pieces, grouped by block (counted, then placed). */
static refit_status_t place_pieces(build_t *b)
{
    refit_fp8_table_t *x = b->x;
    if (x->nblocks >= UINT32_MAX) return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: too many blocks");
    x->block_piece = calloc(x->nblocks + 1, sizeof(uint32_t));
    uint32_t *next = NULL;
    if (!x->block_piece) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < b->spans.len; k++) {
            const span_t *s = &b->spans.data[k];
            const refit_fp8_matrix_t *mt = &x->mats[s->mat];
            if ((uint64_t)s->r0 + s->nr > mt->rows || (uint64_t)s->c0 + s->nc > mt->cols) {
                free(next);
                return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: a piece outside its matrix");
            }
            for (uint32_t i = s->r0 / B; i <= (s->r0 + s->nr - 1) / B; i++)
                for (uint32_t j = s->c0 / B; j <= (s->c0 + s->nc - 1) / B; j++) {
                    uint64_t blk = mt->first_block + (uint64_t)i * mt->bcols + j;
                    if (pass == 0) {
                        x->block_piece[blk + 1]++;
                        continue;
                    }
                    uint32_t ra = s->r0 > i * B ? s->r0 : i * B,
                             rz = s->r0 + s->nr < (i + 1) * B ? s->r0 + s->nr : (i + 1) * B;
                    uint32_t ca = s->c0 > j * B ? s->c0 : j * B,
                             cz = s->c0 + s->nc < (j + 1) * B ? s->c0 + s->nc : (j + 1) * B;
                    refit_fp8_piece_t *p = &x->pieces[next[blk]++];
                    p->src_offset = s->src_offset + (uint64_t)(ra - s->r0) * s->src_stride + (uint64_t)(ca - s->c0) * 2;
                    p->src_stride = s->src_stride;
                    p->src_slot = s->slot;
                    p->r0 = (uint8_t)(ra - i * B);
                    p->r1 = (uint8_t)(rz - i * B);
                    p->c0 = (uint8_t)(ca - j * B);
                    p->c1 = (uint8_t)(cz - j * B);
                    x->quantized_bf16 += (uint64_t)(rz - ra) * (cz - ca) * 2;
                }
        }
        if (pass == 1) break;
        uint64_t sum = 0; /* counts -> block_piece[b] the first piece of b, block_piece[b + 1] its end */
        for (uint64_t k = 1; k <= x->nblocks; k++) {
            sum += x->block_piece[k];
            if (sum >= UINT32_MAX) return refit_error(REFIT_ERR_GEOMETRY, "fp8 table: too many pieces");
            x->block_piece[k] = (uint32_t)sum;
        }
        x->npieces = sum;
        x->pieces = calloc(sum ? sum : 1, sizeof(*x->pieces));
        next = malloc((x->nblocks ? x->nblocks : 1) * sizeof(uint32_t));
        if (!x->pieces || !next) {
            free(next);
            return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
        }
        memcpy(next, x->block_piece, x->nblocks * sizeof(uint32_t));
    }
    free(next);
    x->fast = malloc((x->nblocks ? x->nblocks : 1) * sizeof(uint32_t));
    if (!x->fast) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    uint64_t nslow = 0;
    for (uint64_t k = 0; k < x->nblocks; k++) { /* fast ones from the front, the others from the back */
        uint32_t p0 = x->block_piece[k], p1 = x->block_piece[k + 1];
        const refit_fp8_matrix_t *mt = &x->mats[refit_fp8_table_matrix(x->mats, x->nmats, k)];
        const refit_fp8_piece_t *p = &x->pieces[p0];
        uint64_t bi = (k - mt->first_block) / mt->bcols, bj = (k - mt->first_block) % mt->bcols;
        bool whole = p1 - p0 == 1 && (bi + 1) * B <= mt->rows && (bj + 1) * B <= mt->cols && p->r0 == 0 && p->c0 == 0 &&
                     p->r1 == B && p->c1 == B && !((p->src_offset | p->src_stride) & 15);
        if (whole) x->fast[x->full_blocks++] = (uint32_t)k;
        else x->fast[x->nblocks - ++nslow] = (uint32_t)k;
    }
    x->slow = x->fast + x->full_blocks;
    return REFIT_OK;
}

refit_status_t refit_fp8_table_build(const refit_plan_t *plan, const refit_manifest_t *m, const refit_fp8_target_t *t,
                                     const refit_batch_opts_t *o, refit_fp8_table_t *x)
{
    memset(x, 0, sizeof(*x));
    if (!plan || !m || !t || !o) return refit_error(REFIT_ERR_INVALID_ARG, "refit_fp8_table_build: NULL argument");
    build_t b = {.plan = plan, .x = x};
    refit_status_t st = index_target(&b, m, t);
    /* slots: every region of every selected source, as refit_batch_build numbers them */
    size_t nsrc = plan->nsrcs;
    x->nsrcs = (uint32_t)nsrc;
    x->src_slot_base = calloc(nsrc + 1, sizeof(uint32_t));
    if (!st && !x->src_slot_base) st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    for (size_t i = 0; !st && i < plan->regions.len; i++) {
        const refit_plan_region_t *r = &plan->regions.data[i];
        if (o->only && !o->only[r->src]) continue;
        if (r->src_region + 1 > x->src_slot_base[r->src + 1]) x->src_slot_base[r->src + 1] = r->src_region + 1;
    }
    for (size_t s = 0; !st && s < nsrc; s++) x->src_slot_base[s + 1] += x->src_slot_base[s];
    if (!st) {
        x->dst_slot = x->src_slot_base[nsrc];
        x->nslots = x->dst_slot + 1;
    }
    for (size_t i = 0; !st && i < plan->regions.len; i++) {
        const refit_plan_region_t *r = &plan->regions.data[i];
        if (o->only && !o->only[r->src]) continue;
        st = add_region(&b, r, x->src_slot_base[r->src] + r->src_region);
    }
    for (size_t i = 0; !st && i < plan->fills.len; i++) st = add_region(&b, &plan->fills.data[i], 0);
    if (!st) st = place_pieces(&b);
    /* the arena's gaps (tensors are 256-byte aligned, laid out in order): zeros, so that a pull defines every byte */
    uint64_t end = 0;
    for (uint32_t i = 0, n = refit_fp8_target_num_tensors(t); !st && i <= n; i++) {
        const refit_fp8_tensor_t *e = i < n ? refit_fp8_target_tensor(t, i) : NULL;
        uint64_t next = e ? e->offset : refit_fp8_target_bytes(t);
        if (next > end) {
            refit_plan_region_t z = {.src = REFIT_PLAN_FILL, .dst_offset = end, .run = next - end};
            if (REFIT_VEC_PUSH(&b.kept, z)) st = refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
        }
        if (e && e->offset + e->bytes > end) end = e->offset + e->bytes;
    }
    if (!st) { /* the kept tensors: a batch of their own, renumbered onto the table's slots */
        refit_plan_t view = refit_plan_view(b.kept.data, b.kept.len, NULL, nsrc);
        refit_batch_opts_t ko = *o;
        ko.copies = ko.fills = true;
        ko.only = NULL; /* already selected */
        st = refit_batch_build(&view, &ko, &x->copy);
        for (uint32_t i = 0; !st && i < x->copy.n; i++) {
            refit_batch_region_t *r = &x->copy.regions[i];
            if (r->src_slot != REFIT_BATCH_ZERO) {
                uint32_t s = 0;
                while (s + 1 < nsrc && x->copy.src_slot_base[s + 1] <= r->src_slot) s++;
                r->src_slot = x->src_slot_base[s] + (r->src_slot - x->copy.src_slot_base[s]);
            }
            r->dst_slot = x->dst_slot;
        }
        if (!st) {
            memcpy(x->copy.src_slot_base, x->src_slot_base, (nsrc + 1) * sizeof(uint32_t));
            x->copy.dst_slot_base = x->dst_slot;
            x->copy.nslots = x->nslots;
        }
    }
    free(b.tens);
    free(b.spans.data);
    free(b.kept.data);
    if (st) refit_fp8_table_free(x);
    return st;
}

void refit_fp8_table_free(refit_fp8_table_t *x)
{
    if (!x) return;
    free(x->mats);
    free(x->block_piece);
    free(x->pieces);
    free(x->fast);
    free(x->src_slot_base);
    refit_batch_free(&x->copy);
    memset(x, 0, sizeof(*x));
}

refit_status_t refit_fp8_table_execute_host(const refit_fp8_table_t *x, void *const *slots)
{
    uint16_t *tile = malloc(B * B * sizeof(uint16_t));
    if (!tile) return refit_error(REFIT_ERR_NO_MEMORY, "fp8 table");
    for (uint64_t k = 0; k < x->nblocks; k++) {
        const refit_fp8_matrix_t *mt = &x->mats[refit_fp8_table_matrix(x->mats, x->nmats, k)];
        uint64_t bi = (k - mt->first_block) / mt->bcols, bj = (k - mt->first_block) % mt->bcols;
        uint32_t rows = mt->rows - bi * B < B ? (uint32_t)(mt->rows - bi * B) : B;
        uint32_t cols = mt->cols - bj * B < B ? (uint32_t)(mt->cols - bj * B) : B;
        memset(tile, 0, B * B * sizeof(uint16_t));
        for (uint32_t p = x->block_piece[k]; p < x->block_piece[k + 1]; p++) {
            const refit_fp8_piece_t *pc = &x->pieces[p];
            const unsigned char *src = (const unsigned char *)slots[pc->src_slot] + pc->src_offset;
            for (uint32_t r = pc->r0; r < pc->r1; r++)
                memcpy(&tile[r * B + pc->c0], src + (uint64_t)(r - pc->r0) * pc->src_stride,
                       (size_t)(pc->c1 - pc->c0) * 2);
        }
        int32_t m = 0;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t c = 0; c < cols; c++) {
                int32_t a = refit_fp8_hd_absbits(tile[r * B + c]);
                m = a > m ? a : m;
            }
        float scale = refit_fp8_hd_scale(m);
        unsigned char *arena = slots[x->dst_slot];
        uint8_t *q = arena + mt->dst_offset + bi * B * mt->cols + bj * B;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t c = 0; c < cols; c++)
                q[(uint64_t)r * mt->cols + c] = refit_fp8_hd_quantize(tile[r * B + c], scale);
        memcpy(arena + mt->scale_offset + (bi * mt->bcols + bj) * 4, &scale, 4);
    }
    free(tile);
    refit_batch_execute_host(&x->copy, slots, 64);
    return REFIT_OK;
}
