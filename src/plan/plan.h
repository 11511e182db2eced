/* Internal plan representation. */
#ifndef REFIT_PLAN_INTERNAL_H
#define REFIT_PLAN_INTERNAL_H

#include "layout/manifest.h"
#include "refit/plan.h"

struct refit_plan {
    REFIT_VEC(refit_plan_region_t) regions;
    REFIT_VEC(refit_plan_region_t) fills;
    uint64_t *src_bytes; /* per source */
    size_t nsrcs;
    refit_plan_stats_t stats;
    refit_plan_key_t key;
};

/* Last byte (exclusive) a region touches on its source / destination side. */
uint64_t refit_region_src_end(const refit_plan_region_t *r);
uint64_t refit_region_dst_end(const refit_plan_region_t *r);

/* Merges adjacent regions and stacks regularly spaced ones into loops; keeps
 * the bytes moved identical.  Regions must be sorted (see plan.c). */
refit_status_t refit_plan_coalesce(refit_plan_t *plan);

#endif
