/*
 * refit/experimental/select.h - partial refit: pull only some tensors.
 *
 * A receiver narrows its manifest to the local tensors that hold any of the
 * canonical tensors it names, and plans, pulls and verifies with the narrowed
 * manifest; the rest of its memory is left as it was.  A fused local tensor
 * (qkv_proj, gate_up_proj, w13_weight, linear_qkv, ...) is taken whole or not
 * at all: naming q_proj of layer 3 refreshes layer 3's whole qkv_proj, and
 * naming expert 5 refreshes the whole w13_weight / w2_weight that holds it.
 *
 * Patterns (comma-separated, matched against canonical names):
 *   a glob (fnmatch):  "model.layers.3.*", "*.self_attn.*", "lm_head.weight"
 *   layer:N           = "model.layers.N.*"
 *   expert:E          = "model.layers.*.mlp.experts.E.*"
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_SELECT_H
#define REFIT_SELECT_H

#include <stdbool.h>

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t size;           /* sizeof(refit_select_report_t) as the caller compiled it: REFIT_SELECT_REPORT_INIT
                                  (a sized output: refit/engine.h) */
    uint32_t locals;       /* local tensors kept */
    uint32_t canon_named;  /* canonical tensors the patterns match (that this rank holds) */
    uint32_t canon_pulled; /* canonical tensors the kept locals hold (>= named: fused expansion) */
    uint64_t bytes;        /* bytes of the kept local tensors */
} refit_select_report_t;
#ifdef __cplusplus
#define REFIT_SELECT_REPORT_INIT      \
    {                                 \
        sizeof(refit_select_report_t) \
    }
#else
#define REFIT_SELECT_REPORT_INIT              \
    {                                         \
        .size = sizeof(refit_select_report_t) \
    }
#endif

/* The manifest of the local tensors of m that hold a canonical tensor
 * matching `patterns` (with invert: the others), same identity except the
 * layout string ("<layout>|select=<patterns>"), same regions and offsets.
 * REFIT_ERR_NOT_FOUND if nothing matches; REFIT_ERR_PARSE for a bad pattern.
 * report may be NULL; otherwise report->size must be set
 * (REFIT_SELECT_REPORT_INIT; too small: REFIT_ERR_INVALID_ARG). */
REFIT_API refit_status_t refit_manifest_select(const refit_manifest_t *m, const char *patterns, bool invert,
                                               refit_manifest_t **out, refit_select_report_t *report);

#ifdef __cplusplus
}
#endif
#endif
