/* The synthetic truth as a table of boxes, for filling and verifying memory
 * in bulk (on a GPU, or on the CPU exactly as a GPU does).
 *
 * One box per placement (its elements get the truth of their canonical
 * tensor) and one per padding box (zeros).  Boxes are normalised to 4 dims
 * (leading extents 1); element e of a box has digits i[0..3] (i[3]
 * innermost), canonical index cbase + sum i[d]*cst[d] and byte offset
 * lbyte + es * sum i[d]*lst[d] in its memory region.  Boxes are cut into
 * chunks of `chunk` elements; first_chunk is a prefix sum (see batch.h). */
#ifndef REFIT_TRUTH_TABLE_H
#define REFIT_TRUTH_TABLE_H

#include <stdbool.h>

#include "refit/manifest.h"
#include "truth/truth_hd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t seed;  /* the canonical tensor's seed (padding: 0) */
    uint64_t cbase; /* canonical index of the first element */
    uint64_t lbyte; /* byte offset of the first element in its region */
    uint64_t numel;
    uint64_t first_chunk;
    uint64_t ext[4], cst[4], lst[4];
    uint32_t region; /* memory region */
    uint32_t dtype;  /* refit_dtype_t of the values */
    uint32_t es;     /* element size: 1, 2, 4 or 8 */
    uint32_t zero;   /* 1: padding, every byte zero */
} refit_truth_box_t;

typedef struct {
    refit_truth_box_t *boxes;
    uint32_t n;
    uint64_t nchunks, chunk;
    uint64_t elements, bytes;
} refit_truth_table_t;

/* chunk: elements per chunk (0: 16384). */
refit_status_t refit_truth_table_build(const refit_manifest_t *m, uint64_t chunk, refit_truth_table_t *out);
void refit_truth_table_free(refit_truth_table_t *t);
/* Fills or verifies on the CPU the way the GPU kernel does (block by block,
 * `threads` threads a block).  Returns the mismatches; *first_box and
 * *first_elem name the lowest (box, element) that differs. */
uint64_t refit_truth_table_run_host(const refit_truth_table_t *t, void *const *bases, uint64_t version, bool verify,
                                    uint32_t threads, uint64_t *first_key);

/* The positional digest (truth_hd.h) of n bytes, on the CPU. */
uint64_t refit_digest_host(const void *p, uint64_t n);

/* A mismatch key orders by box, then element: box << 40 | element. */
#define REFIT_TRUTH_KEY(box, elem) (((uint64_t)(box) << 40) | ((uint64_t)(elem) & ((1ull << 40) - 1)))

typedef struct {
    uint64_t i[4];
} refit_truth_cursor_t;

REFIT_HD static inline void refit_truth_seek(const refit_truth_box_t *b, uint64_t e, refit_truth_cursor_t *c)
{
    for (int d = 3; d > 0; d--) {
        uint64_t q = e / b->ext[d];
        c->i[d] = e - q * b->ext[d];
        e = q;
    }
    c->i[0] = e;
}

REFIT_HD static inline void refit_truth_advance(const refit_truth_box_t *b, uint64_t n, refit_truth_cursor_t *c)
{
    c->i[3] += n;
    for (int d = 3; d > 0 && c->i[d] >= b->ext[d]; d--) {
        uint64_t q = refit_hd_div(c->i[d], b->ext[d]);
        c->i[d] -= q * b->ext[d];
        c->i[d - 1] += q;
    }
}

/* Fills (verify == 0) or checks elements e0, e0 + step, ... < e1 of box b
 * whose region starts at base.  Returns the number of mismatches and
 * the first mismatching element in *first. */
REFIT_HD static inline uint64_t refit_truth_box_thread(const refit_truth_box_t *b, uint64_t e0, uint64_t e1,
                                                       uint64_t step, unsigned char *base, uint64_t version, int verify,
                                                       uint64_t *first)
{
    uint64_t bad = 0;
    if (e0 >= e1) return 0;
    refit_truth_cursor_t c;
    refit_truth_seek(b, e0, &c);
    for (uint64_t e = e0;;) {
        uint64_t v = 0;
        if (!b->zero) {
            uint64_t ci = b->cbase + c.i[0] * b->cst[0] + c.i[1] * b->cst[1] + c.i[2] * b->cst[2] + c.i[3] * b->cst[3];
            v = refit_hd_truth_value(b->seed, b->dtype, ci, version);
        }
        unsigned char *q = base + b->lbyte +
                           b->es * (c.i[0] * b->lst[0] + c.i[1] * b->lst[1] + c.i[2] * b->lst[2] + c.i[3] * b->lst[3]);
        uint64_t got = 0;
        switch (b->es) {
        case 1:
            if (verify) got = *q;
            else *q = (uint8_t)v;
            break;
        case 2:
            if (verify) got = *(const uint16_t *)q;
            else *(uint16_t *)q = (uint16_t)v;
            break;
        case 4:
            if (verify) got = *(const uint32_t *)q;
            else *(uint32_t *)q = (uint32_t)v;
            break;
        default:
            if (verify) got = *(const uint64_t *)q;
            else *(uint64_t *)q = v;
            break;
        }
        if (verify && got != v && bad++ == 0) *first = e;
        e += step;
        if (e >= e1) break;
        refit_truth_advance(b, step, &c);
    }
    return bad;
}

REFIT_HD static inline uint32_t refit_truth_find(const refit_truth_box_t *bx, uint32_t n, uint64_t c)
{
    uint32_t i;
    REFIT_HD_LAST_LE(i, bx, n, first_chunk, c);
    return i;
}

/* Expected bits of element e of box b (for error messages). */
REFIT_HD static inline uint64_t refit_truth_box_expected(const refit_truth_box_t *b, uint64_t e, uint64_t version,
                                                         uint64_t *byte_off)
{
    refit_truth_cursor_t c;
    refit_truth_seek(b, e, &c);
    *byte_off = b->lbyte + b->es * (c.i[0] * b->lst[0] + c.i[1] * b->lst[1] + c.i[2] * b->lst[2] + c.i[3] * b->lst[3]);
    if (b->zero) return 0;
    uint64_t ci = b->cbase + c.i[0] * b->cst[0] + c.i[1] * b->cst[1] + c.i[2] * b->cst[2] + c.i[3] * b->cst[3];
    return refit_hd_truth_value(b->seed, b->dtype, ci, version);
}

#ifdef __cplusplus
}
#endif
#endif
