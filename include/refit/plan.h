/*
 * refit/plan.h - the reshard planner.
 *
 * From the manifests of every source rank and the manifest of one destination
 * rank, a plan lists strided regions that write every destination byte that a
 * placement covers exactly once, reading nothing else: each region copies
 * `run` contiguous bytes, repeated over up to three nested loops, each loop
 * with its own source and destination stride.  A row-parallel slice is one
 * region.  Bytes of destination tensors that no placement covers (padding)
 * are listed as fill regions (zeros).
 *
 * Where several sources hold the same bytes (DP replicas, replicated norms),
 * reads are balanced across them by bytes; pieces larger than split_bytes are
 * split between replicas so that all sources work at once.
 *
 * Coverage is proven before a plan is returned: every piece lies inside a box
 * its source holds, the pieces of each destination box are pairwise disjoint
 * (sort-and-sweep) and their volumes sum to the box's volume, and every region
 * lies inside its source and destination memory regions.  A plan that cannot
 * be complete is refused (fails closed) with a detail naming the tensor and
 * the box nobody holds, or the dtype/shape mismatch.
 *
 * Plans depend on manifests' layout parts only: refit_plan_key() is the pair of
 * signatures, for caching.  A plan is immutable and may be shared by threads.
 */
#ifndef REFIT_PLAN_H
#define REFIT_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "refit/manifest.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_plan refit_plan_t;

#define REFIT_PLAN_MAX_LOOPS 3

typedef struct {
    uint32_t src;                              /* index into the source array given to refit_plan_create;
                            REFIT_PLAN_FILL for a zero-fill region */
    uint32_t src_region;                       /* memory region of that source */
    uint32_t dst_region;                       /* memory region of the destination */
    uint32_t nloops;                           /* 0..REFIT_PLAN_MAX_LOOPS */
    uint64_t src_offset;                       /* bytes into src_region */
    uint64_t dst_offset;                       /* bytes into dst_region */
    uint64_t run;                              /* contiguous bytes per innermost copy */
    uint64_t count[REFIT_PLAN_MAX_LOOPS];      /* loop 0 is the innermost */
    uint64_t src_stride[REFIT_PLAN_MAX_LOOPS]; /* bytes */
    uint64_t dst_stride[REFIT_PLAN_MAX_LOOPS]; /* bytes */
} refit_plan_region_t;

#define REFIT_PLAN_FILL UINT32_MAX

/* Plan params, sized as refit/engine.h says (the caller's sizeof in `size`;
 * the library reads what fits and takes the rest as 0).  Every field's 0 is
 * its default. */
typedef struct {
    size_t size;           /* sizeof(refit_plan_params_t): REFIT_PLAN_PARAMS_INIT */
    uint64_t split_bytes;  /* replicated pieces above this are split across replicas;
                               0 = default (4 MiB); UINT64_MAX = never split */
    uint32_t balance_seed; /* rotates ties between replicas, so that different destination
                               ranks start on different replicas; read only with use_seed */
    bool use_seed;         /* false: seed = destination rank */
    bool no_coalesce;      /* true: keep one region per piece (for tests and inspection) */
} refit_plan_params_t;
/* The end of the first layout's last field: the smallest size accepted. */
#define REFIT_PLAN_PARAMS_SIZE_1 (offsetof(refit_plan_params_t, no_coalesce) + sizeof(bool))
#define REFIT_PLAN_PARAMS_INIT              \
    {                                       \
        .size = sizeof(refit_plan_params_t) \
    }

typedef struct {
    size_t size;              /* sizeof(refit_plan_stats_t) as the caller compiled it: REFIT_PLAN_STATS_INIT
                                 (a sized output: refit/engine.h) */
    uint64_t bytes_written;   /* destination bytes the placements cover */
    uint64_t bytes_read;      /* bytes the regions read from sources */
    uint64_t bytes_redundant; /* bytes_read - bytes_written (0 for a correct plan) */
    uint64_t bytes_fill;      /* padding bytes written as zeros */
    size_t regions;           /* copy regions after coalescing */
    size_t fills;             /* fill regions */
    size_t pieces;            /* (destination box, source) overlaps before coalescing */
    size_t sources_used;      /* sources read from */
    double plan_ms;           /* wall time of refit_plan_create */
} refit_plan_stats_t;
#ifdef __cplusplus
#define REFIT_PLAN_STATS_INIT      \
    {                              \
        sizeof(refit_plan_stats_t) \
    }
#else
#define REFIT_PLAN_STATS_INIT              \
    {                                      \
        .size = sizeof(refit_plan_stats_t) \
    }
#endif

/* Plans the destination from the sources (all finalized; a NULL entry in srcs
 * stands for a missing rank and is reported as REFIT_ERR_MISSING_SOURCE if any
 * destination byte would need it, which is always when none other holds them).
 * Sources must describe the same model as dst (REFIT_ERR_IDENTITY), and
 * every canonical tensor they share must agree in dtype and shape
 * (REFIT_ERR_MISMATCH).  params may be NULL for defaults; REFIT_ERR_INVALID_ARG
 * for params of a wrong size (refit/engine.h: params with a size).  The
 * manifests stay the caller's. */
REFIT_API refit_status_t refit_plan_create(const refit_manifest_t *const *srcs, size_t nsrcs,
                                           const refit_manifest_t *dst, const refit_plan_params_t *params,
                                           refit_plan_t **out);
REFIT_API void refit_plan_destroy(refit_plan_t *plan);

/* The plan's statistics into *out, whose size the caller sets
 * (REFIT_PLAN_STATS_INIT); REFIT_ERR_INVALID_ARG (nothing written) for a size
 * too small or a NULL argument. */
REFIT_API refit_status_t refit_plan_stats(const refit_plan_t *plan, refit_plan_stats_t *out);
/* Copy regions (sorted by source, then destination offset) and fill regions. */
REFIT_API const refit_plan_region_t *refit_plan_regions(const refit_plan_t *plan, size_t *n);
REFIT_API const refit_plan_region_t *refit_plan_fills(const refit_plan_t *plan, size_t *n);
/* Bytes read from source i. */
REFIT_API uint64_t refit_plan_source_bytes(const refit_plan_t *plan, uint32_t src);
/* The byte after the last one a region touches on its source / destination
 * side (its offset plus the span of its loops). */
REFIT_API uint64_t refit_region_src_end(const refit_plan_region_t *r);
REFIT_API uint64_t refit_region_dst_end(const refit_plan_region_t *r);
REFIT_API size_t refit_plan_num_sources(const refit_plan_t *plan);

/* Bytes a region moves (run * product of counts). */
REFIT_API uint64_t refit_plan_region_bytes(const refit_plan_region_t *r);

/* Executes a plan with memcpy in this process: src_bases[i][r] is the base of
 * region r of source i, dst_bases[r] of destination region r.  threads = 0
 * picks one per online CPU.  Regions are split between threads by bytes. */
REFIT_API refit_status_t refit_plan_execute_memcpy(const refit_plan_t *plan, const void *const *const *src_bases,
                                                   void *const *dst_bases, unsigned threads);

#ifdef __cplusplus
}
#endif
#endif
