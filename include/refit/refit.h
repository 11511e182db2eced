/*
 * refit/refit.h - the umbrella header.
 *
 * refit moves model weights from the ranks that train them to the ranks that
 * serve them.  Start with refit/model.h (what a model is), refit/layout.h
 * (how a framework shards it), refit/manifest.h (what one rank holds) and
 * refit/plan.h (the byte plan between two layouts).
 *
 * This header includes the stable set: the declarations under the ABI
 * promise (version node REFIT_1 of src/refit.map; docs/api.md).  What
 * refit's own tools and tests use besides (delta codec, FP8 targets and
 * relays, the synthetic truth, safetensors, GPU and host probes, partial
 * selection, plan keys) is in refit/experimental/, with no ABI promise:
 * refit/experimental/all.h includes all of it.
 */
#ifndef REFIT_REFIT_H
#define REFIT_REFIT_H

#include "refit/status.h"
#include "refit/version.h"
#include "refit/types.h"
#include "refit/model.h"
#include "refit/manifest.h"
#include "refit/layout.h"
#include "refit/plan.h"
#include "refit/engine.h"
#include "refit/metrics.h"

#endif
