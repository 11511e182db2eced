/*
 * refit/experimental/truth.h - the synthetic truth.
 *
 * Every element of every canonical tensor has a deterministic value computed
 * from (tensor name, element index in the canonical tensor, version), so any
 * process can fill a shard in any layout and verify any destination byte
 * without a reference copy.  bf16/f16/f32 values are finite, differ between
 * neighbours in the last dimension (the element index's parity is in the
 * low mantissa bit) and between consecutive versions (the version's parity is
 * in the next bit), and depend on the tensor name through a hash, so a
 * transposed, shifted or stale copy is caught.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_TRUTH_H
#define REFIT_TRUTH_H

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seed of a tensor's values (a hash of its name). */
REFIT_API uint64_t refit_truth_tensor_seed(const char *canonical_name);
/* The value's bits (in the low dtype-size bytes) of element `index` of a tensor. */
REFIT_API uint64_t refit_truth_value(uint64_t tensor_seed, refit_dtype_t dtype, uint64_t index, uint64_t version);

/* Delta mode: a fraction of the elements changes per version.  Element i
 * keeps its value from version v-1 at version v unless change(i, v) (a hash of
 * the tensor seed, i and v mapped to [0, 1)) is below `fraction`; its value is
 * refit_truth_value(seed, dtype, i, u) for the last version u <= v at which it
 * changed (0 if never).  fraction >= 1 gives refit_truth_value exactly. */
REFIT_API bool refit_truth_changed(uint64_t tensor_seed, uint64_t index, uint64_t version, double fraction);
REFIT_API uint64_t refit_truth_value_delta(uint64_t tensor_seed, refit_dtype_t dtype, uint64_t index, uint64_t version,
                                           double fraction);

/* Fills every placed element of every local tensor of m with the truth of
 * `version`, and padding with zeros.  region_bases[r] is region r's base. */
REFIT_API refit_status_t refit_truth_fill(const refit_manifest_t *m, void *const *region_bases, uint64_t version);

/* As refit_truth_fill / refit_truth_verify, with refit_truth_value_delta(fraction). */
REFIT_API refit_status_t refit_truth_fill_delta(const refit_manifest_t *m, void *const *region_bases, uint64_t version,
                                                double fraction);

typedef struct {
    size_t size; /* sizeof(refit_truth_report_t) as the caller compiled it: REFIT_TRUTH_REPORT_INIT
                    (a sized output: refit/engine.h) */
    uint64_t elements_checked;
    uint64_t bytes_checked;
    uint64_t mismatches; /* elements (and padding bytes) that differ */
} refit_truth_report_t;
#ifdef __cplusplus
#define REFIT_TRUTH_REPORT_INIT      \
    {                                \
        sizeof(refit_truth_report_t) \
    }
#else
#define REFIT_TRUTH_REPORT_INIT              \
    {                                        \
        .size = sizeof(refit_truth_report_t) \
    }
#endif

/* Verifies every byte of every local tensor of m: placed elements against the
 * truth of `version`, padding against zero.  REFIT_ERR_VERIFY if anything
 * differs, with a detail naming the first wrong element (local tensor, index,
 * canonical tensor and index, expected and found bits).  report may be NULL;
 * otherwise report->size must be set (REFIT_TRUTH_REPORT_INIT; a size too
 * small: REFIT_ERR_INVALID_ARG, nothing checked), and it is written whether
 * the bytes match or not. */
REFIT_API refit_status_t refit_truth_verify(const refit_manifest_t *m, const void *const *region_bases,
                                            uint64_t version, refit_truth_report_t *report);

REFIT_API refit_status_t refit_truth_verify_delta(const refit_manifest_t *m, const void *const *region_bases,
                                                  uint64_t version, double fraction, refit_truth_report_t *report);

#ifdef __cplusplus
}
#endif
#endif
