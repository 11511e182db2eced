/*
 * refit/experimental/delta.h - delta refit: send only what changed since the last version.
 *
 * A publisher keeps a copy of what it last published (refit_delta_encoder_t)
 * and, per memory region, encodes the difference between that copy and the
 * new bytes in the source's own byte coordinates.  One encoding serves every
 * receiver whatever its layout: a receiver maps changed source bytes to its
 * own bytes through the plan it already has (refit_delta_apply), fetching only
 * the chunks its plan reads (refit_delta_index_t).
 *
 * Encoding (little-endian): a header, a chunk table, then payloads.  The
 * region is cut into chunks of REFIT_DELTA_CHUNK_UNITS 2-byte units; a chunk
 * is unchanged (no payload), sparse (u16 unit indices, then the units'
 * values), dense (the chunk's bytes) or, with REFIT_DELTA_BLOCKS, a bitmap of
 * changed blocks followed by those blocks.  Each chunk takes the cheapest of
 * the encodings the format allows, so a heavily changed chunk never costs more
 * than its bytes plus a table entry.
 *
 * Bit-exactness: a delta names its base version; applying it to memory that
 * holds any other version is refused (REFIT_ERR_STALE): the caller then does
 * a full refit.
 *
 * EXPERIMENTAL (docs/api.md): no ABI promise.  Exported for refit's own tools
 * and tests (version node REFIT_EXPERIMENTAL of src/refit.map); a release may
 * change or remove any declaration here without a new soname.
 */
#ifndef REFIT_DELTA_H
#define REFIT_DELTA_H

#include <stdbool.h>

#include "refit/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_DELTA_CHUNK_UNITS 65536u /* 2-byte units per chunk: 128 KiB */

typedef enum {
    REFIT_DELTA_SPARSE = 0, /* per chunk: sparse or dense */
    REFIT_DELTA_BLOCKS = 1, /* per chunk: blocks bitmap or dense */
} refit_delta_format_t;

typedef struct {
    refit_delta_format_t format;
    uint32_t block_bytes; /* REFIT_DELTA_BLOCKS: bytes per block (even, divides the chunk); 0: 64 */
    unsigned threads;     /* encoding threads (chunks are split between them); 0: 1.  Added after
                             format and block_bytes: initialize the whole struct (= {0}, then set) */
} refit_delta_params_t;

typedef struct {
    size_t size; /* sizeof(refit_delta_info_t) as the caller compiled it: REFIT_DELTA_INFO_INIT
                                (a sized output: refit/engine.h) */
    uint64_t base_version, version;
    uint64_t region_bytes;
    uint64_t nchunks;
    uint64_t header_bytes;  /* header + chunk table */
    uint64_t total_bytes;   /* the whole encoding */
    uint64_t changed_units; /* 2-byte units that differ */
    uint64_t sparse_chunks, dense_chunks, block_chunks;
} refit_delta_info_t;
#ifdef __cplusplus
#define REFIT_DELTA_INFO_INIT      \
    {                              \
        sizeof(refit_delta_info_t) \
    }
#else
#define REFIT_DELTA_INFO_INIT              \
    {                                      \
        .size = sizeof(refit_delta_info_t) \
    }
#endif

/* Encodes the difference between base and cur (nbytes each, even).  *out is
 * malloc'ed (free it). */
REFIT_API refit_status_t refit_delta_encode(const void *base, const void *cur, uint64_t nbytes, uint64_t base_version,
                                            uint64_t version, const refit_delta_params_t *params, void **out,
                                            size_t *len);
/* Reads and checks a delta's header and chunk table (len may cover only the
 * header and table: refit_delta_header_bytes tells how much that is).  out
 * may be NULL (check only); otherwise out->size must be set
 * (REFIT_DELTA_INFO_INIT; too small: REFIT_ERR_INVALID_ARG). */
