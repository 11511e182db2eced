/*
 * refit/experimental/gpu.h - the CUDA devices this library sees, and the synthetic truth
 * in their memory.
 *
 * Every function here exists in every build: without CUDA (refit_features()
 * lacks REFIT_FEATURE_CUDA) refit_gpu_count() is 0, refit_gpu_can_access_peer()
 * false and the others return REFIT_ERR_UNSUPPORTED.  Each may be called from
 * any thread; each saves and restores the calling thread's current device.
 * Outputs are written only on success.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_GPU_PUBLIC_H
#define REFIT_GPU_PUBLIC_H

#include <stdbool.h>
#include <stdint.h>

#include "refit/manifest.h"
#include "refit/status.h"
#include "refit/experimental/truth.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices usable here: 0 without CUDA, a driver or a device (never fails). */
REFIT_API int refit_gpu_count(void);

typedef struct {
    char name[256];
    char uuid[48]; /* "GPU-xxxxxxxx-..." */
    char pci[20];  /* bus id */
    uint64_t memory, free_memory;
    int sms, cc_major, cc_minor;
    int driver, runtime; /* versions, e.g. 13000 */
} refit_gpu_info_t;
/* What device dev is.  REFIT_ERR_INVALID_ARG for a device that is not here. */
REFIT_API refit_status_t refit_gpu_info(int dev, refit_gpu_info_t *out);
/* Whether device `dev` can read device `peer`'s memory directly (P2P). */
REFIT_API bool refit_gpu_can_access_peer(int dev, int peer);

/* The synthetic truth of `version` (refit/truth.h) written into device
 * memory: bases[i] is region i of m, memory of device dev. */
REFIT_API refit_status_t refit_gpu_truth_fill(const refit_manifest_t *m, int dev, void *const *bases, uint64_t version);

/* Verifies device memory against the synthetic truth of `version`: bases[i]
 * is region i of m, memory of device dev; every byte of every local tensor
 * is checked on the device (placed elements against the truth, padding
 * against zero), as refit_truth_verify does on the host.  REFIT_ERR_VERIFY
 * if anything differs, with a detail naming the first wrong element or
 * byte.  report may be NULL; otherwise report->size must be set
 * (REFIT_TRUTH_REPORT_INIT; too small: REFIT_ERR_INVALID_ARG, nothing
 * checked) and it is written whether the bytes match or not. */
REFIT_API refit_status_t refit_gpu_truth_verify(const refit_manifest_t *m, int dev, const void *const *bases,
                                                uint64_t version, refit_truth_report_t *report);

#ifdef __cplusplus
}
#endif
#endif
