/*
 * refit/manifest.h - what one rank holds.
 *
 * A manifest describes one rank of one layout: its identity (model, layout
 * string, rank, world size), its memory regions (one arena or a few ranges,
 * never one per tensor), its local tensors (name, dtype, shape, region, byte
 * offset), and placements: each maps one N-d box of a canonical tensor onto
 * an equally sized box of a local tensor.  A fused local tensor carries
 * several placements.  Bytes of a local tensor that no placement covers are
 * padding (e.g. padded vocabulary rows): receivers write them as zeros.
 *
 * Box convention: a placement's box has the canonical tensor's ndim; it maps
 * onto the trailing ndim dimensions of the local tensor, whose leading
 * dimensions (if any) are fixed at local_offset[0..] with extent 1.  So an
 * expert's gate_proj box [I, H] lands in w13_weight [E, 2I, H] at
 * local_offset = {e, 0, 0}.  No transposes: every layout refit knows stores
 * canonical rows as rows.
 *
 * Layout signature: a hash of everything except attributes (transport
 * descriptors, addresses), stable from step to step while the layout is
 * unchanged.  Plans are cached by pairs of signatures.
 *
 * Life cycle: create, add regions / canonical tensors / local tensors /
 * placements, finalize (validates and signs; afterwards only attributes may
 * change), then encode, or plan with it.  Decoding yields a finalized
 * manifest.  A manifest is not thread-safe while being built; a finalized one
 * may be read from any number of threads.
 */
#ifndef REFIT_MANIFEST_H
#define REFIT_MANIFEST_H

#include <stdbool.h>

#include "refit/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_manifest refit_manifest_t;

typedef struct {
    const char *model;  /* model identity, e.g. "qwen3-30b-a3b" */
    const char *layout; /* layout string, e.g. "megatron:tp=1,pp=1,ep=8,etp=1,dp=8,pad=128";
                           free text for custom layouts */
    uint32_t rank;      /* this rank, < world */
    uint32_t world;     /* number of ranks of this layout */
} refit_manifest_identity_t;

typedef struct {
    uint32_t canon;                        /* canonical tensor id (refit_manifest_add_canonical) */
    uint32_t local;                        /* local tensor id (refit_manifest_add_local) */
    uint32_t ndim;                         /* = the canonical tensor's ndim */
    uint64_t canon_offset[REFIT_MAX_DIMS]; /* box start in the canonical tensor */
    uint64_t extent[REFIT_MAX_DIMS];       /* box size, every entry >= 1 */
    uint64_t local_offset[REFIT_MAX_DIMS]; /* box start in the local tensor (local ndim entries) */
} refit_placement_t;

/* Limits enforced by finalize and decode. */
#define REFIT_MANIFEST_MAX_NAME 255
#define REFIT_MANIFEST_MAX_ENTRIES (1u << 24)
/* Ranks of one layout (enforced by create and decode): receivers keep tables
 * as long as their sources' world, so a hostile manifest must not choose it
 * freely.  Also the layouts' limit (refit/layout.h). */
#define REFIT_MANIFEST_MAX_WORLD 16384u

/* Creates an empty manifest.  REFIT_ERR_INVALID_ARG if rank >= world, world is
 * 0 or above REFIT_MANIFEST_MAX_WORLD, or a string is NULL or longer than
 * REFIT_MANIFEST_MAX_NAME. */
REFIT_API refit_status_t refit_manifest_create(const refit_manifest_identity_t *id, refit_manifest_t **out);
/* Destroys a manifest; NULL is accepted. */
REFIT_API void refit_manifest_destroy(refit_manifest_t *m);

/* Adds a memory region of `size` bytes; *id receives its index (0, 1, ...). */
REFIT_API refit_status_t refit_manifest_add_region(refit_manifest_t *m, uint64_t size, uint32_t *id);
/* Declares a canonical tensor (full shape).  Declaring the same name twice
 * returns the first id; with a different dtype or shape it fails with
 * REFIT_ERR_MISMATCH. */
