/* Delta refit: encoding at the source, plan-guided application at the
 * destination.  See refit/delta.h for the format. */
#include "refit/delta.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"
#include "util/util.h"

#define MAGIC 0x31444652u /* "RFD1" */
#define HDR 64u
#define ENTRY 16u
#define CB ((uint64_t)REFIT_DELTA_CHUNK_UNITS * 2) /* chunk bytes */

enum { K_NONE = 0, K_SPARSE = 1, K_DENSE = 2, K_BLOCKS = 3 };

static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void wr64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void wr32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf_t;

static int buf_need(buf_t *b, size_t n)
{
    if (b->len + n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

uint64_t refit_delta_header_bytes(const void *delta, size_t len)
{
    const unsigned char *p = delta;
    if (!p || len < HDR || rd32(p) != MAGIC) return 0;
    return HDR + rd64(p + 40) * ENTRY;
}

refit_status_t refit_delta_encode(const void *base, const void *cur, uint64_t nbytes, uint64_t base_version,
                                  uint64_t version, const refit_delta_params_t *params, void **out, size_t *len)
{
    if (!base || !cur || !out || !len || (nbytes & 1))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_encode: NULL argument or odd size");
    refit_delta_format_t fmt = params ? params->format : REFIT_DELTA_SPARSE;
    uint32_t bb = params && params->block_bytes ? params->block_bytes : 64;
    if (fmt == REFIT_DELTA_BLOCKS && ((bb & 1) || CB % bb))
        return refit_error(REFIT_ERR_INVALID_ARG, "block_bytes %u must be even and divide %llu", bb,
                           (unsigned long long)CB);
    const unsigned char *a = base, *b = cur;
    uint64_t nchunks = (nbytes + CB - 1) / CB, changed = 0;
    buf_t o = {0};
    uint16_t *idx = malloc(REFIT_DELTA_CHUNK_UNITS * sizeof(uint16_t));
    uint8_t *bits = NULL;
    if (fmt == REFIT_DELTA_BLOCKS) bits = malloc(CB / bb / 8 + 1);
    if (!idx || (fmt == REFIT_DELTA_BLOCKS && !bits) || buf_need(&o, HDR + nchunks * ENTRY)) goto oom;
    memset(o.p, 0, HDR + nchunks * ENTRY);
    o.len = HDR + nchunks * ENTRY;
    for (uint64_t c = 0; c < nchunks; c++) {
        uint64_t off = c * CB, cb = nbytes - off < CB ? nbytes - off : CB, units = cb / 2;
        const unsigned char *x = a + off, *y = b + off;
        uint32_t n = 0;
        for (uint64_t u = 0; u < units;) {
            if (u + 4 <= units && !memcmp(x + u * 2, y + u * 2, 8)) {
                u += 4;
                continue;
            }
            uint64_t end = u + 4 < units ? u + 4 : units;
            for (; u < end; u++)
                if (memcmp(x + u * 2, y + u * 2, 2)) idx[n++] = (uint16_t)u;
        }
        changed += n;
        unsigned char *e = o.p + HDR + c * ENTRY;
        if (n == 0) continue;
        uint64_t dense_cost = cb, cost;
        uint32_t kind, count = n;
        if (fmt == REFIT_DELTA_SPARSE) {
            cost = (uint64_t)n * 4;
            kind = K_SPARSE;
        } else {
            uint64_t nb = (cb + bb - 1) / bb, nbits = (nb + 7) / 8;
            memset(bits, 0, nbits);
            uint32_t nset = 0;
            for (uint32_t k = 0; k < n; k++) {
                uint64_t blk = (uint64_t)idx[k] * 2 / bb;
                if (!(bits[blk / 8] & (1u << (blk % 8)))) {
                    bits[blk / 8] |= (uint8_t)(1u << (blk % 8));
                    nset++;
                }
            }
            cost = nbits + (uint64_t)nset * bb;
            kind = K_BLOCKS;
            count = nset;
        }
        if (cost >= dense_cost) {
            kind = K_DENSE;
            cost = dense_cost;
            count = (uint32_t)units;
        }
        size_t at = o.len;
        if (buf_need(&o, cost)) goto oom;
        e = o.p + HDR + c * ENTRY;
        wr64(e, at);
        wr32(e + 8, count);
        wr32(e + 12, kind);
        unsigned char *q = o.p + at;
        if (kind == K_DENSE) {
            memcpy(q, y, cb);
        } else if (kind == K_SPARSE) {
            memcpy(q, idx, (size_t)n * 2);
            for (uint32_t k = 0; k < n; k++) memcpy(q + (size_t)n * 2 + k * 2, y + (uint64_t)idx[k] * 2, 2);
        } else {
            uint64_t nb = (cb + bb - 1) / bb, nbits = (nb + 7) / 8;
            memcpy(q, bits, nbits);
            unsigned char *d = q + nbits;
            for (uint64_t blk = 0; blk < nb; blk++)
                if (bits[blk / 8] & (1u << (blk % 8))) {
                    uint64_t s = blk * bb, l = s + bb <= cb ? bb : cb - s;
                    memcpy(d, y + s, l);
                    d += bb;
                }
        }
        o.len += cost;
    }
    wr32(o.p, MAGIC);
    wr32(o.p + 4, (uint32_t)fmt);
    wr32(o.p + 8, bb);
    wr32(o.p + 12, 2);
    wr64(o.p + 16, base_version);
    wr64(o.p + 24, version);
    wr64(o.p + 32, nbytes);
    wr64(o.p + 40, nchunks);
    wr64(o.p + 48, changed);
    wr64(o.p + 56, o.len);
    free(idx);
    free(bits);
    *out = o.p;
    *len = o.len;
    return REFIT_OK;
oom:
    free(idx);
    free(bits);
    free(o.p);
    return refit_error(REFIT_ERR_NO_MEMORY, "encoding a delta");
}

static uint64_t payload_len(const unsigned char *p, uint64_t c, uint32_t kind, uint32_t count)
{
    uint64_t nbytes = rd64(p + 32), off = c * CB, cb = nbytes - off < CB ? nbytes - off : CB;
    uint32_t bb = rd32(p + 8);
    switch (kind) {
    case K_SPARSE: return (uint64_t)count * 4;
    case K_DENSE: return cb;
    case K_BLOCKS: return ((cb + bb - 1) / bb + 7) / 8 + (uint64_t)count * bb;
    default: return 0;
    }
}

void refit_delta_chunk_payload(const void *delta, uint64_t c, uint64_t *off, uint64_t *n)
{
    const unsigned char *p = delta, *e = p + HDR + c * ENTRY;
    *off = rd64(e);
    *n = payload_len(p, c, rd32(e + 12), rd32(e + 8));
}

refit_status_t refit_delta_info(const void *delta, size_t len, refit_delta_info_t *out)
{
    const unsigned char *p = delta;
    uint64_t hb = refit_delta_header_bytes(delta, len);
    if (!hb || hb > len) return refit_error(REFIT_ERR_CORRUPT, "not a delta, or its chunk table is truncated");
    refit_delta_info_t d = {.base_version = rd64(p + 16), .version = rd64(p + 24), .region_bytes = rd64(p + 32),
                            .nchunks = rd64(p + 40), .changed_units = rd64(p + 48), .total_bytes = rd64(p + 56),
                            .header_bytes = hb};
    uint32_t bb = rd32(p + 8);
    if (rd32(p + 12) != 2 || (d.region_bytes + CB - 1) / CB != d.nchunks || rd32(p + 4) > REFIT_DELTA_BLOCKS ||
        (rd32(p + 4) == REFIT_DELTA_BLOCKS && (bb == 0 || (bb & 1) || CB % bb)))
        return refit_error(REFIT_ERR_CORRUPT, "delta header is inconsistent");
    for (uint64_t c = 0; c < d.nchunks; c++) {
        const unsigned char *e = p + HDR + c * ENTRY;
        uint32_t kind = rd32(e + 12), count = rd32(e + 8);
        if (kind > K_BLOCKS || (kind == K_SPARSE && count > REFIT_DELTA_CHUNK_UNITS))
            return refit_error(REFIT_ERR_CORRUPT, "delta chunk %llu: bad kind or count", (unsigned long long)c);
        uint64_t off = rd64(e), n = payload_len(p, c, kind, count);
        if (kind != K_NONE && (off < hb || off > d.total_bytes || n > d.total_bytes - off))
            return refit_error(REFIT_ERR_CORRUPT, "delta chunk %llu: payload outside the delta", (unsigned long long)c);
        d.sparse_chunks += kind == K_SPARSE;
        d.dense_chunks += kind == K_DENSE;
        d.block_chunks += kind == K_BLOCKS;
    }
    if (out) *out = d;
    return REFIT_OK;
}

/* A plan region reading the indexed source region.  Nested regions (source
 * strides growing outwards, each loop's rows after the previous loop's)
 * map a source byte back to its row arithmetically; others are walked row
 * by row. */
typedef struct {
    refit_plan_region_t r;
    uint64_t rows, span_lo, span_hi;
    bool nested;
} ireg_t;

struct refit_delta_index {
    ireg_t *regs;
    size_t nregs;
    uint64_t nchunks, region_bytes;
    uint8_t *need;
    uint32_t *start; /* nchunks + 1: CSR of regions per chunk */
    uint32_t *list;
};

static bool is_nested(const refit_plan_region_t *r)
{
    uint64_t inner = r->run; /* bytes one row (and the loops inside) span */
    if ((r->src_offset | r->run | r->dst_offset) & 1) return false;
    for (uint32_t i = 0; i < r->nloops; i++) {
        if (r->count[i] > 1 && (r->src_stride[i] < inner || ((r->src_stride[i] | r->dst_stride[i]) & 1))) return false;
        inner = r->src_stride[i] * (r->count[i] - 1) + inner;
    }
    return true;
}

void refit_delta_index_destroy(refit_delta_index_t *ix)
{
    if (!ix) return;
    free(ix->regs);
    free(ix->need);
    free(ix->start);
    free(ix->list);
    free(ix);
}

refit_status_t refit_delta_index_create(const refit_plan_t *plan, uint32_t src, uint32_t src_region,
                                        uint64_t region_bytes, refit_delta_index_t **out)
{
    if (!plan || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_index_create: NULL argument");
    refit_delta_index_t *ix = calloc(1, sizeof(*ix));
    if (!ix) return refit_error(REFIT_ERR_NO_MEMORY, "delta index");
    size_t nr;
    const refit_plan_region_t *rv = refit_plan_regions(plan, &nr);
    ix->region_bytes = region_bytes;
    ix->nchunks = (region_bytes + CB - 1) / CB;
    ix->regs = calloc(nr ? nr : 1, sizeof(ireg_t));
    ix->need = calloc(ix->nchunks ? ix->nchunks : 1, 1);
    ix->start = calloc(ix->nchunks + 2, sizeof(uint32_t));
    if (!ix->regs || !ix->need || !ix->start) goto oom;
    for (size_t i = 0; i < nr; i++) {
        const refit_plan_region_t *r = &rv[i];
        if (r->src != src || r->src_region != src_region || !r->run) continue;
        uint64_t end = refit_region_src_end(r);
        if (end > region_bytes) {
            refit_delta_index_destroy(ix);
            return refit_error(REFIT_ERR_OUT_OF_BOUNDS, "plan reads past byte %llu of the source region",
                               (unsigned long long)region_bytes);
        }
        ireg_t *g = &ix->regs[ix->nregs++];
        g->r = *r;
        g->rows = 1;
        for (uint32_t l = 0; l < r->nloops; l++) g->rows *= r->count[l];
        g->span_lo = r->src_offset;
        g->span_hi = end;
        g->nested = is_nested(r);
        for (uint64_t row = 0; row < g->rows; row++) { /* exact: the chunks the rows read */
            uint64_t so, dof;
            refit_region_row_offsets(r, row, &so, &dof);
            for (uint64_t c = so / CB; c <= (so + r->run - 1) / CB; c++) ix->need[c] = 1;
        }
    }
    /* CSR: regions per chunk (by span). */
    for (size_t i = 0; i < ix->nregs; i++)
        for (uint64_t c = ix->regs[i].span_lo / CB; c <= (ix->regs[i].span_hi - 1) / CB; c++) ix->start[c + 1]++;
    for (uint64_t c = 0; c < ix->nchunks; c++) ix->start[c + 1] += ix->start[c];
    ix->list = malloc((ix->start[ix->nchunks] ? ix->start[ix->nchunks] : 1) * sizeof(uint32_t));
    uint32_t *fillp = calloc(ix->nchunks + 1, sizeof(uint32_t));
    if (!ix->list || !fillp) {
        free(fillp);
        goto oom;
    }
    for (size_t i = 0; i < ix->nregs; i++)
        for (uint64_t c = ix->regs[i].span_lo / CB; c <= (ix->regs[i].span_hi - 1) / CB; c++)
            ix->list[ix->start[c] + fillp[c]++] = (uint32_t)i;
    free(fillp);
    *out = ix;
    return REFIT_OK;
oom:
    refit_delta_index_destroy(ix);
    return refit_error(REFIT_ERR_NO_MEMORY, "delta index");
}

const uint8_t *refit_delta_index_need(const refit_delta_index_t *ix, uint64_t *nchunks)
{
    *nchunks = ix->nchunks;
    return ix->need;
}

/* Copies source bytes [lo, hi) that region g reads, taking them from
 * chunk-relative data at `data` (data[0] is source byte c0). */
static uint64_t copy_range(const ireg_t *g, uint64_t lo, uint64_t hi, const unsigned char *data, uint64_t c0,
                           unsigned char *dst)
{
    uint64_t n = 0;
    if (g->nested) {
        /* First row ending after lo (rows ascend in source order). */
        uint64_t L = 0, H = g->rows;
        while (L < H) {
            uint64_t M = L + (H - L) / 2, so, dof;
            refit_region_row_offsets(&g->r, M, &so, &dof);
            if (so + g->r.run <= lo) L = M + 1;
            else H = M;
        }
        for (uint64_t row = L; row < g->rows; row++) {
            uint64_t so, dof;
            refit_region_row_offsets(&g->r, row, &so, &dof);
            if (so >= hi) break;
            uint64_t b0 = so > lo ? so : lo, b1 = so + g->r.run < hi ? so + g->r.run : hi;
            if (b0 >= b1) continue;
            memcpy(dst + dof + (b0 - so), data + (b0 - c0), b1 - b0);
            n += b1 - b0;
        }
        return n;
    }
    for (uint64_t row = 0; row < g->rows; row++) {
        uint64_t so, dof;
        refit_region_row_offsets(&g->r, row, &so, &dof);
        uint64_t b0 = so > lo ? so : lo, b1 = so + g->r.run < hi ? so + g->r.run : hi;
        if (b0 >= b1) continue;
        memcpy(dst + dof + (b0 - so), data + (b0 - c0), b1 - b0);
        n += b1 - b0;
    }
    return n;
}

/* A position in a nested region's rows. */
typedef struct {
    uint64_t k[REFIT_PLAN_MAX_LOOPS];
    uint64_t so, dof, step; /* the row's source and destination offsets; loop 0's source stride */
} cursor_t;

/* The row holding source byte pos or the next one after it (false: none). */
static bool seek(const ireg_t *g, uint64_t pos, cursor_t *c)
{
    const refit_plan_region_t *r = &g->r;
    uint64_t rel = pos < r->src_offset ? 0 : pos - r->src_offset;
    c->so = r->src_offset;
    c->dof = r->dst_offset;
    c->step = r->nloops ? r->src_stride[0] : r->run;
    if (!c->step) c->step = r->run;
    for (int i = (int)r->nloops - 1; i >= 0; i--) {
        uint64_t k = r->src_stride[i] ? rel / r->src_stride[i] : 0;
        if (k >= r->count[i]) k = r->count[i] - 1;
        rel -= k * r->src_stride[i];
        c->k[i] = k;
        c->so += k * r->src_stride[i];
        c->dof += k * r->dst_stride[i];
    }
    return true;
}

/* Moves to the next row (false after the last). */
static inline bool next_row(const ireg_t *g, cursor_t *c)
{
    const refit_plan_region_t *r = &g->r;
    for (uint32_t i = 0; i < r->nloops; i++) {
        if (++c->k[i] < r->count[i]) {
            c->so += r->src_stride[i];
            c->dof += r->dst_stride[i];
            return true;
        }
        c->so -= (r->count[i] - 1) * r->src_stride[i];
        c->dof -= (r->count[i] - 1) * r->dst_stride[i];
        c->k[i] = 0;
    }
    return false;
}

/* Applies chunk c (needed, of any kind) through every plan region reading it. */
static refit_status_t apply_chunk(const refit_delta_index_t *ix, const unsigned char *p, const refit_delta_info_t *info,
                                  uint32_t bb, uint64_t c, void *const *dst_bases, refit_delta_apply_stats_t *s)
{
    const unsigned char *e = p + HDR + c * ENTRY;
    uint32_t kind = rd32(e + 12), count = rd32(e + 8);
    if (kind == K_NONE) return REFIT_OK;
    const unsigned char *pay = p + rd64(e);
    uint64_t c0 = c * CB, cb = info->region_bytes - c0 < CB ? info->region_bytes - c0 : CB;
    for (uint32_t li = ix->start[c]; li < ix->start[c + 1]; li++) {
        const ireg_t *g = &ix->regs[ix->list[li]];
        unsigned char *dst = (unsigned char *)dst_bases[g->r.dst_region];
        uint64_t lo = g->span_lo > c0 ? g->span_lo : c0, hi = g->span_hi < c0 + cb ? g->span_hi : c0 + cb;
        if (lo >= hi) continue;
        if (kind == K_DENSE) {
            s->bytes_written += copy_range(g, lo, hi, pay, c0, dst);
        } else if (kind == K_SPARSE) {
            const unsigned char *vals = pay + (uint64_t)count * 2;
            uint64_t want = (lo - c0) / 2;
            uint32_t L = 0, H = count;
            while (L < H) {
                uint32_t M = L + (H - L) / 2;
                uint16_t v;
                memcpy(&v, pay + (uint64_t)M * 2, 2);
                if (v < want) L = M + 1;
                else H = M;
            }
            if (!g->nested) {
                for (uint32_t k = L; k < count; k++) {
                    uint16_t v;
                    memcpy(&v, pay + (uint64_t)k * 2, 2);
                    uint64_t pos = c0 + (uint64_t)v * 2;
                    if (pos >= hi) break;
                    s->units_written += copy_range(g, pos, pos + 2, vals + (uint64_t)k * 2, pos, dst) ? 1 : 0;
                }
                continue;
            }
            /* Changes ascend, and so do the rows: walk both. */
            cursor_t cur;
            bool started = false;
            for (uint32_t k = L; k < count; k++) {
                uint16_t v;
                memcpy(&v, pay + (uint64_t)k * 2, 2);
                uint64_t pos = c0 + (uint64_t)v * 2;
                if (pos >= hi) break;
                if (!started || pos - cur.so >= 8 * cur.step) {
                    if (!seek(g, pos, &cur)) break;
                    started = true;
                }
                while (pos >= cur.so + g->r.run)
                    if (!next_row(g, &cur)) goto done_region;
                if (pos < cur.so) continue; /* a gap between rows */
                memcpy(dst + cur.dof + (pos - cur.so), vals + (uint64_t)k * 2, 2);
                s->units_written++;
            }
        done_region:;
        } else {
            uint64_t nb = (cb + bb - 1) / bb, nbits = (nb + 7) / 8;
            uint64_t first = (lo - c0) / bb, last = (hi - 1 - c0) / bb, rank = 0;
            for (uint64_t k = 0; k < first; k++) rank += (pay[k / 8] >> (k % 8)) & 1;
            for (uint64_t k = first; k <= last; k++) {
                if (!((pay[k / 8] >> (k % 8)) & 1)) continue;
                if (rank >= count) return refit_error(REFIT_ERR_CORRUPT, "delta chunk %llu: more blocks than it holds",
                                                      (unsigned long long)c);
                uint64_t bs = c0 + k * bb, b0 = bs > lo ? bs : lo, b1 = bs + bb < hi ? bs + bb : hi;
                s->bytes_written += copy_range(g, b0, b1, pay + nbits + rank * bb + (b0 - bs), b0, dst);
                rank++;
            }
        }
    }
    return REFIT_OK;
}

typedef struct {
    const refit_delta_index_t *ix;
    const unsigned char *p;
    const refit_delta_info_t *info;
    uint32_t bb;
    void *const *dst_bases;
    atomic_uint_fast64_t next;
    atomic_int failed;
    refit_status_t st;
    char detail[256];
    pthread_mutex_t lock;
    refit_delta_apply_stats_t s;
} apply_ctx_t;

#define APPLY_TASK 8 /* chunks per task */

static void *apply_worker(void *arg)
{
    apply_ctx_t *a = arg;
    refit_delta_apply_stats_t s = {0};
    while (!atomic_load(&a->failed)) {
        uint64_t c0 = atomic_fetch_add(&a->next, APPLY_TASK);
        if (c0 >= a->ix->nchunks) break;
        for (uint64_t c = c0; c < c0 + APPLY_TASK && c < a->ix->nchunks; c++) {
            if (!a->ix->need[c]) continue;
            refit_status_t st = apply_chunk(a->ix, a->p, a->info, a->bb, c, a->dst_bases, &s);
            if (st) {
                int expected = 0;
                if (atomic_compare_exchange_strong(&a->failed, &expected, 1)) {
                    a->st = st;
                    snprintf(a->detail, sizeof a->detail, "%s", refit_last_error());
                }
                break;
            }
        }
    }
    pthread_mutex_lock(&a->lock);
    a->s.units_written += s.units_written;
    a->s.bytes_written += s.bytes_written;
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

refit_status_t refit_delta_apply(const refit_delta_index_t *ix, const void *delta, size_t len, uint64_t have_version,
                                 void *const *dst_bases, refit_delta_apply_stats_t *stats)
{
    return refit_delta_apply_threads(ix, delta, len, have_version, dst_bases, 1, stats);
}

refit_status_t refit_delta_apply_threads(const refit_delta_index_t *ix, const void *delta, size_t len,
                                         uint64_t have_version, void *const *dst_bases, unsigned threads,
                                         refit_delta_apply_stats_t *stats)
{
    if (!ix || !delta || !dst_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_apply: NULL argument");
    refit_delta_info_t info;
    refit_status_t st = refit_delta_info(delta, len, &info);
    if (st) return st;
    if (info.total_bytes > len)
        return refit_error(REFIT_ERR_CORRUPT, "delta is %llu bytes, %zu given", (unsigned long long)info.total_bytes, len);
    if (info.region_bytes != ix->region_bytes)
        return refit_error(REFIT_ERR_CORRUPT, "delta of a %llu-byte region, the plan reads a %llu-byte one",
                           (unsigned long long)info.region_bytes, (unsigned long long)ix->region_bytes);
    if (info.base_version != have_version)
        return refit_error(REFIT_ERR_STALE, "delta %llu -> %llu does not apply to version %llu (a full refit is needed)",
                           (unsigned long long)info.base_version, (unsigned long long)info.version,
                           (unsigned long long)have_version);
    const unsigned char *p = delta;
    uint32_t bb = rd32(p + 8);
    apply_ctx_t a = {.ix = ix, .p = p, .info = &info, .bb = bb, .dst_bases = dst_bases};
    atomic_init(&a.next, 0);
    atomic_init(&a.failed, 0);
    pthread_mutex_init(&a.lock, NULL);
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    if (threads > 64) threads = 64;
    pthread_t tid[64];
    unsigned started = 0;
    for (unsigned t = 1; t < threads; t++)
        if (!pthread_create(&tid[started], NULL, apply_worker, &a)) started++;
    apply_worker(&a);
    for (unsigned t = 0; t < started; t++) pthread_join(tid[t], NULL);
    pthread_mutex_destroy(&a.lock);
    if (atomic_load(&a.failed)) return refit_error(a.st, "%s", a.detail);
    if (stats) *stats = a.s;
    return REFIT_OK;
}

struct refit_delta_encoder {
    uint32_t n;
    uint64_t *sizes;
    unsigned char **copies;
    uint64_t version;
    refit_delta_params_t params;
};

refit_status_t refit_delta_encoder_create(const uint64_t *sizes, uint32_t n, const refit_delta_params_t *params,
                                          refit_delta_encoder_t **out)
{
    if (!sizes || !out || !n) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_encoder_create: bad argument");
    refit_delta_encoder_t *e = calloc(1, sizeof(*e));
    if (!e) return refit_error(REFIT_ERR_NO_MEMORY, "delta encoder");
    e->n = n;
    e->sizes = calloc(n, sizeof(uint64_t));
    e->copies = calloc(n, sizeof(void *));
    if (params) e->params = *params;
    if (!e->sizes || !e->copies) goto oom;
    for (uint32_t r = 0; r < n; r++) {
        if (sizes[r] & 1) {
            refit_delta_encoder_destroy(e);
            return refit_error(REFIT_ERR_INVALID_ARG, "region %u has an odd size", r);
        }
        e->sizes[r] = sizes[r];
        if (!(e->copies[r] = malloc(sizes[r] ? sizes[r] : 1))) goto oom;
    }
    *out = e;
    return REFIT_OK;
oom:
    refit_delta_encoder_destroy(e);
    return refit_error(REFIT_ERR_NO_MEMORY, "delta encoder copies");
}

uint64_t refit_delta_encoder_version(const refit_delta_encoder_t *e) { return e ? e->version : 0; }

refit_status_t refit_delta_encoder_publish(refit_delta_encoder_t *e, const void *const *bases, uint64_t version,
                                           void **deltas, size_t *lens)
{
    if (!e || !bases || !deltas || !lens) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_encoder_publish: NULL");
    if (version <= e->version)
        return refit_error(REFIT_ERR_INVALID_ARG, "version %llu is not newer than %llu", (unsigned long long)version,
                           (unsigned long long)e->version);
    for (uint32_t r = 0; r < e->n; r++) {
        deltas[r] = NULL;
        lens[r] = 0;
    }
    if (e->version) {
        for (uint32_t r = 0; r < e->n; r++) {
            refit_status_t st =
                refit_delta_encode(e->copies[r], bases[r], e->sizes[r], e->version, version, &e->params, &deltas[r], &lens[r]);
            if (st) {
                for (uint32_t k = 0; k < r; k++) {
                    free(deltas[k]);
                    deltas[k] = NULL;
                }
                return st;
            }
        }
    }
    for (uint32_t r = 0; r < e->n; r++) memcpy(e->copies[r], bases[r], e->sizes[r]);
    e->version = version;
    return REFIT_OK;
}

void refit_delta_encoder_destroy(refit_delta_encoder_t *e)
{
    if (!e) return;
    for (uint32_t r = 0; e->copies && r < e->n; r++) free(e->copies[r]);
    free(e->copies);
    free(e->sizes);
    free(e);
}
