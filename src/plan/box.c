/* Box arithmetic.  The overlap sweep lives in box_sweep.c. */
#include "plan/box.h"

#include <stdio.h>

uint64_t refit_box_volume(const refit_box_t *b)
{
    uint64_t v = 1;
    for (uint32_t d = 0; d < b->ndim; d++) v *= b->ext[d];
    return v;
}

bool refit_box_intersect(const refit_box_t *a, const refit_box_t *b, refit_box_t *out)
{
    refit_box_t r = {.ndim = a->ndim};
    for (uint32_t d = 0; d < a->ndim; d++) {
        uint64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        uint64_t ea = a->off[d] + a->ext[d], eb = b->off[d] + b->ext[d];
        uint64_t hi = ea < eb ? ea : eb;
        if (hi <= lo) return false;
        r.off[d] = lo;
        r.ext[d] = hi - lo;
    }
    if (out) *out = r;
    return true;
}

bool refit_box_contains(const refit_box_t *outer, const refit_box_t *inner)
{
    for (uint32_t d = 0; d < outer->ndim; d++)
        if (inner->off[d] < outer->off[d] || inner->off[d] + inner->ext[d] > outer->off[d] + outer->ext[d])
            return false;
    return true;
}

int refit_box_cmp(const refit_box_t *a, const refit_box_t *b)
{
    for (uint32_t d = 0; d < a->ndim; d++) {
        if (a->off[d] != b->off[d]) return a->off[d] < b->off[d] ? -1 : 1;
        if (a->ext[d] != b->ext[d]) return a->ext[d] < b->ext[d] ? -1 : 1;
    }
    return 0;
}

size_t refit_box_subtract(const refit_box_t *a, const refit_box_t *b, refit_box_t out[2 * REFIT_MAX_DIMS])
{
    refit_box_t isect;
    if (!refit_box_intersect(a, b, &isect)) {
        out[0] = *a;
        return 1;
    }
    /* Peel slabs dimension by dimension: below and above the intersection in
     * dim d, restricted to the intersection's range in dims < d. */
    size_t n = 0;
    refit_box_t rest = *a;
    for (uint32_t d = 0; d < a->ndim; d++) {
        if (isect.off[d] > rest.off[d]) {
            refit_box_t lo = rest;
            lo.ext[d] = isect.off[d] - rest.off[d];
            out[n++] = lo;
        }
        uint64_t iend = isect.off[d] + isect.ext[d], rend = rest.off[d] + rest.ext[d];
        if (iend < rend) {
            refit_box_t hi = rest;
            hi.off[d] = iend;
            hi.ext[d] = rend - iend;
            out[n++] = hi;
        }
        rest.off[d] = isect.off[d];
        rest.ext[d] = isect.ext[d];
    }
    return n;
}

char *refit_box_format(const refit_box_t *b, char *buf, size_t size)
{
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, size - pos, "[");
    for (uint32_t d = 0; d < b->ndim && pos < size; d++)
        pos += (size_t)snprintf(buf + pos, size - pos, "%s%llu:%llu", d ? ", " : "", (unsigned long long)b->off[d],
                                (unsigned long long)(b->off[d] + b->ext[d]));
    if (pos < size) snprintf(buf + pos, size - pos, "]");
    return buf;
}