REFIT_API refit_status_t refit_delta_info(const void *delta, size_t len, refit_delta_info_t *out);
/* Bytes of header + chunk table of any delta of a region of region_bytes. */
REFIT_API uint64_t refit_delta_table_bytes(uint64_t region_bytes);
/* Bytes of header + chunk table, from the first 64 bytes of a delta (0 if not a delta). */
REFIT_API uint64_t refit_delta_header_bytes(const void *delta, size_t len);
/* Byte range [*off, *off + *n) of chunk c's payload inside the encoding. */
REFIT_API void refit_delta_chunk_payload(const void *delta, uint64_t c, uint64_t *off, uint64_t *n);

/* What a destination needs to apply deltas of one source region through its
 * plan: the chunks its plan reads (only those need fetching) and, per chunk,
 * the plan regions reading it.  Built once per plan, like the plan. */
typedef struct refit_delta_index refit_delta_index_t;
REFIT_API refit_status_t refit_delta_index_create(const refit_plan_t *plan, uint32_t src, uint32_t src_region,
                                                  uint64_t region_bytes, refit_delta_index_t **out);
/* need[c] != 0 for the chunks the plan reads; *nchunks entries. */
REFIT_API const uint8_t *refit_delta_index_need(const refit_delta_index_t *ix, uint64_t *nchunks);
REFIT_API void refit_delta_index_destroy(refit_delta_index_t *ix);

typedef struct {
    size_t size;            /* sizeof(refit_delta_apply_stats_t) as the caller compiled it:
                               REFIT_DELTA_APPLY_STATS_INIT (a sized output: refit/engine.h) */
    uint64_t units_written; /* destination 2-byte units written by sparse chunks */
    uint64_t bytes_written; /* destination bytes written by dense and block chunks */
} refit_delta_apply_stats_t;
#ifdef __cplusplus
#define REFIT_DELTA_APPLY_STATS_INIT      \
    {                                     \
        sizeof(refit_delta_apply_stats_t) \
    }
#else
#define REFIT_DELTA_APPLY_STATS_INIT              \
    {                                             \
        .size = sizeof(refit_delta_apply_stats_t) \
    }
#endif

/* Applies a delta of the index's source region to destination memory that
 * holds `have_version`.  Reads the header, the table and only the payloads
 * of needed chunks, so the caller may have fetched only those.
 * REFIT_ERR_STALE if have_version is not the delta's base (do a full refit);
 * REFIT_ERR_CORRUPT for a malformed delta or one of another region size.
 * stats may be NULL; otherwise stats->size must be set
 * (REFIT_DELTA_APPLY_STATS_INIT; too small: REFIT_ERR_INVALID_ARG, nothing
 * applied). */
REFIT_API refit_status_t refit_delta_apply(const refit_delta_index_t *ix, const void *delta, size_t len,
                                           uint64_t have_version, void *const *dst_bases,
                                           refit_delta_apply_stats_t *stats);

/* The same with `threads` threads (0: one per CPU); chunks are split between
 * them (each destination byte has one source byte, so they write disjoint bytes). */
REFIT_API refit_status_t refit_delta_apply_threads(const refit_delta_index_t *ix, const void *delta, size_t len,
                                                   uint64_t have_version, void *const *dst_bases, unsigned threads,
                                                   refit_delta_apply_stats_t *stats);

/* A publisher's memory of what it last published: a copy of each region. */
typedef struct refit_delta_encoder refit_delta_encoder_t;
REFIT_API refit_status_t refit_delta_encoder_create(const uint64_t *region_sizes, uint32_t nregions,
                                                    const refit_delta_params_t *params, refit_delta_encoder_t **out);
/* Version last published (0: none; the first publish yields no delta). */
REFIT_API uint64_t refit_delta_encoder_version(const refit_delta_encoder_t *e);
/* Publishes `version` from region_bases: for each region r, deltas[r] is
 * the delta from the previously published version (NULL the first time; free
 * them), then the kept copy becomes `version` (one pass: encoding writes the
 * changed bytes into the copy).  On failure no delta is returned and the next
 * publish starts over (yields no delta). */
REFIT_API refit_status_t refit_delta_encoder_publish(refit_delta_encoder_t *e, const void *const *region_bases,
                                                     uint64_t version, void **deltas, size_t *lens);
REFIT_API void refit_delta_encoder_destroy(refit_delta_encoder_t *e);

#ifdef __cplusplus
}
#endif
#endif
