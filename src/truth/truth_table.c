/* Truth tables (see truth_table.h): the walk of truth.c as data. */
#include "truth/truth_table.h"

#include <string.h>

#include "layout/manifest.h"
#include "refit/experimental/truth.h"

static int push(refit_truth_table_t *t, size_t *cap, const refit_truth_box_t *b)
{
    if (t->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        refit_truth_box_t *p = realloc(t->boxes, nc * sizeof(*p));
        if (!p) return -1;
        t->boxes = p;
        *cap = nc;
    }
    refit_truth_box_t *x = &t->boxes[t->n++];
    *x = *b;
    x->first_chunk = t->nchunks;
    t->nchunks += (x->numel + t->chunk - 1) / t->chunk;
    t->elements += x->numel;
    t->bytes += x->numel * x->es;
    return 0;
}

refit_status_t refit_truth_table_build(const refit_manifest_t *m, uint64_t chunk, refit_truth_table_t *t)
{
    memset(t, 0, sizeof(*t));
    if (!m || !m->finalized) return refit_error(REFIT_ERR_INVALID_ARG, "truth table: manifest is not finalized");
    t->chunk = chunk ? chunk : 16384;
    size_t cap = 0;
    for (size_t i = 0; i < m->placements.len; i++) {
        const refit_placement_t *p = &m->placements.data[i];
        const refit_tdesc_t *c = &m->canon.data[p->canon];
        const refit_local_t *l = &m->locals.data[p->local];
        uint64_t cst[REFIT_MAX_DIMS], lst[REFIT_MAX_DIMS];
        refit_tdesc_strides(c, cst);
        refit_tdesc_strides(&l->d, lst);
        uint32_t nd = p->ndim, lead = l->d.ndim - nd, pad = 4 - nd;
        refit_truth_box_t b;
        memset(&b, 0, sizeof(b));
        b.seed = refit_truth_tensor_seed(c->name);
        b.dtype = (uint32_t)c->dtype;
        b.es = (uint32_t)refit_dtype_size(c->dtype);
        b.region = l->region;
        b.numel = 1;
        uint64_t lbase = 0;
        for (uint32_t d = 0; d < l->d.ndim; d++) lbase += p->local_offset[d] * lst[d];
        b.lbyte = l->offset + lbase * b.es;
        for (uint32_t d = 0; d < 4; d++) b.ext[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            b.ext[pad + d] = p->extent[d];
            b.cst[pad + d] = cst[d];
            b.lst[pad + d] = lst[lead + d];
            b.cbase += p->canon_offset[d] * cst[d];
            b.numel *= p->extent[d];
        }
        if (push(t, &cap, &b)) goto oom;
    }
    for (uint32_t li = 0; li < m->locals.len; li++) {
        const refit_local_t *l = &m->locals.data[li];
        refit_box_t *boxes;
        size_t n;
        refit_status_t st = refit_manifest_padding(m, li, &boxes, &n);
        if (st) {
            refit_truth_table_free(t);
            return st;
        }
        uint64_t lst[REFIT_MAX_DIMS];
        refit_tdesc_strides(&l->d, lst);
        for (size_t u = 0; u < n; u++) {
            const refit_box_t *x = &boxes[u];
            refit_truth_box_t b;
            memset(&b, 0, sizeof(b));
            b.zero = 1;
            b.dtype = (uint32_t)l->d.dtype;
            b.es = (uint32_t)refit_dtype_size(l->d.dtype);
            b.region = l->region;
            b.numel = 1;
            uint32_t pad = 4 - x->ndim;
            uint64_t lbase = 0;
            for (uint32_t d = 0; d < 4; d++) b.ext[d] = 1;
            for (uint32_t d = 0; d < x->ndim; d++) {
                b.ext[pad + d] = x->ext[d];
                b.lst[pad + d] = lst[d];
                lbase += x->off[d] * lst[d];
                b.numel *= x->ext[d];
            }
            b.lbyte = l->offset + lbase * b.es;
            if (b.numel && push(t, &cap, &b)) {
                free(boxes);
                goto oom;
            }
        }
        free(boxes);
    }
    return REFIT_OK;
oom:
    refit_truth_table_free(t);
    return refit_error(REFIT_ERR_NO_MEMORY, "truth table");
}

void refit_truth_table_free(refit_truth_table_t *t)
{
    if (!t) return;
    free(t->boxes);
    memset(t, 0, sizeof(*t));
}

uint64_t refit_truth_table_run_host(const refit_truth_table_t *t, void *const *bases, uint64_t version, bool verify,
                                    uint32_t threads, uint64_t *first_key)
{
    uint64_t bad = 0;
    *first_key = UINT64_MAX;
    for (uint64_t c = 0; c < t->nchunks; c++) {
        uint32_t bi = refit_truth_find(t->boxes, t->n, c);
        const refit_truth_box_t *b = &t->boxes[bi];
        uint64_t e0 = (c - b->first_chunk) * t->chunk, e1 = e0 + t->chunk;
        if (e1 > b->numel) e1 = b->numel;
        for (uint32_t th = 0; th < threads; th++) {
            uint64_t first = 0;
            uint64_t n = refit_truth_box_thread(b, e0 + th, e1, threads, bases[b->region], version, verify, &first);
            if (n) {
                bad += n;
                uint64_t key = REFIT_TRUTH_KEY(bi, first);
                if (key < *first_key) *first_key = key;
            }
        }
    }
    return bad;
}

uint64_t refit_digest_host(const void *p, uint64_t n)
{
    const unsigned char *b = p;
    uint64_t d = 0, i = 0;
    for (; (i + 1) * 8 <= n; i++) {
        uint64_t w;
        memcpy(&w, b + i * 8, 8);
        d += refit_hd_digest_word(w, i);
    }
    if (i * 8 < n) {
        uint64_t w = 0;
        memcpy(&w, b + i * 8, n - i * 8);
        d += refit_hd_digest_word(w, i);
    }
    return d;
}
