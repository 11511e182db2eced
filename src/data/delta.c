/* Delta refit: encoding at the source, plan-guided application at the
 * destination.  See refit/delta.h for the format. */
#include "refit/delta.h"

#include <stdlib.h>
#include <string.h>

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

/* Calls fn(ctx, so, dof, run) for each row of each region of plan reading (src, src_region). */
#define FOR_ROWS(plan, src, src_region, ...)                                                        \
    do {                                                                                             \
        size_t nr_;                                                                                  \
        const refit_plan_region_t *rv_ = refit_plan_regions(plan, &nr_);                             \
        for (size_t i_ = 0; i_ < nr_; i_++) {                                                        \
            const refit_plan_region_t *r = &rv_[i_];                                                 \
            if (r->src != (src) || r->src_region != (src_region)) continue;                          \
            uint64_t rows_ = 1;                                                                      \
            for (uint32_t l_ = 0; l_ < r->nloops; l_++) rows_ *= r->count[l_];                       \
            for (uint64_t row_ = 0; row_ < rows_; row_++) {                                          \
                uint64_t so = r->src_offset, dof = r->dst_offset, k_ = row_;                         \
                for (uint32_t l_ = 0; l_ < r->nloops; l_++) {                                        \
                    so += (k_ % r->count[l_]) * r->src_stride[l_];                                   \
                    dof += (k_ % r->count[l_]) * r->dst_stride[l_];                                  \
                    k_ /= r->count[l_];                                                              \
                }                                                                                    \
                uint64_t run = r->run;                                                               \
                __VA_ARGS__ \
            }                                                                                        \
        }                                                                                            \
    } while (0)

void refit_delta_mark(const refit_plan_t *plan, uint32_t src, uint32_t src_region, uint64_t nchunks, uint8_t *need)
{
    FOR_ROWS(plan, src, src_region, {
        (void)dof;
        if (!run) continue;
        for (uint64_t c = so / CB; c <= (so + run - 1) / CB && c < nchunks; c++) need[c] = 1;
    });
}

refit_status_t refit_delta_apply(const refit_plan_t *plan, uint32_t src, uint32_t src_region, const void *delta,
                                 size_t len, const uint8_t *need, uint64_t have_version, void *const *dst_bases,
                                 refit_delta_apply_stats_t *stats)
{
    if (!plan || !delta || !dst_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_delta_apply: NULL argument");
    refit_delta_info_t info;
    refit_status_t st = refit_delta_info(delta, len, &info);
    if (st) return st;
    if (info.base_version != have_version)
        return refit_error(REFIT_ERR_STALE, "delta %llu -> %llu does not apply to version %llu (a full refit is needed)",
                           (unsigned long long)info.base_version, (unsigned long long)info.version,
                           (unsigned long long)have_version);
    const unsigned char *p = delta;
    uint32_t bb = rd32(p + 8);
    refit_delta_apply_stats_t s = {0};
    st = REFIT_OK;
    FOR_ROWS(plan, src, src_region, {
        if (st) break;
        s.rows++;
        if (so + run > info.region_bytes) {
            st = refit_error(REFIT_ERR_OUT_OF_BOUNDS, "plan reads past the delta's region");
            break;
        }
        unsigned char *dst = (unsigned char *)dst_bases[r->dst_region] + dof;
        for (uint64_t c = so / CB; run && c <= (so + run - 1) / CB; c++) {
            const unsigned char *e = p + HDR + c * ENTRY;
            uint32_t kind = rd32(e + 12), count = rd32(e + 8);
            if (kind == K_NONE) continue;
            if (need && !need[c]) {
                st = refit_error(REFIT_ERR_INVALID_ARG, "delta chunk %llu is read but was not fetched",
                                 (unsigned long long)c);
                break;
            }
            const unsigned char *pay = p + rd64(e);
            uint64_t c0 = c * CB, lo = so > c0 ? so : c0, hi = so + run < c0 + CB ? so + run : c0 + CB;
            if (kind == K_DENSE) {
                memcpy(dst + (lo - so), pay + (lo - c0), hi - lo);
                s.units_written += (hi - lo) / 2;
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
                for (uint32_t k = L; k < count; k++) {
                    uint16_t v;
                    memcpy(&v, pay + (uint64_t)k * 2, 2);
                    uint64_t pos = c0 + (uint64_t)v * 2;
                    if (pos >= hi) break;
                    uint64_t b0 = pos > lo ? pos : lo, b1 = pos + 2 < hi ? pos + 2 : hi;
                    memcpy(dst + (b0 - so), vals + (uint64_t)k * 2 + (b0 - pos), b1 - b0);
                    s.units_written++;
                }
            } else {
                uint64_t cb = info.region_bytes - c0 < CB ? info.region_bytes - c0 : CB;
                uint64_t nb = (cb + bb - 1) / bb, nbits = (nb + 7) / 8;
                uint64_t first = (lo - c0) / bb, last = (hi - 1 - c0) / bb, rank = 0;
                for (uint64_t k = 0; k < first; k++) rank += (pay[k / 8] >> (k % 8)) & 1;
                for (uint64_t k = first; k <= last; k++) {
                    if (!((pay[k / 8] >> (k % 8)) & 1)) continue;
                    uint64_t bs = c0 + k * bb, b0 = bs > lo ? bs : lo, b1 = bs + bb < hi ? bs + bb : hi;
                    memcpy(dst + (b0 - so), pay + nbits + rank * bb + (b0 - bs), b1 - b0);
                    s.units_written += (b1 - b0) / 2;
                    rank++;
                }
            }
        }
    });
    if (stats) *stats = s;
    return st;
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
