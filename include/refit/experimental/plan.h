/*
 * refit/experimental/plan.h - the identity of a plan, for caches of plans.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_EXPERIMENTAL_PLAN_H
#define REFIT_EXPERIMENTAL_PLAN_H

#include "refit/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t src; /* combination of every source's signature, in order */
    uint64_t dst; /* the destination's signature */
} refit_plan_key_t;

REFIT_API void refit_plan_key(const refit_plan_t *plan, refit_plan_key_t *out);
/* The key a plan for these manifests would have, without planning. */
REFIT_API void refit_plan_key_of(const refit_manifest_t *const *srcs, size_t nsrcs, const refit_manifest_t *dst,
                                 refit_plan_key_t *out);

#ifdef __cplusplus
}
#endif
#endif
