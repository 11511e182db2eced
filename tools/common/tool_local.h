/* In-process execution of plans between synthetic sources and destinations:
 * what `refit plan --execute`, `refit preflight` and the tests use to prove
 * plans byte for byte.  Written on the public API only (include/refit), so
 * that the programs linking librefit.so and the tests linking librefit.a
 * share it.
 * Sources are filled with the synthetic truth; destination arenas are
 * poisoned before the plan runs, so a byte the plan fails to write is caught
 * by verification as surely as a wrong one. */
#ifndef REFIT_TOOL_LOCAL_H
#define REFIT_TOOL_LOCAL_H

#include "refit/experimental/all.h"

typedef struct {
    uint32_t n; /* ranks */
    refit_manifest_t **manifests;
    void **arenas;             /* one region per rank (layout manifests) */
    const void *const **bases; /* bases[i] = &arenas[i], as refit_plan_execute_memcpy wants */
} tool_local_set_t;

/* Manifests of every rank of `layout`; with fill, arenas filled with the truth of version. */
refit_status_t tool_local_set_create(const refit_model_t *model, const refit_layout_t *layout, bool fill,
                                     uint64_t version, tool_local_set_t *out);
void tool_local_set_destroy(tool_local_set_t *set);

typedef struct {
    refit_plan_stats_t stats;
    refit_truth_report_t verify;
    double exec_ms;
} tool_local_result_t;

/* Plans destination `dst` from the set's manifests; with execute, runs the
 * plan into a poisoned arena and verifies it against version (and, when
 * dump_path is set, writes the arena's tensors there as safetensors). */
refit_status_t tool_local_run(const tool_local_set_t *src, const refit_manifest_t *dst, bool execute, uint64_t version,
                              const refit_plan_params_t *params, const char *dump_path, tool_local_result_t *out);

#endif