REFIT_API refit_status_t refit_manifest_add_canonical(refit_manifest_t *m, const refit_tensor_info_t *t, uint32_t *id);
/* Declares a local tensor stored contiguously (row-major) at `offset` bytes
 * into `region`.  REFIT_ERR_INVALID_ARG for a duplicate name. */
REFIT_API refit_status_t refit_manifest_add_local(refit_manifest_t *m, const refit_tensor_info_t *t, uint32_t region,
                                                  uint64_t offset, uint32_t *id);
/* Adds a placement; checked fully by finalize. */
REFIT_API refit_status_t refit_manifest_add_placement(refit_manifest_t *m, const refit_placement_t *p);

/* Validates and signs.  Errors, each with a detail naming the offender:
 *  REFIT_ERR_OUT_OF_BOUNDS  a box outside its canonical or local tensor, a local
 *                           tensor outside its region;
 *  REFIT_ERR_OVERLAP        two local tensors sharing bytes, two placements
 *                           writing the same local elements;
 *  REFIT_ERR_MISMATCH       a placement between tensors of different dtypes, or a
 *                           local tensor with fewer dims than its canonical box;
 *  REFIT_ERR_INVALID_ARG    bad ids, ndim, zero extents or shapes.
 * Finalizing twice is a no-op. */
REFIT_API refit_status_t refit_manifest_finalize(refit_manifest_t *m);

/* Sets an attribute (opaque bytes under a key), replacing any previous value.
 * Attributes carry per-transport access descriptors; they are encoded but are
 * not part of the signature, and may be set after finalize. */
REFIT_API refit_status_t refit_manifest_set_attr(refit_manifest_t *m, const char *key, const void *val, size_t len);
/* Looks an attribute up; REFIT_ERR_NOT_FOUND if absent.  *val points into m. */
REFIT_API refit_status_t refit_manifest_get_attr(const refit_manifest_t *m, const char *key, const void **val,
                                                 size_t *len);

/* Encodes a finalized manifest into a fresh buffer (free() it).  The encoding
 * is versioned, little-endian, and ends in a checksum. */
REFIT_API refit_status_t refit_manifest_encode(const refit_manifest_t *m, void **buf, size_t *len);
/* Decodes and fully validates (as finalize does) untrusted bytes.  Truncated,
 * corrupt (checksum), unknown-version or hostile input yields REFIT_ERR_CORRUPT
 * or REFIT_ERR_UNSUPPORTED (or a finalize error) with a detail naming the field
 * and byte offset; nothing is allocated on failure. */
REFIT_API refit_status_t refit_manifest_decode(const void *buf, size_t len, refit_manifest_t **out);

/* Accessors (valid on any manifest; ids must be in range). */
REFIT_API void refit_manifest_identity(const refit_manifest_t *m, refit_manifest_identity_t *out);
REFIT_API uint64_t refit_manifest_signature(const refit_manifest_t *m); /* 0 before finalize */
REFIT_API uint32_t refit_manifest_num_regions(const refit_manifest_t *m);
REFIT_API uint64_t refit_manifest_region_size(const refit_manifest_t *m, uint32_t region);
REFIT_API uint32_t refit_manifest_num_canonical(const refit_manifest_t *m);
REFIT_API void refit_manifest_canonical(const refit_manifest_t *m, uint32_t id, refit_tensor_info_t *out);
REFIT_API uint32_t refit_manifest_num_locals(const refit_manifest_t *m);
REFIT_API void refit_manifest_local(const refit_manifest_t *m, uint32_t id, refit_tensor_info_t *out, uint32_t *region,
                                    uint64_t *offset);
REFIT_API uint32_t refit_manifest_num_placements(const refit_manifest_t *m);
REFIT_API void refit_manifest_placement(const refit_manifest_t *m, uint32_t i, refit_placement_t *out);

#ifdef __cplusplus
}
#endif
#endif
