/* The synthetic truth: a value per (tensor, element, version), computed, never
 * stored.  Filling and verifying walk each placement row by row: the
 * canonical flat index and the local element index both advance by one along
 * the innermost dimension. */
#include "refit/experimental/truth.h"

#include <inttypes.h>
#include <string.h>

#include "layout/manifest.h"

uint64_t refit_truth_tensor_seed(const char *name) { return refit_hash64(name, strlen(name), 0x7472757468ULL); }

uint64_t refit_truth_value(uint64_t seed, refit_dtype_t dtype, uint64_t index, uint64_t version)
{
    uint64_t h = refit_mix64(seed ^ refit_mix64(index * 0x9e3779b97f4a7c15ULL + version * 0xc2b2ae3d27d4eb4fULL + 1));
    uint64_t sign = h >> 63, par = (index & 1) | ((version & 1) << 1);
    switch (dtype) {
    case REFIT_DTYPE_BF16: /* exponent 118..133: magnitudes ~2^-9..2^6 */
        return sign << 15 | (118 + ((h >> 8) & 15)) << 7 | ((h >> 20) & 0x7c) | par;
    case REFIT_DTYPE_F16: /* exponent 8..23 */
        return sign << 15 | (8 + ((h >> 8) & 15)) << 10 | ((h >> 20) & 0x3fc) | par;
    case REFIT_DTYPE_F32: return sign << 31 | (118 + ((h >> 8) & 15)) << 23 | ((h >> 24) & 0x7ffffc) | par;
    case REFIT_DTYPE_F8_E4M3: /* exponent 3..10 of 15 (bias 7): finite, never NaN */
        return sign << 7 | (3 + ((h >> 8) & 7)) << 3 | ((h >> 20) & 4) | par;
    case REFIT_DTYPE_I32: return ((h >> 2) << 2 | par) & 0xffffffffULL;
    case REFIT_DTYPE_I64: return (h >> 2) << 2 | par;
    case REFIT_DTYPE_U8: return ((h >> 2) << 2 | par) & 0xff;
    default: return 0;
    }
}

bool refit_truth_changed(uint64_t seed, uint64_t index, uint64_t version, double fraction)
{
    if (fraction >= 1.0) return true;
    if (fraction <= 0.0) return false;
    uint64_t h = refit_mix64(seed ^ 0x64656c7461ULL ^
                             refit_mix64(index * 0xd6e8feb86659fd93ULL + version * 0x9e3779b97f4a7c15ULL + 7));
    return (double)(h >> 11) * 0x1.0p-53 < fraction;
}

uint64_t refit_truth_value_delta(uint64_t seed, refit_dtype_t dtype, uint64_t index, uint64_t version, double fraction)
{
    uint64_t u = version;
    while (u > 0 && !refit_truth_changed(seed, index, u, fraction)) u--;
    return refit_truth_value(seed, dtype, index, u);
}

static inline void store(unsigned char *p, size_t es, uint64_t v)
{
    switch (es) {
    case 1: *p = (unsigned char)v; break;
    case 2: {
        uint16_t x = (uint16_t)v;
        memcpy(p, &x, 2);
    } break;
    case 4: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
    } break;
    default: memcpy(p, &v, 8); break;
    }
}

