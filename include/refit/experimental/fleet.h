/*
 * refit/experimental/fleet.h - how the fleet pairs receivers.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_EXPERIMENTAL_FLEET_H
#define REFIT_EXPERIMENTAL_FLEET_H

#include <stdint.h>

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A key equal for two ranks' manifests exactly when they hold the same
 * bytes at the same offsets (data-parallel replicas of one rank): the
 * manifest's signature with the rank left out.  The fleet's relays pair
 * receivers by it. */
REFIT_API uint64_t refit_fleet_mirror_key(const refit_manifest_t *m);

#ifdef __cplusplus
}
#endif
#endif
