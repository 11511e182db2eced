/*
 * refit/experimental/all.h - the stable set (refit/refit.h) and every
 * experimental header.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_EXPERIMENTAL_ALL_H
#define REFIT_EXPERIMENTAL_ALL_H

#include "refit/refit.h"

#include "refit/experimental/delta.h"
#include "refit/experimental/fleet.h"
#include "refit/experimental/fp8.h"
#include "refit/experimental/gpu.h"
#include "refit/experimental/metrics.h"
#include "refit/experimental/plan.h"
#include "refit/experimental/probe.h"
#include "refit/experimental/safetensors.h"
#include "refit/experimental/select.h"
#include "refit/experimental/truth.h"

#endif