static inline uint64_t load(const unsigned char *p, size_t es)
{
    switch (es) {
    case 1: return *p;
    case 2: {
        uint16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    case 4: {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    default: {
        uint64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    }
}

typedef struct {
    const refit_manifest_t *m;
    uint64_t version;
    double fraction; /* >= 1: refit_truth_value */
    bool verify;
    unsigned char *const *bases;
    refit_truth_report_t rep;
    refit_status_t st;
} walk_t;

static void walk_placement(walk_t *w, const refit_placement_t *p)
{
    const refit_manifest_t *m = w->m;
    const refit_tdesc_t *c = &m->canon.data[p->canon];
    const refit_local_t *l = &m->locals.data[p->local];
    size_t es = refit_dtype_size(c->dtype);
    uint64_t cst[REFIT_MAX_DIMS], seed = refit_truth_tensor_seed(c->name);
    refit_tdesc_strides(c, cst);
    unsigned char *base = w->bases[l->region] + l->offset;
    uint32_t nd = p->ndim;
    uint64_t rows = 1, inner = p->extent[nd - 1];
    for (uint32_t d = 0; d + 1 < nd; d++) rows *= p->extent[d];
    uint64_t pt[REFIT_MAX_DIMS];
    for (uint64_t row = 0; row < rows; row++) {
        uint64_t rem = row;
        for (int d = (int)nd - 2; d >= 0; d--) {
            pt[d] = p->canon_offset[d] + rem % p->extent[d];
            rem /= p->extent[d];
        }
        pt[nd - 1] = p->canon_offset[nd - 1];
        uint64_t cidx = 0;
        for (uint32_t d = 0; d < nd; d++) cidx += pt[d] * cst[d];
        uint64_t lidx = refit_placement_local_index(m, p, pt);
        unsigned char *q = base + lidx * es;
        for (uint64_t k = 0; k < inner; k++, q += es) {
            uint64_t v = w->fraction >= 1.0
                             ? refit_truth_value(seed, c->dtype, cidx + k, w->version)
                             : refit_truth_value_delta(seed, c->dtype, cidx + k, w->version, w->fraction);
            if (!w->verify) {
                store(q, es, v);
                continue;
            }
            uint64_t got = load(q, es);
            if (got != v) {
                if (w->rep.mismatches++ == 0)
                    w->st = refit_error(REFIT_ERR_VERIFY,
                                        "%s element %" PRIu64 " (%s element %" PRIu64 ", version %" PRIu64
                                        "): expected 0x%" PRIx64 ", found 0x%" PRIx64,
                                        l->d.name, lidx + k, c->name, cidx + k, w->version, v, got);
            }
        }
        w->rep.elements_checked += inner;
        w->rep.bytes_checked += inner * es;
    }
}

static refit_status_t walk(walk_t *w)
{
    const refit_manifest_t *m = w->m;
    if (!m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "manifest is not finalized");
    for (size_t i = 0; i < m->placements.len; i++) walk_placement(w, &m->placements.data[i]);
    /* Padding: zero on fill, checked on verify. */
    for (uint32_t li = 0; li < m->locals.len; li++) {
        const refit_local_t *l = &m->locals.data[li];
        refit_box_t *boxes;
        size_t n;
        refit_status_t st = refit_manifest_padding(m, li, &boxes, &n);
        if (st) return st;
        size_t es = refit_dtype_size(l->d.dtype);
        uint64_t lst[REFIT_MAX_DIMS];
        refit_tdesc_strides(&l->d, lst);
        unsigned char *base = w->bases[l->region] + l->offset;
        for (size_t u = 0; u < n; u++) {
            const refit_box_t *b = &boxes[u];
            uint64_t rows = 1, inner = b->ext[b->ndim - 1] * es;
            for (uint32_t d = 0; d + 1 < b->ndim; d++) rows *= b->ext[d];
            for (uint64_t row = 0; row < rows; row++) {
                uint64_t rem = row, idx = b->off[b->ndim - 1];
                for (int d = (int)b->ndim - 2; d >= 0; d--) {
                    idx += (b->off[d] + rem % b->ext[d]) * lst[d];
                    rem /= b->ext[d];
                }
                unsigned char *q = base + idx * es;
                if (!w->verify) {
                    memset(q, 0, inner);
                    continue;
                }
                for (uint64_t k = 0; k < inner; k++)
                    if (q[k] && w->rep.mismatches++ == 0)
                        w->st = refit_error(REFIT_ERR_VERIFY, "%s padding byte %" PRIu64 " is 0x%02x, not zero",
                                            l->d.name, idx * es + k, q[k]);
                w->rep.bytes_checked += inner;
            }
        }
        free(boxes);
    }
    return w->st;
}

refit_status_t refit_truth_fill(const refit_manifest_t *m, void *const *region_bases, uint64_t version)
{
    if (!m || !region_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_truth_fill: NULL argument");
    walk_t w = {.m = m, .version = version, .fraction = 1.0, .bases = (unsigned char *const *)region_bases};
    return walk(&w);
}

refit_status_t refit_truth_fill_delta(const refit_manifest_t *m, void *const *region_bases, uint64_t version,
                                      double fraction)
{
    if (!m || !region_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_truth_fill_delta: NULL argument");
    walk_t w = {.m = m, .version = version, .fraction = fraction, .bases = (unsigned char *const *)region_bases};
    return walk(&w);
}

refit_status_t refit_truth_verify(const refit_manifest_t *m, const void *const *region_bases, uint64_t version,
                                  refit_truth_report_t *report)
{
    return refit_truth_verify_delta(m, region_bases, version, 1.0, report);
}

refit_status_t refit_truth_verify_delta(const refit_manifest_t *m, const void *const *region_bases, uint64_t version,
                                        double fraction, refit_truth_report_t *report)
{
    if (!m || !region_bases) return refit_error(REFIT_ERR_INVALID_ARG, "refit_truth_verify: NULL argument");
    refit_status_t st;
    if (report &&
        (st = refit_out_check(report->size, REFIT_END_OF(refit_truth_report_t, mismatches), "refit_truth_report_t")))
        return st;
    walk_t w = {.m = m,
                .version = version,
                .fraction = fraction,
                .verify = true,
                .bases = (unsigned char *const *)region_bases};
    st = walk(&w);
    if (report) refit_out_write(report, report->size, &w.rep, sizeof(w.rep));
    if (st == REFIT_ERR_VERIFY && w.rep.mismatches > 1)
        refit_error_prefix("%" PRIu64 " wrong elements or bytes; the first", w.rep.mismatches);
    return st;
}
