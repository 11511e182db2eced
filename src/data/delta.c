/* Delta refit: encoding at the source, plan-guided application at the
 * destination.  See refit/experimental/delta.h for the format. */
#include "refit/experimental/delta.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/delta_hashed.h"
#include "plan/plan.h"
#include "util/util.h"

#define MAGIC 0x31444652u /* "RFD1" */
#define HDR 64u
#define ENTRY 16u
#define CB ((uint64_t)REFIT_DELTA_CHUNK_UNITS * 2) /* chunk bytes */

enum { K_NONE = 0, K_SPARSE = 1, K_DENSE = 2, K_BLOCKS = 3 };

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
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

/* Encodes chunks [c0, c1) of cur against base: payloads into o (offsets in
 * the entries relative to o's start), entries into tab (the chunk table).
 * With upd, the changed bytes are also written into base (upd == base), so a
 * kept copy becomes cur without a second pass over the region. */
typedef struct {
    unsigned char *upd;
    const unsigned char *a, *b;
    uint64_t nbytes, c0, c1;
    refit_delta_changed_fn fn; /* refit_delta_encoder_watch */
    void *ctx;
    uint32_t region, worker;
    refit_delta_format_t fmt;
    uint32_t bb;
    unsigned char *tab;
    buf_t o;
    uint64_t changed;
    int oom;
} erange_t;

