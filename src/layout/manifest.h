/* Internal representation of a manifest, shared by the builder
 * (manifest.c), the codec (manifest_codec.c), the planner and the truth. */
#ifndef REFIT_MANIFEST_INTERNAL_H
#define REFIT_MANIFEST_INTERNAL_H

#include "model/model.h" /* refit_tdesc_t */
#include "plan/box.h"
#include "refit/manifest.h"
#include "util/strmap.h"
#include "util/util.h"

typedef struct {
    refit_tdesc_t d;
    uint32_t region;
    uint64_t offset; /* bytes into the region */
    uint64_t nbytes; /* derived: numel * dtype size (set by add_local) */
} refit_local_t;

typedef struct {
    char *key;
    void *val;
    size_t len;
} refit_attr_t;

struct refit_manifest {
    char *model;
    char *layout;
    uint32_t rank, world;
    REFIT_VEC(uint64_t) regions; /* sizes */
    REFIT_VEC(refit_tdesc_t) canon;
    REFIT_VEC(refit_local_t) locals;
    REFIT_VEC(refit_placement_t) placements;
    REFIT_VEC(refit_attr_t) attrs;
    refit_strmap_t canon_index; /* canonical name -> id */
    refit_strmap_t local_index; /* local name -> id */
    bool finalized;
    uint64_t signature;
    /* Built by finalize: placements grouped by local tensor (CSR) and the
     * number of elements placed in each local tensor. */
    uint32_t *pl_start; /* locals.len + 1 */
    uint32_t *pl_list;  /* placements.len */
    uint64_t *placed;   /* locals.len */
};

/* Checks everything finalize checks (see refit/manifest.h) without signing. */
refit_status_t refit_manifest_validate(const refit_manifest_t *m);
/* The layout signature of a manifest (computed whether or not finalized). */
uint64_t refit_manifest_compute_signature(const refit_manifest_t *m);

/* Row-major element strides of a tensor (strides[ndim-1] == 1). */
void refit_tdesc_strides(const refit_tdesc_t *d, uint64_t strides[REFIT_MAX_DIMS]);
/* The box of canonical coordinates placement p covers (dimensions past its ndim are zero). */
refit_box_t refit_placement_box(const refit_placement_t *p);
/* Element index in local tensor `l` of canonical box point `cpoint` (canonical
 * coordinates) under placement p. */
uint64_t refit_placement_local_index(const refit_manifest_t *m, const refit_placement_t *p,
                                     const uint64_t cpoint[REFIT_MAX_DIMS]);

/* Boxes (in local coordinates) of local tensor `li` that no placement
 * covers: the padding.  *boxes is malloc'ed (free it); *n may be 0.  Needs a
 * finalized manifest. */
refit_status_t refit_manifest_padding(const refit_manifest_t *m, uint32_t li, refit_box_t **boxes, size_t *n);

/* An independent copy of a finalized manifest (through its encoding: exactly what a peer would decode).
 * *out is the caller's.  Errors: those of refit_manifest_encode / refit_manifest_decode. */
refit_status_t refit_manifest_copy(const refit_manifest_t *m, refit_manifest_t **out);

#endif
