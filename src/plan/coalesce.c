/* Coalescing of plan regions (sorted by source, regions, destination offset).
 *
 * Two moves, both exact by construction (they compare real offsets):
 *  - join: a region that continues the previous one contiguously on both
 *    sides (no loops) extends its run;
 *  - stack: a sequence of identically shaped regions at constant source and
 *    destination spacing becomes one region with a new outermost loop.
 * Stacking repeats (at most REFIT_PLAN_MAX_LOOPS levels), so e.g. the gate and
 * up slices of every expert of a layer collapse into one region with two
 * loops.  After each move, loops whose strides make them contiguous with the
 * level inside are folded into it. */
#include <string.h>

#include "plan/plan.h"

static bool same_shape(const refit_plan_region_t *a, const refit_plan_region_t *b)
{
    if (a->src != b->src || a->src_region != b->src_region || a->dst_region != b->dst_region || a->run != b->run ||
        a->nloops != b->nloops)
        return false;
    for (uint32_t i = 0; i < a->nloops; i++)
        if (a->count[i] != b->count[i] || a->src_stride[i] != b->src_stride[i] || a->dst_stride[i] != b->dst_stride[i])
            return false;
    return true;
}

/* Folds loops into the run or into the loop inside them where contiguous. */
static void normalize(refit_plan_region_t *r)
{
    bool changed = true;
    while (changed) {
        changed = false;
        if (r->nloops && r->src_stride[0] == r->run && r->dst_stride[0] == r->run) {
            r->run *= r->count[0];
            memmove(&r->count[0], &r->count[1], (REFIT_PLAN_MAX_LOOPS - 1) * sizeof(uint64_t));
            memmove(&r->src_stride[0], &r->src_stride[1], (REFIT_PLAN_MAX_LOOPS - 1) * sizeof(uint64_t));
            memmove(&r->dst_stride[0], &r->dst_stride[1], (REFIT_PLAN_MAX_LOOPS - 1) * sizeof(uint64_t));
            r->nloops--;
            r->count[r->nloops] = r->src_stride[r->nloops] = r->dst_stride[r->nloops] = 0;
            changed = true;
            continue;
        }
        for (uint32_t i = 1; i < r->nloops; i++) {
            if (r->src_stride[i] == r->count[i - 1] * r->src_stride[i - 1] &&
                r->dst_stride[i] == r->count[i - 1] * r->dst_stride[i - 1]) {
                r->count[i - 1] *= r->count[i];
                for (uint32_t k = i; k + 1 < r->nloops; k++) {
                    r->count[k] = r->count[k + 1];
                    r->src_stride[k] = r->src_stride[k + 1];
                    r->dst_stride[k] = r->dst_stride[k + 1];
                }
                r->nloops--;
                r->count[r->nloops] = r->src_stride[r->nloops] = r->dst_stride[r->nloops] = 0;
                changed = true;
                break;
            }
        }
    }
}

static size_t join_pass(refit_plan_region_t *v, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        refit_plan_region_t *last = w ? &v[w - 1] : NULL;
        if (last && last->nloops == 0 && v[i].nloops == 0 && last->src == v[i].src &&
            last->src_region == v[i].src_region && last->dst_region == v[i].dst_region &&
            last->src_offset + last->run == v[i].src_offset && last->dst_offset + last->run == v[i].dst_offset) {
            last->run += v[i].run;
            continue;
        }
        v[w++] = v[i];
    }
    return w;
}

static size_t stack_pass(refit_plan_region_t *v, size_t n, bool *changed)
{
    size_t w = 0, i = 0;
    while (i < n) {
        refit_plan_region_t r = v[i];
        size_t k = 1;
        if (r.nloops < REFIT_PLAN_MAX_LOOPS && i + 1 < n && same_shape(&r, &v[i + 1]) &&
            v[i + 1].src_offset > r.src_offset && v[i + 1].dst_offset > r.dst_offset) {
            uint64_t ds = v[i + 1].src_offset - r.src_offset, dd = v[i + 1].dst_offset - r.dst_offset;
            while (i + k < n && same_shape(&r, &v[i + k]) && v[i + k].src_offset == r.src_offset + k * ds &&
                   v[i + k].dst_offset == r.dst_offset + k * dd)
                k++;
            if (k > 1) {
                r.count[r.nloops] = k;
                r.src_stride[r.nloops] = ds;
                r.dst_stride[r.nloops] = dd;
                r.nloops++;
                normalize(&r);
                *changed = true;
            }
        }
        v[w++] = r;
        i += k;
    }
    return w;
}

refit_status_t refit_plan_coalesce(refit_plan_t *plan)
{
    size_t n = join_pass(plan->regions.data, plan->regions.len);
    for (int level = 0; level < REFIT_PLAN_MAX_LOOPS + 1; level++) {
        bool changed = false;
        n = stack_pass(plan->regions.data, n, &changed);
        n = join_pass(plan->regions.data, n);
        if (!changed) break;
    }
    plan->regions.len = n;
    return REFIT_OK;
}