static void *encode_range(void *arg)
{
    erange_t *w = arg;
    const uint64_t bb = w->bb;
    uint16_t *idx = malloc(REFIT_DELTA_CHUNK_UNITS * sizeof(uint16_t));
    uint8_t *bits = w->fmt == REFIT_DELTA_BLOCKS ? malloc(CB / bb / 8 + 1) : NULL;
    if (!idx || (w->fmt == REFIT_DELTA_BLOCKS && !bits)) goto oom;
    for (uint64_t c = w->c0; c < w->c1; c++) {
        uint64_t off = c * CB, cb = w->nbytes - off < CB ? w->nbytes - off : CB, units = cb / 2;
        const unsigned char *x = w->a + off, *y = w->b + off;
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
        w->changed += n;
        if (n == 0) continue;
        uint64_t dense_cost = cb, cost;
        uint32_t kind, count = n;
        if (w->fmt == REFIT_DELTA_SPARSE) {
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
        size_t at = w->o.len;
        if (buf_need(&w->o, cost)) goto oom;
        unsigned char *e = w->tab + c * ENTRY;
        wr64(e, at);
        wr32(e + 8, count);
        wr32(e + 12, kind);
        unsigned char *q = w->o.p + at;
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
        w->o.len += cost;
        if (w->fn) w->fn(w->ctx, w->worker, w->region, off, cb, kind == K_DENSE ? NULL : idx, n, w->b, w->a);
        if (w->upd) {
            unsigned char *z = w->upd + off;
            if (kind == K_SPARSE || kind == K_BLOCKS)
                for (uint32_t k = 0; k < n; k++) memcpy(z + (uint64_t)idx[k] * 2, y + (uint64_t)idx[k] * 2, 2);
            else memcpy(z, y, cb);
        }
    }
    free(idx);
    free(bits);
    return NULL;
oom:
    free(idx);
    free(bits);
    w->oom = 1;
    return NULL;
}

/* What encode tells a watcher (refit_delta_encoder_watch): fn NULL for none. */
typedef struct {
    refit_delta_changed_fn fn;
    void *ctx;
    uint32_t region;
} watch_t;

static refit_status_t encode(unsigned char *upd, const void *base, const void *cur, uint64_t nbytes,
                             uint64_t base_version, uint64_t version, const refit_delta_params_t *params,
                             const watch_t *watch, void **out, size_t *len)
{
    if (!base || !cur || !out || !len || (nbytes & 1))
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_encode: NULL argument or odd size");
    refit_delta_format_t fmt = params ? params->format : REFIT_DELTA_SPARSE;
    uint32_t bb = params && params->block_bytes ? params->block_bytes : 64;
    if (fmt == REFIT_DELTA_BLOCKS && ((bb & 1) || CB % bb))
        return refit_error(REFIT_ERR_INVALID_ARG, "block_bytes %u must be even and divide %llu", bb,
                           (unsigned long long)CB);
    uint64_t nchunks = (nbytes + CB - 1) / CB, tb = HDR + nchunks * ENTRY;
    unsigned nt = params && params->threads ? params->threads : 1;
    if (nt > 64) nt = 64;
    if (nt > nchunks) nt = nchunks ? (unsigned)nchunks : 1;
    unsigned char *hdr = calloc(1, tb);
    erange_t *w = calloc(nt, sizeof(*w));
    refit_status_t st = REFIT_OK;
    if (!hdr || !w) goto oom;
    for (unsigned t = 0; t < nt; t++)
        w[t] = (erange_t){.upd = upd,
                          .a = base,
                          .b = cur,
                          .nbytes = nbytes,
                          .c0 = nchunks * t / nt,
                          .c1 = nchunks * (t + 1) / nt,
                          .fmt = fmt,
                          .bb = bb,
                          .tab = hdr + HDR,
                          .fn = watch ? watch->fn : NULL,
                          .ctx = watch ? watch->ctx : NULL,
                          .region = watch ? watch->region : 0,
                          .worker = t};
    pthread_t tid[64];
    unsigned started = 0;
    for (unsigned t = 1; t < nt; t++)
        if (!pthread_create(&tid[t], NULL, encode_range, &w[t])) started = t;
        else break;
    for (unsigned t = started + 1; t < nt; t++) encode_range(&w[t]); /* threads that did not start */
    encode_range(&w[0]);
    for (unsigned t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    uint64_t total = tb, changed = 0;
    for (unsigned t = 0; t < nt; t++) {
        if (w[t].oom) goto oom;
        total += w[t].o.len;
        changed += w[t].changed;
    }
    unsigned char *o = realloc(hdr, total ? total : 1);
    if (!o) goto oom;
    hdr = o;
    uint64_t at = tb;
    for (unsigned t = 0; t < nt; t++) {
        for (uint64_t c = w[t].c0; c < w[t].c1; c++) {
            unsigned char *e = o + HDR + c * ENTRY;
            if (rd32(e + 12) != K_NONE) wr64(e, rd64(e) + at);
        }
        if (w[t].o.len) memcpy(o + at, w[t].o.p, w[t].o.len);
        at += w[t].o.len;
    }
    wr32(o, MAGIC);
    wr32(o + 4, (uint32_t)fmt);
    wr32(o + 8, bb);
    wr32(o + 12, 2);
    wr64(o + 16, base_version);
    wr64(o + 24, version);
    wr64(o + 32, nbytes);
    wr64(o + 40, nchunks);
    wr64(o + 48, changed);
    wr64(o + 56, total);
    *out = o;
    *len = total;
    hdr = NULL;
    goto done;
oom:
    st = refit_error(REFIT_ERR_NO_MEMORY, "encoding a delta");
done:
    for (unsigned t = 0; w && t < nt; t++) free(w[t].o.p);
    free(w);
    free(hdr);
    return st;
}

refit_status_t refit_delta_encode(const void *base, const void *cur, uint64_t nbytes, uint64_t base_version,
                                  uint64_t version, const refit_delta_params_t *params, void **out, size_t *len)
{
    return encode(NULL, base, cur, nbytes, base_version, version, params, NULL, out, len);
}

uint64_t refit_delta_table_bytes(uint64_t region_bytes) { return HDR + (region_bytes + CB - 1) / CB * ENTRY; }

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
    if (out) {
        refit_status_t st = refit_out_check(out->size, REFIT_END_OF(refit_delta_info_t, block_chunks),
                                            "refit_delta_info_t");
        if (st) return st;
    }
    uint64_t hb = refit_delta_header_bytes(delta, len);
    if (!hb || hb > len) return refit_error(REFIT_ERR_CORRUPT, "not a delta, or its chunk table is truncated");
    refit_delta_info_t d = {.base_version = rd64(p + 16),
                            .version = rd64(p + 24),
                            .region_bytes = rd64(p + 32),
                            .nchunks = rd64(p + 40),
                            .changed_units = rd64(p + 48),
                            .total_bytes = rd64(p + 56),
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
    if (out) refit_out_write(out, out->size, &d, sizeof(d));
    return REFIT_OK;
}

/* A plan region reading the indexed source region, normalized so that its
 * rows ascend in source order without overlapping ("nested": each loop's
 * source stride spans the loops inside it).  Then the changes of a chunk,
 * which ascend too, and the rows can be walked together with one cursor and
 * no division.  A plan region whose rows cannot be ordered so (rows that
 * overlap or repeat a source byte) is kept as one region per row. */
typedef struct {
    uint32_t dst_region, nloops;
    uint64_t src_offset, dst_offset, run;
    uint64_t count[REFIT_PLAN_MAX_LOOPS], src_stride[REFIT_PLAN_MAX_LOOPS], dst_stride[REFIT_PLAN_MAX_LOOPS];
    bool even; /* rows start and end on even source bytes: a 2-byte unit lies in one row or none */
} ireg_t;

/* A position in a region's rows: the row's source and destination offsets. */
typedef struct {
    uint64_t so, dof;
    uint64_t k[REFIT_PLAN_MAX_LOOPS];
    bool done; /* past the last row */
} cursor_t;

/* The part of one region inside one chunk, with the cursor on the first row
 * that ends after lo, so that applying a chunk never searches the rows. */
typedef struct {
    uint32_t reg;
    uint64_t lo, hi; /* source bytes of the region's span inside the chunk */
    cursor_t at;
} piece_t;

struct refit_delta_index {
    ireg_t *regs;
    size_t nregs;
    uint64_t nchunks, region_bytes;
    uint8_t *need;
    uint32_t *start; /* nchunks + 1: CSR of pieces per chunk */
    piece_t *pieces;
};

/* Moves to the next row (false after the last). */
static inline bool next_row(const ireg_t *g, cursor_t *c)
{
    for (uint32_t i = 0; i < g->nloops; i++) {
        if (++c->k[i] < g->count[i]) {
            c->so += g->src_stride[i];
            c->dof += g->dst_stride[i];
            return true;
        }
        c->so -= (g->count[i] - 1) * g->src_stride[i];
        c->dof -= (g->count[i] - 1) * g->dst_stride[i];
        c->k[i] = 0;
    }
    c->done = true;
    return false;
}

/* The cursor on the first row ending after source byte pos (done: none). */
static cursor_t seek(const ireg_t *g, uint64_t pos)
{
    cursor_t c = {.so = g->src_offset, .dof = g->dst_offset};
    uint64_t rel = pos < g->src_offset ? 0 : pos - g->src_offset;
    for (int i = (int)g->nloops - 1; i >= 0; i--) { /* the last row starting at or before pos */
        uint64_t k = rel / g->src_stride[i];
        if (k >= g->count[i]) k = g->count[i] - 1;
        rel -= k * g->src_stride[i];
        c.k[i] = k;
        c.so += k * g->src_stride[i];
        c.dof += k * g->dst_stride[i];
    }
    if (c.so + g->run <= pos) next_row(g, &c); /* pos lies in the gap after that row */
    return c;
}

/* Normalizes plan region r into g: loops of one iteration dropped, the
 * others ordered by source stride.  False if its rows are still not nested. */
static bool normalize(const refit_plan_region_t *r, ireg_t *g)
{
    *g = (ireg_t){.dst_region = r->dst_region, .src_offset = r->src_offset, .dst_offset = r->dst_offset, .run = r->run};
    for (uint32_t i = 0; i < r->nloops; i++) {
        if (r->count[i] == 1) continue;
        uint32_t j = g->nloops++;
        for (; j > 0 && g->src_stride[j - 1] > r->src_stride[i]; j--) { /* insertion by source stride */
            g->count[j] = g->count[j - 1];
            g->src_stride[j] = g->src_stride[j - 1];
            g->dst_stride[j] = g->dst_stride[j - 1];
        }
        g->count[j] = r->count[i];
        g->src_stride[j] = r->src_stride[i];
        g->dst_stride[j] = r->dst_stride[i];
    }
    uint64_t inner = g->run, odd = g->src_offset | g->run;
    for (uint32_t i = 0; i < g->nloops; i++) {
        if (g->src_stride[i] < inner) return false;
        inner += g->src_stride[i] * (g->count[i] - 1);
        odd |= g->src_stride[i];
    }
    g->even = !(odd & 1);
    return true;
}

static uint64_t ireg_end(const ireg_t *g)
{
    uint64_t e = g->src_offset + g->run;
    for (uint32_t i = 0; i < g->nloops; i++) e += (g->count[i] - 1) * g->src_stride[i];
    return e;
}

void refit_delta_index_destroy(refit_delta_index_t *ix)
{
    if (!ix) return;
    free(ix->regs);
    free(ix->need);
    free(ix->start);
    free(ix->pieces);
    free(ix);
}

/* Appends g, growing the array as needed. */
static int add_reg(refit_delta_index_t *ix, size_t *cap, const ireg_t *g)
{
    if (ix->nregs == *cap) {
        size_t n = *cap ? *cap * 2 : 64;
        ireg_t *q = realloc(ix->regs, n * sizeof(*q));
        if (!q) return -1;
        ix->regs = q;
        *cap = n;
    }
    ix->regs[ix->nregs++] = *g;
    return 0;
}

/* Calls fn(ix, chunk, piece) for each piece (in region, then chunk order):
 * each chunk a region's span meets that holds a byte of one of its rows. */
static int each_piece(refit_delta_index_t *ix, int (*fn)(refit_delta_index_t *, uint64_t, const piece_t *))
{
    for (size_t i = 0; i < ix->nregs; i++) {
        const ireg_t *g = &ix->regs[i];
        uint64_t lo = g->src_offset, end = ireg_end(g);
        for (uint64_t c = lo / CB; c <= (end - 1) / CB; c++) {
            piece_t pc = {.reg = (uint32_t)i, .lo = c * CB > lo ? c * CB : lo};
            pc.hi = (c + 1) * CB < end ? (c + 1) * CB : end;
            pc.at = seek(g, pc.lo);
            if (pc.at.done || pc.at.so >= pc.hi) continue; /* the chunk falls between rows */
            if (fn(ix, c, &pc)) return -1;
        }
    }
    return 0;
}

static int count_piece(refit_delta_index_t *ix, uint64_t c, const piece_t *pc)
{
    (void)pc;
    ix->start[c + 1]++;
    ix->need[c] = 1;
    return 0;
}

static int fill_piece(refit_delta_index_t *ix, uint64_t c, const piece_t *pc)
{
    ix->pieces[ix->start[c]++] = *pc; /* start[c] is a fill pointer here, shifted back after */
    return 0;
}

refit_status_t refit_delta_index_create(const refit_plan_t *plan, uint32_t src, uint32_t src_region,
                                        uint64_t region_bytes, refit_delta_index_t **out)
{
    if (!plan || !out) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_index_create: NULL argument");
    refit_delta_index_t *ix = calloc(1, sizeof(*ix));
    if (!ix) return refit_error(REFIT_ERR_NO_MEMORY, "delta index");
    size_t nr, cap = 0;
    const refit_plan_region_t *rv = refit_plan_regions(plan, &nr);
    ix->region_bytes = region_bytes;
    ix->nchunks = (region_bytes + CB - 1) / CB;
    ix->need = calloc(ix->nchunks ? ix->nchunks : 1, 1);
    ix->start = calloc(ix->nchunks + 1, sizeof(uint32_t));
    if (!ix->need || !ix->start) goto oom;
    for (size_t i = 0; i < nr; i++) {
        const refit_plan_region_t *r = &rv[i];
        if (r->src != src || r->src_region != src_region || !r->run) continue;
        uint64_t rows = 1;
        for (uint32_t l = 0; l < r->nloops; l++) rows *= r->count[l];
        if (!rows) continue;
        if (refit_region_src_end(r) > region_bytes) {
            refit_delta_index_destroy(ix);
            return refit_error(REFIT_ERR_OUT_OF_BOUNDS, "plan reads past byte %llu of the source region",
                               (unsigned long long)region_bytes);
        }
        ireg_t g;
        if (normalize(r, &g)) {
            if (add_reg(ix, &cap, &g)) goto oom;
            continue;
        }
        for (uint64_t row = 0; row < rows; row++) { /* not nested: one region per row */
            ireg_t one = {.dst_region = r->dst_region, .run = r->run};
            refit_region_row_offsets(r, row, &one.src_offset, &one.dst_offset);
            one.even = !((one.src_offset | one.run) & 1);
            if (add_reg(ix, &cap, &one)) goto oom;
        }
    }
    if (each_piece(ix, count_piece)) goto oom;
    for (uint64_t c = 0; c < ix->nchunks; c++) ix->start[c + 1] += ix->start[c];
    if (!(ix->pieces = malloc((ix->start[ix->nchunks] ? ix->start[ix->nchunks] : 1) * sizeof(piece_t)))) goto oom;
    each_piece(ix, fill_piece);
    for (uint64_t c = ix->nchunks; c > 0; c--) ix->start[c] = ix->start[c - 1];
    ix->start[0] = 0;
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

/* The receiver's digests kept up to date by the apply (refit_delta_apply_hashed); one per thread. */
typedef struct {
    const refit_digest_map_t *map;
    refit_dsum_t *acc;
    refit_digest_cursor_t cur;
} dhash_t;

/* Writes n bytes at destination offset dof of region g's destination (through the digest map when h). */
static inline void put(const ireg_t *g, dhash_t *h, unsigned char *dst, uint64_t dof, const unsigned char *src,
                       uint64_t n)
{
    if (h) refit_digest_map_update(h->map, &h->cur, g->dst_region, dof, dst + dof, src, n, h->acc);
    else memcpy(dst + dof, src, n);
}

/* Copies source bytes [lo, hi) that region g reads from data (data[0] is
 * source byte at), moving the cursor forward; successive calls on one
 * cursor must ascend.  Returns the bytes written. */
static uint64_t walk_copy(const ireg_t *g, cursor_t *c, uint64_t lo, uint64_t hi, const unsigned char *data,
                          uint64_t at, unsigned char *dst, dhash_t *h)
{
    uint64_t n = 0;
    while (!c->done && c->so < hi) {
        uint64_t e = c->so + g->run;
        if (e > lo) {
            uint64_t b0 = c->so > lo ? c->so : lo, b1 = e < hi ? e : hi;
            put(g, h, dst, c->dof + (b0 - c->so), data + (b0 - at), b1 - b0);
            n += b1 - b0;
        }
        if (e > hi) break; /* the next range may start in this row */
        next_row(g, c);
    }
    return n;
}

enum { SPARSE_AHEAD = 32, SPARSE_BATCH = 32 };

/* apply_sparse's tight loop with digests: the changes are written SPARSE_BATCH at a time, SPARSE_AHEAD changes
 * after their lines were asked for, and each batch's sums computed together (refit_digest_map_update_units: 16
 * units a vector where the kernel is AVX-512; the scalar update of one unit at a time cost about 7 ns a change,
 * docs/digest.md). */
static uint64_t apply_sparse_hashed(const ireg_t *g, const piece_t *pc, uint64_t c0, const unsigned char *idx,
                                    const unsigned char *vals, uint32_t count, uint32_t L, cursor_t cur,
                                    unsigned char *dst, dhash_t *h)
{
    enum { RING = SPARSE_AHEAD + SPARSE_BATCH };
    uint64_t so = cur.so, end = so + g->run, shift = cur.dof - so, n = 0;
    uint64_t at[RING], offs[SPARSE_BATCH];
    uint16_t nv[SPARSE_BATCH];
    uint32_t from[RING], nb = 0; /* the changes found and not yet written: n, n + 1, ... (mod the ring) */
    bool more = true, last = false;
    for (uint32_t k = L; !last; k++) {
        last = k >= count || !more;
        if (!last) {
            uint16_t v;
            memcpy(&v, idx + (uint64_t)k * 2, 2);
            uint64_t pos = c0 + (uint64_t)v * 2;
            if (pos >= pc->hi) {
                last = true;
            } else {
                while (pos >= end && (more = next_row(g, &cur))) {
                    so = cur.so;
                    end = so + g->run;
                    shift = cur.dof - so;
                }
                if (!more) last = true;
                else if (pos >= so) {
                    uint32_t slot = (uint32_t)((n + nb) % RING);
                    at[slot] = shift + pos;
                    from[slot] = k;
                    __builtin_prefetch(dst + at[slot], 1);
                    nb++;
                }
            }
        }
        /* A full batch whose lines have had SPARSE_AHEAD changes' time to come; at the end, whatever is left. */
        while (nb >= (last ? 1 : RING)) {
            uint32_t b = nb < SPARSE_BATCH ? nb : SPARSE_BATCH;
            for (uint32_t y = 0; y < b; y++) {
                uint32_t slot = (uint32_t)((n + y) % RING);
                offs[y] = at[slot];
                memcpy(&nv[y], vals + (uint64_t)from[slot] * 2, 2);
            }
            refit_digest_map_update_units(h->map, &h->cur, g->dst_region, dst, offs, nv, b, h->acc);
            n += b;
            nb -= b;
        }
    }
    return n;
}

/* Sparse changes of one piece: idx/vals hold the chunk's count changes
 * (chunk-relative unit indices, ascending).  Returns the units written. */
static uint64_t apply_sparse(const ireg_t *g, const piece_t *pc, uint64_t c0, const unsigned char *idx,
                             const unsigned char *vals, uint32_t count, unsigned char *dst, dhash_t *h)
{
    uint32_t L = 0, H = count, want = (uint32_t)((pc->lo - c0) / 2); /* first change at or after lo */
    while (L < H) {
        uint32_t M = L + (H - L) / 2;
        uint16_t v;
        memcpy(&v, idx + (uint64_t)M * 2, 2);
        if (v < want) L = M + 1;
        else H = M;
    }
    cursor_t cur = pc->at;
    uint64_t n = 0;
    if (!g->even) { /* a unit may straddle rows: copy what each row holds of it */
        for (uint32_t k = L; k < count; k++) {
            uint16_t v;
            memcpy(&v, idx + (uint64_t)k * 2, 2);
            uint64_t pos = c0 + (uint64_t)v * 2;
            if (pos >= pc->hi) break;
            n += walk_copy(g, &cur, pos, pos + 2, vals + (uint64_t)k * 2, pos, dst, h) ? 1 : 0;
        }
        return n;
    }
    /* The tight loop: the row is [so, end) and a change at pos lands at
     * dst + shift + pos (shift = dof - so wraps as unsigned; the sum is the
     * destination offset).  Each change's destination line is asked for
     * SPARSE_AHEAD changes before it is written (with digests, 32 to 63 in
     * apply_sparse_hashed's batches): a change is one unit in a line of its
     * own, and with digests its write reads the old unit first, a miss that
     * stalled every change (140-170 ms for 2.8 M changes, 60-80 without
     * digests; docs/digest.md). */
    if (h) return apply_sparse_hashed(g, pc, c0, idx, vals, count, L, cur, dst, h);
    uint64_t so = cur.so, end = so + g->run, shift = cur.dof - so;
    uint64_t at[SPARSE_AHEAD];
    uint32_t from[SPARSE_AHEAD], nb = 0; /* the changes found and not yet written: n, n + 1, ... (mod the ring) */
    bool more = true;
    for (uint32_t k = L; k < count && more; k++) {
        uint16_t v;
        memcpy(&v, idx + (uint64_t)k * 2, 2);
        uint64_t pos = c0 + (uint64_t)v * 2;
        if (pos >= pc->hi) break;
        while (pos >= end && (more = next_row(g, &cur))) {
            so = cur.so;
            end = so + g->run;
            shift = cur.dof - so;
        }
        if (!more || pos < so) continue; /* past the last row, or in the gap before the row */
        uint32_t slot = (uint32_t)(n + nb) % SPARSE_AHEAD;
        if (nb == SPARSE_AHEAD) { /* the change found SPARSE_AHEAD changes ago: its line has had time to come */
            put(g, h, dst, at[slot], vals + (uint64_t)from[slot] * 2, 2);
            n++;
            nb--;
        }
        at[slot] = shift + pos;
        from[slot] = k;
        __builtin_prefetch(dst + at[slot], 1);
        nb++;
    }
    for (; nb; nb--, n++) {
        uint32_t slot = (uint32_t)n % SPARSE_AHEAD;
        put(g, h, dst, at[slot], vals + (uint64_t)from[slot] * 2, 2);
    }
    return n;
}

/* Applies chunk c (needed, of any kind) through every piece of it. */
static refit_status_t apply_chunk(const refit_delta_index_t *ix, const unsigned char *p, const refit_delta_info_t *info,
                                  uint32_t bb, uint64_t c, void *const *dst_bases, refit_delta_apply_stats_t *s,
                                  dhash_t *h)
{
    const unsigned char *e = p + HDR + c * ENTRY;
    uint32_t kind = rd32(e + 12), count = rd32(e + 8);
    if (kind == K_NONE) return REFIT_OK;
    const unsigned char *pay = p + rd64(e);
    uint64_t c0 = c * CB, cb = info->region_bytes - c0 < CB ? info->region_bytes - c0 : CB;
    if (kind == K_SPARSE) { /* the apply loop trusts ascending indices inside the chunk: check them once */
        uint32_t prev = 0;
        for (uint32_t k = 0; k < count; k++) {
            uint16_t v;
            memcpy(&v, pay + (uint64_t)k * 2, 2);
            if ((k && v <= prev) || (uint64_t)v * 2 + 2 > cb)
                return refit_error(REFIT_ERR_CORRUPT, "delta chunk %llu: sparse index %u of %u (%u) is %s",
                                   (unsigned long long)c, k, count, v,
                                   (uint64_t)v * 2 + 2 > cb ? "past the chunk" : "not ascending");
            prev = v;
        }
    }
    for (uint32_t pi = ix->start[c]; pi < ix->start[c + 1]; pi++) {
        const piece_t *pc = &ix->pieces[pi];
        const ireg_t *g = &ix->regs[pc->reg];
        unsigned char *dst = (unsigned char *)dst_bases[g->dst_region];
        if (kind == K_SPARSE) {
            s->units_written += apply_sparse(g, pc, c0, pay, pay + (uint64_t)count * 2, count, dst, h);
            continue;
        }
        cursor_t cur = pc->at;
        if (kind == K_DENSE) {
            s->bytes_written += walk_copy(g, &cur, pc->lo, pc->hi, pay, c0, dst, h);
            continue;
        }
        uint64_t nb = (cb + bb - 1) / bb, nbits = (nb + 7) / 8;
        uint64_t first = (pc->lo - c0) / bb, last = (pc->hi - 1 - c0) / bb, rank = 0;
        for (uint64_t k = 0; k < first; k++) rank += (pay[k / 8] >> (k % 8)) & 1;
        for (uint64_t k = first; k <= last; k++) {
            if (!((pay[k / 8] >> (k % 8)) & 1)) continue;
            if (rank >= count)
                return refit_error(REFIT_ERR_CORRUPT, "delta chunk %llu: more blocks than it holds",
                                   (unsigned long long)c);
            uint64_t bs = c0 + k * bb, b0 = bs > pc->lo ? bs : pc->lo, b1 = bs + bb < pc->hi ? bs + bb : pc->hi;
            s->bytes_written += walk_copy(g, &cur, b0, b1, pay + nbits + rank * bb + (b0 - bs), b0, dst, h);
            rank++;
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
    const refit_digest_map_t *map; /* NULL: no digests kept */
    refit_dsum_t *acc;
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
    dhash_t hash = {.map = a->map, .acc = a->acc}, *h = a->map ? &hash : NULL;
    while (!atomic_load(&a->failed)) {
        uint64_t c0 = atomic_fetch_add(&a->next, APPLY_TASK);
        if (c0 >= a->ix->nchunks) break;
        for (uint64_t c = c0; c < c0 + APPLY_TASK && c < a->ix->nchunks; c++) {
            if (!a->ix->need[c]) continue;
            refit_status_t st = apply_chunk(a->ix, a->p, a->info, a->bb, c, a->dst_bases, &s, h);
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
    if (h) refit_digest_cursor_flush(&h->cur);
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
    return refit_delta_apply_hashed(ix, delta, len, have_version, dst_bases, threads, stats, NULL, NULL);
}

refit_status_t refit_delta_apply_hashed(const refit_delta_index_t *ix, const void *delta, size_t len,
                                        uint64_t have_version, void *const *dst_bases, unsigned threads,
                                        refit_delta_apply_stats_t *stats, const refit_digest_map_t *map,
                                        refit_dsum_t *acc)
{
    if (map && !acc) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_apply_hashed: a map without its sums");
    if (!ix || !delta || !dst_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_apply: NULL argument");
    refit_status_t st;
    if (stats && (st = refit_out_check(stats->size, REFIT_END_OF(refit_delta_apply_stats_t, bytes_written),
                                       "refit_delta_apply_stats_t")))
        return st;
    refit_delta_info_t info = REFIT_DELTA_INFO_INIT;
    st = refit_delta_info(delta, len, &info);
    if (st) return st;
    if (info.total_bytes > len)
        return refit_error(REFIT_ERR_CORRUPT, "delta is %llu bytes, %zu given", (unsigned long long)info.total_bytes,
                           len);
    if (info.region_bytes != ix->region_bytes)
        return refit_error(REFIT_ERR_CORRUPT, "delta of a %llu-byte region, the plan reads a %llu-byte one",
                           (unsigned long long)info.region_bytes, (unsigned long long)ix->region_bytes);
    if (info.base_version != have_version)
        return refit_error(
            REFIT_ERR_STALE, "delta %llu -> %llu does not apply to version %llu (a full refit is needed)",
            (unsigned long long)info.base_version, (unsigned long long)info.version, (unsigned long long)have_version);
    const unsigned char *p = delta;
    uint32_t bb = rd32(p + 8);
    apply_ctx_t a = {.ix = ix, .p = p, .info = &info, .bb = bb, .dst_bases = dst_bases, .map = map, .acc = acc};
    atomic_init(&a.next, 0);
    atomic_init(&a.failed, 0);
    pthread_mutex_init(&a.lock, NULL);
    refit_run_threads(apply_worker, &a, threads);
    pthread_mutex_destroy(&a.lock);
    if (atomic_load(&a.failed)) return refit_error(a.st, "%s", a.detail);
    if (stats) refit_out_write(stats, stats->size, &a.s, sizeof(a.s));
    return REFIT_OK;
}

struct refit_delta_encoder {
    uint32_t n;
    uint64_t *sizes;
    unsigned char **copies;
    uint64_t version;
    refit_delta_params_t params;
    refit_delta_changed_fn watch;
    void *watch_ctx;
};

void refit_delta_encoder_watch(refit_delta_encoder_t *e, refit_delta_changed_fn fn, void *ctx)
{
    if (!e) return;
    e->watch = fn;
    e->watch_ctx = ctx;
}

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
    if (!e || !bases || !deltas || !lens)
        return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_encoder_publish: NULL");
    if (version <= e->version)
        return refit_error(REFIT_ERR_INVALID_ARG, "version %llu is not newer than %llu", (unsigned long long)version,
                           (unsigned long long)e->version);
    for (uint32_t r = 0; r < e->n; r++) {
        deltas[r] = NULL;
        lens[r] = 0;
    }
    if (!e->version) {
        for (uint32_t r = 0; r < e->n; r++) memcpy(e->copies[r], bases[r], e->sizes[r]);
        e->version = version;
        return REFIT_OK;
    }
    /* Each region's encoding also brings its copy up to date (only the changed
     * bytes are written); a failure part-way leaves copies of two versions,
     * so the encoder starts over (the next publish yields no delta). */
    for (uint32_t r = 0; r < e->n; r++) {
        watch_t wt = {e->watch, e->watch_ctx, r};
        refit_status_t st = encode(e->copies[r], e->copies[r], bases[r], e->sizes[r], e->version, version, &e->params,
                                   &wt, &deltas[r], &lens[r]);
        if (st) {
            for (uint32_t k = 0; k < r; k++) {
                free(deltas[k]);
                deltas[k] = NULL;
                lens[k] = 0;
            }
            e->version = 0;
            return st;
        }
    }
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
