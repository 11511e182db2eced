/* Internal plan representation. */
#ifndef REFIT_PLAN_INTERNAL_H
#define REFIT_PLAN_INTERNAL_H

#include <string.h>

#include "data/digest.h"
#include "layout/manifest.h"
#include "refit/experimental/plan.h"

struct refit_plan {
    REFIT_VEC(refit_plan_region_t) regions;
    REFIT_VEC(refit_plan_region_t) fills;
    uint64_t *src_bytes; /* per source */
    size_t nsrcs;
    refit_plan_stats_t stats;
    refit_plan_key_t key;
};

/* A plan over the caller's regions (not copied, not freed), for a one-off
 * transport pull: src_bytes[s] the bytes read from source s < nsrcs.  Its
 * key is a hash of the regions, so that a transport's cache of what it
 * built for a plan (cuda_ipc's tables) tells two views apart, and finds
 * again the table of a view with the same regions (a digest plan's entries,
 * fetched every version). */
static inline struct refit_plan refit_plan_view(refit_plan_region_t *regs, size_t n, uint64_t *src_bytes, size_t nsrcs)
{
    struct refit_plan p;
    memset(&p, 0, sizeof(p));
    p.regions.data = regs;
    p.regions.len = p.regions.cap = n;
    p.src_bytes = src_bytes;
    p.nsrcs = nsrcs;
    p.key.src = regs ? refit_hash64(regs, n * sizeof(*regs), 0x76696577 /* "view" */) : 0;
    p.key.dst = src_bytes ? refit_hash64(src_bytes, nsrcs * sizeof(*src_bytes), n) : n;
    return p;
}

/* Innermost runs of a region (product of its loop counts), and the source and
 * destination offsets of run `row` (loop 0 varies fastest). */
uint64_t refit_region_rows(const refit_plan_region_t *r);
void refit_region_row_offsets(const refit_plan_region_t *r, uint64_t row, uint64_t *src_off, uint64_t *dst_off);

/* Last byte (exclusive) a region touches on its source / destination side. */
uint64_t refit_region_src_end(const refit_plan_region_t *r);
uint64_t refit_region_dst_end(const refit_plan_region_t *r);

/* Merges adjacent regions and stacks regularly spaced ones into loops; keeps
 * the bytes moved identical.  Regions must be sorted (see plan.c). */
refit_status_t refit_plan_coalesce(refit_plan_t *plan);

/* Plan execution with options (the public memcpy entry point and the local
 * transports share it). */
typedef struct {
    unsigned threads; /* 0: one per online CPU */
    /* Copies len bytes of source `src` (region, offset) to dst.  NULL: memcpy
     * from src_bases.  Returns non-zero status to abort. */
    refit_status_t (*copy)(void *user, uint32_t src, uint32_t src_region, uint64_t src_offset, void *dst, uint64_t len);
    void *user;
    /* Called from the calling thread between tasks, at most every ~10 ms; a
     * non-zero status aborts. */
    refit_status_t (*tick)(void *user);
    void *tick_user;
    double deadline;     /* refit_now() limit; 0: none (REFIT_ERR_TIMEOUT) */
    const uint8_t *only; /* if set, execute only regions whose source s has only[s] != 0 (fills always run) */
    bool skip_fills;
    /* Hash while copying (data/digest.h): with dmap set, every copy region's
     * bytes go through refit_digest_map_copy into dacc (one entry per
     * destination placement, added to), fused with the copy (memcpy from
     * src_bases) or right after it (a caller's copy function: hashed in
     * place, while in cache); the mapped bytes hashed are added to *dbytes. */
    const refit_digest_map_t *dmap;
    refit_dsum_t *dacc;
    uint64_t *dbytes;
} refit_exec_opts_t;

refit_status_t refit_plan_execute(const refit_plan_t *plan, const void *const *const *src_bases, void *const *dst_bases,
                                  const refit_exec_opts_t *opts);

#endif
