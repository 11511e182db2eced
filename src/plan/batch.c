/* Builds batch tables from plans (see batch.h). */
#include "plan/batch.h"

#include <string.h>

#include "plan/plan.h"

static uint32_t pick_shift(const refit_plan_region_t *r, uint32_t max_shift)
{
    uint64_t a = r->dst_offset | r->run;
    if (r->src != REFIT_PLAN_FILL) a |= r->src_offset;
    for (uint32_t i = 0; i < r->nloops; i++)
        if (r->count[i] > 1) a |= r->dst_stride[i] | (r->src != REFIT_PLAN_FILL ? r->src_stride[i] : 0);
    uint32_t s = max_shift > 4 ? 4 : max_shift;
    while (s && (a & ((1ull << s) - 1))) s--;
    return s;
}

static bool selected(const refit_plan_region_t *r, const refit_batch_opts_t *o)
{
    if (r->src == REFIT_PLAN_FILL) return o->fills;
    return o->copies && (!o->only || o->only[r->src]);
}

refit_status_t refit_batch_build(const refit_plan_t *plan, const refit_batch_opts_t *o, refit_batch_t *b)
{
    memset(b, 0, sizeof(*b));
    if (!plan || !o) return refit_error(REFIT_ERR_INVALID_ARG, "refit_batch_build: NULL argument");
    uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : (256u << 10);
    size_t nsrc = plan->nsrcs, total = plan->regions.len + plan->fills.len;
    b->nsrcs = (uint32_t)nsrc;
    b->src_slot_base = calloc(nsrc + 1, sizeof(uint32_t));
    b->regions = calloc(total ? total : 1, sizeof(refit_batch_region_t));
    uint32_t *nreg = calloc(nsrc ? nsrc : 1, sizeof(uint32_t));
    if (!b->src_slot_base || !b->regions || !nreg) {
        free(nreg);
        refit_batch_free(b);
        return refit_error(REFIT_ERR_NO_MEMORY, "batch table");
    }
    uint32_t ndst = 0;
    for (size_t i = 0; i < total; i++) {
        const refit_plan_region_t *r = i < plan->regions.len ? &plan->regions.data[i]
                                                             : &plan->fills.data[i - plan->regions.len];
        if (!selected(r, o)) continue;
        if (r->src != REFIT_PLAN_FILL && r->src < nsrc && r->src_region + 1 > nreg[r->src])
            nreg[r->src] = r->src_region + 1;
        if (r->dst_region + 1 > ndst) ndst = r->dst_region + 1;
    }
    for (size_t s = 0; s < nsrc; s++) b->src_slot_base[s + 1] = b->src_slot_base[s] + nreg[s];
    free(nreg);
    b->dst_slot_base = b->src_slot_base[nsrc];
    b->nslots = b->dst_slot_base + ndst;
    uint64_t next = 0;
    for (size_t i = 0; i < total; i++) {
        const refit_plan_region_t *r = i < plan->regions.len ? &plan->regions.data[i]
                                                             : &plan->fills.data[i - plan->regions.len];
        if (!selected(r, o) || r->run == 0) continue;
        refit_batch_region_t *x = &b->regions[b->n];
        memset(x, 0, sizeof(*x));
        x->shift = pick_shift(r, o->max_shift);
        x->src_offset = r->src == REFIT_PLAN_FILL ? 0 : r->src_offset;
        x->dst_offset = r->dst_offset;
        x->run_units = r->run >> x->shift;
        x->units = x->run_units;
        for (uint32_t k = 0; k < 3; k++) {
            x->count[k] = k < r->nloops ? r->count[k] : 1;
            if (x->count[k] == 0) x->units = 0;
            if (k < r->nloops) {
                x->src_stride[k] = r->src == REFIT_PLAN_FILL ? 0 : r->src_stride[k];
                x->dst_stride[k] = r->dst_stride[k];
            }
            x->units *= x->count[k];
        }
        if (x->units == 0) continue;
        x->src_slot = r->src == REFIT_PLAN_FILL ? REFIT_BATCH_ZERO : b->src_slot_base[r->src] + r->src_region;
        x->dst_slot = b->dst_slot_base + r->dst_region;
        x->chunk_units = chunk >> x->shift ? chunk >> x->shift : 1;
        x->first_chunk = next;
        next += (x->units + x->chunk_units - 1) / x->chunk_units;
        b->bytes += x->units << x->shift;
        b->n++;
    }
    b->nchunks = next;
    return REFIT_OK;
}

refit_status_t refit_batch_single(uint64_t bytes, uint64_t chunk_bytes, uint32_t max_shift, refit_batch_t *b)
{
    memset(b, 0, sizeof(*b));
    uint64_t chunk = chunk_bytes ? chunk_bytes : (256u << 10);
    b->regions = calloc(1, sizeof(refit_batch_region_t));
    b->src_slot_base = calloc(2, sizeof(uint32_t));
    if (!b->regions || !b->src_slot_base) {
        refit_batch_free(b);
        return refit_error(REFIT_ERR_NO_MEMORY, "batch table");
    }
    b->nsrcs = 1;
    b->src_slot_base[1] = 1;
    b->dst_slot_base = 1;
    b->nslots = 2;
    if (!bytes) return REFIT_OK;
    refit_batch_region_t *x = &b->regions[0];
    uint32_t s = max_shift > 4 ? 4 : max_shift;
    while (s && (bytes & ((1ull << s) - 1))) s--;
    x->shift = s;
    x->run_units = x->units = bytes >> s;
    x->count[0] = x->count[1] = x->count[2] = 1;
    x->src_slot = 0;
    x->dst_slot = 1;
    x->chunk_units = chunk >> s ? chunk >> s : 1;
    b->n = 1;
    b->nchunks = (x->units + x->chunk_units - 1) / x->chunk_units;
    b->bytes = bytes;
    return REFIT_OK;
}

void refit_batch_free(refit_batch_t *b)
{
    if (!b) return;
    free(b->regions);
    free(b->src_slot_base);
    memset(b, 0, sizeof(*b));
}

void refit_batch_execute_host(const refit_batch_t *b, void *const *slots, uint32_t threads)
{
    uint64_t *s = malloc((b->nslots ? b->nslots : 1) * sizeof(uint64_t));
    if (!s) return;
    for (uint32_t i = 0; i < b->nslots; i++) s[i] = (uint64_t)(uintptr_t)slots[i];
    for (uint64_t c = 0; c < b->nchunks; c++)
        for (uint32_t t = 0; t < threads; t++) refit_batch_chunk(b->regions, b->n, c, t, threads, s);
    free(s);
}
