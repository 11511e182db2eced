/* Shared by the simulator's files. */
#ifndef REFIT_SIM_INTERNAL_H
#define REFIT_SIM_INTERNAL_H

#include "engine/fleet/fleet.h"
#include "engine/fleet/relay.h"
#include "refit/experimental/delta.h"
#include "sim.h"
#include "util/util.h"

#define REFIT_MAX_RELAYS_SIM REFIT_MAX_RELAYS /* relay slots per rank (relay.h) */

/* Every source manifest and the plan of every destination rank needed. */
typedef struct {
    uint32_t src_world, dst_world;
    uint32_t ndst;           /* plans made: dst_world, or 1 (only_rank) */
    uint32_t *dst_rank;      /* rank of plans[i] */
    refit_manifest_t **srcs; /* src_world */
    refit_manifest_t **dsts; /* ndst */
    refit_plan_t **plans;    /* ndst */
    double *plan_ms;         /* ndst */
    uint64_t *mkeys;         /* mirror key of each source manifest */
    uint64_t model_bytes;
    double manifests_ms, plan_wall_ms;
    unsigned threads;
    char src_spec[128], dst_spec[128];
} sim_plans_t;

refit_status_t sim_plans_build(const char *model, const char *src, const char *dst, uint32_t only_rank,
                               unsigned threads, sim_plans_t *P);
void sim_plans_free(sim_plans_t *P);

#endif
