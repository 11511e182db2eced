/*
 * refit/experimental/metrics.h - metrics for tests.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_EXPERIMENTAL_METRICS_H
#define REFIT_EXPERIMENTAL_METRICS_H

#include "refit/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forgets every value (for tests and for processes that start a new job). */
REFIT_API void refit_metrics_reset(void);

#ifdef __cplusplus
}
#endif
#endif
