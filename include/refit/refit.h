/*
 * refit/refit.h - the umbrella header.
 *
 * refit moves model weights from the ranks that train them to the ranks that
 * serve them.  Start with refit/model.h (what a model is), refit/layout.h
 * (how a framework shards it), refit/manifest.h (what one rank holds) and
 * refit/plan.h (the byte plan between two layouts).
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
#include "refit/truth.h"
#include "refit/safetensors.h"
#include "refit/engine.h"
#include "refit/delta.h"
#include "refit/select.h"
#include "refit/fp8.h"
#include "refit/gpu.h"
#include "refit/probe.h"
#include "refit/metrics.h"

#endif
